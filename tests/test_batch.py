"""The host tables: blocks cover every token once, and the contiguous-rows flag is right
(a wrong 1 would make the kernel compute rows instead of loading them: wrong rows read)."""

import numpy as np
import pytest

from jitconv.kernels.batch import Part, build_batch
from jitconv.testing.steps import cumulative


def part(lengths, rows, spec=False):
    n = len(lengths)
    return Part(query_start_loc=cumulative(lengths).numpy().astype(np.int64),
                lines=np.arange(n), rows=np.asarray(rows), offsets=np.zeros(n, np.int64),
                initial=np.ones(n, bool), spec=spec)


def test_blocks_cover_each_token_once_and_flag_contiguous_rows():
    rows = list(range(40)) + [45, 44, 43] + list(range(60, 95))  # one break-up in the middle
    p = part([40, 3, 35], rows)
    b = build_batch([p], num_tokens=100, block_tokens=16)
    slots = np.concatenate([np.arange(t, t + n) for t, n in zip(b.blk_tok, b.blk_len)])
    uncovered_slots = len(rows) + np.arange(100 - len(rows))
    assert np.array_equal(np.sort(slots), np.concatenate([np.arange(len(rows)),
                                                          uncovered_slots]))
    for t, n, flag in zip(b.blk_tok, b.blk_len, b.blk_contig):
        block_rows = b.rows[t:t + n]
        assert flag == int(np.all(np.diff(block_rows) == 1)), (t, n, block_rows)
    # Blocks: 40 tokens as 16+16+8 (consecutive rows), the reversed 3, 35 tokens as
    # 16+16+3, then the 22 rows nobody uses (40-42, 46-59, 95-99) as 16+6: not consecutive.
    assert b.blk_len.tolist() == [16, 16, 8, 3, 16, 16, 3, 16, 6]
    assert b.blk_contig.tolist() == [1, 1, 1, 0, 1, 1, 1, 0, 0]


def test_empty_sequences_get_a_block_and_flags_match_their_rows():
    # Sequences of 0, 5, 0 and 3 tokens; the last one's rows are out of order; rows 5 and
    # 6 are used by nobody (one zero-writing block, consecutive rows).
    p = part([0, 5, 0, 3], list(range(5)) + [9, 7, 8])
    b = build_batch([p], num_tokens=10)
    assert b.blk_seq.tolist() == [0, 1, 2, 3, 4]
    assert b.blk_len.tolist() == [0, 5, 0, 3, 2]
    assert b.rows[b.blk_tok[4]:b.blk_tok[4] + 2].tolist() == [5, 6]
    assert b.blk_contig.tolist() == [1, 1, 1, 0, 1]


