"""jitconv.vllm: the drop-in entry points with vLLM's argument conventions, against the
float64 reference.

x comes in the layouts vLLM passes: for ``causal_conv1d_fn`` a channel-major (dim,
cu_seqlen) view of a token-major tensor; for ``causal_conv1d_update`` (batch, dim),
(batch, dim, seqlen) or varlen (num_tokens, dim); for ``gdn_conv_step`` a whole GDN
engine step described by GDNAttentionMetadata fields. conv_state is the (lines, dim,
state_len) transposed view of vLLM's (lines, state_len, dim) storage, with more columns
than width - 1 and more lines than sequences. Every kernel test compares the output with
the reference (dtype tolerance), the state bit-exactly, checks that lines no sequence
uses are bit-identical and that padded sequences / padding rows come out exactly zero.
"""

import types
import zlib

import numpy as np
import pytest
import torch

from jitconv import bridge, vllm
from jitconv.reference import causal_conv1d_reference

from helpers import (DTYPES, POISON, TOLERANCE, assert_outputs_close, assert_state_exact,
                     bits, cumulative, make_state, randn, strided_rows)

DIM = 136
WIDTHS = (2, 3, 4, 5)
EXTRA_LINES = 3        # cache lines no sequence uses
PAD = vllm.PAD_SLOT_ID
NUM_SPEC = 3           # draft tokens per spec sequence (vLLM: num_speculative_tokens)
# vLLM passes activation as True/False/None/"silu"; the reference takes "silu" or None.
REF_ACTIVATION = {True: "silu", False: None, None: None, "silu": "silu"}


# ---------------------------------------------------------------------------- helpers

@pytest.fixture
def rand(request):
    """(torch generator, numpy rng), seeded from the test id: fresh and reproducible."""
    seed = zlib.crc32(request.node.nodeid.encode())
    return torch.Generator().manual_seed(seed), np.random.default_rng(seed)


@pytest.fixture(autouse=True)
def dirty_output_buffers(monkeypatch):
    """The vLLM entry points take no ``out=``, and a fresh buffer is often all zeros by
    luck, which would let unwritten padding rows pass the zero checks. Poison (NaN) every
    output buffer jitconv allocates, as a reused device allocation would be dirty."""
    allocate = bridge.empty_like_output

    def poisoned(*args, **kwargs):
        buffer = allocate(*args, **kwargs)
        buffer.fill_(POISON)
        return buffer
    monkeypatch.setattr(bridge, "empty_like_output", poisoned)


def int32(values):
    return torch.tensor(np.asarray(values), dtype=torch.int32)


def conv_params(gen, width, dtype):
    """weight (dim, width) and bias (dim,)."""
    return randn(gen, (DIM, width), dtype), randn(gen, (DIM,), dtype)


def vllm_state(gen, nseq_lines, width, dtype, extra_columns=NUM_SPEC):
    """conv_state as vLLM allocates it: (lines, state_len, dim) storage, passed as the
    transposed (lines, dim, state_len) view; state_len = width - 1 + num_spec."""
    return make_state(gen, nseq_lines + EXTRA_LINES, DIM, width - 1 + extra_columns,
                      dtype, "SD")


def sequence_rows(query_start_loc, token_indx=None):
    """Rows of x of each sequence, as a list of int arrays."""
    qsl = np.asarray(query_start_loc)
    order = np.arange(qsl[-1]) if token_indx is None else np.asarray(token_indx)
    return [order[qsl[i]:qsl[i + 1]] for i in range(len(qsl) - 1)]


def pad_rows(query_start_loc, lines, token_indx=None):
    """Rows of x that belong to padded sequences (cache line == pad_slot_id)."""
    rows = sequence_rows(query_start_loc, token_indx)
    padded = [r for r, line in zip(rows, np.asarray(lines)) if line == PAD]
    return np.concatenate(padded + [np.zeros(0, np.int64)]).astype(np.int64)


