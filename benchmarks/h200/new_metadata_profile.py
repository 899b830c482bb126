"""Where a layer's host time goes when the step's metadata tensors are new at every step
(as vLLM's metadata builder makes them): a plan built per step, then each layer's first
run of it. ``bench.stage``'s steps (36 layers, bfloat16), dim 8192; per side the wall
time per layer (median of 10 steps, one sync per step) and a cProfile of 10 steps.

    PYTHONPATH=$PWD python3 benchmarks/h200/new_metadata_profile.py
"""

import cProfile
import pstats
import statistics
import time

import torch

import jitconv
from jitconv.bench import stage as bs

DIM = 8192


def fresh(meta):
    return {k: v.clone() for k, v in meta.items()}


def sides(step):
    heads = step.heads()
    one_part = not ("spec_query_start_loc" in step.meta and
                    "non_spec_query_start_loc" in step.meta)

    def host_stage():
        plan = jitconv.plan(step.T, step.num_lines, step.state_len, 4, **fresh(step.meta))
        for L in step.layers:
            plan.run_stage(L["x"], L["weight"], L["bias"], L["state"], L["a"], L["b"],
                           L["A_log"], L["dt_bias"], **heads)

    def host_conv():
        plan = jitconv.plan(step.T, step.num_lines, step.state_len, 4, **fresh(step.meta))
        for L in step.layers:
            plan.run(L["x"], L["weight"], L["bias"], L["state"], split=True)

    def device_conv():
        m = fresh(step.meta)
        m.pop("spec_token_indx", None), m.pop("non_spec_token_indx", None)
        plan = jitconv.device_plan(step.T, step.num_lines, step.state_len, 4,
                                   max_query_len=None if step.prefill else 4, **m)
        for L in step.layers:
            plan.run(L["x"], L["weight"], L["bias"], L["state"])

    def device_stage():
        m = fresh(step.meta)
        plan = jitconv.device_plan(step.T, step.num_lines, step.state_len, 4,
                                   max_query_len=None if step.prefill else 4, **m)
        for L in step.layers:
            plan.run_stage(L["x"], L["weight"], L["bias"], L["state"], L["a"], L["b"],
                           L["A_log"], L["dt_bias"], **heads)

    out = {"host plan per step, stage": host_stage, "host plan per step, conv": host_conv}
    if one_part:
        out.update({"device plan per step, conv": device_conv,
                    "device plan per step, stage": device_stage})
    return out


def time_and_profile(label, call, profile, steps=10, top=(25, 40), callees=()):
    """``call()`` (one step of ``bs.LAYERS`` layers) after three warm-up steps: its wall
    time per layer printed under ``label`` (median of ``steps``, one sync per step);
    with ``profile`` a cProfile of ``steps`` steps (the ``top`` functions by own and by
    cumulative time, and the callees of the functions matching ``callees``)."""
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    walls = []
    for _ in range(steps):
        t0 = time.perf_counter()
        call()
        torch.cuda.synchronize()
        walls.append((time.perf_counter() - t0) * 1e6 / bs.LAYERS)
    print(f"{label}: {statistics.median(walls):.1f} us per layer", flush=True)
    if not profile:
        return
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        call()
    torch.cuda.synchronize()
    prof.disable()
    st = pstats.Stats(prof)
    st.sort_stats("tottime").print_stats(top[0])
    st.sort_stats("cumulative").print_stats(top[1])
    for pattern in callees:
        st.print_callees(pattern)


def main():
    jitconv.set_device("cuda:0")
    device = torch.device("cuda:0")
    with torch.inference_mode():
        for name, (ns, sp) in bs.WORKLOADS.items():
            if name.startswith("prefill"):
                continue
            step = bs.Step(torch.Generator().manual_seed(3), ns, sp, DIM, device)
            for side, call in sides(step).items():
                time_and_profile(f"{name} | {side}", call,
                                 name.startswith("mixed") or
                                 side.startswith("device plan per step, conv"),
                                 callees=("launching.py.*\\(launch\\)", "run_checked"))


if __name__ == "__main__":
    main()
