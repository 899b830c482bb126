"""Public ops: validate everything on the host, then one kernel launch.

All ops share one path: metadata -> ``batch.Part``s (one per kind of sequence) -> a
``api.plan.StepPlan`` -> ONE launch of the mixed kernel, whatever mix of prefill chunks, plain
decodes, spec verify sequences and pads the step holds. ``jitconv.plan`` builds the plan
once for many layers; ``causal_conv1d_fn``, ``causal_conv1d_update`` and
``causal_conv1d_mixed`` are a plan plus one run.

Metadata in tensors on x's CUDA or XPU device (and no token maps or split outputs) is
never read on the host: such a call runs a device plan kept for those tensors
(``device_calls``), which checks the values on the device and records bad ones for
``jitconv.check_errors``.
The contract is docs/SEMANTICS.md; ``jitconv.reference`` implements it in float64.
"""

from typing import Any, Optional

import dataclasses

import numpy as np
import torch

from jitconv.backends import registry
from jitconv.api import device_calls, device_plan, plan_cache
from jitconv.api import validation
from jitconv.kernels.batch import Part
from jitconv.api.metadata import ALL_NAMES as METADATA_NAMES, StepMetadata
from jitconv.api.plan import StepPlan, split_request
from jitconv.api.validation import Geometry

# Types of the public API, for readers and checkers: tensors are torch tensors (CPU, XPU or
# CUDA), USM arrays (dpctl / dpnp, anything with __sycl_usm_array_interface__) or kDLOneAPI
# DLPack producers; metadata is a tensor, numpy array, list or USM array of ints.
Array = Any
Ints = Any


def _sequences(query_start_loc, state_indices, token_indx, names, geo, first_row,
               whole_x, lines_2d=False):
    """Common checks of one part: returns (qsl, lines, real mask, rows)."""
    qsl = validation.host_ints(query_start_loc, names["qsl"])
    validation.check_query_start_loc(qsl, names["qsl"])
    count, nseq = int(qsl[-1]), len(qsl) - 1
    if state_indices is None:
        raise ValueError(f"{names['lines']}: required when {names['qsl']} is given "
                         f"(one cache line per sequence)")
    lines = validation.host_ints(state_indices, names["lines"],
                                 ndim=(1, 2) if lines_2d else 1)
    if lines.ndim == 2:
        if lines.shape[1] == 0:
            raise ValueError(f"{names['lines']}: expected shape (num_seqs,) or (num_seqs, "
                             f"K) with K >= 1, got {lines.shape}")
        lines = lines[:, 0]  # (Q, K) block table: the conv uses column 0
    validation.check_lines(lines, names["lines"], nseq, geo.num_lines, geo.pad_slot_id)
    if token_indx is None:
        if whole_x and first_row + count != geo.num_tokens:
            raise ValueError(f"{names['qsl']}: last element must equal the token count "
                             f"{geo.num_tokens - first_row}, got {count}")
        if first_row + count > geo.num_tokens:
            raise ValueError(f"{names['qsl']}: covers {count} tokens from row {first_row},"
                             f" but x has only {geo.num_tokens} rows")
        rows = np.arange(first_row, first_row + count)
    else:
        rows = validation.host_ints(token_indx, names["rows"])
        validation.check_token_indx(rows, names["rows"], count, geo.num_tokens)
    return qsl, lines, lines != geo.pad_slot_id, rows


def _window_offsets(num_accepted_tokens, name, real, geo):
    """Window start column per sequence: num_accepted_tokens - 1 (0 when not given).
    Padded sequences are not checked: engines pad these arrays with anything."""
    nseq = len(real)
    if num_accepted_tokens is None:
        return np.zeros(nseq, np.int64)
    accepted = validation.host_ints(num_accepted_tokens, name)
    if len(accepted) != nseq:
        raise ValueError(f"{name}: expected {nseq} entries (one per sequence), "
                         f"got {len(accepted)}")
    bad = real & (accepted < 1)
    if np.any(bad):
        i = int(np.argmax(bad))
        raise ValueError(f"{name}: every entry must be >= 1 (the bonus token counts), "
                         f"entry {i} is {int(accepted[i])}")
    too_far = real & (accepted - 1 + (geo.width - 1) > geo.state_len)
    if np.any(too_far):
        i = int(np.argmax(too_far))
        raise ValueError(f"{name}: entry {i} = {int(accepted[i])} puts the conv window "
                         f"beyond state_len={geo.state_len} (need num_accepted_tokens - 1 "
                         f"+ width - 1 <= state_len)")
    return np.where(real, accepted - 1, 0)