def assert_rows_zero(out_tokens, rows):
    got = out_tokens[torch.as_tensor(rows, dtype=torch.long)].float()
    assert torch.equal(got, torch.zeros_like(got)), "padded rows must come out exactly zero"


def check_state(state, before, ref_state, lines):
    """State bit-exact against the reference; lines no sequence uses bit-identical."""
    assert_state_exact(state, ref_state)
    lines = torch.as_tensor(np.asarray(lines), dtype=torch.long)
    unused = torch.ones(state.shape[0], dtype=torch.bool)
    unused[lines[lines >= 0]] = False
    assert unused.any()
    assert torch.equal(bits(state)[unused], before[unused]), "an unused cache line changed"


def random_lines(rng, nseq, num_lines, pads=()):
    """Distinct random cache lines, pad_slot_id at the positions ``pads``."""
    lines = rng.permutation(num_lines)[:nseq]
    lines[list(pads)] = PAD
    return lines


def random_accepted(rng, nseq):
    """num_accepted_tokens in 1..num_spec+1: the window start a - 1 <= num_spec stays
    inside state_len = width - 1 + num_spec."""
    return int32(rng.integers(1, NUM_SPEC + 2, size=nseq))


def mixed_initial(rng, nseq):
    """has_initial_state with both values present."""
    return torch.tensor(rng.permutation([i % 2 == 0 for i in range(nseq)]))


# x in the model dtype, conv_state in vLLM's mamba_cache_dtype (e.g. bf16 model with a
# float32 cache); weight and bias are the model's parameters, so in x's dtype.
X_AND_STATE_DTYPES = pytest.mark.parametrize("x_dtype,state_dtype", [
    (torch.bfloat16, torch.float32), (torch.float16, torch.float32),
    (torch.float32, torch.bfloat16)], ids=["bf16_x-f32_state", "f16_x-f32_state",
                                           "f32_x-bf16_state"])
# Weight and bias in the state's dtype, or in the model dtype (what vLLM passes when
# mamba_cache_dtype differs from the model dtype).
WEIGHT_DTYPE_OF = pytest.mark.parametrize("weight_dtype_of", ["state", "x"])


def one_dtype(dtype):
    """x, conv_state and weight all in ``dtype`` (keyword arguments of the builders)."""
    return dict(x_dtype=dtype, state_dtype=dtype, weight_dtype=dtype)


def coarser(*dtypes):
    """The dtype with the loosest tolerance: the result went through all of them."""
    return max(dtypes, key=lambda d: TOLERANCE[d])


# ------------------------------------------------------------------- causal_conv1d_fn

def fn_case(gen, rng, *, x_dtype, state_dtype, weight_dtype, width, with_cache_indices,
            padding_tokens=0):
    """Random prefill batch (chunks and decodes) for vllm.causal_conv1d_fn. x is kept
    token-major (``tokens``, a strided slice of a wider projection, as in vLLM) and passed
    transposed. One sequence is padded when cache_indices are given."""
    lengths = rng.permutation([1, 2, width - 1, 9, 37])
    nseq = len(lengths)
    state = vllm_state(gen, nseq, width, state_dtype)
    if with_cache_indices:
        lines = random_lines(rng, nseq, state.shape[0], pads=rng.choice(nseq, 1))
        cache_indices = int32(lines)
    else:  # vLLM's default: sequence i uses cache line i
        lines, cache_indices = np.arange(nseq), None
    weight, bias = conv_params(gen, width, weight_dtype)
    return types.SimpleNamespace(
        tokens=strided_rows(gen, int(lengths.sum()) + padding_tokens, DIM, x_dtype),
        weight=weight, bias=bias, state=state, query_start_loc=cumulative(lengths),
        lines=lines, cache_indices=cache_indices,
        has_initial_state=mixed_initial(rng, nseq))


