"""``python -m jitconv bench``: speed of the mixed conv on the current device, as ratios
measured in the same run: against the device's copy bandwidth and against the pure-torch
implementation (``jitconv.testing.baseline``). These machines are shared and noisy: read ratios,
not absolute numbers, and never gate tests on timings.

Workloads are what a serving engine runs per GDN layer and step: decode-only (64 x 1),
spec-only (16 x (1+3)), prefill-heavy (4 x 1024), decode-heavy mixed (48 decodes + 16 spec),
a realistic mixed step (prefill chunks + decodes + spec verify, laid out as vLLM does: spec
rows first, each sequence's rows contiguous), and the same step with every token's row
shuffled (a stress case for the token maps).
"""

import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import jitconv
from jitconv.backends.sycl import launching
from jitconv.api import plan_cache
from jitconv.testing.baseline import causal_conv1d_mixed_torch
from jitconv.testing.steps import DATA_KEYS, mixed_step, random_values, split_step
from jitconv.backends.sycl.state import STATE as SYCL_STATE
from jitconv.backends.sycl.usm import DeviceArray

MTP_K = 3
WORKLOADS = {  # name: (non-spec sequence lengths, spec sequence lengths)
    "decode-only 64": ([1] * 64, []),
    "spec-only 16x(1+3)": ([], [1 + MTP_K] * 16),
    "prefill-heavy 4x1024": ([1024] * 4, []),
    "decode-heavy mixed": ([1] * 48, [1 + MTP_K] * 16),
    "mixed step": ([640, 512, 256] + [1] * 24, [1 + MTP_K] * 16),
    "mixed, rows shuffled": ([640, 512, 256] + [1] * 24, [1 + MTP_K] * 16),
}


def make_step(name, dim, dtype, width=4, seed=0):
    """kwargs of causal_conv1d_mixed for one workload, all tensors in USM (zero-copy).
    Laid out as vLLM lays a step out (spec rows first, each sequence's rows contiguous),
    except "mixed, rows shuffled", a stress case that gives every token a random row."""
    ns_lengths, sp_lengths = WORKLOADS[name]
    return mixed_step(torch.Generator().manual_seed(seed), dim=dim, width=width,
                      dtype=dtype, ns_lengths=ns_lengths, sp_lengths=sp_lengths,
                      rows="shuffled" if name == "mixed, rows shuffled" else "vllm",
                      state_len=width - 1 + MTP_K, extra_lines=32, usm=True)


def bytes_moved(step):
    """Bytes that must move: x read, out written, each real sequence's state window read
    and its new state columns written, weights and bias read."""
    x = step["x"]
    item = x.element_size()
    dim, width = step["weight"].shape
    S = width - 1
    total = 2 * x.numel() * item + (dim * width + dim) * item
    if "non_spec_query_start_loc" in step:
        seqs = int((step["non_spec_state_indices"] >= 0).sum())
        total += seqs * 2 * S * dim * item
    if "spec_query_start_loc" in step:
        lengths = torch.diff(step["spec_query_start_loc"])
        real = step["spec_state_indices"] >= 0
        total += int((S + S - 1 + lengths[real]).sum()) * dim * item
    return total


