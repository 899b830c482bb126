"""jitconv's ops as torch custom ops (``torch.ops.jitconv.*``), for torch.compile, and
the public ops that route to them while torch.compile traces.

torch.compile cannot trace jitconv's Python (it launches SYCL or CUDA kernels through
dpctl / the driver, and updates ``conv_state`` in place behind torch's back). Registered
with ``torch.library.custom_op``, each op is one opaque node whose mutated arguments are
declared (so functionalization keeps the in-place state update) and whose fake
implementation gives the output's shape, dtype and device without running anything.

``jitconv.causal_conv1d_mixed`` / ``_fn`` / ``_update`` are the functions defined here:
eagerly they are ``jitconv.api.ops``'s; called inside a compiled function
(``torch.compiler.is_compiling()``) they become these ops, without a graph break. There,
metadata must be tensors, Python lists or numpy arrays (made tensors), and ``out`` is
filled by a copy of the op's result; split outputs (``split`` / ``out_spec`` /
``out_non_spec`` of ``causal_conv1d_mixed``) go through ``causal_conv1d_mixed_split``,
which writes the caller's tensors or new ones sized by the parts' token maps. Plan
objects (``jitconv.plan``, ``device_plan``) are not ops and are not traced. The vLLM
drop-ins have their own ops (``jitconv.vllm.custom_ops``).
"""

import functools
from typing import Optional

import numpy as np
import torch
from torch import Tensor
from torch.library import custom_op

from jitconv.api import ops, validation
from jitconv.api.metadata import NAMES, StepMetadata
from jitconv.api.plan import SplitOutputs, split_request


def _fake_rows(x):
    """The output of an op on token-major x: a new contiguous tensor like x."""
    return torch.empty(tuple(x.shape), dtype=x.dtype, device=x.device)


def _mixed(x, weight, bias, conv_state, values, activation, pad_slot_id, math, split=None):
    """The eager op of the mixed custom ops: ``values`` the metadata in NAMES order."""
    return ops.mixed(x, weight, bias, conv_state, StepMetadata(**dict(zip(NAMES, values))),
                     activation=activation, pad_slot_id=pad_slot_id, math=math, split=split)


_METADATA_SCHEMA = "".join(f"Tensor? {name}, " for name in NAMES)


@custom_op("jitconv::causal_conv1d_mixed", mutates_args=("conv_state",),
           schema="(Tensor x, Tensor weight, Tensor? bias, Tensor(a!) conv_state, "
                  + _METADATA_SCHEMA + "str? activation, int pad_slot_id, str? math) -> Tensor")
def mixed_op(x, weight, bias, conv_state, *rest):
    values, (activation, pad_slot_id, math) = rest[:-3], rest[-3:]
    return _mixed(x, weight, bias, conv_state, values, activation, pad_slot_id, math)


@mixed_op.register_fake
def _(x, *args):
    return _fake_rows(x)


# The split outputs' op: the mixed op's arguments with out_spec / out_non_spec (written)
# after conv_state; nothing returned.
_SPLIT_SCHEMA = ("(Tensor x, Tensor weight, Tensor? bias, Tensor(a!) conv_state, "
                 "Tensor(b!)? out_spec, Tensor(c!)? out_non_spec, "
                 + _METADATA_SCHEMA
                 + "str? activation, int pad_slot_id, str? math) -> ()")


@custom_op("jitconv::causal_conv1d_mixed_split",
           mutates_args=("conv_state", "out_spec", "out_non_spec"), schema=_SPLIT_SCHEMA)
def mixed_split_op(x, weight, bias, conv_state, out_spec, out_non_spec, *rest):
    values, (activation, pad_slot_id, math) = rest[:-3], rest[-3:]
    _mixed(x, weight, bias, conv_state, values, activation, pad_slot_id, math,
           split=(out_spec, out_non_spec))


@mixed_split_op.register_fake
def _(*args):
    return None


