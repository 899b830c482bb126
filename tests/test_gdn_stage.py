"""The GDN conv stage (``jitconv.gdn_conv_stage``, SEMANTICS.md "The GDN conv stage"):
one launch against ``reference.gdn_conv_stage_reference``, on the device under test.

Where it runs: on a SYCL device (CI: opencl:cpu, the nd-range kernel whose work-groups
normalise after a barrier), on an NVIDIA GPU (numba-cuda: a warp per head, l2norm by
shuffles), and in CI under numba's CUDA simulator (tests/test_cuda_simulator.py). The
simulator has no warp shuffles: its lane sum goes through shared memory
(``backends/cuda/kernels._lane_sum_shared``), so the shuffle itself is checked on a GPU
only. Small head dims on the CPU devices (head_k_dim 32: one channel per CUDA thread),
Qwen3-Next's on a GPU.
"""

import numpy as np
import pytest
import torch

import jitconv
from jitconv.api import validation
from jitconv.kernels import abi
from jitconv.backends.cuda import devices as cuda_devices
from jitconv.backends.sycl.backend import SyclBackend
from jitconv.reference import gdn_conv_stage_reference
from jitconv.testing.steps import DATA_KEYS, mixed_step

from helpers import (DTYPES, assert_outputs_close, assert_state_exact, bits, with_rules,
                     poison_new_outputs, randn, usm_copy)

SIM = cuda_devices.simulating()
GPU = bool(cuda_devices.devices()) and not SIM
# (num_k_heads, head_k_dim, num_v_heads, head_v_dim): the smallest on the CPU devices, and
# on a GPU Qwen3-Next's head dims with GQA (2 v heads per k head).
HEADS = (2, 128, 4, 128) if GPU else (1, 32, 2, 32)
FIELDS = ("q", "k", "v", "g", "beta")
# g and beta are float32 from float32 math: tight against float64
GATE_TOLERANCE = dict(rtol=2e-5, atol=2e-6)


@pytest.fixture
def device(sycl_device):
    """The device under test (a SYCL device, a CUDA GPU or the simulator), current."""
    return jitconv.set_device(sycl_device)


@pytest.fixture
def poisoned_outputs(monkeypatch):
    """The stage's one output (q, k, v and the gates of both parts) starts as NaN, so a
    row or gate it does not write fails the comparison."""
    poison_new_outputs(monkeypatch)


def stage_case(seed, dtype, *, ns_lengths=(1, 2, 9, 3), sp_lengths=(1, 4, 2), pads=1,
               rows="shuffled", heads=HEADS, width=4):
    """A mixed step (prefill chunks, decodes, spec verify, pads, shuffled rows) with the
    stage's inputs: (data tensors, metadata, a, b, A_log, dt_bias, heads)."""
    H, K, HV, V = heads
    gen = torch.Generator().manual_seed(seed)
    step = mixed_step(gen, dim=2 * H * K + HV * V, width=width, dtype=dtype,
                      ns_lengths=ns_lengths, sp_lengths=sp_lengths, rows=rows,
                      ns_pads=pads, sp_pads=pads, initial="alternate", spec_columns=2,
                      extra_state_columns=1, extra_lines=2)
    device = "cuda" if GPU else "cpu"  # the simulator's and opencl:cpu's: the host's
    data = {k: step.pop(k) for k in DATA_KEYS}
    T = data["x"].shape[0]
    ab = randn(gen, (T, 2 * HV), dtype) * 3  # a and b as views of one projection
    # a + dt_bias past softplus's threshold (20) for some tokens, and far past it (where
    # exp overflows float32 without the threshold)
    ab[::3, HV] = 24.0
    ab[1::4, HV] = 100.0
    gates = dict(a=ab[:, HV:], b=ab[:, :HV], A_log=randn(gen, (HV,), torch.float32),
                 dt_bias=randn(gen, (HV,), torch.float32))
    on = lambda d: {k: v.to(device) if isinstance(v, torch.Tensor) else v  # noqa: E731
                    for k, v in d.items()}
    return on(data), on(step), on(gates)


