"""The host tables: blocks cover every token once, and the contiguous-rows flag is right
(a wrong 1 would make the kernel read the wrong rows)."""

import numpy as np

from jitconv.batch import Part, build_batch


def part(lengths, rows, spec=False):
    qsl = np.concatenate([[0], np.cumsum(lengths)])
    n = len(lengths)
    return Part(qsl, np.arange(n), np.asarray(rows), np.zeros(n, np.int64),
                np.ones(n, bool), spec)


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
    assert 0 in b.blk_contig and 1 in b.blk_contig


def test_empty_sequences_get_a_block_and_flags_stay_in_range():
    p = part([0, 5, 0], list(range(5)))
    b = build_batch([p], num_tokens=5)
    assert len(b.blk_seq) == 3 and list(b.blk_len) == [0, 5, 0]
    assert set(b.blk_contig.tolist()) <= {0, 1}