def mixed_split(x, weight, bias, conv_state, split, activation, pad_slot_id, math, metadata,
                out):
    """``causal_conv1d_mixed`` with split outputs while torch.compile traces: the caller's
    (out_spec, out_non_spec), or (``split`` True) new ones whose row counts are the
    lengths of the parts' token maps (the traced graph cannot read the query_start_loc
    values): a part with sequences needs its map."""
    validation.check_no_out(out)
    m = StepMetadata(**{n: as_tensor(v) for n, v in zip(NAMES, metadata)})
    if split is True:
        parts = []
        for name, loc, rows in (
                ("spec_token_indx", m.spec_query_start_loc, m.spec_token_indx),
                ("non_spec_token_indx", m.non_spec_query_start_loc, m.non_spec_token_indx)):
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
                                                *m.values(), activation, pad_slot_id, math)
    return SplitOutputs(*split)


@custom_op("jitconv::causal_conv1d_fn", mutates_args=("conv_state",))
def fn_op(x: Tensor, weight: Tensor, bias: Optional[Tensor], conv_state: Tensor,
          query_start_loc: Tensor, cache_indices: Tensor,
          has_initial_state: Optional[Tensor], activation: Optional[str],
          pad_slot_id: int, token_indx: Optional[Tensor],
          math: Optional[str]) -> Tensor:
    return ops.causal_conv1d_fn(x, weight, bias, conv_state, query_start_loc, cache_indices,
                                has_initial_state, activation=activation,
                                pad_slot_id=pad_slot_id, token_indx=token_indx, math=math)


@fn_op.register_fake
def _(x, *args):
    return _fake_rows(x)


@custom_op("jitconv::causal_conv1d_update", mutates_args=("conv_state",))
def update_op(x: Tensor, weight: Tensor, bias: Optional[Tensor],
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


@update_op.register_fake
def _(x, *args):
    return _fake_rows(x)


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


def compile_aware(eager, traced):
    """``eager``, run as ``traced`` (same arguments: the custom op's call) while
    torch.compile traces."""
    @functools.wraps(eager)
    def public(*args, **kwargs):
        if torch.compiler.is_compiling():
            return traced(*args, **kwargs)
        return eager(*args, **kwargs)
    return public


def _traced_fn(x, weight, bias, conv_state, query_start_loc, cache_indices,
               has_initial_state=None, activation="silu", pad_slot_id=-1, token_indx=None,
               out=None, math=None):
    return into(out, torch.ops.jitconv.causal_conv1d_fn(
        x, weight, bias, conv_state, as_tensor(query_start_loc), as_tensor(cache_indices),
        as_tensor(has_initial_state), activation, int(pad_slot_id), as_tensor(token_indx),
        math))


def _traced_update(x, weight, bias, conv_state, conv_state_indices, query_start_loc=None,
                   num_accepted_tokens=None, activation="silu", pad_slot_id=-1,
                   token_indx=None, out=None, math=None, max_query_len=None):
    return into(out, torch.ops.jitconv.causal_conv1d_update(
        x, weight, bias, conv_state, as_tensor(conv_state_indices),
        as_tensor(query_start_loc), as_tensor(num_accepted_tokens), activation,
        int(pad_slot_id), as_tensor(token_indx), math,
        validation.check_max_query_len(max_query_len)))


def _traced_mixed(x, weight, bias, conv_state, *, activation="silu", pad_slot_id=-1,
                  out=None, math=None, split=False, out_spec=None, out_non_spec=None,
                  **metadata):
    values = StepMetadata.of(metadata).values()
    split = split_request(split, out_spec, out_non_spec)
    if split is not None:
        return mixed_split(x, weight, bias, conv_state, split, activation, int(pad_slot_id),
                           math, values, out)
    return into(out, torch.ops.jitconv.causal_conv1d_mixed(
        x, weight, bias, conv_state, *(as_tensor(m) for m in values), activation,
        int(pad_slot_id), math))


causal_conv1d_fn = compile_aware(ops.causal_conv1d_fn, _traced_fn)
causal_conv1d_update = compile_aware(ops.causal_conv1d_update, _traced_update)
causal_conv1d_mixed = compile_aware(ops.causal_conv1d_mixed, _traced_mixed)
