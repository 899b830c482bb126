"""The persistent SPIR-V cache: warm processes compile nothing and never import
numba-dpex; corrupt or stale entries are detected and rebuilt, never trusted."""

import hashlib
import json
import os
import subprocess
import sys

import pytest

from jitconv import kernel_cache

# A child process: one update call, then what the launcher did, as JSON.
CHILD = """
import json, sys, time, torch
import jitconv
from jitconv import kernel_cache, launching
x, w, st = torch.randn(3, 40), torch.randn(40, 4), torch.randn(3, 40, 3)
ref, ref_state = jitconv.reference.causal_conv1d_reference(
    x, w, None, st, non_spec_query_start_loc=[0, 1, 2, 3], non_spec_state_indices=[0, 1, 2])
t0 = time.perf_counter()
out = jitconv.causal_conv1d_update(x, w, None, st, torch.arange(3, dtype=torch.int32))
first_call = time.perf_counter() - t0
print(json.dumps(dict(launching.stats, first_call=first_call,
                      numba_dpex="numba_dpex" in sys.modules,
                      correct=bool(abs(out.double().numpy() - ref).max() < 1e-3),
                      rejected=[r for _, r in kernel_cache.rejected])))
"""


def run_child(cache_dir, device):
    env = dict(os.environ, JITCONV_CACHE_DIR=str(cache_dir), JITCONV_DEVICE=device)
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_second_process_starts_warm(sycl_device, tmp_path):
    cold = run_child(tmp_path, sycl_device)
    assert cold["compiled"] == 1 and cold["cache_hits"] == 0 and cold["correct"]
    warm = run_child(tmp_path, sycl_device)
    assert warm["compiled"] == 0 and warm["cache_hits"] == 1 and warm["correct"]
    assert warm["numba_dpex"] is False, "a warm process must not import numba-dpex"


def _entry(tmp_path):
    (meta,) = tmp_path.glob("conv_w4_float32_*.json")
    return meta, meta.with_suffix(".spv")


def test_corrupt_spirv_is_rebuilt(sycl_device, tmp_path):
    run_child(tmp_path, sycl_device)
    meta, spv = _entry(tmp_path)
    spv.write_bytes(spv.read_bytes()[:-64] + b"\0" * 64)  # checksum no longer matches
    again = run_child(tmp_path, sycl_device)
    assert again["compiled"] == 1 and again["correct"]
    assert any("checksum" in r for r in again["rejected"])
    assert run_child(tmp_path, sycl_device)["compiled"] == 0, "the rebuilt entry is stored"


def test_garbage_with_a_valid_checksum_fails_to_build_and_is_rebuilt(sycl_device, tmp_path):
    run_child(tmp_path, sycl_device)
    meta, spv = _entry(tmp_path)
    garbage = b"not SPIR-V at all" * 10
    spv.write_bytes(garbage)
    data = json.loads(meta.read_text())
    data["sha256"] = hashlib.sha256(garbage).hexdigest()
    meta.write_text(json.dumps(data))
    again = run_child(tmp_path, sycl_device)
    assert again["compiled"] == 1 and again["correct"]
    assert any("build failed" in r for r in again["rejected"])


@pytest.mark.parametrize("field,value,reason", [
    ("numba-dpex", "0.0.1", "built by numba-dpex 0.0.1"),
    ("abi", [["x", 1, "raw", "C"]], "argument layout differs"),
    ("format", 999, "format"),
])
def test_stale_metadata_is_rejected(tmp_path, monkeypatch, field, value, reason):
    monkeypatch.setenv("JITCONV_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(kernel_cache, "rejected", [])
    kernel_cache.store(4, "float32", b"spirv-bytes", "kernel_name")
    assert kernel_cache.load(4, "float32")[:2] == (b"spirv-bytes", "kernel_name")
    meta, _ = _entry(tmp_path)
    data = json.loads(meta.read_text())
    data[field] = value
    meta.write_text(json.dumps(data))
    assert kernel_cache.load(4, "float32") is None
    assert reason in kernel_cache.rejected[-1][1]


def test_unreadable_metadata_is_rejected(tmp_path, monkeypatch):
    monkeypatch.setenv("JITCONV_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(kernel_cache, "rejected", [])
    kernel_cache.store(4, "float32", b"spirv-bytes", "kernel_name")
    meta, _ = _entry(tmp_path)
    meta.write_text("{ not json")
    assert kernel_cache.load(4, "float32") is None
    assert "unreadable" in kernel_cache.rejected[-1][1]


def test_key_changes_with_what_changes_the_code():
    keys = {kernel_cache.key(w, d) for w in (2, 3, 4) for d in ("float32", "bfloat16")}
    assert len(keys) == 6
    assert kernel_cache.key(4, "float32") == kernel_cache.key(4, "float32")
