"""The vLLM drop-ins' eager implementations (``jitconv.vllm`` has the public functions,
which route to custom ops while torch.compile traces: ``jitconv.vllm.custom_ops``).

vLLM's GDN and Mamba layers call ``causal_conv1d_fn`` (prefill, x channel-major) and
``causal_conv1d_update`` (decode / spec verify) from
``vllm.model_executor.layers.mamba.ops.causal_conv1d``. The two functions here have the
same signatures, argument order and defaults as vLLM 0.33's, and follow vLLM's batch
conventions (null block 0 and zero-length sequences skipped, batch taken from
``conv_state_indices``, update written into x when ``out`` is None);
``jitconv.vllm.conventions`` translates those into the core ops' arguments, so the core's
validation still applies. ``gdn_conv_step`` goes further: the conv of a whole engine step
(prefill chunks, decodes and spec verify sequences) straight from vLLM's
``GDNAttentionMetadata``, in one launch.

``causal_conv1d_update`` and ``causal_conv1d_fn`` with CUDA (or XPU) tensors and their
metadata on x's device (vLLM's calls) leave the metadata there: each runs a
``jitconv.device_plan`` kept per set of metadata buffers (``jitconv.api.device_calls``),
so they never wait for the device and a CUDA graph may capture them; bad values there are
skipped and recorded (``jitconv.check_errors`` raises them), not raised by the call.
Every other call reads the metadata on the host.

Output rows that no sequence computes (rows of skipped sequences, rows of x beyond the
batch) hold zeros here, also when the result is written into x; vLLM's kernels leave
them as they were. jitconv writes them so that no stale or uninitialised value flows on.
"""

import numpy as np
import torch

from jitconv.api import device_calls, ops, validation
from jitconv.api.device_plan import RULE_TOKENS
from jitconv.api.plan import SplitOutputs
from jitconv.api.validation import activation_name, host_ints
from jitconv.vllm import conventions
from jitconv.vllm.conventions import NULL_BLOCK_ID, PAD_SLOT_ID


# Arguments of vLLM's conv ops (in some releases or revisions) that jitconv does not
# implement: what each asks for, and the vLLM setting that makes vLLM pass it. The
# drop-ins take them and refuse any value but the default before anything runs; the
# plugin reads which of them the installed vLLM's ops take. (None now: the last one,
# cache_seqlens, is SEMANTICS.md's circular lines.)
NOT_IMPLEMENTED = {}
# vLLM's prefix caching in 'all' mode (--enable-prefix-caching --mamba-cache-mode all)
# comes as its ops' block-index arguments with a 2-D cache_indices (SEMANTICS.md "More
# state rules": a read line, a write line and the block-boundary checkpoints). The eager
# drop-ins implement them (``prefix_caching``); the torch.compile custom ops (device
# metadata) refuse them by name (``refuse_prefix_caching``).
# vLLM's Triton prefill kernel cuts sequences into chunks of this many tokens, and aligns
# its checkpoints to a multiple of it (its validate_data asserts that).
VLLM_BLOCK_M = 8


def refuse_prefix_caching(where, **given):
    """NotImplementedError naming the first prefix-caching argument given (a value other
    than None, or 0 for block_size_to_align), for a path ``where`` that cannot take
    them."""
    for name, value in given.items():
        off = value is None or (name == "block_size_to_align"
                                and isinstance(value, int) and value == 0)
        if not off:
            raise NotImplementedError(
                f"{name}: vLLM's prefix caching in 'all' mode is not implemented {where}. "
                f"Expected {'0' if name == 'block_size_to_align' else 'None'}; the eager "
                f"drop-in implements it")


def _index_columns(values, name, batch, table, skipped):
    """Per sequence a column of the (batch, K) ``table`` (a vLLM block index): ints in
    [0, K) for every sequence not skipped."""
    cols = host_ints(values, name)
    if len(cols) < batch:
        raise ValueError(f"{name}: {len(cols)} entries, but the batch holds {batch} "
                         f"sequences")
    cols = cols[:batch]
    bad = ~skipped & ((cols < 0) | (cols >= table.shape[1]))
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"{name}: entry {i} is {int(cols[i])}; expected a column of the "
                         f"block table in [0, {table.shape[1]})")
    return cols


