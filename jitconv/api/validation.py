"""Input checks shared by the public ops. Everything here runs on the host, before any
launch, so a bad call never touches conv_state.

Errors name the argument and say what was expected: TypeError for a wrong kind or dtype,
ValueError for a wrong shape or value.
"""

from dataclasses import dataclass

import numpy as np
import torch

from jitconv.backends import registry
from jitconv.memory import arrays
from jitconv.kernels import abi
from jitconv.kernels.abi import SUPPORTED_WIDTHS

FLOAT_DTYPES = ("float32", "float16", "bfloat16")


def shape_of(t):
    """The shape as a tuple of ints (torch.Size and UsmArray shapes already are)."""
    return tuple(t.shape)


def check_activation(activation):
    if activation not in abi.ACTIVATIONS:
        raise ValueError(f"activation must be 'silu', 'swish' or None, got {activation!r}")
    return activation is not None


def activation_name(activation):
    """An engine's activation argument as the ops take it: True / False (SGLang, old vLLM
    releases) are "silu" / None; anything else as given (checked by check_activation)."""
    if isinstance(activation, bool):
        return "silu" if activation else None
    return activation


def check_math(math):
    """``math``: None (the backend's default for the dtype), "exact" or "fast"."""
    if math not in abi.MATHS:
        raise ValueError(f"math must be 'exact', 'fast' or None (the default), got {math!r}")
    return math


def check_tensors(x, weight, bias, conv_state, out):
    """Shapes, dtypes and devices of the data tensors. Returns (dim, width, dtype name).
    Runs on every layer: each property is read once."""
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise TypeError(f"x: expected a tensor, got {type(x).__name__}")
    xshape = shape_of(x)
    if len(xshape) != 2:
        raise ValueError(f"x: expected shape (num_tokens, dim), got {xshape}")
    dtype = arrays.dtype_name(x)
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"x: dtype must be one of {FLOAT_DTYPES}, got {dtype}")
    dim = xshape[1]

    wshape = shape_of(weight)
    if not (len(wshape) == 2 or (len(wshape) == 3 and wshape[1] == 1)) or wshape[0] != dim:
        raise ValueError(f"weight: expected shape (dim, width) or (dim, 1, width) with "
                         f"dim={dim}, got {wshape}")
    width = wshape[-1]
    if width not in SUPPORTED_WIDTHS:
        raise ValueError(f"weight: width (last dimension) must be one of "
                         f"{SUPPORTED_WIDTHS}, got {width}")
    _same_dtype("weight", weight, dtype)
    if bias is not None:
        if shape_of(bias) != (dim,):
            raise ValueError(f"bias: expected shape ({dim},) or None, got {shape_of(bias)}")
        _same_dtype("bias", bias, dtype)

    sshape = shape_of(conv_state)
    if len(sshape) != 3 or sshape[1] != dim:
        raise ValueError(f"conv_state: expected a view of shape (num_cache_lines, dim="
                         f"{dim}, state_len) (pass a transposed view for (lines, state_len,"
                         f" dim) storage), got {sshape}")
    if sshape[2] < width - 1:
        raise ValueError(f"conv_state: state_len (shape[2]) must be >= width - 1 = "
                         f"{width - 1}, got {sshape[2]}")
    _same_dtype("conv_state", conv_state, dtype)
    _check_strides("conv_state", conv_state)

    if out is not None:
        if shape_of(out) != xshape:
            raise ValueError(f"out: expected shape {xshape} (same as x), "
                             f"got {shape_of(out)}")
        _same_dtype("out", out, dtype)
        _check_strides("out", out)

    where = _where(x)
    for name, t in (("weight", weight), ("bias", bias), ("conv_state", conv_state),
                    ("out", out)):
        if t is not None and _where(t) != where:
            raise ValueError(f"{name}: expected a tensor on the same device as x "
                             f"({arrays.device_of(x)}), got one on {arrays.device_of(t)}")
    return dim, width, dtype


def _where(t):
    """A cheap comparable device key (torch.device objects compare without str())."""
    return t.device if isinstance(t, torch.Tensor) else arrays.device_of(t)


def _same_dtype(name, t, dtype):
    got = arrays.dtype_name(t)
    if got != dtype:
        raise TypeError(f"{name}: dtype must match x ({dtype}), got {got}")


def _check_strides(name, t):
    strides = t.stride()  # torch tensors and arrays.UsmArray, in elements
    if min(strides, default=0) < 0:
        raise ValueError(f"{name}: negative strides are not supported, got {tuple(strides)}")


