"""Parent maps (tree verify) and intermediate windows in the one launch of a mixed step
(docs/SEMANTICS.md "More state rules"), against the float64 reference: outputs within
tolerance, states and windows bit-exact, everything else untouched."""

import pytest
import torch

import jitconv
from jitconv.reference import causal_conv1d_reference

from helpers import (DTYPES, assert_outputs_close, assert_state_exact, bits, build_mixed,
                     check_rules_case, random_parents, with_rules)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("width", [2, 3, 4, 6])
@pytest.mark.parametrize("usm", [False, True])
def test_trees_and_windows_in_a_mixed_step(sycl_device, dtype_name, width, usm):
    """Prefill chunks, decodes, tree-verify spec sequences and pads in one launch; window
    rows for some sequences of both parts (the wide kernel takes 16-bit data in USM)."""
    dtype = DTYPES[dtype_name]
    gen = torch.Generator().manual_seed(width * 10 + usm)
    case = build_mixed(width + 100 * usm, dtype=dtype, width=width, dim=136, usm=usm)
    case, windows = with_rules(case, gen, usm=usm)
    check_rules_case(case, windows, dtype)


@pytest.mark.parametrize("width", [3, 4])
def test_sglang_verify_windows_every_token(sycl_device, width):
    """SGLang's target verify: non-spec sequences (state: their last S tokens) that write
    every token's window, with and without a tree; contiguous rows (no token maps)."""
    dtype = torch.bfloat16
    gen = torch.Generator().manual_seed(width)
    lengths = [4, 4, 4]
    dim, S = 64, width - 1
    x = torch.randn(sum(lengths), dim, generator=gen).to(dtype)
    case = dict(x=x, weight=torch.randn(dim, width, generator=gen).to(dtype),
                bias=torch.randn(dim, generator=gen).to(dtype),
                conv_state=torch.randn(5, dim, S, generator=gen).to(dtype),
                non_spec_query_start_loc=torch.tensor([0, 4, 8, 12], dtype=torch.int32),
                non_spec_state_indices=torch.tensor([3, 0, 1], dtype=torch.int32),
                non_spec_window_rows=torch.tensor([2, 0, 1], dtype=torch.int32))
    windows = torch.randn(3, 4, dim, S, generator=gen).to(dtype)
    check_rules_case(case, windows, dtype)
    case["non_spec_parent_token"] = random_parents(gen, lengths)
    check_rules_case(case, windows, dtype)


def test_linear_parent_map_is_bit_identical_to_none(sycl_device):
    dtype = torch.float32
    case = build_mixed(7, dtype=dtype, width=4, dim=64)
    lengths = torch.diff(case["spec_query_start_loc"]).tolist()
    parents = torch.full((len(lengths), 6), -1, dtype=torch.int32)
    for i, n in enumerate(lengths):
        parents[i, 1:n] = torch.arange(n - 1)
    plain_state = case["conv_state"].clone()
    plain = jitconv.causal_conv1d_mixed(**{**case, "conv_state": plain_state})
    tree = jitconv.causal_conv1d_mixed(spec_parent_token=parents, **case)
    assert torch.equal(bits(plain), bits(tree))
    assert torch.equal(bits(plain_state), bits(case["conv_state"]))


def test_out_aliasing_x_with_a_tree(sycl_device):
    """A token's inputs are its ancestors' rows of x: in place, the launch computes into a
    separate buffer first (the result is the same as with a new output)."""
    dtype = torch.float32
    gen = torch.Generator().manual_seed(3)
    case = build_mixed(3, dtype=dtype, width=4, dim=64, non_spec=False, pads=False,
                       shuffle=False)
    case, windows = with_rules(case, gen, windows=None)
    ref_out, ref_state = causal_conv1d_reference(**case)
    x = case["x"]
    result = jitconv.causal_conv1d_mixed(out=x, **case)
    assert result is x
    assert_outputs_close(result, ref_out, dtype)
    assert_state_exact(case["conv_state"], ref_state)


