"""Engine steps as an engine runs them: metadata tensors new at every step (NVIDIA, the
CUDA backend). ``python -m jitconv.bench.steps --vllm-file PATH --prep-file PATH [--out
DIR]``: the two files of ``jitconv.bench.stage`` (vLLM's ``causal_conv1d.py`` and
``fused_gdn_prefill_post_conv.py``, never part of this repository).

vLLM's metadata builder makes new tensors for every step (query_start_loc, cache lines,
token maps, accepted counts) and the GDN layers of the step read them; so here, before
each step, every metadata tensor is cloned (new addresses, the same values) and a new
``GDNAttentionMetadata``-shaped record is made of them (the fields ``jitconv.vllm``'s
whole-step mode reads, as vLLM 0.32's builder sets them). The layers' tensors (x,
weights, conv states, a, b) stay the same, as a captured engine's do.

Steps (``jitconv.bench.stage``'s, 36 layers, bfloat16, width 4): decode-only (64 x 1),
spec-only (64 x (1 + 3)), prefill-heavy (4 chunks of 2048), mixed (a 512-token chunk, 32
decodes, 16 x (1 + 3) spec, vLLM's row order and token maps).

Sides, each called per layer as its engine calls it:
- "vllm conv": the conv calls of vLLM 0.32's ``_forward_core`` (the parts' ``index_select``
  of mixed_qkv in mixed steps, ``causal_conv1d_update`` for spec and decode parts,
  ``causal_conv1d_fn`` for prefill parts);
- "jitconv drop-ins": the same calls with jitconv.vllm's ``causal_conv1d_update`` /
  ``causal_conv1d_fn`` in place of vLLM's (what the plugin's drop-in mode installs);
- "jitconv whole-step conv": ``jitconv.vllm.gdn_conv_step`` from the step's record, split
  outputs where the step has both parts, a new output for prefills without spec part,
  else written into mixed_qkv (what the plugin's whole-step mode does);
- "vllm chain": ``jitconv.bench.stage``'s chain (the conv calls, ``rearrange_mixed_qkv``,
  ``fused_post_conv_prep``);
- "jitconv whole-step stage": ``jitconv.vllm.gdn_conv_stage_step`` from the step's record,
  l2norm as the plugin asks for it (the prefill rows).

Figures per side, microseconds per layer: eager wall time of a step's 36 layers (one
synchronization at the end) / 36 and the host's time until the last call returned / 36,
median over ``--steps`` steps, the sides taking turns step by step, each step's metadata
new; and the device time of one layer's GPU work (torch's profiler, L2 flushed, median
of ``--reps``) on a record kept between calls. Before timing, the jitconv sides' outputs
and states of layer 0 are checked against the float64 reference.
"""

import copy
import statistics
import sys
import time
import types

import numpy as np
import torch

import jitconv
import jitconv.vllm
from jitconv.bench import stage as bs
from jitconv.vllm.plugin import whole_step_outputs
from jitconv.bench.gpu import (bench_device, device_time_us, load_vllm_triton, print_row,
                               save_rows)
from jitconv.reference import TOLERANCE, causal_conv1d_reference, gdn_conv_stage_reference

SIDES = ("vllm conv", "jitconv drop-ins", "jitconv whole-step conv", "vllm chain",
         "jitconv whole-step stage")
BASE = {"jitconv drop-ins": "vllm conv", "jitconv whole-step conv": "vllm conv",
        "jitconv whole-step stage": "vllm chain"}


def fresh(step):
    """A copy of ``step`` whose metadata tensors are new (clones: new addresses, the
    same values), with its GDNAttentionMetadata-shaped record (``record``)."""
    new = copy.copy(step)
    new.meta = {k: v.clone() for k, v in step.meta.items()}
    new.vllm = {k: v.clone() for k, v in step.vllm.items()}
    new.record = record(new)
    return new


def record(step):
    """The fields of vLLM 0.32's GDNAttentionMetadata that its layer (and jitconv.vllm's
    whole-step mode) reads, as its builder sets them for this step."""
    m, host = step.meta, step.host_meta
    spec = "spec_query_start_loc" in m
    ns = np.diff(host["non_spec_query_start_loc"].numpy()) if "non_spec_query_start_loc" \
        in host else np.zeros(0, np.int64)
    num_sp = len(host["spec_query_start_loc"]) - 1 if spec else 0
    num_decodes = 0 if spec else int((ns == 1).sum())
    num_prefills = int((ns > 0).sum()) - num_decodes
    sp_tokens = int(host["spec_query_start_loc"][-1]) if spec else 0
    decode = num_prefills == 0 and num_decodes > 0
    return types.SimpleNamespace(
        num_prefills=num_prefills, num_decodes=num_decodes,
        num_prefill_tokens=int(ns.sum()) - num_decodes, num_decode_tokens=num_decodes,
        num_spec_decodes=num_sp, num_spec_decode_tokens=sp_tokens,
        num_actual_tokens=step.T,
        has_initial_state=None if decode else m.get("has_initial_state"),
        spec_sequence_masks=(torch.ones(num_sp, dtype=torch.bool, device=step.device)
                             if spec else None),
        spec_query_start_loc=m.get("spec_query_start_loc"),
        spec_state_indices_tensor=step.vllm.get("spec_block_table"),
        num_accepted_tokens=m.get("num_accepted_tokens"),
        non_spec_query_start_loc=None if decode else m.get("non_spec_query_start_loc"),
        non_spec_state_indices_tensor=m.get("non_spec_state_indices"),
        spec_token_indx=m.get("spec_token_indx"),
        non_spec_token_indx=m.get("non_spec_token_indx"))


