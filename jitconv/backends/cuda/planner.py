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
                for name in ("_start_token", "_sequence", "slot_record", "plan_slot",
                             "plan_rules"):
                    fn = getattr(planner, name)
                    copy = types.FunctionType(fn.__code__, namespace, name, fn.__defaults__)
                    namespace[name] = cuda.jit(device=True, **inline)(copy)
                STATE.planner_functions.update(namespace)
    return STATE.planner_functions


# The two planner kernels: "planner" (``planner.plan_slot``, one thread per block slot)
# and "rules" (``planner.plan_rules``, one thread per sequence, for plans with state
# rules): (function, argument list, array arguments, the count of threads' argument).
_KINDS = {"planner": ("plan_slot", planner.PLAN_ARGS, planner.METADATA_ARRAYS, "capacity"),
          "rules": ("plan_rules", planner.RULE_ARGS, planner.RULE_ARRAYS, "count")}
_SOURCE = """
def jitconv_{kind}({args}):
    s = cuda.grid(1)
    if s >= {count}:
        return
    {function}(s, {call})
"""


def _signature(element_types, kind):
    from numba import from_dtype
    from numba import types as nt
    _function, args, names, _count = _KINDS[kind]
    arrays = dict(zip(names, element_types))
    arrays.update(tables="int32", errors="int32")
    return nt.void(*[nt.CPointer(from_dtype(np.dtype(arrays[a]))) if a in arrays else nt.int64
                     for a in args])


def get_planner(element_types, kind="planner"):
    """The planner kernel of ``kind`` (``_KINDS``) for arrays of these numpy element type
    names (in ``planner.METADATA_ARRAYS`` or ``RULE_ARRAYS`` order)."""
    key = (kind, element_types)
    kernel = STATE.planners.get(key)
    if kernel is None:
        with STATE.planner_lock:
            kernel = STATE.planners.get(key)
            if kernel is None:
                function, args, _names, count = _KINDS[kind]
                namespace = {"cuda": cuda, function: device_functions()[function]}
                source = _SOURCE.format(kind=kind, args=", ".join(args), count=count,
                                        function=function, call=", ".join(args[:-1]))
                exec(compile(source, f"<jitconv cuda {kind}>", "exec"), namespace)
                fn = namespace[f"jitconv_{kind}"]
                kernel = cuda.jit(fn) if _simulating() else \
                    cuda.jit(_signature(element_types, kind))(fn)
                STATE.planners[key] = kernel
    return kernel


def launch_shape(capacity):
    return (-(-capacity // THREADS),), (THREADS,)
