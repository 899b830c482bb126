"""The numba-cuda backend of the conv kernel: the template of ``kernels.template``
compiled for NVIDIA GPUs. Only what is CUDA's lives here: the index (thread and block
ids, and the bounds guard a grid rounded up to whole thread blocks needs), numba-cuda's
device-function decorator, the vector accesses to rows of x and out (``_row_access``),
and which conversions run (LLVM intrinsics on a GPU, their
Python twins under numba's CUDA simulator, NUMBA_ENABLE_CUDASIM=1).

Arguments are ``kernels.abi.CONV_ARGS`` followed by ``EXTRA_ARGS`` (dim and the number of
blocks, for the guard); a kernel with a compiled-in layout (``with_layout``) takes only
the per-call ones, ``CALL_ARGS``, and may have its thread block's shape compiled in too
(``cuda_index``: then no blockDim reads, and no guard where the grid is exact). Thread
layout: x over channel groups (neighbouring threads on neighbouring channels:
coalesced), y over blocks of tokens. On a GPU each array argument
is a raw device address (a typed pointer, ``pointer_signature``), not a numba array: a
numba array is a 7-field struct (56 bytes of kernel parameters), and the kernel's few
used fields spread over ~500 bytes of parameter space (H200: its decode launches stalled
on constant-cache misses, ncu imc_miss 2.96 cycles per issued instruction against 1.72
for vLLM's Triton kernel; pointers: 0.998-1.03x on the benchmark's workloads, same
call, benchmarks/h200/). The simulator runs Python and keeps numpy arrays.

The silu division is a plain fdiv: numba-cuda compiles with numba's "numpy" error model
(no zero-divisor check), unlike numba-dpex's default. ``fast_exp`` (the default, see
``backends.cuda``) makes silu's exp and division the GPU's approximate instructions;
``fastmath`` compiles the whole kernel with numba's fastmath (measured on the H200, see
benchmarks/h200/). bfloat16 results are rounded by the GPU's own conversion instruction
on compute capability 8.0 and later (``_bf16_store``), and the kernel is compiled for at
most ``max_registers`` registers per thread (the tuning table's, ``jitconv.kernels.tuning``).
"""

import linecache
import math

import numpy as np

if not hasattr(np, "row_stack"):  # numpy 2.x removed it; some numba-cuda releases use it
    np.row_stack = np.vstack

from numba import cuda  # noqa: E402

from jitconv.backends.cuda.state import STATE  # noqa: E402
from jitconv.kernels import bit_conversions, planner  # noqa: E402
from jitconv.kernels.abi import (CONV_ARGS, FLAG_BLOCK_ROWS, FLAG_INITIAL_STATE, FLAG_SEQ_ROWS,  # noqa: E402
                         FLAG_SPEC, FLAG_UNCOVERED, FLAG_CHAIN, FLAG_LINES, FLAG_RING,
                         FLAG_TREE, STAGE_ARGS, STAGE_L2NORM_EPS, STAGE_SOFTPLUS_THRESHOLD,
                         SPLIT_PARTS,
                         STORAGE)
from jitconv.kernels.template import window_value  # noqa: E402
from jitconv.backends.cuda.source import ARG_NAMES, EXTRA_ARGS, name_and_source  # noqa: E402


def pointer_signature(dtype_name, names=ARG_NAMES, fused_plan=None):
    """The kernel's numba signature on a GPU for the arguments ``names`` (ARG_NAMES, or
    CALL_ARGS for a compiled-in layout, then ``planner.RECORD_ARGS`` for a kernel that
    plans its own block): each array as a pointer to its element type (the storage type
    of ``dtype_name`` for "raw"; a metadata array's from ``fused_plan``, the element types
    of ``planner.METADATA_ARRAYS``), each scalar as its type there (int64)."""
    from numba import from_dtype, types
    raw = from_dtype(np.dtype(STORAGE[dtype_name]))

    def numba_type(arg):
        _, ndim, element, _ = arg
        scalar = raw if element == "raw" else from_dtype(np.dtype(element))
        return types.CPointer(scalar) if ndim else scalar
    by_name = {a[0]: a for a in CONV_ARGS + EXTRA_ARGS + STAGE_ARGS}
    by_name.update({a: (a, 0, "int64", None) for a in planner.RECORD_ARGS})
    by_name["errors"] = ("errors", 1, "int32", None)
    for a, element in zip(planner.METADATA_ARRAYS, fused_plan or ()):
        by_name[a] = (a, 1, element, None)
    return types.void(*[numba_type(by_name[name]) for name in names])


def _simulating():
    from numba.core import config
    return bool(config.ENABLE_CUDASIM)


def _intrinsic():
    """numba's ``intrinsic`` decorator for CUDA code: numba-cuda's own extension API
    (newer releases), else numba's."""
    try:
        from numba.cuda.extending import intrinsic
    except ImportError:
        from numba.core.extending import intrinsic
    return intrinsic


