"""Split outputs (``split``, ``out_spec`` / ``out_non_spec``): each part's rows written
contiguously by the same launch, as the one-output call followed by vLLM's two ``index_select``
gathers would give them; and the checks that refuse bad split outputs before anything
runs."""

import pytest
import torch

import jitconv

from jitconv.api import validation
from jitconv.backends.cuda import devices as cuda_devices
from jitconv.backends.sycl import launching
from jitconv.backends.sycl.state import STATE as SYCL_STATE

from helpers import (DTYPES, bits, build_mixed, check_split_outputs, part_tokens, poisoned,
                     token_rows)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("width", [2, 4, 5])
@pytest.mark.parametrize("shape", ["shuffled", "plain", "spec_only", "non_spec_only"])
def test_split_outputs_match_gathers(sycl_device, dtype_name, width, shape):
    dtype = DTYPES[dtype_name]
    seed = list(DTYPES).index(dtype_name) * 10 + width
    case = build_mixed(seed, dtype=dtype, width=width, dim=72, usm=True,
                       shuffle=shape == "shuffled", non_spec=shape != "spec_only",
                       spec=shape != "non_spec_only")
    check_split_outputs(case, dtype, usm=True)


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_split_outputs_skip_uncovered_rows(sycl_device, dtype_name):
    """Rows of x that no sequence uses belong to neither part: nothing is written for
    them (the one-output call writes zeros there)."""
    dtype = DTYPES[dtype_name]
    case = build_mixed(3, dtype=dtype, width=4, dim=64, usm=True, shuffle=True)
    check_split_outputs(case, dtype, usm=True, extra_rows=5)


def test_split_outputs_plan_every_layer(sycl_device):
    """A plan's runs with split outputs, layer after layer, and a plain tensor run (copied
    to the device and back; not on a CUDA GPU, which refuses CPU tensors)."""
    dtype = torch.bfloat16
    case = build_mixed(11, dtype=dtype, width=4, dim=64, usm=True)
    step = {k: v for k, v in case.items() if k not in ("x", "weight", "bias", "conv_state")}
    plan = jitconv.plan(case["x"].shape[0], case["conv_state"].shape[0],
                        case["conv_state"].shape[2], 4, **step)
    expected = jitconv.causal_conv1d_mixed(**dict(case, conv_state=case["conv_state"].clone()))
    n_s, n_ns = part_tokens(case, "spec"), part_tokens(case, "non_spec")
    gpu = cuda_devices.is_cuda_name(sycl_device) and not cuda_devices.simulating()
    for usm in (True,) if gpu else (True, False):
        spec, non_spec = poisoned((n_s, 64), dtype, usm), poisoned((n_ns, 64), dtype, usm)
        got = plan.run(case["x"], case["weight"], case["bias"], case["conv_state"].clone(),
                       out_spec=spec, out_non_spec=non_spec)
        assert got == jitconv.SplitOutputs(spec, non_spec)
        assert torch.equal(bits(spec), bits(expected)[case["spec_token_indx"].long()])
        assert torch.equal(bits(non_spec), bits(expected)[case["non_spec_token_indx"].long()])


@pytest.mark.skipif(not launching.can_resubmit(),
                    reason="launches are remembered on the C submit path only")
def test_new_split_outputs_are_remembered_per_layer(sycl_device, monkeypatch):
    """split=True runs of a layer after the first skip the checks (a remembered launch),
    also through another plan of the same geometry (the next step's), and stay
    bit-exact; a one-output run of the same tensors is not served by the split launch."""
    SYCL_STATE.runs.clear()
    dtype = torch.bfloat16
    checks = []
    original = validation.check_tensors
    monkeypatch.setattr(validation, "check_tensors",
                        lambda *a: checks.append(1) or original(*a))
    case = build_mixed(21, dtype=dtype, width=4, dim=64, usm=True, shuffle=True)
    layer = {k: case[k] for k in ("x", "weight", "bias")}
    step = {k: v for k, v in case.items() if k not in ("x", "weight", "bias", "conv_state")}
    state = case["conv_state"]
    state0 = state.clone()
    full = jitconv.causal_conv1d_mixed(conv_state=state.clone(), **layer, **step)
    for calls in (1, 0):  # the second plan: a new object of the same geometry
        plan = jitconv.plan(layer["x"].shape[0], state.shape[0], state.shape[2], 4, **step)
        del checks[:]
        for _ in range(3):
            state.copy_(state0)
            got = plan.run(conv_state=state, split=True, **layer)
            for part, t in zip(("spec", "non_spec"), got):
                assert torch.equal(bits(t), bits(full)[token_rows(case, part)]), part
        assert len(checks) == calls
    del checks[:]
    state.copy_(state0)
    assert torch.equal(bits(plan.run(conv_state=state, **layer)), bits(full))
    assert len(checks) == 1, "a one-output run took the split launch"
    SYCL_STATE.runs.clear()


def _bad_split_cases(case):
    dim = case["x"].shape[1]
    n_s, n_ns = part_tokens(case, "spec"), part_tokens(case, "non_spec")
    dtype = case["x"].dtype

    def out(rows, **kw):
        return jitconv.empty((rows, dim), kw.get("dtype", dtype))

    shared = jitconv.empty((n_s + n_ns, dim), dtype)
    wide = jitconv.empty((n_s, 2 * dim), dtype)
    return [
        ("out_spec", dict(out_spec=out(n_s + 1), out_non_spec=out(n_ns)), "expected shape"),
        ("out_non_spec", dict(out_spec=out(n_s), out_non_spec=out(n_ns, dtype=torch.float16)),
         "dtype must match x"),
        ("out_non_spec", dict(out_spec=out(n_s)), "its output is needed"),
        ("out_spec", dict(out_non_spec=out(n_ns)), "its output is needed"),
        ("out_spec and out_non_spec", dict(out_spec=shared[:n_s], out_non_spec=shared[n_s - 1:-1]),
         "overlap in memory"),
        ("out_spec and x", dict(out_spec=case["x"][:n_s], out_non_spec=out(n_ns)),
         "overlap in memory"),
        ("out_spec and conv_state",
         dict(out_spec=case["conv_state"].transpose(1, 2).reshape(-1, dim)[:n_s],
              out_non_spec=out(n_ns)),
         "overlap in memory"),
        ("out_spec", dict(out_spec=wide[:, ::2], out_non_spec=out(n_ns)),
         "channels (last dimension) must be contiguous"),
        ("out", dict(out=out(case["x"].shape[0]), out_spec=out(n_s), out_non_spec=out(n_ns)),
         "split outputs replace out"),
        ("out_spec", dict(out_spec=torch.empty(n_s, dim, dtype=dtype, device="meta"),
                          out_non_spec=out(n_ns)), "same device as x"),
    ]


@pytest.mark.parametrize("index", range(10))
def test_bad_split_outputs_are_rejected_by_name(sycl_device, index):
    case = build_mixed(5, dtype=torch.float32, width=4, dim=64, usm=True, layout="SD")
    name, extra, message = _bad_split_cases(case)[index]
    before = bits(case["conv_state"])
    with pytest.raises((ValueError, TypeError)) as err:
        jitconv.causal_conv1d_mixed(**case, **extra)
    assert str(err.value).startswith(name) and message in str(err.value), str(err.value)
    assert torch.equal(bits(case["conv_state"]), before)
