"""fp16 / bf16 storage conversions, as LLVM IR for the kernels and as plain Python for
numba's CUDA simulator.

Neither numba-dpex nor numba-cuda has a usable 16-bit float array type here, so fp16 and
bf16 tensors reach the kernels as int16 bit patterns. The kernels convert them with numba
intrinsics that emit LLVM bitcast / fpext / fptrunc and integer ops: the same IR serves
the SYCL (SPIR-V) and the CUDA (NVVM) backend. A backend passes its own ``intrinsic``
decorator (numba's, or numba-cuda's where it has one) to ``intrinsics``. ``row_store``
gives both backends the signatures of their row-store intrinsics.

numba's CUDA simulator runs kernels as Python, where an intrinsic cannot run; the
``python_converters`` do the same conversions with numpy scalars (tests check them against
torch's rounding, and against each other where numba can run the intrinsics).
"""

import numpy as np
from llvmlite import ir

_I16, _I32, _F16, _F32 = ir.IntType(16), ir.IntType(32), ir.HalfType(), ir.FloatType()


def _emit_bf16_to_f32(b, v):
    """bfloat16 bit pattern (int16) -> float32: the upper half of a float32."""
    return b.bitcast(b.shl(b.zext(v, _I32), ir.Constant(_I32, 16)), _F32)


def _emit_f16_to_f32(b, v):
    """IEEE half bit pattern (int16) -> float32 (exact)."""
    return b.fpext(b.bitcast(v, _F16), _F32)


def _emit_f32_to_f16(b, v):
    """float32 -> IEEE half bit pattern (int16), round to nearest even (LLVM fptrunc)."""
    return b.bitcast(b.fptrunc(v, _F16), _I16)


def _emit_f32_to_bf16(b, v):
    """float32 -> bfloat16 bits, round to nearest even (as torch does); NaN stays a quiet
    NaN. Emitted as straight-line IR (one select, no call, no branch) so it vectorizes."""
    c = lambda n: ir.Constant(_I32, n)  # noqa: E731
    bits = b.bitcast(v, _I32)
    upper = b.lshr(bits, c(16))
    rounded = b.lshr(b.add(bits, b.add(c(0x7FFF), b.and_(upper, c(1)))), c(16))
    is_nan = b.fcmp_unordered("uno", v, v)
    return b.trunc(b.select(is_nan, b.or_(upper, c(0x40)), rounded), _I16)


def intrinsics(intrinsic):
    """{name: numba intrinsic} for the four conversions, made with ``intrinsic``."""
    from numba import types

    def unary(result_type, emit):
        @intrinsic
        def op(typingctx, value):
            def codegen(context, builder, signature, args):
                return emit(builder, args[0])
            return result_type(value), codegen
        op.__doc__ = emit.__doc__
        return op

    return {"bf16_to_f32": unary(types.float32, _emit_bf16_to_f32),
            "f16_to_f32": unary(types.float32, _emit_f16_to_f32),
            "f32_to_f16": unary(types.int16, _emit_f32_to_f16),
            "f32_to_bf16": unary(types.int16, _emit_f32_to_bf16)}


# ------------------------------------------------------ the same, in Python (simulator)

def _bits16(v):
    return int(np.int16(v)) & 0xFFFF


def py_bf16_to_f32(v):
    return np.uint32(_bits16(v) << 16).view(np.float32)


def py_f16_to_f32(v):
    return np.float32(np.uint16(_bits16(v)).view(np.float16))


def py_f32_to_f16(v):
    with np.errstate(over="ignore"):  # beyond the half range: inf, as fptrunc gives
        return np.float16(np.float32(v)).view(np.int16)  # numpy rounds to nearest even


def py_f32_to_bf16(v):
    """Bit for bit what _emit_f32_to_bf16 computes (32-bit wraparound included)."""
    v = np.float32(v)
    bits = int(v.view(np.uint32))
    upper = bits >> 16
    if v != v:
        return np.uint16(upper | 0x40).view(np.int16)
    rounded = ((bits + 0x7FFF + (upper & 1)) & 0xFFFFFFFF) >> 16
    return np.uint16(rounded & 0xFFFF).view(np.int16)


def python_converters():
    return {"bf16_to_f32": py_bf16_to_f32, "f16_to_f32": py_f16_to_f32,
            "f32_to_f16": py_f32_to_f16, "f32_to_bf16": py_f32_to_bf16}


def row_store(intrinsic, group, codegen):
    """A numba intrinsic ``store(array, index, v0, .., v{group-1})`` (group 2 or 4) whose
    lowering is ``codegen``: the row stores of both backends (``_row_access`` in
    ``backends/sycl/kernels.py`` and in ``backends/cuda/kernels.py``) share it. numba
    intrinsics take no ``*args``, so each group size has its own signature."""
    from numba import types
    if group == 2:
        @intrinsic
        def store(typingctx, array, index, a, b):
            return types.none(array, types.uint64, array.dtype, array.dtype), codegen
    elif group == 4:
        @intrinsic
        def store(typingctx, array, index, a, b, c, d):
            return types.none(array, types.uint64, *[array.dtype] * 4), codegen
    else:
        raise ValueError(f"group must be 2 or 4, got {group}")
    return store


# storage -> (load: raw -> float32, store: float32 -> raw), by conversion name
CONVERSIONS = {"float32": (None, None), "float16": ("f16_to_f32", "f32_to_f16"),
               "bfloat16": ("bf16_to_f32", "f32_to_bf16")}
