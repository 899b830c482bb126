"""Remembered launches (jitconv.backends.sycl.run_cache): a run whose tensors were checked before goes
straight to the submit, with the same results, and never where the checks would now fail.

Every run is compared with the float64 reference. The cases that must NOT reuse a
remembered launch: a plan of another geometry, a tensor that now requires grad, memory
that is no longer the same allocation, and written tensors that share memory with an
input (whose aliasing check depends on the plan's cache lines).
"""

import gc
import types

import pytest
import torch

import jitconv
from jitconv.backends.sycl import launching
from jitconv.backends.sycl import run_cache
from jitconv.backends.sycl.backend import launch_kind
from jitconv.api import validation
from jitconv.reference import causal_conv1d_reference
from jitconv.backends.sycl.state import STATE as SYCL_STATE

from helpers import (DATA_KEYS, assert_outputs_close, assert_state_exact, bits, wide_choices,
                     mixed_step, randn)

pytestmark = pytest.mark.skipif(not launching.can_resubmit(),
                                reason="launches are remembered on the C submit path only")


def _step(seed, usm=True, dtype=torch.float32, **kw):
    gen = torch.Generator().manual_seed(seed)
    step = mixed_step(gen, dim=40, width=4, dtype=dtype, ns_lengths=[9, 1, 1],
                      sp_lengths=[3], initial="alternate", extra_lines=2, usm=usm, **kw)
    meta = {k: v for k, v in step.items() if k not in DATA_KEYS}
    return gen, {k: step[k] for k in DATA_KEYS}, meta


def _plan(data, meta, **geometry):
    lines, _dim, state_len = data["conv_state"].shape
    args = dict(num_tokens=data["x"].shape[0], num_cache_lines=lines, state_len=state_len,
                width=data["weight"].shape[-1])
    args.update(geometry)
    return jitconv.plan(args["num_tokens"], args["num_cache_lines"], args["state_len"],
                        args["width"], **meta)


class _CountChecks:
    """Counts validation.check_tensors calls (the full check path of a run)."""

    def __init__(self, monkeypatch):
        self.calls = 0
        original = validation.check_tensors

        def counted(*args):
            self.calls += 1
            return original(*args)
        monkeypatch.setattr(validation, "check_tensors", counted)


@pytest.fixture(autouse=True)
def _empty_cache():
    SYCL_STATE.runs.clear()
    yield
    SYCL_STATE.runs.clear()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # bfloat16: wide kernel
@pytest.mark.parametrize("with_out", [True, False])
def test_repeated_runs_skip_the_checks_and_stay_exact(sycl_device, monkeypatch, with_out,
                                                      dtype):
    _gen, data, meta = _step(1, dtype=dtype)
    plan = _plan(data, meta)
    checks = _CountChecks(monkeypatch)
    out = jitconv.empty(tuple(data["x"].shape), dtype) if with_out else None
    outputs = []
    for _ in range(3):  # each run updates the state: the reference follows it
        ref_out, ref_state = causal_conv1d_reference(**data, **meta)
        if out is not None:
            out.fill_(float("nan"))
        got = plan.run(**data, out=out)
        assert_outputs_close(got, ref_out, dtype)
        assert_state_exact(data["conv_state"], ref_state)
        outputs.append(got)
    assert checks.calls == 1, "the second and third runs reuse the checked launch"
    if with_out:
        assert all(o is out for o in outputs)
    else:  # a new output per run, as without the cache
        assert len({o.data_ptr() for o in outputs}) == 3


def test_a_new_output_that_a_wide_launch_cannot_take_is_checked_again(sycl_device,
                                                                      monkeypatch):
    """A remembered wide launch (bfloat16, rows aligned to 4 channels) whose new output
    would start off that alignment is not reused: the run takes the full path, which
    picks the one-channel kernel for it."""
    from jitconv.backends.sycl import bridge
    _gen, data, meta = _step(2, dtype=torch.bfloat16)
    plan = _plan(data, meta)
    plan.run(**data)  # remembered, wide
    (entry,) = SYCL_STATE.runs.values()
    assert entry.groups == data["x"].shape[1] // launching.WIDE_CHANNELS["bfloat16"]
    checks = _CountChecks(monkeypatch)
    fresh = bridge.empty_like_output

    def off_by_one(x, shape, dtype):  # a new output one element into its allocation
        buf = fresh(x, (shape[0] * shape[1] + 1,), dtype)
        return buf[1:].view(shape)
    monkeypatch.setattr(bridge, "empty_like_output", off_by_one)
    chosen = wide_choices(monkeypatch)
    ref_out, ref_state = causal_conv1d_reference(**data, **meta)
    got = plan.run(**data)
    assert got.data_ptr() % 8 != 0
    assert_outputs_close(got, ref_out, torch.bfloat16)
    assert_state_exact(data["conv_state"], ref_state)
    assert checks.calls == 1 and chosen == [False]


