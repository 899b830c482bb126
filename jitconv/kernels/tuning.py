"""Tuning values: one table, keyed by backend, architecture, dtype and kind of kernel.

Every value here was measured against its alternatives in one process (the figures, and
how to reproduce them: docs/design.md, "CUDA (H200) choices"); kept optimizations have no
off-switch. Benchmarks and experiments try other values through ``override`` (in code, for
the process: not for concurrent use), never through environment variables.

Kinds of kernel: "general" (prefill chunks and mixed steps), "decode" (launches whose
sequences hold one token each) and "spec" (verify sequences of a few tokens). Only the
CUDA backend has tuning values; the SYCL kernels take theirs from ``abi`` (their choices
are properties of the kernels themselves: the wide kernels' channel counts, silu's math).
"""

import contextlib
import contextvars
import dataclasses


@dataclasses.dataclass(frozen=True, kw_only=True)
class CudaTuning:
    channels: int = 2            # contiguous channels per thread (halved until it divides dim)
    lookahead: int = 0           # tokens loaded before their stores; 0: automatic, below
    short_lookahead: int = 4     # automatic: launches whose blocks hold at most this many tokens
    long_lookahead: int = 8      # automatic: every other launch
    threads: int = 128           # per thread block
    max_registers: int = 64      # per thread (0: the compiler's choice)
    short_kernel: bool = True    # decode / spec launches run a kernel with only that path
    row_group: int = 2           # channels per access to rows of x and out
    group_state: bool = False    # the conv state accessed row_group channels at a time too
    early_weights: bool = False  # weights and bias loaded before the state update
    vector_taps: bool = True     # a (dim, 4) weight's taps as one vector load
    constant_layout: bool = True  # a layer's offsets, strides, dim, flags compiled in
    compact_args: bool = True    # ... and dropped from the kernel's parameters
    fixed_block: bool = True     # ... with the thread block's shape compiled in
    exact_grid: bool = True      # ... and no bounds guard where the grid is exact
    uniform_decode: bool = True  # plain decode steps: length 1 and window column 0 as constants
    fastmath: bool = False       # numba's fastmath for the whole kernel
    fast_exp: bool = True        # silu's math when a call passes math=None: the fast one
    # device plans: the conv kernel plans its own block (one launch), not a planner kernel
    # before it (H200, 2026-12-03, 4 workloads: kernel 0.77-0.93x, graph replay 0.74-0.89x)
    fused_planner: bool = True
    # ... its record computed by one thread of the thread block and shared through shared
    # memory (a barrier), not by every warp (H200, 2026-12-04: spec 0.92-0.97x kernel
    # time, decode 1.03x: the table turns it on for spec kernels only)
    shared_record: bool = False
    # ... with the plan's kind compiled in (``source.plan_kind``: offsets, strides, flags,
    # an absent part's count), so that the record's tests of them fold away (H100,
    # 2026-12-05, 4 workloads: kernel 0.81-0.93x, graph replay 0.82-0.92x)
    constant_plan: bool = True


# (backend, architecture, dtype, kind) -> values; "*" matches anything. Entries apply in
# this order over the dataclass's defaults, more specific ones last. The architecture is
# "sm_XY" for a GPU (every figure was measured on an H200, sm_90) or "simulator".
TABLE = {
    ("cuda", "*", "*", "*"): {},
    ("cuda", "simulator", "*", "*"): {"threads": 32},  # Python threads: keep blocks small
    ("cuda", "*", "*", "decode"): {"group_state": True, "early_weights": True},
    # 16-bit spec kernels ran 0.64-0.93x as fast with paired row accesses
    ("cuda", "*", "*", "spec"): {"row_group": 1, "group_state": True, "early_weights": True,
                                 "shared_record": True},
    ("cuda", "*", "float32", "spec"): {"row_group": 2},
}

CHOICES = {  # what each value may be (override checks)
    "channels": (1, 2, 4, 8), "lookahead": (0, 1, 2, 4, 8, 16),
    "short_lookahead": (1, 2, 4, 8, 16), "long_lookahead": (1, 2, 4, 8, 16),
    "threads": tuple(range(32, 1025, 32)), "max_registers": (0,) + tuple(range(32, 256, 8)),
    "row_group": (1, 2, 4),
}

# Values over every entry of TABLE (``override``): per context (thread, task), as a
# sorted tuple of (name, value), so that one thread's override is no other's.
OVERRIDES = contextvars.ContextVar("jitconv_tuning_overrides", default=())


def overrides():
    """The overrides in force here, as a sorted tuple of (name, value) (hashable: a CUDA
    run's key holds it)."""
    return OVERRIDES.get()


def _matches(pattern, value):
    return pattern == "*" or pattern == value


def cuda(arch, dtype_name, kind):
    """The CudaTuning of a CUDA kernel of ``kind`` for ``dtype_name`` on ``arch``."""
    values = {}
    for (backend, a, d, k), entry in TABLE.items():
        if backend == "cuda" and _matches(a, arch) and _matches(d, dtype_name) and \
                _matches(k, kind):
            values.update(entry)
    values.update(OVERRIDES.get())
    return CudaTuning(**values)


def check(name, value):
    fields = {f.name: f for f in dataclasses.fields(CudaTuning)}
    if name not in fields:
        raise ValueError(f"{name}: not a tuning value; expected one of {sorted(fields)}")
    if fields[name].type in (bool, "bool"):
        if not isinstance(value, bool):
            raise ValueError(f"{name}: expected True or False, got {value!r}")
    elif isinstance(value, bool) or value not in CHOICES.get(name, (value,)):
        raise ValueError(f"{name}: expected one of {CHOICES.get(name)}, got {value!r}")


@contextlib.contextmanager
def override(**values):
    """Tuning values other than the table's, for the block (benchmarks, experiments):
    ``with tuning.override(lookahead=16, row_group=1): ...``. Checked by name and value.
    In force in this thread (context) only: threads started inside the block do not see
    it."""
    for name, value in values.items():
        check(name, value)
    token = OVERRIDES.set(tuple(sorted(dict(OVERRIDES.get(), **values).items())))
    try:
        yield
    finally:
        OVERRIDES.reset(token)
