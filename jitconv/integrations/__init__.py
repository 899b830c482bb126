"""Engine integrations above the public ops: torch custom ops (``torch_ops``). The vLLM
drop-ins and plugin are ``jitconv.vllm``, at the same level."""
