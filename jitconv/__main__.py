"""Command line: ``python -m jitconv demo`` (the main job: one verified mixed engine step)
and ``python -m jitconv info`` (versions and devices)."""

import argparse
import dataclasses
import json
import os
import platform
import sys
import time

import numpy as np
import torch

import jitconv
from jitconv import reference
from jitconv.backends.cuda import launching as cuda_launching, source as cuda_source
from jitconv.backends.sycl import (bootstrap, device_check, kernel_cache, launching, planner,
                                   source)
from jitconv.bench import cpu as benchmark
from jitconv.testing.steps import mixed_step, split_step
from jitconv.backends.sycl.state import STATE as SYCL_STATE


def info(_args):
    from importlib.metadata import PackageNotFoundError, version

    print(f"jitconv {jitconv.__version__}  (python {platform.python_version()}, "
          f"{platform.machine()})")
    for pkg in ("torch", "numpy", "numba", "llvmlite", "numba-dpex", "dpctl", "dpnp",
                "intel-sycl-rt", "intel-opencl-rt"):
        try:
            print(f"  {pkg:16s} {version(pkg)}")
        except PackageNotFoundError:
            print(f"  {pkg:16s} not installed")
    print(f"runtime libraries: {bootstrap.runtime_lib_dir()} "
          f"({len(bootstrap.RUNTIME.preloaded)} preloaded by jitconv)")
    for var in ("JITCONV_DEVICE", "ONEAPI_DEVICE_SELECTOR", "OCL_ICD_FILENAMES",
                "LD_LIBRARY_PATH", bootstrap.CPU_TARGET_VARIABLE):
        print(f"  {var}={os.environ.get(var, '')}")
    vendor, flags = bootstrap.host_cpu()
    target = bootstrap.cpu_target_arch(vendor, flags) if vendor else None
    set_by_us = bootstrap.RUNTIME.cpu_target_set
    print(f"host CPU: {vendor or 'unknown'}; CPU runtime target: "
          + (f"{set_by_us} (set by jitconv)" if set_by_us
             else f"{os.environ[bootstrap.CPU_TARGET_VARIABLE]} (set before jitconv; "
                  f"jitconv's choice would be {target or 'none'})"
             if bootstrap.CPU_TARGET_VARIABLE in os.environ
             else "the runtime's own choice"))
    print(f"device check: {'on' if device_check.ENABLED else 'OFF (JITCONV_DEVICE_CHECK=0)'}"
          f", verdicts in {device_check.verdict_dir()}")
    print(f"devices: {jitconv.devices()}")
    print(f"current device: {jitconv.get_device()}")
    for directory in kernel_cache.search_dirs():
        count = len(list(directory.glob("*.spv"))) if directory.exists() else 0
        print(f"kernel cache: {directory} ({count} SPIR-V files)")
    compiler = launching.have_compiler()
    print(f"numba-dpex available to compile missing kernels: {compiler}")
    print("where each kernel comes from (shipped with the package / user cache / "
          "compiled on first use):")
    for width, dtype, wide, fast, where in kernel_origins(compiler):
        print(f"  width {width} {dtype:9s} {_math_name(fast)} {'wide ' if wide else ''}"
              f"{where}")
    print("fused kernels of device plans (one submit per run; where one is missing and "
          "cannot be compiled, a device plan submits its planner first):")
    for width, dtype, wide, fast, types, where in fused_origins(compiler):
        print(f"  width {width} {dtype:9s} {_math_name(fast)} {'wide ' if wide else ''}"
              f"{_types_name(types)} {where}")
    for path, reason in SYCL_STATE.rejected:
        print(f"  ignored {path}: {reason}")
    return 0


def _math_name(fast):
    return "fast " if fast else "exact"


def _types_name(record_types):
    """A fused kernel's metadata types: cache lines' / flags' (the others are the lines')."""
    return f"metadata {record_types[1]}/{record_types[2]}"


def _where(entry, compiler, missing):
    """Where a kernel's SPIR-V comes from: its cache entry, a compile, or ``missing``."""
    if entry is not None:
        return f"{kernel_cache.origin(entry[2])} ({entry[2]})"
    return "compiled on first use (numba-dpex)" if compiler else missing