def test_a_plan_runs_the_rules_for_every_layer(sycl_device):
    dtype = torch.float16
    gen = torch.Generator().manual_seed(5)
    case = build_mixed(5, dtype=dtype, width=4, dim=64)
    case, windows = with_rules(case, gen)
    meta = {k: v for k, v in case.items() if k not in ("x", "weight", "bias", "conv_state")}
    state = case["conv_state"]
    plan = jitconv.plan(case["x"].shape[0], state.shape[0], state.shape[2], 4, **meta)
    for layer in range(2):
        layer_state = state.clone()
        layer_windows = windows.clone()
        ref = causal_conv1d_reference(intermediate_windows=layer_windows, **{
            **case, "conv_state": layer_state})
        out = plan.run(case["x"], case["weight"], case["bias"], layer_state,
                       intermediate_windows=layer_windows)
        assert_outputs_close(out, ref[0], dtype)
        assert_state_exact(layer_state, ref[1])
        assert torch.equal(bits(layer_windows), bits(torch.from_numpy(ref[2]).to(dtype)))


# ------------------------------------------------------------------ bad input

def _tree_case():
    gen = torch.Generator().manual_seed(11)
    case = build_mixed(11, dtype=torch.float32, width=4, dim=32, pads=False)
    return gen, case


@pytest.mark.parametrize("bad,message", [
    ("cycle", "token 1: its parent must be a token before it"),
    ("after", "must be a token before it"),
    ("range", "must be a token before it"),
    ("rows", "expected 6 rows"),
    ("columns", "columns"),
])
def test_a_bad_parent_map_is_refused_before_launch(sycl_device, bad, message):
    gen, case = _tree_case()
    lengths = torch.diff(case["spec_query_start_loc"]).tolist()
    parents = random_parents(gen, lengths)
    i = next(k for k, n in enumerate(lengths) if n >= 3)
    if bad == "cycle":
        parents[i, 1] = 1
    elif bad == "after":
        parents[i, 1] = 2
    elif bad == "range":
        parents[i, 2] = -1
    elif bad == "rows":
        parents = parents[:-1]
    else:
        parents = parents[:, :1]
    before = bits(case["conv_state"])
    with pytest.raises(ValueError, match="spec_parent_token") as info:
        jitconv.causal_conv1d_mixed(spec_parent_token=parents, **case)
    assert message in str(info.value)
    assert torch.equal(bits(case["conv_state"]), before)


@pytest.mark.parametrize("bad,error,message", [
    ("missing", ValueError, "intermediate_windows: required"),
    ("unasked", ValueError, "no sequence has a window row"),
    ("rows", ValueError, "but a sequence writes row"),
    ("steps", ValueError, "steps"),
    ("shape", ValueError, "expected shape"),
    ("dtype", TypeError, "dtype must match x"),
    ("duplicate", ValueError, "spec_window_rows/non_spec_window_rows"),
    ("negative", ValueError, "or -1 for none"),
    ("overlap", ValueError, "overlap"),
])
def test_bad_windows_are_refused_before_launch(sycl_device, bad, error, message):
    gen, case = _tree_case()
    case, windows = with_rules(case, gen, windows="all")
    if bad == "missing":
        windows = None
    elif bad == "unasked":
        case.pop("spec_window_rows")
        case.pop("non_spec_window_rows")
    elif bad == "rows":
        windows = windows[:-1]
    elif bad == "steps":
        windows = windows[:, :2]
    elif bad == "shape":
        windows = windows[..., :1]
    elif bad == "dtype":
        windows = windows.to(torch.float16)
    elif bad == "duplicate":
        case["spec_window_rows"] = case["spec_window_rows"].clone()
        case["spec_window_rows"][0] = case["non_spec_window_rows"][0]
    elif bad == "negative":
        case["spec_window_rows"] = case["spec_window_rows"].clone()
        case["spec_window_rows"][0] = -2
    elif bad == "overlap":
        state = case["conv_state"]  # the windows as a view of the state's memory
        windows = state.as_strided(tuple(windows.shape[:2]) + (state.shape[1], 3),
                                   (0, 0, state.stride(1), state.stride(2)))
    before = bits(case["conv_state"])
    with pytest.raises(error) as info:
        jitconv.causal_conv1d_mixed(intermediate_windows=windows, **case)
    assert message in str(info.value)
    assert torch.equal(bits(case["conv_state"]), before)
