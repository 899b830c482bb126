"""Where in a step the drop-ins' host time with new metadata goes: each layer of a step
timed on its own (``time.perf_counter`` around each layer's conv calls, made as vLLM
0.32's ``_forward_core`` makes them, ``jitconv.bench.steps.vllm_conv``), one
synchronization per step, so the first layer (which builds the step's device plans) and
the others are told apart. Per workload (dim 8192, 36 layers, bfloat16), microseconds,
median over 30 steps: layer 0, layer 1, the median of layers 2-35, and the whole step per
layer (its wall, the GPU's tail included, / 36); for vLLM's calls and the drop-ins, each
with metadata new every step (cloned before the step, as an engine's builder makes them)
and kept, and the drop-ins with new metadata and Python's garbage collector off during
the steps (collected before each). Then, on the mixed step, one call of each part per
call (median of 2000, kept metadata): the public drop-in, the drop-in module's function,
its device path (``_device_update`` / ``_device_fn``) and ``plan.run``. First, per
workload, the synchronizing calls torch reports (``torch.cuda.set_sync_debug_mode``) in a
step of each side with new metadata.

    PYTHONPATH=$PWD python3 benchmarks/h200/dropin_layers.py .peers/v032/causal_conv1d.py
"""

import gc
import warnings
import os
import statistics
import sys
import time

import torch

import jitconv
import jitconv.vllm
from jitconv.api import plan_cache
from jitconv.bench import stage as bs
from jitconv.bench import steps as bsteps
from jitconv.bench.gpu import load_vllm_triton
from jitconv.vllm import dropins

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from host_pieces import per_call, recorded_steps  # noqa: E402  (a script beside)

DIM = 8192
WORKLOADS = ("decode 64", "spec 64 x (1+3)", "mixed 512 + 32 + 16 x 4")


def layer_times(update, fn, base, new, steps=30, collect=True):
    """{label: median us} of each layer's calls timed alone (see the module's text)."""
    firsts, seconds, rests, wholes = [], [], [], []
    kept = bsteps.fresh(base)
    for i in range(steps + 3):
        s = bsteps.fresh(base) if new else kept
        if not collect:
            gc.collect()
            gc.disable()
        torch.cuda.synchronize()
        times = []
        t0 = time.perf_counter()
        for L in s.layers:
            a = time.perf_counter()
            bsteps.vllm_conv(s, L, update, fn)
            times.append(time.perf_counter() - a)
        torch.cuda.synchronize()
        whole = time.perf_counter() - t0
        gc.enable()
        if i >= 3:
            firsts.append(times[0])
            seconds.append(times[1])
            rests.append(statistics.median(times[2:]))
            wholes.append(whole / len(times))
    med = statistics.median
    return {"layer 0": med(firsts) * 1e6, "layer 1": med(seconds) * 1e6,
            "layers 2-35": med(rests) * 1e6, "step / 36": med(wholes) * 1e6}


def synchronizing(update, fn, base):
    """The warnings of torch's sync debug mode in one step of the calls (new metadata)."""
    s = bsteps.fresh(base)
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for L in s.layers:
                bsteps.vllm_conv(s, L, update, fn)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    # (other warnings raised meanwhile, and the mode's own notice, are not syncs)
    return [str(w.message).splitlines()[0] for w in caught
            if "synchronizing CUDA operation" in str(w.message)]