def run_fn(case, activation, tolerance_dtype):
    """Call vllm.causal_conv1d_fn and check it against the reference."""
    x = case.tokens.t()  # (dim, cu_seqlen), channel-major view as vLLM passes it
    before = bits(case.state)
    # vLLM computes on x converted to the state dtype.
    ref_out, ref_state = causal_conv1d_reference(
        case.tokens.to(case.state.dtype), case.weight, case.bias, case.state,
        non_spec_query_start_loc=case.query_start_loc,
        non_spec_state_indices=case.lines, has_initial_state=case.has_initial_state,
        activation=REF_ACTIVATION[activation])
    out = vllm.causal_conv1d_fn(x, case.weight, case.bias, case.state,
                                case.query_start_loc, cache_indices=case.cache_indices,
                                has_initial_state=case.has_initial_state,
                                activation=activation)
    assert tuple(out.shape) == tuple(x.shape) and out.dtype == x.dtype
    assert_outputs_close(out.t(), ref_out, tolerance_dtype)
    assert_rows_zero(out.t(), pad_rows(case.query_start_loc, case.lines))
    check_state(case.state, before, ref_state, case.lines)
    return out


@pytest.mark.parametrize("activation", [True, None, "silu"], ids=["True", "None", "silu"])
@pytest.mark.parametrize("with_cache_indices", [True, False],
                         ids=["cache_indices_with_pad", "cache_indices_None"])
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_fn_channel_major(sycl_device, rand, dtype_name, width, with_cache_indices,
                          activation):
    dtype = DTYPES[dtype_name]
    case = fn_case(*rand, **one_dtype(dtype), width=width,
                   with_cache_indices=with_cache_indices)
    run_fn(case, activation, dtype)


@WEIGHT_DTYPE_OF
@X_AND_STATE_DTYPES
def test_fn_x_dtype_differs_from_state(sycl_device, rand, x_dtype, state_dtype,
                                       weight_dtype_of):
    """vLLM converts x to conv_states' dtype and returns x's dtype."""
    case = fn_case(*rand, x_dtype=x_dtype, state_dtype=state_dtype, width=4,
                   weight_dtype={"x": x_dtype, "state": state_dtype}[weight_dtype_of],
                   with_cache_indices=True)
    run_fn(case, "silu", coarser(x_dtype, state_dtype))


@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_fn_padded_x_extra_columns_are_zero(sycl_device, rand, dtype_name):
    """x wider than query_start_loc[-1] (padded batch): the extra columns come out zero."""
    dtype = DTYPES[dtype_name]
    case = fn_case(*rand, **one_dtype(dtype), width=4, with_cache_indices=True,
                   padding_tokens=5)
    out = run_fn(case, "silu", dtype)
    used = int(case.query_start_loc[-1])
    assert_rows_zero(out.t(), np.arange(used, out.shape[1]))


# --------------------------------------------------------------- causal_conv1d_update

UPDATE_LENGTHS = {"2d": [1] * 5, "3d": [3] * 5, "3d_view": [3] * 5,
                  "varlen": [1, 4, 2, 3, 1]}


def update_x(tokens, form, nseq):
    """x in the form vllm.causal_conv1d_update takes, from token-major ``tokens``."""
    if form in ("2d", "varlen"):
        return tokens
    per_seq = tokens.reshape(nseq, -1, DIM).transpose(1, 2)  # (batch, dim, seqlen) view
    return per_seq.contiguous() if form == "3d" else per_seq


def update_out_tokens(out, form):
    """The output of vllm.causal_conv1d_update back in token-major order."""
    if form in ("2d", "varlen"):
        return out
    return out.transpose(1, 2).reshape(-1, DIM)


