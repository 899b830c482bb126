"""Where the drop-ins' host time goes (``jitconv.vllm.causal_conv1d_update`` /
``causal_conv1d_fn`` called as vLLM 0.32's ``_forward_core`` calls them,
``jitconv.bench.steps``' method): per workload (dim 8192, 36 layers, bfloat16), wall
microseconds per layer, median of 30 steps, one synchronization per step, each side with
the step's metadata new (cloned before the step, as an engine's builder makes them) and
kept (the same tensors every step):
- "vllm conv": vLLM's own calls (the reference of the ratio);
- "drop-ins": the whole calls (index_select of each part on mixed steps included);
- "index_selects": the mixed step's two index_select calls alone;
- "update only" / "fn only": one drop-in call per layer on inputs selected before timing;
then the runs' fate per step with new metadata (own kept run, a run of the plan's
signature patched, or prepared by ``launching.launch``), and on the decode step the
layers of one call, per call (median of 2000, kept metadata): the public function, the
drop-in module's, ``_device_update`` and ``plan.run``. Last, a cProfile of 20 decode
steps of drop-ins with new and with kept metadata (functions by own time): what new
metadata adds; and on the mixed step one of 10 steps of the update calls alone and of the
fn calls alone, metadata new.

    PYTHONPATH=$PWD python3 benchmarks/h200/dropin_pieces.py .peers/v032/causal_conv1d.py
"""

import cProfile
import io
import os
import pstats
import sys

import torch

import jitconv
import jitconv.vllm
from jitconv.backends.cuda import launching
from jitconv.bench import stage as bs
from jitconv.bench import steps as bsteps
from jitconv.bench.gpu import load_vllm_triton
from jitconv.vllm import dropins

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from host_pieces import per_call, per_layer, recorded_steps  # noqa: E402  (a script beside)

DIM = 8192
WORKLOADS = ("decode 64", "spec 64 x (1+3)", "mixed 512 + 32 + 16 x 4")


def fates(call, base, steps=5):
    """Per step with new metadata: how many runs were the plan's own, patched from the
    signature's, or prepared."""
    counts = {"prepared": 0, "own or patched": 0}
    real = launching.launch

    def counting(*a, **k):
        counts["prepared"] += 1
        return real(*a, **k)
    real_kept = launching._kept_run

    def kept_run(*args):
        found = real_kept(*args)
        if found[0] is not None:
            counts["own or patched"] += 1
        return found
    launching.launch, launching._kept_run = counting, kept_run
    try:
        for _ in range(steps):
            call(bsteps.fresh(base))
        torch.cuda.synchronize()
    finally:
        launching.launch, launching._kept_run = real, real_kept
    return {k: v / steps for k, v in counts.items()}


def profile(call, steps):
    """cProfile's table (functions by own time) of ``call`` on each of ``steps``."""
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for one in steps:
        call(one)
    torch.cuda.synchronize()
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(22)
    return text.getvalue()


def main(vllm_file):
    jitconv.set_device("cuda:0")
    device = torch.device("cuda:0")
    vt = load_vllm_triton(vllm_file)
    drop = (jitconv.vllm.causal_conv1d_update, jitconv.vllm.causal_conv1d_fn)
    with torch.inference_mode():
        for name, base in recorded_steps(WORKLOADS, DIM, device):
            ns, sp = bs.WORKLOADS[name]
            mixed = bool(ns) and bool(sp)

            def vllm(s):
                for L in s.layers:
                    bsteps.vllm_conv(s, L, vt.causal_conv1d_update, vt.causal_conv1d_fn)

            def dropin(s):
                for L in s.layers:
                    bsteps.vllm_conv(s, L, *drop)
            rows, profiled = {}, {}
            for label, call in (("vllm conv", vllm), ("drop-ins", dropin)):
                rows[f"{label}, new metadata"] = per_layer(call, base)
                rows[f"{label}, kept metadata"] = per_layer(call, base, new=False)
            if mixed:
                def selects(s):
                    for L in s.layers:
                        L["x"].index_select(0, s.meta["spec_token_indx"])
                        L["x"].index_select(0, s.meta["non_spec_token_indx"])
                sel_sp = [L["x"].index_select(0, base.meta["spec_token_indx"])
                          for L in base.layers]
                sel_ns = [L["x"].index_select(0, base.meta["non_spec_token_indx"])
                          for L in base.layers]

                def update_only(s):
                    m, v = s.meta, s.vllm
                    nsp = len(m["spec_query_start_loc"]) - 1
                    for L, xs in zip(s.layers, sel_sp):
                        drop[0](xs, L["state"], L["weight"], L["bias"], "silu",
                                conv_state_indices=v["spec_block_table"][:, 0][:nsp],
                                num_accepted_tokens=m["num_accepted_tokens"],
                                query_start_loc=m["spec_query_start_loc"],
                                max_query_len=v["spec_block_table"].size(-1),
                                validate_data=False)

                def fn_only(s):
                    m = s.meta
                    for L, xn in zip(s.layers, sel_ns):
                        drop[1](xn.transpose(0, 1), L["weight"], L["bias"], activation="silu",
                                conv_states=L["state"], has_initial_state=m["has_initial_state"],
                                cache_indices=m["non_spec_state_indices"],
                                query_start_loc=m["non_spec_query_start_loc"],
                                metadata=s.fn_meta)
                for label, call in (("index_selects", selects), ("update only", update_only),
                                    ("fn only", fn_only)):
                    rows[f"{label}, new metadata"] = per_layer(call, base)
                    rows[f"{label}, kept metadata"] = per_layer(call, base, new=False)
                for label, call in (("update only", update_only), ("fn only", fn_only)):
                    profiled[label] = profile(call, [bsteps.fresh(base) for _ in range(10)])
            print(f"{name}, dim {DIM}")
            for label, text in profiled.items():
                print(f"  cProfile, mixed step's {label}, new metadata, 10 steps:\n{text}")
            for k, v in rows.items():
                print(f"  {k:<34}{v:8.2f} us per layer")
            for k, v in fates(dropin, base).items():
                print(f"  runs per step, {k:<20}{v:8.1f}")
            if name.startswith("decode"):
                s = bsteps.fresh(base)
                L = s.layers[0]
                x, st, w, b = L["x"], L["state"], L["weight"], L["bias"]
                lines = s.meta["non_spec_state_indices"]
                args = (x, st, w, b, "silu")
                kw = dict(conv_state_indices=lines, validate_data=True)
                jitconv.vllm.causal_conv1d_update(*args, **kw)
                plan = [p for k, p in dropins.device_calls.plan_cache._plans.items()
                        if k[1] == "vllm update"][-1]
                pieces = {
                    "public drop-in": lambda: jitconv.vllm.causal_conv1d_update(*args, **kw),
                    "dropins.causal_conv1d_update": lambda: dropins.causal_conv1d_update(
                        *args, **kw),
                    "_device_update": lambda: dropins._device_update(
                        x, st, w, b, "silu", lines, None, None, -1, 0, x, None),
                    "plan.run": lambda: plan.run(x, w, b, st, out=x, activation="silu")}
                for k, fn in pieces.items():
                    print(f"  per call {k:<30}{per_call(fn):8.2f} us")
                for label, new in (("new", True), ("kept", False)):
                    steps = [bsteps.fresh(base) if new else s for _ in range(20)]
                    print(f"  cProfile, decode drop-ins, {label} metadata, 20 steps:")
                    print(profile(dropin, steps))
            sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1])