def prefix_caching(table, qsl, lines, *, block_idx_last_scheduled_token, initial_state_idx,
                   block_idx_first_scheduled_token=None,
                   num_computed_tokens=None, block_size_to_align=None):
    """vLLM's prefix-caching arguments as the core's rules (SEMANTICS.md: "vLLM 0.20-0.32
    prefix caching"): each sequence reads column ``initial_state_idx`` of its row of the
    (batch, K) block ``table``, writes its state to column
    ``block_idx_last_scheduled_token``, and (``causal_conv1d_fn``, with
    ``num_computed_tokens`` and B = ``block_size_to_align``) a checkpoint at position
    (k + 1) * B - num_computed_tokens into column k for every k from
    ``block_idx_first_scheduled_token`` up to the last. ``lines``: the read lines with
    the skipped sequences' (null block, pads, no tokens) already -1. Returns
    {core keyword: value} for the non-spec or spec part's rules (write lines, and the
    checkpoints when ``num_computed_tokens`` is given)."""
    batch = len(lines)
    skipped = lines < 0
    write = _index_columns(block_idx_last_scheduled_token, "block_idx_last_scheduled_token",
                           batch, table, skipped)
    rows = np.arange(batch)
    rules = {"write_lines": np.where(skipped, -1, table[rows, write])}
    if num_computed_tokens is None:
        return rules
    if isinstance(block_size_to_align, bool) or \
            not isinstance(block_size_to_align, (int, np.integer)) \
            or block_size_to_align <= 0 or block_size_to_align % VLLM_BLOCK_M:
        raise ValueError(f"block_size_to_align: expected a positive multiple of "
                         f"{VLLM_BLOCK_M} (vLLM's mamba block size) with prefix caching, "
                         f"got {block_size_to_align!r}")
    first = _index_columns(block_idx_first_scheduled_token, "block_idx_first_scheduled_token",
                           batch, table, skipped)
    done = host_ints(num_computed_tokens, "num_computed_tokens")[:batch]
    if len(done) < batch:
        raise ValueError(f"num_computed_tokens: {len(done)} entries, but the batch holds "
                         f"{batch} sequences")
    B, loc, pos, ind = block_size_to_align, [0], [], []
    for i in range(batch):
        if not skipped[i]:
            n = int(qsl[i + 1] - qsl[i])
            ks = np.arange(first[i], write[i])
            at = (ks + 1) * B - int(done[i])
            if len(ks) and (at[0] < 1 or at[-1] > n):
                raise ValueError(
                    f"block_idx_first_scheduled_token / num_computed_tokens: sequence {i} "
                    f"({n} tokens after {int(done[i])}) has block boundaries at positions "
                    f"{at.tolist()}, outside [1, {n}] (block_size_to_align={B})")
            pos += at.tolist()
            ind += table[i, ks].tolist()
        loc.append(len(pos))
    rules.update(loc=np.asarray(loc), pos=np.asarray(pos, np.int64),
                 lines=np.asarray(ind, np.int64))
    return rules


def _to_state_dtype(conv_state, *tensors):
    """vLLM's kernels compute in the conv cache's dtype (mamba_cache_dtype may differ from
    the model's): x, weight and bias are converted to it. Weights are tiny; None stays
    None."""
    dtype = conv_state.dtype
    return [t if t is None or t.dtype == dtype else t.to(dtype) for t in tensors]


def causal_conv1d_fn(x, weight, bias, conv_states, query_start_loc, cache_indices=None,
                     has_initial_state=None, activation="silu", pad_slot_id=PAD_SLOT_ID,
                     null_block_id=NULL_BLOCK_ID, metadata=None, validate_data=False, *,
                     block_idx_first_scheduled_token=None,
                     block_idx_last_scheduled_token=None, initial_state_idx=None,
                     num_computed_tokens=None, block_size_to_align=0):
    """vLLM's prefill op. x: (dim, cu_seqlen) (usually a transposed token-major view);
    conv_states: (lines, dim, state_len) view, updated in place; the batch is
    ``query_start_loc.size(0) - 1``. A sequence is skipped (state untouched, output
    zeros) when its line equals ``null_block_id`` or ``pad_slot_id`` (either may be None)
    or it has no tokens. ``cache_indices`` None: sequence i uses line i, none skipped for
    its line. Columns of x beyond ``query_start_loc[-1]`` come out zero. Returns a new
    (dim, cu_seqlen) tensor in x's dtype. ``metadata`` only tunes vLLM's Triton launch and
    is ignored; jitconv always validates (``validate_data`` is accepted and ignored).

    Prefix caching (vLLM 0.20-0.32's 'all' mode): with ``block_idx_last_scheduled_token``
    given, ``cache_indices`` is vLLM's (batch, K) block table and each sequence reads its
    initial state from column ``initial_state_idx``, writes its final state to column
    ``block_idx_last_scheduled_token`` and a checkpoint at every block boundary (block
    size ``block_size_to_align``, after ``num_computed_tokens``) to the columns from
    ``block_idx_first_scheduled_token`` on (SEMANTICS.md "More state rules"); the
    metadata are then read on the host. Without it, a 2-D ``cache_indices`` means its
    column 0, as in vLLM.
    """
    # (vLLM's call at every layer passes none of the prefix-caching arguments)
    apc = None if block_idx_last_scheduled_token is None and initial_state_idx is None \
        and block_idx_first_scheduled_token is None and num_computed_tokens is None \
        and type(block_size_to_align) is int and block_size_to_align == 0 \
        else _prefix_caching_arguments(
            block_idx_first_scheduled_token=block_idx_first_scheduled_token,
            block_idx_last_scheduled_token=block_idx_last_scheduled_token,
            initial_state_idx=initial_state_idx, num_computed_tokens=num_computed_tokens,
            block_size_to_align=block_size_to_align)
    null_block_id = conventions.check_skipped_id(null_block_id, "null_block_id")
    pad_slot_id = conventions.check_skipped_id(pad_slot_id, "pad_slot_id")
    size = _leading_size(query_start_loc)
    if size:
        # vLLM's kernel reads the first batch entries of these: longer ones are padded
        batch = size - 1
        cache_indices = conventions.leading_entries(cache_indices, batch, "cache_indices")
        has_initial_state = conventions.leading_entries(has_initial_state, batch,
                                                        "has_initial_state")
    table_given = cache_indices is not None and getattr(cache_indices, "ndim", 1) == 2
    if apc is None and not table_given and \
            _on_device(x, cache_indices, query_start_loc, has_initial_state) and \
            x.dtype == conv_states.dtype:
        return _device_fn(x, weight, bias, conv_states, query_start_loc, cache_indices,
                          has_initial_state, activation, pad_slot_id, null_block_id)
    original_dtype = x.dtype
    # (cu_seqlen, dim): a view when no conversion is needed
    tokens, weight, bias = _to_state_dtype(conv_states, x.transpose(0, 1), weight, bias)
    num_lines = int(conv_states.shape[0])
    qsl = conventions.query_start_loc(query_start_loc, None, "query_start_loc")
    batch = len(qsl) - 1
    table = None
    if cache_indices is None:
        if apc is not None:
            raise ValueError("cache_indices: required with block_idx_last_scheduled_token "
                             "(the (batch, blocks) table the block indices point into)")
        lines, skipped = np.arange(batch), ()
    else:
        table, skipped = conventions.block_table(cache_indices, "cache_indices"), \
            (null_block_id, pad_slot_id)
        lines = conventions.column_zero(table) if apc is None else \
            _read_lines(table, apc, batch, "cache_indices", qsl)
    lines = conventions.skip_sequences(lines, qsl, "cache_indices", num_lines, skipped)
    rows = conventions.leading_rows(int(qsl[-1]), int(tokens.shape[0]), "query_start_loc")
    rules = {} if apc is None else prefix_caching(table, qsl, lines, **apc)
    out = ops.causal_conv1d_mixed(
        tokens, weight, bias, conv_states, non_spec_query_start_loc=qsl,
        non_spec_state_indices=lines, has_initial_state=has_initial_state,
        non_spec_token_indx=rows, activation=activation_name(activation),
        pad_slot_id=conventions.CORE_PAD,
        **{ops.NON_SPEC_RULES[role]: value for role, value in rules.items()})
    return out.transpose(0, 1).to(original_dtype)


