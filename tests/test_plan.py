"""jitconv.plan: one step's metadata validated once, run on many layers.

Each layer has its own x, weight, bias and conv_state; every run is checked against the
float64 reference (outputs within tolerance, states bit-exact). A run whose tensors do not
fit the plan raises before launching, naming the tensor, with conv_state untouched; bad
metadata raises at plan time with the same errors as causal_conv1d_mixed. Runs of one plan
from several threads at once give the same results as sequential runs.

The plans here run on a SYCL device (their tests hold SYCL queues, USM arrays and the SYCL
backend's counters): on a CUDA device under test they skip, and only the metadata checks
run. CUDA plans: tests/test_cuda.py and tests/test_device_plan.py.
"""

import threading

import pytest
import torch

import jitconv
from jitconv.backends.sycl import devices as sycl_devices
from jitconv.backends.sycl import launching
from jitconv.reference import causal_conv1d_reference
from jitconv.backends.sycl.usm import DeviceArray
from jitconv.backends.sycl.state import STATE as SYCL_STATE

from helpers import (DATA_KEYS, DTYPES, TransposedView, assert_outputs_close,
                     assert_state_exact, bits,
                     gdn_metadata, mixed_step, randn)

LAYERS = 4


def step_and_meta(seed, dtype=torch.float32, dim=72, width=4, usm=False, spec_columns=4,
                  pads=1):
    gen = torch.Generator().manual_seed(seed)
    step = mixed_step(gen, dim=dim, width=width, dtype=dtype, ns_lengths=[37, 1, 2, 1],
                      sp_lengths=[4, 2, 4], rows="shuffled", ns_pads=pads, sp_pads=pads,
                      initial="alternate", spec_columns=spec_columns, extra_lines=3,
                      usm=usm)
    meta = {k: v for k, v in step.items() if k not in DATA_KEYS}
    return gen, {k: step[k] for k in DATA_KEYS}, meta


def plan_for(step, meta):
    lines, _dim, state_len = step["conv_state"].shape
    return jitconv.plan(step["x"].shape[0], lines, state_len, step["weight"].shape[-1],
                        **meta)


def layer_tensors(gen, step, dtype, usm=False):
    """Another layer of the same step: its own x, weight, bias and conv_state."""
    like = {k: step[k] for k in DATA_KEYS}
    layer = {k: randn(gen, tuple(v.shape), dtype, usm) for k, v in like.items()
             if k != "conv_state"}
    state = randn(gen, tuple(step["conv_state"].transpose(1, 2).shape), dtype, usm)
    layer["conv_state"] = state.transpose(1, 2)
    return layer


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("usm", [False, True])
def test_one_plan_many_layers(spirv_device, dtype_name, usm):
    dtype = DTYPES[dtype_name]
    gen, step, meta = step_and_meta(1, dtype, usm=usm)
    plan = plan_for(step, meta)
    before = SYCL_STATE.stats["submitted"]
    for _ in range(LAYERS):
        layer = layer_tensors(gen, step, dtype, usm)
        ref_out, ref_state = causal_conv1d_reference(**layer, **meta)
        out = plan.run(**layer)
        assert_outputs_close(out, ref_out, dtype)
        assert_state_exact(layer["conv_state"], ref_state)
    assert SYCL_STATE.stats["submitted"] == before + LAYERS, "one launch per layer"


def test_run_with_out_and_no_activation(spirv_device):
    gen, step, meta = step_and_meta(2)
    plan = plan_for(step, meta)
    ref_out, ref_state = causal_conv1d_reference(**step, **meta, activation=None)
    out = torch.full(tuple(step["x"].shape), float("nan"))
    assert plan.run(**step, out=out, activation=None) is out
    assert_outputs_close(out, ref_out, torch.float32)
    assert_state_exact(step["conv_state"], ref_state)


def test_plan_equals_the_one_shot_op(spirv_device):
    gen, step, meta = step_and_meta(3, torch.bfloat16)
    twin = {k: (v.clone() if k == "conv_state" else v) for k, v in step.items()}
    a = plan_for(step, meta).run(**step)
    b = jitconv.causal_conv1d_mixed(**twin, **meta)
    assert torch.equal(bits(a), bits(b))
    assert torch.equal(bits(step["conv_state"]), bits(twin["conv_state"]))


