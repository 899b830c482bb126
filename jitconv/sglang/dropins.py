"""SGLang's conv ops, run by jitconv: the same signatures, argument order and defaults
as ``sglang/kernels/ops/mamba/causal_conv1d_triton.py`` (sglang 0.5.23), and SGLang's
conventions:

- ``causal_conv1d_fn``: x channel-major (dim, tokens) (SGLang passes
  ``mixed_qkv.transpose(0, 1)``), ``query_start_loc`` / ``cache_indices`` /
  ``has_initial_state`` as vLLM's; a new output like x (not in place);
  ``seq_lens_cpu`` only sized SGLang's grid (accepted, not needed: the lengths are
  ``query_start_loc``'s).
- ``causal_conv1d_update``: x (batch, dim) or (batch, dim, seqlen), a new output like x.
  Without ``num_accept_tokens`` a sequence continues from its line and keeps its last
  width - 1 inputs (target verify too: SGLang restores the accepted window from
  ``intermediate_conv_window`` after verify); with it, vLLM's spec rule. The windows: for
  every token, its width - 1 newest inputs to
  ``intermediate_conv_window[intermediate_state_indices[i], t]``. A tree
  (``retrieve_next_token`` / ``retrieve_next_sibling``: first child and next sibling of
  each draft position, -1 none) gives each token its parent; the parents are written
  into ``retrieve_parent_token``, as SGLang's kernel does.
- ``pad_slot_id`` (-1) marks padded batch entries: nothing is written for them but zero
  output rows (SGLang leaves those rows unwritten).

The rules are docs/SEMANTICS.md's ("More state rules"); one conv launch per call.
Metadata in tensors on x's GPU (SGLang's target verify inside CUDA graphs) stay there: a
``jitconv.device_plan`` reads them at every run (the windows' rows included), for
sequences of at most 16 tokens; trees and ``cache_seqlens`` are read on the host (a tree's
parents are built from the lists there).
"""

import numpy as np
import torch

from jitconv.api import device_calls, ops, validation
from jitconv.api.device_plan import RULE_TOKENS
from jitconv.api.validation import activation_name, host_ints

PAD_SLOT_ID = -1


def _refuse(name, value, what):
    if value is not None:
        raise NotImplementedError(f"{name}: not implemented by jitconv: {what}. Expected "
                                  f"None; run SGLang's own conv op for it")


def causal_conv1d_fn(x, weight, bias, conv_states, query_start_loc, seq_lens_cpu,
                     cache_indices=None, has_initial_state=None, activation="silu",
                     pad_slot_id=PAD_SLOT_ID, validate_data=False, block_table=None,
                     **kwargs):
    """SGLang's prefill / extend conv. x: (dim, num_tokens) (any strides); conv_states:
    (lines, dim, state_len) (the first width - 1 columns are the state). Returns a new
    (dim, num_tokens) tensor laid out like x when x is a transposed token-major tensor.
    ``block_table`` (SGLang's (sequence, chunk) launch table for CUDA graphs) is refused:
    jitconv plans its own blocks. ``validate_data``: jitconv always validates."""
    if kwargs:
        raise TypeError(f"{sorted(kwargs)[0]}: not an argument of SGLang's "
                        f"causal_conv1d_fn that jitconv knows")
    _refuse("block_table", block_table, "SGLang's CUDA-graph launch table (jitconv "
            "plans its blocks from query_start_loc)")
    if x.dim() != 2:
        raise ValueError(f"x: expected shape (dim, num_tokens), got {tuple(x.shape)}")
    if conv_states is None:
        raise ValueError("conv_states: required")
    tokens = x.transpose(0, 1)  # (num_tokens, dim), a view
    out = torch.empty(tuple(tokens.shape), dtype=x.dtype, device=x.device)
    # SGLang's grid has a program per entry of seq_lens_cpu: that is the batch, and the
    # leading entries of the other arrays are its (they may be longer: padded batches).
    qsl = host_ints(query_start_loc, "query_start_loc")
    nseq = len(qsl) - 1 if seq_lens_cpu is None else len(seq_lens_cpu)
    if not 0 <= nseq < len(qsl):
        raise ValueError(f"query_start_loc: {len(qsl)} entries, but seq_lens_cpu holds "
                         f"{nseq} sequences (need one more)")
    lines = np.arange(nseq) if cache_indices is None else \
        _leading(cache_indices, nseq, "cache_indices")
    initial = np.zeros(nseq, bool) if has_initial_state is None else \
        _leading(has_initial_state, nseq, "has_initial_state")  # None: no state yet
    rows = np.arange(int(qsl[nseq]) - int(qsl[0])) + int(qsl[0])
    ops.causal_conv1d_mixed(tokens, weight, bias, conv_states,
                            non_spec_query_start_loc=qsl[:nseq + 1] - qsl[0],
                            non_spec_state_indices=lines, has_initial_state=initial,
                            non_spec_token_indx=rows,
                            activation=activation_name(activation), pad_slot_id=pad_slot_id,
                            out=out)
    return out.transpose(0, 1)


