"""The benchmark runs end to end and its figures add up (timings are printed, never
asserted: these machines are shared and noisy)."""

import io

import pytest
import torch

import jitconv
from jitconv.bench import cpu as bench
from jitconv.testing.baseline import causal_conv1d_mixed_torch
from jitconv.reference import TOLERANCE

from helpers import bits


@pytest.fixture(scope="module")
def small_run(sycl_device, tmp_path_factory):
    text = io.StringIO()
    plot = tmp_path_factory.mktemp("bench") / "bench.png"
    result = bench.run(dims=(128,), dtypes=("float32",), plot_path=str(plot), cold=True,
                       out=text, layers=3, layer_dim=128)
    return result, text.getvalue(), plot


def test_bench_figures_add_up(small_run):
    result, printed, plot = small_run
    assert bench.inconsistencies(result) == []
    assert [r["workload"] for r in result["rows"]] == list(bench.WORKLOADS)
    assert set(result["cold_start"]) == {"empty cache", "warm cache"}
    assert [r["workload"] for r in result["layer_loops"]] == ["decode-only 64", "mixed step"]
    assert plot.stat().st_size > 1000
    for r in result["rows"]:  # the table shows the figures of the result
        assert f"{r['one_us']:8.0f}us {r['gbps']:6.2f} {r['pct_copy']:5.1f}%" in printed
    assert "device copy bandwidth" in printed and "host overhead" in printed


def test_bytes_moved_counts_what_must_move():
    """decode-only 64, dim 128, float32: x read and out written (2 x 64 x 128 x 4), the
    weights and bias (128 x 5 x 4), and per sequence the old window read and the new one
    written (64 x 2 x 3 x 128 x 4)."""
    step = bench.make_step("decode-only 64", 128, torch.float32)
    assert bench.bytes_moved(step) == 2 * 64 * 128 * 4 + 128 * 5 * 4 + 64 * 2 * 3 * 128 * 4


def test_kernel_only_figures_add_up(sycl_device, monkeypatch):
    """--kernel-only: kernel and copy times from profiling events, same consistency."""
    timed = []  # the submits whose events were timed: the copy, one call, two calls
    original = bench.median_kernel_times

    def recorded(submits, *args, **kwargs):
        timed.append(len(submits))
        return original(submits, *args, **kwargs)
    monkeypatch.setattr(bench, "median_kernel_times", recorded)
    result = bench.run(dims=(128,), dtypes=("bfloat16",), workloads=["mixed step"],
                       plot_path=None, cold=False, out=io.StringIO(), layers=0,
                       kernel_only=True)
    assert result["timing"] == "kernel"
    assert 3 in timed, f"the workload's kernels were not timed from events: {timed}"
    assert bench.inconsistencies(result) == []
    assert result["rows"][0]["two_us"] > 0 and result["rows"][0]["pct_two_us"] > 0


def test_copy_buffers_are_filled(sycl_device):
    """The copy figure reads memory that holds data: a never-written allocation maps to
    the zero page and a copy of it runs from cache."""
    import numpy as np
    memory = bench._filled(4096 * 3, jitconv.get_queue())
    data = np.frombuffer(memory.copy_to_host(), np.uint8)
    assert data.size == 4096 * 3 and (data != 0).all()


@pytest.mark.parametrize("tamper", ["copy", "row copy", "copy bytes", "two % copy",
                                    "row missing", "row twice", "GB/s", "% copy",
                                    "speedup", "bytes", "two calls", "layer host",
                                    "layer host new tensors", "kernel share"])
def test_inconsistencies_are_found(small_run, tamper):
    result, _, _ = small_run
    bad = dict(result, rows=[dict(r) for r in result["rows"]])
    rows = bad["rows"]
    if tamper == "copy":
        bad["copy_gbps"] *= 1.01
    elif tamper in ("row copy", "copy bytes"):
        rows[3]["copy_us" if tamper == "row copy" else "copy_bytes"] *= 1.01
    elif tamper == "two % copy":
        rows[3]["pct_two_us"] *= 1.01  # decode-heavy mixed: has two calls
    elif tamper == "row missing":
        del rows[2]
    elif tamper == "row twice":
        rows[1] = dict(rows[0])
    elif tamper == "two calls":
        rows[0]["two_us"] = rows[0]["one_us"]  # decode-only has no second part
    elif tamper in ("layer host", "layer host new tensors", "kernel share"):
        loops = bad["layer_loops"] = [dict(r) for r in result["layer_loops"]]
        loops[-1][{"layer host": "host_us_per_layer", "kernel share": "kernel_share",
                   "layer host new tensors": "checked_host_us_per_layer"}[tamper]] *= 1.01
    else:
        key = {"GB/s": "gbps", "% copy": "pct_copy", "speedup": "speedup",
               "bytes": "bytes"}[tamper]
        rows[3][key] *= 1.01
    assert bench.inconsistencies(bad) != []