def non_spec_part(query_start_loc, state_indices, has_initial_state, token_indx,
                  num_accepted_tokens, names, geo, *, first_row=0, whole_x=False,
                  lines_2d=False):
    """Validated non-spec sequences (prefill chunks and decodes). ``names`` maps roles to
    the caller's argument names, so errors name what the user typed."""
    qsl, lines, real, rows = _sequences(query_start_loc, state_indices, token_indx, names,
                                        geo, first_row, whole_x, lines_2d)
    nseq = len(lines)
    if has_initial_state is None:
        initial = np.ones(nseq, bool)
    else:
        initial = validation.host_ints(has_initial_state, names["init"], allow_bool=True)
        if len(initial) != nseq:
            raise ValueError(f"{names['init']}: expected {nseq} entries (one per "
                             f"sequence), got {len(initial)}")
        initial = initial != 0
    offsets = _window_offsets(num_accepted_tokens, names.get("accepted"), real, geo)
    return Part(query_start_loc=qsl, lines=np.where(real, lines, -1), rows=rows,
                offsets=offsets, initial=initial, spec=False)


def spec_part(query_start_loc, state_indices, token_indx, num_accepted_tokens, names, geo,
              *, first_row=0, whole_x=False):
    """Validated spec-decode verify sequences (1 + k draft tokens each, ragged)."""
    qsl, lines, real, rows = _sequences(query_start_loc, state_indices, token_indx, names,
                                        geo, first_row, whole_x, lines_2d=True)
    if num_accepted_tokens is None:
        raise ValueError(f"{names['accepted']}: required for spec sequences (tokens "
                         f"accepted in the previous step, >= 1)")
    offsets = _window_offsets(num_accepted_tokens, names["accepted"], real, geo)
    lengths = np.diff(qsl)
    short = real & (geo.width - 2 + lengths > geo.state_len)
    if np.any(short):
        i = int(np.argmax(short))
        raise ValueError(f"conv_state: state_len={geo.state_len} is too small for spec "
                         f"sequence {i} with {int(lengths[i])} tokens (need state_len >= "
                         f"width - 2 + tokens = {geo.width - 2 + int(lengths[i])})")
    return Part(query_start_loc=qsl, lines=np.where(real, lines, -1), rows=rows,
                offsets=offsets, initial=np.ones(len(lines), bool), spec=True)


def with_rules(part, values, names, geo):
    """``part`` with its state rules (SEMANTICS.md "More state rules"), validated:
    ``values`` and ``names`` (the caller's argument names) by role: "parents",
    "window_rows", "write_lines", and for the non-spec part "loc", "pos", "lines" (the
    checkpoints)."""
    real = part.lines >= 0
    nseq = len(part.lines)
    rules = {}
    if values.get("parents") is not None:
        rules["parents"] = validation.parent_map(values["parents"], names["parents"],
                                                 part.query_start_loc, real)
    if values.get("window_rows") is not None:
        rules["window_rows"] = validation.window_rows(values["window_rows"],
                                                      names["window_rows"], nseq, real)
    if values.get("write_lines") is not None:
        rules["write_lines"] = validation.write_lines(values["write_lines"],
                                                      names["write_lines"], nseq,
                                                      geo.num_lines, real)
    if "loc" in names:
        rules["checkpoints"] = validation.checkpoints(
            values, names, part.query_start_loc, geo.num_lines, real)
    if values.get("ring") is not None:
        others = [names[r] for r in ("write_lines", "loc") if values.get(r) is not None]
        if values.get("accepted") is not None:
            others.append("non_spec_num_accepted_tokens")
        if others:
            raise ValueError(f"{names['ring']}: circular lines do not combine with "
                             f"{others[0]} (a ring has no fixed columns to move or "
                             f"checkpoint); pass one or the other")
        rules["ring"] = validation.ring_positions(values["ring"], names["ring"], nseq,
                                                  geo.state_len, real)
    return dataclasses.replace(part, **rules)


