"""Where a small launch's time goes: the CUDA kernel with parts of its source removed,
timed beside the full kernel and vLLM's Triton ops in one process (same_call.py's
timing and rounds). Timing only: an ablated kernel's outputs are wrong, so the bit
comparison of same_call is skipped.

    python3 benchmarks/h200/ablate.py --vllm-file .vllm/causal_conv1d.py --out DIR \
        --variant full: --variant nostores:JITCONV_ABLATE=no-state-stores \
        --workload "decode-only 64" --dim 2048 [--dtype bfloat16] [--rounds 5]

JITCONV_ABLATE names one or more edits of ABLATIONS (joined by "+"), applied to the
generated source of every kernel compiled while it is set; each setting gets its own
compiled kernels. Written for the short decode kernel (kernel_template's short_tokens
= 1 with row groups of 2): an edit whose pattern is not in a kernel's source fails.
"""

import os
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # same_call.py
import same_call  # noqa: E402
from jitconv.backends.cuda import launching as cuda_backend
from jitconv.backends.cuda import source as cuda_source  # noqa: E402

# name -> [(regex, replacement)], each regex must match at least once.
ABLATIONS = {
    # the new state not written (the window's loads then feed only the output)
    "no-state-stores": [(r"\n( *)store_row2\(state, [^\n]*", r"\n\1pass")],
    # the output not written: its math is dead code, so removed too
    "no-out": [(r"\n( *)store_row2\(out, U\(oc_0 \+ rq0[^\n]*", r"\n\1pass")],
    # the record's fields that only the state part needs as constants (decode: n = 1,
    # window from column 0): no dependent L1 round for the window's address
    "const-n-off": [(r"\n( *)n = tables\[U\(blk \+ 3\)\]", r"\n\1n = 1"),
                    (r"\n( *)off = tables\[U\(blk \+ 5\)\]", r"\n\1off = 0")],
    # the cache line's window not read (zeros)
    "no-window": [(r"\n( *)if initial:\n", r"\n\1if False:\n")],
    # weights and bias as constants (no loads)
    "no-weights": [(r"load_taps4\(weight, [^\n]*\)", "ZERO, ZERO, ZERO, ZERO"),
                   (r"load\(strided\(bias, [^\n]*\)\)\)", "F32_ZERO")],
    # the token not read from x (zeros)
    "no-x": [(r"= load_row2\(x, [^\n]*\)", "= ZERO, ZERO")],
}


def ablated(source, names):
    for name in names:
        for pattern, replacement in ABLATIONS[name]:
            source, count = re.subn(pattern, replacement, source)
            if not count:
                raise ValueError(f"ablation {name}: {pattern!r} not in the kernel's source")
    return source


def _current():
    value = os.environ.get("JITCONV_ABLATE", "")
    names = [n for n in value.split("+") if n]
    unknown = [n for n in names if n not in ABLATIONS]
    if unknown:
        raise ValueError(f"JITCONV_ABLATE: unknown {unknown}; known: {sorted(ABLATIONS)}")
    return names


class _ByAblation(dict):
    """cuda_backend's kernel cache with the current ablation in every key."""

    def get(self, key, default=None):
        return super().get((os.environ.get("JITCONV_ABLATE", ""), key), default)

    def __getitem__(self, key):
        return super().__getitem__((os.environ.get("JITCONV_ABLATE", ""), key))

    def __setitem__(self, key, value):
        super().__setitem__((os.environ.get("JITCONV_ABLATE", ""), key), value)


def main(argv=None):
    source_of = cuda_source.kernel_source
    cuda_source.kernel_source = lambda *a, **k: ablated(source_of(*a, **k), _current())
    cuda_backend._kernels = _ByAblation()
    # outputs differ by design: every variant "matches" the first
    same_call.outputs = lambda step, env: (torch.zeros(1),)
    same_call.main(argv)


if __name__ == "__main__":
    main()