_INT32 = (-(1 << 31), (1 << 31) - 1)  # the kernel's tables are int32


def host_ints(t, name, ndim=1, allow_bool=False):
    """Metadata as an int64 numpy array on the host (read from any device). ``ndim``: the
    number of dimensions required, or a tuple of those allowed. Every value must fit the
    kernel's int32 tables: a value that does not (an unsigned 2**64 - 1 would otherwise
    wrap to -1, a pad) is an error naming the argument."""
    if isinstance(t, torch.Tensor):
        if t.is_floating_point() or t.is_complex() or (t.dtype == torch.bool and not allow_bool):
            raise TypeError(f"{name}: expected an integer tensor, got dtype {t.dtype}")
        if t.device.type == "meta":
            raise TypeError(f"{name}: a tensor on torch's meta device has no values; pass "
                            f"it on the CPU or the device")
        if t.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"{name}: read on the host while a CUDA graph is captured "
                               f"(the replays would keep this step's values); capture runs "
                               f"of jitconv.device_plan, which read the metadata on the "
                               f"device")
        arr = t.detach().cpu().numpy()
    else:
        arr = registry.host_array(t, name) if arrays.is_device_array(t) else np.asarray(t)
        if arr.dtype == object or not (np.issubdtype(arr.dtype, np.integer)
                                       or (allow_bool and arr.dtype == np.bool_)):
            raise TypeError(f"{name}: expected integers, got dtype {arr.dtype}")
    allowed = ndim if isinstance(ndim, tuple) else (ndim,)
    if arr.ndim not in allowed:
        want = " or ".join(f"{n}-D" for n in allowed)
        raise ValueError(f"{name}: expected a {want} array, got shape {arr.shape}")
    if arr.size and arr.dtype != np.bool_:
        low, high = arr.min(), arr.max()  # compared before any cast: no wraparound
        if low < _INT32[0] or high > _INT32[1]:
            bad = high if high > _INT32[1] else low
            raise ValueError(f"{name}: value {int(bad)} does not fit the int32 range "
                             f"[{_INT32[0]}, {_INT32[1]}] of jitconv's tables")
    return arr.astype(np.int64)


def check_query_start_loc(qsl, name):
    """(P+1,) cumulative token counts: starts at 0 and never decreases. (Where it must
    end depends on the token maps: ops checks that.)"""
    if len(qsl) < 1:
        raise ValueError(f"{name}: expected at least one element (0), got an empty array")
    if qsl[0] != 0:
        raise ValueError(f"{name}: must start at 0, got {qsl[0]}")
    if np.any(np.diff(qsl) < 0):
        bad = int(np.argmax(np.diff(qsl) < 0))
        raise ValueError(f"{name}: must be non-decreasing, but {name}[{bad + 1}]="
                         f"{qsl[bad + 1]} < {name}[{bad}]={qsl[bad]}")


def check_lines(lines, name, num_seqs, num_lines, pad_slot_id):
    if len(lines) != num_seqs:
        raise ValueError(f"{name}: expected {num_seqs} entries (one per sequence), "
                         f"got {len(lines)}")
    real = lines[lines != pad_slot_id]
    bad = real[(real < 0) | (real >= num_lines)]
    if len(bad):
        raise ValueError(f"{name}: cache line {int(bad[0])} is out of range [0, "
                         f"{num_lines}) and is not pad_slot_id={pad_slot_id}")


def check_token_indx(rows, name, count, num_tokens):
    if len(rows) != count:
        raise ValueError(f"{name}: expected {count} entries (one per token), got {len(rows)}")
    bad = rows[(rows < 0) | (rows >= num_tokens)]
    if len(bad):
        raise ValueError(f"{name}: row {int(bad[0])} is out of range [0, {num_tokens})")


def check_unique(values, name, what, bound):
    """Every value (already checked to lie in [0, bound)) appears at most once. A count
    per value, not a sort: this runs on every call."""
    if len(values) < 2:
        return
    counts = np.bincount(values, minlength=bound)
    if counts.max() > 1:
        raise ValueError(f"{name}: {what} {int(np.argmax(counts > 1))} is used more "
                         f"than once in one call")


# ---------------------------------------------------------------- plans

@dataclass(frozen=True, kw_only=True)
class Geometry:
    """What the metadata checks need to know about the data tensors of a step."""
    num_tokens: int   # rows of x (and out)
    num_lines: int    # cache lines of conv_state
    state_len: int
    width: int
    pad_slot_id: int


