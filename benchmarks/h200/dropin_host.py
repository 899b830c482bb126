"""Host time of ``jitconv.vllm.causal_conv1d_update`` (the drop-in, device metadata) and of
``jitconv.causal_conv1d_update`` (the core one-shot op, the same metadata tensors) per
call, on the engine benchmark's steps and layers (``jitconv.bench.engine``: 36 layers,
decode 64 and spec 64 x (1+3), bfloat16, dims 8192 and 2048), alone in the process: no
profiler run and no other side before it. Median of 20 loops over the 36 layers (each
loop's calls issued back to back, then a sync); a cProfile of the spec step at dim 8192.

    PYTHONPATH=$PWD python3 benchmarks/h200/dropin_host.py .vllm/causal_conv1d.py
"""

import cProfile
import pstats
import sys
import time

import torch

import jitconv
from jitconv.bench import engine
from jitconv.bench.gpu import load_vllm_triton

vt = load_vllm_triton(sys.argv[1])
jitconv.set_device("cuda:0")
with torch.inference_mode():
    for side, dim in [(s, d) for s in ("jitconv drop-in", "jitconv one-shot")
                      for d in (8192, 2048)]:
        for wl, (seqs, te) in engine.WORKLOADS.items():
            gen = torch.Generator().manual_seed(1)
            step = engine.Step(gen, seqs, te, dim, torch.bfloat16, torch.device("cuda:0"))
            calls, _ = engine.side_calls(side, step, vt)
            for c in calls:
                c()
            torch.cuda.synchronize()
            ts = []
            for _ in range(20):
                t0 = time.perf_counter()
                for c in calls:
                    c()
                ts.append((time.perf_counter() - t0) * 1e6 / len(calls))
                torch.cuda.synchronize()
            ts.sort()
            print(side, wl, dim, "host us per call", round(ts[10], 2), flush=True)
            if dim == 8192 and te > 1:
                profile = cProfile.Profile()
                profile.enable()
                for _ in range(50):
                    for c in calls:
                        c()
                profile.disable()
                torch.cuda.synchronize()
                pstats.Stats(profile).sort_stats("tottime").print_stats(14)