def test_a_new_plan_reuses_the_layer_launch_with_its_own_tables(sycl_device, monkeypatch):
    """The next engine step (new metadata, new plan, same geometry) with the same layer
    tensors: the remembered launch is used with the new plan's tables."""
    gen, data, meta = _step(2)
    _plan(data, meta).run(**data)
    _gen2, other, meta2 = _step(3)  # other metadata, same geometry
    assert {k: tuple(v.shape) for k, v in other.items()} == \
        {k: tuple(v.shape) for k, v in data.items()}
    checks = _CountChecks(monkeypatch)
    plan2 = _plan(data, meta2)
    ref_out, ref_state = causal_conv1d_reference(**data, **meta2)
    got = plan2.run(**data)
    assert checks.calls == 0
    assert_outputs_close(got, ref_out, torch.float32)
    assert_state_exact(data["conv_state"], ref_state)


def test_a_plan_of_another_geometry_checks_again(sycl_device):
    _gen, data, meta = _step(4)
    _plan(data, meta).run(**data)
    lines = data["conv_state"].shape[0]
    other = _plan(data, meta, num_cache_lines=lines + 1)
    before = bits(data["conv_state"])
    with pytest.raises(ValueError, match="conv_state: has .* cache lines"):
        other.run(**data)
    assert torch.equal(bits(data["conv_state"]), before)


def test_a_tensor_that_now_requires_grad_is_rejected(sycl_device):
    _gen, data, meta = _step(5)
    plan = _plan(data, meta)
    plan.run(**data)
    data["weight"].requires_grad_(True)
    before = bits(data["conv_state"])
    with pytest.raises(TypeError, match="weight: requires grad"):
        plan.run(**data)
    assert torch.equal(bits(data["conv_state"]), before)


def test_an_entry_whose_memory_is_gone_is_not_used(sycl_device):
    """The key holds addresses; once the USM allocation behind one is freed, that
    address may be reused by other memory, so the entry must not be found."""
    _gen, data, meta = _step(6)
    plan = _plan(data, meta)
    out = jitconv.empty(tuple(data["x"].shape))
    plan.run(**data, out=out)
    key = run_cache.key(*(data[k] for k in ("x", "weight", "bias", "conv_state")), out,
                        "silu", None, jitconv.get_queue(), metadata=launch_kind(plan))
    assert run_cache.find(key, plan) is not None
    previous = jitconv.set_pool_limit(0)  # really free, do not keep for reuse
    try:
        del out
        gc.collect()
        assert run_cache.find(key, plan) is None
    finally:
        jitconv.set_pool_limit(previous)


def test_written_tensors_sharing_memory_are_never_remembered(sycl_device):
    """x lies inside conv_state's memory. With every sequence padded no cache line is
    written, and the run is allowed; a plan that writes lines must still reject the same
    tensors (the aliasing check depends on the plan's lines)."""
    gen = torch.Generator().manual_seed(7)
    dim, width, lines, state_len = 16, 3, 4, 2
    storage = randn(gen, (lines + 2, state_len, dim), torch.float32, True)
    conv_state = storage[:lines].transpose(1, 2)
    x = storage.view(-1, dim)[1:4]  # rows inside conv_state's memory
    weight = randn(gen, (dim, width), torch.float32, True)
    data = dict(x=x, weight=weight, bias=None, conv_state=conv_state)
    qsl = torch.tensor([0, 1, 2, 3], dtype=torch.int32)
    padded = dict(non_spec_query_start_loc=qsl, has_initial_state=torch.ones(3, dtype=torch.bool),
                  non_spec_state_indices=torch.full((3,), -1, dtype=torch.int32))
    real = dict(padded, non_spec_state_indices=torch.tensor([0, 1, 2], dtype=torch.int32))
    out = jitconv.empty((3, dim))
    jitconv.plan(3, lines, state_len, width, **padded).run(**data, out=out)
    before = bits(storage)
    with pytest.raises(ValueError, match="conv_state and x overlap"):
        jitconv.plan(3, lines, state_len, width, **real).run(**data, out=out)
    assert torch.equal(bits(storage), before)


