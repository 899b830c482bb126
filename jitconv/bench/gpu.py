"""GPU benchmark (NVIDIA, the CUDA backend): ``python -m jitconv.bench.gpu --vllm-file
PATH --out DIR``.

The workloads of ``python -m jitconv bench`` (``bench.WORKLOADS``), width 4, bfloat16 and
float32, conv dim 2048 and 8192, side by side in one run with vLLM's Triton ops
(``vllm/model_executor/layers/mamba/ops/causal_conv1d.py`` from vLLM's distribution,
passed as a file: it is never part of this repository) and the GPU's copy bandwidth.

Kernel time is device time from torch's profiler (CUPTI): the summed durations of the
kernels one call launches, with L2 flushed (a 256 MiB fill) before every repetition,
median of ``--reps``. Metadata transfers and fills (host-to-device / device-to-host
copies, ``torch.full``) are not counted on either side: an engine makes them once per
step, not per layer. GB/s = bytes that must move (``bench.bytes_moved``) / time; % of
copy = that over the device-to-device copy bandwidth measured in the same run (1 GiB);
``pct_copy_same`` = the time of a copy of the workload's own bytes between filled
buffers, timed the same way (its own row per workload), over the row's time: what
``python -m jitconv bench`` reports on SYCL devices, and the fairer yardstick for
launches of a few microseconds, which a 1 GiB copy's bandwidth does not reach either.

Rows per workload: jitconv one launch for C channels per thread (``--channels``: "auto",
the CUDA backend's own choice per launch, and 1, 2, 4),
L tokens of lookahead ("auto", the CUDA backend's own choice per launch, unless
``--lookaheads`` names others; "auto" among them keeps it), G channels per access of
a row (``--row-groups``: the tuning's row_group, "auto" the table's) and each math of
silu in ``MODES`` (``--modes``); jitconv as two calls (mixed
steps, with the defaults); vLLM Triton as vLLM calls it (one call for one kind of
sequences; for mixed steps its two calls on pre-gathered inputs), and for mixed steps
vLLM's two calls plus the two ``index_select`` gathers its GDN layer makes; on GPUs where
vLLM launches them with programmatic dependent launch, both again with it off (rows
ending in ``TRITON_NO_PDL``: with it on, a kernel's measured time can include the end of
the flush before it).

``python -m jitconv.bench.gpu host VLLM_FILE OUT_DIR``: host cost per call instead
(``host_cost``).
"""

import argparse
import csv
import itertools
import json
import os
import statistics
import sys
import time
import types

import torch

import jitconv
from jitconv.backends.cuda import devices as cuda_devices
from jitconv.kernels import tuning
from jitconv.bench.cpu import WORKLOADS, bytes_moved, make_step, plan_of
from jitconv.bench.cpu import plot
from jitconv.reference import TOLERANCE, causal_conv1d_reference
from jitconv.testing.steps import DATA_KEYS, split_step, token_rows

_NOT_COUNTED = ("Memcpy HtoD", "Memcpy DtoH", "FillFunctor", "Memset")

AUTO = "auto"  # the tuning table's value (no override)


def load_vllm_triton(path):
    """vLLM's causal_conv1d.py as a module, its three vLLM imports replaced by what they
    provide (triton, the pad / null-block constants, and the platform's PDL check)."""
    text = open(path).read()
    replaced = {
        "from vllm.platforms import current_platform": "current_platform = _platform",
        "from vllm.triton_utils import tl, triton":
            "import triton\nimport triton.language as tl",
        "from vllm.v1.attention.backends.utils import NULL_BLOCK_ID, PAD_SLOT_ID":
            "NULL_BLOCK_ID, PAD_SLOT_ID = 0, -1",
    }
    for old, new in replaced.items():
        if old not in text:
            raise RuntimeError(f"{path}: expected the line {old!r}")
        text = text.replace(old, new)
    module = types.ModuleType("vllm_causal_conv1d")
    # vLLM enables programmatic dependent launch from compute capability 9.0 (Hopper)
    major = torch.cuda.get_device_capability()[0]
    module._platform = types.SimpleNamespace(is_arch_support_pdl=lambda: major >= 9,
                                             is_cpu=lambda: False)
    module.__file__ = path
    exec(compile(text, path, "exec"), module.__dict__)
    return module


