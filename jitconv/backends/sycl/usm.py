"""USM memory jitconv allocates: torch CPU tensors in USM shared memory (``empty`` /
``zeros``) with a pool that recycles them, the registry that finds the allocation behind
such a tensor without a SYCL pointer query, and the int32 tables a plan owns.
"""

import bisect
import collections
import os
import threading
import weakref

import numpy as np
import torch

from jitconv.backends import devices
from jitconv.backends.sycl.state import STATE

try:
    import dpctl.memory as dpm  # noqa: E402  (devices bootstraps the runtime first)
except ImportError:  # a CUDA-only install: no USM memory (empty() then needs dpctl)
    dpm = None

if dpm is not None:
    class _SharedAllocation(dpm.MemoryUSMShared):
        """USM shared memory that can be weakly referenced (a Python subclass), so the
        pool's registry forgets it when the last tensor using it is gone."""


def find_allocation(address):
    """(memory, byte offset) of the jitconv.empty allocation holding ``address``, or None.
    A lookup, not a SYCL pointer query (those cost ~40 us each on opencl:cpu)."""
    return _pool.find(address)


class _Pool:
    """Freed jitconv.empty allocations, kept for reuse by size (like torch's caching
    allocator). A fresh USM allocation costs a system call and then a page fault per page
    on first touch: for a 128 MiB prefill output that was 3x the kernel's own time on
    opencl:cpu. At most ``limit`` bytes are kept: when a freed buffer would exceed it, the
    least recently freed buffers are really freed first (a server whose token count
    changes every step keeps recent sizes, not the first ones it saw).

    Two finalizers feed the pool: a tensor's memory coming back (``give``) and an
    allocation dying (``_unregister``). A finalizer runs wherever the last reference goes
    or the garbage collector starts, which can be inside a pool method on the same thread,
    holding the lock. So finalizers never wait for the lock: they queue their change and
    apply the queue only if the lock is free; whoever holds it applies the queue after
    releasing it (``_settle``). Memory is really freed outside the lock, so a USM free
    never runs while other threads wait for the pool."""

    def __init__(self, limit):
        self.limit, self.kept = limit, 0
        self.free = {}                      # (device, nbytes) -> [memory], newest last
        self.order = collections.OrderedDict()  # id(memory) -> (device, nbytes), oldest first
        self.lock = threading.Lock()
        self.pending = collections.deque()  # ("give", device, memory) / ("gone", base)
        # Every live allocation, in use or kept: base addresses sorted, and per base a weak
        # reference to it and its size (``find``).
        self.bases, self.sizes = [], {}

    # Finalizers: queue, then apply if nobody holds the lock.
    def give(self, device, memory):
        self.pending.append(("give", device, memory))
        self._settle()

    def _unregister(self, base):
        self.pending.append(("gone", base))
        self._settle()

    def _settle(self):
        """Apply queued finalizer changes while the lock can be taken without waiting. A
        holder calls this after releasing, so a change queued while it held the lock is
        applied by one side or the other: the finalizer queues before trying the lock, the
        holder looks at the queue after releasing it."""
        while self.pending and self.lock.acquire(blocking=False):
            dropped, change = [], None
            try:
                while self.pending:
                    change = self.pending.popleft()
                    if change[0] == "give":
                        self._keep(change[1], change[2], dropped)
                    else:
                        self._forget(change[1])
            finally:
                self.lock.release()
            # Memory evicted (and the last change's tuple) is really freed here, outside
            # the lock; its finalizer may queue more changes, which the loop applies.
            change = dropped = None

    def _keep(self, device, memory, dropped):
        key = (device, memory.nbytes)
        self.free.setdefault(key, []).append(memory)
        self.order[id(memory)] = key
        self.kept += memory.nbytes
        self._evict(self.limit, dropped)

    def _forget(self, base):
        # Only if the allocation registered at ``base`` is really gone: a new allocation
        # at the same address may have been registered before this change was applied.
        entry = self.sizes.get(base)
        if entry is None or entry[0]() is not None:
            return
        del self.sizes[base]
        i = bisect.bisect_left(self.bases, base)
        if i < len(self.bases) and self.bases[i] == base:
            del self.bases[i]

    def _evict(self, limit, dropped):
        """Move the least recently given buffers to ``dropped`` until at most ``limit``
        bytes are kept (caller holds the lock and frees ``dropped`` after releasing it)."""
        while self.kept > limit and self.order:
            oldest, key = self.order.popitem(last=False)
            bucket = self.free[key]
            i = next(i for i, m in enumerate(bucket) if id(m) == oldest)
            memory = bucket.pop(i)
            self.kept -= memory.nbytes
            dropped.append(memory)
            if not bucket:
                del self.free[key]

    # Called by jitconv code, never by a finalizer.
    def find(self, address):
        with self.lock:
            i = bisect.bisect_right(self.bases, address) - 1
            if i < 0:
                return None
            base = self.bases[i]
            ref, nbytes = self.sizes[base]
            memory = ref()
        self._settle()
        if memory is None or address >= base + nbytes:
            return None
        return memory, address - base

    def take(self, device, nbytes):
        memory = None
        with self.lock:
            spare = self.free.get((device, nbytes))
            if spare:
                memory = spare.pop()
                del self.order[id(memory)]
                self.kept -= nbytes
                if not spare:
                    del self.free[(device, nbytes)]
        self._settle()
        if memory is not None:
            return memory
        memory = _SharedAllocation(nbytes, queue=devices.get_queue(device))
        base = memory._pointer
        with self.lock:
            if base not in self.sizes:
                bisect.insort(self.bases, base)
            self.sizes[base] = (weakref.ref(memory), memory.nbytes)
        self._settle()
        weakref.finalize(memory, self._unregister, base)
        return memory

    def set_limit(self, limit):
        dropped = []
        with self.lock:
            previous, self.limit = self.limit, limit
            self._evict(limit, dropped)
        del dropped
        self._settle()
        return previous

    def kept_bytes(self):
        self._settle()
        return self.kept


