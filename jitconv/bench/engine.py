"""Engine-step benchmark (NVIDIA, the CUDA backend): the conv of every GDN layer of one
engine step, jitconv beside vLLM's Triton op called as vLLM's GDN layer calls it.
``python -m jitconv.bench.engine --vllm-file PATH [--out DIR]``; the vLLM file is
``vllm/model_executor/layers/mamba/ops/causal_conv1d.py`` from vLLM's distribution
(never part of this repository).

Steps: decode-only (64 sequences of 1 token) and spec verify (64 sequences of 1 + 3
tokens, ragged accepted counts), width 4, conv dim 8192 and 2048, bfloat16, 36 layers
(each its own x, weight, bias and conv state). vLLM's GDN layer calls
``causal_conv1d_update`` for both, with the metadata in device tensors: decode with
``conv_state_indices``; spec with column 0 of the spec block table, ``num_accepted_tokens``,
``query_start_loc`` and ``max_query_len``; the result written into x.

Sides: "vllm triton" (that call); "jitconv drop-in" (``jitconv.vllm.causal_conv1d_update``,
the same call: a device plan kept per set of metadata tensors, result copied into x as
vLLM's is written there); "jitconv one-shot" (``jitconv.causal_conv1d_update`` with the
same metadata tensors and max_query_len, into an out buffer per layer: a device plan
kept likewise); "jitconv device plan" (``jitconv.device_plan`` built once,
``run`` into an out buffer per layer); "jitconv host plan" (``jitconv.plan`` from the
metadata's values, built once per step; eager only, it cannot be captured).

Figures per side (microseconds per layer):
- kernel: device time from torch's profiler (CUPTI) of the kernels one call launches
  (the planner's and the conv's for jitconv's device paths; the copy into x for the
  drop-in), L2 flushed before each call, median of ``--reps``;
- eager: a step's 36 calls issued back to back, one synchronization at the end: wall time
  of the step / 36 ("wall"), and the time until the last call returned / 36 ("host");
  median over ``--steps`` steps, the sides taking turns step by step (host-bound figures:
  a drift of the host's speed falls on every side alike);
- graph: the step's 36 calls captured in one CUDA graph, replayed; replay time (CUDA
  events) / 36, median over ``--steps`` replays. Before timing, the metadata tensors are
  rewritten (new cache lines, new accepted counts) and one replay is checked against the
  float64 reference on every layer's outputs and states: a side whose replays did not
  follow the new metadata is reported as wrong.
"""

import argparse
import statistics
import sys
import time

import torch

import jitconv
from jitconv.bench.gpu import (bench_device, device_time_us, load_vllm_triton, print_row,
                               save_rows)
from jitconv.kernels import tuning
from jitconv.reference import TOLERANCE, causal_conv1d_reference

LAYERS = 36
WORKLOADS = {"decode 64": (64, 1), "spec 64 x (1+3)": (64, 4)}
SIDES = ("vllm triton", "jitconv drop-in", "jitconv one-shot", "jitconv device plan",
         "jitconv host plan")
# Sides that run with other tuning values (variants, measured beside the defaults).
VARIANTS = {"jitconv device plan (planner)": ("jitconv device plan",
                                              {"fused_planner": False})}


