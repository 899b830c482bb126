"""The CUDA device: torch CUDA tensors in and out, zero-copy, the conv kernel of
``kernels_cuda`` (the same template as the SYCL kernel) launched on torch's current CUDA
stream. Needs numba-cuda (``pip install 'jitconv[cuda]'``); neither dpctl nor numba-dpex.

Memory: each tensor reaches the kernel as the device address of its first element (no
copy; the kernel takes typed pointers, ``kernels_cuda.pointer_signature``) with element
strides as scalars, the layout the SYCL backend uses too (there, flat arrays from the
first to the last element). fp16/bf16 are read as int16 (their bit patterns). The
plan's int32 tables are copied to the device once per plan and device.

Order: the kernel goes on torch's current stream of x's device, so it is ordered with
torch's work before and after it; ``run`` does not wait for it.

numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1, numba-cuda installed) runs the same
kernels as Python on the CPU: then "cuda:0" is listed, ``jitconv.set_device("cuda:0")``
works, and torch CPU tensors go through this backend (tests/test_cuda.py runs that way in
CI). The simulator checks the kernel's logic (indexing, bounds guard, tables, state
updates); it cannot check code generation, the pointer arguments (it passes numpy
arrays), the LLVM conversion intrinsics (it runs their Python twins, see
``bit_conversions``), fastmath, streams or speed.
"""

import functools
import importlib.util
import os
import threading

import numpy as np
import torch

from .kernel_abi import rows_aligned