def prepare(x, weight, bias, conv_state, out, activation, math, pad_slot_id):
    """Argument checks shared by every op, before any metadata is read (so a bad tensor
    is reported first, as it always was). Returns the step's Geometry and what
    ``StepPlan.run_checked`` takes as checked tensors."""
    validation.check_activation(activation)
    validation.check_math(math)
    validation.check_pad_slot_id(pad_slot_id)
    tensors = registry.normalize_all(x, weight, bias, conv_state, out)
    _dim, width, dtype = validation.check_tensors(*tensors)
    num_lines, _, state_len = validation.shape_of(tensors[3])
    geo = Geometry(num_tokens=validation.shape_of(tensors[0])[0], num_lines=num_lines,
                   state_len=state_len, width=width, pad_slot_id=int(pad_slot_id))
    return geo, (tensors, dtype)


_FN_NAMES = {"qsl": "query_start_loc", "lines": "cache_indices",
             "init": "has_initial_state", "rows": "token_indx"}
# The argument names by device plan array (``planner.METADATA_ARRAYS``), for errors;
# jitconv.vllm's drop-ins have the same.
FN_DEVICE_NAMES = dict(ns_qsl="query_start_loc", ns_lines="cache_indices",
                       ns_init="has_initial_state")
UPDATE_DEVICE_NAMES = dict(ns_qsl="query_start_loc", ns_lines="conv_state_indices",
                           sp_qsl="query_start_loc", sp_lines="conv_state_indices",
                           sp_accepted="num_accepted_tokens")


def causal_conv1d_fn(x: Array, weight: Array, bias: Optional[Array], conv_state: Array,
                     query_start_loc: Ints, cache_indices: Ints,
                     has_initial_state: Optional[Ints] = None,
                     activation: Optional[str] = "silu", pad_slot_id: int = -1,
                     token_indx: Optional[Ints] = None, out: Optional[Array] = None,
                     math: Optional[str] = None) -> Array:
    """Causal depthwise conv1d over prefill chunks and plain decodes (non-spec tokens).

    Parameters
    ----------
    x : tensor, (num_tokens, dim)
        Rows may be strided; channels are read contiguous (a copy is made otherwise).
    weight : tensor, (dim, width) or (dim, 1, width)
    bias : tensor, (dim,), or None
    conv_state : tensor, viewed as (num_cache_lines, dim, state_len)
        Any strides; the lines of the step's sequences are updated in place.
    query_start_loc : ints, (P+1,)
        Cumulative token counts of the P sequences.
    cache_indices : ints, (P,)
        Cache line of each sequence; ``pad_slot_id`` marks a padded sequence (its
        outputs are zeros, no state is touched).
    has_initial_state : bools, (P,), optional
        False: the sequence starts from zeros (None: all True).
    activation : {"silu", "swish", None}
    pad_slot_id : int
    token_indx : ints, (query_start_loc[-1],), optional
        Row of x of each token in sequence order; None: rows 0..n-1, and then
        query_start_loc[-1] must equal num_tokens.
    out : tensor, (num_tokens, dim), optional
        Where the outputs go (may alias x).
    math : {None, "exact", "fast"}
        silu's math; see ``causal_conv1d_mixed``.

    Returns
    -------
    tensor
        ``out``, or a new tensor like x. Rows no sequence uses are zeros.

    Notes
    -----
    The exact rule is docs/SEMANTICS.md. Every argument is checked before anything is
    launched; a bad one raises an error naming it, and conv_state is left as it was.
    Metadata in tensors on x's GPU is the exception: its values are checked on the
    device, a bad sequence skipped and reported by ``jitconv.check_errors`` (README,
    "Metadata on the device").
    """
    metadata = (query_start_loc, cache_indices, has_initial_state)
    if token_indx is None and device_calls.on_device(x, *metadata):
        return _run_on_device("fn", (x, weight, bias, conv_state, out), activation, math,
                              pad_slot_id, metadata, lambda geo: device_calls.build(
                                  geo, dict(device_calls.NO_ARRAYS, ns_qsl=query_start_loc,
                                            ns_lines=cache_indices,
                                            ns_init=has_initial_state), FN_DEVICE_NAMES))
    geo, checked = prepare(x, weight, bias, conv_state, out, activation, math,
                           pad_slot_id)

    def build():
        part = non_spec_part(query_start_loc, cache_indices, has_initial_state, token_indx,
                             None, _FN_NAMES, geo, whole_x=True)
        return StepPlan([part], geo, line_names="cache_indices")

    metadata = (query_start_loc, cache_indices, has_initial_state, token_indx)
    plan = plan_cache.plan_for(plan_cache.key("fn", geo, metadata), build)
    return plan.run_checked((x, weight, bias, conv_state, out), activation, checked, math)