def vllm_conv(step, layer, update, fn):
    """The conv calls of vLLM 0.32's _forward_core (``update`` / ``fn``: vLLM's ops or
    jitconv.vllm's drop-ins): (spec part's output, non-spec part's output)."""
    m, v = step.meta, step.vllm
    x, state = layer["x"], layer["state"]
    spec = "spec_query_start_loc" in m
    if spec and "non_spec_query_start_loc" in m:
        x_sp = x.index_select(0, m["spec_token_indx"])
        x_ns = x.index_select(0, m["non_spec_token_indx"])
    else:
        x_sp, x_ns = (x, None) if spec else (None, x)
    if spec:
        nsp = len(m["spec_query_start_loc"]) - 1
        x_sp = update(x_sp, state, layer["weight"], layer["bias"], "silu",
                      conv_state_indices=v["spec_block_table"][:, 0][:nsp],
                      num_accepted_tokens=m["num_accepted_tokens"],
                      query_start_loc=m["spec_query_start_loc"],
                      max_query_len=v["spec_block_table"].size(-1), validate_data=False)
    if step.prefill:
        x_ns = fn(x_ns.transpose(0, 1), layer["weight"], layer["bias"], activation="silu",
                  conv_states=state, has_initial_state=m["has_initial_state"],
                  cache_indices=m["non_spec_state_indices"],
                  query_start_loc=m["non_spec_query_start_loc"],
                  metadata=step.fn_meta).transpose(0, 1)
    elif x_ns is not None:
        x_ns = update(x_ns, state, layer["weight"], layer["bias"], "silu",
                      conv_state_indices=m["non_spec_state_indices"][:x_ns.shape[0]],
                      validate_data=True)
    return x_sp, x_ns


def whole_step_conv(step, layer):
    """The plugin's whole-step mode: one gdn_conv_step, split where both parts are, a new
    output for prefills without spec part, else into x."""
    both, new = whole_step_outputs(step.record)
    return jitconv.vllm.gdn_conv_step(layer["x"], layer["weight"], layer["bias"],
                                      layer["state"], step.record, split=both,
                                      out=None if both or new else layer["x"])


def l2norm_of(m):
    """What the plugin's whole-step mode asks the stage to normalise (vLLM's layer
    normalises the prefill rows of its non-spec part)."""
    if m.num_prefills == 0:
        return False
    peeled = m.spec_sequence_masks is None and m.num_decodes > 0
    return {"non_spec": int(m.num_decode_tokens) if peeled else 0}


def whole_step_stage(step, layer):
    return jitconv.vllm.gdn_conv_stage_step(
        layer["x"], layer["weight"], layer["bias"], layer["state"], layer["a"],
        layer["b"], layer["A_log"], layer["dt_bias"], step.record,
        use_l2norm=l2norm_of(step.record), **step.heads())


def check(step):
    """The whole-step sides on clones of layer 0 against the reference (conv outputs in
    each part's token order, q / k / v, g, beta; states bit-exact); their largest
    differences."""
    worst = {}
    host = {k: t.cpu() for k, t in step.layers[0].items()}
    meta = step.host_meta
    rtol, atol = TOLERANCE["bfloat16"]
    want_out, want_state = causal_conv1d_reference(host["x"], host["weight"], host["bias"],
                                                   host["state"], **meta)
    layer = {k: t.clone() for k, t in step.layers[0].items()}
    got = whole_step_conv(step, layer)
    parts = got if isinstance(got, jitconv.SplitOutputs) else None
    for part in ("spec", "non_spec"):
        rows = meta.get(f"{part}_token_indx")
        if parts is None or rows is None:
            continue
        t = getattr(parts, part).double().cpu().numpy()
        np.testing.assert_allclose(t, want_out[rows.numpy()], rtol, atol, err_msg=part)
        worst[f"conv {part}"] = float(np.abs(t - want_out[rows.numpy()]).max())
    if parts is None:  # x itself (written in place) or a new tensor
        t = got.double().cpu().numpy()
        np.testing.assert_allclose(t, want_out, rtol, atol, err_msg="conv")
    assert torch.equal(layer["state"].cpu(), torch.from_numpy(want_state).to(
        layer["state"].dtype)), "whole-step conv state"
    layer = {k: t.clone() for k, t in step.layers[0].items()}
    ref, ref_state = gdn_conv_stage_reference(
        host["x"], host["weight"], host["bias"], host["state"], host["a"], host["b"],
        host["A_log"], host["dt_bias"], **step.heads(), **meta,
        use_l2norm=l2norm_of(step.record))
    result = whole_step_stage(step, layer)
    for part in ("spec", "non_spec"):
        out = getattr(result, part)
        if out is None:
            continue
        n = len(ref[part]["q"])
        for f in ("q", "k", "v"):
            t = getattr(out, f)[:n].double().cpu().numpy()
            np.testing.assert_allclose(t, ref[part][f], rtol, atol, err_msg=f"{part} {f}")
            worst[f"stage {part} {f}"] = float(np.abs(t - ref[part][f]).max())
    assert torch.equal(layer["state"].cpu(), torch.from_numpy(ref_state).to(
        layer["state"].dtype)), "whole-step stage state"
    jitconv.check_errors()
    return worst


