"""The torch bridge: tensors in, tensors out, zero-copy where the memory allows it.

How an argument reaches a kernel (``to_device``):
- torch XPU tensor: DLPack (kDLOneAPI) into dpctl, zero-copy. float16/bfloat16 are viewed
  as int16 first: dpctl refuses kDLBfloat, and the kernels read raw 16-bit patterns anyway.
- torch CPU tensor whose memory is USM of the device's context (``jitconv.empty`` /
  ``jitconv.zeros`` make such tensors): passed by pointer, zero-copy.
- any other torch CPU tensor: copied into USM memory, and copied back afterwards when the
  argument is updated in place (conv_state, out). Copies are counted (``copy_counts``);
  ``set_allow_copies(False)`` (or JITCONV_ALLOW_COPIES=0) turns a needed copy into a
  ``CopyRequiredError``.
- dpctl usm_ndarray, dpnp array, or any object exporting a kDLOneAPI DLPack capsule:
  zero-copy.

A kernel receives a ``DeviceView``: the dpctl memory object of the allocation, the view's
element offset, shape, strides (in elements) and itemsize. Memory objects are reused (the
allocation's own, or looked up in a registry of jitconv.empty allocations): making one for
an arbitrary pointer is a SYCL pointer query that costs ~40 us on opencl:cpu. Kernels do
not care about the element type beyond its size: the dtype each op expects is checked by
the op before launch.
"""

import bisect
import os
import threading
import weakref
from typing import NamedTuple

import numpy as np
import torch

from . import device as devices

import dpctl.memory as dpm  # noqa: E402  (devices bootstraps the runtime first)
import dpctl.tensor as dpt  # noqa: E402

KDL_ONEAPI = 14  # DLPack device type of SYCL USM memory

DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16",
               torch.bfloat16: "bfloat16", torch.int32: "int32", torch.int64: "int64",
               torch.bool: "bool", torch.int16: "int16", torch.uint8: "uint8",
               torch.int8: "int8", torch.float64: "float64"}
_TORCH_DTYPES = {v: k for k, v in DTYPE_NAMES.items()}
_SIXTEEN_BIT = (torch.float16, torch.bfloat16)

_counts = {"to_device": 0, "from_device": 0}
_allow_copies = os.environ.get("JITCONV_ALLOW_COPIES", "1") != "0"


class CopyRequiredError(RuntimeError):
    """A tensor had to be copied to reach the device, and copies are switched off."""


def copy_counts():
    """How many tensors were copied host->device and device->host so far."""
    return dict(_counts)


def reset_copy_counts():
    _counts["to_device"] = 0
    _counts["from_device"] = 0


def set_allow_copies(allow):
    """Allow (default) or forbid the host<->device copies of non-USM CPU tensors."""
    global _allow_copies
    _allow_copies = bool(allow)


class DeviceView(NamedTuple):
    """What a kernel gets for one array: the dpctl memory object of the whole allocation
    (what SyclQueue.submit takes) and the view's element offset, shape and strides."""
    memory: object  # dpctl USM memory object of the allocation
    offset: int     # in elements, from memory's start
    shape: tuple
    strides: tuple  # in elements
    itemsize: int
    owner: object   # keeps the memory alive while the view is in use

    @property
    def address(self):
        return self.memory._pointer + self.offset * self.itemsize


def dtype_name(t):
    """'float32', 'float16', 'bfloat16', ... for a torch tensor, dpctl or dpnp array."""
    if isinstance(t, torch.Tensor):
        return DTYPE_NAMES.get(t.dtype, str(t.dtype))
    return np.dtype(t.dtype).name


def device_of(t):
    """Where an argument lives: 'cpu', 'xpu:N', or the dpctl filter string of its queue."""
    if isinstance(t, torch.Tensor):
        return str(t.device)
    usm = _as_usm_ndarray(t)
    return usm.sycl_device.filter_string if usm is not None else type(t).__name__


class _SharedAllocation(dpm.MemoryUSMShared):
    """USM shared memory that can be weakly referenced (a Python subclass), so the
    registry below forgets it when the last tensor using it is gone."""


_alloc_bases = []   # sorted base addresses of live _SharedAllocations
_alloc_info = {}    # base address -> (weakref to the allocation, nbytes)


def _register(memory):
    base = memory._pointer
    bisect.insort(_alloc_bases, base)
    _alloc_info[base] = (weakref.ref(memory), memory.nbytes)
    weakref.finalize(memory, _unregister, base)


def _unregister(base):
    _alloc_info.pop(base, None)
    i = bisect.bisect_left(_alloc_bases, base)
    if i < len(_alloc_bases) and _alloc_bases[i] == base:
        del _alloc_bases[i]


def _find_allocation(address):
    """(memory, byte offset) of the jitconv.empty allocation holding ``address``, or None.
    A lookup, not a SYCL pointer query (those cost ~40 us each on opencl:cpu)."""
    i = bisect.bisect_right(_alloc_bases, address) - 1
    if i < 0:
        return None
    base = _alloc_bases[i]
    ref, nbytes = _alloc_info[base]
    memory = ref()
    if memory is None or address >= base + nbytes:
        return None
    return memory, address - base


