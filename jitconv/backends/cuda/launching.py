"""The CUDA device: torch CUDA tensors in and out, zero-copy, the conv kernel of
``kernels`` (the same template as the SYCL kernel) launched on torch's current CUDA
stream. Needs numba-cuda (``pip install 'jitconv[cuda]'``); neither dpctl nor numba-dpex.

Memory: each tensor reaches the kernel as the device address of its first element (no
copy; the kernel takes typed pointers, ``kernels.pointer_signature``) with element
strides as scalars, the layout the SYCL backend uses too (there, flat arrays from the
first to the last element). fp16/bf16 are read as int16 (their bit patterns). A host
plan's int32 tables are copied to the device once per plan and device; a device plan's
(``jitconv.device_plan``) are written by its planner kernel before each conv launch.

Launches: the first run of a plan on a set of tensors works out the kernel and packs its
arguments (``driver.Prepared``) and keeps them under the run's key (``run_key``); a later
run with the same key is the driver launch(es) alone (``run_remembered``). A device
plan's runs are also kept by its ``signature`` (everything its launches depend on but
the addresses of its metadata, tables and error words): an engine builds a new plan
from new metadata tensors at every step, and the first run of each layer's tensors on
it launches those of an earlier plan of the same signature with those addresses
replaced (``_kept_run``), not a new preparation: each thread writes its own copy of a
run's words in place (``Frame``), so such a run costs a kept plan's run plus the writing
of those words. Runs of host plans refuse to be captured in a CUDA graph (``backend``).

Order: the kernels go on torch's current stream of x's device, so they are ordered with
torch's work before and after them; ``run`` does not wait for them.

numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1, numba-cuda installed) runs the same
kernels as Python on the CPU: then "cuda:0" is listed, ``jitconv.set_device("cuda:0")``
works, and torch CPU tensors go through this backend (tests/test_cuda.py runs that way in
CI). The simulator checks the kernel's logic (indexing, bounds guard, tables, state
updates); it cannot check code generation, the pointer arguments (it passes numpy
arrays), the LLVM conversion intrinsics (it runs their Python twins, see
``bit_conversions``), fastmath, streams or speed.
"""

import functools
from threading import get_ident

import numpy as np
import torch

from jitconv.kernels import planner, tuning
from jitconv.memory.arrays import byte_extent, extents_meet
from jitconv.kernels.abi import (CONV_ARGS, SPLIT_NONE, SPLIT_PARTS, rows_aligned,
                                 stage_divisors)
from jitconv.backends.cuda import driver
from jitconv.backends.cuda.state import STATE
from jitconv.backends.cuda.devices import architecture, have_numba_cuda, native_bf16, simulating
from jitconv.backends.cuda.source import (ARG_NAMES, CALL_ARGS, EXTRA_ARGS, LAYOUT_ARGS,
                                          STAGE_NAMES, STATE_CHUNK_EXTRA, KernelSpec,
                                          plan_kind, record_args_taken, short_tokens_for)

_SIXTEEN_BIT = (torch.float16, torch.bfloat16)

KINDS = ("general", "decode", "spec")


def _fast_exp(tune, math=None):
    """Whether silu's exp and division are the GPU's approximate instructions (as in
    vLLM's Triton kernels; within the contract's tolerances, NaN and inf kept): the call's
    ``math``, or the tuning's value when it is None."""
    return tune.fast_exp if math is None else math == "fast"


def _arch(device):
    return "simulator" if simulating() else architecture(device)


def kind_of(short_tokens):
    return "general" if not short_tokens else "decode" if short_tokens == 1 else "spec"


def channels_for(dim, channels):
    """``channels`` per thread, halved until it divides dim (no per-channel guard)."""
    while channels > 1 and dim % channels:
        channels //= 2
    return channels


def lookahead_for(tune, longest_block):
    """L of a launch whose longest block holds ``longest_block`` tokens."""
    if tune.lookahead:
        return tune.lookahead
    return tune.short_lookahead if longest_block <= tune.short_lookahead else tune.long_lookahead


def _aligned(t, group):
    return rows_aligned(t.data_ptr(), t.element_size(), t.shape, t.stride(), group)


def vector_taps_for(weight, tune):
    """Whether a launch reads each channel's taps as one vector: the tuning value and a
    (dim, 4) weight with contiguous taps in rows of 4 (the kernel reads channel c's at
    4 c) and its first element aligned to 4 elements (``abi.rows_aligned``)."""
    return (tune.vector_taps and weight.shape[1] == 4
            and (weight.stride(0) == 4 or weight.shape[0] == 1) and _aligned(weight, 4))


def row_group_for(channels, tune, x, target, conv_state, out2=None):
    """(G, grouped state) of a launch. G: the tuning's channels per access to rows of x
    and out (and out2, the spec part's split output), halved until it divides
    ``channels`` and the rows of those (tokens, dim) tensors are aligned to it
    (``abi.rows_aligned``). Grouped state: the conv state accessed G channels at a time
    too, where the tuning asks for it, G > 1 and its channels are contiguous and aligned
    to G."""
    rows = (x, target) if out2 is None else (x, target, out2)  # (x may stand in)
    group = tune.row_group
    while group > 1 and (channels % group or not all(_aligned(t, group) for t in rows)):
        group //= 2
    return group, group > 1 and tune.group_state and _aligned(conv_state, group)