def update_case(gen, rng, *, form, spec, x_dtype, state_dtype, weight_dtype, width):
    """Random decode / verify batch for vllm.causal_conv1d_update. x as (batch, dim),
    (batch, dim, seqlen) (contiguous, or a view of token-major storage), or varlen with
    query_start_loc and 2-D (Q, 1 + num_spec) conv_state_indices: only column 0 is a
    sequence's line, the lines in the other columns must stay untouched. Sequence 1 is
    padded (its whole row of indices is pad_slot_id)."""
    lengths = UPDATE_LENGTHS[form]
    nseq = len(lengths)
    columns = 1 + NUM_SPEC if form == "varlen" else 1
    state = vllm_state(gen, nseq * columns, width, state_dtype)
    lines = random_lines(rng, nseq * columns, state.shape[0]).reshape(nseq, columns)
    lines[1] = PAD
    query_start_loc = cumulative(lengths)
    tokens = randn(gen, (int(query_start_loc[-1]), DIM), x_dtype)
    weight, bias = conv_params(gen, width, weight_dtype)
    return types.SimpleNamespace(
        form=form, tokens=tokens, x=update_x(tokens, form, nseq), weight=weight,
        bias=bias, state=state, lines=lines[:, 0], query_start_loc=query_start_loc,
        conv_state_indices=int32(lines if form == "varlen" else lines[:, 0]),
        max_query_len=max(lengths),
        num_accepted_tokens=random_accepted(rng, nseq) if spec else None)


def run_update(case, activation, tolerance_dtype):
    """Call vllm.causal_conv1d_update and check it against the reference."""
    kind = "non_spec" if case.num_accepted_tokens is None else "spec"
    before = bits(case.state)
    ref_out, ref_state = causal_conv1d_reference(
        case.tokens.to(case.state.dtype), case.weight, case.bias, case.state,
        num_accepted_tokens=case.num_accepted_tokens, activation=REF_ACTIVATION[activation],
        **{f"{kind}_query_start_loc": case.query_start_loc,
           f"{kind}_state_indices": case.lines})
    out = vllm.causal_conv1d_update(
        case.x, case.state, case.weight, case.bias, activation=activation,
        conv_state_indices=case.conv_state_indices,
        num_accepted_tokens=case.num_accepted_tokens,
        query_start_loc=case.query_start_loc if case.form == "varlen" else None,
        max_query_len=case.max_query_len)
    assert tuple(out.shape) == tuple(case.x.shape) and out.dtype == case.x.dtype
    out_tokens = update_out_tokens(out, case.form)
    assert_outputs_close(out_tokens, ref_out, tolerance_dtype)
    assert_rows_zero(out_tokens, pad_rows(case.query_start_loc, case.lines))
    check_state(case.state, before, ref_state, case.lines)


@pytest.mark.parametrize("activation", [True, None], ids=["True", "None"])
@pytest.mark.parametrize("spec", [False, True], ids=["plain", "num_accepted_tokens"])
@pytest.mark.parametrize("form", list(UPDATE_LENGTHS))
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_update(sycl_device, rand, dtype_name, width, form, spec, activation):
    dtype = DTYPES[dtype_name]
    case = update_case(*rand, **one_dtype(dtype), form=form, spec=spec, width=width)
    run_update(case, activation, dtype)


@WEIGHT_DTYPE_OF
@X_AND_STATE_DTYPES
def test_update_x_dtype_differs_from_state(sycl_device, rand, x_dtype, state_dtype,
                                           weight_dtype_of):
    """Spec verify over varlen x; vLLM converts x to conv_state's dtype, returns x's."""
    case = update_case(*rand, form="varlen", spec=True, x_dtype=x_dtype,
                       state_dtype=state_dtype, width=4,
                       weight_dtype={"x": x_dtype, "state": state_dtype}[weight_dtype_of])
    run_update(case, True, coarser(x_dtype, state_dtype))


# ---------------------------------------------------------------------- gdn_conv_step

