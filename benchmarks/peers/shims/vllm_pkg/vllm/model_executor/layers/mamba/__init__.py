# shim for a side-by-side run, not vLLM's code (empty package marker)
