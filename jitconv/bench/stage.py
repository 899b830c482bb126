"""The GDN conv stage against vLLM's chain (NVIDIA, the CUDA backend).
``python -m jitconv.bench.stage --vllm-file PATH --prep-file PATH [--out DIR]``: PATH is
vLLM's ``vllm/model_executor/layers/mamba/ops/causal_conv1d.py`` and ``--prep-file`` its
``vllm/third_party/flash_linear_attention/ops/fused_gdn_prefill_post_conv.py``, both from
vLLM's distribution (never part of this repository).

The chain is what vLLM 0.32's ``QwenGatedDeltaNetAttention._forward_core`` runs between
the input projection and the recurrent kernels, called the way it calls each link:
``index_select`` of mixed_qkv, a and b by each part's token map (mixed steps only),
``causal_conv1d_update`` for the spec part (column 0 of the block table,
num_accepted_tokens, query_start_loc, max_query_len), ``causal_conv1d_fn`` for prefill
steps (x transposed, a conv metadata record built once per step as vLLM's builder does) or
``causal_conv1d_update`` for decode-only ones, ``rearrange_mixed_qkv`` (split, one
``torch.cat``, views) for the parts that go to the recurrent update kernel, and
``fused_post_conv_prep`` (l2norm, g, beta) for the part that goes to the chunked prefill
kernel. vLLM leaves l2norm and the gates of its spec and decode parts to the recurrent
kernel; the stage computes them for every part (more work on its side, not less).

Sides: "jitconv stage" (``StepPlan.run_stage`` on a host plan built from the step's
metadata at every step, its build counted in the eager figures: an engine builds one per
step); "jitconv stage, kept plan" (the plan built once: from the second step on every
layer's run is a remembered launch, the floor of the host's cost); "jitconv conv only"
(the conv alone with split outputs, ``StepPlan.run(split=True)`` on a kept plan: what the
stage adds to the conv's device time).

Workloads (Qwen3-Next's heads: head_k_dim = head_v_dim = 128, 2 v heads per k head; conv
dim 8192 = 16 k heads, 2048 = 4), width 4, bfloat16, 36 layers each with its own
tensors: decode-only (64 x 1), spec-only (64 x (1 + 3)), prefill-heavy (4 chunks of
2048), mixed (a 512-token chunk, 32 decodes, 16 x (1 + 3) spec, vLLM's row order).

Figures per side, microseconds per layer:
- kernel: device time from torch's profiler of the GPU work of one layer's call, L2
  flushed before each, median of ``--reps``;
- eager: a step's 36 layers back to back with one synchronization: wall / 36, and the
  host's time until the last call returned / 36; median over ``--steps`` steps, the sides
  taking turns step by step;
- for the stage on prefill-heavy steps, its bytes (x, a, b read; q, k, v, g, beta
  written; state lines read and written) over its device time, beside a same-bytes
  device-to-device copy's rate;
- on the steps of one part (decode-only, spec-only) and the mixed step, CUDA-graph
  replay: the chain's 36 layers captured in one graph, and the stage's on a device plan
  of the step's metadata (``jitconv.device_plan``, the mixed step's with its token maps)
  in another, each replay timed by CUDA events, median of ``--reps``, per layer.
Before timing, each side's outputs are checked: the stage's against the float64
reference (``jitconv.reference.gdn_conv_stage_reference``) and the chain's q / k / v
(normalised where vLLM leaves it to the recurrent kernel) against the stage's.
"""

import argparse
import json
import statistics
import sys
import time
import types

import numpy as np
import torch

import jitconv
from jitconv.bench.gpu import (bench_device, copy_bandwidth, device_time_us,
                               load_vllm_triton, print_row, save_rows)
from jitconv.reference import TOLERANCE, gdn_conv_stage_reference

LAYERS = 36
WIDTH = 4
HEAD = 128  # head_k_dim = head_v_dim
# (non-spec lengths, spec lengths)
WORKLOADS = {"decode 64": ([1] * 64, []), "spec 64 x (1+3)": ([], [4] * 64),
             "prefill 4 x 2048": ([2048] * 4, []),
             "mixed 512 + 32 + 16 x 4": ([512] + [1] * 32, [4] * 16)}