def causal_conv1d_update(x: Array, weight: Array, bias: Optional[Array], conv_state: Array,
                         conv_state_indices: Ints, query_start_loc: Optional[Ints] = None,
                         num_accepted_tokens: Optional[Ints] = None,
                         activation: Optional[str] = "silu", pad_slot_id: int = -1,
                         token_indx: Optional[Ints] = None,
                         out: Optional[Array] = None, math: Optional[str] = None,
                         max_query_len: Optional[int] = None) -> Array:
    """Decode step: plain decodes, or spec verify when ``num_accepted_tokens`` is given.

    Parameters
    ----------
    x, weight, bias, conv_state, activation, pad_slot_id, out, math
        As in ``causal_conv1d_fn``.
    conv_state_indices : ints, (Q,) or (Q, K)
        Cache line of each sequence (column 0 of a 2-D array); ``pad_slot_id`` pads.
    query_start_loc : ints, (Q+1,), optional
        For several (ragged) tokens per sequence; None: one token per sequence, rows
        0..Q-1.
    num_accepted_tokens : ints, (Q,), optional
        Tokens accepted in the previous step (>= 1, the bonus token included): the
        window starts at state column a-1, and the state keeps the newest width-2 old
        columns, then all new tokens. None: each sequence continues from its state (the
        non-spec rule).
    token_indx : ints, optional
        Row of x of each token in sequence order; None: rows in order.
    max_query_len : int, optional
        The most tokens any sequence holds (1 + k for spec verify), declared: a longer
        sequence is an error. With metadata on the device it picks the short kernels
        (as ``jitconv.device_plan``'s); None: no bound.

    Returns
    -------
    tensor
        ``out``, or a new tensor like x.
    """
    metadata = (conv_state_indices, query_start_loc, num_accepted_tokens)
    if token_indx is None and device_calls.on_device(x, *metadata):
        longest = validation.check_max_query_len(max_query_len)
        return _run_on_device(("update", longest), (x, weight, bias, conv_state, out),
                              activation, math, pad_slot_id, metadata,
                              lambda geo: _update_device_plan(geo, *metadata, longest))
    geo, checked = prepare(x, weight, bias, conv_state, out, activation, math,
                           pad_slot_id)
    longest = validation.check_max_query_len(max_query_len)

    def build():
        qsl = query_start_loc
        if qsl is None:
            lines = validation.host_ints(conv_state_indices, "conv_state_indices",
                                         ndim=(1, 2))
            if token_indx is None and len(lines) != geo.num_tokens:
                raise ValueError(f"conv_state_indices: expected {geo.num_tokens} entries "
                                 f"(one per row of x when query_start_loc is None), got "
                                 f"{len(lines)}")
            qsl = np.arange(len(lines) + 1)
        names = {"qsl": "query_start_loc", "lines": "conv_state_indices",
                 "rows": "token_indx", "accepted": "num_accepted_tokens"}
        if num_accepted_tokens is None:
            part = non_spec_part(qsl, conv_state_indices, None, token_indx, None,
                                 names, geo, whole_x=True, lines_2d=True)
        else:
            part = spec_part(qsl, conv_state_indices, token_indx,
                             num_accepted_tokens, names, geo, whole_x=True)
        validation.check_lengths_within(part.query_start_loc, longest, "query_start_loc")
        return StepPlan([part], geo, line_names="conv_state_indices")

    metadata = (conv_state_indices, query_start_loc, num_accepted_tokens, token_indx,
                longest)
    plan = plan_cache.plan_for(plan_cache.key("update", geo, metadata), build)
    return plan.run_checked((x, weight, bias, conv_state, out), activation, checked, math)


