"""Which backend runs a call: the first of ``BACKENDS`` that takes its x."""

from jitconv.backends.cuda.backend import BACKEND as CUDA
from jitconv.backends.sycl.backend import BACKEND as SYCL

BACKENDS = (CUDA, SYCL)  # SYCL takes whatever CUDA does not (it rejects what it cannot reach)


def for_call(x):
    for backend in BACKENDS:
        if backend.takes(x):
            return backend
    raise TypeError(f"x: no backend runs a {type(x).__name__}")


def devices():
    """Every device of every backend: SYCL devices first, then CUDA GPUs."""
    return SYCL.devices() + CUDA.devices()