def get_kernel(spec):
    """The dispatcher of a ``source.KernelSpec``, compiled once per process."""
    kernel = STATE.kernels.get(spec)
    if kernel is None:
        with STATE.lock:
            kernel = STATE.kernels.get(spec)
            if kernel is None:
                from jitconv.backends.cuda.kernels import make_conv_kernel  # numba-cuda
                kernel = STATE.kernels[spec] = make_conv_kernel(spec)
    return kernel


def kind_spec(width, dtype_name, kind, arch="sm_90", dim=8192):
    """The KernelSpec of a launch of one kind ("general": prefill and mixed steps,
    "decode": one token per sequence, "spec": verify sequences of up to width - 1 +
    STATE_CHUNK_EXTRA tokens) on tensors laid out as vLLM's (aligned rows, a (dim, 4)
    weight, contiguous state channels), without a compiled-in layout: what ``python -m
    jitconv show-kernel cuda`` prints. ``launch`` makes the same choices from the plan and
    the tensors."""
    if kind not in KINDS:
        raise ValueError(f"kind: expected one of {KINDS}, got {kind!r}")
    short = tuning.cuda(arch, dtype_name, "general").short_kernel
    short_tokens = {"general": 0, "decode": 1,
                    "spec": width - 1 + STATE_CHUNK_EXTRA}[kind] if short else 0
    tune = tuning.cuda(arch, dtype_name, kind_of(short_tokens))
    channels = channels_for(dim, tune.channels)
    group = tune.row_group
    while group > 1 and channels % group:
        group //= 2
    return KernelSpec(width=width, dtype_name=dtype_name, channels=channels,
                      fastmath=tune.fastmath,
                      lookahead=lookahead_for(tune, short_tokens or 2 * tune.long_lookahead),
                      fast_exp=_fast_exp(tune), max_registers=tune.max_registers or None,
                      short_tokens=short_tokens, row_group=group,
                      early_weights=tune.early_weights,
                      group_state=group > 1 and tune.group_state,
                      vector_taps=width == 4 and tune.vector_taps,
                      uniform_decode=short_tokens == 1 and tune.uniform_decode)