def _run_on_device(op, args, activation, math, pad_slot_id, metadata, build, split=None):
    """A one-shot call whose metadata stays on the device: the device plan kept for
    ``op`` (a name, with what else fixes the plan), these tensors' shapes and the
    ``metadata`` tensors, else ``build(geometry)``'s after the host's checks (``prepare``),
    run on ``args`` (x, weight, bias, conv_state, out); ``split`` as ``run_checked``'s."""
    x, weight, bias, conv_state, out = args
    key = (op, device_calls.shapes(x, weight, conv_state),
           validation.check_pad_slot_id(pad_slot_id)) + tuple(
               device_calls.describe(m) for m in metadata)
    plan = device_calls.kept_plan(key, lambda: build(
        prepare(*args, activation, math, pad_slot_id)[0]))
    return plan.run_checked(args, activation, None, math, split)


def _update_device_plan(geo, lines, query_start_loc, num_accepted_tokens, max_query_len):
    """The device plan of ``causal_conv1d_update`` with metadata on the device, after the
    host's checks of what it can see (shapes), naming the op's arguments."""
    if lines is None:
        raise ValueError("conv_state_indices: required (one cache line per sequence)")
    if lines.dim() not in (1, 2) or (lines.dim() == 2 and lines.shape[1] == 0):
        raise ValueError(f"conv_state_indices: expected shape (num_seqs,) or (num_seqs, K) "
                         f"with K >= 1, got {tuple(lines.shape)}")
    qsl, declared = query_start_loc, max_query_len
    if qsl is None:  # one token per sequence, rows 0..Q-1
        if lines.shape[0] != geo.num_tokens:
            raise ValueError(f"conv_state_indices: expected {geo.num_tokens} entries (one "
                             f"per row of x when query_start_loc is None), got "
                             f"{lines.shape[0]}")
        if num_accepted_tokens is not None:  # a spec part of 1-token sequences
            qsl = torch.arange(lines.shape[0] + 1, dtype=lines.dtype, device=lines.device)
            declared = 1
    if num_accepted_tokens is None:
        given = dict(device_calls.NO_ARRAYS, ns_qsl=qsl,
                     ns_lines=lines[:, 0] if lines.dim() == 2 else lines)
    else:
        given = dict(device_calls.NO_ARRAYS, sp_qsl=qsl, sp_lines=lines,
                     sp_accepted=num_accepted_tokens)
    return device_calls.build(geo, given, UPDATE_DEVICE_NAMES, max_query_len=declared)


