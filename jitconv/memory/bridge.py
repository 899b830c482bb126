"""The torch bridge: tensors in, tensors out, zero-copy where the memory allows it.

How an argument reaches a kernel (``to_device``):
- torch XPU tensor: its DLPack capsule (kDLOneAPI) is read by ``jitconv.memory.dlpack``,
  zero-copy. float16/bfloat16 are viewed as int16 first: the kernels read raw 16-bit
  patterns anyway.
- torch CPU tensor whose memory is USM of the device's context (``jitconv.empty`` /
  ``jitconv.zeros`` make such tensors): passed by pointer, zero-copy.
- any other torch CPU tensor: copied into USM device memory (dpctl.memory +
  ``SyclQueue.memcpy``), and copied back afterwards when the argument is updated in place
  (conv_state, out). Copies are counted (``copy_counts``); ``set_allow_copies(False)`` (or
  JITCONV_ALLOW_COPIES=0) turns a needed copy into a ``CopyRequiredError``.
- dpctl usm_ndarray, dpnp array, any object with ``__sycl_usm_array_interface__``, or any
  object exporting a kDLOneAPI DLPack capsule: zero-copy. They are recognised by those
  attributes, never by importing dpnp or dpctl.tensor (dpctl 0.22 has no dpctl.tensor).

Only ``dpctl.memory`` and ``SyclQueue`` are used here: what every dpctl from 0.17 to 0.22
has. ``normalize`` turns every non-torch argument into a ``UsmArray`` (address, shape,
strides, dtype, device), which is what validation and the launch read.

A kernel receives a ``DeviceView``: the dpctl memory object of the allocation, the view's
element offset, shape, strides (in elements) and itemsize. Memory objects are reused (the
allocation's own, or looked up in ``usm``'s registry of jitconv.empty allocations): making one for
an arbitrary pointer is a SYCL pointer query that costs ~40 us on opencl:cpu. Kernels do
not care about the element type beyond its size: the dtype each op expects is checked by
the op before launch.
"""

import os
import sys
from typing import NamedTuple

import numpy as np
import torch

from jitconv import device as devices
from jitconv.memory import dlpack
from jitconv.memory import usm
from jitconv.backends.sycl.devices import name_of

try:
    import dpctl  # noqa: E402  (devices bootstraps the runtime first)
    import dpctl.memory as dpm  # noqa: E402
except ImportError:  # a CUDA-only install: torch CUDA tensors need none of this module's
    dpctl = dpm = None  # SYCL paths (cuda_backend)

KDL_ONEAPI = dlpack.KDL_ONEAPI

DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16",
               torch.bfloat16: "bfloat16", torch.int32: "int32", torch.int64: "int64",
               torch.bool: "bool", torch.int16: "int16", torch.uint8: "uint8",
               torch.int8: "int8", torch.float64: "float64"}
DTYPE_TORCH = {v: k for k, v in DTYPE_NAMES.items()}
_SIXTEEN_BIT = (torch.float16, torch.bfloat16)
_USM_CLASSES = ((dpm.MemoryUSMShared, dpm.MemoryUSMDevice, dpm.MemoryUSMHost)
                if dpm is not None else ())

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


class UsmArray:
    """A non-torch array in USM memory, as validation and the launch see it: a dpctl
    usm_ndarray, a dpnp array, any ``__sycl_usm_array_interface__`` object, or a tensor
    imported from a kDLOneAPI DLPack capsule. ``source`` is the caller's object (outputs
    are made of its kind); ``owner`` keeps the memory valid (the source, or the DLPack
    import whose deleter frees it)."""

    __slots__ = ("source", "owner", "address", "shape", "strides", "dtype", "itemsize",
                 "device", "allocation", "read_only", "copied")

    def __init__(self, source, owner, address, shape, strides, dtype, itemsize, device,
                 allocation=None, read_only=False, copied=False):
        self.source, self.owner, self.address = source, owner, address
        self.shape, self.strides = tuple(shape), tuple(strides)
        self.dtype, self.itemsize, self.device = dtype, itemsize, device
        self.allocation = allocation  # the allocation's dpctl memory object, if known
        self.read_only, self.copied = read_only, copied

    def stride(self):
        return self.strides

    def extent(self):
        """(first, last + 1) byte addresses the view touches."""
        if any(n == 0 for n in self.shape):
            return self.address, self.address
        span = sum((n - 1) * s for n, s in zip(self.shape, self.strides))
        return self.address, self.address + (span + 1) * self.itemsize


