"""jitconv without numba-dpex, installed from its wheel: two more virtual environments with
the SYCL runtimes torch XPU uses, which numba-dpex 0.23 cannot share a process with.

- dpctl 0.21.1 + the 2025.3 runtime (torch XPU 2.10 - 2.12), requirements-dpctl-only.txt:
  kernels from a user cache (JITCONV_CACHE_DIR), shipped ones off: copies of the shipped
  entries, some of them built again in the main environment in this run.
- dpctl 0.22.1 + the 2026.2 runtime (torch XPU 2.13+; no dpctl.tensor there),
  requirements-dpctl-0.22.txt: only the kernels the wheel ships (empty user cache).

Each environment gets jitconv from a wheel built from this tree (non-editable) and runs,
from a directory outside the tree (cwd and sys.path do not contain the repo): a plain
`import jitconv` with no runtime variables set, `python -m jitconv info`, the missing-kernel
error, and the kernel test files themselves (mixed grid, validation, vLLM drop-ins,
causal_conv1d_fn, DLPack) copied out of the tree; the session report must show that
jitconv came from the venv's site-packages, that no kernel was compiled and that neither
numba-dpex nor dpctl.tensor was imported.

Environments are created once at .venv-dpctl-* and reused while their requirements file
is unchanged. JITCONV_SKIP_DPCTL_ONLY=1 skips (reported as a skip, never as a pass).
"""

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from jitconv.backends.sycl import kernel_cache

from helpers import RUNTIME_VARS, ensure_venv, run_checked as _run

ROOT = Path(__file__).resolve().parents[1]
ENVIRONMENTS = {  # name: (requirements file, venv, dpctl version, kernels)
    "dpctl-0.21.1": ("requirements-dpctl-only.txt", ".venv-dpctl-only", "0.21.1",
                     "built now"),
    "dpctl-0.22.1": ("requirements-dpctl-0.22.txt", ".venv-dpctl-0.22", "0.22.1",
                     "shipped"),
}
TEST_FILES = ("test_mixed.py", "test_validation.py", "test_vllm.py",
              "test_causal_conv1d_fn.py", "test_dlpack.py", "test_plan.py",
              "test_run_cache.py", "test_plan_cache.py", "test_device_check.py",
              "test_golden_kernels.py", "test_device_plan.py", "test_gdn_stage.py")
SUPPORT_FILES = ("conftest.py", "helpers.py")
# Needs dpctl.tensor to make an array on another queue: not available with dpctl 0.22.
DESELECT = "test_validation.py::test_bad_input_raises_and_leaves_state[different devices]"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def kernels_built_now(sycl_device, tmp_path_factory):
    """A user cache holding every kernel of this tree: the entries the package ships (their
    keys are this tree's: test_prebuilt), then width 4's float32 kernels (plain and fused)
    and the planners compiled now by ``build-kernels`` in the main environment, replacing
    their copies. Compiling every width here took over 20 minutes on a 2-core AMD EPYC
    (family 23) and ran out of CI's time; this keeps a freshly built entry of each kind."""
    out = tmp_path_factory.mktemp("spirv")
    for entry in kernel_cache.PREBUILT_DIR.iterdir():
        if entry.suffix in (".spv", ".json"):
            shutil.copy(entry, out / entry.name)
    printed = _run([sys.executable, "-m", "jitconv", "--device", sycl_device, "build-kernels",
                    "--dir", str(out), "--widths", "4", "--dtypes", "float32"], cwd=ROOT,
                   timeout=1200)
    built = [line for line in printed.splitlines() if str(out) not in line and ".spv" in line]
    assert any(" fused " in line for line in built) and \
        any(line.strip().startswith("planner") for line in built), printed
    return out


@pytest.fixture(params=sorted(ENVIRONMENTS))
def environment(request, sycl_device, jitconv_wheel, tmp_path):
    if os.environ.get("JITCONV_SKIP_DPCTL_ONLY") == "1":
        pytest.skip("JITCONV_SKIP_DPCTL_ONLY=1")
    requirements, venv, dpctl_version, kernels = ENVIRONMENTS[request.param]
    py = ensure_venv(ROOT / venv, [["install", "-r", str(ROOT / requirements), "pytest"]],
                     key=(ROOT / requirements).read_text())
    # With its dependencies: dpctl, numpy and torch are there, so pip must keep them (it
    # would replace dpctl and the runtime if the wheel still required the compile stack).
    _run([str(py), "-m", "pip", "install", "--disable-pip-version-check", "-q",
          "--force-reinstall", "--no-index", "--no-deps", str(jitconv_wheel)], timeout=600)
    _run([str(py), "-m", "pip", "install", "--disable-pip-version-check", "-q",
          str(jitconv_wheel)], timeout=600)
    frozen = _run([str(py), "-m", "pip", "freeze"])
    assert f"dpctl=={dpctl_version}" in frozen and "numba" not in frozen, frozen
    env = {k: v for k, v in os.environ.items() if k not in RUNTIME_VARS}
    cache = tmp_path / "user-cache"
    cache.mkdir()
    if kernels == "built now":
        env.update(JITCONV_CACHE_DIR=str(request.getfixturevalue("kernels_built_now")),
                   JITCONV_NO_SHIPPED_KERNELS="1")
    else:
        env.update(JITCONV_CACHE_DIR=str(cache), JITCONV_NO_SHIPPED_KERNELS="0")
    work = tmp_path / "outside-the-tree"
    work.mkdir()
    return dict(py=py, venv=ROOT / venv, dpctl=dpctl_version, kernels=kernels, env=env,
                cache=cache, work=work, device=sycl_device)