def kernel_origins(compiler):
    """(width, dtype, wide, fast, where its SPIR-V comes from) for every supported
    specialization (``kernel_cache.specializations``)."""
    return [(width, dtype, wide, fast,
             _where(kernel_cache.load(width, dtype, wide, fast), compiler,
                    "MISSING: no SPIR-V and no numba-dpex to compile it"))
            for width, dtype, wide, fast in kernel_cache.specializations()]


def fused_origins(compiler):
    """(width, dtype, wide, fast, record types, where) of each shipped fused kernel
    (``kernel_cache.fused_specializations``); a missing one is not an error: device plans
    then run their planner first."""
    return [(width, dtype, wide, fast, types,
             _where(kernel_cache.load(width, dtype, wide, fast, types), compiler,
                    "not available: device plans run their planner first"))
            for width, dtype, wide, fast, types in kernel_cache.fused_specializations()]


def _demo_step(gen, dim, width, dtype, mtp_k=3):
    """One engine step of a hybrid model with MTP speculative decoding and chunked
    prefill, as vLLM schedules it: prefill chunks (two continue from cached state, one
    starts fresh), plain decodes, spec verify sequences of 1+k tokens, one padded slot of
    each kind, token rows interleaved. conv_state in vLLM's (lines, state_len, dim)
    storage with room for the spec window (state_len = width - 1 + k), in USM memory."""
    prefill, decodes, spec, num_lines = [640, 512, 256], 24, 16, 96
    ns_lengths = prefill + [1] * (decodes + 1)   # one of them padded
    sp_lengths = [1 + mtp_k] * (spec + 1)        # one of them padded
    step = mixed_step(
        gen, dim=dim, width=width, dtype=dtype, ns_lengths=ns_lengths,
        sp_lengths=sp_lengths, rows="shuffled", ns_pads=1, sp_pads=1,
        initial=[True, True, False] + [True] * (decodes + 1),  # a new request's chunk
        spec_columns=1 + mtp_k,  # vLLM's (Q, 1+k) block table
        state_len=width - 1 + mtp_k, extra_lines=num_lines - len(ns_lengths) - len(sp_lengths),
        usm=True)
    num_tokens = sum(ns_lengths) + sum(sp_lengths)
    summary = (f"{len(prefill)} prefill chunks {prefill} (2 continue from cached state, 1 "
               f"fresh), {decodes} decodes, {spec} spec verify sequences of 1+{mtp_k} "
               f"tokens (MTP), 1 padded slot of each kind; {num_tokens} tokens with spec "
               f"and non-spec rows interleaved")
    return step, summary


def _bits(t):
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)


def _verify(out, state, ref_out, ref_state):
    """(max |error|, outputs within the dtype's tolerance, state bit-exact)."""
    rtol, atol = reference.TOLERANCE[str(out.dtype).replace("torch.", "")]
    err = np.abs(out.to(torch.float64).numpy() - ref_out)
    out_ok = bool(np.all(err <= atol + rtol * np.abs(ref_out)))
    state_ok = torch.equal(_bits(state), _bits(torch.from_numpy(ref_state).to(state.dtype)))
    return float(err.max()), out_ok, state_ok