def _leading_size(values):
    """The length of a 1-D argument's first axis (0 for anything without one)."""
    if isinstance(values, torch.Tensor):  # (Tensor.__len__ is Python-level: slower)
        return int(values.shape[0]) if values.dim() > 0 else 0
    return len(values) if hasattr(values, "__len__") else 0


def _prefix_caching_arguments(**given):
    """The prefix-caching arguments as keywords of ``prefix_caching``, or None when vLLM
    would not read them (its kernels read them only with block_idx_last_scheduled_token):
    given without it, or incomplete, they are an error naming the argument."""
    if given["block_idx_last_scheduled_token"] is None:
        for name, value in given.items():
            if value is not None and not (name == "block_size_to_align"
                                          and not isinstance(value, bool) and value == 0):
                raise ValueError(f"{name}: given without block_idx_last_scheduled_token "
                                 f"(vLLM reads the prefix-caching arguments only with it); "
                                 f"pass it too, or drop {name}")
        return None
    for name, value in given.items():
        if value is None:
            raise ValueError(f"{name}: required with block_idx_last_scheduled_token "
                             f"(vLLM's prefix caching in 'all' mode)")
    return given


def _read_lines(table, apc, batch, name, qsl):
    """The read line of each sequence with prefix caching: column ``initial_state_idx``
    of its row of vLLM's (batch, K) block ``table`` (a ``conventions.block_table``); a
    sequence without tokens (skipped) reads column 0."""
    if table.ndim != 2:
        raise ValueError(f"{name}: expected vLLM's 2-D block table with "
                         f"block_idx_last_scheduled_token, got shape {table.shape}")
    if len(table) < batch:
        raise ValueError(f"{name}: {len(table)} rows, but the batch holds {batch} sequences")
    table = table[:batch]
    empty = np.diff(qsl)[:batch] == 0
    cols = _index_columns(apc["initial_state_idx"], "initial_state_idx", batch, table, empty)
    return table[np.arange(batch), np.where(empty, 0, cols)]