def run_stage(data, meta, gates, heads=HEADS, **options):
    H, K, _HV, V = heads
    return jitconv.gdn_conv_stage(*(data[k] for k in DATA_KEYS), gates["a"], gates["b"],
                                  gates["A_log"], gates["dt_bias"], num_k_heads=H,
                                  head_k_dim=K, head_v_dim=V, **meta, **options)


def reference_of(data, meta, gates, heads=HEADS, **options):
    H, K, _HV, V = heads
    return gdn_conv_stage_reference(**data, **gates, **meta, num_k_heads=H, head_k_dim=K,
                                    head_v_dim=V, **options)


def check_against_reference(data, meta, gates, dtype, **options):
    ref, ref_state = reference_of(data, meta, gates, **options)
    result = run_stage(data, meta, gates, **options)
    for part in ("spec", "non_spec"):
        got = getattr(result, part)
        if not len(ref[part]["v"]):
            assert got is None
            continue
        for field in ("q", "k", "v"):
            out = getattr(got, field)
            assert out.dtype == dtype and out.is_contiguous()
            assert_outputs_close(out, ref[part][field], dtype)
        for field in ("g", "beta"):
            out = getattr(got, field)
            assert out.dtype == torch.float32
            torch.testing.assert_close(out.double().cpu(),
                                       torch.from_numpy(ref[part][field]),
                                       **GATE_TOLERANCE)
    assert_state_exact(data["conv_state"], ref_state)  # untouched lines included
    return result


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
@pytest.mark.parametrize("rows", ["shuffled", "vllm"])
def test_stage_matches_the_reference(device, poisoned_outputs, dtype_name, rows):
    dtype = DTYPES[dtype_name]
    data, meta, gates = stage_case(11, dtype, rows=rows)
    check_against_reference(data, meta, gates, dtype)


@pytest.mark.parametrize("options", [dict(use_l2norm=False), dict(exp_g=True),
                                     dict(activation=None), dict(use_l2norm=("non_spec",)),
                                     dict(use_l2norm=["spec"]),
                                     dict(use_l2norm={"non_spec": 3, "spec": 0}),
                                     dict(use_l2norm={"non_spec": 1, "spec": 5})])
def test_stage_options(device, poisoned_outputs, options):
    data, meta, gates = stage_case(12, torch.float32)
    check_against_reference(data, meta, gates, torch.float32, **options)


@pytest.mark.parametrize("kind", ["decode", "spec", "prefill"])
def test_stage_single_kinds(device, poisoned_outputs, kind):
    """Steps of one kind (each a different kernel choice: decode, spec and general)."""
    lengths = {"decode": dict(ns_lengths=(1,) * 5, sp_lengths=()),
               "spec": dict(ns_lengths=(), sp_lengths=(4, 4, 2)),
               "prefill": dict(ns_lengths=(17, 6), sp_lengths=())}[kind]
    data, meta, gates = stage_case(13, torch.bfloat16, rows="plain", pads=0, **lengths)
    check_against_reference(data, meta, gates, torch.bfloat16)


def test_stage_conv_equals_the_split_conv(device):
    """Without l2norm the stage's q | k | v are the conv's split outputs, bit for bit
    (same taps, same order, same silu), and the states are the same bits."""
    data, meta, gates = stage_case(14, torch.bfloat16)
    state0 = data["conv_state"].clone()
    result = run_stage(data, meta, gates, use_l2norm=False)
    stage_state = bits(data["conv_state"])
    data["conv_state"].copy_(state0)
    split = jitconv.causal_conv1d_mixed(*(data[k] for k in DATA_KEYS), **meta, split=True)
    assert torch.equal(bits(data["conv_state"]), stage_state)
    for part in ("spec", "non_spec"):
        got, want = getattr(result, part), getattr(split, part)
        T = want.shape[0]
        joined = torch.cat([got.q.reshape(T, -1), got.k.reshape(T, -1),
                            got.v.reshape(T, -1)], dim=1)
        assert torch.equal(bits(joined), bits(want))


