"""jitconv.vllm: the drop-ins with vLLM 0.33's conventions, against the float64 reference.

vLLM's conventions as the tests state them (our reading of vLLM 0.33, SEMANTICS.md):
cache line NULL_BLOCK_ID (0) marks a padded sequence and is skipped, as is a sequence
with no tokens (state untouched); causal_conv1d_update takes its batch from
conv_state_indices, tolerates a longer query_start_loc / num_accepted_tokens and extra
rows of x, and writes into x when out is None. Line 0 is never a real line here, so
"unused lines bit-identical" covers the null block too. The reference marks every
skipped sequence with its own pad (-1). Rows no sequence computes must come out zero
(jitconv's choice; vLLM leaves them as they were). Output buffers are poisoned (NaN).
"""

import types
import zlib

import numpy as np
import pytest
import torch

from jitconv.backends.sycl import bridge
import jitconv
from jitconv import vllm
from jitconv.vllm import dropins
from jitconv.reference import causal_conv1d_reference

from helpers import (DTYPES, POISON, TOLERANCE, assert_outputs_close, assert_state_exact,
                     bits, cumulative, randn, strided_rows)
from helpers import (DIM, GDN_STEPS, NULL, NUM_SPEC, REF_PAD, build_gdn_metadata,  # noqa: F401
                     conv_params,
                     gdn_case, ints, random_accepted, random_lines, reference_lines,
                     requests_for, vllm_state)

# Every test holds torch CPU tensors (skipped on a CUDA GPU: conftest.cpu_tensor_device).
pytestmark = pytest.mark.usefixtures("cpu_tensor_device")

WIDTHS = (2, 3, 4, 5)
REF_ACTIVATION = {True: "silu", False: None, None: None, "silu": "silu"}
META_DTYPES = {"int32": torch.int32, "int64": torch.int64}


# ---------------------------------------------------------------------------- helpers

@pytest.fixture
def rand(request):
    """(torch generator, numpy rng), seeded from the test id: fresh and reproducible."""
    seed = zlib.crc32(request.node.nodeid.encode())
    return torch.Generator().manual_seed(seed), np.random.default_rng(seed)


@pytest.fixture(autouse=True)
def dirty_output_buffers(monkeypatch):
    """Poison (NaN) every output buffer jitconv allocates: a fresh buffer is often zero by
    luck, which would let unwritten rows pass the zero checks."""
    allocate = bridge.empty_like_output

    def poisoned(*args, **kwargs):
        buffer = allocate(*args, **kwargs)
        buffer.fill_(POISON)
        return buffer
    monkeypatch.setattr(bridge, "empty_like_output", poisoned)


def assert_rows_zero(out_tokens, rows):
    rows = torch.as_tensor(np.asarray(rows, dtype=np.int64))
    got = out_tokens[rows].float()
    assert torch.equal(got, torch.zeros_like(got)), "skipped rows must come out zero"


def skipped_rows(qsl, lines, rows_of=None):
    """Rows of sequences whose (reference) line is a pad."""
    qsl = np.asarray(qsl)
    order = np.arange(qsl[-1]) if rows_of is None else np.asarray(rows_of)
    out = [order[qsl[i]:qsl[i + 1]] for i, line in enumerate(lines) if line == REF_PAD]
    return np.concatenate(out + [np.zeros(0, np.int64)])


def check_state(state, before, ref_state, real_lines):
    """State bit-exact against the reference; every other line (the null block 0 and
    the unused ones) bit-identical to before."""
    assert_state_exact(state, ref_state)
    untouched = torch.ones(state.shape[0], dtype=torch.bool)
    real = torch.as_tensor(np.asarray(real_lines, dtype=np.int64))
    untouched[real[real >= 0]] = False
    assert untouched[NULL] and untouched.sum() > 1
    assert torch.equal(bits(state)[untouched], before[untouched]), "a skipped line changed"


# x in the model dtype, conv_state in mamba_cache_dtype (vLLM computes in the latter).
X_AND_STATE_DTYPES = pytest.mark.parametrize("x_dtype,state_dtype", [
    (torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16)],
    ids=["bf16_x-f32_state", "f32_x-bf16_state"])


def coarser(*dtypes):
    return max(dtypes, key=lambda d: TOLERANCE[d])


# ------------------------------------------------------------------- causal_conv1d_fn