def test_launches_that_copied_an_argument_are_never_remembered(sycl_device, monkeypatch):
    """A plain CPU weight (not USM) is copied to the device on every run: new memory each
    time, so its launch must not be remembered, even where that memory could be weakly
    referenced (as pooled memory can: simulated here)."""
    _gen, data, meta = _step(6)
    data["weight"] = data["weight"].clone()  # plain CPU memory
    monkeypatch.setattr(run_cache, "weakref", types.SimpleNamespace(ref=lambda o: lambda: o))
    plan = _plan(data, meta)
    checks = _CountChecks(monkeypatch)
    for _ in range(2):
        ref_out, ref_state = causal_conv1d_reference(**data, **meta)
        got = plan.run(**data)
        assert_outputs_close(got, ref_out, torch.float32)
        assert_state_exact(data["conv_state"], ref_state)
    assert checks.calls == 2 and not SYCL_STATE.runs


@pytest.mark.parametrize("with_out", [True, False])
def test_a_remembered_launch_follows_x_to_other_memory(sycl_device, monkeypatch, with_out):
    """An engine's x is a new tensor at every layer and step: a launch remembered for x
    at one address is submitted for x at another (no checks again) and reads the new x
    (the reference of its values). Not for x at another alignment (a new key), nor in
    memory that is not a live USM allocation of jitconv's pool (a plain CPU tensor:
    checked and copied in), nor on conv_state's memory (refused by the checks, conv_state
    untouched)."""
    gen, data, meta = _step(7)
    plan = _plan(data, meta)
    shape, dtype = tuple(data["x"].shape), data["x"].dtype
    out = jitconv.empty(shape, dtype) if with_out else None
    state = data["conv_state"]

    def run_on(x):
        args = dict(data, x=x)
        ref_out, ref_state = causal_conv1d_reference(**args, **meta)
        if out is not None:
            out.fill_(float("nan"))
        got = plan.run(**args, out=out)
        assert_outputs_close(got, ref_out, dtype)
        assert_state_exact(state, ref_state)

    def at_class(memory_of, numel):
        """A view of ``numel`` elements of the flat tensor ``memory_of`` whose address
        is congruent to x's modulo the key's alignment (the same key)."""
        want = data["x"].data_ptr() % run_cache.X_ALIGNMENT
        size = memory_of.element_size()
        k = next(k for k in range(run_cache.X_ALIGNMENT)
                 if (memory_of.data_ptr() + k * size) % run_cache.X_ALIGNMENT == want)
        return memory_of[k:k + numel].view(shape)

    run_on(data["x"])
    checks = _CountChecks(monkeypatch)
    for _ in range(2):
        moved = jitconv.empty(shape, dtype)
        moved.copy_(randn(gen, shape, dtype))
        assert moved.data_ptr() != data["x"].data_ptr()
        if moved.data_ptr() % run_cache.X_ALIGNMENT != \
                data["x"].data_ptr() % run_cache.X_ALIGNMENT:
            moved = at_class(jitconv.empty((moved.numel() + run_cache.X_ALIGNMENT,), dtype),
                             moved.numel())
            moved.copy_(randn(gen, shape, dtype))
        run_on(moved)
    assert checks.calls == 0, "x at another address of its alignment took the checks"
    numel = data["x"].numel()
    odd = jitconv.empty((numel + 8,), dtype)
    odd = odd[1:1 + numel].view(shape) if odd.data_ptr() % run_cache.X_ALIGNMENT != \
        (data["x"].data_ptr() - 4) % run_cache.X_ALIGNMENT else odd[2:2 + numel].view(shape)
    odd.copy_(randn(gen, shape, dtype))
    run_on(odd)  # another key: checked, then remembered too
    assert checks.calls == 1
    plain = at_class(torch.empty(numel + run_cache.X_ALIGNMENT, dtype=dtype), numel)
    plain.copy_(randn(gen, shape, dtype))
    run_on(plain)  # not USM: checked and copied in
    assert checks.calls == 2
    onto = at_class(state.as_strided((state.numel(),), (1,)), numel)
    before = bits(state)
    with pytest.raises(ValueError, match="overlap"):
        plan.run(**dict(data, x=onto), out=out)
    assert torch.equal(bits(state), before) and checks.calls == 3
