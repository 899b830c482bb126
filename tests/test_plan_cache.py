"""One-shot calls reuse the plan of an earlier call with the same metadata VALUES
(jitconv.api.plan_cache), and never a plan whose metadata has changed since, even when the
engine rewrote the same tensor in place. Every call is compared with the reference."""

import pytest
import torch

import jitconv
from jitconv.api import plan_cache
from jitconv.api import plan as step_plan
from jitconv.reference import causal_conv1d_reference

from helpers import DATA_KEYS, assert_outputs_close, assert_state_exact, mixed_step, randn


@pytest.fixture(autouse=True)
def _empty_cache():
    plan_cache.clear()
    yield
    plan_cache.clear()


@pytest.fixture
def plans_built(monkeypatch):
    built = []
    original = step_plan.StepPlan.__init__

    def counted(self, *args, **kwargs):
        built.append(self)
        original(self, *args, **kwargs)
    monkeypatch.setattr(step_plan.StepPlan, "__init__", counted)
    return built


def _step(seed):
    gen = torch.Generator().manual_seed(seed)
    step = mixed_step(gen, dim=24, width=4, dtype=torch.float32, ns_lengths=[5, 1, 1],
                      sp_lengths=[3, 2], initial="alternate", extra_lines=2, usm=True)
    meta = {k: v for k, v in step.items() if k not in DATA_KEYS}
    return gen, {k: step[k] for k in DATA_KEYS}, meta


def _layer(gen, data):
    layer = {k: randn(gen, tuple(v.shape), torch.float32, True) for k, v in data.items()
             if k != "conv_state"}
    layer["conv_state"] = randn(gen, tuple(data["conv_state"].transpose(1, 2).shape),
                                torch.float32, True).transpose(1, 2)
    return layer


def _check(layer, meta):
    ref_out, ref_state = causal_conv1d_reference(**layer, **meta)
    out = jitconv.causal_conv1d_mixed(**layer, **meta)
    assert_outputs_close(out, ref_out, torch.float32)
    assert_state_exact(layer["conv_state"], ref_state)


def test_layers_with_the_same_metadata_share_one_plan(sycl_device, plans_built):
    gen, data, meta = _step(1)
    for _ in range(3):
        _check(_layer(gen, data), meta)
    assert len(plans_built) == 1
    # equal values in new tensors (the next step of a steady decode): the same plan
    _check(_layer(gen, data), {k: v.clone() if isinstance(v, torch.Tensor) else v
                               for k, v in meta.items()})
    assert len(plans_built) == 1


def test_metadata_rewritten_in_place_gets_a_new_plan(sycl_device, plans_built):
    """Engines update persistent metadata buffers in place between steps."""
    gen, data, meta = _step(2)
    _check(_layer(gen, data), meta)
    lines = meta["non_spec_state_indices"]
    lines.copy_(lines.flip(0))  # the same tensor object, other cache lines
    _check(_layer(gen, data), meta)
    assert len(plans_built) == 2


def test_another_geometry_is_validated_again(sycl_device):
    gen = torch.Generator().manual_seed(3)
    dim, width = 16, 4
    weight = randn(gen, (dim, width), torch.float32, True)
    state = randn(gen, (4, 3, dim), torch.float32, True).transpose(1, 2)
    qsl, lines = torch.tensor([0, 2, 3], dtype=torch.int32), \
        torch.tensor([0, 1], dtype=torch.int32)
    x = randn(gen, (3, dim), torch.float32, True)
    jitconv.causal_conv1d_fn(x, weight, None, state, qsl, lines)
    longer = randn(gen, (5, dim), torch.float32, True)
    with pytest.raises(ValueError, match="query_start_loc: last element must equal the "
                                         "token count 5"):
        jitconv.causal_conv1d_fn(longer, weight, None, state, qsl, lines)


def test_update_reuses_its_plan(sycl_device, plans_built):
    """causal_conv1d_update without query_start_loc (one token per sequence): the same
    indices twice reuse one plan, and both calls stay right."""
    gen = torch.Generator().manual_seed(4)
    dim, width = 16, 3
    lines = torch.tensor([2, 0, 1], dtype=torch.int32)
    for _ in range(2):
        x = randn(gen, (3, dim), torch.float32, True)
        weight = randn(gen, (dim, width), torch.float32, True)
        state = randn(gen, (3, 2, dim), torch.float32, True).transpose(1, 2)
        ref_out, ref_state = causal_conv1d_reference(
            x, weight, None, state, non_spec_query_start_loc=torch.arange(4),
            non_spec_state_indices=lines)
        out = jitconv.causal_conv1d_update(x, weight, None, state, lines)
        assert_outputs_close(out, ref_out, torch.float32)
        assert_state_exact(state, ref_state)
    assert len(plans_built) == 1