_SIXTEEN_BIT = (torch.float16, torch.bfloat16)
# Defaults, the fastest or within a few percent of it on every workload of the H200 run
# (benchmarks/h200/): channels per thread by dtype (JITCONV_CUDA_CHANNELS), tokens loaded
# before the first of their stores (JITCONV_CUDA_LOOKAHEAD), silu's exp and division as
# the GPU's approximate instructions (JITCONV_FAST_EXP=0: the exact ones; 1.1-1.4x slower
# on prefill, see _fast_exp).
# The same for every kernel: float32 decode launches took one channel per thread while
# their accesses were single-channel; with two channels per vector access
# (DEFAULT_SHORT_ROW_GROUP) two are faster (H200, same call, decode-only dim 8192: 7.41
# -> 6.83 us; dim 2048 equal).
DEFAULT_CHANNELS = {"bfloat16": 2, "float16": 2, "float32": 2}
DEFAULT_LOOKAHEAD = 8
# Launches whose blocks all hold at most this many tokens (decode and spec steps of up to
# 1 + 3 tokens) use it as their lookahead instead: bfloat16 small launches 1.03-1.08x
# faster on the H200, float32 unchanged; prefill keeps DEFAULT_LOOKAHEAD (1.14x faster
# than 4 there). JITCONV_CUDA_LOOKAHEAD, when set, applies to every launch.
SHORT_LOOKAHEAD = 4
DEFAULT_FAST_EXP = True
DEFAULT_THREADS = 128  # threads per thread block (JITCONV_CUDA_THREADS)
# Registers per thread the compiler may use (JITCONV_CUDA_MAX_REGISTERS; 0: its own
# choice). Left alone it took 72 for the default kernel (7 thread blocks of 128 per SM
# on the H200); 64 gives 8 without spilling: up to 1.1x on prefill and mixed steps in the
# same run, f32 decode-only at dim 2048 4.0 -> 4.4 us; 56 spills and is slower.
DEFAULT_MAX_REGISTERS = 64
# Launches of short sequences only (decode and spec-verify steps: kernels_cuda.
# short_tokens_for) run a kernel without the general paths (kernel_template's
# short_tokens; T = 1 for decode steps): H200, same call against the general kernel,
# 1.00-1.10x on decode-only, spec-only and decode-heavy mixed steps (benchmarks/h200/).
# JITCONV_CUDA_SHORT_KERNEL=0: the general kernel for every launch.
DEFAULT_SHORT_KERNEL = True
# Rows of x and out read and written two channels at a time (one 32-bit access per
# bfloat16 / float16 pair, 64-bit per float32 pair) in launches of the general kernel
# where the launch allows it: a channel count and rows aligned to the group
# (row_group_for). H200, same call, against single-channel accesses: prefill and mixed
# steps 0.97-1.06x (9 of 12 faster; benchmarks/h200/). Short kernels keep single-channel
# accesses: with pairs, bfloat16 spec-only and decode-heavy launches (T = 4) ran
# 0.72-0.87x as fast (not explained; their PTX has fewer instructions). One channel
# per access always: JITCONV_CUDA_ROW_GROUP=1; =4: four channels per access (16-bit
# rows 8 bytes, float32 16 bytes at a time) in launches of C = 4 channels per thread.
DEFAULT_ROW_GROUP = 2
# The same for short kernels (JITCONV_CUDA_SHORT_ROW_GROUP overrides it for all of them):
# 2 for the decode kernel (T = 1) and for float32 spec kernels; 16-bit spec kernels (T = 4)
# keep single-channel accesses, with pairs they ran 0.64-0.93x as fast on the H200 (not
# explained: their decode kernel gains with pairs). Used with the next two (H200, same
# call, ninth session, benchmarks/h200/): bfloat16 decode-only dim 8192 5.50 -> 4.94 us.
DEFAULT_SHORT_ROW_GROUP = {"decode": 2, "spec": 1, "spec float32": 2}
# The conv state's window and stores grouped like rows of x too (kernel_template's
# group_state) where the state's channels are contiguous and aligned to the group (vLLM's
# conv state is laid out so), by kind of kernel: short kernels 0.99-1.03x; the general
# kernel 0.97-0.99x in bfloat16 (first blocks only; not kept). JITCONV_CUDA_GROUP_STATE=0/1
# overrides.
DEFAULT_GROUP_STATE = {"short": True, "general": False}
# A channel's 4 taps read as one vector where the weight is (dim, 4), contiguous and
# aligned (vLLM's): short kernels 0.99-1.13x (decode-heavy 1.04-1.13x), prefill and mixed
# steps 1.00-1.02x (H200, same call). JITCONV_CUDA_VECTOR_TAPS=0 turns it off.
DEFAULT_VECTOR_TAPS = True
# A layer's offsets, strides, dim, has_bias and silu compiled into its kernel as constants
# (kernels_cuda.LAYOUT_ARGS), one compile per layout (at most MAX_LAYOUTS per process).
# H200, same call, against the kernel that reads them as arguments: 1.01-1.14x on 22 of
# 24 workloads (bfloat16 decode-only at dim 8192 6.22 -> 5.46 us, mixed step 1.02-1.11x),
# float32 / bfloat16 decode-only at dim 2048 0.98x / 0.98x. JITCONV_CUDA_CONSTANT_LAYOUT=0
# turns it off.
DEFAULT_CONSTANT_LAYOUT = True
# The weights and bias loaded before the state update instead of after it
# (kernel_template's early_weights), by kind of kernel: short (decode / spec) and general.
# The state update's stores wait for the window's loads, and a load placed after a store
# cannot be moved above it (for the compiler the arrays may alias), so late weights are a
# further memory round trip. H200, same call: short kernels with the pairs and vector taps
# 1.00-1.09x; the general kernel 0.93-0.99x (more registers held through the state
# update). JITCONV_CUDA_EARLY_WEIGHTS=0/1: off / on for every kernel.
DEFAULT_EARLY_WEIGHTS = {"short": True, "general": False}

# What a kernel with a compiled-in layout also fixes, by setting (each 0 / 1):
# JITCONV_CUDA_COMPACT_ARGS: the layout's 16 parameters dropped from its signature (it
# takes the 9 per-call ones: the kernel parameters a launch reads then lie in 72 bytes,
# not 200); JITCONV_CUDA_FIXED_BLOCK: its thread block's shape compiled in (no blockDim
# reads; with one row of token blocks per thread block the block's record address is
# uniform across the block); JITCONV_CUDA_EXACT_GRID: with that shape, no bounds guard
# where the grid rounds nothing up (dim a multiple of the block's channels: the first
# load then waits for nothing but the block id). H200, same call (twelfth session,
# benchmarks/h200/same-call-12th-session.json): the first two against neither
# 1.005-1.044x on 16 small and mixed workloads (bfloat16 decode-only at dim 2048 3.21 ->
# 3.07 us); the third against the first two 1.00-1.04x on 15 of 16 rows (one 0.96x,
# within that row's spread between calls), prefill 1.00-1.01x.
DEFAULT_COMPACT_ARGS = True
DEFAULT_FIXED_BLOCK = True
DEFAULT_EXACT_GRID = True
# Decode launches whose every sequence with a cache line holds one token and has its
# window at column 0 (a plain decode step: _plan_uniform_decode) run a decode kernel with
# those two fields as constants (kernel_template's uniform_decode): H200, same call,
# decode-only 64 1.05-1.14x (bfloat16 3.06 -> 2.69 us at dim 2048, Triton 2.88; float32
# 3.58 -> 3.14 us, Triton 3.49), other launches unchanged (benchmarks/h200/).
# JITCONV_CUDA_UNIFORM_DECODE=0 turns it off.
DEFAULT_UNIFORM_DECODE = True