def demo(args):
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16,
             "float32": torch.float32}[args.dtype]
    gen = torch.Generator().manual_seed(args.seed)
    step, summary = _demo_step(gen, args.dim, args.width, dtype)
    print(f"device: {jitconv.get_device()}  (available: {jitconv.devices()})")
    print(f"step: {summary}")
    print(f"      conv_dim {args.dim}, width {args.width}, {args.dtype}, conv_state "
          f"{tuple(step['conv_state'].shape)} viewed from (lines, state_len, dim) storage")

    state_before = step["conv_state"].clone()
    ref_out, ref_state = reference.causal_conv1d_reference(**step)
    jitconv.reset_copy_counts()
    t0 = time.perf_counter()
    out = jitconv.causal_conv1d_mixed(**step)
    cold = time.perf_counter() - t0

    rtol, atol = reference.TOLERANCE[args.dtype]
    err, out_ok, state_ok = _verify(out, step["conv_state"], ref_out, ref_state)
    print(f"one call, one kernel launch: max |error| vs float64 reference = {err:.3g}"
          f" (tolerance {atol} + {rtol}*|ref|): {'OK' if out_ok else 'FAILED'}")
    print(f"conv_state: {'bit-exact' if state_ok else 'MISMATCH'} vs reference (every line,"
          f" including pads and unused lines); copies: {jitconv.copy_counts()}")

    # The same step as two calls (non-spec part, then spec part) from the same state.
    # In USM memory like the step's own state: both ways run zero-copy.
    split_state = jitconv.empty(tuple(state_before.transpose(1, 2).shape),
                                state_before.dtype).transpose(1, 2)
    split_state.copy_(state_before)
    non_spec, spec = split_step(step, conv_state=split_state)
    out_ns = jitconv.causal_conv1d_mixed(**non_spec)
    out_sp = jitconv.causal_conv1d_mixed(**spec)
    ns_rows = non_spec["non_spec_token_indx"].long()
    sp_rows = spec["spec_token_indx"].long()
    same = (torch.equal(_bits(out[ns_rows]), _bits(out_ns[ns_rows]))
            and torch.equal(_bits(out[sp_rows]), _bits(out_sp[sp_rows]))
            and torch.equal(_bits(split_state), _bits(step["conv_state"])))
    print(f"same step as two calls (non-spec, then spec): outputs and states "
          f"{'bit-identical' if same else 'DIFFER'}")

    reps = args.reps
    timings = {}
    for name, calls in (("one call", [step]), ("two calls", [non_spec, spec])):
        t0 = time.perf_counter()
        for _ in range(reps):
            for kwargs in calls:
                jitconv.causal_conv1d_mixed(**kwargs)
        timings[name] = (time.perf_counter() - t0) / reps
    num_tokens = step["x"].shape[0]
    moved = 2 * num_tokens * args.dim * out.element_size()  # read x, write out
    how = ("includes the JIT compile" if SYCL_STATE.stats["compiled"]
           else "kernel loaded from the SPIR-V cache")
    print(f"time: first call {cold * 1e3:.0f} ms ({how}); warm one call "
          f"{timings['one call'] * 1e3:.2f} ms ({moved / timings['one call'] / 1e9:.2f} "
          f"GB/s effective), two calls {timings['two calls'] * 1e3:.2f} ms "
          f"(mean of {reps}; the state keeps evolving, only time matters here)")
    ok = out_ok and state_ok and same
    print("demo: VERIFIED" if ok else "demo: FAILED")
    return 0 if ok else 1


def device_checks(queue):
    """The device check (``jitconv.backends.sycl.device_check``) of every kernel jitconv may launch on
    ``queue``'s device, run now whatever the stored verdicts say: prints one verdict per
    kernel and returns how many failed."""
    failed = 0
    print(f"device check on {queue.sycl_device.filter_string} ({queue.sycl_device.name}, "
          f"driver {queue.sycl_device.driver_version}); verdicts kept in "
          f"{device_check.verdict_dir()}"
          + ("" if device_check.ENABLED else "; the automatic check is OFF "
             "(JITCONV_DEVICE_CHECK=0)"))
    kernels = [spec + (None, False) for spec in kernel_cache.specializations()]
    kernels += [spec + (False,) for spec in kernel_cache.fused_specializations()]
    kernels += [spec + (None, True) for spec in kernel_cache.stage_specializations()]
    for width, dtype, wide, fast, types, stage in kernels:
        t0 = time.perf_counter()
        try:
            launching.check_kernel(width, dtype, queue, wide, fast, types, stage)
            verdict = "passed"
        except device_check.DeviceCheckError as exc:
            failed += 1
            verdict = "FAILED: " + str(exc).splitlines()[0].split("known-answer step: ")[-1]
        except launching.KernelUnavailableError:
            verdict = "no kernel (not shipped, and numba-dpex is not installed)"
        kind = f"fused, {_types_name(types)} " if types else "GDN stage " if stage else ""
        print(f"  width {width} {dtype:9s} {_math_name(fast)} {'wide' if wide else '    '} "
              f"{kind}{verdict} "
              f"({(time.perf_counter() - t0) * 1e3:.0f} ms)", flush=True)
    if failed:
        print(str(device_check.refusal(queue.sycl_device.filter_string)))
    return failed