def _bad_calls(data, meta, gates):
    """(argument named in the error, exception, changes): changes to the gates' tensors,
    the heads (num_k_heads, head_v_dim), the metadata and the options."""
    H, K, HV, V = HEADS
    T, x = data["x"].shape[0], data["x"]
    wrong_dtype = torch.float64 if x.dtype == torch.float32 else torch.float32
    in_state = data["conv_state"].as_strided((T, HV), (HV, 1))
    spec_seqs = len(meta["spec_query_start_loc"]) - 1
    return [
        ("num_k_heads", ValueError, dict(heads=(H + 1, K, HV, V))),
        ("head_v_dim", ValueError, dict(heads=(H, K, HV, 0))),
        ("a", ValueError, dict(gates=dict(a=gates["a"][:-1]))),
        ("b", TypeError, dict(gates=dict(b=gates["b"].to(wrong_dtype)))),
        ("a", ValueError, dict(gates=dict(a=torch.empty(HV, T, dtype=x.dtype).t()))),
        ("A_log", ValueError, dict(gates=dict(A_log=gates["A_log"][:-1]))),
        ("dt_bias", ValueError, dict(gates=dict(dt_bias=gates["dt_bias"][:-1]))),
        ("A_log", TypeError, dict(gates=dict(A_log=gates["A_log"].to(torch.int32)))),
        ("b", ValueError, dict(gates=dict(b=in_state))),
        ("use_l2norm", TypeError, dict(options=dict(use_l2norm=1))),
        ("use_l2norm", TypeError, dict(options=dict(use_l2norm=("prefill",)))),
        ("use_l2norm", TypeError, dict(options=dict(use_l2norm={"spec": -1}))),
        ("use_l2norm", TypeError, dict(options=dict(use_l2norm={"prefill": 0}))),
        # row 4 is inside the non-spec part's third sequence (rows 3..11)
        ("use_l2norm", ValueError, dict(options=dict(use_l2norm={"non_spec": 4}))),
        ("spec_window_rows", ValueError,
         dict(meta=dict(spec_window_rows=torch.arange(spec_seqs)))),
        ("not_a_metadata_name", TypeError, dict(meta=dict(not_a_metadata_name=1))),
    ]


def test_bad_input_is_refused_before_launch(device):
    data, meta, gates = stage_case(15, torch.float32)
    state0 = bits(data["conv_state"])
    for name, error, change in _bad_calls(data, meta, gates):
        with pytest.raises(error, match=name):
            run_stage(data, dict(meta, **change.get("meta", {})),
                      dict(gates, **change.get("gates", {})),
                      heads=change.get("heads", HEADS), **change.get("options", {}))
        assert torch.equal(bits(data["conv_state"]), state0), name


def test_head_dims_the_kernel_cannot_take(device):
    """CUDA: head_k_dim 48 is no warp's multiple; SYCL: 512 is more than a work-group of
    one channel per work-item may hold. Refused by name, nothing changed."""
    heads = (1, 48, 2, 24) if cuda_devices.is_cuda_name(device) else (1, 512, 1, 32)
    data, meta, gates = stage_case(16, torch.float32, heads=heads)
    state0 = bits(data["conv_state"])
    with pytest.raises(ValueError, match="head_k_dim"):
        run_stage(data, meta, gates, heads=heads)
    assert torch.equal(bits(data["conv_state"]), state0)