def fn_case(gen, rng, *, x_dtype, state_dtype, width, pads, zero_length=0,
            padding_tokens=0, meta_dtype=torch.int32):
    """A prefill batch (chunks and decodes) for vllm.causal_conv1d_fn: ``pads``
    sequences carry the null block, ``zero_length`` more have no tokens (with real
    lines and no initial state, so the literal rule would zero their window)."""
    lengths = list(rng.permutation([1, 2, width - 1, 9, 37] + [0] * zero_length))
    nseq = len(lengths)
    state = vllm_state(gen, nseq, width, state_dtype)
    lines = random_lines(rng, nseq, state.shape[0])
    lines[rng.choice([i for i in range(nseq) if lengths[i]], pads, replace=False)] = NULL
    initial = np.array([i % 2 == 0 for i in range(nseq)])
    initial[[i for i in range(nseq) if lengths[i] == 0]] = False
    weight, bias = conv_params(gen, width, state_dtype)
    qsl = cumulative(lengths).to(meta_dtype)
    return types.SimpleNamespace(
        tokens=strided_rows(gen, int(qsl[-1]) + padding_tokens, DIM, x_dtype),
        weight=weight, bias=bias, state=state, query_start_loc=qsl,
        cache_indices=ints(lines, meta_dtype), ref_lines=reference_lines(lines, qsl),
        has_initial_state=torch.tensor(initial))


def run_fn(case, activation="silu", tolerance_dtype=None, **kwargs):
    x = case.tokens.t()  # (dim, cu_seqlen), channel-major view as vLLM passes it
    before = bits(case.state)
    ref_out, ref_state = causal_conv1d_reference(
        case.tokens.to(case.state.dtype), case.weight, case.bias, case.state,
        non_spec_query_start_loc=case.query_start_loc,
        non_spec_state_indices=case.ref_lines, has_initial_state=case.has_initial_state,
        activation=REF_ACTIVATION[activation])
    out = vllm.causal_conv1d_fn(x, case.weight, case.bias, case.state, case.query_start_loc,
                                cache_indices=case.cache_indices,
                                has_initial_state=case.has_initial_state,
                                activation=activation, **kwargs)
    assert tuple(out.shape) == tuple(x.shape) and out.dtype == x.dtype
    assert_outputs_close(out.t(), ref_out, tolerance_dtype or x.dtype)
    assert_rows_zero(out.t(), skipped_rows(case.query_start_loc, case.ref_lines))
    check_state(case.state, before, ref_state, case.ref_lines)
    return out


@pytest.mark.parametrize("activation", [True, None, "silu"], ids=["True", "None", "silu"])
@pytest.mark.parametrize("pads", [1, 2], ids=["one_null_block", "two_null_blocks"])
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_fn_null_block_pads(sycl_device, rand, dtype_name, width, pads, activation):
    dtype = DTYPES[dtype_name]
    case = fn_case(*rand, x_dtype=dtype, state_dtype=dtype, width=width, pads=pads)
    run_fn(case, activation)


@pytest.mark.parametrize("meta", list(META_DTYPES))
def test_fn_zero_length_sequences_leave_their_state(sycl_device, rand, meta):
    """Zero-length sequences on real lines without initial state: vLLM skips them (the
    contract's literal rule would zero their window)."""
    case = fn_case(*rand, x_dtype=torch.float32, state_dtype=torch.float32, width=4,
                   pads=1, zero_length=2, meta_dtype=META_DTYPES[meta])
    run_fn(case)


def test_fn_extra_columns_of_x_are_zero(sycl_device, rand):
    case = fn_case(*rand, x_dtype=torch.bfloat16, state_dtype=torch.bfloat16, width=4,
                   pads=1, padding_tokens=5)
    out = run_fn(case)
    assert_rows_zero(out.t(), np.arange(int(case.query_start_loc[-1]), out.shape[1]))


def test_fn_reads_the_first_batch_entries_of_longer_per_sequence_tensors(sycl_device, rand):
    """cache_indices and has_initial_state longer than the batch (vLLM's own test file
    passes padded ones; its kernel reads the first batch entries): the rest is ignored,
    whatever it holds. Shorter ones are refused by name, the state untouched."""
    case = fn_case(*rand, x_dtype=torch.float32, state_dtype=torch.float32, width=4,
                   pads=1)
    given = case.cache_indices, case.has_initial_state
    case.cache_indices = torch.cat([given[0], torch.tensor([7, 99, -5], dtype=given[0].dtype)])
    case.has_initial_state = torch.cat([given[1], torch.tensor([True, False])])
    run_fn(case)
    for name, short in (("cache_indices", dict(cache_indices=given[0][:-1])),
                        ("has_initial_state", dict(has_initial_state=given[1][:-1]))):
        before = bits(case.state)
        args = dict(dict(cache_indices=given[0], has_initial_state=given[1]), **short)
        with pytest.raises(ValueError, match=f"^{name}: expected at least"):
            vllm.causal_conv1d_fn(case.tokens.t(), case.weight, case.bias, case.state,
                                  case.query_start_loc, **args)
        assert torch.equal(bits(case.state), before)


