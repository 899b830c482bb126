"""The CUDA conv kernel's source: the template (``jitconv.kernels.template``) with what is
CUDA's (the index: thread and block ids and the bounds guard a grid rounded up to whole
thread blocks needs; the layout compiled in as constants), as text. No numba import:
``python -m jitconv show-kernel`` and the golden kernels in the tests read it anywhere;
``kernels`` compiles it."""

import dataclasses
from typing import Optional

from jitconv.kernels.abi import CONV_ARGS, STAGE_ARGS, SUPPORTED_WIDTHS, TABLES
from jitconv.kernels.planner import RECORD_ARGS
from jitconv.kernels.template import Backend, kernel_source


def cuda_index(block=None, exact=False):
    """The CUDA backend's index code (``Backend.index``): x threads over channel groups,
    y threads over blocks of tokens. ``block`` (tx, ty): the thread block's shape compiled
    in (kernels with a compiled-in layout, whose launches all have that shape), None: read
    from blockDim. ``exact``: the grid has exactly one thread per channel group and token
    block (ty = 1, the groups a multiple of tx: ``launch_shape`` then rounds nothing up),
    so no bounds guard."""
    tx, ty = block or ("cuda.blockDim.x", "cuda.blockDim.y")
    b = "cuda.blockIdx.x" if ty == 1 else f"cuda.blockIdx.x * {ty} + cuda.threadIdx.y"
    index = (f"    g = cuda.blockIdx.y * {tx} + cuda.threadIdx.x  # channel group\n"
             f"    b = {b}  # block\n"
             "    c = g * {C}  # first of the work-item's channels")
    if exact:
        return index
    return (index + "\n    if c >= dim or b >= num_blocks:\n"
            "        return  # the grid is rounded up to whole thread blocks")


CUDA = Backend(name="cuda", index_arg="", extra_args=", dim, num_blocks", index=cuda_index(),
               early_record=True, reuse_state_loads=True, split_window=True,
               shared_array="cuda.shared.array({n}, RECORD_TYPE)",
               first_in_group="cuda.threadIdx.x == 0", barrier="cuda.syncthreads()",
               lane_sum="lane_sum")
EXTRA_ARGS = (("dim", 0, "int64", None), ("num_blocks", 0, "int64", None))
# New-state values read from x per round of loads: width - 1 + this (the template's
# state_chunk). With one more than the window's width - 1, a spec sequence of 1 + 3
# tokens at width 4 reads its 4 values in one round instead of two (each round's loads
# wait for the previous round's state stores). H200, same call: spec-only 1.02-1.14x,
# decode-heavy mixed 1.02-1.11x; bfloat16 decode-only 0.90-0.97x (benchmarks/h200/).
STATE_CHUNK_EXTRA = 1

# The scalar arguments a kernel can take as compile-time constants (``layout``): a
# layer's offsets, strides, dim, has_bias, silu and split, the same at every call of a
# layer (the per-call table offsets, block count and spec_slot0 are not). With them
# constant the 64-bit index arithmetic on them folds (the bfloat16 decode kernel's SASS
# held 149 IMAD, 58 LEA and 46 IADD3 against 33, 8 and 2 in vLLM's Triton kernel, whose
# strides are constexpr; docs/design.md).
LAYOUT_ARGS = tuple(a[0] for a in CONV_ARGS + EXTRA_ARGS
                    if not a[1] and a[0] not in TABLES + ("num_blocks", "spec_slot0"))


ARG_NAMES = tuple(a[0] for a in CONV_ARGS + EXTRA_ARGS)
STAGE_NAMES = tuple(a[0] for a in STAGE_ARGS)  # a stage kernel's last arguments
# What a kernel with a compiled-in layout takes: the per-call arguments only.
CALL_ARGS = tuple(name for name in ARG_NAMES if name not in LAYOUT_ARGS)


# The arguments of ``planner.RECORD_ARGS`` that a device plan's fused kernel takes as
# compile-time constants (``KernelSpec.plan_kind``): what the plan's kind and the
# metadata tensors' layout fix (offsets, strides, which parts and arrays exist, pad
# lines, one slot per sequence), never counts that change with the batch, so that an
# engine's capture sizes share a kernel. The planner's tests of them then fold away:
# decode-only and spec-only kernels keep only their part's code.
PLAN_KIND_ARGS = tuple(a for a in RECORD_ARGS if a.endswith(("_offset", "_stride"))) + (
    "ns_implicit", "has_ns_init", "has_ns_accepted", "width", "pad_line", "null_line",
    "has_null", "skip_empty", "one_slot", "spec_first", "has_maps")
