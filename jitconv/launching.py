"""Compile, cache and submit kernels.

numba-dpex compiles each kernel specialization once to SPIR-V (kept on disk by
``kernel_cache``); dpctl builds that SPIR-V into a SYCL kernel for the device, and every
launch is a plain ``SyclQueue.submit``. This avoids numba-dpex's per-call dispatch (~215 us
per call on opencl:cpu, against ~20 us for a submit) and compiles one specialization per
(width, dtype) instead of one per combination of argument layouts: the argument types are
fixed by ``kernel_abi.CONV_ARGS`` (flat arrays with explicit strides), so contiguous and
strided tensors share one kernel. With a warm cache numba and numba-dpex are never
imported.

A numba-dpex array argument is flattened into five kernel parameters (its device data
model): nitems (int64), itemsize (int64), data pointer, shape[ndim] (int64) and
strides[ndim] (int64, in bytes). ``_flatten`` builds exactly that list.
"""

import ctypes
import threading
import warnings

import numpy as np

from . import kernel_cache
from .kernel_abi import CONV_ARGS, STORAGE
from . import device as devices

_lock = threading.Lock()
_built = {}  # (device filter, width, dtype name) -> dpctl.program.SyclKernel
_numba_ready = False
stats = {"compiled": 0, "built": 0, "cache_hits": 0, "submitted": 0}


def _prepare_numba_dpex():
    """numba-dpex installs its kernel typing/lowering registries on the first call_kernel.

    Compiling a dispatcher directly (which we do, to get SPIR-V for an explicit signature)
    fails before that with "No definition for lowering static_getitem(UniTuple...)". One
    launch of a trivial kernel on the first compile initialises them.
    """
    global _numba_ready
    if _numba_ready:
        return
    import dpctl.tensor as dpt
    import numba_dpex as dpex

    @dpex.kernel
    def _warmup(item, a):
        a[item.get_id(0)] = a.shape[0]

    a = dpt.zeros(1, dtype="i8", device=devices.get_queue())
    dpex.call_kernel(_warmup, dpex.Range(1), a)
    _numba_ready = True


def _signature(width, dtype_name, queue):
    from numba import types
    from numba_dpex.core.types import DpctlSyclQueue, USMNdArray
    from numba_dpex.core.types.kernel_api.index_space_ids import ItemType

    ntype = {"raw": getattr(types, np.dtype(STORAGE[dtype_name]).name),
             "int32": types.int32, "int64": types.int64}
    qtype = DpctlSyclQueue(queue)
    args = [ItemType(2)]
    for _name, ndim, elem, layout in CONV_ARGS:
        if ndim == 0:
            args.append(ntype[elem])
        else:
            args.append(USMNdArray(ndim, layout=layout, dtype=ntype[elem], queue=qtype))
    return types.void(*args)


def compile_spirv(width, dtype_name, queue):
    """SPIR-V bytes and kernel name of one specialization, compiled by numba-dpex."""
    from numba.core.target_extension import target_override

    from .kernels import make_conv_kernel

    _prepare_numba_dpex()
    dispatcher = make_conv_kernel(width, dtype_name)
    with target_override("dpex"):
        result = dispatcher.get_compile_result(_signature(width, dtype_name, queue))
    stats["compiled"] += 1
    module = result.kernel_device_ir_module
    return module.kernel_bitcode, module.kernel_name


class KernelUnavailableError(RuntimeError):
    """No usable SPIR-V for a specialization, and numba-dpex is not there to compile it."""


def have_compiler():
    import importlib.util
    return importlib.util.find_spec("numba_dpex") is not None


def _program(queue, spirv, name):
    import dpctl.program as dpp
    kernel = dpp.create_program_from_spirv(queue, spirv).get_sycl_kernel(name)
    stats["built"] += 1
    return kernel


