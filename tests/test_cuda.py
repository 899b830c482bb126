"""The CUDA backend (numba-cuda, torch CUDA tensors): the same contract checks as the
SYCL kernel tests, through the public ops.

Where it runs:
- on an NVIDIA GPU (`pytest tests/test_cuda.py` with numba-cuda installed): the whole
  grid of test_mixed.py at dim 136 and the other cases below (the H200 run is recorded in
  benchmarks/h200/);
- in CI, under numba's CUDA simulator (tests/test_cuda_simulator.py starts this file in
  a subprocess with NUMBA_ENABLE_CUDASIM=1 and dpctl / numba-dpex hidden): a subset at a
  small dim, since the simulator runs every thread as Python. The simulator checks the
  kernel's logic (indexing, the bounds guard of the rounded-up grid: its arrays are
  exactly as long as the data, so a stray index raises; tables; state updates;
  channels per thread). It does not check code generation, the pointer arguments of the
  GPU kernels (it passes numpy arrays), the LLVM bit-conversion intrinsics (it runs
  their Python twins: tests/test_bit_conversions.py compares those with torch),
  fastmath, streams or speed.
"""

import os
import sys

import pytest
import torch

import jitconv
from jitconv.backends.cuda import devices as cuda_devices
from jitconv.backends.cuda import launching as cuda_backend
from jitconv.kernels import tuning
from jitconv.reference import causal_conv1d_reference
from jitconv.testing.steps import mixed_step
from jitconv.backends.cuda.state import STATE as CUDA_STATE

from helpers import (DTYPES, GRID, POISON, assert_outputs_close, assert_state_exact, bits,
                     build_mixed, check_grid_case, check_mixed_equals_split, cumulative,
                     check_split_outputs, grid_ids, poisoned, randn, run_and_check, tune)

SIM = cuda_devices.simulating()
pytestmark = pytest.mark.skipif(not cuda_devices.devices(),
                                reason=f"no CUDA device: {cuda_devices.why_unavailable()}")
DIM = 12 if SIM else 136  # 12: divisible by 4, not a multiple of 32 (grid rounding)
# The simulator takes every 8th case of the grid (all dtypes, widths, layouts appear).
CASES = GRID[::8] if SIM else GRID


@pytest.fixture(scope="module")
def cuda_device():
    device = jitconv.set_device(cuda_devices.devices()[0])
    yield device


def test_runs_without_the_sycl_stack_when_hidden(cuda_device):
    """In the simulator run dpctl, dpnp and numba-dpex are hidden (conftest): jitconv's
    import and a whole step on the CUDA device must not need them (the H200 image has
    none of them). Fails if any of the CUDA path reaches for dpctl or USM memory."""
    if os.environ.get("JITCONV_TEST_HIDE_SYCL") != "1":
        pytest.skip("SYCL stack not hidden in this run")
    from jitconv.backends.sycl import devices as sycl_devices
    from jitconv.backends.sycl import usm
    assert sycl_devices.dpctl is None and usm.dpm is None  # jitconv saw no SYCL runtime
    assert jitconv.devices() == [cuda_device]
    case = build_mixed(1, dtype=torch.float32, width=4, dim=DIM, usm=True)
    run_and_check(case, dtype=torch.float32)
    assert "numba_dpex" not in sys.modules or sys.modules["numba_dpex"] is None


@pytest.mark.parametrize("params", CASES, ids=grid_ids(CASES))
def test_mixed_grid(cuda_device, params):
    def on_cuda(case):
        assert case["x"].device == cuda_devices.torch_device(cuda_device)
    check_grid_case(params, dim=DIM, usm=True, on_device=on_cuda)


@pytest.mark.parametrize("channels,dim", [(1, 12), (2, 12), (4, 12), (4, 10), (4, 9),
                                          (8, 24)])
@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_channels_per_thread(cuda_device, monkeypatch, channels, dim, dtype_name):
    """C contiguous channels per thread (halved until it divides dim)."""
    tune(monkeypatch, channels=channels)
    used = cuda_backend.channels_for(dim, channels)
    assert dim % used == 0 and used <= channels
    dtype = DTYPES[dtype_name]
    case = build_mixed(channels * 100 + dim, dtype=dtype, width=4, dim=dim, usm=True,
                       strided=True)
    run_and_check(case, dtype=dtype, out=poisoned(tuple(case["x"].shape), dtype, usm=True))


@pytest.mark.parametrize("lookahead", [1, 2, 16])
def test_lookahead(cuda_device, monkeypatch, lookahead):
    """L tokens loaded before their stores: groups of L, then single tokens (prefill
    blocks of 16 and shorter sequences exercise both)."""
    tune(monkeypatch, lookahead=lookahead)
    for seed, dtype in ((lookahead, torch.float32), (lookahead + 50, torch.bfloat16)):
        case = build_mixed(seed, dtype=dtype, width=4, dim=12, usm=True, strided=True)
        run_and_check(case, dtype=dtype, out=poisoned(tuple(case["x"].shape), dtype, usm=True))