def _converters(dtype_name, native_bf16=False):
    """(load, store) for the dtype: the intrinsics on a GPU, the Python twins in the
    simulator (where intrinsics cannot run)."""
    conversions = _made("conversions", None, _conversions)
    load, store = bit_conversions.CONVERSIONS[dtype_name]
    if store == "f32_to_bf16" and native_bf16 and not _simulating():
        return conversions[load], _bf16_store()
    return conversions[load or "identity"], conversions[store or "identity"]


def _made(what, key, make):
    """The device function(s) ``make(key)`` gives, made once per process (kept in the
    backend's state)."""
    found = STATE.device_functions.get((what, key))
    if found is None:
        found = STATE.device_functions.setdefault((what, key), make(key))
    return found


def _conversions(_key):
    if _simulating():
        return dict(bit_conversions.python_converters(), identity=lambda v: v)
    return dict(bit_conversions.intrinsics(_intrinsic()),
                identity=cuda.jit(device=True)(lambda v: v))


def _bf16_store():
    """float32 -> bfloat16 bits as the GPU's own conversion (PTX ``cvt.rn.bf16.f32``,
    sm_80 and later; ``native_bf16``): one instruction where the portable rounding of
    ``bit_conversions`` is about eight integer ops per element (on the H200, added to a
    kernel variant that was not kept: 1.03-1.05x on bf16 prefill and mixed steps,
    benchmarks/h200/). Round to nearest even as well; a NaN becomes the canonical quiet
    NaN 0x7FFF instead of keeping its sign and payload's upper bits."""
    return _made("bf16 store", None, _make_bf16_store)


def _make_bf16_store(_key):
    from llvmlite import ir
    from numba import types

    @_intrinsic()
    def f32_to_bf16_ptx(typingctx, value):
        def codegen(context, builder, signature, args):
            cvt = ir.InlineAsm(ir.FunctionType(ir.IntType(16), [ir.FloatType()]),
                               "cvt.rn.bf16.f32 $0, $1;", "=h,f")
            return builder.call(cvt, [args[0]])
        return types.int16(value), codegen
    return f32_to_bf16_ptx


def _divide(a, b):
    return a / b  # numba-cuda's "numpy" error model: a plain division


def _fdiv_for(fastmath):
    """The division compiled with the kernel's fastmath setting: a device function keeps
    its own flags, and a precise division inside a fastmath kernel cost the H200 15% on
    bf16 prefill (div.rn instead of the approximate division)."""
    return _made("division", fastmath,
                 lambda fast: cuda.jit(device=True, fastmath=fast)(_divide))


@cuda.jit(device=True)
def _element(array, index):
    return array[index]


def _row_access(group):
    """(load, store) of the kernel with row group G = ``group`` (2 or 4): elements index
    .. index + G - 1 of a 16- or 32-bit kernel argument (a typed pointer) read or written
    as one vector access (PTX ld/st.global.v2 / .v4), where the kernel's scalar code
    makes G. &array[index] must be aligned to the vector's size: the host picks such a
    kernel only then
    (``backends.cuda``); a misaligned vector access is a fault on a GPU. The simulator
    runs their Python twins, which check that index is a multiple of G (the part of the
    alignment a twin can see: it runs on copies of the arrays)."""
    return _made("row access", group, _make_row_access)


def _make_row_access(group):
    if _simulating():
        def load(array, index):
            index = int(index)  # a uint64 + 1 would be a float in numpy
            if index % group:
                raise IndexError(f"load_row{group} at index {index}")
            return tuple(array[index + k] for k in range(group))

        def store(array, index, *values):
            index = int(index)
            if index % group:
                raise IndexError(f"store_row{group} at index {index}")
            for k, value in enumerate(values):
                array[index + k] = value
        return load, store
    from llvmlite import ir
    from numba import types
    intrinsic = _intrinsic()

    def vector_pointer(context, builder, signature, args):
        """(pointer to <G x element> at &array[index], the vector's size in bytes);
        ``array`` is a kernel argument, a typed pointer (``pointer_signature``)."""
        data = args[0]
        element = builder.gep(data, [args[1]], inbounds=True)
        vector = ir.VectorType(context.get_value_type(signature.args[0].dtype), group)
        return (builder.bitcast(element, vector.as_pointer(data.type.addrspace)),
                group * context.get_abi_sizeof(vector.element))

    @intrinsic
    def load(typingctx, array, index):
        def codegen(context, builder, signature, args):
            pointer, size = vector_pointer(context, builder, signature, args)
            vector = builder.load(pointer, align=size)
            return context.make_tuple(builder, signature.return_type, [
                builder.extract_element(vector, ir.Constant(ir.IntType(32), k))
                for k in range(group)])
        return types.UniTuple(array.dtype, group)(array, types.uint64), codegen

    def store_codegen(context, builder, signature, args):
        pointer, size = vector_pointer(context, builder, signature, args)
        vector = ir.Constant(pointer.type.pointee, ir.Undefined)
        for k, value in enumerate(args[2:]):  # numba cast them to the array's dtype
            vector = builder.insert_element(vector, value, ir.Constant(ir.IntType(32), k))
        builder.store(vector, pointer, align=size)
        return context.get_dummy_value()

    return load, bit_conversions.row_store(intrinsic, group, store_codegen)


