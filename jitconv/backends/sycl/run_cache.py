"""Remembered launches: a layer's checked, packed kernel arguments, reused by a later run
whose tensors are described by the same key.

A model calls the conv once per layer and engine step, and a layer's weight, bias and
conv_state are the same tensors every step (x and the output often land at the same
addresses too: torch's caching allocator and jitconv's pool reuse them). The checks of a
run (shapes, dtypes, devices, strides, writability, aliasing, zero-copy access) read only
what the key below holds, so a run whose key was seen before, on a plan of the same
geometry, would pass them again and pack the same arguments: it goes straight to the
submit (a few microseconds of Python instead of ~60 on opencl:cpu).

What a key cannot show is whether memory at an address is still the same USM
allocation (a CPU tensor's memory can be freed and the address reused by plain host
memory). A weak reference to the allocation (or to the dpctl / dpnp array) guards that:
an entry whose guard died is never used. Torch XPU memory is device USM by construction.

Only launches that needed no copies are remembered, and only when the written tensors
(out, conv_state) share no memory with any other argument or themselves: then the
aliasing checks pass for every plan, whichever cache lines it writes. Entries hold no
tensor, only addresses, the kernel and the queue; the table is bounded and shared by
all threads (dict operations are atomic; entries are never changed after creation).

x (and a GDN stage's a and b) is the exception: an engine's x is a new tensor at every
layer and step (a projection's output, a part gathered by index_select), so a key holds
a torch x's address only modulo ``X_ALIGNMENT`` (what the kernel choice reads of it), and
a run kept for x at one address is submitted for x at another with x's parameters
replaced (``_Mover``), once x there is checked apart from conv_state and out and, for a
CPU tensor, inside a live USM allocation of jitconv's pool.

The GDN stage's runs are kept the same way (``stage_key``, ``_StageEntry``), with a,
b, A_log and dt_bias in the key: each run writes a new output buffer of the kept layout,
whose address replaces the outputs' parameters (``launching.set_stage_output``).
"""

import weakref
from dataclasses import dataclass

import torch

from jitconv.backends.sycl import bridge, launching, planner, tables, usm
from jitconv.backends.sycl.state import STATE
from jitconv.kernels.abi import ACTIVATIONS, MATHS, SPLIT_PARTS
from jitconv.memory import arrays

LIMIT = 512  # entries: several models' layers; the table starts over when it is full
_NAMES = ("x", "weight", "bias", "conv_state", "out")
# A torch x's address in a conv run's key: modulo this, a multiple of the widest row
# access of a wide kernel (``launching.WIDE_CHANNELS``) and of allocations' alignment.
X_ALIGNMENT = 512


def _tensor_key(t):
    """What the checks read from one argument, hashable; False for a kind that is never
    remembered (DLPack-only producers: each import may be a different buffer)."""
    if t is None:
        return None
    if isinstance(t, torch.Tensor):
        return (t.data_ptr(), t.shape, t.stride(), t.dtype, t.device, t.requires_grad,
                t.is_inference())
    iface = getattr(t, "__sycl_usm_array_interface__", None)
    if iface is None:
        return False
    # dpctl / dpnp arrays: by identity (a weak reference guards it) and by what their
    # interface says now (a shape can be set in place, a flag changed).
    return (id(t), iface["data"], tuple(iface["shape"]), iface.get("strides"),
            iface["typestr"], iface.get("offset"))


def _moving_key(t):
    """``_tensor_key`` of a tensor that may move (x; a stage's a and b): a torch tensor's
    address only modulo ``X_ALIGNMENT``."""
    if isinstance(t, torch.Tensor):
        return (t.data_ptr() % X_ALIGNMENT, t.shape, t.stride(), t.dtype, t.device,
                t.requires_grad, t.is_inference())
    return _tensor_key(t)


def key(x, weight, bias, conv_state, out, activation, math, queue, split=0, metadata=None):
    """The key of a run (``split``: its kernels.abi split mode; ``metadata``: a device
    plan's element types, whose runs take their own kernel), or None when it must be
    checked and packed from scratch. A torch x counts by its address modulo
    ``X_ALIGNMENT`` (the module docstring)."""
    if activation not in ACTIVATIONS or math not in MATHS or not launching.can_resubmit():
        return None
    parts = (_moving_key(x), _tensor_key(weight), _tensor_key(bias),
             _tensor_key(conv_state), _tensor_key(out))
    if False in parts:
        return None
    return (parts, activation, math, torch.is_grad_enabled(), torch.is_inference_mode_enabled(),
            queue, split, metadata)


