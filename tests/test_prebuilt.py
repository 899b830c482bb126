"""The kernels the package ships (jitconv/prebuilt/): SPIR-V for every supported width and
dtype, named by the current cache key. A change to the kernel source (or its ABI) without
regenerating them fails here, so the wheel never carries stale kernels."""

import hashlib
import json
import os
import subprocess
import sys

from jitconv.backends.sycl import kernel_cache
from jitconv.kernels.abi import CONV_ARGS

REGENERATE = "python -m jitconv build-kernels --ship"


def test_every_supported_kernel_is_shipped_for_the_current_source():
    present = sorted(p.name for p in kernel_cache.PREBUILT_DIR.iterdir()
                     if p.suffix in (".spv", ".json"))
    expected = kernel_cache.shipped_files()
    missing = sorted(set(expected) - set(present))
    stale = sorted(set(present) - set(expected))
    assert not missing and not stale, (
        f"jitconv/prebuilt/ does not match the kernel source: missing {missing}, stale "
        f"{stale}; run `{REGENERATE}` in the main environment and commit the result")


def test_shipped_entries_are_intact():
    for name in kernel_cache.shipped_files():
        if not name.endswith(".json"):
            continue
        meta = json.loads((kernel_cache.PREBUILT_DIR / name).read_text())
        spirv = (kernel_cache.PREBUILT_DIR / name).with_suffix(".spv").read_bytes()
        assert spirv[:4] == b"\x03\x02\x23\x07", f"{name}: not SPIR-V"
        assert hashlib.sha256(spirv).hexdigest() == meta["sha256"], name
        if "planner" in meta:  # a device planner (jitconv.device_plan)
            assert meta["abi"] == kernel_cache._planner_abi(tuple(meta["planner"])), name
        elif "rules" in meta:  # a device plan's rule planner
            assert meta["abi"] == kernel_cache._planner_abi(tuple(meta["rules"]),
                                                            "rules"), name
        elif "record_types" in meta:  # a fused kernel of device plans
            assert meta["abi"] == kernel_cache._abi(tuple(meta["record_types"])), name
        elif meta.get("stage"):  # a GDN stage kernel
            assert meta["abi"] == kernel_cache._abi(None, True), name
        else:
            assert meta["abi"] == [list(a) for a in CONV_ARGS], name
        assert meta["format"] == kernel_cache.FORMAT, name


# A child process with an empty user cache and the shipped kernels allowed.
CHILD = """
import json, sys, torch
import jitconv
from jitconv.backends.sycl.state import STATE as SYCL_STATE
x, w, st = torch.randn(3, 40), torch.randn(40, 4), torch.randn(3, 40, 3)
ref, _ = jitconv.reference.causal_conv1d_reference(
    x, w, None, st, non_spec_query_start_loc=[0, 1, 2, 3], non_spec_state_indices=[0, 1, 2])
out = jitconv.causal_conv1d_update(x, w, None, st, torch.arange(3, dtype=torch.int32))
print(json.dumps(dict(SYCL_STATE.stats, numba_dpex="numba_dpex" in sys.modules,
                      correct=bool(abs(out.double().numpy() - ref).max() < 1e-3))))
"""


def _child_env(tmp_path, device):
    env = dict(os.environ, JITCONV_CACHE_DIR=str(tmp_path), JITCONV_DEVICE=device)
    env.pop("JITCONV_NO_SHIPPED_KERNELS", None)
    return env


def test_shipped_kernels_run_without_compiling(spirv_device, tmp_path):
    env = _child_env(tmp_path, spirv_device)
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    stats = json.loads(done.stdout.strip().splitlines()[-1])
    assert stats["compiled"] == 0 and stats["cache_hits"] == 1 and stats["correct"]
    assert stats["numba_dpex"] is False
    # No kernel is written to the user cache: only the device check's verdict.
    assert [p.name for p in tmp_path.iterdir()] == ["checks"]
    assert len(list((tmp_path / "checks").glob("*.json"))) == 1
    info = subprocess.run([sys.executable, "-m", "jitconv", "info"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert info.returncode == 0, info.stderr[-3000:]
    assert "width 4 float32   exact shipped (" in info.stdout, info.stdout


def test_a_kernel_the_device_rejects_is_ignored_with_a_warning_and_rebuilt(
        spirv_device, tmp_path):
    """A user-cache entry with a valid checksum whose SPIR-V the device cannot build."""
    garbage = b"\x03\x02\x23\x07 but not a module" * 4
    kernel_cache.store(4, "float32", garbage, "no_such_kernel", directory=tmp_path)
    env = _child_env(tmp_path, spirv_device)
    env["JITCONV_NO_SHIPPED_KERNELS"] = "1"
    done = subprocess.run([sys.executable, "-W", "always", "-c", CHILD], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "RuntimeWarning: jitconv: ignoring the user cache kernel" in done.stderr
    assert "the device rejected it" in done.stderr
    stats = json.loads(done.stdout.strip().splitlines()[-1])
    assert stats["compiled"] == 1 and stats["correct"]
