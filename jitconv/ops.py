"""Public ops: validate everything on the host, then one kernel launch.

All ops share one path: metadata -> ``batch.Part``s -> ``batch.Batch`` -> one launch of the
mixed kernel. The contract is docs/SEMANTICS.md; ``jitconv.reference`` implements it in
float64.
"""

import numpy as np
import torch

from . import bridge, launching, validation
from . import device as devices
from .batch import Part, build_batch


def non_spec_part(query_start_loc, state_indices, has_initial_state, token_indx,
                  num_accepted_tokens, *, num_tokens, num_lines, state_len, width,
                  pad_slot_id, names, default_first_row=0, require_all_tokens=False):
    """Validate the non-spec metadata (prefill chunks and decodes) into a ``Part``.

    ``names`` maps the roles to the caller's argument names, so errors use the names the
    user typed.
    """
    qsl = validation.host_ints(query_start_loc, names["qsl"])
    validation.check_query_start_loc(qsl, names["qsl"], None)
    count = int(qsl[-1])
    nseq = len(qsl) - 1
    lines = validation.host_ints(state_indices, names["lines"])
    validation.check_lines(lines, names["lines"], nseq, num_lines, pad_slot_id)
    if token_indx is None:
        expected = num_tokens - default_first_row if require_all_tokens else None
        if expected is not None and count != expected:
            raise ValueError(f"{names['qsl']}: last element must equal the token count "
                             f"{expected}, got {count}")
        if default_first_row + count > num_tokens:
            raise ValueError(f"{names['qsl']}: covers {count} tokens from row "
                             f"{default_first_row}, but x has only {num_tokens} rows")
        rows = np.arange(default_first_row, default_first_row + count)
    else:
        rows = validation.host_ints(token_indx, names["rows"])
        validation.check_token_indx(rows, names["rows"], count, num_tokens)
    if has_initial_state is None:
        initial = np.ones(nseq, bool)
    else:
        initial = validation.host_ints(has_initial_state, names["init"], allow_bool=True)
        if len(initial) != nseq:
            raise ValueError(f"{names['init']}: expected {nseq} entries (one per sequence), "
                             f"got {len(initial)}")
        initial = initial != 0
    offsets = _window_offsets(num_accepted_tokens, names.get("accepted"), nseq,
                              width, state_len)
    real = lines != pad_slot_id
    return Part(qsl, np.where(real, lines, -1), rows, np.where(real, offsets, 0),
                initial, spec=False)


def _window_offsets(num_accepted_tokens, name, nseq, width, state_len):
    """Window start column per sequence: num_accepted_tokens - 1 (0 when not given)."""
    if num_accepted_tokens is None:
        return np.zeros(nseq, np.int64)
    accepted = validation.host_ints(num_accepted_tokens, name)
    if len(accepted) != nseq:
        raise ValueError(f"{name}: expected {nseq} entries (one per sequence), "
                         f"got {len(accepted)}")
    if np.any(accepted < 1):
        raise ValueError(f"{name}: every entry must be >= 1 (the bonus token counts), "
                         f"got {int(accepted.min())}")
    too_far = accepted - 1 + (width - 1) > state_len
    if np.any(too_far):
        i = int(np.argmax(too_far))
        raise ValueError(f"{name}: entry {i} = {int(accepted[i])} puts the conv window "
                         f"beyond state_len={state_len} (need num_accepted_tokens - 1 + "
                         f"width - 1 <= state_len)")
    return accepted - 1


