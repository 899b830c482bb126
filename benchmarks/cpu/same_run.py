"""Helpers of the same-run comparisons in this folder: kernel variants compiled in this
process, one step's launch packed once, and kernels timed in turn with the device copy
of the same bytes (profiling events, kernel time only). A variant with ``wide=True``
(16-bit dtypes) handles ``jitconv.kernels.abi.WIDE_CHANNELS`` channels per work-item: it is
launched over that many times fewer work-items (``variant_channels``). Needs
numba-dpex."""

import statistics

import numpy as np
import torch

from jitconv.bench import cpu as bench
from jitconv.backends.sycl import launching
from jitconv import reference
from jitconv.kernels.abi import WIDE_CHANNELS
from jitconv.testing.steps import DATA_KEYS, mixed_step


def compile_variant(width, dtype_name, queue, **options):
    """The SYCL kernel ``kernels.make_conv_kernel(width, dtype_name, **options)``,
    compiled by numba-dpex in this process and built for ``queue``."""
    import dpctl.program as dpp
    from numba.core.target_extension import target_override
    from jitconv.backends.sycl.kernels import make_conv_kernel
    launching.prepare_numba_dpex(queue)
    dispatcher = make_conv_kernel(width, dtype_name, **options)
    with target_override("dpex"):
        module = dispatcher.get_compile_result(
            launching._signature(width, dtype_name, queue)).kernel_device_ir_module
    program = dpp.create_program_from_spirv(queue, module.kernel_bitcode)
    return program.get_sycl_kernel(module.kernel_name)


def variant_channels(dtype_name, options):
    """Channels per work-item of the variant ``options`` (of ``compile_variant``)."""
    return WIDE_CHANNELS[dtype_name] if options.get("wide") else 1


def packed_launch(step, queue):
    """(values, grid, out, plan) of the step's launch with one channel per work-item,
    packed by a plan but not submitted (grid: (blocks, dim); a variant of C channels per
    work-item runs over (blocks, dim / C) with the same values). The values point into
    the plan's tables and into out: keep both alive while the values are submitted."""
    plan = bench.plan_of(step, queue)
    fits, launching.wide_fits = launching.wide_fits, lambda *args: False
    try:
        with bench._submits_recorded() as submitted:
            out = plan.run(**{k: step[k] for k in DATA_KEYS})
    finally:
        launching.wide_fits = fits
    _kernel, _queue, values, grid, _wait = submitted[-1]
    return values, grid, out, plan


def submitter(kernel, queue, values, grid):
    def submit():
        with launching.recording() as events:
            launching.submit_packed(kernel, queue, values, grid, False)
        return events
    return submit


def accuracy(kernel, dtype, queue, seed=5, channels=1):
    """Output of ``kernel`` on a random mixed step against the float64 reference:
    (output bits, max |error|, max of |error| / (atol + rtol |ref|): below 1 passes)."""
    step = mixed_step(torch.Generator().manual_seed(seed), dim=2048, width=4, dtype=dtype,
                      ns_lengths=[700, 33, 1, 1, 5], sp_lengths=[4, 4, 2], usm=True)
    ref, _ = reference.causal_conv1d_reference(
        **{**step, "conv_state": step["conv_state"].clone()})
    values, (blocks, dim), out, _plan = packed_launch(step, queue)
    for event in submitter(kernel, queue, values, (blocks, dim // channels))():
        event.wait()
    got = out.to(torch.float64).numpy()
    rtol, atol = reference.TOLERANCE[str(dtype).replace("torch.", "")]
    err = np.abs(got - ref)
    raw = out.contiguous().view(torch.int16 if out.element_size() == 2 else torch.int32)
    return raw.numpy().astype(np.int64), err.max(), (err / (atol + rtol * np.abs(ref))).max()


def time_in_turn(copy_submit, submits, rounds, min_time=0.5):
    """[copy, submit 0, submit 1, ...] median times over ``rounds`` x len(submits)
    rounds, each timing the copy then every submit in turn. The submits' order rotates
    every round: the kernel right after the copy runs up to ~10% slower (its dirty
    lines), so each takes that place equally often."""
    n = len(submits)
    results = []
    for r in range(rounds * n):
        k = r % n
        times = bench.median_kernel_times([copy_submit] + submits[k:] + submits[:k],
                                          min_time=min_time)
        results.append([times[0]] + [times[1 + (i - k) % n] for i in range(n)])
    return [statistics.median(row[i] for row in results) for i in range(n + 1)]


def timed_workloads(kernels, dtype, queue, workloads, dims, rounds, min_time=0.5,
                    channels=None):
    """For each workload (";"-separated names of jitconv.bench.cpu) and dim: (workload, dim,
    copy GB/s, [copy, kernel 0, kernel 1, ...] times) from ``time_in_turn``, every kernel
    launched on the same packed step (kernel i over dim / ``channels[i]`` work-items;
    default one channel each)."""
    channels = channels or [1] * len(kernels)
    for workload in workloads.split(";"):
        for dim in (int(d) for d in dims.split(",")):
            step = bench.make_step(workload, dim, dtype)
            moved = bench.bytes_moved(step)
            values, (blocks, _dim), _out, _plan = packed_launch(step, queue)
            copy_submit = bench.copy_submit(moved // 2, queue)
            subs = [submitter(k, queue, values, (blocks, dim // c))
                    for k, c in zip(kernels, channels)]
            times = time_in_turn(copy_submit, subs, rounds, min_time=min_time)
            yield workload, dim, moved / times[0] / 1e9, times