def find(key, plan):
    """The entry for ``key`` if it fits ``plan``'s geometry and its memory is the same."""
    entry = STATE.runs.get(key)
    if entry is None or entry.geometry != plan.fit or not plan.num_blocks:
        return None
    for guard in entry.guards:
        if guard() is None:
            return None
    return entry


def _shares_memory(tensors, extents):
    """Whether a written argument (out, conv_state) could share memory with another
    argument or with itself (then the checks depend on the plan's cache lines)."""
    for written in ("out", "conv_state"):
        t = tensors[_NAMES.index(written)]
        if t is None:
            continue
        if arrays.strides_may_overlap(tuple(t.shape), tuple(t.stride())):
            return True
        for other in _NAMES:
            if other != written and arrays.extents_meet(extents[written], extents[other]):
                return True
    return False


def remember(key, tensors, views, extents, plan, kernel, queue, values, groups, wait, dtype):
    """Keep a checked zero-copy launch (``values`` as packed for ``plan``, over ``groups``
    channel groups: dim, or dim / C for a wide kernel) under ``key``."""
    if _shares_memory(tensors, extents):
        return
    x = tensors[0]
    moves = isinstance(x, torch.Tensor)  # (as ``_moving_key``)
    guards = []
    for t, name in zip(tensors, _NAMES):
        if t is None or (isinstance(t, torch.Tensor) and t.device.type != "cpu") or \
                (name == "x" and moves):  # (x's memory is checked at each run)
            continue
        anchor = views[name].memory if isinstance(t, torch.Tensor) else t.source
        try:
            guards.append(weakref.ref(anchor))
        except TypeError:  # no way to tell later whether it is the same memory
            return
    if len(STATE.runs) >= LIMIT:
        STATE.runs.clear()
    out_shape = tuple(tensors[0].shape)
    # The bytes a new output's address must be a multiple of: C elements (C = dim /
    # groups: 1 for the one-channel kernel, which any element address suits).
    align = out_shape[1] // groups * views["out"].itemsize
    movers = ()
    if moves:
        try:
            movers = (_Mover.of(x, views["x"], _x_params(x),
                                (extents["conv_state"], extents["out"])),)
        except TypeError:  # (as the guards': its allocation cannot be watched)
            return
    STATE.runs[key] = _Entry(geometry=plan.fit, kernel=kernel, queue=queue,
                             values=launching.addresses(values), groups=groups, align=align,
                             guards=tuple(guards), wait=wait, out_shape=out_shape,
                             dtype=dtype, movers=movers)


def _x_params(x):
    """``_Mover.params`` of x: its own packed array and the windows' stand-in, which
    repeats it (a remembered run has no windows: ``launching._pack``)."""
    return (("x", (0, x.stride(0))), ("win", (0, 0, 0, 0, 0)))


@dataclass(frozen=True, kw_only=True, slots=True)
class _Mover:
    """A tensor of a kept launch that may be elsewhere at a later run (x; a stage's a
    and b), and what a run with it elsewhere replaces and checks."""
    params: tuple  # ((packed array name, its scalars: offset 0, strides), ...)
    home: int  # the address the packed parameters hold
    guard: object  # a weak reference to a CPU tensor's allocation, or None
    cpu: bool  # a CPU tensor: elsewhere, it must be in a live USM allocation of the pool
    span: tuple  # (first, last + 1) byte of its extent, relative to its address
    nitems: int  # elements from its first to its last
    apart: tuple  # the byte extents it must not meet (the written tensors')

    @staticmethod
    def of(t, view, params, apart):
        """The mover of torch tensor ``t`` (``view``: its DeviceView, ``params``: as the
        field, ``apart``: byte extents, None for a tensor absent or empty). TypeError: a
        CPU tensor's allocation cannot be watched (no weak reference)."""
        start = t.data_ptr()
        first, last = arrays.byte_extent(t) or (start, start)  # (no elements)
        cpu = t.device.type == "cpu"
        return _Mover(params=params, home=start,
                      guard=weakref.ref(view.memory) if cpu else None, cpu=cpu,
                      span=(first - start, last - start),
                      nitems=(last - first) // t.element_size(),
                      apart=tuple(e for e in apart if e is not None))

    def where(self, t):
        """t's address if the parameters must be set to it, 0 if they hold it, or None
        when t there is not memory the launch may read (the checks will say why)."""
        address = t.data_ptr()
        if address == self.home and (self.guard is None or self.guard() is not None):
            return 0
        extent = (address + self.span[0], address + self.span[1])
        if any(arrays.extents_meet(extent, other) for other in self.apart):
            return None
        if self.cpu:
            found = usm.find_allocation(address)
            if found is None or found[1] + self.span[1] > found[0].nbytes:
                return None
        return address


