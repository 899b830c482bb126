"""silu's math on SYCL, chosen per call (``math="exact" | "fast"``, None: the dtype's
default, ``abi.fast_silu``): the exact math, and the fast one (OpenCL's native_exp). The
fast one is the default for float16 / bfloat16, the exact one for float32. Each choice is
its own kernel (own cache key, both shipped). Checked here: both stay within the
contract's tolerances against the float64 reference with states bit-exact; the exact
16-bit kernels compute what the float32 kernel computes on the same inputs, rounded to the
dtype (the 16-bit kernels do the float32 math and round once); the fast ones differ from
them by at most 1 ulp, in few outputs; a remembered launch never replays another math;
NaN / inf inputs of any payload come out as the reference's; a bad ``math`` is refused by
name before anything runs."""

import numpy as np
import pytest
import torch

import jitconv
from jitconv.kernels import abi
from jitconv.backends.sycl import kernel_cache
from jitconv.reference import causal_conv1d_reference
from jitconv.testing.steps import mixed_step

from helpers import (DTYPES, TOLERANCE, assert_outputs_close, assert_state_exact, bits,
                     make_state, poisoned, randn)

MATHS = (None, "exact", "fast")


def _step(dtype):
    return mixed_step(torch.Generator().manual_seed(3), dim=160, width=4, dtype=dtype,
                      ns_lengths=[300, 1, 5], sp_lengths=[4, 4], usm=True)


def _run_every_math(step, dtype):
    """Bits of the output of each math, from ONE plan and the same tensors (the second
    and later runs of a math go through the remembered launch), states checked."""
    kwargs = {k: v for k, v in step.items() if k not in ("x", "weight", "bias",
                                                         "conv_state")}
    x, weight, bias, state = step["x"], step["weight"], step["bias"], step["conv_state"]
    plan = jitconv.plan(x.shape[0], state.shape[0], state.shape[2], weight.shape[-1],
                        **kwargs)
    before = state.clone()
    ref, ref_state = causal_conv1d_reference(**{**step, "conv_state": state.clone()})
    out = poisoned(tuple(x.shape), dtype, usm=True)
    got = {}
    for math in MATHS + MATHS[::-1]:  # each math twice, in both orders
        state.copy_(before)
        out.fill_(float("nan"))
        plan.run(x, weight, bias, state, out=out, math=math)
        assert_outputs_close(out, ref, dtype)
        assert_state_exact(state, ref_state)
        b = bits(out).flatten().clone()
        assert math not in got or torch.equal(got[math], b), math  # the same kernel again
        got[math] = b
    return got


def test_each_math_is_its_own_kernel_with_its_own_key():
    for name in DTYPES:
        wide = name in abi.WIDE_CHANNELS
        exact, fast = (kernel_cache.key(4, name, wide, f) for f in (False, True))
        assert exact != fast, name
        assert kernel_cache.key(4, name, wide) == (fast if abi.DEFAULT_FAST_SILU[name]
                                                   else exact), name
    assert abi.DEFAULT_FAST_SILU == {"float32": False, "float16": True, "bfloat16": True}
    # both maths ship: a dpctl-only install (torch XPU) runs either without numba-dpex
    shipped = {p.stem for p in kernel_cache.PREBUILT_DIR.glob("*.spv")}
    for spec in kernel_cache.specializations():
        assert kernel_cache.key(*spec) in shipped, spec
    assert {s[3] for s in kernel_cache.specializations()} == {False, True}


def test_the_maths_against_each_other_and_the_reference(cpu_tensor_device):
    runs = {name: _run_every_math(_step(dtype), dtype) for name, dtype in DTYPES.items()}
    # The float32 kernel on the 16-bit steps' values (exact in float32), rounded once.
    rounded = {}
    for name in ("bfloat16", "float16"):
        dtype = DTYPES[name]
        wide = {k: (v.float() if torch.is_tensor(v) and v.dtype == dtype else v)
                for k, v in _step(dtype).items()}
        out = poisoned(tuple(wide["x"].shape), torch.float32, usm=True)
        jitconv.causal_conv1d_mixed(**wide, out=out, math="exact")
        rounded[name] = bits(out.to(dtype)).flatten()
    for name in ("bfloat16", "float16"):
        got = runs[name]
        assert torch.equal(got[None], got["fast"]), name  # the 16-bit default is fast
        # The exact path: what the float32 math gives, rounded once.
        assert torch.equal(got["exact"], rounded[name]), name
        # The fast path: at most 1 ulp from it, in few outputs.
        want = got["exact"].numpy().astype(np.int64)
        fast = got["fast"].numpy().astype(np.int64)
        assert np.abs(fast - want).max() <= 1, name
        share = (fast != want).mean()
        assert share < (0.01 if name == "bfloat16" else 0.05), (name, share)
    f32 = runs["float32"]
    assert torch.equal(f32[None], f32["exact"])  # float32's default is exact
    # native_exp differs from exp in some outputs on opencl:cpu; another device's may
    # round exactly, so the difference is only required there.
    if cpu_tensor_device.startswith("opencl:cpu"):
        assert not torch.equal(f32["fast"], f32["exact"])


