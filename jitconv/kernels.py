"""The numba-dpex kernels: the math of SEMANTICS.md and nothing else.

No host logic lives here. The public ops (``ops.py``) validate inputs and build the
per-sequence and per-block tables; ``launching.py`` compiles and submits.

One kernel serves every kind of sequence (prefill chunk, plain decode, spec verify, pad).
Its index space is 2-D: get_id(0) is the channel (the fastest-varying index), get_id(1)
the block, so neighbouring work-items touch neighbouring channels of one token row
(contiguous memory: vectorized on the OpenCL CPU device, coalesced on a GPU). A block is
up to B consecutive tokens of one sequence; long prefills are split into many blocks, so
they fill the device like many short sequences do.

Per work-item: load the width-1 inputs before the block into registers (from x, or
from the cache line, or zeros), then slide over the block's tokens. The work-item that owns
the first block of a sequence (for its channel) is the only one that reads that sequence's
old conv-state window, so it can also write the new state without racing anyone: it holds
the old window in registers before writing. New state values are raw copies of inputs
(bit-exact, whatever the dtype).

fp16/bf16 have no numba-dpex array type, so such tensors arrive as int16 arrays and are
converted with LLVM bitcasts (see the intrinsics below). Accumulation is float32; the result
is rounded once to the output dtype.
"""

import linecache
import math

import numpy as np
from llvmlite import ir
from numba import types
from numba.core.extending import intrinsic

import numba_dpex as dpex

from numba.core import cgutils

from .kernel_abi import FAST_EXP, FLAG_INITIAL_STATE, FLAG_SPEC, STORAGE, SUPPORTED_WIDTHS


_I16, _I32, _I64 = ir.IntType(16), ir.IntType(32), ir.IntType(64)
_F16, _F32 = ir.HalfType(), ir.FloatType()


def _llvm_unary(result_type, emit, doc):
    """A numba intrinsic of one argument whose body is ``emit(builder, value)``: the
    bit-level conversions numba-dpex has no typed operation for."""
    @intrinsic
    def op(typingctx, value):
        def codegen(context, builder, signature, args):
            return emit(builder, args[0])
        return result_type(value), codegen
    op.__doc__ = doc
    return op


_bf16_bits_to_f32 = _llvm_unary(
    types.float32, lambda b, v: b.bitcast(b.shl(b.zext(v, _I32), ir.Constant(_I32, 16)), _F32),
    "bfloat16 bit pattern (int16) -> float32: the upper half of a float32.")
_f16_bits_to_f32 = _llvm_unary(
    types.float32, lambda b, v: b.fpext(b.bitcast(v, _F16), _F32),
    "IEEE half bit pattern (int16) -> float32 (exact).")
_f32_to_f16_bits = _llvm_unary(
    types.int16, lambda b, v: b.bitcast(b.fptrunc(v, _F16), _I16),
    "float32 -> IEEE half bit pattern (int16), round to nearest even (LLVM fptrunc).")
def _emit_f32_to_bf16(b, v):
    """float32 -> bfloat16 bits, round to nearest even (as torch does); NaN stays a quiet
    NaN. Emitted as straight-line IR (one select, no call, no branch) so it vectorizes."""
    c = lambda n: ir.Constant(_I32, n)  # noqa: E731
    bits = b.bitcast(v, _I32)
    upper = b.lshr(bits, c(16))
    rounded = b.lshr(b.add(bits, b.add(c(0x7FFF), b.and_(upper, c(1)))), c(16))
    is_nan = b.fcmp_unordered("uno", v, v)
    return b.trunc(b.select(is_nan, b.or_(upper, c(0x40)), rounded), _I16)


_f32_to_bf16_bits = _llvm_unary(types.int16, _emit_f32_to_bf16, _emit_f32_to_bf16.__doc__)


@intrinsic
def _fdiv(typingctx, a, b):
    """float32 a / b as a plain LLVM fdiv (IEEE: x/0 is inf or NaN). numba's error model
    guards ``/`` with "if b == 0: return" per lane; in the token loop that made every
    lane able to leave the loop, and the OpenCL CPU compiler then ran the vectorized loop
    fully masked, each iteration waiting for the previous exp (~25% slower in float32)."""
    def codegen(context, builder, signature, args):
        return builder.fdiv(args[0], args[1])
    return types.float32(types.float32, types.float32), codegen