def _build(width, dtype_name, device):
    """Disk cache first (no numba-dpex import at all), else compile and store."""
    queue = devices.get_queue(device)
    entry = kernel_cache.load(width, dtype_name)
    if entry is not None:
        spirv, name, path = entry
        try:
            kernel = _program(queue, spirv, name)
            stats["cache_hits"] += 1
            return kernel
        except Exception as exc:  # dpctl could not build it for this device
            kernel_cache.rejected.append((str(path), f"build failed: {exc}"))
            warnings.warn(f"jitconv: ignoring the {kernel_cache.origin(path)} kernel "
                          f"{path}: the device rejected it ({exc})", RuntimeWarning)
    if not have_compiler():
        raise KernelUnavailableError(
            f"no usable prebuilt kernel for width={width}, dtype={dtype_name} in "
            f"{[str(d) for d in kernel_cache.search_dirs()]} and numba-dpex is not "
            f"installed to compile one; run `python -m jitconv build-kernels` where "
            f"numba-dpex is installed and point JITCONV_CACHE_DIR at the result"
            + (f" (ignored: {kernel_cache.rejected})" if kernel_cache.rejected else ""))
    kernel, _path = compile_and_store(width, dtype_name, queue, required=False)
    return kernel


_warned_dirs = set()  # unwritable cache directories already reported in this process


def compile_and_store(width, dtype_name, queue, directory=None, required=True):
    """Compile with numba-dpex, build (only what builds is stored), store the SPIR-V.
    Returns (kernel, path of the stored SPIR-V). With ``required=False`` a cache that
    cannot be written (read-only, no home directory) costs a warning, once per
    directory, and the kernel is still returned (path None): compiled once, not cached."""
    spirv, name = compile_spirv(width, dtype_name, queue)
    kernel = _program(queue, spirv, name)
    try:
        return kernel, kernel_cache.store(width, dtype_name, spirv, name, directory)
    except OSError as exc:
        if required:
            raise
        where = str(directory or kernel_cache.cache_dir())
        kernel_cache.rejected.append((where, f"not writable: {exc}"))
        if where not in _warned_dirs:
            _warned_dirs.add(where)
            warnings.warn(
                f"jitconv: cannot write the kernel cache {where} ({exc}); kernels are "
                f"compiled in every new process until it is writable. Set "
                f"JITCONV_CACHE_DIR to a writable directory.", RuntimeWarning, stacklevel=2)
        return kernel, None


def get_conv_kernel(width, dtype_name, device=None):
    """The built SYCL kernel for (device, width, dtype): from this process's table, the
    disk cache, or a fresh numba-dpex compile, in that order."""
    device = device or devices.get_device()
    key = (device, width, dtype_name)
    kernel = _built.get(key)
    if kernel is None:
        with _lock:
            kernel = _built.get(key)
            if kernel is None:
                kernel = _built[key] = _build(width, dtype_name, device)
    return kernel


def _flatten(view):
    """One array argument as the kernel's parameters (see the module docstring)."""
    nitems = 1
    for n in view.shape:
        nitems *= n
    flat = [ctypes.c_int64(nitems), ctypes.c_int64(view.itemsize), view.memory]
    flat += [ctypes.c_int64(n) for n in view.shape]
    flat += [ctypes.c_int64(s * view.itemsize) for s in view.strides]
    return flat


def launch_conv(width, dtype_name, args, num_blocks, dim, device=None):
    """Submit the conv kernel over (num_blocks, dim) work-items and wait for it.

    ``args`` maps the names of CONV_ARGS to ``bridge.DeviceView``s (ints for scalars), all
    in memory of the queue of ``device``.
    """
    if num_blocks == 0 or dim == 0:
        return
    device = device or devices.get_device()
    queue = devices.get_queue(device)
    kernel = get_conv_kernel(width, dtype_name, device)
    flat = []
    for name, ndim, _elem, _layout in CONV_ARGS:
        value = args[name]
        flat += [ctypes.c_int64(int(value))] if ndim == 0 else _flatten(value)
    # SYCL order (slowest first): the kernel's get_id(0) is the last, fastest dimension.
    queue.submit(kernel, flat, [int(num_blocks), int(dim)]).wait()
    stats["submitted"] += 1