def _device_events(prof):
    """(name, start_ns, duration_ns) of every GPU activity the profiler saw."""
    out = []
    for e in prof.profiler.kineto_results.events():
        if e.device_type() == torch.autograd.DeviceType.CUDA:
            out.append((e.name(), e.start_ns(), e.duration_ns()))
    return sorted(out, key=lambda e: e[1])


def device_time_us(fn, flush, reps):
    """Median over ``reps`` of the summed durations of the GPU work one ``fn()`` launches
    (fills and metadata copies excepted), L2 flushed before each; and the names.
    ``flush``: anything with ``zero_()`` (the fill tensor, or a wrapper that launches
    more GPU work); its own activities are counted once and left out of every
    repetition."""
    from torch.profiler import ProfilerActivity, profile
    flush.zero_()  # a flush's first call may copy what later ones reuse; not counted
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    per_call = len(_device_events(prof))
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        flush.zero_()
        torch.cuda.synchronize()
    per_flush = len(_device_events(prof))  # 1 for a fill; more for a flush that queues
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            flush.zero_()
            fn()
        torch.cuda.synchronize()
    events = _device_events(prof)
    group = per_call + per_flush
    if len(events) != reps * group:
        raise RuntimeError(f"expected {reps} x ({per_call} + {per_flush} flush) GPU "
                           f"activities, got {len(events)}")
    times, names = [], set()
    for i in range(reps):
        counted = [e for e in events[i * group + per_flush:(i + 1) * group]
                   if not any(k in e[0] for k in _NOT_COUNTED)]
        names.update(e[0][:60] for e in counted)
        times.append(sum(e[2] for e in counted) / 1e3)
    return statistics.median(times), sorted(names)