def check(args):
    """The device check of every kernel, then a small mixed step per (width, dtype)
    through the public op, compared with the float64 reference: "does this installation
    compute right" (also run in the dpctl-only environments in CI)."""
    if device_checks(jitconv.get_queue()):
        print("check: FAILED (the device check refused this device)")
        return 1
    failures = 0
    for width in [int(w) for w in args.widths.split(",")]:
        for name in args.dtypes.split(","):
            dtype = getattr(torch, name)
            step, _ = _demo_step(torch.Generator().manual_seed(width), args.dim, width, dtype)
            ref_out, ref_state = reference.causal_conv1d_reference(**step)
            before = step["conv_state"].clone()
            for math in ("exact", "fast"):
                step["conv_state"].copy_(before)  # each math from the same state
                out = jitconv.causal_conv1d_mixed(**step, math=math)
                err, out_ok, state_ok = _verify(out, step["conv_state"], ref_out, ref_state)
                ok = out_ok and state_ok
                failures += not ok
                print(f"  width {width} {name:9s} {math:5s} max error {err:.3g} "
                      f"{'OK' if ok else 'FAILED'}", flush=True)
    import dpctl
    used = {(w, d) for w in args.widths.split(",") for d in args.dtypes.split(",")}
    origins = sorted({where.split(" (")[0] for w, d, _wide, _fast, where in kernel_origins(False)
                      if (str(w), d) in used})
    print(f"dpctl {dpctl.__version__}, device {jitconv.get_device()}, kernels: "
          f"{SYCL_STATE.stats['cache_hits']} from the SPIR-V cache ({', '.join(origins)}), "
          f"{SYCL_STATE.stats['compiled']} compiled; numba-dpex imported: "
          f"{'numba_dpex' in sys.modules}; ignored cache entries: {SYCL_STATE.rejected}")
    if args.require_prebuilt and SYCL_STATE.stats["compiled"]:
        print("check: FAILED (--require-prebuilt, but kernels were compiled)")
        return 1
    print("check: OK" if not failures else f"check: {failures} FAILED")
    return 1 if failures else 0


