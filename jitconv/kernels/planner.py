"""The device planner: the conv kernel's block records built on the device, from
metadata that stays there (``jitconv.device_plan``).

A host plan reads the step's metadata once and builds its tables on the host
(``kernels.batch``). A device plan never reads metadata values on the host: before each
conv launch a planning kernel (one work-item per block slot, this module's
``plan_slot``) reads query_start_loc, cache lines, initial-state flags and accepted
counts where they are, and writes one record per slot into a table of fixed capacity
that the conv kernel then reads. Records past the step's real blocks are inert (no
tokens, no cache line: the conv kernel does nothing for them), so the conv grid is fixed
by the capacity and a CUDA graph that captured both launches follows metadata rewritten
in place before each replay.

Slots. Sequences are numbered in the order of their rows: non-spec first (i < P), then
spec (P <= i < P + Q), or with ``spec_first`` spec then non-spec (vLLM's layout of a mixed
step); their tokens are consecutive rows of x in that order, and the rows after the last
token are the "tail", zeros in the output (a device plan has no token maps); the
tail's blocks are non-spec blocks, spec blocks in a plan of spec sequences alone (so
split outputs, the GDN stage's, give those rows to that part). Sequence i,
starting at token slot T(i), owns slots ``i + T(i) // B`` onward, one per block of B
(``batch.DEFAULT_BLOCK_TOKENS``) tokens and at least one: no sequence's slots meet the
next one's, so a work-item finds its sequence by binary search over T, with no prefix
sum and no synchronization between work-items. A plan whose sequences hold at most B
tokens each (declared: ``max_query_len``) takes one slot per sequence, no search. The
tail's blocks come after the sequences' slots.

Bad values are found on the device, where they are: each sequence is checked by the
work-item of slot i (every sequence has one, the capacity is at least P + Q), which sets
its error's word in the plan's error table; a bad sequence is skipped as a pad (its rows
zeros, its cache line untouched) and no record ever points outside x, out or the conv
state (``device_plan.DevicePlan.check_errors`` reports the words).

This module imports no kernel framework: backends compile ``plan_slot`` as a device
function (numba-cuda: ``backends/cuda/planner.py``; numba-dpex:
          ``backends/sycl/planner.py``).
"""

from jitconv.kernels.batch import DEFAULT_BLOCK_TOKENS as BLOCK
from jitconv.kernels.abi import (BLOCK_FIELDS, FLAG_BLOCK_ROWS, FLAG_CHAIN, FLAG_INITIAL_STATE,
                                 FLAG_LINES, FLAG_SEQ_ROWS, FLAG_SPEC, FLAG_TREE, LINK_FIELDS,
                                 SEQUENCE_FIELDS)

# Words of the error table, one per kind of bad value (index: what it means).
ERRORS = (
    "query_start_loc: not starting at 0, decreasing, or covering more rows than x has",
    "state indices: a cache line out of range that is not a pad",
    "num_accepted_tokens: an entry < 1, or one that puts the window beyond state_len",
    "a sequence longer than max_query_len, or a spec sequence too long for state_len",
    "parent map: a token's parent not a position before it (a tree lists parents first)",
    "window rows: a row < -1 or past intermediate_windows' rows, or a sequence with a "
    "window row longer than its steps",
    "write lines: a cache line out of range",
    "token maps: a row outside x (read as row 0)",
    "use_l2norm: a first normalised row inside a sequence (it must begin one)",
)
(E_QSL, E_LINE, E_ACCEPTED, E_LENGTH, E_PARENT, E_WINDOW, E_WRITE, E_MAP,
 E_L2NORM) = range(len(ERRORS))
NF = len(BLOCK_FIELDS)
NL, NS = len(LINK_FIELDS), len(SEQUENCE_FIELDS)
L2NORM_NONE = -1  # ``l2norm_ns`` / ``l2norm_sp`` of a part with no first row to check