@pytest.mark.parametrize("change,text", [
    ("rows", "x: has 60 rows (num_tokens), but the plan was built for 51"),
    ("width", "weight: has 3 taps (width), but the plan was built for 4"),
    ("lines", "conv_state: has 8 cache lines (num_cache_lines), but the plan was built "
              "for 10"),
    ("state_len", "conv_state: has 7 columns (state_len), but the plan was built for 6"),
    ("dtype", "weight: dtype must match x"),
])
def test_run_rejects_tensors_that_do_not_fit(spirv_device, change, text):
    gen, step, meta = step_and_meta(4)
    plan = plan_for(step, meta)
    layer = dict(step)
    if change == "rows":
        layer["x"] = randn(gen, (60, 72), torch.float32)
    elif change == "width":
        layer["weight"] = randn(gen, (72, 3), torch.float32)
    elif change == "lines":
        layer["conv_state"] = step["conv_state"][:8]
    elif change == "state_len":
        layer["conv_state"] = randn(gen, (10, 7, 72), torch.float32).transpose(1, 2)
    else:
        layer["weight"] = step["weight"].double()
    state = layer["conv_state"]
    before = bits(state)
    with pytest.raises((ValueError, TypeError), match=text.replace("(", r"\(").replace(
            ")", r"\)")):
        plan.run(**layer)
    assert torch.equal(bits(state), before)


@pytest.mark.parametrize("changes,error,text", [
    (dict(num_tokens=50), ValueError, "token_indx: row 50 is out of range"),
    (dict(num_cache_lines=3), ValueError, "cache line"),
    (dict(state_len=2), ValueError, "state_len: must be >= width - 1 = 3"),
    (dict(width=9), ValueError, "width: must be one of"),
    (dict(width=4.0), TypeError, "width: expected an int"),
    (dict(num_tokens=-1), ValueError, "num_tokens: expected an int >= 0"),
    (dict(num_accepted_tokens=torch.tensor([1, 0, 1], dtype=torch.int32)), ValueError,
     "num_accepted_tokens: every entry must be >= 1"),
    (dict(spec_state_indices=None), ValueError, "spec_state_indices: required"),
])
def test_bad_plan_arguments_name_the_argument(sycl_device, changes, error, text):
    gen, step, meta = step_and_meta(5)
    lines, _dim, state_len = step["conv_state"].shape
    kwargs = dict(meta, num_tokens=step["x"].shape[0], num_cache_lines=lines,
                  state_len=state_len, width=4)
    kwargs.update(changes)
    with pytest.raises(error, match=text):
        jitconv.plan(**kwargs)


def test_threads_run_plans_on_their_own_layers(spirv_device):
    """8 threads x 6 layers each, at once, on two plans of different steps (threads 0, 2,
    ... share one, 1, 3, ... the other): every result is the reference's."""
    plans = []
    for seed, shape in ((6, dict(ns_lengths=[37, 1, 2, 1], sp_lengths=[4, 2, 4])),
                        (8, dict(ns_lengths=[1] * 9, sp_lengths=[3] * 5))):
        gen = torch.Generator().manual_seed(seed)
        step = mixed_step(gen, dim=72, width=4, dtype=torch.bfloat16, rows="shuffled",
                          ns_pads=1, extra_lines=2, usm=True, **shape)
        meta = {k: v for k, v in step.items() if k not in DATA_KEYS}
        plans.append((plan_for(step, meta), step, meta))
    layers = [[layer_tensors(gen, plans[t % 2][1], torch.bfloat16, usm=True)
               for _ in range(6)] for t in range(8)]
    expected = [[causal_conv1d_reference(**layer, **plans[t % 2][2]) for layer in mine]
                for t, mine in enumerate(layers)]
    results, errors = {}, []
    start = threading.Barrier(len(layers))

    def work(t):
        try:
            start.wait()
            results[t] = [plans[t % 2][0].run(**layer) for layer in layers[t]]
        except Exception as exc:  # reported below: a thread's failure must fail the test
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(len(layers))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=300)
    assert not errors, errors
    for t, mine in enumerate(layers):
        for layer, out, (ref_out, ref_state) in zip(mine, results[t], expected[t]):
            assert_outputs_close(out, ref_out, torch.bfloat16)
            assert_state_exact(layer["conv_state"], ref_state)


def test_queue_from_a_sycl_queue_address(spirv_device):
    """torch's XPU stream gives its sycl::queue as an address; wrapped for dpctl it is the
    same queue. (No XPU here: a dpctl queue's own address stands in for torch's.)"""
    q = jitconv.get_queue()
    wrapped = sycl_devices.queue_from_address(q.addressof_ref())
    assert wrapped == q and wrapped.sycl_context == q.sycl_context
    assert sycl_devices.queue_from_address(q.addressof_ref()) is wrapped, "cached per address"
    with pytest.raises(ValueError, match="queue address"):
        sycl_devices.queue_from_address(0)


