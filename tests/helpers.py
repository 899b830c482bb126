"""Shared test helpers: random inputs, engine steps (from ``jitconv.steps``, which the
demo and the benchmark use too), state layouts, and the comparisons every kernel test
makes (outputs against the float64 reference within the dtype's tolerance, states
bit-exact)."""

import numpy as np
import torch

import jitconv
from jitconv import reference
# One place for steps and their metadata, shared with the demo and the benchmark.
from jitconv.steps import (DATA_KEYS, cumulative, fn_arguments, mixed_step,  # noqa: F401
                           random_values as randn, split_step, token_rows)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# (rtol, atol) against the float64 reference, keyed by torch dtype
TOLERANCE = {DTYPES[name]: tol for name, tol in reference.TOLERANCE.items()}
_BITS = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}
POISON = float("nan")


def make_state(gen, lines, dim, state_len, dtype, layout, usm=False):
    """conv_state viewed as (lines, dim, state_len). "SD" stores (lines, state_len, dim)
    (vLLM's layout, channels contiguous) and returns the transposed view; "DS" stores
    (lines, dim, state_len)."""
    if layout == "SD":
        return randn(gen, (lines, state_len, dim), dtype, usm).transpose(1, 2)
    assert layout == "DS", layout
    return randn(gen, (lines, dim, state_len), dtype, usm)


def strided_rows(gen, num_tokens, dim, dtype, usm=False):
    """x as the first ``dim`` channels of a wider projection: row stride > dim."""
    wide = randn(gen, (num_tokens, dim + 24), dtype, usm)
    return wide[:, 8:8 + dim]


def poisoned(shape, dtype, usm=False):
    t = jitconv.empty(shape, dtype) if usm else torch.empty(shape, dtype=dtype)
    t.fill_(POISON)
    return t


def bits(t):
    """The raw bit pattern of a float tensor (for bit-exact comparisons), on the CPU."""
    return t.detach().contiguous().view(_BITS[t.dtype]).cpu().clone()


def assert_outputs_close(out, ref, dtype):
    rtol, atol = TOLERANCE[dtype]
    got = out.detach().to(torch.float64).cpu().numpy()
    assert np.isfinite(got).all(), "some output rows were not written (poison left)"
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol)


def assert_state_exact(state, ref_state):
    """conv_state equals the reference bit for bit (new values are copies of inputs)."""
    expected = torch.from_numpy(ref_state).to(state.dtype)
    got, want = bits(state), bits(expected)
    if not torch.equal(got, want):
        diff = (got != want).nonzero()
        raise AssertionError(f"conv_state differs from the reference at {diff.shape[0]} "
                             f"places, first (line, channel, column) = {diff[0].tolist()}")


def gdn_metadata(step, num_actual_tokens=None, lines=lambda t: t):
    """A stand-in for vLLM's GDNAttentionMetadata of a ``mixed_step`` with both kinds of
    sequences (the fields ``jitconv.vllm.gdn_conv_step`` reads). With spec decodes in the
    step, vLLM counts the non-spec sequences as prefills. ``lines`` maps the step's cache
    lines to vLLM's (e.g. pads -1 to the null block)."""
    import types
    prefills = len(step["non_spec_query_start_loc"]) - 1
    spec = len(step["spec_query_start_loc"]) - 1
    return types.SimpleNamespace(
        num_actual_tokens=(step["x"].shape[0] if num_actual_tokens is None
                           else num_actual_tokens),
        num_prefills=prefills, num_decodes=0, num_spec_decodes=spec,
        spec_sequence_masks=torch.ones(prefills + spec, dtype=torch.bool),
        non_spec_query_start_loc=step["non_spec_query_start_loc"],
        non_spec_state_indices_tensor=lines(step["non_spec_state_indices"]),
        has_initial_state=step["has_initial_state"],
        non_spec_token_indx=step["non_spec_token_indx"],
        spec_query_start_loc=step["spec_query_start_loc"],
        spec_state_indices_tensor=lines(step["spec_state_indices"]),
        spec_token_indx=step["spec_token_indx"],
        num_accepted_tokens=step["num_accepted_tokens"])


def wide_choices(monkeypatch):
    """The ``wide`` argument of every SYCL kernel lookup (launching.get_conv_kernel) from
    here on, in a list: which kernel each launch chose."""
    from jitconv import launching
    chosen = []
    lookup = launching.get_conv_kernel

    def spy(width, dtype_name, queue=None, wide=False):
        chosen.append(wide)
        return lookup(width, dtype_name, queue, wide)
    monkeypatch.setattr(launching, "get_conv_kernel", spy)
    return chosen
