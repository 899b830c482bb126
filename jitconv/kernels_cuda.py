"""The numba-cuda backend of the conv kernel: the template of ``kernel_template``
compiled for NVIDIA GPUs. Only what is CUDA's lives here: the index (thread and block
ids, and the bounds guard a grid rounded up to whole thread blocks needs), numba-cuda's
device-function decorator, the vector accesses to rows of x and out (``_row_access``),
and which conversions run (LLVM intrinsics on a GPU, their
Python twins under numba's CUDA simulator, NUMBA_ENABLE_CUDASIM=1).

Arguments are ``kernel_abi.CONV_ARGS`` followed by ``EXTRA_ARGS`` (dim and the number of
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
``cuda_backend``) makes silu's exp and division the GPU's approximate instructions;
``fastmath`` compiles the whole kernel with numba's fastmath (measured on the H200, see
benchmarks/h200/). bfloat16 results are rounded by the GPU's own conversion instruction
on compute capability 8.0 and later (``_bf16_store``), and the kernel is compiled for at
most ``max_registers`` registers per thread (``cuda_backend.DEFAULT_MAX_REGISTERS``).
"""

import linecache
import math

import numpy as np

if not hasattr(np, "row_stack"):  # numpy 2.x removed it; some numba-cuda releases use it
    np.row_stack = np.vstack

from numba import cuda  # noqa: E402

from . import bit_conversions  # noqa: E402
from .kernel_abi import (CONV_ARGS, FLAG_BLOCK_ROWS, FLAG_INITIAL_STATE, FLAG_SEQ_ROWS,  # noqa: E402
                         FLAG_SPEC, STORAGE, SUPPORTED_WIDTHS, TABLES)
from .kernel_template import Backend, kernel_source, window_value  # noqa: E402


def cuda_index(block=None, exact=False):
    """The CUDA backend's index code (``Backend.index``): x threads over channel groups,
    y threads over blocks of tokens. ``block`` (tx, ty): the thread block's shape compiled
    in (kernels with a compiled-in layout, whose launches all have that shape), None: read
    from blockDim. ``exact``: the grid has exactly one thread per channel group and token
    block (ty = 1, the groups a multiple of tx: ``launch_shape`` then rounds nothing up),
    so no bounds guard."""
    tx, ty = block or ("cuda.blockDim.x", "cuda.blockDim.y")
    b = "cuda.blockIdx.x" if ty == 1 else f"cuda.blockIdx.x * {ty} + cuda.threadIdx.y"
    index = (f"    g = cuda.blockIdx.y * {tx} + cuda.threadIdx.x  # channel group\n"
             f"    b = {b}  # block\n"
             "    c = g * {C}  # first of the work-item's channels")
    if exact:
        return index
    return (index + "\n    if c >= dim or b >= num_blocks:\n"
            "        return  # the grid is rounded up to whole thread blocks")


CUDA = Backend(name="cuda", index_arg="", extra_args=", dim, num_blocks", index=cuda_index(),
               one_round_record=True, reuse_state_loads=True, split_window=True)
EXTRA_ARGS = (("dim", 0, "int64", None), ("num_blocks", 0, "int64", None))
# New-state values read from x per round of loads: width - 1 + this (the template's
# state_chunk). With one more than the window's width - 1, a spec sequence of 1 + 3
# tokens at width 4 reads its 4 values in one round instead of two (each round's loads
# wait for the previous round's state stores). H200, same call: spec-only 1.02-1.14x,
# decode-heavy mixed 1.02-1.11x; bfloat16 decode-only 0.90-0.97x (benchmarks/h200/).
STATE_CHUNK_EXTRA = 1

# The scalar arguments a kernel can take as compile-time constants (``layout``): a
# layer's offsets, strides, dim, has_bias and silu, the same at every call of a layer
# (the per-call table offsets and block count are not). With them constant the 64-bit
# index arithmetic on them folds (the bfloat16 decode kernel's SASS held 149 IMAD, 58
# LEA and 46 IADD3 against 33, 8 and 2 in vLLM's Triton kernel, whose strides are
# constexpr; benchmarks/h200/README.md).
LAYOUT_ARGS = tuple(a[0] for a in CONV_ARGS + EXTRA_ARGS
                    if not a[1] and a[0] not in TABLES + ("num_blocks",))


