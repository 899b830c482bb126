"""Where the host time of the vLLM integration's calls goes when the step's metadata
tensors are new at every step (``jitconv.bench.steps``' method): ``gdn_conv_step`` as
the plugin's whole-step mode calls it and the drop-ins as vLLM's ``_forward_core`` calls
them, decode-only and mixed steps at dim 8192, 36 layers, bfloat16. Per side the wall
time per layer (median of 10 steps, one sync per step), then a cProfile of 10 steps (top
functions by own time and by cumulative time).

    PYTHONPATH=$PWD python3 benchmarks/h200/whole_step_profile.py
"""

import os
import sys

import torch

import jitconv
import jitconv.vllm
from jitconv.bench import steps as bsteps

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from host_pieces import recorded_steps  # noqa: E402  (scripts beside this one)
from new_metadata_profile import time_and_profile  # noqa: E402

DIM = 8192
WORKLOADS = ("decode 64", "spec 64 x (1+3)", "mixed 512 + 32 + 16 x 4")


def main():
    jitconv.set_device("cuda:0")
    device = torch.device("cuda:0")
    drop_ins = (jitconv.vllm.causal_conv1d_update, jitconv.vllm.causal_conv1d_fn)
    with torch.inference_mode():
        for name, base in recorded_steps(WORKLOADS, DIM, device):
            sides = {"whole-step conv": lambda s, L: bsteps.whole_step_conv(s, L),
                     "drop-ins": lambda s, L: bsteps.vllm_conv(s, L, *drop_ins)}
            for side, call in sides.items():
                def one_step(call=call):
                    s = bsteps.fresh(base)
                    for L in s.layers:
                        call(s, L)
                time_and_profile(f"{name} | {side} (the step's metadata cloned and "
                                 f"recorded included)", one_step, True, top=(18, 28))


if __name__ == "__main__":
    main()