@intrinsic
def _native_exp(typingctx, value):
    """OpenCL's native_exp (float32), called as the SPIR builtin it is: the device's
    fastest exp, accuracy implementation-defined (opt-in: kernel_abi.FAST_EXP)."""
    def codegen(context, builder, signature, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_F32, [_F32]),
                                            "_Z10native_expf")
        fn.calling_convention = "spir_func"
        return builder.call(fn, args, cconv="spir_func")
    return types.float32(types.float32), codegen


@intrinsic
def _load16_by_word(typingctx, array, index):
    """array[index] of a 16-bit array, read as the aligned 32-bit word that holds it.
    For loads whose addresses are not consecutive across work-items (runtime strides:
    weights, bias, the state window) the OpenCL CPU compiler has no 16-bit gather and
    emitted 16 scalar loads and inserts per vector; a 32-bit gather is one instruction.
    The word never crosses the element's aligned 4 bytes (allocations are at least
    4-byte aligned), so it reads no other page or allocation granule."""
    def codegen(context, builder, signature, args):
        model = context.data_model_manager[signature.args[0]]
        data = builder.extract_value(args[0], model.get_field_position("data"))
        addr = builder.add(builder.ptrtoint(data, _I64),
                           builder.shl(args[1], ir.Constant(_I64, 1)))
        word_ptr = builder.inttoptr(builder.and_(addr, ir.Constant(_I64, ~3)),
                                    _I32.as_pointer(data.type.addrspace))
        word = builder.load(word_ptr, align=4)
        shift = builder.trunc(builder.shl(builder.and_(addr, ir.Constant(_I64, 2)),
                                          ir.Constant(_I64, 3)), _I32)  # 0 or 16 bits
        return builder.trunc(builder.lshr(word, shift), _I16)
    return types.int16(array, types.uint64), codegen


@dpex.device_func
def _identity(v):
    return v


@dpex.device_func
def _element(array, index):
    return array[index]


_CONVERTERS = {
    # storage -> (load: raw -> float32, store: float32 -> raw, strided element read)
    "float32": (_identity, _identity, _element),
    "float16": (_f16_bits_to_f32, _f32_to_f16_bits, _load16_by_word),
    "bfloat16": (_bf16_bits_to_f32, _f32_to_bf16_bits, _load16_by_word),
}


@dpex.device_func
def _window_value(x, x_at, x_row_stride, state, state_at, tables, rows, st0, p, initial,
                  zero, strided):
    """The input at position p of the sequence: p >= 0 is a row of x (``x_at`` is the
    channel's offset); p < 0 reads the cache line's window (flat index ``state_at``), or
    zero without initial state."""
    if p >= 0:
        return x[np.uint64(x_at + tables[rows + st0 + p] * x_row_stride)]
    if initial:
        return strided(state, np.uint64(state_at))
    return zero


# The kernel body, written once; {…} parts are expanded per width so that the sliding
# window and the taps live in scalar variables (registers): private arrays indexed in
# loops were slower. Every array is flat (1-D) with explicit element strides: with 2-D
# and 3-D strided numba arrays in a 2-D index space, the OpenCL CPU compiler produced
# wrong loads here (channels 16..31 read the weights of channels 0..15).
# Indices are cast to unsigned (U): for a signed index numba adds negative-index
# wraparound, a per-lane select that turns contiguous loads into gathers (2x slower).
_TEMPLATE = """
def {name}(item, x, x_offset, x_row_stride, out, out_offset, out_row_stride,
           weight, weight_offset, weight_stride_c, weight_stride_k,
           bias, bias_offset, bias_stride,
           state, state_offset, state_stride_line, state_stride_c, state_stride_col,
           tables, rows, blk_seq, blk_tok, blk_len, seq_tok, seq_len, seq_line, seq_off,
           seq_flags, blk_contig, has_bias, silu):
    # rows, blk_*, seq_*: offsets of the per-call tables inside `tables`.
    c = item.get_id(0)  # channel: the fastest index (contiguous memory)
    b = item.get_id(1)  # block
    s = tables[blk_seq + b]
    t0 = tables[blk_tok + b]
    nb = tables[blk_len + b]
    line = tables[seq_line + s]
    xc = x_offset + c      # this channel in x and out
    oc = out_offset + c
    if line < 0:
        # Padded sequence, or output rows no sequence covers: zeros, no state access.
        for i in range(nb):
            out[U(oc + tables[rows + t0 + i] * out_row_stride)] = ZERO
        return

    st0 = tables[seq_tok + s]
    n = tables[seq_len + s]
    p0 = t0 - st0  # position of the block's first token in its sequence
    off = tables[seq_off + s]
    flags = tables[seq_flags + s]
    initial = flags & FLAG_INITIAL_STATE
    st = state_offset + line * state_stride_line + c * state_stride_c  # line, channel
    sc = state_stride_col
    # u = concat(window, x_seq); u0..u{S1} hold u[p0 .. p0+S-1] as raw values.
{load_window}
    if p0 == 0:
        # Sole reader of this line's old window (per channel): write the new state.
        # New state = u[q0:] from column 0: spec keeps all but the oldest column
        # (S-1+n values), non-spec the last S.
        q0 = n
        if flags & FLAG_SPEC:
            q0 = 1
{store_window}
        for q in range(max(q0, {S}), {S} + n):
            state[U(st + (q - q0) * sc)] = x[U(xc + tables[rows + st0 + q - {S}] * x_row_stride)]

{load_weights}
    bias_c = F32_ZERO
    if has_bias:
        bias_c = load(strided(bias, U(bias_offset + c * bias_stride)))
{window_to_float}
    if tables[blk_contig + b]:
        r0 = tables[rows + t0]  # consecutive rows: computed, not loaded per token
        for i in range(nb):
            r = r0 + i
{body}
    else:
        for i in range(nb):
            r = tables[rows + t0 + i]
{body}
"""

