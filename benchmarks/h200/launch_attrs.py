"""Decode-only 64 at dim 2048 (the one workload where vLLM's Triton update is faster):
jitconv's kernel timed under other launch attributes, beside vLLM's Triton kernel, in
one process (2026-12-02, commit d3c76b3; results in launch-attrs-2026-12-02-d3c76b3.txt and
same-call-2026-12-02-d3c76b3.json).

    python3 benchmarks/h200/launch_attrs.py .vllm/causal_conv1d.py

The question: does the Triton kernel start with an SM configuration that jitconv's
lacks? Nsight Compute's launch statistics show the same for both (grid 512, block 128,
no static or dynamic shared memory, 32 KiB shared-memory configuration, 1 KiB driver
shared memory, CachePreferNone), so this varies what a launch can set: the preferred
L1 / shared carveout of jitconv's kernel (0, 50, 100; -1 is the default) and dynamic
shared memory requested at launch (1 KiB, 16 KiB; with carveout 0). Each variant is timed as bench_gpu
times a call (256 MiB fill before each repetition, median of 60), 3 rounds, medians
printed; the kernels' attributes (registers, shared, local, carveout) are printed too.

Then both kernels with their code warm: the flush is the fill followed by the same
kernel's call on a second step of the same shapes (other tensors, so the timed call's
data are still flushed; device_time_us leaves the flush's activities out). If the
Triton kernel's lead came from fetching less code after the fill (which evicts code as
well as data), it would shrink here.
"""

import statistics
import sys

import torch

import jitconv
from jitconv.bench.cpu import make_step
from jitconv.bench.gpu import _plan, device_time_us, load_vllm_triton, vllm_calls

VARIANTS = (("base", 0, -1), ("carveout 0", 0, 0), ("carveout 100", 0, 100),
            ("carveout 50", 0, 50), ("dynamic shared 1 KiB", 1024, 0),
            ("dynamic shared 16 KiB", 16384, 0))


class SharedMemoryLaunches:
    """numba-cuda's compiled-kernel launch with ``sharedmem`` bytes of dynamic shared
    memory (cuda_backend passes 0); records the kernels it launched."""

    def __init__(self):
        import numba.cuda.dispatcher as dispatcher
        self.sharedmem, self.kernels = 0, set()
        launch = dispatcher._Kernel.launch

        def with_shared(kernel, args, griddim, blockdim, stream=0, sharedmem=0):
            self.kernels.add(kernel)
            return launch(kernel, args, griddim, blockdim, stream, self.sharedmem)
        dispatcher._Kernel.launch = with_shared

    def carveout(self, percent):
        for kernel in self.kernels:
            kernel._codelibrary.get_cufunc().set_shared_memory_carveout(percent)


class WarmFlush:
    """The fill, then ``warm()`` (the kernel on other tensors): ``zero_()`` as the
    flush tensor's, for device_time_us."""

    def __init__(self, tensor, warm):
        self.tensor, self.warm = tensor, warm

    def zero_(self):
        self.tensor.zero_()
        self.warm()


def main(vllm_file):
    device = torch.device(jitconv.set_device("cuda:0"))
    vt = load_vllm_triton(vllm_file)
    vt._platform.is_arch_support_pdl = lambda: False
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=device)
    launches = SharedMemoryLaunches()
    for dtype in (torch.bfloat16, torch.float32):
        step = make_step("decode-only 64", 2048, dtype)
        mine, theirs = _plan(step), vllm_calls(vt, step, device, gathers=False)[0]
        mine()
        torch.cuda.synchronize()
        for kernel in launches.kernels:
            print(dtype, "jitconv kernel", kernel._codelibrary.get_cufunc().attrs)
        times = {}
        for _ in range(3):
            for name, sharedmem, carveout in VARIANTS:
                launches.sharedmem = sharedmem
                launches.carveout(carveout)
                times.setdefault(name, []).append(device_time_us(mine, flush, 60)[0])
            launches.sharedmem = 0
            launches.carveout(-1)
            times.setdefault("vllm triton", []).append(device_time_us(theirs, flush, 60)[0])
        print(dtype, "  ".join(f"{name} {statistics.median(t):.2f} us"
                               for name, t in times.items()), flush=True)
        other = make_step("decode-only 64", 2048, dtype, seed=1)
        warm = {"jitconv": (mine, _plan(other)),
                "vllm triton": (theirs, vllm_calls(vt, other, device, gathers=False)[0])}
        times = {}
        for _ in range(3):
            for name, (fn, warm_fn) in warm.items():
                times.setdefault(name, []).append(
                    device_time_us(fn, WarmFlush(flush, warm_fn), 60)[0])
        print(dtype, "code warm:", "  ".join(f"{name} {statistics.median(t):.2f} us"
                                             for name, t in times.items()), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