def test_installed_wheel_runs_the_kernel_tests_without_numba_dpex(environment):
    e = environment
    py, env, work = e["py"], e["env"], e["work"]
    site = _run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                env=env, cwd=work).strip()

    # A plain import, no runtime variables at all: the bootstrap finds the runtime.
    bare = {k: v for k, v in env.items() if not k.startswith("JITCONV_")}
    line = _run([str(py), "-c",
                 "import importlib.util as u, sys, dpctl, jitconv; print(jitconv.__file__, "
                 "dpctl.__version__, u.find_spec('numba_dpex') is None, "
                 "'dpctl.tensor' in sys.modules, jitconv.devices())"],
                env=bare, cwd=work).strip()
    jitconv_file, dpctl_version, no_numba_dpex, dpctl_tensor, devices = line.split(" ", 4)
    assert jitconv_file.startswith(site + "/jitconv/"), line
    assert (dpctl_version, no_numba_dpex, dpctl_tensor) == (e["dpctl"], "True", "False")
    assert "opencl:cpu" in devices, line

    info = _run([str(py), "-m", "jitconv", "info"], env=env, cwd=work)
    where = "user cache" if e["kernels"] == "built now" else "shipped"
    # 7 widths x 3 dtypes, the 16-bit wide kernels, both maths; the fused kernels of
    # device plans (width 4: 5 kernels x 4 sets of metadata types)
    assert info.count(f" {where} (") == 70 + 20, info
    assert "MISSING" not in info and "compiled on first use (" not in info, info

    # Kernel tests, copied out of the tree so that only the installed package is found.
    tests = work / "tests"
    tests.mkdir()
    for name in TEST_FILES + SUPPORT_FILES:
        shutil.copy(ROOT / "tests" / name, tests / name)
    shutil.copytree(ROOT / "tests" / "golden", tests / "golden")  # test_golden_kernels'
    report = work / "report.json"
    run_env = dict(env, JITCONV_RUN_REPORT=str(report), CI="true")
    out = _run([str(py), "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir",
                str(work), "--sycl-device", e["device"], "--deselect",
                f"tests/{DESELECT}", str(tests)], env=run_env, cwd=work, timeout=1800)
    summary = out.strip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary and "error" not in summary, out
    assert "1 deselected" in summary, f"{DESELECT} was renamed? {summary}"
    got = json.loads(report.read_text())
    assert got["jitconv_file"].startswith(site + "/jitconv/"), got
    on_path = {Path(p).resolve() for p in got["sys_path"] if p}
    assert not on_path & {ROOT, ROOT / "tests"}, got["sys_path"]  # the venv may be under ROOT
    assert got["stats"]["compiled"] == 0 and got["stats"]["cache_hits"] > 0, got
    assert got["numba_dpex"] is False and got["dpctl_tensor"] is False, got
    # The device check ran in this runtime and passed every kernel the tests launched;
    # the verdicts are all that was written (no kernel compiled or stored).
    cache = Path(env["JITCONV_CACHE_DIR"])
    verdicts = [json.loads(p.read_text()) for p in (cache / "checks").glob("*.json")]
    mine = [v for v in verdicts if v["device"]["runtime"]["dpctl"] == e["dpctl"]]
    assert len(mine) >= 4 and all(v["passed"] for v in mine), verdicts
    if e["kernels"] == "shipped":
        assert [p.name for p in cache.iterdir()] == ["checks"], list(cache.iterdir())


MISSING = """
import torch, jitconv
from jitconv.backends.sycl.launching import KernelUnavailableError
try:
    jitconv.causal_conv1d_update(torch.randn(2, 8), torch.randn(8, 3), None,
                                 torch.randn(2, 8, 2), torch.arange(2, dtype=torch.int32))
except KernelUnavailableError as exc:
    print(exc)
"""


def test_missing_kernel_says_what_where_and_how(environment):
    e = environment
    env = dict(e["env"], JITCONV_CACHE_DIR=str(e["cache"]), JITCONV_NO_SHIPPED_KERNELS="1")
    message = _run([str(e["py"]), "-c", MISSING], env=env, cwd=e["work"])
    assert "width=3, dtype=float32" in message, message
    assert str(e["cache"]) in message, message
    assert "python -m jitconv build-kernels" in message, message
