"""torch.compile over jitconv's ops (``jitconv.api.torch_ops``): a function calling each
public op compiles with fullgraph=True (a graph break would raise), and the compiled
function's outputs and conv_state updates are bit-identical to eager's, on fresh random
inputs, with untouched cache lines unchanged. Backends: "aot_eager" (tracing and
functionalization: what decides whether the in-place state update survives) for every
op, and inductor for one. On the SYCL device under test (torch CPU tensors) and, where
there is one, a CUDA GPU (torch CUDA tensors; not under the simulator, which has no
driver launches for the compiled code to make)."""

import os

import pytest
import torch

import jitconv
from jitconv import vllm
from jitconv.backends.cuda import devices as cuda_devices
from jitconv.testing.steps import mixed_step

from helpers import bits, make_state, randn

DIM, WIDTH = 40, 4


@pytest.fixture(scope="module", params=["sycl", "cuda"])
def device(request):
    """The torch device of the tensors: "cpu" for the SYCL device under test, or a GPU."""
    if request.param == "cuda":
        if cuda_devices.simulating() or not cuda_devices.devices():
            pytest.skip("needs a CUDA GPU")
        return cuda_devices.torch_device(jitconv.set_device(cuda_devices.devices()[0]))
    if os.environ.get("JITCONV_TEST_HIDE_SYCL") == "1":
        pytest.skip("SYCL hidden")
    name = request.getfixturevalue("sycl_device")
    if cuda_devices.is_cuda_name(name):
        pytest.skip(f"no SYCL device (the device under test is {name})")
    jitconv.set_device(name)
    return torch.device("cpu")


def on(device, tensors):
    return [t.to(device) if isinstance(t, torch.Tensor) else t for t in tensors]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def both(fn, make_args, device, backend="aot_eager"):
    """Run ``fn`` eagerly and compiled (fullgraph) on two copies of the same arguments on
    ``device``; return (eager args, eager result, compiled args, compiled result)."""
    eager_args, compiled_args = on(device, make_args()), on(device, make_args())
    want = fn(*eager_args)
    got = torch.compile(fn, fullgraph=True, backend=backend)(*compiled_args)
    return eager_args, want, compiled_args, got


def assert_same(a, b):
    assert a.shape == b.shape and a.dtype == b.dtype
    assert torch.equal(bits(a), bits(b))


def decode_args(dtype=torch.float32, lines=(3, 0, -1, 5)):
    gen = torch.Generator().manual_seed(1)
    n = len(lines)
    return (randn(gen, (n, DIM), dtype), randn(gen, (DIM, WIDTH), dtype),
            randn(gen, (DIM,), dtype), make_state(gen, 8, DIM, WIDTH - 1, dtype, "SD"),
            torch.tensor(lines, dtype=torch.int32))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_update_compiles_and_updates_the_state(device, backend):
    def fn(x, w, b, state, lines):
        return jitconv.causal_conv1d_update(x, w, b, state, lines) * 2

    ea, want, ca, got = both(fn, decode_args, device, backend)
    assert_same(got, want)
    assert_same(ca[3], ea[3])
    before = bits(decode_args()[3])
    assert not torch.equal(bits(ca[3]), before), "the state update was lost"
    assert torch.equal(bits(ca[3])[[1, 2, 4, 6, 7]], before[[1, 2, 4, 6, 7]])


def small_mixed_step(seed, device):
    """(step, the data keys, the metadata on ``device``) of a small mixed step."""
    step = mixed_step(torch.Generator().manual_seed(seed), dim=DIM, width=WIDTH,
                      dtype=torch.float32, ns_lengths=[5, 1, 3], sp_lengths=[2, 3],
                      rows="vllm", state_len=WIDTH - 1 + 2, extra_lines=2)
    data = ("x", "weight", "bias", "conv_state")
    return step, data, {k: v.to(device) if isinstance(v, torch.Tensor) else v
                        for k, v in step.items() if k not in data}


def test_fn_and_mixed_compile(device):
    step, data, meta = small_mixed_step(2, device)

    def make():
        return [step[k].clone() for k in data]

    def mixed(x, w, b, state):
        return jitconv.causal_conv1d_mixed(x, w, b, state, **meta)

    ea, want, ca, got = both(mixed, make, device)
    assert_same(got, want)
    assert_same(ca[3], ea[3])
    assert not torch.equal(bits(ca[3]), bits(step["conv_state"]))

    qsl = torch.tensor([0, 4, 9], dtype=torch.int32, device=device)
    lines = torch.tensor([2, 0], dtype=torch.int32, device=device)

    def fn(x, w, b, state):
        return jitconv.causal_conv1d_fn(x, w, b, state, qsl, lines, [True, False])

    def make_fn():
        g = torch.Generator().manual_seed(3)
        return [randn(g, (9, DIM), torch.float32), randn(g, (DIM, WIDTH), torch.float32),
                None, make_state(g, 4, DIM, WIDTH - 1, torch.float32, "DS")]

    ea, want, ca, got = both(fn, make_fn, device)
    assert_same(got, want)
    assert_same(ca[3], ea[3])