def test_run_on_an_explicit_in_order_queue_with_device_arrays(spirv_device):
    """Device memory on an in-order queue: run returns after the submit; work queued
    after it on the same queue (the copies back) sees the results."""
    import dpctl
    base = jitconv.get_queue()
    queue = dpctl.SyclQueue(base.sycl_context, base.sycl_device, property="in_order")
    gen, step, meta = step_and_meta(7)
    lines, _dim, state_len = step["conv_state"].shape
    plan = jitconv.plan(step["x"].shape[0], lines, state_len, 4, queue=queue, **meta)
    ref_out, ref_state = causal_conv1d_reference(**step, **meta)
    arrays = {k: DeviceArray(step[k], queue) for k in ("x", "weight", "bias")}
    stored = step["conv_state"].transpose(1, 2)  # (lines, state_len, dim), contiguous
    state = DeviceArray(stored, queue)
    out = DeviceArray(torch.full(tuple(step["x"].shape), float("nan")), queue)
    before = SYCL_STATE.stats["submitted"]
    plan.run(arrays["x"], arrays["weight"], arrays["bias"], TransposedView(state), out=out)
    assert SYCL_STATE.stats["submitted"] == before + 1
    assert_outputs_close(out.to_tensor(), ref_out, torch.float32)
    assert_state_exact(state.to_tensor().transpose(1, 2), ref_state)


def test_gdn_conv_step_plans_once_per_metadata_object(spirv_device, monkeypatch):
    """vLLM's GDN layers of one step share one metadata object: the first layer builds
    the plan, the others reuse it (no per-layer validation), each layer still correct.
    A new metadata object (the next step) gets a new plan. (No pads here, so any line,
    0 included, is real: null_block_id=None.)"""
    from jitconv.api import ops
    from jitconv import vllm
    built = []
    real_plan = ops.plan_from
    monkeypatch.setattr(ops, "plan_from", lambda *a, **k: built.append(1) or real_plan(*a, **k))
    gen, step, meta = step_and_meta(9, spec_columns=1, pads=0)
    layers = [layer_tensors(gen, step, torch.float32) for _ in range(3)]

    def metadata():
        return gdn_metadata(dict(step, **meta))

    m = metadata()
    for layer in layers:
        ref_out, ref_state = causal_conv1d_reference(**layer, **meta)
        out = vllm.gdn_conv_step(layer["x"], layer["weight"], layer["bias"],
                                 layer["conv_state"], m, null_block_id=None)
        assert_outputs_close(out, ref_out, torch.float32)
        assert_state_exact(layer["conv_state"], ref_state)
    assert len(built) == 1
    vllm.gdn_conv_step(layers[0]["x"], layers[0]["weight"], layers[0]["bias"],
                       layers[0]["conv_state"], metadata(), null_block_id=None)
    assert len(built) == 2


@pytest.mark.parametrize("path", ["C interface", "dpctl's Python submit"])
def test_both_submit_paths_compute_the_contract(spirv_device, monkeypatch, path):
    """Launches go through dpctl's C interface when its library is found, else through
    SyclQueue.submit: both must pack the same arguments."""
    if path == "C interface":
        assert launching._c_submit is not None, "libDPCTLSyclInterface was not found"
    else:
        monkeypatch.setattr(launching, "_c_submit", None)
    gen, step, meta = step_and_meta(10, torch.bfloat16)
    ref_out, ref_state = causal_conv1d_reference(**step, **meta)
    out = plan_for(step, meta).run(**step)
    assert_outputs_close(out, ref_out, torch.bfloat16)
    assert_state_exact(step["conv_state"], ref_state)


def test_device_plan_metadata_types_without_a_planner_are_named(spirv_device, monkeypatch):
    """Without numba-dpex, metadata whose element types no shipped planner takes (an
    int32 / int64 mix) is refused by name, with the types that are shipped."""
    from jitconv.backends.sycl import launching
    monkeypatch.setattr(launching, "have_compiler", lambda: False)
    monkeypatch.setenv("JITCONV_NO_SHIPPED_KERNELS", "0")
    plan = jitconv.device_plan(
        2, 4, 3, 4, non_spec_query_start_loc=jitconv.zeros((3,), torch.int64),
        non_spec_state_indices=jitconv.zeros((2,), torch.int32))
    x, w, state = jitconv.zeros((2, 8)), torch.randn(8, 4), jitconv.zeros((4, 8, 3))
    with pytest.raises(launching.KernelUnavailableError,
                       match=r"no planner for metadata of element types \('int64', 'int32'"):
        plan.run(x, w, None, state)
    # the rule planner's arrays likewise (int64 parents beside int32 window rows)
    lines = jitconv.zeros((2,), torch.int32)
    plan = jitconv.device_plan(
        2, 4, 3, 4, non_spec_state_indices=lines,
        non_spec_parent_token=jitconv.zeros((2, 1), torch.int64),
        non_spec_window_rows=lines)
    with pytest.raises(launching.KernelUnavailableError,
                       match=r"no rule planner for rules of element types \('int64', 'int64', "
                             r"'int32'"):
        plan.run(x, w, None, state, intermediate_windows=jitconv.zeros((2, 1, 8, 3)))