def causal_conv1d_mixed(x: Array, weight: Array, bias: Optional[Array], conv_state: Array, *,
                        non_spec_query_start_loc: Optional[Ints] = None,
                        non_spec_state_indices: Optional[Ints] = None,
                        has_initial_state: Optional[Ints] = None,
                        non_spec_token_indx: Optional[Ints] = None,
                        spec_query_start_loc: Optional[Ints] = None,
                        spec_state_indices: Optional[Ints] = None,
                        spec_token_indx: Optional[Ints] = None,
                        num_accepted_tokens: Optional[Ints] = None,
                        non_spec_num_accepted_tokens: Optional[Ints] = None,
                        activation: Optional[str] = "silu", pad_slot_id: int = -1,
                        out: Optional[Array] = None, math: Optional[str] = None,
                        split: bool = False, out_spec: Optional[Array] = None,
                        out_non_spec: Optional[Array] = None,
                        spec_parent_token: Optional[Ints] = None,
                        non_spec_parent_token: Optional[Ints] = None,
                        spec_window_rows: Optional[Ints] = None,
                        non_spec_window_rows: Optional[Ints] = None,
                        intermediate_windows: Optional[Array] = None,
                        spec_write_indices: Optional[Ints] = None,
                        non_spec_write_indices: Optional[Ints] = None,
                        non_spec_checkpoint_loc: Optional[Ints] = None,
                        non_spec_checkpoint_pos: Optional[Ints] = None,
                        non_spec_checkpoint_indices: Optional[Ints] = None,
                        non_spec_cache_seqlens: Optional[Ints] = None) -> Array:
    """One engine step of a hybrid model in ONE kernel launch: prefill chunks, plain
    decodes (the non-spec part) and spec-decode verify sequences (the spec part).

    Parameters
    ----------
    x, weight, bias, conv_state, activation, pad_slot_id, out
        As in ``causal_conv1d_fn``.
    non_spec_query_start_loc, non_spec_state_indices, has_initial_state : ints, optional
        The non-spec part (prefill chunks and plain decodes), as ``causal_conv1d_fn``'s
        query_start_loc, cache_indices and has_initial_state. None: no such part.
    non_spec_token_indx, spec_token_indx : ints, optional
        Row of x of each token of the part, in sequence order; the maps may interleave
        the parts' rows in any order. Without maps the non-spec tokens are rows
        0..n_ns-1 and the spec tokens the rows after them (together they must cover x).
    spec_query_start_loc, spec_state_indices : ints, optional
        The spec (verify) part: cumulative token counts, and cache lines as (Q,) or
        (Q, K). None: no such part.
    num_accepted_tokens : ints, (Q,), optional
        The spec part's accepted counts, as in ``causal_conv1d_update``.
    non_spec_num_accepted_tokens : ints, (P,), optional
        A non-spec sequence that follows a spec step which accepted a tokens reads its
        window at state column a-1 (default: column 0).
    math : {None, "exact", "fast"}
        silu's math, with one meaning on both backends. "exact": libm's exp and IEEE
        division. "fast": the device's approximate exp (on CUDA also the approximate
        division), within the contract's tolerances, NaN and inf kept. None: the
        backend's default for the dtype (SYCL: "fast" for float16 / bfloat16, "exact"
        for float32; CUDA: "fast"). Each choice is its own kernel.
    split : bool
        Return the outputs split by part, written by the same launch:
        ``jitconv.SplitOutputs(spec, non_spec)`` of shapes (spec tokens, dim) and
        (non-spec tokens, dim), row k the part's k-th token, as
        ``out.index_select(0, spec_token_indx)`` / ``(0, non_spec_token_indx)`` would
        give (with the default maps: the part's rows in order); None for a part without
        tokens. Rows of x that no sequence covers are written nowhere.
    out_spec, out_non_spec : tensors, optional
        The split outputs to write into (implies ``split``; not with ``out``). A part
        with tokens needs its tensor; they may not overlap x, weight, bias, conv_state
        or each other.
    spec_parent_token, non_spec_parent_token : ints, (sequences, >= longest), optional
        Tree verify: entry t of a sequence is its token t's parent position (token 0 the
        root, its entry ignored; every other parent before its child). A token's window
        runs through its ancestors, then the line's window. None: the linear chain.
    spec_window_rows, non_spec_window_rows : ints, (sequences,), optional
        Each sequence's row of ``intermediate_windows`` (distinct across the step).
    intermediate_windows : tensor, (rows, steps, dim, width - 1), optional
        Written for the sequences with window rows: [row, t] gets token t's S newest
        inputs (the state after it, along its chain); x's dtype, any strides. With
        parent maps or windows, out may not alias x.
    spec_write_indices, non_spec_write_indices : ints, (sequences,), optional
        The line each sequence writes its new state to; its window is still read from
        its state_indices line, which is then left as it was (unless a checkpoint
        writes it). Prefix caching: read one block's line, write another's.
    non_spec_checkpoint_loc, non_spec_checkpoint_pos, non_spec_checkpoint_indices : ints
        Checkpoints of non-spec sequences: loc (sequences + 1,) cumulative counts, pos
        and indices (loc[-1],). Checkpoint k of sequence i (entries loc[i]:loc[i+1],
        positions increasing, each in [1, its tokens]) writes the S inputs before token
        pos (the state after its first pos tokens) to columns 0..S-1 of line
        indices[k]. A checkpoint may write the line the sequence reads; every other
        line a step writes belongs to one sequence and is read by no other.
    non_spec_cache_seqlens : ints, (sequences,), optional
        Circular lines (the Dao-AILab/causal-conv1d convention): each non-spec line is a
        ring of state_len inputs holding cache_seqlens of them so far; with c =
        cache_seqlens % state_len the window is columns (c - S + k) % state_len, and
        token k goes to column (c + k) % state_len (the caller advances the counts). Not
        with write lines, checkpoints or non_spec_num_accepted_tokens.

    Returns
    -------
    tensor or SplitOutputs
        ``out``, or a new tensor like x (rows no sequence uses are zeros); with split
        outputs a ``jitconv.SplitOutputs``.

    Keyword names follow vLLM's GDN metadata; the rule is docs/SEMANTICS.md.
    """
    meta = StepMetadata.of({n: v for n, v in locals().items() if n in METADATA_NAMES})
    return mixed(x, weight, bias, conv_state, meta, activation=activation,
                 pad_slot_id=pad_slot_id, out=out, math=math,
                 split=split_request(split, out_spec, out_non_spec),
                 windows=intermediate_windows)