def execute(x, weight, bias, conv_state, parts, *, silu, width, dtype, out,
            pad_slot_id):
    """Check the parts together, then launch the kernel once. Returns ``out``."""
    num_tokens = validation.shape_of(x)[0]
    all_rows = np.concatenate([p.rows for p in parts] + [np.zeros(0, np.int64)])
    validation.check_unique(all_rows, "token_indx", "row")
    all_lines = np.concatenate([p.lines for p in parts] + [np.zeros(0, np.int64)])
    validation.check_unique(all_lines[all_lines >= 0], "state_indices", "cache line")

    batch = build_batch(parts, num_tokens)
    if x.shape[1] == 0:
        return out if out is not None else bridge.empty_like_output(x, x.shape, dtype)

    # out may alias x: the kernel reads neighbouring rows of x, so compute into a
    # separate buffer and copy (aliasing is rare; correctness over a saved copy).
    target = out
    if out is None or _overlaps(out, x):
        target = bridge.empty_like_output(x, validation.shape_of(x), dtype)

    queue = devices.get_queue()
    if isinstance(weight, torch.Tensor) or hasattr(weight, "shape"):
        weight = weight.reshape(weight.shape[0], weight.shape[-1]) \
            if len(weight.shape) == 3 else weight
    views, write_backs = {}, []
    for name, t, writable in (("x", x, False), ("out", target, True),
                              ("weight", weight, False), ("conv_state", conv_state, True)):
        views[name], wb = bridge.to_device(t, name, writable, queue)
        if wb is not None:
            write_backs.append(wb)
    if bias is not None:
        views["bias"], _ = bridge.to_device(bias, "bias", False, queue)
    else:
        # The kernel does not read bias then, but the argument must be a valid 1-D array.
        views["bias"] = views["weight"]._replace(shape=(1,), strides=(1,))
    tables = bridge.upload_int32(batch.tables(), queue)
    args = dict(zip(("rows", "blk_seq", "blk_tok", "blk_len", "seq_tok", "seq_len",
                     "seq_line", "seq_off", "seq_flags"), tables))
    args.update(x=views["x"], out=views["out"], weight=views["weight"], bias=views["bias"],
                state=views["conv_state"], has_bias=int(bias is not None), silu=int(silu))
    launching.launch_conv(width, dtype, args, batch.num_blocks * int(x.shape[1]))
    for wb in write_backs:
        wb()
    if out is not None and target is not out:
        _copy_into(out, target)
        return out
    return target


def _normalize(x, weight, bias, conv_state, out):
    names = ("x", "weight", "bias", "conv_state", "out")
    return [bridge.normalize(t, n) for t, n in zip((x, weight, bias, conv_state, out), names)]


def _overlaps(a, b):
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    ua, ub = bridge._as_usm_ndarray(a), bridge._as_usm_ndarray(b)
    if ua is not None and ub is not None:
        return ua.usm_data._pointer == ub.usm_data._pointer
    return False


def _copy_into(out, src):
    if isinstance(out, torch.Tensor):
        out.copy_(src)
    else:
        out[...] = src


def causal_conv1d_fn(x, weight, bias, conv_state, query_start_loc, cache_indices,
                     has_initial_state=None, activation="silu", pad_slot_id=-1,
                     token_indx=None, out=None):
    """Causal depthwise conv1d over prefill chunks and plain decodes (non-spec tokens).

    x: (num_tokens, dim), rows may be strided; weight: (dim, width) or (dim, 1, width);
    bias: (dim,) or None; conv_state: viewed as (num_cache_lines, dim, state_len), any
    strides, updated in place. query_start_loc: (P+1,) cumulative token counts;
    cache_indices: (P,) cache line per sequence (pad_slot_id marks a padded sequence:
    zeros out, state untouched); has_initial_state: (P,) bool or None (all True);
    token_indx: (num_tokens_used,) row of x for each token in sequence order, or None for
    rows 0..n-1 (then query_start_loc[-1] must equal num_tokens). Returns out (new, or the
    given ``out``, which may alias x). See docs/SEMANTICS.md for the exact rule.
    """
    silu = validation.check_activation(activation)
    x, weight, bias, conv_state, out = _normalize(x, weight, bias, conv_state, out)
    dim, width, dtype = validation.check_tensors(x, weight, bias, conv_state, out)
    num_tokens = validation.shape_of(x)[0]
    num_lines, _, state_len = validation.shape_of(conv_state)
    part = non_spec_part(
        query_start_loc, cache_indices, has_initial_state, token_indx, None,
        num_tokens=num_tokens, num_lines=num_lines, state_len=state_len, width=width,
        pad_slot_id=pad_slot_id, require_all_tokens=True,
        names={"qsl": "query_start_loc", "lines": "cache_indices",
               "init": "has_initial_state", "rows": "token_indx"})
    return execute(x, weight, bias, conv_state, [part], silu=silu, width=width,
                   dtype=dtype, out=out, pad_slot_id=pad_slot_id)
