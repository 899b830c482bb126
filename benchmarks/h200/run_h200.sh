#!/bin/bash
# The H200 run of issue 12 (what produced this folder), from a snapshot folder holding
# src/{jitconv,tests} (this tree) and vllm/causal_conv1d.py. The vLLM file comes from
# vLLM's distribution, downloaded where pip works into an ignored folder, never committed:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --platform manylinux_2_28_x86_64 vllm==0.33.0 -d .vllm
#   unzip -p .vllm/vllm-0.33.0-*.whl vllm/model_executor/layers/mamba/ops/causal_conv1d.py \
#     > SNAPSHOT/vllm/causal_conv1d.py
# On the GPU machine (python3 with torch, triton, numba-cuda; no dpctl): OUT=dir bash run_h200.sh
cd "$(dirname "$0")/src"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python3 -c "import sys, numpy, numba, numba_cuda, torch, triton; print(sys.version.split()[0], 'numpy', numpy.__version__, 'numba', numba.__version__, 'numba-cuda', getattr(numba_cuda,'__version__','?'), 'torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())" 2>&1 | tee $OUT/versions.txt
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv | tee -a $OUT/versions.txt
T="python3 -m pytest -q -p no:cacheprovider -rs"
DAY=$(date +%F)  # result files are named by date (add the short commit when committing them)
# The grid compiles a kernel per layout (numba-cuda, 1-2 s each): spread it over the
# machine's cores with pytest-xdist (in its image). With the slow tests split per layout
# (2026-12-01, 23f473d) the grid took about 140 s and the rest about 260 s with 15 workers
# (test-grid-2026-12-01-23f473d.txt); on 2026-12-02 (103f0b6) the whole suite completed 488
# of its 581 tests in 545 s and the rest alone 97 of 197 in 320 s (test-grid-2026-12-02-103f0b6.txt):
# in calls of 10 minutes at most, run the grid and the rest (-k "not test_mixed_grid") in
# separate calls, with -v so that a call cut by its timeout still names what passed.
$T -n 15 --durations=30 tests/test_cuda.py tests/test_bit_conversions.py 2>&1 \
  | tee $OUT/test-grid-$DAY.txt | tail -40
# The defaults (C and L per launch, fast exp) beside C = 4 and four channels per row
# access (the run of 2026-12-01, 85beddb); same-run-variants.csv came from the same command
# with --modes "fast exp" on each variant's tree.
python3 -m jitconv.bench.gpu --vllm-file ../vllm/causal_conv1d.py --out $OUT/bench --reps 60 \
  --channels auto,4 --row-groups auto,4 --modes "fast exp" 2>&1 | grep -v -i "warn" \
  | tee $OUT/bench.log
