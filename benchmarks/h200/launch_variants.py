"""What one remembered CUDA launch costs on the host, by way of calling the driver (GPU
machine): ``python3 benchmarks/h200/launch_variants.py``. An experiment, not the
product's code: it times the same prepared conv launch (a device plan's decode step,
64 sequences, bfloat16, dim 8192) made

- as ``driver.Prepared.launch`` makes it (ctypes, ``cuLaunchKernelEx`` of four
  arguments with a launch configuration kept per stream),
- through ``cuLaunchKernel`` (ctypes, twelve arguments, no argtypes; what jitconv called
  before 2026-12-05),
- through cuda-bindings' ``cuLaunchKernel`` (the package numba-cuda depends on),

and the context check before it (``driver.in_context``'s ``cuCtxGetCurrent``) against
torch's current-device query, the run key, a remembered run and ``plan.run``, with torch
``add_`` for scale. Each figure: median of 7 rounds of 3000 calls, in us per call; the
rounds of the variants alternate."""

import ctypes
import statistics
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
plan = jitconv.device_plan(64, 129, 3, 4, non_spec_state_indices=lines)
args = (x, w, b, state, out)

with torch.inference_mode():
    plan.run(*args[:4], out=out)
    key = launching.run_key(args, "silu", None)
    run = launching._runs_of(plan, launching._plan_state(plan))[key]
    (prepared,) = run.launches
    lib = driver._driver()
    stream = driver.current_stream(0)
    head = (prepared.function,) + prepared.grid + prepared.block + (0,)

    def plain_launch():
        code = lib.cuLaunchKernel(*head, ctypes.c_void_p(stream), None, prepared.extra)
        if code:
            raise RuntimeError(f"cuLaunchKernel: {code}")

    variants = {
        "torch add_": lambda: x.add_(0),
        "Prepared.launch (ctypes cuLaunchKernelEx)": lambda: prepared.launch(stream),
        "cuLaunchKernel (ctypes, 12 arguments)": plain_launch,
        "in_context (ctypes cuCtxGetCurrent)": lambda: driver.in_context(run.context),
        "torch.cuda.current_device": torch.cuda.current_device,
        "current_stream": lambda: driver.current_stream(0),
        "run_key": lambda: launching.run_key(args, "silu", None),
        "Run(out, stream)": lambda: run(out, stream),
        "plan.run": lambda: plan.run(x, w, b, state, out=out),
    }
    try:
        from cuda.bindings import driver as cb
    except ImportError:
        try:
            from cuda import cuda as cb
        except ImportError:
            cb = None
    if cb is not None:
        function = cb.CUfunction(prepared.function.value)
        cb_stream = cb.CUstream(stream)
        # the extra array's forms the binding may take: its address, or its five words
        forms = {"address": ctypes.addressof(prepared.extra),
                 "words": [prepared.extra[i] or 0 for i in range(5)]}
        for form, extra in forms.items():
            def bindings_launch(extra=extra):
                err, = cb.cuLaunchKernel(function, *prepared.grid, *prepared.block, 0,
                                         cb_stream, 0, extra)
                if err != cb.CUresult.CUDA_SUCCESS:
                    raise RuntimeError(f"cuda-bindings cuLaunchKernel: {err}")

            try:
                bindings_launch()
                torch.cuda.synchronize()
                variants[f"cuda-bindings cuLaunchKernel (extra as {form})"] = bindings_launch
                break
            except Exception as e:  # report, and time the others
                print(f"cuda-bindings cuLaunchKernel, extra as {form}: failed:", repr(e))
    else:
        print("cuda-bindings: not importable")

    for fn in variants.values():
        fn()
    torch.cuda.synchronize()
    n, rounds = 3000, 7
    times = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            torch.cuda.synchronize()
            times[name].append(timeit.timeit(fn, number=n) / n * 1e6)
            torch.cuda.synchronize()
    for name, t in times.items():
        print(f"{name}: {statistics.median(t):.2f} us (rounds: "
              f"{' '.join(f'{v:.2f}' for v in t)})")