def _leading(values, count, name):
    values = host_ints(values, name, allow_bool=True)
    if len(values) < count:
        raise ValueError(f"{name}: {len(values)} entries, but the batch holds {count} "
                         f"sequences")
    return values[:count]


def tree_parents(next_token, next_sibling, lengths, real):
    """Each draft position's parent, from the first-child / next-sibling arrays, as
    SGLang's kernel derives it (positions in index order: a parent before its
    children; a position in no list gets parent 0); a child listed before its parent or
    reached twice is an error. Rows of padded entries stay -1. (batch, T) int64."""
    nxt = host_ints(next_token, "retrieve_next_token", ndim=2)
    sib = host_ints(next_sibling, "retrieve_next_sibling", ndim=2)
    if nxt.shape != sib.shape:
        raise ValueError(f"retrieve_next_sibling: expected shape {nxt.shape} (as "
                         f"retrieve_next_token), got {sib.shape}")
    parents = np.full(nxt.shape, -1, np.int64)
    for i in np.flatnonzero(real):
        n = int(lengths[i])
        par = np.zeros(n, np.int64)
        par_seen = np.zeros(n, bool)
        par_seen[0] = True
        for t in range(n):
            # t's first child gets parent t, t's next sibling t's parent
            for name, table, parent in (("retrieve_next_token", nxt, t),
                                        ("retrieve_next_sibling", sib, par[t])):
                child = int(table[i, t])
                if child == -1:
                    continue
                if not t < child < n:
                    raise ValueError(f"{name}: batch entry {i}, position {t}: {child} is "
                                     f"not a later position of the draft (< {n}), so the "
                                     f"tree is not listed parents first")
                if par_seen[child]:
                    raise ValueError(f"{name}: batch entry {i}: position {child} is "
                                     f"reached twice (not a tree)")
                par[child] = parent
                par_seen[child] = True
        parents[i, :n] = par  # a position in no list keeps parent 0, as in SGLang
    return parents


