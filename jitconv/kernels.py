"""The numba-dpex (SYCL) backend of the conv kernel: the template of ``kernel_template``
compiled for SYCL devices. Only what is SYCL's lives here: the work-item's index
(``item.get_id``: the range is exact, so no bounds guard), numba-dpex's device-function
decorator, and the numba intrinsics for the fp16/bf16 bit conversions.

No host logic lives here. The public ops (``ops.py``) validate inputs and build the
per-sequence and per-block tables; ``launching.py`` compiles and submits.
"""

import linecache
import math

import numpy as np
from numba.core.extending import intrinsic

import numba_dpex as dpex

from . import bit_conversions
from .kernel_abi import FLAG_INITIAL_STATE, FLAG_SPEC, STORAGE, SUPPORTED_WIDTHS
from .kernel_template import Backend, kernel_source as _template_source, window_value

SYCL = Backend(
    name="sycl", index_arg="item, ", extra_args="",
    index="    c = item.get_id(0)  # channel: the fastest index (contiguous memory)\n"
          "    b = item.get_id(1)  # block")

_INTRINSICS = bit_conversions.intrinsics(intrinsic)


@dpex.device_func
def _identity(v):
    return v


def _converters(dtype_name):
    load, store = bit_conversions.CONVERSIONS[dtype_name]
    return ((_INTRINSICS[load] if load else _identity),
            (_INTRINSICS[store] if store else _identity))


_window_value = dpex.device_func(window_value)


def kernel_source(width, name):
    """The Python source of the SYCL conv kernel for one width (one channel per
    work-item)."""
    return _template_source(width, name, SYCL)


def make_conv_kernel(width, dtype_name):
    """Build the mixed-batch causal-conv1d kernel for one (width, dtype) specialization.

    The width shapes the source (scalar registers for the window and the taps); the
    storage conversions are globals of the generated function, so numba treats them as
    compile-time constants. Returns a numba-dpex kernel with the argument list
    ``kernel_abi.CONV_ARGS``.
    """
    if width not in SUPPORTED_WIDTHS:
        raise ValueError(f"width must be one of {SUPPORTED_WIDTHS}, got {width}")
    name = f"jitconv_conv_w{width}_{dtype_name}"
    source = kernel_source(width, name)
    filename = f"<jitconv kernel {name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    load, store = _converters(dtype_name)
    namespace = {
        "U": np.uint64, "math": math, "load": load, "store": store, "_window_value": _window_value,
        "ZERO": STORAGE[dtype_name](0), "F32_ZERO": np.float32(0.0), "ONE": np.float32(1.0),
        "FLAG_INITIAL_STATE": FLAG_INITIAL_STATE, "FLAG_SPEC": FLAG_SPEC,
    }
    exec(compile(source, filename, "exec"), namespace)
    return dpex.kernel(namespace[name])
