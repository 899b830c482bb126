"""Public ops: validate everything on the host, then one kernel launch.

All ops share one path: metadata -> ``batch.Part``s (one per kind of sequence) ->
``batch.Batch`` -> ONE launch of the mixed kernel, whatever mix of prefill chunks, plain
decodes, spec verify sequences and pads the step holds. ``causal_conv1d_fn`` and
``causal_conv1d_update`` are thin views of ``causal_conv1d_mixed``'s machinery.
The contract is docs/SEMANTICS.md; ``jitconv.reference`` implements it in float64.
"""

import threading
from dataclasses import dataclass

import numpy as np

from . import bridge, launching, validation
from . import device as devices
from .batch import Part, build_batch
from .kernel_abi import TABLES


_launch_lock = threading.Lock()


@dataclass
class _Geometry:
    """What the metadata checks need to know about the data tensors."""
    num_tokens: int
    num_lines: int
    state_len: int
    width: int
    pad_slot_id: int


def _sequences(query_start_loc, state_indices, token_indx, names, geo, first_row,
               whole_x, lines_2d=False):
    """Common checks of one part: returns (qsl, lines, real mask, rows)."""
    qsl = validation.host_ints(query_start_loc, names["qsl"])
    validation.check_query_start_loc(qsl, names["qsl"])
    count, nseq = int(qsl[-1]), len(qsl) - 1
    if state_indices is None:
        raise ValueError(f"{names['lines']}: required when {names['qsl']} is given "
                         f"(one cache line per sequence)")
    ndim = len(getattr(state_indices, "shape", (0,)))
    if lines_2d and ndim not in (1, 2):
        raise ValueError(f"{names['lines']}: expected shape (num_seqs,) or (num_seqs, K), "
                         f"got {tuple(state_indices.shape)}")
    lines = validation.host_ints(state_indices, names["lines"], ndim=ndim if lines_2d else 1)
    if lines.ndim == 2:
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
    return Part(qsl, np.where(real, lines, -1), rows, offsets, initial, spec=False)


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
    return Part(qsl, np.where(real, lines, -1), rows, offsets,
                np.ones(len(lines), bool), spec=True)


def _prepare(x, weight, bias, conv_state, out, activation, pad_slot_id):
    """Tensor checks shared by every op. Returns the normalized tensors and geometry."""
    silu = validation.check_activation(activation)
    if isinstance(pad_slot_id, bool) or not isinstance(pad_slot_id, (int, np.integer)):
        raise TypeError(f"pad_slot_id: expected an int, got {pad_slot_id!r}")
    names = ("x", "weight", "bias", "conv_state", "out")
    x, weight, bias, conv_state, out = [
        bridge.normalize(t, n) for t, n in zip((x, weight, bias, conv_state, out), names)]
    _dim, width, dtype = validation.check_tensors(x, weight, bias, conv_state, out)
    num_lines, _, state_len = validation.shape_of(conv_state)
    geo = _Geometry(validation.shape_of(x)[0], num_lines, state_len, width,
                    int(pad_slot_id))
    return (x, weight, bias, conv_state, out), silu, dtype, geo


