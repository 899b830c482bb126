"""Where a remembered CUDA run's host time goes (H200 machine): ``python3
benchmarks/h200/host_profile.py``. Times the pieces of one run (torch's stream accessor,
the run's key, one prepared driver launch, a torch add_ for scale), each plan's
``run`` on a decode step (64 sequences) and a spec-verify step (64 of 1 + 3 tokens),
bfloat16, dim 8192, and prints a cProfile of 3000 runs of the decode step's host plan and
device plan; then the registers and local memory of every conv kernel the process
compiled (local memory: spilled registers)."""

import cProfile
import pstats
import timeit

import torch

import jitconv
from jitconv.backends.cuda import driver, launching

jitconv.set_device("cuda:0")
dev = torch.device("cuda:0")
g = torch.Generator().manual_seed(0)


def layer(tokens, state_len):
    x = torch.randn(tokens, 8192, generator=g).to(torch.bfloat16).to(dev)
    w = torch.randn(8192, 4, generator=g).to(torch.bfloat16).to(dev)
    b = torch.randn(8192, generator=g).to(torch.bfloat16).to(dev)
    state = torch.randn(129, state_len, 8192, generator=g).to(torch.bfloat16).to(
        dev).transpose(1, 2)
    return x, w, b, state, torch.empty_like(x)


lines = torch.arange(1, 65, dtype=torch.int32, device=dev)
qsl = torch.arange(0, 257, 4, dtype=torch.int32, device=dev)
accepted = torch.randint(1, 5, (64,), generator=g, dtype=torch.int32).to(dev)
steps = {
    "decode": (layer(64, 3), jitconv.plan(64, 129, 3, 4, non_spec_query_start_loc=list(
        range(65)), non_spec_state_indices=lines.cpu()),
        jitconv.device_plan(64, 129, 3, 4, non_spec_state_indices=lines)),
    "spec": (layer(256, 6), jitconv.plan(256, 129, 6, 4, spec_query_start_loc=qsl.cpu(),
                                         spec_state_indices=lines.cpu(),
                                         num_accepted_tokens=accepted.cpu()),
             jitconv.device_plan(256, 129, 6, 4, spec_query_start_loc=qsl,
                                 spec_state_indices=lines, num_accepted_tokens=accepted,
                                 max_query_len=4)),
}
n = 3000


def us(fn):
    fn()
    torch.cuda.synchronize()
    t = timeit.timeit(fn, number=n) / n * 1e6
    torch.cuda.synchronize()
    return f"{t:.2f} us"


with torch.inference_mode():
    for name, (args, host, dplan) in steps.items():
        for p in (host, dplan):
            p.run(*args[:4], out=args[4])
    args, host, dplan = steps["decode"]
    x, out = args[0], args[4]
    key = launching.run_key(args, "silu", None)
    run = host.derived["cuda"]["runs"][key]
    print("torch add_", us(lambda: x.add_(0)))
    print("current_stream", us(lambda: driver.current_stream(0)))
    print("run_key", us(lambda: launching.run_key(args, "silu", None)))
    print("Run(out) (prepared launch only)", us(lambda: run(out, driver.current_stream(0))))
    print("Run.launch (driver calls only)", us(lambda: run.launch(driver.current_stream(0), out)))
    for name, (args, host, dplan) in steps.items():
        for kind, p in (("host plan", host), ("device plan", dplan)):
            print(f"{name} {kind}.run", us(lambda: p.run(*args[:4], out=args[4])))
    args, host, dplan = steps["decode"]
    for name, p in (("host plan", host), ("device plan", dplan)):
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(n):
            p.run(*args[:4], out=args[4])
        prof.disable()
        torch.cuda.synchronize()
        print(f"--- decode {name}: cProfile of {n} runs")
        pstats.Stats(prof).sort_stats("tottime").print_stats(16)
for spec, kernel in launching._kernels.items():
    (compiled,) = kernel.overloads.values()
    print(f"short_tokens={spec.short_tokens} uniform_decode={spec.uniform_decode} "
          f"fused={spec.fused_plan is not None} max_registers={spec.max_registers}:",
          compiled._codelibrary.get_cufunc().attrs)