@X_AND_STATE_DTYPES
def test_fn_x_dtype_differs_from_state(sycl_device, rand, x_dtype, state_dtype):
    case = fn_case(*rand, x_dtype=x_dtype, state_dtype=state_dtype, width=4, pads=1)
    run_fn(case, "silu", coarser(x_dtype, state_dtype))


def test_fn_null_block_none_makes_line_0_a_real_line(sycl_device, rand):
    """null_block_id=None: line 0 is updated like any other; pad_slot_id still skips."""
    gen, rng = rand
    case = fn_case(gen, rng, x_dtype=torch.float32, state_dtype=torch.float32, width=4,
                   pads=0)
    lines = case.cache_indices.clone()
    lines[0], lines[1] = 0, vllm.PAD_SLOT_ID
    case.cache_indices = lines
    case.ref_lines = lines.numpy().copy()   # the reference's pad is -1 as well
    before = bits(case.state)
    ref_out, ref_state = causal_conv1d_reference(
        case.tokens, case.weight, case.bias, case.state,
        non_spec_query_start_loc=case.query_start_loc, non_spec_state_indices=lines,
        has_initial_state=case.has_initial_state)
    out = vllm.causal_conv1d_fn(case.tokens.t(), case.weight, case.bias, case.state,
                                case.query_start_loc, lines, case.has_initial_state,
                                null_block_id=None)
    assert_outputs_close(out.t(), ref_out, torch.float32)
    assert_state_exact(case.state, ref_state)
    assert not torch.equal(bits(case.state)[0], before[0]), "line 0 was not updated"


# --------------------------------------------------------------- causal_conv1d_update

UPDATE_LENGTHS = {"2d": [1] * 6, "3d": [3] * 6, "3d_view": [3] * 6,
                  "varlen": [1, 4, 2, 3, 1, 4]}


def update_x(tokens, form, nseq):
    if form in ("2d", "varlen"):
        return tokens
    per_seq = tokens.reshape(nseq, -1, DIM).transpose(1, 2)  # (batch, dim, seqlen) view
    return per_seq.contiguous() if form == "3d" else per_seq


def tokens_of(out, form):
    """The output of vllm.causal_conv1d_update in token-major order."""
    if form in ("2d", "varlen"):
        return out
    return out.transpose(1, 2).reshape(-1, DIM)


def update_case(gen, rng, *, form, spec, x_dtype, state_dtype, width, pads=(1, 3),
                meta_dtype=torch.int32, layout="SD"):
    """A decode / verify batch for vllm.causal_conv1d_update with the null block at the
    positions ``pads``. varlen: (Q, 1 + num_spec) conv_state_indices (column 0 used,
    the other columns' lines must stay untouched)."""
    lengths = UPDATE_LENGTHS[form]
    nseq = len(lengths)
    columns = 1 + NUM_SPEC if form == "varlen" else 1
    state = vllm_state(gen, nseq * columns, width, state_dtype, layout)
    table = random_lines(rng, nseq * columns, state.shape[0]).reshape(nseq, columns)
    table[list(pads)] = NULL
    qsl = cumulative(lengths)
    tokens = randn(gen, (int(qsl[-1]), DIM), x_dtype)
    weight, bias = conv_params(gen, width, state_dtype)
    return types.SimpleNamespace(
        form=form, tokens=tokens, x=update_x(tokens, form, nseq), weight=weight,
        bias=bias, state=state, query_start_loc=qsl.to(meta_dtype),
        conv_state_indices=ints(table if form == "varlen" else table[:, 0], meta_dtype),
        ref_lines=reference_lines(table[:, 0], qsl), max_query_len=max(lengths),
        num_accepted_tokens=ints(random_accepted(rng, nseq), meta_dtype) if spec else None)


def update_reference(case, activation, tokens=None):
    kind = "non_spec" if case.num_accepted_tokens is None else "spec"
    tokens = case.tokens if tokens is None else tokens
    nseq = len(case.ref_lines)
    accepted = case.num_accepted_tokens
    return causal_conv1d_reference(
        tokens.to(case.state.dtype), case.weight, case.bias, case.state,
        num_accepted_tokens=None if accepted is None else accepted[:nseq],
        activation=REF_ACTIVATION[activation],
        **{f"{kind}_query_start_loc": case.query_start_loc[:nseq + 1],
           f"{kind}_state_indices": case.ref_lines})