def dtype_name(t):
    """'float32', 'float16', 'bfloat16', ... for a torch tensor or a UsmArray."""
    if isinstance(t, torch.Tensor):
        return DTYPE_NAMES.get(t.dtype, str(t.dtype))
    if isinstance(t, UsmArray):
        return t.dtype
    return np.dtype(t.dtype).name


def device_of(t):
    """Where an argument lives: 'cpu', 'xpu:N', or the dpctl filter string of its device."""
    if isinstance(t, torch.Tensor):
        return str(t.device)
    if isinstance(t, UsmArray):
        return t.device or "a SYCL context"
    return type(t).__name__


_device_ids = {}  # SyclDevice -> DLPack device id; filter strings by DLPack device id


def dlpack_device_id(device):
    """The DLPack device id of a SyclDevice (kDLOneAPI ids index dpctl.get_devices();
    dpctl >= 0.18 computes it as get_device_id())."""
    found = _device_ids.get(device)
    if found is None:
        getter = getattr(device, "get_device_id", None)
        found = _device_ids[device] = getter() if getter else dpctl.get_devices().index(device)
    return found


_dlpack_devices = {}  # DLPack device id -> filter string (listing devices costs ~50 us)


def _filter_string_of_dlpack_id(device_id):
    found = _dlpack_devices.get(device_id)
    if found is None:
        listed = dpctl.get_devices()
        found = (listed[device_id].filter_string if 0 <= device_id < len(listed)
                 else f"oneAPI device {device_id}")
        _dlpack_devices[device_id] = found
    return found


def _c_strides(shape):
    """Row-major strides, in elements."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.insert(0, step)
        step *= max(int(n), 1)
    return tuple(strides)


class _Pointer:
    """A raw USM address in the form dpctl.memory accepts (no dtype, no shape). The
    memory object made from it references it, so ``owner`` lives as long as that."""

    __slots__ = ("__sycl_usm_array_interface__", "owner")

    def __init__(self, address, nbytes, queue, owner=None):
        self.__sycl_usm_array_interface__ = {
            "data": (address, False), "shape": (max(int(nbytes), 1),), "strides": None,
            "typestr": "|u1", "version": 1, "syclobj": queue,
        }
        self.owner = owner


def _query_usm(address, queue, nbytes=1, owner=None):
    """A dpctl memory object at ``address`` if it is USM of the queue's context, else None
    (the slow path, for USM memory jitconv did not allocate)."""
    try:
        return dpm.as_usm_memory(_Pointer(address, nbytes, queue, owner))
    except ValueError:
        return None


def is_usm(address, queue=None):
    """True if ``address`` is USM memory of the queue's context (host-accessible or not)."""
    queue = queue or devices.get_queue()
    return usm.find_allocation(address) is not None or _query_usm(address, queue) is not None


def _allocation_of(obj):
    """The dpctl memory object behind a dpctl / dpnp array, when it says (usm_data):
    saves a pointer query per call."""
    memory = getattr(obj, "usm_data", None)
    if memory is None and hasattr(obj, "get_array"):  # dpnp arrays wrap a usm_ndarray
        memory = getattr(obj.get_array(), "usm_data", None)
    return memory if isinstance(memory, _USM_CLASSES) else None


def _from_usm_interface(obj, name):
    iface = obj.__sycl_usm_array_interface__
    dt = np.dtype(iface["typestr"])
    shape = tuple(int(n) for n in iface["shape"])
    strides = iface.get("strides")
    if strides is None:
        strides = _c_strides(shape)
    syclobj = iface.get("syclobj")
    device = getattr(syclobj, "sycl_device", None)
    address = iface["data"][0] + int(iface.get("offset", 0) or 0) * dt.itemsize
    dtype = "bool" if dt == np.bool_ else dt.name
    # syclobj may also be a context (no device to name): the pointer query decides then
    return UsmArray(obj, obj, address, shape, strides, dtype, dt.itemsize,
                    name_of(device) if device is not None else None,
                    allocation=_allocation_of(obj), read_only=bool(iface["data"][1]))