def test_split_outputs_compile(device):
    """causal_conv1d_mixed with split outputs inside a compiled function: new ones
    (split=True, sized by the token maps) and the caller's (out_spec / out_non_spec,
    written in place), bit-identical to eager, states too."""
    step, data, meta = small_mixed_step(6, device)
    n_spec, n_non_spec = len(meta["spec_token_indx"]), len(meta["non_spec_token_indx"])

    def new(x, w, b, state):
        spec, non_spec = jitconv.causal_conv1d_mixed(x, w, b, state, split=True, **meta)
        return spec * 2, non_spec + 1

    ea, want, ca, got = both(new, lambda: [step[k].clone() for k in data], device)
    for a, b in zip(got, want):
        assert_same(a, b)
    assert_same(ca[3], ea[3])
    assert not torch.equal(bits(ca[3]), bits(step["conv_state"])), "the state update was lost"

    def given(x, w, b, state, out_spec, out_non_spec):
        jitconv.causal_conv1d_mixed(x, w, b, state, out_spec=out_spec,
                                    out_non_spec=out_non_spec, **meta)
        return out_spec.sum()

    def make():
        return [step[k].clone() for k in data] + [
            torch.full((n, DIM), float("nan")) for n in (n_spec, n_non_spec)]

    ea, want, ca, got = both(given, make, device)
    assert_same(got, want)
    for i in (3, 4, 5):
        assert_same(ca[i], ea[i])
    assert not torch.isnan(ca[5]).any()


def test_vllm_drop_ins_compile(device):
    """The update writes into x (vLLM's convention) inside the compiled function too;
    causal_conv1d_fn returns a new (dim, tokens) tensor."""
    def update(x, w, b, state, lines):
        y = vllm.causal_conv1d_update(x, state, w, b, "silu", lines)
        return y + 1

    ea, want, ca, got = both(update, lambda: decode_args(lines=(3, 0, 6, 5)), device)
    assert_same(got, want)
    assert_same(ca[0], ea[0])  # x written in place, as eagerly
    assert_same(ca[3], ea[3])

    def fn(x, w, b, state, qsl, lines):
        return vllm.causal_conv1d_fn(x.t(), w, b, state, qsl, lines)

    def make_fn():
        g = torch.Generator().manual_seed(4)
        return [randn(g, (7, DIM), torch.float32), randn(g, (DIM, WIDTH), torch.float32),
                randn(g, (DIM,), torch.float32),
                make_state(g, 4, DIM, WIDTH - 1, torch.float32, "SD"),
                torch.tensor([0, 3, 7], dtype=torch.int32),
                torch.tensor([1, 3], dtype=torch.int32)]

    ea, want, ca, got = both(fn, make_fn, device)
    assert_same(got, want)
    assert_same(ca[3], ea[3])


def test_bad_input_raises_when_compiled(device):
    """Validation still runs (inside the op, when the compiled function runs): a bad
    value of host metadata raises naming the argument, conv_state as it was; metadata on
    a GPU is checked there, and ``jitconv.check_errors`` raises it after the call."""
    x, w, b, state, lines = on(device, decode_args(lines=(3, 99, -1, 5)))

    def fn(x, w, b, state, lines):
        return jitconv.causal_conv1d_update(x, w, b, state, lines)

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    if lines.is_cuda:
        jitconv.check_errors()
        compiled(x, w, b, state, lines)
        with pytest.raises(ValueError, match="a cache line out of range"):
            jitconv.check_errors()
        lines = lines.cpu()  # host metadata, x on the GPU
    before = bits(state)
    with pytest.raises(Exception, match="conv_state_indices"):
        compiled(x, w, b, state, lines)
    assert torch.equal(bits(state), before)


def test_ops_pass_torch_opcheck(device):
    """torch.library.opcheck: schema (declared mutations match what the op writes), fake
    implementation against the real one, and dispatch through AOT autograd."""
    x, w, b, state, lines = on(device, decode_args())
    torch.library.opcheck(torch.ops.jitconv.causal_conv1d_update.default,
                          (x, w, b, state, lines, None, None, "silu", -1, None, None))
    x, w, b, state, lines = on(device, decode_args(lines=(3, 0, 6, 5)))
    torch.library.opcheck(torch.ops.jitconv.vllm_causal_conv1d_update.default,
                          (x, state, w, b, "silu", lines, None, None, -1, 0, None, None))
    # split outputs: two decodes (rows 0, 1) and a spec sequence of one token (row 2)
    x, w, b, state, _lines = on(device, decode_args(lines=(3, 0, 6, 5)))
    ints = [torch.tensor(v, dtype=torch.int32, device=x.device) for v in (
        [0, 1, 2], [3, 0], [0, 1], [0, 1], [[6]], [2], [1])]
    qsl, ns_lines, ns_rows, sp_qsl, sp_lines, sp_rows, accepted = ints
    out_spec, out_non_spec = (torch.full((n, DIM), float("nan"), device=x.device)
                              for n in (1, 2))
    torch.library.opcheck(torch.ops.jitconv.causal_conv1d_mixed_split.default,
                          (x, w, b, state, out_spec, out_non_spec, qsl, ns_lines, None,
                           ns_rows, sp_qsl, sp_lines, sp_rows, accepted, None, "silu", -1,
                           None))