def test_divisions_by_head_dims():
    """The kernel's n // d as (n * m) >> s (``abi.divisor_magic``): exact for every
    channel index n below 2 ** STAGE_CHANNEL_BITS (all n < 2 ** 16 and the last 4096
    below the bound, every d up to 1024 and some larger ones), n * m within int64;
    other divisors refused; and x with that many channels refused by name."""
    bound = 2 ** abi.STAGE_CHANNEL_BITS
    n = np.concatenate([np.arange(2 ** 16), np.arange(bound - 4096, bound)]).astype(np.int64)
    for d in list(range(1, 1025)) + [1031, 4095, 4096, 65535, 2 ** 20 + 7, bound - 1]:
        m, s = abi.divisor_magic(d)
        assert m * (bound - 1) < 2 ** 63
        np.testing.assert_array_equal((n * m) >> s, n // d, err_msg=f"d={d}")
    for bad in (0, -3, bound, 2.0, True):
        with pytest.raises(ValueError, match="divisor_magic"):
            abi.divisor_magic(bad)
    x = torch.empty((1, bound), dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="^x: the GDN stage takes fewer than"):
        validation.check_stage(x, None, None, None, None, None, 1, 1, 1)


def test_stage_takes_torch_tensors(device):
    data, meta, gates = stage_case(17, torch.float32)
    with pytest.raises(TypeError, match="^a: the GDN stage takes torch tensors"):
        run_stage(data, meta, dict(gates, a=gates["a"].numpy() if not GPU else [1.0]))


# Head dims that are no powers of two (the kernel's divisions by them, ``divisor_magic``),
# as each device takes them: a CUDA warp holds a k head, a SYCL work-group too.
ODD_HEADS = (1, 64, 3, 48) if GPU else (1, 32, 3, 24) if SIM else (1, 40, 3, 24)


@pytest.mark.parametrize("heads", [(2, 128, 4, 128), (1, 64, 3, 32), ODD_HEADS])
def test_stage_head_layouts(device, poisoned_outputs, heads):
    """Qwen3-Next's head dims in bfloat16 (SYCL: the wide kernel, 4 channels per
    work-item, 32 per work-group), a v head dim below the k one with 3 v heads, and head
    dims that are no powers of two (the kernel's divisions by them: q / k heads and the
    gates' v heads), every output and the cache against the reference."""
    if SIM and heads != ODD_HEADS:
        pytest.skip("the simulator has no time for dim 1024 (the GPU run has it)")
    data, meta, gates = stage_case(19, torch.bfloat16, heads=heads)
    check_against_reference(data, meta, gates, torch.bfloat16, heads=heads)


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_stage_with_a_long_tree(device, poisoned_outputs, dtype_name):
    """A spec tree of 20 tokens (a parent map) is one block of the stage kernel, longer
    than any other (16 tokens at most), here with the longest head a SYCL work-group
    takes (head_k_dim 256, the l2norm's widest rows), beside prefill chunks and
    decodes: every output and the cache against the reference."""
    heads = (1, 256, 1, 32)
    dtype = DTYPES[dtype_name]
    data, meta, gates = stage_case(23, dtype, ns_lengths=(1, 17, 3), sp_lengths=(20, 1, 4),
                                   heads=heads)
    meta, _windows = with_rules(meta, torch.Generator().manual_seed(23), windows=False)
    assert meta["spec_parent_token"] is not None
    check_against_reference(data, meta, gates, dtype, heads=heads)


def usm_case(data, gates):
    """A stage case's tensors copied into USM memory of jitconv's pool (SYCL keeps only
    zero-copy launches), a and b as views of one projection output (as a layer has them):
    (data, gates, that output)."""
    HV = gates["a"].shape[1]
    ab = usm_copy(torch.cat([gates["b"], gates["a"]], dim=1))
    return ({k: usm_copy(v) for k, v in data.items()},
            dict(a=ab[:, HV:], b=ab[:, :HV], A_log=usm_copy(gates["A_log"]),
                 dt_bias=usm_copy(gates["dt_bias"])), ab)


def test_remembered_stage_runs(device, monkeypatch):
    """A layer's second run with the same tensors is a remembered launch (no checks, no
    kernel choice: the backend's launch is not called) into a new output, and it is as
    right as the first: the second run continues from the state the first left. On a
    SYCL device the tensors are USM memory (zero-copy: only such launches are kept)."""
    if SIM:
        pytest.skip("the simulator has no remembered launches (its tensors are the host's)")
    data, meta, gates = stage_case(18, torch.bfloat16)
    if GPU:
        from jitconv.backends.cuda import launching
        backend, name = launching, "launch"
    else:
        backend, name = SyclBackend, "launch"
        data, gates, _ab = usm_case(data, gates)
    plan = jitconv.plan(data["x"].shape[0], data["conv_state"].shape[0],
                        data["conv_state"].shape[2], 4, **meta)
    H, K, _HV, V = HEADS
    args = [data[k] for k in DATA_KEYS] + [gates[k] for k in ("a", "b", "A_log", "dt_bias")]
    results = []
    for run in range(2):
        ref, ref_state = reference_of(data, meta, gates)
        results.append(plan.run_stage(*args, num_k_heads=H, head_k_dim=K, head_v_dim=V))
        for part in ("spec", "non_spec"):
            got = getattr(results[-1], part)
            for field in ("q", "k", "v"):
                assert_outputs_close(getattr(got, field), ref[part][field], torch.bfloat16)
            for field in ("g", "beta"):  # the gates are patched into the new output too
                torch.testing.assert_close(getattr(got, field).double().cpu(),
                                           torch.from_numpy(ref[part][field]),
                                           **GATE_TOLERANCE)
        assert_state_exact(data["conv_state"], ref_state)
        if run == 0:
            monkeypatch.setattr(backend, name, None)  # a second launch would fail
    assert results[0].spec.q.data_ptr() != results[1].spec.q.data_ptr()  # a new output


def test_a_remembered_stage_launch_follows_its_inputs_to_other_memory(device, monkeypatch):
    """SYCL: a layer's x, a and b are new tensors at every step (a projection's
    outputs): a stage launch remembered for them at some addresses is submitted for them
    at others (no checks, no new launch) and reads the new ones (the reference of their
    values); a or b on conv_state's memory is refused by the checks, conv_state
    untouched. (CUDA: tests/test_device_plan.py's runs on moved inputs.)"""
    if SIM:
        pytest.skip("the simulator has no remembered launches (its tensors are the host's)")
    if GPU:
        pytest.skip("SYCL's remembered launches (CUDA's: tests/test_device_plan.py)")
    from jitconv.backends.sycl import run_cache
    data, meta, gates = stage_case(21, torch.bfloat16)
    data, gates, ab = usm_case(data, gates)
    HV = gates["a"].shape[1]

    def at_class(t, like):
        """A pool copy of ``t`` at an address congruent to ``like``'s modulo the key's
        alignment (the same key)."""
        flat = jitconv.empty((t.numel() + run_cache.X_ALIGNMENT,), t.dtype)
        k = next(k for k in range(run_cache.X_ALIGNMENT)
                 if (flat.data_ptr() + k * t.element_size()) % run_cache.X_ALIGNMENT
                 == like.data_ptr() % run_cache.X_ALIGNMENT)
        copy = flat[k:k + t.numel()].view(t.shape)
        copy.copy_(t)
        return copy

    plan = jitconv.plan(data["x"].shape[0], data["conv_state"].shape[0],
                        data["conv_state"].shape[2], 4, **meta)
    H, K, _HV, V = HEADS

    def run(data, gates):
        args = [data[k] for k in DATA_KEYS] + [gates[k] for k in ("a", "b", "A_log",
                                                                  "dt_bias")]
        return plan.run_stage(*args, num_k_heads=H, head_k_dim=K, head_v_dim=V)

    run(data, gates)
    monkeypatch.setattr(SyclBackend, "launch", None)  # a launch not remembered would fail
    gen = torch.Generator().manual_seed(5)
    for _ in range(2):
        x = at_class(torch.randn(data["x"].shape, generator=gen).to(torch.bfloat16),
                     data["x"])
        ab2 = at_class((torch.randn(ab.shape, generator=gen) * 3).to(torch.bfloat16), ab)
        assert x.data_ptr() != data["x"].data_ptr() and ab2.data_ptr() != ab.data_ptr()
        moved = (dict(data, x=x), dict(gates, a=ab2[:, HV:], b=ab2[:, :HV]))
        ref, ref_state = reference_of(*moved[:1], meta, moved[1])
        result = run(*moved)
        for part in ("spec", "non_spec"):
            got = getattr(result, part)
            for field in ("q", "k", "v"):
                assert_outputs_close(getattr(got, field), ref[part][field], torch.bfloat16)
            for field in ("g", "beta"):
                torch.testing.assert_close(getattr(got, field).double().cpu(),
                                           torch.from_numpy(ref[part][field]),
                                           **GATE_TOLERANCE)
        assert_state_exact(data["conv_state"], ref_state)
    state = data["conv_state"]
    flat = state.as_strided((state.numel(),), (1,))
    before = bits(state)
    for name in ("a", "b"):  # a view of conv_state's memory at the same key
        want = gates[name].data_ptr() % run_cache.X_ALIGNMENT
        k = next(k for k in range(run_cache.X_ALIGNMENT)
                 if (flat.data_ptr() + 2 * k) % run_cache.X_ALIGNMENT == want)
        onto = torch.as_strided(flat[k:], gates[name].shape, gates[name].stride())
        with pytest.raises(ValueError, match="overlap"):
            run(data, dict(gates, **{name: onto}))
        assert torch.equal(bits(state), before)


def test_a_remembered_stage_launch_serves_only_its_layout(device):
    """SYCL keeps stage launches by the layer's tensors, for any plan of the geometry: a
    plan whose parts hold other token counts (so other output rows) on the same tensors
    must not take a launch kept for another layout, and is right."""
    if SIM:
        pytest.skip("the simulator has no remembered launches (its tensors are the host's)")
    if GPU:
        pytest.skip("SYCL's remembered launches (CUDA keeps them per plan)")
    data, meta, gates = stage_case(19, torch.bfloat16)
    _d, other, _g = stage_case(19, torch.bfloat16, ns_lengths=(1, 2, 9, 4),
                               sp_lengths=(1, 4, 1))
    data, gates, _ab = usm_case(data, gates)
    H, K, _HV, V = HEADS
    args = [data[k] for k in DATA_KEYS] + [gates[k] for k in ("a", "b", "A_log", "dt_bias")]
    for metadata in (meta, other):
        plan = jitconv.plan(data["x"].shape[0], data["conv_state"].shape[0],
                            data["conv_state"].shape[2], 4, **metadata)
        ref, ref_state = reference_of(data, metadata, gates)
        result = plan.run_stage(*args, num_k_heads=H, head_k_dim=K, head_v_dim=V)
        for part in ("spec", "non_spec"):
            got = getattr(result, part)
            assert got.q.shape[0] == len(ref[part]["q"])
            for field in ("q", "k", "v"):
                assert_outputs_close(getattr(got, field), ref[part][field], torch.bfloat16)
        assert_state_exact(data["conv_state"], ref_state)


def test_threads_run_the_stage_at_once(device):
    """Four threads, each its own layer (tensors and conv state) of one step, call the
    stage at once, twice each: every result and state is the reference's."""
    if SIM:
        pytest.skip("the simulator has no time for threads (it runs one kernel at a time)")
    import threading
    cases = [stage_case(30 + i, torch.bfloat16) for i in range(4)]
    expected = []
    for data, meta, gates in cases:
        first, _ = reference_of(data, meta, gates)
        state = data["conv_state"].clone()
        data["conv_state"].copy_(torch.from_numpy(
            reference_of(data, meta, gates)[1]).to(state.dtype))
        second, final = reference_of(data, meta, gates)
        data["conv_state"].copy_(state)
        expected.append((first, second, final))
    results, errors = [[] for _ in cases], []

    def work(i):
        try:
            data, meta, gates = cases[i]
            for _ in range(2):
                results[i].append(run_stage(data, meta, gates))
        except Exception as exc:  # reported below, with the thread's case
            errors.append((i, exc))
    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(cases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for (data, _meta, _gates), got, (first, second, final) in zip(cases, results, expected):
        for result, ref in zip(got, (first, second)):
            for part in ("spec", "non_spec"):
                for field in ("q", "k", "v"):
                    assert_outputs_close(getattr(getattr(result, part), field),
                                         ref[part][field], torch.bfloat16)
        assert_state_exact(data["conv_state"], final)