def _from_dlpack(obj, name, source=None):
    try:
        t = dlpack.import_tensor(obj)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{name}: {exc}") from exc
    kind, device_id = t.device
    if kind != KDL_ONEAPI:
        raise TypeError(f"{name}: the DLPack tensor is on device type {kind}, expected "
                        f"kDLOneAPI ({KDL_ONEAPI}: SYCL USM memory)")
    return UsmArray(obj if source is None else source, t, t.address, t.shape, t.strides,
                    t.dtype, t.itemsize, _filter_string_of_dlpack_id(device_id),
                    read_only=t.read_only, copied=t.copied)


def is_device_array(t):
    """A non-torch array jitconv can take zero-copy (USM interface or kDLOneAPI DLPack)."""
    if isinstance(t, UsmArray) or hasattr(t, "__sycl_usm_array_interface__"):
        return True
    try:
        return hasattr(t, "__dlpack__") and t.__dlpack_device__()[0] == KDL_ONEAPI
    except (AttributeError, TypeError, ValueError):
        return False


def normalize(t, name):
    """torch tensors as they are; every other array (dpctl, dpnp, any USM-interface or
    kDLOneAPI DLPack producer) as a ``UsmArray``, zero-copy."""
    if t is None or isinstance(t, (torch.Tensor, UsmArray)):
        return t
    if hasattr(t, "__sycl_usm_array_interface__"):
        arr = _from_usm_interface(t, name)
    elif is_device_array(t):
        arr = _from_dlpack(t, name)
    else:
        raise TypeError(f"{name}: expected a torch tensor, dpnp array, dpctl usm_ndarray or"
                        f" a oneAPI DLPack producer, got {type(t).__name__}")
    if any(s < 0 for s in arr.strides):
        raise ValueError(f"{name}: negative strides are not supported, got {arr.strides}")
    return arr


_queue_devices = {}  # SyclQueue -> filter string of its device


def _queue_device(queue):
    found = _queue_devices.get(queue)
    if found is None:
        found = _queue_devices[queue] = name_of(queue.sycl_device)
    return found


def _view_of_usm_array(arr, name, writable, queue):
    if arr.read_only and writable:
        raise ValueError(f"{name}: the array is read-only, but it is updated in place")
    if arr.copied and writable:
        raise ValueError(f"{name}: the DLPack producer exported a copy, so the in-place "
                         f"update would not reach the caller's tensor")
    where = _queue_device(queue)
    if arr.device is not None and arr.device != where:
        raise ValueError(f"{name}: the array is on {arr.device}, but jitconv runs on "
                         f"{where} (jitconv.set_device)")
    if any(n == 0 for n in arr.shape):  # nothing is read or written (address may be 0)
        return DeviceView(usm.placeholder(queue), 0, arr.shape, arr.strides, arr.itemsize,
                          arr.owner)
    memory, byte_offset = arr.allocation, None
    if memory is not None and memory.sycl_context == queue.sycl_context:
        byte_offset = arr.address - memory._pointer
    else:
        found = usm.find_allocation(arr.address)
        if found is None:
            lo, hi = arr.extent()
            memory = _query_usm(arr.address, queue, hi - lo, owner=arr.owner)
            found = None if memory is None else (memory, 0)
        if found is None:
            raise ValueError(f"{name}: its memory (address {arr.address:#x}) is not USM "
                             f"memory of {where}'s SYCL context")
        memory, byte_offset = found
    return DeviceView(memory, byte_offset // arr.itemsize, arr.shape, arr.strides,
                      arr.itemsize, arr.owner)