ARG_NAMES = tuple(a[0] for a in CONV_ARGS + EXTRA_ARGS)
# What a kernel with a compiled-in layout takes: the per-call arguments only.
CALL_ARGS = tuple(name for name in ARG_NAMES if name not in LAYOUT_ARGS)


def with_layout(source, layout, compact=True):
    """``source`` with the LAYOUT_ARGS parameters bound to the values of ``layout`` (ints,
    in LAYOUT_ARGS order) at the body's top and dropped from the parameter list (the
    kernel then takes CALL_ARGS; ``compact`` False: kept, renamed, unused)."""
    head, body = source.split("):\n", 1)  # the def's parameter list ends here
    start, params = head.split("(", 1)
    names = [p.strip() for p in params.split(",")]
    for param in LAYOUT_ARGS:
        if names.count(param) != 1:  # the template's parameter list changed: bind nothing
            raise ValueError(f"kernel source: parameter {param!r} found "
                             f"{names.count(param)} times")
    if compact:
        names = [p for p in names if p not in LAYOUT_ARGS]
    else:
        names = [f"_{p}" if p in LAYOUT_ARGS else p for p in names]
    values = "".join(f"    {param} = {int(value)}\n" for param, value in zip(LAYOUT_ARGS, layout))
    return f"{start}({', '.join(names)}):\n" + values + body


def short_tokens_for(width, longest_sequences):
    """The ``short_tokens`` of the kernel for a launch whose longest non-spec and spec
    sequences (with a cache line) hold ``longest_sequences`` tokens: 1 for decode steps,
    the state update's one round (width - 1 + STATE_CHUNK_EXTRA) when every non-spec
    sequence holds at most width - 1 tokens and every spec one at most that round, else
    0 (the general kernel). Two short kernels, not one per length: each is compiled on
    first use."""
    non_spec, spec = longest_sequences
    one_round = width - 1 + STATE_CHUNK_EXTRA
    if non_spec > width - 1 or spec > one_round:
        return 0
    return 1 if max(non_spec, spec) <= 1 else one_round


def pointer_signature(dtype_name, names=ARG_NAMES):
    """The kernel's numba signature on a GPU for the arguments ``names`` (ARG_NAMES, or
    CALL_ARGS for a compiled-in layout): each array of CONV_ARGS as a pointer to its
    element type (the storage type of ``dtype_name`` for "raw"), each scalar as its type
    there (int64)."""
    from numba import from_dtype, types
    raw = from_dtype(np.dtype(STORAGE[dtype_name]))

    def numba_type(arg):
        _, ndim, element, _ = arg
        scalar = raw if element == "raw" else from_dtype(np.dtype(element))
        return types.CPointer(scalar) if ndim else scalar
    by_name = {a[0]: a for a in CONV_ARGS + EXTRA_ARGS}
    return types.void(*[numba_type(by_name[name]) for name in names])


def _simulating():
    from numba.core import config
    return bool(config.ENABLE_CUDASIM)


_conversions = {}


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
    if not _conversions:
        if _simulating():
            _conversions.update(bit_conversions.python_converters())
            _conversions["identity"] = lambda v: v
        else:
            _conversions.update(bit_conversions.intrinsics(_intrinsic()))
            _conversions["identity"] = cuda.jit(device=True)(lambda v: v)
    load, store = bit_conversions.CONVERSIONS[dtype_name]
    if store == "f32_to_bf16" and native_bf16 and not _simulating():
        return _conversions[load], _bf16_store()
    return _conversions[load or "identity"], _conversions[store or "identity"]


_cvt = []  # the PTX bf16 rounding, made once


def _bf16_store():
    """float32 -> bfloat16 bits as the GPU's own conversion (PTX ``cvt.rn.bf16.f32``,
    sm_80 and later; ``native_bf16``): one instruction where the portable rounding of
    ``bit_conversions`` is about eight integer ops per element (on the H200, added to a
    kernel variant that was not kept: 1.03-1.05x on bf16 prefill and mixed steps,
    benchmarks/h200/). Round to nearest even as well; a NaN becomes the canonical quiet
    NaN 0x7FFF instead of keeping its sign and payload's upper bits."""
    if not _cvt:
        from llvmlite import ir
        from numba import types

        @_intrinsic()
        def f32_to_bf16_ptx(typingctx, value):
            def codegen(context, builder, signature, args):
                cvt = ir.InlineAsm(ir.FunctionType(ir.IntType(16), [ir.FloatType()]),
                                   "cvt.rn.bf16.f32 $0, $1;", "=h,f")
                return builder.call(cvt, [args[0]])
            return types.int16(value), codegen
        _cvt.append(f32_to_bf16_ptx)
    return _cvt[0]


