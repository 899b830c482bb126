"""Device plans (``jitconv.device_plan``): metadata that stays in device tensors, read by
the device planner at every run, on both backends.

The shared tests run on the SYCL device under test (``sycl``: torch CPU tensors in USM
memory, ``jitconv.empty``, so that nothing is copied) and on CUDA (``cuda``): under numba's
CUDA simulator in CI (tests/test_cuda_simulator.py starts this file with test_cuda.py)
and on an NVIDIA GPU. The CUDA-graph tests and the remembered-launch tests need a GPU
(the simulator has neither graphs nor driver launches).
"""

import contextvars
import os
import threading
import types

import pytest
import torch

import jitconv
from jitconv.api import device_calls, plan_cache, validation
from jitconv.api import device_plan as device_plan_module
from jitconv.backends.cuda import devices as cuda_devices
from jitconv.backends.cuda import launching as cuda_launching
from jitconv.backends.cuda import source as cuda_source
from jitconv.backends.sycl import launching as sycl_launching
from jitconv.kernels import planner, tuning
from jitconv.reference import causal_conv1d_reference, gdn_conv_stage_reference
from jitconv.backends.sycl.state import STATE as SYCL_STATE
from jitconv.backends.cuda.state import STATE as CUDA_STATE

from helpers import (DTYPES, GDN_STEPS, POISON, assert_outputs_close, assert_state_exact,
                     bits, gdn_case, poison_new_outputs,
                     cumulative, lengths_of, make_state, random_parents, randn)

SIM = cuda_devices.simulating()
SYCL_HIDDEN = os.environ.get("JITCONV_TEST_HIDE_SYCL") == "1"
DIM = 12 if SIM else 136
GPU_ONLY = pytest.mark.skipif(SIM or not cuda_devices.devices(),
                              reason="needs a GPU (the simulator has no CUDA graphs and no "
                                     "driver launches)")
KINDS = ("decode", "spec", "mixed", "prefill")


@pytest.fixture(scope="module", params=["sycl", "sycl-planner", "cuda", "cuda-planner"])
def device(request):
    """The torch device of a backend's tensors: "cpu" for the SYCL device under test
    (tensors made by ``put``: USM memory), the CUDA device (or the simulator's "cpu"):
    "cuda" with the conv kernel planning its own blocks (the tuning's default,
    ``fused_planner``), "cuda-planner" with the planner kernel launched before it. On
    SYCL likewise: "sycl" runs the fused kernel, "sycl-planner" the planner and the
    kernel that reads its table, as where no fused kernel is shipped or compiled."""
    if request.param.startswith("cuda"):
        if not cuda_devices.devices():
            pytest.skip(f"no CUDA device: {cuda_devices.why_unavailable()}")
        name = jitconv.set_device(cuda_devices.devices()[0])
        with tuning.override(fused_planner=request.param == "cuda"):
            yield cuda_devices.torch_device(name)
        return
    if SYCL_HIDDEN or SIM:
        pytest.skip("SYCL device plans: not in the CUDA simulator's run (SYCL hidden)")
    name = request.getfixturevalue("sycl_device")
    if cuda_devices.is_cuda_name(name):  # a CUDA machine without a SYCL device
        pytest.skip(f"SYCL device plans: the device under test is {name}")
    jitconv.set_device(name)
    # remembered launches keep their kernel: none may cross from one variant to the other
    SYCL_STATE.runs.clear()
    with pytest.MonkeyPatch.context() as patch:
        if request.param == "sycl-planner":
            patch.setattr(sycl_launching, "fused_kernel", lambda *args: None)
        yield torch.device("cpu")
    SYCL_STATE.runs.clear()


@pytest.fixture(scope="module", params=["planner", "fused"])
def cuda_device(request):
    name = jitconv.set_device(cuda_devices.devices()[0])
    with tuning.override(fused_planner=request.param == "fused"):
        yield cuda_devices.torch_device(name)


