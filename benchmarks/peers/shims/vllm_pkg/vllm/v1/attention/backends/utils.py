# shim for a side-by-side run, not vLLM's code
# Provides: vllm.v1.attention.backends.utils.PAD_SLOT_ID
PAD_SLOT_ID = -1