def median_time(fn, min_time=0.2, min_reps=5, max_reps=200):
    fn()  # warm-up (compiles on first use)
    times = []
    start = time.perf_counter()
    while len(times) < min_reps or (time.perf_counter() - start < min_time
                                    and len(times) < max_reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def median_kernel_times(submits, min_time=0.2, min_reps=5, max_reps=200):
    """Median device time of each of ``submits`` (callables returning the profiling
    events of the work they submitted, summed: a two-call step is both kernels), run in
    turn within every repetition so that all see the same load on a shared machine.
    Host cost is left out."""
    def once(submit):
        events = submit()
        for e in events:
            e.wait()
        return sum(e.profiling_info_end - e.profiling_info_start for e in events) / 1e9

    for submit in submits:
        once(submit)  # warm-up (compiles on first use)
    times = [[] for _ in submits]
    start = time.perf_counter()
    while len(times[0]) < min_reps or (time.perf_counter() - start < min_time
                                       and len(times[0]) < max_reps):
        for t, submit in zip(times, submits):
            t.append(once(submit))
    return [statistics.median(t) for t in times]


def profiling_queue():
    """An in-order queue with event profiling on the current device, in the default
    queue's context (so USM tensors made by jitconv.empty are usable on it)."""
    import dpctl
    base = jitconv.get_queue()
    return dpctl.SyclQueue(base.sycl_context, base.sycl_device,
                           property=["enable_profiling", "in_order"])


def _filled(nbytes, queue):
    """Device memory whose pages all hold data: an allocation never written maps every
    page to one zero page, which a copy then reads from cache (overstating bandwidth)."""
    import numpy as np
    import dpctl.memory as dpm
    memory = dpm.MemoryUSMDevice(max(nbytes, 1), queue=queue)
    memory.copy_from_host(np.full(max(nbytes, 1), 0x3C, np.uint8))
    return memory


def _copy_figures(nbytes, seconds):
    return {"bytes": 2 * nbytes, "us": seconds * 1e6, "gbps": 2 * nbytes / seconds / 1e9}


def copy_submit(nbytes, queue):
    """A callable submitting a memcpy of ``nbytes`` between two filled buffers on the
    profiling ``queue`` and returning its event (for median_kernel_times)."""
    src, dst = _filled(nbytes, queue), _filled(nbytes, queue)
    return lambda: [queue.memcpy_async(dst, src, nbytes)]


def copy_bandwidth(nbytes=256 << 20, queue=None):
    """Device memcpy of ``nbytes`` between two filled buffers: {"bytes": read + write,
    "us": median time, "gbps"}. With a profiling ``queue`` the time is the copy's own
    (from its events), else the wall time of copy + wait."""
    if queue is not None:
        return _copy_figures(nbytes, median_kernel_times([copy_submit(nbytes, queue)])[0])
    q = jitconv.get_queue()
    src, dst = _filled(nbytes, q), _filled(nbytes, q)
    return _copy_figures(nbytes, median_time(lambda: q.memcpy(dst, src, nbytes)))


def _torch_step(step):
    """The baseline on plain torch tensors (a copy of the state, so runs stay independent)."""
    return {k: (v.clone() if k == "conv_state" else v) for k, v in step.items()}


def _planned_runs(steps, queue):
    """Submit the steps (each a kwargs dict of causal_conv1d_mixed) as plan runs on the
    profiling ``queue`` and return their kernels' events. Plans are built once: only the
    kernels are timed."""
    runs = [(plan_of(step, queue), {k: step[k] for k in DATA_KEYS}) for step in steps]

    def submit():
        with launching.recording() as events:
            for plan, data in runs:
                plan.run(**data)
        return events
    return submit


def run_workload(name, dim, dtype, queue=None):
    """One workload: jitconv as one call and (mixed steps) as two calls, the pure-torch
    baseline, and the device copy of the same number of bytes (filled buffers). With a
    profiling ``queue`` (kernel-only) jitconv's and the copy's times are device times
    from events, measured in turn; the baseline is host code and always wall time."""
    step = make_step(name, dim, dtype)
    split = None
    if "spec_query_start_loc" in step and "non_spec_query_start_loc" in step:
        split = split_step(step)
    moved = bytes_moved(step)
    if queue is None:
        one = median_time(lambda: jitconv.causal_conv1d_mixed(**step))
        two = None if split is None else median_time(
            lambda: [jitconv.causal_conv1d_mixed(**part) for part in split])
        copy = copy_bandwidth(moved // 2)  # read + write = the bytes the conv moves
    else:  # kernels and copy in turn: the same load on a shared machine
        submits = [copy_submit(moved // 2, queue), _planned_runs([step], queue)]
        if split is not None:
            submits.append(_planned_runs(split, queue))
        copy_s, one, *two = median_kernel_times(submits)
        two = two[0] if two else None
        copy = _copy_figures(moved // 2, copy_s)
    tstep = _torch_step(step)
    base = median_time(lambda: causal_conv1d_mixed_torch(**tstep), min_reps=3)
    return dict(workload=name, dtype=str(dtype).replace("torch.", ""), dim=dim,
                tokens=int(step["x"].shape[0]), bytes=moved, one_us=one * 1e6,
                two_us=None if two is None else two * 1e6, torch_us=base * 1e6,
                gbps=moved / one / 1e9, copy_bytes=copy["bytes"], copy_us=copy["us"],
                copy_gbps=copy["gbps"])


def percent_of_copy(row, key):
    """A time of a result row (one_us, two_us, torch_us) as % of the copy bandwidth
    measured for that row: 100 x copy time / that time (both move the same bytes)."""
    return None if row[key] is None else 100 * row["bytes"] / (row[key] * 1e3) / row[
        "copy_gbps"]


@contextlib.contextmanager
def _submits_recorded():
    """Inside the block nothing is submitted: every launch's ``submit_packed`` arguments
    are appended to the yielded list instead (to time jitconv's host work alone, then the
    runtime's submit of the same arguments alone)."""
    submitted = []
    original = launching.submit_packed
    def record(kernel, queue, values, grid, wait, after=None):
        submitted.append((kernel, queue, values, grid, wait))
    launching.submit_packed = record
    try:
        yield submitted
    finally:
        launching.submit_packed = original


def host_overhead():
    """Per-call time of a decode batch too small for the kernel to matter: host cost.
    Also the bare submit + wait of the prebuilt kernel with the same arguments."""
    step = make_step("decode-only 64", 64, torch.float32)
    per_call = median_time(lambda: jitconv.causal_conv1d_mixed(**step), min_reps=50)
    with _submits_recorded() as submitted:
        jitconv.causal_conv1d_mixed(**step)
    args = submitted[-1]
    submit = median_time(lambda: launching.submit_packed(*args), min_reps=50)
    return per_call * 1e6, submit * 1e6


def _metadata(step):
    return {k: v for k, v in step.items() if k not in DATA_KEYS}


def plan_of(step, queue=None):
    """The step's plan (``jitconv.plan`` from its tensors' shapes and its metadata)."""
    lines, _dim, state_len = step["conv_state"].shape
    return jitconv.plan(step["x"].shape[0], lines, state_len, step["weight"].shape[-1],
                        queue=queue, **_metadata(step))


def _layers(step, count, seed=1):
    """``count`` layers of the step's shape: their own x, weight, bias, conv_state and
    out, all in USM memory (distinct tensors, as a model's layers have)."""
    gen = torch.Generator().manual_seed(seed)
    layers = []
    for _ in range(count):
        layer = {k: random_values(gen, tuple(step[k].shape), step["x"].dtype, usm=True)
                 for k in ("x", "weight", "bias")}
        stored = tuple(step["conv_state"].transpose(1, 2).shape)
        layer["conv_state"] = random_values(gen, stored, step["x"].dtype,
                                            usm=True).transpose(1, 2)
        layer["out"] = jitconv.empty(tuple(step["x"].shape), step["x"].dtype)
        layers.append(layer)
    return layers


def layer_loop(name, dim, dtype, layers=48, distinct=4, reps=3):
    """One engine step of a ``layers``-layer model: ``jitconv.plan`` once and a run per
    layer, against a one-shot ``causal_conv1d_mixed`` per layer. Runs go to an in-order
    profiling queue, so the kernels' own time is read from their events, in the same
    steps whose wall time is reported (the median one). Layer tensors
    are USM torch CPU tensors (runs wait for their kernel: host code may read them);
    ``distinct`` sets of them are cycled to bound memory. A new plan per step, as an
    engine has new metadata each step; the layers' tensors are those of the step before,
    so their checked launches are reused (``run_cache``), and a second figure empties
    that cache before every run (every layer's tensors new)."""
    step = make_step(name, dim, dtype)
    meta = _metadata(step)
    sets = _layers(step, distinct)
    queue = profiling_queue()

    def planned(checked=False):
        plan = plan_of(step, queue)
        for i in range(layers):
            if checked:  # as if every layer's tensors were new this step
                SYCL_STATE.runs.clear()
            plan.run(**sets[i % distinct])

    def one_shot():
        for i in range(layers):
            jitconv.causal_conv1d_mixed(**sets[i % distinct], **meta)

    def median_step(checked):
        runs = []  # (wall time, kernel time) of the same step: the kernels ran inside it
        for _ in range(reps):
            with launching.recording() as events:
                t0 = time.perf_counter()
                planned(checked)
                wall = time.perf_counter() - t0
            runs.append((wall, sum(e.profiling_info_end - e.profiling_info_start
                                   for e in events) / 1e9))
        return sorted(runs)[len(runs) // 2]

    planned()  # warm-up; later steps find each layer's launch checked (run_cache)
    plan_s, kernel_s = median_step(False)
    checked_s, checked_kernel_s = median_step(True)
    one_s = median_time(one_shot, min_time=0, min_reps=reps, max_reps=reps)
    return dict(workload=name, dtype=str(dtype).replace("torch.", ""), dim=dim,
                layers=layers, plan_step_us=plan_s * 1e6, one_shot_step_us=one_s * 1e6,
                kernel_us=kernel_s * 1e6,
                host_us_per_layer=(plan_s - kernel_s) / layers * 1e6,
                checked_step_us=checked_s * 1e6, checked_kernel_us=checked_kernel_s * 1e6,
                checked_host_us_per_layer=(checked_s - checked_kernel_s) / layers * 1e6,
                one_shot_host_us_per_layer=(one_s - kernel_s) / layers * 1e6,
                kernel_share=kernel_s / plan_s)


def tiny_run_cost(runs=1000):
    """Wall time per ``StepPlan.run`` of a tiny decode (1 sequence, dim 64, float32) over
    ``runs`` runs, and of a one-shot call (plan + run). "waits": USM torch CPU tensors,
    so every run waits for its kernel; "pipelined": device memory on an in-order queue,
    one wait at the end (how torch XPU tensors on torch's stream run). Runs repeat the
    same tensors, so after the first they reuse the checked launch (``run_cache``);
    "checked": pipelined with that cache emptied before every run (new tensors). One-shot
    calls repeat the metadata, so they reuse its plan (``plan_cache``); "new": both
    caches emptied before every call. "python": pipelined runs with the runtime's submit
    skipped; "submit": the runtime's submit alone, of the same packed arguments."""
    import dpctl
    step = mixed_step(torch.Generator().manual_seed(0), dim=64, width=4,
                      dtype=torch.float32, ns_lengths=[1], usm=True)
    meta = _metadata(step)
    data = {k: step[k] for k in DATA_KEYS}
    lines, _dim, state_len = step["conv_state"].shape
    out = jitconv.empty((1, 64))
    plan = jitconv.plan(1, lines, state_len, 4, **meta)
    plan.run(**data, out=out)

    def loop(run, n):
        t0 = time.perf_counter()
        for _ in range(n):
            run()
        return (time.perf_counter() - t0) / n

    waits = loop(lambda: plan.run(**data, out=out), runs)
    one_shot = loop(lambda: jitconv.causal_conv1d_mixed(**data, **meta, out=out), runs // 4)

    def one_shot_new():  # as if metadata and tensors were new: validate, build, check
        plan_cache.clear()
        SYCL_STATE.runs.clear()
        jitconv.causal_conv1d_mixed(**data, **meta, out=out)

    one_shot_new_s = loop(one_shot_new, runs // 4)
    base = jitconv.get_queue()
    queue = dpctl.SyclQueue(base.sycl_context, base.sycl_device, property="in_order")
    device = {k: DeviceArray(v, queue) for k, v in data.items()}
    device_out = DeviceArray(out, queue)
    qplan = jitconv.plan(1, lines, state_len, 4, queue=queue, **meta)
    qplan.run(**device, out=device_out)
    queue.wait()

    def pipelined(checked):
        t0 = time.perf_counter()
        for _ in range(runs):
            if checked:  # as if the tensors were new: every run is checked and packed
                SYCL_STATE.runs.clear()
            qplan.run(**device, out=device_out)
        queue.wait()
        return (time.perf_counter() - t0) / runs

    result = dict(run_waits_us=waits * 1e6, run_pipelined_us=pipelined(False) * 1e6,
                  run_checked_us=pipelined(True) * 1e6, one_shot_us=one_shot * 1e6,
                  one_shot_new_us=one_shot_new_s * 1e6)
    # The same pipelined runs split in two: jitconv's own Python (the runtime's submit
    # skipped), and the runtime's submit alone (the packed arguments of the last run).
    with _submits_recorded() as submitted:
        result["python_us"] = pipelined(False) * 1e6
        result["python_checked_us"] = pipelined(True) * 1e6
    kernel, _queue, values, grid, _wait = submitted[-1]
    t0 = time.perf_counter()
    for _ in range(runs):
        launching.submit_packed(kernel, queue, values, grid, False)
    queue.wait()
    result["submit_us"] = (time.perf_counter() - t0) / runs * 1e6
    return result


_COLD_CHILD = """
import json, time, torch
t0 = time.perf_counter()
import jitconv
t1 = time.perf_counter()
x, w, st = torch.randn(64, 2048).bfloat16(), torch.randn(2048, 4).bfloat16(), torch.randn(64, 2048, 3).bfloat16()
jitconv.causal_conv1d_update(x, w, None, st, torch.arange(64, dtype=torch.int32))
t2 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "first_call_s": t2 - t1}))
"""


def cold_start():
    """First call in a new process: with an empty kernel cache, then with a warm one."""
    results = {}
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, JITCONV_CACHE_DIR=cache, JITCONV_DEVICE=jitconv.get_device())
        for label in ("empty cache", "warm cache"):
            done = subprocess.run([sys.executable, "-c", _COLD_CHILD], env=env,
                                  capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                raise RuntimeError(done.stderr[-2000:])
            results[label] = json.loads(done.stdout.strip().splitlines()[-1])
    return results


SERIES = (("one_us", "jitconv, one call", "tab:blue"),
          ("two_us", "jitconv, two calls (non-spec + spec)", "tab:cyan"),
          ("torch_us", "pure torch", "tab:gray"))


def plot(panels, path):
    """% of copy bandwidth per workload: one bar per series for each row. ``panels``:
    [(title, rows)] or [(title, rows, series)], one subplot each, side by side (this
    device's run beside another device's results: rows with "workload", "dtype", "dim"
    and, per series key, "pct_<key>" or None); series default to ``SERIES`` (one call,
    two calls, pure torch); ``jitconv.bench.gpu.panel`` makes the H200's."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = [tuple(p) + (SERIES,) if len(p) == 2 else tuple(p) for p in panels]
    widest = max(len(rows) for _t, rows, _s in panels)
    fig, axes = plt.subplots(1, len(panels), figsize=(max(8, 0.55 * widest) * len(panels), 5),
                             squeeze=False, sharey=True)
    for ax, (title, rows, series) in zip(axes[0], panels):
        width = 0.8 / len(series)
        for k, (key, label, color) in enumerate(series):
            shift = (k - (len(series) - 1) / 2) * width
            xs = [i + shift for i, r in enumerate(rows) if r.get(f"pct_{key}")]
            ys = [r[f"pct_{key}"] for r in rows if r.get(f"pct_{key}")]
            ax.bar(xs, ys, width, color=color, label=label)
        ax.axhline(100, color="tab:red", linestyle="--", label="device copy (same bytes)")
        ax.axhline(60, color="tab:orange", linestyle=":", label="target: 60% of copy")
        labels = [f"{r['workload']}\n{r['dtype']} d{r['dim']}" for r in rows]
        ax.set_xticks(range(len(rows)), labels, rotation=60, ha="right", fontsize=7)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    axes[0][0].set_ylabel("% of copy bandwidth (bytes that must move)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(dims=(2048, 8192), dtypes=("bfloat16", "float32"), workloads=None,
        plot_path="bench.png", cold=True, out=sys.stdout, layers=48, layer_dim=8192,
        layer_dtype="bfloat16", layer_workloads=("decode-only 64", "mixed step"),
        kernel_only=False):
    """Run the benchmark, print the table; returns a dict with every figure.
    ``kernel_only``: jitconv's and the copies' times are device times from profiling
    events (no host cost) instead of the wall time of whole calls."""
    def say(text=""):
        print(text, file=out, flush=True)

    workloads = list(workloads or WORKLOADS)
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown:
        raise ValueError(f"workloads: unknown {unknown}; expected names from {list(WORKLOADS)}")
    say(f"device: {jitconv.get_device()}")
    queue = profiling_queue() if kernel_only else None
    timing = "kernel" if kernel_only else "wall"
    copy = copy_bandwidth(queue=queue)
    copy_gbps = copy["gbps"]
    say(f"device copy bandwidth (memcpy of 256 MiB, filled buffers, read + write): "
        f"{copy_gbps:.1f} GB/s")
    say("times: " + ("jitconv's kernels from profiling events (no host cost), pure torch "
                     "wall time" if kernel_only else "wall time of whole calls (host cost "
                     "included)") + "; % copy: against a copy of the workload's own bytes "
        "(filled buffers), measured beside it")
    rows = []
    total = len(dims) * len(dtypes) * len(workloads)
    header = (f"{'workload':22s} {'dtype':8s} {'dim':>5s} {'tokens':>6s} {'one call':>10s} "
              f"{'GB/s':>6s} {'% copy':>6s} {'two calls':>10s} {'% copy':>6s} {'copy':>5s} "
              f"{'torch':>11s} {'vs torch':>8s}")
    say(header)
    for dim in dims:
        for dtype_name in dtypes:
            for name in workloads:
                r = run_workload(name, dim, getattr(torch, dtype_name), queue)
                for key, _label, _color in SERIES:
                    r[f"pct_{key}"] = percent_of_copy(r, key)
                r["pct_copy"] = r["pct_one_us"]
                r["speedup"] = r["torch_us"] / r["one_us"]
                rows.append(r)
                two = (f"{r['two_us']:8.0f}us {r['pct_two_us']:5.1f}%" if r["two_us"]
                       else f"{'-':>10s} {'-':>6s}")
                say(f"{name:22s} {r['dtype']:8s} {dim:5d} {r['tokens']:6d} "
                    f"{r['one_us']:8.0f}us {r['gbps']:6.2f} {r['pct_copy']:5.1f}% {two} "
                    f"{r['copy_gbps']:5.1f} {r['torch_us']:9.0f}us {r['speedup']:7.1f}x"
                    f"   [{len(rows)}/{total}]")
    per_call, submit = host_overhead()
    say(f"host overhead: {per_call:.0f} us per call for a tiny decode batch (64 x 1, dim 64)"
        f" end to end; bare kernel submit + wait {submit:.0f} us")
    tiny = tiny_run_cost()
    say(f"tiny decode (1 x 1, dim 64), wall time per call over a loop: plan.run "
        f"{tiny['run_waits_us']:.0f} us (USM tensors, waits for each kernel), "
        f"{tiny['run_pipelined_us']:.0f} us (device memory, in-order queue, one wait at "
        f"the end), {tiny['run_checked_us']:.0f} us (the same, every run checked as if "
        f"its tensors were new); one-shot call {tiny['one_shot_us']:.0f} us (metadata of "
        f"the call before: its plan is reused), {tiny['one_shot_new_us']:.0f} us (new "
        f"metadata and tensors)")
    say(f"  of a pipelined run: jitconv's Python {tiny['python_us']:.0f} us "
        f"({tiny['python_checked_us']:.0f} us when checked), the SYCL runtime's submit "
        f"of the packed arguments {tiny['submit_us']:.0f} us")
    loops = []
    for name in layer_workloads if layers else ():
        r = layer_loop(name, layer_dim, getattr(torch, layer_dtype), layers=layers)
        loops.append(r)
        say(f"{layers}-layer step, {name}, {r['dtype']} dim {layer_dim}: plan + runs "
            f"{r['plan_step_us'] / 1e3:.2f} ms, one-shot calls "
            f"{r['one_shot_step_us'] / 1e3:.2f} ms, kernels {r['kernel_us'] / 1e3:.2f} ms "
            f"({100 * r['kernel_share']:.0f}% of the planned step); outside the kernels "
            f"per layer: {r['host_us_per_layer']:.0f} us planned, "
            f"{r['checked_host_us_per_layer']:.0f} us planned with new tensors, "
            f"{r['one_shot_host_us_per_layer']:.0f} us one-shot")
    result = dict(device=jitconv.get_device(), timing=timing,
                  grid=dict(dims=list(dims), dtypes=list(dtypes), workloads=workloads),
                  copy_gbps=copy_gbps,
                  copy_bytes=copy["bytes"], copy_us=copy["us"], rows=rows,
                  host_us_per_call=per_call, submit_us=submit, tiny_decode=tiny,
                  layer_loops=loops)
    if cold:
        starts = cold_start()
        for label, t in starts.items():
            say(f"new process, {label}: import {t['import_s']:.2f} s, "
                f"first call {t['first_call_s']:.3f} s")
        result["cold_start"] = starts
    if plot_path:
        try:
            plot([(f"jitconv on {jitconv.get_device()} ({timing} time)", rows)], plot_path)
            say(f"plot: {plot_path}")
        except ImportError:
            say("plot skipped: matplotlib is not installed")
    return result


def inconsistencies(result):
    """What does not add up in a result of ``run`` (an empty list when all is well): every
    workload of the grid measured once, bytes as ``bytes_moved`` counts them, GB/s equal to
    bytes / time, each row's copy of the row's own bytes, % of copy (one call, two calls,
    torch) and the speedup equal to their ratios, two calls measured
    exactly for the steps that have both kinds of sequences. Timings themselves are never
    judged: these machines are shared and noisy."""
    problems = []

    def differ(a, b):
        return not math.isclose(a, b, rel_tol=1e-9)

    if differ(result["copy_gbps"], result["copy_bytes"] / result["copy_us"] / 1e3):
        problems.append("copy_gbps is not copy_bytes / copy_us")
    grid = result["grid"]
    want = [(w, t, d) for d in grid["dims"] for t in grid["dtypes"] for w in grid["workloads"]]
    got = [(r["workload"], r["dtype"], r["dim"]) for r in result["rows"]]
    if sorted(got) != sorted(want):
        problems.append(f"rows {got} are not the grid {want}")
    for r in result["rows"]:
        name = f"{r['workload']} {r['dtype']} d{r['dim']}"
        ns_lengths, sp_lengths = WORKLOADS[r["workload"]]
        if r["tokens"] != sum(ns_lengths) + sum(sp_lengths):
            problems.append(f"{name}: {r['tokens']} tokens")
        step = make_step(r["workload"], r["dim"], getattr(torch, r["dtype"]))
        if r["bytes"] != bytes_moved(step):
            problems.append(f"{name}: bytes {r['bytes']} != {bytes_moved(step)}")
        times = [r["one_us"], r["torch_us"]] + ([r["two_us"]] if r["two_us"] else [])
        if not all(math.isfinite(t) and t > 0 for t in times):
            problems.append(f"{name}: a time is not positive: {times}")
            continue
        if differ(r["gbps"], r["bytes"] / r["one_us"] / 1e3):
            problems.append(f"{name}: GB/s is not bytes / time")
        if differ(r["copy_gbps"], r["copy_bytes"] / r["copy_us"] / 1e3):
            problems.append(f"{name}: copy GB/s is not copy bytes / copy time")
        if abs(r["copy_bytes"] - r["bytes"]) > 1:  # a copy of the workload's own bytes
            problems.append(f"{name}: copy of {r['copy_bytes']} bytes, not {r['bytes']}")
        if differ(r["pct_copy"], 100 * r["gbps"] / r["copy_gbps"]):
            problems.append(f"{name}: % of copy is not GB/s / copy GB/s")
        for key in ("two_us", "torch_us"):
            if r[key] is not None and (r[f"pct_{key}"] is None or differ(
                    r[f"pct_{key}"], 100 * r["bytes"] / r[key] / 1e3 / r["copy_gbps"])):
                problems.append(f"{name}: % of copy of {key} is not its GB/s / copy GB/s")
        if differ(r["speedup"], r["torch_us"] / r["one_us"]):
            problems.append(f"{name}: speedup is not torch time / jitconv time")
        if (r["two_us"] is not None) != bool(ns_lengths and sp_lengths):
            problems.append(f"{name}: two calls measured for the wrong kind of step")
    for key in ("host_us_per_call", "submit_us"):
        if not result[key] > 0:
            problems.append(f"{key} = {result[key]}")
    for r in result["layer_loops"]:
        name = f"{r['layers']}-layer {r['workload']}"
        if differ(r["host_us_per_layer"], (r["plan_step_us"] - r["kernel_us"]) / r["layers"]):
            problems.append(f"{name}: host time per layer is not (step - kernels) / layers")
        if differ(r["checked_host_us_per_layer"],
                  (r["checked_step_us"] - r["checked_kernel_us"]) / r["layers"]):
            problems.append(f"{name}: host time per layer (new tensors) is not (step - "
                            f"kernels) / layers")
        if differ(r["kernel_share"], r["kernel_us"] / r["plan_step_us"]):
            problems.append(f"{name}: kernel share is not kernels / step")
        if not r["kernel_share"] > 0:
            problems.append(f"{name}: kernel share {r['kernel_share']} is not positive")
    if not all(v > 0 for v in result["tiny_decode"].values()):
        problems.append(f"tiny decode: {result['tiny_decode']}")
    return problems