def rows_words(maps):
    """Words of a device plan's rows table (before its records): with token maps
    (``maps``: the parts' slot counts) a row per token slot, padded to whole records;
    without, one (unused) record's worth."""
    if maps is None:
        return NF
    slots = sum(maps)
    return max(NF, slots + -slots % NF)


def tail_blocks(num_tokens, maps):
    """The tail's blocks: ceil(num_tokens / B), or with token maps (the parts' slot
    counts) each part's own tail, ceil(slots / B) per part."""
    if maps is None:
        return -(-num_tokens // BLOCK)
    return sum(-(-n // BLOCK) for n in maps)


def capacity(num_sequences, num_tokens, one_slot_per_sequence, maps=None):
    """Block slots of a device plan: the sequences' slots (one each, or, with longer
    sequences, ``i + T(i) // B`` onward: at most P + Q + ceil(num_tokens / B) in all),
    then the tail's blocks (``tail_blocks``)."""
    tail = tail_blocks(num_tokens, maps)
    if one_slot_per_sequence:
        return num_sequences + tail
    return num_sequences + -(-num_tokens // BLOCK) + tail


def tail_first(num_sequences, num_tokens, one_slot_per_sequence, maps=None):
    """The first slot of the tail's blocks (the last ``tail_blocks`` slots)."""
    return capacity(num_sequences, num_tokens, one_slot_per_sequence, maps) - \
        tail_blocks(num_tokens, maps)


def scalars(*, num_ns, num_sp, ns_implicit, has_ns_init, has_ns_accepted, num_tokens,
            num_lines, state_len, width, pad_line, null_line, skip_empty, max_len,
            spec_first, maps=None, l2norm=(L2NORM_NONE, L2NORM_NONE)):
    """The planner's scalar arguments (``PLAN_ARGS``) for a step of these counts and
    flags: ``null_line`` None for no second pad line, ``max_len`` None for no bound (one
    slot per sequence when it is at most B); ``maps``: (non-spec, spec) token map
    lengths, None without maps; ``l2norm``: each part's first row a GDN stage
    normalises, checked to begin a sequence (L2NORM_NONE: none)."""
    one_slot = max_len is not None and max_len <= BLOCK
    n_seq = num_ns + num_sp
    ns_slots, sp_slots = maps or (0, 0)
    return dict(
        num_ns=num_ns, num_sp=num_sp, ns_implicit=int(ns_implicit),
        has_ns_init=int(has_ns_init), has_ns_accepted=int(has_ns_accepted),
        num_tokens=num_tokens, num_lines=num_lines, state_len=state_len, width=width,
        pad_line=pad_line, null_line=0 if null_line is None else null_line,
        has_null=int(null_line is not None), skip_empty=int(skip_empty),
        max_len=num_tokens if max_len is None else max_len, one_slot=int(one_slot),
        tail_first=tail_first(n_seq, num_tokens, one_slot, maps), spec_first=int(spec_first),
        has_maps=int(maps is not None), ns_slots=ns_slots, sp_slots=sp_slots,
        l2norm_ns=l2norm[0], l2norm_sp=l2norm[1], blocks=rows_words(maps),
        capacity=capacity(n_seq, num_tokens, one_slot, maps))


# The planner's arguments after the slot, in order (backends build their signature and
# their launch from this list). Metadata arrays come as (array, element stride); an
# absent one is any valid array with its "has_" word 0.
# Token maps (``ns_map``, ``sp_map``: the row of x of each of the part's tokens, in the
# part's order; ``has_maps``) number the token slots by part: the non-spec part's
# ``ns_slots`` slots, then the spec part's ``sp_slots`` (the maps' lengths, so each
# part's split outputs have a row per slot), each part's slots after its last sequence
# being its tail; the planner writes each slot's row into the rows table.
METADATA_ARRAYS = ("ns_qsl", "ns_lines", "ns_init", "ns_accepted", "sp_qsl", "sp_lines",
                   "sp_accepted", "ns_map", "sp_map")
PLAN_ARGS = tuple(f"{a}{part}" for a in METADATA_ARRAYS
                  for part in ("", "_offset", "_stride")) + (
    "num_ns", "num_sp", "ns_implicit", "has_ns_init", "has_ns_accepted",
    "num_tokens", "num_lines", "state_len", "width", "pad_line", "null_line", "has_null",
    "skip_empty", "max_len", "one_slot", "tail_first", "spec_first", "has_maps",
    "ns_slots", "sp_slots", "l2norm_ns", "l2norm_sp",
    "tables", "blocks", "errors", "capacity",
)
# ``slot_record``'s arguments after the slot: the planner's without its table, the rows
# it writes and the stage's check (a conv kernel that plans its own block takes no maps).
RECORD_ARGS = tuple(a for a in PLAN_ARGS if a not in (
    "tables", "blocks", "capacity", "ns_map", "ns_map_offset", "ns_map_stride", "sp_map",
    "sp_map_offset", "sp_map_stride", "l2norm_ns", "l2norm_sp"))


def _start_token(i, ns_qsl, ns_qsl_offset, ns_qsl_stride, sp_qsl, sp_qsl_offset,
                 sp_qsl_stride, num_ns, ns_implicit, num_sp, spec_first, has_maps, ns_slots):
    """T(i): the token slot of sequence i's first token (i may be num_ns + num_sp: the
    slot after the last token). Sequences are numbered in the order of their rows: non-spec
    then spec, or with ``spec_first`` spec then non-spec (vLLM's layout). With token maps
    the spec part's slots start at ``ns_slots`` (never spec first)."""
    if spec_first:
        n_sp = 0
        if num_sp > 0:
            if i <= num_sp:
                return sp_qsl[sp_qsl_offset + i * sp_qsl_stride]
            n_sp = sp_qsl[sp_qsl_offset + num_sp * sp_qsl_stride]
        k = i - num_sp
        if ns_implicit:
            return n_sp + k
        return n_sp + ns_qsl[ns_qsl_offset + k * ns_qsl_stride]
    if i <= num_ns and (i < num_ns or not has_maps):
        if ns_implicit:
            return i
        return ns_qsl[ns_qsl_offset + i * ns_qsl_stride]
    n_ns = num_ns
    if has_maps:
        n_ns = ns_slots
        if num_sp == 0:  # (no spec query_start_loc to read)
            return n_ns
    elif not ns_implicit:
        n_ns = ns_qsl[ns_qsl_offset + num_ns * ns_qsl_stride]
    return n_ns + sp_qsl[sp_qsl_offset + (i - num_ns) * sp_qsl_stride]


def slot_record(s, ns_qsl, ns_qsl_offset, ns_qsl_stride, ns_lines, ns_lines_offset,
                ns_lines_stride, ns_init, ns_init_offset, ns_init_stride, ns_accepted,
                ns_accepted_offset, ns_accepted_stride, sp_qsl, sp_qsl_offset,
                sp_qsl_stride, sp_lines, sp_lines_offset, sp_lines_stride, sp_accepted,
                sp_accepted_offset, sp_accepted_stride, num_ns, num_sp, ns_implicit,
                has_ns_init, has_ns_accepted, num_tokens, num_lines, state_len, width,
                pad_line, null_line, has_null, skip_empty, max_len, one_slot, tail_first,
                spec_first, has_maps, ns_slots, sp_slots, errors):
    """The record of block slot ``s`` (``abi.BLOCK_FIELDS``), and for s < P + Q the check
    of sequence s: what the planner stores, and what a conv kernel that plans its own
    block (``template``'s ``fused_plan``) computes instead of reading it. With token maps
    the record's rows are slots (``plan_slot`` writes the rows table and the row fields)."""
    n_seq = num_ns + num_sp
    # Which sequence (i, block k of it) this slot holds; i = -1: the tail's block k;
    # i = -2: an inert slot.
    i = -2
    k = 0
    if s >= tail_first:
        i = -1
        k = s - tail_first
    elif one_slot:
        if s < n_seq:
            i = s
    elif n_seq > 0:
        lo = 0
        hi = n_seq
        first = _start_token(0, ns_qsl, ns_qsl_offset, ns_qsl_stride, sp_qsl, sp_qsl_offset,
                             sp_qsl_stride, num_ns, ns_implicit, num_sp, spec_first,
                             has_maps, ns_slots)
        if first // BLOCK <= s:
            while hi - lo > 1:
                mid = (lo + hi) // 2
                t_mid = _start_token(mid, ns_qsl, ns_qsl_offset, ns_qsl_stride, sp_qsl,
                                     sp_qsl_offset, sp_qsl_stride, num_ns, ns_implicit,
                                     num_sp, spec_first, has_maps, ns_slots)
                if mid + t_mid // BLOCK <= s:
                    lo = mid
                else:
                    hi = mid
            t_lo = _start_token(lo, ns_qsl, ns_qsl_offset, ns_qsl_stride, sp_qsl,
                                sp_qsl_offset, sp_qsl_stride, num_ns, ns_implicit, num_sp,
                                spec_first, has_maps, ns_slots)
            i = lo
            k = s - (lo + t_lo // BLOCK)

    if s == 0:  # the parts' query_start_loc start at 0
        if not ns_implicit and ns_qsl[ns_qsl_offset] != 0:
            errors[E_QSL] = 1
        if num_sp > 0 and sp_qsl[sp_qsl_offset] != 0:
            errors[E_QSL] = 1
    if s < n_seq and s != i:  # this slot's work-item checks sequence s too
        _sequence(s, True, ns_qsl, ns_qsl_offset, ns_qsl_stride, ns_lines, ns_lines_offset,
                  ns_lines_stride, ns_init, ns_init_offset, ns_init_stride, ns_accepted,
                  ns_accepted_offset, ns_accepted_stride, sp_qsl, sp_qsl_offset,
                  sp_qsl_stride, sp_lines, sp_lines_offset, sp_lines_stride, sp_accepted,
                  sp_accepted_offset, sp_accepted_stride, num_ns, num_sp, spec_first,
                  ns_implicit, has_ns_init, has_ns_accepted, num_tokens, num_lines,
                  state_len, width, pad_line, null_line, has_null, skip_empty, max_len,
                  has_maps, ns_slots, sp_slots, errors)

    tok = 0
    n = 0
    pos = 0
    seq_len = 0
    line = -1
    off = 0
    flags = FLAG_BLOCK_ROWS | FLAG_SEQ_ROWS
    if i == -1:
        # The tail: the slots after the last sequence (with token maps, each part's
        # slots after its last sequence: the non-spec part's tail blocks first).
        limit = num_tokens
        spec_tail = num_ns == 0  # spec sequences alone: split outputs give it that part
        if has_maps:
            ns_tail = (ns_slots + BLOCK - 1) // BLOCK
            spec_tail = k >= ns_tail
            if spec_tail:
                k = k - ns_tail
                limit = ns_slots + sp_slots
                t_end = _start_token(n_seq, ns_qsl, ns_qsl_offset, ns_qsl_stride, sp_qsl,
                                     sp_qsl_offset, sp_qsl_stride, num_ns, ns_implicit,
                                     num_sp, spec_first, has_maps, ns_slots)
            else:
                limit = ns_slots
                t_end = num_ns
                if not ns_implicit:
                    t_end = ns_qsl[ns_qsl_offset + num_ns * ns_qsl_stride]
        else:
            t_end = _start_token(n_seq, ns_qsl, ns_qsl_offset, ns_qsl_stride, sp_qsl,
                                 sp_qsl_offset, sp_qsl_stride, num_ns, ns_implicit, num_sp,
                                 spec_first, has_maps, ns_slots)
        if t_end < 0:
            t_end = limit  # bad query_start_loc (flagged): no tail
        tok = t_end + k * BLOCK
        if tok < limit:
            n = min(BLOCK, limit - tok)
        else:
            tok = 0
        seq_len = n
        if spec_tail:
            flags = flags | FLAG_SPEC
    elif i >= 0:
        t0, length, line, off, flags, ok = _sequence(i, s == i, ns_qsl, ns_qsl_offset,
            ns_qsl_stride, ns_lines, ns_lines_offset, ns_lines_stride, ns_init,
            ns_init_offset, ns_init_stride, ns_accepted, ns_accepted_offset,
            ns_accepted_stride, sp_qsl, sp_qsl_offset, sp_qsl_stride, sp_lines,
            sp_lines_offset, sp_lines_stride, sp_accepted, sp_accepted_offset,
            sp_accepted_stride, num_ns, num_sp, spec_first, ns_implicit, has_ns_init,
            has_ns_accepted, num_tokens, num_lines, state_len, width, pad_line, null_line,
            has_null, skip_empty, max_len, has_maps, ns_slots, sp_slots, errors)
        if ok:
            blocks_of_seq = 1
            if not one_slot and length > BLOCK:
                blocks_of_seq = (length + BLOCK - 1) // BLOCK
            if k < blocks_of_seq:
                pos = k * BLOCK
                tok = t0 + pos
                n = length - pos
                if n < 0:
                    n = 0
                if not one_slot and n > BLOCK:
                    n = BLOCK
                seq_len = length
            else:
                line = -1
        else:
            line = -1  # rows outside x: nothing to write
    return tok, n, pos, seq_len, line, off, flags, tok


def plan_slot(s, ns_qsl, ns_qsl_offset, ns_qsl_stride, ns_lines, ns_lines_offset,
              ns_lines_stride, ns_init, ns_init_offset, ns_init_stride, ns_accepted,
              ns_accepted_offset, ns_accepted_stride, sp_qsl, sp_qsl_offset, sp_qsl_stride,
              sp_lines, sp_lines_offset, sp_lines_stride, sp_accepted, sp_accepted_offset,
              sp_accepted_stride, ns_map, ns_map_offset, ns_map_stride, sp_map,
              sp_map_offset, sp_map_stride, num_ns, num_sp, ns_implicit, has_ns_init,
              has_ns_accepted, num_tokens, num_lines, state_len, width, pad_line,
              null_line, has_null, skip_empty, max_len, one_slot, tail_first, spec_first,
              has_maps, ns_slots, sp_slots, l2norm_ns, l2norm_sp, tables, blocks, errors):
    """Write the record of block slot ``s`` into ``tables`` at ``blocks``; with token
    maps also its tokens' rows into the rows table (at 0), and its record's row fields
    from them. A GDN stage's first normalised row of a part (``l2norm_ns`` /
    ``l2norm_sp``, in the part's rows; -1: none) must begin a sequence: a sequence
    that holds it past its first row is skipped (a pad) and reported."""
    tok, n, pos, seq_len, line, off, flags, row0 = slot_record(s, ns_qsl, ns_qsl_offset,
        ns_qsl_stride, ns_lines, ns_lines_offset, ns_lines_stride, ns_init, ns_init_offset,
        ns_init_stride, ns_accepted, ns_accepted_offset, ns_accepted_stride, sp_qsl,
        sp_qsl_offset, sp_qsl_stride, sp_lines, sp_lines_offset, sp_lines_stride,
        sp_accepted, sp_accepted_offset, sp_accepted_stride, num_ns, num_sp, ns_implicit,
        has_ns_init, has_ns_accepted, num_tokens, num_lines, state_len, width, pad_line,
        null_line, has_null, skip_empty, max_len, one_slot, tail_first, spec_first,
        has_maps, ns_slots, sp_slots, errors)
    if line >= 0 and s < tail_first:  # a sequence's block: the stage's l2norm row
        spec = (flags & FLAG_SPEC) != 0
        first = l2norm_ns
        base = 0
        if spec:
            first = l2norm_sp
            if has_maps:
                base = ns_slots
            elif not spec_first:
                base = _start_token(num_ns, ns_qsl, ns_qsl_offset, ns_qsl_stride, sp_qsl,
                                    sp_qsl_offset, sp_qsl_stride, num_ns, ns_implicit,
                                    num_sp, spec_first, has_maps, ns_slots)
        elif spec_first:  # the non-spec part's rows follow the spec part's
            base = _start_token(num_sp, ns_qsl, ns_qsl_offset, ns_qsl_stride, sp_qsl,
                                sp_qsl_offset, sp_qsl_stride, num_ns, ns_implicit, num_sp,
                                spec_first, has_maps, ns_slots)
        start = tok - pos - base  # the sequence's first row in its part
        if (first > start) & (first < start + seq_len):
            errors[E_L2NORM] = 1
            line = -1
    if has_maps:
        # the block's rows, each map entry checked as it is read (one outside x reads
        # row 0, reported); consecutive rows keep FLAG_BLOCK_ROWS, the sequence's rows
        # are looked up (FLAG_SEQ_ROWS off)
        consecutive = 1
        for j in range(n):
            t = tok + j
            if t < ns_slots:
                r = ns_map[ns_map_offset + t * ns_map_stride]
            else:
                r = sp_map[sp_map_offset + (t - ns_slots) * sp_map_stride]
            if (r < 0) | (r >= num_tokens):
                errors[E_MAP] = 1
                r = 0
            tables[t] = r
            if j == 0:
                row0 = r
            elif r != row0 + j:
                consecutive = 0
        flags = flags & ~FLAG_SEQ_ROWS
        if not consecutive:
            flags = flags & ~FLAG_BLOCK_ROWS
    at = blocks + s * NF
    tables[at] = tok
    tables[at + 1] = n
    tables[at + 2] = pos
    tables[at + 3] = seq_len
    tables[at + 4] = line
    tables[at + 5] = off
    tables[at + 6] = flags
    tables[at + 7] = row0


def _sequence(i, report, ns_qsl, ns_qsl_offset, ns_qsl_stride, ns_lines, ns_lines_offset,
              ns_lines_stride, ns_init, ns_init_offset, ns_init_stride, ns_accepted,
              ns_accepted_offset, ns_accepted_stride, sp_qsl, sp_qsl_offset, sp_qsl_stride,
              sp_lines, sp_lines_offset, sp_lines_stride, sp_accepted, sp_accepted_offset,
              sp_accepted_stride, num_ns, num_sp, spec_first, ns_implicit, has_ns_init,
              has_ns_accepted, num_tokens, num_lines, state_len, width, pad_line, null_line,
              has_null, skip_empty, max_len, has_maps, ns_slots, sp_slots, errors):
    """Sequence i's (first token slot, length, cache line (-1: pad), window offset, flags,
    rows inside x), by SEMANTICS.md's rules; a bad value becomes a pad (and, with
    ``report``, sets its error word). ``ok`` 0: its rows are not inside x (with token
    maps: its slots not inside its part's). (An int, not
    a bool: a bool in the returned tuple crashed the OpenCL CPU compiler's build of the
    SPIR-V, runtime 2024.2.)"""
    spec = i >= num_ns
    j = i - num_ns if spec else i  # the sequence's index in its part
    if spec_first:
        spec = i < num_sp
        j = i if spec else i - num_sp
    # Every value the sequence needs is loaded before any of them is tested, and the
    # tests are combined without branches into one decision at the end: each loaded
    # value is used on every path, so the compiler cannot sink a load behind the test
    # before it, and the loads are in flight together (one memory latency, not one per
    # test; on a GPU the conv kernel's threads wait for them). Each index is valid: j
    # is inside its part's arrays (their shapes are checked on the host), and an absent
    # array is a placeholder read at its first element (stride 0).
    t0 = _start_token(i, ns_qsl, ns_qsl_offset, ns_qsl_stride, sp_qsl, sp_qsl_offset,
                      sp_qsl_stride, num_ns, ns_implicit, num_sp, spec_first, has_maps,
                      ns_slots)
    t1 = _start_token(i + 1, ns_qsl, ns_qsl_offset, ns_qsl_stride, sp_qsl, sp_qsl_offset,
                      sp_qsl_stride, num_ns, ns_implicit, num_sp, spec_first, 0, 0)
    limit = num_tokens  # the slot after the part's last
    start = 0  # the part's first slot
    if has_maps:
        limit = ns_slots
        if spec:
            start = ns_slots
            limit = ns_slots + sp_slots
            t1 = ns_slots + sp_qsl[sp_qsl_offset + (j + 1) * sp_qsl_stride]
    flags = FLAG_BLOCK_ROWS | FLAG_SEQ_ROWS | FLAG_INITIAL_STATE
    if spec:
        raw = sp_lines[sp_lines_offset + j * sp_lines_stride]
        accepted = sp_accepted[sp_accepted_offset + j * sp_accepted_stride]
        flags |= FLAG_SPEC
    else:
        raw = ns_lines[ns_lines_offset + j * ns_lines_stride]
        accepted = ns_accepted[ns_accepted_offset + j * ns_accepted_stride]
        if has_ns_init and ns_init[ns_init_offset + j * ns_init_stride] == 0:
            flags = FLAG_BLOCK_ROWS | FLAG_SEQ_ROWS
    length = t1 - t0
    outside = (length < 0) | (t0 < start) | (t1 > limit)  # rows not inside x
    pad = (raw == pad_line) | ((has_null != 0) & (raw == null_line)) | (
        (skip_empty != 0) & (length == 0))
    bad = -1  # the error of a bad value, the last test's where several fail
    if (raw < 0) | (raw >= num_lines):
        bad = E_LINE
    counted = spec | (has_ns_accepted != 0)  # the window starts at accepted - 1
    if counted & ((accepted < 1) | (accepted - 1 + width - 1 > state_len)):
        bad = E_ACCEPTED
    if (length > max_len) | (spec & (width - 2 + length > state_len)):
        bad = E_LENGTH
    if outside:
        bad = E_QSL
    elif pad:
        bad = -1
    if report and bad >= 0:
        errors[bad] = 1
    off = accepted - 1 if counted else 0
    line = raw
    if outside | pad | (bad >= 0):
        line = -1
        off = 0
    if outside:
        return 0, 0, -1, 0, FLAG_BLOCK_ROWS | FLAG_SEQ_ROWS, 0
    return t0, length, line, off, flags, 1


# The state rules of a device plan (SEMANTICS.md "More state rules": parent maps,
# intermediate windows, write lines), planned by a second kernel after ``plan_slot``, one
# work-item per sequence (``plan_rules``). Only for plans of one slot per sequence (every
# sequence at most B tokens, declared): sequence i's record is slot i's. Per part
# (non-spec, spec), each array is optional: parents (sequences, >= max_query_len) with a
# column stride, window rows and write lines (sequences,).
RULE_ARRAYS = ("ns_parents", "sp_parents", "ns_windows", "sp_windows", "ns_write", "sp_write")
RULE_ARGS = tuple(f"{a}{part}" for a in RULE_ARRAYS
                  for part in ("", "_offset", "_stride")) + (
    "ns_parents_cstride", "sp_parents_cstride", "given", "num_ns", "num_sp", "spec_first",
    "num_tokens", "num_lines", "win_rows", "win_steps", "tables", "blocks", "links",
    "errors", "count",
)


def rule_bit(array):
    """The bit of ``RULE_ARRAYS`` entry ``array`` in ``plan_rules``' ``given``."""
    return 1 << RULE_ARRAYS.index(array)


def links_words(num_tokens, num_sequences):
    """Size of a device plan's "links" table (``abi.TABLES``): LINK_FIELDS for each row
    of x and for each sequence (an empty sequence's own slot, after the rows), then one
    record (SEQUENCE_FIELDS, no checkpoints) per sequence."""
    return (num_tokens + num_sequences) * NL + num_sequences * NS


def plan_rules(i, ns_parents, ns_parents_offset, ns_parents_stride, sp_parents,
               sp_parents_offset, sp_parents_stride, ns_windows, ns_windows_offset,
               ns_windows_stride, sp_windows, sp_windows_offset, sp_windows_stride,
               ns_write, ns_write_offset, ns_write_stride, sp_write, sp_write_offset,
               sp_write_stride, ns_parents_cstride, sp_parents_cstride, given, num_ns,
               num_sp, spec_first, num_tokens, num_lines, win_rows, win_steps, tables,
               blocks, links, errors):
    """Sequence i's rules, after ``plan_slot`` wrote its record (slot i): checks them
    (a bad one makes the sequence a pad and sets its error word), then writes what the
    rule kernels read, as ``batch.build_batch`` does on the host: the links of its
    tokens (parent, offset of its record), its record (window row, write line; no ring,
    no checkpoints) and its flags (FLAG_CHAIN | FLAG_TREE with parents, FLAG_CHAIN with
    a window row, FLAG_LINES with a write line other than its line). A pad (line -1:
    padded, or skipped by ``plan_slot``) takes no rule."""
    at = blocks + i * NF
    tok = tables[at]
    n = tables[at + 1]
    line = tables[at + 4]
    flags = tables[at + 6]
    if line < 0:
        return
    spec = i >= num_ns
    j = i - num_ns if spec else i
    if spec_first:
        spec = i < num_sp
        j = i if spec else i - num_sp
    shift = 1 if spec else 0  # the part's bits of ``given``: ns_ at even, sp_ at odd bits
    tree = (given >> shift) & 1
    wrow = -1
    wline = line
    if spec:
        if (given >> 3) & 1:
            wrow = sp_windows[sp_windows_offset + j * sp_windows_stride]
        if (given >> 5) & 1:
            wline = sp_write[sp_write_offset + j * sp_write_stride]
    else:
        if (given >> 2) & 1:
            wrow = ns_windows[ns_windows_offset + j * ns_windows_stride]
        if (given >> 4) & 1:
            wline = ns_write[ns_write_offset + j * ns_write_stride]
    bad = -1
    if (wrow < -1) | (wrow >= win_rows) | ((wrow >= 0) & (n > win_steps)):
        bad = E_WINDOW
    if (wline < 0) | (wline >= num_lines):
        bad = E_WRITE
    add = 0
    if tree:
        add = FLAG_CHAIN | FLAG_TREE
    if wrow >= 0:
        add |= FLAG_CHAIN
    if wline != line:
        add |= FLAG_LINES
    if (bad < 0) & (add != 0):
        slots = num_tokens + num_sp + num_ns
        record = slots * NL + i * NS  # the record's offset in "links"
        tables[links + record] = wrow
        tables[links + record + 1] = wline
        tables[links + record + 2] = -1  # no ring
        tables[links + record + 3] = 0
        tables[links + record + 4] = 0  # no checkpoints
        if n == 0:  # an empty sequence finds its record at a slot of its own
            tok = num_tokens + i
            tables[at] = tok
            tables[at + 7] = tok
            tables[links + tok * NL + 1] = record
        # the tokens' links, each parent checked as it is read (links written before a
        # bad one are never read: the sequence becomes a pad)
        for k in range(n):
            parent = k - 1
            if tree and k > 0:
                if spec:
                    parent = sp_parents[sp_parents_offset + j * sp_parents_stride +
                                        k * sp_parents_cstride]
                else:
                    parent = ns_parents[ns_parents_offset + j * ns_parents_stride +
                                        k * ns_parents_cstride]
                if (parent < 0) | (parent >= k):
                    bad = E_PARENT
            tables[links + (tok + k) * NL] = parent
            tables[links + (tok + k) * NL + 1] = record
    if bad >= 0:
        errors[bad] = 1
        tables[at + 4] = -1  # a pad: its rows zeros, no line touched
        return
    tables[at + 6] = flags | add