def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None,
                         conv_state_indices=None, num_accepted_tokens=None,
                         query_start_loc=None, max_query_len=-1,
                         null_block_id=conventions.DEFAULT, validate_data=False, out=None,
                         pad_slot_id=None, *, block_idx_last_scheduled_token=None,
                         initial_state_idx=None, retrieve_parent_token=None,
                         cache_seqlens=None):
    """vLLM's decode / spec-verify op. x: (batch, dim) (one token each), (batch, dim,
    seqlen), or varlen (num_tokens, dim) with ``query_start_loc``. conv_state: (lines,
    dim, state_len) view. The batch is ``conv_state_indices.size(0)`` ((batch,) or
    vLLM's (batch, K) table, column 0 used); ``query_start_loc`` and
    ``num_accepted_tokens`` may be longer and x may have extra rows (ignored, those rows
    come out zero). Lines equal to ``null_block_id`` (None: no such line) and
    zero-length sequences are skipped; ``conv_state_indices`` None: sequence i uses line
    i, none skipped for its line. With ``num_accepted_tokens`` the spec-decode
    sliding-window rule applies. The result goes into ``out``, or into x when ``out`` is
    None, and that tensor is returned. ``max_query_len`` (> 0), with metadata on the
    device, declares the longest sequence (the short kernels; a longer one is a bad
    value); host metadata gives lengths from ``query_start_loc``. ``validate_data`` is
    accepted and ignored.

    vLLM before its null block (up to 0.19) passes ``pad_slot_id`` (PAD_SLOT_ID = -1)
    instead: sequences on that line are skipped, and with no ``null_block_id`` given line
    0 is then a cache line like any other (that convention had no null block).

    ``retrieve_parent_token`` ((batch, >= longest) ints, vLLM's EAGLE tree verify): each
    token's parent position in its sequence (the root's entry ignored); a token's window
    runs through its ancestors (SEMANTICS.md "More state rules"); the metadata are then
    read on the host. Prefix caching (vLLM's 'all' mode): with
    ``block_idx_last_scheduled_token`` given, ``conv_state_indices`` is the (batch, K)
    block table, and each sequence reads its window from column ``initial_state_idx``
    and writes its state to column ``block_idx_last_scheduled_token`` (read on the host
    too). ``cache_seqlens`` ((batch,) counts, vLLM 0.11's sixth argument, the
    Dao-AILab/causal-conv1d convention): circular lines (SEMANTICS.md), read on the host;
    not with ``num_accepted_tokens`` or prefix caching.
    """
    apc = None if block_idx_last_scheduled_token is None and initial_state_idx is None \
        else _prefix_caching_arguments(
            block_idx_last_scheduled_token=block_idx_last_scheduled_token,
            initial_state_idx=initial_state_idx)
    null_block_id, pad_slot_id = conventions.skipped_ids(null_block_id, pad_slot_id)
    target = x if out is None else out
    # a tree on the device: with a declared bound of at most 16 tokens a sequence
    tree_on_device = retrieve_parent_token is None or (
        max_query_len is not None and 0 < max_query_len <= RULE_TOKENS)
    if apc is None and cache_seqlens is None and tree_on_device and \
            _on_device(x, conv_state_indices, query_start_loc, num_accepted_tokens,
                       retrieve_parent_token) and \
            (out is None or (out.shape == x.shape and out.dtype == x.dtype)) and \
            x.dtype == conv_state.dtype:
        return _device_update(x, conv_state, weight, bias, activation, conv_state_indices,
                              num_accepted_tokens, query_start_loc, max_query_len,
                              null_block_id, target, pad_slot_id, retrieve_parent_token)
    if out is not None:
        if tuple(out.shape) != tuple(x.shape):
            raise ValueError(f"out: expected shape {tuple(x.shape)} (same as x), got "
                             f"{tuple(out.shape)}")
        if out.dtype != x.dtype:
            raise TypeError(f"out: dtype must match x ({x.dtype}), got {out.dtype}")
    x, weight, bias = _to_state_dtype(conv_state, x, weight, bias)
    num_lines = int(conv_state.shape[0])
    batch_form = None  # (batch, seqlen, dim) when x is (batch, dim, seqlen)
    if query_start_loc is not None:
        if x.dim() != 2:
            raise ValueError(f"x: expected shape (num_tokens, dim) with query_start_loc, "
                             f"got {tuple(x.shape)}")
        if conv_state_indices is None:
            raise ValueError("conv_state_indices: required with query_start_loc (the "
                             "batch is its size)")
        tokens, skipped = x, (null_block_id, pad_slot_id)
        table = conventions.block_table(conv_state_indices, "conv_state_indices")
        lines = conventions.column_zero(table)
        qsl = conventions.query_start_loc(query_start_loc, len(lines), "query_start_loc")
    else:
        size = int(x.shape[0])
        if x.dim() == 2:
            tokens, seqlen = x, 1
        elif x.dim() == 3:
            _, dim, seqlen = (int(s) for s in x.shape)
            # (batch, dim, seqlen) -> token-major (batch * seqlen, dim); reshape copies
            # only when the strides do not allow a view.
            tokens = x.transpose(1, 2).reshape(size * seqlen, dim)
            batch_form = (size, seqlen, dim)
        else:
            raise ValueError(f"x: expected (batch, dim), (batch, dim, seqlen) or, with "
                             f"query_start_loc, (num_tokens, dim); got {tuple(x.shape)}")
        if conv_state_indices is None:  # sequence i on line i: no index marks a pad
            lines, skipped = np.arange(size), ()
        else:
            table = conventions.block_table(conv_state_indices, "conv_state_indices")
            lines, skipped = conventions.column_zero(table), (null_block_id, pad_slot_id)
            if len(lines) > size:
                raise ValueError(f"conv_state_indices: {len(lines)} entries (the batch), "
                                 f"but x holds only {size} sequences")
        qsl = np.arange(0, len(lines) * seqlen + 1, seqlen)
    batch = len(lines)
    if apc is not None:
        if conv_state_indices is None:
            raise ValueError("conv_state_indices: required with block_idx_last_scheduled_"
                             "token (the (batch, blocks) table the block indices point into)")
        lines = _read_lines(table, apc, batch, "conv_state_indices", qsl)
    lines = conventions.skip_sequences(lines, qsl, "conv_state_indices", num_lines, skipped)
    accepted = None
    if num_accepted_tokens is not None:
        accepted = conventions.first_entries(num_accepted_tokens, batch,
                                             "num_accepted_tokens")
    rows = conventions.leading_rows(int(qsl[-1]), int(tokens.shape[0]), "query_start_loc")
    direct = x.dim() == 2 and target.dtype == conv_state.dtype
    if retrieve_parent_token is None and apc is None and cache_seqlens is None:
        result = ops.causal_conv1d_update(
            tokens, weight, bias, conv_state, lines, query_start_loc=qsl,
            num_accepted_tokens=accepted, activation=activation_name(activation),
            pad_slot_id=conventions.CORE_PAD, token_indx=rows,
            out=target if direct else None)
    else:  # a tree or prefix caching: the part's rules, in the one launch of the mixed op
        part = "non_spec" if accepted is None else "spec"
        names = {f"{part}_query_start_loc": qsl, f"{part}_state_indices": lines,
                 f"{part}_token_indx": rows}
        if retrieve_parent_token is not None:
            parents = host_ints(retrieve_parent_token, "retrieve_parent_token", ndim=2)
            if len(parents) < batch:
                raise ValueError(f"retrieve_parent_token: {len(parents)} rows, but the "
                                 f"batch holds {batch} sequences")
            names[f"{part}_parent_token"] = parents[:batch]
        if apc is not None:
            names[f"{part}_write_indices"] = prefix_caching(table, qsl, lines,
                                                           **apc)["write_lines"]
        if cache_seqlens is not None:
            if accepted is not None or apc is not None:
                raise ValueError(
                    f"cache_seqlens: circular lines do not combine with "
                    f"{'num_accepted_tokens' if accepted is not None else 'prefix caching'}"
                    f" (a ring has no fixed columns); pass one or the other")
            counts = host_ints(cache_seqlens, "cache_seqlens")
            if len(counts) < batch:
                raise ValueError(f"cache_seqlens: {len(counts)} entries, but the batch "
                                 f"holds {batch} sequences")
            names["non_spec_cache_seqlens"] = counts[:batch]
        if accepted is not None:
            names["num_accepted_tokens"] = accepted
        try:
            result = ops.causal_conv1d_mixed(
                tokens, weight, bias, conv_state, activation=activation_name(activation),
                pad_slot_id=conventions.CORE_PAD, out=target if direct else None, **names)
        except ValueError as exc:  # name vLLM's argument, not the core's
            raise ValueError(str(exc).replace(f"{part}_parent_token", "retrieve_parent_token")
                             .replace("non_spec_cache_seqlens", "cache_seqlens")) from None
    if not direct:  # another dtype or a (batch, dim, seqlen) form: copy into place
        target.copy_(result if batch_form is None
                     else result.reshape(batch_form).transpose(1, 2))
    return target


