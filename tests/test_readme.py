"""The README's usage examples run as written (blocks that need a vLLM layer, which
mention `self.`, are documentation only and skipped)."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_examples_run(sycl_device):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    runnable = [b for b in blocks if "self." not in b]
    assert len(runnable) >= 4, "the README lost its examples"
    namespace = {}
    try:
        for block in runnable:
            exec(compile(block, str(README), "exec"), namespace)
    finally:
        import jitconv
        jitconv.set_device(sycl_device)  # the example picks opencl:cpu
    # The mixed-step example updated the state it allocated.
    assert namespace["state"].abs().sum() > 0