# ... and the parts' sequence counts where a part is absent (0: its code folds away too)
PART_COUNTS = ("num_ns", "num_sp")


def plan_kind(values):
    """The ``KernelSpec.plan_kind`` of a device plan whose ``planner.RECORD_ARGS`` have
    these ``values`` (name -> value; the arrays' any): ((name, int), ...)."""
    kind = [(a, int(values[a])) for a in PLAN_KIND_ARGS]
    kind += [(a, 0) for a in PART_COUNTS if values[a] == 0]
    return tuple(kind)


def record_args_taken(plan_kind):
    """The RECORD_ARGS a fused kernel with this ``plan_kind`` (None: none bound) takes,
    in order: those it does not have as constants."""
    bound = dict(plan_kind or ())
    return tuple(a for a in RECORD_ARGS if a not in bound)


def short_tokens_for(width, longest_sequences):
    """The ``short_tokens`` of the kernel for a launch whose longest non-spec and spec
    sequences (with a cache line) hold ``longest_sequences`` tokens: 1 for decode steps,
    the state update's one round (width - 1 + STATE_CHUNK_EXTRA) when every non-spec
    sequence holds at most width - 1 tokens and every spec one at most that round, else
    0 (the general kernel). Two short kernels, not one per length: each is compiled on
    first use."""
    non_spec, spec = longest_sequences
    one_round = width - 1 + STATE_CHUNK_EXTRA
    if non_spec > width - 1 or spec > one_round:
        return 0
    return 1 if max(non_spec, spec) <= 1 else one_round


@dataclasses.dataclass(frozen=True, kw_only=True)
class KernelSpec:
    """One CUDA kernel specialization: what ``kernels.make_conv_kernel`` compiles, and the
    key of the compiled kernels (the only way to ask for one). ``channels``: per thread;
    ``lookahead``: tokens loaded before their stores; ``fastmath``: numba's fastmath for
    the whole kernel; ``fast_exp``: silu's exp and division as the GPU's approximate
    instructions; ``max_registers``: per thread (None: the compiler's choice);
    ``native_bf16``: bfloat16 rounded by the GPU's instruction (compute capability 8.0+);
    ``short_tokens``: the kernel of launches whose sequences hold at most that many tokens
    (0: the general kernel); ``row_group``: channels per access to rows of x and out;
    ``layout``: the values of LAYOUT_ARGS compiled in (None: read from the arguments);
    ``early_weights``, ``group_state``, ``vector_taps``, ``uniform_decode``: the template's
    options (``jitconv.kernels.template``); ``block``: the thread block's shape compiled in
    (with a layout only); ``compact_args``: the layout's parameters dropped from the
    signature; ``exact_grid``: no bounds guard where the grid rounds nothing up;
    ``fused_plan``: the element types of a device plan's metadata (``planner``'s
    METADATA_ARRAYS order) when the kernel plans its own block (``template``'s
    ``kernel_source``'s ``record_args``: it then also takes ``planner.RECORD_ARGS``), else
    None; ``shared_record``: its record computed once per thread block (the template's
    ``shared_record``: for kernels without a bounds guard, where every thread reaches the
    barrier; every warp computing the record itself doubled the instructions the H200
    executed for a spec step, 2.78 M against 5.51 M, ncu);
    ``plan_kind``: those of its RECORD_ARGS compiled in as constants (``plan_kind()``), the
    kernel then taking the others; ``chains``: the template's chain piece (parent maps,
    intermediate windows), only in kernels of plans that have them, so that every other
    launch runs the kernel it ran before the piece existed; ``stage``: the GDN conv
    stage's kernel (the template's ``stage``: ``abi.STAGE_ARGS`` follow the others; a
    warp's 32 lanes are one q or k head, so channels = head_k_dim / 32). Values without
    effect are normalized, so that one kernel has one spec."""
    width: int
    dtype_name: str
    channels: int = 1
    fastmath: bool = False
    lookahead: int = 1
    fast_exp: bool = False
    max_registers: Optional[int] = None
    native_bf16: bool = False
    short_tokens: int = 0
    row_group: int = 1
    layout: Optional[tuple] = None
    early_weights: bool = False
    group_state: bool = False
    vector_taps: bool = False
    block: Optional[tuple] = None
    compact_args: bool = True
    exact_grid: bool = True
    uniform_decode: bool = False
    fused_plan: Optional[tuple] = None
    shared_record: bool = False
    plan_kind: Optional[tuple] = None
    chains: bool = False
    stage: bool = False

    def __post_init__(self):
        normal = {"native_bf16": self.native_bf16 and self.dtype_name == "bfloat16",
                  "compact_args": self.compact_args and self.layout is not None,
                  "exact_grid": self.exact_grid and self.block is not None}
        # every thread must reach the barrier: no bounds guard returns before it
        normal["shared_record"] = self.shared_record and self.fused_plan is not None and \
            _exact(self.layout, self.block, self.channels, normal["exact_grid"])
        normal["plan_kind"] = self.plan_kind if self.fused_plan is not None else None
        normal["chains"] = self.chains and not self.short_tokens
        for name, value in normal.items():
            object.__setattr__(self, name, value)


