"""The kernel visible: the generated source of a few default kernels, kept in
tests/golden/, so that a change of the template or of a backend's code generation shows
here as a kernel diff (review it, then regenerate the file with the command in the
failure message). The source is generated without numba: these tests need no device."""

import difflib
from pathlib import Path

import pytest

from jitconv.__main__ import kernel_text

GOLDEN = Path(__file__).resolve().parent / "golden"
KERNELS = {  # file -> (backend, width, dtype, wide, kind, chains, stage)
    "sycl-w4-bfloat16.py": ("sycl", 4, "bfloat16", False, "general", False, False),
    "sycl-w4-bfloat16-wide.py": ("sycl", 4, "bfloat16", True, "general", False, False),
    "sycl-w4-float32.py": ("sycl", 4, "float32", False, "general", False, False),
    "sycl-w4-bfloat16-wide-chains.py": ("sycl", 4, "bfloat16", True, "general", True, False),
    "sycl-w4-bfloat16-wide-stage.py": ("sycl", 4, "bfloat16", True, "general", False, True),
    "cuda-w4-bfloat16-general.py": ("cuda", 4, "bfloat16", False, "general", False, False),
    "cuda-w4-bfloat16-decode.py": ("cuda", 4, "bfloat16", False, "decode", False, False),
    "cuda-w4-float32-spec.py": ("cuda", 4, "float32", False, "spec", False, False),
    "cuda-w4-bfloat16-chains.py": ("cuda", 4, "bfloat16", False, "general", True, False),
    "cuda-w4-bfloat16-stage.py": ("cuda", 4, "bfloat16", False, "general", False, True),
}


def _command(name):
    backend, width, dtype, wide, kind, chains, stage = KERNELS[name]
    flags = " --wide" if wide else "" if backend == "sycl" else f" --kind {kind}"
    flags += " --chains" if chains else ""
    flags += " --stage" if stage else ""
    return (f"python -m jitconv show-kernel {backend} --width {width} --dtype {dtype}"
            f"{flags} > tests/golden/{name}")


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_generated_kernel_matches_its_golden_copy(name):
    backend, width, dtype, wide, kind, chains, stage = KERNELS[name]
    got = kernel_text(backend, width, dtype, wide, kind, chains=chains, stage=stage)
    want = (GOLDEN / name).read_text()
    if got != want:
        diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True),
                                            f"golden/{name}", "generated", n=2))
        pytest.fail(f"the generated kernel differs from tests/golden/{name}; if the change "
                    f"is intended, regenerate it: {_command(name)}\n{diff[:6000]}")


def test_every_golden_file_is_checked():
    assert sorted(p.name for p in GOLDEN.iterdir()) == sorted(KERNELS)