class _Pointer:
    """A raw USM address in the form dpctl.memory accepts (no dtype, no shape)."""

    __slots__ = ("__sycl_usm_array_interface__",)

    def __init__(self, address, nbytes, queue):
        self.__sycl_usm_array_interface__ = {
            "data": (address, False), "shape": (max(int(nbytes), 1),), "strides": None,
            "typestr": "|u1", "version": 1, "syclobj": queue,
        }


def _query_usm(address, queue):
    """A dpctl memory object at ``address`` if it is USM of the queue's context, else None
    (the slow path, for USM memory jitconv did not allocate)."""
    try:
        return dpm.as_usm_memory(_Pointer(address, 1, queue))
    except ValueError:
        return None


def is_usm(address, queue=None):
    """True if ``address`` is USM memory of the queue's context (host-accessible or not)."""
    queue = queue or devices.get_queue()
    return _find_allocation(address) is not None or _query_usm(address, queue) is not None


def _as_usm_ndarray(obj):
    if isinstance(obj, dpt.usm_ndarray):
        return obj
    if hasattr(obj, "get_array") and type(obj).__module__.startswith("dpnp"):
        return obj.get_array()
    return None


def _view_of_usm_ndarray(a):
    iface = a.__sycl_usm_array_interface__
    itemsize = a.itemsize
    memory = a.usm_data
    start = iface["data"][0] - memory._pointer + iface.get("offset", 0) * itemsize
    return DeviceView(memory, start // itemsize, tuple(a.shape), tuple(a.strides),
                      itemsize, a)


def from_dlpack_oneapi(obj):
    """Import an object exporting a kDLOneAPI DLPack capsule as a dpctl usm_ndarray."""
    return dpt.from_dlpack(obj)


def normalize(t, name):
    """Arguments as torch tensors, dpnp arrays or dpctl usm_ndarrays (what the ops and the
    validation understand); any other kDLOneAPI DLPack producer is imported zero-copy."""
    if t is None or isinstance(t, torch.Tensor) or _as_usm_ndarray(t) is not None:
        return t
    if hasattr(t, "__dlpack_device__") and t.__dlpack_device__()[0] == KDL_ONEAPI:
        return from_dlpack_oneapi(t)
    raise TypeError(f"{name}: expected a torch tensor, dpnp array, dpctl usm_ndarray or a "
                    f"oneAPI DLPack producer, got {type(t).__name__}")


def _torch_xpu_to_usm(t):
    if t.dtype in _SIXTEEN_BIT:
        t = t.view(torch.int16)  # dpctl rejects kDLBfloat; kernels read raw bits
    return from_dlpack_oneapi(t)


def to_device(t, name, writable=False, queue=None):
    """A DeviceView of ``t`` on the queue, plus a write-back callable (or None).

    The write-back must be called after the kernel finished when the argument was
    updated in place and had to be copied.
    """
    queue = queue or devices.get_queue()
    usm = _as_usm_ndarray(t)
    if usm is not None:
        return _view_of_usm_ndarray(usm), None
    if isinstance(t, torch.Tensor):
        if t.device.type == "xpu":
            return _view_of_usm_ndarray(_torch_xpu_to_usm(t)), None
        if t.device.type != "cpu":
            raise TypeError(f"{name}: tensors on {t.device} are not supported "
                            f"(expected an XPU tensor, or a CPU tensor)")
        if t.numel() == 0:  # nothing is read or written: any valid memory will do
            return DeviceView(_placeholder(queue), 0, tuple(t.shape), tuple(t.stride()),
                              t.element_size(), t), None
        found = _find_allocation(t.data_ptr())
        if found is None:
            memory = _query_usm(t.data_ptr(), queue)
            found = None if memory is None else (memory, 0)
        if found is None:
            return _copy_in(t, name, writable, queue)
        memory, byte_offset = found
        return DeviceView(memory, byte_offset // t.element_size(), tuple(t.shape),
                          tuple(t.stride()), t.element_size(), t), None
    return _view_of_usm_ndarray(normalize(t, name)), None


def _host_numpy(t):
    t = t.detach()
    if t.dtype in _SIXTEEN_BIT:
        t = t.view(torch.int16)
    return t.contiguous().numpy()


def _copy_in(t, name, writable, queue):
    if not _allow_copies:
        raise CopyRequiredError(
            f"{name}: this CPU tensor is not in USM memory, so it would be copied to the "
            f"device; allocate it with jitconv.empty/jitconv.zeros, or allow copies with "
            f"jitconv.set_allow_copies(True)")
    arr = dpt.asarray(_host_numpy(t), device=queue)
    _counts["to_device"] += 1
    view = _view_of_usm_ndarray(arr)
    if not writable:
        return view, None

    def write_back():
        host = torch.from_numpy(dpt.asnumpy(arr))
        if t.dtype in _SIXTEEN_BIT:
            host = host.view(t.dtype)
        t.copy_(host)
        _counts["from_device"] += 1

    return view, write_back


