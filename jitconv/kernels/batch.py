"""The host-side description of one engine step: which tokens form which sequence, and
how the work is cut into blocks for the kernel.

A ``Batch`` is built from validated metadata (``ops.py`` validates). It holds:
- ``rows``: for each token slot, in sequence order, the row of x (and out) it uses. Slots
  are the non-spec tokens, then the spec tokens, then any rows of x that no sequence
  covers (those get zeros, as pads do: never stale memory).
- per sequence: first slot, length, cache line (-1 for pads and the uncovered rows),
  window offset (num_accepted - 1) and flags (initial state, spec).
- per block: sequence, first slot, token count. A block is at most ``block_tokens``
  consecutive tokens of one sequence; every sequence has at least one block so that its
  state update happens even when it has no tokens.
"""

from dataclasses import dataclass

import numpy as np

from jitconv.kernels.abi import (BLOCK_FIELDS, FLAG_BLOCK_ROWS, FLAG_CHAIN, FLAG_INITIAL_STATE,
                                 FLAG_LINES, FLAG_RING, FLAG_SEQ_ROWS, FLAG_SPEC, FLAG_TREE,
                                 FLAG_UNCOVERED, LINK_FIELDS, RULE_FLAGS, SEQUENCE_FIELDS,
                                 SUPPORTED_WIDTHS)

DEFAULT_BLOCK_TOKENS = 16



@dataclass(frozen=True, kw_only=True)
class Batch:
    rows: np.ndarray
    seq_tok: np.ndarray
    seq_len: np.ndarray
    seq_line: np.ndarray
    seq_off: np.ndarray
    seq_flags: np.ndarray
    blk_seq: np.ndarray
    blk_tok: np.ndarray
    blk_len: np.ndarray
    blk_contig: np.ndarray  # 1 if the block's rows of x are consecutive
    seq_contig: np.ndarray  # 1 if all the sequence's rows of x are consecutive
    links: np.ndarray  # abi.TABLES' "links" (flat); empty without rule flags

    @property
    def num_blocks(self):
        return len(self.blk_seq)

    def block_records(self):
        """(num_blocks, len(BLOCK_FIELDS)) int32: per block what the kernel needs, its
        sequence's fields included. One record per block (32 bytes, one memory sector) so
        that a work-item reaches everything with one round of independent loads: with
        per-sequence tables the block's sequence had to be loaded first, one more
        dependent memory latency before any data load (it showed on small launches,
        decode and spec verify, on the H200)."""
        s = self.blk_seq
        flags = self.seq_flags[s] | np.where(self.blk_contig != 0, FLAG_BLOCK_ROWS, 0) | \
            np.where(self.seq_contig[s] != 0, FLAG_SEQ_ROWS, 0)
        row0 = np.zeros(len(s), np.int64)  # (a block without tokens reads no row)
        has_rows = self.blk_len > 0
        row0[has_rows] = self.rows[self.blk_tok[has_rows]]
        fields = dict(tok=self.blk_tok, len=self.blk_len, pos=self.blk_tok - self.seq_tok[s],
                      seq_len=self.seq_len[s], line=self.seq_line[s], off=self.seq_off[s],
                      flags=flags, row0=row0)
        return np.stack([np.asarray(fields[f], np.int64) for f in BLOCK_FIELDS], axis=1) \
            .astype(np.int32)

    def longest_sequences(self):
        """(non-spec, spec): tokens of the longest sequence of each kind that has a cache
        line (pads and the rows no sequence covers not counted); 0 when there is none."""
        real = self.seq_line >= 0
        spec = (self.seq_flags & FLAG_SPEC) != 0
        return tuple(int(self.seq_len[real & kind].max(initial=0)) for kind in (~spec, spec))

    def uniform_decode(self):
        """Whether every sequence with a cache line holds one token and has its window at
        column 0 (a plain decode step: the CUDA backend's uniform decode kernel)."""
        real = self.seq_line >= 0
        return bool(real.any() and (self.seq_len[real] == 1).all()
                    and (self.seq_off[real] == 0).all())

    def tables(self):
        """The int32 arrays in the kernel's argument order (kernels.abi.TABLES): the rows,
        padded to whole records so that the records start aligned, then the records."""
        pad = -len(self.rows) % len(BLOCK_FIELDS)
        rows = np.concatenate([self.rows, np.zeros(pad, np.int32)]).astype(np.int32)
        return [rows, self.block_records().reshape(-1), self.links]

    def has_chains(self):
        """Whether a block takes one of the template's rule pieces (parent maps, windows,
        write lines, checkpoints, rings): such a step needs a kernel with them (the
        general token loops)."""
        return bool((self.seq_flags & RULE_FLAGS).any())

    def has_chain_tokens(self):
        """Whether a sequence's tokens take inputs along a chain (parent maps, windows):
        a token then reads other tokens' rows of x."""
        return bool((self.seq_flags & FLAG_CHAIN).any())


