"""Every malformed call raises before any launch, names the argument, and leaves
conv_state bit-identical."""

import pytest
import torch

import jitconv
from jitconv.reference import causal_conv1d_fn_reference, causal_conv1d_reference

from helpers import assert_outputs_close, assert_state_exact, bits, cumulative, randn

DIM, WIDTH, LINES, STATE_LEN = 32, 4, 5, 4


def good_call():
    gen = torch.Generator().manual_seed(0)
    return dict(
        x=randn(gen, (7, DIM), torch.float32),
        weight=randn(gen, (DIM, WIDTH), torch.float32),
        bias=randn(gen, (DIM,), torch.float32),
        conv_state=randn(gen, (LINES, STATE_LEN, DIM), torch.float32).transpose(1, 2),
        query_start_loc=cumulative([3, 1, 3]),
        cache_indices=torch.tensor([0, 3, -1], dtype=torch.int32),
        has_initial_state=torch.tensor([True, False, True]),
    )


def i32(*values):
    return torch.tensor(values, dtype=torch.int32)


BAD = {
    # name: (changes to the good call, error type, text the message must contain)
    "x rank": (dict(x=torch.randn(7, DIM, 1)), ValueError, "x: expected shape"),
    "x dtype": (dict(x=torch.randn(7, DIM, dtype=torch.float64)), TypeError, "x: dtype"),
    "x kind": (dict(x=[[1.0] * DIM] * 7), TypeError, "x: expected a torch tensor"),
    "weight dim": (dict(weight=torch.randn(DIM + 1, WIDTH)), ValueError, "weight: expected"),
    "weight rank": (dict(weight=torch.randn(DIM, 2, WIDTH)), ValueError, "weight: expected"),
    "width 1": (dict(weight=torch.randn(DIM, 1)), ValueError, "weight: width"),
    "width 9": (dict(weight=torch.randn(DIM, 9)), ValueError, "weight: width"),
    "weight dtype": (dict(weight=torch.randn(DIM, WIDTH).half()), TypeError,
                     "weight: dtype must match x"),
    "bias shape": (dict(bias=torch.randn(DIM - 1)), ValueError, "bias: expected shape"),
    "bias dtype": (dict(bias=torch.randn(DIM).bfloat16()), TypeError, "bias: dtype"),
    "state rank": (dict(conv_state=torch.randn(LINES, DIM)), ValueError, "conv_state"),
    "state dim": (dict(conv_state=torch.randn(LINES, DIM + 2, STATE_LEN)), ValueError,
                  "conv_state: expected a view of shape"),
    "state too short": (dict(conv_state=torch.randn(LINES, DIM, WIDTH - 2)), ValueError,
                        "conv_state: state_len"),
    "state dtype": (dict(conv_state=torch.randn(LINES, DIM, STATE_LEN).half()), TypeError,
                    "conv_state: dtype must match x"),
    "out shape": (dict(out=torch.empty(6, DIM)), ValueError, "out: expected shape"),
    "out dtype": (dict(out=torch.empty(7, DIM).half()), TypeError, "out: dtype"),
    "activation": (dict(activation="relu"), ValueError, "activation must be"),
    "qsl float": (dict(query_start_loc=torch.tensor([0.0, 3.0, 4.0, 7.0])), TypeError,
                  "query_start_loc: expected an integer"),
    "qsl start": (dict(query_start_loc=i32(1, 3, 4, 7)), ValueError,
                  "query_start_loc: must start at 0"),
    "qsl decreasing": (dict(query_start_loc=i32(0, 4, 3, 7)), ValueError,
                       "query_start_loc: must be non-decreasing"),
    "qsl end": (dict(query_start_loc=i32(0, 3, 4, 6)), ValueError,
                "query_start_loc: last element must equal the token count 7"),
    "qsl rank": (dict(query_start_loc=i32(0, 3, 4, 7).reshape(2, 2)), ValueError,
                 "query_start_loc: expected a 1-D"),
    "lines count": (dict(cache_indices=i32(0, 3)), ValueError,
                    "cache_indices: expected 3 entries"),
    "line range": (dict(cache_indices=i32(0, LINES, -1)), ValueError,
                   "cache_indices: cache line 5 is out of range"),
    "line negative": (dict(cache_indices=i32(0, -2, -1)), ValueError,
                      "cache_indices: cache line -2"),
    "line twice": (dict(cache_indices=i32(2, 2, -1)), ValueError,
                   "cache line 2 is used more than once"),
    "lines float": (dict(cache_indices=torch.tensor([0.0, 1.0, 2.0])), TypeError,
                    "cache_indices: expected an integer"),
    "init count": (dict(has_initial_state=torch.tensor([True, False])), ValueError,
                   "has_initial_state: expected 3 entries"),
    "init float": (dict(has_initial_state=torch.tensor([1.0, 0.0, 1.0])), TypeError,
                   "has_initial_state: expected an integer"),
    "token map range": (dict(token_indx=i32(0, 1, 2, 3, 4, 5, 7)), ValueError,
                        "token_indx: row 7 is out of range"),
    "token map twice": (dict(token_indx=i32(0, 1, 2, 3, 4, 5, 5)), ValueError,
                        "row 5 is used more than once"),
    "token map count": (dict(token_indx=i32(0, 1, 2)), ValueError,
                        "token_indx: expected 7 entries"),
    "different devices": (dict(weight="dpctl"), ValueError, "same device as x"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_raises_and_leaves_state(sycl_device, case):
    changes, error, text = BAD[case]
    call = good_call()
    if changes.get("weight") == "dpctl":
        import dpctl.tensor as dpt
        changes = dict(weight=dpt.asarray(call["weight"].numpy(),
                                          sycl_queue=jitconv.get_queue()))
    call.update(changes)
    before = bits(call["conv_state"]) if isinstance(call["conv_state"], torch.Tensor) \
        and call["conv_state"].dtype == torch.float32 else None
    with pytest.raises(error, match=text.replace("(", "\\(").replace(")", "\\)")):
        jitconv.causal_conv1d_fn(**call)
    if before is not None:
        assert torch.equal(bits(call["conv_state"]), before)


def test_good_call_passes(sycl_device):
    """The baseline the bad cases start from is itself valid and computes the contract
    (so each bad case tests one fault)."""
    call = good_call()
    ref_out, ref_state = causal_conv1d_fn_reference(**call)
    out = jitconv.causal_conv1d_fn(**call)
    assert_outputs_close(out, ref_out, torch.float32)
    assert_state_exact(call["conv_state"], ref_state)


# --- causal_conv1d_mixed / causal_conv1d_update -------------------------------------
# Good mixed step: 2 non-spec sequences (4 tokens) and 2 spec sequences of 2 and 3 tokens,
# rows interleaved by the maps. A 3-token spec sequence at width 4 needs state_len >= 5.
MIXED_STATE_LEN = 5


def good_mixed():
    gen = torch.Generator().manual_seed(1)
    return dict(
        x=randn(gen, (9, DIM), torch.float32),
        weight=randn(gen, (DIM, WIDTH), torch.float32),
        bias=None,
        conv_state=randn(gen, (LINES, MIXED_STATE_LEN, DIM), torch.float32).transpose(1, 2),
        non_spec_query_start_loc=cumulative([3, 1]),
        non_spec_state_indices=i32(0, 1),
        has_initial_state=torch.tensor([True, False]),
        spec_query_start_loc=cumulative([2, 3]),
        spec_state_indices=torch.tensor([[2, 9], [3, 9]], dtype=torch.int32),
        num_accepted_tokens=i32(1, 2),
        non_spec_token_indx=i32(8, 0, 2, 4),
        spec_token_indx=i32(1, 3, 5, 6, 7),
    )


BAD_MIXED = {
    "row in both maps": (dict(spec_token_indx=i32(1, 3, 5, 6, 8)), ValueError,
                         "row 8 is used more than once"),
    "line in both parts": (dict(spec_state_indices=i32(2, 1)), ValueError,
                           "cache line 1 is used more than once"),
    "accepted zero": (dict(num_accepted_tokens=i32(1, 0)), ValueError,
                      "num_accepted_tokens: every entry must be >= 1"),
    "window beyond state": (dict(num_accepted_tokens=i32(1, 4)), ValueError,
                            "num_accepted_tokens: entry 1 = 4 puts the conv window beyond"),
    "accepted count": (dict(num_accepted_tokens=i32(1)), ValueError,
                       "num_accepted_tokens: expected 2 entries"),
    "accepted missing": (dict(num_accepted_tokens=None), ValueError,
                         "num_accepted_tokens: required for spec sequences"),
    "spec too long": (dict(spec_query_start_loc=cumulative([1, 4]),
                           spec_token_indx=i32(1, 3, 5, 6, 7)), ValueError,
                      "state_len=5 is too small for spec sequence 1 with 4 tokens"),
    "non-spec accepted": (dict(non_spec_num_accepted_tokens=i32(1, 4)), ValueError,
                          "non_spec_num_accepted_tokens: entry 1 = 4"),
    "orphan spec indices": (dict(spec_query_start_loc=None, spec_token_indx=None,
                                 num_accepted_tokens=None), ValueError,
                            "spec_state_indices: given without spec_query_start_loc"),
    "orphan init": (dict(non_spec_query_start_loc=None, non_spec_state_indices=None,
                         non_spec_token_indx=None), ValueError,
                    "has_initial_state: given without non_spec_query_start_loc"),
    "missing lines": (dict(non_spec_state_indices=None), ValueError,
                      "non_spec_state_indices: required"),
    "spec map count": (dict(spec_token_indx=i32(1, 3, 5)), ValueError,
                       "spec_token_indx: expected 5 entries"),
    "spec line range": (dict(spec_state_indices=i32(2, 7)), ValueError,
                        "spec_state_indices: cache line 7 is out of range"),
    "spec indices 3-D": (dict(spec_state_indices=torch.zeros(2, 1, 1, dtype=torch.int32)),
                         ValueError, "spec_state_indices: expected a 1-D or 2-D array, "
                         "got shape (2, 1, 1)"),
    "pad id type": (dict(pad_slot_id=-1.0), TypeError, "pad_slot_id: expected an int"),
    "no maps, not covering x": (dict(non_spec_token_indx=None, spec_token_indx=None,
                                     spec_query_start_loc=cumulative([2, 2])), ValueError,
                                "spec_query_start_loc: last element must equal the token "
                                "count 5, got 4"),
}


@pytest.mark.parametrize("case", list(BAD_MIXED))
def test_bad_mixed_input_raises_and_leaves_state(sycl_device, case):
    changes, error, text = BAD_MIXED[case]
    call = good_mixed()
    call.update(changes)
    call = {k: v for k, v in call.items() if v is not None or k == "bias"}
    before = bits(call["conv_state"])
    with pytest.raises(error, match=text.replace("(", "\\(").replace(")", "\\)")):
        jitconv.causal_conv1d_mixed(**call)
    assert torch.equal(bits(call["conv_state"]), before)


def test_good_mixed_call_passes(sycl_device):
    call = good_mixed()
    ref_out, ref_state = causal_conv1d_reference(**call)
    out = jitconv.causal_conv1d_mixed(**call)
    assert_outputs_close(out, ref_out, torch.float32)
    assert_state_exact(call["conv_state"], ref_state)


def good_update():
    gen = torch.Generator().manual_seed(2)
    return dict(x=randn(gen, (2, DIM), torch.float32),
                weight=randn(gen, (DIM, WIDTH), torch.float32), bias=None,
                conv_state=randn(gen, (LINES, DIM, STATE_LEN), torch.float32),
                conv_state_indices=i32(0, 1))


def test_good_update_call_passes(sycl_device):
    call = good_update()
    ref_out, ref_state = causal_conv1d_reference(
        call["x"], call["weight"], None, call["conv_state"],
        non_spec_query_start_loc=cumulative([1, 1]),
        non_spec_state_indices=call["conv_state_indices"])
    out = jitconv.causal_conv1d_update(**call)
    assert_outputs_close(out, ref_out, torch.float32)
    assert_state_exact(call["conv_state"], ref_state)


@pytest.mark.parametrize("changes,text", [
    (dict(conv_state_indices=i32(0, 1, 2)), "conv_state_indices: expected 2 entries"),
    (dict(num_accepted_tokens=i32(0, 1)), "num_accepted_tokens: every entry must be >= 1"),
    (dict(query_start_loc=i32(0, 1, 3)), "query_start_loc: last element must equal"),
    (dict(conv_state_indices=i32(1, 1)), "cache line 1 is used more than once"),
])
def test_bad_update_input(sycl_device, changes, text):
    call = good_update()
    call.update(changes)
    before = bits(call["conv_state"])
    with pytest.raises(ValueError, match=text):
        jitconv.causal_conv1d_update(**call)
    assert torch.equal(bits(call["conv_state"]), before)
