"""Backends: one package per kind of device, each behind the same small interface.

- ``sycl``: SYCL devices through dpctl (Intel GPUs, the Intel OpenCL CPU device); kernels
  compiled to SPIR-V by numba-dpex, cached and shipped, submitted through dpctl.
- ``cuda``: NVIDIA GPUs through numba-cuda, on torch's current CUDA stream.

A plan knows no backend by name: ``registry.for_call(x)`` picks the backend that runs a
call with this x, the plan checks the tensors (``jitconv.api``) and hands the backend a
``Launch``. What a backend derives per plan (tables copied to a device, kernel choices,
prepared launches) it keeps in the plan's ``derived`` dict under names of its own, or
itself keyed by the plan; the plan's other fields are never written after it is built.
"""

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, kw_only=True, slots=True)
class Launch:
    """One run's checked tensors, as the plan hands them to a backend."""
    x: object          # channels contiguous (a copy of the caller's x if they were not)
    weight: object
    bias: object       # or None
    conv_state: object
    out: object        # the caller's out (normalized), or None
    target: object     # where the kernel writes: out, or a new tensor
    silu: bool
    math: object       # None (the backend's default for the dtype), "exact" or "fast"
    dtype: str         # "float32", "float16" or "bfloat16"
    extents: dict      # byte extents of the arguments (validation.check_aliasing)
    zero_copy: bool    # x and out are the caller's own tensors (the launch may be kept)
    key: object        # the backend's key from ``remembered``, or None
    # The kernel's split mode (kernels.abi SPLIT_*). SPLIT_PARTS: target takes the
    # non-spec part's rows and out2 the spec part's, row k of a part its k-th token
    # (either None for a part without tokens: nothing is written there, the backend
    # passes x in its place); spec_slot0: the spec part's first token slot. SPLIT_SLOTS:
    # each token at its slot's row of target (a new output; out2 not used).
    split: int = 0
    out2: object = None
    spec_slot0: int = 0
    # The intermediate windows (the plan's window rows), or None.
    windows: object = None
    # The GDN conv stage's inputs and outputs (a ``StageTensors``), or None: the conv
    # alone. With it split is SPLIT_PARTS and target / out2 are the parts' q | k | v
    # buffers, viewed as (part tokens, dim).
    stage: object = None


@dataclass(frozen=True, kw_only=True)
class StageTensors:
    """A stage run's tensors and head layout, checked (``jitconv.kernels.abi.STAGE_ARGS``
    says how the kernel reads them)."""
    a: object          # (tokens, HV), unit column stride, x's dtype
    b: object          # (tokens, HV), the same
    A_log: object      # (HV,) float32, contiguous
    dt_bias: object    # (HV,) float32, contiguous
    buffer: object     # the run's one new output, flat; the parts' buffers and gates are
    #                    views of it (a remembered run allocates it anew and patches
    #                    their addresses: ``cuda.driver.Prepared``)
    gates: object      # float32: the non-spec part's g and beta, then the spec part's
    part_rows: tuple   # (non-spec, spec) rows of each part's buffer (its tokens; a
    #                    device plan's one part: every row of x)
    head_k_dim: int
    qk: int            # num_k_heads * head_k_dim
    vdim: int          # num_v_heads * head_v_dim
    head_v_dim: int
    l2norm: tuple      # each part's first normalised row (non-spec, spec;
    #                    kernels.abi.STAGE_L2NORM_NONE: none)
    exp_g: bool


class Backend(Protocol):
    """What every backend implements; the public layer calls nothing else on one."""

    name: str
    state: object  # everything the backend keeps between calls, with a ``clear()``

    def devices(self) -> list:
        """The device names this backend runs on ("opencl:cpu:0", "cuda:0", ...)."""

    def takes(self, x) -> bool:
        """Whether a call whose x is ``x`` runs on this backend."""

    def remembered(self, plan, args, activation, math, split=0):
        """(result, key): the result of a launch remembered for exactly these tensors
        and split mode (submitted now, no checks needed), else None and a key for
        ``launch`` to keep this one under (None: never kept). SPLIT_PARTS runs (the
        caller's two outputs) are never remembered; only what the backend refuses for
        any run is checked then."""

    def launch(self, plan, launch: Launch) -> None:
        """Run ``plan`` on the checked tensors of ``launch``, writing ``launch.target``."""

    def empty_output(self, x, shape, dtype):
        """A new output of ``shape`` for a call whose x is ``x`` (its kind and device)."""

    def empty(self, shape, dtype, device):
        """A new tensor on ``device`` (one of this backend's) its kernels use with no copy."""

    def remembered_stage(self, plan, args, stage_args, activation, math):
        """``remembered`` for a GDN stage run (``args``: x, weight, bias, conv_state,
        None; ``stage_args``: a, b, A_log, dt_bias, (num_k_heads, head_k_dim,
        head_v_dim), use_l2norm, exp_g): (its new output buffer, key) or (None, key)."""

    def stage_refusal(self, head_k_dim, head_v_dim):
        """Why this backend cannot run the GDN stage with these head dims (a message
        naming the argument), or None."""

    def as_floats(self, t):
        """A torch tensor ``t`` as a contiguous float32 vector (itself when it is one)."""

    def read_errors(self, plan) -> list:
        """A device plan's own error words (``kernels.planner.ERRORS``), cleared."""

    def new_error_words(self, device):
        """Zeroed error words shared by the device plans of one-shot calls on ``device``."""

    def read_error_words(self, words) -> list:
        """Those words' values, cleared where set (waits for the plans that write them)."""

    def forget_runs(self) -> None:
        """Drop every remembered launch."""

    def clear(self) -> None:
        """Forget every cache and counter the backend keeps (``state.clear()``)."""
