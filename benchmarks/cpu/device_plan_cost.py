"""What a device plan's run costs on a SYCL device, beside a bare submit of the same conv
kernel, in the same process:

- bare submit: the conv kernel's remembered launch (the host plan's packed arguments)
  submitted through ``launching.submit_packed`` and waited for: the floor of any run;
- host plan: ``plan.run`` of a ``jitconv.plan`` (remembered: checks skipped);
- device plan: ``plan.run`` of a ``jitconv.device_plan`` on the same metadata, in USM
  tensors: one submit of the fused kernel, which computes its block records from the
  metadata (remembered);
- fused submit: that run's fused kernel, its remembered launch submitted and waited for
  (the bare submit of the kernel a device plan's run launches);
- planner + conv: the same device plan's run as where no fused kernel can be had: the
  planner's submit, then the conv kernel's (remembered: its own output tensor, so that
  its remembered launch is its own).

Each is wall time per call (host and device together: with torch CPU tensors every run
waits for its kernel), the median of rounds of ``--calls`` calls, all in turn within each
round. Ratios are against the bare submit of the same round, and the device plan's also
against the fused submit ("device/fused").

    python benchmarks/cpu/device_plan_cost.py [--dim 2048] [--calls 200] [--rounds 15]
"""

import argparse
import statistics
import time

import torch

import jitconv
from jitconv.backends.sycl import launching, planner, tables
from jitconv.backends.sycl.state import STATE as SYCL_STATE

WORKLOADS = {  # name: (decode sequences, spec sequences of 1 + 3 tokens)
    "decode 64": (64, 0),
    "spec 16 x (1+3)": (0, 16),
    "mixed 48 + 16 x (1+3)": (48, 16),
}


def usm(t):
    u = jitconv.empty(tuple(t.shape), t.dtype)
    u.copy_(t)
    return u


def step(decodes, specs, dim, dtype, gen):
    width, state_len = 4, 6
    tokens = decodes + 4 * specs
    lines = torch.randperm(decodes + specs + 8, generator=gen).to(torch.int32)
    md = {}
    if decodes:
        md["non_spec_state_indices"] = usm(lines[:decodes])
    if specs:
        md.update(spec_query_start_loc=usm(torch.arange(0, 4 * specs + 1, 4, dtype=torch.int32)),
                  spec_state_indices=usm(lines[decodes:decodes + specs]),
                  num_accepted_tokens=usm(torch.randint(1, 4, (specs,), generator=gen,
                                                        dtype=torch.int32)))
    host = {k: v.clone() for k, v in md.items()}
    if decodes:
        host["non_spec_query_start_loc"] = list(range(decodes + 1))
    num_lines = decodes + specs + 8
    layer = (usm(torch.randn(tokens, dim, generator=gen).to(dtype)),
             usm(torch.randn(dim, width, generator=gen).to(dtype)),
             usm(torch.randn(dim, generator=gen).to(dtype)),
             usm(torch.randn(num_lines, state_len, dim, generator=gen).to(dtype)).transpose(1, 2))
    geometry = (tokens, num_lines, state_len, width)
    return (jitconv.plan(*geometry, **host),
            jitconv.device_plan(*geometry, max_query_len=4 if specs else 1, **md), layer)


def timed(fn, calls):
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dim", type=int, default=2048)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    print(f"device {jitconv.get_device()}, dim {args.dim}, {args.dtype}; us per call "
          f"(median of {args.rounds} rounds of {args.calls} calls)")
    print(f"{'workload':24s} {'bare submit':>12s} {'host plan':>10s} {'fused submit':>13s} "
          f"{'device plan':>12s} {'planner+conv':>13s} {'host/bare':>10s} "
          f"{'device/bare':>12s} {'device/fused':>13s} {'planner/bare':>13s}")
    for name, (decodes, specs) in WORKLOADS.items():
        host_plan, device_plan, (x, w, b, state) = step(decodes, specs, args.dim, dtype,
                                                       torch.Generator().manual_seed(0))
        out = usm(torch.zeros(tuple(x.shape), dtype=dtype))
        SYCL_STATE.runs.clear()
        host_plan.run(x, w, b, state, out=out)  # checked, packed, remembered
        (entry,) = SYCL_STATE.runs.values()
        values = launching.with_tables(entry.values, tables.tables_on(host_plan, entry.queue))
        grid = (host_plan.num_blocks, entry.groups)

        def bare():
            launching.submit_packed(entry.kernel, entry.queue, values, grid, True)

        def host():
            host_plan.run(x, w, b, state, out=out)

        def device():
            device_plan.run(x, w, b, state, out=out)

        out_planner = usm(torch.zeros(tuple(x.shape), dtype=dtype))

        def planner_and_conv():
            device_plan.run(x, w, b, state, out=out_planner)

        fused_kernel = launching.fused_kernel
        launching.fused_kernel = lambda *a: None  # remembered as planner + conv
        planner_and_conv()
        launching.fused_kernel = fused_kernel
        device()  # checked, packed, remembered: the fused kernel's launch
        (fused,) = [e for e in SYCL_STATE.runs.values()
                    if len(e.values) > launching.CONV_PARAMS]
        table_args, record, _copies = planner.record_on(device_plan, fused.queue)
        fused_values = launching.with_record(fused.values, table_args, record)

        def fused_bare():
            launching.submit_packed(fused.kernel, fused.queue, fused_values,
                                    (device_plan.num_blocks, fused.groups), True)

        fns = (bare, host, fused_bare, device, planner_and_conv)
        for fn in fns:  # warm-up: builds, remembers
            timed(fn, 10)
        rounds = [[timed(fn, args.calls) for fn in fns] for _ in range(args.rounds)]
        med = [statistics.median(r[i] for r in rounds) for i in range(len(fns))]
        ratio = {(i, j): statistics.median(r[i] / r[j] for r in rounds)
                 for i, j in ((1, 0), (3, 0), (3, 2), (4, 0))}
        print(f"{name:24s} {med[0]:12.1f} {med[1]:10.1f} {med[2]:13.1f} {med[3]:12.1f} "
              f"{med[4]:13.1f} {ratio[1, 0]:10.2f} {ratio[3, 0]:12.2f} {ratio[3, 2]:13.2f} "
              f"{ratio[4, 0]:13.2f}", flush=True)
        device_plan.check_errors()


if __name__ == "__main__":
    main()