def check_geometry(num_tokens, num_cache_lines, state_len, width, pad_slot_id):
    """The plan's geometry arguments as a Geometry (errors name the argument)."""
    values = {}
    for name, value, low in (("num_tokens", num_tokens, 0),
                             ("num_cache_lines", num_cache_lines, 0),
                             ("state_len", state_len, 1), ("width", width, 2),
                             ("pad_slot_id", pad_slot_id, None)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{name}: expected an int, got {value!r}")
        if low is not None and value < low:
            raise ValueError(f"{name}: expected an int >= {low}, got {value}")
        values[name] = int(value)
    if values["width"] not in SUPPORTED_WIDTHS:
        raise ValueError(f"width: must be one of {SUPPORTED_WIDTHS}, got {width}")
    if values["state_len"] < values["width"] - 1:
        raise ValueError(f"state_len: must be >= width - 1 = {values['width'] - 1}, "
                         f"got {state_len}")
    return Geometry(num_tokens=values["num_tokens"], num_lines=values["num_cache_lines"],
                    state_len=values["state_len"], width=values["width"],
                    pad_slot_id=values["pad_slot_id"])


def check_pad_slot_id(pad_slot_id):
    if isinstance(pad_slot_id, bool) or not isinstance(pad_slot_id, (int, np.integer)):
        raise TypeError(f"pad_slot_id: expected an int, got {pad_slot_id!r}")
    return int(pad_slot_id)


def check_max_query_len(max_query_len):
    """A declared bound on tokens per sequence: None, or an int >= 1."""
    if max_query_len is None:
        return None
    if isinstance(max_query_len, bool) or not isinstance(max_query_len, (int, np.integer)) \
            or max_query_len < 1:
        raise ValueError(f"max_query_len: expected an int >= 1 or None, got "
                         f"{max_query_len!r}")
    return int(max_query_len)


def check_lengths_within(query_start_loc, longest, name):
    """No sequence of ``query_start_loc`` (checked) holds more than ``longest`` tokens
    (None: no bound)."""
    if longest is None or len(query_start_loc) < 2:
        return
    lengths = np.diff(query_start_loc)
    if lengths.max() > longest:
        i = int(np.argmax(lengths))
        raise ValueError(f"max_query_len: declared {longest}, but sequence {i} of {name} "
                         f"holds {int(lengths[i])} tokens")


def check_fits_plan(geometry, x, conv_state, width):
    """x, conv_state and the width of one run have the plan's geometry (errors name the
    tensor and the plan's expectation)."""
    rows = shape_of(x)[0]
    lines, _dim, state_len = shape_of(conv_state)
    for name, got, want, what in (("x", rows, geometry.num_tokens, "rows (num_tokens)"),
                                  ("weight", width, geometry.width, "taps (width)"),
                                  ("conv_state", lines, geometry.num_lines,
                                   "cache lines (num_cache_lines)"),
                                  ("conv_state", state_len, geometry.state_len,
                                   "columns (state_len)")):
        if got != want:
            raise ValueError(f"{name}: has {got} {what}, but the plan was built for {want}")


# ------------------------------------------------------- writability and aliasing

def check_writable(x, weight, bias, conv_state, out):
    """The conv has no autograd, and conv_state / out are written in place: reject what
    torch (or the producer) would not allow, before anything runs."""
    if torch.is_grad_enabled():
        for name, t in (("x", x), ("weight", weight), ("bias", bias),
                        ("conv_state", conv_state), ("out", out)):
            if isinstance(t, torch.Tensor) and t.requires_grad:
                raise TypeError(f"{name}: requires grad, but jitconv's conv has no "
                                f"autograd (it is not differentiable); call it under "
                                f"torch.no_grad() or torch.inference_mode(), or pass "
                                f"{name}.detach()")
    for name, t in (("conv_state", conv_state), ("out", out)):
        _check_updatable(name, t)


def _check_updatable(name, t):
    if isinstance(t, torch.Tensor):
        if t.is_inference() and not torch.is_inference_mode_enabled():
            raise ValueError(f"{name}: an inference tensor cannot be updated in place "
                             f"outside torch.inference_mode() (torch forbids it)")
    elif t is not None and getattr(t, "read_only", False):
        raise ValueError(f"{name}: the array is read-only, but it is updated in place")


_EXACT_LIMIT = 1 << 22  # elements: beyond this an ambiguous layout is rejected unchecked


def _elements_repeat(shape, strides, first_index=None):
    """Exact check: do two elements (of the index-0 entries in ``first_index``, when
    given) share an offset? None when that is too many elements to check."""
    index_sets = [np.arange(n, dtype=np.int64) for n in shape]
    if first_index is not None:
        index_sets[0] = np.asarray(first_index, np.int64)
    count = int(np.prod([len(i) for i in index_sets], dtype=np.int64))
    if count > _EXACT_LIMIT:
        return None
    offsets = np.zeros((), np.int64)
    for idx, s in zip(index_sets, strides):
        offsets = np.add.outer(offsets, idx * s)
    return len(np.unique(offsets)) < offsets.size


def check_aliasing(x, weight, bias, conv_state, out, lines):
    """Outputs (out, and the cache lines ``lines`` of conv_state) must not overlap each
    other, themselves, or an input the kernel reads while writing them. out may alias x
    (the launch then computes into a separate buffer and copies). Interval checks on the
    byte extents; exact element checks only where a layout could overlap itself.
    Returns the byte extents by argument name (the launch reuses x's and out's)."""
    extents = {name: arrays.byte_extent(t) for name, t in (
        ("x", x), ("weight", weight), ("bias", bias), ("conv_state", conv_state),
        ("out", out))}

    def meet(a, b):
        return arrays.extents_meet(extents[a], extents[b])

    if out is not None:
        if arrays.strides_may_overlap(shape_of(out), _strides(out)) and \
                _elements_repeat(shape_of(out), _strides(out)) is not False:
            raise ValueError(f"out: its elements overlap in memory (strides "
                             f"{tuple(_strides(out))} for shape {shape_of(out)}): the "
                             f"kernel would write some of them twice")
        for other in ("conv_state", "weight", "bias"):
            if meet("out", other):
                role = "updated" if other == "conv_state" else "read"
                raise ValueError(f"out and {other} overlap in memory: out is written while "
                                 f"{other} is {role}; pass separate tensors")
    if len(lines):
        for other in ("x", "weight", "bias"):
            if meet("conv_state", other):
                raise ValueError(f"conv_state and {other} overlap in memory: conv_state is "
                                 f"updated while {other} is read; pass separate tensors")
        shape, strides = shape_of(conv_state), _strides(conv_state)
        if arrays.strides_may_overlap(shape, strides) and \
                _elements_repeat(shape, strides, first_index=lines) is not False:
            raise ValueError(f"conv_state: the cache lines this call updates overlap in "
                             f"memory (strides {tuple(strides)} for shape {shape}, e.g. an "
                             f"expand() or as_strided() view); each line needs its own "
                             f"memory")
    return extents


def _strides(t):
    return tuple(t.stride())



# ---------------------------------------------------------------- split outputs

SPLIT_NAMES = ("out_spec", "out_non_spec")


def check_no_out(out):
    """A call with split outputs (``split``, ``out_spec`` / ``out_non_spec``) takes no out."""
    if out is not None:
        raise ValueError("out: given with split outputs (split, out_spec / out_non_spec); "
                         "split outputs replace out: pass one or the other")


def check_split_outputs(x, weight, bias, conv_state, split, part_rows, extents):
    """The split outputs of one run (``split``: out_spec, out_non_spec, normalized;
    ``part_rows``: the plan's token count of each part, in that order) against the other
    tensors (checked already; ``extents``: their byte extents). A part with tokens needs
    its output, of shape (tokens, dim), x's dtype and device, contiguous channels and
    rows apart; one without tokens takes None or zero rows. They are written while x,
    weight, bias and conv_state are read or updated, so they overlap none of them nor
    each other."""
    dim, where = shape_of(x)[1], _where(x)
    found = {}
    for name, t, rows in zip(SPLIT_NAMES, split, part_rows):
        if t is None:
            if rows:
                raise ValueError(f"{name}: the plan's part holds {rows} tokens, so its "
                                 f"output is needed: pass a ({rows}, {dim}) tensor")
            continue
        if not hasattr(t, "shape") or not hasattr(t, "dtype"):
            raise TypeError(f"{name}: expected a tensor, got {type(t).__name__}")
        if shape_of(t) != (rows, dim):
            raise ValueError(f"{name}: expected shape ({rows}, {dim}) (the part's tokens, "
                             f"dim), got {shape_of(t)}")
        _same_dtype(name, t, arrays.dtype_name(x))
        if _where(t) != where:
            raise ValueError(f"{name}: expected a tensor on the same device as x "
                             f"({arrays.device_of(x)}), got one on {arrays.device_of(t)}")
        _check_strides(name, t)
        if not arrays.has_unit_channel_stride(t):
            raise ValueError(f"{name}: channels (last dimension) must be contiguous, got "
                             f"strides {tuple(t.stride())}")
        if rows > 1 and dim > 1 and t.stride()[0] < dim:
            raise ValueError(f"{name}: its rows overlap in memory (row stride "
                             f"{t.stride()[0]} < dim {dim})")
        if torch.is_grad_enabled() and isinstance(t, torch.Tensor) and t.requires_grad:
            raise TypeError(f"{name}: requires grad, but jitconv's conv has no autograd; "
                            f"pass {name}.detach() or run under torch.no_grad()")
        _check_updatable(name, t)
        found[name] = arrays.byte_extent(t)
    for name, extent in found.items():
        for other in ("x", "weight", "bias", "conv_state"):
            if arrays.extents_meet(extent, extents[other]):
                role = "updated" if other == "conv_state" else "read"
                raise ValueError(f"{name} and {other} overlap in memory: {name} is written "
                                 f"while {other} is {role}; pass separate tensors")
    if len(found) == 2 and arrays.extents_meet(*found.values()):
        raise ValueError("out_spec and out_non_spec overlap in memory: each part's rows "
                         "need their own memory")


# ------------------------------------------------- parent maps and intermediate windows

def parent_map(parents, name, query_start_loc, real):
    """A part's parent map (SEMANTICS.md "More state rules"): (sequences, >= the longest
    sequence's tokens) ints, entry t of a sequence its token t's parent position. Returns
    the parents per token slot (the root's -1). Every token but the root has a parent
    before it; padded sequences are not checked (engines fill them with anything)."""
    table = host_ints(parents, name, ndim=2)
    lengths = np.diff(query_start_loc)
    nseq = len(lengths)
    if table.shape[0] != nseq:
        raise ValueError(f"{name}: expected {nseq} rows (one per sequence), got "
                         f"{table.shape[0]}")
    longest = int(lengths[real].max(initial=0))
    if table.shape[1] < longest:
        raise ValueError(f"{name}: expected at least {longest} columns (the longest "
                         f"sequence's tokens), got {table.shape[1]}")
    flat = np.full(int(query_start_loc[-1]), -1, np.int64)
    for i in np.flatnonzero(real):
        n = int(lengths[i])
        if n < 2:
            continue
        p = table[i, 1:n]
        t = np.arange(1, n)
        bad = (p < 0) | (p >= t)
        if bad.any():
            k = int(np.argmax(bad)) + 1
            raise ValueError(f"{name}: sequence {i}, token {k}: its parent must be a token "
                             f"before it, in [0, {k}) (a tree listed parents first), got "
                             f"{int(table[i, k])}")
        flat[query_start_loc[i] + 1:query_start_loc[i + 1]] = p
    return flat


def window_rows(rows, name, nseq, real):
    """A part's rows of the intermediate windows: (sequences,) ints, a row >= 0 or -1
    for a sequence without windows (padded sequences' not checked: they write nothing)."""
    rows = host_ints(rows, name)
    if len(rows) != nseq:
        raise ValueError(f"{name}: expected {nseq} entries (one per sequence), got "
                         f"{len(rows)}")
    bad = real & (rows < -1)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"{name}: entry {i} is {int(rows[i])}; expected a row >= 0 of "
                         f"intermediate_windows, or -1 for none")
    return np.where(real, rows, -1)