def to_device(t, name, writable=False, queue=None, written=None):
    """A DeviceView of ``t`` on the queue, plus a write-back callable (or None).

    The write-back must be called after the kernel finished when the argument was
    updated in place and had to be copied. ``written``: indices along dimension 0 that
    the kernel may write (the call's cache lines); only those are copied back, so calls
    from other threads updating other lines of the same tensor are not overwritten.
    """
    queue = queue or devices.get_queue()
    if isinstance(t, torch.Tensor):
        if t.device.type == "xpu":
            # dpctl rejected kDLBfloat; the kernels read raw bits anyway
            bits = t.view(torch.int16) if t.dtype in _SIXTEEN_BIT else t
            return _view_of_usm_array(_from_dlpack(bits, name, source=t), name, writable,
                                      queue), None
        if t.device.type != "cpu":
            raise TypeError(f"{name}: tensors on {t.device} are not supported "
                            f"(expected an XPU tensor, or a CPU tensor)")
        if t.numel() == 0:  # nothing is read or written: any valid memory will do
            return DeviceView(usm.placeholder(queue), 0, tuple(t.shape), tuple(t.stride()),
                              t.element_size(), t), None
        found = usm.find_allocation(t.data_ptr())
        if found is None:
            memory = _query_usm(t.data_ptr(), queue)
            found = None if memory is None else (memory, 0)
        if found is None:
            return _copy_in(t, name, writable, queue, written)
        memory, byte_offset = found
        return DeviceView(memory, byte_offset // t.element_size(), tuple(t.shape),
                          tuple(t.stride()), t.element_size(), t), None
    return _view_of_usm_array(normalize(t, name), name, writable, queue), None


def _host_numpy(t):
    t = t.detach()
    if t.dtype in _SIXTEEN_BIT:
        t = t.view(torch.int16)
    return t.contiguous().numpy()


def is_copy(view):
    """Whether ``to_device`` made ``view`` by copying its argument (``_copy_in``: such a
    view owns its own new memory; a zero-copy view is owned by its source)."""
    return view.owner is view.memory


def _copy_in(t, name, writable, queue, written=None):
    """Copy a plain CPU tensor into USM device memory with SyclQueue.memcpy (dpctl.memory
    only: dpctl.tensor's asarray/asnumpy abort or deadlock from several threads in
    dpctl 0.17, and dpctl 0.22 has no dpctl.tensor)."""
    if not _allow_copies:
        raise CopyRequiredError(
            f"{name}: this CPU tensor is not in USM memory, so it would be copied to the "
            f"device; allocate it with jitconv.empty/jitconv.zeros, or allow copies with "
            f"jitconv.set_allow_copies(True)")
    host = _host_numpy(t)
    nbytes = max(host.nbytes, 1)
    memory = dpm.MemoryUSMDevice(nbytes, queue=queue)
    if host.nbytes:
        queue.memcpy(memory, host.reshape(-1).view(np.uint8), host.nbytes)
    _counts["to_device"] += 1
    view = DeviceView(memory, 0, tuple(host.shape), _c_strides(host.shape), host.itemsize,
                      memory)
    if not writable:
        return view, None

    def write_back():
        back = np.empty_like(host)
        if back.nbytes:
            queue.memcpy(back.reshape(-1).view(np.uint8), memory, back.nbytes)
        result = torch.from_numpy(back)
        if t.dtype in _SIXTEEN_BIT:
            result = result.view(t.dtype)
        if written is None:
            t.copy_(result)
        else:  # line by line: also right for views whose lines share memory (expand)
            for line in written:
                t[line].copy_(result[line])
        _counts["from_device"] += 1

    return view, write_back


def host_array(t, name):
    """A non-torch device array (USM interface or kDLOneAPI DLPack) copied to a numpy
    array (metadata such as query_start_loc passed as dpnp/dpctl arrays)."""
    arr = normalize(t, name)
    if arr.dtype not in ("bool",) and not arr.dtype.startswith(("int", "uint", "float")):
        raise TypeError(f"{name}: dtype {arr.dtype} cannot be read on the host")
    dt = np.dtype(np.bool_ if arr.dtype == "bool" else arr.dtype)
    lo, hi = arr.extent()
    raw = np.empty(hi - lo, np.uint8)
    if hi > lo:
        queue = devices.get_queue()
        memory = _query_usm(lo, queue, hi - lo, owner=arr.owner)
        if memory is None:
            raise ValueError(f"{name}: its memory is not USM memory of "
                             f"{_queue_device(queue)}'s SYCL context")
        queue.memcpy(raw, memory, hi - lo)
    return np.ndarray(arr.shape, dt, raw, 0, [s * dt.itemsize for s in arr.strides]).copy()


