"""Where a remembered CUDA run's host time goes (H200 machine): ``python3
benchmarks/h200/host_profile.py``. Times the pieces of one run (torch's stream accessor,
the run's key, one prepared driver launch, a torch add_ for scale) and prints a cProfile
of 3000 runs of a host plan and of a device plan (decode 64, bfloat16, dim 8192)."""

import cProfile
import pstats
import timeit

import torch

import jitconv
from jitconv.backends.cuda import driver, launching

jitconv.set_device("cuda:0")
dev = torch.device("cuda:0")
g = torch.Generator().manual_seed(0)
x = torch.randn(64, 8192, generator=g).to(torch.bfloat16).to(dev)
w = torch.randn(8192, 4, generator=g).to(torch.bfloat16).to(dev)
b = torch.randn(8192, generator=g).to(torch.bfloat16).to(dev)
state = torch.randn(129, 3, 8192, generator=g).to(torch.bfloat16).to(dev).transpose(1, 2)
out = torch.empty_like(x)
lines = torch.arange(1, 65, dtype=torch.int32, device=dev)
host = jitconv.plan(64, 129, 3, 4, non_spec_query_start_loc=list(range(65)),
                    non_spec_state_indices=lines.cpu())
dplan = jitconv.device_plan(64, 129, 3, 4, non_spec_state_indices=lines)
with torch.inference_mode():
    for p in (host, dplan):
        p.run(x, w, b, state, out=out)
    args = (x, w, b, state, out)
    key = launching.run_key(args, "silu", None)
    run = launching.remembered(host, key)
    n = 3000

    def us(fn):
        fn()
        torch.cuda.synchronize()
        t = timeit.timeit(fn, number=n) / n * 1e6
        torch.cuda.synchronize()
        return f"{t:.2f} us"
    print("torch add_", us(lambda: x.add_(0)))
    print("current_stream", us(lambda: driver.current_stream(0)))
    print("torch.cuda.current_stream", us(lambda: torch.cuda.current_stream(0)))
    print("run_key", us(lambda: launching.run_key(args, "silu", None)))
    print("Run(out) (prepared launch only)", us(lambda: run(out)))
    print("host plan.run", us(lambda: host.run(x, w, b, state, out=out)))
    print("device plan.run", us(lambda: dplan.run(x, w, b, state, out=out)))
    for name, p in (("host plan", host), ("device plan", dplan)):
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(n):
            p.run(x, w, b, state, out=out)
        prof.disable()
        torch.cuda.synchronize()
        print(f"--- {name}: cProfile of {n} runs")
        pstats.Stats(prof).sort_stats("tottime").print_stats(14)
