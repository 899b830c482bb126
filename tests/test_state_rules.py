"""Parent maps (tree verify), intermediate windows, write lines, checkpoints and circular
lines in the one launch of a mixed step (docs/SEMANTICS.md "More state rules"), against
the float64 reference: outputs within tolerance, states and windows bit-exact, everything
else untouched."""

import pytest
import torch

import jitconv
from jitconv.reference import causal_conv1d_reference

from jitconv.backends.sycl.state import STATE as SYCL_STATE
from helpers import (DTYPES, assert_outputs_close, assert_state_exact, bits, build_mixed,
                     check_rules_case, random_parents, with_lines, with_ring, with_rules)


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


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("width", [2, 4, 6])
@pytest.mark.parametrize("usm", [False, True])
def test_every_rule_in_one_launch(sycl_device, dtype_name, width, usm):
    """Prefill chunks with checkpoints (one on the line read), decodes, linear and tree
    spec verify, write lines in both parts, windows and pads: ONE launch, states and
    windows bit-exact against the reference (the wide kernel takes 16-bit USM data)."""
    dtype = DTYPES[dtype_name]
    gen = torch.Generator().manual_seed(width * 7 + usm)
    case = build_mixed(width + 10 * usm, dtype=dtype, width=width, dim=136, usm=usm,
                       extra_lines=40)
    case, windows = with_rules(case, gen, usm=usm)
    case = with_lines(case, gen)
    assert len(case["non_spec_checkpoint_pos"]) >= 3
    submitted = SYCL_STATE.stats["submitted"]
    check_rules_case(case, windows, dtype)
    assert SYCL_STATE.stats["submitted"] == submitted + 1


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("width", [2, 4, 5])
@pytest.mark.parametrize("usm", [False, True])
def test_circular_lines(sycl_device, dtype_name, width, usm):
    """Circular non-spec lines (prefill chunks longer than the ring, decodes, pads, with
    and without initial state) beside spec verify with a tree, in one launch."""
    dtype = DTYPES[dtype_name]
    gen = torch.Generator().manual_seed(width * 3 + usm)
    case = build_mixed(width + 20 * usm, dtype=dtype, width=width, dim=136, usm=usm)
    case, windows = with_rules(case, gen, windows=None, usm=usm)
    check_rules_case(with_ring(case, gen), windows, dtype)


def test_rules_on_one_token_and_empty_sequences(sycl_device):
    """Sequences of 0 and 1 tokens with write lines, checkpoints and rings: the empty
    ones find their own record (an empty non-spec sequence copies its window to its
    write line; an empty spec sequence shifts it)."""
    dtype = torch.float32
    gen = torch.Generator().manual_seed(9)
    dim, width = 32, 4
    x = torch.randn(3, dim, generator=gen)
    state = torch.randn(12, dim, 6, generator=gen)
    w, b = torch.randn(dim, width, generator=gen), torch.randn(dim, generator=gen)
    case = dict(x=x, weight=w, bias=b, conv_state=state,
                non_spec_query_start_loc=torch.tensor([0, 0, 1, 1]),
                non_spec_state_indices=torch.tensor([1, 2, 3]),
                non_spec_write_indices=torch.tensor([4, 5, 6]),
                non_spec_checkpoint_loc=torch.tensor([0, 0, 1, 1]),
                non_spec_checkpoint_pos=torch.tensor([1]),
                non_spec_checkpoint_indices=torch.tensor([2]),
                spec_query_start_loc=torch.tensor([0, 0, 2]),
                spec_state_indices=torch.tensor([7, 8]),
                spec_write_indices=torch.tensor([9, 10]),
                num_accepted_tokens=torch.tensor([2, 1]))
    check_rules_case(case, None, dtype)
    ring = {k: v for k, v in case.items() if "write" not in k and "checkpoint" not in k}
    ring["non_spec_cache_seqlens"] = torch.tensor([5, 7, 0])
    ring["conv_state"] = torch.randn(12, dim, 6, generator=gen)
    check_rules_case(ring, None, dtype)


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