# One token of the sliding window (inside the loops above): the taps, the shift, silu.
_BODY = """
xf = load(x[U(xc + r * x_row_stride)])
acc = bias_c + {taps}
{shift}
if silu:
    acc = fdiv(acc, ONE + exp(-acc))  # divisor >= 1 or NaN: never 0
out[U(oc + r * out_row_stride)] = store(acc)
"""


def kernel_source(width, name):
    """The Python source of the conv kernel for one width (see _TEMPLATE)."""
    S = width - 1
    ind = " " * 4

    def lines(fmt, count, depth=1):
        return "\n".join(ind * depth + fmt.format(k=k) for k in range(count))

    body = _BODY.format(
        taps=" + ".join([f"w{k} * f{k}" for k in range(S)] + [f"w{S} * xf"]),
        shift="\n".join([f"f{k} = f{k + 1}" for k in range(S - 1)] + [f"f{S - 1} = xf"]))
    body = "\n".join(ind * 3 + line for line in body.strip().splitlines())
    return _TEMPLATE.format(
        name=name, S=S, S1=S - 1, body=body,
        load_window=lines(f"u{{k}} = _window_value(x, xc, x_row_stride, state, "
                          f"st + (off + p0 + {{k}}) * sc, tables, rows, st0, "
                          f"p0 - {S} + {{k}}, initial, ZERO, strided)", S),
        store_window=lines("if q0 <= {k}:\n" + ind * 3 + "state[U(st + ({k} - q0) * sc)] = u{k}",
                           S, depth=2),
        load_weights=lines("w{k} = load(strided(weight, U(weight_offset + c * weight_stride_c"
                           " + {k} * weight_stride_k)))", width),
        window_to_float=lines("f{k} = load(u{k})", S),
    )


def make_conv_kernel(width, dtype_name, fast_exp=FAST_EXP):
    """Build the mixed-batch causal-conv1d kernel for one (width, dtype) specialization;
    ``fast_exp``: silu's exp is OpenCL's native_exp instead of math.exp.

    The width shapes the source (scalar registers for the window and the taps); the
    storage conversions are globals of the generated function, so numba treats them as
    compile-time constants. Returns a numba-dpex kernel with the argument list
    ``kernel_abi.CONV_ARGS``.
    """
    if width not in SUPPORTED_WIDTHS:
        raise ValueError(f"width must be one of {SUPPORTED_WIDTHS}, got {width}")
    name = f"jitconv_conv_w{width}_{dtype_name}" + ("_fastexp" if fast_exp else "")
    source = kernel_source(width, name)
    filename = f"<jitconv kernel {name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    load, store, strided = _CONVERTERS[dtype_name]
    namespace = {
        "U": np.uint64, "fdiv": _fdiv,
        "exp": _native_exp if fast_exp else math.exp,
        "load": load, "store": store, "strided": strided,
        "_window_value": _window_value,
        "ZERO": STORAGE[dtype_name](0), "F32_ZERO": np.float32(0.0), "ONE": np.float32(1.0),
        "FLAG_INITIAL_STATE": FLAG_INITIAL_STATE, "FLAG_SPEC": FLAG_SPEC,
    }
    exec(compile(source, filename, "exec"), namespace)
    return dpex.kernel(namespace[name])
