"""A small reader of DLPack capsules (DLPack's C ABI), so that jitconv imports the
tensors of any producer (torch XPU, dpnp, dpctl, ...) without dpctl.tensor.

Both capsule kinds are read: "dltensor" (DLManagedTensor, DLPack < 1.0) and
"dltensor_versioned" (DLManagedTensorVersioned, DLPack 1.x, with read-only/copied flags).

Ownership follows the DLPack rules: once read, the capsule is renamed to
"used_dltensor" / "used_dltensor_versioned" (its destructor then leaves the tensor alone)
and the consumer owns the managed tensor. Here that is a ``Tensor`` object: its producer's
deleter runs when the ``Tensor`` is garbage collected, never earlier, so memory viewed
through it stays valid while anything references it. Nothing here is global state: any
number of threads may import tensors at once.
"""

import ctypes
import weakref

from jitconv.memory import arrays

KDL_CPU = 1
KDL_ONEAPI = arrays.KDL_ONEAPI  # SYCL USM memory

# DLDataTypeCode -> dtype names for the codes jitconv meets (bits decide the width).
_CODES = {0: "int", 1: "uint", 2: "float", 4: "bfloat", 6: "bool"}
FLAG_READ_ONLY = 1
FLAG_IS_COPIED = 2


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32),
                ("dtype", _DataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _Managed(ctypes.Structure):
    pass


_Managed._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                     ("deleter", ctypes.CFUNCTYPE(None, ctypes.POINTER(_Managed)))]


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _ManagedVersioned(ctypes.Structure):
    pass


_ManagedVersioned._fields_ = [
    ("version", _Version), ("manager_ctx", ctypes.c_void_p),
    ("deleter", ctypes.CFUNCTYPE(None, ctypes.POINTER(_ManagedVersioned))),
    ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensor)]

_capi = ctypes.pythonapi
_capi.PyCapsule_IsValid.restype = ctypes.c_int
_capi.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capi.PyCapsule_GetPointer.restype = ctypes.c_void_p
_capi.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capi.PyCapsule_SetName.restype = ctypes.c_int
_capi.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]

# PyCapsule_SetName keeps the char pointer, not a copy: these objects must outlive every
# capsule renamed with them (module constants do).
_USED = {b"dltensor": ctypes.c_char_p(b"used_dltensor"),
         b"dltensor_versioned": ctypes.c_char_p(b"used_dltensor_versioned")}


class Tensor:
    """What a capsule describes: ``address`` (data + byte_offset), ``shape``,
    ``strides`` (in elements; C order when the producer gave none), ``dtype`` (e.g.
    "float32", "bfloat16", "int64", "bool"), ``itemsize``, ``device`` ((type, id)),
    ``read_only`` and ``copied`` (versioned capsules only). Owns the managed tensor: the
    producer's deleter is called when this object is collected."""

    def __init__(self, address, shape, strides, dtype, itemsize, device, read_only, copied):
        self.address, self.shape, self.strides = address, shape, strides
        self.dtype, self.itemsize, self.device = dtype, itemsize, device
        self.read_only, self.copied = read_only, copied


def _delete(deleter, pointer):
    if deleter:
        deleter(pointer)


def _dtype(dt):
    kind = _CODES.get(dt.code)
    if kind is None or dt.lanes != 1 or dt.bits % 8:
        raise TypeError(f"DLPack dtype (code={dt.code}, bits={dt.bits}, lanes={dt.lanes}) "
                        f"is not supported")
    if kind == "bool":
        return "bool", dt.bits // 8
    return f"{kind}{dt.bits}", dt.bits // 8


def from_capsule(capsule):
    """Read a DLPack capsule and take ownership of its tensor (see the module docstring).
    Raises ValueError for a capsule that is not an unused DLPack tensor."""
    for name, struct in ((b"dltensor_versioned", _ManagedVersioned), (b"dltensor", _Managed)):
        if _capi.PyCapsule_IsValid(capsule, name):
            break
    else:
        raise ValueError("not a DLPack capsule (or one that was already consumed)")
    address = _capi.PyCapsule_GetPointer(capsule, name)
    managed = ctypes.cast(address, ctypes.POINTER(struct))
    m = managed.contents
    flags = m.flags if struct is _ManagedVersioned else 0
    # From here on we own the tensor: rename first, so that even if reading the fields
    # fails below, the deleter runs exactly once (through the Tensor's finalizer).
    if _capi.PyCapsule_SetName(capsule, _USED[name]) != 0:
        raise ValueError("could not mark the DLPack capsule as used")
    t = m.dl_tensor
    holder = Tensor(0, (), (), None, 0, (t.device.device_type, t.device.device_id),
                    bool(flags & FLAG_READ_ONLY), bool(flags & FLAG_IS_COPIED))
    finalizer = weakref.finalize(holder, _delete, m.deleter, managed)
    finalizer.atexit = False  # at interpreter exit the producer may already be gone
    holder.dtype, holder.itemsize = _dtype(t.dtype)
    shape = tuple(t.shape[i] for i in range(t.ndim))
    if t.strides:
        strides = tuple(t.strides[i] for i in range(t.ndim))
    else:  # no strides: compact row-major
        strides, step = [], 1
        for n in reversed(shape):
            strides.insert(0, step)
            step *= max(n, 1)
        strides = tuple(strides)
    holder.address = (t.data or 0) + t.byte_offset
    holder.shape, holder.strides = shape, strides
    return holder


def import_tensor(obj):
    """``obj.__dlpack__()`` read into a ``Tensor``; asks for a versioned capsule (DLPack
    1.x) and falls back to the classic one for producers that do not know max_version."""
    try:
        capsule = obj.__dlpack__(max_version=(1, 0))
    except TypeError:
        capsule = obj.__dlpack__()
    return from_capsule(capsule)
