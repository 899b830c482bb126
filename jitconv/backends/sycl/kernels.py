"""The numba-dpex (SYCL) backend of the conv kernel: the template of ``kernels.template``
compiled for SYCL devices. Only what is SYCL's lives here: the work-item's index
(``item.get_id``: the range is exact, so no bounds guard), numba-dpex's device-function
decorator, and the numba intrinsics the SPIR-V kernel uses: the fp16/bf16 bit
conversions (``bit_conversions``), a plain fdiv, OpenCL's native_exp (the fast silu: the
default for fp16/bf16, ``kernels.abi.fast_silu``), the 32-bit-word read of 16-bit
elements, the 64-bit read of a width-4 16-bit weight's taps, and the wide kernels' row
accesses (``_row_access``: C channels of a row as one integer word). The SYCL backend
takes the template's ``unit_stride_reads`` (stride-specific read paths that the OpenCL
CPU compiler turns into vector loads instead of gathers). Each (width, dtype) has the
one-channel kernel, and the 16-bit dtypes also a wide one (``kernels.abi.WIDE_CHANNELS``)
that the host launches where its accesses are aligned (``launching.wide_fits``).

No host logic lives here. The public ops (``ops.py``) validate inputs, ``batch.py`` builds
the tables (token rows, one record per block); ``launching.py`` compiles and submits.
"""

import functools
import linecache
import math
import types as pytypes

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.extending import intrinsic

import numba_dpex as dpex
from numba_dpex.kernel_api import MemoryScope, group_barrier

from jitconv.kernels import bit_conversions, planner
from jitconv.kernels.abi import (FLAG_BLOCK_ROWS, FLAG_CHAIN, FLAG_INITIAL_STATE, FLAG_SEQ_ROWS,
                                 FLAG_LINES, FLAG_RING, FLAG_SPEC, FLAG_TREE,
                                 FLAG_UNCOVERED, SPLIT_PARTS, STAGE_L2NORM_EPS,
                                 STAGE_SOFTPLUS_THRESHOLD, STORAGE, WIDE_CHANNELS,
                                 fast_silu)
from jitconv.kernels.template import window_value
from jitconv.backends.sycl.source import name_and_source

_INTRINSICS = bit_conversions.intrinsics(intrinsic)
_I16, _I32, _I64, _F32 = ir.IntType(16), ir.IntType(32), ir.IntType(64), ir.FloatType()


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
    fastest exp, accuracy implementation-defined (the fast silu: kernels.abi.fast_silu).
    On opencl:cpu it is SVML's ``expf16_native``, within 1e-5 of exp (relative)."""
    def codegen(context, builder, signature, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_F32, [_F32]),
                                            "_Z10native_expf")
        fn.calling_convention = "spir_func"
        return builder.call(fn, args, cconv="spir_func")
    return types.float32(types.float32), codegen


def _data_pointer(context, builder, signature, args):
    """The data pointer of an intrinsic's first argument (a numba-dpex array)."""
    model = context.data_model_manager[signature.args[0]]
    return builder.extract_value(args[0], model.get_field_position("data"))


@intrinsic
def _load16_by_word(typingctx, array, index):
    """array[index] of a 16-bit array, read as the aligned 32-bit word that holds it.
    For loads whose addresses are not consecutive across work-items (runtime strides:
    weights, bias, the state window) the OpenCL CPU compiler has no 16-bit gather and
    emitted 16 scalar loads and inserts per vector; a 32-bit gather is one instruction.
    The word never crosses the element's aligned 4 bytes (allocations are at least
    4-byte aligned), so it reads no other page or allocation granule; the other half is
    discarded."""
    def codegen(context, builder, signature, args):
        data = _data_pointer(context, builder, signature, args)
        addr = builder.add(builder.ptrtoint(data, _I64),
                           builder.shl(args[1], ir.Constant(_I64, 1)))
        word_ptr = builder.inttoptr(builder.and_(addr, ir.Constant(_I64, ~3)),
                                    _I32.as_pointer(data.type.addrspace))
        word = builder.load(word_ptr, align=4)
        shift = builder.trunc(builder.shl(builder.and_(addr, ir.Constant(_I64, 2)),
                                          ir.Constant(_I64, 3)), _I32)  # 0 or 16 bits
        return builder.trunc(builder.lshr(word, shift), _I16)
    return types.int16(array, types.uint64), codegen


