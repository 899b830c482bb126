"""Tests of the float64 reference itself (jitconv/reference.py) against SEMANTICS.md.

Every kernel test trusts the reference, so the reference must be checked on its own.
These tests run on the CPU with numpy/torch only. Expectations are computed
independently: with torch.nn.functional.conv1d, by slicing the token stream by hand,
or by driving the reference through a different path (sequential decodes, separate
calls, another argument shape) than the one under test.

Conventions: state arrays are (lines, dim, state_len); W = width, S = W - 1.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from jitconv.reference import (causal_conv1d_fn_reference, causal_conv1d_reference,
                               gdn_conv_stage_reference)
from jitconv.testing.steps import cumulative

DIM = 6
WIDTHS = [2, 3, 4, 5]
EXACT = dict(rtol=1e-12, atol=1e-12)  # float64 vs float64: only summation order differs


# ----------------------------------------------------------------------------- helpers

def rng_for(*key):
    """A generator seeded from the test parameters, so each case has its own data."""
    return np.random.default_rng([int(k) for k in key])


def rand(rng, *shape):
    """Standard normal float64 values (never all zero, so 'untouched' checks mean something)."""
    return rng.standard_normal(shape)


def make_weights(rng, width, with_bias=True):
    bias = rand(rng, DIM) if with_bias else None
    return rand(rng, DIM, width), bias


def start_loc(lengths):
    """Cumulative token counts starting at 0, as an int32 numpy array (query_start_loc)."""
    return cumulative(lengths).numpy()


def i32(values):
    return np.asarray(values, dtype=np.int32)


def torch_causal_conv(window, xs, weight, bias, activation):
    """Independent expectation with F.conv1d (depthwise, groups=dim).

    window: (dim, S) inputs preceding the sequence, or None for left zero padding;
    xs: (n, dim) tokens, n >= 1. Returns (n, dim).
    """
    width = weight.shape[1]
    inp = torch.from_numpy(np.ascontiguousarray(xs.T))
    if window is None:
        inp = F.pad(inp, (width - 1, 0))
    else:
        inp = torch.cat([torch.from_numpy(np.ascontiguousarray(window)), inp], dim=1)
    y = F.conv1d(inp[None], torch.from_numpy(weight)[:, None, :],
                 None if bias is None else torch.from_numpy(bias), groups=weight.shape[0])
    y = y[0].T
    if activation is not None:
        y = F.silu(y)
    return y.numpy()


def run_non_spec(x, weight, bias, state, lengths, lines, init=None, activation="silu", **kw):
    """Reference over non-spec sequences only (prefill chunks / plain decodes)."""
    return causal_conv1d_reference(
        x, weight, bias, state, non_spec_query_start_loc=start_loc(lengths),
        non_spec_state_indices=i32(lines),
        has_initial_state=None if init is None else np.asarray(init, dtype=bool),
        activation=activation, **kw)


def run_spec(x, weight, bias, state, lengths, lines, accepted, activation="silu", **kw):
    """Reference over spec verify sequences only."""
    return causal_conv1d_reference(
        x, weight, bias, state, spec_query_start_loc=start_loc(lengths),
        spec_state_indices=i32(lines), num_accepted_tokens=i32(accepted),
        activation=activation, **kw)


def assert_lines_untouched(new_state, old_state, lines):
    for line in lines:
        np.testing.assert_array_equal(new_state[line], old_state[line],
                                      err_msg=f"cache line {line} changed")


# ------------------------------------------------- 1. single sequence vs F.conv1d

@pytest.mark.parametrize("layout", ["DS", "SD"])
@pytest.mark.parametrize("n", [1, 7])
@pytest.mark.parametrize("has_initial_state", [True, False])
@pytest.mark.parametrize("activation", ["silu", None])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("width", WIDTHS)
def test_single_sequence_matches_torch_conv1d(width, with_bias, activation,
                                              has_initial_state, n, layout):
    rng = rng_for(1, width, with_bias, activation is None, has_initial_state, n,
                  layout == "SD")
    S = width - 1
    state_len, lines, line = S + 3, 3, 1
    weight, bias = make_weights(rng, width, with_bias)
    x = rand(rng, n, DIM)
    state0 = rand(rng, lines, DIM, state_len)
    # vLLM's "SD" storage is (lines, state_len, dim), passed as a transposed view.
    conv_state = (torch.from_numpy(state0.copy()) if layout == "DS"
                  else torch.from_numpy(np.ascontiguousarray(state0.transpose(0, 2, 1)))
                  .transpose(1, 2))

    out, new_state = causal_conv1d_fn_reference(
        x, weight, bias, conv_state, start_loc([n]), i32([line]),
        has_initial_state=np.array([has_initial_state]), activation=activation)

    window = state0[line, :, :S] if has_initial_state else np.zeros((DIM, S))
    np.testing.assert_allclose(out, torch_causal_conv(window if has_initial_state else None,
                                                      x, weight, bias, activation), **EXACT)
    u = np.concatenate([window, x.T], axis=1)
    np.testing.assert_array_equal(new_state[line, :, :S], u[:, -S:])
    np.testing.assert_array_equal(new_state[line, :, S:], state0[line, :, S:])
    assert_lines_untouched(new_state, state0, [0, 2])


# ------------------------------------------------- 2. chunked prefill == one chunk

@pytest.mark.parametrize("first_init", [True, False])
@pytest.mark.parametrize("first_len", [0, 1, 2, 4, 7, 8, 9])
@pytest.mark.parametrize("width", WIDTHS)
def test_chunked_prefill_equals_single_chunk(width, first_len, first_init):
    # Total 9 tokens: first chunks of 0 (empty), 1, 2 (shorter than S for wide kernels),
    # and second chunks of 2 and 1 token (first_len 7, 8), plus the empty second chunk.
    rng = rng_for(2, width, first_len, first_init)
    total, line = 9, 2
    weight, bias = make_weights(rng, width)
    x = rand(rng, total, DIM)
    state0 = rand(rng, 4, DIM, width + 2)

    out_one, state_one = run_non_spec(x, weight, bias, state0, [total], [line], [first_init])

    out_a, state_a = run_non_spec(x[:first_len], weight, bias, state0, [first_len], [line],
                                  [first_init])
    out_b, state_b = run_non_spec(x[first_len:], weight, bias, state_a, [total - first_len],
                                  [line], [True])

    np.testing.assert_allclose(np.concatenate([out_a, out_b]), out_one, **EXACT)
    np.testing.assert_array_equal(state_b, state_one)
    # Guard against a no-op reference making both sides agree trivially.
    assert not np.array_equal(state_one[line], state0[line])


# --------------------------------------- 3. spec rollback == sequential decoding

def spec_cases():
    return [(k, a) for k in range(1, 5) for a in range(1, k + 2)]


@pytest.mark.parametrize("k,accepted", spec_cases())
@pytest.mark.parametrize("width", WIDTHS)
def test_spec_rollback_equals_sequential_decoding(width, k, accepted):
    """SEMANTICS.md "Why the spec rule is right", step by step.

    The line starts after a prefill/decode: st[:, 0:S] = [h1..hS]. Verify step 1 feeds
    d1..dn (n = 1 + k) with num_accepted_tokens = 1 (the previous step was not spec), so
    the line becomes [h2..hS, d1..dn]. The sampler accepts a tokens; verify step 2 feeds
    e1..en with num_accepted_tokens = a. Its outputs must equal decoding d1..da one at a
    time, then e1..en as a plain continuation.
    """
    rng = rng_for(3, width, k, accepted)
    S, n, a = width - 1, 1 + k, accepted
    extra = 3  # columns beyond any the spec steps write: must stay bit-identical
    state_len, line = S - 1 + n + extra, 2
    weight, bias = make_weights(rng, width)
    h, d, e = rand(rng, S, DIM), rand(rng, n, DIM), rand(rng, n, DIM)
    state0 = rand(rng, 4, DIM, state_len)
    state0[line, :, :S] = h.T

    # Verify step 1.
    out1, state1 = run_spec(d, weight, bias, state0, [n], [line], [1])
    np.testing.assert_allclose(out1, torch_causal_conv(h.T, d, weight, bias, "silu"), **EXACT)
    np.testing.assert_array_equal(state1[line, :, :S - 1 + n],
                                  np.concatenate([h[1:], d]).T)
    np.testing.assert_array_equal(state1[line, :, S - 1 + n:], state0[line, :, S - 1 + n:])
    assert_lines_untouched(state1, state0, [0, 1, 3])

    # Verify step 2, rolled back to the a accepted tokens.
    out2, state2 = run_spec(e, weight, bias, state1, [n], [line], [a])

    # Sequential path: decode d1..da one by one, then e as one non-spec continuation.
    seq_state, seq_outs = state0, []
    for token in d[:a]:
        y, seq_state = run_non_spec(token[None], weight, bias, seq_state, [1], [line], [True])
        seq_outs.append(y)
    out_seq, seq_state = run_non_spec(e, weight, bias, seq_state, [n], [line], [True])

    np.testing.assert_allclose(np.concatenate(seq_outs), out1[:a], **EXACT)
    np.testing.assert_allclose(out2, out_seq, **EXACT)
    # And against the whole token stream with torch, independently of the reference.
    stream = np.concatenate([h, d[:a], e])
    np.testing.assert_allclose(
        out2, torch_causal_conv(stream[a:a + S].T, e, weight, bias, "silu"), **EXACT)

    # Step 2 leaves the newest S-1+n stream tokens; its last S are the sequential window.
    np.testing.assert_array_equal(state2[line, :, :S - 1 + n], stream[-(S - 1 + n):].T)
    np.testing.assert_array_equal(state2[line, :, n - 1:n - 1 + S], seq_state[line, :, :S])
    np.testing.assert_array_equal(state2[line, :, S - 1 + n:], state0[line, :, S - 1 + n:])
    assert_lines_untouched(state2, state0, [0, 1, 3])


# ------------------------------------------- 4. mixed batch == spec + non-spec calls

@pytest.mark.parametrize("width", WIDTHS)
def test_mixed_batch_equals_separate_calls(width):
    rng = rng_for(4, width)
    S = width - 1
    ns_len, ns_lines, ns_init = [5, 1, 3, 1, 2], [1, 4, 6, 0, 8], [True, True, False, True, True]
    sp_len, sp_lines, sp_acc = [2, 4, 3, 1], [3, 7, 5, 9], [1, 3, 2, 1]
    unused = [2]
    n_ns, n_sp = sum(ns_len), sum(sp_len)
    state_len = S - 1 + max(sp_len) + 1
    weight, bias = make_weights(rng, width)
    x = rand(rng, n_ns + n_sp, DIM)
    state0 = rand(rng, 10, DIM, state_len)
    # Shuffled token maps: spec and non-spec rows interleaved arbitrarily.
    perm = rng.permutation(n_ns + n_sp)
    ns_rows, sp_rows = perm[:n_ns], perm[n_ns:]

    out, new_state = causal_conv1d_reference(
        torch.from_numpy(x), torch.from_numpy(weight), torch.from_numpy(bias),
        torch.from_numpy(state0.copy()),
        non_spec_query_start_loc=torch.from_numpy(start_loc(ns_len)),
        non_spec_state_indices=torch.tensor(ns_lines, dtype=torch.int32),
        has_initial_state=torch.tensor(ns_init),
        non_spec_token_indx=torch.from_numpy(i32(ns_rows)),
        spec_query_start_loc=torch.from_numpy(start_loc(sp_len)),
        spec_state_indices=torch.tensor(sp_lines, dtype=torch.int32),
        spec_token_indx=torch.from_numpy(i32(sp_rows)),
        num_accepted_tokens=torch.tensor(sp_acc, dtype=torch.int32))

    # Separate calls on compact inputs in sequence order (default token maps).
    out_ns, state_ns = run_non_spec(x[ns_rows], weight, bias, state0, ns_len, ns_lines, ns_init)
    out_sp, state_sp = run_spec(x[sp_rows], weight, bias, state0, sp_len, sp_lines, sp_acc)

    expected_out = np.empty_like(x)
    expected_out[ns_rows], expected_out[sp_rows] = out_ns, out_sp
    np.testing.assert_allclose(out, expected_out, **EXACT)
    expected_state = state0.copy()
    expected_state[ns_lines], expected_state[sp_lines] = state_ns[ns_lines], state_sp[sp_lines]
    np.testing.assert_array_equal(new_state, expected_state)
    assert_lines_untouched(new_state, state0, unused)
    for line in ns_lines + sp_lines:  # guard against a no-op reference
        assert not np.array_equal(new_state[line], state0[line])


# -------------------------------------------- 5. padded sequences, uncovered rows

@pytest.mark.parametrize("pad_slot_id", [None, 99999])  # None: the default, -1
@pytest.mark.parametrize("width", WIDTHS)
def test_padded_sequences_and_uncovered_rows(width, pad_slot_id):
    rng = rng_for(5, width, 0 if pad_slot_id is None else pad_slot_id)
    S = width - 1
    pad = -1 if pad_slot_id is None else pad_slot_id
    # With 4 lines, pad -1 would alias line 3 and 99999 is out of range if ever used.
    ns_len, ns_lines = [3, 2, 1], [pad, 1, pad]
    sp_len, sp_lines, sp_acc = [2, 3], [pad, 2], [3, 2]
    n_ns, n_sp, n_uncovered = sum(ns_len), sum(sp_len), 3
    weight, bias = make_weights(rng, width)
    x = rand(rng, n_ns + n_sp + n_uncovered, DIM)
    state0 = rand(rng, 4, DIM, S + 3)
    perm = rng.permutation(len(x))
    ns_rows, sp_rows, uncovered = perm[:n_ns], perm[n_ns:n_ns + n_sp], perm[n_ns + n_sp:]
    kw = {} if pad_slot_id is None else dict(pad_slot_id=pad_slot_id)

    out, new_state = causal_conv1d_reference(
        x, weight, bias, state0.copy(),
        non_spec_query_start_loc=start_loc(ns_len), non_spec_state_indices=i32(ns_lines),
        non_spec_token_indx=i32(ns_rows),
        spec_query_start_loc=start_loc(sp_len), spec_state_indices=i32(sp_lines),
        spec_token_indx=i32(sp_rows), num_accepted_tokens=i32(sp_acc), **kw)

    pad_rows = np.concatenate([ns_rows[0:3], ns_rows[5:6], sp_rows[0:2]])
    np.testing.assert_array_equal(out[pad_rows], 0.0)
    np.testing.assert_array_equal(out[uncovered], 0.0)
    assert_lines_untouched(new_state, state0, [0, 3])
    # The real sequences still run (window offset a-1 = 1 for the spec one).
    np.testing.assert_allclose(out[ns_rows[3:5]], torch_causal_conv(
        state0[1, :, :S], x[ns_rows[3:5]], weight, bias, "silu"), **EXACT)
    np.testing.assert_allclose(out[sp_rows[2:5]], torch_causal_conv(
        state0[2, :, 1:1 + S], x[sp_rows[2:5]], weight, bias, "silu"), **EXACT)


# --------------------------------------------------- 6. 2-D spec_state_indices

@pytest.mark.parametrize("width", WIDTHS)
def test_spec_state_indices_2d_uses_column_0(width):
    rng = rng_for(6, width)
    S = width - 1
    lengths, accepted = [3, 2], [2, 1]
    lines_2d = [[1, 4, 5], [3, 6, 7]]  # columns 1.. name lines the conv must not touch
    weight, bias = make_weights(rng, width)
    x = rand(rng, sum(lengths), DIM)
    state0 = rand(rng, 8, DIM, S - 1 + max(lengths) + 1)

    out_2d, state_2d = run_spec(x, weight, bias, state0, lengths, lines_2d, accepted)
    out_1d, state_1d = run_spec(x, weight, bias, state0, lengths, [1, 3], accepted)

    np.testing.assert_array_equal(out_2d, out_1d)
    np.testing.assert_array_equal(state_2d, state_1d)
    assert_lines_untouched(state_2d, state0, [0, 2, 4, 5, 6, 7])
    assert not np.array_equal(state_2d[1], state0[1])


# ------------------------------------- 7. non_spec_num_accepted_tokens offset rule

@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("accepted", [1, 2, 3, 4])
@pytest.mark.parametrize("width", WIDTHS)
def test_non_spec_num_accepted_tokens_reads_offset_window(width, accepted, n):
    """A non-spec sequence after a spec step with a accepted reads st[:, a-1:a-1+S].

    The line holds what a verify step left, [h2..hS, d1..dk]; any values will do, so the
    state is random and the expectation is sliced from it by hand.
    """
    rng = rng_for(7, width, accepted, n)
    S, a, line = width - 1, accepted, 1
    state_len = S + 3  # offset a-1 <= 3 keeps the window inside the line
    weight, bias = make_weights(rng, width)
    x = rand(rng, n, DIM)
    state0 = rand(rng, 3, DIM, state_len)

    out, new_state = causal_conv1d_fn_reference(
        x, weight, bias, state0.copy(), start_loc([n]), i32([line]),
        has_initial_state=np.array([True]), num_accepted_tokens=i32([a]))

    window = state0[line, :, a - 1:a - 1 + S]
    np.testing.assert_allclose(out, torch_causal_conv(window, x, weight, bias, "silu"),
                               **EXACT)
    u = np.concatenate([window, x.T], axis=1)
    np.testing.assert_array_equal(new_state[line, :, :S], u[:, -S:])
    np.testing.assert_array_equal(new_state[line, :, S:], state0[line, :, S:])
    assert_lines_untouched(new_state, state0, [0, 2])

    if n == 1:
        # A one-token decode is what the spec rule gives for n = 1: same window, and
        # st[:, 0:S-1+1] = u[:, 1:] is the same last-S update.
        out_sp, state_sp = run_spec(x, weight, bias, state0, [1], [line], [a])
        np.testing.assert_allclose(out, out_sp, **EXACT)
        np.testing.assert_array_equal(new_state, state_sp)


# ------------------------------------------------- 8. weight shaped (dim, 1, width)

@pytest.mark.parametrize("width", WIDTHS)
def test_weight_dim_1_width_equals_dim_width(width):
    rng = rng_for(8, width)
    S = width - 1
    weight, bias = make_weights(rng, width)
    x = rand(rng, 6, DIM)
    state0 = rand(rng, 3, DIM, S + 2)
    # One non-spec prefill (rows 0..3) and one spec sequence (rows 4..5).
    kw = dict(non_spec_query_start_loc=start_loc([4]), non_spec_state_indices=i32([0]),
              spec_query_start_loc=start_loc([2]), spec_state_indices=i32([2]),
              num_accepted_tokens=i32([2]))

    out_3d, state_3d = causal_conv1d_reference(
        x, torch.from_numpy(weight)[:, None, :], bias, state0, **kw)
    out_2d, state_2d = causal_conv1d_reference(x, weight, bias, state0, **kw)

    np.testing.assert_array_equal(out_3d, out_2d)
    np.testing.assert_array_equal(state_3d, state_2d)
    np.testing.assert_allclose(out_3d[:4], torch_causal_conv(state0[0, :, :S], x[:4], weight,
                                                             bias, "silu"), **EXACT)


# ------------------------------------------------------- 9. "swish" == "silu"

@pytest.mark.parametrize("width", WIDTHS)
def test_swish_equals_silu(width):
    rng = rng_for(9, width)
    weight, bias = make_weights(rng, width)
    x = rand(rng, 5, DIM)
    state0 = rand(rng, 2, DIM, width + 1)

    outs = {act: run_non_spec(x, weight, bias, state0, [5], [1], activation=act)[0]
            for act in ("silu", "swish", None)}

    np.testing.assert_array_equal(outs["swish"], outs["silu"])
    # Both are z * sigmoid(z) of the un-activated output (torch's silu, independently).
    np.testing.assert_allclose(outs["silu"], F.silu(torch.from_numpy(outs[None])).numpy(),
                               **EXACT)


# ------------------------------------- more state rules (SEMANTICS.md "More state rules")

def random_tree(rng, n):
    """A parent map of n tokens: token 0 the root, each other token's parent before it
    (entry 0 is -1, as the engines write the root's)."""
    return np.array([-1] + [int(rng.integers(0, t)) for t in range(1, n)], np.int64)


def path_to(parents, t):
    """Token positions from the root to t."""
    path = [t]
    while path[-1] > 0:
        path.append(int(parents[path[-1]]))
    return path[::-1]


def decode_one_by_one(x_rows, weight, bias, line_state, activation="silu"):
    """Decode the rows one at a time as plain non-spec decodes of one line: the outputs
    and the line after each (an independent path through the reference)."""
    dim, state_len = line_state.shape
    st = line_state[None].copy()
    ys, states = [], []
    for row in x_rows:
        y, st = run_non_spec(row[None], weight, bias, st, [1], [0], activation=activation)
        ys.append(y[0])
        states.append(st[0].copy())
    return ys, states


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("part", ["spec", "non_spec"])
def test_linear_parent_map_equals_no_parent_map(width, part):
    """parents[k] = k - 1 is the linear chain: bit-identical to no map."""
    rng = rng_for(width, part == "spec")
    lengths, n_lines, state_len = [3, 5, 1], 6, width - 1 + 5
    weight, bias = make_weights(rng, width)
    x, state = rand(rng, sum(lengths), DIM), rand(rng, n_lines, DIM, state_len)
    parents = np.full((3, 6), -1)
    for i, n in enumerate(lengths):
        parents[i, 1:n] = np.arange(n - 1)
    run = (lambda **kw: run_spec(x, weight, bias, state, lengths, [4, 0, 2], [1, 2, 1], **kw)) \
        if part == "spec" else (lambda **kw: run_non_spec(x, weight, bias, state, lengths,
                                                            [4, 0, 2], **kw))
    plain = run()
    tree = run(**{f"{part}_parent_token": parents})
    for a, b in zip(plain, tree):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("seed", range(4))
def test_tree_token_equals_decoding_its_path(width, seed):
    """A tree-verify token's output is what decoding the tokens of its root-to-token path
    one by one from the sequence's window gives; the state is the linear spec rule's
    (all tokens in index order, as vLLM's tree kernel writes it); token t's window is
    the line after decoding its path."""
    rng = rng_for(width, seed, 7)
    n, accepted, S = 6, int(rng.integers(1, 3)), width - 1
    state_len = S - 1 + n + 1
    weight, bias = make_weights(rng, width)
    x, state = rand(rng, n, DIM), rand(rng, 3, DIM, state_len)
    parents = random_tree(rng, n)
    windows = rand(rng, 4, n + 2, DIM, S)
    out, new, new_windows = run_spec(
        x, weight, bias, state, [n], [1], [accepted], spec_parent_token=parents[None],
        intermediate_windows=windows, spec_window_rows=i32([2]))
    o = accepted - 1
    start = np.zeros((DIM, state_len))
    start[:, :S] = state[1][:, o:o + S]  # the window the spec rule reads
    for t in range(n):
        path = path_to(parents, t)
        ys, states = decode_one_by_one(x[path], weight, bias, start)
        np.testing.assert_allclose(out[t], ys[-1], **EXACT)
        np.testing.assert_array_equal(new_windows[2, t], states[-1][:, :S])
    expected = state[1].copy()
    expected[:, :S - 1 + n] = np.concatenate([state[1][:, o + 1:o + S], x.T], axis=1)
    np.testing.assert_array_equal(new[1], expected)
    assert_lines_untouched(new, state, [0, 2])
    untouched = [r for r in range(4) if r != 2]
    np.testing.assert_array_equal(new_windows[untouched], windows[untouched])
    np.testing.assert_array_equal(new_windows[2, n:], windows[2, n:])


@pytest.mark.parametrize("width", WIDTHS)
def test_windows_of_a_linear_sequence_are_the_states_of_sequential_decodes(width):
    """SGLang's target verify: a non-spec sequence (state: its last S inputs) whose every
    token's window is written to its row of the windows."""
    rng = rng_for(width, 11)
    n, S = 5, width - 1
    weight, bias = make_weights(rng, width)
    x, state = rand(rng, n, DIM), rand(rng, 2, DIM, S)
    windows = rand(rng, 3, n, DIM, S)
    out, new, new_windows = run_non_spec(x, weight, bias, state, [n], [1],
                                         intermediate_windows=windows,
                                         non_spec_window_rows=i32([0]))
    ys, states = decode_one_by_one(x, weight, bias, state[1])
    for t in range(n):
        np.testing.assert_allclose(out[t], ys[t], **EXACT)
        np.testing.assert_array_equal(new_windows[0, t], states[t])
    np.testing.assert_array_equal(new[1], states[-1])
    np.testing.assert_array_equal(new_windows[1:], windows[1:])


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("initial", [True, False])
def test_checkpoints_and_write_line_equal_shorter_prefills(width, initial):
    """A chunk of n tokens read from one line, its final state written to another and
    checkpoints after p tokens written to theirs: each checkpoint equals the state of a
    prefill of the first p tokens; the read line is untouched."""
    rng = rng_for(width, initial, 13)
    n, S, state_len = 11, width - 1, width - 1 + 2
    weight, bias = make_weights(rng, width)
    x, state = rand(rng, n, DIM), rand(rng, 8, DIM, state_len)
    pos, lines = [1, 4, 8, 11], [5, 2, 7, 3]
    out, new = run_non_spec(x, weight, bias, state, [n], [6], [initial],
                            non_spec_write_indices=i32([0]),
                            non_spec_checkpoint_loc=i32([0, 4]),
                            non_spec_checkpoint_pos=i32(pos),
                            non_spec_checkpoint_indices=i32(lines))
    plain_out, plain = run_non_spec(x, weight, bias, state, [n], [6], [initial])
    np.testing.assert_array_equal(out, plain_out)
    expected = state[0].copy()
    expected[:, :S] = plain[6][:, :S]
    np.testing.assert_array_equal(new[0], expected)
    for p, line in zip(pos, lines):
        _, short = run_non_spec(x[:p], weight, bias, state, [p], [6], [initial])
        expected = state[line].copy()
        expected[:, :S] = short[6][:, :S]
        np.testing.assert_array_equal(new[line], expected, err_msg=f"checkpoint {p}")
    assert_lines_untouched(new, state, [1, 4, 6])


@pytest.mark.parametrize("width", WIDTHS)
def test_spec_write_line(width):
    """A spec sequence reading one line and writing another: the written line is what the
    read line would have become; the read line is untouched."""
    rng = rng_for(width, 17)
    n, S = 3, width - 1
    state_len = S - 1 + n + 1
    weight, bias = make_weights(rng, width)
    x, state = rand(rng, n, DIM), rand(rng, 4, DIM, state_len)
    out, new = run_spec(x, weight, bias, state, [n], [1], [2],
                        spec_write_indices=i32([3]))
    plain_out, plain = run_spec(x, weight, bias, state, [n], [1], [2])
    np.testing.assert_array_equal(out, plain_out)
    expected = state[3].copy()
    expected[:, :S - 1 + n] = plain[1][:, :S - 1 + n]
    np.testing.assert_array_equal(new[3], expected)
    assert_lines_untouched(new, state, [0, 1, 2])


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("seqlen,n", [(0, 1), (5, 2), (9, 3), (13, 9)])
def test_circular_line_equals_the_rotated_linear_line(width, seqlen, n):
    """Dao's and SGLang's cache_seqlens: the line is a ring of state_len inputs with the
    next one at cache_seqlens % state_len. Outputs are those of the window the ring holds
    (its S newest, by hand); token k lands at (cache_seqlens + k) % state_len, the last
    ones winning when n > state_len; nothing else changes."""
    rng = rng_for(width, seqlen, n, 19)
    S, L = width - 1, width + 3
    weight, bias = make_weights(rng, width)
    x, state = rand(rng, n, DIM), rand(rng, 2, DIM, L)
    out, new = run_non_spec(x, weight, bias, state, [n], [1],
                            non_spec_cache_seqlens=i32([seqlen]))
    c = seqlen % L
    window = state[1][:, [(c - S + k) % L for k in range(S)]]
    np.testing.assert_allclose(out, torch_causal_conv(window, x, weight, bias, "silu"),
                               **EXACT)
    expected = state[1].copy()
    for k in range(n):
        expected[:, (c + k) % L] = x[k]
    np.testing.assert_array_equal(new[1], expected)
    assert_lines_untouched(new, state, [0])


@pytest.mark.parametrize("parents", [[-1, 0, 2], [-1, 1, 0], [-1, 0, 3], [-1, -1, 0]])
def test_a_parent_map_that_is_not_a_tree_in_order_is_refused(parents):
    rng = rng_for(23)
    weight, bias = make_weights(rng, 4)
    x, state = rand(rng, 3, DIM), rand(rng, 2, DIM, 6)
    with pytest.raises(ValueError, match="spec_parent_token: token"):
        run_spec(x, weight, bias, state, [3], [1], [1],
                 spec_parent_token=np.asarray([parents]))


# ------------------------------------------------------------- the GDN conv stage

def stage_case(seed, H=2, HV=4, K=8, V=6, width=4):
    """A mixed step (two prefill chunks, a pad, two spec sequences) with shuffled token
    maps, and the layer's gating inputs, as the stage reference takes them."""
    rng = rng_for(seed)
    dim = 2 * H * K + HV * V
    S = width - 1
    ns, sp = [5, 3, 2], [3, 3]
    T = sum(ns) + sum(sp) + 2  # two rows of x nobody covers
    order = rng.permutation(T)
    lines = rng.permutation(12)
    md = dict(non_spec_query_start_loc=cumulative(ns),
              non_spec_state_indices=np.array([lines[0], -1, lines[1]]),
              has_initial_state=np.array([True, False, True]),
              non_spec_token_indx=order[:sum(ns)],
              spec_query_start_loc=cumulative(sp),
              spec_state_indices=np.array([lines[2], lines[3]]),
              spec_token_indx=order[sum(ns):sum(ns) + sum(sp)],
              num_accepted_tokens=np.array([1, 2]))
    data = dict(x=rng.standard_normal((T, dim)), weight=rng.standard_normal((dim, width)),
                bias=rng.standard_normal(dim),
                conv_state=rng.standard_normal((12, dim, S + 3)),
                a=rng.standard_normal((T, HV)) * 8, b=rng.standard_normal((T, HV)) * 3,
                A_log=rng.standard_normal(HV), dt_bias=rng.standard_normal(HV) * 8)
    return data, md, dict(num_k_heads=H, head_k_dim=K, head_v_dim=V)


@pytest.mark.parametrize("use_l2norm,exp_g", [(True, False), (False, False), (True, True),
                                               ({"non_spec": 2}, False)])
def test_gdn_stage_splits_normalises_and_gates_each_part(use_l2norm, exp_g):
    """The stage reference against its formulas written with torch: the conv's output
    rows of each part's tokens, in the part's token order, cut into q, k (H heads of K)
    and v (HV heads of V); q and k divided by sqrt(sum of squares + 1e-6) per head;
    g = -exp(A_log) * softplus(a + dt_bias) (torch's softplus, threshold 20), beta the
    sigmoid of b; the state as the conv reference's. A dict normalises a part's rows
    from the one it gives on."""
    data, md, heads = stage_case(3)
    parts, state = gdn_conv_stage_reference(**data, **heads, use_l2norm=use_l2norm,
                                            exp_g=exp_g, **md)
    out, want_state = causal_conv1d_reference(data["x"], data["weight"], data["bias"],
                                              data["conv_state"], **md)
    np.testing.assert_array_equal(state, want_state)
    H, K, V = heads["num_k_heads"], heads["head_k_dim"], heads["head_v_dim"]
    for part in ("spec", "non_spec"):
        rows = torch.from_numpy(md[f"{part}_token_indx"])
        y = torch.from_numpy(out)[rows]
        q, k, v = torch.split(y, [H * K, H * K, y.shape[1] - 2 * H * K], dim=1)
        q, k, v = q.reshape(len(rows), H, K), k.reshape(len(rows), H, K), \
            v.reshape(len(rows), -1, V)
        first = use_l2norm.get(part, len(rows)) if isinstance(use_l2norm, dict) else \
            0 if use_l2norm else len(rows)
        q, k = (torch.cat([t[:first], t[first:] * torch.rsqrt(
            (t[first:] * t[first:]).sum(-1, keepdim=True) + 1e-6)]) for t in (q, k))
        a, b = (torch.from_numpy(data[n])[rows] for n in ("a", "b"))
        g = -torch.from_numpy(data["A_log"]).exp() * F.softplus(
            a + torch.from_numpy(data["dt_bias"]), beta=1.0, threshold=20.0)
        want = dict(q=q, k=k, v=v, g=g.exp() if exp_g else g, beta=torch.sigmoid(b))
        for name, value in want.items():
            np.testing.assert_allclose(parts[part][name], value.numpy(), **EXACT,
                                       err_msg=f"{part} {name}")
    pad = md["non_spec_token_indx"][5:8]  # the padded sequence's tokens: zero q, k, v
    assert not np.abs(out[pad]).any()
    assert not np.abs(parts["non_spec"]["q"][5:8]).any()
    assert (parts["non_spec"]["beta"][5:8] > 0).all()


def test_gdn_stage_default_rows_and_softplus_threshold():
    """Without token maps each part's tokens are its rows of the default layout (non-spec
    first); softplus is its argument itself above 20 and log(1 + e^x) up to it."""
    data, md, heads = stage_case(4)
    for key in ("non_spec_token_indx", "spec_token_indx"):
        md.pop(key)
    data["a"][:, 0] = 25.0 - data["dt_bias"][0]  # softplus(25) taken as 25
    data["a"][:, 1] = 20.0 - data["dt_bias"][1]  # softplus(20) = log(1 + e^20)
    parts, _ = gdn_conv_stage_reference(**data, **heads, **md)
    n_ns = 10
    np.testing.assert_allclose(parts["non_spec"]["g"][:, 0],
                               -np.exp(data["A_log"][0]) * 25.0, **EXACT)
    np.testing.assert_allclose(parts["spec"]["g"][:, 1],
                               -np.exp(data["A_log"][1]) * np.log1p(np.exp(20.0)), **EXACT)
    np.testing.assert_allclose(parts["spec"]["beta"],
                               1 / (1 + np.exp(-data["b"][n_ns:n_ns + 6])), **EXACT)


def test_gdn_stage_heads_must_fill_the_conv():
    data, md, heads = stage_case(5)
    with pytest.raises(ValueError, match="num_k_heads, head_k_dim, head_v_dim"):
        gdn_conv_stage_reference(**data, **dict(heads, head_v_dim=5), **md)
