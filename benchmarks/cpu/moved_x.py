"""Host time of a remembered run whose x is at a new address at every call (an engine's
x: a projection's output, a part gathered by index_select), against one whose x stays,
on the device ``jitconv`` selects (opencl:cpu here). A decode step of ``--batch``
sequences (64), dim ``--dim`` (2048; small ones leave the host's part), float32, one
plan; x cycles through ``--buffers`` USM tensors of jitconv's
pool (600: more than the SYCL run cache's 512 entries, so a cache keyed by x's address
finds none of them). Median microseconds per call of 2000 calls, each waited for.

    PYTHONPATH=$PWD python3 benchmarks/cpu/moved_x.py [--buffers 600] [--dim 2048] [--batch 64]
"""

import argparse
import statistics
import time

import torch

import jitconv


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--buffers", type=int, default=600)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--dim", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    dim, batch, state_len = args.dim, args.batch, 3
    lines = batch + 16
    gen = torch.Generator().manual_seed(1)
    idx = torch.randperm(lines, generator=gen)[:batch]
    plan = jitconv.plan(batch, lines, state_len, 4, non_spec_state_indices=idx,
                        non_spec_query_start_loc=torch.arange(batch + 1))
    weight = jitconv.empty((dim, 4))
    weight.copy_(torch.randn(dim, 4, generator=gen))
    bias = jitconv.empty((dim,))
    bias.copy_(torch.randn(dim, generator=gen))
    state = jitconv.empty((lines, dim, state_len))
    state.copy_(torch.randn(lines, dim, state_len, generator=gen))
    xs = []
    for _ in range(args.buffers):
        x = jitconv.empty((batch, dim))
        x.copy_(torch.randn(batch, dim, generator=gen))
        xs.append(x)
    out = jitconv.empty((batch, dim))

    def timed(pick):
        times = []
        for i in range(args.calls + 50):
            x = pick(i)
            t0 = time.perf_counter()
            plan.run(x, weight, bias, state, out=out)
            if i >= 50:
                times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1e6

    same = timed(lambda i: xs[0])
    moving = timed(lambda i: xs[i % len(xs)])
    print(f"device {jitconv.get_device()}, dim {dim}, batch {batch}: same x {same:.1f} us per call, "
          f"x at one of {len(xs)} addresses in turn {moving:.1f} us per call")


if __name__ == "__main__":
    main()
