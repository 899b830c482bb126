"""Drop-in entry points with vLLM's own conventions (as of vLLM 0.33).

``causal_conv1d_fn`` / ``causal_conv1d_update`` have the signatures, argument order and
defaults of vLLM's Triton ops in ``vllm.model_executor.layers.mamba.ops.causal_conv1d``
and follow its batch conventions (``jitconv.vllm.dropins``; inside torch.compile each is
one custom op: ``jitconv.vllm.custom_ops``). ``gdn_conv_step`` does the conv of a whole
engine step from vLLM's ``GDNAttentionMetadata`` in one launch, ``gdn_conv_stage_step``
the layer's whole conv stage (q, k, v, l2norm, gates) the same way; ``conv_state_view``
gives a layer's conv cache in the layout the ops take. ``jitconv.vllm.plugin`` puts them
into a vLLM server, following the conventions it reads from the installed vLLM
(``jitconv.vllm.installed``).
"""

from jitconv.vllm.conventions import NULL_BLOCK_ID, PAD_SLOT_ID
from jitconv.vllm.custom_ops import causal_conv1d_fn, causal_conv1d_update
from jitconv.vllm.dropins import (NOT_IMPLEMENTED, conv_state_view, gdn_conv_stage_step,
                                  gdn_conv_step)

__all__ = ["causal_conv1d_fn", "causal_conv1d_update", "gdn_conv_step",
           "gdn_conv_stage_step", "conv_state_view", "NULL_BLOCK_ID", "PAD_SLOT_ID",
           "NOT_IMPLEMENTED"]
