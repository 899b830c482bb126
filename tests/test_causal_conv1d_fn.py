"""causal_conv1d_fn (prefill chunks + plain decodes) against the float64 reference.

The grid crosses dtypes, widths, activation, bias, state layout, pads, shuffled token
maps and mixed has_initial_state; every batch holds sequences of lengths
{1, 2, width-1, 8, 129, 1024}. Outputs are poisoned (NaN) before the call; states are
compared bit-exactly, including the untouched tail columns and unused cache lines.
"""

import itertools

import numpy as np
import pytest
import torch

import jitconv
from jitconv.reference import causal_conv1d_fn_reference

from helpers import (DTYPES, TOLERANCE, assert_outputs_close, assert_state_exact, bits,
                     cumulative, fn_arguments, make_state, mixed_step, poisoned, randn)

def lengths_for(width):
    return [1, 2, width - 1, 8, 129, 1024]


def build_case(seed, *, dtype, width, dim, layout, use_bias, pads, shuffle, init_mode,
               lengths=None, usm=False, strided=False):
    """Random inputs and metadata for one call: causal_conv1d_fn kwargs plus the sequence
    lengths. Two pads when ``pads``; 3 spare state columns (state_len = width - 1 + 3) and
    3 unused cache lines, which must stay bit-identical."""
    gen = torch.Generator().manual_seed(seed)
    lengths = list(lengths if lengths is not None else lengths_for(width))
    lengths = [lengths[i] for i in torch.randperm(len(lengths), generator=gen)]
    step = mixed_step(gen, dim=dim, width=width, dtype=dtype, ns_lengths=lengths,
                      rows="shuffled" if shuffle else "plain", ns_pads=2 if pads else 0,
                      initial=None if init_mode == "all" else "alternate",
                      extra_state_columns=3, extra_lines=3, layout=layout, bias=use_bias,
                      usm=usm, strided=strided)
    return fn_arguments(step), lengths


def run_and_check(case, *, activation, dtype, out=None):
    state_before = bits(case["conv_state"])
    ref_out, ref_state = causal_conv1d_fn_reference(activation=activation, **case)
    result = jitconv.causal_conv1d_fn(activation=activation, out=out, **case)
    if out is not None:
        assert result is out
    assert result.dtype == dtype and tuple(result.shape) == tuple(case["x"].shape)
    assert_outputs_close(result, ref_out, dtype)
    assert_state_exact(case["conv_state"], ref_state)
    # Say it explicitly: unused lines and the tail columns were not written at all.
    used = case["cache_indices"][case["cache_indices"] >= 0].long()
    unused = torch.ones(case["conv_state"].shape[0], dtype=torch.bool)
    unused[used] = False
    width = case["weight"].shape[-1]
    after = bits(case["conv_state"])
    assert torch.equal(after[unused], state_before[unused])
    assert torch.equal(after[:, :, width - 1:], state_before[:, :, width - 1:])
    return result


GRID = list(itertools.product(
    DTYPES, (2, 3, 4, 5), ("silu", None), (True, False), ("SD", "DS"),
    (False, True), (False, True), ("all", "mixed")))


@pytest.mark.parametrize(
    "dtype_name,width,activation,use_bias,layout,pads,shuffle,init_mode", GRID,
    ids=["-".join(str(v) for v in p) for p in GRID])
def test_grid_dim136(sycl_device, dtype_name, width, activation, use_bias, layout, pads,
                     shuffle, init_mode):
    dtype = DTYPES[dtype_name]
    seed = GRID.index((dtype_name, width, activation, use_bias, layout, pads, shuffle,
                       init_mode))
    case, _ = build_case(seed, dtype=dtype, width=width, dim=136, layout=layout,
                         use_bias=use_bias, pads=pads, shuffle=shuffle, init_mode=init_mode)
    out = poisoned(tuple(case["x"].shape), dtype)
    run_and_check(case, activation=activation, dtype=dtype, out=out)


@pytest.mark.parametrize("dim", [64, 2048])
@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("width", [2, 3, 4, 5])
@pytest.mark.parametrize("layout", ["SD", "DS"])
def test_other_dims(sycl_device, dim, dtype_name, width, layout):
    dtype = DTYPES[dtype_name]
    case, _ = build_case(1000 + dim + width, dtype=dtype, width=width, dim=dim,
                         layout=layout, use_bias=True, pads=True, shuffle=True,
                         init_mode="mixed", strided=True)
    out = poisoned(tuple(case["x"].shape), dtype)
    run_and_check(case, activation="silu", dtype=dtype, out=out)