def _moved(movers, tensors):
    """[(mover, its tensor's address)] of the ``movers`` whose tensors are elsewhere, or
    None when one of them is where the launch may not read it."""
    found = []
    for mover, t in zip(movers, tensors):
        address = mover.where(t)
        if address is None:
            return None
        if address:
            found.append((mover, address))
    return found


def _set_moved(values, moved):
    """The packed ``values``' parameters of each moved tensor set to its new address."""
    for mover, address in moved:
        for name, scalars in mover.params:
            launching.set_array(values, name, address, mover.nitems, *scalars)


@dataclass(frozen=True, kw_only=True, slots=True)
class _Entry:
    """A checked zero-copy launch, kept for the next run with the same tensors."""
    geometry: tuple  # the plan's ``fit``: what its tensors were checked against
    kernel: object
    queue: object
    values: list  # packed parameters, addresses where pointers go
    groups: int  # channel groups the kernel runs over (dim, or dim / C)
    align: int  # bytes a new output's address must be a multiple of
    guards: tuple  # weak references: the memory is the same while all are alive
    wait: bool
    out_shape: tuple
    dtype: str
    movers: tuple  # (x's ``_Mover``,), or () for a USM array x (kept by identity)

    def run(self, plan, x, out):
        """Submit the remembered launch with ``plan``'s tables: returns the output (the
        given ``out``, or a new one of x's kind), or None, having submitted nothing, when
        a new output is not aligned as the remembered kernel needs or x is where the
        launch may not read it (``_Mover.where``)."""
        moved = _moved(self.movers, (x,))
        if moved is None:
            return None
        target = out
        if out is None:
            # A new contiguous output of x's kind: USM memory of x's device (jitconv's
            # pool, torch XPU, or x's own library), so only its address is new. A wide
            # kernel needs its rows aligned: a fresh allocation is, but it is checked.
            target = bridge.empty_like_output(x, self.out_shape, self.dtype)
            address = bridge.address_of(target)
            if address % self.align:
                return None
        wait = self.wait
        if len(self.values) > launching.CONV_PARAMS:  # a fused kernel: the plan's record
            table_args, record, copies = planner.record_on(plan, self.queue)
            values, after, wait = launching.with_record(self.values, table_args, record), \
                None, wait or copies
        else:
            table_args, after = tables.for_run(plan, self.queue)
            values = launching.with_tables(self.values, table_args)
        if out is None:
            launching.set_out(values, address, self.out_shape)
        _set_moved(values, moved)
        if not wait:
            tables.mark_unwaited(plan)
        launching.submit_packed(self.kernel, self.queue, values,
                                (plan.num_blocks, self.groups), wait, after)
        return target


# ------------------------------------------------------------------ the GDN stage's runs

def stage_key(x, weight, bias, conv_state, activation, math, queue, stage_args,
              metadata=None):
    """``key`` of a GDN stage run: the conv's tensors', then a, b, A_log and dt_bias's
    and the head dims and flags (``stage_args``: (a, b, A_log, dt_bias, heads, l2norm,
    exp_g)). None: not a run to remember (as ``key``'s, or A_log or dt_bias not float32
    and contiguous: the launch reads a converted copy then)."""
    conv = key(x, weight, bias, conv_state, None, activation, math, queue, SPLIT_PARTS,
               metadata)
    a, b, A_log, dt_bias, heads, l2norm, exp_g = stage_args
    if conv is None or not all(isinstance(t, torch.Tensor) and t.dtype == torch.float32
                               and t.is_contiguous() for t in (A_log, dt_bias)) or \
            not all(isinstance(t, torch.Tensor) for t in (x, a, b)):
        return None
    parts = (_moving_key(a), _moving_key(b), _tensor_key(A_log), _tensor_key(dt_bias))
    if False in parts:
        return None
    return conv + (parts, heads, l2norm, exp_g)


