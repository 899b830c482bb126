"""Command line: ``python -m jitconv demo`` (the main job) and ``python -m jitconv info``."""

import argparse
import os
import platform
import sys
import time

import numpy as np
import torch

import jitconv
from jitconv import reference


def info(_args):
    from importlib.metadata import PackageNotFoundError, version

    from jitconv import _bootstrap
    print(f"jitconv {jitconv.__version__}  (python {platform.python_version()}, "
          f"{platform.machine()})")
    for pkg in ("torch", "numpy", "numba", "llvmlite", "numba-dpex", "dpctl", "dpnp",
                "intel-sycl-rt", "intel-opencl-rt"):
        try:
            print(f"  {pkg:16s} {version(pkg)}")
        except PackageNotFoundError:
            print(f"  {pkg:16s} not installed")
    print(f"runtime libraries: {_bootstrap.runtime_lib_dir()} "
          f"({len(_bootstrap.preloaded)} preloaded by jitconv)")
    for var in ("JITCONV_DEVICE", "ONEAPI_DEVICE_SELECTOR", "OCL_ICD_FILENAMES",
                "LD_LIBRARY_PATH"):
        print(f"  {var}={os.environ.get(var, '')}")
    print(f"devices: {jitconv.devices()}")
    print(f"current device: {jitconv.get_device()}")
    return 0


def _demo_batch(gen, dim, width, dtype):
    """A non-spec engine step as vLLM schedules it with chunked prefill: a few prefill
    chunks (two continue from cached state, one starts fresh), many single-token decodes,
    and two padded slots. conv_state in vLLM's (lines, state_len, dim) storage."""
    prefill = [640, 512, 256]
    decodes = 24
    lengths = prefill + [1] * decodes + [1, 1]  # the last two are pads
    nseq = len(lengths)
    num_lines = 64
    lines = torch.randperm(num_lines, generator=gen)[:nseq].to(torch.int32)
    lines[-2:] = -1
    init = torch.ones(nseq, dtype=torch.bool)
    init[2] = False  # a new request's first chunk
    num_tokens = sum(lengths)

    def usm_randn(*shape):
        t = jitconv.empty(shape, dtype)
        t.copy_(torch.randn(shape, generator=gen).to(dtype))
        return t

    state_storage = usm_randn(num_lines, width - 1, dim)
    return dict(
        x=usm_randn(num_tokens, dim),
        weight=usm_randn(dim, width),
        bias=usm_randn(dim),
        conv_state=state_storage.transpose(1, 2),
        query_start_loc=torch.tensor(np.concatenate([[0], np.cumsum(lengths)]),
                                     dtype=torch.int32),
        cache_indices=lines,
        has_initial_state=init,
    ), prefill, decodes


def demo(args):
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16,
             "float32": torch.float32}[args.dtype]
    gen = torch.Generator().manual_seed(args.seed)
    case, prefill, decodes = _demo_batch(gen, args.dim, args.width, dtype)
    num_tokens = case["x"].shape[0]
    print(f"device: {jitconv.get_device()}  (available: {jitconv.devices()})")
    print(f"batch: {len(prefill)} prefill chunks {prefill} (2 continue from cached state, "
          f"1 fresh), {decodes} decodes, 2 padded slots; {num_tokens} tokens, "
          f"conv_dim {args.dim}, width {args.width}, {args.dtype}, SD state layout")

    ref_out, ref_state = reference.causal_conv1d_fn_reference(**case)
    out = jitconv.empty(tuple(case["x"].shape), dtype)
    jitconv.reset_copy_counts()
    t0 = time.perf_counter()
    jitconv.causal_conv1d_fn(out=out, **case)
    cold = time.perf_counter() - t0

    rtol, atol = {torch.float32: (3e-4, 1e-3), torch.float16: (3e-3, 5e-3),
                  torch.bfloat16: (1e-2, 5e-2)}[dtype]
    got = out.to(torch.float64).numpy()
    err = np.abs(got - ref_out)
    out_ok = bool(np.all(err <= atol + rtol * np.abs(ref_out)))
    want_state = torch.from_numpy(ref_state).to(dtype)
    state_ok = torch.equal(case["conv_state"].view(torch.int16) if dtype != torch.float32
                           else case["conv_state"], want_state.view(torch.int16)
                           if dtype != torch.float32 else want_state)
    pads_ok = bool(np.all(got[-2:] == 0))
    print(f"output: max |error| vs float64 reference = {err.max():.3g} "
          f"(tolerance atol {atol} + rtol {rtol}·|ref|): {'OK' if out_ok else 'FAILED'}")
    print(f"conv_state: {'bit-exact' if state_ok else 'MISMATCH'} vs reference "
          f"({int((case['cache_indices'] >= 0).sum())} lines updated in place, "
          f"pads and unused lines untouched); padded rows zero: {pads_ok}")
    print(f"copies host<->device: {jitconv.copy_counts()} (USM tensors: zero-copy)")

    # Warm timing: the same step again (state keeps evolving; only the time matters here).
    reps = args.reps
    t0 = time.perf_counter()
    for _ in range(reps):
        jitconv.causal_conv1d_fn(out=out, **case)
    warm = (time.perf_counter() - t0) / reps
    itemsize = out.element_size()
    moved = 2 * num_tokens * args.dim * itemsize  # read x, write out (state is tiny)
    print(f"time: first call {cold * 1e3:.1f} ms (includes JIT compile), warm "
          f"{warm * 1e3:.2f} ms/call over {reps} calls = {moved / warm / 1e9:.2f} GB/s "
          f"effective")
    ok = out_ok and state_ok and pads_ok
    print("demo: VERIFIED" if ok else "demo: FAILED")
    return 0 if ok else 1


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m jitconv")
    parser.add_argument("--device", help="dpctl filter string (default: jitconv's choice)")
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="run and verify a realistic engine step")
    d.add_argument("--dim", type=int, default=8192)
    d.add_argument("--width", type=int, default=4)
    d.add_argument("--dtype", default="bfloat16",
                   choices=["bfloat16", "float16", "float32"])
    d.add_argument("--reps", type=int, default=10)
    d.add_argument("--seed", type=int, default=0)
    sub.add_parser("info", help="versions and SYCL devices")
    args = parser.parse_args(argv)
    if args.device:
        jitconv.set_device(args.device)
    return {"demo": demo, "info": info}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