def test_block_records_carry_their_sequence_and_row_flags():
    # Sequence rows: consecutive (0-39), out of order (45, 44, 43), consecutive across
    # blocks (60-94); a wrong "consecutive sequence" bit makes the kernel compute the rows
    # of the window and of the new state instead of loading them: wrong rows read.
    from jitconv.kernels.abi import (BLOCK_FIELDS, FLAG_BLOCK_ROWS, FLAG_INITIAL_STATE,
                                    FLAG_SEQ_ROWS)
    rows = list(range(40)) + [45, 44, 43] + list(range(60, 95))
    p = part([40, 3, 35], rows)
    b = build_batch([p], num_tokens=100, block_tokens=16)
    rec = {f: b.block_records()[:, i] for i, f in enumerate(BLOCK_FIELDS)}
    s = b.blk_seq
    assert np.array_equal(rec["tok"], b.blk_tok) and np.array_equal(rec["len"], b.blk_len)
    assert np.array_equal(rec["pos"], b.blk_tok - b.seq_tok[s])
    assert np.array_equal(rec["seq_len"], b.seq_len[s])
    assert np.array_equal(rec["line"], b.seq_line[s])
    assert np.array_equal(rec["off"], b.seq_off[s])
    for k, (t, n) in enumerate(zip(b.blk_tok, b.blk_len)):
        if n:
            assert rec["row0"][k] == b.rows[t]
        seq_rows = b.rows[b.seq_tok[s[k]]:b.seq_tok[s[k]] + b.seq_len[s[k]]]
        assert bool(rec["flags"][k] & FLAG_SEQ_ROWS) == bool(np.all(np.diff(seq_rows) == 1))
        assert bool(rec["flags"][k] & FLAG_BLOCK_ROWS) == bool(b.blk_contig[k])
        assert bool(rec["flags"][k] & FLAG_INITIAL_STATE) == bool(b.seq_flags[s[k]] & 1)
    # 40 consecutive, 3 reversed, 35 consecutive, then the unused rows (not consecutive)
    assert [bool(f & FLAG_SEQ_ROWS) for f in rec["flags"]] == [1, 1, 1, 0, 1, 1, 1, 0, 0]
    # The tables: rows padded to whole records, then the records (aligned); no links
    # without parent maps or windows.
    rows_table, blocks_table, links_table = b.tables()
    assert len(rows_table) % len(BLOCK_FIELDS) == 0
    assert np.array_equal(rows_table[:len(b.rows)], b.rows)
    assert np.array_equal(blocks_table, b.block_records().reshape(-1))
    assert len(links_table) == 0 and not b.has_chains()


def test_links_and_one_block_per_tree():
    """A sequence with a parent map is one block whatever its length (its tokens' chains
    may reach its window); the links table holds each token slot's parent and its
    sequence's windows row; a padded sequence gets no chain flag."""
    from jitconv.kernels.abi import FLAG_CHAIN, FLAG_TREE
    tree = Part(query_start_loc=np.array([0, 20, 23, 25]), lines=np.array([3, -1, 1]),
                rows=np.arange(25), offsets=np.zeros(3, np.int64), initial=np.ones(3, bool),
                spec=True, parents=np.concatenate([[-1], np.arange(19), [-1, 0, 0], [-1, 0]]),
                window_rows=np.array([-1, 4, 2]))
    linear = Part(query_start_loc=np.array([0, 40]), lines=np.array([0]),
                  rows=np.arange(25, 65), offsets=np.zeros(1, np.int64),
                  initial=np.ones(1, bool), spec=False, window_rows=np.array([5]))
    b = build_batch([linear, tree], 65, block_tokens=16)
    flags = b.seq_flags
    assert [bool(f & FLAG_CHAIN) for f in flags] == [True, True, False, True]
    assert [bool(f & FLAG_TREE) for f in flags] == [False, True, False, True]
    # the linear sequence in blocks of 16; the 20-token tree in one block
    assert b.blk_len.tolist() == [16, 16, 8, 20, 3, 2]
    assert b.has_chains()
    links = decode_links(b, len(b.rows))
    parent = [p for p, _record in links]
    window_row = [record["window_row"] for _p, record in links]
    assert parent[:40] == list(range(-1, 39))  # the linear chain
    assert parent[40 + 20:40 + 23] == [-1, 0, 0]
    assert window_row[:40] == [5] * 40
    assert window_row[40:60] == [-1] * 20 and window_row[63:65] == [2, 2]
    assert all(record["checkpoints"] == [] and record["ring_len"] == 0
               for _p, record in links)


def decode_links(b, slots):
    """The "links" table of a Batch with ``slots`` link slots, read back as the kernel
    reads it: per slot (parent, its sequence's record by SEQUENCE_FIELDS name, the
    checkpoints as (position, line) pairs)."""
    from jitconv.kernels.abi import LINK_FIELDS, SEQUENCE_FIELDS
    flat = b.links.tolist()
    out = []
    for k in range(slots):
        parent = flat[len(LINK_FIELDS) * k + LINK_FIELDS.index("parent")]
        at = flat[len(LINK_FIELDS) * k + LINK_FIELDS.index("sequence")]
        record = dict(zip(SEQUENCE_FIELDS, flat[at:at + len(SEQUENCE_FIELDS)]))
        pairs = flat[at + len(SEQUENCE_FIELDS):at + len(SEQUENCE_FIELDS)
                     + 2 * record["checkpoints"]]
        record["checkpoints"] = list(zip(pairs[::2], pairs[1::2]))
        out.append((parent, record))
    return out


