"""Driver for Nsight Compute on the decode-only launch (bench workload "decode-only 64",
dim 2048 by default): jitconv's default kernel and vLLM's Triton causal_conv1d_update
(without programmatic dependent launch), each run twice per dtype, L2 flushed before
each. Profile it with, for example:

    ncu --clock-control none --set full --warp-sampling-interval 0 \
        -k regex:"jitconv|causal_conv1d_update" -o OUT/decode \
        python3 benchmarks/h200/ncu_decode.py .vllm/causal_conv1d.py [DIM]
"""

import sys

import torch

import jitconv
from jitconv.bench.cpu import make_step
from jitconv.bench.gpu import _plan, load_vllm_triton, vllm_calls


def main(vllm_file, dim=2048):
    device = torch.device(jitconv.set_device("cuda:0"))
    vt = load_vllm_triton(vllm_file)
    vt._platform.is_arch_support_pdl = lambda: False
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=device)
    for dtype in (torch.bfloat16, torch.float32):
        step = make_step("decode-only 64", dim, dtype)
        mine, theirs = _plan(step), vllm_calls(vt, step, device, gathers=False)[0]
        for fn in (mine, theirs, mine, theirs):
            flush.zero_()
            fn()
            torch.cuda.synchronize()


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:3]))
