"""causal_conv1d_mixed / causal_conv1d_update: prefill chunks, plain decodes and spec
verify sequences in one invocation, against the float64 reference and the invariants of
docs/SEMANTICS.md."""

import pytest
import torch

import jitconv
from jitconv.backends.sycl import launching
from jitconv.reference import causal_conv1d_reference
from jitconv.backends.sycl.state import STATE as SYCL_STATE

from helpers import (DTYPES, GRID, assert_outputs_close, assert_state_exact, bits,
                     build_mixed, check_grid_case, check_mixed_equals_split, cumulative,
                     grid_ids, make_state, poisoned, randn, run_and_check, wide_choices)

@pytest.mark.parametrize("params", GRID, ids=grid_ids(GRID))
def test_mixed_grid(sycl_device, params):
    # In USM memory, zero-copy: the kernel sees the layouts as built (a plain CPU tensor
    # would reach it as a contiguous copy); other tests cover that copy path.
    check_grid_case(params, dim=136, usm=True)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("dim", [64, 2048])
def test_mixed_other_dims_usm_zero_copy(sycl_device, dtype_name, dim):
    dtype = DTYPES[dtype_name]
    case = build_mixed(dim, dtype=dtype, width=4, dim=dim, usm=True)
    jitconv.reset_copy_counts()
    run_and_check(case, dtype=dtype)
    assert jitconv.copy_counts() == {"to_device": 0, "from_device": 0}


def _relaid(t, layout, gen):
    """``t`` (a (dim, width) weight or a (dim,) bias) with the same values in another
    memory layout, in jitconv USM memory (zero-copy: the element offset reaches the
    kernel). "offset<k>": stored k elements into a larger buffer (k = 1, 2: not 8-byte
    aligned for 16-bit data; 4: aligned), "transposed": the channel is the unit-stride
    index, "padded": channels further apart than the row's length."""
    if layout == "contiguous":
        return t
    n = t.numel()
    if layout.startswith("offset"):
        k = int(layout[len("offset"):])
        buf = randn(gen, (n + k,), t.dtype, True)
        view = buf[k:].view(t.shape)
    elif layout == "transposed":
        view = randn(gen, tuple(reversed(t.shape)), t.dtype, True).t()
    else:
        assert layout == "padded", layout
        wide = randn(gen, (t.shape[0], (t.shape[1] if t.dim() == 2 else 1) + 3), t.dtype, True)
        view = wide[:, :t.shape[1]] if t.dim() == 2 else wide[:, 1]
    view.copy_(t)
    return view


def check_relaid(dtype_name, width, dim, weight_layout, bias_layout, state_layout="SD"):
    """A mixed step with its weight and bias relaid (``_relaid``) in USM memory, run
    zero-copy into a poisoned out and compared with the reference."""
    dtype = DTYPES[dtype_name]
    gen = torch.Generator().manual_seed(width)
    case = build_mixed(width, dtype=dtype, width=width, dim=dim, usm=True,
                       layout=state_layout)
    case["weight"] = _relaid(case["weight"], weight_layout, gen)
    case["bias"] = _relaid(case["bias"], bias_layout, gen)
    jitconv.reset_copy_counts()
    run_and_check(case, dtype=dtype, out=poisoned(tuple(case["x"].shape), dtype, usm=True))
    assert jitconv.copy_counts() == {"to_device": 0, "from_device": 0}


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("width", [3, 4])
@pytest.mark.parametrize("weight_layout",
                         ["contiguous", "offset1", "offset2", "offset4", "transposed", "padded"])
@pytest.mark.parametrize("bias_layout", ["contiguous", "offset1", "padded"])
def test_weight_and_bias_layouts(sycl_device, dtype_name, width, weight_layout, bias_layout):
    """Every weight and bias layout gives the reference's result: the SYCL kernel reads
    them by stride-specific paths (a channel's four 16-bit taps as one 64-bit word when
    the weight is (dim, 4) with aligned rows, unit-stride bias reads), each with its
    general fallback."""
    check_relaid(dtype_name, width, 136, weight_layout, bias_layout)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("width", [3, 4])
@pytest.mark.parametrize("weight_layout,bias_layout,state_layout", [
    ("contiguous", "contiguous", "SD"), ("offset1", "offset1", "SD"),
    ("offset4", "offset1", "SD"), ("padded", "padded", "DS"),
    ("transposed", "contiguous", "DS")])
def test_layouts_at_a_wide_dim(sycl_device, dtype_name, width, weight_layout, bias_layout,
                               state_layout):
    """The same read paths at dim 2048, where the OpenCL CPU compiler runs many 16-channel
    vectors per work-group: a miscompiled 64-bit taps read (ptrtoint/inttoptr addressing)
    was right at dim 64 and 136 and wrong for channels 16 and up at dim 2048."""
    check_relaid(dtype_name, width, 2048, weight_layout, bias_layout, state_layout)


