"""Kernel variants of the CUDA backend timed in one process, in turn, beside vLLM's Triton
ops: the comparison the H200 notes call "same call" (a variant's effect is read against
its baseline timed minutes apart on the same GPU, not across machine calls).

    python3 benchmarks/h200/same_call.py --vllm-file .vllm/causal_conv1d.py \
        --out DIR --variant base:compact_args=0,fixed_block=0 \
        --variant new: [--workload "decode-only 64"] [--rounds 3] [--reps 60] \
        [--flush fill|synced-fill|queued]

A variant is NAME:FIELD=VALUE,... (tuning values, ``jitconv.kernels.tuning``: 0 / 1 for
the switches, numbers for the others; an empty list: the table's values). Each round times every variant, then vLLM's calls (without programmatic
dependent launch), on every workload, dtype and dim, with bench_gpu.device_time_us (L2
flushed before each repetition, median of --reps); the result per row is the median over
rounds. ``--flush synced-fill`` waits for the L2 flush to finish before each repetition's
call (the default, ``fill``, launches the call right behind it, as bench_gpu does), to see
whether a difference between kernels comes from starting behind the fill's writes.
``--flush queued`` has the GPU spin (``torch.cuda._sleep``, about 0.5 ms) before each
fill, so that the call is launched while the GPU is still busy and its kernels start right
behind the fill whatever the host spends per call (with ``fill`` a call whose host path
is longer than the fill starts on an idle GPU), as in an engine whose GPU runs behind its
host.
Outputs of every variant are compared bit for bit with the first variant's
(outputs and conv state) before timing. Writes DIR/same-call-YYYY-MM-DD.json (today's date;
add the short commit of the tree to the name when committing it) and prints a table.
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch

import jitconv
from jitconv.__main__ import _bits
from jitconv.bench.cpu import WORKLOADS, make_step
from jitconv.bench.gpu import _plan, device_time_us, load_vllm_triton, vllm_calls


def parse_variant(text):
    """NAME:FIELD=VALUE,... -> (name, settings): lowercase fields are tuning values
    (``jitconv.kernels.tuning``: 0 / 1 for the switches, numbers for the others),
    uppercase ones environment variables of a benchmark script (ablate.py's
    JITCONV_ABLATE)."""
    import dataclasses
    from jitconv.kernels import tuning
    fields = {f.name: f for f in dataclasses.fields(tuning.CudaTuning)}
    name, _, settings = text.partition(":")
    values = {"tuning": {}, "env": {}}
    for item in filter(None, settings.split(",")):
        field, _, value = item.partition("=")
        if field.isupper():
            values["env"][field] = value
            continue
        kind = fields[field].type if field in fields else int
        values["tuning"][field] = bool(int(value)) if kind in (bool, "bool") else int(value)
    return name, values


def with_env(values, fn):
    """``fn()`` with a variant's tuning values and environment variables."""
    from jitconv.kernels import tuning
    saved = {k: os.environ.get(k) for k in values["env"]}
    os.environ.update(values["env"])
    try:
        with tuning.override(**values["tuning"]):
            return fn()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def outputs(step, env):
    state = step["conv_state"].clone()
    out = with_env(env, lambda: jitconv.causal_conv1d_mixed(**dict(step, conv_state=state)))
    torch.cuda.synchronize()
    return _bits(out), _bits(state)


def _after_sync(fn):
    """``fn`` behind a wait for the GPU's earlier work (the flush): device_time_us counts
    only kernel durations, so the wait itself is not timed."""
    def run():
        torch.cuda.synchronize()
        return fn()
    return run


class QueuedFlush:
    """The fill behind a GPU spin: ``zero_()`` as the flush tensor's, for device_time_us
    (which counts the flush's GPU activities, spin included, and leaves them out)."""
    CYCLES = 1_000_000  # about 0.5 ms at the H200's clock: longer than a call's host path

    def __init__(self, tensor):
        self.tensor = tensor

    def zero_(self):
        torch.cuda._sleep(self.CYCLES)
        self.tensor.zero_()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm-file", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--variant", action="append", required=True)
    parser.add_argument("--workload", action="append")
    parser.add_argument("--dim", type=int, action="append")
    parser.add_argument("--dtype", action="append")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=60)
    parser.add_argument("--flush", choices=("fill", "synced-fill", "queued"), default="fill")
    args = parser.parse_args(argv)
    variants = [parse_variant(v) for v in args.variant]
    device = torch.device(jitconv.set_device("cuda:0"))
    vt = load_vllm_triton(args.vllm_file)
    vt._platform.is_arch_support_pdl = lambda: False
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=device)
    if args.flush == "queued":
        flush = QueuedFlush(flush)
    cases = []
    for dim in args.dim or (2048, 8192):
        for dtype_name in args.dtype or ("bfloat16", "float32"):
            for name in args.workload or WORKLOADS:
                step = make_step(name, dim, getattr(torch, dtype_name))
                first = outputs(step, variants[0][1])
                for vname, env in variants[1:]:
                    got = outputs(step, env)
                    same = all(torch.equal(a, b) for a, b in zip(first, got))
                    if not same:
                        sys.exit(f"{name} {dtype_name} {dim}: variant {vname} differs from "
                                 f"{variants[0][0]}")
                runs = {vname: (env, _plan(step)) for vname, env in variants}
                runs["vllm triton"] = ({}, vllm_calls(vt, step, device, gathers=False)[0])
                if args.flush == "synced-fill":
                    runs = {v: (env, _after_sync(fn)) for v, (env, fn) in runs.items()}
                cases.append(((name, dtype_name, dim), runs))
    times = {}
    for r in range(args.rounds):
        for key, runs in cases:
            for vname, (env, fn) in runs.items():
                us, _ = with_env(env, lambda: device_time_us(fn, flush, args.reps))
                times.setdefault(key, {}).setdefault(vname, []).append(us)
        print(f"round {r + 1} of {args.rounds} done", flush=True)
    rows = []
    base = variants[0][0]
    for (name, dtype_name, dim), by_variant in times.items():
        row = {"workload": name, "dtype": dtype_name, "dim": dim,
               "us": {v: statistics.median(t) for v, t in by_variant.items()},
               "rounds": by_variant}
        rows.append(row)
        cells = "  ".join(f"{v} {u:7.2f}" for v, u in row["us"].items())
        speed = "  ".join(f"{v}/{base} {row['us'][base] / row['us'][v]:.3f}x"
                          for v, _ in variants[1:])
        print(f"{name:22s} {dtype_name:8s} {dim:5d}  {cells}  {speed}  "
              f"triton/{base} {row['us']['vllm triton'] / row['us'][base]:.3f}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"same-call-{time.strftime('%Y-%m-%d')}.json")
    with open(path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "variants": dict(variants),
                   "reps": args.reps, "rounds": args.rounds, "flush": args.flush,
                   "rows": rows}, f, indent=1)
    print(f"wrote {path}", flush=True)


if __name__ == "__main__":
    main()