_lock = threading.Lock()
_kernels = {}  # (width, dtype, channels, fastmath, lookahead, fast exp, max registers,
#                 native bf16 rounding, short tokens, row group, layout, early weights,
#                 grouped state, vector taps, block shape, compact args, exact grid,
#                 uniform decode)
#                 -> dispatcher
_streams = {}  # (device index, cudaStream_t) -> numba external stream


@functools.lru_cache(maxsize=None)
def have_numba_cuda():
    # Looked up once: find_spec searches sys.path (tens of µs), and launches ask often.
    return importlib.util.find_spec("numba_cuda") is not None


def simulating():
    """numba's CUDA simulator is on (it must be set before numba.cuda is imported)."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" and have_numba_cuda()


def devices():
    """'cuda:N' for each NVIDIA GPU torch sees, when numba-cuda is installed (one
    simulated 'cuda:0' under the simulator)."""
    if not have_numba_cuda():
        return []
    if simulating():
        return ["cuda:0"]
    if not torch.cuda.is_available():
        return []
    return [f"cuda:{i}" for i in range(torch.cuda.device_count())]


def why_unavailable():
    if not have_numba_cuda():
        return "numba-cuda is not installed: pip install 'jitconv[cuda]'"
    if not simulating() and not torch.cuda.is_available():
        return "torch sees no CUDA GPU"
    return "no such device"


def is_cuda_name(name):
    return isinstance(name, str) and (name.strip() == "cuda" or name.strip().startswith("cuda:"))


def resolve(name):
    """The canonical 'cuda:N' for a device name, or None when there is no such GPU."""
    name = name.strip()
    name = "cuda:0" if name == "cuda" else name
    return name if name in devices() else None


def torch_device(name):
    """The torch device holding a CUDA device's tensors (the CPU under the simulator)."""
    return torch.device("cpu") if simulating() else torch.device(name)


def wants(x):
    """Whether a call with this x runs here: a torch CUDA tensor, or (simulator) a torch
    CPU tensor while the current device is 'cuda:N'."""
    if not isinstance(x, torch.Tensor):
        return False
    if x.device.type == "cuda":
        return True
    if x.device.type != "cpu":
        return False
    from . import device as devices_module
    try:
        current = devices_module.get_device()
    except devices_module.DeviceNotFoundError:
        return False
    if not is_cuda_name(current):
        return False
    if simulating():
        return True
    raise TypeError(f"x: a CPU tensor, but the current device is {current}: pass torch "
                    f"CUDA tensors (x.to('{current}')) or select a SYCL device")


def channels_for(dim, dtype_name="float32"):
    """Channels per thread: JITCONV_CUDA_CHANNELS (1, 2, 4 or 8; default
    DEFAULT_CHANNELS of the dtype), halved until it divides dim (the kernel has no
    per-channel guard)."""
    default = DEFAULT_CHANNELS[dtype_name]
    value = os.environ.get("JITCONV_CUDA_CHANNELS", str(default))
    if value not in ("1", "2", "4", "8"):
        raise ValueError(f"JITCONV_CUDA_CHANNELS: expected 1, 2, 4 or 8, got {value!r}")
    channels = int(value)
    while channels > 1 and dim % channels:
        channels //= 2
    return channels


def _fastmath():
    return os.environ.get("JITCONV_CUDA_FASTMATH", "0") == "1"


