"""The device planner (``jitconv.kernels.planner``) compiled with numba-cuda: one thread
per block slot, 128 threads a block. Compiled once per combination of the metadata's
element types (int32 / int64, and bool / uint8 for the initial-state flags)."""

import threading
import types

import numpy as np
from numba import cuda

from jitconv.kernels import planner

THREADS = 128
_lock = threading.Lock()
_kernels = {}  # element types of planner.METADATA_ARRAYS -> dispatcher
_plan_slot = []


def _simulating():
    from numba.core import config
    return bool(config.ENABLE_CUDASIM)


def _device_plan_slot():
    """``planner.plan_slot`` as a numba-cuda device function, its helpers too: copies of
    the module's functions whose globals name the device versions."""
    if not _plan_slot:
        namespace = dict(vars(planner))
        for name in ("_start_token", "_sequence", "plan_slot"):
            fn = getattr(planner, name)
            copy = types.FunctionType(fn.__code__, namespace, name, fn.__defaults__)
            namespace[name] = cuda.jit(device=True)(copy)
        _plan_slot.append(namespace["plan_slot"])
    return _plan_slot[0]


_SOURCE = """
def jitconv_planner({args}):
    s = cuda.grid(1)
    if s >= capacity:
        return
    plan_slot(s, {call})
"""


def _signature(element_types):
    from numba import from_dtype
    from numba import types as nt
    arrays = dict(zip(planner.METADATA_ARRAYS, element_types))
    arrays.update(tables="int32", errors="int32")
    return nt.void(*[nt.CPointer(from_dtype(np.dtype(arrays[a]))) if a in arrays else nt.int64
                     for a in planner.PLAN_ARGS])


def get_planner(element_types):
    """The planner kernel for metadata of these numpy element type names (in
    ``planner.METADATA_ARRAYS`` order)."""
    kernel = _kernels.get(element_types)
    if kernel is None:
        with _lock:
            kernel = _kernels.get(element_types)
            if kernel is None:
                namespace = {"cuda": cuda, "plan_slot": _device_plan_slot()}
                source = _SOURCE.format(args=", ".join(planner.PLAN_ARGS),
                                        call=", ".join(planner.PLAN_ARGS[:-1]))
                exec(compile(source, "<jitconv cuda planner>", "exec"), namespace)
                fn = namespace["jitconv_planner"]
                kernel = cuda.jit(fn) if _simulating() else \
                    cuda.jit(_signature(element_types))(fn)
                _kernels[element_types] = kernel
    return kernel


def launch_shape(capacity):
    return (-(-capacity // THREADS),), (THREADS,)
