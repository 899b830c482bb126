"""Same-run comparison of two builds of the SYCL kernel, by default without and with its
stride-specific reads (the template's ``unit_stride_reads``: unit-stride state window
and bias, a width-4 16-bit weight's taps as one 64-bit word). ``--before``/``--after``
set other values of the SYCL backend's flags (``kernels.make_conv_kernel``; ``key=0|1``,
comma-separated, e.g. ``--before "" --after one_round_record=1,reuse_state_loads=1``).
Both are compiled in this process and timed in turn with the device copy of the same
bytes on the benchmark's workloads (jitconv.bench.cpu), the order rotated every round.
Outputs of both are compared bit for bit. Needs numba-dpex.

    python benchmarks/cpu/kernel_variants.py [--before ...] [--after ...] [--dims 2048,8192]
        [--dtypes ...] [--rounds 3]
"""

import argparse

import numpy as np
import torch

from jitconv.bench import cpu as bench
from same_run import accuracy, compile_variant, timed_workloads, variant_channels


def _options(text):
    """``key=0|1,...`` as keyword arguments of kernels.make_conv_kernel."""
    options = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        if value not in ("0", "1"):
            raise argparse.ArgumentTypeError(f"{item!r}: expected key=0 or key=1")
        options[key.strip()] = value == "1"
    return options


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dims", default="2048,8192")
    p.add_argument("--dtypes", default="bfloat16,float16,float32")
    p.add_argument("--workloads", default="prefill-heavy 4x1024;mixed step")
    p.add_argument("--rounds", type=int, default=3, help="rounds per kernel order")
    p.add_argument("--before", default="unit_stride_reads=0", type=_options)
    p.add_argument("--after", default="", type=_options)
    args = p.parse_args()
    queue = bench.profiling_queue()
    width = 4
    print(f"device: {queue.sycl_device.filter_string}; kernel times from profiling events; "
          f"before = {args.before or 'default'}, after = {args.after or 'default'}")
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        kernels = [compile_variant(width, dtype_name, queue, **options)
                   for options in (args.before, args.after)]
        channels = [variant_channels(dtype_name, o) for o in (args.before, args.after)]
        (a_bits, a_err, _), (b_bits, b_err, _) = (accuracy(k, dtype, queue, channels=c)
                                                  for k, c in zip(kernels, channels))
        print(f"{dtype_name}: max err vs float64 reference before {a_err:.3g}, after "
              f"{b_err:.3g}; outputs bit-identical: {bool(np.array_equal(a_bits, b_bits))}")
        for workload, dim, gbps, (copy, before, after) in timed_workloads(
                kernels, dtype, queue, args.workloads, args.dims, args.rounds, min_time=0.4,
                channels=channels):
            print(f"  {workload:22s} {dtype_name:9s} {dim:5d}  copy {gbps:5.1f} GB/s | "
                  f"before {before * 1e6:7.0f}us {100 * copy / before:5.1f}% copy | after "
                  f"{after * 1e6:7.0f}us {100 * copy / after:5.1f}% copy | before / after "
                  f"{before / after:.2f}", flush=True)

if __name__ == "__main__":
    main()