def _fast_exp():
    """Whether silu's exp and division are the GPU's approximate instructions (as in
    vLLM's Triton kernels; within the contract's tolerances, NaN and inf kept): the
    default here for every dtype; the SYCL backend makes OpenCL's native_exp the default
    for float16 / bfloat16 only (``kernel_abi.fast_silu``). JITCONV_FAST_EXP=0 selects
    the exact path, =1 the fast one, on both backends (read per launch here, once per
    process by the SYCL backend)."""
    from .kernel_abi import fast_exp_setting
    chosen = fast_exp_setting(os.environ.get("JITCONV_FAST_EXP"))
    return DEFAULT_FAST_EXP if chosen is None else chosen


def _threads():
    value = os.environ.get("JITCONV_CUDA_THREADS", "32" if simulating() else str(DEFAULT_THREADS))
    if not value.isdigit() or int(value) < 32 or int(value) > 1024 or int(value) % 32:
        raise ValueError(f"JITCONV_CUDA_THREADS: expected a multiple of 32 in [32, 1024], "
                         f"got {value!r}")
    return int(value)


def _lookahead(longest_block=None):
    """L for a launch whose longest block holds ``longest_block`` tokens (None: not
    known, the default L)."""
    value = os.environ.get("JITCONV_CUDA_LOOKAHEAD", "")
    if value == "":
        short = longest_block is not None and longest_block <= SHORT_LOOKAHEAD
        return SHORT_LOOKAHEAD if short else DEFAULT_LOOKAHEAD
    if value not in ("1", "2", "4", "8", "16"):
        raise ValueError(f"JITCONV_CUDA_LOOKAHEAD: expected 1, 2, 4, 8 or 16, got {value!r}")
    return int(value)


def _choice(name, choices):
    """The value of the setting ``name`` ("" when unset), refused unless one of
    ``choices``."""
    value = os.environ.get(name, "")
    if value not in ("",) + choices:
        raise ValueError(f"{name}: expected {', '.join(choices[:-1])} or {choices[-1]}, "
                         f"got {value!r}")
    return value


def _switch(name, default):
    """A 0 / 1 setting as a bool, ``default`` when unset."""
    value = _choice(name, ("0", "1"))
    return value == "1" if value else default


def _short_kernel():
    return _switch("JITCONV_CUDA_SHORT_KERNEL", DEFAULT_SHORT_KERNEL)


def _early_weights(short_tokens):
    """Whether a launch's kernel loads the weights before the state update: the setting
    JITCONV_CUDA_EARLY_WEIGHTS (0 or 1), else DEFAULT_EARLY_WEIGHTS for its kind."""
    return _switch("JITCONV_CUDA_EARLY_WEIGHTS",
                   DEFAULT_EARLY_WEIGHTS["short" if short_tokens else "general"])


def _row_group_setting():
    value = _choice("JITCONV_CUDA_ROW_GROUP", ("1", "2", "4"))
    return int(value) if value else DEFAULT_ROW_GROUP


def _short_row_group(short_tokens, dtype_name):
    value = _choice("JITCONV_CUDA_SHORT_ROW_GROUP", ("1", "2", "4"))
    if value:
        return int(value)
    if short_tokens == 1:
        return DEFAULT_SHORT_ROW_GROUP["decode"]
    return DEFAULT_SHORT_ROW_GROUP.get(f"spec {dtype_name}", DEFAULT_SHORT_ROW_GROUP["spec"])


def _group_state(short_tokens):
    return _switch("JITCONV_CUDA_GROUP_STATE",
                   DEFAULT_GROUP_STATE["short" if short_tokens else "general"])


def _aligned(t, group):
    return rows_aligned(t.data_ptr(), t.element_size(), t.shape, t.stride(), group)


def vector_taps_for(weight):
    """Whether a launch reads each channel's taps as one vector: the setting
    (JITCONV_CUDA_VECTOR_TAPS, default DEFAULT_VECTOR_TAPS) and a (dim, 4) weight with
    contiguous taps in rows of 4 (the kernel reads channel c's at 4 c) and its first
    element aligned to 4 elements (``kernel_abi.rows_aligned``, taps as the row)."""
    return (_switch("JITCONV_CUDA_VECTOR_TAPS", DEFAULT_VECTOR_TAPS) and weight.shape[1] == 4
            and (weight.stride(0) == 4 or weight.shape[0] == 1) and _aligned(weight, 4))