def mixed(x, weight, bias, conv_state, meta, *, activation="silu", pad_slot_id=-1, out=None,
          math=None, split=None, windows=None):
    """``causal_conv1d_mixed`` with its metadata as one ``StepMetadata`` and ``split`` from
    ``plan.split_request``: one plan (kept by the metadata's content, or on the device
    for metadata tensors there) and one run."""
    arrays = meta.device_arrays()
    if not meta.has_rules() and windows is None and _device_fits(x, arrays, split) and \
            device_calls.on_device(x, *arrays.values()):
        return _run_on_device("mixed", (x, weight, bias, conv_state, out), activation, math,
                              pad_slot_id, tuple(arrays.values()), lambda geo: device_calls.build(
                                  geo, arrays, device_plan.ARGUMENT_NAMES), split)
    geo, checked = prepare(x, weight, bias, conv_state, out, activation, math,
                           pad_slot_id)
    plan = plan_cache.plan_for(plan_cache.key("mixed", geo, meta.all_values()),
                               lambda: plan_from(meta, geo))
    return plan.run_checked((x, weight, bias, conv_state, out), activation, checked, math,
                            split, windows)


def _device_fits(x, arrays, split):
    """Whether a device plan gives what the call asks for as a host plan does: without
    token maps outputs in x's rows (split outputs need each part's token count); with
    them split outputs (each part's rows: its map's), or x's rows where the maps name
    every row of x (their lengths, shapes the host reads, add up to x's rows)."""
    maps = [arrays[k] for k in ("ns_map", "sp_map") if arrays[k] is not None]
    if not maps:
        return split is None
    if split is not None:
        return True
    lengths = [getattr(m, "shape", (None,))[0] for m in maps]
    return None not in lengths and sum(lengths) == getattr(x, "shape", (None,))[0]


def plan(num_tokens: int, num_cache_lines: int, state_len: int, width: int, *,
         non_spec_query_start_loc: Optional[Ints] = None,
         non_spec_state_indices: Optional[Ints] = None,
         has_initial_state: Optional[Ints] = None, non_spec_token_indx: Optional[Ints] = None,
         spec_query_start_loc: Optional[Ints] = None,
         spec_state_indices: Optional[Ints] = None, spec_token_indx: Optional[Ints] = None,
         num_accepted_tokens: Optional[Ints] = None,
         non_spec_num_accepted_tokens: Optional[Ints] = None, pad_slot_id: int = -1,
         queue: Any = None, spec_parent_token: Optional[Ints] = None,
         non_spec_parent_token: Optional[Ints] = None,
         spec_window_rows: Optional[Ints] = None,
         non_spec_window_rows: Optional[Ints] = None,
         spec_write_indices: Optional[Ints] = None,
         non_spec_write_indices: Optional[Ints] = None,
         non_spec_checkpoint_loc: Optional[Ints] = None,
         non_spec_checkpoint_pos: Optional[Ints] = None,
         non_spec_checkpoint_indices: Optional[Ints] = None,
         non_spec_cache_seqlens: Optional[Ints] = None) -> StepPlan:
    """Validate one engine step's metadata once, for every layer of the step.

    Parameters
    ----------
    num_tokens, num_cache_lines, state_len, width : int
        The geometry every layer's tensors must have: x with ``num_tokens`` rows,
        conv_state viewed as (``num_cache_lines``, dim, ``state_len``), weights of
        ``width`` taps.
    non_spec_query_start_loc, ..., non_spec_num_accepted_tokens, pad_slot_id
        ``causal_conv1d_mixed``'s metadata: same rules, same errors. Numpy arrays,
        lists, CPU or device tensors: read here, once, and never again.
    spec_parent_token, ..., non_spec_cache_seqlens
        Parent maps, windows rows, write lines, checkpoints and rings, as in
        ``causal_conv1d_mixed`` (runs with window rows take ``intermediate_windows=``).
    queue : dpctl.SyclQueue, optional
        Where runs go on SYCL (default: torch's current stream for XPU tensors, an
        array's own queue for dpctl/dpnp arrays, else the current device's queue).

    Returns
    -------
    StepPlan
        ``plan.run(x, weight, bias, conv_state, out=None, activation="silu",
        math=None)`` does the conv of one layer.
    """
    geo = validation.check_geometry(num_tokens, num_cache_lines, state_len, width, pad_slot_id)
    meta = StepMetadata.of({n: v for n, v in locals().items() if n in METADATA_NAMES})
    return plan_from(meta, geo, queue)


