"""The backend objects, and which one runs a call: the first of ``BACKENDS`` that takes
its x. Arrays that are not torch tensors (dpctl, dpnp, DLPack producers) are SYCL
memory: only the SYCL backend reads them (``normalize``, ``host_array``)."""

import torch

from jitconv.backends import devices
from jitconv.backends.cuda.backend import BACKEND as CUDA, current_is_cuda
from jitconv.backends.cuda.devices import is_cuda_name
from jitconv.backends.sycl.backend import BACKEND as SYCL

BACKENDS = (CUDA, SYCL)  # SYCL takes whatever CUDA does not (it rejects what it cannot reach)
TENSOR_NAMES = ("x", "weight", "bias", "conv_state", "out")


def for_call(x):
    """The backend that runs a call whose x is ``x``. A torch CPU tensor while a CUDA GPU
    is the current device is refused: its memory is not the GPU's."""
    for backend in BACKENDS:
        if backend.takes(x):
            if backend is SYCL and isinstance(x, torch.Tensor) and x.is_cpu and \
                    current_is_cuda():
                name = devices.get_device()
                raise TypeError(f"x: a CPU tensor, but the current device is {name}: pass "
                                f"torch CUDA tensors (x.to('{name}')) or select a SYCL "
                                f"device")
            return backend
    raise TypeError(f"x: expected a torch tensor (CPU, XPU or CUDA), a dpnp array, a dpctl "
                    f"usm_ndarray or a oneAPI DLPack producer, got {type(x).__name__}")


def for_device(name):
    """The backend of a device name ("cuda:0", "opencl:cpu:0", ...)."""
    return CUDA if is_cuda_name(name) else SYCL


def normalize(t, name):
    """torch tensors (and None) as they are; any other array as the SYCL backend's
    ``UsmArray`` of it (or a TypeError naming ``name``)."""
    if t is None or isinstance(t, torch.Tensor):
        return t
    return SYCL.normalize(t, name)


def normalize_all(*tensors):
    """``normalize`` of the ops' five tensor arguments (x, weight, bias, conv_state, out)."""
    return [normalize(t, n) for t, n in zip(tensors, TENSOR_NAMES)]


def channels_contiguous(t, name="x"):
    """``t`` itself if its channels (last dimension) are contiguous, else a copy that is
    (a foreign array's by its own library)."""
    if t.shape[-1] <= 1 or t.stride()[-1] == 1:
        return t
    if isinstance(t, torch.Tensor):
        return t.contiguous()
    return SYCL.channels_contiguous(t, name)


def host_array(t, name):
    """A non-torch device array's values as a numpy array (metadata passed that way)."""
    return SYCL.host_array(t, name)


def empty(shape, dtype=torch.float32, device=None):
    """A new tensor on ``device`` (default: the current one) that its kernels use with no
    copy: on a SYCL device a torch CPU tensor in USM shared memory (recycled through a
    pool once no tensor uses it; on an Intel GPU prefer torch XPU tensors, which live in
    device memory), on "cuda:N" a torch CUDA tensor. ``dtype``: a torch dtype or its name
    ("bfloat16", ...)."""
    if isinstance(shape, int):
        shape = (shape,)
    shape = tuple(int(s) for s in shape)
    if isinstance(dtype, str):
        named = getattr(torch, dtype, None)
        if not isinstance(named, torch.dtype):
            raise TypeError(f"dtype: expected a torch dtype or its name, got {dtype!r}")
        dtype = named
    device = device or devices.get_device()
    return for_device(device).empty(shape, dtype, device)


def zeros(shape, dtype=torch.float32, device=None):
    """Like ``empty``, filled with zeros."""
    t = empty(shape, dtype, device)
    t.zero_()
    return t


def all_devices():
    """Every device of every backend: SYCL devices first, then CUDA GPUs."""
    return SYCL.devices() + CUDA.devices()


def clear_caches():
    """Forget what every backend keeps between calls (``Backend.clear``)."""
    for backend in BACKENDS:
        backend.clear()