def side_call(name, vt, prep):
    """The per-layer call of a side: f(step, layer)."""
    drop_update = jitconv.vllm.causal_conv1d_update
    drop_fn = jitconv.vllm.causal_conv1d_fn
    return {
        "vllm conv": lambda s, L: vllm_conv(s, L, vt.causal_conv1d_update,
                                            vt.causal_conv1d_fn),
        "jitconv drop-ins": lambda s, L: vllm_conv(s, L, drop_update, drop_fn),
        "jitconv whole-step conv": whole_step_conv,
        "vllm chain": lambda s, L: bs.vllm_chain(s, L, vt, prep),
        "jitconv whole-step stage": whole_step_stage}[name]


def eager(step, calls, steps):
    """(wall, host) per layer of each side, the sides taking turns step by step, the
    metadata new at every step (made before the step's timing starts)."""
    walls, hosts = [[] for _ in calls], [[] for _ in calls]
    for i in range(steps + 3):
        for k, call in enumerate(calls):
            s = fresh(step)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for layer in step.layers:
                call(s, layer)
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            if i >= 3:
                walls[k].append((t2 - t0) * 1e6 / len(step.layers))
                hosts[k].append((t1 - t0) * 1e6 / len(step.layers))
    return [(statistics.median(w), statistics.median(h)) for w, h in zip(walls, hosts)]


def run(vllm_file, prep_file, out_dir=None, dims=(8192, 2048), reps=30, steps=20,
        workloads=None):
    vt, prep = load_vllm_triton(vllm_file), bs.load_post_conv_prep(prep_file)
    device, flush = bench_device()
    rows = []
    with torch.inference_mode():
        for dim in dims:
            for workload, (ns_lengths, sp_lengths) in bs.WORKLOADS.items():
                if workloads and workload not in workloads:
                    continue
                gen = torch.Generator().manual_seed(dim + len(ns_lengths) + len(sp_lengths))
                step = bs.Step(gen, ns_lengths, sp_lengths, dim, device)
                worst = check(fresh(step))
                calls = [side_call(name, vt, prep) for name in SIDES]
                timed = eager(step, calls, steps)
                kept = fresh(step)
                for name, call, (wall, host) in zip(SIDES, calls, timed):
                    kernel, names = device_time_us(lambda: call(kept, step.layers[0]),
                                                   flush, reps)
                    row = dict(workload=workload, dim=dim, side=name, kernel_us=kernel,
                               eager_wall_us=wall, eager_host_us=host, launches=len(names),
                               kernels=sorted(names))
                    if name.startswith("jitconv whole-step"):
                        row["max_diff_to_reference"] = {
                            k: v for k, v in worst.items()
                            if k.startswith(name.split()[-1])}
                    rows.append(row)
                    print_row(row)
    table(rows)
    save_rows(out_dir, "steps.json", rows, layers=bs.LAYERS, reps=reps, steps=steps)
    return rows


def table(rows):
    print(f"\n{'workload':<34}{'side':<26}{'kernel':>9}{'eager wall':>12}{'host':>8}"
          f"  ratio to its vLLM side (kernel / eager wall)")
    for r in rows:
        label = f"{r['workload']} dim {r['dim']}"
        ratio = ""
        base = BASE.get(r["side"])
        if base:
            b = next(x for x in rows if x["workload"] == r["workload"]
                     and x["dim"] == r["dim"] and x["side"] == base)
            ratio = (f"  {r['kernel_us'] / b['kernel_us']:.2f} / "
                     f"{r['eager_wall_us'] / b['eager_wall_us']:.2f} of {base}")
        print(f"{label:<34}{r['side']:<26}{r['kernel_us']:9.2f}{r['eager_wall_us']:12.2f}"
              f"{r['eager_host_us']:8.2f}{ratio}")


def main(argv=None):
    p = bs.arguments(__doc__.split("\n\n")[0], reps=30, steps=20)
    p.add_argument("--workloads", default="", help="comma-separated; default: all")
    a = p.parse_args(argv)
    run(a.vllm_file, a.prep_file, a.out, tuple(int(d) for d in a.dims.split(",")), a.reps,
        a.steps, tuple(w for w in a.workloads.split(",") if w))


if __name__ == "__main__":
    sys.exit(main())