def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None,
                         cache_seqlens=None, conv_state_indices=None,
                         num_accept_tokens=None, intermediate_conv_window=None,
                         intermediate_state_indices=None, retrieve_next_token=None,
                         retrieve_next_sibling=None, retrieve_parent_token=None,
                         pad_slot_id=PAD_SLOT_ID, metadata=None, validate_data=False):
    """SGLang's decode / target-verify conv (see the module docstring). x: (batch, dim)
    or (batch, dim, seqlen); conv_state: (lines, dim, state_len). Returns a new tensor
    like x. ``cache_seqlens`` ((batch,) counts): circular lines, as SGLang's CUDA op
    (and Dao-AILab/causal-conv1d) define them (SEMANTICS.md; SGLang's Triton op ignores
    the argument); not with ``num_accept_tokens``. ``metadata`` (SGLang's precomputed
    launch metadata) is refused unless None."""
    _refuse("metadata", metadata, "SGLang's precomputed launch metadata (jitconv plans "
            "its launch from the other arguments)")
    seqlen = 1 if x.dim() == 2 else int(x.shape[-1]) if x.dim() == 3 else 0
    if retrieve_next_token is None and cache_seqlens is None and \
            0 < seqlen <= RULE_TOKENS and conv_state_indices is not None and \
            (intermediate_conv_window is None) == (intermediate_state_indices is None) and \
            x.dtype == conv_state.dtype and device_calls.on_device(
                x[:, :, 0] if x.dim() == 3 else x, conv_state_indices,
                num_accept_tokens, intermediate_state_indices):
        return _device_update(x, conv_state, weight, bias, activation, conv_state_indices,
                              num_accept_tokens, intermediate_conv_window,
                              intermediate_state_indices, pad_slot_id)
    if x.dim() == 2:
        batch, dim = (int(s) for s in x.shape)
        seqlen = 1
        tokens = x
    elif x.dim() == 3:
        batch, dim, seqlen = (int(s) for s in x.shape)
        tokens = x.transpose(1, 2).reshape(batch * seqlen, dim)  # a view when token-major
    else:
        raise ValueError(f"x: expected (batch, dim) or (batch, dim, seqlen), got "
                         f"{tuple(x.shape)}")
    if conv_state_indices is None:
        lines = np.arange(batch)
    else:
        lines = host_ints(conv_state_indices, "conv_state_indices")
        if len(lines) != batch:
            raise ValueError(f"conv_state_indices: expected {batch} entries (one per batch "
                             f"entry of x), got {len(lines)}")
    real = lines != pad_slot_id
    qsl = np.arange(0, batch * seqlen + 1, seqlen)
    part = "non_spec" if num_accept_tokens is None else "spec"
    meta = {f"{part}_query_start_loc": qsl, f"{part}_state_indices": lines}
    if num_accept_tokens is not None:
        meta["num_accepted_tokens"] = host_ints(num_accept_tokens, "num_accept_tokens")[:batch]
    if cache_seqlens is not None:
        if num_accept_tokens is not None:
            raise ValueError("cache_seqlens: circular lines do not combine with "
                             "num_accept_tokens (a ring has no fixed columns to slide); "
                             "pass one or the other")
        meta["non_spec_cache_seqlens"] = host_ints(cache_seqlens, "cache_seqlens")[:batch]
    windows = None
    if intermediate_conv_window is not None:
        if intermediate_state_indices is None or conv_state_indices is None:
            raise ValueError("intermediate_state_indices: required with "
                             "intermediate_conv_window (and conv_state_indices, as "
                             "SGLang's kernel needs)")
        rows = host_ints(intermediate_state_indices, "intermediate_state_indices")
        if len(rows) < batch:
            raise ValueError(f"intermediate_state_indices: {len(rows)} entries, but the "
                             f"batch holds {batch}")
        if real.any():  # (a batch of pads only writes no window)
            meta[f"{part}_window_rows"] = rows[:batch]
            windows = intermediate_conv_window
    if retrieve_next_token is not None:
        if retrieve_parent_token is None:
            raise ValueError("retrieve_parent_token: required with retrieve_next_token "
                             "(the parents are written into it)")
        parents = tree_parents(retrieve_next_token, retrieve_next_sibling,
                               np.full(batch, seqlen), real)
        meta[f"{part}_parent_token"] = parents
    out = torch.empty(tuple(tokens.shape), dtype=x.dtype, device=x.device)
    try:
        ops.causal_conv1d_mixed(tokens, weight, bias, conv_state,
                                activation=activation_name(activation),
                                pad_slot_id=pad_slot_id, out=out,
                                intermediate_windows=windows, **meta)
    except ValueError as exc:  # name SGLang's arguments, not the core's
        message = str(exc)
        for core, sglang in ((f"{part}_state_indices", "conv_state_indices"),
                             (f"{part}_window_rows", "intermediate_state_indices"),
                             ("intermediate_windows", "intermediate_conv_window"),
                             ("spec_window_rows/non_spec_window_rows",
                              "intermediate_state_indices"),
                             ("num_accepted_tokens", "num_accept_tokens"),
                             ("non_spec_cache_seqlens", "cache_seqlens")):
            message = message.replace(core, sglang)
        raise ValueError(message) from None
    if retrieve_next_token is not None:
        written = torch.from_numpy(parents[real]).to(retrieve_parent_token.dtype)
        index = torch.from_numpy(np.flatnonzero(real))
        retrieve_parent_token[index.to(retrieve_parent_token.device), :seqlen] = \
            written.to(retrieve_parent_token.device)
    if x.dim() == 2:
        return out
    return out.view(batch, seqlen, dim).transpose(1, 2)


