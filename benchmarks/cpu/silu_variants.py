"""Same-run comparison of silu's two SYCL maths (``math="exact" | "fast"``) on one device:
the default kernel of each dtype and the other math's (as jitconv picks them: shipped,
cache or compiled), timed in turn within every repetition with the
device copy of the same bytes (profiling events, kernel time only), on the benchmark's
own workloads (jitconv.bench.cpu.make_step). Also the outputs of both against the float64
reference.

    python benchmarks/cpu/silu_variants.py [--dims 2048,8192] [--dtypes ...] [--rounds 3]
"""

import argparse

import numpy as np
import torch

from jitconv.bench import cpu as bench
from jitconv.backends.sycl import launching
from jitconv.kernels.abi import WIDE_CHANNELS, fast_silu
from same_run import accuracy, timed_workloads, variant_channels


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dims", default="2048,8192")
    p.add_argument("--dtypes", default="bfloat16,float16,float32")
    p.add_argument("--workloads", default="prefill-heavy 4x1024;mixed step")
    p.add_argument("--rounds", type=int, default=2, help="pairs of rounds (both orders)")
    args = p.parse_args()
    queue = bench.profiling_queue()
    width = 4
    print(f"device: {queue.sycl_device.filter_string}; kernel times from profiling events, "
          f"% copy against a copy of the same bytes timed in turn with both kernels")
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        # the kernel a launch of these (aligned) workloads takes: wide where there is one
        wide = dtype_name in WIDE_CHANNELS
        default = launching.get_conv_kernel(width, dtype_name, queue, wide)
        other = launching.get_conv_kernel(width, dtype_name, queue, wide,
                                          not fast_silu(dtype_name))
        channels = [variant_channels(dtype_name, {"wide": wide})] * 2
        names = ["fast" if fast_silu(dtype_name) else "exact",
                 "exact" if fast_silu(dtype_name) else "fast"]
        a_bits, a_err, a_use = accuracy(default, dtype, queue, channels=channels[0])
        b_bits, b_err, b_use = accuracy(other, dtype, queue, channels=channels[1])
        print(f"{dtype_name}: default = {names[0]}; vs float64 reference: {names[0]} max err "
              f"{a_err:.3g} ({a_use:.2f} of tolerance), {names[1]} {b_err:.3g} "
              f"({b_use:.2f}); outputs differing: {100 * (a_bits != b_bits).mean():.2f}%, "
              f"max {np.abs(a_bits - b_bits).max()} ulp")
        for workload, dim, gbps, (copy, t_default, t_other) in timed_workloads(
                [default, other], dtype, queue, args.workloads, args.dims, args.rounds,
                channels=channels):
            print(f"  {workload:22s} {dtype_name:9s} {dim:5d}  copy {gbps:5.1f}"
                  f" GB/s | {names[0]} (default) {t_default * 1e6:7.0f}us "
                  f"{100 * copy / t_default:5.1f}% copy | {names[1]} {t_other * 1e6:7.0f}us "
                  f"{100 * copy / t_other:5.1f}% copy | exact / fast time "
                  f"{(t_other / t_default if names[0] == 'fast' else t_default / t_other):.2f}",
                  flush=True)

if __name__ == "__main__":
    main()