def run_update(case, activation, tolerance_dtype, out=None):
    """Call vllm.causal_conv1d_update (in place into x unless ``out``), check it."""
    before = bits(case.state)
    x_before = bits(case.x)
    ref_out, ref_state = update_reference(case, activation)
    result = vllm.causal_conv1d_update(
        case.x, case.state, case.weight, case.bias, activation,
        conv_state_indices=case.conv_state_indices,
        num_accepted_tokens=case.num_accepted_tokens,
        query_start_loc=case.query_start_loc if case.form == "varlen" else None,
        max_query_len=case.max_query_len, out=out)
    target = case.x if out is None else out
    assert result is target, "the result must be written into x (out=None) or out"
    if out is not None:
        assert torch.equal(bits(case.x), x_before), "x changed although out was given"
    got = tokens_of(result, case.form)
    assert_outputs_close(got, ref_out, tolerance_dtype)
    assert_rows_zero(got, skipped_rows(case.query_start_loc, case.ref_lines))
    check_state(case.state, before, ref_state, case.ref_lines)
    return got


@pytest.mark.parametrize("activation", [True, None], ids=["True", "None"])
@pytest.mark.parametrize("spec", [False, True], ids=["plain", "num_accepted_tokens"])
@pytest.mark.parametrize("form", list(UPDATE_LENGTHS))
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_update_in_place_with_null_blocks(sycl_device, rand, dtype_name, width, form,
                                          spec, activation):
    dtype = DTYPES[dtype_name]
    case = update_case(*rand, form=form, spec=spec, x_dtype=dtype, state_dtype=dtype,
                       width=width)
    run_update(case, activation, dtype)


@pytest.mark.parametrize("spec", [False, True])
def test_update_with_pad_slot_id_as_vllm_0_19_passes_it(sycl_device, rand, spec):
    """vLLM <= 0.19: pads are PAD_SLOT_ID (-1), passed as pad_slot_id, and line 0 is a
    cache line like any other (no null block): pads skipped, line 0 updated."""
    gen, rng = rand
    case = update_case(gen, rng, form="varlen", spec=spec, x_dtype=torch.float32,
                       state_dtype=torch.float32, width=4, pads=())
    table = case.conv_state_indices.clone()
    table[1, 0], table[4, 0], table[2, 0] = vllm.PAD_SLOT_ID, vllm.PAD_SLOT_ID, 0
    case.conv_state_indices = table
    case.ref_lines = table[:, 0].numpy().copy()  # pads -1 like the reference's; 0 is real
    before = bits(case.state)
    ref_out, ref_state = update_reference(case, "silu")
    out = vllm.causal_conv1d_update(
        case.x, case.state, case.weight, case.bias, "silu", table, case.num_accepted_tokens,
        case.query_start_loc, case.max_query_len, pad_slot_id=vllm.PAD_SLOT_ID)
    assert_outputs_close(out, ref_out, torch.float32)
    assert_state_exact(case.state, ref_state)
    assert not torch.equal(bits(case.state)[0], before[0]), "line 0 was not updated"
    with pytest.raises(ValueError, match="cache line -1"):  # -1 is no pad without it
        vllm.causal_conv1d_update(case.x, case.state, case.weight, case.bias, "silu", table,
                                  case.num_accepted_tokens, case.query_start_loc)
    with pytest.raises(TypeError, match="pad_slot_id"):
        vllm.causal_conv1d_update(case.x, case.state, case.weight, pad_slot_id="-1",
                                  conv_state_indices=table)


@pytest.mark.parametrize("form", ["2d", "3d_view", "varlen"])
def test_update_into_out_leaves_x(sycl_device, rand, form):
    case = update_case(*rand, form=form, spec=form == "varlen", x_dtype=torch.float32,
                       state_dtype=torch.float32, width=4, pads=(0,))
    out = torch.full(tuple(case.x.shape), POISON)
    run_update(case, True, torch.float32, out=out)


@X_AND_STATE_DTYPES
def test_update_x_dtype_differs_from_state(sycl_device, rand, x_dtype, state_dtype):
    """Computed in conv_state's dtype, written into x in x's dtype."""
    case = update_case(*rand, form="varlen", spec=True, x_dtype=x_dtype,
                       state_dtype=state_dtype, width=4)
    run_update(case, True, coarser(x_dtype, state_dtype))


