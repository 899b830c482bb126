"""The conv kernel's source, written once for every backend: the math of SEMANTICS.md
as Python source text that a backend compiles (numba-dpex for SYCL in
``backends/sycl/kernels.py``, numba-cuda in ``backends/cuda/kernels.py``). This module
imports neither. A backend supplies what differs (a ``Backend``): how a work-item finds
its channel group and block (and the bounds guard a rounded-up CUDA grid needs), its
extra arguments, and, as globals of the generated function, the storage conversions
``load``/``store``, ``strided``, ``fdiv``, ``exp`` and ``_window_value``.

One kernel serves every kind of sequence (prefill chunk, plain decode, spec verify, pad).
The index space is 2-D: the channel group (fastest-varying: neighbouring work-items touch
neighbouring channels of one token row) and the block, up to B consecutive tokens of one
sequence (B >= width - 1: the first block of a sequence writes the new state, so a later
block must find its window in x). A work-item handles C contiguous channels (names
suffixed _0.._{C-1} when C > 1), finds its block's fields in one record of the blocks
table (``abi.BLOCK_FIELDS``), loads the width - 1 inputs before the block (from x, the
cache line, or zeros), then slides over the block's tokens. The work-item of a
sequence's first block is the only reader of its old state window, so it writes the new
state without racing anyone. New state values are raw copies of inputs (bit-exact);
accumulation is float32, rounded once to the output dtype.

Options (``kernel_source``; which backend sets which, and why, with the measurements and
how to reproduce them: docs/design.md):
- ``channels`` C, ``lookahead`` L (loads of L tokens issued before their stores),
  ``state_chunk`` (new-state values loaded per round before storing them);
- ``row_group`` G: rows of x and out accessed G channels at a time (the SYCL "wide"
  kernel: C = G = 4 for 16-bit data, with the state grouped the same way), and
  ``group_state`` (the state grouped on a backend without ``unit_stride_reads``);
- ``short_tokens`` T: a kernel for launches whose sequences hold at most T tokens;
  ``uniform_decode``: for decode steps whose every sequence holds one token with its
  window at column 0, those two fields as constants;
- ``early_weights`` (weights and bias loaded before the state update), ``vector_taps``
  (a (dim, 4) weight's taps as one vector load);
- backend flags: ``unit_stride_reads`` (SYCL: channel-unit-stride paths chosen by uniform
  branches on the strides, 64-bit weight words), ``early_record`` (the block record's
  every field read with its first ones, before the pad check),
  ``reuse_state_loads`` and ``split_window`` (CUDA: fewer instructions and memory rounds
  per decode or spec work-item);
- ``stage``: the GDN conv stage (SEMANTICS.md) in the same kernel: the outputs in head
  layout, q and k l2-normalised, the gates (``kernel_source``).
"""

from dataclasses import dataclass

import numpy as np

from jitconv.kernels.abi import BLOCK_FIELDS, LINK_FIELDS, SEQUENCE_FIELDS, STAGE_ARGS


@dataclass(frozen=True, kw_only=True)
class Backend:
    """What the template leaves to a backend. ``index`` sets ``c`` (first channel of the
    work-item, from its group times C) and ``b`` (block), formatted with {C}; it may
    return early (bounds guard). ``index_arg``: leading parameter(s) (SYCL's item);
    ``extra_args``: trailing parameters the index code needs."""
    name: str
    index_arg: str
    index: str
    extra_args: str
    unit_stride_reads: bool = False  # these four: see the module docstring
    early_record: bool = False
    reuse_state_loads: bool = False
    split_window: bool = False
    # A record shared by a thread block (``kernel_source``'s ``shared_record``): an array
    # of {n} record words in shared memory, the test of the block's first work-item, and
    # the barrier after which the others read what it wrote. None: not supported.
    shared_array: str = None
    first_in_group: str = None
    barrier: str = None
    # The GDN stage's l2norm (``kernel_source``'s ``stage``), one of two ways. lane_sum:
    # the name of a device function summing a float32 over the work-items of one head
    # (head_k_dim / C of one token block), every one getting the sum: each token is
    # normalised before its store. group_barrier: a statement after which the stores of
    # the work-group's work-items (one head's, of one token block: the backend launches
    # such work-groups) are visible to all of them: the raw outputs are stored, then each
    # token's head row is normalised by one work-item (``norm_pass``). Neither: no stage
    # kernels.
    lane_sum: str = None
    group_barrier: str = None


def window_value(x, x_at, x_row_stride, state, state_at, tables, rows, first_slot, base, p,
                 initial, zero, strided):
    """The input at position p of the sequence: p >= 0 is a row of x (``x_at`` is the
    channel's offset; the row is ``base + p`` when the sequence's rows are consecutive,
    ``base`` >= 0, else looked up); p < 0 reads the cache line's window (flat index
    ``state_at``, with the backend's ``strided`` element read), or zero without initial
    state. (A device function: backends decorate it.)"""
    if p >= 0:
        r = base + p
        if base < 0:
            r = tables[rows + first_slot + p]
        return x[np.uint64(x_at + r * x_row_stride)]
    if initial:
        return strided(state, np.uint64(state_at))
    return zero


# The kernel body, written once; {…} parts are expanded per width and per channel so that
# the sliding window and the taps live in scalar variables (registers): private arrays
# indexed in loops were slower. Every array is flat (1-D) with explicit element strides:
# with 2-D and 3-D strided numba arrays in a 2-D index space, the OpenCL CPU compiler
# produced wrong loads here (channels 16..31 read the weights of channels 0..15).
# Indices are cast to unsigned (U): for a signed index numba adds negative-index
# wraparound, a per-lane select that turns contiguous loads into gathers (2x slower);
# for the tables too (about 6 integer instructions per read on a GPU).
# Loads are grouped before stores wherever the values allow it: for the compiler any
# store may alias x (it cannot know that out, state and x never overlap), so a load
# placed after a store waits for it, and on a GPU every such wait is a memory latency.
_TEMPLATE = """
{signature}
    # rows, blocks: offsets of the per-call tables inside `tables` (jitconv.kernels.abi.TABLES);
    # a block's record holds BLOCK_FIELDS, its sequence's fields included.
{index}
{record}
    t0 = {tok}
    nb = {len}
    line = {line}
    flags = {flags}
    r0 = {row0}  # the row of the block's first token (consecutive rows)
{early_record}{channel_offsets}
    o = out  # the array this block's outputs go to, and its row stride
    ors = out_row_stride
    ob = -1  # out row r is x row r; split outputs: the block's first out row (its slot)
    if split:
        ob = t0
        if split == SPLIT_PARTS and flags & FLAG_SPEC:
            o = out2
            ors = out2_row_stride
            ob = t0 - spec_slot0
{split_offsets}
{stage_offsets}    if line < 0:
        # Padded sequence, or output rows no sequence covers: zeros, no state access.
        if ob >= 0 and flags & FLAG_UNCOVERED:
            return  # rows of neither part: no split output has them
        for i in range(nb):
            r = r0 + i
            if not flags & FLAG_BLOCK_ROWS:
                r = tables[U(rows + t0 + i)]
{pad_zeros}
{pad_gates}        return

{early_weights}{late_record}    first_slot = t0 - p0  # the sequence's first token slot
    initial = flags & FLAG_INITIAL_STATE
    base = -1  # the row of position 0 when the sequence's rows are consecutive
    if flags & FLAG_SEQ_ROWS:
        base = r0 - p0
{state_part}
{late_weights}{window_to_float}
{tokens}
{norm_pass}{gates}"""


