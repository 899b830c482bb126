"""Where the first layer of a step with new metadata spends its host time: the drop-ins
(as vLLM 0.32's ``_forward_core`` calls them, ``jitconv.bench.steps.vllm_conv``) and the
whole-step conv (``jitconv.bench.steps.whole_step_conv``), each step's metadata tensors
new (``bench.steps.fresh``), one synchronization per step.

Per workload (dim 8192, 36 layers, bfloat16), median over 40 steps, microseconds: layer 0
and the median of layers 2-35 timed alone, then layer 0 again with the pieces it runs
timed inside it (``time.perf_counter`` around each piece's calls, summed per step): the
plan build (``device_plan.build``; ``DevicePlan.rebound`` where a plan of that layout is
kept), the kept-plan lookup it happens in, the run's table and signature lookups, the
binding of the plan's words, and the run as a whole. Last, a cProfile of layer 0 over 40
steps (its per-call overhead inflates small calls: read it for what is called, not for
times).

    PYTHONPATH=$PWD python3 benchmarks/h200/first_layer.py
"""

import cProfile
import functools
import io
import pstats
import statistics
import sys
import time

import torch

import jitconv
import jitconv.vllm
from jitconv.api import device_plan, plan, plan_cache
from jitconv.backends.cuda import launching
from jitconv.bench import steps as bsteps
from jitconv.bench import stage as bs

DIM = 8192
WORKLOADS = ("decode 64", "spec 64 x (1+3)", "mixed 512 + 32 + 16 x 4")
STEPS = 40
_spent = {}  # piece -> seconds in this step


def _timed(owner, name, label):
    """Wrap ``owner.name`` so that its calls' time adds to ``_spent[label]``."""
    inner = getattr(owner, name)

    @functools.wraps(inner)
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            _spent[label] = _spent.get(label, 0.0) + time.perf_counter() - t0
    setattr(owner, name, wrapper)
    return lambda: setattr(owner, name, inner)


PIECES = ((plan_cache, "plan_for", "kept-plan lookup (build included)"),
          (device_plan, "build", "device_plan.build"),
          (device_plan.DevicePlan, "rebound", "DevicePlan.rebound"),
          (plan.StepPlan, "run_checked", "plan run (all of it)"),
          (launching, "_kept_run", "remembered run"),
          (launching, "_signed", "signature lookup"),
          (launching, "_tables", "tables"),
          (launching.Run, "_bind", "binding the plan's words"))


def times(call, base, pieces=False):
    """(layer 0, layers 2-35, {piece: us in layer 0}) medians over STEPS new steps."""
    firsts, rests, spent = [], [], {}
    undo = [_timed(*p) for p in PIECES if hasattr(p[0], p[1])] if pieces else []
    try:
        for i in range(STEPS + 3):
            s = bsteps.fresh(base)
            torch.cuda.synchronize()
            each = []
            for L in s.layers:
                _spent.clear()
                a = time.perf_counter()
                call(s, L)
                each.append(time.perf_counter() - a)
                if L is s.layers[0]:
                    got = dict(_spent)
            torch.cuda.synchronize()
            if i >= 3:
                firsts.append(each[0])
                rests.append(statistics.median(each[2:]))
                for k, v in got.items():
                    spent.setdefault(k, []).append(v)
    finally:
        for u in undo:
            u()
    return (statistics.median(firsts) * 1e6, statistics.median(rests) * 1e6,
            {k: statistics.median(v) * 1e6 for k, v in spent.items()})


def profile(call, base):
    prof = cProfile.Profile()
    for _ in range(STEPS):
        s = bsteps.fresh(base)
        torch.cuda.synchronize()
        prof.enable()
        call(s, s.layers[0])
        prof.disable()
        for L in s.layers[1:]:
            call(s, L)
        torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(22)
    return text.getvalue()


def main():
    jitconv.set_device("cuda:0")
    device = torch.device("cuda:0")
    update, fn = jitconv.vllm.causal_conv1d_update, jitconv.vllm.causal_conv1d_fn
    sides = {"drop-ins": lambda s, L: bsteps.vllm_conv(s, L, update, fn),
             "whole-step conv": bsteps.whole_step_conv}
    print(f"{torch.cuda.get_device_name()}, dim {DIM}, median of {STEPS} steps, us")
    with torch.inference_mode():
        for name in WORKLOADS:
            ns, sp = bs.WORKLOADS[name]
            base = bs.Step(torch.Generator().manual_seed(3), ns, sp, DIM, device)
            base.record = bsteps.record(base)
            for side, call in sides.items():
                times(call, base)  # warm
                first, rest, _ = times(call, base)
                first_p, _rest, spent = times(call, base, pieces=True)
                print(f"{name} | {side}: layer 0 {first:.1f}, layers 2-35 {rest:.1f}; "
                      f"layer 0 with its pieces timed {first_p:.1f}:")
                for label, us in spent.items():
                    print(f"    {label:<36}{us:8.1f}")
                sys.stdout.flush()
            for side, call in sides.items():
                print(f"--- cProfile, layer 0 of {STEPS} steps: {name} | {side}")
                print(profile(call, base))


if __name__ == "__main__":
    main()