SIDES = ("vllm chain", "jitconv stage", "jitconv stage, kept plan", "jitconv conv only")


def load_post_conv_prep(path):
    """vLLM's fused_post_conv_prep module, its one vLLM import replaced by triton's."""
    text = open(path).read()
    old = "from vllm.triton_utils import tl, triton"
    if old not in text:
        raise RuntimeError(f"{path}: expected the line {old!r}")
    module = types.ModuleType("vllm_post_conv")
    module.__file__ = path
    exec(compile(text.replace(old, "import triton\nimport triton.language as tl"), path,
                 "exec"), module.__dict__)
    return module.fused_post_conv_prep


class Step:
    """One engine step's metadata (device tensors, vLLM's layout: spec rows first) and
    36 layers' tensors."""

    def __init__(self, gen, ns_lengths, sp_lengths, dim, device):
        self.H = dim // (4 * HEAD)  # q, k: H heads each; v: 2 H heads
        self.HV = 2 * self.H
        assert 2 * self.H * HEAD + self.HV * HEAD == dim
        self.dim, self.device = dim, device
        n_sp, n_ns = sum(sp_lengths), sum(ns_lengths)
        self.T = n_sp + n_ns
        S = WIDTH - 1
        self.spec_width = max(sp_lengths, default=1)
        self.state_len = S - 1 + self.spec_width if sp_lengths else S
        nseq = len(ns_lengths) + len(sp_lengths)
        lines = torch.randperm(nseq + 8, generator=gen)[:nseq].to(torch.int32) + 1
        cum = lambda n: torch.tensor([0] + np.cumsum(n).tolist(), dtype=torch.int32)  # noqa: E731
        meta, vllm = {}, {}
        if sp_lengths:
            sp_lines = lines[len(ns_lengths):]
            table = torch.stack([sp_lines + 1000 * k for k in range(self.spec_width)], 1)
            table[:, 1:] = 0  # only column 0 is the line the conv reads
            meta.update(spec_query_start_loc=cum(sp_lengths), spec_state_indices=sp_lines,
                        num_accepted_tokens=torch.randint(
                            1, self.spec_width + 1, (len(sp_lengths),), generator=gen,
                            dtype=torch.int32))
            vllm.update(spec_block_table=table)
        if ns_lengths:
            meta.update(non_spec_query_start_loc=cum(ns_lengths),
                        non_spec_state_indices=lines[:len(ns_lengths)],
                        has_initial_state=torch.ones(len(ns_lengths), dtype=torch.bool))
        if sp_lengths and ns_lengths:
            meta.update(spec_token_indx=torch.arange(n_sp, dtype=torch.int32),
                        non_spec_token_indx=torch.arange(n_sp, self.T, dtype=torch.int32))
        self.host_meta = meta
        self.meta = {k: v.to(device) for k, v in meta.items()}
        self.vllm = {k: v.to(device) for k, v in vllm.items()}
        self.prefill = any(n > 1 for n in ns_lengths)
        self.num_lines = nseq + 9
        self.fn_meta = (_conv_fn_metadata(meta["non_spec_query_start_loc"], device)
                        if self.prefill else None)
        self.layers = [self._layer(gen) for _ in range(LAYERS)]

    def _layer(self, gen):
        dim, HV = self.dim, self.HV

        def randn(*shape, scale=1.0):
            return (torch.randn(shape, generator=gen) * scale).to(torch.bfloat16).to(
                self.device)
        ba = randn(self.T, 2 * HV)
        return dict(x=randn(self.T, dim), weight=randn(dim, WIDTH, scale=0.5),
                    bias=randn(dim, scale=0.1),
                    # vLLM's SD layout: (lines, state_len, dim), passed transposed
                    state=randn(self.num_lines, self.state_len, dim).transpose(1, 2),
                    b=ba[:, :HV], a=ba[:, HV:],
                    A_log=torch.randn(HV, generator=gen).to(self.device),
                    dt_bias=torch.randn(HV, generator=gen).to(self.device))

    def heads(self):
        return dict(num_k_heads=self.H, head_k_dim=HEAD, head_v_dim=HEAD)