class _Pool:
    """Freed jitconv.empty allocations, kept for reuse by size (like torch's caching
    allocator). A fresh USM allocation costs a system call and then a page fault per page
    on first touch: for a 128 MiB prefill output that was 3x the kernel's own time on
    opencl:cpu. At most ``limit`` bytes are kept; beyond that memory is really freed."""

    def __init__(self, limit=1 << 30):
        self.limit, self.kept, self.free = limit, 0, {}
        self.lock = threading.Lock()

    def take(self, device, nbytes):
        with self.lock:
            spare = self.free.get((device, nbytes))
            if spare:
                self.kept -= nbytes
                return spare.pop()
        memory = _SharedAllocation(nbytes, queue=devices.get_queue(device))
        _register(memory)
        return memory

    def give(self, device, memory):
        with self.lock:
            if self.kept + memory.nbytes <= self.limit:
                self.free.setdefault((device, memory.nbytes), []).append(memory)
                self.kept += memory.nbytes


_pool = _Pool()


def empty(shape, dtype=torch.float32, device=None):
    """A torch CPU tensor in USM shared memory of ``device``: kernels use it with no copy.

    Works on any SYCL device (shared USM is host- and device-accessible); on an Intel GPU
    prefer torch XPU tensors, which live in device memory. Memory is recycled through a
    pool once no tensor uses it any more.
    """
    if isinstance(shape, int):
        shape = (shape,)
    shape = tuple(int(s) for s in shape)
    dtype = _TORCH_DTYPES.get(dtype, dtype) if isinstance(dtype, str) else dtype
    itemsize = torch.empty((), dtype=dtype).element_size()
    used = int(np.prod(shape, dtype=np.int64)) * itemsize
    device = device or devices.get_device()
    memory = _pool.take(device, max(used, 1))
    # The numpy array holds `memory` while any tensor built on it lives; when the last one
    # goes, the array dies and the memory returns to the pool.
    host = np.frombuffer(memory, dtype=np.uint8)
    weakref.finalize(host, _pool.give, device, memory)
    return torch.from_numpy(host)[:used].view(dtype).view(shape)


def zeros(shape, dtype=torch.float32, device=None):
    """Like ``empty``, filled with zeros."""
    t = empty(shape, dtype, device)
    t.zero_()
    return t


def empty_like_output(x, shape, dtype_str):
    """A new output tensor of the same kind (torch CPU/XPU, dpnp, dpctl) as ``x``."""
    if isinstance(x, torch.Tensor):
        if x.device.type == "xpu":
            return torch.empty(shape, dtype=x.dtype, device=x.device)
        return empty(shape, x.dtype)
    usm = _as_usm_ndarray(x)
    if usm is not None:
        out = dpt.empty(shape, dtype=usm.dtype, sycl_queue=usm.sycl_queue)
        if usm is not x:  # dpnp in, dpnp out
            import dpnp
            return dpnp.asarray(out)
        return out
    return empty(shape, _TORCH_DTYPES[dtype_str])


def _strides(t):
    if isinstance(t, torch.Tensor):
        return t.stride()
    return _as_usm_ndarray(t).strides


def has_unit_channel_stride(t):
    """True if the last dimension is contiguous (or has a single element)."""
    return t.shape[-1] <= 1 or _strides(t)[-1] == 1


def channels_contiguous(t):
    """``t`` itself if its channels (last dimension) are contiguous, else a copy that is."""
    if has_unit_channel_stride(t):
        return t
    if isinstance(t, torch.Tensor):
        return t.contiguous()
    return dpt.copy(_as_usm_ndarray(t), order="C")


def upload_tables(host_arrays, queue):
    """Copy int32 tables into a new USM shared allocation of the queue's context (a plan
    owns it and never writes it again). Returns (DeviceView of it, element offsets)."""
    sizes = [len(a) for a in host_arrays]
    memory = dpm.MemoryUSMShared(4 * max(sum(sizes), 1), queue=queue)
    array = np.frombuffer(memory, dtype=np.int32)
    offsets, start = [], 0
    for a, n in zip(host_arrays, sizes):
        array[start:start + n] = a
        offsets.append(start)
        start += n
    return DeviceView(memory, 0, (max(start, 1),), (1,), 4, memory), offsets


_placeholders = {}  # queue's context -> a small allocation that no kernel reads


def _placeholder(queue):
    """Valid USM memory for an argument with no elements (the kernel never reads it)."""
    memory = _placeholders.get(queue.sycl_context)
    if memory is None:
        memory = _placeholders.setdefault(queue.sycl_context,
                                          dpm.MemoryUSMShared(64, queue=queue))
    return memory


def normalize_all(x, weight, bias, conv_state, out):
    """``normalize`` for the five tensor arguments of the ops, in that order."""
    return [normalize(t, n) for t, n in zip((x, weight, bias, conv_state, out),
                                            ("x", "weight", "bias", "conv_state", "out"))]


def same_memory(a, b):
    """True if two arguments share an allocation (then writing one may change the other)."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    ua, ub = _as_usm_ndarray(a), _as_usm_ndarray(b)
    if ua is not None and ub is not None:
        return ua.usm_data._pointer == ub.usm_data._pointer
    return False
