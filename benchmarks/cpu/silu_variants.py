"""Same-run comparison of silu's two SYCL variants (kernel_abi.fast_silu) on one device:
the default kernels (as jitconv picks them: shipped, cache or compiled) and the other
variant of each dtype, compiled here, timed in turn within every repetition with the
device copy of the same bytes (profiling events, kernel time only), on the benchmark's
own workloads (jitconv.bench.make_step). Also the outputs of both against the float64
reference. Needs numba-dpex (the other variant is compiled in this process).

    python benchmarks/cpu/silu_variants.py [--dims 2048,8192] [--dtypes ...] [--rounds 3]
"""

import argparse
import statistics

import numpy as np
import torch

import jitconv
from jitconv import bench, launching, reference
from jitconv.kernel_abi import fast_silu
from jitconv.steps import DATA_KEYS, mixed_step


def compile_variant(width, dtype_name, fast, queue):
    """The SYCL kernel of one silu variant, compiled by numba-dpex in this process."""
    import dpctl.program as dpp
    from numba.core.target_extension import target_override
    from jitconv.kernels import make_conv_kernel
    launching._prepare_numba_dpex()
    dispatcher = make_conv_kernel(width, dtype_name, fast=fast)
    with target_override("dpex"):
        module = dispatcher.get_compile_result(
            launching._signature(width, dtype_name, queue)).kernel_device_ir_module
    program = dpp.create_program_from_spirv(queue, module.kernel_bitcode)
    return program.get_sycl_kernel(module.kernel_name)


def packed_launch(step, queue):
    """(values, grid, out) of the step's launch, packed by a plan but not submitted."""
    plan = bench.plan_of(step, queue)
    with bench._submits_recorded() as submitted:
        out = plan.run(**{k: step[k] for k in DATA_KEYS})
    _kernel, _queue, values, grid, _wait = submitted[-1]
    return values, grid, out


def submitter(kernel, queue, values, grid):
    def submit():
        with launching.recording() as events:
            launching.submit_packed(kernel, queue, values, grid, False)
        return events
    return submit


def accuracy(kernel, dtype, queue, seed=5):
    """Output of ``kernel`` on a random mixed step against the float64 reference:
    (output, max |error|, max of |error| / (atol + rtol |ref|): below 1 passes)."""
    step = mixed_step(torch.Generator().manual_seed(seed), dim=2048, width=4, dtype=dtype,
                      ns_lengths=[700, 33, 1, 1, 5], sp_lengths=[4, 4, 2], usm=True)
    ref, _ = reference.causal_conv1d_reference(
        **{**step, "conv_state": step["conv_state"].clone()})
    values, grid, out = packed_launch(step, queue)
    for event in submitter(kernel, queue, values, grid)():
        event.wait()
    got = out.to(torch.float64).numpy()
    rtol, atol = reference.TOLERANCE[str(dtype).replace("torch.", "")]
    err = np.abs(got - ref)
    raw = out.contiguous().view(torch.int16 if out.element_size() == 2 else torch.int32)
    return raw.numpy().astype(np.int64), err.max(), (err / (atol + rtol * np.abs(ref))).max()


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
        default = launching.get_conv_kernel(width, dtype_name, queue)
        other = compile_variant(width, dtype_name, not fast_silu(dtype_name), queue)
        names = ["fast" if fast_silu(dtype_name) else "exact",
                 "exact" if fast_silu(dtype_name) else "fast"]
        a_bits, a_err, a_use = accuracy(default, dtype, queue)
        b_bits, b_err, b_use = accuracy(other, dtype, queue)
        print(f"{dtype_name}: default = {names[0]}; vs float64 reference: {names[0]} max err "
              f"{a_err:.3g} ({a_use:.2f} of tolerance), {names[1]} {b_err:.3g} "
              f"({b_use:.2f}); outputs differing: {100 * (a_bits != b_bits).mean():.2f}%, "
              f"max {np.abs(a_bits - b_bits).max()} ulp")
        for workload in args.workloads.split(";"):
            for dim in (int(d) for d in args.dims.split(",")):
                step = bench.make_step(workload, dim, dtype)
                moved = bench.bytes_moved(step)
                values, grid, _out = packed_launch(step, queue)
                copy_submit = bench.copy_submit(moved // 2, queue)
                kernels = [submitter(default, queue, values, grid),
                           submitter(other, queue, values, grid)]
                # The kernel right after the copy runs up to ~10% slower (the copy's
                # dirty lines): every other round swaps the two kernels' order.
                rounds = []
                for r in range(2 * args.rounds):
                    order = kernels if r % 2 == 0 else kernels[::-1]
                    times = bench.median_kernel_times([copy_submit] + order, min_time=0.5)
                    rounds.append(times if r % 2 == 0 else [times[0]] + times[:0:-1])
                copy, t_default, t_other = (statistics.median(r[i] for r in rounds)
                                            for i in range(3))
                print(f"  {workload:22s} {dtype_name:9s} {dim:5d}  copy {moved / copy / 1e9:5.1f}"
                      f" GB/s | {names[0]} (default) {t_default * 1e6:7.0f}us "
                      f"{100 * copy / t_default:5.1f}% copy | {names[1]} {t_other * 1e6:7.0f}us "
                      f"{100 * copy / t_other:5.1f}% copy | exact / fast time "
                      f"{(t_other / t_default if names[0] == 'fast' else t_default / t_other):.2f}",
                      flush=True)


if __name__ == "__main__":
    main()
