"""The numba-dpex kernels: the math of SEMANTICS.md and nothing else.

No host logic lives here. The public ops (``ops.py``) validate inputs and build the
per-sequence and per-block tables; ``launching.py`` compiles and submits.

One kernel serves every kind of sequence (prefill chunk, plain decode, spec verify, pad).
Its index space is (block, channel) flattened with the channel fastest, so neighbouring
work-items touch neighbouring channels of one token row (contiguous memory, coalesced on a
GPU). A block is up to B consecutive tokens of one sequence; long prefills are split into
many blocks, so they fill the device like many short sequences do.

Per work-item: load the width-1 inputs before the block into a private window (from x, or
from the cache line, or zeros), then slide over the block's tokens. The work-item that owns
the first block of a sequence (for its channel) is the only one that reads that sequence's
old conv-state window, so it can also write the new state without racing anyone: it holds
the old window in registers before writing. New state values are raw copies of inputs
(bit-exact, whatever the dtype).

fp16/bf16 have no numba-dpex array type, so such tensors arrive as int16 arrays and are
converted with LLVM bitcasts (see the intrinsics below). Accumulation is float32; the result
is rounded once to the output dtype.
"""

import math

import numpy as np
from llvmlite import ir
from numba import types
from numba.core.extending import intrinsic

import numba_dpex as dpex
from numba_dpex import kernel_api as kapi

# Storage kinds: how a tensor of the given torch dtype is passed to the kernel.
STORAGE = {"float32": np.float32, "float16": np.int16, "bfloat16": np.int16}
SUPPORTED_WIDTHS = (2, 3, 4, 5, 6, 7, 8)

# seq_flags bits (built by ops.py)
FLAG_INITIAL_STATE = 1
FLAG_SPEC = 2


@intrinsic
def _bf16_bits_to_f32(typingctx, bits):
    """bfloat16 bit pattern (int16) -> float32: the upper half of a float32."""
    sig = types.float32(bits)

    def codegen(context, builder, signature, args):
        wide = builder.zext(args[0], ir.IntType(32))
        return builder.bitcast(builder.shl(wide, ir.Constant(ir.IntType(32), 16)),
                               ir.FloatType())

    return sig, codegen


@intrinsic
def _f16_bits_to_f32(typingctx, bits):
    """IEEE half bit pattern (int16) -> float32 (exact)."""
    sig = types.float32(bits)

    def codegen(context, builder, signature, args):
        half = builder.bitcast(args[0], ir.HalfType())
        return builder.fpext(half, ir.FloatType())

    return sig, codegen


@intrinsic
def _f32_to_f16_bits(typingctx, value):
    """float32 -> IEEE half bit pattern (int16), round to nearest even (LLVM fptrunc)."""
    sig = types.int16(value)

    def codegen(context, builder, signature, args):
        half = builder.fptrunc(args[0], ir.HalfType())
        return builder.bitcast(half, ir.IntType(16))

    return sig, codegen


@intrinsic
def _f32_as_u32(typingctx, value):
    sig = types.uint32(value)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return sig, codegen


@intrinsic
def _u32_low_i16(typingctx, value):
    sig = types.int16(value)

    def codegen(context, builder, signature, args):
        return builder.trunc(args[0], ir.IntType(16))

    return sig, codegen


def _f32_to_bf16_bits(v):
    """float32 -> bfloat16 bit pattern, round to nearest even (as torch does); NaN stays NaN."""
    bits = _f32_as_u32(v)
    if v != v:
        return _u32_low_i16((bits >> np.uint32(16)) | np.uint32(0x40))
    rounding = np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return _u32_low_i16((bits + rounding) >> np.uint32(16))


@dpex.device_func
def _identity(v):
    return v


_CONVERTERS = {
    # storage -> (load: raw -> float32, store: float32 -> raw)
    "float32": (_identity, _identity),
    "float16": (_f16_bits_to_f32, _f32_to_f16_bits),
    "bfloat16": (_bf16_bits_to_f32, dpex.device_func(_f32_to_bf16_bits)),
}


def make_conv_kernel(width, dtype_name):
    """Build the mixed-batch causal-conv1d kernel for one (width, dtype) specialization.

    ``width`` and the storage conversions are closure constants, so the tap loops have
    fixed trip counts that the compiler unrolls. Returns a numba-dpex kernel with the
    argument list documented in ``launching.CONV_ARGS``.
    """
    if width not in SUPPORTED_WIDTHS:
        raise ValueError(f"width must be one of {SUPPORTED_WIDTHS}, got {width}")
    S = width - 1
    W = width
    raw_t = STORAGE[dtype_name]
    raw_zero = raw_t(0)
    load, store = _CONVERTERS[dtype_name]
    one = np.float32(1.0)

    def conv_kernel(item, x, out, weight, bias, state, rows,
                    blk_seq, blk_tok, blk_len,
                    seq_tok, seq_len, seq_line, seq_off, seq_flags,
                    has_bias, silu):
        dim = out.shape[1]
        gid = item.get_id(0)
        b = gid // dim
        c = gid - b * dim
        s = blk_seq[b]
        t0 = blk_tok[b]
        nb = blk_len[b]
        line = seq_line[s]
        if line < 0:
            # Padded sequence, or output rows no sequence covers: zeros, no state access.
            for i in range(nb):
                out[rows[t0 + i], c] = raw_zero
            return

        st0 = seq_tok[s]
        n = seq_len[s]
        p0 = t0 - st0  # position of the block's first token inside its sequence
        off = seq_off[s]
        flags = seq_flags[s]

        # u = concat(window, x_seq); win holds u[p0 .. p0+S-1] (raw values).
        win = kapi.PrivateArray(shape=S, dtype=raw_t)
        for k in range(S):
            p = p0 - S + k
            if p >= 0:
                win[k] = x[rows[st0 + p], c]
            elif flags & FLAG_INITIAL_STATE:
                win[k] = state[line, c, off + S + p]
            else:
                win[k] = raw_zero

        if p0 == 0:
            # New state = u[q0:] written to columns 0.. : spec keeps all but the oldest
            # column (S-1+n values), non-spec keeps the last S.
            q0 = n
            if flags & FLAG_SPEC:
                q0 = 1
            for q in range(q0, S + n):
                if q < S:
                    state[line, c, q - q0] = win[q]
                else:
                    state[line, c, q - q0] = x[rows[st0 + q - S], c]

        w = kapi.PrivateArray(shape=W, dtype=np.float32)
        for j in range(W):
            w[j] = load(weight[c, j])
        bias_c = np.float32(0.0)
        if has_bias:
            bias_c = load(bias[c])

        for i in range(nb):
            r = rows[t0 + i]
            xv = x[r, c]
            acc = bias_c + w[S] * load(xv)
            for j in range(S):
                acc += w[j] * load(win[j])
            for j in range(S - 1):
                win[j] = win[j + 1]
            win[S - 1] = xv
            if silu:
                acc = acc / (one + math.exp(-acc))
            out[r, c] = store(acc)

    conv_kernel.__name__ = f"jitconv_conv_w{width}_{dtype_name}"
    conv_kernel.__qualname__ = conv_kernel.__name__
    return dpex.kernel(conv_kernel)
