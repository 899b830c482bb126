"""What the conv kernel expects, shared by the kernel source, the launcher and the host
tables: supported widths, storage types, flag bits and the argument list.

Kept free of numba / numba-dpex imports: launching prebuilt SPIR-V needs only this.
"""

import numpy as np

SUPPORTED_WIDTHS = (2, 3, 4, 5, 6, 7, 8)
ACTIVATIONS = (None, "silu", "swish")  # silu and its other name, or none

# silu's math, chosen per call (``math=``), with one meaning on both backends:
# "exact": libm's exp and IEEE division (bf16 results rounded with their NaN check);
# "fast": the device's approximate exp (OpenCL native_exp on SYCL; on CUDA also the
# approximate division), within the contract's tolerances, NaN and inf kept.
# None: the backend's default for the dtype. On SYCL that is "fast" for the 16-bit dtypes
# only: its error is far below half an ulp of their outputs (measured on opencl:cpu: 1 ulp
# at most, in a few per mille of bfloat16 and ~1.5% of float16 outputs, all within the
# contract's tolerances), and it made them faster there (docs/design.md); float32 keeps the
# exact math. (A bf16 rounding without its NaN check was 8-10% faster still on the CPU, but
# only x86's NaNs survive it: a GPU's canonical NaN 0x7FFFFFFF would round to -0.0, so it
# is not used.) CUDA's default is the tuning table's (``tuning.CudaTuning.fast_exp``).
# Each variant is its own kernel with its own cache key; the shipped kernels are the
# defaults'.
MATHS = (None, "exact", "fast")
DEFAULT_FAST_SILU = {"float32": False, "float16": True, "bfloat16": True}


def fast_silu(dtype_name, math=None):
    """Whether the SYCL kernel for ``dtype_name`` runs the fast silu under ``math``."""
    return DEFAULT_FAST_SILU[dtype_name] if math is None else math == "fast"


# How a tensor of each dtype is passed to the kernel: fp16/bf16 have no numba-dpex array
# type, so they travel as int16 bit patterns and are converted inside the kernel.
STORAGE = {"float32": np.float32, "float16": np.int16, "bfloat16": np.int16}

# The SYCL backend's "wide" kernels (16-bit dtypes): C channels per work-item, and every
# access to a row of x, out or the conv state covers those C channels as one 64-bit word
# (the template's row_group). A compiler that vectorizes across work-items (the OpenCL
# CPU device) then reads 8 bytes of contiguous memory per lane instead of 2: on
# opencl:cpu (AVX2, 8 lanes) bfloat16 1.21-1.73x and float16 1.01-1.40x faster on every
# benchmark workload in same-run comparisons (docs/design.md). The host launches one
# only where every such access is aligned (launching.wide_fits); every other launch takes
# the one-channel kernel. float32 keeps one channel per work-item (2 or 4 were 0.7-1.14x
# as fast there).
WIDE_CHANNELS = {"float16": 4, "bfloat16": 4}


def rows_aligned(address, itemsize, shape, strides, group, channel_axis=1):
    """Whether every row of an array (element ``strides``, channel axis contiguous)
    starts on a multiple of ``group`` elements of memory aligned to that many, so that
    channels c .. c + group - 1 (c a multiple of group) are one aligned access: the
    first element's ``address`` and every other stride (of an axis longer than 1) are
    multiples of the group. The rule of both backends' grouped row accesses (SYCL's
    wide kernels, CUDA's row groups): a misaligned vector access is undefined in SPIR-V
    and faults on a GPU, so it is checked on the address (views may start anywhere)."""
    if strides[channel_axis] != 1 and shape[channel_axis] > 1:
        return False
    if address % (group * itemsize):
        return False
    return all(s % group == 0 for i, (n, s) in enumerate(zip(shape, strides))
               if i != channel_axis and n > 1)

# Flag bits of a block (built by batch.py): of its sequence (initial state, spec), and
# whether the rows of x of the block / of its whole sequence are consecutive.
FLAG_INITIAL_STATE = 1
FLAG_SPEC = 2
FLAG_BLOCK_ROWS = 4
FLAG_SEQ_ROWS = 8
# The pseudo sequence of the rows of x that no sequence covers (zeros in out): it belongs
# to neither part, so a launch with split outputs writes nothing for it.
FLAG_UNCOVERED = 16
# A sequence whose tokens take their inputs along a chain (the template's chain piece):
# with a parent map (FLAG_TREE: each token's parent from the links table, else the token
# before it) or intermediate windows (a windows row in the links table). A sequence with
# a parent map is one block.
FLAG_CHAIN = 32
FLAG_TREE = 64
# A sequence that writes other lines than the one it reads (the template's lines piece):
# its new state to a write line, and/or checkpoints (the S inputs before a position) to
# lines of their own, all written by its first block after it read its window.
FLAG_LINES = 128
# A sequence whose line is a ring (circular buffer): its window at the ring position, its
# tokens written from there on (the template's ring piece).
FLAG_RING = 256
# The flags that need a kernel with the rule pieces (SYCL's ``_chains`` kernels, CUDA's
# ``KernelSpec.chains``).
RULE_FLAGS = FLAG_CHAIN | FLAG_LINES | FLAG_RING

