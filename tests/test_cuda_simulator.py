"""The CUDA backend in CI: tests/test_cuda.py, tests/test_device_plan.py and tests/test_vllm.py
(the drop-ins, in place into x among them) under numba's CUDA simulator, in a
subprocess (NUMBA_ENABLE_CUDASIM must be set before numba.cuda is first imported) with
dpctl, dpnp and numba-dpex hidden, as on a CUDA machine without the SYCL stack.
See tests/test_cuda.py for what the simulator can and cannot check."""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


@pytest.mark.skipif(importlib.util.find_spec("numba_cuda") is None,
                    reason="numba-cuda is not installed (pip install 'jitconv[test]')")
def test_cuda_kernels_in_the_simulator():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", JITCONV_TEST_HIDE_SYCL="1",
               NUMBA_CUDA_USE_NVIDIA_BINDING="0",  # the simulator needs no CUDA bindings
               PYTHONPATH=os.pathsep.join([str(TESTS.parent)] + sys.path))
    env.pop("JITCONV_DEVICE", None)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-rs", str(TESTS / "test_cuda.py"),
                           str(TESTS / "test_device_plan.py"), str(TESTS / "test_vllm.py"),
                           str(TESTS / "test_gdn_stage.py")],
                          cwd=TESTS.parent, env=env,
                          capture_output=True, text=True, timeout=900)
    tail = done.stdout[-3000:] + done.stderr[-2000:]
    assert done.returncode == 0, tail
    passed = re.search(r"(\d+) passed", done.stdout)
    assert passed and int(passed.group(1)) >= 60, tail
    # Only what needs a GPU may skip: the stream test (the simulator has no streams) and
    # the device-plan tests of graphs and driver launches; and the SYCL cases of the
    # device-plan and stage tests (SYCL is hidden here; the main run has them).
    reasons = re.findall(r"SKIPPED \[(\d+)\] [^:]+:\d+: (.*)", done.stdout)
    reasons = [(n, why) for n, why in reasons if not why.startswith("SYCL device plans")]
    assert all("simulator has no" in why for _, why in reasons), tail
    # 48 device-plan (2 of them the stage's graph replays, 6 signature runs, 6 runs on
    # moved inputs, 2 threads on one signature, 2 threads rebinding plans of one
    # layout), 1 stream, 6 stage
    assert sum(int(n) for n, _ in reasons) <= 55, tail