def _on_device(x, first, *metadata):
    """Whether a drop-in call takes the device-metadata path
    (``device_calls.on_device``); ``first`` (the cache lines) must be given: without it
    sequence i uses line i, which needs the batch on the host."""
    return first is not None and device_calls.on_device(x, first, *metadata)


def _device_update(x, conv_state, weight, bias, activation, conv_state_indices,
                   num_accepted_tokens, query_start_loc, max_query_len, null_block_id,
                   target, pad_slot_id, parents=None):
    """``causal_conv1d_update`` with its metadata left on the device (never read back):
    a ``jitconv.device_plan`` per set of metadata tensors, kept (engines pass the same
    persistent buffers, or the same slices of them, at every layer and step), run on
    torch's stream; a CUDA graph may capture the call. The same conventions: the batch
    is conv_state_indices' length (column 0 of a 2-D table), longer query_start_loc,
    num_accepted_tokens and ``parents`` (retrieve_parent_token) are cut to it, the null
    block and empty sequences are skipped, rows of x after the batch's tokens come out
    zero; a parent map that is not a tree skips its sequence (``jitconv.check_errors``)."""
    shape = _state_shape(conv_state)
    declared = int(max_query_len) if max_query_len is not None and max_query_len > 0 else None
    # Keyed by the arguments as given (slices of them are new objects at every call).
    key = ("vllm update", device_calls.describe(conv_state_indices),
           device_calls.describe(query_start_loc), device_calls.describe(num_accepted_tokens),
           device_calls.describe(parents), x.get_device(), x.shape[0], shape[0], shape[2],
           weight.shape[-1], null_block_id, pad_slot_id, declared)
    plan = device_calls.kept_plan(key, lambda: _device_update_plan(
        x, conv_state_indices, num_accepted_tokens, query_start_loc, declared,
        null_block_id, pad_slot_id, (shape[0], shape[2], weight.shape[-1]), parents))
    if weight.dtype != conv_state.dtype or (bias is not None and bias.dtype != weight.dtype):
        weight, bias = _to_state_dtype(conv_state, weight, bias)
    # Straight into target when the plan allows it (x itself included: every sequence
    # in one block), else a new output copied there.
    result = plan.run(x, weight, bias, conv_state, out=target if plan.in_place else None,
                      activation=activation_name(activation))
    if result is not target:
        target.copy_(result)
    return target