def write_lines(lines, name, nseq, num_lines, real):
    """A part's write lines (SEMANTICS.md "More state rules"): (sequences,) cache lines
    in [0, num_lines), padded sequences' not checked. Returns them with -1 for pads."""
    lines = host_ints(lines, name)
    if len(lines) != nseq:
        raise ValueError(f"{name}: expected {nseq} entries (one per sequence), got "
                         f"{len(lines)}")
    bad = real & ((lines < 0) | (lines >= num_lines))
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"{name}: entry {i} is {int(lines[i])}; expected a cache line in "
                         f"[0, {num_lines})")
    return np.where(real, lines, -1)


CHECKPOINT_ROLES = ("loc", "pos", "lines")


def checkpoints(values, names, query_start_loc, num_lines, real):
    """A part's checkpoints: ``values`` and ``names`` by role (``CHECKPOINT_ROLES``):
    loc (sequences + 1,) cumulative counts, pos and lines (loc[-1],): sequence i's
    checkpoints are entries loc[i]:loc[i+1], positions increasing within [1, its tokens],
    lines in [0, num_lines). Returns (loc, pos, lines) without padded sequences' entries
    (engines fill those with anything; they write nothing), or None when none is given."""
    given = [r for r in CHECKPOINT_ROLES if values[r] is not None]
    if not given:
        return None
    if len(given) < len(CHECKPOINT_ROLES):
        missing = next(r for r in CHECKPOINT_ROLES if values[r] is None)
        raise ValueError(f"{names[missing]}: required with {names[given[0]]} (checkpoints "
                         f"take {', '.join(names[r] for r in CHECKPOINT_ROLES)})")
    loc = host_ints(values["loc"], names["loc"])
    check_query_start_loc(loc, names["loc"])
    nseq = len(query_start_loc) - 1
    if len(loc) != nseq + 1:
        raise ValueError(f"{names['loc']}: expected {nseq + 1} entries (sequences + 1), got "
                         f"{len(loc)}")
    pos, lines = (host_ints(values[r], names[r]) for r in ("pos", "lines"))
    for role, arr in (("pos", pos), ("lines", lines)):
        if len(arr) != loc[-1]:
            raise ValueError(f"{names[role]}: expected {int(loc[-1])} entries ({names['loc']}"
                             f"[-1]), got {len(arr)}")
    keep_pos, keep_lines, counts = [], [], np.zeros(nseq, np.int64)
    for i in np.flatnonzero(real & (np.diff(loc) > 0)):
        n = int(query_start_loc[i + 1] - query_start_loc[i])
        p, q = pos[loc[i]:loc[i + 1]], lines[loc[i]:loc[i + 1]]
        if p.min() < 1 or p.max() > n or (np.diff(p) <= 0).any():
            raise ValueError(f"{names['pos']}: sequence {i}'s positions {p.tolist()} must be "
                             f"increasing, each in [1, {n}] (its tokens)")
        if q.min() < 0 or q.max() >= num_lines:
            bad = int(q[(q < 0) | (q >= num_lines)][0])
            raise ValueError(f"{names['lines']}: sequence {i}'s line {bad} is out of range "
                             f"[0, {num_lines})")
        keep_pos.append(p)
        keep_lines.append(q)
        counts[i] = len(p)
    empty = np.zeros(0, np.int64)
    return (np.concatenate([[0], np.cumsum(counts)]), np.concatenate(keep_pos or [empty]),
            np.concatenate(keep_lines or [empty]))


