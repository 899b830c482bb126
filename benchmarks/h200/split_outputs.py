"""Split outputs on a GPU (issue 34): a mixed step (prefill chunk, decodes, spec verify)
whose conv output the GDN layer needs per part, three ways, measured in one run:

- "vllm + gathers": vLLM's two conv calls as its GDN layer makes them, after its two
  ``index_select`` gathers of x (``bench.gpu.vllm_calls`` with gathers);
- "jitconv + gathers": one jitconv launch into one output, then the same two gathers;
- "jitconv split": one jitconv launch writing the caller's out_spec / out_non_spec (no
  gathers; such runs are checked at every call);
- "jitconv split new": ``plan.run(..., split=True)``: one launch into new split outputs
  (views of one tensor), a remembered launch after the first call, as
  ``jitconv.vllm.gdn_conv_step(split=True)`` runs it.

Per side: device time (profiler, sum of the GPU work of one call, L2 flushed, median)
and eager wall time per call (``calls`` calls, one sync at the end: host + device).
Results are checked equal to each other (the split rows bit-exact against jitconv's
gathered rows) before timing.

    python benchmarks/h200/split_outputs.py --vllm-file .vllm/causal_conv1d.py --out DIR
"""

import argparse
import json
import sys

import torch

import jitconv
from jitconv.bench import gpu
from jitconv.bench.cpu import plan_of
from jitconv.testing.steps import mixed_step, token_rows


def _step(dim, dtype, device):
    gen = torch.Generator().manual_seed(dim)
    step = mixed_step(gen, dim=dim, width=4, dtype=dtype, ns_lengths=[1] * 32 + [512],
                      sp_lengths=[4] * 16, rows="vllm", spec_columns=4,
                      extra_state_columns=0)
    return {k: (v.to(device) if isinstance(v, torch.Tensor) and k in gpu.DATA_KEYS else v)
            for k, v in step.items()}


def measure(vt, dim, dtype, device, reps, calls):
    step = _step(dim, dtype, device)
    plan = plan_of(step)
    x, w, b, state = step["x"], step["weight"], step["bias"], step["conv_state"]
    rows = {p: token_rows(step, p).to(device) for p in ("spec", "non_spec")}
    out_spec = torch.empty((len(rows["spec"]), dim), dtype=dtype, device=device)
    out_ns = torch.empty((len(rows["non_spec"]), dim), dtype=dtype, device=device)

    def gathered():
        out = plan.run(x, w, b, state)
        return out.index_select(0, rows["spec"]), out.index_select(0, rows["non_spec"])

    def split():
        return plan.run(x, w, b, state, out_spec=out_spec, out_non_spec=out_ns)

    def split_new():
        return plan.run(x, w, b, state, split=True)

    vllm_run, _ = gpu.vllm_calls(vt, step, device, gathers=True)
    saved = state.clone()
    want = gathered()
    state.copy_(saved)
    got = split()
    exact = all(torch.equal(a, g) for a, g in zip(want, (got.spec, got.non_spec)))
    state.copy_(saved)
    got = split_new()
    exact = exact and all(torch.equal(a, g) for a, g in zip(want, (got.spec, got.non_spec)))
    state.copy_(saved)
    flush = torch.empty(1 << 28, dtype=torch.uint8, device=device)
    result = {"dim": dim, "dtype": str(dtype).split(".")[-1], "split_bit_exact": exact,
              "tokens": int(x.shape[0]), "spec_tokens": len(rows["spec"])}
    for name, fn in (("vllm + gathers", vllm_run), ("jitconv + gathers", gathered),
                     ("jitconv split", split), ("jitconv split new", split_new)):
        kernel, names = gpu.device_time_us(fn, flush, reps)
        result[name] = {"device_us": round(kernel, 2), "eager_us": round(
            gpu._wall_per_call_us(fn, calls), 2), "kernels": names}
    return result


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--vllm-file", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--calls", type=int, default=300)
    a = p.parse_args(argv)
    device = torch.device("cuda:0")
    jitconv.set_device("cuda:0")
    vt = gpu.load_vllm_triton(a.vllm_file)
    results = []
    with torch.inference_mode():
        for dim in (2048, 8192):
            r = measure(vt, dim, torch.bfloat16, device, a.reps, a.calls)
            results.append(r)
            print(json.dumps(r), flush=True)
    with open(f"{a.out}/split-outputs.json", "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
