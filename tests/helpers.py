"""Shared test helpers: random inputs, engine steps (from ``jitconv.testing.steps``, which the
demo and the benchmark use too), state layouts, and the comparisons every kernel test
makes (outputs against the float64 reference within the dtype's tolerance, states
bit-exact)."""

import contextvars
import hashlib
import itertools
import os
import subprocess
import sys
import types

import numpy as np
import torch

import jitconv
import jitconv.vllm
from jitconv import reference
from jitconv.backends.cuda.backend import CudaBackend
from jitconv.backends.sycl.backend import SyclBackend
from jitconv.reference import causal_conv1d_reference
# One place for steps and their metadata, shared with the demo and the benchmark.
from jitconv.testing.steps import (DATA_KEYS, cumulative, fn_arguments, mixed_step,  # noqa: F401
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


def usm_copy(t):
    """A contiguous copy of CPU tensor ``t`` in USM memory (``jitconv.empty``): zero-copy
    for the SYCL kernels."""
    u = jitconv.empty(tuple(t.shape), t.dtype)
    u.copy_(t)
    return u


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
    from jitconv.backends.sycl import launching
    chosen = []
    lookup = launching.get_conv_kernel

    def spy(width, dtype_name, queue=None, wide=False, fast=None, **options):
        chosen.append(wide)
        return lookup(width, dtype_name, queue, wide, fast, **options)
    monkeypatch.setattr(launching, "get_conv_kernel", spy)
    return chosen


# ------------------------------------------------------------------ the mixed grid
# (shared by the SYCL tests, the CUDA tests and the baseline's)

def build_mixed(seed, *, dtype, width, dim, layout="SD", use_bias=True, pads=True,
                shuffle=True, usm=False, non_spec=True, spec=True, spec_2d=True,
                non_spec_accepted=False, strided=False, extra_lines=3):
    """kwargs for one mixed step; the same names serve jitconv and the reference.
    Non-spec lengths {1, 2, width-1, 8, 129} in random order, six ragged spec sequences
    of 1 + (0..4) tokens, one pad of each kind, 2 spare state columns, ``extra_lines``
    unused lines."""
    gen = torch.Generator().manual_seed(seed)
    ns_lengths = [1, 2, width - 1, 8, 129] if non_spec else []
    ns_lengths = [ns_lengths[i] for i in torch.randperm(len(ns_lengths), generator=gen)]
    sp_lengths = torch.randint(1, 6, (6,), generator=gen).tolist() if spec else []
    return mixed_step(gen, dim=dim, width=width, dtype=dtype, ns_lengths=ns_lengths,
                      sp_lengths=sp_lengths, rows="shuffled" if shuffle else "plain",
                      ns_pads=int(pads), sp_pads=int(pads), initial="alternate",
                      spec_columns=4 if spec_2d else 1, extra_state_columns=2,
                      extra_lines=extra_lines, layout=layout, bias=use_bias, usm=usm,
                      strided=strided, non_spec_accepted=non_spec_accepted)


def used_lines(case):
    """The cache lines a case reads or writes (write lines and checkpoints included)."""
    lines = []
    for key in ("non_spec_state_indices", "spec_state_indices", "non_spec_write_indices",
                "spec_write_indices", "non_spec_checkpoint_indices"):
        if case.get(key) is not None:
            t = case[key]
            lines += (t[:, 0] if t.dim() == 2 else t).tolist()
    return [line for line in lines if line >= 0]


def read_lines(case, part):
    t = case[f"{part}_state_indices"]
    return (t[:, 0] if t.dim() == 2 else t).tolist()


def with_lines(case, gen):
    """``case`` with write lines for some sequences of both parts and up to three
    checkpoints for some non-spec sequences (a sequence that moves its state writing its
    first checkpoint into the line it read, as vLLM's 'all' mode does), all on lines no
    sequence reads, in a random order (the case needs that many spare lines)."""
    case = dict(case)
    used = set(used_lines(case))
    free = [line for line in range(case["conv_state"].shape[0]) if line not in used]
    free = [free[i] for i in torch.randperm(len(free), generator=gen).tolist()]
    for part in ("non_spec", "spec"):
        if case.get(f"{part}_query_start_loc") is None:
            continue
        lines = read_lines(case, part)
        writes = [line if line < 0 or torch.rand(1, generator=gen) < 0.4 else free.pop()
                  for line in lines]
        case[f"{part}_write_indices"] = torch.tensor(writes, dtype=torch.int32)
        if part == "spec":
            continue
        loc, pos, ind = [0], [], []
        for i, n in enumerate(lengths_of(case["non_spec_query_start_loc"])):
            if lines[i] >= 0 and n >= 1 and torch.rand(1, generator=gen) < 0.8:
                picks = torch.randint(1, n + 1, (3,), generator=gen).tolist()
                for j, p in enumerate(sorted(set(picks))):
                    pos.append(p)
                    ind.append(lines[i] if j == 0 and writes[i] != lines[i] else free.pop())
            loc.append(len(pos))
        case.update(non_spec_checkpoint_loc=torch.tensor(loc, dtype=torch.int32),
                    non_spec_checkpoint_pos=torch.tensor(pos, dtype=torch.int32),
                    non_spec_checkpoint_indices=torch.tensor(ind, dtype=torch.int32))
    return case


def with_ring(case, gen):
    """``case`` with circular non-spec lines: random counts written so far, from 0 to
    three times around the ring (no non-spec accepted counts: rings take none)."""
    case = dict(case)
    case.pop("non_spec_num_accepted_tokens", None)
    count = len(case["non_spec_query_start_loc"]) - 1
    state_len = case["conv_state"].shape[2]
    case["non_spec_cache_seqlens"] = torch.randint(0, 3 * state_len, (count,),
                                                   generator=gen, dtype=torch.int32)
    return case


def run_and_check(case, *, dtype, activation="silu", out=None):
    before = bits(case["conv_state"])
    ref_out, ref_state = causal_conv1d_reference(activation=activation, **case)
    result = jitconv.causal_conv1d_mixed(activation=activation, out=out, **case)
    if out is not None:
        assert result is out
    assert_outputs_close(result, ref_out, dtype)
    assert_state_exact(case["conv_state"], ref_state)
    unused = torch.ones(case["conv_state"].shape[0], dtype=torch.bool)
    unused[used_lines(case)] = False
    assert torch.equal(bits(case["conv_state"])[unused], before[unused])
    return result


GRID = list(itertools.product(
    DTYPES, (2, 3, 4, 5), ("SD", "DS"), (False, True), (False, True),
    (("silu", True), (None, False), ("silu", False), (None, True))))


def grid_ids(grid):
    return ["-".join(str(v) for v in p[:5]) + f"-{p[5][0]}-bias{p[5][1]}" for p in grid]


def check_grid_case(params, dim, usm=False, on_device=None):
    """One case of GRID (its index is the seed): built, run with a poisoned out, and
    compared with the reference. ``on_device``: a check of the built case's tensors."""
    dtype_name, width, layout, pads, shuffle, (activation, use_bias) = params
    dtype = DTYPES[dtype_name]
    seed = GRID.index(params)
    case = build_mixed(seed, dtype=dtype, width=width, dim=dim, layout=layout,
                       use_bias=use_bias, pads=pads, shuffle=shuffle, usm=usm,
                       spec_2d=bool(seed % 2), strided=bool(seed % 3 == 0))
    if on_device is not None:
        on_device(case)
    out = poisoned(tuple(case["x"].shape), dtype, usm=usm)
    run_and_check(case, dtype=dtype, activation=activation, out=out)


def check_mixed_equals_split(case):
    """The mixed call and its two halves as separate calls agree bit for bit (outputs
    of each half's rows, and the states)."""
    split_state = case["conv_state"].clone()
    mixed = jitconv.causal_conv1d_mixed(**case)
    non_spec_only, spec_only = split_step(case, conv_state=split_state)
    out_ns = jitconv.causal_conv1d_mixed(**non_spec_only)
    out_sp = jitconv.causal_conv1d_mixed(**spec_only)
    ns_rows, sp_rows = token_rows(case, "non_spec"), token_rows(case, "spec")
    assert torch.equal(bits(mixed)[ns_rows], bits(out_ns)[ns_rows])
    assert torch.equal(bits(mixed)[sp_rows], bits(out_sp)[sp_rows])
    assert torch.equal(bits(case["conv_state"]), bits(split_state))


def tune(monkeypatch, **values):
    """Tuning values other than the table's (``jitconv.kernels.tuning``) for one test,
    checked as ``tuning.override`` checks them; a value None restores the table's."""
    from jitconv.kernels import tuning
    current = dict(tuning.overrides())
    for name, value in values.items():
        if value is None:
            current.pop(name, None)
        else:
            tuning.check(name, value)
            current[name] = value
    # a variable of the test's own, whose default is these values (restored after it)
    monkeypatch.setattr(tuning, "OVERRIDES", contextvars.ContextVar(
        "jitconv_tuning_overrides_test", default=tuple(sorted(current.items()))))


# ------------------------------------------------------------------ split outputs

def part_tokens(case, part):
    key = f"{part}_query_start_loc"
    return int(case[key][-1]) if case.get(key) is not None else 0


def check_split_outputs(case, dtype, usm=False, extra_rows=0):
    """causal_conv1d_mixed with out_spec / out_non_spec: each a poisoned view with
    margins inside a larger buffer. Its rows equal the one-output call's rows gathered
    by the part's token map, bit for bit (and the reference within tolerance); the states
    are bit-identical; the margins stay poison. Then twice with split=True (new outputs;
    the second run a remembered launch where launches are): the same bits. ``extra_rows``:
    rows of x that no sequence covers (needs token maps), written nowhere."""
    if extra_rows:
        x = case["x"]
        grown = randn(torch.Generator().manual_seed(7), (x.shape[0] + extra_rows, x.shape[1]),
                      dtype, usm)
        grown[:x.shape[0]] = x
        case = dict(case, x=grown)
    state0 = case["conv_state"].clone()
    ref_out, ref_state = causal_conv1d_reference(**case)
    full = jitconv.causal_conv1d_mixed(**case)
    full_state = bits(case["conv_state"])
    case["conv_state"].copy_(state0)
    dim, views, buffers = case["x"].shape[1], {}, {}
    for part in ("spec", "non_spec"):
        n = part_tokens(case, part)
        if not n and f"{part}_query_start_loc" not in case:
            views[part] = None
            continue
        buffers[part] = poisoned((n + 4, dim + 8), dtype, usm)
        views[part] = buffers[part][2:2 + n, 4:4 + dim]
    result = jitconv.causal_conv1d_mixed(out_spec=views["spec"], out_non_spec=views["non_spec"],
                                         **case)
    assert result.spec is views["spec"] and result.non_spec is views["non_spec"]
    for part, buf in buffers.items():
        rows = token_rows(case, part)
        assert torch.equal(bits(views[part]), bits(full)[rows])
        assert_outputs_close(views[part], ref_out[rows.numpy()], dtype)
        margin = torch.ones(buf.shape, dtype=torch.bool)
        margin[2:2 + len(rows), 4:4 + dim] = False
        assert torch.isnan(buf.cpu()[margin].float()).all(), "a split output wrote outside its view"
    assert torch.equal(bits(case["conv_state"]), full_state)
    assert_state_exact(case["conv_state"], ref_state)
    for _ in range(2):
        case["conv_state"].copy_(state0)
        new = jitconv.causal_conv1d_mixed(split=True, **case)
        for part, t in zip(("spec", "non_spec"), new):
            n = part_tokens(case, part)
            assert (t is None) == (n == 0), part
            if n:
                assert torch.equal(bits(t), bits(full)[token_rows(case, part)]), part
        assert torch.equal(bits(case["conv_state"]), full_state)


class TransposedView:
    """A (lines, dim, state_len) view of a DeviceArray stored as (lines, state_len, dim),
    through the same USM interface with swapped shape and strides."""

    def __init__(self, arr):
        iface = dict(arr.__sycl_usm_array_interface__)
        lines, state_len, dim = arr.shape
        iface.update(shape=(lines, dim, state_len), strides=(state_len * dim, 1, dim))
        self.__sycl_usm_array_interface__ = iface
        self.sycl_queue, self.usm_data = arr.sycl_queue, arr.usm_data


# ------------------------------------------------------- other environments (venvs)

# Variables that point a child Python at this environment's runtime or kernels.
RUNTIME_VARS = ("LD_LIBRARY_PATH", "OCL_ICD_FILENAMES", "PYTHONPATH", "JITCONV_CACHE_DIR",
                "JITCONV_NO_SHIPPED_KERNELS", "JITCONV_NO_BOOTSTRAP", "JITCONV_RUN_REPORT")


def run_checked(cmd, **kwargs):
    """Run a command; its output when it succeeds, else an assertion with its tail."""
    done = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    assert done.returncode == 0, f"{cmd}\n{done.stdout[-6000:]}\n{done.stderr[-6000:]}"
    return done.stdout


def clean_env(**extra):
    """This process's environment without RUNTIME_VARS, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in RUNTIME_VARS}
    env.update(extra)
    return env


def ensure_venv(venv, steps, key="", timeout=1800):
    """A virtual environment at ``venv`` made by ``steps`` (pip argument lists, run in
    order), made again only when the steps or ``key`` (e.g. a requirements file's text)
    change: a stamp file keeps their hash. Returns its python."""
    py = venv / "bin" / "python"
    stamp = venv / ".steps-sha256"
    want = hashlib.sha256((repr(steps) + key).encode()).hexdigest()
    if py.exists() and stamp.exists() and stamp.read_text() == want:
        return py
    run_checked([sys.executable, "-m", "venv", "--clear", str(venv)])
    for step in steps:
        run_checked([str(py), "-m", "pip", "--disable-pip-version-check", "-q", *step],
                    timeout=timeout)
    stamp.write_text(want)
    return py


# ------------------------------------------------- parent maps and intermediate windows

def random_parents(gen, lengths, columns=None):
    """(len(lengths), columns) int32 parent maps: token 0 the root (-1), each other token's
    parent a random token before it; columns past a sequence's length -1 (as engines pad)."""
    columns = max(lengths, default=1) if columns is None else columns
    table = torch.full((len(lengths), max(columns, 1)), -1, dtype=torch.int32)
    for i, n in enumerate(lengths):
        for t in range(1, n):
            table[i, t] = int(torch.randint(0, t, (1,), generator=gen))
    return table


def lengths_of(query_start_loc):
    return torch.diff(query_start_loc.cpu()).tolist()


def with_rules(case, gen, *, trees=True, windows="some", usm=False):
    """``case`` (a mixed step's kwargs) with a parent map for the spec part (``trees``)
    and window rows for some (or "all") sequences of both parts, in a random order of
    rows; returns (case, windows tensor: random values, so untouched entries mean
    something). The windows tensor is None when no sequence has a row."""
    case = dict(case)
    steps, order = 1, []
    for part in ("non_spec", "spec"):
        qsl = case.get(f"{part}_query_start_loc")
        if qsl is None:
            continue
        lengths = lengths_of(qsl)
        if part == "spec" and trees:
            case["spec_parent_token"] = random_parents(gen, lengths)
        if windows:
            take = [True] * len(lengths) if windows == "all" else \
                (torch.rand(len(lengths), generator=gen) < 0.6).tolist()
            rows = torch.full((len(lengths),), -1, dtype=torch.int32)  # -1: no windows
            for i, n in enumerate(lengths):
                if take[i]:
                    order.append((part, i))
                    steps = max(steps, n)
            case[f"{part}_window_rows"] = rows
    perm = torch.randperm(len(order), generator=gen).tolist()
    for (part, i), row in zip(order, perm):
        case[f"{part}_window_rows"][i] = row + 1  # row 0 stays unwritten
    if not order:
        return case, None
    x = case["x"]
    width = case["weight"].shape[-1]
    shape = (len(order) + 1, steps + 1, x.shape[1], width - 1)
    win = randn(gen, shape, x.dtype, usm)
    return case, win


def check_rules_case(case, windows, dtype, out=None):
    """Run ``case`` with its rules into a poisoned output; compare with the reference."""
    before_state, before_win = bits(case["conv_state"]), None
    ref = causal_conv1d_reference(intermediate_windows=windows, **case)
    if windows is not None:
        before_win = bits(windows)
    if out is None:
        out = poisoned(tuple(case["x"].shape), dtype)
    result = jitconv.causal_conv1d_mixed(intermediate_windows=windows, out=out, **case)
    assert result is out
    assert_outputs_close(result, ref[0], dtype)
    assert_state_exact(case["conv_state"], ref[1])
    unused = torch.ones(case["conv_state"].shape[0], dtype=torch.bool)
    unused[used_lines(case)] = False
    assert torch.equal(bits(case["conv_state"])[unused], before_state[unused])
    if windows is not None:
        # bit-exact: copies of inputs; rows and steps nobody writes keep their bits
        expected = bits(torch.from_numpy(ref[2]).to(dtype))
        got = bits(windows)
        assert torch.equal(got, expected), \
            f"windows differ at {(got != expected).nonzero()[:3].tolist()}"
        assert not torch.equal(got, before_win)  # something was written
    return result


def poison_new_outputs(monkeypatch):
    """Every new output a backend allocates for a run (``empty_output``: the GDN stage's
    one buffer, new split outputs) starts as NaN, so a row or gate a kernel does not
    write fails the comparison."""
    for backend in (CudaBackend, SyclBackend):
        def poisoned(self, *args, empty_output=backend.empty_output):
            return empty_output(self, *args).fill_(POISON)
        monkeypatch.setattr(backend, "empty_output", poisoned)


# ------------------------------------------------- vLLM's GDN step metadata (stand-in)
# vLLM's GDNAttentionMetadata as its builder lays it out, written here from its
# conventions (tests/test_vllm.py; tests/test_device_plan.py on a GPU).

DIM = 136
EXTRA_LINES = 3        # cache lines no sequence uses (line 0, the null block, besides)
NULL = jitconv.vllm.NULL_BLOCK_ID
REF_PAD = -1           # the reference's pad_slot_id
NUM_SPEC = 3           # draft tokens per spec sequence (vLLM: num_speculative_tokens)


def ints(values, dtype=torch.int32):
    return torch.tensor(np.asarray(values), dtype=dtype)


def conv_params(gen, width, dtype):
    return randn(gen, (DIM, width), dtype), randn(gen, (DIM,), dtype)


def vllm_state(gen, real_lines, width, dtype, layout="SD", extra_columns=NUM_SPEC):
    """conv_state as vLLM allocates it: line 0 (the null block) + real lines + unused
    ones; state_len = width - 1 + num_spec. "SD" (vLLM's default) stores (lines,
    state_len, dim) and passes the transposed view; "DS" is dim-first storage."""
    return make_state(gen, 1 + real_lines + EXTRA_LINES, DIM, width - 1 + extra_columns,
                      dtype, layout)


def random_lines(rng, n, num_lines):
    """n distinct real cache lines (never 0: that is the null block)."""
    return 1 + rng.permutation(num_lines - 1)[:n]


def reference_lines(lines, qsl):
    """What vLLM skips (null block, zero-length sequences) as the reference's pads."""
    lines, qsl = np.asarray(lines).copy(), np.asarray(qsl)
    lines[(lines == NULL) | (np.diff(qsl)[:len(lines)] == 0)] = REF_PAD
    return lines


def random_accepted(rng, n):
    """num_accepted_tokens in 1..num_spec+1 (the window a-1 stays inside state_len)."""
    return rng.integers(1, NUM_SPEC + 2, size=n)


class Request(types.SimpleNamespace):
    """One request of an engine step: ``length`` tokens, spec or not, its block-table row
    (spec: 1 + num_spec lines, column 0 the conv's), accepted tokens of the previous
    step, and whether it has computed tokens before (has_initial_state)."""


STALE = 2  # stale entries after the batch in build_gdn_metadata's persistent buffers


def build_gdn_metadata(requests, *, full_graph_pad=0, meta_dtype=torch.int32):
    """GDNAttentionMetadata as vLLM 0.33's builder lays it out (our own code, from its
    conventions), for requests in vLLM's order. Returns (metadata, rows of x, per-part
    reference arguments). full_graph_pad: padded requests a FULL graph adds to a
    spec-only or decode-only step (null block lines, zero tokens, accepted 1)."""
    spec_mask = np.array([r.spec for r in requests])
    lengths = np.array([r.length for r in requests])
    num_tokens = int(lengths.sum())
    spec = [r for r in requests if r.spec]
    non_spec = [r for r in requests if not r.spec]
    ns_lengths = [r.length for r in non_spec]
    num_decodes = sum(1 for n in ns_lengths if n == 1) if not spec else 0
    num_prefills = len([n for n in ns_lengths if n > 0]) - num_decodes
    if spec and non_spec:  # vLLM counts non-spec decodes as prefills beside spec ones
        num_prefills = len([n for n in ns_lengths if n > 0])
    m = types.SimpleNamespace(
        num_prefills=num_prefills, num_decodes=num_decodes, num_spec_decodes=len(spec),
        num_actual_tokens=num_tokens, has_initial_state=None,
        spec_query_start_loc=None, non_spec_query_start_loc=None,
        spec_state_indices_tensor=None, non_spec_state_indices_tensor=None,
        spec_sequence_masks=None, spec_token_indx=None, non_spec_token_indx=None,
        num_accepted_tokens=None)
    ref = {}
    spec_rows = np.nonzero(np.repeat(spec_mask, lengths))[0]
    ns_rows = np.nonzero(~np.repeat(spec_mask, lengths))[0]
    if spec:
        m.spec_sequence_masks = torch.tensor(spec_mask)
        table = np.array([r.lines for r in spec])
        accepted = np.array([r.accepted for r in spec])
        qsl = cumulative([r.length for r in spec]).numpy()
        ref.update(spec_query_start_loc=qsl, spec_token_indx=spec_rows,
                   spec_state_indices=reference_lines(table[:, 0], qsl),
                   num_accepted_tokens=accepted)
        if not non_spec:  # spec-only: aranges, and FULL-graph padding of the tail
            pad = full_graph_pad
            table = np.concatenate([table, np.full((pad, table.shape[1]), NULL)])
            qsl = np.concatenate([qsl, np.repeat(qsl[-1:], pad)])
            accepted = np.concatenate([accepted, np.ones(pad, np.int64)])
            m.spec_token_indx = torch.arange(len(spec) * (1 + NUM_SPEC),
                                             dtype=torch.int32)[:num_tokens]
            m.non_spec_token_indx = torch.empty(0, dtype=torch.int32)
            m.num_actual_tokens = num_tokens + pad * (1 + NUM_SPEC)
        else:  # mixed: token maps from a stable argsort of the spec mask (int64)
            order = torch.argsort(torch.tensor(np.repeat(spec_mask, lengths)), stable=True)
            m.non_spec_token_indx = order[:len(ns_rows)].to(meta_dtype)
            m.spec_token_indx = order[len(ns_rows):].to(meta_dtype)
        # Persistent buffers are longer than the batch: stale rows (real lines) after
        # num_spec_decodes must be cut, never run.
        table = np.concatenate([table, table[:1].repeat(STALE, 0)])
        qsl = np.concatenate([qsl, qsl[-1] + np.arange(1, STALE + 1)])
        accepted = np.concatenate([accepted, np.ones(STALE, np.int64)])
        m.spec_state_indices_tensor = ints(table, meta_dtype)
        m.spec_query_start_loc = ints(qsl, meta_dtype)
        m.num_accepted_tokens = ints(accepted, meta_dtype)
    if non_spec:
        lines = np.array([r.lines[0] for r in non_spec])
        qsl = cumulative(ns_lengths).numpy()
        initial = np.array([r.initial for r in non_spec])
        ref.update(non_spec_query_start_loc=qsl, non_spec_token_indx=ns_rows,
                   non_spec_state_indices=reference_lines(lines, qsl),
                   has_initial_state=initial if num_prefills else None)
        if num_prefills:
            m.has_initial_state = torch.tensor(initial)
        elif full_graph_pad:  # decode-only FULL graph: null lines, qsl tail repeated
            lines = np.concatenate([lines, np.full(full_graph_pad, NULL)])
            qsl = np.concatenate([qsl, np.repeat(qsl[-1:], full_graph_pad)])
            m.num_actual_tokens = num_tokens + full_graph_pad
        if not num_prefills:  # stale lines past num_actual_tokens: cut, never run
            lines = np.concatenate([lines, lines[:STALE]])
        m.non_spec_state_indices_tensor = ints(lines, meta_dtype)
        m.non_spec_query_start_loc = ints(qsl, meta_dtype)
    return m, ref


def requests_for(rng, num_lines, *, prefill=(), decodes=0, spec=(), null_ns=0,
                 null_spec=0, zero_length=0):
    """Requests in vLLM's order (decodes first, then prefills, then spec); ``spec`` lists
    verify lengths (1 + drafted tokens, ragged allowed). null_ns / null_spec requests get
    the null block; zero_length non-spec requests (trailing padding) have real lines."""
    n_ns = decodes + len(prefill) + zero_length
    lines = random_lines(rng, n_ns + len(spec) * (1 + NUM_SPEC), num_lines)
    ns_lines, sp_lines = lines[:n_ns], lines[n_ns:].reshape(len(spec), 1 + NUM_SPEC)
    ns_lines[rng.choice(decodes + len(prefill), null_ns, replace=False)] = NULL
    sp_lines[rng.choice(len(spec), null_spec, replace=False)] = NULL
    ns = [Request(length=1, spec=False, initial=True) for _ in range(decodes)]
    ns += [Request(length=n, spec=False, initial=i % 2 == 1) for i, n in enumerate(prefill)]
    ns += [Request(length=0, spec=False, initial=False) for _ in range(zero_length)]
    for r, line in zip(ns, ns_lines):
        r.lines = [int(line)]
    sp = [Request(length=n, spec=True, lines=[int(v) for v in row], accepted=int(a))
          for n, row, a in zip(spec, sp_lines, random_accepted(rng, len(spec)))]
    # vLLM's reorder puts decodes (and spec decodes) before prefills; spec rows are
    # interleaved here on purpose so that both maps are non-trivial.
    if ns and sp:
        merged = []
        for i in range(max(len(ns), len(sp))):
            merged += sp[i:i + 1] + ns[i:i + 1]
        return merged
    return ns + sp


def gdn_case(gen, rng, *, dtype=torch.float32, state_dtype=None, width=4, layout="SD",
             full_graph_pad=0, meta_dtype=torch.int32, **sizes):
    state_dtype = state_dtype or dtype
    real = 40
    state = vllm_state(gen, real, width, state_dtype, layout)
    requests = requests_for(rng, state.shape[0], **sizes)
    meta, ref = build_gdn_metadata(requests, full_graph_pad=full_graph_pad,
                                   meta_dtype=meta_dtype)
    weight, bias = conv_params(gen, width, state_dtype)
    extra_rows = 3  # mixed_qkv is often longer than num_actual_tokens
    x = strided_rows(gen, meta.num_actual_tokens + extra_rows, DIM, dtype)
    return types.SimpleNamespace(x=x, weight=weight, bias=bias, state=state, meta=meta,
                                 ref=ref)




GDN_STEPS = {  # gdn_case's steps of each kind (tests/test_vllm.py's gdn_conv_step tests)
    "mixed": dict(prefill=[37, 2, 9], decodes=3, spec=[4, 2, 4, 3], null_ns=2, null_spec=1,
                  zero_length=1, meta_dtype=torch.int64),
    "spec": dict(full_graph_pad=3, spec=[4, 4, 2, 4], null_spec=1),
    "decode": dict(full_graph_pad=4, decodes=6, null_ns=2),
    "prefill": dict(prefill=[5, 20, 1], decodes=2, null_ns=1, zero_length=2)}