@pytest.mark.parametrize("width", [6, 7, 8])
def test_wider_kernels(sycl_device, width):
    case, _ = build_case(50 + width, dtype=torch.float32, width=width, dim=72, layout="SD",
                         use_bias=True, pads=True, shuffle=True, init_mode="mixed")
    run_and_check(case, activation="silu", dtype=torch.float32)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_new_output_and_strided_x(sycl_device, dtype_name):
    """out=None returns a new tensor; x as a strided slice of a wider projection."""
    dtype = DTYPES[dtype_name]
    case, _ = build_case(7, dtype=dtype, width=4, dim=136, layout="SD", use_bias=True,
                         pads=True, shuffle=False, init_mode="mixed", strided=True)
    assert case["x"].stride(0) > case["x"].shape[1]
    x_before = bits(case["x"])
    result = run_and_check(case, activation="silu", dtype=dtype)
    assert result.data_ptr() != case["x"].data_ptr()
    assert torch.equal(bits(case["x"]), x_before), "x must not be modified"


@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_out_may_alias_x(sycl_device, dtype_name):
    dtype = DTYPES[dtype_name]
    case, _ = build_case(8, dtype=dtype, width=4, dim=64, layout="DS", use_bias=True,
                         pads=True, shuffle=True, init_mode="mixed")
    ref_out, ref_state = causal_conv1d_fn_reference(**case)
    x = case["x"]
    result = jitconv.causal_conv1d_fn(out=x, **case)
    assert result is x
    assert_outputs_close(x, ref_out, dtype)
    assert_state_exact(case["conv_state"], ref_state)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("layout", ["SD", "DS"])
def test_usm_tensors_are_zero_copy(sycl_device, dtype_name, layout):
    """Tensors from jitconv.empty/zeros reach the kernel with no copy, and the state update
    lands in the caller's tensor."""
    dtype = DTYPES[dtype_name]
    case, _ = build_case(9, dtype=dtype, width=4, dim=136, layout=layout, use_bias=True,
                         pads=True, shuffle=True, init_mode="mixed", usm=True)
    out = poisoned(tuple(case["x"].shape), dtype, usm=True)
    jitconv.reset_copy_counts()
    run_and_check(case, activation="silu", dtype=dtype, out=out)
    assert jitconv.copy_counts() == {"to_device": 0, "from_device": 0}


def test_plain_cpu_tensors_are_copied_and_updated(sycl_device):
    """Non-USM CPU tensors are copied in, and conv_state/out copied back: counted."""
    case, _ = build_case(10, dtype=torch.float32, width=4, dim=64, layout="SD",
                         use_bias=True, pads=False, shuffle=False, init_mode="all")
    out = poisoned(tuple(case["x"].shape), torch.float32)
    jitconv.reset_copy_counts()
    run_and_check(case, activation="silu", dtype=torch.float32, out=out)
    counts = jitconv.copy_counts()
    assert counts == {"to_device": 5, "from_device": 2}, counts  # x, out, w, b, state


def test_copies_can_be_forbidden(sycl_device):
    case, _ = build_case(11, dtype=torch.float32, width=4, dim=64, layout="SD",
                         use_bias=True, pads=False, shuffle=False, init_mode="all")
    before = bits(case["conv_state"])
    jitconv.set_allow_copies(False)
    try:
        with pytest.raises(jitconv.CopyRequiredError, match="x: this CPU tensor"):
            jitconv.causal_conv1d_fn(**case)
    finally:
        jitconv.set_allow_copies(True)
    assert torch.equal(bits(case["conv_state"]), before)


def test_zero_length_sequences_and_no_sequences(sycl_device):
    """A sequence with no tokens still applies the state rule (zeros without initial
    state); a call with no sequences at all is valid and touches nothing."""
    gen = torch.Generator().manual_seed(12)
    dim, width = 40, 4
    x = randn(gen, (3, dim), torch.float32)
    w = randn(gen, (dim, width), torch.float32)
    st = randn(gen, (4, dim, 5), torch.float32)
    case = dict(x=x, weight=w, bias=None, conv_state=st,
                query_start_loc=cumulative([0, 3, 0]),
                cache_indices=torch.tensor([0, 2, 3], dtype=torch.int32),
                has_initial_state=torch.tensor([False, True, True]))
    ref_out, ref_state = causal_conv1d_fn_reference(**case)
    out = jitconv.causal_conv1d_fn(**case)
    assert_outputs_close(out, ref_out, torch.float32)
    assert_state_exact(st, ref_state)
    assert torch.equal(st[0, :, :3], torch.zeros(dim, 3))

    empty_x = torch.empty((0, dim))
    before = bits(st)
    res = jitconv.causal_conv1d_fn(empty_x, w, None, st, cumulative([]),
                                   torch.zeros(0, dtype=torch.int32))
    assert res.shape == (0, dim)
    assert torch.equal(bits(st), before)