def ring_positions(seqlens, name, nseq, state_len, real):
    """A part's circular lines (SEMANTICS.md "More state rules"): (sequences,) ints >= 0,
    each line's count of inputs written so far. Returns (position in the ring, ring
    length): positions ``seqlens % state_len`` (padded sequences' -1, not checked)."""
    seqlens = host_ints(seqlens, name)
    if len(seqlens) != nseq:
        raise ValueError(f"{name}: expected {nseq} entries (one per sequence), got "
                         f"{len(seqlens)}")
    bad = real & (seqlens < 0)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"{name}: entry {i} is {int(seqlens[i])}; expected a count >= 0")
    return np.where(real, seqlens % state_len, -1), state_len


def check_written_lines(parts, names):
    """SEMANTICS.md: every line a step writes (a sequence's state or write line, its
    checkpoint lines) is written by one sequence only and read by no other; a sequence
    may checkpoint into the line it reads. ``parts``: validated ``batch.Part``s with
    their cache lines already checked unique. Returns every line the step reads or
    writes."""
    if all(p.write_lines is None and p.checkpoints is None for p in parts):
        # (every plan comes here: no work beyond what the unique-lines check did)
        lines = np.concatenate([p.lines for p in parts] + [np.zeros(0, np.int64)])
        return lines[lines >= 0]
    read, written, writer = [], [], []
    first = 0
    for p in parts:
        real = p.lines >= 0
        seqs = first + np.arange(len(p.lines))
        read.append(np.stack([p.lines[real], seqs[real]], axis=1))
        writes = p.lines if p.write_lines is None else np.where(real, p.write_lines, -1)
        written.append(writes[real])
        writer.append(seqs[real])
        if p.checkpoints is not None:
            loc, _pos, lines = p.checkpoints
            written.append(lines)
            writer.append(np.repeat(seqs, np.diff(loc)))
        first += len(p.lines)
    read = np.concatenate(read + [np.zeros((0, 2), np.int64)])
    written = np.concatenate(written + [np.zeros(0, np.int64)])
    writer = np.concatenate(writer + [np.zeros(0, np.int64)])
    if len(written) > 1:
        order = np.argsort(written, kind="stable")
        twice = np.flatnonzero(np.diff(written[order]) == 0)
        if len(twice):
            line = int(written[order][twice[0]])
            raise ValueError(f"{names}: cache line {line} is written twice in one call "
                             f"(each line a step writes belongs to one sequence)")
    if len(read) and len(written):
        by_line = np.argsort(read[:, 0])
        lines, readers = read[by_line, 0], read[by_line, 1]
        at = np.minimum(np.searchsorted(lines, written), len(lines) - 1)
        other = (lines[at] == written) & (readers[at] != writer)
        if other.any():
            k = int(np.argmax(other))
            raise ValueError(f"{names}: cache line {int(written[k])} is written by sequence "
                             f"{int(writer[k])} and read by sequence {int(readers[at[k]])} "
                             f"in one call")
    return np.unique(np.concatenate([read[:, 0], written]))


