"""pytest setup: device choice and the markers.

--sycl-device FILTER   run kernels on this dpctl device (default: $JITCONV_DEVICE, else
                       jitconv's default: first Level Zero GPU, else opencl:cpu).

A missing device skips the device tests with the reason shown, except in CI (CI=true) or
with --require-device, where it is an error: a run that skipped every kernel test must
not look green.
"""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

# JITCONV_TEST_HIDE_SYCL=1: run as on a machine without the SYCL stack (the CUDA backend's
# simulator run, tests/test_cuda_simulator.py): importing dpctl, dpnp or numba-dpex fails.
if os.environ.get("JITCONV_TEST_HIDE_SYCL") == "1":
    for _name in ("dpctl", "dpnp", "numba_dpex"):
        sys.modules[_name] = None


def pytest_configure(config):
    # Hermetic kernel cache: a session starts cold (so the compile path runs) unless the
    # user points JITCONV_CACHE_DIR somewhere on purpose.
    if "JITCONV_CACHE_DIR" not in os.environ:
        os.environ["JITCONV_CACHE_DIR"] = tempfile.mkdtemp(prefix="jitconv-test-cache-")
    # The shipped kernels would make every kernel warm: leave them out unless asked for
    # (tests/test_prebuilt.py checks them; the dpctl-only environments run on them).
    os.environ.setdefault("JITCONV_NO_SHIPPED_KERNELS", "1")


def pytest_addoption(parser):
    parser.addoption("--sycl-device", default=os.environ.get("JITCONV_DEVICE", "auto"),
                     help="dpctl filter string of the device to test, or 'auto'")
    parser.addoption("--require-device", action="store_true",
                     default=os.environ.get("CI", "").lower() == "true",
                     help="fail instead of skipping when the device is missing")


def _select(config):
    import jitconv
    wanted = config.getoption("--sycl-device")
    try:
        if wanted == "auto":
            return jitconv.get_device(), None
        return jitconv.set_device(wanted), None
    except jitconv.DeviceNotFoundError as exc:
        return None, str(exc)


@pytest.fixture(scope="session")
def sycl_device(request):
    """The filter string of the device under test (set as jitconv's current device)."""
    device, problem = _select(request.config)
    if device is None:
        if request.config.getoption("--require-device"):
            pytest.fail(f"SYCL device unavailable: {problem}", pytrace=False)
        pytest.skip(f"SYCL device unavailable: {problem}")
    return device


@pytest.fixture
def cpu_tensor_device(sycl_device):
    """The device under test, for tests whose tensors are torch CPU tensors: a SYCL device
    (zero-copy through DLPack) or the CUDA simulator. A CUDA GPU refuses CPU tensors: skip
    there (the drop-ins on a GPU: tests/test_device_plan.py, and vLLM's own test file
    through scripts/check_old_vllm_tests.py)."""
    from jitconv.backends.cuda import devices
    if devices.is_cuda_name(sycl_device) and not devices.simulating():
        pytest.skip(f"these tests hold torch CPU tensors; the device under test is the "
                    f"CUDA GPU {sycl_device}")
    return sycl_device


@pytest.fixture
def spirv_device(sycl_device):
    """The device under test, for tests of the SPIR-V kernels themselves (shipped or
    cached): a SYCL device. Skip where it is a CUDA device (a GPU, or the simulator)."""
    from jitconv.backends.cuda import devices
    if devices.is_cuda_name(sycl_device):
        pytest.skip(f"these tests run SPIR-V kernels; the device under test is {sycl_device}")
    return sycl_device


@pytest.fixture(scope="session")
def jitconv_wheel(tmp_path_factory):
    """jitconv's wheel, built from this tree (with the shipped kernels as package data),
    for the tests that install it into environments of their own."""
    out = tmp_path_factory.mktemp("wheel")
    root = Path(__file__).resolve().parents[1]
    # From a clean copy: an in-tree build/ left from an earlier build would put its stale
    # files (e.g. kernels of an older source) into the wheel.
    source = out / "source"
    shutil.copytree(root, source, ignore=shutil.ignore_patterns(
        ".git", ".venv*", ".vllm*", "build", "dist", "*.egg-info", "__pycache__",
        ".pytest_cache"))
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "--no-build-isolation", "--disable-pip-version-check", "-q", "-w",
                           str(out), str(source)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    (path,) = out.glob("jitconv-*.whl")
    return path


def pytest_collection_modifyitems(config, items):
    device, _ = _select(config)
    if device is not None and ":gpu" in device:
        return
    skip_gpu = pytest.mark.skip(reason=f"needs an Intel GPU; testing on {device}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


def pytest_report_header(config):
    device, problem = _select(config)
    return f"jitconv device: {device or 'unavailable (' + problem + ')'}"


def pytest_sessionfinish(session, exitstatus):
    """With JITCONV_RUN_REPORT=PATH, write what the session's jitconv did (which package
    was imported, kernels compiled or loaded, whether numba-dpex / dpctl.tensor were
    imported): tests/test_dpctl_only.py runs the kernel tests in other environments and
    checks this."""
    path = os.environ.get("JITCONV_RUN_REPORT")
    if not path:
        return
    import json
    import sys

    import jitconv
    from jitconv.backends.sycl.state import STATE as SYCL_STATE
    with open(path, "w") as f:
        json.dump({"jitconv_file": jitconv.__file__, "stats": SYCL_STATE.stats,
                   "numba_dpex": "numba_dpex" in sys.modules,
                   "dpctl_tensor": "dpctl.tensor" in sys.modules,
                   "sys_path": sys.path, "cwd": os.getcwd()}, f)