@intrinsic
def _load_taps16(typingctx, array, index):
    """The four 16-bit elements array[index .. index + 3] as one int64 (little-endian:
    element k in bits 16k .. 16k + 15), read as one 64-bit word; &array[index] must be
    8-byte aligned (``_taps16_aligned``). For the taps of a width-4 weight in vLLM's
    (dim, width) layout: one 64-bit gather per channel instead of four 32-bit ones.
    Addressed by a GEP from the data pointer: the same load through ptrtoint/inttoptr
    arithmetic was miscompiled by the OpenCL CPU compiler (channels past the first 16
    read wrong taps at dim 2048)."""
    def codegen(context, builder, signature, args):
        data = _data_pointer(context, builder, signature, args)
        element = builder.gep(data, [args[1]], inbounds=True)  # &array[index]
        word = builder.bitcast(element, _I64.as_pointer(data.type.addrspace))
        return builder.load(word, align=8)
    return types.int64(array, types.uint64), codegen


@functools.lru_cache(maxsize=None)  # one intrinsic per group size
def _row_aligned(group):
    """Whether &array[index] is aligned to ``group`` elements: the condition of a
    ``_row_access`` read of that many, and with 4 of ``_load_taps16`` (16-bit elements,
    8 bytes). Checked on the address, not the offset: memory jitconv did not allocate
    can start anywhere (a view's own address)."""
    @intrinsic
    def aligned(typingctx, array, index):
        def codegen(context, builder, signature, args):
            data = _data_pointer(context, builder, signature, args)
            size = context.get_abi_sizeof(context.get_value_type(signature.args[0].dtype))
            addr = builder.ptrtoint(builder.gep(data, [args[1]], inbounds=True), _I64)
            mask = ir.Constant(_I64, group * size - 1)
            return builder.icmp_unsigned("==", builder.and_(addr, mask), ir.Constant(_I64, 0))
        return types.boolean(array, types.uint64), codegen
    return aligned


_taps16_aligned = _row_aligned(4)


@intrinsic
def _tap16(typingctx, word, k):
    """Element k (0..3) of a ``_load_taps16`` word, as int16."""
    def codegen(context, builder, signature, args):
        shift = builder.mul(args[1], ir.Constant(_I64, 16))
        return builder.trunc(builder.lshr(args[0], shift), _I16)
    return types.int16(types.int64, types.int64), codegen