@pytest.mark.parametrize("layout", ["SD", "DS"])
@pytest.mark.parametrize("meta", list(META_DTYPES))
def test_update_full_graph_padding(sycl_device, rand, meta, layout):
    """vLLM's FULL-graph spec call: conv_state_indices cut to the real batch, while
    query_start_loc repeats its last value for the padded tail, num_accepted_tokens is
    padded with 1 and x has the padded token rows. The tail is ignored, its rows come
    out zero, and one real sequence carries the null block as well."""
    gen, rng = rand
    case = update_case(gen, rng, form="varlen", spec=True, x_dtype=torch.float32,
                       state_dtype=torch.float32, width=4, pads=(2,),
                       meta_dtype=META_DTYPES[meta], layout=layout)
    real, padded_tail, extra_rows = len(case.ref_lines), 3, 7
    qsl = case.query_start_loc
    case.query_start_loc = torch.cat([qsl, qsl[-1:].repeat(padded_tail)])
    case.num_accepted_tokens = torch.cat([case.num_accepted_tokens,
                                          torch.ones(padded_tail, dtype=qsl.dtype)])
    case.tokens = torch.cat([case.tokens, randn(gen, (extra_rows, DIM), torch.float32)])
    case.x = case.tokens
    assert case.conv_state_indices.shape[0] == real
    got = run_update(case, True, torch.float32)
    assert_rows_zero(got, np.arange(int(qsl[-1]), got.shape[0]))


def test_update_batch_from_indices_with_extra_rows(sycl_device, rand):
    """(rows, dim) x with fewer conv_state_indices than rows: the extra rows are not
    sequences; they come out zero."""
    gen, rng = rand
    case = update_case(gen, rng, form="2d", spec=False, x_dtype=torch.float32,
                       state_dtype=torch.float32, width=4, pads=(0, 4))
    case.tokens = torch.cat([case.tokens, randn(gen, (5, DIM), torch.float32)])
    case.x = case.tokens
    got = run_update(case, True, torch.float32)
    assert_rows_zero(got, np.arange(len(case.ref_lines), got.shape[0]))


def test_update_zero_length_spec_sequences_leave_their_state(sycl_device, rand):
    """Zero-length verify sequences on real lines: skipped (the contract's literal spec
    rule would shift their state by one column)."""
    gen, rng = rand
    case = update_case(gen, rng, form="varlen", spec=True, x_dtype=torch.float32,
                       state_dtype=torch.float32, width=4, pads=())
    lengths = [2, 0, 3, 0, 1, 4]
    case.query_start_loc = cumulative(lengths)
    case.tokens = case.x = randn(gen, (sum(lengths), DIM), torch.float32)
    case.ref_lines = reference_lines(case.conv_state_indices[:, 0].numpy(),
                                     case.query_start_loc)
    assert (case.ref_lines == REF_PAD).sum() == 2
    run_update(case, True, torch.float32)


def test_update_without_indices_uses_line_i(sycl_device, rand):
    """conv_state_indices None: row i is a sequence on line i, line 0 included (there is
    no index to mark the null block)."""
    gen, _ = rand
    state = vllm_state(gen, 4, 4, torch.float32)
    weight, bias = conv_params(gen, 4, torch.float32)
    x = randn(gen, (3, DIM), torch.float32)
    ref_out, ref_state = causal_conv1d_reference(
        x, weight, bias, state, non_spec_query_start_loc=cumulative([1, 1, 1]),
        non_spec_state_indices=[0, 1, 2])
    before = bits(state)
    out = vllm.causal_conv1d_update(x, state, weight, bias, True)
    assert out is x
    assert_outputs_close(out, ref_out, torch.float32)
    assert_state_exact(state, ref_state)
    assert not torch.equal(bits(state)[0], before[0]), "line 0 was not updated"


BAD_UPDATES = {
    "negative line": (dict(conv_state_indices=[3, -1]), ValueError,
                      "conv_state_indices: cache line -1"),
    "line out of range": (dict(conv_state_indices=[3, 99]), ValueError,
                          "conv_state_indices: cache line 99"),
    "real line twice": (dict(conv_state_indices=[3, 3]), ValueError,
                        "conv_state_indices: cache line 3 is used more than once"),
    "query_start_loc too short": (dict(query_start_loc=[0, 2], num_accepted_tokens=[1, 1]),
                                  ValueError, "query_start_loc: expected at least 3"),
    "num_accepted_tokens too short": (dict(query_start_loc=[0, 2, 4],
                                           num_accepted_tokens=[1]),
                                      ValueError, "num_accepted_tokens: expected at least"),
    "more indices than x rows": (dict(conv_state_indices=[3, 4, 5, 6, 7]), ValueError,
                                 "conv_state_indices: 5 entries"),
    "float indices": (dict(conv_state_indices=torch.tensor([3.0, 4.0])), TypeError,
                      "conv_state_indices: expected an integer tensor"),
    "accepted 0 on a real line": (dict(query_start_loc=[0, 2, 4],
                                       num_accepted_tokens=[0, 1]),
                                  ValueError, "num_accepted_tokens: every entry"),
}


