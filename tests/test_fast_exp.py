"""silu's two variants on SYCL (kernel_abi.fast_silu): the exact math, and the fast one
(OpenCL's native_exp). The fast one
is the default for float16 / bfloat16, the exact one for float32; JITCONV_FAST_EXP=0 / 1
selects one for every dtype. Each variant is its own kernel (own cache key). Checked
here: both stay within the contract's tolerances against the float64 reference with
states bit-exact; the exact 16-bit kernels compute exactly what they computed before the
fast default (the float32 kernel's result on the same inputs, rounded to the dtype: the
16-bit kernels do the float32 math of the float32 kernel and round once); the fast ones
differ from them by at most 1 ulp, in few outputs; and NaN / inf inputs of any payload
come out as the reference's."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import jitconv
from jitconv.reference import causal_conv1d_reference

from helpers import DTYPES, TOLERANCE, bits, make_state, randn

CHILD = """
import json, sys, torch
import jitconv
from jitconv.kernels import abi as kernel_abi
from jitconv.backends.sycl import kernel_cache
from jitconv.backends.sycl import launching
from jitconv.reference import causal_conv1d_reference
from jitconv.testing.steps import mixed_step
from helpers import assert_outputs_close, assert_state_exact, bits, poisoned

def run(step):
    out = poisoned(tuple(step["x"].shape), step["x"].dtype, usm=True)
    jitconv.causal_conv1d_mixed(**step, out=out)
    return out

result = {"fast": {}, "keys": {}, "bits": {}, "f32_rounded": {}}
for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16),
                    ("float16", torch.float16)):
    make = lambda: mixed_step(torch.Generator().manual_seed(3), dim=160, width=4, dtype=dtype,
                              ns_lengths=[300, 1, 5], sp_lengths=[4, 4], usm=True)
    step = make()
    ref, ref_state = causal_conv1d_reference(**{**step, "conv_state": step["conv_state"].clone()})
    out = run(step)
    assert_outputs_close(out, ref, dtype)
    assert_state_exact(step["conv_state"], ref_state)
    # The float32 kernel on the same values (exact in float32), rounded once by torch.
    wide = {k: (v.float() if torch.is_tensor(v) and v.dtype == dtype else v)
            for k, v in make().items()}
    rounded = run(wide).to(dtype)
    result["fast"][name] = kernel_abi.fast_silu(name)
    # dim 160 in aligned USM memory: the 16-bit steps take their wide kernels
    result["keys"][name] = kernel_cache.key(4, name, name in kernel_abi.WIDE_CHANNELS)
    result["bits"][name] = bits(out).flatten().tolist()
    result["f32_rounded"][name] = bits(rounded).flatten().tolist()
result["compiled"] = launching.stats["compiled"]
print(json.dumps(result))
"""


def _child(sycl_device, cache_dir, fast_exp):
    env = dict(os.environ, JITCONV_CACHE_DIR=str(cache_dir), JITCONV_DEVICE=sycl_device,
               JITCONV_NO_SHIPPED_KERNELS="1",
               PYTHONPATH=os.pathsep.join([os.path.dirname(__file__),
                                           os.environ.get("PYTHONPATH", "")]))
    env.pop("JITCONV_FAST_EXP", None)
    if fast_exp is not None:
        env["JITCONV_FAST_EXP"] = fast_exp
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_silu_variants_are_their_own_kernels_and_the_exact_one_is_unchanged(
        sycl_device, tmp_path):
    runs = {setting: _child(sycl_device, tmp_path / str(setting), setting)
            for setting in (None, "0", "1")}
    default, exact, fast = runs[None], runs["0"], runs["1"]
    assert default["fast"] == {"float32": False, "bfloat16": True, "float16": True}
    assert exact["fast"] == dict.fromkeys(DTYPES, False)
    assert fast["fast"] == dict.fromkeys(DTYPES, True)
    for name in DTYPES:  # one key per variant: never another variant's entry
        assert (exact["keys"][name] == default["keys"][name]) == (name == "float32"), name
        assert (fast["keys"][name] == default["keys"][name]) == (name != "float32"), name
    for setting, run in runs.items():
        assert run["compiled"] == 3  # one kernel per dtype (the widened run reuses float32's)
        assert sorted(p.name for p in (tmp_path / str(setting)).glob("*.spv")) == sorted(
            f"{k}.spv" for k in run["keys"].values())
    for name in ("bfloat16", "float16"):
        # The exact path: what the float32 math gives, rounded once (as before).
        assert exact["bits"][name] == exact["f32_rounded"][name], name
        # The fast path: at most 1 ulp from it, in few outputs.
        want = np.array(exact["bits"][name], np.int64)
        got = np.array(default["bits"][name], np.int64)
        assert np.abs(got - want).max() <= 1, name
        share = (got != want).mean()
        assert share < (0.01 if name == "bfloat16" else 0.05), (name, share)
        assert fast["bits"][name] == default["bits"][name], name
    # float32 keeps the exact math by default; JITCONV_FAST_EXP=1 is its opt-in (whose
    # native_exp differs from exp in some outputs on opencl:cpu; another device's
    # native_exp may round exactly, so the difference is only required there).
    assert default["bits"]["float32"] == exact["bits"]["float32"]
    if sycl_device.startswith("opencl:cpu"):
        assert fast["bits"]["float32"] != default["bits"]["float32"]


# NaN bit patterns of each 16-bit dtype: signaling and quiet, smallest and largest
# payloads, both signs.
NANS = {"bfloat16": [0x7F81, 0x7FBF, 0x7FC0, 0x7FC1, 0x7FFF, 0xFF81, 0xFFC0, 0xFFFF],
        "float16": [0x7C01, 0x7DFF, 0x7E00, 0x7E01, 0x7FFF, 0xFC01, 0xFE00, 0xFFFF]}


def test_nan_of_any_payload_and_inf_come_out_as_the_reference(sycl_device):
    """The default (fast silu) 16-bit kernels give NaN for every NaN input payload and
    infinities their float result."""
    from jitconv.kernels import abi as kernel_abi
    if any(kernel_abi.fast_silu(d) != kernel_abi.DEFAULT_FAST_SILU[d] for d in NANS):
        pytest.skip("JITCONV_FAST_EXP overrides the default kernels in this process")
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
        out = jitconv.causal_conv1d_mixed(**case)
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


def test_the_variable_selects_the_variant_and_a_wrong_value_is_an_error(monkeypatch):
    from jitconv.kernels import abi as kernel_abi
    for value, want in ((None, kernel_abi.DEFAULT_FAST_SILU), ("", kernel_abi.DEFAULT_FAST_SILU),
                        ("0", dict.fromkeys(DTYPES, False)), ("1", dict.fromkeys(DTYPES, True))):
        monkeypatch.setattr(kernel_abi, "FAST_EXP", value)
        assert {d: kernel_abi.fast_silu(d) for d in DTYPES} == want, value
    monkeypatch.setattr(kernel_abi, "FAST_EXP", "yes")
    try:
        kernel_abi.fast_silu("bfloat16")
    except ValueError as exc:
        assert "JITCONV_FAST_EXP" in str(exc)
    else:
        raise AssertionError("JITCONV_FAST_EXP=yes was accepted")