def _lines_case():
    gen = torch.Generator().manual_seed(13)
    case = build_mixed(13, dtype=torch.float32, width=4, dim=32, pads=False, extra_lines=40)
    return with_lines(case, gen)


@pytest.mark.parametrize("bad,message", [
    ("write_range", "non_spec_write_indices: entry 0 is 99; expected a cache line in"),
    ("write_twice", "is written twice in one call"),
    ("write_read", None),
    ("pos_order", "non_spec_checkpoint_pos: sequence"),
    ("pos_range", "each in [1,"),
    ("pos_count", "non_spec_checkpoint_pos: expected"),
    ("loc_len", "non_spec_checkpoint_loc: expected"),
    ("missing", "non_spec_checkpoint_pos: required with non_spec_checkpoint_loc"),
    ("ck_line", "non_spec_checkpoint_indices: sequence"),
    ("ring_write", "non_spec_cache_seqlens: circular lines do not combine with "
                   "non_spec_write_indices"),
    ("ring_accepted", "do not combine with non_spec_num_accepted_tokens"),
    ("ring_negative", "non_spec_cache_seqlens: entry 0 is -1"),
])
def test_bad_lines_are_refused_before_launch(sycl_device, bad, message):
    case = _lines_case()
    lines = case["non_spec_state_indices"]
    i = next(k for k in range(len(lines)) if torch.diff(
        case["non_spec_checkpoint_loc"])[k] >= 2)
    first = int(case["non_spec_checkpoint_loc"][i])
    for key in ("non_spec_write_indices", "non_spec_checkpoint_pos",
                "non_spec_checkpoint_indices", "non_spec_checkpoint_loc"):
        case[key] = case[key].clone()
    if bad == "write_range":
        case["non_spec_write_indices"][0] = 99
    elif bad == "write_twice":
        case["non_spec_write_indices"][1] = case["non_spec_write_indices"][0] = 39
    elif bad == "write_read":  # the read line of a spec sequence that moves its state
        spec_lines = case["spec_state_indices"][:, 0]
        j = next(k for k in range(len(spec_lines))
                 if case["spec_write_indices"][k] != spec_lines[k])
        case["non_spec_write_indices"][0] = spec_lines[j]
        message = f"is written by sequence 0 and read by sequence {len(lines) + j}"
    elif bad == "pos_order":
        case["non_spec_checkpoint_pos"][first + 1] = case["non_spec_checkpoint_pos"][first]
    elif bad == "pos_range":
        case["non_spec_checkpoint_pos"][first] = 0
    elif bad == "pos_count":
        case["non_spec_checkpoint_pos"] = case["non_spec_checkpoint_pos"][:-1]
    elif bad == "loc_len":
        case["non_spec_checkpoint_loc"] = case["non_spec_checkpoint_loc"][:-1]
    elif bad == "missing":
        case.pop("non_spec_checkpoint_pos")
    elif bad == "ck_line":
        case["non_spec_checkpoint_indices"][first] = -3
    elif bad.startswith("ring"):
        gen = torch.Generator().manual_seed(1)
        if bad == "ring_accepted":
            case = with_ring({k: v for k, v in case.items() if "write" not in k
                              and "checkpoint" not in k}, gen)
            case["non_spec_num_accepted_tokens"] = torch.ones(len(lines), dtype=torch.int32)
        else:
            case = with_ring(case, gen)
        if bad == "ring_negative":
            case = {k: v for k, v in case.items() if "write" not in k and "checkpoint" not in k}
            case["non_spec_cache_seqlens"][0] = -1
    before = bits(case["conv_state"])
    with pytest.raises(ValueError) as info:
        jitconv.causal_conv1d_mixed(**case)
    assert message in str(info.value), str(info.value)
    assert torch.equal(bits(case["conv_state"]), before)