def _moved(t, gen, offset=0, row_pad=0):
    """A copy of ``t`` (2-D, channels last, in USM memory) ``offset`` elements into a
    larger buffer whose rows are ``row_pad`` elements longer: a view with the same
    values whose first element / row starts are shifted."""
    rows, dim = t.shape
    buf = randn(gen, (offset + rows * (dim + row_pad),), t.dtype, True)
    view = buf[offset:].view(rows, dim + row_pad)[:, :dim]
    view.copy_(t)
    return view


def _moved_state(state, gen, offset):
    """An "SD" conv_state (a (lines, dim, state_len) view of (lines, state_len, dim)
    memory) copied ``offset`` elements into a larger USM buffer."""
    lines, dim, state_len = state.shape
    buf = randn(gen, (offset + state.numel(),), state.dtype, True)
    view = buf[offset:].view(lines, state_len, dim).transpose(1, 2)
    view.copy_(state)
    return view


# (what is changed, whether the 16-bit launch takes the wide kernel): its 4-channel
# accesses need dim % 4 == 0 and the rows of x, out and conv_state (channels contiguous)
# to start on 8-byte boundaries; anything else takes the one-channel kernel.
WIDE_CASES = [("aligned", True), ("x offset 4", True), ("x offset 2", False),
              ("x row stride +2", False), ("x row stride +4", True), ("out offset 1", False),
              ("state offset 2", False), ("state offset 4", True), ("state DS", False),
              ("dim 138", False)]


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("change,wide", WIDE_CASES, ids=[c for c, _ in WIDE_CASES])
def test_wide_kernel_where_rows_are_aligned(sycl_device, monkeypatch, dtype_name, change,
                                            wide):
    """16-bit launches take the wide kernel exactly where its accesses are aligned (never
    for float32), and every choice gives the reference's result, zero-copy."""
    dtype = DTYPES[dtype_name]
    gen = torch.Generator().manual_seed(17)
    case = build_mixed(17, dtype=dtype, width=4, dim=138 if change == "dim 138" else 136,
                       usm=True, layout="DS" if change == "state DS" else "SD")
    out = poisoned(tuple(case["x"].shape), dtype, usm=True)
    kind, _, amount = change.rpartition(" ")
    if kind == "x offset":
        case["x"] = _moved(case["x"], gen, offset=int(amount))
    elif kind == "x row stride":
        case["x"] = _moved(case["x"], gen, row_pad=int(amount))
    elif kind == "out offset":
        out = _moved(out, gen, offset=int(amount))
    elif kind == "state offset":
        case["conv_state"] = _moved_state(case["conv_state"], gen, int(amount))
    chosen = wide_choices(monkeypatch)
    jitconv.reset_copy_counts()
    run_and_check(case, dtype=dtype, out=out)
    assert jitconv.copy_counts() == {"to_device": 0, "from_device": 0}
    assert chosen == [wide and dtype_name in launching.WIDE_CHANNELS]


@pytest.mark.parametrize("dtype_name", sorted(launching.WIDE_CHANNELS))
@pytest.mark.parametrize("width", [2, 3, 4, 5])
@pytest.mark.parametrize("dim", [136, 2048])
def test_wide_kernel_equals_one_channel_kernel(sycl_device, monkeypatch, dtype_name, width,
                                               dim):
    """The wide kernel computes what the one-channel kernel computes, bit for bit
    (outputs and states): each channel's arithmetic is the same, only the accesses
    differ."""
    dtype = DTYPES[dtype_name]
    results = []
    for wide in (True, False):
        SYCL_STATE.runs.clear()  # the second case may get the first one's addresses
        case = build_mixed(width, dtype=dtype, width=width, dim=dim, usm=True)
        if not wide:
            monkeypatch.setattr(launching, "wide_fits", lambda *args: False)
        chosen = wide_choices(monkeypatch)
        out = run_and_check(case, dtype=dtype, out=poisoned(tuple(case["x"].shape), dtype,
                                                            usm=True))
        assert chosen == [wide]
        results.append((bits(out), bits(case["conv_state"])))
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][1], results[1][1])


@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_one_launch_for_the_whole_step(sycl_device, dtype_name):
    case = build_mixed(3, dtype=DTYPES[dtype_name], width=4, dim=64)
    jitconv.causal_conv1d_mixed(**case)  # compile outside the count
    before = SYCL_STATE.stats["submitted"]
    jitconv.causal_conv1d_mixed(**case)
    assert SYCL_STATE.stats["submitted"] == before + 1


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("shuffle", [False, True])
def test_mixed_equals_spec_call_plus_non_spec_call(sycl_device, dtype_name, shuffle):
    """Same rows, same states, bit for bit: the single invocation changes nothing."""
    check_mixed_equals_split(build_mixed(21, dtype=DTYPES[dtype_name], width=4, dim=136,
                                         shuffle=shuffle))


def _decode_one_by_one(x_rows, w, b, state, line):
    outs = []
    for row in x_rows:
        outs.append(jitconv.causal_conv1d_update(row[None], w, b, state,
                                                 torch.tensor([line], dtype=torch.int32)))
    return torch.cat(outs)


