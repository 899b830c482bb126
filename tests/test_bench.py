"""The benchmark runs end to end on a small setting and reports every figure it promises
(timings are printed, never asserted: these machines are shared and noisy)."""

import io

import torch

from jitconv import bench
from jitconv.baseline import causal_conv1d_mixed_torch

import jitconv


def test_bench_small_setting_reports_all_figures(sycl_device, tmp_path):
    text = io.StringIO()
    result = bench.run(dims=(256,), dtypes=("float32",),
                       workloads=["decode-heavy mixed", "mixed step"],
                       plot_path=str(tmp_path / "bench.png"), cold=True, out=text)
    assert result["copy_gbps"] > 0
    assert len(result["rows"]) == 2
    for row in result["rows"]:
        assert row["one_us"] > 0 and row["torch_us"] > 0 and row["two_us"] > 0
        assert row["gbps"] > 0 and row["speedup"] > 0
    assert result["host_us_per_call"] > 0 and result["submit_us"] > 0
    assert set(result["cold_start"]) == {"empty cache", "warm cache"}
    assert (tmp_path / "bench.png").stat().st_size > 1000
    printed = text.getvalue()
    assert "device copy bandwidth" in printed and "host overhead" in printed


def test_bench_workloads_compute_the_same_thing_both_ways(sycl_device):
    """What the benchmark times is correct: jitconv == the torch baseline on its steps."""
    for name in ("decode-only 64", "spec-only 16x(1+3)", "mixed step",
                 "mixed, rows shuffled"):
        step = bench.make_step(name, 128, torch.float32)
        tstep = {k: (v.clone() if k == "conv_state" else v) for k, v in step.items()}
        ours = jitconv.causal_conv1d_mixed(**step)
        theirs = causal_conv1d_mixed_torch(**tstep)
        torch.testing.assert_close(ours, theirs, rtol=3e-4, atol=1e-3)
        torch.testing.assert_close(step["conv_state"], tstep["conv_state"], rtol=0, atol=0)
