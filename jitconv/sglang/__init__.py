"""jitconv for SGLang: drop-ins with the signatures and conventions of SGLang's Triton
conv ops (``jitconv.sglang.dropins``), and ``install()``, which puts them into SGLang's
GDN and Mamba attention backends (``jitconv.sglang.plugin``)."""

from jitconv.sglang.dropins import PAD_SLOT_ID, causal_conv1d_fn, causal_conv1d_update
from jitconv.sglang.plugin import install

__all__ = ["PAD_SLOT_ID", "causal_conv1d_fn", "causal_conv1d_update", "install"]
