"""Which output rows of vLLM's own ``causal_conv1d_fn`` with prefix caching differ from
the float64 reference (``jitconv.reference``), on random chunks (``state_rules_peers``'s
generator: chunks of at least width - 1 tokens, first boundary at least width - 1 tokens
in), all three dtypes; prints each case with a row beyond 0.05 and stops after eight.

vLLM's ops module on PYTHONPATH as for ``state_rules_peers.py``, on a CUDA GPU:
``PYTHONPATH=.:.peers/vllm_pkg:.peers/sglang_pkg python3
benchmarks/peers/vllm_prefix_caching_window.py``. (0.05 is below bfloat16's tolerance:
bfloat16 rows just past it are rounding, not a finding.)
"""

import os
import random
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from state_rules_peers import prefix_caching_sequence  # noqa: E402
from jitconv.reference import causal_conv1d_reference  # noqa: E402


def main():
    import vllm.model_executor.layers.mamba.ops.causal_conv1d as vllm_ops
    rng = random.Random(5)
    found = 0
    for case in range(40):
        for dtype in (torch.float16, torch.float32, torch.bfloat16):
            width = rng.choice([2, 3, 4])
            S, B, nseq = width - 1, rng.choice([16, 32, 64]), rng.randint(1, 4)
            seqs = [prefix_caching_sequence(rng, B, S) for _ in range(nseq)]
            K = max(s[4] for s in seqs) + 2
            lines = 1 + nseq * K
            table = torch.tensor(rng.sample(range(1, lines), nseq * K),
                                 dtype=torch.int32).view(nseq, K)
            qsl = np.concatenate([[0], np.cumsum([s[1] for s in seqs])]).astype(np.int32)
            n, dim = int(qsl[-1]), 256
            x, w = torch.randn(n, dim).to(dtype), torch.randn(dim, width).to(dtype)
            b = torch.randn(dim).to(dtype)
            state = torch.randn(lines, S, dim).to(dtype).cuda().transpose(1, 2)
            init = torch.tensor([s[0] > 0 for s in seqs])

            def col(k):
                return torch.tensor([s[k] for s in seqs], dtype=torch.int32).cuda()

            out = vllm_ops.causal_conv1d_fn(
                x.cuda().t(), w.cuda(), b.cuda(), state.clone(), torch.from_numpy(qsl).cuda(),
                cache_indices=table.cuda(), has_initial_state=init.cuda(), activation="silu",
                block_idx_first_scheduled_token=col(3), block_idx_last_scheduled_token=col(4),
                initial_state_idx=col(2), num_computed_tokens=col(0), block_size_to_align=B)
            torch.cuda.synchronize()
            ref = causal_conv1d_reference(
                x, w, b, state.cpu(), non_spec_query_start_loc=qsl,
                non_spec_state_indices=[int(table[i, s[2]]) for i, s in enumerate(seqs)],
                has_initial_state=init.numpy(),
                non_spec_write_indices=[int(table[i, s[4]]) for i, s in enumerate(seqs)])
            err = np.abs(out.t().double().cpu().numpy() - ref[0]).max(axis=1)
            bad = np.flatnonzero(err > 0.05)
            if len(bad):
                found += 1
                print(f"case {case} {dtype} w{width} B{B} (computed, tokens) "
                      f"{[(s[0], s[1]) for s in seqs]} qsl {qsl.tolist()}: {len(bad)} rows, "
                      f"first {bad[:12].tolist()}, max error {err.max():.2f}", flush=True)
                if found >= 8:
                    return
    print("done", found)


if __name__ == "__main__":
    main()