def _conv_fn_metadata(query_start_loc, device):
    """What vLLM's metadata builder gives causal_conv1d_fn once per step (its
    ``nums_dict`` for BLOCK_M 8 and the two program tables), computed here from the
    host's query_start_loc."""
    nums = -(-query_start_loc.diff().long() // 8)
    mlist = torch.from_numpy(np.repeat(np.arange(len(nums)), nums.numpy())).to(torch.int32)
    offsets = torch.tensor([j for n in nums.tolist() for j in range(n)], dtype=torch.int32)
    size = 2 * max(1024, len(mlist))
    batch_ptr = torch.full((size,), -1, dtype=torch.int32, device=device)
    chunk_ptr = torch.full((size,), -1, dtype=torch.int32, device=device)
    batch_ptr[:len(mlist)] = mlist.to(device)
    chunk_ptr[:len(mlist)] = offsets.to(device)
    entry = dict(nums=nums, tot=int(nums.sum()), mlist=mlist, mlist_len=len(mlist),
                 offsetlist=offsets, batch_ptr=batch_ptr, token_chunk_offset_ptr=chunk_ptr)
    return types.SimpleNamespace(nums_dict={8: entry}, batch_ptr=batch_ptr,
                                 token_chunk_offset_ptr=chunk_ptr)


def _rearrange(mixed, step):
    """vLLM's rearrange_mixed_qkv: split, one cat, views (1, T, heads, dim)."""
    if mixed is None:
        return None
    T, qk = mixed.shape[0], step.H * HEAD
    q, k, v = torch.split(mixed, [qk, qk, step.HV * HEAD], dim=-1)
    fused = torch.cat([q.reshape(-1), k.reshape(-1), v.reshape(-1)], dim=0)
    return (fused[:T * qk].view(1, T, -1, HEAD), fused[T * qk:2 * T * qk].view(1, T, -1, HEAD),
            fused[2 * T * qk:].view(1, T, -1, HEAD))


def vllm_chain(step, layer, vt, prep):
    """_forward_core's calls from the conv input to the recurrent kernels' inputs."""
    m, v = step.meta, step.vllm
    x, a, b, state = layer["x"], layer["a"], layer["b"], layer["state"]
    spec = "spec_query_start_loc" in m
    mixed = spec and "non_spec_query_start_loc" in m
    if mixed:
        x_sp = x.index_select(0, m["spec_token_indx"])
        a.index_select(0, m["spec_token_indx"])  # a_spec, b_spec: the recurrent kernel's
        b.index_select(0, m["spec_token_indx"])
        x_ns = x.index_select(0, m["non_spec_token_indx"])
    else:
        x_sp, x_ns = (x, None) if spec else (None, x)
    out = {}
    if spec:
        nsp = len(m["spec_query_start_loc"]) - 1
        x_sp = vt.causal_conv1d_update(
            x_sp, state, layer["weight"], layer["bias"], "silu",
            conv_state_indices=v["spec_block_table"][:, 0][:nsp],
            num_accepted_tokens=m["num_accepted_tokens"],
            query_start_loc=m["spec_query_start_loc"],
            max_query_len=v["spec_block_table"].size(-1), validate_data=False)
    if step.prefill:
        x_ns = vt.causal_conv1d_fn(
            x_ns.transpose(0, 1), layer["weight"], layer["bias"], activation="silu",
            conv_states=state, has_initial_state=m["has_initial_state"],
            cache_indices=m["non_spec_state_indices"],
            query_start_loc=m["non_spec_query_start_loc"],
            metadata=step.fn_meta).transpose(0, 1)
    elif x_ns is not None:
        x_ns = vt.causal_conv1d_update(
            x_ns, state, layer["weight"], layer["bias"], "silu",
            conv_state_indices=m["non_spec_state_indices"][:x_ns.shape[0]],
            validate_data=True)
    out["spec"] = _rearrange(x_sp, step) if spec else None
    if step.prefill:
        a_ns, b_ns = a, b
        if spec:
            a_ns = a.index_select(0, m["non_spec_token_indx"])
            b_ns = b.index_select(0, m["non_spec_token_indx"])
        out["non_spec"] = prep(conv_output=x_ns, a=a_ns, b=b_ns, A_log=layer["A_log"],
                               dt_bias=layer["dt_bias"], apply_l2norm=True,
                               output_g_exp=False, **step.heads())
    else:
        out["non_spec"] = _rearrange(x_ns, step)
    return out


def stage_calls(step, conv_only=False):
    """The stage's per-layer calls over one host plan (``plans[0]``, rebuilt by
    ``new_plan`` at each step's start); ``conv_only``: the conv's split run instead."""
    plans = [None]

    def new_plan():
        plans[0] = jitconv.plan(step.T, step.num_lines, step.state_len, WIDTH,
                                **step.meta)

    def call(layer):
        if conv_only:
            return plans[0].run(layer["x"], layer["weight"], layer["bias"], layer["state"],
                                split=True)
        return plans[0].run_stage(layer["x"], layer["weight"], layer["bias"],
                                  layer["state"], layer["a"], layer["b"], layer["A_log"],
                                  layer["dt_bias"], **step.heads())
    return new_plan, call


def check(step, vt, prep):
    """Both sides on clones of layer 0 against the reference: the stage within the
    dtype's tolerance (q, k, v) and 1e-4 (g, beta), its states bit-exact; the chain's
    states equal the stage's, its q, k (normalised here where vLLM's recurrent kernel
    does it) and v within tolerance of the stage's. Returns the largest differences."""
    layer = step.layers[0]
    fresh = lambda: {k: t.clone() for k, t in layer.items()}  # noqa: E731
    mine, theirs = fresh(), fresh()
    host = {k: t.cpu() for k, t in layer.items()}
    ref, ref_state = gdn_conv_stage_reference(
        host["x"], host["weight"], host["bias"], host["state"], host["a"], host["b"],
        host["A_log"], host["dt_bias"], **step.heads(), **step.host_meta)
    new_plan, call = stage_calls(step)
    new_plan()
    result = call(mine)
    chain = vllm_chain(step, theirs, vt, prep)
    torch.cuda.synchronize()
    rtol, atol = TOLERANCE["bfloat16"]
    worst = {}
    for part in ("spec", "non_spec"):
        got = getattr(result, part)
        if got is None:
            continue
        for f in ("q", "k", "v", "g", "beta"):
            t = getattr(got, f).double().cpu().numpy()
            tol = (rtol, atol) if f in "qkv" else (1e-4, 1e-5)
            np.testing.assert_allclose(t, ref[part][f], *tol, err_msg=f"stage {part} {f}")
        q, k, v = chain[part][:3]
        q, k = (t.reshape(got.q.shape).float() for t in (q, k))
        if part == "spec" or not step.prefill:  # normalised by vLLM's recurrent kernel
            q, k = (t / torch.sqrt((t * t).sum(-1, keepdim=True) + 1e-6) for t in (q, k))
        for f, theirs_f in (("q", q), ("k", k), ("v", v.reshape(got.v.shape))):
            diff = (getattr(got, f).float() - theirs_f.float()).abs().max().item()
            worst[f"{part} {f}"] = diff
            torch.testing.assert_close(getattr(got, f).float(), theirs_f.float(),
                                       rtol=rtol, atol=atol)
    state = mine["state"].cpu()
    assert torch.equal(state, torch.from_numpy(ref_state).to(state.dtype)), "stage state"
    assert torch.equal(state, theirs["state"].cpu()), "chain state"
    return worst


def eager(sides, steps):
    """(wall, host) per layer of each side's steps, the sides taking turns."""
    walls, hosts = [[] for _ in sides], [[] for _ in sides]
    for i in range(steps + 3):
        for k, (start, calls) in enumerate(sides):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            start()
            for call in calls:
                call()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            if i >= 3:
                walls[k].append((t2 - t0) * 1e6 / len(calls))
                hosts[k].append((t1 - t0) * 1e6 / len(calls))
    return [(statistics.median(w), statistics.median(h)) for w, h in zip(walls, hosts)]


# The steps captured in CUDA graphs, with the max_query_len of the stage's device plan:
# those of one part (vLLM's FULL graphs capture uniform decode and spec-verify steps), and
# the mixed step (its device plan has the step's token maps; vLLM runs mixed steps
# eagerly or in piecewise graphs, so its side here is what a graph of its ops gives).
GRAPH_MAX_QUERY_LEN = {"decode 64": 1, "spec 64 x (1+3)": 4,
                       "mixed 512 + 32 + 16 x 4": None}


def graph_replay_us(calls, reps):
    """Per layer: one CUDA graph that captured ``calls`` (a step's layers), replayed
    ``reps`` times, each timed by CUDA events; the median / len(calls)."""
    for call in calls:  # warm-up: compiles, prepares, remembers
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps + 3):
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(calls))
    return statistics.median(times[3:])