@pytest.mark.parametrize("bad", list(BAD_UPDATES))
def test_update_bad_metadata_raises_before_launch(sycl_device, rand, bad):
    gen, _ = rand
    state = vllm_state(gen, 6, 4, torch.float32)
    weight, bias = conv_params(gen, 4, torch.float32)
    x = randn(gen, (4, DIM), torch.float32)
    changes, error, message = BAD_UPDATES[bad]
    kwargs = dict(conv_state_indices=[3, 4])
    kwargs.update(changes)
    kwargs = {k: v if isinstance(v, torch.Tensor) else ints(v) for k, v in kwargs.items()}
    before, x_before = bits(state), bits(x)
    with pytest.raises(error, match=message):
        vllm.causal_conv1d_update(x, state, weight, bias, True, **kwargs)
    assert torch.equal(bits(state), before) and torch.equal(bits(x), x_before)


# ---------------------------------------------------------------------- gdn_conv_step

def run_gdn(case, tolerance_dtype=None, **kwargs):
    before = bits(case.state)
    ref_out, ref_state = causal_conv1d_reference(
        case.x.to(case.state.dtype), case.weight, case.bias, case.state, **case.ref,
        **{k: v for k, v in kwargs.items() if k == "non_spec_num_accepted_tokens"})
    out = vllm.gdn_conv_step(case.x, case.weight, case.bias, case.state, case.meta,
                             **kwargs)
    assert tuple(out.shape) == tuple(case.x.shape) and out.dtype == case.x.dtype
    assert_outputs_close(out, ref_out, tolerance_dtype or case.x.dtype)
    used, zero = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for part in ("non_spec", "spec"):
        if f"{part}_query_start_loc" in case.ref:
            lines = case.ref[f"{part}_state_indices"]
            used.append(lines)
            zero.append(skipped_rows(case.ref[f"{part}_query_start_loc"], lines,
                                     case.ref[f"{part}_token_indx"]))
    covered = np.concatenate([case.ref.get("non_spec_token_indx", np.zeros(0, np.int64)),
                              case.ref.get("spec_token_indx", np.zeros(0, np.int64))])
    zero.append(np.setdiff1d(np.arange(out.shape[0]), covered))  # padding rows
    assert_rows_zero(out, np.concatenate(zero))
    check_state(case.state, before, ref_state, np.concatenate(used))


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_gdn_mixed_step_with_null_blocks_in_both_parts(sycl_device, rand, dtype_name,
                                                       width):
    """Prefill chunks + decodes (counted as prefills) + ragged spec sequences, int64
    argsort maps, null blocks in both parts, a trailing zero-length request."""
    case = gdn_case(*rand, dtype=DTYPES[dtype_name], width=width, prefill=[37, 2, 9],
                    decodes=3, spec=[4, 2, 4, 3], null_ns=2, null_spec=1, zero_length=1,
                    meta_dtype=torch.int64)
    assert case.meta.non_spec_token_indx.dtype == torch.int64
    run_gdn(case)


@pytest.mark.parametrize("layout", ["SD", "DS"])
@pytest.mark.parametrize("full_graph_pad", [0, 3])
def test_gdn_spec_only_step(sycl_device, rand, full_graph_pad, layout):
    """Spec-only: aranges as maps, an empty non_spec_token_indx; under FULL graphs the
    metadata's tail is padded (null lines, repeated query_start_loc, accepted 1) and
    num_actual_tokens counts the padded tokens."""
    case = gdn_case(*rand, layout=layout, full_graph_pad=full_graph_pad,
                    spec=[4, 4, 2, 4], null_spec=1)
    run_gdn(case)


@pytest.mark.parametrize("layout", ["SD", "DS"])
@pytest.mark.parametrize("full_graph_pad", [0, 4])
def test_gdn_decode_only_step(sycl_device, rand, full_graph_pad, layout):
    """Decode-only (no spec): vLLM's layer reads non_spec_state_indices_tensor[:
    num_actual_tokens], one token each; has_initial_state is None."""
    case = gdn_case(*rand, layout=layout, full_graph_pad=full_graph_pad, decodes=6,
                    null_ns=2)
    assert case.meta.has_initial_state is None and case.meta.num_prefills == 0
    run_gdn(case)