@pytest.mark.parametrize("width", [2, 4, 5])
@pytest.mark.parametrize("k", [1, 3])
def test_spec_steps_equal_sequential_decoding(sycl_device, width, k):
    """Verify step with 1+k tokens, then the next step with a accepted == decoding the
    accepted tokens one by one and continuing."""
    gen = torch.Generator().manual_seed(100 * width + k)
    dim, n = 72, 1 + k
    S = width - 1
    state_len = S - 1 + n + 1
    w = randn(gen, (dim, width), torch.float32)
    b = randn(gen, (dim,), torch.float32)
    history = randn(gen, (1, dim, state_len), torch.float32)
    drafts = randn(gen, (n, dim), torch.float32)
    nxt = randn(gen, (n, dim), torch.float32)
    line = torch.tensor([0], dtype=torch.int32)
    for accepted in range(1, n + 1):
        spec_state = history.clone()
        jitconv.causal_conv1d_update(drafts, w, b, spec_state, line,
                                     query_start_loc=cumulative([n]),
                                     num_accepted_tokens=torch.tensor([1], dtype=torch.int32))
        got = jitconv.causal_conv1d_update(
            nxt, w, b, spec_state, line, query_start_loc=cumulative([n]),
            num_accepted_tokens=torch.tensor([accepted], dtype=torch.int32))

        seq_state = history.clone()
        _decode_one_by_one(drafts[:accepted], w, b, seq_state, 0)
        want = _decode_one_by_one(nxt, w, b, seq_state, 0)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_non_spec_num_accepted_tokens(sycl_device, dtype_name):
    """A prefill chunk / decode after a spec step that accepted a tokens reads its window
    at column a-1 (the upstream kernels read column 0: stale window)."""
    dtype = DTYPES[dtype_name]
    case = build_mixed(31, dtype=dtype, width=4, dim=136, non_spec_accepted=True)
    assert int(case["non_spec_num_accepted_tokens"].max()) > 1
    run_and_check(case, dtype=dtype)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("width", [2, 3, 4, 5])
def test_update_plain_decode(sycl_device, dtype_name, width):
    """One token per sequence, no query_start_loc, pads, (Q, K) indices."""
    dtype = DTYPES[dtype_name]
    gen = torch.Generator().manual_seed(width)
    dim, batch = 136, 9
    x = randn(gen, (batch, dim), dtype)
    w, b = randn(gen, (dim, width), dtype), randn(gen, (dim,), dtype)
    state = make_state(gen, batch + 2, dim, width - 1 + 1, dtype, "SD")
    lines = torch.randperm(batch + 2, generator=gen)[:batch].to(torch.int32)
    lines[4] = -1
    indices = torch.stack([lines, torch.zeros_like(lines)], 1)
    ref_out, ref_state = causal_conv1d_reference(
        x, w, b, state, non_spec_query_start_loc=cumulative([1] * batch),
        non_spec_state_indices=lines)
    out = poisoned((batch, dim), dtype)
    jitconv.causal_conv1d_update(x, w, b, state, indices, out=out)
    assert_outputs_close(out, ref_out, dtype)
    assert_state_exact(state, ref_state)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("spec", [False, True])
def test_update_varlen(sycl_device, dtype_name, spec):
    """Several ragged tokens per sequence; spec rule when num_accepted_tokens is given."""
    dtype = DTYPES[dtype_name]
    case = build_mixed(41, dtype=dtype, width=4, dim=136, non_spec=False)
    kwargs = dict(conv_state_indices=case["spec_state_indices"],
                  query_start_loc=case["spec_query_start_loc"],
                  token_indx=case["spec_token_indx"])
    ref_kwargs = dict(spec_query_start_loc=case["spec_query_start_loc"],
                      spec_state_indices=case["spec_state_indices"],
                      spec_token_indx=case["spec_token_indx"])
    if spec:
        kwargs["num_accepted_tokens"] = case["num_accepted_tokens"]
        ref_kwargs["num_accepted_tokens"] = case["num_accepted_tokens"]
        ref_out, ref_state = causal_conv1d_reference(
            case["x"], case["weight"], case["bias"], case["conv_state"], **ref_kwargs)
    else:  # plain multi-token decode: the non-spec rule, continuing from the state
        ref_out, ref_state = causal_conv1d_reference(
            case["x"], case["weight"], case["bias"], case["conv_state"],
            non_spec_query_start_loc=case["spec_query_start_loc"],
            non_spec_state_indices=case["spec_state_indices"][:, 0],
            non_spec_token_indx=case["spec_token_indx"])
    out = jitconv.causal_conv1d_update(case["x"], case["weight"], case["bias"],
                                       case["conv_state"], **kwargs)
    assert_outputs_close(out, ref_out, dtype)
    assert_state_exact(case["conv_state"], ref_state)


def test_mixed_with_only_one_part(sycl_device):
    for part in ("non_spec", "spec"):
        case = build_mixed(51, dtype=torch.float32, width=4, dim=64,
                           non_spec=part == "non_spec", spec=part == "spec")
        run_and_check(case, dtype=torch.float32)
