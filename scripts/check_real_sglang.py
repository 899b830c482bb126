"""By hand, not collected by pytest: jitconv.sglang against the REAL SGLang 0.5.23 modules.

Needs a separate venv where SGLang's GDN backend imports (on a CPU machine: torch 2.14.1
and torchvision 0.29.1 from PyPI, ``pip install --no-deps sglang==0.5.23``, then the
modules its import chain needs: dill, sentencepiece, apache-tvm-ffi, compressed-tensors,
gguf, openai, partial_json_parser, uvicorn, fastapi, orjson, pybase64, msgspec, pyzmq,
ipython, aiohttp, einops, transformers), plus dpctl 0.22.1 with the 2026.2 runtime for
opencl:cpu, and jitconv on PYTHONPATH:

    PYTHONPATH=/path/to/jitconv <venv>/bin/python scripts/check_real_sglang.py

It runs ``jitconv.sglang.install()`` on the real modules, then SGLang's own
``GDNAttnBackend._convolve_prefill`` (which calls ``causal_conv1d_fn`` through the module
global, as every extend step does) and the target-verify call exactly as
``forward_extend`` makes it (x viewed (batch, dim, draft tokens), windows, a tree), and
checks both against jitconv's float64 reference: states and windows bit-exact, outputs
within tolerance. The backend object and the forward batch are namespaces holding the
fields those two places read (no engine runs here).
"""

import logging
import sys
import types

import numpy as np
import torch

import jitconv
from jitconv import sglang as jsg
from jitconv.reference import TOLERANCE, causal_conv1d_reference


def close(got, want, dtype_name):
    rtol, atol = TOLERANCE[dtype_name]
    np.testing.assert_allclose(got.double().numpy(), want, rtol=rtol, atol=atol)


def main():
    logging.basicConfig(level=logging.INFO)
    jitconv.set_device("opencl:cpu")
    import sglang.srt.layers.attention.linear.gdn_backend as gdn
    report = jsg.install()
    print("install():", report)
    assert report["sglang.srt.layers.attention.linear.gdn_backend.causal_conv1d_fn"] == \
        "replaced"
    assert report["sglang.srt.layers.attention.linear.gdn_backend.causal_conv1d_update"] == \
        "replaced"
    gen = torch.Generator().manual_seed(0)
    dim, width, S = 64, 4, 3
    w = torch.randn(dim, width, generator=gen)
    bias = torch.randn(dim, generator=gen)
    layer = types.SimpleNamespace(conv_weights=w, bias=bias, activation="silu")

    # extend: two sequences, the second with a prefix (initial state)
    lengths, lines = [5, 9], torch.tensor([2, 0], dtype=torch.int32)
    qsl = torch.tensor([0, 5, 14], dtype=torch.int32)
    x = torch.randn(14, dim, generator=gen)
    state = torch.randn(4, dim, S, generator=gen)
    before = state.clone()
    backend = types.SimpleNamespace(forward_metadata=types.SimpleNamespace(
        conv_block_table=None, query_start_loc=qsl))
    batch = types.SimpleNamespace(extend_prefix_lens=torch.tensor([0, 3]),
                                  extend_seq_lens_cpu=lengths)
    out = gdn.GDNAttnBackend._convolve_prefill(backend, layer, batch, x, state, lines)
    ref_out, ref_state = causal_conv1d_reference(
        x, w, bias, before, non_spec_query_start_loc=qsl, non_spec_state_indices=lines,
        has_initial_state=np.array([False, True]))
    close(out, ref_out, "float32")
    assert torch.equal(state, torch.from_numpy(ref_state).float())
    print("extend (GDNAttnBackend._convolve_prefill): outputs within tolerance, state exact")

    # target verify with a tree, as forward_extend calls it
    bs, T = 3, 4
    mixed_qkv = torch.randn(bs * T, dim, generator=gen)
    parents = [[-1, 0, 0, 1], [-1, 0, 1, 2], [-1, 0, 1, 1]]
    nxt = torch.full((bs, T), -1, dtype=torch.int32)
    sib = torch.full((bs, T), -1, dtype=torch.int32)
    for i, par in enumerate(parents):
        last = {}
        for t in range(1, T):
            if par[t] in last:
                sib[i, last[par[t]]] = t
            else:
                nxt[i, par[t]] = t
            last[par[t]] = t
    state = torch.randn(5, dim, S, generator=gen)
    windows = torch.randn(4, T, dim, S, generator=gen)
    before, windows_before = state.clone(), windows.clone()
    cache_indices = torch.tensor([4, 1, 3, 0], dtype=torch.int32)
    window_rows = torch.tensor([2, 0, 3, 1], dtype=torch.int32)
    parent_out = torch.zeros(bs, T, dtype=torch.int32)
    x3 = mixed_qkv.view(bs, T, -1).transpose(1, 2)
    out = gdn.causal_conv1d_update(
        x3, state, layer.conv_weights, layer.bias, layer.activation,
        conv_state_indices=cache_indices[:bs], intermediate_conv_window=windows,
        intermediate_state_indices=window_rows[:bs], retrieve_next_token=nxt,
        retrieve_next_sibling=sib, retrieve_parent_token=parent_out)
    flat = out.transpose(1, 2).reshape(bs * T, -1)
    ref_out, ref_state, ref_windows = causal_conv1d_reference(
        mixed_qkv, w, bias, before, non_spec_query_start_loc=np.arange(0, bs * T + 1, T),
        non_spec_state_indices=cache_indices[:bs], non_spec_parent_token=np.array(parents),
        non_spec_window_rows=window_rows[:bs], intermediate_windows=windows_before)
    close(flat, ref_out, "float32")
    assert torch.equal(state, torch.from_numpy(ref_state).float())
    assert torch.equal(windows, torch.from_numpy(ref_windows).float())
    assert parent_out[:, 1:].tolist() == [p[1:] for p in parents]
    print("target verify (tree, windows): outputs within tolerance, state and windows exact,"
          " parents written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
