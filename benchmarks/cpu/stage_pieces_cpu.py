"""Where the GDN stage kernel's time goes on a SYCL CPU device: the stage (``plan.run_stage``
on a plan built once, remembered runs) with pieces of its kernel left out or written the
way an earlier commit wrote them, wall per call, median of --reps, for the workloads of
``gdn_stage_cpu.py`` at dim 2048. One variant per process (a process compiles one stage
kernel per dtype); run the variants in turn, several times, and compare the lines.

    python benchmarks/cpu/stage_pieces_cpu.py VARIANT [--reps 30]

VARIANT: "base" (the kernel as shipped); "without-gates", "without-norm",
"without-offsets" (outputs at x's offsets), "without-all" (the three): timing only, the
outputs are wrong, so the device check is turned off for the process; "divisions" (the
channel index divided by the head dims with ``//`` and ``%``, as before 2026-12-07:
outputs right, checked). Results: docs/performance.md, "How fast is the GDN stage on
opencl:cpu?".
"""

import argparse
import os
import statistics
import sys
import time

VARIANTS = ("base", "without-gates", "without-norm", "without-offsets", "without-all",
            "divisions")


def _patch(variant):
    """Override the template's stage pieces for ``variant`` (before any kernel is built)."""
    from jitconv.kernels import template as T
    gates, norm, offsets = T._Kernel.gates, T._Kernel.norm_pass, T._Kernel.stage_offsets
    if variant in ("without-gates", "without-all"):
        T._Kernel.gates = lambda self, depth: ""
    if variant in ("without-norm", "without-all"):
        T._Kernel.norm_pass = lambda self: ""
    if variant in ("without-offsets", "without-all"):
        plain = ["qk2 = 2 * qk", "sb = out_offset", "tp = part_rows", "go = gates_offset",
                 "lfrom = l2norm_from", "ors = out_row_stride"]
        T._Kernel.stage_offsets = lambda self: (
            "\n".join(T._indent(plain, 1)) + "\n" if self.stage else offsets(self))
    if variant == "divisions":
        T._Kernel.gates = lambda self, depth: gates(self, depth).replace(
            "((c - qk2) * head_v_magic) >> head_v_shift", "(c - qk2) // head_v").replace(
            "nhv = v_heads", "nhv = vdim // head_v")
        T._Kernel.norm_pass = lambda self: norm(self).replace(
            "((c * head_k_magic) >> head_k_shift) * head_k", "c - c % head_k")


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("variant", choices=VARIANTS)
    p.add_argument("--reps", type=int, default=30)
    args = p.parse_args(argv)
    if args.variant.startswith("without"):
        os.environ["JITCONV_DEVICE_CHECK"] = "0"  # wrong outputs by design: timing only
    _patch(args.variant)
    import torch
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import gdn_stage_cpu as cpu
    gen = torch.Generator().manual_seed(0)
    times = []
    for dtype in (torch.float32, torch.bfloat16):
        for name, (ns, sp) in cpu.WORKLOADS.items():
            plan, data, gates, heads = cpu.step(gen, ns, sp, 2048, dtype)
            call = [data[k] for k in ("x", "weight", "bias", "conv_state")] + \
                [gates[k] for k in ("a", "b", "A_log", "dt_bias")]
            plan.run_stage(*call, **heads)
            walls = []
            for _ in range(args.reps):
                t0 = time.perf_counter()
                plan.run_stage(*call, **heads)
                walls.append(time.perf_counter() - t0)
            times.append(f"{name} {str(dtype)[6:]} {statistics.median(walls) * 1e6:.0f}")
    print(f"{args.variant}: " + "; ".join(times), flush=True)


if __name__ == "__main__":
    main()