def graph_sides(step, workload, vt, prep, reps):
    """{"vllm chain": us, "jitconv stage, device plan": us} of graph replay per layer,
    for a step of one part (``GRAPH_MAX_QUERY_LEN``); the stage's replayed outputs of the
    first layer checked against the reference first (they follow the metadata)."""
    plan = jitconv.device_plan(step.T, step.num_lines, step.state_len, WIDTH,
                               max_query_len=GRAPH_MAX_QUERY_LEN[workload], **step.meta)

    def stage(layer):
        return plan.run_stage(layer["x"], layer["weight"], layer["bias"], layer["state"],
                              layer["a"], layer["b"], layer["A_log"], layer["dt_bias"],
                              **step.heads())
    layer = {k: t.clone() for k, t in step.layers[0].items()}
    host = {k: t.cpu() for k, t in layer.items()}
    ref, ref_state = gdn_conv_stage_reference(
        host["x"], host["weight"], host["bias"], host["state"], host["a"], host["b"],
        host["A_log"], host["dt_bias"], **step.heads(), **step.host_meta)
    got = stage(layer)
    plan.check_errors()
    rtol, atol = TOLERANCE["bfloat16"]
    for part in ("spec", "non_spec"):
        if getattr(got, part) is None:
            continue
        n = len(ref[part]["v"])
        np.testing.assert_allclose(getattr(got, part).v[:n].double().cpu().numpy(),
                                   ref[part]["v"], rtol, atol, err_msg="device-plan stage v")
    assert torch.equal(layer["state"].cpu(), torch.from_numpy(ref_state).to(
        layer["state"].dtype)), "device-plan stage state"
    return {"vllm chain": graph_replay_us([lambda L=L: vllm_chain(step, L, vt, prep)
                                           for L in step.layers], reps),
            "jitconv stage, device plan": graph_replay_us(
                [lambda L=L: stage(L) for L in step.layers], reps)}