# The state rules' argument names by role (``with_rules``).
SPEC_RULES = dict(parents="spec_parent_token", window_rows="spec_window_rows",
                  write_lines="spec_write_indices")
NON_SPEC_RULES = dict(parents="non_spec_parent_token", window_rows="non_spec_window_rows",
                      write_lines="non_spec_write_indices", loc="non_spec_checkpoint_loc",
                      pos="non_spec_checkpoint_pos", lines="non_spec_checkpoint_indices",
                      ring="non_spec_cache_seqlens")


def plan_from(meta, geo, queue=None):
    """The StepPlan of a step's ``StepMetadata`` for a checked Geometry (``jitconv.plan``
    once its geometry is checked): each part validated, errors naming the metadata
    keywords."""
    m = meta
    no_maps = m.non_spec_token_indx is None and m.spec_token_indx is None
    parts = []
    if m.non_spec_query_start_loc is None:
        _reject_orphans(m, ("non_spec_state_indices", "has_initial_state",
                            "non_spec_token_indx", "non_spec_num_accepted_tokens",
                            *NON_SPEC_RULES.values()), "non_spec_query_start_loc")
    else:
        parts.append(non_spec_part(
            m.non_spec_query_start_loc, m.non_spec_state_indices, m.has_initial_state,
            m.non_spec_token_indx, m.non_spec_num_accepted_tokens,
            {"qsl": "non_spec_query_start_loc", "lines": "non_spec_state_indices",
             "init": "has_initial_state", "rows": "non_spec_token_indx",
             "accepted": "non_spec_num_accepted_tokens"},
            geo, whole_x=no_maps and m.spec_query_start_loc is None))
        parts[-1] = with_rules(parts[-1], dict(
            parents=m.non_spec_parent_token, window_rows=m.non_spec_window_rows,
            write_lines=m.non_spec_write_indices, loc=m.non_spec_checkpoint_loc,
            pos=m.non_spec_checkpoint_pos, lines=m.non_spec_checkpoint_indices,
            ring=m.non_spec_cache_seqlens, accepted=m.non_spec_num_accepted_tokens),
            NON_SPEC_RULES, geo)
    if m.spec_query_start_loc is None:
        _reject_orphans(m, ("spec_state_indices", "spec_token_indx", "num_accepted_tokens",
                            *SPEC_RULES.values()), "spec_query_start_loc")
    else:
        first = int(parts[0].query_start_loc[-1]) if parts else 0
        parts.append(spec_part(
            m.spec_query_start_loc, m.spec_state_indices, m.spec_token_indx,
            m.num_accepted_tokens,
            {"qsl": "spec_query_start_loc", "lines": "spec_state_indices",
             "rows": "spec_token_indx", "accepted": "num_accepted_tokens"},
            geo, first_row=first, whole_x=no_maps))
        parts[-1] = with_rules(parts[-1], dict(
            parents=m.spec_parent_token, window_rows=m.spec_window_rows,
            write_lines=m.spec_write_indices), SPEC_RULES, geo)
    return StepPlan(parts, geo, queue=queue,
                    row_names="non_spec_token_indx/spec_token_indx",
                    line_names="non_spec_state_indices/spec_state_indices")


def _reject_orphans(meta, names, owner):
    for name in names:
        if getattr(meta, name) is not None:
            raise ValueError(f"{name}: given without {owner}; pass {owner} too, or drop it")


def clear_caches() -> None:
    """Forget everything jitconv keeps between calls in this process: the one-shot ops'
    plans (``plan_cache``) and, per backend, compiled kernels and planners, tables copied
    to devices, remembered launches, device-check verdicts, error words not yet read by
    ``check_errors`` and counters (``jitconv.backends.*.state``). For tests and long-lived
    processes; whatever is needed again is made again (kernels from the disk cache). Plans
    the caller holds stay valid. Not for use while other threads run jitconv calls."""
    plan_cache.clear()
    registry.clear_caches()