# The kernel's ``split`` modes (see CONV_ARGS): one output in x's rows; the two parts
# into out and out2; every token at its slot's row of out.
SPLIT_NONE, SPLIT_PARTS, SPLIT_SLOTS = 0, 1, 2

# The per-call tables (built by batch.py), in the order of Batch.tables(): "rows" (the
# row of x of each token slot, in sequence order), "blocks" (one record per block) and
# "links" (read only for blocks with RULE_FLAGS, empty in steps without them): LINK_FIELDS
# per token slot (the position of the token's parent in its sequence, and the offset in
# "links" of its sequence's record), then the sequences' records: SEQUENCE_FIELDS (windows
# row or -1, write line, ring position and ring length (-1 and 0 without a ring), and the
# number of checkpoints), followed by that many (position, line) pairs. An empty sequence
# with rule flags gets a slot of its own after the token slots (its record's first
# slot), so that it finds its record.
TABLES = ("rows", "blocks", "links")
LINK_FIELDS = ("parent", "sequence")
SEQUENCE_FIELDS = ("window_row", "write_line", "ring_pos", "ring_len", "checkpoints")
# A block's record, in order: first token slot, token count, position of its first token
# in its sequence, the sequence's length, cache line (-1: pad), window offset, flags, and
# the row of x of its first token.
BLOCK_FIELDS = ("tok", "len", "pos", "seq_len", "line", "off", "flags", "row0")

# The conv kernel's arguments, in order: (name, ndim, element type, layout).
# ndim 0 is a scalar. Element type "raw" is the storage type of the dtype being compiled.
# Every array is passed flat (1-D, "C": its whole allocation) with the view's element
# offset and strides as scalars: launching then reuses one memory object per allocation. x and out
# need contiguous channels: consecutive work-items then touch consecutive addresses,
# which the OpenCL CPU compiler vectorizes and a GPU coalesces (with a runtime channel
# stride the same loads become gathers: 3-4x slower on opencl:cpu). Strided 2-D / 3-D
# numba arrays in the 2-D index space were also miscompiled by the OpenCL CPU compiler
# here (wrong channels read): flat arrays avoid that.
CONV_ARGS = (
    ("x", 1, "raw", "C"), ("x_offset", 0, "int64", None),
    ("x_row_stride", 0, "int64", None),
    ("out", 1, "raw", "C"), ("out_offset", 0, "int64", None),
    ("out_row_stride", 0, "int64", None),
    ("weight", 1, "raw", "C"), ("weight_offset", 0, "int64", None),
    ("weight_stride_c", 0, "int64", None), ("weight_stride_k", 0, "int64", None),
    ("bias", 1, "raw", "C"), ("bias_offset", 0, "int64", None),
    ("bias_stride", 0, "int64", None),
    ("state", 1, "raw", "C"), ("state_offset", 0, "int64", None),
    ("state_stride_line", 0, "int64", None), ("state_stride_c", 0, "int64", None),
    ("state_stride_col", 0, "int64", None),
    # All per-call tables live in one int32 buffer; these are their offsets in it.
    ("tables", 1, "int32", "C"),
) + tuple((name, 0, "int64", None) for name in TABLES) + (
    ("has_bias", 0, "int64", None), ("silu", 0, "int64", None),
    # Split outputs. ``split`` 1: each part's outputs in their own array, row k of a part
    # being its k-th token in the part's token order (its slot, the spec part's counted
    # from ``spec_slot0``): the non-spec part into out, the spec part into out2. ``split``
    # 2: every token into out at the row of its slot (the non-spec part's rows, then the
    # spec part's: one array that both parts are views of). Otherwise out row r is x row
    # r. Unless ``split`` is 1, out2 is not read (any valid array).
    ("out2", 1, "raw", "C"), ("out2_offset", 0, "int64", None),
    ("out2_row_stride", 0, "int64", None), ("split", 0, "int64", None),
    ("spec_slot0", 0, "int64", None),
    # Intermediate windows (SEMANTICS.md): (rows, steps, dim, S) with any element strides;
    # token t of a sequence with windows row w writes its S newest inputs to [w, t, :, :].
    # Read by no kernel without FLAG_CHAIN blocks (then any valid array).
    ("win", 1, "raw", "C"), ("win_offset", 0, "int64", None),
    ("win_stride_row", 0, "int64", None), ("win_stride_step", 0, "int64", None),
    ("win_stride_c", 0, "int64", None), ("win_stride_col", 0, "int64", None),
)