def row_group_for(channels, short_tokens, x, target, conv_state, dtype_name):
    """(G, grouped state) of a launch. G: the channels per access of rows of x and out,
    the setting (JITCONV_CUDA_ROW_GROUP, default DEFAULT_ROW_GROUP; for short kernels
    JITCONV_CUDA_SHORT_ROW_GROUP, default DEFAULT_SHORT_ROW_GROUP) halved until it
    divides ``channels`` and the rows of both (tokens, dim) tensors are aligned to it
    (``kernel_abi.rows_aligned``). Grouped state: the conv state (lines, dim, state_len)
    accessed G channels at a time too, where the setting (JITCONV_CUDA_GROUP_STATE,
    default DEFAULT_GROUP_STATE) asks for it, G > 1 and its channels are contiguous and
    aligned to G."""
    group = _short_row_group(short_tokens, dtype_name) if short_tokens else _row_group_setting()
    while group > 1 and (channels % group or not all(_aligned(t, group) for t in (x, target))):
        group //= 2
    grouped_state = group > 1 and _group_state(short_tokens) and _aligned(conv_state, group)
    return group, grouped_state


_REGISTER_LIMITS = (0,) + tuple(range(32, 256, 8))


def _max_registers():
    value = os.environ.get("JITCONV_CUDA_MAX_REGISTERS", str(DEFAULT_MAX_REGISTERS))
    if not value.isdigit() or int(value) not in _REGISTER_LIMITS:
        raise ValueError(f"JITCONV_CUDA_MAX_REGISTERS: expected 0 (the compiler's choice) "
                         f"or a multiple of 8 in [32, 248], got {value!r}")
    return int(value) or None


_capability = {}  # device index -> compute capability


def native_bf16(device):
    """Whether the GPU rounds to bfloat16 itself (PTX cvt.rn.bf16.f32: compute capability
    8.0 and later); never under the simulator."""
    if simulating():
        return False
    found = _capability.get(device.index)
    if found is None:
        found = _capability.setdefault(device.index, torch.cuda.get_device_capability(device))
    return found >= (8, 0)


def get_kernel(width, dtype_name, channels, fastmath=False, lookahead=DEFAULT_LOOKAHEAD,
               fast_exp=DEFAULT_FAST_EXP, max_registers=DEFAULT_MAX_REGISTERS or None,
               bf16_instruction=False, short_tokens=0, row_group=1, layout=None,
               early_weights=False, group_state=False, vector_taps=False, block=None,
               compact_args=True, exact_grid=True, uniform_decode=False):
    """The dispatcher of one specialization, made once per process. ``bf16_instruction``:
    bfloat16 rounded by the GPU's instruction (``native_bf16`` of the device);
    ``short_tokens``: the kernel for launches of sequences of at most that many tokens
    (0: the general kernel); ``row_group``: x and out accessed that many channels at a
    time (dividing ``channels``; only for launches whose rows are aligned,
    ``row_group_for``); ``layout``: the launch's layer constants compiled in
    (``kernels_cuda.LAYOUT_ARGS``, see ``_layout``), or None; ``early_weights``: the
    weights and bias loaded before the state update (``_early_weights``);
    ``group_state``: the conv state accessed ``row_group`` channels at a time too (only
    for aligned states, ``row_group_for``); ``vector_taps``: each channel's taps as one
    vector load (``vector_taps_for``); ``block``, ``compact_args``, ``exact_grid``: see
    ``kernels_cuda.make_conv_kernel`` (with a ``layout`` only; DEFAULT_COMPACT_ARGS);
    ``uniform_decode``: see there (chosen by ``_uniform_decode``)."""
    bf16_instruction = bf16_instruction and dtype_name == "bfloat16"  # others: one kernel
    compact_args = compact_args and layout is not None  # no effect without: one key
    exact_grid = exact_grid and block is not None
    key = (width, dtype_name, channels, fastmath, lookahead, fast_exp, max_registers,
           bf16_instruction, short_tokens, row_group, layout, early_weights, group_state,
           vector_taps, block, compact_args, exact_grid, uniform_decode)
    kernel = _kernels.get(key)
    if kernel is None:
        with _lock:
            kernel = _kernels.get(key)
            if kernel is None:
                from .kernels_cuda import make_conv_kernel
                kernel = _kernels[key] = make_conv_kernel(width, dtype_name, channels,
                                                          fastmath, lookahead, fast_exp,
                                                          max_registers, bf16_instruction,
                                                          short_tokens, row_group,
                                                          layout, early_weights,
                                                          group_state, vector_taps, block,
                                                          compact_args, exact_grid,
                                                          uniform_decode)
    return kernel


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


