"""By hand, not collected by pytest: vLLM's own conv-op test file of the pad_slot_id
convention (vLLM up to 0.19) against jitconv, through the plugin's replacements.

vLLM's file (``tests/kernels/mamba/test_causal_conv1d.py`` before the null-block change,
e.g. at vLLM commit 05fe798) is not part of jitconv: save it somewhere outside the
repository's tracked files (``.vllm/`` is ignored) and pass its path. It imports vLLM's
ops module, ``PAD_SLOT_ID`` and ``current_platform``, and runs on "cuda" tensors, so this
needs a CUDA GPU with numba-cuda, torch and pytest (einops if present; else the one
``rearrange`` pattern the file uses is provided).

    PYTHONPATH=$PWD python3 scripts/check_old_vllm_tests.py .vllm/old/test_causal_conv1d.py

What it does: writes a minimal ``vllm`` package (ops with the signatures of that
convention, vLLM 0.19's, that raise if they are ever called, ``PAD_SLOT_ID`` = -1, a CUDA
``current_platform``), runs ``jitconv.vllm.plugin.install()`` on it (which reads the
pad_slot_id convention from those signatures) from a conftest before the test file is
imported, then pytest on a copy of the file. The exit status is pytest's.
"""

import shutil
import sys
import tempfile
import textwrap
from pathlib import Path

STANDIN = {
    "vllm/__init__.py": "",
    "vllm/attention/__init__.py": "",
    "vllm/attention/backends/__init__.py": "",
    "vllm/attention/backends/utils.py": "PAD_SLOT_ID = -1\n",
    "vllm/platforms/__init__.py": """
        import random

        import numpy as np
        import torch


        class CudaPlatform:
            def is_xpu(self):
                return False

            def is_cuda(self):
                return True

            def seed_everything(self, seed):
                random.seed(seed)
                np.random.seed(seed)
                torch.manual_seed(seed)


        current_platform = CudaPlatform()
        """,
    "vllm/model_executor/__init__.py": "",
    "vllm/model_executor/layers/__init__.py": "",
    "vllm/model_executor/layers/mamba/__init__.py": "",
    "vllm/model_executor/layers/mamba/ops/__init__.py": "",
    "vllm/model_executor/layers/mamba/ops/causal_conv1d.py": """
        from vllm.attention.backends.utils import PAD_SLOT_ID


        def causal_conv1d_fn(x, weight, bias, conv_states, query_start_loc,
                             cache_indices=None, has_initial_state=None, activation="silu",
                             pad_slot_id=PAD_SLOT_ID, block_idx_first_scheduled_token=None,
                             block_idx_last_scheduled_token=None, initial_state_idx=None,
                             num_computed_tokens=None, block_size_to_align=0,
                             metadata=None, validate_data=False):
            raise AssertionError("the stand-in's op ran: the plugin did not replace it")


        def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None,
                                 conv_state_indices=None, num_accepted_tokens=None,
                                 query_start_loc=None, max_query_len=-1,
                                 pad_slot_id=PAD_SLOT_ID, block_idx_last_scheduled_token=None,
                                 initial_state_idx=None, validate_data=False):
            raise AssertionError("the stand-in's op ran: the plugin did not replace it")
        """,
    "conftest.py": """
        import jitconv
        from jitconv.vllm import plugin

        jitconv.set_device("cuda:0")
        replaced = plugin.install()
        assert "vllm.model_executor.layers.mamba.ops.causal_conv1d.causal_conv1d_update" \\
            in replaced, replaced
        """,
}

EINOPS = """
    def rearrange(t, pattern):
        if pattern.replace(" ", "") != "bsd->bds":
            raise NotImplementedError(pattern)
        return t.transpose(1, 2)
    """


def main(argv):
    if len(argv) < 1:
        print(__doc__)
        return 2
    test_file = Path(argv[0]).resolve()
    import pytest
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        files = dict(STANDIN)
        try:
            import einops  # noqa: F401
        except ImportError:
            files["einops.py"] = EINOPS
        for path, text in files.items():
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text(textwrap.dedent(text))
        shutil.copy(test_file, root / test_file.name)
        sys.path.insert(0, str(root))
        return pytest.main(["-q", "-p", "no:cacheprovider", "--rootdir", str(root),
                            str(root / test_file.name), *argv[1:]])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