def test_a_bad_math_is_refused_by_name_before_anything_runs(sycl_device):
    step = _step(torch.float32)
    state = step["conv_state"]
    before = state.clone()
    x, weight, bias = step["x"], step["weight"], step["bias"]
    kwargs = {k: v for k, v in step.items() if k not in ("x", "weight", "bias",
                                                         "conv_state")}
    plan = jitconv.plan(x.shape[0], state.shape[0], state.shape[2], 4, **kwargs)
    plan.run(x, weight, bias, state)  # remembered: the bad call must not replay it
    state.copy_(before)
    qsl, lines = kwargs["non_spec_query_start_loc"], kwargs["non_spec_state_indices"]
    calls = [lambda m: plan.run(x, weight, bias, state, math=m),
             lambda m: jitconv.causal_conv1d_mixed(x, weight, bias, state, math=m, **kwargs),
             lambda m: jitconv.causal_conv1d_fn(x, weight, bias, state, qsl, lines,
                                                token_indx=kwargs["non_spec_token_indx"],
                                                math=m),
             lambda m: jitconv.causal_conv1d_update(x[:2], weight, bias, state, lines[:2],
                                                    math=m)]
    for call in calls:
        for bad in ("Fast", "approx", 1, True):
            with pytest.raises(ValueError, match="math must be 'exact', 'fast' or None"):
                call(bad)
            assert torch.equal(bits(state), bits(before))


# NaN bit patterns of each 16-bit dtype: signaling and quiet, smallest and largest
# payloads, both signs.
NANS = {"bfloat16": [0x7F81, 0x7FBF, 0x7FC0, 0x7FC1, 0x7FFF, 0xFF81, 0xFFC0, 0xFFFF],
        "float16": [0x7C01, 0x7DFF, 0x7E00, 0x7E01, 0x7FFF, 0xFC01, 0xFE00, 0xFFFF]}


@pytest.mark.parametrize("math", MATHS)
def test_nan_of_any_payload_and_inf_come_out_as_the_reference(cpu_tensor_device, math):
    """Every math of the 16-bit kernels gives NaN for every NaN input payload and
    infinities their float result."""
    gen = torch.Generator().manual_seed(21)
    dim, width, tokens = 64, 4, 40
    for name, patterns in NANS.items():
        dtype = DTYPES[name]
        x = randn(gen, (tokens, dim), dtype)
        weight, bias = randn(gen, (dim, width), dtype), randn(gen, (dim,), dtype)
        state = make_state(gen, 3, dim, 3, dtype, "SD")
        nan = torch.tensor(patterns, dtype=torch.int32).to(torch.int16).view(dtype)
        for i, value in enumerate(nan):  # in x, the state window, weights and bias
            x[2 + 4 * i, 3 + 5 * i] = value
            state[1, 40 + i, i % 3] = value
        weight[60, 1], bias[62] = nan[0], nan[-1]
        x[30, 11], x[33, 12] = float("inf"), -float("inf")
        case = dict(x=x, weight=weight, bias=bias, conv_state=state,
                    non_spec_query_start_loc=torch.tensor([0, 25, tokens], dtype=torch.int32),
                    non_spec_state_indices=torch.tensor([1, 2], dtype=torch.int32))
        before = state.clone()
        ref_out, _ = causal_conv1d_reference(**{**case, "conv_state": state.clone()})
        out = jitconv.causal_conv1d_mixed(**case, math=math)
        got = out.to(torch.float64).numpy()
        assert np.isnan(ref_out).sum() > 3 * len(patterns), name
        np.testing.assert_array_equal(np.isnan(got), np.isnan(ref_out), err_msg=name)
        np.testing.assert_array_equal(np.isposinf(got), np.isposinf(ref_out), err_msg=name)
        np.testing.assert_array_equal(np.isneginf(got), np.isneginf(ref_out), err_msg=name)
        finite = np.isfinite(ref_out)
        rtol, atol = TOLERANCE[dtype]
        np.testing.assert_allclose(got[finite], ref_out[finite], rtol=rtol, atol=atol,
                                   err_msg=name)
        # New state columns are the last 3 inputs of each sequence, bit for bit (NaN
        # payloads included: the float64 reference would quiet signaling NaNs).
        want = before.clone()
        want[1, :, 0:3], want[2, :, 0:3] = x[22:25].T, x[37:40].T
        assert torch.equal(bits(state), bits(want)), name