def _divide(a, b):
    return a / b  # numba-cuda's "numpy" error model: a plain division


_fdiv = {}  # fastmath -> the division as a device function compiled with that setting


def _fdiv_for(fastmath):
    """The division compiled with the kernel's fastmath setting: a device function keeps
    its own flags, and a precise division inside a fastmath kernel cost the H200 15% on
    bf16 prefill (div.rn instead of the approximate division)."""
    found = _fdiv.get(fastmath)
    if found is None:
        found = _fdiv.setdefault(fastmath, cuda.jit(device=True, fastmath=fastmath)(_divide))
    return found


@cuda.jit(device=True)
def _element(array, index):
    return array[index]


_row_ops = {}  # row group G -> (load_row{G}, store_row{G}), made once per G


def _row_access(group):
    """(load, store) of the kernel with row group G = ``group`` (2 or 4): elements index
    .. index + G - 1 of a 16- or 32-bit kernel argument (a typed pointer) read or written
    as one vector access (PTX ld/st.global.v2 / .v4), where the kernel's scalar code
    makes G. &array[index] must be aligned to the vector's size: the host picks such a
    kernel only then
    (``cuda_backend``); a misaligned vector access is a fault on a GPU. The simulator
    runs their Python twins, which check that index is a multiple of G (the part of the
    alignment a twin can see: it runs on copies of the arrays)."""
    found = _row_ops.get(group)
    if found is not None:
        return found
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
        return _row_ops.setdefault(group, (load, store))
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

    return _row_ops.setdefault(group, (load, bit_conversions.row_store(intrinsic, group,
                                                                       store_codegen)))


_fast_silu = []  # (exp, division), made once


def _fast_silu_ops():
    """(exp, division) of the fast silu (``fast_exp``): the GPU's approximate exp and
    division (libdevice's __expf and __fdividef, as vLLM's Triton kernels use), without
    fastmath's no-NaN / no-inf assumptions. The simulator runs Python, which has
    neither: there they are math.exp and the plain division."""
    if not _fast_silu:
        if _simulating():
            ops = (math.exp, _fdiv_for(False))
        else:
            from numba.cuda import libdevice
            ops = (libdevice.fast_expf,
                   cuda.jit(device=True)(lambda a, b: libdevice.fast_fdividef(a, b)))
        _fast_silu.append(ops)
    return _fast_silu[0]


