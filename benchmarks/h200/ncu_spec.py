"""Driver for Nsight Compute on a spec-verify step (64 sequences of 1 + 3 tokens,
bfloat16, dim 8192 by default): the conv kernel of a host plan and of a device plan (the
kernel that plans its own block), each run twice, L2 flushed before each. Profile it with,
for example:

    ncu --clock-control none --section SpeedOfLight --section WarpStateStats \
        --section SchedulerStats --section InstructionStats --section Occupancy \
        -k regex:jitconv python3 benchmarks/h200/ncu_spec.py [DIM]
"""

import sys

import torch

import jitconv


def main(dim=8192):
    dev = torch.device(jitconv.set_device("cuda:0"))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, dim, generator=g).to(torch.bfloat16).to(dev)
    w = torch.randn(dim, 4, generator=g).to(torch.bfloat16).to(dev)
    b = torch.randn(dim, generator=g).to(torch.bfloat16).to(dev)
    state = torch.randn(129, 6, dim, generator=g).to(torch.bfloat16).to(dev).transpose(1, 2)
    lines = torch.randperm(128, generator=g)[:64].to(torch.int32).add_(1).to(dev)
    qsl = torch.arange(0, 257, 4, dtype=torch.int32, device=dev)
    accepted = torch.randint(1, 5, (64,), generator=g, dtype=torch.int32).to(dev)
    host = jitconv.plan(256, 129, 6, 4, spec_query_start_loc=qsl.cpu(),
                        spec_state_indices=lines.cpu(), num_accepted_tokens=accepted.cpu())
    device = jitconv.device_plan(256, 129, 6, 4, spec_query_start_loc=qsl,
                                 spec_state_indices=lines, num_accepted_tokens=accepted,
                                 max_query_len=4)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    out = torch.empty_like(x)
    with torch.inference_mode():
        for p in (host, device, host, device):
            flush.zero_()
            p.run(x, w, b, state, out=out)
            torch.cuda.synchronize()


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:2]))