def _row_access(group):
    """(load, store) of ``group`` (2 or 4) consecutive elements of a row of x or out as
    one integer access of group x element bits: the load returns a tuple of the raw
    elements, the store takes them. Lane i of a vector the OpenCL CPU compiler builds
    across work-items then reads group x its element size of contiguous memory (a whole
    64-byte cache line per 8-lane vector for 16-bit data and group 4) instead of one
    element. &array[index] must be aligned to the access (the host checks)."""

    def pointer(context, builder, signature, args):
        data = _data_pointer(context, builder, signature, args)
        bits = 8 * context.get_abi_sizeof(context.get_value_type(signature.args[0].dtype))
        element = builder.gep(data, [args[1]], inbounds=True)
        word = ir.IntType(bits * group)
        return builder.bitcast(element, word.as_pointer(data.type.addrspace)), word, bits

    @intrinsic
    def load(typingctx, array, index):
        def codegen(context, builder, signature, args):
            ptr, word, bits = pointer(context, builder, signature, args)
            value = builder.load(ptr, align=word.width // 8)
            kind = context.get_value_type(signature.args[0].dtype)
            parts = [builder.bitcast(builder.trunc(builder.lshr(value, ir.Constant(word, bits * k)),
                                                   ir.IntType(bits)), kind)
                     for k in range(group)]
            return context.make_tuple(builder, signature.return_type, parts)
        return types.UniTuple(array.dtype, group)(array, types.uint64), codegen

    def store_codegen(context, builder, signature, args):
        ptr, word, bits = pointer(context, builder, signature, args)
        value = ir.Constant(word, 0)
        for k, v in enumerate(args[2:]):
            part = builder.zext(builder.bitcast(v, ir.IntType(bits)), word)
            value = builder.or_(value, builder.shl(part, ir.Constant(word, bits * k)))
        builder.store(value, ptr, align=word.width // 8)
        return context.get_dummy_value()

    return load, bit_conversions.row_store(intrinsic, group, store_codegen)


# The wide kernels' row operations, as globals of the generated source (by group size).
_ROW_OPS = {}
for _group in sorted(set(WIDE_CHANNELS.values())):
    _ROW_OPS[f"load_row{_group}"], _ROW_OPS[f"store_row{_group}"] = _row_access(_group)
    _ROW_OPS[f"aligned_row{_group}"] = _row_aligned(_group)


@dpex.device_func
def _identity(v):
    return v


@dpex.device_func
def _element(array, index):
    return array[index]


def _converters(dtype_name):
    """(load, store, strided element read) for the dtype."""
    load, store = bit_conversions.CONVERSIONS[dtype_name]
    strided = _element if STORAGE[dtype_name] == np.float32 else _load16_by_word
    return ((_INTRINSICS[load] if load else _identity),
            (_INTRINSICS[store] if store else _identity), strided)


_window_value = dpex.device_func(window_value)


@functools.lru_cache(maxsize=None)
def planner_functions():
    """The device planner's functions (``kernels.planner``) as numba-dpex device functions:
    copies whose globals name each other's device versions. The planner kernel calls
    ``plan_slot``, a fused conv kernel ``slot_record``."""
    namespace = dict(vars(planner))
    for name in ("_start_token", "_sequence", "slot_record", "plan_slot"):
        fn = getattr(planner, name)
        copy = pytypes.FunctionType(fn.__code__, namespace, name, fn.__defaults__)
        namespace[name] = dpex.device_func(copy)
    return namespace


def make_conv_kernel(width, dtype_name, fast=None, wide=False, fused=False, chains=False,
                     stage=False, **backend_options):
    """Build the mixed-batch causal-conv1d kernel for one (width, dtype) specialization;
    ``fast``: the fast silu (silu's exp is OpenCL's native_exp instead of math.exp);
    None: the dtype's default (``abi.fast_silu``); ``wide``: the wide kernel
    (``kernels.abi.WIDE_CHANNELS`` channels per work-item, launched over dim / that many
    work-items); ``backend_options``: as in ``kernel_source`` (only for same-run
    comparisons: jitconv builds the default flags, the only ones cached and shipped).

    The width shapes the source (scalar registers for the window and the taps); the
    storage conversions are globals of the generated function, so numba treats them as
    compile-time constants. Returns a numba-dpex kernel with the argument list
    ``kernels.abi.CONV_ARGS`` (then ``planner.RECORD_ARGS`` when ``fused``, or
    ``abi.STAGE_ARGS`` with ``stage``: the GDN stage's nd-range kernel).
    """
    if fast is None:
        fast = fast_silu(dtype_name)
    name, source = name_and_source(width, dtype_name, fast, wide, fused, chains, stage,
                                   **backend_options)
    variant = "".join(f" {key}={value}" for key, value in sorted(backend_options.items()))
    filename = f"<jitconv kernel {name}{variant}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    load, store, strided = _converters(dtype_name)
    namespace = {
        "U": np.uint64, "fdiv": _fdiv, "exp": _native_exp if fast else math.exp,
        "load": load, "store": store, "strided": strided, "element": _element,
        "load_taps16": _load_taps16, "taps16_aligned": _taps16_aligned, "tap16": _tap16,
        "_window_value": _window_value,
        **_ROW_OPS,
        "ZERO": STORAGE[dtype_name](0), "F32_ZERO": np.float32(0.0), "ONE": np.float32(1.0),
        "FLAG_INITIAL_STATE": FLAG_INITIAL_STATE, "FLAG_SPEC": FLAG_SPEC,
        "FLAG_BLOCK_ROWS": FLAG_BLOCK_ROWS, "FLAG_SEQ_ROWS": FLAG_SEQ_ROWS,
        "FLAG_UNCOVERED": FLAG_UNCOVERED, "FLAG_CHAIN": FLAG_CHAIN, "FLAG_TREE": FLAG_TREE,
        "FLAG_LINES": FLAG_LINES, "FLAG_RING": FLAG_RING,
        "SPLIT_PARTS": SPLIT_PARTS,
    }
    if fused:
        namespace["slot_record"] = planner_functions()["slot_record"]
    if stage:
        namespace.update(gexp=math.exp, log1p=math.log1p, sqrt=math.sqrt,
                         L2NORM_EPS=np.float32(STAGE_L2NORM_EPS),
                         SOFTPLUS_THRESHOLD=np.float32(STAGE_SOFTPLUS_THRESHOLD),
                         group_barrier=group_barrier, MemoryScope=MemoryScope)
    exec(compile(source, filename, "exec"), namespace)
    return dpex.kernel(namespace[name])