def _exact(layout, block, channels, exact_grid):
    """Whether the grid has exactly one thread per channel group and token block (no
    bounds guard): a compiled-in 1-D thread block that divides the channel groups."""
    if not (exact_grid and block and layout is not None) or block[1] != 1:
        return False
    return layout[LAYOUT_ARGS.index("dim")] // channels % block[0] == 0


def name_and_source(spec):
    """(kernel name, Python source, argument names) of a KernelSpec."""
    width, dtype_name, channels = spec.width, spec.dtype_name, spec.channels
    layout, block, fused_plan, plan_kind = spec.layout, spec.block, spec.fused_plan, \
        spec.plan_kind
    if width not in SUPPORTED_WIDTHS:
        raise ValueError(f"width must be one of {SUPPORTED_WIDTHS}, got {width}")
    if block and layout is None:
        raise ValueError("block: a thread block shape is compiled in only with a layout")
    exact = _exact(layout, block, channels, spec.exact_grid)
    name = (f"jitconv_conv_w{width}_{dtype_name}_c{channels}_l{spec.lookahead}"
            f"{'_fast' if spec.fastmath else ''}{'_fastexp' if spec.fast_exp else ''}"
            f"{f'_r{spec.max_registers}' if spec.max_registers else ''}"
            f"{'_cvt' if spec.native_bf16 and dtype_name == 'bfloat16' else ''}"
            f"{f'_short{spec.short_tokens}' if spec.short_tokens else ''}"
            f"{f'_g{spec.row_group}' if spec.row_group > 1 else ''}"
            f"{'_ew' if spec.early_weights else ''}{'_gs' if spec.group_state else ''}"
            f"{'_vt' if spec.vector_taps else ''}"
            f"{f'_k{hash(layout) % 10 ** 10}' if layout is not None else ''}"
            f"{f'_b{block[0]}x{block[1]}' if block else ''}"
            f"{'_ca' if layout is not None and spec.compact_args else ''}"
            f"{'_ng' if exact else ''}{'_ud' if spec.uniform_decode else ''}"
            f"{f'_fp{hash(fused_plan) % 10 ** 6}' if fused_plan else ''}"
            f"{'_sr' if spec.shared_record else ''}"
            f"{f'_pk{hash(plan_kind) % 10 ** 6}' if plan_kind else ''}"
            f"{'_ch' if spec.chains else ''}{'_gdn' if spec.stage else ''}")
    backend = dataclasses.replace(CUDA, index=cuda_index(block, exact)) if block else CUDA
    # Bound at the body's top: the layout's values (kept as renamed parameters without
    # compact_args), then the plan kind's.
    constants = tuple((param, value, not spec.compact_args)
                      for param, value in zip(LAYOUT_ARGS, layout or ()))
    constants += tuple((param, value, False) for param, value in (plan_kind or ())
                       if fused_plan)
    source = kernel_source(width, name, backend, channels, spec.lookahead,
                           state_chunk=width - 1 + STATE_CHUNK_EXTRA,
                           short_tokens=spec.short_tokens, row_group=spec.row_group,
                           early_weights=spec.early_weights, group_state=spec.group_state,
                           vector_taps=spec.vector_taps, uniform_decode=spec.uniform_decode,
                           record_args=RECORD_ARGS if fused_plan else None,
                           shared_record=bool(fused_plan) and spec.shared_record,
                           constants=constants, chains=spec.chains, stage=spec.stage)
    names = CALL_ARGS if layout is not None and spec.compact_args else ARG_NAMES
    names += record_args_taken(plan_kind) if fused_plan else ()
    return name, source, names + (STAGE_NAMES if spec.stage else ())