# The GDN conv stage (SEMANTICS.md "The GDN conv stage"): the conv kernel with the stage's
# pieces (``template.kernel_source``'s ``stage``) takes these after its other arguments.
# Its outputs are split by part (``split`` 1): each part's buffer (out: non-spec, out2:
# spec) holds q (rows, H * K), then k (rows, H * K), then v (rows, HV * V), each
# contiguous, ``part_rows`` / ``part2_rows`` rows (the part's tokens); "gates" (float32)
# holds each part's g (rows, HV) then beta (rows, HV), the non-spec part's from
# ``gates_offset``, the spec part's from ``gates2_offset``. a and b (rows of x, HV)
# have unit column stride; A_log and dt_bias (HV,) are float32. ``qk`` = H * K,
# ``head_k`` = K, ``vdim`` = HV * V, ``head_v`` = V, ``v_heads`` = HV; the channel
# index's divisions by K and V as ``stage_divisors`` gives them; ``l2norm_from`` /
# ``l2norm2_from``: the non-spec / spec part's first row whose q and k are normalised
# (every later row is too; STAGE_L2NORM_NONE: none); ``exp_g``: 0 or 1.
STAGE_ARGS = (
    ("ga", 1, "raw", "C"), ("ga_offset", 0, "int64", None), ("ga_row_stride", 0, "int64", None),
    ("gb", 1, "raw", "C"), ("gb_offset", 0, "int64", None), ("gb_row_stride", 0, "int64", None),
    ("alog", 1, "float32", "C"), ("alog_offset", 0, "int64", None),
    ("dtb", 1, "float32", "C"), ("dtb_offset", 0, "int64", None),
    ("gates", 1, "float32", "C"), ("gates_offset", 0, "int64", None),
    ("gates2_offset", 0, "int64", None),
    ("part_rows", 0, "int64", None), ("part2_rows", 0, "int64", None),
    ("qk", 0, "int64", None), ("head_k", 0, "int64", None), ("vdim", 0, "int64", None),
    ("head_v", 0, "int64", None), ("v_heads", 0, "int64", None),
    ("head_k_magic", 0, "int64", None), ("head_k_shift", 0, "int64", None),
    ("head_v_magic", 0, "int64", None), ("head_v_shift", 0, "int64", None),
    ("l2norm_from", 0, "int64", None), ("l2norm2_from", 0, "int64", None),
    ("exp_g", 0, "int64", None),
)
STAGE_PARTS = ("non_spec", "spec")  # the order of the l2norm rows above
# The stage divides channel indices by a head dim known only at run time. An integer
# division by a variable is a per-lane library call on a CPU's vector units (it cost the
# opencl:cpu stage a third of its time, 2026-12-07) and a long instruction sequence on a
# GPU, so the kernel multiplies and shifts instead (``divisor_magic``), exactly for every
# channel index below 2 ** STAGE_CHANNEL_BITS (the stage refuses wider x).
STAGE_CHANNEL_BITS = 24


def divisor_magic(d):
    """(m, s) such that n // d == (n * m) >> s for every int 0 <= n < 2 **
    STAGE_CHANNEL_BITS (N). Granlund and Montgomery's round-up method: with l the
    smallest integer such that d <= 2 ** l, s = N + l and m = 2 ** s // d + 1, m * d
    lies in (2 ** s, 2 ** s + d], and d <= 2 ** l keeps the error of n * m / 2 ** s
    against n / d below 1 / d (what flooring needs); n * m < 2 ** 50 (no int64
    overflow)."""
    if isinstance(d, bool) or not isinstance(d, int) or not 1 <= d < 2 ** STAGE_CHANNEL_BITS:
        raise ValueError(f"divisor_magic: expected an int in [1, 2 ** {STAGE_CHANNEL_BITS}), "
                         f"got {d!r}")
    s = STAGE_CHANNEL_BITS + (d - 1).bit_length()
    return (1 << s) // d + 1, s


def stage_divisors(head_k, head_v, vdim):
    """The stage arguments ``v_heads`` to ``head_v_shift`` (STAGE_ARGS) of head dims K and
    V and ``vdim`` = HV * V."""
    return (vdim // head_v, *divisor_magic(head_k), *divisor_magic(head_v))
STAGE_L2NORM_NONE = 2 ** 62  # a first row no part reaches
# The stage's constants, as vLLM's fused_post_conv_prep (the reference has its own copy:
# it stands alone): l2norm's eps and softplus's threshold.
STAGE_L2NORM_EPS = 1e-6
STAGE_SOFTPLUS_THRESHOLD = 20.0
