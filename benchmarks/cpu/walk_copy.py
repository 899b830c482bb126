"""How fast a kernel can walk memory the way the conv kernel does, with no arithmetic:
copy kernels (numba-dpex, plain loads and stores, float32) whose work-item is one
channel of a block of B consecutive rows (the conv kernel's index space: channel, block),
against the device memcpy of the same bytes, on the prefill-heavy step's shape (4096
rows; dim 2048 and 8192). Also: B = 16 in an nd-range of work-groups of L channels with a
work-group barrier after every 4 rows. Wall time of submit + wait (the kernels take
milliseconds; ``bench.median_time``) per round, rounds rotated; outputs checked.

On opencl:cpu the runtime runs a work-group's vectors of lanes one after another, each
through all B rows of its block: B rows of x and B of out are walked at once (2B
streams). Needs numba-dpex.

    python benchmarks/cpu/walk_copy.py [--dims 2048,8192] [--rounds 3] [--group 1024]
"""

import argparse
import statistics

import numpy as np

from jitconv.bench import cpu as bench  # also the virtual environment's import setup


def kernels():
    import numba_dpex as dpex
    from numba_dpex import kernel_api as kapi

    @dpex.kernel
    def copy_flat(item, x, out):
        i = item.get_id(0)
        out[i] = x[i]

    @dpex.kernel
    def copy_walk(item, x, out, dim, rows_per):
        c = item.get_id(0)
        b = item.get_id(1)
        for i in range(rows_per):
            at = np.uint64((b * rows_per + i) * dim + c)
            out[at] = x[at]

    @dpex.kernel
    def copy_walk_barrier(nd, x, out, dim, rows_per, every):
        c = nd.get_global_id(0)
        b = nd.get_global_id(1)
        for i in range(rows_per):
            at = np.uint64((b * rows_per + i) * dim + c)
            out[at] = x[at]
            if i % every == every - 1:  # uniform: every work-item of a group has this b
                kapi.group_barrier(nd.get_group())

    return copy_flat, copy_walk, copy_walk_barrier


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dims", default="2048,8192")
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--group", type=int, default=1024, help="work-group size L of the barrier run")
    p.add_argument("--device", default="opencl:cpu")
    args = p.parse_args()
    if args.rows % 16 or args.rows <= 0:
        p.error(f"--rows must be a positive multiple of 16 (the longest block), got {args.rows}")
    import dpctl
    import dpctl.tensor as dpt
    import numba_dpex as dpex

    queue = dpctl.SyclQueue(args.device)
    copy_flat, copy_walk, copy_walk_barrier = kernels()
    rows = args.rows
    print(f"device: {queue.sycl_device.filter_string}; float32, {rows} rows; wall time")
    for dim in (int(d) for d in args.dims.split(",")):
        n = rows * dim
        host = np.random.default_rng(0).standard_normal(n, dtype=np.float32)
        x = dpt.asarray(host, sycl_queue=queue)
        out = dpt.asarray(np.ones(n, np.float32), sycl_queue=queue)  # filled: real pages
        runs = {"memcpy": lambda: queue.memcpy(out.usm_data, x.usm_data, 4 * n),
                "flat": lambda: dpex.call_kernel(copy_flat, dpex.Range(n), x, out)}
        for B in (4, 8, 16):
            runs[f"B{B}"] = (lambda B=B: dpex.call_kernel(
                copy_walk, dpex.Range(dim, rows // B), x, out, dim, B))
        if dim % args.group == 0:
            runs[f"B16 barrier/4 L{args.group}"] = lambda: dpex.call_kernel(
                copy_walk_barrier, dpex.NdRange(dpex.Range(dim, rows // 16),
                                                dpex.Range(args.group, 1)),
                x, out, dim, 16, 4)
        for name, run in runs.items():
            out.usm_data.memset(0)
            run()
            queue.wait()
            if not np.array_equal(dpt.asnumpy(out), host):
                raise AssertionError(f"{name}: out differs from x")
        names = list(runs)
        times = {name: [] for name in names}
        for r in range(args.rounds * len(names)):
            k = r % len(names)
            for name in names[k:] + names[:k]:
                run = runs[name]
                times[name].append(bench.median_time(lambda: (run(), queue.wait())))
        t = {name: statistics.median(v) for name, v in times.items()}
        moved = 2 * 4 * n
        print(f"dim {dim} ({moved / 2 ** 20:.0f} MiB read + written): " + " | ".join(
            f"{name} {t[name] * 1e3:.2f} ms {100 * t['memcpy'] / t[name]:.0f}%" for name in names),
            flush=True)


if __name__ == "__main__":
    main()
