"""Device selection, and imports that work in a plain venv (no LD_LIBRARY_PATH etc.)."""

import os
import subprocess
import sys

import pytest
import torch

import jitconv

_RUNTIME_VARS = ("LD_LIBRARY_PATH", "OCL_ICD_FILENAMES", "ONEAPI_DEVICE_SELECTOR",
                 "JITCONV_DEVICE", "JITCONV_NO_BOOTSTRAP")


def run_python(code, **env_overrides):
    """Run code in a new interpreter of this venv, with the runtime variables cleared."""
    env = {k: v for k, v in os.environ.items() if k not in _RUNTIME_VARS}
    env.update(env_overrides)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def test_plain_venv_import_lists_opencl_cpu():
    line = run_python("import jitconv, numba_dpex, dpnp, dpctl; print(jitconv.devices())")
    assert "opencl:cpu" in line


def test_user_variables_are_respected():
    # A user's OCL_ICD_FILENAMES wins over ours: pointing it nowhere hides the CPU device.
    line = run_python("import jitconv; print(jitconv.devices())",
                      OCL_ICD_FILENAMES="/nonexistent/libOpenCL-driver.so")
    assert "opencl:cpu" not in line
    line = run_python("import jitconv; print(jitconv.get_device())",
                      JITCONV_DEVICE="opencl:cpu")
    assert line.startswith("opencl:cpu")


def test_torch_blas_unaffected_by_runtime_bootstrap():
    """The oneAPI libraries we preload must not replace torch's BLAS symbols (a global
    ILP64 dgemm_ once corrupted torch matmuls in the same process)."""
    code = ("import torch, sys\n"
            "g = torch.Generator().manual_seed(0)\n"
            "a = torch.randn(64, 48, dtype=torch.float64, generator=g)\n"
            "b = torch.randn(48, 32, dtype=torch.float64, generator=g)\n"
            "before = a @ b\n"
            "import jitconv, dpnp, numba_dpex\n"
            "after = a @ b\n"
            "exact = (a.unsqueeze(2) * b.unsqueeze(0)).sum(1)\n"
            "print(torch.equal(before, after), bool(torch.allclose(after, exact)))\n")
    assert run_python(code) == "True True"


def test_devices_and_selection(sycl_device):
    names = jitconv.devices()
    assert sycl_device in names
    assert all(isinstance(n, str) and n.count(":") == 2 for n in names)
    assert jitconv.set_device(sycl_device.rsplit(":", 1)[0]) == sycl_device
    assert jitconv.get_device() == sycl_device
    assert jitconv.get_queue() is jitconv.get_queue(), "one cached queue per device"


def test_unknown_device_lists_what_exists(sycl_device):
    with pytest.raises(jitconv.DeviceNotFoundError, match="available: \\["):
        jitconv.set_device("level_zero:gpu:7")
    with pytest.raises(jitconv.DeviceNotFoundError):
        jitconv.set_device("")
    assert jitconv.get_device() == sycl_device  # a failed set changes nothing


def test_bad_device_in_environment_is_an_error():
    code = ("import jitconv\n"
            "try:\n    jitconv.get_device()\nexcept jitconv.DeviceNotFoundError as e:\n"
            "    print('raised', 'available' in str(e))\n")
    assert run_python(code, JITCONV_DEVICE="level_zero:gpu:9") == "raised True"


def test_empty_and_zeros_are_usm_torch_tensors(sycl_device):
    from jitconv.backends.sycl import bridge
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int32):
        t = jitconv.zeros((3, 5), dtype)
        assert isinstance(t, torch.Tensor) and t.device.type == "cpu"
        assert t.dtype == dtype and t.shape == (3, 5) and t.is_contiguous()
        assert torch.count_nonzero(t) == 0
        assert bridge.is_usm(t.data_ptr())
        assert bridge.is_usm(t[1:].data_ptr()), "views of USM tensors are USM too"
    assert not bridge.is_usm(torch.zeros(4).data_ptr())


@pytest.mark.gpu
def test_torch_xpu_tensors_are_zero_copy(sycl_device):
    """On an Intel GPU with torch XPU: DLPack import is zero-copy (bf16 as int16)."""
    from jitconv.backends.sycl import bridge
    if not (hasattr(torch, "xpu") and torch.xpu.is_available()):
        pytest.skip("torch has no XPU device here")
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        t = torch.randn(8, 16, device="xpu").to(dtype)
        view, write_back = bridge.to_device(t, "x")
        assert view.address == t.data_ptr() and write_back is None


def test_import_preloads_only_what_dpctl_needs():
    """oneMKL (dpnp's and numba-dpex's closure) is loaded only when dpnp is imported, and
    then dpnp works in a plain venv."""
    code = ("import sys\n"
            "def mkl():\n"
            "    return sorted({l.split('/')[-1].strip() for l in open('/proc/self/maps')\n"
            "                   if 'libmkl' in l})\n"
            "import jitconv\n"
            "from jitconv.backends.sycl import bootstrap\n"
            "jitconv.devices()\n"
            "before = mkl(), [n for n in bootstrap.RUNTIME.preloaded if 'mkl' in n]\n"
            "import dpnp\n"
            "dpnp.arange(3, device=jitconv.get_queue())\n"
            "print(before == ([], []), len(mkl()) > 0, 'numba_dpex' in sys.modules)\n")
    assert run_python(code) == "True True False"


def test_runtime_found_from_distribution_records():
    from jitconv.backends.sycl import bootstrap
    libs = bootstrap.runtime_libraries()
    sycl = [name for name in libs if name.startswith("libsycl.so.")]
    assert sycl and all(libs[n].exists() for n in sycl)
    assert bootstrap.runtime_lib_dir() == libs[sycl[0]].parent
    assert "libintelocl.so" in libs  # intel-opencl-rt: the opencl:cpu ICD


def test_no_device_because_dpctl_came_first_is_explained():
    from jitconv.backends.sycl import bootstrap
    lib = str(bootstrap.runtime_lib_dir())
    code = ("import dpctl\n"
            "dpctl.get_devices()\n"
            "import jitconv\n"
            "try:\n    jitconv.get_device()\nexcept jitconv.DeviceNotFoundError as e:\n"
            "    print('dpctl was imported before jitconv' in str(e))\n")
    assert run_python(code, LD_LIBRARY_PATH=lib) == "True"