# The device update's argument names (errors name them), by planner array name.
DEVICE_NAMES = dict(ns_qsl="x", ns_lines="conv_state_indices", sp_qsl="x",
                    sp_lines="conv_state_indices", sp_accepted="num_accept_tokens",
                    ns_windows="intermediate_state_indices",
                    sp_windows="intermediate_state_indices")


def _device_update(x, conv_state, weight, bias, activation, conv_state_indices,
                   num_accept_tokens, windows, window_rows, pad_slot_id):
    """``causal_conv1d_update`` with its metadata left on the device (never read back), as
    SGLang's target verify runs inside CUDA graphs: a ``jitconv.device_plan`` kept per set
    of metadata tensors (the batch's sequences of x's seqlen tokens each, declared), the
    windows' rows read by the device; bad values skip their sequence
    (``jitconv.check_errors``). Trees (``retrieve_next_token``) and rings are read on the
    host."""
    batch, dim = int(x.shape[0]), int(x.shape[1])
    seqlen = 1 if x.dim() == 2 else int(x.shape[2])
    tokens = x if x.dim() == 2 else x.transpose(1, 2).reshape(batch * seqlen, dim)
    num_lines, _dim, state_len = (int(s) for s in conv_state.shape)
    width = int(weight.shape[-1])
    key = ("sglang update", device_calls.describe(conv_state_indices),
           device_calls.describe(num_accept_tokens), device_calls.describe(window_rows),
           x.get_device(), batch, seqlen, num_lines, state_len, width, pad_slot_id)

    def build():
        for name, t in (("conv_state_indices", conv_state_indices),
                        ("num_accept_tokens", num_accept_tokens),
                        ("intermediate_state_indices", window_rows)):
            if t is not None and (t.dim() != 1 or t.shape[0] < batch):
                raise ValueError(f"{name}: expected at least {batch} entries (one per "
                                 f"batch entry of x), got shape {tuple(t.shape)}")
        lines = conv_state_indices[:batch]
        qsl = torch.arange(0, batch * seqlen + 1, seqlen, dtype=lines.dtype,
                           device=lines.device)
        part = "ns" if num_accept_tokens is None else "sp"
        given = dict(device_calls.NO_ARRAYS, **{f"{part}_qsl": qsl, f"{part}_lines": lines})
        if num_accept_tokens is not None:
            given["sp_accepted"] = num_accept_tokens[:batch]
        rules = {} if window_rows is None else {f"{part}_windows": window_rows[:batch]}
        geo = validation.check_geometry(batch * seqlen, num_lines, state_len, width,
                                        pad_slot_id)
        return device_calls.build(geo, given, DEVICE_NAMES, max_query_len=seqlen,
                                  rules=rules)

    plan = device_calls.kept_plan(key, build)
    if weight.dtype != conv_state.dtype or (bias is not None and bias.dtype != weight.dtype):
        weight = weight.to(conv_state.dtype)
        bias = None if bias is None else bias.to(conv_state.dtype)
    out = plan.run(tokens, weight, bias, conv_state, activation=activation_name(activation),
                   intermediate_windows=windows)
    if x.dim() == 2:
        return out
    return out.view(batch, seqlen, dim).transpose(1, 2)