def put(t, device):
    """``t`` on ``device``: for the SYCL device a copy in USM memory (zero-copy for the
    kernels), strides kept."""
    if device.type != "cpu" or SIM:
        return t.to(device)
    base = jitconv.empty((t.untyped_storage().nbytes() // t.element_size(),), t.dtype)
    u = base.as_strided(t.shape, t.stride(), t.storage_offset())
    u.copy_(t)
    return u


def full(shape, value, dtype, device):
    return put(torch.full(shape, value, dtype=dtype), device)


def random_metadata(gen, kind, num_seqs, num_tokens, num_lines, state_len, width,
                    max_len=None, pads=1):
    """Metadata of one step of ``kind`` with ``num_seqs`` sequences of each part it has,
    as CPU tensors (kwargs of ``jitconv.device_plan``), at most ``num_tokens`` tokens in
    all; lengths, cache lines (distinct, ``pads`` of them -1), flags and accepted counts
    random."""
    S = width - 1
    lines = torch.randperm(num_lines, generator=gen)[:2 * num_seqs].to(torch.int32)
    ns_lines, sp_lines = lines[:num_seqs].clone(), lines[num_seqs:].clone()

    def lengths(low, high, n):
        return [int(v) for v in torch.randint(low, high + 1, (n,), generator=gen)]

    def accepted(n):
        return torch.randint(1, state_len - S + 2, (n,), generator=gen, dtype=torch.int32)

    md = {}
    budget = num_tokens
    if kind == "decode":
        md["non_spec_state_indices"] = ns_lines
        budget -= num_seqs
    if kind in ("mixed", "prefill"):
        longest = max_len or 40
        ns = lengths(0, longest, num_seqs)
        while sum(ns) > budget // 2:
            ns = [n // 2 for n in ns]
        budget -= sum(ns)
        md.update(non_spec_query_start_loc=cumulative(ns), non_spec_state_indices=ns_lines,
                  has_initial_state=torch.rand(num_seqs, generator=gen) < 0.7)
        if kind == "prefill":
            md["non_spec_num_accepted_tokens"] = accepted(num_seqs)
    if kind in ("spec", "mixed"):
        longest = min(max_len or 16, state_len - width + 2)
        sp = lengths(1, longest, num_seqs)
        while sum(sp) > budget:
            sp = [max(1, n // 2) for n in sp]
        md.update(spec_query_start_loc=cumulative(sp), spec_state_indices=sp_lines,
                  num_accepted_tokens=accepted(num_seqs))
    for key in ("non_spec_state_indices", "spec_state_indices"):
        if key in md and pads:
            md[key][torch.randperm(num_seqs, generator=gen)[:pads]] = -1
    return md


def reference_of(md, data, activation="silu", spec_first=False, windows=None):
    """The float64 reference of a device plan's step: each part's tokens consecutive
    rows, non-spec then spec (``spec_first``: spec then non-spec), the rest of x zeros;
    with ``windows`` (the intermediate windows), their new values third."""
    args = reference_metadata(md, spec_first)
    if windows is not None:
        args["intermediate_windows"] = windows.cpu()
    return causal_conv1d_reference(*(t.cpu() if t is not None else None for t in data),
                                   activation=activation, **args)


def reference_metadata(md, spec_first=False):
    """A device plan's metadata as the reference's keywords: the token maps of its
    layout (each part's tokens consecutive rows, non-spec then spec or ``spec_first``)
    and a decode step's query_start_loc spelled out."""
    args = {k: v.cpu() for k, v in md.items()}
    if "non_spec_state_indices" in args and "non_spec_query_start_loc" not in args:
        args["non_spec_query_start_loc"] = torch.arange(len(args["non_spec_state_indices"]) + 1)
    n_ns = int(args["non_spec_query_start_loc"][-1]) if "non_spec_query_start_loc" in args \
        else 0
    n_sp = int(args["spec_query_start_loc"][-1]) if "spec_query_start_loc" in args else 0
    ns_first, sp_first = (n_sp, 0) if spec_first else (0, n_ns)
    if n_ns or "non_spec_query_start_loc" in args:
        args["non_spec_token_indx"] = torch.arange(ns_first, ns_first + n_ns)
    if "spec_query_start_loc" in args:
        args["spec_token_indx"] = torch.arange(sp_first, sp_first + n_sp)
    return args


def layer(gen, dtype, num_tokens, num_lines, state_len, width, device, layout="SD", dim=DIM):
    data = (randn(gen, (num_tokens, dim), dtype), randn(gen, (dim, width), dtype),
            randn(gen, (dim,), dtype), make_state(gen, num_lines, dim, state_len, dtype, layout))
    return tuple(put(t, device) for t in data)


def run_checked(plan, data, md, dtype, spec_first=False):
    """One run into a poisoned out, checked against the reference (outputs within the
    dtype's tolerance, every cache line bit-exact, touched or not)."""
    x, w, b, state = data
    want_out, want_state = reference_of(md, (x, w, b, state), spec_first=spec_first)
    out = full(tuple(x.shape), POISON, dtype, x.device)
    got = plan.run(x, w, b, state, out=out)
    assert got is out
    assert_outputs_close(out, want_out, dtype)
    assert_state_exact(state, want_state)
    plan.check_errors()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
@pytest.mark.parametrize("declared", [True, False])
def test_runs_follow_rewritten_metadata(device, kind, dtype_name, declared):
    """One plan, three steps: the metadata tensors are rewritten in place between runs
    (lengths, cache lines, flags, accepted counts) and each run matches the reference of
    the values they hold then. ``declared``: max_query_len given (one block per sequence,
    the short kernels) or not (the block search, the general kernel)."""
    dtype = DTYPES[dtype_name]
    width, num_tokens, num_lines, nseq = 4, 40, 20, 5
    max_len = (1 if kind == "decode" else 5 if kind == "spec" else 12) if declared else None
    state_len = 3 + (max_len or 5) if kind in ("spec", "mixed") else 6
    gen = torch.Generator().manual_seed(7 + len(kind) + declared)
    md = random_metadata(gen, kind, nseq, num_tokens, num_lines, state_len, width, max_len)
    live = {k: put(v, device) for k, v in md.items()}
    plan = jitconv.device_plan(num_tokens, num_lines, state_len, width, max_query_len=max_len,
                               **live)
    assert plan.one_slot == (declared or kind == "decode")  # a decode step: 1 token each
    assert plan.uniform_decode == (kind == "decode")
    data = layer(gen, dtype, num_tokens, num_lines, state_len, width, device)
    for step in range(3):
        if step:
            new = random_metadata(gen, kind, nseq, num_tokens, num_lines, state_len, width,
                                  max_len, pads=step - 1)
            for k, v in new.items():
                live[k].copy_(v)
        run_checked(plan, data, live, dtype)


@pytest.mark.parametrize("declared", [True, False])
def test_spec_rows_first(device, declared):
    """vLLM's layout of a mixed step: the spec part's rows first, the non-spec part's
    after them (``spec_rows_first``); runs follow rewrites, decodes (implicit query_start_loc)
    as well as prefill chunks."""
    width, num_tokens, num_lines, nseq, state_len = 4, 40, 20, 4, 8
    max_len = 5 if declared else None
    gen = torch.Generator().manual_seed(40 + declared)
    for kind in ("mixed", "decode+spec"):
        md = random_metadata(gen, "mixed", nseq, num_tokens, num_lines, state_len, width,
                             max_len)
        if kind == "decode+spec":  # decodes: one token each, no query_start_loc
            del md["non_spec_query_start_loc"], md["has_initial_state"]
        live = {k: put(v, device) for k, v in md.items()}
        plan = jitconv.device_plan(num_tokens, num_lines, state_len, width,
                                   max_query_len=max_len, spec_rows_first=True, **live)
        data = layer(gen, torch.float32, num_tokens, num_lines, state_len, width, device)
        for step in range(2):
            if step:
                new = random_metadata(gen, "mixed", nseq, num_tokens, num_lines, state_len,
                                      width, max_len, pads=0)
                for k in live:
                    live[k].copy_(new[k])
            run_checked(plan, data, live, torch.float32, spec_first=True)


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_spec_kernel_shares_its_record(device, dtype_name, monkeypatch):
    """A spec step whose channel groups fill whole thread blocks (no bounds guard): the
    fused conv kernel computes its block's record in one thread and shares it (the
    tuning's ``shared_record``); runs follow rewritten metadata, with pads and bad values
    among them."""
    if device.type == "cpu" and not SIM:
        pytest.skip("the CUDA kernel's choice (SYCL device plans run the planner kernel)")
    dtype = DTYPES[dtype_name]
    tune = tuning.cuda("simulator" if SIM else "sm_90", dtype_name, "spec")
    dim = 4 * tune.threads * tune.channels  # groups: a multiple of the block
    width, num_tokens, num_lines, nseq, max_len = 4, 48, 30, 9, 4
    state_len = width - 2 + max_len
    gen = torch.Generator().manual_seed(11)
    md = random_metadata(gen, "spec", nseq, num_tokens, num_lines, state_len, width, max_len)
    live = {k: put(v, device) for k, v in md.items()}
    plan = jitconv.device_plan(num_tokens, num_lines, state_len, width, max_query_len=max_len,
                               **live)
    data = layer(gen, dtype, num_tokens, num_lines, state_len, width, device, dim=dim)
    # layouts compiled in are capped per process (MAX_LAYOUTS; earlier tests may have
    # used them all): without one no thread block shape is compiled in, nor the record
    monkeypatch.setattr(CUDA_STATE, "layouts", set())
    used, real = [], cuda_launching.get_kernel
    monkeypatch.setattr(cuda_launching, "get_kernel", lambda spec: used.append(spec) or
                        real(spec))
    for step in range(3):
        if step:
            new = random_metadata(gen, "spec", nseq, num_tokens, num_lines, state_len, width,
                                  max_len, pads=step)
            for k, v in new.items():
                live[k].copy_(v)
        run_checked(plan, data, live, dtype)
    fused = [spec for spec in used if spec.fused_plan]
    if tune.fused_planner:  # the "cuda" device (not "cuda-planner")
        assert fused and all(spec.shared_record for spec in fused), used


@pytest.mark.parametrize("kind", ["decode", "spec", "mixed"])
@pytest.mark.parametrize("constant", [True, False])
def test_kernel_compiles_in_the_plans_kind(device, kind, constant, monkeypatch):
    """CUDA's fused kernel takes what the plan's kind fixes as constants (the tuning's
    ``constant_plan``): offsets, strides, flags, and the count of an absent part, never
    the other counts, so that steps of other sizes share it; with or without them, runs
    follow rewritten metadata (pads among them)."""
    if device.type == "cpu" and not SIM:
        pytest.skip("the CUDA kernel's choice (SYCL's fused kernels take every argument)")
    width, num_tokens, num_lines, nseq = 4, 40, 20, 5
    max_len = 1 if kind == "decode" else 5
    state_len = 3 + max_len
    gen = torch.Generator().manual_seed(5 + len(kind))
    md = random_metadata(gen, kind, nseq, num_tokens, num_lines, state_len, width, max_len)
    live = {k: put(v, device) for k, v in md.items()}
    plan = jitconv.device_plan(num_tokens, num_lines, state_len, width, max_query_len=max_len,
                               **live)
    data = layer(gen, torch.float32, num_tokens, num_lines, state_len, width, device)
    used, real = [], cuda_launching.get_kernel
    monkeypatch.setattr(cuda_launching, "get_kernel", lambda spec: used.append(spec) or
                        real(spec))
    with tuning.override(constant_plan=constant):
        for step in range(3):
            if step:
                new = random_metadata(gen, kind, nseq, num_tokens, num_lines, state_len,
                                      width, max_len, pads=step)
                for k, v in new.items():
                    live[k].copy_(v)
            run_checked(plan, data, live, torch.float32)
        # a step of another batch size (an engine's next capture size): the same kernel
        md = random_metadata(gen, kind, nseq + 2, num_tokens, num_lines, state_len, width,
                             max_len)
        other = {k: put(v, device) for k, v in md.items()}
        run_checked(jitconv.device_plan(num_tokens, num_lines, state_len, width,
                                        max_query_len=max_len, **other), data, other,
                    torch.float32)
    fused = [spec for spec in used if spec.fused_plan]
    assert len(set(fused)) <= 1, used
    if not tuning.cuda("simulator" if SIM else "sm_90", "float32", "general").fused_planner:
        assert not fused, used  # "cuda-planner": the planner kernel, then the conv's
        return
    assert fused, used
    for spec in fused:
        if not constant:
            assert spec.plan_kind is None
            continue
        bound = dict(spec.plan_kind)
        assert set(cuda_source.PLAN_KIND_ARGS) <= set(bound)
        counts = {a for a in cuda_source.PART_COUNTS if a in bound}
        assert counts == {"decode": {"num_sp"}, "spec": {"num_ns"}, "mixed": set()}[kind]
        assert not {"num_tokens", "tail_first", "max_len"} & set(bound)


@pytest.mark.parametrize("metadata", ["usm", "plain"])
def test_sycl_submits(device, metadata, monkeypatch):
    """A SYCL device plan's run is one submit: the fused kernel, which computes its
    records from the metadata ("sycl"); or where none can be had the planner's submit,
    then the conv kernel's ("sycl-planner"). The same for remembered runs (the same
    tensors again) and for metadata in plain CPU memory ("plain": copied at every run,
    the run waits for the kernel), each run following the rewritten values."""
    if device.type != "cpu" or SIM:
        pytest.skip("SYCL device plans: their submits (the device under test is CUDA)")
    fused = sycl_launching.fused_kernel.__name__ == "fused_kernel"  # not the fixture's
    gen = torch.Generator().manual_seed(21)
    width, num_tokens, num_lines, state_len = 4, 30, 16, 7
    md = random_metadata(gen, "mixed", 4, num_tokens, num_lines, state_len, width, 4)
    live = {k: put(v, device) if metadata == "usm" else v.clone() for k, v in md.items()}
    plan = jitconv.device_plan(num_tokens, num_lines, state_len, width, max_query_len=4,
                               **live)
    data = layer(gen, torch.bfloat16, num_tokens, num_lines, state_len, width, device)
    planners = []
    real = sycl_launching.submit_planner
    monkeypatch.setattr(sycl_launching, "submit_planner",
                        lambda *a, **k: planners.append(1) or real(*a, **k))
    before = SYCL_STATE.stats["submitted"]
    for step in range(3):  # checked and packed, then remembered
        if step:
            new = random_metadata(gen, "mixed", 4, num_tokens, num_lines, state_len, width,
                                  4, pads=step - 1)
            for k, v in new.items():
                live[k].copy_(v)
        run_checked(plan, data, live, torch.bfloat16)
    assert SYCL_STATE.stats["submitted"] - before == 3
    assert len(planners) == (0 if fused else 3)
    if fused:  # the kernel built for these metadata types
        assert plan.element_types in [k[-1] for k in SYCL_STATE.kernels], \
            list(SYCL_STATE.kernels)


@pytest.mark.parametrize("width", [2, 3, 5])
def test_widths_and_layouts(device, width):
    gen = torch.Generator().manual_seed(width)
    md = random_metadata(gen, "mixed", 4, 30, 12, width - 1 + 6, width)
    live = {k: put(v, device) for k, v in md.items()}
    plan = jitconv.device_plan(30, 12, width - 1 + 6, width, **live)
    for layout in ("SD", "DS"):
        run_checked(plan, layer(gen, torch.float32, 30, 12, width + 5, width, device, layout),
                    live, torch.float32)


def test_vllm_conventions(device):
    """null_block_id and skip_empty: sequences on the null line or without tokens are
    skipped (state untouched, outputs zero), as vLLM's kernels do."""
    gen = torch.Generator().manual_seed(3)
    qsl = torch.tensor([0, 3, 3, 5, 9], dtype=torch.int32)
    lines = torch.tensor([4, 6, 0, 2], dtype=torch.int32)  # line 0: vLLM's null block
    md = dict(non_spec_query_start_loc=put(qsl, device),
              non_spec_state_indices=put(lines, device))
    plan = jitconv.device_plan(12, 8, 3, 4, null_block_id=0, skip_empty=True, **md)
    data = layer(gen, torch.float32, 12, 8, 3, 4, device)
    as_pads = dict(non_spec_query_start_loc=qsl,
                   non_spec_state_indices=torch.tensor([4, -1, -1, 2], dtype=torch.int32))
    x, w, b, state = data
    want_out, want_state = reference_of(as_pads, data)
    out = plan.run(x, w, b, state)
    assert_outputs_close(out, want_out, torch.float32)
    assert_state_exact(state, want_state)



def test_split_outputs_of_device_plans(device):
    """Split outputs need each part's token count on the host: a device plan of both
    parts without token maps refuses them by name, before anything runs; a plan of one
    part gives that part every row of x (its tokens, then zeros: the count is on the
    device)."""
    gen = torch.Generator().manual_seed(4)
    ns = dict(non_spec_query_start_loc=torch.tensor([0, 3, 5], dtype=torch.int32),
              non_spec_state_indices=torch.tensor([1, 2], dtype=torch.int32))
    sp = dict(spec_query_start_loc=torch.tensor([0, 1], dtype=torch.int32),
              spec_state_indices=torch.tensor([3], dtype=torch.int32),
              num_accepted_tokens=torch.tensor([1], dtype=torch.int32))
    x, w, b, state = layer(gen, torch.float32, 7, 4, 3, 4, device)
    plan = jitconv.device_plan(7, 4, 3, 4, **{k: put(v, device) for k, v in
                                              dict(ns, **sp).items()})
    before = bits(state)
    for split in (dict(out_non_spec=torch.empty_like(x)), dict(split=True)):
        with pytest.raises(ValueError, match="^split: split outputs need"):
            plan.run(x, w, b, state, **split)
    assert torch.equal(bits(state), before)
    plan = jitconv.device_plan(7, 4, 3, 4, **{k: put(v, device) for k, v in ns.items()})
    want_out, want_state = reference_of(ns, (x, w, b, state))
    parts = plan.run(x, w, b, state, split=True)
    assert parts.spec is None and parts.non_spec.shape == x.shape
    assert_outputs_close(parts.non_spec, want_out, torch.float32)  # rows 5, 6: zeros
    assert_state_exact(state, want_state)


BAD = {  # name: (the argument spoiled, how, the error word it sets)
    "line out of range": ("spec_state_indices", lambda t: t.__setitem__(1, 99),
                          planner.E_LINE),
    "negative line": ("non_spec_state_indices", lambda t: t.__setitem__(0, -5),
                      planner.E_LINE),
    "accepted 0": ("num_accepted_tokens", lambda t: t.__setitem__(0, 0), planner.E_ACCEPTED),
    "accepted too far": ("num_accepted_tokens", lambda t: t.__setitem__(2, 50),
                         planner.E_ACCEPTED),
    "qsl decreasing": ("spec_query_start_loc", lambda t: t.__setitem__(2, 0), planner.E_QSL),
    "qsl past x": ("non_spec_query_start_loc", lambda t: t.__setitem__(-1, 10 ** 6),
                   planner.E_QSL),
    "qsl not from 0": ("spec_query_start_loc", lambda t: t.__setitem__(0, 1), planner.E_QSL),
    "too long": ("spec_query_start_loc", lambda t: t[1:].add_(9), planner.E_LENGTH),
}
# The steps' arguments by kind: decode-only and spec-only plans run kernels with the
# absent part compiled away (the CUDA backend's plan kind), mixed ones keep both.
ARGUMENTS = {"decode": {"non_spec_state_indices"},
             "spec": {"spec_query_start_loc", "spec_state_indices", "num_accepted_tokens"}}
ARGUMENTS["mixed"] = ARGUMENTS["decode"] | ARGUMENTS["spec"] | {"non_spec_query_start_loc"}


@pytest.mark.parametrize("kind,bad", [(kind, bad) for kind in ARGUMENTS for bad in BAD
                                      if BAD[bad][0] in ARGUMENTS[kind]])
@pytest.mark.parametrize("declared", [True, False])
def test_bad_values_are_flagged_and_stay_inside(device, kind, bad, declared):
    """A bad value found on the device: its error word is set (check_errors raises it and
    clears it), and nothing outside x, out and conv_state is written: each lies inside a
    larger poisoned buffer whose margins must stay bit-identical, and every cache line
    no sequence owns is unchanged."""
    argument, spoil, word = BAD[bad]
    gen = torch.Generator().manual_seed(11)
    width, num_tokens, num_lines, state_len = 4, 40, 12, 8
    max_len = (1 if kind == "decode" else 5) if declared else None
    md = random_metadata(gen, kind, 4, num_tokens, num_lines, state_len, width,
                         max_len=max_len, pads=0)
    spoil(md[argument])
    live = {k: put(v, device) for k, v in md.items()}
    plan = jitconv.device_plan(num_tokens, num_lines, state_len, width,
                               max_query_len=max_len, **live)

    def inside(shape, dtype=torch.float32):
        """A view of ``shape`` in the middle of a poisoned buffer, and the buffer."""
        n = 1
        for s in shape:
            n *= s
        buffer = full((n + 64,), POISON, dtype, device)
        return buffer[32:32 + n].view(shape), buffer

    x, xb = inside((num_tokens, DIM))
    x.copy_(randn(gen, (num_tokens, DIM), torch.float32))
    out, ob = inside((num_tokens, DIM))
    state, sb = inside((num_lines, state_len, DIM))
    state.copy_(randn(gen, (num_lines, state_len, DIM), torch.float32))
    before = [bits(t) for t in (xb, sb)]
    w, b = put(randn(gen, (DIM, width), torch.float32), device), \
        put(randn(gen, (DIM,), torch.float32), device)
    plan.run(x, w, b, state.transpose(1, 2), out=out)
    with pytest.raises(ValueError, match="bad metadata values") as raised:
        plan.check_errors()
    assert planner.ERRORS[word] in str(raised.value)
    plan.check_errors()  # cleared: nothing new since
    for t, margin in ((xb, before[0]), (ob, None), (sb, before[1])):
        got = bits(t)
        if margin is None:  # out's margins: still poison
            assert torch.isnan(t[:32]).all() and torch.isnan(t[-32:]).all()
        else:
            assert torch.equal(got[:32], margin[:32]) and torch.equal(got[-32:], margin[-32:])
    assert torch.equal(bits(xb), before[0])  # x is only read
    if word != planner.E_QSL:  # (with bad query_start_loc rows may be left unwritten)
        assert not torch.isnan(out).any()  # every row written, skipped ones as zeros


def test_host_checks(device):
    """What the host can see is checked before anything runs, by name."""
    lines = put(torch.tensor([1, 2], dtype=torch.int32), device)
    qsl = put(torch.tensor([0, 1, 3], dtype=torch.int32), device)
    cases = [
        (dict(non_spec_state_indices=[1, 2]), TypeError, "non_spec_state_indices: a device plan"),
        (dict(non_spec_state_indices=lines.float()), TypeError, "expected dtype"),
        (dict(non_spec_query_start_loc=qsl), ValueError, "non_spec_state_indices: required"),
        (dict(non_spec_query_start_loc=qsl[:2], non_spec_state_indices=lines), ValueError,
         "non_spec_state_indices: expected 1 entries"),
        (dict(spec_query_start_loc=qsl, spec_state_indices=lines), ValueError,
         "num_accepted_tokens: required"),
        (dict(spec_query_start_loc=qsl, spec_state_indices=lines,
              num_accepted_tokens=lines[:1]), ValueError, "num_accepted_tokens: expected 2"),
        (dict(num_accepted_tokens=lines), ValueError, "num_accepted_tokens: given without"),
        (dict(non_spec_state_indices=lines, has_initial_state=lines.float()), TypeError,
         "has_initial_state: expected dtype"),
        (dict(non_spec_state_indices=lines, max_query_len=0), ValueError, "max_query_len"),
        (dict(), ValueError, "no metadata"),
    ]
    for kwargs, error, message in cases:
        with pytest.raises(error, match=message):
            jitconv.device_plan(4, 8, 3, 4, **kwargs)
    plan = jitconv.device_plan(4, 8, 3, 4, non_spec_state_indices=lines)
    gen = torch.Generator().manual_seed(1)
    x, w, b, state = layer(gen, torch.float32, 5, 8, 3, 4, device)
    before = bits(state)
    with pytest.raises(ValueError, match="x"):  # 5 rows, the plan has 4
        plan.run(x, w, b, state)
    assert torch.equal(bits(state), before)


# The state rules a device plan takes, by the names of the sets the tests run.
RULE_SETS = {"tree": ("parents",), "windows": ("windows",), "write": ("write",),
             "all": ("parents", "windows", "write")}
RULE_KEYS = {"parents": "{part}_parent_token", "windows": "{part}_window_rows",
             "write": "{part}_write_indices"}


def random_rules(gen, md, rules, num_lines, max_len, window_rows=8):
    """State rules for each part of the step ``md`` (CPU tensors) has: parent maps (a
    random tree per sequence, max_len columns), window rows (about 60% of the sequences,
    distinct rows from 1: row 0 is never written) and write lines (about 60%, distinct
    lines no sequence reads; the others their own line); padded sequences' entries are
    out of range (engines leave anything there)."""
    reads = {int(v) for k in ("non_spec_state_indices", "spec_state_indices") if k in md
             for v in md[k].reshape(-1).tolist() if v >= 0}
    free = [v for v in torch.randperm(num_lines, generator=gen).tolist() if v not in reads]
    rows = (torch.randperm(window_rows - 1, generator=gen) + 1).tolist()
    found = {}
    for part in ("non_spec", "spec"):
        lines = md.get(f"{part}_state_indices")
        if lines is None:
            continue
        qsl = md.get(f"{part}_query_start_loc")
        lengths = [1] * len(lines) if qsl is None else lengths_of(qsl)
        pads = lines < 0
        if "parents" in rules:
            found[f"{part}_parent_token"] = random_parents(gen, lengths, max_len)
        if "windows" in rules:
            take = torch.rand(len(lines), generator=gen) < 0.6
            found[f"{part}_window_rows"] = torch.tensor(
                [rows.pop() if t and rows else -1 for t in take.tolist()], dtype=torch.int32)
            found[f"{part}_window_rows"][pads] = 10 ** 4
        if "write" in rules:
            write = lines.clone()
            for i in range(len(write)):
                if not pads[i] and free and float(torch.rand(1, generator=gen)) < 0.6:
                    write[i] = free.pop()
            write[pads] = num_lines + 7
            found[f"{part}_write_indices"] = write
    return found


def run_rules_checked(plan, data, md, dtype, windows=None, spec_first=False):
    """``run_checked`` for a plan with state rules: outputs, every cache line and the
    windows (bit-exact, entries nobody writes untouched) against the reference."""
    x, w, b, state = data
    want = reference_of(md, (x, w, b, state), spec_first=spec_first, windows=windows)
    out = full(tuple(x.shape), POISON, dtype, x.device)
    got = plan.run(x, w, b, state, out=out, intermediate_windows=windows)
    assert got is out
    plan.check_errors()
    assert_outputs_close(out, want[0], dtype)
    assert_state_exact(state, want[1])
    if windows is not None:
        expected = bits(torch.from_numpy(want[2]).to(dtype))
        assert torch.equal(bits(windows.cpu()), expected)


@pytest.mark.parametrize("kind,rules,dtype_name", [
    (kind, rules, "float32") for kind in ("decode", "spec", "mixed") for rules in RULE_SETS
] + [("mixed", "all", "bfloat16")])
def test_rules_follow_rewritten_metadata(device, kind, rules, dtype_name):
    """Parent maps, window rows and write lines in device tensors: three runs of one
    plan, the metadata and the rules rewritten in place between them (trees, rows,
    lines, lengths, pads), each checked against the reference of what they hold then;
    windows bit-exact, rows nobody writes untouched."""
    dtype = DTYPES[dtype_name]
    width, num_tokens, num_lines, nseq = 4, 40, 24, 4
    max_len = 1 if kind == "decode" else 6
    state_len = 3 + max_len
    gen = torch.Generator().manual_seed(17 + len(kind) * 3 + len(rules))

    def step(pads):
        md = random_metadata(gen, kind, nseq, num_tokens, num_lines, state_len, width,
                             max_len, pads=pads)
        return {**md, **random_rules(gen, md, RULE_SETS[rules], num_lines, max_len)}

    md = step(1)
    live = {k: put(v, device) for k, v in md.items()}
    plan = jitconv.device_plan(num_tokens, num_lines, state_len, width,
                               max_query_len=max_len, **live)
    assert plan.has_chains and plan.one_slot
    data = layer(gen, dtype, num_tokens, num_lines, state_len, width, device)
    windows = None
    if rules in ("windows", "all"):
        windows = put(randn(gen, (8, max_len + 1, DIM, width - 1), dtype), device)
    for n in range(3):
        if n:
            for k, v in step(n - 1).items():
                live[k].copy_(v)
        run_rules_checked(plan, data, live, dtype, windows)


def test_rules_with_spec_rows_first(device):
    """vLLM's layout (spec tokens first) with a tree, windows and write lines."""
    width, num_tokens, num_lines, max_len = 4, 40, 24, 5
    gen = torch.Generator().manual_seed(5)
    md = random_metadata(gen, "mixed", 4, num_tokens, num_lines, 3 + max_len, width,
                         max_len)
    md.update(random_rules(gen, md, RULE_SETS["all"], num_lines, max_len))
    live = {k: put(v, device) for k, v in md.items()}
    plan = jitconv.device_plan(num_tokens, num_lines, 3 + max_len, width,
                               max_query_len=max_len, spec_rows_first=True, **live)
    data = layer(gen, torch.float32, num_tokens, num_lines, 3 + max_len, width, device)
    windows = put(randn(gen, (8, max_len, DIM, width - 1), torch.float32), device)
    run_rules_checked(plan, data, live, torch.float32, windows, spec_first=True)


BAD_RULES = {  # name: (the rule spoiled, how (of sequence 1), the error word it sets)
    "parent after its child": ("spec_parent_token", lambda t: t[1].__setitem__(2, 2),
                               planner.E_PARENT),
    "negative parent": ("spec_parent_token", lambda t: t[1].__setitem__(3, -1),
                        planner.E_PARENT),
    "window row past the rows": ("spec_window_rows", lambda t: t.__setitem__(1, 8),
                                 planner.E_WINDOW),
    "window row below -1": ("spec_window_rows", lambda t: t.__setitem__(1, -2),
                            planner.E_WINDOW),
    "write line out of range": ("spec_write_indices", lambda t: t.__setitem__(1, 24),
                                planner.E_WRITE),
    "negative write line": ("spec_write_indices", lambda t: t.__setitem__(1, -1),
                            planner.E_WRITE),
}


@pytest.mark.parametrize("bad", list(BAD_RULES) + ["longer than the windows' steps"])
def test_bad_rules_are_flagged_and_skipped(device, bad):
    """A bad rule value found on the device: its error word is set, the sequence is
    skipped as a pad (its rows zeros, its lines and windows untouched) and every other
    sequence is right."""
    width, num_tokens, num_lines, max_len = 4, 20, 24, 5
    gen = torch.Generator().manual_seed(23)
    md = dict(spec_query_start_loc=cumulative([3, 4, 2, 5]),
              spec_state_indices=torch.tensor([3, 9, 4, 11], dtype=torch.int32),
              num_accepted_tokens=torch.tensor([1, 2, 1, 3], dtype=torch.int32))
    md.update(random_rules(gen, md, RULE_SETS["all"], num_lines, max_len))
    md["spec_window_rows"][1] = 5  # sequence 1: a window row, a write line of its own
    md["spec_write_indices"][1] = 20
    steps = max_len
    word = planner.E_WINDOW
    if bad in BAD_RULES:
        argument, spoil, word = BAD_RULES[bad]
        spoil(md[argument])
    else:
        steps = 3  # sequence 1 holds 4 tokens
        for k in ("spec_window_rows",):
            md[k][md[k] >= 0] = -1
        md["spec_window_rows"][1] = 5
    live = {k: put(v, device) for k, v in md.items()}
    plan = jitconv.device_plan(num_tokens, num_lines, 3 + max_len, width,
                               max_query_len=max_len, **live)
    data = layer(gen, torch.float32, num_tokens, num_lines, 3 + max_len, width, device)
    windows = put(randn(gen, (8, steps, DIM, width - 1), torch.float32), device)
    skipped = dict(md, spec_state_indices=md["spec_state_indices"].clone(),
                   spec_window_rows=md["spec_window_rows"].clone())
    skipped["spec_state_indices"][1] = -1  # the reference's pad
    skipped["spec_window_rows"][1] = -1
    x, w, b, state = data
    want = reference_of(skipped, data, windows=windows)
    out = full(tuple(x.shape), POISON, torch.float32, x.device)
    plan.run(x, w, b, state, out=out, intermediate_windows=windows)
    with pytest.raises(ValueError, match="bad metadata values") as raised:
        plan.check_errors()
    assert planner.ERRORS[word] in str(raised.value)
    assert_outputs_close(out, want[0], torch.float32)
    assert_state_exact(state, want[1])
    assert torch.equal(bits(windows.cpu()), bits(torch.from_numpy(want[2]).float()))


def test_rule_host_checks(device):
    """The rules' shapes, dtypes and their need of a declared bound are checked on the
    host, by name, before anything runs; a run without the windows its plan needs, or
    with windows of the wrong shape, raises and leaves conv_state untouched."""
    qsl = put(torch.tensor([0, 2, 5], dtype=torch.int32), device)
    lines = put(torch.tensor([1, 2], dtype=torch.int32), device)
    accepted = put(torch.tensor([1, 1], dtype=torch.int32), device)
    parents = put(torch.tensor([[-1, 0, 0], [-1, 0, 1]], dtype=torch.int32), device)
    spec = dict(spec_query_start_loc=qsl, spec_state_indices=lines,
                num_accepted_tokens=accepted)
    cases = [
        (dict(spec, spec_parent_token=parents), ValueError,
         "max_query_len: a device plan with spec_parent_token"),
        (dict(spec, spec_parent_token=parents, max_query_len=17), ValueError,
         "max_query_len: a device plan"),
        (dict(spec, spec_parent_token=parents[0], max_query_len=3), ValueError,
         "spec_parent_token: expected a 2-D"),
        (dict(spec, spec_parent_token=parents[:, :2], max_query_len=3), ValueError,
         "spec_parent_token: expected at least max_query_len = 3 columns"),
        (dict(spec, spec_parent_token=parents[:1], max_query_len=3), ValueError,
         "spec_parent_token: expected 2 entries"),
        (dict(spec, spec_write_indices=lines.float(), max_query_len=3), TypeError,
         "spec_write_indices: expected dtype"),
        (dict(spec, non_spec_window_rows=lines, max_query_len=3), ValueError,
         "non_spec_window_rows: given without non_spec_state_indices"),
    ]
    for kwargs, error, message in cases:
        with pytest.raises(error, match=message):
            jitconv.device_plan(5, 8, 6, 4, **kwargs)
    plan = jitconv.device_plan(5, 8, 6, 4, max_query_len=3, spec_window_rows=lines, **spec)
    gen = torch.Generator().manual_seed(2)
    x, w, b, state = layer(gen, torch.float32, 5, 8, 6, 4, device)
    before = bits(state)
    with pytest.raises(ValueError, match="intermediate_windows: required"):
        plan.run(x, w, b, state)
    bad = put(torch.zeros(4, 3, DIM, 2), device)
    with pytest.raises(ValueError, match="intermediate_windows: expected shape"):
        plan.run(x, w, b, state, intermediate_windows=bad)
    assert torch.equal(bits(state), before)


@pytest.fixture
def one_shot_on_device(device, monkeypatch):
    """The one-shot ops' device-metadata path for this backend's tensors: on a GPU as
    they are (metadata in CUDA tensors); for the SYCL device under test and the
    simulator, whose tensors are CPU tensors (which the ops read on the host), by routing
    CPU metadata tensors there too. Reading metadata on the host fails the test: the path
    must never read values back. Kept plans and the device's error words start empty."""
    if device.type == "cpu":
        def on_device(x, *metadata):
            given = [m for m in metadata if m is not None]
            return isinstance(x, torch.Tensor) and x.dim() == 2 and bool(given) and \
                all(isinstance(m, torch.Tensor) for m in given)
        monkeypatch.setattr(device_calls, "on_device", on_device)

    def host_ints(value, name, *args, **kwargs):
        raise AssertionError(f"{name}: read on the host")
    monkeypatch.setattr(validation, "host_ints", host_ints)
    plan_cache.clear()
    jitconv.check_errors()
    yield device
    plan_cache.clear()


def kept_device_plans():
    return [k for k in plan_cache._plans if k[0] == "device plan"]


ONE_SHOT = ("update decode", "update spec", "update 1-token spec", "fn", "mixed")


def one_shot_step(gen, call, num_lines, state_len, width, device, seqs=5):
    """(device plan metadata as CPU tensors for ``reference_of``, a function of the live
    tensors that calls the one-shot op, the rows of x) of one step of ``call``."""
    kind = {"update decode": "decode", "update spec": "spec", "update 1-token spec": "spec",
            "fn": "prefill", "mixed": "mixed"}[call]
    md = random_metadata(gen, kind, seqs, 40, num_lines, state_len, width,
                         max_len=5 if kind == "spec" else None)
    md.pop("non_spec_num_accepted_tokens", None)
    if call == "update 1-token spec":
        md["spec_query_start_loc"] = torch.arange(seqs + 1, dtype=torch.int32)
    rows = sum(int(md[k][-1]) for k in ("non_spec_query_start_loc", "spec_query_start_loc")
               if k in md)
    if call == "update decode":
        rows = seqs

    def op(live, x, w, b, state, out):
        if call == "update decode":
            return jitconv.causal_conv1d_update(x, w, b, state,
                                                live["non_spec_state_indices"], out=out)
        if call == "update 1-token spec":
            return jitconv.causal_conv1d_update(
                x, w, b, state, live["spec_state_indices"],
                num_accepted_tokens=live["num_accepted_tokens"], out=out)
        if call == "update spec":
            return jitconv.causal_conv1d_update(
                x, w, b, state, live["spec_state_indices"],
                query_start_loc=live["spec_query_start_loc"],
                num_accepted_tokens=live["num_accepted_tokens"], out=out, max_query_len=5)
        if call == "fn":
            return jitconv.causal_conv1d_fn(x, w, b, state,
                                            live["non_spec_query_start_loc"],
                                            live["non_spec_state_indices"],
                                            live["has_initial_state"], out=out)
        return jitconv.causal_conv1d_mixed(x, w, b, state, out=out, **live)
    return md, op, rows


@pytest.mark.parametrize("call", ONE_SHOT)
def test_one_shot_ops_keep_metadata_on_the_device(one_shot_on_device, call):
    """The one-shot ops with metadata tensors on x's device run a device plan kept for
    those tensors (never reading their values on the host): results equal the reference,
    and after the tensors are rewritten in place the next call, with the same kept plan,
    follows the new values (rows after the step's tokens come out zero)."""
    device = one_shot_on_device
    width, num_lines, state_len = 4, 24, 8
    gen = torch.Generator().manual_seed(60 + len(call))
    md, op, rows = one_shot_step(gen, call, num_lines, state_len, width, device)
    live = {k: put(v, device) for k, v in md.items()}
    data = layer(gen, torch.float32, rows, num_lines, state_len, width, device)
    for step in range(2):
        if step:  # same shapes, new values (fewer tokens: the rows after come out zero)
            new, _, more = one_shot_step(gen, call, num_lines, state_len, width, device)
            while more > rows:
                new, _, more = one_shot_step(gen, call, num_lines, state_len, width, device)
            for k, v in new.items():
                live[k].copy_(v)
        want_out, want_state = reference_of(live, data)
        out = full((rows, DIM), POISON, torch.float32, device)
        assert op(live, *data, out) is out
        assert_outputs_close(out, want_out, torch.float32)
        assert_state_exact(data[3], want_state)
        assert len(kept_device_plans()) == 1
    jitconv.check_errors()  # nothing bad was met


@pytest.mark.parametrize("call", ONE_SHOT)
def test_new_metadata_tensors_of_a_kept_layout_are_rebound(one_shot_on_device, call,
                                                          monkeypatch):
    """An engine's metadata tensors are new at every step, their layout is not: a
    one-shot call with new tensors of the layout of an earlier call's builds no plan
    (``device_plan.build`` is not called) but rebinds the earlier one to its tensors
    (``DevicePlan.rebound``: the same signature), and each plan follows its own tensors'
    values (the reference's outputs, every cache line bit-exact), the first one too
    after the second was made; a bad value in the new tensors is recorded in the
    device's words; another layout (int64 cache lines), and any call after
    ``clear_caches``, builds anew."""
    device = one_shot_on_device
    width, num_lines, state_len = 4, 24, 8
    gen = torch.Generator().manual_seed(90 + len(call))
    builds = []
    real = device_plan_module.build
    monkeypatch.setattr(device_plan_module, "build",
                        lambda *a, **k: builds.append(1) or real(*a, **k))
    md, op, rows = one_shot_step(gen, call, num_lines, state_len, width, device)
    data = layer(gen, torch.float32, rows, num_lines, state_len, width, device)

    def step(values, dtype=None):
        """A call with new tensors of ``values`` (each cast to ``dtype`` if given),
        checked; the live tensors and the plan the call kept for them."""
        return check({k: put(v if dtype is None or v.dtype == torch.bool else v.to(dtype),
                             device) for k, v in values.items()})

    def check(live):
        """A call with the tensors ``live``, checked; them and the plan kept for them."""
        want_out, want_state = reference_of(live, data)
        out = full((rows, DIM), POISON, torch.float32, device)
        assert op(live, *data, out) is out
        assert_outputs_close(out, want_out, torch.float32)
        assert_state_exact(data[3], want_state)
        ptrs = {t.data_ptr() for t in live.values()}
        held = [plan_cache._plans[k] for k in kept_device_plans()  # the one reading live
                if {t.data_ptr() for t, _s in plan_cache._plans[k].arrays.values()} & ptrs]
        assert len(held) == 1
        return live, held[0]

    def other_values():  # same shapes (and at most ``rows`` tokens), new values
        new, _, more = one_shot_step(gen, call, num_lines, state_len, width, device)
        while more > rows:
            new, _, more = one_shot_step(gen, call, num_lines, state_len, width, device)
        return new

    first_live, first = step(md)
    assert len(builds) == 1
    _live, second = step(other_values())
    assert len(builds) == 1, "new tensors of a kept layout built a plan"
    assert second is not first and second.signature == first.signature
    # none of the first plan's metadata memory (the op may pass views: memory counts)
    assert not {t.data_ptr() for t, _s in second.arrays.values()} & \
        {t.data_ptr() for t, _s in first.arrays.values()}
    for k, v in other_values().items():  # the first plan reads its own tensors
        first_live[k].copy_(v)
    _live, again = check(first_live)
    assert again is first and len(builds) == 1
    bad = other_values()
    lines = "spec_state_indices" if "spec_state_indices" in bad else "non_spec_state_indices"
    bad[lines][0] = 99  # no such cache line: skipped and recorded
    live = {k: put(v, device) for k, v in bad.items()}
    op(live, *data, full((rows, DIM), POISON, torch.float32, device))
    assert len(builds) == 1
    with pytest.raises(ValueError, match="bad metadata values"):
        jitconv.check_errors()
    step(other_values(), dtype=torch.int64)
    assert len(builds) == 2, "another layout (int64 metadata) was rebound"
    jitconv.clear_caches()
    step(other_values())
    assert len(builds) == 3, "a plan kept before clear_caches was rebound"
    jitconv.check_errors()


def test_threads_rebind_plans_of_one_layout(one_shot_on_device, monkeypatch):
    """Four threads, each its own layer (x, weight, bias, conv state) and its own stream
    of new metadata tensors of one layout, call the spec update at once, 6 steps each:
    after the first call (which builds the layout's plan) no thread builds one, and every
    step's outputs and the final states are the reference's for that thread's values (a
    plan rebound with another thread's tensors would write other lines or rows)."""
    if SIM:
        pytest.skip("the simulator has no time for threads (it runs one kernel at a time)")
    device = one_shot_on_device
    width, num_lines, state_len, steps = 4, 24, 8, 6
    builds = []
    real = device_plan_module.build
    monkeypatch.setattr(device_plan_module, "build",
                        lambda *a, **k: builds.append(1) or real(*a, **k))
    gens = [torch.Generator().manual_seed(120 + i) for i in range(4)]
    md, op, rows = one_shot_step(gens[0], "update spec", num_lines, state_len, width,
                                 device)

    def values(gen):  # the layout of ``md``, at most ``rows`` tokens, new values
        new, _, more = one_shot_step(gen, "update spec", num_lines, state_len, width,
                                     device)
        while more > rows:
            new, _, more = one_shot_step(gen, "update spec", num_lines, state_len, width,
                                         device)
        return new

    layers = [layer(gen, torch.float32, rows, num_lines, state_len, width, device)
              for gen in gens]
    plans = [[values(gen) for _ in range(steps)] for gen in gens]
    expected = []
    for data, steps_md in zip(layers, plans):  # each thread's chain of states
        state, outs = data[3].cpu(), []
        for step_md in steps_md:
            out, state = reference_of(step_md, data[:3] + (state,))
            state = torch.from_numpy(state).to(data[3].dtype)
            outs.append(out)
        expected.append((outs, state))
    op({k: put(v, device) for k, v in md.items()}, *layers[0][:3],
       put(layers[0][3].clone(), device), full((rows, DIM), POISON, torch.float32, device))
    assert len(builds) == 1
    results, errors, start = [[] for _ in gens], [], threading.Barrier(len(gens))

    def work(n):
        try:
            start.wait()
            for step_md in plans[n]:
                live = {k: put(v, device) for k, v in step_md.items()}
                out = full((rows, DIM), POISON, torch.float32, device)
                results[n].append(op(live, *layers[n], out).cpu())
        except Exception as exc:  # reported below, with the thread's number
            errors.append((n, exc))
    threads = [threading.Thread(target=contextvars.copy_context().run, args=(work, n))
               for n in range(len(gens))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(builds) == 1, "threads built plans of a kept layout"
    for data, got, (outs, state) in zip(layers, results, expected):
        for out, want in zip(got, outs):
            assert_outputs_close(out, want, torch.float32)
        assert_state_exact(data[3], state.double().numpy())
    jitconv.check_errors()


def test_one_shot_mixed_op_takes_token_maps_on_the_device(one_shot_on_device, monkeypatch):
    """causal_conv1d_mixed with token maps on the device: split outputs (each part's
    map length) from a kept device plan; outputs in x's rows where the maps name every
    row; where they do not, the host path (which this test's fixture forbids to read)."""
    poison_new_outputs(monkeypatch)
    device = one_shot_on_device
    gen = torch.Generator().manual_seed(67)
    width, num_tokens, num_lines, state_len = 4, 48, 20, 8
    md = mapped_metadata(gen, random_metadata(gen, "mixed", 4, num_tokens - 8, num_lines,
                                              state_len, width, 5), num_tokens)
    live = {k: put(v, device) for k, v in md.items()}
    data = layer(gen, torch.float32, num_tokens, num_lines, state_len, width, device)
    want_out, want_state = causal_conv1d_reference(*(t.cpu() for t in data),
                                                   **mapped_reference(live))
    parts = jitconv.causal_conv1d_mixed(*data, split=True, **live)
    check_split(parts, live, want_out, torch.float32)
    assert_state_exact(data[3], want_state)
    assert len(kept_device_plans()) == 1
    with pytest.raises(AssertionError, match="read on the host"):
        jitconv.causal_conv1d_mixed(*data, **live)  # rows of x no map names
    tokens = [int(md[q][-1]) for q in ("non_spec_query_start_loc", "spec_query_start_loc")]
    rows = torch.randperm(num_tokens, generator=gen).to(torch.int32)
    md.update(non_spec_token_indx=rows[:num_tokens - tokens[1]],
              spec_token_indx=rows[num_tokens - tokens[1]:])
    live = {k: put(v, device) for k, v in md.items()}
    want_out, want_state = causal_conv1d_reference(*(t.cpu() for t in data),
                                                   **mapped_reference(live))
    out = jitconv.causal_conv1d_mixed(*data, **live)
    assert_outputs_close(out, want_out, torch.float32)
    assert_state_exact(data[3], want_state)
    jitconv.check_errors()


def test_one_shot_bad_values_are_recorded(one_shot_on_device):
    """A bad value in a one-shot call's device metadata: the call returns, the sequence
    is skipped (its rows zero, its line untouched) and ``jitconv.check_errors`` raises
    its kind once, also after the call's kept plan is gone; the vLLM drop-in records
    into the same words."""
    device = one_shot_on_device
    gen = torch.Generator().manual_seed(70)
    width, num_lines, state_len = 4, 24, 8
    md, op, rows = one_shot_step(gen, "update spec", num_lines, state_len, width, device)
    md["spec_state_indices"][1] = 99  # no such cache line
    live = {k: put(v, device) for k, v in md.items()}
    data = layer(gen, torch.float32, rows, num_lines, state_len, width, device)
    before = bits(data[3])
    out = full((rows, DIM), POISON, torch.float32, device)
    op(live, *data, out)
    plan_cache.clear()  # the kept plan goes: the words are the device's
    with pytest.raises(ValueError, match="bad metadata values") as raised:
        jitconv.check_errors()
    assert planner.ERRORS[planner.E_LINE] in str(raised.value)
    jitconv.check_errors()  # reported once
    qsl = md["spec_query_start_loc"]
    skipped = slice(int(qsl[1]), int(qsl[2]))
    assert torch.equal(out[skipped].cpu(), torch.zeros_like(out[skipped]).cpu())
    others = [int(v) for i, v in enumerate(md["spec_state_indices"]) if i != 1 and v >= 0]
    unwritten = sorted(set(range(num_lines)) - set(others))
    assert torch.equal(bits(data[3])[unwritten], before[unwritten])
    lines = put(torch.tensor([3, 99], dtype=torch.int32), device)
    jitconv.vllm.causal_conv1d_update(data[0][:2], data[3], data[1], data[2], "silu",
                                      conv_state_indices=lines)
    with pytest.raises(ValueError, match=f"on {device}"):
        jitconv.check_errors(device)
    jitconv.check_errors()


def test_one_shot_host_checks(one_shot_on_device):
    """With device metadata the host checks what it sees (tensors, dtypes, lengths,
    declared bounds), naming the op's arguments, before anything runs."""
    device = one_shot_on_device
    gen = torch.Generator().manual_seed(80)
    x, w, b, state = layer(gen, torch.float32, 3, 8, 5, 4, device)
    before = bits(state)
    lines = put(torch.tensor([1, 2, 4], dtype=torch.int32), device)
    qsl = put(torch.tensor([0, 1, 2, 3], dtype=torch.int32), device)
    update, fn, mixed = (jitconv.causal_conv1d_update, jitconv.causal_conv1d_fn,
                         jitconv.causal_conv1d_mixed)
    cases = [
        (lambda: update(x, w, b, state, lines.float()), TypeError,
         "conv_state_indices: expected dtype"),
        (lambda: update(x, w, b, state, lines[:2]), ValueError,
         "conv_state_indices: expected 3 entries"),
        (lambda: update(x, w, b, state, None, query_start_loc=qsl), ValueError,
         "conv_state_indices: required"),
        (lambda: update(x, w, b, state, lines[0]), ValueError,
         r"conv_state_indices: expected shape \(num_seqs,\)"),
        (lambda: update(x, w, b, state, lines, query_start_loc=qsl,
                        num_accepted_tokens=lines[:2]), ValueError,
         "num_accepted_tokens: expected 3 entries"),
        (lambda: update(x, w, b, state, lines, max_query_len=0), ValueError,
         "max_query_len"),
        (lambda: update(x, w[:2], b, state, lines), ValueError, "weight"),
        (lambda: update(x, w, b, state, lines, pad_slot_id=[1]), TypeError, "pad_slot_id"),
        (lambda: fn(x, w, b, state, qsl, lines, lines[:2] > 0), ValueError,
         "has_initial_state: expected 3 entries"),
        (lambda: fn(x, w, b, state, qsl, None), ValueError, "cache_indices: required"),
        (lambda: mixed(x, w, b, state, spec_query_start_loc=qsl, spec_state_indices=lines),
         ValueError, "num_accepted_tokens: required"),
    ]
    for call, error, message in cases:
        with pytest.raises(error, match=message):
            call()
        assert torch.equal(bits(state), before)
    assert not kept_device_plans()


@pytest.mark.parametrize("engine", ["vllm tree", "vllm tree non-spec", "sglang windows",
                                    "sglang windows spec"])
def test_engine_rules_stay_on_the_device(one_shot_on_device, monkeypatch, engine):
    """The drop-ins' state rules with metadata on x's device: vLLM's EAGLE-tree update
    (retrieve_parent_token, vLLM's (batch, K) table, the null block skipped) and SGLang's
    target verify (intermediate windows, a pad) run a kept device plan that never reads
    values on the host; results equal the reference, and after the metadata are rewritten
    in place the next call follows them with the same plan."""
    device = one_shot_on_device
    from jitconv.vllm import dropins as vllm_dropins
    from jitconv.sglang import dropins as sglang_dropins
    for module in (vllm_dropins, sglang_dropins):
        monkeypatch.setattr(module, "host_ints", validation.host_ints)  # the raising one
    gen = torch.Generator().manual_seed(41 + len(engine))
    batch, each, num_lines, width = 4, 5, 24, 4
    state_len = width - 1 + each - 1
    spec = engine in ("vllm tree", "sglang windows spec")
    md = {}
    part = "spec" if spec else "non_spec"
    if engine.startswith("vllm"):
        table = put(torch.zeros(batch, 2, dtype=torch.int32), device)
        accepted = put(torch.ones(batch + 2, dtype=torch.int32), device)  # padded: longer
        parents = put(torch.full((batch, each), -1, dtype=torch.int32), device)
        qsl = put(cumulative([each] * batch), device)

        def rewrite():
            table[:, 0] = 1 + torch.randperm(num_lines - 1, generator=gen)[:batch]
            table[2, 0] = 0  # the null block: skipped
            accepted.copy_(torch.randint(1, each, (batch + 2,), generator=gen))
            parents.copy_(random_parents(gen, [each] * batch))
            md.clear()
            md.update({f"{part}_query_start_loc": qsl, f"{part}_parent_token": parents,
                       f"{part}_state_indices": torch.where(table[:, 0] == 0, -1,
                                                            table[:, 0])})
            if spec:
                md["num_accepted_tokens"] = accepted[:batch]

        def call(x, w, b, state):
            extra = dict(num_accepted_tokens=accepted) if spec else {}
            got = vllm_dropins.causal_conv1d_update(
                x, state, w, b, "silu", conv_state_indices=table, query_start_loc=qsl,
                max_query_len=each, retrieve_parent_token=parents, **extra)
            assert got is x
            return x
        rows, windows = batch * each + 2, None
    else:
        lines = put(torch.zeros(batch, dtype=torch.int32), device)
        accepted = put(torch.ones(batch, dtype=torch.int32), device)
        window_rows = put(torch.zeros(batch, dtype=torch.int32), device)
        windows = put(randn(gen, (batch + 2, each, DIM, width - 1), torch.float32), device)

        def rewrite():
            lines.copy_(torch.randperm(num_lines, generator=gen)[:batch])
            lines[1] = -1  # SGLang's pad
            accepted.copy_(torch.randint(1, each, (batch,), generator=gen))
            window_rows.copy_(torch.randperm(batch + 2, generator=gen)[:batch])
            md.clear()
            md.update({f"{part}_query_start_loc": cumulative([each] * batch),
                       f"{part}_state_indices": lines, f"{part}_window_rows": window_rows})
            if spec:
                md["num_accepted_tokens"] = accepted

        def call(x, w, b, state):
            extra = dict(num_accept_tokens=accepted) if spec else {}
            by_channel = x.view(batch, each, DIM).transpose(1, 2)  # SGLang's (batch, dim, seqlen)
            got = sglang_dropins.causal_conv1d_update(
                by_channel, state, w, b, "silu", conv_state_indices=lines,
                intermediate_conv_window=windows, intermediate_state_indices=window_rows,
                **extra)
            return got.transpose(1, 2).reshape(batch * each, DIM)
        rows = batch * each
    data = layer(gen, torch.float32, rows, num_lines, state_len, width, device)
    for _step in range(2):
        rewrite()
        want = reference_of(md, data, windows=windows)
        got = call(*data)
        assert_outputs_close(got, want[0], torch.float32)
        assert_state_exact(data[3], want[1])
        if windows is not None:
            assert torch.equal(bits(windows.cpu()), bits(torch.from_numpy(want[2]).float()))
        assert len(kept_device_plans()) == 1
    jitconv.check_errors()  # nothing bad was met


def test_update_max_query_len_on_the_host(device):
    """A declared max_query_len holds for host metadata too: a longer sequence raises."""
    gen = torch.Generator().manual_seed(81)
    x, w, b, state = layer(gen, torch.float32, 5, 8, 6, 4, device)
    before = bits(state)
    with pytest.raises(ValueError, match="max_query_len: declared 2, but sequence 1"):
        jitconv.causal_conv1d_update(x, w, b, state, [1, 2], query_start_loc=[0, 2, 5],
                                     num_accepted_tokens=[1, 1], max_query_len=2)
    assert torch.equal(bits(state), before)
    jitconv.causal_conv1d_update(x, w, b, state, [1, 2], query_start_loc=[0, 2, 5],
                                 num_accepted_tokens=[1, 1], max_query_len=3)


# The GDN stage on device plans: one q / k head and two v heads of 32 (128 channels),
# which every backend takes.
STAGE_HEADS = dict(num_k_heads=1, head_k_dim=32, head_v_dim=32)
STAGE_DIM = 128


def stage_layer(gen, dtype, num_tokens, num_lines, state_len, device):
    """A GDN layer's tensors for the stage: (x, weight, bias, conv_state), then a and b
    (views of one projection output), A_log and dt_bias."""
    data = layer(gen, dtype, num_tokens, num_lines, state_len, 4, device, dim=STAGE_DIM)
    ab = put(randn(gen, (num_tokens, 4), dtype) * 3, device)
    return data + (ab[:, :2], ab[:, 2:], put(randn(gen, (2,), torch.float32), device),
                   put(randn(gen, (2,), torch.float32), device))


def check_stage(result, layer_tensors, md, dtype, want):
    """A device plan's stage result against the reference ``want`` (its part's tokens
    in their rows), the rows after them: zero q, k and v, and gates from their a and b."""
    part = "spec" if "spec_query_start_loc" in md else "non_spec"
    assert getattr(result, "non_spec" if part == "spec" else "spec") is None
    out = getattr(result, part)
    parts, want_state = want
    n = len(parts[part]["q"])
    T = layer_tensors[0].shape[0]
    for field in ("q", "k", "v"):
        got = getattr(out, field)
        assert got.shape[0] == T and got.dtype == dtype
        assert_outputs_close(got[:n], parts[part][field], dtype)
        assert not got[n:].cpu().float().any(), f"{field}: rows after the tokens"
    a, b, A_log, dt_bias = (t.cpu().double() for t in layer_tensors[4:])
    g = -A_log.exp() * torch.nn.functional.softplus(a + dt_bias, beta=1.0, threshold=20.0)
    for field, tail in (("g", g), ("beta", torch.sigmoid(b))):
        got = getattr(out, field).cpu().double()
        torch.testing.assert_close(got[:n], torch.from_numpy(parts[part][field]),
                                   rtol=2e-5, atol=2e-6)
        torch.testing.assert_close(got[n:], tail[n:], rtol=2e-5, atol=2e-6)
    assert_state_exact(layer_tensors[3], want_state)


@pytest.mark.parametrize("kind", ["decode", "spec", "prefill"])
def test_gdn_stage_follows_rewritten_metadata(device, kind, monkeypatch):
    """The GDN stage on a device plan of one part (decode, spec verify or prefill): its
    tokens' q, k, v, g and beta against the stage's reference, the rows of x after them
    zeros (their count is on the device), every cache line bit-exact; the metadata
    rewritten in place between runs, outputs poisoned first. On CUDA with the tuning's
    ``fused_planner`` the stage's kernel plans its own blocks (one launch, no planner:
    every row is normalised, so there is no first row to check)."""
    poison_new_outputs(monkeypatch)
    used, real = [], cuda_launching.get_kernel
    monkeypatch.setattr(cuda_launching, "get_kernel", lambda spec: used.append(spec) or
                        real(spec))
    dtype = torch.bfloat16
    num_tokens, num_lines, nseq = 40, 20, 5
    max_len = {"decode": 1, "spec": 5, "prefill": 12}[kind]
    state_len = 3 + max_len if kind == "spec" else 6
    gen = torch.Generator().manual_seed(31 + len(kind))
    md = random_metadata(gen, kind, nseq, num_tokens, num_lines, state_len, 4, max_len)
    live = {k: put(v, device) for k, v in md.items()}
    plan = jitconv.device_plan(num_tokens, num_lines, state_len, 4, max_query_len=max_len,
                               **live)
    tensors = stage_layer(gen, dtype, num_tokens, num_lines, state_len, device)
    for step in range(3):
        if step:
            new = random_metadata(gen, kind, nseq, num_tokens, num_lines, state_len, 4,
                                  max_len, pads=step - 1)
            for k, v in new.items():
                live[k].copy_(v)
        want = gdn_conv_stage_reference(*(t.cpu() for t in tensors), **STAGE_HEADS,
                                        **reference_metadata(live))
        result = plan.run_stage(*tensors, **STAGE_HEADS)
        check_stage(result, tensors, live, dtype, want)
        plan.check_errors()
    stages = [spec for spec in used if spec.stage]
    if plan.device.type == "cuda" or SIM:
        fused = tuning.cuda("simulator" if SIM else "sm_90", "bfloat16", "general") \
            .fused_planner
        assert stages and all(bool(spec.fused_plan) == fused for spec in stages), used


def test_gdn_stage_device_plan_refusals(device):
    """What a device plan cannot give the stage is refused by name before any launch,
    conv_state untouched: a mixed step without token maps (each part's token count is
    on the device) and l2norm from a row past the part's rows."""
    gen = torch.Generator().manual_seed(3)
    for kind, options, name in (("mixed", {}, "plan"),
                                ("spec", dict(use_l2norm={"spec": 25}), "use_l2norm")):
        md = random_metadata(gen, kind, 3, 24, 12, 9, 4, 5)
        plan = jitconv.device_plan(24, 12, 9, 4, max_query_len=5,
                                   **{k: put(v, device) for k, v in md.items()})
        tensors = stage_layer(gen, torch.float32, 24, 12, 9, device)
        before = bits(tensors[3])
        with pytest.raises(ValueError, match=f"^{name}: "):
            plan.run_stage(*tensors, **STAGE_HEADS, **options)
        assert torch.equal(bits(tensors[3]), before)


@GPU_ONLY
def test_gdn_stage_graph_replays_follow_rewritten_metadata(cuda_device):
    """A CUDA graph that captured the GDN stage of a device plan (two layers) replays it
    with the metadata the tensors hold at replay time: the captured runs' outputs
    against the reference each time."""
    device = cuda_device
    for kind, max_len in (("decode", 1), ("spec", 4)):
        gen = torch.Generator().manual_seed(40 + len(kind))
        num_tokens, num_lines, state_len = 48, 24, 8
        md = random_metadata(gen, kind, 6, num_tokens, num_lines, state_len, 4, max_len)
        live = {k: v.to(device) for k, v in md.items()}
        plan = jitconv.device_plan(num_tokens, num_lines, state_len, 4,
                                   max_query_len=max_len, **live)
        layers = [stage_layer(gen, torch.bfloat16, num_tokens, num_lines, state_len, device)
                  for _ in range(2)]
        for tensors in layers:  # warm-up: compiles, prepares
            plan.run_stage(*tensors[:3], tensors[3].clone(), *tensors[4:], **STAGE_HEADS)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            results = [plan.run_stage(*tensors, **STAGE_HEADS) for tensors in layers]
        for _ in range(3):
            new = random_metadata(gen, kind, 6, num_tokens, num_lines, state_len, 4,
                                  max_len)
            for k, v in new.items():
                live[k].copy_(v)
            wants = [gdn_conv_stage_reference(*(t.cpu() for t in tensors), **STAGE_HEADS,
                                              **reference_metadata(live))
                     for tensors in layers]
            graph.replay()
            torch.cuda.synchronize()
            for result, tensors, want in zip(results, layers, wants):
                check_stage(result, tensors, live, torch.bfloat16, want)
        plan.check_errors()


@GPU_ONLY
def test_graph_replays_follow_rewritten_metadata(cuda_device):
    """A CUDA graph that captured runs of a device plan (three layers) replays them with
    the metadata the tensors hold at replay time, bit-exact against the reference for
    decode, spec verify and mixed steps."""
    device = cuda_device
    for kind, max_len in (("decode", 1), ("spec", 4), ("mixed", None)):
        gen = torch.Generator().manual_seed(len(kind))
        width, num_tokens, num_lines, state_len = 4, 48, 24, 8
        md = random_metadata(gen, kind, 6, num_tokens, num_lines, state_len, width, max_len)
        live = {k: v.to(device) for k, v in md.items()}
        plan = jitconv.device_plan(num_tokens, num_lines, state_len, width,
                                   max_query_len=max_len, **live)
        layers = [layer(gen, torch.bfloat16, num_tokens, num_lines, state_len, width, device)
                  for _ in range(3)]
        outs = [torch.empty((num_tokens, DIM), dtype=torch.bfloat16, device=device)
                for _ in layers]
        for (x, w, b, s), o in zip(layers, outs):  # warm-up: compiles, prepares
            plan.run(x, w, b, s.clone(), out=o)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for (x, w, b, s), o in zip(layers, outs):
                plan.run(x, w, b, s, out=o)
        for step in range(3):
            new = random_metadata(gen, kind, 6, num_tokens, num_lines, state_len, width,
                                  max_len)
            for k, v in new.items():
                live[k].copy_(v)
            wants = [reference_of(live, data) for data in layers]
            graph.replay()
            torch.cuda.synchronize()
            for (x, w, b, s), o, (want_out, want_state) in zip(layers, outs, wants):
                assert_outputs_close(o, want_out, torch.bfloat16)
                assert_state_exact(s, want_state)
        plan.check_errors()


@GPU_ONLY
def test_graph_replays_follow_rewritten_rules(cuda_device):
    """A CUDA graph that captured runs of a device plan with a tree, windows and write
    lines (two layers) replays them with the rules the tensors hold at replay time:
    outputs, every cache line and the windows against the reference."""
    device = cuda_device
    gen = torch.Generator().manual_seed(8)
    width, num_tokens, num_lines, max_len = 4, 48, 32, 6
    state_len = 3 + max_len

    def step():
        md = random_metadata(gen, "mixed", 5, num_tokens, num_lines, state_len, width,
                             max_len)
        return {**md, **random_rules(gen, md, RULE_SETS["all"], num_lines, max_len)}

    live = {k: v.to(device) for k, v in step().items()}
    plan = jitconv.device_plan(num_tokens, num_lines, state_len, width,
                               max_query_len=max_len, **live)
    layers = [layer(gen, torch.bfloat16, num_tokens, num_lines, state_len, width, device)
              for _ in range(2)]
    wins = [randn(gen, (8, max_len, DIM, width - 1), torch.bfloat16).to(device)
            for _ in layers]
    outs = [torch.empty((num_tokens, DIM), dtype=torch.bfloat16, device=device)
            for _ in layers]
    for (x, w, b, s), o, win in zip(layers, outs, wins):  # warm-up: compiles, prepares
        plan.run(x, w, b, s.clone(), out=o, intermediate_windows=win.clone())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for (x, w, b, s), o, win in zip(layers, outs, wins):
            plan.run(x, w, b, s, out=o, intermediate_windows=win)
    for _ in range(3):
        for k, v in step().items():
            live[k].copy_(v)
        wants = [reference_of(live, data, windows=win) for data, win in zip(layers, wins)]
        graph.replay()
        torch.cuda.synchronize()
        for (x, w, b, s), o, win, want in zip(layers, outs, wins, wants):
            assert_outputs_close(o, want[0], torch.bfloat16)
            assert_state_exact(s, want[1])
            assert torch.equal(bits(win.cpu()), bits(torch.from_numpy(want[2]).to(
                torch.bfloat16)))
    plan.check_errors()


@GPU_ONLY
def test_host_plans_refuse_capture(cuda_device):
    """A plan built from host values cannot follow new metadata: capturing its run is an
    error (a stale replay would write the old cache lines), and so are check_errors and
    a one-shot op whose metadata would be read back."""
    device = cuda_device
    gen = torch.Generator().manual_seed(5)
    x, w, b, state = layer(gen, torch.float32, 3, 6, 3, 4, device)
    plan = jitconv.plan(3, 6, 3, 4, non_spec_query_start_loc=[0, 1, 2, 3],
                        non_spec_state_indices=[0, 1, 2])
    plan.run(x, w, b, state)
    dplan = jitconv.device_plan(3, 6, 3, 4, non_spec_state_indices=torch.tensor(
        [0, 1, 2], dtype=torch.int32, device=device))
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="capture runs of jitconv.device_plan"):
        with torch.cuda.graph(graph):
            plan.run(x, w, b, state)
    with pytest.raises(RuntimeError, match="check_errors"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            dplan.check_errors()
    # a one-shot op whose device metadata must be read on the host (a token map: device
    # plans have none) is refused by name (the tensors are made before the capture:
    # their own copies to the device could not be captured)
    lines = torch.tensor([0, 1, 2], dtype=torch.int32, device=device)
    rows = torch.tensor([2, 0, 1], dtype=torch.int32, device=device)
    with pytest.raises(RuntimeError, match="conv_state_indices: read on the host"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            jitconv.causal_conv1d_update(x, w, b, state, lines, token_indx=rows)


@GPU_ONLY
@pytest.mark.parametrize("call", ONE_SHOT)
def test_one_shot_graph_replays_follow_rewritten_metadata(cuda_device, call):
    """A one-shot op with CUDA metadata, captured after one eager call, replays with the
    values the metadata tensors hold at each replay."""
    device = cuda_device
    width, num_lines, state_len = 4, 24, 8
    gen = torch.Generator().manual_seed(90 + len(call))
    md, op, rows = one_shot_step(gen, call, num_lines, state_len, width, device)
    live = {k: v.to(device) for k, v in md.items()}
    data = layer(gen, torch.bfloat16, rows, num_lines, state_len, width, device)
    out = torch.empty((rows, DIM), dtype=torch.bfloat16, device=device)
    op(live, *data, out)  # eager first: the kept plan, the device's error words
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        op(live, *data, out)
    for _ in range(2):
        new, _, more = one_shot_step(gen, call, num_lines, state_len, width, device)
        while more > rows:
            new, _, more = one_shot_step(gen, call, num_lines, state_len, width, device)
        for k, v in new.items():
            live[k].copy_(v)
        data[0].copy_(randn(gen, (rows, DIM), torch.bfloat16))
        want_out, want_state = reference_of(live, data)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_outputs_close(out, want_out, torch.bfloat16)
        assert_state_exact(data[3], want_state)
    jitconv.check_errors()


@GPU_ONLY
def test_first_device_call_in_a_capture_is_refused(cuda_device, monkeypatch):
    """The first one-shot call with metadata on a device makes that device's error words;
    inside a CUDA graph capture it is refused by name (made there, the words would be
    zeroed by every replay). After one eager call the same capture works."""
    device = cuda_device
    monkeypatch.setattr(CUDA_STATE, "error_words", {})
    plan_cache.clear()
    gen = torch.Generator().manual_seed(12)
    x, w, b, state = layer(gen, torch.float32, 3, 8, 3, 4, device)
    lines = torch.tensor([1, 4, 6], dtype=torch.int32, device=device)
    with pytest.raises(RuntimeError, match="the first call with metadata on"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            jitconv.causal_conv1d_update(x, w, b, state, lines)
    out = torch.empty_like(x)
    jitconv.causal_conv1d_update(x, w, b, state, lines, out=out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        jitconv.causal_conv1d_update(x, w, b, state, lines, out=out)
    lines.copy_(torch.tensor([2, 3, 7], dtype=torch.int32))
    want_out, want_state = reference_of(dict(non_spec_state_indices=lines), (x, w, b, state))
    graph.replay()
    torch.cuda.synchronize()
    assert_outputs_close(out, want_out, torch.float32)
    assert_state_exact(state, want_state)
    jitconv.check_errors()
    plan_cache.clear()  # its plans write the words this test made


@GPU_ONLY
def test_runs_are_remembered(cuda_device, monkeypatch):
    """The second run with the same tensors goes straight to the prepared launches (no
    checks, no packing): launching.launch is not called again; a run with out=None gets
    a new output each time; different tensors are packed anew."""
    device = cuda_device
    gen = torch.Generator().manual_seed(9)
    lines = torch.tensor([0, 3, 5], dtype=torch.int32, device=device)
    for make in (lambda: jitconv.device_plan(3, 8, 3, 4, non_spec_state_indices=lines),
                 lambda: jitconv.plan(3, 8, 3, 4, non_spec_query_start_loc=[0, 1, 2, 3],
                                      non_spec_state_indices=[0, 3, 5])):
        plan = make()
        calls = []
        real = cuda_launching.launch
        monkeypatch.setattr(cuda_launching, "launch",
                            lambda *a, **k: calls.append(1) or real(*a, **k))
        x, w, b, state = layer(gen, torch.float32, 3, 8, 3, 4, device)
        first = plan.run(x, w, b, state)
        second = plan.run(x, w, b, state)
        assert len(calls) == 1 and second.data_ptr() != first.data_ptr()
        want_out, want_state = reference_of(
            dict(non_spec_state_indices=lines), (x, w, b, state))  # from the updated state
        out = torch.full_like(x, POISON)
        plan.run(x, w, b, state, out=out)  # another out: packed anew
        assert len(calls) == 2
        assert_outputs_close(out, want_out, torch.float32)
        assert_state_exact(state, want_state)
        plan.run(x, w, b, state.clone(), out=out)  # another conv_state: packed anew
        assert len(calls) == 3
        if not plan.on_device:  # new split outputs: a launch of their own, remembered
            parts = [plan.run(x, w, b, state, split=True) for _ in range(2)]
            assert len(calls) == 4
            assert parts[0].spec is None and parts[1].spec is None
            assert parts[0].non_spec.data_ptr() != parts[1].non_spec.data_ptr()
            want_out, want_state = reference_of(
                dict(non_spec_state_indices=lines), (x, w, b, state))
            third = plan.run(x, w, b, state, split=True)
            assert_outputs_close(third.non_spec, want_out, torch.float32)
            assert_state_exact(state, want_state)
        monkeypatch.undo()


@GPU_ONLY
@pytest.mark.parametrize("kind,count", [("decode", 2), ("mixed", 2), ("mixed", 40)])
def test_new_plans_take_the_runs_of_their_signature(cuda_device, kind, count, monkeypatch):
    """An engine's step: new metadata tensors, a new device plan, every layer's tensors
    as before. A layer's first run on the new plan takes the launches prepared on the
    earlier plan of the same signature (the same shapes: sequence counts, map lengths),
    with the new plan's words (launching.launch is not called), and follows the new
    plan's values (other cache lines, other rows in the maps: the reference of its
    metadata, every cache line bit-exact); the conv with split outputs over token maps
    and the GDN stage alike, and the first plan again after the second (its own words
    back). A plan of another signature (another sequence count) prepares its own. ``count``
    layers: 40 are a model's step of 82 runs (conv and stage, layer 0 twice), which one
    signature keeps whole."""
    poison_new_outputs(monkeypatch)
    device = cuda_device
    gen = torch.Generator().manual_seed(47 + len(kind))
    num_tokens, num_lines, state_len, nseq = 48, 24, 8, 4
    calls = []
    real = cuda_launching.launch
    monkeypatch.setattr(cuda_launching, "launch",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    layers = [stage_layer(gen, torch.bfloat16, num_tokens, num_lines, state_len, device)
              for _ in range(count)]

    def renewed(md):
        """``md``'s shapes with other values: its cache lines and map rows permuted."""
        lines = torch.randperm(num_lines, generator=gen).to(torch.int32)
        rows = torch.randperm(num_tokens, generator=gen).to(torch.int32)
        new = dict(md)
        for name, perm in (("non_spec_state_indices", lines), ("spec_state_indices", lines),
                           ("non_spec_token_indx", rows), ("spec_token_indx", rows)):
            if name in md:
                t = md[name]
                new[name] = torch.where(t >= 0, perm[t.clamp(min=0).long()], t)
        return new

    def step(seqs, like=None):
        md = random_metadata(gen, kind, seqs, num_tokens - 8, num_lines, state_len, 4, 5)
        md = mapped_metadata(gen, md, num_tokens) if like is None else renewed(like)
        live = {k: v.to(device) for k, v in md.items()}  # new tensors, new addresses
        plan = jitconv.device_plan(num_tokens, num_lines, state_len, 4, max_query_len=5,
                                   **live)
        for tensors in layers + layers[:1]:  # (layer 0 twice)
            want_out, want_state = causal_conv1d_reference(
                *(t.cpu() for t in tensors[:4]), **mapped_reference(live))
            check_split(plan.run(*tensors[:4], split=True), live, want_out, torch.bfloat16)
            assert_state_exact(tensors[3], want_state)
            parts, want_state = gdn_conv_stage_reference(
                *(t.cpu() for t in tensors), **STAGE_HEADS, **mapped_reference(live))
            result = plan.run_stage(*tensors, **STAGE_HEADS)
            for part in ("non_spec", "spec"):
                if getattr(result, part) is not None:
                    n = len(parts[part]["q"])
                    assert_outputs_close(getattr(result, part).q[:n], parts[part]["q"],
                                         torch.bfloat16)
            assert_state_exact(tensors[3], want_state)
        plan.check_errors()
        return plan, md

    first, md = step(nseq)
    assert len(calls) == 2 * len(layers)  # each layer's conv and stage prepared once
    second, _ = step(nseq, like=md)
    assert second.signature == first.signature and len(calls) == 2 * len(layers)
    for tensors in layers[:2]:  # the first plan after the second: its words again
        want_out, want_state = causal_conv1d_reference(
            *(t.cpu() for t in tensors[:4]), **mapped_reference(md))
        check_split(first.run(*tensors[:4], split=True), md, want_out, torch.bfloat16)
        assert_state_exact(tensors[3], want_state)
    assert len(calls) == 2 * len(layers)
    step(nseq + 1)  # another signature: prepared anew
    assert len(calls) == 4 * len(layers)


@GPU_ONLY
def test_threads_run_one_layer_on_plans_of_one_signature(cuda_device, monkeypatch):
    """Two threads run one layer's tensors (a new output each run) on device plans of
    one signature, each its own plan naming its own cache lines, 60 times each at once:
    one run prepared for both, and every launch takes its own thread's plan's words
    (each output the reference's from its lines' state at that run, every cache line
    bit-exact at the end: a launch with the other thread's words would write the other
    lines)."""
    poison_new_outputs(monkeypatch)
    device = cuda_device
    gen = torch.Generator().manual_seed(71)
    num_lines, state_len, runs = 16, 3, 60
    x, w, b, state = layer(gen, torch.bfloat16, 4, num_lines, state_len, 4, device)
    mds = [dict(non_spec_state_indices=torch.tensor(lines, dtype=torch.int32,
                                                      device=device))
           for lines in ([0, 3, 5, 6], [9, 10, 12, 15])]
    plans = [jitconv.device_plan(4, num_lines, state_len, 4, **md) for md in mds]
    assert plans[0].signature == plans[1].signature
    calls = []
    real = cuda_launching.launch
    monkeypatch.setattr(cuda_launching, "launch",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    want_state = state.cpu()
    expected = []
    for md in mds:  # each thread's outputs, its lines' states chained run after run
        chain, outs = state.cpu(), []
        for _ in range(runs + 1):
            out, chain = reference_of(md, (x, w, b, chain))
            chain = torch.from_numpy(chain).to(state.dtype)
            outs.append(out)
        lines = md["non_spec_state_indices"].long().cpu()
        want_state[lines] = chain[lines]
        expected.append(outs)
    stream = torch.cuda.current_stream(device)
    with torch.inference_mode():
        results = [[plan.run(x, w, b, state)] for plan in plans]  # (prepared once)
    errors, start = [], threading.Barrier(2)

    def work(n):
        try:  # (torch's inference mode and current stream are the thread's own, and
            # the tuning's overrides its context's: each thread runs in a copy of this one)
            with torch.inference_mode(), torch.cuda.stream(stream):
                start.wait()
                for _ in range(runs):
                    results[n].append(plans[n].run(x, w, b, state))
        except Exception as exc:  # reported below, with the thread's plan
            errors.append((n, exc))
    threads = [threading.Thread(target=contextvars.copy_context().run, args=(work, n))
               for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    torch.cuda.synchronize(device)
    assert not errors, errors
    assert len(calls) == 1, "plans of one signature prepared their own runs"
    for got, want in zip(results, expected):
        for out, ref in zip(got, want):
            assert_outputs_close(out, ref, torch.bfloat16)
    assert_state_exact(state, want_state.double().numpy())


@GPU_ONLY
@pytest.mark.parametrize("inference", [False, True])
def test_remembered_runs_need_the_same_tensors(cuda_device, monkeypatch, inference):
    """A run is remembered for its tensors exactly (``launching.run_key``): the same
    memory seen with another shape, strides or dtype, a tensor off the GPU or one that
    needs grad goes through the checks (refused, or launched anew and right), never
    through the remembered launch."""
    device = cuda_device
    gen = torch.Generator().manual_seed(12)
    lines = torch.tensor([0, 3, 5], dtype=torch.int32, device=device)
    md = dict(non_spec_state_indices=lines)
    plan = jitconv.device_plan(3, 8, 3, 4, **md)
    x, w, b, state = layer(gen, torch.bfloat16, 3, 8, 3, 4, device)
    out = torch.empty_like(x)
    replays = []
    real = cuda_launching.Run.__call__
    monkeypatch.setattr(cuda_launching.Run, "__call__",
                        lambda self, *a: replays.append(1) or real(self, *a))
    # the state's bytes read as (lines, dim, state_len) with state_len contiguous
    state_ds = state.as_strided(state.shape, (state.shape[1] * 3, 3, 1))
    with torch.inference_mode(inference):
        for _ in range(2):
            plan.run(x, w, b, state, out=out)
        assert len(replays) == 1
        others = {"x, fewer rows": (x[:2], w, b, state, out),
                  "weight as float16": (x, w.view(torch.float16), b, state, out),
                  "bias on the CPU": (x, w, b.cpu(), state, out),
                  "out as float16": (x, w, b, state, out.view(torch.float16)),
                  "weight as (dim, 1, width)": (x, w[:, None, :], b, state, out),
                  "conv_state, other strides": (x, w, b, state_ds, out)}
        if not inference:
            others["weight needing grad"] = (x, w.detach().requires_grad_(), b, state, out)
        for name, args in others.items():
            try:
                plan.run(*args[:4], out=args[4])
            except (TypeError, ValueError, RuntimeError):
                pass
            assert len(replays) == 1, f"{name}: the remembered launch was replayed"
        want_out, want_state = reference_of(md, (x, w, b, state_ds))
        out.fill_(POISON)
        plan.run(x, w, b, state_ds, out=out)
    assert_outputs_close(out, want_out, torch.bfloat16)
    assert_state_exact(state_ds, want_state)


@GPU_ONLY
@pytest.mark.parametrize("what", ["conv", "conv into x", "stage"])
def test_remembered_runs_follow_their_inputs_to_other_memory(cuda_device, monkeypatch, what):
    """An engine's x (and a stage's a and b) is a new tensor at every layer and step (a
    projection's output, a part gathered by index_select), so a run kept for them at
    some addresses is launched for them at others (nothing prepared again), reading and
    (into x) writing the new tensors only: the reference's outputs and cache lines of the
    new inputs, the first inputs bit-identical. x at an address of another alignment is
    prepared anew; x, a or b moved onto conv_state's memory is refused as without a kept
    run, conv_state untouched."""
    device = cuda_device
    gen = torch.Generator().manual_seed(13 + len(what))
    stage = what == "stage"
    lines = torch.tensor([0, 3, 5], dtype=torch.int32, device=device)
    md = dict(non_spec_state_indices=lines)
    plan = jitconv.device_plan(3, 8, 3, 4, **md)
    tensors = stage_layer(gen, torch.bfloat16, 3, 8, 3, device) if stage else \
        layer(gen, torch.bfloat16, 3, 8, 3, 4, device)
    w, b, state = tensors[1:4]
    calls = []
    real = cuda_launching.launch
    monkeypatch.setattr(cuda_launching, "launch",
                        lambda *a, **k: calls.append(1) or real(*a, **k))

    def run(movers):
        """Run on x (and a, b: ``movers``) as given."""
        x = movers[0]
        if stage:
            return plan.run_stage(x, w, b, state, *movers[1:], *tensors[6:], **STAGE_HEADS)
        return plan.run(x, w, b, state, out=x if what == "conv into x" else None)

    def run_on(movers):
        if stage:
            want = gdn_conv_stage_reference(*(t.cpu() for t in (movers[0], w, b, state)),
                                            *(t.cpu() for t in movers[1:]),
                                            *(t.cpu() for t in tensors[6:]), **STAGE_HEADS,
                                            **reference_metadata(md))
            check_stage(run(movers), (movers[0], w, b, state) + tuple(movers[1:])
                        + tensors[6:], md, torch.bfloat16, want)
            return
        want_out, want_state = reference_of(md, (movers[0], w, b, state))
        result = run(movers)
        assert (result is movers[0]) == (what == "conv into x")
        assert_outputs_close(result, want_out, torch.bfloat16)
        assert_state_exact(state, want_state)

    def new_movers():
        """New tensors at new addresses, as an engine's layers pass them (a and b: views
        of one new projection output)."""
        x = randn(gen, tuple(tensors[0].shape), torch.bfloat16).to(device)
        if not stage:
            return (x,)
        ab = (randn(gen, (x.shape[0], 4), torch.bfloat16) * 3).to(device)
        return x, ab[:, :2], ab[:, 2:]

    with torch.inference_mode():
        first = (tensors[0].clone(),) + tuple(tensors[4:6])  # kept: no later one reuses them
        first = first if stage else first[:1]
        run_on(first)
        assert len(calls) == 1
        first_bits = [bits(t) for t in first]
        for _ in range(2):
            movers = new_movers()
            assert all(m.data_ptr() != f.data_ptr() for m, f in zip(movers, first))
            run_on(movers)
        assert len(calls) == 1, "a run was prepared again for inputs at other addresses"
        assert all(torch.equal(bits(t), f) for t, f in zip(first, first_bits))
        run_on(first)  # back where the run was prepared: its own words again
        assert len(calls) == 1
        # x two bytes past an aligned address: another alignment, prepared anew
        flat = torch.empty(first[0].numel() + 8, dtype=torch.bfloat16, device=device)
        odd = flat[1:1 + first[0].numel()].view(first[0].shape)
        odd.copy_(new_movers()[0])
        run_on((odd,) + new_movers()[1:])
        assert len(calls) == 2
        # x, a or b on conv_state's memory: the checks refuse it, nothing launched
        before = bits(state)
        for n in range(len(first)):
            onto = list(new_movers())
            onto[n] = torch.as_strided(state, tuple(onto[n].shape), onto[n].stride())
            with pytest.raises(ValueError, match="overlap"):
                run(onto)
            assert torch.equal(bits(state), before) and len(calls) == 2


@GPU_ONLY
@pytest.mark.parametrize("spec", [False, True])
def test_vllm_update_keeps_metadata_on_the_device(cuda_device, monkeypatch, spec):
    """jitconv.vllm.causal_conv1d_update with CUDA metadata takes the device path (one
    device plan for the persistent buffers, kept), writes into x as vLLM's does, equals
    the host-metadata drop-in bit for bit, and can be captured: a replay after the
    buffers are rewritten equals the host drop-in on the new values."""
    device = cuda_device
    from jitconv.vllm import dropins as drop_in
    gen = torch.Generator().manual_seed(21 + spec)
    batch, each, num_lines, dim = 8, 4 if spec else 1, 20, DIM
    state_len = 3 + each - 1
    built = []
    real = drop_in._device_update_plan
    monkeypatch.setattr(drop_in, "_device_update_plan",
                        lambda *a, **k: built.append(1) or real(*a, **k))
    table = torch.zeros(batch, 2, dtype=torch.int32, device=device)  # vLLM's (batch, K)
    accepted = torch.ones(batch + 2, dtype=torch.int32, device=device)  # padded: longer
    qsl = torch.arange(0, batch * each + 1, each, dtype=torch.int32, device=device)

    def rewrite():
        table[:, 0] = (1 + torch.randperm(num_lines - 1, generator=gen)[:batch]).to(device)
        table[2, 0] = 0  # the null block: skipped
        accepted[:batch] = torch.randint(1, each + 1, (batch,), generator=gen).to(device)

    def meta(on):
        m = dict(conv_state_indices=table.to(on))
        if spec:
            m.update(num_accepted_tokens=accepted.to(on), query_start_loc=qsl.to(on),
                     max_query_len=each)
        return m

    w = randn(gen, (dim, 4), torch.bfloat16).to(device)
    b = randn(gen, (dim,), torch.bfloat16).to(device)
    x = randn(gen, (batch * each + 3, dim), torch.bfloat16).to(device)  # 3 extra rows
    state = make_state(gen, num_lines, dim, state_len, torch.bfloat16, "SD").to(device)

    def host_result(x0, s0):
        xs, ss = x0.clone(), s0.clone()
        drop_in.causal_conv1d_update(xs, ss, w, b, "silu", **meta("cpu"))
        return bits(xs), bits(ss)

    rewrite()
    want = host_result(x, state)
    got = drop_in.causal_conv1d_update(x, state, w, b, "silu", **meta(device))
    assert got is x and len(built) == 1
    assert torch.equal(bits(x), want[0]) and torch.equal(bits(state), want[1])
    drop_in.causal_conv1d_update(x, state, w, b, "silu", **meta(device))  # warm, kept
    assert len(built) == 1
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        drop_in.causal_conv1d_update(x, state, w, b, "silu", **meta(device))
    for _ in range(2):
        rewrite()
        x.copy_(randn(gen, tuple(x.shape), torch.bfloat16))
        want = host_result(x, state)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(bits(x), want[0]) and torch.equal(bits(state), want[1])


@GPU_ONLY
def test_vllm_fn_keeps_metadata_on_the_device(cuda_device):
    """jitconv.vllm.causal_conv1d_fn with CUDA metadata (vLLM's prefill call) takes the
    device path: equal to the host-metadata drop-in bit for bit, and capturable, replays
    following query_start_loc, cache lines (null block, pad) and flags rewritten in
    place."""
    device = cuda_device
    from jitconv.vllm import dropins as drop_in
    gen = torch.Generator().manual_seed(31)
    batch, tokens, num_lines, dim, state_len = 5, 60, 16, DIM, 3
    qsl = torch.zeros(batch + 1, dtype=torch.int32, device=device)
    lines = torch.zeros(batch, dtype=torch.int32, device=device)
    init = torch.zeros(batch, dtype=torch.bool, device=device)

    def rewrite():
        lengths = torch.randint(0, 12, (batch,), generator=gen)
        qsl.copy_(cumulative([int(n) for n in lengths]).to(device))
        lines.copy_((1 + torch.randperm(num_lines - 1, generator=gen)[:batch]).to(device))
        lines[1], lines[3] = 0, -1  # the null block, a pad: both skipped
        init.copy_((torch.rand(batch, generator=gen) < 0.5).to(device))

    w = randn(gen, (dim, 4), torch.bfloat16).to(device)
    b = randn(gen, (dim,), torch.bfloat16).to(device)
    x = randn(gen, (tokens, dim), torch.bfloat16).to(device)
    state = make_state(gen, num_lines, dim, state_len, torch.bfloat16, "SD").to(device)

    def host_result():
        ss = state.clone()
        out = drop_in.causal_conv1d_fn(x.t(), w, b, ss, qsl.cpu(), lines.cpu(), init.cpu())
        return bits(out), bits(ss)

    rewrite()
    want = host_result()
    got = drop_in.causal_conv1d_fn(x.t(), w, b, state, qsl, lines, init)
    assert got.shape == (dim, tokens)
    assert torch.equal(bits(got), want[0]) and torch.equal(bits(state), want[1])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = drop_in.causal_conv1d_fn(x.t(), w, b, state, qsl, lines, init)
    for _ in range(2):
        rewrite()
        x.copy_(randn(gen, tuple(x.shape), torch.bfloat16))
        want = host_result()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(bits(captured), want[0]) and torch.equal(bits(state), want[1])


# ------------------------------------------------------------------ token maps

def mapped_metadata(gen, md, num_tokens, extra=2):
    """``md`` with token maps (CPU tensors): each part's tokens at random distinct rows
    of x, each map ``extra`` entries longer than its part's tokens (rows the part's
    outputs hold as zeros)."""
    rows = torch.randperm(num_tokens, generator=gen).to(torch.int32)
    maps, used = {}, 0
    for qsl, lines, name in (("non_spec_query_start_loc", "non_spec_state_indices",
                              "non_spec_token_indx"),
                             ("spec_query_start_loc", "spec_state_indices",
                              "spec_token_indx")):
        if lines not in md:
            continue
        tokens = int(md[qsl][-1]) if qsl in md else len(md[lines])
        n = min(tokens + extra, num_tokens - used - (extra if not used else 0))
        maps[name] = rows[used:used + n].clone()
        used += n
    return dict(md, **maps)


def fitting_metadata(live, draw):
    """``draw()``'s metadata, drawn until each part's tokens fit its map in ``live``."""
    while True:
        md = draw()
        counts = {"non_spec_token_indx": int(md["non_spec_query_start_loc"][-1])
                  if "non_spec_query_start_loc" in md else
                  len(md.get("non_spec_state_indices", ())),
                  "spec_token_indx": int(md["spec_query_start_loc"][-1])
                  if "spec_query_start_loc" in md else 0}
        if all(n <= len(live[k]) for k, n in counts.items() if k in live):
            return md


def mapped_reference(md):
    """The reference's keywords for a device plan with token maps: each map cut to its
    part's tokens."""
    args = reference_metadata({k: v for k, v in md.items() if not k.endswith("token_indx")})
    for qsl, name in (("non_spec_query_start_loc", "non_spec_token_indx"),
                      ("spec_query_start_loc", "spec_token_indx")):
        if name in md:
            n = len(args[qsl]) and int(args[qsl][-1])
            args[name] = md[name].cpu()[:n].long()
    return args


def check_split(parts, md, want_out, dtype):
    """Split outputs of a mapped device plan: each part's rows, in its map's order,
    against the reference's rows of x; the rows after its tokens zeros."""
    args = mapped_reference(md)
    for part, name in (("non_spec", "non_spec_token_indx"), ("spec", "spec_token_indx")):
        got = getattr(parts, part)
        if name not in md:
            assert got is None
            continue
        rows = args[name]
        assert got.shape[0] == len(md[name])
        assert_outputs_close(got[:len(rows)], want_out[rows.numpy()], dtype)
        assert not got[len(rows):].cpu().float().any(), f"{part}: rows after its tokens"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("declared", [True, False])
def test_token_maps_follow_rewritten_metadata(device, kind, declared, monkeypatch):
    """Token maps on a device plan: each part's tokens at the rows its map names
    (shuffled across x), split outputs of each part's map length, written by one run;
    the metadata and the maps' entries rewritten in place between runs, each run against
    the reference of the values then (outputs poisoned first, every cache line
    bit-exact)."""
    poison_new_outputs(monkeypatch)
    dtype = torch.bfloat16
    width, num_tokens, num_lines, nseq = 4, 48, 20, 5
    max_len = (1 if kind == "decode" else 5 if kind == "spec" else 12) if declared else None
    state_len = 3 + (max_len or 5) if kind in ("spec", "mixed") else 6
    gen = torch.Generator().manual_seed(17 + len(kind) + declared)
    md = mapped_metadata(gen, random_metadata(gen, kind, nseq, num_tokens - 8, num_lines,
                                              state_len, width, max_len), num_tokens)
    live = {k: put(v, device) for k, v in md.items()}
    plan = jitconv.device_plan(num_tokens, num_lines, state_len, width,
                               max_query_len=max_len, **live)
    data = layer(gen, dtype, num_tokens, num_lines, state_len, width, device)
    for step in range(3):
        if step:  # new values, the same maps' lengths
            new = fitting_metadata(live, lambda: random_metadata(
                gen, kind, nseq, num_tokens - 8, num_lines, state_len, width, max_len,
                pads=step - 1))
            for k, v in new.items():
                live[k].copy_(v)
            rows = torch.randperm(num_tokens, generator=gen).to(torch.int32)
            used = 0
            for name in ("non_spec_token_indx", "spec_token_indx"):
                if name in live:
                    n = len(live[name])
                    live[name].copy_(rows[used:used + n])
                    used += n
        want_out, want_state = causal_conv1d_reference(
            *(t.cpu() for t in data), activation="silu", **mapped_reference(live))
        parts = plan.run(*data, split=True)
        check_split(parts, live, want_out, dtype)
        assert_state_exact(data[3], want_state)
        plan.check_errors()


def test_token_maps_covering_x_run_into_its_rows(device):
    """Maps that name every row of x: a run without split outputs writes each token at
    its row of x (and is refused by name where the maps leave rows unnamed, before any
    launch)."""
    gen = torch.Generator().manual_seed(23)
    width, num_tokens, num_lines, state_len = 4, 40, 20, 8
    md = random_metadata(gen, "mixed", 4, num_tokens, num_lines, state_len, width, 5)
    tokens = [int(md[q][-1]) for q in ("non_spec_query_start_loc", "spec_query_start_loc")]
    rows = torch.randperm(num_tokens, generator=gen).to(torch.int32)
    md.update(non_spec_token_indx=rows[:num_tokens - tokens[1]],
              spec_token_indx=rows[num_tokens - tokens[1]:])
    live = {k: put(v, device) for k, v in md.items()}
    plan = jitconv.device_plan(num_tokens, num_lines, state_len, width, max_query_len=5,
                               **live)
    data = layer(gen, torch.float32, num_tokens, num_lines, state_len, width, device)
    want_out, want_state = causal_conv1d_reference(*(t.cpu() for t in data),
                                                   **mapped_reference(live))
    out = full(tuple(data[0].shape), POISON, torch.float32, data[0].device)
    assert plan.run(*data, out=out) is out
    assert_outputs_close(out, want_out, torch.float32)
    assert_state_exact(data[3], want_state)
    short = dict(live, spec_token_indx=live["spec_token_indx"][:-1])
    plan = jitconv.device_plan(num_tokens, num_lines, state_len, width, max_query_len=5,
                               **short)
    before = bits(data[3])
    with pytest.raises(ValueError, match="^split: this device plan's token maps name 39"):
        plan.run(*data)
    assert torch.equal(bits(data[3]), before)


def test_token_map_host_checks(device):
    """The maps' shapes are checked on the host, each error naming its argument."""
    md = dict(non_spec_query_start_loc=torch.tensor([0, 2, 5], dtype=torch.int32),
              non_spec_state_indices=torch.tensor([1, 2], dtype=torch.int32),
              spec_query_start_loc=torch.tensor([0, 2], dtype=torch.int32),
              spec_state_indices=torch.tensor([3], dtype=torch.int32),
              num_accepted_tokens=torch.tensor([1], dtype=torch.int32),
              non_spec_token_indx=torch.arange(5, dtype=torch.int32),
              spec_token_indx=torch.arange(5, 7, dtype=torch.int32))
    cases = [
        (dict(spec_token_indx=None), "^spec_token_indx: required with non_spec_token_indx"),
        (dict(non_spec_token_indx=None), "^non_spec_token_indx: required with spec_token"),
        (dict(non_spec_token_indx=torch.arange(8, dtype=torch.int32)),
         "^non_spec_token_indx/spec_token_indx: 10 entries in all, but x has 9 rows"),
        (dict(non_spec_token_indx=torch.zeros(5, 1, dtype=torch.int32)),
         "^non_spec_token_indx: expected a 1-D tensor"),
        (dict(spec_token_indx=torch.arange(5, 7, dtype=torch.float32)),
         "^spec_token_indx: expected dtype"),
        (dict(spec_query_start_loc=None, spec_state_indices=None, num_accepted_tokens=None),
         "^spec_token_indx: given without spec_query_start_loc"),
    ]
    for change, message in cases:
        given = {k: v for k, v in dict(md, **change).items() if v is not None}
        with pytest.raises((ValueError, TypeError), match=message):
            jitconv.device_plan(9, 4, 5, 4, **{k: put(v, device) for k, v in given.items()})
    with pytest.raises(ValueError, match="^spec_rows_first: not with token maps"):
        jitconv.device_plan(9, 4, 5, 4, spec_rows_first=True,
                            **{k: put(v, device) for k, v in md.items()})
    decode = dict(non_spec_state_indices=torch.tensor([1, 2, 3], dtype=torch.int32),
                  non_spec_token_indx=torch.arange(2, dtype=torch.int32))
    with pytest.raises(ValueError, match="^non_spec_token_indx: expected at least 3"):
        jitconv.device_plan(9, 4, 5, 4, **{k: put(v, device) for k, v in decode.items()})


def test_bad_token_map_entries_are_flagged(device):
    """A map entry outside x is read as row 0 and reported (check_errors names it):
    nothing outside x, out or conv_state is touched."""
    gen = torch.Generator().manual_seed(29)
    width, num_tokens, num_lines, state_len = 4, 40, 20, 8
    md = mapped_metadata(gen, random_metadata(gen, "mixed", 4, num_tokens - 8, num_lines,
                                              state_len, width, 5), num_tokens)
    md["spec_token_indx"][0] = num_tokens + 3
    live = {k: put(v, device) for k, v in md.items()}
    plan = jitconv.device_plan(num_tokens, num_lines, state_len, width, max_query_len=5,
                               **live)
    data = layer(gen, torch.float32, num_tokens, num_lines, state_len, width, device)
    parts = plan.run(*data, split=True)
    with pytest.raises(ValueError, match="bad metadata values") as raised:
        plan.check_errors()
    assert planner.ERRORS[planner.E_MAP] in str(raised.value)
    assert not torch.isnan(parts.spec.cpu()).any()


@pytest.mark.parametrize("declared", [True, False])
def test_gdn_stage_of_a_mixed_step_with_token_maps(device, declared, monkeypatch):
    """The GDN stage of a mixed step on a device plan with token maps: each part's q, k,
    v, g and beta in its map's order, l2norm from a sequence's first row of the
    non-spec part (vLLM's prefill rows after its decodes) and on every spec row, the
    rows after each part's tokens zero q, k, v; every cache line bit-exact; metadata
    rewritten between runs."""
    poison_new_outputs(monkeypatch)
    dtype = torch.bfloat16
    num_tokens, num_lines, nseq, state_len = 48, 20, 5, 8
    max_len = 5 if declared else None
    gen = torch.Generator().manual_seed(41 + declared)
    md = mapped_metadata(gen, random_metadata(gen, "mixed", nseq, num_tokens - 8, num_lines,
                                              state_len, 4, max_len or 5), num_tokens)
    live = {k: put(v, device) for k, v in md.items()}
    plan = jitconv.device_plan(num_tokens, num_lines, state_len, 4, max_query_len=max_len,
                               **live)
    tensors = stage_layer(gen, dtype, num_tokens, num_lines, state_len, device)
    for step in range(2):
        if step:
            new = fitting_metadata(live, lambda: random_metadata(
                gen, "mixed", nseq, num_tokens - 8, num_lines, state_len, 4, max_len or 5))
            for k, v in new.items():
                live[k].copy_(v)
        qsl = live["non_spec_query_start_loc"].cpu()
        first = int(qsl[2])  # the third non-spec sequence's first row
        l2norm = {"non_spec": first, "spec": 0}
        parts, want_state = gdn_conv_stage_reference(
            *(t.cpu() for t in tensors), **STAGE_HEADS, use_l2norm=l2norm,
            **mapped_reference(live))
        result = plan.run_stage(*tensors, **STAGE_HEADS, use_l2norm=l2norm)
        for part, name in (("non_spec", "non_spec_token_indx"), ("spec", "spec_token_indx")):
            got, want = getattr(result, part), parts[part]
            n = len(want["q"])
            for field in ("q", "k", "v"):
                t = getattr(got, field)
                assert t.shape[0] == len(live[name])
                assert_outputs_close(t[:n], want[field], dtype)
                assert not t[n:].cpu().float().any(), f"{part} {field}: rows after"
            for field in ("g", "beta"):
                torch.testing.assert_close(getattr(got, field)[:n].cpu().double(),
                                           torch.from_numpy(want[field]), rtol=2e-5,
                                           atol=2e-6)
        assert_state_exact(tensors[3], want_state)
        plan.check_errors()


@pytest.mark.parametrize("maps", [True, False])
def test_gdn_stage_l2norm_row_inside_a_sequence_is_flagged(device, maps):
    """On a device plan the host cannot see where sequences begin: a first normalised
    row inside one makes the planner skip that sequence (zeros, state untouched) and
    report it; the other sequences' outputs and states are the reference's. With or
    without token maps: a plan without them whose kernel could plan its own blocks
    launches the planner for this check."""
    gen = torch.Generator().manual_seed(43)
    num_tokens, num_lines, state_len = 48, 20, 8
    md = random_metadata(gen, "prefill", 4, num_tokens - 8, num_lines, state_len, 4, 12,
                         pads=0)
    md["non_spec_query_start_loc"] = cumulative([3, 5, 4, 6])
    if maps:
        md = mapped_metadata(gen, md, num_tokens)
    live = {k: put(v, device) for k, v in md.items()}
    plan = jitconv.device_plan(num_tokens, num_lines, state_len, 4, max_query_len=12, **live)
    tensors = stage_layer(gen, torch.float32, num_tokens, num_lines, state_len, device)
    inside = 3 + 2  # the second sequence's third row
    skipped = dict(live, non_spec_state_indices=live["non_spec_state_indices"].clone())
    skipped["non_spec_state_indices"][1] = -1
    parts, want_state = gdn_conv_stage_reference(
        *(t.cpu() for t in tensors), **STAGE_HEADS, use_l2norm={"non_spec": 8},
        **(mapped_reference(skipped) if maps else reference_metadata(skipped)))
    result = plan.run_stage(*tensors, **STAGE_HEADS, use_l2norm={"non_spec": inside})
    with pytest.raises(ValueError, match="bad metadata values") as raised:
        plan.check_errors()
    assert planner.ERRORS[planner.E_L2NORM] in str(raised.value)
    got = result.non_spec
    for field in ("q", "k", "v"):  # every sequence but the second as from row 8 on
        t = getattr(got, field)[:18]
        want = parts["non_spec"][field]
        keep = [r for r in range(18) if not 3 <= r < 8]
        assert_outputs_close(t[keep], want[keep], torch.float32)
        assert not t[3:8].cpu().any()
    assert_state_exact(tensors[3], want_state)


@pytest.mark.parametrize("kind", list(GDN_STEPS))
def test_whole_step_mode_keeps_gdn_metadata_on_the_device(one_shot_on_device, kind):
    """jitconv.vllm's whole-step calls with vLLM's GDN metadata in tensors on x's device
    read nothing back (reading values on the host fails the test): the conv (split
    outputs where the step has both parts) and the GDN stage against the reference, two
    steps of new metadata tensors with the same values, every cache line bit-exact."""
    import numpy as np
    import jitconv.vllm as jvllm
    device = one_shot_on_device
    seed = 61 + len(kind)
    case = gdn_case(torch.Generator().manual_seed(seed), np.random.default_rng(seed),
                    **GDN_STEPS[kind])
    on = lambda t: put(t, device) if isinstance(t, torch.Tensor) else t  # noqa: E731
    x, w, b, state = (on(t) for t in (case.x, case.weight, case.bias, case.state))
    gen = torch.Generator().manual_seed(seed)
    ab = on(randn(gen, (x.shape[0], 4), torch.float32) * 3)
    A_log, dt_bias = on(randn(gen, (2,), torch.float32)), on(randn(gen, (2,), torch.float32))
    heads = dict(num_k_heads=1, head_k_dim=32, head_v_dim=36)  # 2 * 32 + 2 * 36 = DIM
    both = kind == "mixed"
    for _step in range(2):
        meta = types.SimpleNamespace(**{k: on(v) for k, v in vars(case.meta).items()})
        before = state.cpu()
        want_out, want_state = causal_conv1d_reference(x.cpu(), w.cpu(), b.cpu(), before,
                                                       **case.ref)
        got = jvllm.gdn_conv_step(x, w, b, state, meta, split=both)
        if both:
            for part in ("spec", "non_spec"):
                rows = case.ref[f"{part}_token_indx"]
                assert_outputs_close(getattr(got, part), want_out[rows], torch.float32)
        else:
            assert_outputs_close(got, want_out, torch.float32)
        assert_state_exact(state, want_state)
        before = state.cpu()
        parts, want_state = gdn_conv_stage_reference(
            x.cpu(), w.cpu(), b.cpu(), before, ab[:, 2:].cpu(), ab[:, :2].cpu(), A_log.cpu(),
            dt_bias.cpu(), **heads, **case.ref)
        result = jvllm.gdn_conv_stage_step(x, w, b, state, ab[:, 2:], ab[:, :2], A_log,
                                           dt_bias, meta, **heads)
        for part in ("spec", "non_spec"):
            if part not in parts or not len(parts[part]["q"]):
                continue
            n = len(parts[part]["q"])
            for field in ("q", "k", "v"):
                assert_outputs_close(getattr(getattr(result, part), field)[:n],
                                     parts[part][field], torch.float32)
        assert_state_exact(state, want_state)
        jitconv.check_errors()
