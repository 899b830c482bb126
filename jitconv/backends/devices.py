"""The current device: which device jitconv's calls run on when their tensors do not say.

Devices are named by dpctl filter strings ("opencl:cpu", "level_zero:gpu:0", ...), and
NVIDIA GPUs as "cuda:N" when numba-cuda is installed (``backends.cuda.devices``). The
default is the first Level Zero GPU if there is one, else the first CUDA GPU, else the
OpenCL CPU device. JITCONV_DEVICE overrides the default; ``set_device`` overrides both.
dpctl is optional: without it (a CUDA-only install) only the CUDA devices exist.
"""

import os

from jitconv.backends.cuda import devices as cuda_devices
from jitconv.backends.sycl import devices as sycl
from jitconv.backends.sycl.bootstrap import no_device_hint

dpctl = sycl.dpctl

_current = None


class DeviceNotFoundError(ValueError):
    """A device filter string matched no usable SYCL device."""


def devices():
    """Usable devices: SYCL devices as dpctl filter strings, e.g. ['opencl:cpu:0'], then
    CUDA GPUs as 'cuda:N' (with numba-cuda installed)."""
    return [d.filter_string for d in sycl.sycl_devices()] + cuda_devices.devices()


def _resolve(filter_str):
    if not isinstance(filter_str, str) or not filter_str.strip():
        raise DeviceNotFoundError(
            f"device must be a dpctl filter string such as 'opencl:cpu' or "
            f"'level_zero:gpu', or 'cuda:N', got {filter_str!r}; available: {devices()}")
    if cuda_devices.is_cuda_name(filter_str):
        name = cuda_devices.resolve(filter_str)
        if name is None:
            raise DeviceNotFoundError(
                f"no CUDA device matches {filter_str!r}; available: {devices() or 'none'}"
                f" ({cuda_devices.why_unavailable()})")
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
    available = sycl.sycl_devices()
    for backend, dtype in (("level_zero", "gpu"), ("cuda", None), ("opencl", "cpu")):
        if backend == "cuda":
            gpus = cuda_devices.devices()
            if gpus:
                return gpus[0]
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
           f" dpctl is not installed; CUDA: {cuda_devices.why_unavailable()}"))


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


def get_queue(device=None):
    """dpctl's cached queue of ``device`` (default: the current device)."""
    filter_str = device or get_device()
    if cuda_devices.is_cuda_name(filter_str):
        raise ValueError(f"device: {filter_str} is a CUDA device, which has no SYCL queue "
                         f"(pass torch CUDA tensors; jitconv runs on their stream)")
    return sycl.get_queue(filter_str)


def queue_for(x):
    """The queue a call whose x is ``x`` runs on: for a torch XPU tensor the queue of
    torch's current stream (ordered with torch's kernels, no host wait); for a dpctl or
    dpnp array its own queue; otherwise the current device's cached queue."""
    device = getattr(x, "device", None)
    if getattr(device, "type", None) == "xpu":
        return sycl.torch_stream_queue(device)
    queue = getattr(getattr(x, "source", x), "sycl_queue", None)  # bridge.UsmArray
    return queue if queue is not None else get_queue()