@pytest.mark.parametrize("meta", list(META_DTYPES))
def test_gdn_prefill_and_decodes_without_spec(sycl_device, rand, meta):
    case = gdn_case(*rand, prefill=[5, 20, 1], decodes=2, null_ns=1, zero_length=2,
                    meta_dtype=META_DTYPES[meta])
    run_gdn(case)


@X_AND_STATE_DTYPES
def test_gdn_x_dtype_differs_from_state(sycl_device, rand, x_dtype, state_dtype):
    case = gdn_case(*rand, dtype=x_dtype, state_dtype=state_dtype, prefill=[9, 1],
                    decodes=2, spec=[4, 4], null_spec=1)
    run_gdn(case, coarser(x_dtype, state_dtype))


def test_gdn_stale_window_fix_is_opt_in(sycl_device, rand):
    """non_spec_num_accepted_tokens moves the non-spec windows to column a-1."""
    gen, rng = rand
    case = gdn_case(gen, rng, prefill=[6, 3], decodes=2, spec=[4, 4])
    n = len(case.ref["non_spec_state_indices"])
    run_gdn(case, non_spec_num_accepted_tokens=ints(random_accepted(rng, n)))


@pytest.mark.parametrize("kind", ["decode", "spec", "prefill", "mixed"])
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16])
def test_gdn_step_into_mixed_qkv(sycl_device, rand, kind, x_dtype):
    """``out=mixed_qkv`` (what the plugin's whole-step mode passes where the layer reads
    the conv's output from mixed_qkv next): the call writes its outputs there and returns
    it, in x's dtype also where the state's differs (a copy); split outputs refuse it."""
    case = gdn_case(*rand, dtype=x_dtype, state_dtype=torch.float32, **GDN_STEPS[kind])
    x = case.x
    if kind == "mixed":
        with pytest.raises(ValueError, match="^out: not with split=True"):
            vllm.gdn_conv_step(x, case.weight, case.bias, case.state, case.meta, split=True,
                               out=x)
    ref_out, _ = causal_conv1d_reference(x.to(case.state.dtype), case.weight, case.bias,
                                         case.state, **case.ref)
    got = vllm.gdn_conv_step(x, case.weight, case.bias, case.state, case.meta, out=x)
    assert got is x
    assert_outputs_close(x, ref_out, x_dtype)


def test_gdn_conv_state_view_follows_the_layout(sycl_device):
    cache = torch.zeros(5, 6, DIM)  # state-major storage (lines, state_len, dim)
    assert vllm.conv_state_view(cache, dim_first=False).shape == (5, DIM, 6)
    assert vllm.conv_state_view(cache, dim_first=True) is cache


@pytest.mark.parametrize("kind", list(GDN_STEPS))
def test_gdn_device_plan_reads_the_metadata_as_the_layer(sycl_device, rand, kind):
    """The whole-step mode's plan of device metadata (``gdn_device_plan``: vLLM's
    metadata tensors read where they are, never on the host) against the reference of
    vLLM's conventions: a mixed step's token maps and split outputs (the maps' lengths),
    FULL-graph padding, null blocks, zero-length requests, stale buffer entries."""
    case = gdn_case(*rand, **GDN_STEPS[kind])
    plan = dropins.gdn_device_plan(case.x.shape[0], case.state, 4, case.meta)
    assert plan.on_device
    before = bits(case.state)
    ref_out, ref_state = causal_conv1d_reference(case.x, case.weight, case.bias, case.state,
                                                 **case.ref)
    both = kind == "mixed"
    result = plan.run(case.x, case.weight, case.bias, case.state, split=both)
    if both:
        for part in ("spec", "non_spec"):
            rows = case.ref[f"{part}_token_indx"]
            got = getattr(result, part)
            assert got.shape[0] == len(rows)
            assert_outputs_close(got, ref_out[rows], case.x.dtype)
    else:
        assert_outputs_close(result, ref_out, case.x.dtype)
    jitconv.check_errors()
    used = [case.ref[f"{p}_state_indices"] for p in ("non_spec", "spec")
            if f"{p}_state_indices" in case.ref]
    check_state(case.state, before, ref_state, np.concatenate(used))


