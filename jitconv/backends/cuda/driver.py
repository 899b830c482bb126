"""Kernel launches straight through the CUDA driver (``cuLaunchKernelEx`` of libcuda, via
ctypes), with everything prepared once.

numba-cuda's own launch types and packs every argument on each call (tens of
microseconds of Python per launch). A ``Prepared`` launch holds the kernel's handle, its
grid and its arguments packed once into one buffer of 64-bit words (every argument of
jitconv's kernels is a pointer or an int64, ``source.pointer_signature``), handed to the
driver as ``CU_LAUNCH_PARAM_BUFFER_POINTER``, and a launch configuration (grid, block,
stream) per stream it has run on; a run is then one driver call of four arguments on
torch's current stream (``cuLaunchKernelEx``: about 0.8 us less host time than
``cuLaunchKernel``'s twelve, docs/performance.md). The driver copies the arguments when
the call returns, so a prepared buffer or configuration is never written after it is
built (threads share them); a launch whose output tensor is new at every run, or whose
words naming a device plan's memory are another plan's (``launching.Run``), gets a copy
of the buffer with those words replaced.

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


class Prepared:
    """One kernel launch with its grid and arguments fixed. ``patch``: the argument words
    that ``launch(stream, value)`` replaces, as ((index, delta), ...): word index gets
    value + delta (a new output's address, and addresses inside it); an int i stands for
    ((i, 0),); None: none."""

    __slots__ = ("function", "grid", "block", "words", "size", "extra", "patch", "configs")

    def __init__(self, *, kernel, args, grid, block, patch=None):
        _driver()
        self.function = ctypes.c_void_p(address(kernel))
        self.grid = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
        self.block = tuple(int(b) for b in block) + (1,) * (3 - len(block))
        self.words = (ctypes.c_int64 * len(args))(*(int(a) for a in args))
        self.size = ctypes.c_size_t(ctypes.sizeof(self.words))
        self.extra = self._extra(self.words)
        self.patch = ((patch, 0),) if isinstance(patch, int) else patch
        self.configs = {}  # raw stream handle -> a reference to its LaunchConfig

    def rebound(self, at, values):
        """This launch with argument words replaced: word i set to values[name] for each
        (i, name) of ``at``."""
        copy = Prepared.__new__(Prepared)
        copy.function, copy.grid, copy.block = self.function, self.grid, self.block
        copy.words = self._replaced(at, values)
        copy.size = self.size
        copy.extra = copy._extra(copy.words)
        copy.patch, copy.configs = self.patch, {}
        return copy

    def _replaced(self, at, values):
        """A copy of the argument buffer with ``rebound``'s replacements."""
        buffer = type(self.words).from_buffer_copy(self.words)
        for index, name in at:
            buffer[index] = values[name]
        return buffer

    def _extra(self, words):
        return (ctypes.c_void_p * 5)(_BUFFER_POINTER, ctypes.addressof(words),
                                     _BUFFER_SIZE, ctypes.addressof(self.size), _END)

    def _config(self, stream):
        config = LaunchConfig((ctypes.c_uint * 3)(*self.grid),
                              (ctypes.c_uint * 3)(*self.block), 0, stream, None, 0)
        if len(self.configs) >= MAX_STREAMS:
            self.configs.clear()
        found = self.configs[stream] = ctypes.byref(config)  # (which keeps config)
        return found

    def launch(self, stream, value=None, at=(), values=None, moved=()):
        """Launch on ``stream`` (a raw handle) in the calling thread's current context
        (``in_context``); ``value``: the patched word's value; ``at``, ``values``: as
        ``rebound``'s, and ``moved``: ((word index, value), ...), written into a copy of
        the arguments for this launch only."""
        config = self.configs.get(stream)
        if config is None:
            config = self._config(stream)
        extra = self.extra
        if self.patch is not None or at or moved:
            buffer = self._replaced(at, values)
            for index, word in moved:
                buffer[index] = word
            if self.patch is not None:
                for index, delta in self.patch:
                    buffer[index] = value + delta
            extra = self._extra(buffer)  # (buffer lives until the driver has copied it)
        code = STATE.driver.cuLaunchKernelEx(config, self.function, None, extra)
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