# The kernel's parameters: CONV_ARGS (abi), after the backend's index argument(s) and
# before its extra ones; a fused kernel's record arguments follow (``kernel_source``).
_PARAMETERS = """{index_arg}x, x_offset, x_row_stride, out, out_offset, out_row_stride,
           weight, weight_offset, weight_stride_c, weight_stride_k,
           bias, bias_offset, bias_stride,
           state, state_offset, state_stride_line, state_stride_c, state_stride_col,
           tables, rows, blocks, links, has_bias, silu, out2, out2_offset, out2_row_stride,
           split, spec_slot0, win, win_offset, win_stride_row, win_stride_step,
           win_stride_c, win_stride_col{extra_args}{record_args}{stage_args}"""


# The state window and the state update; in its own template because a backend with
# ``unit_stride_reads`` emits it twice (see kernel_source).
_STATE_PART = """{state_offsets}
    sc = state_stride_col
    # u = concat(window, x_seq); u0..u{S1} hold u[p0 .. p0+S-1] as raw values.
{load_window}
{ring_window}{short_init}    if p0 == 0:
        # Sole reader of this line's old window (per channel): write the new state.
        # New state = u[q0:] from column 0: spec keeps all but the oldest column
        # (S-1+n values), non-spec the last S. Columns from S - q0 on are rows of x
        # (positions q - S), read {K} at a time before they are stored.
{write_base}        q0 = n
        if flags & FLAG_SPEC:
            q0 = 1
        q = max(q0, {S})
{ring_skip}{short_flag}        first = True
        while first or q < {S} + n:
{state_chunk_loads}
            if first:
{store_window}
                first = False
{state_chunk_stores}
            q += {K}
{checkpoints}{ring_writes}"""


# The state update of a kernel for short sequences only (``short_tokens``): one block
# holds the whole sequence (p0 == 0), so the window is the cache line's, and one round of
# loads reads all its tokens (positions 0..n-1, the first round of _STATE_PART, q = S).
_SHORT_STATE_PART = """{state_offsets}
    sc = state_stride_col
    # The cache line's window (zeros without initial state): u0..u{S1}.
{load_window}
    # New state = concat(window, x_seq)[q0:] from column 0 (spec: q0 = 1, else n):
    # window columns from q0 on, then the tokens (loaded first: the stores may alias x
    # for the compiler).
    q0 = n
    if flags & FLAG_SPEC:
        q0 = 1
{token_loads}
{store_window}
{token_stores}
"""


def kernel_source(width, name, backend, channels=1, lookahead=1, word_taps=False,
                  state_chunk=None, short_tokens=0, row_group=1, early_weights=False,
                  group_state=False, vector_taps=False, uniform_decode=False,
                  record_args=None, shared_record=False, constants=(), chains=True,
                  stage=False):
    """The Python source of the conv kernel for one width, backend, channel count and
    lookahead (tokens whose loads are issued before the first of their stores).
    ``word_taps`` (width 4, 16-bit storage, a backend with ``unit_stride_reads`` that
    supplies ``load_taps16`` / ``taps16_aligned`` / ``tap16``): the 64-bit taps path.
    ``state_chunk``: see the module docstring. ``short_tokens`` T > 0: a kernel for
    launches whose sequences all hold at most T tokens (T <= ``state_chunk``; non-spec
    ones also at most width - 1; pads of any length), such as decode (T = 1) and
    spec-verify steps: the state update in one round and the tokens from its registers,
    without the general paths (fewer instructions and registers per work-item); the
    host picks it per launch, and other launches would be wrong with it. ``row_group``
    G (1, 2 or 4, dividing ``channels``; a backend that supplies ``load_row{G}`` /
    ``store_row{G}``, and ``aligned_row{G}`` with ``unit_stride_reads``): rows of x and
    out (and with ``unit_stride_reads`` of the conv state) accessed G channels at a time
    (see the module docstring); the host picks it per launch, only where those accesses
    are aligned. ``early_weights``, ``vector_taps`` (width 4 only; a backend that
    supplies ``load_taps4``) and ``group_state`` (with G > 1): see the module docstring;
    the host picks the last two only where the weight's or the state's layout and
    alignment allow them. ``uniform_decode`` (with T = 1): every sequence with a cache
    line holds one token and its window starts at column 0 (see the module docstring);
    the host picks it only for steps that are so.

    ``record_args`` (the fused kernel of a device plan): the block record computed by
    ``slot_record(b, *record_args)`` (``kernels.planner``, a device function the backend
    supplies) instead of read from the tables, those arguments appended to the
    parameters: what a device plan launches instead of its planner and the plain kernel
    (``tables`` is then never read: every record says rows are consecutive, but it must
    be valid memory). ``shared_record`` (with ``record_args``, a backend with
    ``shared_array``): the record computed once per thread block, by its first
    work-item, and read by the others after a barrier. ``constants``: ((parameter,
    value, keep), ...): each parameter bound to its int value at the body's top, in
    that order, and dropped from the parameters (``keep``: kept, renamed with a leading
    underscore, unused); the parameters are then written on one line. ``chains``: the
    chain piece (parent maps and intermediate windows, FLAG_CHAIN blocks) in the general
    token loops; a backend that leaves it out launches such a kernel only for steps
    without chains (the parameters stay, unused).

    ``stage`` (a backend with ``lane_sum`` or ``group_barrier``; host plans' split
    outputs, ``split`` 1): the GDN conv stage (SEMANTICS.md) in the same launch:
    ``abi.STAGE_ARGS`` appended to the parameters; outputs to the parts' q | k | v
    buffers in head layout (``stage_offsets``); q and k heads l2-normalised per token
    (``store_outputs`` with ``lane_sum``, else ``norm_pass``); g and beta per v head and
    token (``gates``). The backend launches the head_k_dim / ``channels`` work-items of
    one head and token block together (one ``lane_sum`` group, or one work-group). With
    ``record_args`` too (a device plan without token maps): the gates' rows are then
    consecutive like every other access's, so the rows table is never read.
    """
    if uniform_decode and short_tokens != 1:
        raise ValueError(f"uniform_decode needs short_tokens 1, got {short_tokens}")
    if row_group not in (1, 2, 4) or channels % row_group:
        raise ValueError(f"row_group must be 1, 2 or 4 and divide the channel count "
                         f"{channels}, got {row_group}")
    if vector_taps and width != 4:
        raise ValueError(f"vector_taps needs width 4, got {width}")
    if shared_record and (record_args is None or backend.shared_array is None):
        raise ValueError("shared_record needs record_args and a backend with shared_array")
    if chains and short_tokens:
        chains = False  # a short kernel has no token loops; never launched for chains
    if stage and (backend.lane_sum or backend.group_barrier) is None:
        raise ValueError("stage needs a backend with lane_sum or group_barrier")
    return _Kernel(width, backend, channels, lookahead, word_taps, state_chunk, short_tokens,
                   row_group, early_weights, group_state, vector_taps, uniform_decode,
                   record_args, shared_record, chains, stage).source(name, constants)