def copy_bandwidth(device, nbytes=1 << 30, reps=20):
    """Device-to-device copy of filled buffers: GB/s counting bytes read + written."""
    src = torch.randn(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    us = statistics.median(times)
    return {"bytes": 2 * nbytes, "us": us, "gbps": 2 * nbytes / us / 1e3}


def _on(device, step):
    """The step's metadata on the device (vLLM's kernels read it there)."""
    return {k: (v.to(device) if isinstance(v, torch.Tensor) and k not in DATA_KEYS else v)
            for k, v in step.items()}


def _plan(step):
    plan = plan_of(step)
    return lambda: plan.run(step["x"], step["weight"], step["bias"], step["conv_state"])


def vllm_calls(vt, step, device, gathers):
    """A callable running the step as vLLM's GDN layer does: causal_conv1d_update for the
    spec part (and for non-spec decodes when the step has no prefill and no spec),
    causal_conv1d_fn for the non-spec part; ``gathers``: the two index_selects of x
    inside the call (else the parts are gathered once, outside)."""
    d = _on(device, step)
    x, w, b, state = d["x"], d["weight"], d["bias"], d["conv_state"]
    has_ns, has_sp = "non_spec_query_start_loc" in d, "spec_query_start_loc" in d
    rows = {p: token_rows(step, p).to(device) for p, h in (("non_spec", has_ns), ("spec", has_sp)) if h}
    both = has_ns and has_sp
    pre = {p: x.index_select(0, r) for p, r in rows.items()} if both else {p: x for p in rows}
    decode_only = has_ns and not has_sp and bool(
        (torch.diff(step["non_spec_query_start_loc"]) == 1).all())

    spec_lines = None
    if has_sp:  # the GDN layer's column-0 slice, made once per step, not per layer
        sp = d["spec_state_indices"]
        spec_lines = (sp[:, 0] if sp.dim() == 2 else sp).contiguous()

    def part(p):
        return x.index_select(0, rows[p]) if (gathers and both) else pre[p]

    def run():
        outs = []
        if has_sp:
            outs.append(vt.causal_conv1d_update(
                part("spec"), state, w, b, "silu", conv_state_indices=spec_lines,
                num_accepted_tokens=d["num_accepted_tokens"],
                query_start_loc=d["spec_query_start_loc"],
                max_query_len=int(torch.diff(step["spec_query_start_loc"]).max()),
                null_block_id=-1))
        if has_ns and decode_only:
            outs.append(vt.causal_conv1d_update(
                part("non_spec"), state, w, b, "silu",
                conv_state_indices=d["non_spec_state_indices"], null_block_id=-1))
        elif has_ns:
            outs.append(vt.causal_conv1d_fn(
                part("non_spec").transpose(0, 1), w, b, state, d["non_spec_query_start_loc"],
                cache_indices=d["non_spec_state_indices"],
                has_initial_state=d.get("has_initial_state"), activation="silu",
                pad_slot_id=-1, null_block_id=-1).transpose(0, 1))
        return outs
    return run, rows


def _check(step, device, vt):
    """jitconv's and vLLM's outputs of the step against the float64 reference."""
    ref_out, _ = causal_conv1d_reference(**dict(step, conv_state=step["conv_state"].clone()))
    rtol, atol = TOLERANCE[str(step["x"].dtype).replace("torch.", "")]
    ok = {}
    got = jitconv.causal_conv1d_mixed(**dict(step, conv_state=step["conv_state"].clone()))
    ok["jitconv"] = bool(torch.allclose(got.double().cpu(), torch.from_numpy(ref_out), rtol=rtol, atol=atol))
    run, rows = vllm_calls(vt, dict(step, conv_state=step["conv_state"].clone()), device, False)
    outs = run()
    parts = [p for p in ("spec", "non_spec") if p in rows]
    vllm_ok = True
    for p, o in zip(parts, outs):
        want = torch.from_numpy(ref_out)[rows[p].cpu()]
        vllm_ok &= bool(torch.allclose(o.double().cpu(), want, rtol=rtol, atol=atol))
    ok["vllm"] = vllm_ok
    return ok


def same_bytes_copy(moved, device):
    """A callable copying ``moved`` / 2 bytes between two filled device buffers: the
    copy of a workload's own bytes (read + written), timed like the kernels."""
    src = torch.randn(max(1, moved // 8), device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    return lambda: dst.copy_(src)


def run(vllm_file, out_dir, dims=(2048, 8192), dtypes=("bfloat16", "float32"), reps=100,
        channels=(AUTO, 1, 2, 4), workloads=None, lookaheads=None, modes=None,
        row_groups=None):
    lookaheads = lookaheads or (AUTO,)
    row_groups = row_groups or (AUTO,)
    modes = modes or tuple(MODES)
    device = torch.device(jitconv.set_device("cuda:0"))
    vt = load_vllm_triton(vllm_file)
    pdl_by_default = vt._platform.is_arch_support_pdl()
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=device)
    copy = copy_bandwidth(device)
    print(f"{torch.cuda.get_device_name()}: copy {copy['gbps']:.0f} GB/s", flush=True)
    rows = []
    for dim in dims:
        for dtype_name in dtypes:
            dtype = getattr(torch, dtype_name)
            for name in workloads or WORKLOADS:
                step = make_step(name, dim, dtype)
                assert step["x"].device == device
                moved = bytes_moved(step)
                try:
                    ok = _check(step, device, vt)
                except Exception as exc:
                    print(f"{name} {dtype_name} {dim}: check FAILED {exc!r}"[:400], flush=True)
                    ok = {"jitconv": None, "vllm": None}
                base = dict(workload=name, dtype=dtype_name, dim=dim,
                            tokens=int(step["x"].shape[0]), bytes=moved,
                            jitconv_correct=ok["jitconv"], vllm_correct=ok["vllm"])
                # The copy of the workload's own bytes, timed like the kernels: a launch
                # this small does not reach the 1 GiB copy's bandwidth either.
                same_us, _ = device_time_us(same_bytes_copy(moved, device), flush, reps)
                rows.append(dict(base, variant=SAME_BYTES_COPY, us=same_us,
                                 gbps=moved / same_us / 1e3,
                                 pct_copy=100 * moved / same_us / 1e3 / copy["gbps"],
                                 pct_copy_same=100.0))

                def record(variant, fn):
                    try:
                        us, names = device_time_us(fn, flush, reps)
                    except Exception as exc:  # keep the run going; the row says why
                        rows.append(dict(base, variant=variant, error=repr(exc)[:300]))
                        print(f"{name} {dtype_name} {dim} {variant}: FAILED {exc!r}"[:400],
                              flush=True)
                        return
                    gbps = moved / us / 1e3
                    rows.append(dict(base, variant=variant, us=us, gbps=gbps,
                                     pct_copy=100 * gbps / copy["gbps"],
                                     pct_copy_same=100 * same_us / us, kernels=names))
                    print(f"{name:22s} {dtype_name:8s} {dim:5d} {variant:28s} {us:8.1f} us "
                          f"{gbps:7.0f} GB/s {100 * gbps / copy['gbps']:5.1f}% "
                          f"({100 * same_us / us:5.1f}% of the same bytes' copy, "
                          f"{same_us:.1f} us)", flush=True)

                for mode, c, la, g in itertools.product(modes, channels, lookaheads,
                                                        row_groups):
                    values = dict(MODES[mode])
                    # (not ``name``: record's printed line reads the workload's name)
                    for knob, value in (("channels", c), ("lookahead", la), ("row_group", g)):
                        if value != AUTO:
                            values[knob] = value
                    with tuning.override(**values):
                        record(variant_name(c, la, mode, g), _plan(step))
                first, second = split_step(step)
                if first is not None and second is not None:
                    p1, p2 = _plan(first), _plan(second)
                    record("jitconv two calls", lambda: (p1(), p2()))
                vrun, _ = vllm_calls(vt, step, device, gathers=False)
                grun = None
                if first is not None and second is not None:
                    grun, _ = vllm_calls(vt, step, device, gathers=True)
                for pdl in (True, False) if pdl_by_default else (False,):
                    # Rows "... , no PDL": vLLM's calls with programmatic dependent launch
                    # off (see TRITON_NO_PDL)
                    vt._platform.is_arch_support_pdl = lambda pdl=pdl: pdl
                    suffix = "" if pdl == pdl_by_default else TRITON_NO_PDL
                    record("vllm triton" + suffix, vrun)
                    if grun is not None:
                        record("vllm triton + gathers" + suffix, grun)
                vt._platform.is_arch_support_pdl = lambda: pdl_by_default
                _save(out_dir, copy, reps, rows)  # as it goes: a cut-off run keeps rows
    return _save(out_dir, copy, reps, rows)


def _save(out_dir, copy, reps, rows):
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "copy": copy, "reps": reps, "rows": rows}
    try:
        import numba_cuda
        import triton
        result.update(numba_cuda=getattr(numba_cuda, "__version__", "?"),
                      triton=triton.__version__)
    except ImportError:
        pass
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(out_dir, "results.csv"), "w", newline="") as f:
        fields = ["workload", "dtype", "dim", "tokens", "bytes", "variant", "us", "gbps",
                  "pct_copy", "pct_copy_same", "jitconv_correct", "vllm_correct"]
        writer = csv.DictWriter(f, fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return result


# The math of silu (tuning values): exact, the approximate exp and division (the CUDA
# default) and numba's fastmath for the whole kernel.
MODES = {"exact": {"fast_exp": False, "fastmath": False},
         "fast exp": {"fast_exp": True, "fastmath": False},
         "fastmath": {"fast_exp": False, "fastmath": True}}


def _wall_per_call_us(fn, calls):
    """Wall time per call of ``calls`` calls that wait for nothing (the GPU runs behind
    them, so when a call's host work outlasts its kernel, this is the host work)."""
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def host_cost(vllm_file, out_dir, layers=48, calls=1000):
    """Host cost on a CUDA device. A decode step too small for its kernel to matter (64
    sequences of 1 token, dim 64, float32): wall time per call of jitconv's
    ``plan.run`` and one-shot call and of vLLM's ``causal_conv1d_update``. One engine
    step of a ``layers``-layer model (decode-only 64, bfloat16, dim 8192): a plan and a
    run per layer (4 sets of layer tensors, cycled), against vLLM's call per layer;
    wall time of the step to its last kernel's end, per layer. And where plan.run's
    host time goes (cProfile, by own time). Writes ``host.json`` and ``host.txt``."""
    import cProfile
    import io
    import pstats
    device = torch.device(jitconv.set_device("cuda:0"))
    vt = load_vllm_triton(vllm_file)
    lines = [f"{torch.cuda.get_device_name()}, wall time per call over {calls} calls"]
    tiny = make_step("decode-only 64", 64, torch.float32)
    plan = plan_of(tiny)
    data = {k: tiny[k] for k in DATA_KEYS}
    out = torch.empty_like(tiny["x"])
    result = {"tiny": {
        "plan.run": _wall_per_call_us(lambda: plan.run(**data, out=out), calls),
        "one-shot call": _wall_per_call_us(lambda: jitconv.causal_conv1d_mixed(**tiny), calls),
        "vllm triton": _wall_per_call_us(vllm_calls(vt, tiny, device, gathers=False)[0],
                                         calls)}}
    lines += [f"tiny decode (64 x 1, dim 64, float32): {name} {us:.1f} us"
              for name, us in result["tiny"].items()]
    sets = [make_step("decode-only 64", 8192, torch.bfloat16) for _ in range(4)]
    layer_args = [dict({k: s[k] for k in DATA_KEYS}, out=torch.empty_like(s["x"]))
                  for s in sets]  # built here, not inside the timed loop
    vllm_runs = [vllm_calls(vt, s, device, gathers=False)[0] for s in sets]

    def planned_step():
        step_plan = plan_of(sets[0])
        for i in range(layers):
            step_plan.run(**layer_args[i % 4])

    def vllm_step():
        for i in range(layers):
            vllm_runs[i % 4]()

    result["step"] = {name: _wall_per_call_us(fn, 20) / layers
                      for name, fn in (("plan + runs", planned_step), ("vllm triton", vllm_step))}
    lines += [f"{layers}-layer step, decode-only 64, bfloat16, dim 8192, per layer: {name} "
              f"{us:.1f} us" for name, us in result["step"].items()]
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(300):
        plan.run(**data, out=out)
    profile.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(18)
    lines += ["", "plan.run under cProfile, 300 calls, by own time:", text.getvalue()]
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "host.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(out_dir, "host.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return result


def variant_name(channels, lookahead, mode="exact", row_group=AUTO):
    return (f"jitconv C={channels} L={lookahead}{'' if mode == 'exact' else ' ' + mode}"
            f"{'' if row_group == AUTO else f' G={row_group}'}")


# The row of each workload that times a copy of its own bytes (jitconv.bench.gpu.run).
SAME_BYTES_COPY = "device copy of the same bytes"
# Suffix of the rows of vLLM's calls made with programmatic dependent launch (PDL) off, on
# GPUs where vLLM turns it on (compute capability 9.0 and later). A kernel launched with
# PDL may start while the kernel before it (here the L2 flush) is still finishing, and
# its measured duration then counts that overlap: on the H200 vLLM's bfloat16
# decode-only launch measured 4.5-9.4 us with PDL and 2.8-5.0 us without it (both its own
# kernel). ``table`` and ``panel`` take the faster of the two as vLLM's time.
TRITON_NO_PDL = ", no PDL"


def _fastest(v, name):
    """The faster of vLLM's row ``name`` and its no-PDL twin (None if neither ran), and
    whether the twin was it."""
    rows = [(v[k], k != name) for k in (name, name + TRITON_NO_PDL) if k in v]
    if not rows:
        return None, False
    return min(rows, key=lambda r: r[0]["us"])


def table(result):
    """The markdown results table of benchmarks/h200/README.md, from a run's result:
    per (dim, dtype, workload) the default variant (automatic channels and lookahead,
    the table's fast exp; in older results the table's channels, and before the automatic
    lookahead its long lookahead), the fastest jitconv variant, vLLM's calls (the faster
    of PDL on and off, "no PDL" where off was faster: TRITON_NO_PDL), and the ratios."""
    table_values = tuning.CudaTuning()
    by = {}
    for r in result["rows"]:
        if "us" in r:
            by.setdefault((r["dim"], r["dtype"], r["workload"]), {})[r["variant"]] = r
    order = {name: i for i, name in enumerate(WORKLOADS)}

    def cell(r):
        return "-" if r is None else f"{r['us']:.1f} us ({r['pct_copy']:.0f}%)"

    lines = ["| dim | dtype | workload | jitconv default | best jitconv (variant) | "
             "vLLM Triton | vLLM Triton + gathers | jitconv two calls | best vs Triton | "
             "best vs Triton+gathers | copy of the same bytes | best, % of that copy |",
             "|---" * 12 + "|"]
    for (dim, dtype, name) in sorted(by, key=lambda k: (k[0], k[1], order.get(k[2], 99))):
        v = by[(dim, dtype, name)]
        ours = {k: r for k, r in v.items() if k.startswith("jitconv C=")}
        best_name = min(ours, key=lambda k: ours[k]["us"])
        best = ours[best_name]
        mode = "fast exp" if table_values.fast_exp else "exact"
        default = next((ours[k] for k in (variant_name(AUTO, AUTO, mode),
                                           variant_name(table_values.channels, AUTO, mode),
                                           variant_name(table_values.channels,
                                                        table_values.long_lookahead, mode))
                        if k in ours), None)
        (triton, t_off), (gathers, g_off) = (_fastest(v, "vllm triton"),
                                             _fastest(v, "vllm triton + gathers"))
        vs = f"{triton['us'] / best['us']:.2f}x" if triton else "-"
        vs_g = f"{gathers['us'] / best['us']:.2f}x" if gathers else "-"
        same = v.get(SAME_BYTES_COPY)  # results before it was measured have none
        same_pct = f"{100 * same['us'] / best['us']:.0f}%" if same else "-"
        lines.append(f"| {dim} | {dtype} | {name} | {cell(default)} | {cell(best)} "
                     f"{best_name.replace('jitconv ', '')} | {cell(triton)}{' no PDL' * t_off} | "
                     f"{cell(gathers)}{' no PDL' * g_off} | "
                     f"{cell(v.get('jitconv two calls'))} | {vs} | {vs_g} | "
                     f"{cell(same)} | {same_pct} |")
    return "\n".join(lines)


PANEL_SERIES = (("best", "jitconv, one launch (best variant)", "tab:blue"),
                ("two", "jitconv, two calls", "tab:cyan"),
                ("triton", "vLLM Triton", "tab:green"),
                ("gathers", "vLLM Triton + gathers", "tab:olive"))


def _pct(row):
    return None if row is None else row["pct_copy"]


def panel(result):
    """A GPU run as a panel of ``bench.plot`` (title, rows, series), to draw beside the
    CPU device's run."""
    by = {}
    for r in result["rows"]:
        if "pct_copy" in r:
            by.setdefault((r["dim"], r["dtype"], r["workload"]), {})[r["variant"]] = r
    order = {name: i for i, name in enumerate(WORKLOADS)}
    rows = []
    for (dim, dtype, name) in sorted(by, key=lambda k: (order.get(k[2], 99), k[1], k[0])):
        v = by[(dim, dtype, name)]
        pct = {k: r["pct_copy"] for k, r in v.items()}
        rows.append(dict(workload=name, dtype=dtype, dim=dim,
                         pct_best=max(p for k, p in pct.items() if k.startswith("jitconv C=")),
                         pct_two=pct.get("jitconv two calls"),
                         pct_triton=_pct(_fastest(v, "vllm triton")[0]),
                         pct_gathers=_pct(_fastest(v, "vllm triton + gathers")[0])))
    title = f"{result['device']} (copy {result['copy']['gbps']:.0f} GB/s), kernel time"
    return title, rows, PANEL_SERIES


def side_by_side(cpu_json, gpu_json, path):
    """One figure: a CPU device's ``python -m jitconv bench --json`` result beside a GPU
    run of this module (the README's plot)."""
    with open(cpu_json) as f:
        cpu = json.load(f)
    with open(gpu_json) as f:
        gpu = json.load(f)
    plot([(f"{cpu['device']} ({cpu.get('timing', 'wall')} time), % of the copy of the same "
           f"bytes", cpu["rows"]), panel(gpu)], path)


def _lookaheads(text):
    if not text:
        return None
    values = tuple(v.strip() for v in text.split(","))
    bad = [v for v in values if v != AUTO and v not in ("1", "2", "4", "8", "16")]
    if bad:
        raise SystemExit(f"--lookaheads: unknown {bad}; expected auto, 1, 2, 4, 8 or 16")
    return tuple(v if v == AUTO else int(v) for v in values)


def _row_groups(text):
    if not text:
        return None
    values = tuple(v.strip() for v in text.split(","))
    bad = [v for v in values if v not in (AUTO, "1", "2", "4")]
    if bad:
        raise SystemExit(f"--row-groups: unknown {bad}; expected auto, 1, 2 or 4")
    return tuple(v if v == AUTO else int(v) for v in values)


def _modes(text):
    modes = tuple(m.strip() for m in text.split(","))
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise SystemExit(f"--modes: unknown {unknown}; expected among {list(MODES)}")
    return modes


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["side-by-side"]:  # CPU_JSON GPU_JSON PNG: no GPU needed
        side_by_side(*argv[1:4])
        return
    if argv[:1] == ["host"]:  # VLLM_FILE OUT_DIR
        if not cuda_devices.devices():
            sys.exit(f"no CUDA device: {cuda_devices.why_unavailable()}")
        host_cost(*argv[1:3])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm-file", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--reps", type=int, default=100)
    parser.add_argument("--workload", action="append", help="only these (repeatable)")
    parser.add_argument("--dim", type=int, action="append")
    parser.add_argument("--channels", default="auto,1,2,4",
                        help="C values, comma-separated, 'auto' among them (the CUDA backend's "
                             "choice per launch)")
    parser.add_argument("--lookaheads", help="L values, comma-separated, 'auto' among them "
                        "(default: auto, the CUDA backend's choice per launch)")
    parser.add_argument("--row-groups", help="G values (the tuning's row_group), comma-"
                        "separated, 'auto' among them (default: auto, the CUDA backend's choice)")
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"silu's math, comma-separated among {', '.join(MODES)}")
    args = parser.parse_args(argv)
    if not cuda_devices.devices():
        sys.exit(f"no CUDA device: {cuda_devices.why_unavailable()}")

    def ints(text):
        return tuple(v if v == AUTO else int(v) for v in text.split(",")) if text else None

    result = run(args.vllm_file, args.out, reps=args.reps, workloads=args.workload,
                 dims=tuple(args.dim or (2048, 8192)), channels=ints(args.channels),
                 lookaheads=_lookaheads(args.lookaheads), modes=_modes(args.modes),
                 row_groups=_row_groups(args.row_groups))
    plot([panel(result)], os.path.join(args.out, "h200_pct_copy.png"))


if __name__ == "__main__":
    main()


def print_row(row):
    """One result row as a JSON line (floats to 2 decimals), as the benchmarks print them."""
    print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v)
                      for k, v in row.items()}), flush=True)


def save_rows(out_dir, name, rows, **fields):
    """``rows`` (and ``fields``) with the device and torch's version as ``name`` in
    ``out_dir`` (nothing when it is None)."""
    if not out_dir:
        return
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, name), "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                       **fields, rows=rows), f, indent=1)


def bench_device():
    """(cuda:0, made jitconv's current device; an L2 flush buffer of 256 MiB there)."""
    device = torch.device("cuda:0")
    jitconv.set_device("cuda:0")
    return device, torch.empty(256 * 2 ** 20 // 4, dtype=torch.float32, device=device)