def _fast_silu_ops():
    """(exp, division) of the fast silu (``fast_exp``): the GPU's approximate exp and
    division (libdevice's __expf and __fdividef, as vLLM's Triton kernels use), without
    fastmath's no-NaN / no-inf assumptions. The simulator runs Python, which has
    neither: there they are math.exp and the plain division."""
    return _made("fast silu", None, _make_fast_silu)


def _make_fast_silu(_key):
    if _simulating():
        return math.exp, _fdiv_for(False)
    from numba.cuda import libdevice
    return (libdevice.fast_expf,
            cuda.jit(device=True)(lambda a, b: libdevice.fast_fdividef(a, b)))


def _lane_sum_warp(value):
    """The sum of ``value`` over the 32 lanes of the warp, in every lane (a butterfly:
    each step adds the same two operands in both lanes, so every lane ends with the same
    bits)."""
    for step in (16, 8, 4, 2, 1):
        value += cuda.shfl_xor_sync(0xFFFFFFFF, value, step)
    return value


def _lane_sum_shared(value):
    """``_lane_sum_warp`` for the simulator, which has no shuffles: through shared
    memory between two barriers (the simulator launches a stage kernel's thread blocks
    as one warp, 32 x 1, so the barriers are the warp's)."""
    sums = cuda.shared.array(32, np.float32)
    lane = cuda.threadIdx.x % 32
    cuda.syncthreads()  # the previous sum was read by every lane
    sums[lane] = value
    cuda.syncthreads()
    total = np.float32(0.0)
    for j in range(32):
        total += sums[j]
    return total


def stage_functions():
    """What a stage kernel's source calls besides the conv kernel's (its namespace)."""
    lane_sum = _lane_sum_shared if _simulating() else _lane_sum_warp
    return {"lane_sum": cuda.jit(device=True)(lane_sum), "gexp": math.exp,
            "log1p": math.log1p, "sqrt": math.sqrt,
            "L2NORM_EPS": np.float32(STAGE_L2NORM_EPS),
            "SOFTPLUS_THRESHOLD": np.float32(STAGE_SOFTPLUS_THRESHOLD)}


def make_conv_kernel(spec):
    """The CUDA conv kernel of a ``source.KernelSpec``: a numba-cuda dispatcher, compiled
    here for ``pointer_signature`` on a GPU (its one overload is launched with device
    addresses), typed at the first launch in the simulator. With a ``layout`` the kernel
    takes CALL_ARGS, else ARG_NAMES."""
    name, source, names = name_and_source(spec)
    dtype_name, fastmath, fast_exp = spec.dtype_name, spec.fastmath, spec.fast_exp
    row_group, vector_taps, max_registers = spec.row_group, spec.vector_taps, spec.max_registers
    filename = f"<jitconv cuda kernel {name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    load, store = _converters(dtype_name, spec.native_bf16)
    namespace = {
        "cuda": cuda, "U": np.uint64, "load": load, "store": store,
        "fdiv": _fdiv_for(fastmath), "exp": math.exp, "strided": _element, "element": _element,
        "_window_value": cuda.jit(device=True)(window_value),
        "ZERO": STORAGE[dtype_name](0), "F32_ZERO": np.float32(0.0), "ONE": np.float32(1.0),
        "FLAG_INITIAL_STATE": FLAG_INITIAL_STATE, "FLAG_SPEC": FLAG_SPEC,
        "FLAG_BLOCK_ROWS": FLAG_BLOCK_ROWS, "FLAG_SEQ_ROWS": FLAG_SEQ_ROWS,
        "FLAG_UNCOVERED": FLAG_UNCOVERED, "FLAG_CHAIN": FLAG_CHAIN, "FLAG_TREE": FLAG_TREE,
        "FLAG_LINES": FLAG_LINES, "FLAG_RING": FLAG_RING,
        "SPLIT_PARTS": SPLIT_PARTS,
    }
    if fast_exp:
        namespace["exp"], namespace["fdiv"] = _fast_silu_ops()
    if row_group > 1:
        namespace[f"load_row{row_group}"], namespace[f"store_row{row_group}"] = \
            _row_access(row_group)
    if vector_taps:
        namespace["load_taps4"] = _row_access(4)[0]
    if spec.fused_plan:
        from jitconv.backends.cuda.planner import device_functions
        namespace["slot_record"] = device_functions()["slot_record"]
        namespace["RECORD_TYPE"] = np.int32  # the tables' element type: the same arithmetic
    if spec.stage:
        namespace.update(stage_functions())
    exec(compile(source, filename, "exec"), namespace)
    if _simulating():  # Python: numpy arrays, no register limit
        return cuda.jit(fastmath=fastmath)(namespace[name])
    limit = {"max_registers": max_registers} if max_registers else {}
    return cuda.jit(pointer_signature(dtype_name, names, spec.fused_plan), fastmath=fastmath,
                    **limit)(namespace[name])