def gdn_step(gen, rng, *, x_dtype, state_dtype, weight_dtype, width, prefill, decodes,
             spec, padding_rows):
    """A random engine step and the GDNAttentionMetadata fields vLLM would build for it.

    prefill: lengths of the prefill chunks (half continue from a state); decodes: number
    of plain decodes; spec: number of verify sequences of 1 + NUM_SPEC tokens. When both
    kinds are present, one of each is padded and the token rows are shuffled (the index
    maps interleave them); when only one kind is present vLLM gives no maps, and its
    tokens are rows 0..n-1. ``padding_rows`` rows follow the num_actual_tokens real ones.
    """
    ns_lengths = list(prefill) + [1] * decodes
    sp_lengths = [1 + NUM_SPEC] * spec
    both = bool(ns_lengths) and bool(sp_lengths)
    n_ns, n_sp = sum(ns_lengths), sum(sp_lengths)
    num_lines = len(ns_lengths) + spec * (1 + NUM_SPEC)
    state = vllm_state(gen, num_lines, width, state_dtype)
    lines = random_lines(rng, num_lines, state.shape[0])
    ns_lines = lines[:len(ns_lengths)]
    sp_lines = lines[len(ns_lengths):].reshape(spec, 1 + NUM_SPEC)
    meta = types.SimpleNamespace(
        num_actual_tokens=n_ns + n_sp,
        has_initial_state=None, non_spec_query_start_loc=None,
        non_spec_state_indices_tensor=None, non_spec_token_indx=None,
        spec_query_start_loc=None, spec_state_indices_tensor=None, spec_token_indx=None,
        num_accepted_tokens=None)
    if both:
        ns_lines[-1] = PAD  # a padded decode
        sp_lines[0] = PAD   # a padded verify sequence
        # vLLM puts spec rows first; shuffled here so that the maps interleave
        rows = rng.permutation(n_ns + n_sp)
        meta.spec_token_indx = int32(rows[:n_sp])
        meta.non_spec_token_indx = int32(rows[n_sp:])
    if ns_lengths:
        init = [i % 2 == 1 for i in range(len(prefill))] + [True] * decodes
        meta.has_initial_state = torch.tensor(init)
        meta.non_spec_query_start_loc = cumulative(ns_lengths)
        meta.non_spec_state_indices_tensor = int32(ns_lines)
    if sp_lengths:
        meta.spec_query_start_loc = cumulative(sp_lengths)
        meta.spec_state_indices_tensor = int32(sp_lines)
        meta.num_accepted_tokens = random_accepted(rng, spec)
    weight, bias = conv_params(gen, width, weight_dtype)
    return types.SimpleNamespace(
        x=strided_rows(gen, n_ns + n_sp + padding_rows, DIM, x_dtype),  # mixed_qkv
        weight=weight, bias=bias, state=state, meta=meta)


def run_gdn_step(step, tolerance_dtype):
    """Call vllm.gdn_conv_step and check it: reference, padded sequences and padding rows
    zero, state bit-exact, unused lines (and spec columns 1.. lines) untouched."""
    m = step.meta
    before = bits(step.state)
    ref_out, ref_state = causal_conv1d_reference(
        step.x.to(step.state.dtype), step.weight, step.bias, step.state,
        activation="silu",
        non_spec_query_start_loc=m.non_spec_query_start_loc,
        non_spec_state_indices=m.non_spec_state_indices_tensor,
        has_initial_state=m.has_initial_state, non_spec_token_indx=m.non_spec_token_indx,
        spec_query_start_loc=m.spec_query_start_loc,
        spec_state_indices=m.spec_state_indices_tensor, spec_token_indx=m.spec_token_indx,
        num_accepted_tokens=m.num_accepted_tokens)
    out = vllm.gdn_conv_step(step.x, step.weight, step.bias, step.state, m)
    assert tuple(out.shape) == tuple(step.x.shape) and out.dtype == step.x.dtype
    assert_outputs_close(out, ref_out, tolerance_dtype)
    zero_rows = [np.arange(m.num_actual_tokens, step.x.shape[0])]
    used = []
    for qsl, lines, rows in (
            (m.non_spec_query_start_loc, m.non_spec_state_indices_tensor,
             m.non_spec_token_indx),
            (m.spec_query_start_loc, m.spec_state_indices_tensor, m.spec_token_indx)):
        if qsl is not None:
            lines = lines.reshape(len(lines), -1)[:, 0].numpy()  # spec: (Q, K) column 0
            zero_rows.append(pad_rows(qsl, lines, rows))
            used.append(lines)
    assert_rows_zero(out, np.concatenate(zero_rows))
    check_state(step.state, before, ref_state, np.concatenate(used))


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_gdn_conv_step_mixed(sycl_device, rand, dtype_name, width):
    """Prefill chunks + decodes + spec sequences of 1+3 tokens in one step, rows
    shuffled, num_actual_tokens < rows of mixed_qkv."""
    dtype = DTYPES[dtype_name]
    step = gdn_step(*rand, **one_dtype(dtype), width=width,
                    prefill=[37, 2, width - 1, 9], decodes=3, spec=4, padding_rows=6)
    run_gdn_step(step, dtype)