def build_kernels(args):
    """Compile the standard specializations with numba-dpex and store their SPIR-V."""
    if not launching.have_compiler():
        print("build-kernels needs numba-dpex (pip install jitconv's pinned stack)")
        return 2
    target = kernel_cache.PREBUILT_DIR if args.ship else (
        args.dir or kernel_cache.cache_dir())
    queue = jitconv.get_queue()
    if args.ship:  # the package carries every supported specialization
        args.widths = ",".join(str(w) for w in jitconv.SUPPORTED_WIDTHS)
        args.dtypes = "float32,float16,bfloat16"
    widths = [int(w) for w in args.widths.split(",")]
    dtypes = args.dtypes.split(",")
    specs = [s for s in kernel_cache.specializations() if s[0] in widths and s[1] in dtypes]
    print(f"building {len(specs)} kernels into {target}")
    for width, dtype, wide, fast in specs:
        t0 = time.perf_counter()
        _kernel, path = launching.compile_and_store(width, dtype, queue, target, wide=wide,
                                                    fast=fast)
        print(f"  width {width} {dtype:9s} {_math_name(fast)} {'wide' if wide else '    '} "
              f"{path.stat().st_size / 1024:6.1f} KiB {time.perf_counter() - t0:5.2f} s  "
              f"{path.name}", flush=True)
    # the fused kernels of device plans, for the widths and dtypes asked for
    for width, dtype, wide, fast, types in kernel_cache.fused_specializations():
        if width not in widths or dtype not in dtypes:
            continue
        t0 = time.perf_counter()
        _kernel, path = launching.compile_and_store(width, dtype, queue, target, wide=wide,
                                                    fast=fast, record_types=types)
        print(f"  width {width} {dtype:9s} fused {_types_name(types)} "
              f"{'wide' if wide else '    '} {path.stat().st_size / 1024:6.1f} KiB "
              f"{time.perf_counter() - t0:5.2f} s  {path.name}", flush=True)
    # the kernels with the chain piece (parent maps, intermediate windows), and the GDN
    # stage's kernels (jitconv.gdn_conv_stage) without and with it
    stages = kernel_cache.stage_specializations()
    for label, specs, options in (
            ("chains", kernel_cache.chain_specializations(), dict(chains=True)),
            ("stage ", stages, dict(stage=True)),
            ("stage chains", stages, dict(stage=True, chains=True))):
        for width, dtype, wide, fast in specs:
            if width not in widths or dtype not in dtypes:
                continue
            t0 = time.perf_counter()
            _kernel, path = launching.compile_and_store(width, dtype, queue, target,
                                                        wide=wide, fast=fast, **options)
            print(f"  width {width} {dtype:9s} {_math_name(fast)} {label} "
                  f"{'wide' if wide else '    '} {path.stat().st_size / 1024:6.1f} KiB "
                  f"{time.perf_counter() - t0:5.2f} s  {path.name}", flush=True)
    # the device planners (jitconv.device_plan): one per shipped set of metadata types
    for types in kernel_cache.planner_specializations():
        t0 = time.perf_counter()
        _kernel, path = planner.compile_and_store(types, queue, target)
        print(f"  planner {types[0]}, flags {types[2]:5s} "
              f"{path.stat().st_size / 1024:6.1f} KiB {time.perf_counter() - t0:5.2f} s  "
              f"{path.name}", flush=True)
    # the rule planners (device plans with parent maps, windows or write lines)
    for types in kernel_cache.planner_specializations("rules"):
        t0 = time.perf_counter()
        _kernel, path = planner.compile_and_store(types, queue, target, kind="rules")
        print(f"  rule planner {types[0]} {path.stat().st_size / 1024:6.1f} KiB "
              f"{time.perf_counter() - t0:5.2f} s  {path.name}", flush=True)
    if args.ship:  # entries of older kernel sources would only bloat the wheel
        keep = set(kernel_cache.shipped_files())
        for stale in target.iterdir():
            if stale.suffix in (".spv", ".json") and stale.name not in keep:
                stale.unlink()
                print(f"  removed stale {stale.name}")
    return 0


def kernel_text(backend, width, dtype, wide=False, kind="general", math=None, chains=False,
                stage=False):
    """The generated Python source of one kernel specialization (``show-kernel``);
    ``chains``: the kernel of steps with parent maps or windows; ``stage``: the GDN
    stage's kernel (on CUDA for head_k_dim 128: 4 channels per thread)."""
    if backend == "sycl":
        fast = {None: None, "exact": False, "fast": True}[math]
        return source.name_and_source(width, dtype, fast, wide, chains=chains,
                                      stage=stage)[1]
    spec = cuda_launching.kind_spec(width, dtype, kind)
    if math is not None:
        spec = dataclasses.replace(spec, fast_exp=math == "fast")
    if chains:
        spec = dataclasses.replace(spec, chains=True)
    if stage:
        spec = dataclasses.replace(spec, stage=True, channels=4,
                                   row_group=min(spec.row_group, 4))
    return cuda_source.name_and_source(spec)[1]


def show_kernel(args):
    sys.stdout.write(kernel_text(args.backend, args.width, args.dtype, args.wide, args.kind,
                                 args.math, args.chains, args.stage))
    return 0


def bench(args):
    result = benchmark.run(dims=[int(d) for d in args.dims.split(",")],
                           dtypes=args.dtypes.split(","),
                           workloads=args.workloads.split(";") if args.workloads else None,
                           plot_path=args.plot or None, cold=not args.no_cold_start,
                           layers=args.layers, layer_dim=args.layer_dim,
                           kernel_only=args.kernel_only)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


