"""The device planner (``jitconv.kernels.planner``) compiled with numba-cuda: one thread
per block slot, 128 threads a block. Compiled once per combination of the metadata's
element types (int32 / int64, and bool / uint8 for the initial-state flags)."""

import inspect
import types

import numpy as np
from numba import cuda

from jitconv.backends.cuda.state import STATE
from jitconv.kernels import planner

THREADS = 128


def _simulating():
    from numba.core import config
    return bool(config.ENABLE_CUDASIM)


def device_functions():
    """``planner``'s functions as numba-cuda device functions (``plan_slot`` for the
    planner, ``slot_record`` for a conv kernel that plans its own block): copies of the
    module's functions whose globals name the device versions. Inlined into their
    callers (NVVM's forceinline, where numba-cuda has it): a fused kernel's constants
    (``source.plan_kind``) then fold into them."""
    if not STATE.planner_functions:
        with STATE.planner_lock:
            if not STATE.planner_functions:
                namespace = dict(vars(planner))
                inline = {} if _simulating() or "forceinline" not in inspect.signature(
                    cuda.jit).parameters else {"forceinline": True}
                for name in ("_start_token", "_sequence", "slot_record", "plan_slot"):
                    fn = getattr(planner, name)
                    copy = types.FunctionType(fn.__code__, namespace, name, fn.__defaults__)
                    namespace[name] = cuda.jit(device=True, **inline)(copy)
                STATE.planner_functions.update(namespace)
    return STATE.planner_functions


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
    kernel = STATE.planners.get(element_types)
    if kernel is None:
        with STATE.planner_lock:
            kernel = STATE.planners.get(element_types)
            if kernel is None:
                namespace = {"cuda": cuda, "plan_slot": device_functions()["plan_slot"]}
                source = _SOURCE.format(args=", ".join(planner.PLAN_ARGS),
                                        call=", ".join(planner.PLAN_ARGS[:-1]))
                exec(compile(source, "<jitconv cuda planner>", "exec"), namespace)
                fn = namespace["jitconv_planner"]
                kernel = cuda.jit(fn) if _simulating() else \
                    cuda.jit(_signature(element_types))(fn)
                STATE.planners[element_types] = kernel
    return kernel


def launch_shape(capacity):
    return (-(-capacity // THREADS),), (THREADS,)
