# shim for a side-by-side run, not vLLM's code
# Provides: vllm.triton_utils.tl, vllm.triton_utils.triton
import triton
import triton.language as tl

__all__ = ["triton", "tl"]