def stage_bytes(step):
    """What the stage must move: x, a, b read; q, k, v (x's size) and g, beta written;
    each sequence's state window read and its new state written."""
    e = 2  # bfloat16
    T, dim, HV = step.T, step.dim, step.HV
    seqs = sum(len(v) - 1 for k, v in step.host_meta.items() if k.endswith("query_start_loc"))
    return (2 * T * dim * e + 2 * T * HV * e + 2 * T * HV * 4
            + 2 * seqs * step.state_len * dim * e)


def run(vllm_file, prep_file, out_dir=None, dims=(8192, 2048), reps=40, steps=30):
    vt, prep = load_vllm_triton(vllm_file), load_post_conv_prep(prep_file)
    device, flush = bench_device()
    rows = []
    with torch.inference_mode():
        for dim in dims:
            for workload, (ns_lengths, sp_lengths) in WORKLOADS.items():
                gen = torch.Generator().manual_seed(dim + len(ns_lengths) + len(sp_lengths))
                step = Step(gen, ns_lengths, sp_lengths, dim, device)
                worst = check(step, vt, prep)
                new_plan, stage_call = stage_calls(step)
                new_plan()
                kept_plan, kept_call = stage_calls(step)
                kept_plan()
                conv_plan, conv_call = stage_calls(step, conv_only=True)
                conv_plan()
                layer = step.layers[0]
                side_fns = {
                    "vllm chain": (lambda: None,
                                   [lambda L=L: vllm_chain(step, L, vt, prep)
                                    for L in step.layers]),
                    "jitconv stage": (new_plan, [lambda L=L: stage_call(L)
                                                 for L in step.layers]),
                    "jitconv stage, kept plan": (lambda: None, [lambda L=L: kept_call(L)
                                                                for L in step.layers]),
                    "jitconv conv only": (lambda: None, [lambda L=L: conv_call(L)
                                                         for L in step.layers])}
                kernels = {
                    "vllm chain": lambda: vllm_chain(step, layer, vt, prep),
                    "jitconv stage": lambda: stage_call(layer),
                    "jitconv stage, kept plan": lambda: kept_call(layer),
                    "jitconv conv only": lambda: conv_call(layer)}
                timed = eager([side_fns[s] for s in SIDES], steps)
                if workload in GRAPH_MAX_QUERY_LEN:
                    graphs = graph_sides(step, workload, vt, prep, reps)
                    rows.append(dict(workload=workload, dim=dim, graph_replay_us=graphs))
                    print(json.dumps(rows[-1]), flush=True)
                for side, (wall, host) in zip(SIDES, timed):
                    kernel, names = device_time_us(kernels[side], flush, reps)
                    row = dict(workload=workload, dim=dim, side=side, kernel_us=kernel,
                               eager_wall_us=wall, eager_host_us=host,
                               launches=len(names), kernels=sorted(names))
                    if side == "jitconv stage":
                        row["max_diff_to_chain"] = worst
                    if side.startswith("jitconv stage"):
                        if workload.startswith("prefill"):
                            nbytes = stage_bytes(step)
                            row["stage_GBps"] = nbytes / kernel * 1e-3
                            # a copy of half the bytes reads and writes them all
                            row["copy_GBps"] = copy_bandwidth(device, nbytes // 2)["gbps"]
                    rows.append(row)
                    print_row(row)
    table(rows)
    save_rows(out_dir, "stage.json", rows, layers=LAYERS, reps=reps, steps=steps)
    return rows


def table(rows):
    graphs = [r for r in rows if "graph_replay_us" in r]
    rows = [r for r in rows if "graph_replay_us" not in r]
    print(f"\n{'workload':<34}{'side':<26}{'kernel':>9}{'eager wall':>12}{'host':>8}"
          f"  ratios to the chain (kernel / eager wall)")
    for r in rows:
        base = next(b for b in rows if b["workload"] == r["workload"] and b["dim"] == r["dim"]
                    and b["side"] == "vllm chain")
        label = f"{r['workload']} dim {r['dim']}"
        extra = (f"  {r['stage_GBps']:.0f} GB/s vs copy {r['copy_GBps']:.0f}"
                 if "stage_GBps" in r else "")
        print(f"{label:<34}{r['side']:<26}{r['kernel_us']:9.2f}{r['eager_wall_us']:12.2f}"
              f"{r['eager_host_us']:8.2f}  {r['kernel_us'] / base['kernel_us']:.2f} / "
              f"{r['eager_wall_us'] / base['eager_wall_us']:.2f}{extra}")
    if graphs:
        print(f"\n{'CUDA-graph replay, per layer':<34}{'vllm chain':>12}"
              f"{'stage (device plan)':>21}  ratio")
        for r in graphs:
            g = r["graph_replay_us"]
            print(f"{r['workload'] + ' dim ' + str(r['dim']):<34}{g['vllm chain']:12.2f}"
                  f"{g['jitconv stage, device plan']:21.2f}  "
                  f"{g['jitconv stage, device plan'] / g['vllm chain']:.2f}")


def arguments(description, reps=40, steps=30):
    """The command line of this benchmark and of ``bench.steps``: vLLM's two files, the
    output directory, dims, repetitions and steps."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--vllm-file", required=True)
    p.add_argument("--prep-file", required=True)
    p.add_argument("--out")
    p.add_argument("--dims", default="8192,2048")
    p.add_argument("--reps", type=int, default=reps)
    p.add_argument("--steps", type=int, default=steps)
    return p


def main(argv=None):
    a = arguments(__doc__.split("\n\n")[0]).parse_args(argv)
    run(a.vllm_file, a.prep_file, a.out, tuple(int(d) for d in a.dims.split(",")), a.reps,
        a.steps)


if __name__ == "__main__":
    sys.exit(main())
