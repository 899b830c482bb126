"""The persistent SPIR-V cache: warm processes compile nothing and never import
numba-dpex; corrupt or stale entries are detected and rebuilt, never trusted."""

import ast
import hashlib
import json
import shutil
import os
import subprocess
import sys

import pytest

from jitconv.backends.sycl import kernel_cache
from jitconv.backends.sycl.state import STATE as SYCL_STATE

# A child process: one update call, then what the launcher did, as JSON.
CHILD = """
import json, sys, time, torch
import jitconv
from jitconv.backends.sycl import kernel_cache
from jitconv.backends.sycl.state import STATE as SYCL_STATE
x, w, st = torch.randn(3, 40), torch.randn(40, 4), torch.randn(3, 40, 3)
ref, ref_state = jitconv.reference.causal_conv1d_reference(
    x, w, None, st, non_spec_query_start_loc=[0, 1, 2, 3], non_spec_state_indices=[0, 1, 2])
t0 = time.perf_counter()
out = jitconv.causal_conv1d_update(x, w, None, st, torch.arange(3, dtype=torch.int32))
first_call = time.perf_counter() - t0
rtol, atol = jitconv.reference.TOLERANCE["float32"]
close = bool((abs(out.double().numpy() - ref) <= atol + rtol * abs(ref)).all())
print(json.dumps(dict(SYCL_STATE.stats, first_call=first_call,
                      numba_dpex="numba_dpex" in sys.modules,
                      correct=close and torch.equal(st, torch.from_numpy(ref_state).float()),
                      rejected=[r for _, r in SYCL_STATE.rejected])))
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
    monkeypatch.setattr(SYCL_STATE, "rejected", [])
    kernel_cache.store(4, "float32", b"spirv-bytes", "kernel_name")
    assert kernel_cache.load(4, "float32")[:2] == (b"spirv-bytes", "kernel_name")
    meta, _ = _entry(tmp_path)
    data = json.loads(meta.read_text())
    data[field] = value
    meta.write_text(json.dumps(data))
    assert kernel_cache.load(4, "float32") is None
    assert reason in SYCL_STATE.rejected[-1][1]


def test_unreadable_metadata_is_rejected(tmp_path, monkeypatch):
    monkeypatch.setenv("JITCONV_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(SYCL_STATE, "rejected", [])
    kernel_cache.store(4, "float32", b"spirv-bytes", "kernel_name")
    meta, _ = _entry(tmp_path)
    meta.write_text("{ not json")
    assert kernel_cache.load(4, "float32") is None
    assert "unreadable" in SYCL_STATE.rejected[-1][1]


def _store_old_entry(tmp_path, monkeypatch):
    monkeypatch.setenv("JITCONV_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(SYCL_STATE, "rejected", [])
    kernel_cache.store(4, "float32", b"old-spirv", "old_kernel")
    assert kernel_cache.load(4, "float32")[:2] == (b"old-spirv", "old_kernel")
    return kernel_cache.key(4, "float32")


def _edit_kernel_source(monkeypatch):
    """The generated kernel source changes (as an edit of the template would make it)."""
    from jitconv.backends.sycl import source
    template = source._template_source
    monkeypatch.setattr(source, "_template_source", lambda *a, **k: template(*a, **k).replace(
        "acc_0 = bias_c_0" if "acc_0 = bias_c_0" in template(*a, **k) else "acc = bias_c",
        "acc = F32_ZERO + bias_c", 1) + "\n")


def _copy_codegen(tmp_path, monkeypatch, edit):
    """A copy of the codegen modules with ``edit`` applied to the SYCL one's text."""
    src = tmp_path / "src"
    for name in kernel_cache.CODEGEN_FILES:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text((kernel_cache._PACKAGE_DIR / name).read_text())
    path = src / kernel_cache.CODEGEN_FILES[0]
    path.write_text(edit(path.read_text()))
    monkeypatch.setattr(kernel_cache, "_PACKAGE_DIR", src)
    kernel_cache._code_fingerprint.cache_clear()
    monkeypatch.setattr(kernel_cache, "_code_fingerprint", kernel_cache._code_fingerprint)


@pytest.fixture(autouse=True)
def _fresh_fingerprint():
    kernel_cache._code_fingerprint.cache_clear()
    yield
    kernel_cache._code_fingerprint.cache_clear()


def test_code_text_is_the_same_under_every_python():
    """The code's text in the key (``kernel_cache._tree_text``) leaves out empty fields,
    so a field that a later Python adds to every node of a kind, empty (3.12's
    ``type_params`` on functions), changes no key: the shipped kernels are found under
    every Python, not only the one that built them. Changed code changes the text."""
    source = "def f(a, *, b=1):\n    return [a, b]\n"
    tree = ast.parse(source)
    before = kernel_cache._tree_text(tree)
    fields = tuple(f for f in ast.FunctionDef._fields if f != "type_params")
    newer = type("FunctionDef", (ast.FunctionDef,), {"_fields": fields + ("type_params",)})
    old = tree.body[0]
    tree.body[0] = newer(**{f: getattr(old, f, None) for f in fields}, type_params=[])
    assert kernel_cache._tree_text(tree) == before
    assert kernel_cache._tree_text(ast.parse(source.replace("b=1", "b=2"))) != before