def _namespace(source):
    """The module that makes arrays of ``source``'s kind (dpctl.tensor for a usm_ndarray,
    dpnp for a dpnp array), or None. Never imported here: a caller holding such an array
    has imported it already."""
    if not hasattr(source, "__sycl_usm_array_interface__"):
        return None
    if hasattr(source, "__array_namespace__"):
        return source.__array_namespace__()
    return sys.modules.get(type(source).__module__.partition(".")[0])


def empty_like_output(x, shape, dtype_str):
    """A new output tensor of the same kind as ``x``: torch XPU / CUDA -> the same device,
    torch CPU -> ``jitconv.empty`` (a torch CUDA-simulator tensor when the current device
    is "cuda:N"), dpctl / dpnp -> an array of that library on x's device (made by
    its own module, found from x). Other DLPack producers get a ``jitconv.empty`` torch
    tensor: USM shared memory of the device, usable on the host and by kernels."""
    if isinstance(x, torch.Tensor):
        if x.device.type in ("xpu", "cuda"):  # torch's own device memory
            return torch.empty(shape, dtype=x.dtype, device=x.device)
        return usm.empty(shape, x.dtype)
    source = x.source if isinstance(x, UsmArray) else x
    xp = _namespace(source)
    if xp is not None and hasattr(xp, "empty") and hasattr(source, "device"):
        return xp.empty(shape, dtype=source.dtype, device=source.device)
    return usm.empty(shape, DTYPE_TORCH[dtype_str])


def address_of(t):
    """The address of the first element of a torch tensor or a USM array."""
    return t.data_ptr() if isinstance(t, torch.Tensor) else normalize(t, "out").address


def has_unit_channel_stride(t):
    """True if the last dimension is contiguous (or has a single element)."""
    return t.shape[-1] <= 1 or t.stride()[-1] == 1


def channels_contiguous(t, name="x"):
    """``t`` itself if its channels (last dimension) are contiguous, else a copy that is
    (made by t's own library; raises TypeError for a foreign array it cannot copy)."""
    if has_unit_channel_stride(t):
        return t
    if isinstance(t, torch.Tensor):
        return t.contiguous()
    xp = _namespace(t.source)
    if xp is None or not hasattr(xp, "copy"):
        raise TypeError(f"{name}: channels (last dimension) must be contiguous for a "
                        f"{type(t.source).__name__}, got strides {t.strides}")
    return normalize(xp.copy(t.source, order="C"), name)


def can_assign(out):
    """Whether results can be copied into ``out`` (when the kernel had to write a
    separate buffer): torch tensors, and arrays whose library supports ``out[...] =``."""
    return isinstance(out, torch.Tensor) or hasattr(out.source, "__setitem__")


def assign(out, result):
    """out[...] = result, for the kinds ``can_assign`` accepts."""
    if isinstance(out, torch.Tensor):
        out.copy_(result)
    else:
        out.source[...] = result


def byte_extent(t):
    """(first, last + 1) byte addresses a tensor's view touches, or None when it has no
    elements (or is None). Strides are non-negative (validated)."""
    if t is None:
        return None
    if isinstance(t, UsmArray):
        lo, hi = t.extent()
        return (lo, hi) if hi > lo else None
    span = 0
    for n, s in zip(t.shape, t.stride()):
        if n == 0:
            return None
        span += (n - 1) * s
    start = t.data_ptr()
    return start, start + (span + 1) * t.element_size()


def extents_meet(ea, eb):
    """Whether two byte extents (from ``byte_extent``) share a byte."""
    return ea is not None and eb is not None and ea[0] < eb[1] and eb[0] < ea[1]


def normalize_all(x, weight, bias, conv_state, out):
    """``normalize`` for the five tensor arguments of the ops, in that order."""
    return [normalize(t, n) for t, n in zip((x, weight, bias, conv_state, out),
                                            ("x", "weight", "bias", "conv_state", "out"))]


def strides_may_overlap(shape, strides):
    """False when the strides prove that no two elements share memory (each dimension,
    by increasing stride, steps over everything the smaller ones span); True otherwise."""
    span = 0
    for n, s in sorted(((n, s) for n, s in zip(shape, strides) if n > 1),
                       key=lambda d: d[1]):
        if s <= span:
            return True
        span += (n - 1) * s
    return False
