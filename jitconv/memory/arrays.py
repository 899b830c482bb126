"""Arrays as validation and the launches see them, whatever backend runs them: dtype
names, byte extents and overlaps, strides; ``UsmArray``, the record of a non-torch array
in USM memory (made by the SYCL backend's bridge, ``normalize``). Nothing here imports a
device runtime."""

import sys

import numpy as np
import torch

KDL_ONEAPI = 14  # DLPack's device type of SYCL USM memory

DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16",
               torch.bfloat16: "bfloat16", torch.int32: "int32", torch.int64: "int64",
               torch.bool: "bool", torch.int16: "int16", torch.uint8: "uint8",
               torch.int8: "int8", torch.float64: "float64"}
DTYPE_TORCH = {v: k for k, v in DTYPE_NAMES.items()}


class UsmArray:
    """A non-torch array in USM memory, as validation and the launch see it: a dpctl
    usm_ndarray, a dpnp array, any ``__sycl_usm_array_interface__`` object, or a tensor
    imported from a kDLOneAPI DLPack capsule. ``source`` is the caller's object (outputs
    are made of its kind); ``owner`` keeps the memory valid (the source, or the DLPack
    import whose deleter frees it)."""

    __slots__ = ("source", "owner", "address", "shape", "strides", "dtype", "itemsize",
                 "device", "allocation", "read_only", "copied")

    def __init__(self, *, source, owner, address, shape, strides, dtype, itemsize, device,
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


def c_strides(shape):
    """Row-major strides, in elements."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.insert(0, step)
        step *= max(int(n), 1)
    return tuple(strides)


def namespace(source):
    """The module that makes arrays of ``source``'s kind (dpctl.tensor for a usm_ndarray,
    dpnp for a dpnp array), or None. Never imported here: a caller holding such an array
    has imported it already."""
    if not hasattr(source, "__sycl_usm_array_interface__"):
        return None
    if hasattr(source, "__array_namespace__"):
        return source.__array_namespace__()
    return sys.modules.get(type(source).__module__.partition(".")[0])


def has_unit_channel_stride(t):
    """True if the last dimension is contiguous (or has a single element)."""
    return t.shape[-1] <= 1 or t.stride()[-1] == 1


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


def is_device_array(t):
    """A non-torch array jitconv can take zero-copy (USM interface or kDLOneAPI DLPack)."""
    if isinstance(t, UsmArray) or hasattr(t, "__sycl_usm_array_interface__"):
        return True
    try:
        return hasattr(t, "__dlpack__") and t.__dlpack_device__()[0] == KDL_ONEAPI
    except (AttributeError, TypeError, ValueError):
        return False