def _tables(plan, device, sim):
    """The plan's tables as the kernel's argument (``_as_kernel_arg`` of one int32
    tensor on ``device``) and their offsets; copied once per plan and device (the plan
    keeps the tensor)."""
    cache = plan.__dict__.setdefault("_cuda_tables", {})
    found = cache.get(str(device))
    if found is None:
        host = [np.asarray(a, np.int32) for a in plan._host_tables]
        offsets = tuple(int(o) for o in np.cumsum([0] + [len(a) for a in host[:-1]]))
        tensor = torch.from_numpy(np.concatenate(host + [np.zeros(1, np.int32)]))
        if not sim:
            tensor = tensor.to(device)
        found = cache.setdefault(str(device), (_as_kernel_arg(tensor, sim), offsets, tensor))
    return found[0], found[1]


def _once_per_plan(plan, name, compute):
    """``compute()``, worked out once per plan and kept on it under ``name``: what depends
    only on the step's metadata, which every layer's launch of the plan shares."""
    found = plan.__dict__.get(name)
    if found is None:
        found = plan.__dict__.setdefault(name, compute())
    return found


def _plan_short_tokens(plan):
    """The short kernel a plan's launches can run (``kernels_cuda.short_tokens_for``)."""
    def compute():
        from .kernels_cuda import short_tokens_for
        return short_tokens_for(plan.geometry.width, plan.longest_sequences)
    return _once_per_plan(plan, "_cuda_short_tokens", compute)


def _plan_uniform_decode(plan):
    """Whether every sequence of the plan with a cache line holds one token and has its
    window at column 0 (``kernel_template``'s uniform_decode; a plain decode step), from
    the plan's block records."""
    def compute():
        from .kernel_abi import BLOCK_FIELDS
        records = np.asarray(plan._host_tables[1]).reshape(-1, len(BLOCK_FIELDS))
        at = BLOCK_FIELDS.index
        real = records[records[:, at("line")] >= 0]
        return bool(len(real) and (real[:, at("seq_len")] == 1).all()
                    and (real[:, at("off")] == 0).all())
    return _once_per_plan(plan, "_cuda_uniform_decode", compute)


def _uniform_decode(plan, short_tokens):
    """The uniform decode kernel for this launch: the setting (JITCONV_CUDA_UNIFORM_DECODE,
    default DEFAULT_UNIFORM_DECODE), a decode kernel (short_tokens 1) and a plan whose
    sequences allow it (``_plan_uniform_decode``)."""
    return (short_tokens == 1 and _switch("JITCONV_CUDA_UNIFORM_DECODE", DEFAULT_UNIFORM_DECODE)
            and _plan_uniform_decode(plan))


def _stream(device):
    """numba's handle on torch's current stream of ``device``."""
    from numba import cuda
    handle = torch.cuda.current_stream(device).cuda_stream
    key = (device.index, handle)
    stream = _streams.get(key)
    if stream is None:
        stream = _streams.setdefault(key, cuda.external_stream(handle))
    return stream