class Step:
    """One engine step's metadata (device tensors, rewritten in place like an engine's
    persistent buffers) and 36 layers of data."""

    def __init__(self, gen, seqs, tokens_each, dim, dtype, device):
        self.seqs, self.tokens_each, self.device = seqs, tokens_each, device
        self.spec = tokens_each > 1
        self.num_tokens = seqs * tokens_each
        self.num_lines = 2 * seqs + 1  # line 0: vLLM's null block, unused here
        self.state_len = 3 + (tokens_each - 1)  # width - 1, plus the drafts for spec
        self.lines = torch.zeros(seqs, tokens_each, dtype=torch.int32, device=device)
        self.accepted = torch.ones(seqs, dtype=torch.int32, device=device)
        self.qsl = torch.arange(0, self.num_tokens + 1, tokens_each, dtype=torch.int32,
                                device=device)
        self.rewrite(gen)
        self.layers = []
        for _ in range(LAYERS):
            x = torch.randn(self.num_tokens, dim, generator=gen).to(dtype).to(device)
            w = torch.randn(dim, 4, generator=gen).to(dtype).to(device)
            b = torch.randn(dim, generator=gen).to(dtype).to(device)
            state = torch.randn(self.num_lines, self.state_len, dim,
                                generator=gen).to(dtype).to(device).transpose(1, 2)
            self.layers.append((x, w, b, state))

    def rewrite(self, gen):
        """New metadata values in the same tensors: other cache lines, accepted counts."""
        lines = 1 + torch.randperm(2 * self.seqs, generator=gen)[:self.seqs]
        self.lines[:, 0].copy_(lines.to(torch.int32))
        self.accepted.copy_(torch.randint(1, self.tokens_each + 1, (self.seqs,),
                                          generator=gen, dtype=torch.int32))

    def metadata(self):
        """causal_conv1d_update's metadata keywords, as vLLM's GDN layer passes them."""
        if self.spec:
            return dict(conv_state_indices=self.lines[:, 0], num_accepted_tokens=self.accepted,
                        query_start_loc=self.qsl, max_query_len=self.tokens_each)
        return dict(conv_state_indices=self.lines[:, 0])

    def plan_arguments(self):
        if self.spec:
            return dict(spec_query_start_loc=self.qsl, spec_state_indices=self.lines,
                        num_accepted_tokens=self.accepted)
        return dict(non_spec_state_indices=self.lines[:, 0])

    def reference(self, x, w, b, state):
        kw = {k: v.cpu() for k, v in self.plan_arguments().items()}
        if not self.spec:
            kw["non_spec_query_start_loc"] = torch.arange(self.seqs + 1)
        return causal_conv1d_reference(x.cpu(), w.cpu(), b.cpu(), state.cpu(), **kw)


def side_calls(name, step, vt):
    """(per-layer callables for one step, output of each layer) of a side."""
    meta = step.metadata()
    if name in ("vllm triton", "jitconv drop-in"):  # both write into x
        update = vt.causal_conv1d_update if name == "vllm triton" else \
            jitconv.vllm.causal_conv1d_update
        return [(lambda x=x, w=w, b=b, s=s: update(x, s, w, b, "silu", **meta))
                for x, w, b, s in step.layers], [layer[0] for layer in step.layers]
    if name in VARIANTS:
        return side_calls(VARIANTS[name][0], step, vt)
    if name == "jitconv one-shot":  # the core op, the same metadata tensors
        outs = [torch.empty_like(layer[0]) for layer in step.layers]
        declared = dict(max_query_len=step.tokens_each) if step.spec else {}
        lines = meta.pop("conv_state_indices")
        meta.pop("max_query_len", None)
        return [(lambda layer=layer, out=out: jitconv.causal_conv1d_update(
            *layer, lines, out=out, **meta, **declared))
            for layer, out in zip(step.layers, outs)], outs
    if name == "jitconv device plan":
        plan = jitconv.device_plan(step.num_tokens, step.num_lines, step.state_len, 4,
                                   max_query_len=step.tokens_each, **step.plan_arguments())
    else:
        kw = {k: v.cpu() for k, v in step.plan_arguments().items()}
        if not step.spec:
            kw["non_spec_query_start_loc"] = torch.arange(step.seqs + 1)
        plan = jitconv.plan(step.num_tokens, step.num_lines, step.state_len, 4, **kw)
    outs = [torch.empty_like(layer[0]) for layer in step.layers]
    return [(lambda layer=layer, out=out: plan.run(*layer, out=out))
            for layer, out in zip(step.layers, outs)], outs


def eager(sides, steps):
    """(median wall, median host) per layer of each side's step (``sides``: [(calls,
    tuning overrides)]). The sides take turns step by step, so that a drift of the host's
    speed (these are host-bound figures) falls on every side alike."""
    walls, hosts = [[] for _ in sides], [[] for _ in sides]
    for i in range(steps + 3):
        for k, (calls, overrides) in enumerate(sides):
            with tuning.override(**overrides):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for call in calls:
                    call()
                t1 = time.perf_counter()
                torch.cuda.synchronize()
                t2 = time.perf_counter()
            if i >= 3:
                walls[k].append((t2 - t0) * 1e6 / len(calls))
                hosts[k].append((t1 - t0) * 1e6 / len(calls))
    return [(statistics.median(w), statistics.median(h)) for w, h in zip(walls, hosts)]


