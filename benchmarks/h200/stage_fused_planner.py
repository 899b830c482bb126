"""The GDN stage on a device plan whose kernel plans its own blocks (one launch: the
tuning's ``fused_planner``, which the stage takes since 2026-12-07) beside the planner
kernel followed by the stage kernel (``fused_planner`` off), vLLM 0.32's chain beside
both: CUDA-graph replay per layer (36 layers in one graph, CUDA events, median of
``--reps``) and the device time of one layer (torch's profiler, L2 flushed, median of
``--reps``), the variants taking turns over ``--rounds`` rounds, the median of the
rounds reported. Decode-only and spec-only steps of ``jitconv.bench.stage``, bfloat16.
The stage's outputs of the first layer are checked against the reference first, under
each variant (``bench.stage.graph_sides`` does it for the default).

    python3 benchmarks/h200/stage_fused_planner.py --vllm-file <ops/causal_conv1d.py>
        --prep-file <fused_gdn_prefill_post_conv.py> [--out DIR]
"""

import statistics
import sys

import torch

import jitconv
from jitconv.bench import stage as bs
from jitconv.bench.gpu import bench_device, device_time_us, print_row, save_rows
from jitconv.kernels import tuning

VARIANTS = {"one launch": True, "planner + stage": False}


def main(argv=None):
    p = bs.arguments(__doc__, reps=20)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    vt, prep = bs.load_vllm_triton(args.vllm_file), bs.load_post_conv_prep(args.prep_file)
    device, flush = bench_device()
    rows = []
    with torch.inference_mode():
        for dim in (int(d) for d in args.dims.split(",")):
            for workload in bs.GRAPH_MAX_QUERY_LEN:
                ns, sp = bs.WORKLOADS[workload]
                if ns and sp:
                    continue  # a mixed step's plan has token maps: never one launch
                step = bs.Step(torch.Generator().manual_seed(dim + len(ns) + len(sp)), ns,
                               sp, dim, device)
                plan = jitconv.device_plan(step.T, step.num_lines, step.state_len,
                                           bs.WIDTH, max_query_len=bs.GRAPH_MAX_QUERY_LEN[
                                               workload], **step.meta)

                def stage(layer):
                    return plan.run_stage(layer["x"], layer["weight"], layer["bias"],
                                          layer["state"], layer["a"], layer["b"],
                                          layer["A_log"], layer["dt_bias"], **step.heads())
                for fused in VARIANTS.values():
                    with tuning.override(fused_planner=fused):
                        bs.graph_sides(step, workload, vt, prep, 1)  # checks the outputs
                found = {name: {"graph": [], "kernel": []} for name in VARIANTS}
                chain = []
                for _ in range(args.rounds):
                    chain.append(bs.graph_replay_us(
                        [lambda L=L: bs.vllm_chain(step, L, vt, prep) for L in step.layers],
                        args.reps))
                    for name, fused in VARIANTS.items():
                        with tuning.override(fused_planner=fused):
                            found[name]["graph"].append(bs.graph_replay_us(
                                [lambda L=L: stage(L) for L in step.layers], args.reps))
                            found[name]["kernel"].append(device_time_us(
                                lambda: stage(step.layers[0]), flush, args.reps)[0])
                row = dict(workload=workload, dim=dim,
                           chain_graph_us=statistics.median(chain))
                for name, got in found.items():
                    row[f"{name} graph_us"] = statistics.median(got["graph"])
                    row[f"{name} kernel_us"] = statistics.median(got["kernel"])
                    row[f"{name} graph/chain"] = row[f"{name} graph_us"] / row[
                        "chain_graph_us"]
                rows.append(row)
                print_row(row)
    save_rows(args.out, "stage-fused-planner.json", rows, reps=args.reps,
              rounds=args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
