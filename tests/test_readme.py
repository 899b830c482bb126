"""The README's examples run as written and compute what the contract says.

The usage blocks run in order in one namespace, with jitconv's three ops wrapped so that
every call they make is checked against the float64 reference (outputs within the
dtype's tolerance, conv_state bit-exact). The vLLM wiring block, which reads attributes
of a GDN layer, runs against a stand-in layer and metadata object that carry exactly
those attributes; what it computes is checked too.
"""

import re
import types
from pathlib import Path

import pytest
import torch

import jitconv
from jitconv.api import ops
from jitconv.reference import causal_conv1d_fn_reference, causal_conv1d_reference

from helpers import (assert_outputs_close, assert_state_exact, cumulative, gdn_metadata,
                     mixed_step)

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
WIRING = [b for b in BLOCKS if "gdn_conv_step" in b and "self." in b]
USAGE = [b for b in BLOCKS if b not in WIRING]


def _update_reference(x, weight, bias, conv_state, conv_state_indices,
                      query_start_loc=None, num_accepted_tokens=None, activation="silu",
                      **rest):
    """causal_conv1d_update's arguments in the reference's terms."""
    assert not rest, f"argument not handled by this test: {sorted(rest)}"
    lines = torch.as_tensor(conv_state_indices)
    lines = lines[:, 0] if lines.dim() == 2 else lines
    if query_start_loc is None:
        query_start_loc = cumulative([1] * len(lines))
    if num_accepted_tokens is None:
        return causal_conv1d_reference(x, weight, bias, conv_state, activation=activation,
                                       non_spec_query_start_loc=query_start_loc,
                                       non_spec_state_indices=lines)
    return causal_conv1d_reference(x, weight, bias, conv_state, activation=activation,
                                   spec_query_start_loc=query_start_loc,
                                   spec_state_indices=lines,
                                   num_accepted_tokens=num_accepted_tokens)


def _checked(op, reference, checked):
    """``op`` that compares each call with the reference before returning."""
    def call(x, weight, bias, conv_state, *args, **kwargs):
        ref_out, ref_state = reference(x, weight, bias, conv_state, *args, **kwargs)
        out = op(x, weight, bias, conv_state, *args, **kwargs)
        assert_outputs_close(out, ref_out, x.dtype)
        assert_state_exact(conv_state, ref_state)
        checked.append(op.__name__)
        return out
    return call


class _CheckedPlan:
    """A jitconv.plan whose runs are compared with the reference."""

    def __init__(self, checked, *args, **metadata):
        self.plan, self.metadata, self.checked = ops.plan(*args, **metadata), metadata, \
            checked

    def run(self, x, weight, bias, conv_state, out=None, activation="silu"):
        meta = {k: v for k, v in self.metadata.items() if k not in ("queue",)}
        ref_out, ref_state = causal_conv1d_reference(x, weight, bias, conv_state,
                                                     activation=activation, **meta)
        result = self.plan.run(x, weight, bias, conv_state, out=out, activation=activation)
        assert_outputs_close(result, ref_out, x.dtype)
        assert_state_exact(conv_state, ref_state)
        self.checked.append("plan.run")
        return result


def test_readme_usage_examples_compute_the_contract(sycl_device, monkeypatch):
    assert len(USAGE) >= 4, "the README lost its examples"
    checked = []
    for name, reference in (("causal_conv1d_mixed", causal_conv1d_reference),
                            ("causal_conv1d_fn", causal_conv1d_fn_reference),
                            ("causal_conv1d_update", _update_reference)):
        monkeypatch.setattr(jitconv, name, _checked(getattr(jitconv, name), reference,
                                                    checked))
    monkeypatch.setattr(jitconv, "plan", lambda *a, **k: _CheckedPlan(checked, *a, **k))
    namespace = {}
    try:
        for block in USAGE:
            exec(compile(block, str(README), "exec"), namespace)
    finally:
        jitconv.set_device(sycl_device)  # the first example picks opencl:cpu
    assert checked == ["causal_conv1d_mixed", "causal_conv1d_fn", "causal_conv1d_update",
                       "causal_conv1d_update"] + ["plan.run"] * 3, checked


@pytest.mark.parametrize("dim_first", [False, True], ids=["state_major", "dim_first"])
@pytest.mark.parametrize("layout", ["vllm", "shuffled"])
def test_readme_vllm_wiring_runs_one_step_of_a_gdn_layer(sycl_device, layout, dim_first):
    """The wiring block against a stand-in layer and GDNAttentionMetadata: the conv of
    the whole step in one launch, split by part (the reference's rows gathered by each
    part's token map), the layer's cache holding the reference state. The step's pads
    carry vLLM's null block 0: line 0 is added in front of the step's lines."""
    assert len(WIRING) == 1, "the README's vLLM wiring example is missing"
    gen = torch.Generator().manual_seed(7)
    dim, width, k, padding = 96, 4, 3, 5
    step = mixed_step(gen, dim=dim, width=width, dtype=torch.float32,
                      ns_lengths=[9, 1, 1, 4], sp_lengths=[1 + k] * 3, rows=layout,
                      ns_pads=1, sp_pads=1, initial=[False, True, True, True],
                      spec_columns=1 + k, extra_lines=4,
                      layout="DS" if dim_first else "SD")
    num_actual = step["x"].shape[0]
    mixed_qkv = torch.cat([step["x"], torch.randn(padding, dim, generator=gen)])
    stored = step["conv_state"] if dim_first else step["conv_state"].transpose(-1, -2)
    null_line = torch.randn((1,) + tuple(stored.shape[1:]), generator=gen)
    kv_cache = torch.cat([null_line, stored])

    def vllm_lines(lines):  # pads (-1) -> null block 0, real lines shifted by one
        return torch.where(lines < 0, 0, lines + 1)
    meta = gdn_metadata(step, lines=vllm_lines)
    ref_out, ref_state = causal_conv1d_reference(**step)
    null_before = kv_cache[0].clone()

    layer = types.SimpleNamespace(
        conv1d=types.SimpleNamespace(weight=step["weight"][:, None, :], bias=step["bias"]),
        activation="silu", kv_cache=[kv_cache])
    namespace = dict(jitconv=jitconv, self=layer, mixed_qkv=mixed_qkv, attn_metadata=meta,
                     num_actual_tokens=num_actual, spec_token_indx=meta.spec_token_indx,
                     is_conv_state_dim_first=lambda: dim_first)
    exec(compile(WIRING[0], str(README), "exec"), namespace)

    for part in ("spec", "non_spec"):
        rows = getattr(meta, f"{part}_token_indx").long().numpy()
        assert_outputs_close(namespace[f"mixed_qkv_{part}"], ref_out[rows], torch.float32)
    state = kv_cache[1:] if dim_first else kv_cache[1:].transpose(-1, -2)
    assert_state_exact(state, ref_state)
    assert torch.equal(kv_cache[0], null_before), "the null block was written"