def make_conv_kernel(width, dtype_name, channels=1, fastmath=False, lookahead=1,
                     fast_exp=False, max_registers=None, native_bf16=False,
                     short_tokens=0, row_group=1, layout=None, early_weights=False,
                     group_state=False, vector_taps=False, block=None,
                     compact_args=True, exact_grid=True, uniform_decode=False):
    """The CUDA conv kernel for one (width, dtype, channels per thread, lookahead)
    specialization: a numba-cuda dispatcher, compiled here for ``pointer_signature`` on a
    GPU (its one overload is launched with device addresses), typed at the first launch
    in the simulator.
    ``fastmath``: numba's fastmath for the whole kernel; ``fast_exp``: only silu's exp
    and division approximate (``_fast_silu_ops``); ``max_registers``: the registers per
    thread the compiler may use (None: its own choice); ``native_bf16``: bfloat16 rounded
    by the GPU's instruction (``_bf16_store``; compute capability 8.0 and later);
    ``short_tokens``: the kernel for launches of sequences of at most that many tokens
    (``kernel_template``; chosen per launch by ``cuda_backend``, 0: the general one);
    ``row_group``: rows of x and out accessed that many (2 or 4) channels at a time
    (``_row_access``; ``channels`` a multiple of it, aligned rows: chosen per launch by
    ``cuda_backend``); ``layout``: the values of LAYOUT_ARGS as compile-time constants
    (``with_layout``; the kernel is then only for launches with exactly those), None:
    all of them read from the arguments; ``early_weights``: the weights and bias loaded
    before the state update; ``group_state``: the conv state's window and stores
    ``row_group`` channels at a time too (``kernel_template``; aligned states only);
    ``vector_taps``: a channel's 4 taps as one vector load ((dim, 4) weights, aligned);
    ``block``: the thread block's shape (tx, ty) compiled in (``cuda_index``; with a
    ``layout`` only, whose launches all have one shape), None: read from blockDim;
    ``exact_grid``: with ``block``, no bounds guard where the launch's grid rounds
    nothing up (``cuda_index``); ``compact_args``: with a ``layout``, the layout's
    parameters dropped from the signature (``with_layout``); ``uniform_decode``: with
    ``short_tokens`` 1, every sequence with a cache line taken to hold one token with its
    window at column 0 (``kernel_template``; only for launches whose step is so:
    ``cuda_backend``).
    With a ``layout`` the kernel takes CALL_ARGS, else ARG_NAMES."""
    if width not in SUPPORTED_WIDTHS:
        raise ValueError(f"width must be one of {SUPPORTED_WIDTHS}, got {width}")
    if block and layout is None:
        raise ValueError("block: a thread block shape is compiled in only with a layout")
    exact = False
    if block:
        groups = layout[LAYOUT_ARGS.index("dim")] // channels
        exact = exact_grid and block[1] == 1 and groups % block[0] == 0
    name = (f"jitconv_conv_w{width}_{dtype_name}_c{channels}_l{lookahead}"
            f"{'_fast' if fastmath else ''}{'_fastexp' if fast_exp else ''}"
            f"{f'_r{max_registers}' if max_registers else ''}"
            f"{'_cvt' if native_bf16 and dtype_name == 'bfloat16' else ''}"
            f"{f'_short{short_tokens}' if short_tokens else ''}"
            f"{f'_g{row_group}' if row_group > 1 else ''}"
            f"{'_ew' if early_weights else ''}{'_gs' if group_state else ''}"
            f"{'_vt' if vector_taps else ''}"
            f"{f'_k{hash(layout) % 10 ** 10}' if layout is not None else ''}"
            f"{f'_b{block[0]}x{block[1]}' if block else ''}"
            f"{'_ca' if layout is not None and compact_args else ''}"
            f"{'_ng' if exact else ''}{'_ud' if uniform_decode else ''}")
    backend = CUDA._replace(index=cuda_index(block, exact)) if block else CUDA
    source = kernel_source(width, name, backend, channels, lookahead,
                           state_chunk=width - 1 + STATE_CHUNK_EXTRA, short_tokens=short_tokens,
                           row_group=row_group, early_weights=early_weights,
                           group_state=group_state, vector_taps=vector_taps,
                           uniform_decode=uniform_decode)
    if layout is not None:
        source = with_layout(source, layout, compact_args)
    names = CALL_ARGS if layout is not None and compact_args else ARG_NAMES
    filename = f"<jitconv cuda kernel {name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    load, store = _converters(dtype_name, native_bf16)
    namespace = {
        "cuda": cuda, "U": np.uint64, "load": load, "store": store,
        "fdiv": _fdiv_for(fastmath), "exp": math.exp, "strided": _element, "element": _element,
        "_window_value": cuda.jit(device=True)(window_value),
        "ZERO": STORAGE[dtype_name](0), "F32_ZERO": np.float32(0.0), "ONE": np.float32(1.0),
        "FLAG_INITIAL_STATE": FLAG_INITIAL_STATE, "FLAG_SPEC": FLAG_SPEC,
        "FLAG_BLOCK_ROWS": FLAG_BLOCK_ROWS, "FLAG_SEQ_ROWS": FLAG_SEQ_ROWS,
    }
    if fast_exp:
        namespace["exp"], namespace["fdiv"] = _fast_silu_ops()
    if row_group > 1:
        namespace[f"load_row{row_group}"], namespace[f"store_row{row_group}"] = \
            _row_access(row_group)
    if vector_taps:
        namespace["load_taps4"] = _row_access(4)[0]
    exec(compile(source, filename, "exec"), namespace)
    if _simulating():  # Python: numpy arrays, no register limit
        return cuda.jit(fastmath=fastmath)(namespace[name])
    limit = {"max_registers": max_registers} if max_registers else {}
    return cuda.jit(pointer_signature(dtype_name, names), fastmath=fastmath,
                    **limit)(namespace[name])