@dataclass(frozen=True, kw_only=True)
class Part:
    """One kind of sequences (non-spec or spec), validated, as host int64 arrays."""
    query_start_loc: np.ndarray  # (n+1,)
    lines: np.ndarray            # (n,), pad_slot_id already mapped to -1
    rows: np.ndarray             # (tokens,) rows of x
    offsets: np.ndarray          # (n,) window start column
    initial: np.ndarray          # (n,) bool
    spec: bool
    # (tokens,) each token's parent position in its sequence (the root's any), checked to
    # be a tree listed parents first; None: the linear chain.
    parents: np.ndarray = None
    window_rows: np.ndarray = None  # (n,) rows of the intermediate windows; None: none
    write_lines: np.ndarray = None  # (n,) line each sequence writes its state to; None: its own
    # Checkpoints: (loc (n+1,) cumulative counts, pos (C,), lines (C,)); None: none.
    checkpoints: tuple = None
    # Rings: (positions (n,) in [0, ring_len), ring_len); None: no ring lines.
    ring: tuple = None


def build_batch(parts, num_tokens, block_tokens=DEFAULT_BLOCK_TOKENS):
    # A later block finds its whole window in x, and the first block is the sole reader
    # of the old state (kernels.template): blocks of at least width - 1 tokens.
    if block_tokens < max(SUPPORTED_WIDTHS) - 1:
        raise ValueError(f"block_tokens must be >= {max(SUPPORTED_WIDTHS) - 1} (the widest "
                         f"window), got {block_tokens}")
    rows = [p.rows for p in parts]
    covered = np.zeros(num_tokens, bool)
    for r in rows:
        covered[r] = True
    uncovered = np.flatnonzero(~covered)

    seq_tok, seq_len, seq_line, seq_off, seq_flags = [], [], [], [], []
    rules = any(p.parents is not None or p.window_rows is not None or
                p.write_lines is not None or p.checkpoints is not None or p.ring is not None
                for p in parts)
    link_parts = []  # per part, with rules: (parents per token slot, records per sequence)
    slot = 0
    for p in parts:
        qsl = p.query_start_loc
        lengths = np.diff(qsl)
        seq_tok.append(slot + qsl[:-1])
        seq_len.append(lengths)
        seq_line.append(p.lines)
        seq_off.append(p.offsets)
        flags = np.where(p.initial, FLAG_INITIAL_STATE, 0) | (FLAG_SPEC if p.spec else 0)
        real = p.lines >= 0
        if p.parents is not None:
            flags = flags | np.where(real, FLAG_CHAIN | FLAG_TREE, 0)
        if p.window_rows is not None:
            flags = flags | np.where(real & (p.window_rows >= 0), FLAG_CHAIN, 0)
        writes = p.lines if p.write_lines is None else np.where(real, p.write_lines, p.lines)
        flags = flags | np.where(real & (writes != p.lines), FLAG_LINES, 0)
        if p.checkpoints is not None:
            flags = flags | np.where(real & (np.diff(p.checkpoints[0]) > 0), FLAG_LINES, 0)
        if p.ring is not None:
            flags = flags | np.where(real, FLAG_RING, 0)
        if rules:
            link_parts.append((p.parents if p.parents is not None else
                               np.arange(int(qsl[-1])) - np.repeat(qsl[:-1], lengths) - 1,
                               _records(p, writes)))
        seq_flags.append(flags)
        slot += int(qsl[-1])
    if len(uncovered):
        # One pseudo pad sequence writes zeros to the rows nobody covers.
        seq_tok.append([slot])
        seq_len.append([len(uncovered)])
        seq_line.append([-1])
        seq_off.append([0])
        seq_flags.append([FLAG_UNCOVERED])
        if rules:
            link_parts.append((np.full(len(uncovered), -1), [_record(-1, -1, -1, 0, [])]))
    rows.append(uncovered)

    def cat(chunks):
        return np.concatenate([np.asarray(c, np.int64) for c in chunks] or
                              [np.zeros(0, np.int64)])

    seq_tok, seq_len, seq_line = cat(seq_tok), cat(seq_len), cat(seq_line)
    seq_off, seq_flags, rows = cat(seq_off), cat(seq_flags), cat(rows)
    links = np.zeros(0, np.int64)
    if (seq_flags & RULE_FLAGS).any():
        seq_tok, links = _links(link_parts, seq_tok, seq_len, seq_flags)

    # A sequence with a parent map is one block: its tokens' chains may reach its window.
    tokens_per_block = np.where(seq_flags & FLAG_TREE, np.maximum(seq_len, 1), block_tokens)
    nblk = np.maximum(1, -(-seq_len // tokens_per_block))
    blk_seq = np.repeat(np.arange(len(seq_len)), nblk)
    first_blk = np.cumsum(nblk) - nblk
    k = np.arange(len(blk_seq)) - np.repeat(first_blk, nblk)
    per = tokens_per_block[blk_seq]
    blk_tok = seq_tok[blk_seq] + k * per
    blk_len = np.clip(seq_len[blk_seq] - k * per, 0, per)
    # A block whose tokens sit in consecutive rows of x (the usual case: a sequence's
    # tokens are contiguous) lets the kernel compute rows instead of loading each one:
    # an indexed row per token kept the loads from vectorizing well (~2x slower here).
    # The same for a whole sequence: then the kernel computes the rows of the window and
    # of the new state from the block's first row instead of loading them.
    breaks = np.concatenate([[0], np.cumsum(np.diff(rows) != 1)])

    def consecutive(first, count):
        """Per span of slots [first, first + count): its rows are consecutive."""
        if not len(rows):
            return np.ones(len(first), bool)
        last = np.maximum(first + count - 1, first)
        return breaks[np.minimum(last, len(rows) - 1)] == breaks[np.minimum(first, len(rows) - 1)]

    blk_contig, seq_contig = consecutive(blk_tok, blk_len), consecutive(seq_tok, seq_len)
    i32 = lambda a: a.astype(np.int32)  # noqa: E731
    return Batch(rows=i32(rows), seq_tok=i32(seq_tok), seq_len=i32(seq_len),
                 seq_line=i32(seq_line), seq_off=i32(seq_off), seq_flags=i32(seq_flags),
                 blk_seq=i32(blk_seq), blk_tok=i32(blk_tok), blk_len=i32(blk_len),
                 blk_contig=i32(blk_contig), seq_contig=i32(seq_contig), links=i32(links))


def _record(window_row, write_line, ring_pos, ring_len, checkpoints):
    """One sequence's record in "links" (``abi.SEQUENCE_FIELDS``, then its checkpoints'
    (position, line) pairs)."""
    fields = dict(window_row=window_row, write_line=write_line, ring_pos=ring_pos,
                  ring_len=ring_len, checkpoints=len(checkpoints))
    return [int(fields[f]) for f in SEQUENCE_FIELDS] + [int(v) for pair in checkpoints
                                                        for v in pair]


def _records(p, writes):
    """The records of a part's sequences (padded ones: no rules)."""
    nseq = len(p.lines)
    real = p.lines >= 0
    rows = np.full(nseq, -1) if p.window_rows is None else p.window_rows
    pos, ring_len = (np.full(nseq, -1), 0) if p.ring is None else p.ring
    loc = np.zeros(nseq + 1, np.int64) if p.checkpoints is None else p.checkpoints[0]
    out = []
    for i in range(nseq):
        checkpoints = []
        if real[i] and loc[i + 1] > loc[i]:
            _loc, cpos, clines = p.checkpoints
            checkpoints = list(zip(cpos[loc[i]:loc[i + 1]], clines[loc[i]:loc[i + 1]]))
        out.append(_record(rows[i], writes[i], pos[i] if real[i] else -1,
                           ring_len if real[i] and p.ring is not None else 0, checkpoints))
    return out


def _links(link_parts, seq_tok, seq_len, seq_flags):
    """The "links" table (``abi.TABLES``) of a step with rule flags, and the sequences'
    first slots (an empty sequence with rule flags moved to a slot of its own after the
    token slots, so that it finds its record)."""
    parent = np.concatenate([lp[0] for lp in link_parts])
    records = [r for lp in link_parts for r in lp[1]]
    slots = len(parent)
    empty = np.flatnonzero((seq_len == 0) & ((seq_flags & RULE_FLAGS) != 0))
    seq_tok = seq_tok.copy()
    seq_tok[empty] = slots + np.arange(len(empty))
    nslots = slots + len(empty)
    sizes = np.array([len(r) for r in records], np.int64)
    at = nslots * len(LINK_FIELDS) + np.cumsum(sizes) - sizes  # each record's offset
    fields = np.full((nslots, len(LINK_FIELDS)), -1, np.int64)
    fields[:slots, 0] = parent
    seq_of_slot = np.concatenate([np.repeat(np.arange(len(seq_len)), seq_len), empty])
    fields[:, 1] = at[seq_of_slot]
    return seq_tok, np.concatenate([fields.reshape(-1)] + [np.asarray(r, np.int64)
                                                           for r in records])