def _device_fn(x, weight, bias, conv_states, query_start_loc, cache_indices,
               has_initial_state, activation, pad_slot_id, null_block_id):
    """``causal_conv1d_fn`` with its metadata left on the device, as ``_device_update``:
    a device plan per set of metadata tensors (lengths from query_start_loc, no bound
    declared: the planner's block search), the null block, ``pad_slot_id`` and empty
    sequences skipped, columns of x beyond the batch's tokens zero."""
    tokens = x.transpose(0, 1)  # (cu_seqlen, dim)
    shape = _state_shape(conv_states)
    key = ("vllm fn", device_calls.describe(query_start_loc),
           device_calls.describe(cache_indices), device_calls.describe(has_initial_state),
           x.get_device(), x.shape[1], shape[0], shape[2], weight.shape[-1], null_block_id,
           pad_slot_id)
    plan = device_calls.kept_plan(key, lambda: device_calls.build(
        _geometry(x.shape[1], shape[0], shape[2], weight.shape[-1], pad_slot_id),
        dict(device_calls.NO_ARRAYS, ns_qsl=query_start_loc, ns_lines=cache_indices,
             ns_init=has_initial_state), ops.FN_DEVICE_NAMES, null_block_id=null_block_id,
        skip_empty=True))
    if weight.dtype != conv_states.dtype or (bias is not None and bias.dtype != weight.dtype):
        weight, bias = _to_state_dtype(conv_states, weight, bias)
    return plan.run(tokens, weight, bias, conv_states,
                    activation=activation_name(activation)).transpose(0, 1)


def _state_shape(conv_state):
    """conv_state's shape (torch's sizes are ints; ``_geometry`` checks them), which the
    device paths' plan keys read before the core's checks: a clear error for one that is
    not (lines, dim, state_len)."""
    if conv_state.dim() != 3:
        raise ValueError(f"conv_state: expected a view of shape (num_cache_lines, dim, "
                         f"state_len) (a transposed view for (lines, state_len, dim) "
                         f"storage), got {tuple(conv_state.shape)}")
    return conv_state.shape


def _device_update_plan(x, conv_state_indices, num_accepted_tokens, query_start_loc,
                        declared, null_block_id, pad_slot_id, geometry, parents=None):
    lines = conv_state_indices
    if lines.dim() == 2:
        if lines.shape[1] == 0:
            raise ValueError(f"conv_state_indices: expected shape (batch,) or (batch, K) "
                             f"with K >= 1, got {tuple(lines.shape)}")
        lines = lines[:, 0]
    batch = lines.shape[0]
    qsl, accepted = query_start_loc, num_accepted_tokens
    for name, t, need in (("query_start_loc", qsl, batch + 1),
                          ("num_accepted_tokens", accepted, batch),
                          ("retrieve_parent_token", parents, batch)):
        if t is not None and (t.dim() != (2 if t is parents else 1) or t.shape[0] < need):
            raise ValueError(f"{name}: expected at least {need} entries (the batch being "
                             f"conv_state_indices' {batch}), got shape {tuple(t.shape)}")
    qsl = None if qsl is None else qsl[:batch + 1]
    accepted = None if accepted is None else accepted[:batch]
    if (accepted is not None or parents is not None) and qsl is None:  # a token each
        qsl = torch.arange(batch + 1, dtype=lines.dtype, device=x.device)
    given = (dict(device_calls.NO_ARRAYS, sp_qsl=qsl, sp_lines=lines, sp_accepted=accepted)
             if accepted is not None
             else dict(device_calls.NO_ARRAYS, ns_qsl=qsl, ns_lines=lines))
    part = "sp" if accepted is not None else "ns"
    rules = {} if parents is None else {f"{part}_parents": parents[:batch]}
    return device_calls.build(_geometry(int(x.shape[0]), *geometry, pad_slot_id), given,
                              DEVICE_UPDATE_NAMES, max_query_len=declared,
                              null_block_id=null_block_id, skip_empty=True, rules=rules)


# The device update's argument names (errors name them), by planner array name.
DEVICE_UPDATE_NAMES = dict(ops.UPDATE_DEVICE_NAMES, sp_parents="retrieve_parent_token",
                           ns_parents="retrieve_parent_token")



def _geometry(num_tokens, num_lines, state_len, width, pad_slot_id):
    # Lines that are neither the null block nor vLLM <= 0.19's pad must be real cache
    # lines (_NO_LINE: a value no int32 line can equal).
    return validation.check_geometry(num_tokens, num_lines, state_len, width,
                                     _NO_LINE if pad_slot_id is None else pad_slot_id)


