"""Device selection: which SYCL device jitconv runs on, and one cached queue per device.

Devices are named by dpctl filter strings ("opencl:cpu", "level_zero:gpu:0", ...), and
NVIDIA GPUs as "cuda:N" when numba-cuda is installed (``cuda_backend``). The default is
the first Level Zero GPU if there is one, else the first CUDA GPU, else the OpenCL CPU
device. JITCONV_DEVICE overrides the default; ``set_device`` overrides both. dpctl is
optional: without it (a CUDA-only install) only the CUDA devices exist.

One queue object per device, always the same: numba-dpex makes the queue part of a
kernel's type, so a new SyclQueue object for the same device would force a recompile.
dpctl's per-device cached queue is the one arrays made with ``device=...`` use too.
"""

import ctypes
import os

from ._bootstrap import bootstrap, no_device_hint

bootstrap()

try:
    import dpctl  # noqa: E402
except ImportError:  # no SYCL runtime (a CUDA-only install): SYCL devices are absent
    dpctl = None

from . import cuda_backend  # noqa: E402

_current = None


class DeviceNotFoundError(ValueError):
    """A device filter string matched no usable SYCL device."""


def _sycl_devices():
    return dpctl.get_devices() if dpctl is not None else []


def devices():
    """Usable devices: SYCL devices as dpctl filter strings, e.g. ['opencl:cpu:0'], then
    CUDA GPUs as 'cuda:N' (with numba-cuda installed)."""
    return [d.filter_string for d in _sycl_devices()] + cuda_backend.devices()


def _resolve(filter_str):
    if not isinstance(filter_str, str) or not filter_str.strip():
        raise DeviceNotFoundError(
            f"device must be a dpctl filter string such as 'opencl:cpu' or "
            f"'level_zero:gpu', or 'cuda:N', got {filter_str!r}; available: {devices()}")
    if cuda_backend.is_cuda_name(filter_str):
        name = cuda_backend.resolve(filter_str)
        if name is None:
            raise DeviceNotFoundError(
                f"no CUDA device matches {filter_str!r}; available: {devices() or 'none'}"
                f" ({cuda_backend.why_unavailable()})")
        return name
    if dpctl is None:
        raise DeviceNotFoundError(
            f"no SYCL device matches {filter_str!r}: dpctl (the SYCL runtime's Python "
            f"package) is not installed; available: {devices() or 'none'}")
    try:
        device = dpctl.SyclDevice(filter_str.strip())
    except (dpctl.SyclDeviceCreationError, ValueError, TypeError) as exc:
        raise DeviceNotFoundError(
            f"no SYCL device matches {filter_str!r}; available: {devices() or 'none'}"
            f" (check ONEAPI_DEVICE_SELECTOR / OCL_ICD_FILENAMES if this list is empty)"
            + no_device_hint()) from exc
    return device.filter_string


def default_device():
    """JITCONV_DEVICE if set, else the first Level Zero GPU, else the OpenCL CPU device."""
    env = os.environ.get("JITCONV_DEVICE")
    if env:
        return _resolve(env)
    available = _sycl_devices()
    for backend, dtype in (("level_zero", "gpu"), ("cuda", None), ("opencl", "cpu")):
        if backend == "cuda":
            cuda_devices = cuda_backend.devices()
            if cuda_devices:
                return cuda_devices[0]
            continue
        for d in available:
            if d.backend.name == backend and d.device_type.name == dtype:
                return d.filter_string
    if available:
        return available[0].filter_string
    raise DeviceNotFoundError(
        "no SYCL or CUDA device found; jitconv needs a Level Zero GPU, the Intel OpenCL "
        "CPU runtime (pip package intel-opencl-rt), or an NVIDIA GPU with numba-cuda."
        + (no_device_hint() if dpctl is not None else
           f" dpctl is not installed; CUDA: {cuda_backend.why_unavailable()}"))


def set_device(filter_str):
    """Select the device for all later calls; returns its full filter string."""
    global _current
    _current = _resolve(filter_str)
    return _current


def get_device():
    """The current device as a filter string (chosen on first use if none was set)."""
    global _current
    if _current is None:
        _current = default_device()
    return _current


_queues = {}  # filter string -> dpctl's cached queue (making a SyclDevice costs ~15 us)


def get_queue(device=None):
    """dpctl's cached queue of ``device`` (default: the current device)."""
    filter_str = device or get_device()
    if cuda_backend.is_cuda_name(filter_str):
        raise ValueError(f"device: {filter_str} is a CUDA device, which has no SYCL queue "
                         f"(pass torch CUDA tensors; jitconv runs on their stream)")
    queue = _queues.get(filter_str)
    if queue is None:
        queue = _queues[filter_str] = dpctl.get_device_cached_queue(
            dpctl.SyclDevice(filter_str))
    return queue


# ------------------------------------------------------------------ the caller's queue

_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)
_by_address = {}  # sycl::queue address -> dpctl.SyclQueue sharing that queue


def queue_from_address(address):
    """A dpctl.SyclQueue for the ``sycl::queue*`` at ``address`` (what torch's
    ``torch.xpu.Stream.sycl_queue`` returns): dpctl takes it as a "SyclQueueRef" capsule
    and shares the queue, so work submitted on it is ordered with the owner's work.
    Cached per address: a stream's queue lives as long as the stream."""
    if not isinstance(address, int) or isinstance(address, bool) or address <= 0:
        raise ValueError(f"queue address: expected a positive int (a sycl::queue*), "
                         f"got {address!r}")
    queue = _by_address.get(address)
    if queue is None:
        queue = _by_address.setdefault(address,
                                       dpctl.SyclQueue(capsule(address, b"SyclQueueRef")))
    return queue


def capsule(address, name):
    """A PyCapsule named ``name`` around a C pointer, the form dpctl takes a SYCL object
    reference in (it copies the object: the capsule does not own it)."""
    return _PyCapsule_New(address, name, None)


def torch_stream_queue(device):
    """The SYCL queue of torch's current XPU stream on ``device`` (a torch.device)."""
    import torch
    return queue_from_address(int(torch.xpu.current_stream(device).sycl_queue))


def queue_for(x):
    """The queue a call whose x is ``x`` runs on: for a torch XPU tensor the queue of
    torch's current stream (ordered with torch's kernels, no host wait); for a dpctl or
    dpnp array its own queue; otherwise the current device's cached queue."""
    device = getattr(x, "device", None)
    if getattr(device, "type", None) == "xpu":
        return torch_stream_queue(device)
    queue = getattr(getattr(x, "source", x), "sycl_queue", None)  # bridge.UsmArray
    return queue if queue is not None else get_queue()