def check_windows(windows, x, plan_rows, steps, width, extents):
    """The intermediate windows of a run: (rows, steps, dim, width - 1) in x's dtype on
    x's device, with every row the plan's sequences name and as many steps as their
    longest sequence, apart from every other argument. (Elements of the windows may
    share memory, as SGLang's deduplicated view does: overlapping entries receive the
    same input.) ``plan_rows`` None: a device plan with window rows, whose rows and
    lengths the device checks."""
    name = "intermediate_windows"
    required = plan_rows is None or len(plan_rows) > 0
    if windows is None:
        if required:
            raise ValueError(f"{name}: required: the plan's sequences have window rows")
        return None
    if not required:
        raise ValueError(f"{name}: given, but no sequence has a window row (pass "
                         f"spec_window_rows / non_spec_window_rows)")
    shape = shape_of(windows)
    dim = shape_of(x)[1]
    if len(shape) != 4 or shape[2] != dim or shape[3] != width - 1:
        raise ValueError(f"{name}: expected shape (rows, steps, dim={dim}, width - 1="
                         f"{width - 1}), got {shape}")
    if plan_rows is None:
        pass
    elif shape[0] <= int(plan_rows.max()):
        raise ValueError(f"{name}: has {shape[0]} rows, but a sequence writes row "
                         f"{int(plan_rows.max())}")
    if shape[1] < steps:
        raise ValueError(f"{name}: has {shape[1]} steps, but a sequence with a window row "
                         f"holds {steps} tokens")
    _same_dtype(name, windows, arrays.dtype_name(x))
    if _where(windows) != _where(x):
        raise ValueError(f"{name}: expected a tensor on the same device as x "
                         f"({arrays.device_of(x)}), got one on {arrays.device_of(windows)}")
    if any(s < 0 for s in _strides(windows)):
        raise ValueError(f"{name}: negative strides {_strides(windows)} are not supported")
    _check_updatable(name, windows)
    extent = arrays.byte_extent(windows)
    for other in ("x", "weight", "bias", "conv_state", "out"):
        if extents.get(other) is not None and arrays.extents_meet(extent, extents[other]):
            raise ValueError(f"{name} and {other} overlap in memory; pass separate tensors")
    return extent


