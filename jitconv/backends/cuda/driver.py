"""Kernel launches straight through the CUDA driver (``cuLaunchKernel`` of libcuda, via
ctypes), with everything but the stream prepared once.

numba-cuda's own launch types and packs every argument on each call (tens of
microseconds of Python per launch). A ``Prepared`` launch holds the kernel's handle, its
grid and its arguments packed once into one buffer of 64-bit words (every argument of
jitconv's kernels is a pointer or an int64, ``source.pointer_signature``), handed to the
driver as ``CU_LAUNCH_PARAM_BUFFER_POINTER``; a run is then one driver call on torch's
current stream. The driver copies the arguments when the call returns, so a prepared
buffer is never written after it is built (threads share it); a launch whose output
tensor is new at every run gets a copy with that one word replaced.

A launch issued while torch captures a CUDA graph is recorded by the graph like any
other kernel, with these arguments.
"""

import ctypes
import threading

import torch

_BUFFER_POINTER, _BUFFER_SIZE, _END = 1, 2, 0  # CU_LAUNCH_PARAM_* of cuda.h
_lock = threading.Lock()
_lib = None


def _driver():
    global _lib
    if _lib is None:
        with _lock:
            if _lib is None:
                lib = ctypes.CDLL("libcuda.so.1")
                vp, u = ctypes.c_void_p, ctypes.c_uint
                # cuLaunchKernel has no argtypes: ctypes' conversions through them cost
                # about 1 us per launch; Prepared passes each argument as its C type
                # (void* as c_void_p; grid and block extents, unsigned int, as Python ints:
                # C ints, the same registers, far below 2**31)
                lib.cuCtxGetCurrent.argtypes = [ctypes.POINTER(vp)]
                lib.cuCtxPushCurrent_v2.argtypes = [vp]
                lib.cuCtxPopCurrent_v2.argtypes = [ctypes.POINTER(vp)]
                lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
                _lib = lib
    return _lib


def _address(handle):
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


class Prepared:
    """One kernel launch with its grid and arguments fixed. ``patch``: the index of the
    argument word that ``launch(stream, value)`` replaces (a new output's address), or
    None."""

    __slots__ = ("function", "grid", "block", "words", "size", "extra", "patch", "head")

    def __init__(self, kernel, args, grid, block, patch=None):
        self.function = ctypes.c_void_p(_address(kernel))
        self.grid = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
        self.block = tuple(int(b) for b in block) + (1,) * (3 - len(block))
        self.words = (ctypes.c_int64 * len(args))(*(int(a) for a in args))
        self.size = ctypes.c_size_t(ctypes.sizeof(self.words))
        self.extra = self._extra(self.words)
        self.patch = patch
        # cuLaunchKernel's arguments before the stream: function, grid, block, shared bytes
        self.head = (self.function,) + self.grid + self.block + (0,)

    def _extra(self, words):
        return (ctypes.c_void_p * 5)(_BUFFER_POINTER, ctypes.addressof(words),
                                     _BUFFER_SIZE, ctypes.addressof(self.size), _END)

    def launch(self, stream, value=None):
        """Launch on ``stream`` (a raw handle) in the calling thread's current context
        (``in_context``); ``value``: the patched word's value."""
        extra = self.extra
        if self.patch is not None:
            words = type(self.words).from_buffer_copy(self.words)
            words[self.patch] = value
            extra = self._extra(words)
        code = _lib.cuLaunchKernel(*self.head, ctypes.c_void_p(stream), None, extra)
        if code:
            _check(code, "cuLaunchKernel")


_current = threading.local()


def in_context(context):
    """Whether ``context`` (an int handle: the device's primary context, which torch and
    numba-cuda share) is the calling thread's current context; if not, it is pushed and
    ``leave_context`` must follow the launches."""
    lib = _driver()
    out = getattr(_current, "out", None)
    if out is None:
        out = _current.out = ctypes.c_void_p()
    lib.cuCtxGetCurrent(ctypes.byref(out))
    if out.value == context:
        return True
    _check(lib.cuCtxPushCurrent_v2(ctypes.c_void_p(context)), "cuCtxPushCurrent")
    return False


def leave_context():
    _lib.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))