def launch_shape(groups, num_blocks, threads):
    """(grid, block): x threads over channel groups (a multiple of 32, at most
    ``threads``), y threads over token blocks; the grid is rounded up (the kernel
    guards). Grid x runs over token blocks (no 65535 limit there), grid y over channel
    tiles."""
    tx = min(threads, 32 * -(-groups // 32))
    ty = max(1, threads // tx)
    return (-(-num_blocks // ty), -(-groups // tx)), (tx, ty)


def _as_kernel_arg(t, sim):
    """What the kernel gets for tensor t (zero-copy): on a GPU the address of its first
    element (the kernel's pointer, read with t's strides), in the simulator t's elements
    from its first to its last as a 1-D numpy array (over the tensor's CPU memory)."""
    if not sim:
        return t.data_ptr()  # an empty tensor's is never read
    bits = t.view(torch.int16) if t.dtype in _SIXTEEN_BIT else t
    if t.numel() == 0:  # nothing is read or written: any valid memory
        bits = torch.zeros(1, dtype=bits.dtype)
    extent = 1 + sum((n - 1) * s for n, s in zip(bits.shape, bits.stride()))
    return bits.as_strided((extent,), (1,)).numpy()


def _tables(plan, device, sim, stream=None):
    """The plan's tables as the kernel's argument (``_as_kernel_arg`` of one int32
    tensor on ``device``) and their offsets. A host plan's are copied once per plan and
    device (the plan keeps the tensor); a device plan's are written by its planner before
    each conv launch, into a table of its own per device and stream (runs on one stream
    are ordered; on two they would race for one table)."""
    cache = _plan_state(plan).setdefault("tables", {})
    where = (str(device), stream)
    found = cache.get(where)
    if found is None:
        if plan.on_device:
            size, offsets = plan.table_layout()
            tensor = torch.empty(size, dtype=torch.int32,
                                 device="cpu" if sim else device)
        else:
            host = [np.asarray(a, np.int32) for a in plan.host_tables]
            offsets = tuple(int(o) for o in np.cumsum([0] + [len(a) for a in host[:-1]]))
            tensor = torch.from_numpy(np.concatenate(host + [np.zeros(1, np.int32)]))
            if not sim:
                tensor = tensor.to(device)
        found = cache.setdefault(where, (_as_kernel_arg(tensor, sim), offsets, tensor))
    return found[0], found[1]


def _plan_state(plan):
    """What this backend derived from ``plan`` (a dict in ``plan.derived``)."""
    found = plan.derived.get("cuda")
    if found is None:
        with STATE.lock:
            found = plan.derived.setdefault("cuda", {})
    return found


def _once_per_plan(plan, name, compute):
    """``compute()``, worked out once per plan and kept for it under ``name``: what depends
    only on the step's metadata, which every layer's launch of the plan shares."""
    state = _plan_state(plan)
    found = state.get(name)
    if found is None:
        found = state.setdefault(name, compute())
    return found


def _plan_short_tokens(plan):
    """The short kernel a plan's launches can run (``source.short_tokens_for``)."""
    def compute():
        if plan.has_chains:  # the chain piece is in the general kernel only
            return 0
        return short_tokens_for(plan.geometry.width, plan.longest_sequences)
    return _once_per_plan(plan, "_cuda_short_tokens", compute)


def _uniform_decode(plan, short_tokens, tune):
    """The uniform decode kernel for this launch: the tuning asks for it, a decode kernel
    (short_tokens 1) and a plan whose sequences allow it (``plan.uniform_decode``)."""
    return short_tokens == 1 and tune.uniform_decode and plan.uniform_decode


def launch(plan, x, weight, bias, conv_state, target, silu, dtype, math=None, key=None,
           new_output=False, out2=None, split=SPLIT_NONE, spec_slot0=0, windows=None,
           stage=None):
    """One run of ``plan`` on checked tensors into ``target`` (StepPlan._launch checked
    them and chose target: channels of x and target contiguous, target apart from x):
    for a device plan its planner, then the conv kernel, on torch's current stream. With
    a ``key`` (``run_key``) the prepared launches are kept for ``run_remembered``;
    ``new_output``: target is a new tensor at every such run. ``split``, ``out2``,
    ``spec_slot0``: split outputs (``backends.Launch``); ``windows``: the intermediate
    windows; ``stage``: the GDN stage's ``StageTensors`` (``backends.Launch``: one warp
    per q or k head, so head_k_dim / 32 channels per thread, and in the simulator, whose
    lane sum is a thread block's, thread blocks of 32 x 1)."""
    sim = simulating()
    if not sim and not have_numba_cuda():
        raise RuntimeError("x: a CUDA tensor, but numba-cuda is not installed: "
                           "pip install 'jitconv[cuda]'")
    if plan.on_device and not sim and plan.device != x.device:
        raise ValueError(f"x: on {x.device}, but the plan's metadata is on {plan.device}")
    dim = x.shape[1]
    if weight.dim() == 3:  # (dim, 1, width)
        weight = weight[:, 0, :]
    width = plan.geometry.width
    arch = _arch(x.device)
    short = tuning.cuda(arch, dtype, "general").short_kernel
    short_tokens = _plan_short_tokens(plan) if short else 0
    tune = tuning.cuda(arch, dtype, kind_of(short_tokens))
    channels = channels_for(dim, tune.channels)
    if stage is not None:
        channels = stage.head_k_dim // 32
    if split != SPLIT_PARTS:
        out2 = None
    row_group, group_state = row_group_for(channels, tune, x, target, conv_state, out2)
    threads = 32 if stage is not None and sim else tune.threads
    grid, block = launch_shape(dim // channels, plan.num_blocks, threads)
    stream = None if sim else driver.current_stream(x.device.index)

    # a plan with rules: the rule planner amends the planner's table (no fused kernel);
    # with token maps every kernel reads the rows the planner writes there; a stage run
    # whose first normalised rows only the planner checks needs its launch too
    fused = plan.on_device and tune.fused_planner and not plan.rules \
        and plan.maps is None and (stage is None or _l2norm_unchecked(stage))

    def kernels_and_args():
        """[(kernel, args, grid, block)]: the planner's launch (device plans, unless the
        conv kernel plans its own blocks: ``fused``), then the conv kernel's; the index
        of out's address among the conv's arguments; those of the tensors that may move
        (``Run.moved``)."""
        record_types = record_values = kind = None
        if fused:  # no table: any valid memory, never read (rows are consecutive)
            record_types, record_values = _planner_values(plan, sim)
            if tune.constant_plan:
                kind = plan_kind(record_values)
            tables, offsets = record_values["errors"], (0, 0, 0)
        else:
            tables, offsets = _tables(plan, x.device, sim, stream)
        args = _arguments(tables, offsets, plan, x, weight, bias, conv_state, target, silu,
                          dim, sim, out2, split, spec_slot0, windows)
        layout = _layout(args) if tune.constant_layout else None
        compact = layout is not None and tune.compact_args
        fixed = block if layout is not None and tune.fixed_block else None
        spec = KernelSpec(
            width=width, dtype_name=dtype, channels=channels, fastmath=tune.fastmath,
            lookahead=lookahead_for(tune, plan.longest_block), fast_exp=_fast_exp(tune, math),
            max_registers=tune.max_registers or None, native_bf16=native_bf16(x.device),
            short_tokens=short_tokens, row_group=row_group, layout=layout,
            early_weights=tune.early_weights, group_state=group_state,
            vector_taps=vector_taps_for(weight, tune), block=fixed, compact_args=compact,
            exact_grid=tune.exact_grid,
            uniform_decode=_uniform_decode(plan, short_tokens, tune), fused_plan=record_types,
            shared_record=tune.shared_record, plan_kind=kind, chains=plan.has_chains,
            stage=stage is not None)
        names = CALL_ARGS if compact else ARG_NAMES
        if compact:  # the layout's values are in the kernel: pass the per-call ones
            args = tuple(args[i] for i in _call_at())
        # the conv's arguments by name, for the words another plan of the signature sets
        bound = _bound_at(names + (record_args_taken(kind) if fused else ()), not fused)
        if fused:
            args += tuple(record_values[a] for a in record_args_taken(kind))
        patch_at = ((names.index("out"), 0),)
        if stage is not None:
            args += _stage_arguments(stage, sim)
            patch_at = _stage_patch(stage, names, args, sim)
        moved = ((names.index("x"), names.index("out")) if into_x else
                 (names.index("x"),),)
        if stage is not None:  # a and b, among the stage kernel's last arguments
            first = len(args) - len(STAGE_NAMES)
            moved += ((first + STAGE_NAMES.index("ga"),), (first + STAGE_NAMES.index("gb"),))
        launches = [(get_kernel(spec), args, grid, block, bound)]
        if plan.on_device and not fused:
            planning = [_planner_launch(plan, tables, sim,
                                        None if stage is None else stage.l2norm)
                        + (_bound_at(planner.PLAN_ARGS, True),)]
            if plan.rules:
                planning.append(_rules_launch(plan, tables, offsets, sim, windows) + ((),))
            launches[:0] = planning
        return launches, patch_at, moved

    # the run writes into x (out is x): x's address is also out's word
    into_x = not new_output and stage is None and target.data_ptr() == x.data_ptr()
    if sim:
        for kernel, args, grid_, block_, _bound in kernels_and_args()[0]:
            kernel[grid_, block_](*args)
        return
    from numba import cuda
    with cuda.gpus[x.device.index]:
        launches, patch_at, moved = kernels_and_args()
        context = driver.address(cuda.current_context().handle)
        # Each dispatcher's one compiled kernel (source.pointer_signature), launched
        # through the driver with its arguments packed once (``driver``): the
        # dispatcher's call would type the arguments again at every launch (about 65 us
        # of Python on the H200 machine).
        prepared, bound = [], []
        for n, (kernel, args, grid_, block_, at) in enumerate(launches):
            (compiled,) = kernel.overloads.values()
            patch = patch_at if new_output and n == len(launches) - 1 else None
            prepared.append(driver.Prepared(
                kernel=compiled._codelibrary.get_cufunc().handle, args=args, grid=grid_,
                block=block_, patch=patch))
            bound.append(at)
    if stage is not None:  # the patched words point into the stage's one output
        target = stage.buffer
    output = (tuple(target.shape), target.dtype, target.device) if new_output else None
    movers = (x,) if stage is None else (x, stage.a, stage.b)
    run = Run(tuple(prepared), context, output, tuple(bound), moved,
              tuple(t.data_ptr() for t in movers),
              _apart(movers, weight, bias, conv_state, target, into_x, new_output))
    run.launch(stream, target)
    if key is not None:
        _keep(plan, key, run)


def _apart(movers, weight, bias, conv_state, target, into_x, new_output):
    """``Run.apart``: per tensor that may move (x, and a stage's a and b), its byte extent
    relative to its address and the extents it must not meet at another address
    (``validation.check_aliasing``'s and ``check_stage``'s rules): conv_state's (written
    while they are read), and for x weight's and bias's when the run writes into x, and a
    separate out's (x meeting it is a run through a copy)."""
    state = byte_extent(conv_state)
    found = []
    for n, t in enumerate(movers):
        others = [state]
        if n == 0:
            others += [byte_extent(weight), byte_extent(bias)] if into_x else \
                [] if new_output else [byte_extent(target)]
        extent = byte_extent(t)
        start = t.data_ptr()
        lo, hi = (0, 0) if extent is None else (extent[0] - start, extent[1] - start)
        found.append((lo, hi, tuple(e for e in others if e is not None)))
    return tuple(found)


# Remembered launches per plan, and per signature (``_signed``): a plan serves a step's
# layers, up to 48 in the models served, each with a conv and a stage run and their
# split modes. Below a whole step's runs, every step would prepare its launches again.
MAX_RUNS = 256
MAX_SIGNATURES = 16  # signatures whose runs are kept (each step shape is one)
_NO_RUNS = {}  # (never written)
# The words of a device plan's launches that name its own memory: its metadata arrays,
# its table and its error words (what another plan of its signature replaces).
BOUND_WORDS = frozenset(planner.METADATA_ARRAYS + ("tables", "errors"))


def _bound_at(names, with_tables):
    """((argument index, name), ...) of the BOUND_WORDS among a launch's arguments
    ``names`` (the table's only ``with_tables``: a fused kernel's table argument is
    any memory, never read)."""
    return tuple((i, n) for i, n in enumerate(names)
                 if n in BOUND_WORDS and (with_tables or n != "tables"))


def _signed(plan, state):
    """The runs kept for device plans of ``plan``'s signature (a dict: run key -> Run),
    shared by those plans; None for a plan without signature. Found once per plan:
    looking up a signature hashes all of it."""
    found = state.get("signed")
    if found is None:
        signature = plan.signature
        if signature is None:
            return None
        with STATE.lock:
            found = STATE.signed_runs.get(signature)
            if found is None:
                if len(STATE.signed_runs) >= MAX_SIGNATURES:
                    STATE.forget_signed()
                found = STATE.signed_runs[signature] = {}
        state["signed"] = found
    return found


def _runs_of(plan, state):
    """The dict of runs (run key -> Run) that ``plan``'s runs are kept in: for a device
    plan with a signature, that signature's (shared by every plan of it: an engine's plan
    of each step runs the launches prepared on an earlier step's, with its own words,
    ``_bound_values``), else the plan's own."""
    signed = _signed(plan, state)
    if signed is not None:
        return signed
    runs = state.get("runs")
    if runs is None:
        runs = state.setdefault("runs", {})
        STATE.plans_with_runs.add(plan)
    return runs


def _keep(plan, key, run):
    """Keep ``run`` for the next run under ``key`` of ``plan``, or of a device plan of
    its signature."""
    runs = _runs_of(plan, _plan_state(plan))
    if len(runs) >= MAX_RUNS:
        runs.clear()
    runs[key] = run


def _bound_values(plan, state, stream):
    """The values of the words of a run's launches that name ``plan``'s memory, by name
    (its metadata arrays, its table on ``stream``, its error words): one dict per plan
    and stream, which every layer's run of the plan shares and ``Run.launch`` fills as
    its words need (``_bound_value``)."""
    values = state.get(("bound", stream))
    if values is None:
        values = state.setdefault(("bound", stream), {})
    return values


def _bound_value(plan, name, stream):
    if name == "errors":
        return errors_of(plan).data_ptr()
    if name == "tables":
        return _tables(plan, plan.device, False, stream)[0]
    return plan.kernel_arrays[name][0].data_ptr()


MAX_THREADS = 64  # threads whose words a run keeps (then it starts again)


class Frame:
    """One thread's argument words of a run's launches (``driver.Words`` each), written
    in place: the device plan whose memory the bound words name (``values``: a
    ``_bound_values`` dict, None for the words the run was prepared with) and the moved
    words set (``moved``, as ``Run.moved_words`` gave them)."""

    __slots__ = ("words", "values", "moved")

    def __init__(self, launches):
        self.words = tuple(driver.Words(p) for p in launches)
        self.values, self.moved = None, ()


class Run:
    """A run's prepared launches (``driver.Prepared``), kept for the next run with the
    same tensors (``run_key``: the addresses of x, and of a stage's a and b, only up to
    their alignment). ``output``: (shape, dtype, device) of the new tensor each run
    writes (out was None), or None (the caller's out). ``bound``: per launch, the words
    that name the plan's own memory (``_bound_at``). Per tensor that may move (x, a, b:
    the "movers"): ``moved``, the conv launch's (the last) words holding its address
    (x's, and out's when the run writes into x), set at a run where it is elsewhere
    (``moved_words``); ``homes``, the addresses they hold; ``apart``, its byte extent
    relative to its address and the extents it must not meet (``_apart``).

    Every thread that launches the run writes its own copy of the words (``Frame``,
    ``frames`` by thread): for another plan of the signature only the bound words
    change, and only when the plan does (once per layer and step in an engine); nothing
    is copied per launch."""

    __slots__ = ("launches", "context", "output", "bound", "moved", "homes", "apart",
                 "frames")

    def __init__(self, launches, context, output, bound, moved, homes, apart):
        self.launches, self.output, self.bound = launches, output, bound
        self.context = context  # the device's primary context (int handle)
        self.moved, self.homes, self.apart = moved, homes, apart
        self.frames = {}  # thread ident -> Frame

    def moved_words(self, movers):
        """The words to set for a run with ``movers`` (x, and a stage's a and b) at their
        addresses: ((word, address), ...), () when each is where the run was prepared;
        None when one's memory there meets a tensor it must not (the run is not for
        these tensors: the checks will say why)."""
        words = ()
        for t, home, at, (lo, hi, others) in zip(movers, self.homes, self.moved,
                                                 self.apart):
            address = t.data_ptr()
            if address == home:
                continue
            extent = (address + lo, address + hi)
            if any(extents_meet(extent, other) for other in others):
                return None
            words += tuple((i, address) for i in at)
        return words

    def _frame(self):
        frames, ident = self.frames, get_ident()
        frame = frames.get(ident)
        if frame is None:
            if len(frames) >= MAX_THREADS:
                frames.clear()  # (a thread launching now holds its frame)
            frame = frames[ident] = Frame(self.launches)
        return frame

    def _bind(self, frame, values, plan, stream):
        """Set ``frame``'s bound words to ``values`` (the prepared words when None),
        filling in those ``values`` lacks from ``plan``'s memory on ``stream``."""
        for prepared, words, at in zip(self.launches, frame.words, self.bound):
            for index, name in at:
                if values is None:
                    value = prepared.words[index]
                else:
                    value = values.get(name)
                    if value is None:
                        value = values.setdefault(name, _bound_value(plan, name, stream))
                words.words[index] = value
        frame.values = values

    def launch(self, stream, target, moved=(), values=None, plan=None):
        """The launches on ``stream`` into ``target``, with ``moved`` ((word, address),
        ... from ``moved_words``) and, when ``values`` is given, the bound words of
        ``plan`` (``_bound_values``: a device plan of the signature of the one the run
        was prepared for)."""
        frame = self._frame()
        if frame.values is not values:
            self._bind(frame, values, plan, stream)
        last = frame.words[-1].words
        if moved != frame.moved:
            prepared = self.launches[-1].words
            for index, _address in frame.moved:
                last[index] = prepared[index]
            for index, address in moved:
                last[index] = address
            frame.moved = moved
        patch = self.launches[-1].patch
        if patch is not None:
            address = target.data_ptr()
            for index, delta in patch:
                last[index] = address + delta
        current = driver.in_context(self.context)
        try:
            for prepared, words in zip(self.launches, frame.words):
                prepared.launch(stream, words)
        finally:
            if not current:
                driver.leave_context()

    def __call__(self, out, stream, moved=(), values=None, plan=None):
        """The run on ``stream`` (torch's current one, a raw handle); returns its output
        (``out`` as given: x when the run writes into x). ``moved``, ``values``,
        ``plan``: as ``launch``'s."""
        if self.output:
            shape, dtype, device = self.output
            out = torch.empty(shape, dtype=dtype, device=device)
        self.launch(stream, out, moved, values, plan)
        return out


def _flags(t):
    """What the checks read of a tensor outside inference mode besides its layout."""
    return None if t is None else (t.requires_grad, t.is_inference())


def _optional(t):
    """The layout of bias or out (None when not given)."""
    return None if t is None else (t.data_ptr(), t.shape, t.stride(), t.dtype, t.get_device())


STREAM_AT = 1  # where a run key holds the stream
# The addresses of the tensors a run may move (x; a stage's a and b) in a run key:
# modulo this, a multiple of the widest access of a row group (``row_group_for``: 8
# channels of 4 bytes at most) and of torch's allocations' alignment.
X_ALIGNMENT = 512


def run_key(args, activation, math, split=SPLIT_NONE):
    """What a remembered run must match: what the checks and the launch's arguments read
    (each tensor's address, shape, strides, dtype, device and, outside inference mode,
    autograd and inference flags; torch's grad and inference modes), the call's
    activation and math, the tuning's overrides, torch's current stream (at
    ``STREAM_AT``) and the split mode. None: not a run to remember (x is not a CUDA
    tensor, or an argument has no tensor's fields).

    x's address counts only up to what the kernel choice reads of it (its alignment,
    ``X_ALIGNMENT``), and out only as "x" when it is x's memory seen the same way: an
    engine's x is a new tensor at every layer and step (a projection's output, a part
    gathered by index_select), and a run kept for x at one address is launched for x at
    another with those words set (``Run.moved_words``), once x's memory there is checked
    apart from the tensors it must not meet. (A stage's a and b alike: ``stage_key``.)

    This is the per-run cost of every remembered run, so it reads each field once, with
    no call per tensor where it can. Only x is tested for being a CUDA tensor: a run is
    remembered only for tensors that passed the checks (CUDA tensors on x's device),
    and a tensor elsewhere has another device index (a CPU tensor's is -1), so its key
    never matches a remembered one."""
    x, weight, bias, conv_state, out = args
    if not isinstance(x, torch.Tensor) or not x.is_cuda:
        return None
    index = x.get_device()
    inference = torch.is_inference_mode_enabled()
    # tuning overrides (tests, benchmarks) choose other kernels: part of the key
    overrides = tuning.overrides()
    try:
        shape, stride, dtype = x.shape, x.stride(), x.dtype
        if out is None:
            out_key = None
        elif out is x or (out.data_ptr() == x.data_ptr() and out.shape == shape
                          and out.stride() == stride and out.dtype == dtype):
            out_key = "x"
        else:
            out_key = _optional(out)
        key = (index, driver.current_stream(index), activation, math, split, inference,
               torch.is_grad_enabled(), overrides,
               x.data_ptr() % X_ALIGNMENT, shape, stride, dtype,
               weight.data_ptr(), weight.shape, weight.stride(), weight.dtype,
               weight.get_device(),
               conv_state.data_ptr(), conv_state.shape, conv_state.stride(),
               conv_state.dtype, conv_state.get_device(), _optional(bias), out_key)
        if inference:  # no autograd, every tensor may be written: the flags are not read
            return key
        return key + (_flags(x), _flags(weight), _flags(bias), _flags(conv_state),
                      _flags(out))
    except AttributeError:  # not a tensor: the checks will say so
        return None


def run_remembered(plan, args, activation, math, split=SPLIT_NONE):
    """(output, key) of the run kept for these arguments (launched now), or (None, key)
    when none is kept (key None: never to be kept): ``backend.remembered``'s work."""
    return _kept_run(plan, run_key(args, activation, math, split), (args[0],), args[4])


def _kept_run(plan, key, movers, out):
    """(output, key) of the run kept under ``key`` for ``plan``, or for a device plan of
    its signature (launched now, into ``out`` or a new output, with ``plan``'s words);
    (None, key) when none is kept (key None: never to be kept).

    An engine builds a new device plan from new metadata at every step and runs each
    layer on it once: the run kept for the signature launches with the new plan's words
    (``Run.launch``), nothing prepared again. A run kept for ``movers`` (x; a stage's
    x, a and b) elsewhere is launched with their words set (``Run.moved_words``); when
    one of them there meets another tensor of the run, (None, None): the checks say
    why."""
    if key is None:
        return None, None
    state = _plan_state(plan)
    signed = _signed(plan, state)
    run = (state.get("runs", _NO_RUNS) if signed is None else signed).get(key)
    if run is None:
        return None, key
    moved = run.moved_words(movers)
    if moved is None:
        return None, None
    # these tensors passed this geometry's checks
    stream = key[STREAM_AT]
    values = None if signed is None else _bound_values(plan, state, stream)
    return run(out, stream, moved, values, plan), key


def errors_of(plan, sim=False):
    """A device plan's error words (``planner.ERRORS``): an int32 tensor on its device,
    the plan's own or those it was given (``DevicePlan.error_words``)."""
    if plan.error_words is not None:
        return plan.error_words

    def make():
        return new_error_words(plan.device)
    return _once_per_plan(plan, "errors", make)


def new_error_words(device):
    """Zeroed error words for device plans whose metadata is on ``device``."""
    return torch.zeros(len(planner.ERRORS), dtype=torch.int32,
                       device="cpu" if simulating() else device)


def read_errors(plan):
    """The error words the planner set (waits for the device), cleared."""
    words = plan.error_words
    if words is None:
        words = _plan_state(plan).get("errors")
    if words is None:
        return [0] * len(planner.ERRORS)
    return read_error_words(words)


def read_error_words(words):
    """Error words (waits for every stream of their device), cleared when any is set."""
    sim = simulating()
    if not sim:
        torch.cuda.synchronize(words.device)
    found = words.tolist()
    if any(found):
        for i, value in enumerate(found):
            if value:  # only the words reported: a word set meanwhile is not lost
                words[i] = 0
        if not sim:  # cleared before any later launch, whichever stream it uses
            torch.cuda.synchronize(words.device)
    return found


def _planner_values(plan, sim, scalars=None):
    """(element types of the metadata arrays, the values of ``planner.PLAN_ARGS`` but
    the tables') of a device plan: what its planner, or a conv kernel that plans its own
    block, takes; ``scalars``: the planner's (None: the plan's, ``DevicePlan.scalars_for``)."""
    values = {}
    for name in planner.METADATA_ARRAYS:
        t, stride = plan.kernel_arrays[name]
        # the kernel's pointer is the first element's: no offset
        values[name], values[name + "_offset"] = _as_kernel_arg(t, sim), 0
        values[name + "_stride"] = stride if name in plan.arrays else 0
    values.update(plan.planner_scalars if scalars is None else scalars,
                  errors=_as_kernel_arg(errors_of(plan, sim), sim))
    return plan.element_types, values


def _planner_launch(plan, tables, sim, l2norm=None):
    """(kernel, args, grid, block) of a device plan's planner writing ``tables``, for a
    GDN stage run whose parts are normalised from the rows ``l2norm`` (None: a conv
    run), which the planner checks."""
    types_, values = _planner_values(plan, sim, plan.scalars_for(l2norm))
    values["tables"] = tables
    kernel, (grid, block) = _planner_kernel(types_, "planner", plan.num_blocks)
    return kernel, tuple(values[a] for a in planner.PLAN_ARGS), grid, block


def _planner_kernel(element_types, kind, threads):
    """(the planner kernel of ``kind`` for these element types, its launch shape over
    ``threads`` threads): ``backends/cuda/planner.py``, which needs numba-cuda, so it is
    imported on first use, as this module's other numba-cuda parts."""
    from jitconv.backends.cuda import planner as cuda_planner  # numba-cuda
    return (cuda_planner.get_planner(element_types, kind),
            cuda_planner.launch_shape(threads))


def _rules_launch(plan, tables, offsets, sim, windows):
    """(kernel, args, grid, block) of a device plan's rule planner (``planner.plan_rules``)
    amending ``tables`` (at ``offsets``, ``abi.TABLES``), for a run with ``windows``."""
    values = {}
    for name in planner.RULE_ARRAYS:
        t, stride, _cstride = plan.rule_arrays[name]
        values[name], values[name + "_offset"] = _as_kernel_arg(t, sim), 0
        values[name + "_stride"] = stride
    values.update(plan.rule_values(None if windows is None else windows.shape),
                  tables=tables, blocks=offsets[1], links=offsets[2],
                  errors=_as_kernel_arg(errors_of(plan, sim), sim))
    kernel, (grid, block) = _planner_kernel(plan.rule_types, "rules", values["count"])
    return kernel, tuple(values[a] for a in planner.RULE_ARGS), grid, block


@functools.lru_cache(maxsize=None)
def _call_at():
    """Positions of source.CALL_ARGS among the kernel's arguments."""
    return tuple(ARG_NAMES.index(n) for n in CALL_ARGS)


MAX_LAYOUTS = 64  # then further layouts run the kernel that reads them as arguments


@functools.lru_cache(maxsize=None)
def _layout_at():
    """Positions of source.LAYOUT_ARGS among the kernel's arguments."""
    names = [a[0] for a in CONV_ARGS + EXTRA_ARGS]
    return tuple(names.index(n) for n in LAYOUT_ARGS)


def _layout(args):
    """The launch's values of source.LAYOUT_ARGS, to compile in (None: read from
    the arguments): a layer's layout is the same at every call, so an engine compiles a
    few kernels; past MAX_LAYOUTS distinct layouts in a process, none more."""
    layout = tuple(int(args[i]) for i in _layout_at())
    if layout not in STATE.layouts:
        with STATE.lock:
            if len(STATE.layouts) >= MAX_LAYOUTS:
                return None
            STATE.layouts.add(layout)
    return layout


def _stage_patch(stage, names, args, sim):
    """The words a remembered stage run patches (``driver.Prepared``): out, out2 and the
    gates all point into ``stage.buffer`` (one new tensor per run), at their offsets
    from its start."""
    if sim:
        return None
    base = stage.buffer.data_ptr()
    at = [names.index("out"), names.index("out2"),
          len(args) - len(STAGE_NAMES) + STAGE_NAMES.index("gates")]
    return tuple((i, int(args[i]) - base) for i in at)


def stage_key(args, stage_args, activation, math):
    """``run_key`` of a stage run: the conv's tensors', then a, b, A_log and dt_bias's
    layouts and the head dims and flags (``stage_args``: (a, b, A_log, dt_bias, heads,
    use_l2norm, exp_g)). None: not a run to remember (as ``run_key``'s, or A_log or
    dt_bias is not contiguous float32: the launch reads a converted copy then)."""
    key = run_key(args, activation, math, SPLIT_PARTS)
    a, b, A_log, dt_bias, heads, l2norm, exp_g = stage_args
    if key is None or not all(isinstance(t, torch.Tensor) and t.dtype == torch.float32
                              and t.is_contiguous() for t in (A_log, dt_bias)):
        return None
    try:
        key += tuple((t.data_ptr() % X_ALIGNMENT, t.shape, t.stride(), t.dtype,
                      t.get_device()) for t in (a, b)) + \
            tuple((t.data_ptr(), t.shape, t.stride(), t.dtype, t.get_device())
                  for t in (A_log, dt_bias)) + (heads, l2norm, exp_g)
        if not key[5]:  # outside inference mode: the flags the checks read
            key += (_flags(a), _flags(b))
        return key
    except AttributeError:  # not a tensor: the checks will say so
        return None


def stage_remembered(plan, args, stage_args, activation, math):
    """(the stage's output buffer, key) of the stage run kept for these arguments
    (launched now), or (None, key) when none is kept (key None: never to be kept)."""
    return _kept_run(plan, stage_key(args, stage_args, activation, math),
                     (args[0], stage_args[0], stage_args[1]), None)


def _l2norm_unchecked(stage):
    """Whether a stage run's first normalised rows need no check (each part's is its row
    0 or past its rows): the planner's check of them (``planner.plan_slot``) can find
    nothing, so the stage's kernel may plan its own blocks."""
    return all(first == 0 or first >= rows
               for first, rows in zip(stage.l2norm, stage.part_rows))


def _stage_arguments(stage, sim):
    """A stage kernel's last arguments (``kernels.abi.STAGE_ARGS``)."""
    a, b, alog, dtb, gates = (_as_kernel_arg(t, sim) for t in (
        stage.a, stage.b, stage.A_log, stage.dt_bias, stage.gates))
    rows_ns, rows_sp = stage.part_rows
    divisors = stage_divisors(stage.head_k_dim, stage.head_v_dim, stage.vdim)
    nhv = divisors[0]
    return (a, 0, stage.a.stride(0), b, 0, stage.b.stride(0), alog, 0, dtb, 0,
            gates, 0, 2 * rows_ns * nhv, rows_ns, rows_sp, stage.qk, stage.head_k_dim,
            stage.vdim, stage.head_v_dim, *divisors, *stage.l2norm, int(stage.exp_g))


def _arguments(tables, offsets, plan, x, weight, bias, conv_state, target, silu, dim, sim,
               out2=None, split=SPLIT_NONE, spec_slot0=0, windows=None):
    """The kernel's arguments (``kernels.abi.CONV_ARGS`` and ``source.EXTRA_ARGS``)."""
    xa, oa, wa, sa = (_as_kernel_arg(t, sim) for t in (x, target, weight, conv_state))
    ba = _as_kernel_arg(bias, sim) if bias is not None else wa  # not read without bias
    # Unless split is SPLIT_PARTS out2 is not read: x stands in on a GPU. The simulator
    # copies each array argument in and back out after the kernel, in argument order, so
    # there the stand-in aliases nothing: an unwritten copy of x (which is out when the
    # run is in place) copied back last would undo the kernel's writes.
    if out2 is None or out2 is x:
        out2, o2 = x, np.zeros(1, xa.dtype) if sim else xa
    else:
        o2 = _as_kernel_arg(out2, sim)
    split = (o2, 0, out2.stride(0), int(split), int(spec_slot0))
    if windows is None:  # not read; as out2's stand-in
        win = (np.zeros(1, xa.dtype) if sim else xa, 0, 0, 0, 0, 0)
    else:
        win = (_as_kernel_arg(windows, sim), 0, *windows.stride())
    return (xa, 0, x.stride(0), oa, 0, target.stride(0),
            wa, 0, weight.stride(0), weight.stride(1),
            ba, 0, bias.stride(0) if bias is not None else 1,
            sa, 0, *conv_state.stride(),
            tables, *offsets, int(bias is not None), int(silu), *split, *win,
            dim, plan.num_blocks)
