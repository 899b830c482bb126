# shim for a side-by-side run, not SGLang's code
# Provides: sglang.test.test_utils.empty_gpu_cache (frees the GPU cache where there is a
# GPU; nothing to free on a CPU-only machine).
import torch


def empty_gpu_cache():
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