def main(vllm_file):
    jitconv.set_device("cuda:0")
    device = torch.device("cuda:0")
    vt = load_vllm_triton(vllm_file)
    sides = {"vllm": (vt.causal_conv1d_update, vt.causal_conv1d_fn),
             "drop-ins": (jitconv.vllm.causal_conv1d_update, jitconv.vllm.causal_conv1d_fn)}
    with torch.inference_mode():
        for name, base in recorded_steps(WORKLOADS, DIM, device):
            print(f"{name}, dim {DIM}, us")
            for side, (update, fn) in sides.items():
                found = synchronizing(update, fn, base)
                print(f"  {side}: {len(found)} synchronizing calls in a step"
                      + (f", first: {found[0]}" if found else ""))
            rows = {}
            for rep in range(2):  # sides in turn, twice
                for side, (update, fn) in sides.items():
                    for label, new, collect in (("new metadata", True, True),
                                                ("kept metadata", False, True),
                                                ("new metadata, gc off", True, False)):
                        if side == "vllm" and not collect:
                            continue
                        got = layer_times(update, fn, base, new, collect=collect)
                        rows.setdefault(f"{side}, {label}", []).append(got)
            for label, runs in rows.items():
                cells = "  ".join(f"{k} {' / '.join(f'{r[k]:6.1f}' for r in runs)}"
                                  for k in runs[0])
                print(f"  {label:<30}{cells}")
            ns, sp = bs.WORKLOADS[name]
            if ns and sp:
                s = bsteps.fresh(base)
                m, v = s.meta, s.vllm
                L = s.layers[0]
                w, b, st = L["weight"], L["bias"], L["state"]
                xs = L["x"].index_select(0, m["spec_token_indx"])
                xn = L["x"].index_select(0, m["non_spec_token_indx"]).transpose(0, 1)
                nsp = len(m["spec_query_start_loc"]) - 1
                lines = v["spec_block_table"][:, 0][:nsp]
                bound = v["spec_block_table"].size(-1)
                ukw = dict(conv_state_indices=lines,
                           num_accepted_tokens=m["num_accepted_tokens"],
                           query_start_loc=m["spec_query_start_loc"], max_query_len=bound,
                           validate_data=False)
                fkw = dict(activation="silu", conv_states=st,
                           has_initial_state=m["has_initial_state"],
                           cache_indices=m["non_spec_state_indices"],
                           query_start_loc=m["non_spec_query_start_loc"], metadata=s.fn_meta)
                plan_cache.clear()  # (so that the two plans below are the last two)
                jitconv.vllm.causal_conv1d_update(xs, st, w, b, "silu", **ukw)
                jitconv.vllm.causal_conv1d_fn(xn, w, b, **fkw)
                plans = [p for k, p in plan_cache._plans.items() if k[0] == "device plan"]
                update_plan = [p for p in plans if p.num_sp][-1]
                fn_plan = [p for p in plans if not p.num_sp][-1]
                tokens = xn.transpose(0, 1)
                pieces = {
                    "update: public drop-in": lambda: jitconv.vllm.causal_conv1d_update(
                        xs, st, w, b, "silu", **ukw),
                    "update: dropins.causal_conv1d_update": lambda:
                        dropins.causal_conv1d_update(xs, st, w, b, "silu", **ukw),
                    "update: _device_update": lambda: dropins._device_update(
                        xs, st, w, b, "silu", lines, m["num_accepted_tokens"],
                        m["spec_query_start_loc"], bound, 0, xs, None),
                    "update: plan.run": lambda: update_plan.run(xs, w, b, st, out=xs,
                                                                activation="silu"),
                    "fn: public drop-in": lambda: jitconv.vllm.causal_conv1d_fn(xn, w, b,
                                                                               **fkw),
                    "fn: dropins.causal_conv1d_fn": lambda: dropins.causal_conv1d_fn(
                        xn, w, b, **fkw),
                    "fn: _device_fn": lambda: dropins._device_fn(
                        xn, w, b, st, m["non_spec_query_start_loc"],
                        m["non_spec_state_indices"], m["has_initial_state"], "silu", -1, 0),
                    "fn: plan.run": lambda: fn_plan.run(tokens, w, b, st, activation="silu"),
                    "torch.empty of the fn's output": lambda: torch.empty(
                        tokens.shape, dtype=tokens.dtype, device=device)}
                for k, call in pieces.items():
                    print(f"  per call {k:<40}{per_call(call):8.2f} us")
            sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1])