def test_bench_workloads_compute_the_same_thing_both_ways(sycl_device):
    """What the benchmark times is correct: jitconv == the torch baseline on its steps."""
    rtol, atol = TOLERANCE["float32"]
    for name in bench.WORKLOADS:
        step = bench.make_step(name, 128, torch.float32)
        tstep = {k: (v.clone() if k == "conv_state" else v) for k, v in step.items()}
        ours = jitconv.causal_conv1d_mixed(**step)
        theirs = causal_conv1d_mixed_torch(**tstep)
        torch.testing.assert_close(ours, theirs, rtol=rtol, atol=atol)
        assert torch.equal(bits(step["conv_state"]), bits(tstep["conv_state"]))


def test_gpu_table_default_variant_and_lookaheads():
    """bench_gpu: --lookaheads takes "auto" (the tuning table's choice per launch) and L
    values; the table's default column is the automatic variant (channels and lookahead),
    or in results from before them the table's channels, L = auto or its long lookahead."""
    from jitconv.bench import gpu as bench_gpu
    from jitconv.kernels import tuning
    assert bench_gpu._lookaheads("auto, 8") == ("auto", 8)
    assert bench_gpu._lookaheads(None) is None
    with pytest.raises(SystemExit, match="--lookaheads"):
        bench_gpu._lookaheads("3")
    table = tuning.CudaTuning()
    mode = "fast exp" if table.fast_exp else "exact"
    C = table.channels
    row = dict(dim=2048, dtype="bfloat16", workload="decode-only 64", pct_copy=10.0)
    fixed = dict(row, variant=bench_gpu.variant_name(C, table.long_lookahead, mode), us=3.0)
    auto = dict(row, variant=bench_gpu.variant_name(C, bench_gpu.AUTO, mode), us=5.0)
    triton = dict(row, variant="vllm triton", us=4.0)

    def default_cell(rows):
        line = bench_gpu.table({"rows": rows}).splitlines()[-1]
        return line.split(" | ")[3]

    assert default_cell([fixed, auto, triton]).startswith("5.0 us")
    assert default_cell([fixed, triton]).startswith("3.0 us")
    # automatic channels too (--channels auto): that row is the default
    both = dict(row, variant=bench_gpu.variant_name(bench_gpu.AUTO, bench_gpu.AUTO, mode),
                us=6.0)
    assert default_cell([fixed, auto, both, triton]).startswith("6.0 us")


def test_gpu_table_takes_the_faster_of_triton_with_and_without_pdl():
    """vLLM's calls are timed with programmatic dependent launch on and off (on GPUs where
    vLLM turns it on): the table's Triton columns, the ratios and the plot take the
    faster of the two, and the cell says when it was the one without PDL."""
    from jitconv.bench import gpu as bench_gpu
    row = dict(dim=2048, dtype="bfloat16", workload="mixed step")
    ours = dict(row, variant=bench_gpu.variant_name(bench_gpu.AUTO, bench_gpu.AUTO, "fast exp"),
                us=6.0, pct_copy=30.0)

    def triton_rows(pdl_us, no_pdl_us, name="vllm triton"):
        rows = [dict(row, variant=name, us=pdl_us, pct_copy=100 / pdl_us)]
        if no_pdl_us is not None:
            rows.append(dict(row, variant=name + bench_gpu.TRITON_NO_PDL, us=no_pdl_us,
                             pct_copy=100 / no_pdl_us))
        return rows

    def cells(rows):
        line = bench_gpu.table({"rows": rows}).splitlines()[-1].split(" | ")
        return line[5], line[6], line[8], line[9]

    rows = [ours] + triton_rows(9.0, 4.0) + triton_rows(12.0, 15.0, "vllm triton + gathers")
    triton, gathers, vs, vs_gathers = cells(rows)
    assert triton.startswith("4.0 us") and triton.endswith("no PDL")
    assert gathers.startswith("12.0 us") and "no PDL" not in gathers
    assert (vs, vs_gathers) == ("0.67x", "2.00x")
    assert cells([ours] + triton_rows(3.0, None))[0].startswith("3.0 us")  # PDL row only
    _title, panel_rows, _series = bench_gpu.panel(
        {"rows": rows, "device": "GPU", "copy": {"gbps": 1.0}})
    assert panel_rows[0]["pct_triton"] == 25.0 and panel_rows[0]["pct_gathers"] == 100 / 12


def test_gpu_host_cost_needs_a_cuda_device():
    """``python -m jitconv.bench.gpu host VLLM_FILE OUT`` (the CUDA call's host cost) says
    why it cannot run where there is no CUDA device, before loading anything."""
    from jitconv.bench import gpu as bench_gpu
    from jitconv.backends.cuda import devices as cuda_devices
    if cuda_devices.devices():
        pytest.skip("a CUDA device is present")
    with pytest.raises(SystemExit, match="no CUDA device"):
        bench_gpu.main(["host", "missing/causal_conv1d.py", "out"])