def test_lines_rings_and_empty_sequences_in_links():
    """Write lines and checkpoints set FLAG_LINES (a write line equal to the read line
    does not), rings FLAG_RING; each sequence's record carries them; an empty sequence
    with rules gets a link slot of its own after the token slots (its first slot), so
    that it never reads another sequence's record; pads get no rule flag."""
    from jitconv.kernels.abi import FLAG_LINES, FLAG_RING
    lines = Part(query_start_loc=np.array([0, 5, 5, 9, 12]), lines=np.array([3, 4, -1, 6]),
                 rows=np.arange(12), offsets=np.zeros(4, np.int64),
                 initial=np.ones(4, bool), spec=False, write_lines=np.array([7, 8, -1, 6]),
                 checkpoints=(np.array([0, 2, 2, 2, 3]), np.array([1, 4, 2]),
                              np.array([3, 9, 10])))
    ring = Part(query_start_loc=np.array([0, 0, 2]), lines=np.array([1, 2]),
                rows=np.arange(12, 14), offsets=np.zeros(2, np.int64),
                initial=np.ones(2, bool), spec=True, ring=(np.array([3, 0]), 5))
    b = build_batch([lines, ring], 14, block_tokens=16)
    flags = b.seq_flags.tolist()
    assert [bool(f & FLAG_LINES) for f in flags] == [True, True, False, True, False, False]
    assert [bool(f & FLAG_RING) for f in flags] == [False] * 4 + [True, True]
    # the two empty sequences with rules: slots 14 and 15; the empty pad keeps slot 5
    assert b.seq_tok.tolist() == [0, 14, 5, 9, 15, 12]
    links = decode_links(b, 16)
    record = {k: links[k][1] for k in (0, 14, 9, 15, 12)}
    assert record[0] == dict(window_row=-1, write_line=7, ring_pos=-1, ring_len=0,
                             checkpoints=[(1, 3), (4, 9)])
    assert record[14]["write_line"] == 8 and record[14]["checkpoints"] == []
    assert record[9] == dict(window_row=-1, write_line=6, ring_pos=-1, ring_len=0,
                             checkpoints=[(2, 10)])
    assert (record[15]["ring_pos"], record[15]["ring_len"]) == (3, 5)
    assert (record[12]["ring_pos"], record[12]["ring_len"]) == (0, 5)


def test_blocks_shorter_than_the_widest_window_are_refused():
    """The kernel takes a later block's whole window from x (positions p0 - width + 1 ..
    p0 - 1 >= 0): a block must hold at least width - 1 tokens for the widest width."""
    p = part([20], list(range(20)))
    with pytest.raises(ValueError, match="block_tokens must be >= 7"):
        build_batch([p], num_tokens=20, block_tokens=6)
    b = build_batch([p], num_tokens=20, block_tokens=7)
    assert b.blk_len.tolist() == [7, 7, 6]


def test_longest_sequences_count_only_sequences_with_a_cache_line():
    """(non-spec, spec) longest sequence, pads (line -1) and uncovered rows left out: the
    CUDA backend picks its short kernels by it, so a pad may be of any length."""
    ns = part([1, 30, 2], list(range(33)))
    ns.lines[1] = -1  # a pad of 30 tokens
    sp = part([4, 3], list(range(40, 47)), spec=True)
    b = build_batch([ns, sp], num_tokens=60)  # rows 33-39 and 47-59: nobody's
    assert b.longest_sequences() == (2, 4)
    sp.lines[0] = -1
    assert build_batch([ns, sp], num_tokens=60).longest_sequences() == (2, 3)
    assert build_batch([ns], num_tokens=60).longest_sequences() == (2, 0)
