"""Host time of building the device plan that a vLLM drop-in call runs when its metadata
tensors are new (``jitconv.vllm.dropins._device_update_plan``: the checks, the plan
object, its placeholders), without any GPU: numba's CUDA simulator, whose CUDA device
takes CPU tensors. An engine whose metadata tensors are new at every step pays this once
per step (its first layer; the other layers find the plan kept). Median of --reps builds
of a decode step of --batch sequences, each with a new cache-line tensor.

    NUMBA_ENABLE_CUDASIM=1 NUMBA_CUDA_USE_NVIDIA_BINDING=0 JITCONV_TEST_HIDE_SYCL=1 \\
        PYTHONPATH=$PWD python3 benchmarks/cpu/device_plan_build.py [--batch 64] [--reps 200]
"""

import argparse
import statistics
import time

import torch

import jitconv
from jitconv.backends.cuda import devices as cuda_devices
from jitconv.vllm import dropins


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--reps", type=int, default=200)
    args = parser.parse_args()
    if not cuda_devices.simulating():
        raise SystemExit("run under numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1): see "
                         "the docstring")
    jitconv.set_device("cuda:0")
    dim, width, lines = 64, 4, args.batch + 16
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(args.batch, dim, generator=gen)
    idx = torch.randperm(lines, generator=gen)[:args.batch].to(torch.int32)

    def build():
        return dropins._device_update_plan(x, idx.clone(), None, None, 1, None, -1,
                                           (lines, width - 1, width))
    build()
    times = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        build()
        times.append(time.perf_counter() - t0)
    print(f"decode {args.batch}: a drop-in's device plan built in "
          f"{statistics.median(times) * 1e6:.1f} us (median of {args.reps}, host only, "
          f"CUDA simulator)")


if __name__ == "__main__":
    main()
