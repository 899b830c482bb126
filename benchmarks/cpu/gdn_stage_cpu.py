"""The GDN stage on a SYCL device beside the conv alone and beside the conv followed by
the stage's post-conv work in torch (what a caller without the stage runs): wall time per
call, the sides taking turns, median of --reps. Every tensor is USM memory
(``jitconv.empty``: zero-copy on opencl:cpu) and each step's plan is built once: from
the second call on, the conv's and (since the commit after a05bf4a) the stage's runs are
remembered launches. The stage's outputs are checked against
the conv + torch side first. Results: docs/performance.md, "How fast is the GDN stage on
opencl:cpu?".

    python benchmarks/cpu/gdn_stage_cpu.py [--reps 30]
"""

import argparse
import os
import statistics
import time

# torch's OpenMP threads spin after each of its CPU ops (OMP_WAIT_POLICY's default) and
# take the cores from the OpenCL CPU runtime's threads: the "conv+torch" side's torch
# ops made the next jitconv launches about 2x slower on 2 cores (2026-12-07). Passive
# waiting keeps each side's time its own. Set before torch (and its OpenMP) loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

import jitconv  # noqa: E402

HEAD = 128
WORKLOADS = {"decode 64": ([1] * 64, []), "spec 64 x (1+3)": ([], [4] * 64),
             "prefill 2 x 512": ([512] * 2, []), "mixed 256 + 16 + 8 x 4": ([256] + [1] * 16, [4] * 8)}


def usm(t):
    return jitconv.empty(t.shape, t.dtype).copy_(t)


def step(gen, ns, sp, dim, dtype):
    H = dim // (4 * HEAD)
    HV = 2 * H
    T = sum(ns) + sum(sp)
    nseq = len(ns) + len(sp)
    cum = lambda n: torch.tensor([0] + torch.tensor(n).cumsum(0).tolist(), dtype=torch.int32)  # noqa: E731
    meta = {}
    if ns:
        meta.update(non_spec_query_start_loc=cum(ns),
                    non_spec_state_indices=torch.arange(len(ns), dtype=torch.int32),
                    has_initial_state=torch.ones(len(ns), dtype=torch.bool))
    if sp:
        meta.update(spec_query_start_loc=cum(sp),
                    spec_state_indices=torch.arange(len(ns), nseq, dtype=torch.int32),
                    num_accepted_tokens=torch.ones(len(sp), dtype=torch.int32))
    state_len = 3 + (max(sp) - 1 if sp else 0)
    data = dict(x=usm(torch.randn(T, dim, generator=gen).to(dtype)),
                weight=usm((torch.randn(dim, 4, generator=gen) * 0.5).to(dtype)),
                bias=usm((torch.randn(dim, generator=gen) * 0.1).to(dtype)),
                conv_state=usm(torch.randn(nseq, dim, state_len, generator=gen).to(dtype)))
    ab = usm(torch.randn(T, 2 * HV, generator=gen).to(dtype))
    gates = dict(a=ab[:, HV:], b=ab[:, :HV], A_log=usm(torch.randn(HV, generator=gen)),
                 dt_bias=usm(torch.randn(HV, generator=gen)))
    plan = jitconv.plan(T, nseq, state_len, 4, **meta)
    return plan, data, gates, dict(num_k_heads=H, head_k_dim=HEAD, head_v_dim=HEAD)


def torch_post(conv, a, b, A_log, dt_bias, H, HV):
    """The stage's post-conv work in torch, on one part's conv rows."""
    T = conv.shape[0]
    qk = H * HEAD
    q = conv[:, :qk].float().view(T, H, HEAD)
    k = conv[:, qk:2 * qk].float().view(T, H, HEAD)
    q = (q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6)).to(conv.dtype)
    k = (k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)).to(conv.dtype)
    v = conv[:, 2 * qk:].reshape(T, HV, HEAD).contiguous()
    g = -torch.exp(A_log) * torch.nn.functional.softplus(a.float() + dt_bias, threshold=20)
    return q, k, v, g, torch.sigmoid(b.float())


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--dim", type=int, default=2048)
    args = p.parse_args(argv)
    gen = torch.Generator().manual_seed(0)
    print(f"device {jitconv.get_device()}, dim {args.dim}, wall per call (us), median of {args.reps}")
    print(f"{'workload':<26}{'dtype':<10}{'stage':>9}{'conv':>9}{'conv+torch':>12}  stage/conv  stage/(conv+torch)")
    for dtype in (torch.float32, torch.bfloat16):
        for name, (ns, sp) in WORKLOADS.items():
            plan, data, gates, heads = step(gen, ns, sp, args.dim, dtype)
            H, HV = heads["num_k_heads"], 2 * heads["num_k_heads"]
            args4 = [data[k] for k in ("x", "weight", "bias", "conv_state")]
            gl = [gates[k] for k in ("a", "b", "A_log", "dt_bias")]

            def stage():
                return plan.run_stage(*args4, *gl, **heads)

            def conv():
                return plan.run(*args4, split=True)

            def conv_torch():
                out = conv()
                rows = {"non_spec": torch.arange(sum(ns)), "spec": torch.arange(sum(ns), sum(ns) + sum(sp))}
                return {part: torch_post(getattr(out, part), gates["a"][rows[part]], gates["b"][rows[part]],
                                         gates["A_log"], gates["dt_bias"], H, HV)
                        for part in ("spec", "non_spec") if getattr(out, part) is not None}
            state0 = data["conv_state"].clone()
            got, want = stage(), None
            data["conv_state"].copy_(state0)
            want = conv_torch()
            for part, (q, k, v, g, beta) in want.items():
                o = getattr(got, part)
                for mine, theirs in ((o.q, q), (o.k, k), (o.v, v), (o.g, g), (o.beta, beta)):
                    torch.testing.assert_close(mine.float(), theirs.float(), rtol=2e-2, atol=2e-2)
            times = {f: [] for f in ("stage", "conv", "conv_torch")}
            fns = {"stage": stage, "conv": conv, "conv_torch": conv_torch}
            for i in range(args.reps + 2):
                for key, fn in fns.items():
                    t0 = time.perf_counter()
                    fn()
                    if i >= 2:
                        times[key].append((time.perf_counter() - t0) * 1e6)
            m = {k: statistics.median(v) for k, v in times.items()}
            print(f"{name:<26}{str(dtype)[6:]:<10}{m['stage']:9.0f}{m['conv']:9.0f}{m['conv_torch']:12.0f}"
                  f"  {m['stage'] / m['conv']:10.2f}  {m['stage'] / m['conv_torch']:18.2f}", flush=True)


if __name__ == "__main__":
    main()
