"""Tuning values for device plans' conv kernels (the kernel that plans its own block),
tried beside the table's on the H200 in one process: ``python3
benchmarks/h200/device_plan_variants.py --vllm-file .vllm/causal_conv1d.py --out OUT``
(the options of ``jitconv.bench.engine``; ``--tried "channels 4,threads 64"``: only those
variants). The table's values were chosen on host plans; each variant here is ``jitconv
device plan`` run under one ``tuning.override``."""

import sys

from jitconv.bench import engine

TRIED = {
    "channels 4": {"channels": 4},
    "threads 64": {"threads": 64},
    "threads 256": {"threads": 256},
    "row_group 2": {"row_group": 2},
    "early_weights off": {"early_weights": False},
    "group_state off": {"group_state": False},
    "max_registers 0": {"max_registers": 0},
    "short_lookahead 2": {"short_lookahead": 2},
    "shared_record off": {"shared_record": False},
    "constant_plan off": {"constant_plan": False},
}

if __name__ == "__main__":
    args = sys.argv[1:]
    tried = list(TRIED)
    if "--tried" in args:
        at = args.index("--tried")
        tried = args[at + 1].split(",")
        del args[at:at + 2]
    sides = ["vllm triton", "jitconv device plan"]
    for label in tried:
        name = f"jitconv device plan ({label})"
        engine.VARIANTS[name] = ("jitconv device plan", TRIED[label])
        sides.append(name)
    sys.exit(engine.main(args + ["--sides", ",".join(sides)]))
