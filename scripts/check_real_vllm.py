"""By hand, not collected by pytest: jitconv's plugin against the REAL vLLM 0.33 GDN module.

Needs a separate venv with vLLM 0.33.0 and its dependencies (``pip install vllm==0.33.0``,
which brings torch 2.14), dpctl 0.22.1 and the 2026.2 runtime wheels (intel-sycl-rt,
intel-cmplr-lib-rt, intel-cmplr-lib-ur, intel-opencl-rt), and jitconv on PYTHONPATH:

    PYTHONPATH=/path/to/jitconv <venv>/bin/python scripts/check_real_vllm.py per_call
    PYTHONPATH=/path/to/jitconv <venv>/bin/python scripts/check_real_vllm.py whole_step
    (VLLM_SSM_CONV_STATE_LAYOUT=DS selects vLLM's dim-first conv-state layout)

It runs ``register()`` (on a machine without XPU: one log line, nothing replaced), then
``install()`` and the real ``QwenGatedDeltaNetAttention._forward_core`` on a mixed step
(prefill, decodes counted as prefills, spec sequences, a null-block spec row) up to the end
of its conv stage: the recurrent kernels after it need a GPU, so the first call after the
conv (``rearrange_mixed_qkv``) records the spec part's conv output and stops. The engine's
forward context is replaced by a namespace holding the metadata (no engine runs here).
Checked against jitconv's float64 reference: conv state bit-exact, null block untouched,
spec conv output within tolerance, and the number of launches (2 per call, 1 whole-step).
"""

import logging
import sys
import types

import numpy as np
import torch

import jitconv  # noqa: F401  (before dpctl, for the runtime bootstrap)
from jitconv.vllm import plugin as vllm_plugin
from jitconv.reference import causal_conv1d_reference
from jitconv.backends.sycl.state import STATE as SYCL_STATE

import vllm.forward_context as forward_context
import vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn as gdn
from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first
from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadata

DIM, WIDTH, NUM_SPEC, LINES, PREFIX = 64, 4, 3, 16, "layers.0"


def cumulative(lengths):
    return torch.cumsum(torch.tensor([0] + lengths), 0).to(torch.int32)


def main(mode):
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    print("register ->", vllm_plugin.register())
    context = types.SimpleNamespace(attn_metadata=None)
    forward_context.get_forward_context = gdn.get_forward_context = lambda: context
    print("install ->", vllm_plugin.install(whole_step=mode == "whole_step"))

    gen = torch.Generator().manual_seed(1)
    lengths = [4, 5, 1, 2, 4, 1]
    spec = torch.tensor([True, False, False, True, True, False])
    token_is_spec = torch.repeat_interleave(spec, torch.tensor(lengths))
    order = torch.argsort(token_is_spec, stable=True)  # vLLM's int64 maps
    n_ns = int((~token_is_spec).sum())
    meta = GDNAttentionMetadata(
        num_prefills=3, num_prefill_tokens=n_ns, num_decodes=0, num_decode_tokens=0,
        num_spec_decodes=3, num_spec_decode_tokens=10, num_actual_tokens=17,
        has_initial_state=torch.tensor([False, True, True]),
        spec_query_start_loc=cumulative([4, 2, 4]),
        non_spec_query_start_loc=cumulative([5, 1, 1]),
        spec_state_indices_tensor=torch.tensor(
            [[3, 9, 10, 11], [0, 0, 0, 0], [6, 12, 13, 14]], dtype=torch.int32),
        non_spec_state_indices_tensor=torch.tensor([5, 7, 8], dtype=torch.int32),
        spec_sequence_masks=spec, spec_token_indx=order[n_ns:],
        non_spec_token_indx=order[:n_ns],
        num_accepted_tokens=torch.tensor([2, 1, 3], dtype=torch.int32))
    dim_first = is_conv_state_dim_first()
    state_len = WIDTH - 1 + NUM_SPEC
    cache = torch.randn(*((LINES, DIM, state_len) if dim_first else (LINES, state_len, DIM)),
                        generator=gen)
    conv_state = cache if dim_first else cache.transpose(-1, -2)

    layer = object.__new__(gdn.QwenGatedDeltaNetAttention)  # no model config here
    torch.nn.Module.__init__(layer)
    layer.prefix, layer.activation = PREFIX, "silu"
    layer.kv_cache = [cache, torch.zeros(LINES, 2, 32, 32)]
    layer.enable_packed_recurrent_decode = False
    layer.conv1d = types.SimpleNamespace(weight=torch.randn(DIM, 1, WIDTH, generator=gen),
                                         bias=torch.randn(DIM, generator=gen))
    captured = []

    def stop_after_conv(spec_output):
        captured.append(spec_output.clone())
        raise RuntimeError("stopped after the conv stage")
    layer.rearrange_mixed_qkv = stop_after_conv
    context.attn_metadata = {PREFIX: meta}

    x = torch.randn(19, DIM, generator=gen)
    ref_out, ref_state = causal_conv1d_reference(
        x[:17], layer.conv1d.weight, layer.conv1d.bias, conv_state,
        non_spec_query_start_loc=meta.non_spec_query_start_loc,
        non_spec_state_indices=meta.non_spec_state_indices_tensor,
        has_initial_state=meta.has_initial_state, non_spec_token_indx=order[:n_ns],
        spec_query_start_loc=meta.spec_query_start_loc, spec_state_indices=[3, -1, 6],
        spec_token_indx=order[n_ns:], num_accepted_tokens=meta.num_accepted_tokens)
    null_before = cache[0].clone()
    launches = SYCL_STATE.stats["submitted"]
    try:
        with torch.no_grad():
            layer._forward_core(mixed_qkv=x, b=torch.zeros(19, 2), a=torch.zeros(19, 2),
                                core_attn_out=torch.zeros(19, 2, 32))
    except RuntimeError as exc:
        if "stopped after the conv stage" not in str(exc):
            raise
    checks = {
        "launches": SYCL_STATE.stats["submitted"] - launches == (
            1 if mode == "whole_step" else 2),
        "conv state bit-exact": torch.equal(torch.from_numpy(ref_state).float(), conv_state),
        "null block untouched": torch.equal(null_before, cache[0]),
        "spec conv output": np.allclose(captured[0].numpy(), ref_out[order[n_ns:].numpy()],
                                        rtol=3e-4, atol=1e-3),
    }
    print(f"{mode}, dim_first={dim_first}:", checks)
    return all(checks.values())


if __name__ == "__main__":
    sys.exit(0 if main(sys.argv[1]) else 1)
