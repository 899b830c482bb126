"""jitconv's ops as torch custom ops (``torch.ops.jitconv.*``), for torch.compile.

torch.compile cannot trace jitconv's Python (it launches SYCL or CUDA kernels through
dpctl / the driver, and updates ``conv_state`` in place behind torch's back). Registered
with ``torch.library.custom_op``, each op is one opaque node whose mutated arguments are
declared (so functionalization keeps the in-place state update) and whose fake
implementation gives the output's shape, dtype and device without running anything.

The public functions route here by themselves while torch.compile traces them
(``torch.compiler.is_compiling()``): ``jitconv.causal_conv1d_mixed`` / ``_fn`` /
``_update`` and ``jitconv.vllm.causal_conv1d_fn`` / ``_update`` called inside a compiled
function become these ops, without a graph break. There, metadata must be tensors,
Python lists or numpy arrays (made tensors), and ``out`` is filled by a copy of the op's
result. Eagerly the functions run as they always do; plan objects (``jitconv.plan``,
``device_plan``) are not ops and are not traced.
"""

from typing import Optional

import numpy as np
import torch
from torch import Tensor
from torch.library import custom_op

from jitconv.api import ops


def _fake_rows(x):
    """The output of an op on token-major x: a new contiguous tensor like x."""
    return torch.empty(tuple(x.shape), dtype=x.dtype, device=x.device)


@custom_op("jitconv::causal_conv1d_mixed", mutates_args=("conv_state",))
def causal_conv1d_mixed(x: Tensor, weight: Tensor, bias: Optional[Tensor],
                        conv_state: Tensor, non_spec_query_start_loc: Optional[Tensor],
                        non_spec_state_indices: Optional[Tensor],
                        has_initial_state: Optional[Tensor],
                        non_spec_token_indx: Optional[Tensor],
                        spec_query_start_loc: Optional[Tensor],
                        spec_state_indices: Optional[Tensor],
                        spec_token_indx: Optional[Tensor],
                        num_accepted_tokens: Optional[Tensor],
                        non_spec_num_accepted_tokens: Optional[Tensor],
                        activation: Optional[str], pad_slot_id: int,
                        math: Optional[str]) -> Tensor:
    return ops.causal_conv1d_mixed(
        x, weight, bias, conv_state, non_spec_query_start_loc=non_spec_query_start_loc,
        non_spec_state_indices=non_spec_state_indices, has_initial_state=has_initial_state,
        non_spec_token_indx=non_spec_token_indx, spec_query_start_loc=spec_query_start_loc,
        spec_state_indices=spec_state_indices, spec_token_indx=spec_token_indx,
        num_accepted_tokens=num_accepted_tokens,
        non_spec_num_accepted_tokens=non_spec_num_accepted_tokens, activation=activation,
        pad_slot_id=pad_slot_id, math=math)


@causal_conv1d_mixed.register_fake
def _(x, *args):
    return _fake_rows(x)


@custom_op("jitconv::causal_conv1d_fn", mutates_args=("conv_state",))
def causal_conv1d_fn(x: Tensor, weight: Tensor, bias: Optional[Tensor], conv_state: Tensor,
                     query_start_loc: Tensor, cache_indices: Tensor,
                     has_initial_state: Optional[Tensor], activation: Optional[str],
                     pad_slot_id: int, token_indx: Optional[Tensor],
                     math: Optional[str]) -> Tensor:
    return ops.causal_conv1d_fn(x, weight, bias, conv_state, query_start_loc, cache_indices,
                                has_initial_state, activation=activation,
                                pad_slot_id=pad_slot_id, token_indx=token_indx, math=math)


@causal_conv1d_fn.register_fake
def _(x, *args):
    return _fake_rows(x)


@custom_op("jitconv::causal_conv1d_update", mutates_args=("conv_state",))
def causal_conv1d_update(x: Tensor, weight: Tensor, bias: Optional[Tensor],
                         conv_state: Tensor, conv_state_indices: Tensor,
                         query_start_loc: Optional[Tensor],
                         num_accepted_tokens: Optional[Tensor], activation: Optional[str],
                         pad_slot_id: int, token_indx: Optional[Tensor],
                         math: Optional[str]) -> Tensor:
    return ops.causal_conv1d_update(x, weight, bias, conv_state, conv_state_indices,
                                    query_start_loc, num_accepted_tokens,
                                    activation=activation, pad_slot_id=pad_slot_id,
                                    token_indx=token_indx, math=math)


@causal_conv1d_update.register_fake
def _(x, *args):
    return _fake_rows(x)


@custom_op("jitconv::vllm_causal_conv1d_fn", mutates_args=("conv_states",))
def vllm_causal_conv1d_fn(x: Tensor, weight: Tensor, bias: Optional[Tensor],
                          conv_states: Tensor, query_start_loc: Tensor,
                          cache_indices: Optional[Tensor],
                          has_initial_state: Optional[Tensor],
                          activation: Optional[str], pad_slot_id: Optional[int],
                          null_block_id: Optional[int]) -> Tensor:
    from jitconv import vllm
    return vllm.causal_conv1d_fn(x, weight, bias, conv_states, query_start_loc,
                                 cache_indices, has_initial_state, activation, pad_slot_id,
                                 null_block_id)


@vllm_causal_conv1d_fn.register_fake
def _(x, *args):
    return torch.empty(tuple(x.shape), dtype=x.dtype, device=x.device)  # (dim, tokens)


@custom_op("jitconv::vllm_causal_conv1d_update", mutates_args=("x", "conv_state", "out"))
def vllm_causal_conv1d_update(x: Tensor, conv_state: Tensor, weight: Tensor,
                              bias: Optional[Tensor], activation: Optional[str],
                              conv_state_indices: Optional[Tensor],
                              num_accepted_tokens: Optional[Tensor],
                              query_start_loc: Optional[Tensor], max_query_len: int,
                              null_block_id: Optional[int], pad_slot_id: Optional[int],
                              out: Optional[Tensor]) -> None:
    # Written into out, or into x when out is None (vLLM's convention): both declared
    # mutated, the caller returns the one written.
    from jitconv import vllm
    vllm.causal_conv1d_update(x, conv_state, weight, bias, activation, conv_state_indices,
                              num_accepted_tokens, query_start_loc, max_query_len,
                              null_block_id=null_block_id, out=out, pad_slot_id=pad_slot_id)


@vllm_causal_conv1d_update.register_fake
def _(*args):
    return None


def as_tensor(value):
    """Metadata as the ops take it: tensors as they are, lists and numpy arrays as int64
    tensors, None as None."""
    if value is None or isinstance(value, Tensor):
        return value
    return torch.as_tensor(np.asarray(value))


def into(out, result):
    """``out`` filled with ``result`` (an op's new output), or ``result``."""
    if out is None:
        return result
    out.copy_(result)
    return out
