"""JITCONV_FAST_EXP=1 (opt-in): silu's exp is OpenCL's native_exp. It is its own kernel
(own cache key, never the default's SPIR-V) and stays within the contract's tolerances
against the float64 reference; states stay bit-exact (they are copies of inputs)."""

import json
import os
import subprocess
import sys

from jitconv import kernel_cache

CHILD = """
import json, sys, torch
import jitconv
from jitconv import kernel_abi, kernel_cache, launching
from jitconv.reference import causal_conv1d_reference, TOLERANCE
from jitconv.steps import mixed_step
from helpers import assert_outputs_close, assert_state_exact, poisoned
for dtype in (torch.float32, torch.bfloat16, torch.float16):
    step = mixed_step(torch.Generator().manual_seed(3), dim=80, width=4, dtype=dtype,
                      ns_lengths=[37, 1, 5], sp_lengths=[4, 4], usm=True)
    ref, ref_state = causal_conv1d_reference(**{**step, "conv_state": step["conv_state"].clone()})
    out = poisoned(tuple(step["x"].shape), dtype)
    jitconv.causal_conv1d_mixed(**step, out=out)
    assert_outputs_close(out, ref, dtype)
    assert_state_exact(step["conv_state"], ref_state)
print(json.dumps({"fast": kernel_abi.FAST_EXP,
                  "keys": [kernel_cache.key(4, d) for d in ("float32", "bfloat16", "float16")],
                  "compiled": launching.stats["compiled"]}))
"""


def test_fast_exp_is_its_own_kernel_and_within_tolerance(sycl_device, tmp_path):
    env = dict(os.environ, JITCONV_FAST_EXP="1", JITCONV_CACHE_DIR=str(tmp_path),
               JITCONV_DEVICE=sycl_device,
               PYTHONPATH=os.pathsep.join([os.path.dirname(__file__),
                                           os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    child = json.loads(done.stdout.strip().splitlines()[-1])
    assert child["fast"] is True
    exact = {kernel_cache.key(4, d) for d in ("float32", "bfloat16", "float16")}
    assert not exact & set(child["keys"])  # never the exact kernels' entries
    assert child["compiled"] == 3  # the shipped (exact) kernels were not used
    assert sorted(p.name for p in tmp_path.glob("*.spv")) == sorted(
        f"{k}.spv" for k in child["keys"])