def test_gdn_bad_metadata_raises_before_launch(sycl_device, rand):
    gen, rng = rand
    case = gdn_case(gen, rng, spec=[4, 4], null_spec=0)
    case.meta.spec_state_indices_tensor = case.meta.spec_state_indices_tensor.clone()
    case.meta.spec_state_indices_tensor[1, 0] = -1  # not vLLM's padding: an error
    before = bits(case.state)
    with pytest.raises(ValueError, match="spec_state_indices_tensor: cache line -1"):
        vllm.gdn_conv_step(case.x, case.weight, case.bias, case.state, case.meta)
    assert torch.equal(bits(case.state), before)


# ------------------------------------------------------------- EAGLE tree verify

# The trees of vLLM's EAGLE-tree conv test (its PR 29846): parent positions, -1 for the
# root and the padding.
EAGLE_TREES = [[-1, 0, 0, 1, -1, -1], [-1, 0, 1, -1, -1, -1], [-1, 0, 0, 1, 1, -1],
               [-1, 0, 0, 1, 1, 2]]


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
@pytest.mark.parametrize("with_bias", [False, True])
def test_update_with_retrieve_parent_token(cpu_tensor_device, dtype_name, with_bias):
    """vLLM's tree verify, called as its EAGLE-tree test calls its kernel: varlen x,
    ragged trees of 4, 3, 5 and 6 tokens, a (batch, 6) parent map padded with -1, a
    (batch, 6) state-index table, num_accepted_tokens; written into x (out=None) as
    0.32's drop-in does; states bit-exact, outputs within the contract's tolerance."""
    dtype = DTYPES[dtype_name]
    gen = torch.Generator().manual_seed(17 + with_bias)
    dim, width = 64, 4
    qsl = torch.tensor([0, 4, 7, 12, 18], dtype=torch.int32)
    x = torch.randn(18, dim, generator=gen).to(dtype)
    state = torch.randn(26, dim, width + 5 - 1, generator=gen).to(dtype)
    w = torch.randn(dim, width, generator=gen).to(dtype)
    bias = torch.randn(dim, generator=gen).to(dtype) if with_bias else None
    table = torch.arange(1, 25, dtype=torch.int32).view(4, 6)  # line 0 is the null block
    accepted = torch.tensor([1, 2, 1, 2], dtype=torch.int32)
    parents = torch.tensor(EAGLE_TREES, dtype=torch.int32)
    ref_out, ref_state = causal_conv1d_reference(
        x, w, bias, state, spec_query_start_loc=qsl, spec_state_indices=table,
        num_accepted_tokens=accepted, spec_parent_token=parents, activation="silu")
    result = vllm.causal_conv1d_update(x, state, w, bias, "silu", conv_state_indices=table,
                                       num_accepted_tokens=accepted, query_start_loc=qsl,
                                       max_query_len=6, retrieve_parent_token=parents)
    assert result is x
    assert_outputs_close(result, ref_out, dtype)
    assert_state_exact(state, ref_state)


def test_a_bad_retrieve_parent_token_is_refused_by_its_name(cpu_tensor_device):
    gen = torch.Generator().manual_seed(19)
    x = torch.randn(6, 16, generator=gen)
    state = torch.randn(3, 16, 8, generator=gen)
    before = state.clone()
    with pytest.raises(ValueError, match="^retrieve_parent_token: sequence 1, token 1"):
        vllm.causal_conv1d_update(x, state, torch.randn(16, 4, generator=gen), None, "silu",
                                  conv_state_indices=torch.tensor([1, 2], dtype=torch.int32),
                                  num_accepted_tokens=torch.tensor([1, 1], dtype=torch.int32),
                                  query_start_loc=torch.tensor([0, 3, 6], dtype=torch.int32),
                                  retrieve_parent_token=torch.tensor([[-1, 0, 1],
                                                                      [-1, 1, 0]]))
    assert torch.equal(state, before)


@pytest.mark.parametrize("shape", [(4, 64), (4, 64, 3, 1)])
def test_device_paths_name_a_conv_state_of_the_wrong_rank(shape):
    """The device-metadata drop-ins read conv_state's sizes for their plan keys before the
    core's checks: a conv_state that is not (lines, dim, state_len) is a ValueError naming
    it, not an index error (the helper both device paths call; the paths themselves need
    a GPU)."""
    with pytest.raises(ValueError, match=r"conv_state: expected a view of shape "
                                         r"\(num_cache_lines, dim, state_len\)"):
        dropins._state_shape(torch.zeros(shape))
    assert dropins._state_shape(torch.zeros(4, 64, 3)) == (4, 64, 3)
