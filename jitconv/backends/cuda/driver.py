"""Kernel launches straight through the CUDA driver (``cuLaunchKernelEx`` of libcuda, via
ctypes), with everything prepared once.

numba-cuda's own launch types and packs every argument on each call (tens of
microseconds of Python per launch). A ``Prepared`` launch holds the kernel's handle, its
grid and its arguments packed once into one buffer of 64-bit words (every argument of
jitconv's kernels is a pointer or an int64, ``source.pointer_signature``), handed to the
driver as ``CU_LAUNCH_PARAM_BUFFER_POINTER``, and a launch configuration (grid, block,
stream) per stream it has run on; a run is then one driver call of four arguments on
torch's current stream (``cuLaunchKernelEx``: about 0.8 us less host time than
``cuLaunchKernel``'s twelve, docs/performance.md). The prepared buffer and configurations
are never written after they are built (threads share them). A launch whose words change
from run to run (a new output's address, x elsewhere, another device plan's metadata:
``launching.Run``) goes from a ``Words`` copy of the buffer that one thread owns and
writes in place: the driver has copied the arguments when the call returns, so the next
run may write them again.

A launch issued while torch captures a CUDA graph is recorded by the graph like any
other kernel, with these arguments.
"""

import ctypes

import torch

from jitconv.backends.cuda.state import STATE

_BUFFER_POINTER, _BUFFER_SIZE, _END = 1, 2, 0  # CU_LAUNCH_PARAM_* of cuda.h


def _driver():
    if STATE.driver is None:
        with STATE.lock:
            if STATE.driver is None:
                lib = ctypes.CDLL("libcuda.so.1")
                if not hasattr(lib, "cuLaunchKernelEx"):
                    raise RuntimeError("the CUDA driver has no cuLaunchKernelEx: jitconv "
                                       "needs a CUDA 12 or later driver")
                vp = ctypes.c_void_p
                # cuLaunchKernelEx and cuCtxGetCurrent have no argtypes: ctypes' conversions
                # through them cost about 1 us per launch; their callers pass each
                # argument as its C type (pointers as c_void_p or byref objects)
                lib.cuCtxPushCurrent_v2.argtypes = [vp]
                lib.cuCtxPopCurrent_v2.argtypes = [ctypes.POINTER(vp)]
                lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
                STATE.driver = lib
    return STATE.driver


def address(handle):
    """The integer value of a driver handle as numba-cuda holds it (a cuda-bindings
    object, or a ctypes pointer with the ctypes binding)."""
    if isinstance(handle, ctypes.c_void_p):
        return handle.value or 0
    return int(handle)


def _check(code, what):
    if code:
        name = ctypes.c_char_p()
        _driver().cuGetErrorName(code, ctypes.byref(name))
        raise RuntimeError(f"CUDA driver: {what} failed with "
                           f"{(name.value or b'?').decode()} ({code})")


try:  # torch's own accessor of the current stream's raw handle (what Triton uses)
    _raw_stream = torch._C._cuda_getCurrentRawStream
except AttributeError:  # pragma: no cover - older torch
    def _raw_stream(index):
        return torch.cuda.current_stream(index).cuda_stream


def current_stream(device_index):
    """The raw handle (an int) of torch's current stream on CUDA device ``device_index``."""
    return _raw_stream(device_index)


class LaunchConfig(ctypes.Structure):
    """``CUlaunchConfig`` of cuda.h (no launch attributes)."""
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("shared_bytes", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.c_void_p), ("num_attrs", ctypes.c_uint)]


MAX_STREAMS = 64  # configurations a prepared launch keeps (then it starts again)


class Words:
    """A thread's own copy of a prepared launch's argument buffer (``words``, written in
    place between launches) and the driver's ``extra`` array that points to it."""

    __slots__ = ("words", "extra")

    def __init__(self, prepared):
        self.words = type(prepared.words).from_buffer_copy(prepared.words)
        self.extra = prepared.extra_for(self.words)


class Prepared:
    """One kernel launch with its grid and arguments fixed. ``patch``: the argument words
    that a run writing a new output sets to that output's address, as ((index, delta),
    ...): word index gets the address + delta (addresses inside it too); an int i stands
    for ((i, 0),); None: none."""

    __slots__ = ("function", "grid", "block", "words", "size", "extra", "patch", "configs")

    def __init__(self, *, kernel, args, grid, block, patch=None):
        _driver()
        self.function = ctypes.c_void_p(address(kernel))
        self.grid = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
        self.block = tuple(int(b) for b in block) + (1,) * (3 - len(block))
        self.words = (ctypes.c_int64 * len(args))(*(int(a) for a in args))
        self.size = ctypes.c_size_t(ctypes.sizeof(self.words))
        self.extra = self.extra_for(self.words)
        self.patch = ((patch, 0),) if isinstance(patch, int) else patch
        self.configs = {}  # raw stream handle -> a reference to its LaunchConfig

    def extra_for(self, words):
        """The driver's ``extra`` array handing it ``words`` (a buffer of this launch's
        size)."""
        return (ctypes.c_void_p * 5)(_BUFFER_POINTER, ctypes.addressof(words),
                                     _BUFFER_SIZE, ctypes.addressof(self.size), _END)

    def _config(self, stream):
        config = LaunchConfig((ctypes.c_uint * 3)(*self.grid),
                              (ctypes.c_uint * 3)(*self.block), 0, stream, None, 0)
        if len(self.configs) >= MAX_STREAMS:
            self.configs.clear()
        found = self.configs[stream] = ctypes.byref(config)  # (which keeps config)
        return found

    def launch(self, stream, words=None):
        """Launch on ``stream`` (a raw handle) in the calling thread's current context
        (``in_context``), with the prepared arguments or those of ``words`` (a
        ``Words`` of this launch that the calling thread owns)."""
        config = self.configs.get(stream)
        if config is None:
            config = self._config(stream)
        code = STATE.driver.cuLaunchKernelEx(config, self.function, None,
                                             self.extra if words is None else words.extra)
        if code:
            _check(code, "cuLaunchKernelEx")


def in_context(context):
    """Whether ``context`` (an int handle: the device's primary context, which torch and
    numba-cuda share) is the calling thread's current context; if not, it is pushed and
    ``leave_context`` must follow the launches."""
    found = getattr(STATE.thread, "found", None)
    if found is None:  # the thread's (handle, reference to it), made once
        handle = ctypes.c_void_p()
        found = STATE.thread.found = (handle, ctypes.byref(handle))
    _driver().cuCtxGetCurrent(found[1])
    if found[0].value == context:
        return True
    _check(STATE.driver.cuCtxPushCurrent_v2(ctypes.c_void_p(context)), "cuCtxPushCurrent")
    return False


def leave_context():
    STATE.driver.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))
