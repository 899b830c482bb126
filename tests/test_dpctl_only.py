"""jitconv without numba-dpex: a second virtual environment with a modern dpctl (0.21.1)
and the 2025.3 SYCL runtime wheels (the runtime torch XPU uses, which numba-dpex 0.23
cannot share) runs a mixed step from SPIR-V built here, and matches the reference.

The environment is created once at .venv-dpctl-only (from requirements-dpctl-only.txt) and
reused while that file is unchanged. Set JITCONV_SKIP_DPCTL_ONLY=1 to skip (reported as a
skip, never as a pass); CI runs it.
"""

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REQUIREMENTS = ROOT / "requirements-dpctl-only.txt"
VENV = ROOT / ".venv-dpctl-only"
PY = VENV / "bin" / "python"
WIDTHS, DTYPES = "2,4,5", "float32,float16,bfloat16"


def _run(cmd, **kwargs):
    done = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    assert done.returncode == 0, f"{cmd}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done.stdout


def _ensure_venv():
    stamp = VENV / ".requirements-sha256"
    want = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()
    if PY.exists() and stamp.exists() and stamp.read_text() == want:
        return
    _run([sys.executable, "-m", "venv", "--clear", str(VENV)])
    _run([str(PY), "-m", "pip", "install", "--disable-pip-version-check", "-q", "-r",
          str(REQUIREMENTS)], timeout=1800)
    stamp.write_text(want)


@pytest.mark.slow
def test_prebuilt_spirv_runs_with_modern_dpctl_and_no_numba_dpex(sycl_device, tmp_path):
    if os.environ.get("JITCONV_SKIP_DPCTL_ONLY") == "1":
        pytest.skip("JITCONV_SKIP_DPCTL_ONLY=1")
    kernels = tmp_path / "spirv"
    _run([sys.executable, "-m", "jitconv", "--device", sycl_device, "build-kernels",
          "--dir", str(kernels), "--widths", WIDTHS, "--dtypes", DTYPES], cwd=ROOT)
    _ensure_venv()
    env = {k: v for k, v in os.environ.items()
           if k not in ("LD_LIBRARY_PATH", "OCL_ICD_FILENAMES", "PYTHONPATH")}
    env.update(JITCONV_CACHE_DIR=str(kernels), PYTHONPATH=str(ROOT))
    versions = _run([str(PY), "-c", "import importlib.util as u, dpctl; "
                     "print(dpctl.__version__, u.find_spec('numba_dpex') is None)"], env=env)
    assert versions.split() == ["0.21.1", "True"], versions
    out = _run([str(PY), "-m", "jitconv", "--device", sycl_device, "check",
                "--widths", WIDTHS, "--dtypes", DTYPES, "--require-prebuilt"],
               env=env, cwd=tmp_path)
    assert "check: OK" in out, out
    assert "numba-dpex imported: False" in out, out