def _limit_from_env():
    value = os.environ.get("JITCONV_POOL_BYTES", str(1 << 30))
    try:
        limit = int(value)
    except ValueError:
        limit = -1
    if limit < 0:
        raise ValueError(f"JITCONV_POOL_BYTES: expected a number of bytes >= 0, got {value!r}")
    return limit


def set_pool_limit(nbytes):
    """How many bytes of freed jitconv.empty memory are kept for reuse (default 1 GiB, or
    JITCONV_POOL_BYTES); 0 frees memory as soon as no tensor uses it. Lowering the limit
    frees the least recently used buffers now. Returns the previous limit."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise ValueError(f"nbytes: expected an int >= 0, got {nbytes!r}")
    return _pool.set_limit(nbytes)


def pool_bytes():
    """Bytes of freed memory the pool holds now."""
    return _pool.kept_bytes()


_pool = _Pool(_limit_from_env())


def empty(shape, dtype=torch.float32, device=None):
    """A torch CPU tensor in USM shared memory of ``device``: kernels use it with no copy.

    Works on any SYCL device (shared USM is host- and device-accessible); on an Intel GPU
    prefer torch XPU tensors, which live in device memory. Memory is recycled through a
    pool once no tensor uses it any more.
    """
    if isinstance(shape, int):
        shape = (shape,)
    shape = tuple(int(s) for s in shape)
    dtype = _dtype_of(dtype) if isinstance(dtype, str) else dtype
    device = device or devices.get_device()
    itemsize = torch.empty((), dtype=dtype).element_size()
    used = int(np.prod(shape, dtype=np.int64)) * itemsize
    memory = _pool.take(device, max(used, 1))
    # The numpy array holds `memory` while any tensor built on it lives; when the last one
    # goes, the array dies and the memory returns to the pool.
    host = np.frombuffer(memory, dtype=np.uint8)
    weakref.finalize(host, _pool.give, device, memory)
    return torch.from_numpy(host)[:used].view(dtype).view(shape)


def zeros(shape, dtype=torch.float32, device=None):
    """Like ``empty``, filled with zeros."""
    t = empty(shape, dtype, device)
    t.zero_()
    return t


def _dtype_of(dtype):
    """A torch dtype from a torch dtype or its name ("bfloat16", ...)."""
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype: expected a torch dtype or its name, got {dtype!r}")
    return dtype


def upload_tables(host_arrays, queue):
    """Copy int32 tables into a new USM shared allocation of the queue's context (a plan
    owns it and never writes it again). Returns (the dpctl memory object, element offsets
    of the tables in it)."""
    sizes = [len(a) for a in host_arrays]
    memory = dpm.MemoryUSMShared(4 * max(sum(sizes), 1), queue=queue)
    array = np.frombuffer(memory, dtype=np.int32)
    offsets, start = [], 0
    for a, n in zip(host_arrays, sizes):
        array[start:start + n] = a
        offsets.append(start)
        start += n
    return memory, offsets


def placeholder(queue):
    """Valid USM memory for an argument with no elements (the kernel never reads it)."""
    memory = STATE.placeholders.get(queue.sycl_context)
    if memory is None:
        memory = STATE.placeholders.setdefault(queue.sycl_context,
                                          dpm.MemoryUSMShared(64, queue=queue))
    return memory


class DeviceArray:
    """A copy of a torch CPU tensor in USM device memory of ``queue``, which jitconv takes
    zero-copy through ``__sycl_usm_array_interface__``: device memory the host does not
    read, as torch XPU tensors are on a GPU. Needs only dpctl.memory (dpctl 0.22 has no
    dpctl.tensor to make such arrays). Dtypes with a numpy type string: float32, float16,
    integers (bfloat16 has none)."""

    _TYPESTR = {torch.float32: "<f4", torch.float16: "<f2", torch.int32: "<i4",
                torch.int64: "<i8", torch.int16: "<i2", torch.uint8: "|u1"}

    def __init__(self, tensor, queue):
        if tensor.dtype not in self._TYPESTR:
            raise TypeError(f"tensor: DeviceArray takes {sorted(map(str, self._TYPESTR))},"
                            f" got {tensor.dtype}")
        t = tensor.detach().contiguous()
        self.dtype, self.shape, self.sycl_queue = t.dtype, tuple(t.shape), queue
        self.usm_data = dpm.MemoryUSMDevice(max(t.numel() * t.element_size(), 1),
                                            queue=queue)
        if t.numel():
            self.usm_data.copy_from_host(t.view(torch.uint8).reshape(-1).numpy())
        self.__sycl_usm_array_interface__ = {
            "data": (self.usm_data._pointer, False), "shape": self.shape, "strides": None,
            "typestr": self._TYPESTR[t.dtype], "version": 1, "syclobj": queue}

    def to_tensor(self):
        """A torch CPU copy (waits for the work queued before it on an in-order queue)."""
        raw = np.frombuffer(self.usm_data.copy_to_host(), dtype=np.uint8)
        t = torch.from_numpy(raw.copy())
        return t[:int(np.prod(self.shape)) * torch.empty((), dtype=self.dtype)
                 .element_size()].view(self.dtype).view(self.shape)