def main(argv=None):
    device_help = "dpctl filter string (default: jitconv's choice)"
    parser = argparse.ArgumentParser(prog="python -m jitconv")
    parser.add_argument("--device", help=device_help)
    # --device is accepted after the subcommand too (`demo --device opencl:cpu`);
    # SUPPRESS keeps a subcommand without it from resetting the one given before.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--device", default=argparse.SUPPRESS, help=device_help)
    sub = parser.add_subparsers(dest="command", required=True)
    add = lambda name, **kw: sub.add_parser(name, parents=[common], **kw)  # noqa: E731
    d = add("demo", help="run and verify a realistic mixed engine step")
    d.add_argument("--dim", type=int, default=8192)
    d.add_argument("--width", type=int, default=4)
    d.add_argument("--dtype", default="bfloat16",
                   choices=["bfloat16", "float16", "float32"])
    d.add_argument("--reps", type=int, default=10)
    d.add_argument("--seed", type=int, default=0)
    add("info", help="versions and SYCL devices")
    c = add("check", help="run the device check of every kernel, then verify a small "
                          "mixed step per width and dtype")
    c.add_argument("--widths", default="2,3,4,5")
    c.add_argument("--dtypes", default="float32,float16,bfloat16")
    c.add_argument("--dim", type=int, default=256)
    c.add_argument("--require-prebuilt", action="store_true",
                   help="fail if any kernel had to be compiled (not found in the cache)")
    p = add("bench", help="benchmark against copy bandwidth and pure torch")
    p.add_argument("--dims", default="2048,8192")
    p.add_argument("--dtypes", default="bfloat16,float32")
    p.add_argument("--workloads", help="';'-separated subset of the workload names")
    p.add_argument("--plot", default="bench.png", help="plot path ('' for none)")
    p.add_argument("--json", help="also write every figure to this JSON file")
    p.add_argument("--no-cold-start", action="store_true")
    p.add_argument("--kernel-only", action="store_true",
                   help="time jitconv's kernels and the copies from profiling events "
                        "(device time, no host cost) instead of whole calls")
    p.add_argument("--layers", type=int, default=48,
                   help="layers of the plan-vs-one-shot step (0: skip it)")
    p.add_argument("--layer-dim", type=int, default=8192)
    k = add("show-kernel", help="print the generated source of one kernel")
    k.add_argument("backend", choices=["sycl", "cuda"])
    k.add_argument("--width", type=int, default=4)
    k.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    k.add_argument("--wide", action="store_true",
                   help="SYCL: the wide kernel (4 channels per work-item, 16-bit dtypes)")
    k.add_argument("--kind", default="general", choices=["general", "decode", "spec"],
                   help="CUDA: the kernel of launches of this kind (default options)")
    k.add_argument("--math", choices=["exact", "fast"],
                   help="silu's exp and division (default: the backend's for the dtype)")
    k.add_argument("--chains", action="store_true",
                   help="the kernel of steps with parent maps or intermediate windows")
    k.add_argument("--stage", action="store_true",
                   help="the GDN conv stage's kernel (jitconv.gdn_conv_stage)")
    b = add("build-kernels", help="precompile kernels to SPIR-V (persistent)")
    where = b.add_mutually_exclusive_group()
    where.add_argument("--dir", help="directory to write (default: the user cache, "
                                     "$JITCONV_CACHE_DIR or ~/.cache/jitconv)")
    where.add_argument("--ship", action="store_true",
                       help="write every supported width and dtype into "
                            "jitconv/prebuilt/ (ships with the package) and remove "
                            "entries of older kernel sources")
    b.add_argument("--widths", default="2,3,4,5")
    b.add_argument("--dtypes", default="float32,float16,bfloat16")
    args = parser.parse_args(argv)
    if args.device:
        try:
            jitconv.set_device(args.device)
        except jitconv.DeviceNotFoundError as exc:
            parser.error(f"--device: {exc}")
    jobs = {"demo": demo, "info": info, "check": check, "bench": bench,
            "build-kernels": build_kernels, "show-kernel": show_kernel}
    return jobs[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
