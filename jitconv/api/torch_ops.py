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
result; split outputs (``split`` / ``out_spec`` / ``out_non_spec`` of
``causal_conv1d_mixed``) go through ``causal_conv1d_mixed_split``, which writes the
caller's tensors or new ones sized by the parts' token maps. Eagerly the functions run as
they always do; plan objects (``jitconv.plan``,
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


# causal_conv1d_mixed's metadata keywords, in the ops' argument order.
MIXED_METADATA = ("non_spec_query_start_loc", "non_spec_state_indices", "has_initial_state",
                  "non_spec_token_indx", "spec_query_start_loc", "spec_state_indices",
                  "spec_token_indx", "num_accepted_tokens", "non_spec_num_accepted_tokens")


def _mixed(x, weight, bias, conv_state, metadata, activation, pad_slot_id, math, **outputs):
    return ops.causal_conv1d_mixed(x, weight, bias, conv_state,
                                   **dict(zip(MIXED_METADATA, metadata)),
                                   activation=activation, pad_slot_id=pad_slot_id,
                                   math=math, **outputs)


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
    return _mixed(x, weight, bias, conv_state, (
        non_spec_query_start_loc, non_spec_state_indices, has_initial_state,
        non_spec_token_indx, spec_query_start_loc, spec_state_indices, spec_token_indx,
        num_accepted_tokens, non_spec_num_accepted_tokens), activation, pad_slot_id, math)


@causal_conv1d_mixed.register_fake
def _(x, *args):
    return _fake_rows(x)


# The split outputs' op: the mixed op's arguments with out_spec / out_non_spec (written)
# after conv_state; nothing returned.
_SPLIT_SCHEMA = ("(Tensor x, Tensor weight, Tensor? bias, Tensor(a!) conv_state, "
                 "Tensor(b!)? out_spec, Tensor(c!)? out_non_spec, "
                 + "".join(f"Tensor? {name}, " for name in MIXED_METADATA)
                 + "str? activation, int pad_slot_id, str? math) -> ()")


@custom_op("jitconv::causal_conv1d_mixed_split",
           mutates_args=("conv_state", "out_spec", "out_non_spec"), schema=_SPLIT_SCHEMA)
def causal_conv1d_mixed_split(x, weight, bias, conv_state, out_spec, out_non_spec, *rest):
    metadata, (activation, pad_slot_id, math) = rest[:-3], rest[-3:]
    _mixed(x, weight, bias, conv_state, metadata, activation, pad_slot_id, math,
           out_spec=out_spec, out_non_spec=out_non_spec)


@causal_conv1d_mixed_split.register_fake
def _(*args):
    return None


def mixed_split(x, weight, bias, conv_state, split, activation, pad_slot_id, math, metadata,
                out):
    """``causal_conv1d_mixed`` with split outputs while torch.compile traces: the caller's
    (out_spec, out_non_spec), or (``split`` True) new ones whose row counts are the
    lengths of the parts' token maps (the traced graph cannot read the query_start_loc
    values): a part with sequences needs its map."""
    from jitconv.api.plan import SplitOutputs
    from jitconv.api.validation import check_no_out
    check_no_out(out)
    metadata = tuple(as_tensor(m) for m in metadata)
    if split is True:
        parts = []
        for name, loc, rows in (("spec_token_indx", metadata[4], metadata[6]),
                                ("non_spec_token_indx", metadata[0], metadata[3])):
            if loc is None:
                parts.append(None)
            elif rows is None:
                raise ValueError(f"{name}: needed for new split outputs under torch.compile "
                                 f"(its length is the part's row count; the traced graph "
                                 f"does not read query_start_loc's values): pass it, or "
                                 f"out_spec / out_non_spec")
            else:
                parts.append(x.new_empty((rows.shape[0], x.shape[1])) if rows.shape[0]
                             else None)
        split = tuple(parts)
    torch.ops.jitconv.causal_conv1d_mixed_split(x, weight, bias, conv_state, *split,
                                                *metadata, activation, pad_slot_id, math)
    return SplitOutputs(*split)


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
                         math: Optional[str],
                         max_query_len: Optional[int] = None) -> Tensor:
    return ops.causal_conv1d_update(x, weight, bias, conv_state, conv_state_indices,
                                    query_start_loc, num_accepted_tokens,
                                    activation=activation, pad_slot_id=pad_slot_id,
                                    token_indx=token_indx, math=math,
                                    max_query_len=max_query_len)


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