@pytest.mark.parametrize("dim", [DIM, 64])
@pytest.mark.parametrize("threads", [32, 128])
@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_thread_block_shapes(cuda_device, monkeypatch, threads, dim, dtype_name):
    """A kernel with a compiled-in layout takes the per-call arguments only and its
    thread block's shape as constants: grids rounded up in x (channel groups short of a
    block row) and in y (4 rows of token blocks per thread block at 128 threads), or
    exact (dim 64 at 32 threads: 32 groups of 2 channels, one row; no bounds guard then).
    Results equal the reference's and, bit for bit, those of the kernel that takes every
    argument, reads blockDim and keeps the guard (tuning: compact_args, fixed_block and
    exact_grid False), on a general and a short (decode) launch."""
    tune(monkeypatch, threads=threads, channels=2)
    monkeypatch.setattr(CUDA_STATE, "layouts", set())
    calls = _spy_get_kernel(monkeypatch)
    dtype = DTYPES[dtype_name]
    for seed, (ns, sp) in enumerate((([3, 17, 1, 0], [2, 4]), ([1, 1, 1, 1, 1], []))):
        case = mixed_step(torch.Generator().manual_seed(seed + 90), dim=dim, width=4,
                          dtype=dtype, ns_lengths=ns, sp_lengths=sp, rows="vllm",
                          initial="alternate", usm=True)
        results = []
        for on in (True, False):
            tune(monkeypatch, compact_args=on, fixed_block=on, exact_grid=on)
            state = case["conv_state"].clone()
            out = run_and_check(dict(case, conv_state=state), dtype=dtype,
                                out=poisoned(tuple(case["x"].shape), dtype, usm=True))
            results.append((bits(out), bits(state)))
        assert all(torch.equal(a, b) for a, b in zip(*results)), (ns, sp)
        fixed, read = calls[-2], calls[-1]
        _, expected = cuda_backend.launch_shape(dim // 2, 1, threads)
        assert fixed["layout"] is not None and fixed["compact_args"] and fixed["exact_grid"]
        assert fixed["block"] == expected
        assert expected == ((32, 1) if threads == 32 else (32, 4) if dim < 128 else (96, 1))
        assert read["block"] is None and not read["compact_args"]  # the guard then stays


@pytest.mark.parametrize("lookahead", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("rows", ["vllm", "shuffled"])
def test_group_edges(cuda_device, monkeypatch, lookahead, rows):
    """Around the edges of the token loops (groups of L tokens loaded before their
    stores, then single tokens; blocks of 16): sequences of 0 tokens (the state rule
    only), 1, L - 1, L, L + 1, 16, 17 and longer; spec sequences of up to 9 tokens (more
    than one round of new-state reads from x)."""
    tune(monkeypatch, lookahead=lookahead)
    L = lookahead
    ns = [0, 1, max(L - 1, 1), L, L + 1, 0, 16, 17, 2 * L + 3, 35]
    for seed, dtype in ((L, torch.float32), (L + 50, torch.bfloat16)):
        gen = torch.Generator().manual_seed(seed)
        case = mixed_step(gen, dim=DIM, width=4, dtype=dtype, ns_lengths=ns,
                          sp_lengths=[1, 2, 4, 7, 9], rows=rows,
                          initial=[True, True, False, True, False, False, True, True,
                                   False, True], extra_lines=2, usm=True, strided=True)
        run_and_check(case, dtype=dtype, out=poisoned(tuple(case["x"].shape), dtype, usm=True))


def _spy_get_kernel(monkeypatch):
    """The KernelSpec of every cuda_backend.get_kernel call, in order, as dicts by field
    name: which kernel each launch chose."""
    import dataclasses
    calls = []
    real = cuda_backend.get_kernel
    cuda_backend.STATE.forget_runs()  # a remembered run chooses no kernel

    def spy(spec):
        calls.append(dataclasses.asdict(spec))
        return real(spec)

    monkeypatch.setattr(cuda_backend, "get_kernel", spy)
    return calls


def test_automatic_lookahead(cuda_device, monkeypatch):
    """With the automatic lookahead (the table's) a launch whose blocks hold at most
    short_lookahead tokens (decode and short spec steps) gets that lookahead, any other
    long_lookahead; both give the reference's result."""
    calls = _spy_get_kernel(monkeypatch)
    table = tuning.CudaTuning()
    short = table.short_lookahead
    assert table.lookahead == 0  # automatic
    for ns, sp, expected in (([1, 1, 1], [short, 2, 1], short),
                             ([1, short + 1], [1], table.long_lookahead)):
        for dtype in (torch.float32, torch.bfloat16):
            calls.clear()
            case = mixed_step(torch.Generator().manual_seed(len(ns)), dim=DIM, width=4,
                              dtype=dtype, ns_lengths=ns, sp_lengths=sp, usm=True)
            run_and_check(case, dtype=dtype,
                          out=poisoned(tuple(case["x"].shape), dtype, usm=True))
            assert [c["lookahead"] for c in calls] == [expected]


def _runs_with(monkeypatch, calls, case, dtype, setting, values):
    """``case`` run once per value of the setting, each run checked against the
    reference: per value, ((out bits, conv_state bits), the get_kernel calls it made)."""
    runs = []
    for value in values:
        tune(monkeypatch, **{setting: value})
        calls.clear()
        state = case["conv_state"].clone()
        out = run_and_check(dict(case, conv_state=state), dtype=dtype,
                            out=poisoned(tuple(case["x"].shape), dtype, usm=True))
        runs.append(((bits(out), bits(state)), list(calls)))
    return runs


@pytest.mark.parametrize("rows", ["vllm", "shuffled", "plain"])
@pytest.mark.parametrize("width", [2, 3, 4, 5])
@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_short_kernels(cuda_device, monkeypatch, dtype_name, width, rows):
    """Launches of short sequences only run a short kernel: T = 1 for decode steps, T =
    the state update's one round when non-spec sequences hold 0..width-1 tokens and spec
    ones up to that round (pads of any length: sequence 5 is a pad of 9 tokens, and the
    first spec sequence a pad). Results equal the reference's and, bit for bit, the
    general kernel's (tuning short_kernel False). One more token in one sequence, and
    the general kernel runs."""
    from jitconv.backends.cuda.source import STATE_CHUNK_EXTRA
    calls = _spy_get_kernel(monkeypatch)
    dtype, S = DTYPES[dtype_name], width - 1
    K = S + STATE_CHUNK_EXTRA
    seed = 10 * width + len(rows) + list(DTYPES).index(dtype_name)
    cases = (([S, 1, 0, 1, S, 9, 1], [1, K, 2, K], K),
             ([S + 1, 1, 0, 1, S, 9, 1], [1, K, 2, K], 0),
             ([S, 1, 0, 1, S, 9, 1], [1, K + 1, 2, K], 0),
             ([1, 1, 0, 1, 1, 9, 1], [3, 1, 1, 1], 1),
             ([1, 1, 0, 1, 1, 9, 1], [], 1),
             ([], [5, 1, 1, 1], 1),
             ([1, 1, 0, 1, 1, 9, 2], [3, 1, 1, 1], K if S >= 2 else 0))
    for ns, sp, expected in cases:
        gen = torch.Generator().manual_seed(seed)
        case = mixed_step(gen, dim=DIM, width=width, dtype=dtype, ns_lengths=ns,
                          sp_lengths=sp, rows=rows, initial="alternate",
                          spec_columns=1 + seed % 2, extra_lines=2,
                          layout="SD" if seed % 2 else "DS", usm=True,
                          strided=seed % 3 == 0, non_spec_accepted=rows != "plain" and bool(ns))
        if ns:
            case["non_spec_state_indices"][5] = -1  # a pad of 9 tokens (one block)
        if sp:
            case["spec_state_indices"][0] = -1  # a spec pad (its whole block-table row)
        runs = _runs_with(monkeypatch, calls, case, dtype, "short_kernel", (True, False))
        for short, (_, used) in zip((True, False), runs):
            chosen = [c["short_tokens"] for c in used]
            assert chosen == [expected if short else 0], (ns, sp, short)
            assert [c["channels"] for c in used] == [tuning.CudaTuning().channels]
        (first, _), (second, _) = runs
        assert all(torch.equal(a, b) for a, b in zip(first, second)), (ns, sp)


@pytest.mark.parametrize("width", [2, 4])
@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_uniform_decode(cuda_device, monkeypatch, dtype_name, width):
    """Decode launches whose every sequence with a cache line holds one token and has its
    window at column 0 run the uniform decode kernel (pads of any length allowed:
    sequence 4 is a pad of 9 tokens); a sequence of 0 tokens with a cache line, or a
    window offset (non_spec_num_accepted_tokens or num_accepted_tokens > 1), gives the
    decode kernel that reads them. Results equal the reference's and, bit for bit, those
    of the decode kernel without it (tuning uniform_decode False)."""
    calls = _spy_get_kernel(monkeypatch)
    dtype = DTYPES[dtype_name]
    # (non-spec lengths, spec lengths, extra state columns, accepted counts to set, uniform)
    cases = (([1, 1, 1, 1, 9, 1], [1, 1], 0, {}, True),
             ([1, 1], [], 1, {"non_spec_num_accepted_tokens": [1, 1]}, True),
             ([1, 1, 0, 1], [1], 0, {}, False),
             ([1, 1, 1], [], 1, {"non_spec_num_accepted_tokens": [1, 2, 1]}, False),
             ([], [1, 1, 1], 2, {"num_accepted_tokens": [1, 3, 1]}, False))
    for i, (ns, sp, extra, accepted, expected) in enumerate(cases):
        gen = torch.Generator().manual_seed(100 * width + 10 * i + len(dtype_name))
        case = mixed_step(gen, dim=DIM, width=width, dtype=dtype, ns_lengths=ns,
                          sp_lengths=sp, initial="alternate", extra_state_columns=extra,
                          extra_lines=2, usm=True, non_spec_accepted=bool(accepted) and bool(ns))
        if len(ns) > 4:
            case["non_spec_state_indices"][4] = -1  # a pad of 9 tokens
        for key, values in accepted.items():
            case[key] = torch.tensor(values, dtype=torch.int32)
        runs = _runs_with(monkeypatch, calls, case, dtype, "uniform_decode", (True, False))
        for uniform, (_, used) in zip((True, False), runs):
            assert [(c["short_tokens"], c["uniform_decode"]) for c in used] == \
                [(1, expected and uniform)], (ns, sp, accepted, uniform)
        (first, _), (second, _) = runs
        assert all(torch.equal(a, b) for a, b in zip(first, second)), (ns, sp, accepted)
    from jitconv.kernels.template import kernel_source
    from jitconv.backends.cuda.source import CUDA
    for T in (0, width):  # only the decode kernel has one token per sequence
        with pytest.raises(ValueError, match="uniform_decode needs short_tokens 1"):
            kernel_source(width, "k", CUDA, 2, 4, state_chunk=width, short_tokens=T,
                          uniform_decode=True)


def _rows_view(rows, dim, dtype, skip, row_stride):
    """A (rows, dim) view of a poisoned buffer on the device: it starts ``skip`` elements
    in and its rows are ``row_stride`` apart (channels contiguous)."""
    buffer = poisoned((skip + rows * row_stride,), dtype, usm=True)
    return buffer[skip:].as_strided((rows, dim), (row_stride, 1)), buffer


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_layout_compiled_in(cuda_device, monkeypatch, dtype_name):
    """A layer's offsets, strides, dim, has_bias and silu compiled into its kernel
    (LAYOUT_ARGS of backends/cuda/source.py, by default): each launch's kernel holds
    exactly that launch's values, on general and short (decode) kernels, strided and
    contiguous layouts, with and without bias, either state layout. Results equal the reference's
    and, bit for bit, those of tuning constant_layout False (the values read as
    arguments). Past MAX_LAYOUTS layouts a process runs the argument-reading kernel."""
    from jitconv.backends.cuda.source import LAYOUT_ARGS
    monkeypatch.setattr(CUDA_STATE, "layouts", set())  # earlier tests' layouts count
    calls = _spy_get_kernel(monkeypatch)
    dtype = DTYPES[dtype_name]
    seen = set()
    for seed, (ns, sp, strided, bias, layout, width, activation) in enumerate((
            ([3, 17, 1], [2, 4], False, True, "SD", 4, "silu"),
            ([3, 17, 1], [2, 4], True, True, "DS", 4, None),
            ([1, 1, 1], [], True, False, "SD", 4, "silu"),
            ([5, 0, 20], [1], False, False, "DS", 2, "silu"))):
        case = mixed_step(torch.Generator().manual_seed(seed + 40), dim=DIM, width=width,
                          dtype=dtype, ns_lengths=ns, sp_lengths=sp, rows="vllm",
                          initial="alternate", strided=strided, bias=bias, layout=layout,
                          usm=True)
        results = []
        for on in (True, False):
            tune(monkeypatch, constant_layout=on)
            state = case["conv_state"].clone()
            out = run_and_check(dict(case, conv_state=state), dtype=dtype,
                                activation=activation)
            results.append((bits(out), bits(state)))
        assert all(torch.equal(a, b) for a, b in zip(*results)), (ns, sp, strided, layout)
        constant, read = calls[-2]["layout"], calls[-1]["layout"]
        assert read is None
        values = dict(zip(LAYOUT_ARGS, constant))
        x, st = case["x"], case["conv_state"]
        assert values["x_row_stride"] == x.stride(0) and values["dim"] == DIM
        assert (values["state_stride_line"], values["state_stride_c"],
                values["state_stride_col"]) == st.stride()
        assert values["has_bias"] == int(bias) and values["silu"] == int(bool(activation))
        seen.add(constant)
    assert len(seen) == 4
    # Past MAX_LAYOUTS, new layouts read their values as arguments; known ones keep theirs.
    monkeypatch.setattr(cuda_backend, "MAX_LAYOUTS", len(CUDA_STATE.layouts))
    tune(monkeypatch, constant_layout=None)
    case = build_mixed(71, dtype=dtype, width=4, dim=DIM + 4, usm=True)
    run_and_check(case, dtype=dtype)
    assert calls[-1]["layout"] is None
    case = mixed_step(torch.Generator().manual_seed(40), dim=DIM, width=4, dtype=dtype,
                      ns_lengths=[3, 17, 1], sp_lengths=[2, 4], rows="vllm",
                      initial="alternate", usm=True)
    run_and_check(case, dtype=dtype)
    assert calls[-1]["layout"] in seen


def test_layout_binds_every_parameter_once():
    """A compiled-in layout binds each of LAYOUT_ARGS at the body's top and drops it from
    the kernel's parameter list (compact: the kernel takes the per-call arguments only),
    or keeps it renamed and unused; a constant for a parameter the kernel lacks is
    refused, not half bound."""
    from jitconv.backends.cuda.source import CALL_ARGS, CUDA, LAYOUT_ARGS
    from jitconv.kernels.template import kernel_source
    values = range(1, len(LAYOUT_ARGS) + 1)
    bound = kernel_source(4, "k", CUDA, constants=tuple(
        (p, v, False) for p, v in zip(LAYOUT_ARGS, values)))
    assert bound.startswith(f"\ndef k({', '.join(CALL_ARGS)}):\n")
    assert f"    dim = {LAYOUT_ARGS.index('dim') + 1}\n" in bound
    kept = kernel_source(4, "k", CUDA, constants=tuple(
        (p, v, True) for p, v in zip(LAYOUT_ARGS, values)))
    assert "def k(x, _x_offset, _x_row_stride, out, " in kept
    assert f"    dim = {LAYOUT_ARGS.index('dim') + 1}\n" in kept
    with pytest.raises(ValueError, match="parameter 'no_such' found 0 times"):
        kernel_source(4, "k", CUDA, constants=(("no_such", 1, False),))


# Layouts of test_row_groups: (x: skip, row stride; out: skip, row stride; tuning
# channels, tuning row_group (None: the table's), the largest group the layout allows),
# in units of the test's DIM. One test per layout: pytest-xdist then spreads their compiles.
ROW_GROUP_LAYOUTS = (((0, 0), (0, 0), None, None, 2), ((1, 0), (0, 0), None, None, 1),
                     ((0, 0), (1, 0), None, None, 1), ((0, 2), (0, 1), None, None, 1),
                     ((0, 2), (2, 4), None, None, 2), ((0, 0), (0, 0), 1, None, 1),
                     ((0, 0), (0, 0), 4, 4, 4), ((2, 2), (0, 0), 4, 4, 2),
                     ((0, 0), (4, 4), 4, 4, 4), ((0, 0), (0, 0), 2, 4, 2),
                     ((0, 0), (0, 0), 4, 1, 4))


@pytest.mark.parametrize("layout", ROW_GROUP_LAYOUTS,
                         ids=[f"layout{i}" for i in range(len(ROW_GROUP_LAYOUTS))])
@pytest.mark.parametrize("width", [2, 4])
@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_row_groups(cuda_device, monkeypatch, dtype_name, width, layout):
    """x and out rows accessed G channels at a time (the tuning's row_group: 2 in
    launches of the general kernel, in short kernels 2 for decode, for spec 2 in float32
    and 1 in 16 bits; an override applies to every kind), halved until G divides the
    channels per thread and every group is aligned (the first element and the row
    stride): not for an x or out that starts one element in, an out with an odd row
    stride, or one channel per thread. Results equal the reference's and, bit for bit,
    those of row_group 1; memory of out's buffer outside its rows stays untouched."""
    calls = _spy_get_kernel(monkeypatch)
    dtype = DTYPES[dtype_name]
    (x_skip, x_extra), (out_skip, out_extra), channels, setting, allowed = layout
    x_at, out_at = (x_skip, DIM + x_extra), (out_skip, DIM + out_extra)
    # (non-spec lengths, spec lengths, tuning short_kernel, general kernel)
    steps = (([1, 17, 3, 35], [1, 4, 2], True, True), ([1, 1, 1], [], True, False),
             ([1, 1, 1], [], False, True), ([], [2, 1, 2], True, False),
             ([], [2, 1, 2], False, True))
    short_group = {1: 2, width: 2 if dtype_name == "float32" else 1}  # by T
    for ns, sp, short, general in steps:
        tune(monkeypatch, channels=channels, short_kernel=short)
        seed = len(calls) + 7 * width + 13 * ROW_GROUP_LAYOUTS.index(layout)
        case = mixed_step(torch.Generator().manual_seed(seed), dim=DIM, width=width,
                          dtype=dtype, ns_lengths=ns, sp_lengths=sp, rows="vllm",
                          initial="alternate", usm=True)
        tokens = case["x"].shape[0]
        x, _ = _rows_view(tokens, DIM, dtype, *x_at)
        x.copy_(case["x"])
        results = []
        for value in (setting, 1):
            tune(monkeypatch, row_group=value)
            state = case["conv_state"].clone()
            out, buffer = _rows_view(tokens, DIM, dtype, *out_at)
            outside = torch.ones(buffer.numel(), dtype=torch.bool)
            outside[(out.storage_offset() + torch.arange(tokens)[:, None] * out.stride(0)
                     + torch.arange(DIM)).flatten()] = False
            run_and_check(dict(case, x=x, conv_state=state), dtype=dtype, out=out)
            assert (bits(buffer)[outside] == bits(poisoned((1,), dtype))).all()
            results.append((bits(out), bits(state)))
        used = [c["row_group"] for c in calls[-2:]]
        T = calls[-1]["short_tokens"]
        assert (T == 0) == general, (ns, sp, short)
        group = min(setting or (tuning.CudaTuning().row_group if general else short_group[T]),
                    allowed)
        assert used == [group, 1], (x_at, out_at, channels, setting, ns, sp)
        assert all(torch.equal(a, b) for a, b in zip(*results)), (x_at, out_at, ns, sp)
        tune(monkeypatch, channels=None)
    # A grouped layout ran grouped general kernels on every step of the general kernel
    # (the calls with ROW_GROUP 1 never are).
    assert sum(c["row_group"] > 1 for c in calls if not c["short_tokens"]) == \
        (min(setting or 2, allowed) > 1) * sum(step[3] for step in steps)
    from jitconv.kernels.template import kernel_source
    from jitconv.backends.cuda.source import CUDA
    for C, G in ((1, 2), (2, 4), (4, 3)):
        with pytest.raises(ValueError, match="row_group must be 1, 2 or 4 and divide"):
            kernel_source(width, "k", CUDA, C, 4, state_chunk=width, row_group=G)


def _in_buffer(buffer, shape, strides, skip, values):
    """A view of ``buffer`` with ``shape`` and element ``strides`` starting ``skip``
    elements in, holding ``values``; and the mask of the buffer's elements outside it."""
    view = buffer.as_strided(shape, strides, skip)
    view.copy_(values)
    outside = torch.ones(buffer.numel(), dtype=torch.bool)
    outside[torch.arange(buffer.numel()).as_strided(shape, strides, skip).flatten()] = False
    return view, outside


_STATE_STEPS = (([1] * 5, [], 1), ([], [4, 2, 4], 4), ([1, 17, 3], [4, 2], 0))  # T expected
# (state: storage, skip, grouped if G > 1; weight: storage transposed, skip, vector)
_STATE_LAYOUTS = ((("SD", 0, True), (False, 0, True)), (("DS", 0, False), (False, 0, True)),
                  (("SD", 1, False), (False, 0, True)), (("SD odd", 0, False), (False, 0, True)),
                  (("SD", 0, True), (True, 0, False)), (("SD", 0, True), (False, 1, False)))
# (width, step, layout): every step and layout at width 4, the first of each at width 3.
# One test each: pytest-xdist then spreads their compiles.
STATE_CASES = [(4, step, layout) for step in _STATE_STEPS for layout in _STATE_LAYOUTS] + \
    [(3, _STATE_STEPS[0], _STATE_LAYOUTS[0])]


@pytest.mark.parametrize("width,step,layout", STATE_CASES,
                         ids=[f"case{i}" for i in range(len(STATE_CASES))])
@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_grouped_state_and_vector_taps(cuda_device, monkeypatch, dtype_name, width, step,
                                       layout):
    """Short kernels access the conv state G channels at a time too (their G: 2 for
    decode, for spec 2 in float32 and 1 in 16 bits) where its channels are contiguous and
    aligned to G, and load the weights before the state update; every kernel reads a
    channel's 4 taps as one vector where the weight is (dim, 4), contiguous and aligned.
    Not for a state stored (lines, dim, state_len) (channel stride state_len), one
    starting one element in, or one with an odd column stride; nor taps of a transposed
    weight, one starting one element in, or width 3. Results equal the reference's and,
    bit for bit, those with all three off (and single-channel accesses in short
    kernels); the memory around the state's and the weight's views stays untouched."""
    calls = _spy_get_kernel(monkeypatch)
    dtype = DTYPES[dtype_name]
    ns, sp, T = step
    (storage, s_skip, grouped), (transposed, w_skip, vector) = layout
    case = mixed_step(torch.Generator().manual_seed(width + len(ns) + 3 * len(sp)),
                      dim=DIM, width=width, dtype=dtype, ns_lengths=ns, sp_lengths=sp,
                      rows="vllm", initial="alternate", usm=True)
    values = case["conv_state"]  # (lines, dim, state_len), channels contiguous
    lines, _, state_len = values.shape
    col = DIM + 1 if storage == "SD odd" else DIM
    shape_strides = ((lines, DIM, state_len), (state_len * col, 1, col)) \
        if storage.startswith("SD") else ((lines, DIM, state_len), (DIM * state_len, state_len, 1))
    state_buffer = poisoned((s_skip + lines * state_len * col,), dtype, usm=True)
    w_buffer = poisoned((w_skip + DIM * width,), dtype, usm=True)
    w_strides = (1, DIM) if transposed else (width, 1)
    weight, w_outside = _in_buffer(w_buffer, (DIM, width), w_strides, w_skip, case["weight"])
    G = 1 if T > 1 and dtype_name != "float32" else 2  # 16-bit spec kernels: 1
    results = []
    for on in (True, False):
        off = None if on else False  # None: the table's value
        tune(monkeypatch, group_state=off, vector_taps=off, early_weights=off,
             row_group=None if on or not T else 1)
        state_buffer.fill_(POISON)
        state, s_outside = _in_buffer(state_buffer, *shape_strides, s_skip, values)
        calls.clear()
        out = run_and_check(dict(case, conv_state=state, weight=weight), dtype=dtype)
        chosen = calls[-1]
        where = (width, ns, sp, storage, s_skip, transposed, w_skip, on)
        assert chosen["short_tokens"] == T, where
        assert chosen["row_group"] == (G if on or not T else 1), where
        assert chosen["group_state"] == (on and bool(T) and G > 1 and grouped), where
        assert chosen["vector_taps"] == (on and width == 4 and vector), where
        assert chosen["early_weights"] == (on and bool(T)), where
        assert (bits(state_buffer)[s_outside] == bits(poisoned((1,), dtype))).all(), where
        assert (bits(w_buffer)[w_outside] == bits(poisoned((1,), dtype))).all(), where
        results.append((bits(out), bits(state)))
    assert all(torch.equal(a, b) for a, b in zip(*results)), where


def test_pointer_signature():
    """On a GPU the kernel takes every array of jitconv.kernels.abi.CONV_ARGS as a typed pointer
    (launched with device addresses), in argument order: the dtype's storage type for
    x, out, weight, bias and state, int32 for the tables; scalars int64. A kernel with a
    compiled-in layout takes the per-call arguments only (CALL_ARGS), typed the same."""
    from numba import types
    from jitconv.kernels.abi import CONV_ARGS
    from jitconv.backends.cuda.kernels import pointer_signature
    from jitconv.backends.cuda.source import ARG_NAMES, CALL_ARGS, EXTRA_ARGS, LAYOUT_ARGS
    assert CALL_ARGS == ("x", "out", "weight", "bias", "state", "tables", "rows", "blocks",
                         "links", "out2", "spec_slot0", "win", "num_blocks")
    assert not set(CALL_ARGS) & set(LAYOUT_ARGS)
    for dtype_name, raw in (("bfloat16", types.int16), ("float16", types.int16),
                            ("float32", types.float32)):
        assert pointer_signature(dtype_name) == pointer_signature(dtype_name, ARG_NAMES)
        for names in (ARG_NAMES, CALL_ARGS):
            chosen = [a for a in CONV_ARGS + EXTRA_ARGS if a[0] in names]
            args = pointer_signature(dtype_name, names).args
            assert len(args) == len(chosen)
            expected = {"x": raw, "out": raw, "weight": raw, "bias": raw, "state": raw,
                        "tables": types.int32, "out2": raw, "win": raw}
            for (name, ndim, _, _), numba_type in zip(chosen, args):
                if ndim:
                    assert numba_type == types.CPointer(expected.pop(name)), name
                else:
                    assert numba_type == types.int64, name
            assert not expected


def test_bf16_rounding_instruction_only_where_the_gpu_has_it(monkeypatch):
    """PTX cvt.rn.bf16.f32 needs compute capability 8.0: older GPUs get the portable
    rounding (the simulator always does: it runs Python)."""
    monkeypatch.setattr(cuda_devices, "simulating", lambda: False)
    for capability, expected in (((7, 5), False), ((8, 0), True), ((9, 0), True)):
        monkeypatch.setattr(CUDA_STATE, "capability", {})
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d, c=capability: c)
        assert cuda_devices.native_bf16(torch.device("cuda:0")) is expected, capability


@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_out_none_and_out_aliasing_x(cuda_device, dtype_name):
    dtype = DTYPES[dtype_name]
    case = build_mixed(7, dtype=dtype, width=4, dim=DIM, usm=True)
    result = run_and_check(dict(case, conv_state=case["conv_state"].clone()), dtype=dtype)
    assert result.device == case["x"].device
    x = case["x"].clone()
    ref_out, _ = causal_conv1d_reference(**dict(case, x=x.clone()))
    got = jitconv.causal_conv1d_mixed(**dict(case, x=x, out=x))
    assert got is x
    assert_outputs_close(x, ref_out, dtype)


def test_memory_around_the_views_is_untouched(cuda_device):
    """x, out and conv_state as views inside larger buffers: the kernel (whose grid is
    rounded up to whole thread blocks) writes nothing outside them."""
    dtype = torch.bfloat16
    case = build_mixed(9, dtype=dtype, width=4, dim=DIM, usm=True, strided=True)
    n = case["x"].shape[0]
    big = poisoned((n + 2, DIM + 40), dtype, usm=True)
    big.copy_(torch.randn(big.shape).to(dtype))
    before = bits(big)
    out = big[1:n + 1, 16:16 + DIM]
    out.fill_(float("nan"))
    inside = torch.zeros(big.shape, dtype=torch.bool)
    inside[1:n + 1, 16:16 + DIM] = True
    run_and_check(case, dtype=dtype, out=out)
    assert torch.equal(bits(big)[~inside], before[~inside])


@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_mixed_equals_spec_call_plus_non_spec_call(cuda_device, dtype_name):
    check_mixed_equals_split(build_mixed(21, dtype=DTYPES[dtype_name], width=4, dim=DIM,
                                         shuffle=True, usm=True))


def test_plan_runs_every_layer(cuda_device):
    """One plan, several layers (different weights and states), each against the
    reference; the tables are copied to the device once."""
    dtype = torch.float16
    case = build_mixed(61, dtype=dtype, width=3, dim=DIM, usm=True)
    meta = {k: v for k, v in case.items() if k not in ("x", "weight", "bias", "conv_state")}
    lines, _, state_len = case["conv_state"].shape
    plan = jitconv.plan(case["x"].shape[0], lines, state_len, 3, **meta)
    gen = torch.Generator().manual_seed(5)
    for layer in range(3):
        x = randn(gen, tuple(case["x"].shape), dtype, usm=True)
        w = randn(gen, (DIM, 3), dtype, usm=True)
        state = case["conv_state"].clone()
        ref_out, ref_state = causal_conv1d_reference(**dict(case, x=x, weight=w,
                                                            conv_state=state.clone()))
        got = plan.run(x, w, None if layer == 1 else case["bias"], state,
                       activation=None if layer == 1 else "silu")
        if layer == 1:
            ref_out, ref_state = causal_conv1d_reference(**dict(
                case, x=x, weight=w, bias=None, conv_state=case["conv_state"].clone()),
                activation=None)
        assert_outputs_close(got, ref_out, dtype)
        assert_state_exact(state, ref_state)
    assert len(cuda_backend._plan_state(plan)["tables"]) == 1


@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_math_chooses_the_kernel(cuda_device, monkeypatch, dtype_name):
    """``math`` picks silu's exp and division per call (None: the table's fast_exp); each
    choice is within the contract's tolerances, with states bit-exact. On a GPU the
    approximate exp changes some float32 outputs (the simulator runs Python's exp for
    both)."""
    calls = _spy_get_kernel(monkeypatch)
    dtype = DTYPES[dtype_name]
    case = mixed_step(torch.Generator().manual_seed(8), dim=DIM, width=4, dtype=dtype,
                      ns_lengths=[9, 1], sp_lengths=[3], usm=True)
    got = {}
    for math in (None, "exact", "fast"):
        calls.clear()
        state = case["conv_state"].clone()
        out = poisoned(tuple(case["x"].shape), dtype, usm=True)
        ref_out, ref_state = causal_conv1d_reference(**dict(case, conv_state=state.clone()))
        jitconv.causal_conv1d_mixed(**dict(case, conv_state=state), out=out, math=math)
        assert_outputs_close(out, ref_out, dtype)
        assert_state_exact(state, ref_state)
        assert [c["fast_exp"] for c in calls] == [
            tuning.CudaTuning().fast_exp if math is None else math == "fast"], math
        got[math] = bits(out)
    assert torch.equal(got[None], got["fast"])
    if not SIM and dtype_name == "float32":
        assert not torch.equal(got["exact"], got["fast"])
    with pytest.raises(ValueError, match="math must be"):
        jitconv.causal_conv1d_mixed(**case, math="approximate")


def test_update_decode(cuda_device):
    gen = torch.Generator().manual_seed(3)
    dtype, batch, width = torch.bfloat16, 5, 4
    x = randn(gen, (batch, DIM), dtype, usm=True)
    w, b = randn(gen, (DIM, width), dtype, usm=True), randn(gen, (DIM,), dtype, usm=True)
    state = randn(gen, (batch + 1, width, DIM), dtype, usm=True).transpose(1, 2)
    lines = torch.tensor([3, 0, -1, 5, 1], dtype=torch.int32)
    ref_out, ref_state = causal_conv1d_reference(
        x, w, b, state, non_spec_query_start_loc=cumulative([1] * batch),
        non_spec_state_indices=lines)
    out = jitconv.causal_conv1d_update(x, w, b, state, lines)
    assert_outputs_close(out, ref_out, dtype)
    assert_state_exact(state, ref_state)


@pytest.mark.skipif(SIM, reason="the simulator has no streams")
def test_runs_on_torchs_current_stream(cuda_device):
    """Inputs produced on a side stream and the result read there, with no sync in
    between: only right if the kernel runs on torch's current stream."""
    dtype = torch.float32
    case = build_mixed(71, dtype=dtype, width=4, dim=4096, usm=True)
    ref_out, ref_state = causal_conv1d_reference(**dict(case, conv_state=case["conv_state"].clone()))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        x = case["x"] * 1.0  # produced on the side stream
        big = torch.randn(4096, 4096, device=x.device) @ torch.randn(4096, 4096, device=x.device)
        out = jitconv.causal_conv1d_mixed(**dict(case, x=x))
        result = out.clone() + 0 * big.sum()
    side.synchronize()
    assert_outputs_close(result, ref_out, dtype)
    assert_state_exact(case["conv_state"], ref_state)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("shape", ["shuffled", "plain", "spec_only", "uncovered"])
def test_split_outputs(cuda_device, dtype_name, shape):
    """out_spec / out_non_spec on CUDA: the gathered rows of the one-output call, bit for
    bit, states bit-identical, nothing written outside the views (tests/helpers.py)."""
    dtype = DTYPES[dtype_name]
    case = build_mixed(21 + len(shape), dtype=dtype, width=4, dim=DIM, usm=True,
                       shuffle=shape in ("shuffled", "uncovered"),
                       non_spec=shape != "spec_only")
    check_split_outputs(case, dtype, usm=True, extra_rows=3 if shape == "uncovered" else 0)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("width", [3, 4])
@pytest.mark.parametrize("rules", ["lines", "ring"])
def test_trees_and_windows(cuda_device, monkeypatch, dtype_name, width, rules):
    """Every state rule in one launch of a mixed step, as in tests/test_state_rules.py:
    prefill chunks, decodes, tree-verify sequences and pads with windows, and write lines
    with checkpoints or circular lines; states and windows bit-exact, the general kernel
    (never a short one) for such a step."""
    from helpers import check_rules_case, with_lines, with_ring, with_rules
    dtype = DTYPES[dtype_name]
    gen = torch.Generator().manual_seed(width)
    case = build_mixed(width, dtype=dtype, width=width, dim=DIM, usm=True, extra_lines=40)
    case, windows = with_rules(case, gen, usm=True)
    case = with_lines(case, gen) if rules == "lines" else with_ring(case, gen)
    short = []
    lookup = cuda_backend.get_kernel
    monkeypatch.setattr(cuda_backend, "get_kernel",
                        lambda spec: short.append(spec.short_tokens) or lookup(spec))
    check_rules_case(case, windows, dtype, out=poisoned(tuple(case["x"].shape), dtype,
                                                        usm=True))
    assert short and not any(short)  # the general kernel: the chain piece is only there
