"""SYCL devices and queues: one cached queue per device, and dpctl queues that share a
caller's ``sycl::queue`` (torch XPU's current stream).

One queue object per device, always the same: numba-dpex makes the queue part of a
kernel's type, so a new SyclQueue object for the same device would force a recompile.
dpctl's per-device cached queue is the one arrays made with ``device=...`` use too.
Importing this module bootstraps the SYCL runtime (``bootstrap``) before dpctl loads it.
"""

import ctypes

from jitconv.backends.sycl.bootstrap import bootstrap
from jitconv.backends.sycl.state import STATE

bootstrap()

try:
    import dpctl  # noqa: E402
except ImportError:  # no SYCL runtime (a CUDA-only install): SYCL devices are absent
    dpctl = None


def sycl_devices():
    """dpctl.SyclDevice of every SYCL device (none without dpctl)."""
    return dpctl.get_devices() if dpctl is not None else []


def name_of(device):
    """The name of a dpctl.SyclDevice in jitconv's caches and messages: its filter string
    ("level_zero:gpu:0"). A sub-device (a tile of an Intel GPU that the driver exposes as
    one, a partition of the CPU device) has no filter string: it is named after its parent,
    with a number that tells this process's sub-devices of that parent apart."""
    names = STATE.device_names
    name = names.get(device)
    if name is None:
        parent = getattr(device, "parent_device", None)
        if parent is None:
            return names.setdefault(device, device.filter_string)
        prefix = f"{name_of(parent)}/sub-device "
        with STATE.names_lock:
            name = names.get(device)
            if name is None:
                taken = sum(1 for n in names.values() if n.startswith(prefix))
                name = names[device] = f"{prefix}{taken}"
    return name


def get_queue(filter_str):
    """dpctl's cached queue of the SYCL device ``filter_str`` (the same object each time;
    making a SyclDevice costs ~15 us)."""
    queue = STATE.queues.get(filter_str)
    if queue is None:
        queue = STATE.queues[filter_str] = dpctl.get_device_cached_queue(
            dpctl.SyclDevice(filter_str))
    return queue


def compile_queue(queue):
    """The queue numba-dpex compiles a kernel for ``queue`` with: ``queue`` itself, or for a
    sub-device the cached queue of its root device. numba-dpex types a kernel by its
    queue's filter string, which a sub-device has none of; the SPIR-V it makes does not
    depend on the device, and each queue builds its own program from it."""
    device = queue.sycl_device
    if getattr(device, "parent_device", None) is None:
        return queue
    while device.parent_device is not None:
        device = device.parent_device
    return get_queue(device.filter_string)


# ------------------------------------------------------------------ the caller's queue

_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)


def queue_from_address(address):
    """A dpctl.SyclQueue for the ``sycl::queue*`` at ``address`` (what torch's
    ``torch.xpu.Stream.sycl_queue`` returns): dpctl takes it as a "SyclQueueRef" capsule
    and shares the queue, so work submitted on it is ordered with the owner's work.
    Cached per address: a stream's queue lives as long as the stream."""
    if not isinstance(address, int) or isinstance(address, bool) or address <= 0:
        raise ValueError(f"queue address: expected a positive int (a sycl::queue*), "
                         f"got {address!r}")
    queue = STATE.queues_by_address.get(address)
    if queue is None:
        queue = STATE.queues_by_address.setdefault(address,
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
