"""pytest setup: device choice and the markers.

--sycl-device FILTER   run kernels on this dpctl device (default: $JITCONV_DEVICE, else
                       jitconv's default: first Level Zero GPU, else opencl:cpu).

A missing device skips the device tests with the reason shown, except in CI (CI=true) or
with --require-device, where it is an error: a run that skipped every kernel test must
not look green.
"""

import os
import tempfile

import pytest


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