def launch(plan, x, weight, bias, conv_state, target, silu, dtype):
    """One run of ``plan`` on checked tensors into ``target`` (StepPlan._launch checked
    them and chose target: channels of x and target contiguous, target apart from x)."""
    sim = simulating()
    if not sim and not have_numba_cuda():
        raise RuntimeError("x: a CUDA tensor, but numba-cuda is not installed: "
                           "pip install 'jitconv[cuda]'")
    dim = x.shape[1]
    if weight.dim() == 3:  # (dim, 1, width)
        weight = weight[:, 0, :]
    width = plan.geometry.width
    short_tokens = _plan_short_tokens(plan) if _short_kernel() else 0
    channels = channels_for(dim, dtype)
    row_group, group_state = row_group_for(channels, short_tokens, x, target, conv_state,
                                           dtype)
    grid, block = launch_shape(dim // channels, plan.num_blocks, _threads())

    def kernel_and_args():
        args = _arguments(plan, x, weight, bias, conv_state, target, silu, dim, sim)
        layout = _layout(args)
        compact = layout is not None and _compact_args()
        fixed = block if layout is not None and _fixed_block() else None
        kernel = get_kernel(width, dtype, channels, _fastmath(), _lookahead(plan.longest_block),
                            _fast_exp(), _max_registers(), native_bf16(x.device),
                            short_tokens, row_group, layout, _early_weights(short_tokens),
                            group_state, vector_taps_for(weight),
                            fixed, compact, _exact_grid(), _uniform_decode(plan, short_tokens))
        if compact:  # the layout's values are in the kernel: pass the per-call ones
            args = tuple(args[i] for i in _call_at())
        return kernel, args

    if sim:
        kernel, args = kernel_and_args()
        kernel[grid, block](*args)
        return
    from numba import cuda
    with cuda.gpus[x.device.index]:
        kernel, args = kernel_and_args()
        # The dispatcher's one compiled kernel (kernels_cuda.pointer_signature), launched
        # with the addresses and scalars as they are: the dispatcher's call would type the
        # arguments again (about 65 us of Python per launch on the H200 machine) and
        # would not take addresses for pointers.
        (compiled,) = kernel.overloads.values()
        compiled.launch(args, grid + (1,), block + (1,), _stream(x.device), 0)


def _compact_args():
    return _switch("JITCONV_CUDA_COMPACT_ARGS", DEFAULT_COMPACT_ARGS)


def _fixed_block():
    return _switch("JITCONV_CUDA_FIXED_BLOCK", DEFAULT_FIXED_BLOCK)


def _exact_grid():
    return _switch("JITCONV_CUDA_EXACT_GRID", DEFAULT_EXACT_GRID)


@functools.lru_cache(maxsize=None)
def _call_at():
    """Positions of kernels_cuda.CALL_ARGS among the kernel's arguments."""
    from .kernels_cuda import ARG_NAMES, CALL_ARGS
    return tuple(ARG_NAMES.index(n) for n in CALL_ARGS)


_LAYOUT_AT = None  # positions of kernels_cuda.LAYOUT_ARGS among the kernel's arguments
_layouts = set()  # layouts compiled in so far
MAX_LAYOUTS = 64  # then further layouts run the kernel that reads them as arguments


def _constant_layout():
    return _switch("JITCONV_CUDA_CONSTANT_LAYOUT", DEFAULT_CONSTANT_LAYOUT)


def _layout(args):
    """The launch's values of kernels_cuda.LAYOUT_ARGS, to compile in (None: read from
    the arguments): a layer's layout is the same at every call, so an engine compiles a
    few kernels; past MAX_LAYOUTS distinct layouts in a process, none more."""
    global _LAYOUT_AT
    if not _constant_layout():
        return None
    if _LAYOUT_AT is None:
        from .kernel_abi import CONV_ARGS
        from .kernels_cuda import EXTRA_ARGS, LAYOUT_ARGS
        names = [a[0] for a in CONV_ARGS + EXTRA_ARGS]
        _LAYOUT_AT = tuple(names.index(n) for n in LAYOUT_ARGS)
    layout = tuple(int(args[i]) for i in _LAYOUT_AT)
    if layout not in _layouts:
        with _lock:
            if len(_layouts) >= MAX_LAYOUTS:
                return None
            _layouts.add(layout)
    return layout


def _arguments(plan, x, weight, bias, conv_state, target, silu, dim, sim):
    """The kernel's arguments (``kernel_abi.CONV_ARGS`` and ``kernels_cuda.EXTRA_ARGS``)."""
    tables, offsets = _tables(plan, x.device, sim)
    xa, oa, wa, sa = (_as_kernel_arg(t, sim) for t in (x, target, weight, conv_state))
    ba = _as_kernel_arg(bias, sim) if bias is not None else wa  # not read without bias
    return (xa, 0, x.stride(0), oa, 0, target.stride(0),
            wa, 0, weight.stride(0), weight.stride(1),
            ba, 0, bias.stride(0) if bias is not None else 1,
            sa, 0, *conv_state.stride(),
            tables, *offsets, int(bias is not None), int(silu),
            dim, plan.num_blocks)