# ---------------------------------------------------------------- the GDN conv stage

def check_stage(x, conv_state, a, b, A_log, dt_bias, num_k_heads, head_k_dim, head_v_dim):
    """The GDN stage's own arguments (SEMANTICS.md "The GDN conv stage"), after
    ``check_tensors``: head counts and dims that fill x's channels, a and b (num_tokens,
    HV) in x's dtype with unit column stride, A_log and dt_bias (HV,) floating, all on x's
    device, none overlapping conv_state (updated while they are read). Returns HV."""
    for name, value in (("num_k_heads", num_k_heads), ("head_k_dim", head_k_dim),
                        ("head_v_dim", head_v_dim)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name}: expected a positive int, got {value!r}")
    num_tokens, dim = shape_of(x)
    if dim >= 2 ** abi.STAGE_CHANNEL_BITS:
        raise ValueError(f"x: the GDN stage takes fewer than 2 ** {abi.STAGE_CHANNEL_BITS} "
                         f"channels, got {dim}")
    for name, t in (("A_log", A_log), ("dt_bias", dt_bias), ("a", a), ("b", b)):
        if not hasattr(t, "shape") or not hasattr(t, "dtype"):
            raise TypeError(f"{name}: expected a tensor, got {type(t).__name__}")
    if len(shape_of(A_log)) != 1:
        raise ValueError(f"A_log: expected shape (num_v_heads,), got {shape_of(A_log)}")
    hv = shape_of(A_log)[0]
    qk = num_k_heads * head_k_dim
    if 2 * qk + hv * head_v_dim != dim:
        raise ValueError(f"num_k_heads, head_k_dim, head_v_dim: 2 * {num_k_heads} * "
                         f"{head_k_dim} + len(A_log)={hv} * {head_v_dim} = "
                         f"{2 * qk + hv * head_v_dim}, but x has {dim} channels")
    if shape_of(dt_bias) != (hv,):
        raise ValueError(f"dt_bias: expected shape ({hv},) (as A_log), got "
                         f"{shape_of(dt_bias)}")
    for name, t in (("A_log", A_log), ("dt_bias", dt_bias)):
        if arrays.dtype_name(t) not in FLOAT_DTYPES:
            raise TypeError(f"{name}: dtype must be one of {FLOAT_DTYPES}, got "
                            f"{arrays.dtype_name(t)}")
    for name, t in (("a", a), ("b", b)):
        if shape_of(t) != (num_tokens, hv):
            raise ValueError(f"{name}: expected shape ({num_tokens}, {hv}) (x's rows, "
                             f"num_v_heads), got {shape_of(t)}")
        _same_dtype(name, t, arrays.dtype_name(x))
        _check_strides(name, t)
        if hv > 1 and t.stride()[1] != 1:
            raise ValueError(f"{name}: its heads (last dimension) must be contiguous, got "
                             f"strides {tuple(t.stride())}")
    where, state = _where(x), arrays.byte_extent(conv_state)
    for name, t in (("a", a), ("b", b), ("A_log", A_log), ("dt_bias", dt_bias)):
        if _where(t) != where:
            raise ValueError(f"{name}: expected a tensor on the same device as x "
                             f"({arrays.device_of(x)}), got one on {arrays.device_of(t)}")
        if arrays.extents_meet(arrays.byte_extent(t), state):
            raise ValueError(f"{name} and conv_state overlap in memory: conv_state is "
                             f"updated while {name} is read; pass separate tensors")
    return hv


