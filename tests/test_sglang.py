"""jitconv.sglang: SGLang's conv ops (sglang 0.5.23's Triton signatures and conventions)
against the float64 reference, and their refusals. SGLang's own modules run them in
scripts/check_real_sglang.py (by hand: its venv is about 3 GB); its own Triton kernels
ran side by side on a GPU (docs/verification.md)."""

import numpy as np
import pytest
import torch

from jitconv import sglang as jsg
from jitconv.reference import causal_conv1d_reference

from helpers import assert_outputs_close, assert_state_exact, bits, random_parents

DIM = 40


def _tensors(gen, batch, seqlen, width, lines=6, dtype=torch.float32, state_extra=0):
    S = width - 1
    x = torch.randn(batch * seqlen, DIM, generator=gen).to(dtype)
    # SGLang's verify x: mixed_qkv.view(bs, T, -1).transpose(1, 2), token-major storage
    x3 = x.view(batch, seqlen, DIM).transpose(1, 2)
    return dict(x=x, x3=x3, weight=torch.randn(DIM, width, generator=gen).to(dtype),
                bias=torch.randn(DIM, generator=gen).to(dtype),
                conv_state=torch.randn(lines, DIM, S + state_extra, generator=gen).to(dtype))


def _children(parents, n):
    """SGLang's first-child / next-sibling arrays of a parent map (children in order)."""
    nxt = torch.full((n,), -1, dtype=torch.int32)
    sib = torch.full((n,), -1, dtype=torch.int32)
    last = {}
    for t in range(1, n):
        p = int(parents[t])
        if p in last:
            sib[last[p]] = t
        else:
            nxt[p] = t
        last[p] = t
    return nxt, sib


