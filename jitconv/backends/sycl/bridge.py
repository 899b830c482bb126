"""The torch bridge: tensors in, tensors out, zero-copy where the memory allows it.

How an argument reaches a kernel (``to_device``):
- torch XPU tensor: its DLPack capsule (kDLOneAPI) is read by ``dlpack``,
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

from dataclasses import dataclass

import numpy as np
import torch

from jitconv.backends import devices
from jitconv.backends.sycl import dlpack, usm
from jitconv.backends.sycl.devices import name_of
from jitconv.backends.sycl.state import STATE
from jitconv.memory import arrays
from jitconv.memory.arrays import DTYPE_TORCH, UsmArray

try:
    import dpctl  # noqa: E402  (devices bootstraps the runtime first)
    import dpctl.memory as dpm  # noqa: E402
except ImportError:  # a CUDA-only install: torch CUDA tensors need none of this module's
    dpctl = dpm = None  # SYCL paths (backends.cuda)

KDL_ONEAPI = dlpack.KDL_ONEAPI

_SIXTEEN_BIT = (torch.float16, torch.bfloat16)
_USM_CLASSES = ((dpm.MemoryUSMShared, dpm.MemoryUSMDevice, dpm.MemoryUSMHost)
                if dpm is not None else ())


class CopyRequiredError(RuntimeError):
    """A tensor had to be copied to reach the device, and copies are switched off."""


def copy_counts():
    """How many tensors were copied host->device and device->host so far."""
    return dict(STATE.copies)


def reset_copy_counts():
    STATE.copies.update(to_device=0, from_device=0)


def set_allow_copies(allow):
    """Allow (default) or forbid the host<->device copies of non-USM CPU tensors."""
    STATE.allow_copies = bool(allow)


@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceView:
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




def dlpack_device_id(device):
    """The DLPack device id of a SyclDevice (kDLOneAPI ids index dpctl.get_devices();
    dpctl >= 0.18 computes it as get_device_id())."""
    found = STATE.dlpack_ids.get(device)
    if found is None:
        getter = getattr(device, "get_device_id", None)
        found = STATE.dlpack_ids[device] = getter() if getter else dpctl.get_devices().index(device)
    return found




def _filter_string_of_dlpack_id(device_id):
    found = STATE.dlpack_devices.get(device_id)
    if found is None:
        listed = dpctl.get_devices()
        found = (listed[device_id].filter_string if 0 <= device_id < len(listed)
                 else f"oneAPI device {device_id}")
        STATE.dlpack_devices[device_id] = found
    return found


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
        strides = arrays.c_strides(shape)
    syclobj = iface.get("syclobj")
    device = getattr(syclobj, "sycl_device", None)
    address = iface["data"][0] + int(iface.get("offset", 0) or 0) * dt.itemsize
    dtype = "bool" if dt == np.bool_ else dt.name
    # syclobj may also be a context (no device to name): the pointer query decides then
    return UsmArray(source=obj, owner=obj, address=address, shape=shape, strides=strides,
                    dtype=dtype, itemsize=dt.itemsize,
                    device=name_of(device) if device is not None else None,
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
    return UsmArray(source=obj if source is None else source, owner=t, address=t.address,
                    shape=t.shape, strides=t.strides, dtype=t.dtype, itemsize=t.itemsize,
                    device=_filter_string_of_dlpack_id(device_id), read_only=t.read_only,
                    copied=t.copied)


def normalize(t, name):
    """torch tensors as they are; every other array (dpctl, dpnp, any USM-interface or
    kDLOneAPI DLPack producer) as a ``UsmArray``, zero-copy."""
    if t is None or isinstance(t, (torch.Tensor, UsmArray)):
        return t
    if hasattr(t, "__sycl_usm_array_interface__"):
        arr = _from_usm_interface(t, name)
    elif arrays.is_device_array(t):
        arr = _from_dlpack(t, name)
    else:
        raise TypeError(f"{name}: expected a torch tensor, dpnp array, dpctl usm_ndarray or"
                        f" a oneAPI DLPack producer, got {type(t).__name__}")
    if any(s < 0 for s in arr.strides):
        raise ValueError(f"{name}: negative strides are not supported, got {arr.strides}")
    return arr




def _queue_device(queue):
    found = STATE.queue_devices.get(queue)
    if found is None:
        found = STATE.queue_devices[queue] = name_of(queue.sycl_device)
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
        return DeviceView(memory=usm.placeholder(queue), offset=0, shape=arr.shape,
                          strides=arr.strides, itemsize=arr.itemsize, owner=arr.owner)
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
    return DeviceView(memory=memory, offset=byte_offset // arr.itemsize, shape=arr.shape,
                      strides=arr.strides, itemsize=arr.itemsize, owner=arr.owner)


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
            return DeviceView(memory=usm.placeholder(queue), offset=0, shape=tuple(t.shape),
                              strides=tuple(t.stride()), itemsize=t.element_size(),
                              owner=t), None
        found = usm.find_allocation(t.data_ptr())
        if found is None:
            memory = _query_usm(t.data_ptr(), queue)
            found = None if memory is None else (memory, 0)
        if found is None:
            return _copy_in(t, name, writable, queue, written)
        memory, byte_offset = found
        return DeviceView(memory=memory, offset=byte_offset // t.element_size(),
                          shape=tuple(t.shape), strides=tuple(t.stride()),
                          itemsize=t.element_size(), owner=t), None
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
    if not STATE.allow_copies:
        raise CopyRequiredError(
            f"{name}: this CPU tensor is not in USM memory, so it would be copied to the "
            f"device; allocate it with jitconv.empty/jitconv.zeros, or allow copies with "
            f"jitconv.set_allow_copies(True)")
    host = _host_numpy(t)
    nbytes = max(host.nbytes, 1)
    memory = dpm.MemoryUSMDevice(nbytes, queue=queue)
    if host.nbytes:
        queue.memcpy(memory, host.reshape(-1).view(np.uint8), host.nbytes)
    STATE.copies["to_device"] += 1
    view = DeviceView(memory=memory, offset=0, shape=tuple(host.shape),
                      strides=arrays.c_strides(host.shape), itemsize=host.itemsize,
                      owner=memory)
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
        STATE.copies["from_device"] += 1

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
    xp = arrays.namespace(source)
    if xp is not None and hasattr(xp, "empty") and hasattr(source, "device"):
        return xp.empty(shape, dtype=source.dtype, device=source.device)
    return usm.empty(shape, DTYPE_TORCH[dtype_str])


def address_of(t):
    """The address of the first element of a torch tensor or a USM array."""
    return t.data_ptr() if isinstance(t, torch.Tensor) else normalize(t, "out").address


def channels_contiguous(t, name="x"):
    """``t`` itself if its channels (last dimension) are contiguous, else a copy that is
    (made by t's own library; raises TypeError for a foreign array it cannot copy)."""
    if arrays.has_unit_channel_stride(t):
        return t
    if isinstance(t, torch.Tensor):
        return t.contiguous()
    xp = arrays.namespace(t.source)
    if xp is None or not hasattr(xp, "copy"):
        raise TypeError(f"{name}: channels (last dimension) must be contiguous for a "
                        f"{type(t.source).__name__}, got strides {t.strides}")
    return normalize(xp.copy(t.source, order="C"), name)


def normalize_all(x, weight, bias, conv_state, out):
    """``normalize`` for the five tensor arguments of the ops, in that order."""
    return [normalize(t, n) for t, n in zip((x, weight, bias, conv_state, out),
                                            ("x", "weight", "bias", "conv_state", "out"))]