def graph(step, calls, outs, gen, steps, check):
    """Replay time per layer of a graph of the step's calls, and whether a replay after
    the metadata was rewritten matched the reference (None: not checked)."""
    g = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for call in calls:  # warm-up on the capture stream (vLLM does the same)
            call()
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(g):
        for call in calls:
            call()
    ok = None
    if check:
        step.rewrite(gen)
        for x, _w, _b, state in step.layers:  # fresh values: in-place sides have grown x
            x.copy_(torch.randn(x.shape, generator=gen).to(x.dtype))
            state.copy_(torch.randn(state.shape, generator=gen).to(state.dtype))
        torch.cuda.synchronize()
        inputs = [tuple(t.clone() for t in layer) for layer in step.layers]
        g.replay()
        torch.cuda.synchronize()
        rtol, atol = TOLERANCE["bfloat16"]
        ok = True
        for layer, before, out in zip(step.layers, inputs, outs):
            want_out, want_state = step.reference(*before)
            ok &= bool(torch.allclose(out.double().cpu(), torch.from_numpy(want_out),
                                      rtol=rtol, atol=atol))
            ok &= bool(torch.equal(layer[3].cpu(),
                                   torch.from_numpy(want_state).to(layer[3].dtype)))
    times = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(calls))
    return statistics.median(times), ok


def run(vllm_file, out_dir=None, dims=(8192, 2048), reps=60, steps=50, sides=SIDES):
    vt = load_vllm_triton(vllm_file)
    device, flush = bench_device()
    rows = []
    with torch.inference_mode():
        for dim in dims:
            for workload, (seqs, tokens_each) in WORKLOADS.items():
                built = []
                for name in sides:
                    gen = torch.Generator().manual_seed(dim + seqs + tokens_each)
                    step = Step(gen, seqs, tokens_each, dim, torch.bfloat16, device)
                    calls, outs = side_calls(name, step, vt)
                    overrides = VARIANTS.get(name, (None, {}))[1]
                    with tuning.override(**overrides):
                        kernel, kernels = device_time_us(calls[0], flush, reps)
                    built.append((name, step, calls, outs, overrides, gen, dict(
                        workload=workload, dim=dim, side=name, kernel_us=kernel,
                        kernels=kernels)))
                timed = eager([(b[2], b[4]) for b in built], steps)
                for (name, step, calls, outs, overrides, gen, row), (wall, host) in zip(
                        built, timed):
                    row.update(eager_wall_us=wall, eager_host_us=host)
                    if name != "jitconv host plan":
                        with tuning.override(**overrides):
                            row["graph_us"], row["graph_follows_metadata"] = graph(
                                step, calls, outs, gen, steps, check=True)
                    rows.append(row)
                    print_row(row)
    table(rows)
    save_rows(out_dir, "engine.json", rows, layers=LAYERS, reps=reps, steps=steps)
    return rows


def table(rows):
    """Per workload: each side's figures and its ratio to vLLM Triton's."""
    print(f"\n{'workload':<26}{'side':<22}{'kernel':>9}{'eager wall':>12}{'host':>8}"
          f"{'graph':>8}  ratios to vllm (kernel / eager / graph)")
    for r in rows:
        base = next(b for b in rows if b["workload"] == r["workload"] and b["dim"] == r["dim"]
                    and b["side"] == "vllm triton")

        def ratio(key):
            return f"{r[key] / base[key]:.2f}" if key in r and key in base else "-"
        graph_us = f"{r['graph_us']:8.2f}" if "graph_us" in r else f"{'-':>8}"
        follows = "" if r.get("graph_follows_metadata", True) else "  WRONG AFTER REWRITE"
        label = f"{r['workload']} dim {r['dim']}"
        print(f"{label:<26}"
              f"{r['side']:<22}{r['kernel_us']:9.2f}{r['eager_wall_us']:12.2f}"
              f"{r['eager_host_us']:8.2f}{graph_us}  {ratio('kernel_us')} / "
              f"{ratio('eager_wall_us')} / {ratio('graph_us')}{follows}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vllm-file", required=True)
    p.add_argument("--out")
    p.add_argument("--dims", default="8192,2048")
    p.add_argument("--reps", type=int, default=60)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--sides", default=",".join(SIDES),
                   help=f"comma-separated; also the variants {', '.join(VARIANTS)}")
    a = p.parse_args(argv)
    run(a.vllm_file, a.out, tuple(int(d) for d in a.dims.split(",")), a.reps, a.steps,
        tuple(a.sides.split(",")))


if __name__ == "__main__":
    sys.exit(main())
