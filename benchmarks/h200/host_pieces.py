"""Where a layer's host time goes in the plugin's whole-step mode when the step's metadata
tensors are new at every step (``jitconv.bench.steps``' method), measured piece by piece
without a profiler (a profiler's per-call cost distorts calls of a few microseconds).

Per workload (dim 8192, 36 layers, bfloat16), microseconds per layer, median of 30 steps
of 36 layers, one synchronization per step, metadata made before each step's timing:
- "vllm update": vLLM 0.32's conv calls as its layer makes them (``jitconv.bench.steps``);
- "whole-step, new metadata": ``gdn_conv_step`` as the plugin calls it, a new record of new
  metadata tensors each step (what an engine does);
- "whole-step, kept record": the same record every step (each layer's run remembered);
- "plan.run, kept device plan": the step's device plan built once, ``plan.run`` per layer
  with the plugin's arguments (the floor of the remembered path);
- "plan build": the first ``_layer_plan`` of a step, per step / 36;
- "drop-ins": vLLM's conv calls with jitconv.vllm's drop-ins, new metadata each step or
  the same.
Then single pieces, per call (median of 2000): run_key, a kept run's launch for the plan
it is bound to and for two plans in turn (each run binding its plan's words),
_to_state_dtype, _layer_plan on a record that has its plan; on the decode
step the drop-in's call as vLLM's layer makes it and vLLM's slice of its lines argument.

    PYTHONPATH=$PWD python3 benchmarks/h200/host_pieces.py .peers/v032/causal_conv1d.py
"""

import statistics
import sys
import time

import torch

import jitconv
import jitconv.vllm
from jitconv.backends.cuda import driver, launching
from jitconv.backends.cuda.state import STATE
from jitconv.bench import stage as bs
from jitconv.bench import steps as bsteps
from jitconv.bench.gpu import load_vllm_triton
from jitconv.kernels.abi import SPLIT_NONE, SPLIT_SLOTS
from jitconv.vllm import dropins
from jitconv.vllm.plugin import whole_step_outputs

DIM = 8192
WORKLOADS = ("decode 64", "spec 64 x (1+3)", "mixed 512 + 32 + 16 x 4")


def per_layer(step_call, base, steps=30, new=True):
    """Median wall us per layer of ``step_call(s)`` (s: a fresh step when ``new``)."""
    walls = []
    kept = bsteps.fresh(base)
    for i in range(steps + 3):
        s = bsteps.fresh(base) if new else kept
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step_call(s)
        torch.cuda.synchronize()
        if i >= 3:
            walls.append((time.perf_counter() - t0) * 1e6 / bs.LAYERS)
    return statistics.median(walls)


def per_call(fn, n=2000):
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return statistics.median(times) * 1e6


def recorded_steps(names, dim, device):
    """(name, step) per workload of ``names`` (``bench.stage.WORKLOADS``): the step every
    side clones (``bench.steps.fresh``), with its metadata record."""
    for name in names:
        ns, sp = bs.WORKLOADS[name]
        base = bs.Step(torch.Generator().manual_seed(3), ns, sp, dim, device)
        base.record = bsteps.record(base)
        yield name, base


def main(vllm_file):
    jitconv.set_device("cuda:0")
    device = torch.device("cuda:0")
    vt = load_vllm_triton(vllm_file)
    with torch.inference_mode():
        for name, base in recorded_steps(WORKLOADS, DIM, device):
            both, new = whole_step_outputs(base.record)

            def whole(s):
                for L in s.layers:
                    bsteps.whole_step_conv(s, L)

            def vllm(s):
                for L in s.layers:
                    bsteps.vllm_conv(s, L, vt.causal_conv1d_update, vt.causal_conv1d_fn)

            def build(s):
                L = s.layers[0]
                dropins._layer_plan(L["x"], L["weight"], L["state"], s.record, 0, None,
                                    both)
            kept = bsteps.fresh(base)
            L0 = kept.layers[0]
            plan = dropins._layer_plan(L0["x"], L0["weight"], L0["state"], kept.record, 0,
                                       None, both)

            def plan_run(s):
                for L in s.layers:
                    if both:
                        plan.run(L["x"], L["weight"], L["bias"], L["state"], split=True)
                    else:
                        plan.run(L["x"], L["weight"], L["bias"], L["state"],
                                 out=None if new else L["x"])

            def dropin(s):
                for L in s.layers:
                    bsteps.vllm_conv(s, L, dropins.causal_conv1d_update,
                                     dropins.causal_conv1d_fn)
            rows = {"vllm update": per_layer(vllm, base),
                    "drop-ins, new metadata": per_layer(dropin, base),
                    "drop-ins, kept metadata": per_layer(dropin, base, new=False),
                    "whole-step, new metadata": per_layer(whole, base),
                    "whole-step, kept record": per_layer(whole, base, new=False),
                    "plan.run, kept device plan": per_layer(plan_run, base, new=False),
                    "plan build (per step / 36)": per_layer(build, base)}
            print(f"{name}, dim {DIM}, plan kind {type(plan).__name__}, "
                  f"signature {'yes' if getattr(plan, 'signature', None) else 'no'}")
            for k, v in rows.items():
                print(f"  {k:<32}{v:8.2f} us per layer")

            # single pieces
            x, w, b, st = L0["x"], L0["weight"], L0["bias"], L0["state"]
            args = (x, w, b, st, None if both or new else x)
            split = SPLIT_SLOTS if both else SPLIT_NONE
            key = launching.run_key(args, "silu", None, split)
            pieces = {"run_key": lambda: launching.run_key(args, "silu", None, split),
                      "_to_state_dtype": lambda: dropins._to_state_dtype(st, x, w, b),
                      "_layer_plan (kept)": lambda: dropins._layer_plan(
                          x, w, st, kept.record, 0, None, both),
                      "current_stream": lambda: driver.current_stream(0),
                      "capturing check": lambda: torch.cuda.is_current_stream_capturing()}
            if name.startswith("decode"):  # the decode call of vLLM's layer
                meta = kept.meta

                def lines():
                    return meta["non_spec_state_indices"][:x.shape[0]]
                pieces["vLLM's slice of the lines"] = lines
                pieces["drop-in update (kept)"] = lambda: dropins.causal_conv1d_update(
                    x, st, w, b, "silu", conv_state_indices=lines(), validate_data=True)
            state = launching._plan_state(plan)
            run = launching._runs_of(plan, state).get(key)
            stream = key[launching.STREAM_AT]
            if run is not None:
                other = bsteps.fresh(base)
                plan2 = dropins._layer_plan(x, w, st, other.record, 0, None, both)
                state2 = launching._plan_state(plan2)
                values = launching._bound_values(plan, state, stream)
                values2 = launching._bound_values(plan2, state2, stream)
                pieces["Run, plan kept"] = lambda: run(args[4], stream, (), values, plan)

                def two_plans():  # each run binds its plan's words
                    run(args[4], stream, (), values2, plan2)
                    run(args[4], stream, (), values, plan)
                pieces["Run, plans alternating (2 runs)"] = two_plans
            else:
                print("  (no kept run under this key)")
            for k, fn in pieces.items():
                print(f"  piece {k:<26}{per_call(fn):8.2f} us per call")
            print(f"  signatures kept: {len(STATE.signed_runs)}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