@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize("tree, dedup", [(False, False), (True, False), (False, True)])
def test_target_verify(cpu_tensor_device, width, tree, dedup):
    """SGLang's target verify: x (batch, dim, draft_tokens), one padded entry, the
    windows written for every token at intermediate_state_indices' rows; with a tree its
    parents come from retrieve_next_token / retrieve_next_sibling and are written into
    retrieve_parent_token. ``dedup``: SGLang's deduplicated windows view (a step's
    window overlaps the next's), linear only."""
    gen = torch.Generator().manual_seed(width * 4 + tree * 2 + dedup)
    batch, T, S = 4, 5, width - 1
    t = _tensors(gen, batch, T, width)
    lines = torch.tensor([2, -1, 0, 5], dtype=torch.int32)
    rows = torch.tensor([1, 3, 0, 2], dtype=torch.int32)
    if dedup:  # [rows, steps, dim, S] over a [rows, dim, T + S - 1] buffer
        buf = torch.randn(4, DIM, T + S - 1, generator=gen)
        windows = buf.as_strided((4, T, DIM, S), (buf.stride(0), 1, buf.stride(1), 1))
    else:
        windows = torch.randn(4, T, DIM, S, generator=gen)
    kwargs, parents = {}, None
    if tree:
        parents = random_parents(gen, [T] * batch)
        pairs = [_children(parents[i], T) for i in range(batch)]
        kwargs = dict(retrieve_next_token=torch.stack([p[0] for p in pairs]),
                      retrieve_next_sibling=torch.stack([p[1] for p in pairs]),
                      retrieve_parent_token=torch.full((batch, T), 9, dtype=torch.int32))
    state0, windows0 = t["conv_state"].clone(), windows.clone()
    out = jsg.causal_conv1d_update(t["x3"], t["conv_state"], t["weight"], t["bias"], True,
                                   conv_state_indices=lines,
                                   intermediate_conv_window=windows,
                                   intermediate_state_indices=rows, **kwargs)
    assert out.shape == t["x3"].shape and out.stride() == t["x3"].stride()
    ref_out, ref_state, ref_windows = causal_conv1d_reference(
        t["x"], t["weight"], t["bias"], state0,
        non_spec_query_start_loc=np.arange(0, batch * T + 1, T),
        non_spec_state_indices=lines.numpy(), non_spec_window_rows=rows.numpy(),
        non_spec_parent_token=None if parents is None else parents.numpy(),
        intermediate_windows=windows0.clone())
    got = out.transpose(1, 2).reshape(batch * T, DIM)
    assert_outputs_close(got[[r for r in range(batch * T) if r // T != 1]],
                         ref_out[[r for r in range(batch * T) if r // T != 1]], torch.float32)
    assert_state_exact(t["conv_state"], ref_state)
    # entry by entry (with the deduplicated view, overlapping entries got the same input)
    assert torch.equal(bits(windows), bits(torch.from_numpy(ref_windows).float()))
    if tree:
        got_parents = kwargs["retrieve_parent_token"]
        real = [0, 2, 3]
        want = parents[real].clone()
        want[:, 0] = 0  # SGLang's kernel writes 0 for the root
        assert torch.equal(got_parents[real], want)
        assert (got_parents[1] == 9).all()  # a padded entry's row is not written


@pytest.mark.parametrize("width", [3, 4])
def test_decode_and_spec_rule(cpu_tensor_device, width):
    """x (batch, dim): plain decodes; with num_accept_tokens, vLLM's spec rule."""
    gen = torch.Generator().manual_seed(width)
    batch = 3
    t = _tensors(gen, batch, 1, width, state_extra=3)
    lines = torch.tensor([4, 1, -1], dtype=torch.int32)
    state0 = t["conv_state"].clone()
    out = jsg.causal_conv1d_update(t["x"], t["conv_state"], t["weight"], t["bias"], "silu",
                                   conv_state_indices=lines)
    ref_out, ref_state = causal_conv1d_reference(
        t["x"], t["weight"], t["bias"], state0, non_spec_query_start_loc=np.arange(4),
        non_spec_state_indices=lines.numpy())
    assert_outputs_close(out[:2], ref_out[:2], torch.float32)
    assert_state_exact(t["conv_state"], ref_state)
    accept = torch.tensor([2, 1, 1], dtype=torch.int32)
    t = _tensors(gen, batch, 3, width, state_extra=3)
    state0 = t["conv_state"].clone()
    out = jsg.causal_conv1d_update(t["x3"], t["conv_state"], t["weight"], None, None,
                                   conv_state_indices=lines, num_accept_tokens=accept)
    ref_out, ref_state = causal_conv1d_reference(
        t["x"], t["weight"], None, state0, spec_query_start_loc=np.arange(0, 10, 3),
        spec_state_indices=lines.numpy(), num_accepted_tokens=accept.numpy(),
        activation=None)
    assert_outputs_close(out.transpose(1, 2).reshape(9, DIM)[:6], ref_out[:6],
                         torch.float32)
    assert_state_exact(t["conv_state"], ref_state)


def test_prefill(cpu_tensor_device):
    """causal_conv1d_fn: x (dim, tokens) as SGLang passes mixed_qkv.transpose(0, 1);
    has_initial_state None means no sequence has a state (SGLang's default), a padded
    sequence writes nothing; the output is laid out like x."""
    gen = torch.Generator().manual_seed(1)
    width = 4
    t = _tensors(gen, 1, 13, width)
    qsl = torch.tensor([0, 5, 6, 13], dtype=torch.int32)
    lines = torch.tensor([3, -1, 0], dtype=torch.int32)
    for init in (None, torch.tensor([True, False, True])):
        state = t["conv_state"].clone()
        out = jsg.causal_conv1d_fn(t["x"].t(), t["weight"], t["bias"], state, qsl,
                                   [5, 1, 7], cache_indices=lines, has_initial_state=init)
        assert out.shape == (DIM, 13) and out.stride() == t["x"].t().stride()
        ref_out, ref_state = causal_conv1d_reference(
            t["x"], t["weight"], t["bias"], t["conv_state"], non_spec_query_start_loc=qsl,
            non_spec_state_indices=lines,
            has_initial_state=np.zeros(3, bool) if init is None else init.numpy())
        keep = [r for r in range(13) if r != 5]
        assert_outputs_close(out.t()[keep], ref_out[keep], torch.float32)
        assert_state_exact(state, ref_state)


def test_update_refuses_metadata(cpu_tensor_device):
    gen = torch.Generator().manual_seed(2)
    t = _tensors(gen, 2, 1, 4)
    before = bits(t["conv_state"])
    with pytest.raises(NotImplementedError, match="^metadata: not implemented"):
        jsg.causal_conv1d_update(t["x"], t["conv_state"], t["weight"],
                                 conv_state_indices=torch.tensor([0, 1]),
                                 metadata=torch.tensor([3, 3], dtype=torch.int32))
    assert torch.equal(bits(t["conv_state"]), before)


def test_update_with_cache_seqlens_runs_circular_lines(cpu_tensor_device):
    """``cache_seqlens``: each line a ring (SGLang's CUDA op's meaning), decodes and
    3-token sequences, positions wrapping; with num_accept_tokens, refused by name."""
    gen = torch.Generator().manual_seed(2)
    for seqlen in (1, 3):
        t = _tensors(gen, 3, seqlen, 4, state_extra=2)
        lines = torch.tensor([4, 0, 2])
        counts = torch.tensor([3, 4, 10], dtype=torch.int32)
        ref_out, ref_state = causal_conv1d_reference(
            t["x"], t["weight"], t["bias"], t["conv_state"],
            non_spec_query_start_loc=torch.arange(0, 3 * seqlen + 1, seqlen),
            non_spec_state_indices=lines, non_spec_cache_seqlens=counts, activation="silu")
        x = t["x"] if seqlen == 1 else t["x3"]
        out = jsg.causal_conv1d_update(x, t["conv_state"], t["weight"], t["bias"], "silu",
                                       cache_seqlens=counts, conv_state_indices=lines)
        tokens = out if seqlen == 1 else out.transpose(1, 2).reshape(-1, DIM)
        assert_outputs_close(tokens, ref_out, torch.float32)
        assert_state_exact(t["conv_state"], ref_state)
    before = bits(t["conv_state"])
    with pytest.raises(ValueError, match="^cache_seqlens: circular lines do not combine "
                                         "with num_accept_tokens"):
        jsg.causal_conv1d_update(t["x3"], t["conv_state"], t["weight"], None, "silu",
                                 cache_seqlens=counts, conv_state_indices=lines,
                                 num_accept_tokens=torch.ones(3, dtype=torch.int32))
    assert torch.equal(bits(t["conv_state"]), before)


def test_fn_refuses_block_table_and_unknown_arguments(cpu_tensor_device):
    gen = torch.Generator().manual_seed(4)
    t = _tensors(gen, 1, 4, 4)
    args = (t["x"].t(), t["weight"], None, t["conv_state"], torch.tensor([0, 4]), [4])
    with pytest.raises(NotImplementedError, match="^block_table: not implemented"):
        jsg.causal_conv1d_fn(*args, block_table=torch.zeros(1, 2, dtype=torch.int32))
    with pytest.raises(TypeError, match="^flavour: not an argument"):
        jsg.causal_conv1d_fn(*args, flavour=1)


@pytest.mark.parametrize("bad, message", [
    ("before", "is not a later position"),
    ("twice", "reached twice"),
    ("range", "is not a later position"),
])
def test_a_bad_tree_is_refused_before_anything_runs(cpu_tensor_device, bad, message):
    gen = torch.Generator().manual_seed(5)
    t = _tensors(gen, 1, 4, 4)
    nxt = torch.tensor([[1, 3, -1, -1]], dtype=torch.int32)
    sib = torch.tensor([[-1, 2, -1, -1]], dtype=torch.int32)
    if bad == "before":
        nxt[0, 2] = 1
    elif bad == "twice":
        sib[0, 2] = 3
    else:
        nxt[0, 1] = 7
    before = bits(t["conv_state"])
    with pytest.raises(ValueError, match=message):
        jsg.causal_conv1d_update(t["x3"], t["conv_state"], t["weight"],
                                 conv_state_indices=torch.tensor([1], dtype=torch.int32),
                                 retrieve_next_token=nxt, retrieve_next_sibling=sib,
                                 retrieve_parent_token=torch.zeros(1, 4, dtype=torch.int32))
    assert torch.equal(bits(t["conv_state"]), before)


def test_windows_errors_name_sglangs_arguments(cpu_tensor_device):
    gen = torch.Generator().manual_seed(6)
    t = _tensors(gen, 2, 3, 4)
    windows = torch.randn(1, 3, DIM, 3, generator=gen)  # one row; row 1 is asked for
    with pytest.raises(ValueError, match="^intermediate_conv_window: has 1 rows"):
        jsg.causal_conv1d_update(t["x3"], t["conv_state"], t["weight"],
                                 conv_state_indices=torch.tensor([0, 1], dtype=torch.int32),
                                 intermediate_conv_window=windows,
                                 intermediate_state_indices=torch.tensor([0, 1]))


def test_a_batch_of_pads_writes_nothing(cpu_tensor_device):
    gen = torch.Generator().manual_seed(7)
    t = _tensors(gen, 2, 3, 4)
    windows = torch.randn(2, 3, DIM, 3, generator=gen)
    before, before_windows = bits(t["conv_state"]), bits(windows)
    jsg.causal_conv1d_update(t["x3"], t["conv_state"], t["weight"],
                             conv_state_indices=torch.tensor([-1, -1], dtype=torch.int32),
                             intermediate_conv_window=windows,
                             intermediate_state_indices=torch.tensor([0, 1]))
    assert torch.equal(bits(t["conv_state"]), before)
    assert torch.equal(bits(windows), before_windows)