def test_all_rows_written_when_token_map_covers_fewer_rows(sycl_device):
    """Rows of x that no sequence uses come out as zeros, never stale memory."""
    gen = torch.Generator().manual_seed(13)
    dim, width = 64, 4
    x = randn(gen, (20, dim), torch.bfloat16)
    case = dict(x=x, weight=randn(gen, (dim, width), torch.bfloat16),
                bias=randn(gen, (dim,), torch.bfloat16),
                conv_state=make_state(gen, 3, dim, 3, torch.bfloat16, "SD"),
                query_start_loc=cumulative([5, 7]),
                cache_indices=torch.tensor([2, 0], dtype=torch.int32),
                token_indx=torch.tensor([19, 3, 5, 7, 0, 1, 2, 4, 6, 8, 10, 12],
                                        dtype=torch.int32))
    ref_out, ref_state = causal_conv1d_fn_reference(**case)
    out = poisoned((20, dim), torch.bfloat16)
    jitconv.causal_conv1d_fn(out=out, **case)
    assert_outputs_close(out, ref_out, torch.bfloat16)
    assert torch.equal(out[[9, 11, 13, 14, 15, 16, 17, 18]].float(), torch.zeros(8, dim))
    assert_state_exact(case["conv_state"], ref_state)


def test_chunked_prefill_equals_one_call(sycl_device):
    """Two chunks (second continuing from the state the first left) == one chunk."""
    gen = torch.Generator().manual_seed(14)
    dim, width, n = 136, 4, 300
    x = randn(gen, (n, dim), torch.float32)
    w = randn(gen, (dim, width), torch.float32)
    b = randn(gen, (dim,), torch.float32)
    st_one = make_state(gen, 2, dim, 3, torch.float32, "SD")
    st_two = st_one.clone()
    lines = torch.tensor([1], dtype=torch.int32)
    whole = jitconv.causal_conv1d_fn(x, w, b, st_one, cumulative([n]), lines,
                                      torch.tensor([False]))
    first = jitconv.causal_conv1d_fn(x[:77], w, b, st_two, cumulative([77]), lines,
                                     torch.tensor([False]))
    second = jitconv.causal_conv1d_fn(x[77:], w, b, st_two, cumulative([n - 77]), lines,
                                      torch.tensor([True]))
    torch.testing.assert_close(torch.cat([first, second]), whole, rtol=1e-6, atol=1e-6)
    assert torch.equal(bits(st_one), bits(st_two))


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("activation", ["silu", None])
def test_nan_and_inf_propagate_like_the_reference(sycl_device, dtype_name, activation):
    """NaN stays NaN and infinities follow float semantics through the dtype conversion
    (the bf16 rounding keeps NaN quiet instead of rounding it into infinity)."""
    dtype = DTYPES[dtype_name]
    gen = torch.Generator().manual_seed(15)
    dim, width = 48, 4
    x = randn(gen, (6, dim), dtype)
    x[1, 3] = float("nan")
    x[2, 7] = float("inf")
    x[4, 9] = -float("inf")
    case = dict(x=x, weight=randn(gen, (dim, width), dtype), bias=randn(gen, (dim,), dtype),
                conv_state=make_state(gen, 2, dim, 3, dtype, "SD"),
                query_start_loc=cumulative([6]),
                cache_indices=torch.tensor([1], dtype=torch.int32))
    ref_out, ref_state = causal_conv1d_fn_reference(activation=activation, **case)
    out = jitconv.causal_conv1d_fn(activation=activation, **case)
    got = out.to(torch.float64).numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref_out))
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(ref_out))
    finite = np.isfinite(ref_out)
    rtol, atol = TOLERANCE[dtype]
    np.testing.assert_allclose(got[finite], ref_out[finite], rtol=rtol, atol=atol)
    assert_state_exact(case["conv_state"], ref_state)