def remember_stage(key, tensors, views, extents, plan, kernel, queue, values, grid, local,
                   wait, layout):
    """Keep a checked zero-copy stage launch under ``key``: ``tensors`` (x, weight,
    bias, conv_state, a, b, A_log, dt_bias), ``layout``: its output's (``_StageEntry``'s
    fields of that name)."""
    if _shares_memory(tensors[:4] + (None,), extents):
        return
    guards = []
    names = _NAMES[:4] + ("ga", "gb", "alog", "dtb")
    for t, name in zip(tensors, names):
        if t is None or t.device.type != "cpu" or name in ("x", "ga", "gb"):
            continue  # (x's, a's and b's memory is checked at each run)
        try:
            guards.append(weakref.ref(views[name].memory))
        except TypeError:  # no way to tell later whether it is the same memory
            return
    x, a, b = tensors[0], tensors[4], tensors[5]
    try:
        movers = tuple(_Mover.of(t, views[name], params, (extents["conv_state"],))
                       for t, name, params in ((x, "x", _x_params(x)),
                                               (a, "ga", (("ga", (0, a.stride(0))),)),
                                               (b, "gb", (("gb", (0, b.stride(0))),))))
    except TypeError:  # (as the guards': an allocation that cannot be watched)
        return
    if len(STATE.runs) >= LIMIT:
        STATE.runs.clear()
    STATE.runs[key] = _StageEntry(geometry=plan.fit, kernel=kernel, queue=queue,
                                  values=launching.addresses(
                                      values, launching.STAGE_KERNEL_POINTERS),
                                  grid=grid, local=local, guards=tuple(guards), wait=wait,
                                  movers=movers,
                                  **layout)


@dataclass(frozen=True, kw_only=True, slots=True)
class _StageEntry:
    """A checked zero-copy GDN stage launch, kept for the next run with the same
    tensors; each run writes a new output of the same layout."""
    geometry: tuple  # the plan's ``fit``
    kernel: object
    queue: object
    values: list  # packed parameters, addresses where pointers go
    grid: tuple
    local: tuple
    guards: tuple
    wait: bool
    x_like: str  # the output's dtype name: x's
    total: int  # elements of the output (``plan._stage_sizes``)
    itemsize: int
    dim: int
    part_rows: tuple
    gates_at: int
    gate_count: int
    align: int  # bytes the output's address must be a multiple of
    l2norm: tuple  # each part's first normalised row (a device plan's planner checks them)
    spec_slot0: int
    movers: tuple  # the ``_Mover`` of x, a and b

    def run(self, plan, x, a, b):
        """Submit the remembered launch with ``plan``'s tables into a new output: returns
        it, or None, having submitted nothing, when ``plan``'s stage outputs are laid out
        otherwise (other part rows), the output is not aligned as the kernel needs, or x,
        a or b is where the launch may not read it (``_Mover.where``)."""
        if plan.stage_layout() != (self.part_rows, self.spec_slot0):
            return None
        moved = _moved(self.movers, (x, a, b))
        if moved is None:
            return None
        target = bridge.empty_like_output(x, (self.total,), self.x_like)
        address = bridge.address_of(target)
        if address % self.align:
            return None
        table_args, after = tables.for_run(plan, self.queue, l2norm=self.l2norm)
        values = launching.with_tables(self.values, table_args)
        launching.set_stage_output(values, address, self.itemsize, self.dim,
                                   self.part_rows, self.gates_at, self.gate_count)
        _set_moved(values, moved)
        if not self.wait:
            tables.mark_unwaited(plan)
        launching.submit_packed(self.kernel, self.queue, values,
                                (plan.num_blocks,) + tuple(self.grid[1:]), self.wait,
                                after, local=self.local,
                                pointers=launching.STAGE_KERNEL_POINTERS)
        return target