IND = " " * 4  # one level of indentation in the generated source


def _indent(lines, depth):
    return [IND * depth + line for line in lines]


def _deeper(text):
    return "\n".join(IND + line if line else line for line in text.splitlines())


def _branch(depth, condition, special, general):
    """``if condition: special else: general`` at ``depth``; ``general`` was written one
    level shallower (as the only path)."""
    at = IND * depth
    return f"{at}if {condition}:\n{special}\n{at}else:\n{_deeper(general)}"


class _Kernel:
    """The pieces of one kernel's source, each a method named after what it computes;
    ``source`` puts them into _TEMPLATE. Names in the generated code: per channel J (a
    suffix _0.._{C-1} when C > 1) the window u0.. (raw values) and f0.. (float32), the
    taps w0.., the accumulator acc; per token the input row r / ra{m} / rq{k}."""

    def __init__(self, width, backend, channels, lookahead, word_taps, state_chunk,
                 short_tokens, row_group, early_weights, group_state, vector_taps,
                 uniform_decode, record_args, shared_record, chains=True, stage=False):
        self.width, self.backend, self.channels, self.lookahead = (width, backend, channels,
                                                                   lookahead)
        self.word_taps, self.short_tokens, self.early_weights = (word_taps, short_tokens,
                                                                 early_weights)
        self.vector_taps, self.uniform_decode = vector_taps, uniform_decode
        self.record_args, self.shared_record = record_args, shared_record
        self.chains, self.stage = chains, stage
        # where the state part stores the new state: the rule kernels' lines piece may
        # move it to another line (lines_write_base)
        self.write_base = "sw" if chains else "st"
        self.G = row_group
        self.S = width - 1  # window columns
        self.K = state_chunk or self.S  # new-state values loaded per round
        self.suffixes = [""] if channels == 1 else [f"_{j}" for j in range(channels)]
        self.chans = ["c"] + [f"(c + {j})" for j in range(1, channels)]
        # channels per row access
        self.groups = [self.suffixes[j:j + row_group] for j in range(0, channels, row_group)]
        # The wide kernel of a backend with unit_stride_reads: G channels per access for
        # the state too; the host picks it only for a state with contiguous, aligned
        # channels.
        self.wide = row_group > 1 and (backend.unit_stride_reads or group_state)

    # ------------------------------------------------------------ per-channel text

    def each(self, fmt, depth=1, **values):
        """``fmt`` once per channel, indented by ``depth``; a multi-line ``fmt`` keeps its
        statements together per channel."""
        return "\n".join(IND * depth + line for J, CH in zip(self.suffixes, self.chans)
                         for line in fmt.format(J=J, CH=CH, **values).splitlines())

    def per_tap(self, fmt, count, depth=1):
        return "\n".join(self.each(fmt, depth, k=k) for k in range(count))

    # ------------------------------------------------------------ rows of x and out

    def x_row(self, dest, row, convert=False):
        """Lines loading row ``row`` of x for every channel into ``dest`` (a name with
        {J}), as raw values, or as float32 with ``convert``; with ``row_group`` G > 1,
        one ``load_row{G}`` per G channels (raw values first in r_``dest``)."""
        G = self.G
        if G == 1:
            read = "load(x[U(xc{J} + {row} * x_row_stride)])" if convert else \
                "x[U(xc{J} + {row} * x_row_stride)]"
            return [f"{dest.format(J=J)} = {read.format(J=J, row=row)}" for J in self.suffixes]
        raw = "r_" + dest if convert else dest
        lines = [", ".join(raw.format(J=J) for J in part)
                 + f" = load_row{G}(x, U(xc{part[0]} + {row} * x_row_stride))"
                 for part in self.groups]
        if convert:
            lines += [f"{dest.format(J=J)} = load({raw.format(J=J)})" for J in self.suffixes]
        return lines

    def out_row(self, value, row, i):
        """Lines storing ``value`` (an expression with {J}) of every channel for the
        block's token ``i``, whose row of x is ``row``: to that row of out, or with split
        outputs to row ob + i of the part's array (``o``, ``ors``: see _TEMPLATE); with
        ``row_group`` G > 1, one ``store_row{G}`` per G channels."""
        G, at = self.G, f"({row} if ob < 0 else ob + {i}) * ors"
        if G == 1:
            return [f"o[U(oc{J} + {at})] = {value.format(J=J)}" for J in self.suffixes]
        return [f"store_row{G}(o, U(oc{part[0]} + {at}), "
                + ", ".join(value.format(J=J) for J in part) + ")" for part in self.groups]

    # ------------------------------------------------------------ the tokens

    def token(self, xv, row, i):
        """One token of the sliding window, its input loaded into ``xv`` (per channel):
        the taps, the shift, silu (the divisions grouped), the store of token ``i`` of
        the block (row ``row`` of x: ``out_row``).
        ``fdiv`` is the backend's plain division (the divisor is >= 1 or NaN, never 0:
        no zero-divisor check, which numba-dpex's default error model would add and
        which broke vectorization on the OpenCL CPU device); ``exp`` is math.exp or the
        device's approximate one (``math="fast"``)."""
        S, lines = self.S, []
        for J in self.suffixes:
            x_J = xv.format(J=J)
            taps = " + ".join([f"w{k}{J} * f{k}{J}" for k in range(S)] + [f"w{S}{J} * {x_J}"])
            lines.append(f"acc{J} = bias_c{J} + {taps}")
        for J in self.suffixes:
            lines += [f"f{k}{J} = f{k + 1}{J}" for k in range(S - 1)] + [f"f{S - 1}{J} = {xv.format(J=J)}"]
        lines.append("if silu:")
        lines += [f"    acc{J} = fdiv(acc{J}, ONE + exp(-acc{J}))" for J in self.suffixes]
        return lines + self.store_outputs(row, i)

    def store_outputs(self, row, i):
        """The store of a token's outputs acc{J} (``out_row``); with the stage, q and k
        heads are first divided by their norm where the block's rows are normalised (a
        block is one sequence's, so the part's first normalised row, which begins a
        sequence, starts a block): the lanes' sums of squares added by the backend's
        ``lane_sum`` (every lane of a head takes the same branch: the head's lanes are one
        block's, and ``qk2`` is a multiple of the head's channels)."""
        if not self.stage or self.backend.lane_sum is None:  # (norm_pass normalises)
            return self.out_row("store(acc{J})", row, i)
        squares = " + ".join(f"acc{J} * acc{J}" for J in self.suffixes)
        lines = ["if c < qk2 and ob >= lfrom:",
                 IND + f"ss = {self.backend.lane_sum}({squares})",
                 IND + "ss = fdiv(ONE, sqrt(ss + L2NORM_EPS))"]
        lines += [IND + f"acc{J} = acc{J} * ss" for J in self.suffixes]
        return lines + self.out_row("store(acc{J})", row, i)

    def token_loops(self, row_of):
        """The block's tokens: groups of L = ``lookahead`` (all loads, then the tokens),
        one group of L / 2 when that many are left (L >= 4: a spec sequence of 1 + 3
        tokens is then one round of loads, 1.05-1.1x on spec-only launches on the H200),
        then one at a time. ``row_of(i)``: the expression of token i's row."""
        L = self.lookahead
        single = [f"r = {row_of('i')}"] + self.x_row("xf{J}", "r", True) + \
            self.token("xf{J}", "r", "i")
        if L == 1:
            lines = ["for i in range(nb):"] + _indent(single, 1)
        else:
            def group(size):
                lines = [f"ra{m} = {row_of(f'i + {m}')}" for m in range(size)]
                for m in range(size):
                    lines += self.x_row(f"xg{m}{{J}}", f"ra{m}", True)
                for m in range(size):
                    lines += self.token(f"xg{m}{{J}}", f"ra{m}", f"i + {m}")
                return _indent(lines, 1) + [IND + f"i += {size}"]
            lines = ["i = 0", f"while i + {L} <= nb:"] + group(L)
            if L >= 4:  # one group of L / 2 (a spec sequence of 1 + 3 tokens)
                lines += [f"if i + {L // 2} <= nb:"] + group(L // 2)
            lines += ["for i in range(i, nb):"] + _indent(single, 1)
        return "\n".join(_indent(lines, 2))

    def tokens_from_registers(self, depth, count):
        """The block's ``count`` tokens at most from the state update's first round (v0..
        at rows rq0..)."""
        lines = []
        for k in range(count):
            body = ([f"xs{k}{J} = load(v{k}{J})" for J in self.suffixes]
                    + self.token(f"xs{k}{{J}}", f"rq{k}", str(k)))
            lines.append(IND * k + f"if nb > {k}:")  # nb = 0: the state rule only
            lines += _indent(body, k + 1)
        return "\n".join(_indent(lines, depth))

    def general_tokens(self):
        """The token loops (rows computed when consecutive, else looked up)."""
        return (IND + "if flags & FLAG_BLOCK_ROWS:\n"
                + self.token_loops(lambda i: f"r0 + {i}") + "\n" + IND + "else:\n"
                + self.token_loops(lambda i: f"tables[U(rows + t0 + {i})]"))

    def chain_tokens(self):
        """The tokens of a FLAG_CHAIN block (SEMANTICS.md "More state rules"): token t's
        inputs a0 (itself), a1 (its parent, or the token before it), ... aS, each a row
        of x or, past the sequence's first token, the window register u{S + k} (only the
        first block gets there: a later block's chain stays S positions deep in x; a
        sequence with a parent map is one block). Then its output, and with a windows row
        its S newest inputs to the windows. The raw values are stored, so windows are
        bit-exact copies. The state rule is the state part's: the chain only changes
        which inputs a token's output and window take."""
        S, lines = self.S, []
        NL = len(LINK_FIELDS)
        lines += [f"wrow = tables[U(links + {self.record_at()} + "
                  f"{SEQUENCE_FIELDS.index('window_row')})]",
                  "for i in range(nb):",
                  IND + "t = p0 + i",
                  IND + "r = r0 + i",
                  IND + "if not flags & FLAG_BLOCK_ROWS:",
                  IND * 2 + "r = tables[U(rows + t0 + i)]"]
        body = self.x_row("a0{J}", "r") + ["k = t"]
        for j in range(1, S + 1):
            body += ["if k > 0 and flags & FLAG_TREE:",
                     IND + f"k = tables[U(links + {NL} * (first_slot + k))]",
                     "else:",
                     IND + "k -= 1",
                     "if k >= 0:",
                     IND + "rk = base + k",
                     IND + "if base < 0:",
                     IND * 2 + "rk = tables[U(rows + first_slot + k)]"]
            body += _indent(self.x_row(f"a{j}{{J}}", "rk"), 1)
            for m in range(S - 1, -1, -1):  # k = m - S: window register u{m}
                test = "else:" if m == 0 else f"elif k == {m - S}:"
                body += [test] + _indent([f"a{j}{J} = u{m}{J}" for J in self.suffixes], 1)
        for J in self.suffixes:
            # in the sliding loop's order (oldest input first): the same sums, bit for bit
            taps = " + ".join(f"w{k}{J} * load(a{S - k}{J})" for k in range(S + 1))
            body.append(f"acc{J} = bias_c{J} + {taps}")
        body.append("if silu:")
        body += [f"    acc{J} = fdiv(acc{J}, ONE + exp(-acc{J}))" for J in self.suffixes]
        body += self.store_outputs("r", "i")
        body += ["if wrow >= 0:",
                 IND + "wt = win_offset + wrow * win_stride_row + t * win_stride_step"]
        body += _indent([f"win[U(wt + {CH} * win_stride_c + {S - 1 - j} * win_stride_col)] "
                         f"= a{j}{J}" for j in range(S)
                         for J, CH in zip(self.suffixes, self.chans)], 1)
        return "\n".join(_indent(lines + _indent(body, 1), 2))

    def tokens(self):
        if self.short_tokens:  # no token loops; the host never picks it for chains
            return (IND + "# Every token was loaded by the state update (v0..).\n"
                    + self.tokens_from_registers(1, self.short_tokens))
        if self.backend.reuse_state_loads:
            rest = (IND + "if short:\n" + IND * 2 + "# The state update's first round "
                    "loaded every token of the block (v0..): no reload after its stores.\n"
                    + self.tokens_from_registers(2, self.K) + "\n" + IND + "el"
                    + self.general_tokens().lstrip())
        else:
            rest = self.general_tokens()
        if not self.chains:
            return rest
        return (IND + "if flags & FLAG_CHAIN:\n" + self.chain_tokens() + "\n" + IND
                + "else:\n" + _deeper(rest))

    # ------------------------------------------------------------ the conv state

    def state_column(self, unit, column, value, base=None):
        """Lines storing ``value`` (with {J}) of every channel to state column ``column``
        of the line at ``base`` (per channel, default: where the new state goes); with
        ``unit`` and a row group G > 1 (the state's channels contiguous and aligned to
        G: the host checks), one ``store_row{G}`` per G channels."""
        base = base or self.write_base
        if unit and self.wide:
            return [f"store_row{self.G}(state, U({base}{part[0]} + ({column}) * sc), "
                    + ", ".join(value.format(J=J) for J in part) + ")"
                    for part in self.groups]
        return [f"state[U({base}{J} + ({column}) * sc)] = {value.format(J=J)}"
                for J in self.suffixes]

    @staticmethod
    def record_at():
        """The expression of the offset in "links" of the block's sequence record."""
        return f"tables[U(links + {len(LINK_FIELDS)} * first_slot + " \
            f"{LINK_FIELDS.index('sequence')})]"

    @staticmethod
    def sequence_field(name):
        """The expression of a field of the sequence record at ``lk`` (links + offset)."""
        return f"tables[U(lk + {SEQUENCE_FIELDS.index(name)})]"

    def lines_write_base(self):
        """The lines piece's start (rule kernels): the new state's line, the sequence's
        write line for a FLAG_LINES block, else the line read (``st``); a ring's state
        is written by the ring piece (``ring_writes``), none here."""
        if not self.chains:
            return ""
        lines = [f"sw{J} = st{J}" for J in self.suffixes]
        lines += ["if flags & FLAG_LINES:",
                  IND + "# Another line than the one read (its window is in u0..).",
                  IND + f"wd = ({self.sequence_field('write_line')} - line) * "
                        "state_stride_line"]
        lines += [IND + f"sw{J} = st{J} + wd" for J in self.suffixes]
        return "\n".join(_indent(lines, 2)) + "\n"

    def ring_skip(self):
        """A ring's first block writes no linear state (``ring_writes`` does): no window
        column and no token in the state update's loop."""
        if not self.chains:
            return ""
        return "\n".join(_indent(["if flags & FLAG_RING:",
                                   IND + f"q0 = {self.S}  # (every window column < S)",
                                   IND + f"q = {self.S} + n"], 2)) + "\n"

    def ring_window(self, unit):
        """The ring piece's window (rule kernels): a FLAG_RING sequence's first block reads
        columns (pos - S + k) mod len of its line into u0.. (zeros without initial
        state); the loads before have read columns 0.. (any valid columns)."""
        if not self.chains:
            return ""
        lines = ["lk = -1", "rp = 0", "rl = 1",
                 "if flags & (FLAG_LINES | FLAG_RING):",
                 IND + f"lk = links + {self.record_at()}",
                 "if flags & FLAG_RING and p0 == 0:",
                 IND + f"rp = {self.sequence_field('ring_pos')}",
                 IND + f"rl = {self.sequence_field('ring_len')}"]
        window = self.cache_window(unit, f"(rp + rl - {self.S} + {{k}}) % rl")
        lines += _indent(window, 1)
        return "\n".join(_indent(lines, 1)) + "\n"

    def ring_writes(self, unit):
        """The ring piece's state rule: token k of the sequence to column (pos + k) mod
        len, in token order, only the last len tokens (earlier ones would be
        overwritten)."""
        if not self.chains:
            return ""
        lines = ["if flags & FLAG_RING:",
                 IND + "for k in range(max(0, n - rl), n):",
                 IND * 2 + "rk = base + k",
                 IND * 2 + "if base < 0:",
                 IND * 3 + "rk = tables[U(rows + first_slot + k)]"]
        lines += _indent(self.x_row("kv0{J}", "rk"), 2)
        lines += _indent(self.state_column(unit, "(rp + k) % rl", "kv0{J}", base="st"), 2)
        return "\n".join(_indent(lines, 2)) + "\n"

    def checkpoints(self, unit):
        """The lines piece's checkpoints (rule kernels, SEMANTICS.md): the first block
        writes each (position p, line) of its sequence's list: columns 0..S-1 of the line
        get u[p .. p + S - 1] (positions p - S .. p - 1: rows of x, or the window
        registers). After the state stores, so a checkpoint on the line read is written
        after its window was read."""
        if not self.chains:
            return ""
        S, at = self.S, len(SEQUENCE_FIELDS)
        lines = ["if flags & FLAG_LINES:",
                 IND + f"for j in range({self.sequence_field('checkpoints')}):",
                 IND * 2 + f"cp = tables[U(lk + {at} + 2 * j)]",
                 IND * 2 + f"cd = (tables[U(lk + {at + 1} + 2 * j)] - line) * "
                           "state_stride_line"]
        body = [f"sk{J} = st{J} + cd" for J in self.suffixes]
        for k in range(S):
            body += [f"pk = cp + {k}", f"if pk >= {S}:",
                     IND + f"rk = base + pk - {S}",
                     IND + "if base < 0:",
                     IND * 2 + f"rk = tables[U(rows + first_slot + pk - {S})]"]
            body += _indent(self.x_row(f"kv{k}{{J}}", "rk"), 1)
            for m in range(S - 1, -1, -1):
                body += ["else:" if m == 0 else f"elif pk == {m}:"]
                body += _indent([f"kv{k}{J} = u{m}{J}" for J in self.suffixes], 1)
        for k in range(S):
            body += self.state_column(unit, str(k), f"kv{k}{{J}}", base="sk")
        return "\n".join(_indent(lines + _indent(body, 2), 2)) + "\n"

    def state_offsets(self, unit):
        stride_c = "" if unit else " * state_stride_c"
        return self.each("st{J} = state_offset + line * state_stride_line + {CH}"
                         + stride_c + "  # line, channel")

    def cache_window(self, unit, column="off + {k}"):
        """The cache line's window into u0.. (zeros without initial state), as lines;
        ``column``: the expression of window column k's column in the line."""
        S, read = self.S, "element" if unit else "strided"
        lines = [f"u{k}{J} = ZERO" for k in range(S) for J in self.suffixes]
        lines += ["if initial:"]
        if unit and self.wide:  # see state_column
            lines += [IND + ", ".join(f"u{k}{J}" for J in part)
                      + f" = load_row{self.G}(state, U(st{part[0]} + "
                      f"({column.format(k=k)}) * sc))"
                      for k in range(S) for part in self.groups]
        else:
            lines += [IND + f"u{k}{J} = {read}(state, U(st{J} + ({column.format(k=k)}) * sc))"
                      for k in range(S) for J in self.suffixes]
        return lines

    def window_by_position(self, unit):
        """The window by one uniform branch on p0 (``Backend.split_window``): the cache
        line's for a sequence's first block, else the S rows of x before the block."""
        S = self.S
        lines = ["if p0 == 0:",
                 IND + "# The cache line's window (zeros without initial state)."]
        lines += _indent(self.cache_window(unit), 1)
        lines += ["else:",
                  IND + f"# p0 >= B >= {S}: the window is the {S} rows of x before the block."]
        for k in range(S):
            lines += [IND + f"rw{k} = base + p0 - {S - k}", IND + "if base < 0:",
                      IND * 2 + f"rw{k} = tables[U(rows + t0 - {S - k})]"]
        for k in range(S):
            lines += _indent(self.x_row(f"u{k}{{J}}", f"rw{k}"), 1)
        return "\n".join(_indent(lines, 1))

    def window_by_element(self, unit):
        """The window one element at a time through ``_window_value`` (x or the cache
        line, by each position's sign)."""
        return self.per_tap(
            f"u{{k}}{{J}} = _window_value(x, xc{{J}}, x_row_stride, state, "
            f"st{{J}} + (off + p0 + {{k}}) * sc, tables, rows, first_slot, base, "
            f"p0 - {self.S} + {{k}}, initial, ZERO, {'element' if unit else 'strided'})",
            self.S)

    def store_window(self, depth, unit):
        """Window columns from q0 on, to the state's columns from 0."""
        return "\n".join(IND * depth + f"if q0 <= {k}:\n" + "\n".join(
            IND * (depth + 1) + line
            for line in self.state_column(unit, f"{k} - q0", f"u{k}{{J}}"))
            for k in range(self.S))

    def new_state_loads(self):
        """One round of the state update's loads: K new-state values (rows of x) v0..
        from position q on."""
        S, lines = self.S, []
        for k in range(self.K):
            lines += _indent([f"v{k}{J} = ZERO" for J in self.suffixes], 3)
            rq = f"rq{k}" if self.backend.reuse_state_loads else "rq"
            lines += _indent([f"if q + {k} < {S} + n:", IND + f"{rq} = base + q + {k - S}",
                              IND + "if base < 0:",
                              IND * 2 + f"{rq} = tables[U(rows + first_slot + q + {k - S})]"], 3)
            lines += _indent(self.x_row(f"v{k}{{J}}", rq), 4)
        return lines

    def new_state_stores(self, unit):
        lines = []
        for k in range(self.K):
            lines += [IND * 3 + f"if q + {k} < {self.S} + n:"]
            lines += _indent(self.state_column(unit, f"q + {k} - q0", f"v{k}{{J}}"), 4)
        return lines

    def short_state_part(self, unit):
        """``_SHORT_STATE_PART``: token k (k < n <= T) loaded into v{k} from row rq{k}."""
        S, T = self.S, self.short_tokens
        loads = [f"rq{k} = 0" for k in range(T)] + [f"v{k}{J} = ZERO" for k in range(T)
                                                     for J in self.suffixes]
        for k in range(T):  # nested: token k exists only if token k - 1 does
            at = IND * (k + 1)
            loads += [IND * k + f"if n > {k}:", at + f"rq{k} = base + {k}",
                      at + "if base < 0:", at + IND + f"rq{k} = tables[U(rows + first_slot + {k})]"]
            loads += [at + line for line in self.x_row(f"v{k}{{J}}", f"rq{k}")]
        stores = []
        for k in range(T):
            stores += [IND * k + f"if n > {k}:"]
            stores += _indent(self.state_column(unit, f"{S + k} - q0", f"v{k}{{J}}"), k + 1)
        return _SHORT_STATE_PART.format(
            S1=S - 1, state_offsets=self.state_offsets(unit),
            load_window="\n".join(_indent(self.cache_window(unit), 1)),
            token_loads="\n".join(_indent(loads, 1)),
            store_window=self.store_window(1, unit),
            token_stores="\n".join(_indent(stores, 1)))

    def state_part(self, unit):
        """The state window and update; ``unit``: the channel's state stride is 1 (read
        as a plain element, the channel's offset without a multiply)."""
        if self.short_tokens:
            return self.short_state_part(unit)
        S, K, reuse = self.S, self.K, self.backend.reuse_state_loads
        # short: the block's tokens are v0.. at rows rq0.. (defined on every path)
        short_init = "\n".join([IND + "short = False"] + [IND + f"rq{k} = 0" for k in range(K)]
                               + [self.each(f"v{k}{{J}} = ZERO") for k in range(K)]) + "\n"
        by_position = self.backend.split_window or self.wide
        return _STATE_PART.format(
            short_init=short_init if reuse else "",
            short_flag=IND * 2 + f"short = n <= {K} and q == {S}\n" if reuse else "",
            S=S, S1=S - 1, K=K,
            state_offsets=self.state_offsets(unit),
            load_window=(self.window_by_position(unit) if by_position
                         else self.window_by_element(unit)),
            state_chunk_loads="\n".join(self.new_state_loads()),
            store_window=self.store_window(4, unit),
            state_chunk_stores="\n".join(self.new_state_stores(unit)),
            write_base=self.lines_write_base(), checkpoints=self.checkpoints(unit),
            ring_window=self.ring_window(unit), ring_skip=self.ring_skip(),
            ring_writes=self.ring_writes(unit))

    def state(self):
        if self.wide:
            return self.state_part(True)
        if self.backend.unit_stride_reads:
            return _branch(1, "state_stride_c == 1", _deeper(self.state_part(True)),
                           self.state_part(False))
        return self.state_part(False)

    # ------------------------------------------------------------ weights, bias, record

    def weights_and_bias(self):
        each, per_tap, width, G = self.each, self.per_tap, self.width, self.G
        weights = per_tap("w{k}{J} = load(strided(weight, U(weight_offset + {CH} * "
                          "weight_stride_c + {k} * weight_stride_k)))", width)
        if self.vector_taps:
            weights = (each("wr0{J}, wr1{J}, wr2{J}, wr3{J} = load_taps4(weight, "
                            "U(weight_offset + {CH} * 4))")
                       + "\n" + per_tap("w{k}{J} = load(wr{k}{J})", width))
        bias = each("bias_c{J} = load(strided(bias, U(bias_offset + {CH} * bias_stride)))", 2)
        if self.backend.unit_stride_reads:
            # Uniform branches on the strides (kernel arguments): where the channel is the
            # unit-stride index, neighbouring work-items read neighbouring elements, which
            # a compiler vectorizing across work-items turns into one vector load instead
            # of a gather (vLLM's conv state and every contiguous bias are laid out so).
            if self.word_taps:
                # vLLM's (dim, width) weight: a channel's 4 taps of 16 bits are one
                # aligned 64-bit word (one 64-bit gather instead of four 32-bit ones).
                weights = _branch(
                    1, "weight_stride_k == 1 and weight_stride_c == 4 and "
                       "taps16_aligned(weight, U(weight_offset))",
                    each("wq{J} = load_taps16(weight, U(weight_offset + {CH} * 4))", 2)
                    + "\n" + per_tap("w{k}{J} = load(tap16(wq{J}, {k}))", width, 2), weights)
            unit_bias = each("bias_c{J} = load(element(bias, U(bias_offset + {CH})))", 3)
            if self.wide:  # G channels per read where the bias' first element is aligned
                grouped = [IND * 4 + ", ".join(f"rb{J}" for J in part)
                           + f" = load_row{G}(bias, U(bias_offset + c + {j * G}))"
                           for j, part in enumerate(self.groups)]
                unit_bias = _branch(3, f"aligned_row{G}(bias, U(bias_offset))",
                                    "\n".join(grouped) + "\n"
                                    + each("bias_c{J} = load(rb{J})", 4), unit_bias)
            bias = _branch(2, "bias_stride == 1", unit_bias, bias)
        return (weights + "\n" + each("bias_c{J} = F32_ZERO") + "\n"
                + IND + "if has_bias:\n" + bias)

    def block_fields(self):
        """The record's fields that the state part and the tokens need (the first ones,
        read before the pad check, are in _TEMPLATE)."""
        fields = ["p0 = 0  # one block per sequence" if self.short_tokens else
                  f"p0 = {self.field('pos')}  # position of the block's first token in its "
                  "sequence"]
        if self.uniform_decode:
            fields += ["# Every sequence with a cache line holds one token and its window "
                       "starts",
                       "# at column 0 (the host checked the step): constants, so the "
                       "window's",
                       "# loads, the x load and the state stores wait for no field of the "
                       "record.",
                       "n = 1", "off = 0"]
        else:
            fields += [f"n = {self.field('seq_len')}", f"off = {self.field('off')}"]
        return "\n".join(_indent(fields, 1))

    # ------------------------------------------------------------ the GDN stage

    def stage_offsets(self):
        """The stage's outputs (``abi.STAGE_ARGS``): in the block's part's buffer, the
        work-item's channels are in the q, k or v rows (all its channels in one: C
        divides head_k_dim and head_v), at row stride qk or vdim; ``tp``: the part's
        rows, ``go``: its gates' offset, ``lfrom``: its first row whose q and k are
        normalised (it begins a sequence: blocks wholly before or from it)."""
        if not self.stage:
            return ""
        lines = ["# The GDN stage: q rows, then k rows, then v rows of the part's buffer.",
                 "qk2 = 2 * qk", "sb = out_offset", "tp = part_rows", "go = gates_offset",
                 "lfrom = l2norm_from", "if flags & FLAG_SPEC:",
                 IND + "sb = out2_offset", IND + "tp = part2_rows",
                 IND + "go = gates2_offset", IND + "lfrom = l2norm2_from",
                 "ors = qk", "if c < qk:"]
        lines += [IND + f"oc{J} = sb + {CH}" for J, CH in zip(self.suffixes, self.chans)]
        lines += ["elif c < qk2:"]
        lines += [IND + f"oc{J} = sb + tp * qk + {CH} - qk"
                  for J, CH in zip(self.suffixes, self.chans)]
        lines += ["else:", IND + "ors = vdim"]
        lines += [IND + f"oc{J} = sb + tp * qk2 + {CH} - qk2"
                  for J, CH in zip(self.suffixes, self.chans)]
        return "\n".join(_indent(lines, 1)) + "\n"

    def norm_pass(self):
        """The stage's l2norm on a backend with ``group_barrier``: after the barrier (the
        head's raw outputs of the block are stored), each of the block's tokens is
        normalised by one work-item of the head (token i by its work-item i mod
        head_k / C), which reads the token's head row (as stored, in the output's dtype),
        then scales it in place."""
        if not self.stage or self.backend.lane_sum is not None:
            return ""
        C, oc = self.channels, "oc" + self.suffixes[0]
        lines = ["if c < qk2 and ob >= lfrom:  # the same for the whole work-group",
                 IND + self.backend.group_barrier,
                 IND + "hc = ((c * head_k_magic) >> head_k_shift) * head_k  # its head's "
                       "first channel",
                 IND + f"ho = {oc} - (c - hc)  # its offset in the part's rows",
                 IND + f"for i in range((c - hc) // {C}, nb, head_k // {C}):",
                 IND * 2 + "at = ho + (ob + i) * ors",
                 IND * 2 + "ss = F32_ZERO",
                 IND * 2 + "for j in range(head_k):",
                 IND * 3 + "yv = load(o[U(at + j)])",
                 IND * 3 + "ss += yv * yv",
                 IND * 2 + "ss = fdiv(ONE, sqrt(ss + L2NORM_EPS))",
                 IND * 2 + "for j in range(head_k):",
                 IND * 3 + "o[U(at + j)] = store(load(o[U(at + j)]) * ss)"]
        return "\n".join(_indent(lines, 1)) + "\n"

    def gates(self, depth):
        """The stage's gates of the block's tokens: g = -exp(A_log) * softplus(a +
        dt_bias) (or exp(g)) and beta = sigmoid(b), float32, to the part's g and beta
        rows. The work-items of a v head share its tokens (token i by the head's
        work-item i mod head_v / C): none loops over a whole block while the others
        wait. ``gexp`` is exact (not silu's ``exp``, which may be the device's
        approximate one)."""
        if not self.stage:
            return ""
        C = self.channels
        lines = ["if c >= qk2:",
                 IND + "hv = ((c - qk2) * head_v_magic) >> head_v_shift  # (c - qk2) // head_v",
                 IND + "nhv = v_heads",
                 IND + "ea = -gexp(alog[U(alog_offset + hv)])",
                 IND + "db = dtb[U(dtb_offset + hv)]",
                 IND + f"for i in range((c - qk2 - hv * head_v) // {C}, nb, head_v // {C}):",
                 IND * 2 + "r = r0 + i",
                 IND * 2 + "if not flags & FLAG_BLOCK_ROWS:",
                 IND * 3 + "r = tables[U(rows + t0 + i)]",
                 IND * 2 + "za = load(ga[U(ga_offset + r * ga_row_stride + hv)]) + db",
                 IND * 2 + "if za <= SOFTPLUS_THRESHOLD:",
                 IND * 3 + "za = log1p(gexp(za))",
                 IND * 2 + "gv = ea * za",
                 IND * 2 + "if exp_g:",
                 IND * 3 + "gv = gexp(gv)",
                 IND * 2 + "zb = load(gb[U(gb_offset + r * gb_row_stride + hv)])",
                 IND * 2 + "gs = go + (ob + i) * nhv + hv",
                 IND * 2 + "gates[U(gs)] = gv",
                 IND * 2 + "gates[U(gs + tp * nhv)] = fdiv(ONE, ONE + gexp(-zb))"]
        return "\n".join(_indent(lines, depth)) + "\n"

    # ------------------------------------------------------------ the whole kernel

    def field(self, name):
        """The expression of one field of the block's record (``abi.BLOCK_FIELDS``): a
        read of the tables, or with ``record_args`` the variable ``slot_record`` set."""
        k = BLOCK_FIELDS.index(name)
        if self.record_args is not None:
            return f"rec{k}"
        return "tables[U(blk)]" if k == 0 else f"tables[U(blk + {k})]"

    def record(self):
        """Where the block's record comes from: its offset in the tables, or computed by
        ``slot_record`` (by one work-item of a thread block with ``shared_record``)."""
        if self.record_args is None:
            return f"{IND}blk = blocks + b * {len(BLOCK_FIELDS)}"
        names = [f"rec{k}" for k in range(len(BLOCK_FIELDS))]
        call = f"slot_record(b, {', '.join(self.record_args)})"
        if not self.shared_record:
            return f"{IND}{', '.join(names)} = {call}"
        b = self.backend
        lines = [f"shared_record = {b.shared_array.format(n=len(names))}",
                 f"if {b.first_in_group}:",
                 f"{IND}{', '.join('q' + n for n in names)} = {call}"]
        lines += [f"{IND}shared_record[{k}] = q{n}" for k, n in enumerate(names)]
        lines += [b.barrier] + [f"{n} = shared_record[{k}]" for k, n in enumerate(names)]
        return "\n".join(_indent(lines, 1))

    def signature(self, name, constants):
        """The def line (with ``constants``: see ``kernel_source``) and the bindings."""
        backend = self.backend
        record_args = "" if self.record_args is None else ", " + ", ".join(self.record_args)
        stage_args = "".join(f", {a[0]}" for a in STAGE_ARGS) if self.stage else ""
        parameters = _PARAMETERS.format(index_arg=backend.index_arg,
                                        extra_args=backend.extra_args,
                                        record_args=record_args, stage_args=stage_args)
        if not constants:
            return f"def {name}({parameters}):"
        names = [p.strip() for p in parameters.split(",")]
        for param, _value, _keep in constants:
            if names.count(param) != 1:
                raise ValueError(f"kernel source: parameter {param!r} found "
                                 f"{names.count(param)} times")
        kept = {param for param, _value, keep in constants if keep}
        dropped = {param for param, _value, keep in constants if not keep}
        names = [f"_{p}" if p in kept else p for p in names if p not in dropped]
        return f"def {name}({', '.join(names)}):\n" + "\n".join(
            f"{IND}{param} = {int(value)}" for param, value, _keep in constants)

    def source(self, name, constants=()):
        backend, S = self.backend, self.S
        record, weights = self.block_fields(), self.weights_and_bias()
        early_record, early_weights = backend.early_record, self.early_weights
        return _TEMPLATE.format(
            signature=self.signature(name, constants), record=self.record(),
            **{f: self.field(f) for f in ("tok", "len", "line", "flags", "row0")},
            index=backend.index.format(C=self.channels),
            channel_offsets=self.each("xc{J} = x_offset + {CH}      # this channel in x and "
                                      "out\noc{J} = out_offset + {CH}"),
            split_offsets=self.each("oc{J} = out2_offset + {CH}", 3),
            pad_zeros="\n".join(_indent(self.out_row("ZERO", "r", "i"), 3)),
            stage_offsets=self.stage_offsets(), pad_gates=self.gates(2), gates=self.gates(1),
            norm_pass=self.norm_pass(),
            state_part=self.state(),
            early_record=record + "\n" if early_record else "",
            late_record="" if early_record else record + "\n",
            early_weights=weights + "\n" if early_weights else "",
            late_weights="" if early_weights else weights + "\n",
            window_to_float=self.per_tap("f{k}{J} = load(u{k}{J})", S),
            tokens=self.tokens())