def l2norm_parts(use_l2norm, sequence_starts, part_rows):
    """The stage's ``use_l2norm`` as the kernel's first normalised row of each part
    (non-spec, spec; ``abi.STAGE_L2NORM_NONE``: none): True (both parts, every row),
    False (neither), a tuple / list / set of part names ("spec", "non_spec": every row of
    those), or a dict {part name: first row} (rows from there on; vLLM normalises the
    prefill rows of its non-spec part, which follow its decodes). A first row must begin
    one of the part's sequences (``sequence_starts``: per part, the rows that do; None
    for a device plan, whose planner checks it on the device) or be its row count
    (``part_rows``), as the kernel decides per block of a sequence."""
    none = abi.STAGE_L2NORM_NONE
    if isinstance(use_l2norm, (bool, np.bool_)):
        return (0, 0) if use_l2norm else (none, none)
    if isinstance(use_l2norm, (tuple, list, set, frozenset)) and \
            all(isinstance(p, str) and p in abi.STAGE_PARTS for p in use_l2norm):
        return tuple(0 if p in use_l2norm else none for p in abi.STAGE_PARTS)
    if not (isinstance(use_l2norm, dict) and all(
            isinstance(p, str) and p in abi.STAGE_PARTS and isinstance(r, (int, np.integer))
            and not isinstance(r, (bool, np.bool_)) and r >= 0
            for p, r in use_l2norm.items())):
        raise TypeError(f"use_l2norm: expected True, False, part names among "
                        f"{list(abi.STAGE_PARTS)} or a dict of part name to first row (an "
                        f"int >= 0), got {use_l2norm!r}")
    for part, row in use_l2norm.items():
        if sequence_starts is None:
            if row > part_rows[part]:
                raise ValueError(f"use_l2norm: the {part} part's first normalised row "
                                 f"must be at most its row count {part_rows[part]}, got "
                                 f"{row}")
        elif row < part_rows[part] and row not in sequence_starts[part]:
            raise ValueError(f"use_l2norm: the {part} part's first normalised row must "
                             f"begin one of its sequences (rows "
                             f"{sequence_starts[part].tolist()[:16]}) or be its row count "
                             f"{part_rows[part]}, got {row}")
    return tuple(min(int(use_l2norm.get(p, none)), none) for p in abi.STAGE_PARTS)