def execute(tensors, parts, *, silu, dtype, geo, row_names="token_indx",
            line_names="state_indices"):
    """Check the parts together, then launch the kernel once. Returns the output."""
    x, weight, bias, conv_state, out = tensors
    all_rows = np.concatenate([p.rows for p in parts] + [np.zeros(0, np.int64)])
    validation.check_unique(all_rows, row_names, "row", geo.num_tokens)
    all_lines = np.concatenate([p.lines for p in parts] + [np.zeros(0, np.int64)])
    validation.check_unique(all_lines[all_lines >= 0], line_names, "cache line",
                            geo.num_lines)

    batch = build_batch(parts, geo.num_tokens)
    dim = validation.shape_of(x)[1]
    # The kernel needs channels contiguous in x and out (see kernel_abi). out may also
    # alias x, and the kernel reads neighbouring rows of x: then compute into a separate
    # buffer and copy (both cases are rare; correctness over a saved copy).
    x = bridge.channels_contiguous(x)
    target = out
    if out is None or bridge.overlaps(out, x) or not bridge.has_unit_channel_stride(out):
        if out is not None and not bridge.can_assign(out):
            raise ValueError(f"out: a {type(out.source).__name__} that overlaps x or has "
                             f"strided channels cannot be written through a copy; pass "
                             f"out=None or a separate array with contiguous channels")
        target = bridge.empty_like_output(x, validation.shape_of(x), dtype)
    if dim == 0 or batch.num_blocks == 0:
        return _finish(out, target)

    queue = devices.get_queue()
    views, write_backs = {}, []
    for name, t, writable in (("x", x, False), ("out", target, True),
                              ("weight", weight, False), ("conv_state", conv_state, True)):
        views[name], wb = bridge.to_device(t, name, writable, queue)
        if wb is not None:
            write_backs.append(wb)
    if len(views["weight"].shape) == 3:  # (dim, 1, width): drop the unit axis
        w = views["weight"]
        views["weight"] = w._replace(shape=(w.shape[0], w.shape[2]),
                                     strides=(w.strides[0], w.strides[2]))
    if bias is not None:
        views["bias"], _ = bridge.to_device(bias, "bias", False, queue)
    else:
        # The kernel does not read bias then, but the argument must be a valid 1-D array.
        views["bias"] = views["weight"]._replace(shape=(1,), strides=(1,))
    flat = {name: bridge.flatten(view) for name, view in views.items()}
    args = {"has_bias": int(bias is not None), "silu": int(silu)}
    for name, prefix in (("x", "x"), ("out", "out"), ("weight", "weight"),
                         ("bias", "bias"), ("conv_state", "state")):
        args[prefix], args[f"{prefix}_offset"], _strides = flat[name]
    args["x_row_stride"] = flat["x"][2][0]
    args["out_row_stride"] = flat["out"][2][0]
    args["weight_stride_c"], args["weight_stride_k"] = flat["weight"][2]
    args["bias_stride"] = flat["bias"][2][0]
    (args["state_stride_line"], args["state_stride_c"],
     args["state_stride_col"]) = flat["conv_state"][2]
    with _launch_lock:  # the table buffer is reused: one writer until its kernel is done
        args["tables"], offsets = bridge.write_tables(batch.tables(), queue)
        args.update(zip(TABLES, offsets))
        launching.launch_conv(geo.width, dtype, args, batch.num_blocks, dim)
    for wb in write_backs:
        wb()
    return _finish(out, target)


def _finish(out, target):
    if out is not None and target is not out:
        bridge.assign(out, target)
        target = out
    return target.source if isinstance(target, bridge.UsmArray) else target


_FN_NAMES = {"qsl": "query_start_loc", "lines": "cache_indices",
             "init": "has_initial_state", "rows": "token_indx"}


def causal_conv1d_fn(x, weight, bias, conv_state, query_start_loc, cache_indices,
                     has_initial_state=None, activation="silu", pad_slot_id=-1,
                     token_indx=None, out=None):
    """Causal depthwise conv1d over prefill chunks and plain decodes (non-spec tokens).

    x: (num_tokens, dim), rows may be strided; weight: (dim, width) or (dim, 1, width);
    bias: (dim,) or None; conv_state: viewed as (num_cache_lines, dim, state_len), any
    strides, updated in place. query_start_loc: (P+1,) cumulative token counts;
    cache_indices: (P,) cache line per sequence (pad_slot_id marks a padded sequence:
    zeros out, state untouched); has_initial_state: (P,) bool or None (all True);
    token_indx: row of x for each token in sequence order, or None for rows 0..n-1 (then
    query_start_loc[-1] must equal num_tokens). Returns out (new, or the given ``out``,
    which may alias x). See docs/SEMANTICS.md for the exact rule.
    """
    tensors, silu, dtype, geo = _prepare(x, weight, bias, conv_state, out, activation,
                                         pad_slot_id)
    part = non_spec_part(query_start_loc, cache_indices, has_initial_state, token_indx,
                         None, _FN_NAMES, geo, whole_x=True)
    return execute(tensors, [part], silu=silu, dtype=dtype, geo=geo,
                   line_names="cache_indices")