_NO_LINE = -(2 ** 40)


def gdn_conv_step(mixed_qkv, weight, bias, conv_state, attn_metadata, activation="silu",
                  null_block_id=NULL_BLOCK_ID, non_spec_num_accepted_tokens=None,
                  split=False, out=None):
    """The conv of one GDN layer for a whole engine step, from vLLM 0.33's
    GDNAttentionMetadata, in ONE launch (prefill chunks, decodes and spec verify
    sequences together).

    mixed_qkv: (num_tokens, conv_dim) projection output; rows no sequence uses (beyond
    ``num_actual_tokens``, or of skipped sequences) come out zero. conv_state: the
    layer's conv cache as vLLM hands it to its conv ops, viewed as (lines, conv_dim,
    state_len): ``kv_cache[0].transpose(-1, -2)`` for the state-major layout,
    ``kv_cache[0]`` as is when dim-first (``conv_state_view`` does this). The metadata is
    read as vLLM's layer reads it (``conventions.gdn_step_metadata``). Computes in
    conv_state's dtype like vLLM's ops; returns a new (num_tokens, conv_dim) tensor in
    mixed_qkv's dtype.

    ``non_spec_num_accepted_tokens`` (opt-in, one per non-spec sequence): a prefill
    chunk or decode that follows a spec step which accepted a tokens reads its window at
    column a-1 (vLLM's kernels read column 0 there: a stale window).

    ``split``: return ``jitconv.SplitOutputs(spec, non_spec)`` instead, each part's rows
    in a tensor of its own, written by the same launch: what vLLM's layer gets from
    ``mixed_qkv.index_select(0, spec_token_indx)`` / ``(0, non_spec_token_indx)``
    followed by its conv calls, without the gathers (None for a part without tokens).
    ``out`` (not with ``split``): the (num_tokens, conv_dim) tensor to write, mixed_qkv
    itself allowed (what vLLM's decode path reads next), returned.

    The plan is built by the first layer of a step and kept on the metadata object; the
    step's other layers reuse it. Where mixed_qkv is a CUDA or XPU tensor and the
    metadata tensors are on its device, it is a ``jitconv.device_plan`` of those tensors:
    nothing is read back and no step waits for the device; bad values are then skipped
    and recorded (``jitconv.check_errors``), not raised, and with both parts the
    split outputs have the token maps' lengths. Otherwise the metadata is read on the
    host once per step (validated, errors raised before any launch).
    """
    if split and out is not None:
        raise ValueError("out: not with split=True (each part's outputs are new tensors)")
    original_dtype = mixed_qkv.dtype
    mixed_qkv, weight, bias = _to_state_dtype(conv_state, mixed_qkv, weight, bias)
    plan = _layer_plan(mixed_qkv, weight, conv_state, attn_metadata, null_block_id,
                       non_spec_num_accepted_tokens, split)
    if split:
        parts = plan.run(mixed_qkv, weight, bias, conv_state,
                         activation=activation_name(activation), split=True)
        return SplitOutputs(*(t if t is None or t.dtype == original_dtype
                              else t.to(original_dtype) for t in parts))
    # straight into out where it has the computing dtype (x itself: every sequence in one
    # block, else a separate buffer copied there: ``StepPlan.run``)
    into = out if out is not None and out.dtype == mixed_qkv.dtype else None
    result = plan.run(mixed_qkv, weight, bias, conv_state, out=into,
                      activation=activation_name(activation))
    if out is None:
        return result if result.dtype == original_dtype else result.to(original_dtype)
    if result is not out:
        out.copy_(result)
    return out


def gdn_conv_stage_step(mixed_qkv, weight, bias, conv_state, a, b, A_log, dt_bias,
                        attn_metadata, *, num_k_heads, head_k_dim, head_v_dim,
                        use_l2norm=True, exp_g=False, activation="silu",
                        null_block_id=NULL_BLOCK_ID, non_spec_num_accepted_tokens=None):
    """The GDN conv stage of one layer for a whole engine step, from vLLM's
    GDNAttentionMetadata, in ONE launch: ``gdn_conv_step``'s conv and state update, then
    per token of each part q, k, v in head layout, l2norm and gates
    (``jitconv.gdn_conv_stage`` documents them and ``use_l2norm`` / ``exp_g``).

    mixed_qkv, a, b: the layer's (num_tokens, ...) rows (rows beyond the step's tokens
    are not read); a and b in mixed_qkv's dtype with contiguous heads. A_log, dt_bias:
    the layer's (num_v_heads,). conv_state, the metadata, ``null_block_id`` and
    ``non_spec_num_accepted_tokens``: as ``gdn_conv_step``'s, whose plan (kept on the
    metadata object) this shares. mixed_qkv must have conv_state's dtype (the stage
    computes in x's dtype; vLLM converts x to the cache's).

    Returns ``jitconv.StageResult(spec, non_spec)``: each part's q, k, v, g and beta, its
    rows in the part's token order (None for a part without tokens).
    """
    if mixed_qkv.dtype != conv_state.dtype:
        raise TypeError(f"mixed_qkv: the GDN stage computes in x's dtype, so x must have "
                        f"conv_state's ({conv_state.dtype}), got {mixed_qkv.dtype}")
    plan = _layer_plan(mixed_qkv, weight, conv_state, attn_metadata, null_block_id,
                       non_spec_num_accepted_tokens)
    weight, bias = _to_state_dtype(conv_state, weight, bias)
    return plan.run_stage(mixed_qkv, weight, bias, conv_state, a, b, A_log, dt_bias,
                          num_k_heads=num_k_heads, head_k_dim=head_k_dim,
                          head_v_dim=head_v_dim, use_l2norm=use_l2norm, exp_g=exp_g,
                          activation=activation_name(activation))