@pytest.mark.parametrize("change", ["kernel source", "codegen code", "ABI", "jitconv version"])
def test_key_changes_with_what_changes_the_code(tmp_path, monkeypatch, change):
    """Each input of the generated code gives a new key, and an entry stored under the old
    key is never loaded for the new code."""
    old_key = _store_old_entry(tmp_path, monkeypatch)
    if change == "kernel source":
        _edit_kernel_source(monkeypatch)
    elif change == "codegen code":
        _copy_codegen(tmp_path, monkeypatch,
                      lambda text: text.replace("def _element(array, index):\n    return array[index]",
                                                "def _element(array, index):\n    return array[index + 0]"))
    elif change == "ABI":
        monkeypatch.setattr(kernel_cache, "CONV_ARGS",
                            kernel_cache.CONV_ARGS + (("extra", 0, "int64", None),))
    else:
        monkeypatch.setattr(kernel_cache, "__version__", kernel_cache.__version__ + ".post1")
    assert kernel_cache.key(4, "float32") != old_key
    assert kernel_cache.load(4, "float32") is None


def test_comments_and_docstrings_do_not_change_the_key(tmp_path, monkeypatch):
    """Editing what is not code (a comment, a docstring) of the codegen rebuilds nothing."""
    old_key = kernel_cache.key(4, "float32")
    _copy_codegen(tmp_path, monkeypatch, lambda text: text.replace(
        '"""', '"""Edited. ', 1).replace("\n\n\n", "\n\n\n# a new comment\n", 1))
    assert kernel_cache.key(4, "float32") == old_key


def test_key_separates_widths_and_dtypes():
    keys = {kernel_cache.key(w, d) for w in (2, 3, 4) for d in ("float32", "bfloat16")}
    assert len(keys) == 6


@pytest.mark.parametrize("tool", ["numba-dpex", "numba"])
def test_entry_from_another_compiler_version_is_not_used(tmp_path, monkeypatch, tool):
    """The compiler's version is in the entry, not in the key (an environment without
    numba-dpex must find shipped entries): where another version is installed, the entry
    is rejected, and the one stored after recompiling is used."""
    old_key = _store_old_entry(tmp_path, monkeypatch)
    newer = dict(kernel_cache.compiler_versions(), **{tool: "99.0"})
    monkeypatch.setattr(kernel_cache, "compiler_versions", lambda: newer)
    assert kernel_cache.key(4, "float32") == old_key
    assert kernel_cache.load(4, "float32") is None
    assert f"built by {tool}" in SYCL_STATE.rejected[-1][1]
    kernel_cache.store(4, "float32", b"new-spirv", "new_kernel")
    assert kernel_cache.load(4, "float32")[:2] == (b"new-spirv", "new_kernel")


def test_numba_without_numba_dpex_does_not_reject_entries(tmp_path, monkeypatch):
    """An environment with numba but no numba-dpex (vLLM's, for one) cannot compile, so
    the numba version must not reject the entries it can use (the shipped ones)."""
    old_key = _store_old_entry(tmp_path, monkeypatch)
    monkeypatch.setattr(kernel_cache, "compiler_versions",
                        lambda: {"numba-dpex": None, "numba": "99.0"})
    assert kernel_cache.key(4, "float32") == old_key
    assert kernel_cache.load(4, "float32") is not None


def test_unwritable_cache_compiles_once_and_warns_once(sycl_device, tmp_path):
    """A cache directory that cannot be created: each specialization is compiled once
    (not twice), the results are right, and one warning names the directory and
    JITCONV_CACHE_DIR."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    child = CHILD.replace("print(json.dumps(", "x2, w2 = x[:, :8].contiguous(), "
                          "torch.randn(8, 3)\njitconv.causal_conv1d_update(x2, w2, None, "
                          "torch.randn(3, 8, 2), torch.arange(3, dtype=torch.int32))\n"
                          "print(json.dumps(")
    env = dict(os.environ, JITCONV_CACHE_DIR=str(blocker / "cache"),
               JITCONV_DEVICE=sycl_device, PYTHONWARNINGS="default")
    done = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["correct"]
    assert result["compiled"] == 2, "two specializations (widths 4 and 3), each compiled once"
    warnings = [line for line in done.stderr.splitlines() if "RuntimeWarning" in line]
    assert len(warnings) == 1, done.stderr
    assert str(blocker / "cache") in warnings[0] and "JITCONV_CACHE_DIR" in warnings[0]


def test_a_rejected_entry_does_not_hide_a_good_one_further_on(tmp_path, monkeypatch):
    """An entry rejected for its compiler version in the user cache: the same key is
    still looked up in the next place (the shipped kernels), and found there."""
    first, second = tmp_path / "cache", tmp_path / "shipped"
    monkeypatch.setenv("JITCONV_CACHE_DIR", str(first))
    monkeypatch.setattr(SYCL_STATE, "rejected", [])
    kernel_cache.store(4, "float32", b"spirv-bytes", "kernel_name")
    shutil.copytree(first, second)
    meta, _ = _entry(first)
    data = json.loads(meta.read_text())
    data["numba-dpex"] = "0.0.1"
    meta.write_text(json.dumps(data))
    monkeypatch.setattr(kernel_cache, "search_dirs", lambda: [first, second])
    found = kernel_cache.load(4, "float32")
    assert "built by numba-dpex 0.0.1" in SYCL_STATE.rejected[-1][1]
    assert found is not None and found[2].parent == second