@pytest.mark.parametrize("padding_rows", [0, 4])
@pytest.mark.parametrize("kind", ["non_spec_only", "spec_only"])
@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_gdn_conv_step_one_kind(sycl_device, rand, dtype_name, kind, padding_rows):
    """Only non-spec (prefill + decodes) or only spec metadata: no token maps."""
    dtype = DTYPES[dtype_name]
    sizes = (dict(prefill=[5, 20, 1], decodes=2, spec=0) if kind == "non_spec_only"
             else dict(prefill=[], decodes=0, spec=5))
    step = gdn_step(*rand, **one_dtype(dtype), width=4, padding_rows=padding_rows, **sizes)
    run_gdn_step(step, dtype)


@pytest.mark.parametrize("weight_dtype_of", ["state", "x"])
@X_AND_STATE_DTYPES
def test_gdn_conv_step_x_dtype_differs_from_state(sycl_device, rand, x_dtype, state_dtype,
                                                  weight_dtype_of):
    """The engine step that the two vLLM calls it replaces accept: mixed_qkv in the model
    dtype, conv_state in mamba_cache_dtype."""
    step = gdn_step(*rand, x_dtype=x_dtype, state_dtype=state_dtype,
                    weight_dtype={"x": x_dtype, "state": state_dtype}[weight_dtype_of],
                    width=4, prefill=[9, 1], decodes=2, spec=2, padding_rows=3)
    run_gdn_step(step, coarser(x_dtype, state_dtype))


# ------------------------------------------------------------ unsupported arguments

def fn_call(gen, state):
    x = randn(gen, (DIM, 3), torch.float32)
    weight, bias = conv_params(gen, 4, torch.float32)
    return lambda **extra: vllm.causal_conv1d_fn(
        x, weight, bias, state, cumulative([3]), cache_indices=int32([0]),
        has_initial_state=torch.tensor([True]), **extra)


def update_call(gen, state):
    x = randn(gen, (1, DIM), torch.float32)
    weight, bias = conv_params(gen, 4, torch.float32)
    return lambda **extra: vllm.causal_conv1d_update(
        x, state, weight, bias, activation=True, conv_state_indices=int32([0]), **extra)


UNSUPPORTED = (
    [(fn_call, name) for name in ("block_idx_first_scheduled_token",
                                  "block_idx_last_scheduled_token", "initial_state_idx",
                                  "num_computed_tokens")]
    + [(update_call, name) for name in ("block_idx_last_scheduled_token",
                                        "initial_state_idx", "retrieve_parent_token")])


@pytest.mark.parametrize("make_call,argument", UNSUPPORTED,
                         ids=[f"{f.__name__[:-5]}-{a}" for f, a in UNSUPPORTED])
def test_unsupported_arguments_raise_and_leave_state(sycl_device, rand, make_call,
                                                     argument):
    gen, _ = rand
    state = vllm_state(gen, 1, 4, torch.float32)
    call = make_call(gen, state)
    call()  # the same call without the unsupported argument is valid (and updates line 0)
    before = bits(state)
    with pytest.raises(NotImplementedError, match=argument):
        call(**{argument: int32([0])})
    assert torch.equal(bits(state), before), "conv_state changed by a rejected call"