def causal_conv1d_update(x, weight, bias, conv_state, conv_state_indices,
                         query_start_loc=None, num_accepted_tokens=None, activation="silu",
                         pad_slot_id=-1, token_indx=None, out=None):
    """Decode step: plain decodes, or spec verify when ``num_accepted_tokens`` is given.

    x: (num_tokens, dim). conv_state_indices: (Q,) or (Q, K) int (column 0 is the line).
    query_start_loc: (Q+1,) for several (ragged) tokens per sequence; None means one
    token per sequence (rows 0..Q-1). num_accepted_tokens: (Q,) tokens accepted in the
    previous step (>= 1, bonus token included): the window starts at column a-1 and the
    state keeps the newest width-2 old columns then all new tokens. Without it, each
    sequence continues from its state (non-spec rule).
    """
    tensors, silu, dtype, geo = _prepare(x, weight, bias, conv_state, out, activation,
                                         pad_slot_id)
    if query_start_loc is None:
        lines = validation.host_ints(conv_state_indices, "conv_state_indices",
                                     ndim=len(getattr(conv_state_indices, "shape", (0,))))
        if token_indx is None and len(lines) != geo.num_tokens:
            raise ValueError(f"conv_state_indices: expected {geo.num_tokens} entries (one "
                             f"per row of x when query_start_loc is None), got {len(lines)}")
        query_start_loc = np.arange(len(lines) + 1)
    names = {"qsl": "query_start_loc", "lines": "conv_state_indices",
             "rows": "token_indx", "accepted": "num_accepted_tokens"}
    if num_accepted_tokens is None:
        part = non_spec_part(query_start_loc, conv_state_indices, None, token_indx, None,
                             names, geo, whole_x=True, lines_2d=True)
    else:
        part = spec_part(query_start_loc, conv_state_indices, token_indx,
                         num_accepted_tokens, names, geo, whole_x=True)
    return execute(tensors, [part], silu=silu, dtype=dtype, geo=geo,
                   line_names="conv_state_indices")


def causal_conv1d_mixed(x, weight, bias, conv_state, *, non_spec_query_start_loc=None,
                        non_spec_state_indices=None, has_initial_state=None,
                        non_spec_token_indx=None, spec_query_start_loc=None,
                        spec_state_indices=None, spec_token_indx=None,
                        num_accepted_tokens=None, non_spec_num_accepted_tokens=None,
                        activation="silu", pad_slot_id=-1, out=None):
    """One engine step of a hybrid model in ONE kernel launch: prefill chunks, plain
    decodes (the non-spec part) and spec-decode verify sequences (the spec part).

    Keyword names follow vLLM's GDN metadata. Either part may be absent. Token index maps
    may interleave spec and non-spec rows in any order; without maps the non-spec tokens
    are rows 0..n_ns-1 and the spec tokens the rows after them (then together they must
    cover x). Rows no sequence uses come out as zeros. ``non_spec_num_accepted_tokens``
    (P,), optional: a non-spec sequence that follows a spec step which accepted a tokens
    reads its window at column a-1 (default: column 0).
    """
    tensors, silu, dtype, geo = _prepare(x, weight, bias, conv_state, out, activation,
                                         pad_slot_id)
    no_maps = non_spec_token_indx is None and spec_token_indx is None
    parts = []
    given = {"non_spec_state_indices": non_spec_state_indices,
             "has_initial_state": has_initial_state,
             "non_spec_token_indx": non_spec_token_indx,
             "non_spec_num_accepted_tokens": non_spec_num_accepted_tokens}
    if non_spec_query_start_loc is None:
        _reject_orphans(given, "non_spec_query_start_loc")
    else:
        parts.append(non_spec_part(
            non_spec_query_start_loc, non_spec_state_indices, has_initial_state,
            non_spec_token_indx, non_spec_num_accepted_tokens,
            {"qsl": "non_spec_query_start_loc", "lines": "non_spec_state_indices",
             "init": "has_initial_state", "rows": "non_spec_token_indx",
             "accepted": "non_spec_num_accepted_tokens"},
            geo, whole_x=no_maps and spec_query_start_loc is None))
    given = {"spec_state_indices": spec_state_indices, "spec_token_indx": spec_token_indx,
             "num_accepted_tokens": num_accepted_tokens}
    if spec_query_start_loc is None:
        _reject_orphans(given, "spec_query_start_loc")
    else:
        first = int(parts[0].query_start_loc[-1]) if parts else 0
        parts.append(spec_part(
            spec_query_start_loc, spec_state_indices, spec_token_indx, num_accepted_tokens,
            {"qsl": "spec_query_start_loc", "lines": "spec_state_indices",
             "rows": "spec_token_indx", "accepted": "num_accepted_tokens"},
            geo, first_row=first, whole_x=no_maps))
    return execute(tensors, parts, silu=silu, dtype=dtype, geo=geo,
                   row_names="non_spec_token_indx/spec_token_indx",
                   line_names="non_spec_state_indices/spec_state_indices")


def _reject_orphans(given, owner):
    for name, value in given.items():
        if value is not None:
            raise ValueError(f"{name}: given without {owner}; pass {owner} too, or drop it")
