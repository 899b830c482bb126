# shim for a side-by-side run, not SGLang's code
# Old module path used by test_causal_conv1d.py; re-exports the unmodified
# sglang/kernels/ops/mamba/causal_conv1d_triton.py (its location in 0.5.23).
from sglang.kernels.ops.mamba.causal_conv1d_triton import (  # noqa: F401
    PAD_SLOT_ID,
    causal_conv1d_fn,
    causal_conv1d_update,
)