def gdn_device_plan(num_tokens, conv_state, width, attn_metadata,
                    null_block_id=NULL_BLOCK_ID, non_spec_num_accepted_tokens=None):
    """The ``jitconv.device_plan`` of one engine step, from vLLM's GDNAttentionMetadata
    tensors as its layer reads them (``conventions.gdn_step_arrays``; nothing is read
    back): ``num_tokens`` rows of mixed_qkv, conv_state as ``gdn_conv_step`` takes it,
    the conv's ``width``. The null block and empty sequences are skipped; a cache line
    out of range (-1 included) is a bad value, skipped and recorded
    (``jitconv.check_errors``). With both parts the plan has the layer's token maps, so
    its runs split their outputs (their rows: the maps' lengths)."""
    null_block_id = conventions.check_skipped_id(null_block_id, "null_block_id")
    lines, _dim, state_len = (int(s) for s in conv_state.shape)
    arrays, declared = conventions.gdn_step_arrays(attn_metadata,
                                                   non_spec_num_accepted_tokens)
    return device_calls.build(_geometry(int(num_tokens), lines, state_len, int(width),
                                        None), arrays, conventions.GDN_DEVICE_NAMES,
                              max_query_len=declared, null_block_id=null_block_id,
                              skip_empty=True)


def _layer_plan(mixed_qkv, weight, conv_state, attn_metadata, null_block_id,
                non_spec_num_accepted_tokens, split=True):
    """The step's plan for a layer of this geometry (``_step_plan``: built by the first
    layer that asks, read from vLLM's metadata as its layer reads it): a device plan
    (``gdn_device_plan``) where mixed_qkv is a CUDA or XPU tensor and the metadata
    tensors are on its device, unless a step of both parts is run without ``split``
    (its outputs in mixed_qkv's rows need every row named); else a plan of the
    metadata's values, read on the host."""
    null_block_id = conventions.check_skipped_id(null_block_id, "null_block_id")
    shape = conv_state.shape
    # (sizes as torch gives them, not converted: this runs for every layer; keyed by
    # ``split`` too: a step of both parts without it is planned on the host)
    key = (mixed_qkv.shape[0], shape[0], shape[2], weight.shape[-1], null_block_id,
           bool(split))

    def build():
        num_tokens, lines, state_len, width = (int(v) for v in key[:4])
        arrays, _declared = conventions.gdn_step_arrays(attn_metadata,
                                                        non_spec_num_accepted_tokens)
        if device_calls.on_device(mixed_qkv, *arrays.values()) and \
                (split or arrays["ns_map"] is None):
            return gdn_device_plan(num_tokens, conv_state, width, attn_metadata,
                                   null_block_id, non_spec_num_accepted_tokens)
        return ops.plan_from(
            conventions.gdn_step_metadata(attn_metadata, num_tokens, lines, null_block_id,
                                          non_spec_num_accepted_tokens),
            validation.check_geometry(num_tokens, lines, state_len, width,
                                      conventions.CORE_PAD))
    return _step_plan(attn_metadata, key, non_spec_num_accepted_tokens, build)


def conv_state_view(conv_cache, dim_first):
    """A layer's conv cache (vLLM: ``kv_cache[0]``) as the (lines, dim, state_len) view
    the conv ops take: vLLM stores it state-major, (lines, state_len, dim), unless its
    conv-state layout is dim-first (``is_conv_state_dim_first()``, env
    VLLM_SSM_CONV_STATE_LAYOUT=DS), which is passed as is."""
    return conv_cache if dim_first else conv_cache.transpose(-1, -2)


def _step_plan(attn_metadata, geometry, extra, build):
    """The plan of this step for this layer geometry (a tuple; ``build()``'s): built by
    the first layer that asks, kept on the metadata object (vLLM builds a new one every
    step), reused by every later layer, so the metadata is translated and checked once
    per step, not once per layer. Objects that take no new attributes just get a plan
    per call."""
    plans = getattr(attn_metadata, "_jitconv_plans", None)
    if plans is None:
        plans = {}
        try:
            attn_metadata._jitconv_plans = plans
        except AttributeError:
            pass
    cached = plans.get(geometry)
    if cached is not None and cached[0] is extra:
        return cached[1]
    plan = build()
    plans[geometry] = (extra, plan)  # `extra`: the plan is valid for this object only
    return plan
