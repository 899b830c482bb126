"""Side by side on a CUDA GPU: jitconv's drop-ins against the peers' own Triton conv
kernels, for the state rules of docs/SEMANTICS.md "More state rules", on random inputs.

- SGLang 0.5.23's ``causal_conv1d_update`` (target verify: windows for every token,
  EAGLE trees from first-child / next-sibling arrays, padded entries; plain decodes) and
  ``causal_conv1d_fn`` (varlen prefill) against ``jitconv.sglang``;
- vLLM's tree verify (its PR 29846, ``retrieve_parent_token``) and its prefix caching in
  'all' mode (``causal_conv1d_fn`` with block-boundary checkpoints, ``causal_conv1d_update``
  reading one block's line and writing another's) against ``jitconv.vllm.plugin``'s
  replacements built from that ops module's signatures.

Both sides get clones of the same inputs. States, windows and parent maps must be
bit-identical; outputs of both sides are compared with the float64 reference
(``jitconv.reference``) at the contract's tolerance, and with each other (max abs diff).
Padded entries' output rows are left out (SGLang leaves them unwritten).

The peers' files are not in this repository: put SGLang's package (from its wheel) and
vLLM's ops module (from the PR's commit) on PYTHONPATH, e.g. ``.peers/sglang_pkg`` and
``.peers/vllm_pkg``. Usage: ``python3 benchmarks/peers/state_rules_peers.py --cases 300
--out results.json``; on a machine without a GPU, ``--device cpu --jitconv-device
opencl:cpu`` with ``TRITON_INTERPRET=1`` (Triton's interpreter runs the peers' kernels on
the CPU, where it can).
"""

import argparse
import json
import os
import random
import sys
import time

import numpy as np
import torch

import jitconv
from jitconv import sglang as jsg
from jitconv.reference import TOLERANCE, causal_conv1d_reference

DEV = "cuda"
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
BITS = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


def interpreter_masks_as_bool():
    """Triton's CPU interpreter (TRITON_INTERPRET=1) refuses the masks of the peers'
    loads and stores ("mask has unsupported dtype": an integer mask where it takes
    booleans); on a GPU the same masks are fine. Cast them for the interpreter: the
    peers' kernels are run as written."""
    from triton.runtime import interpreter
    raw = interpreter._interpreter

    class Masks:
        def __getattr__(self, name):
            return getattr(raw, name)

        @staticmethod
        def load(ptrs, mask, other, dtype):
            return raw.load(ptrs, mask.astype(bool), other, dtype)

        @staticmethod
        def store(ptrs, value, mask):
            return raw.store(ptrs, value, mask.astype(bool))

    interpreter._interpreter = Masks()


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def bits_equal(a, b):
    return torch.equal(a.contiguous().view(BITS[a.dtype]), b.contiguous().view(BITS[b.dtype]))


def within(out, ref, dtype_name, rows):
    """(ok, max abs error) of out's ``rows`` against the float64 reference."""
    rtol, atol = TOLERANCE[dtype_name]
    got = out.double().cpu().numpy()[rows]
    want = ref[rows]
    err = np.abs(got - want)
    return bool(np.all(err <= atol + rtol * np.abs(want))), float(err.max(initial=0))


def random_tree(rng, n):
    return [-1] + [rng.randrange(0, t) for t in range(1, n)]


def children(parents):
    n = len(parents)
    nxt, sib, last = [-1] * n, [-1] * n, {}
    for t in range(1, n):
        p = parents[t]
        if p in last:
            sib[last[p]] = t
        else:
            nxt[p] = t
        last[p] = t
    return nxt, sib


class Tally:
    def __init__(self):
        self.cases, self.failures, self.max_err, self.max_diff = 0, [], {}, {}
        self.outside = {}  # per side: cases with an output outside the tolerance
        self.peer_outside = []  # those of the peers, named

    def add(self, name, ok, detail, errs, diff):
        self.cases += 1
        if not ok:
            self.failures.append({"case": name, **detail})
        for key, value in detail.items():
            if key.endswith("_within") and not value:
                side = key[:-len("_within")]
                self.outside[side] = self.outside.get(side, 0) + 1
                if side != "jitconv":
                    self.peer_outside.append({"case": name, "error": errs[side]})
        for side, e in errs.items():
            self.max_err[side] = max(self.max_err.get(side, 0.0), e)
        self.max_diff[name.split(":")[0]] = max(self.max_diff.get(name.split(":")[0], 0.0), diff)


def sglang_verify(rng, tally, sgl, index):
    dtype_name = rng.choice(list(DTYPES))
    dtype = DTYPES[dtype_name]
    width = rng.choice([2, 3, 4])
    S = width - 1
    batch, T = rng.randint(1, 12), rng.randint(1, 8)
    dim = rng.choice([64, 256, 2048])
    tree = T > 1 and rng.random() < 0.6
    windows_on = rng.random() < 0.85
    dedup = windows_on and not tree and rng.random() < 0.4
    lines_total = batch + 3
    lines = torch.tensor(rng.sample(range(lines_total), batch), dtype=torch.int32)
    pads = [i for i in range(batch) if rng.random() < 0.2]
    for i in pads:
        lines[i] = -1
    rows = torch.tensor(rng.sample(range(batch + 2), batch), dtype=torch.int32)
    dev = DEV
    x = torch.randn(batch * T, dim, dtype=torch.float32).to(dtype)
    x3 = x.clone().view(batch, T, dim).transpose(1, 2).to(dev)
    w = torch.randn(dim, width).to(dtype).to(dev)
    b = torch.randn(dim).to(dtype).to(dev) if rng.random() < 0.7 else None
    state = torch.randn(lines_total, dim, S).to(dtype).to(dev)
    act = rng.choice([True, None, "silu"])
    if dedup:
        buf = torch.randn(batch + 2, dim, T + S - 1).to(dtype).to(dev)
        windows = buf.as_strided((batch + 2, T, dim, S), (buf.stride(0), 1, buf.stride(1), 1))
    else:
        windows = torch.randn(batch + 2, T, dim, S).to(dtype).to(dev)
    parents = None
    kw = {}
    if tree:
        parents = [random_tree(rng, T) for _ in range(batch)]
        pairs = [children(p) for p in parents]
        kw = dict(retrieve_next_token=torch.tensor([p[0] for p in pairs], dtype=torch.int32,
                                                   device=dev),
                  retrieve_next_sibling=torch.tensor([p[1] for p in pairs], dtype=torch.int32,
                                                     device=dev))
    results = {}
    for side, op in (("sglang", sgl.causal_conv1d_update), ("jitconv", jsg.causal_conv1d_update)):
        st, win = state.clone(), (windows.clone() if not dedup else None)
        if dedup:
            b2 = buf.clone()
            win = b2.as_strided(windows.shape, windows.stride())
        extra = dict(kw)
        if tree:
            extra["retrieve_parent_token"] = torch.full((batch, T), 9, dtype=torch.int32,
                                                        device=dev)
        if windows_on:
            extra.update(intermediate_conv_window=win, intermediate_state_indices=rows.to(dev))
        out = op(x3, st, w, b, act, conv_state_indices=lines.to(dev), **extra)
        sync()
        results[side] = (out, st, win, extra.get("retrieve_parent_token"))
    ref = causal_conv1d_reference(
        x, w.cpu(), None if b is None else b.cpu(), state.cpu(),
        non_spec_query_start_loc=np.arange(0, batch * T + 1, T),
        non_spec_state_indices=lines.numpy(),
        non_spec_parent_token=None if parents is None else np.array(parents),
        activation=None if act is None else "silu")
    keep = [r for r in range(batch * T) if r // T not in pads]
    (o_s, st_s, win_s, par_s), (o_j, st_j, win_j, par_j) = results["sglang"], results["jitconv"]
    flat = lambda o: o.transpose(1, 2).reshape(batch * T, dim)  # noqa: E731
    ok_s, err_s = within(flat(o_s), ref[0], dtype_name, keep)
    ok_j, err_j = within(flat(o_j), ref[0], dtype_name, keep)
    state_same = bits_equal(st_s, st_j)
    win_same = (not windows_on) or bits_equal(win_s, win_j)
    real = [i for i in range(batch) if i not in pads]
    par_same = (not tree) or torch.equal(par_s[real], par_j[real])
    diff = float((flat(o_s).float()[keep] - flat(o_j).float()[keep]).abs().max()) if keep else 0.0
    name = (f"sglang-verify:{index} {dtype_name} w{width} b{batch} T{T} d{dim} "
            f"{'tree' if tree else 'linear'}{' dedup' if dedup else ''}"
            f"{' windows' if windows_on else ''} pads{len(pads)}")
    tally.add(name, ok_j and state_same and win_same and par_same,
              dict(jitconv_within=ok_j, sglang_within=ok_s, state_same=state_same,
                   windows_same=win_same, parents_same=par_same),
              {"jitconv": err_j, "sglang": err_s}, diff)


def sglang_prefill(rng, tally, sgl, index):
    dtype_name = rng.choice(list(DTYPES))
    dtype = DTYPES[dtype_name]
    width = rng.choice([2, 3, 4])
    S = width - 1
    nseq = rng.randint(1, 8)
    lengths = [rng.choice([1, 2, 3, 7, 40, 129]) for _ in range(nseq)]
    qsl = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    n = int(qsl[-1])
    dim = rng.choice([64, 2048])
    lines = torch.tensor(rng.sample(range(nseq + 2), nseq), dtype=torch.int32)
    pads = [i for i in range(nseq) if rng.random() < 0.2]
    for i in pads:
        lines[i] = -1
    init = torch.tensor([rng.random() < 0.6 for _ in range(nseq)])
    x = torch.randn(n, dim).to(dtype)
    w = torch.randn(dim, width).to(dtype).to(DEV)
    b = torch.randn(dim).to(dtype).to(DEV)
    state = torch.randn(nseq + 2, dim, S).to(dtype).to(DEV)
    results = {}
    for side, op in (("sglang", sgl.causal_conv1d_fn), ("jitconv", jsg.causal_conv1d_fn)):
        st = state.clone()
        xc = x.clone().to(DEV).t()  # SGLang passes mixed_qkv.transpose(0, 1)
        out = op(xc, w, b, st, torch.from_numpy(qsl).to(DEV), lengths,
                 cache_indices=lines.to(DEV), has_initial_state=init.to(DEV), activation="silu")
        sync()
        results[side] = (out, st)
    ref = causal_conv1d_reference(x, w.cpu(), b.cpu(), state.cpu(),
                                  non_spec_query_start_loc=qsl,
                                  non_spec_state_indices=lines.numpy(),
                                  has_initial_state=init.numpy())
    keep = [r for i in range(nseq) if i not in pads for r in range(qsl[i], qsl[i + 1])]
    (o_s, st_s), (o_j, st_j) = results["sglang"], results["jitconv"]
    ok_s, err_s = within(o_s.t(), ref[0], dtype_name, keep)
    ok_j, err_j = within(o_j.t(), ref[0], dtype_name, keep)
    state_same = bits_equal(st_s, st_j)
    diff = float((o_s.t().float()[keep] - o_j.t().float()[keep]).abs().max()) if keep else 0.0
    tally.add(f"sglang-prefill:{index} {dtype_name} w{width} seqs{nseq} d{dim} pads{len(pads)}",
              ok_j and state_same, dict(jitconv_within=ok_j, sglang_within=ok_s,
                                        state_same=state_same),
              {"jitconv": err_j, "sglang": err_s}, diff)


def vllm_tree(rng, tally, vllm_op, jit_op, index):
    dtype_name = rng.choice(list(DTYPES))
    dtype = DTYPES[dtype_name]
    width = rng.choice([2, 3, 4])
    S = width - 1
    batch, k = rng.randint(1, 10), rng.randint(1, 5)
    lengths = [rng.randint(1, k + 1) for _ in range(batch)]
    qsl = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    n = int(qsl[-1])
    dim = rng.choice([64, 2048])
    state_len = S + k
    lines = torch.tensor(rng.sample(range(batch + 3), batch), dtype=torch.int32)
    accepted = torch.tensor([rng.randint(1, state_len - S + 1) for _ in range(batch)],
                            dtype=torch.int32)
    parents = torch.full((batch, k + 1), -1, dtype=torch.int32)
    for i, m in enumerate(lengths):
        parents[i, :m] = torch.tensor(random_tree(rng, m))
    x = torch.randn(n, dim).to(dtype)
    w = torch.randn(dim, width).to(dtype).to(DEV)
    b = torch.randn(dim).to(dtype).to(DEV) if rng.random() < 0.7 else None
    state = torch.randn(batch + 3, dim, state_len).to(dtype).to(DEV)
    act = rng.choice(["silu", None])
    results = {}
    for side, op in (("vllm", vllm_op), ("jitconv", jit_op)):
        st = state.clone()
        xc = x.clone().to(DEV)
        out = op(xc, st, w, b, activation=act, conv_state_indices=lines.to(DEV),
                 num_accepted_tokens=accepted.to(DEV),
                 query_start_loc=torch.from_numpy(qsl).to(DEV),
                 max_query_len=k + 1, retrieve_parent_token=parents.to(DEV))
        sync()
        results[side] = (out.clone(), st)
    ref = causal_conv1d_reference(x, w.cpu(), None if b is None else b.cpu(), state.cpu(),
                                  spec_query_start_loc=qsl, spec_state_indices=lines.numpy(),
                                  num_accepted_tokens=accepted.numpy(),
                                  spec_parent_token=parents.numpy(), activation=act)
    keep = list(range(n))
    (o_v, st_v), (o_j, st_j) = results["vllm"], results["jitconv"]
    ok_v, err_v = within(o_v, ref[0], dtype_name, keep)
    ok_j, err_j = within(o_j, ref[0], dtype_name, keep)
    state_same = bits_equal(st_v, st_j)
    diff = float((o_v.float() - o_j.float()).abs().max())
    tally.add(f"vllm-tree:{index} {dtype_name} w{width} b{batch} k{k} d{dim}",
              ok_j and state_same, dict(jitconv_within=ok_j, vllm_within=ok_v,
                                        state_same=state_same),
              {"jitconv": err_j, "vllm": err_v}, diff)


def prefix_caching_sequence(rng, B, S):
    """One sequence of vLLM's prefix caching in 'all' mode: (tokens computed before,
    tokens now, initial block, first block, last block). Chunks of at least S tokens
    whose first boundary is at least S tokens in (where vLLM's kernel and the contract
    agree: SEMANTICS.md says where they differ)."""
    while True:
        done = rng.choice([0, rng.randrange(1, 3 * B)])
        n = rng.randint(S, 3 * B)
        first, last = done // B, (done + n - 1) // B
        if last > first and (first + 1) * B - done < S:
            continue
        initial = first if done % B else max(first - 1, 0)
        return done, n, initial, first, last


def vllm_apc_fn(rng, tally, vllm_op, jit_op, index):
    """vLLM's causal_conv1d_fn with prefix caching: read line, write line and every
    block-boundary checkpoint, from a 2-D block table."""
    dtype_name = rng.choice(list(DTYPES))
    dtype = DTYPES[dtype_name]
    width = rng.choice([2, 3, 4])
    S = width - 1
    B = rng.choice([16, 32, 64])
    nseq = rng.randint(1, 6)
    seqs = [prefix_caching_sequence(rng, B, S) for _ in range(nseq)]
    K = max(s[4] for s in seqs) + 2
    lines_total = 1 + nseq * K
    free = rng.sample(range(1, lines_total), nseq * K)  # line 0: vLLM's null block
    table = torch.tensor(free, dtype=torch.int32).view(nseq, K)
    lengths = [s[1] for s in seqs]
    qsl = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    n = int(qsl[-1])
    dim = rng.choice([64, 2048])
    x = torch.randn(n, dim).to(dtype)
    w = torch.randn(dim, width).to(dtype).to(DEV)
    b = torch.randn(dim).to(dtype).to(DEV)
    # vLLM's layout: (lines, dim, S) views of (lines, S, dim) memory
    state = torch.randn(lines_total, S, dim).to(dtype).to(DEV).transpose(1, 2)
    init = torch.tensor([s[0] > 0 for s in seqs])
    col = lambda k: torch.tensor([s[k] for s in seqs], dtype=torch.int32).to(DEV)  # noqa: E731
    apc = dict(block_idx_first_scheduled_token=col(3), block_idx_last_scheduled_token=col(4),
               initial_state_idx=col(2), num_computed_tokens=col(0), block_size_to_align=B)
    results = {}
    for side, op in (("vllm", vllm_op), ("jitconv", jit_op)):
        st = state.clone()
        out = op(x.clone().to(DEV).t(), w, b, st, torch.from_numpy(qsl).to(DEV),
                 cache_indices=table.to(DEV), has_initial_state=init.to(DEV),
                 activation="silu", **apc)
        sync()
        results[side] = (out.t(), st)
    loc, pos, ind = [0], [], []
    for i, (done, m, initial, first, last) in enumerate(seqs):
        for k in range(first, last):
            pos.append((k + 1) * B - done)
            ind.append(int(table[i, k]))
        loc.append(len(pos))
    ref = causal_conv1d_reference(
        x, w.cpu(), b.cpu(), state.cpu(), non_spec_query_start_loc=qsl,
        non_spec_state_indices=[int(table[i, s[2]]) for i, s in enumerate(seqs)],
        has_initial_state=init.numpy(),
        non_spec_write_indices=[int(table[i, s[4]]) for i, s in enumerate(seqs)],
        non_spec_checkpoint_loc=loc, non_spec_checkpoint_pos=pos,
        non_spec_checkpoint_indices=ind)
    keep = list(range(n))
    (o_v, st_v), (o_j, st_j) = results["vllm"], results["jitconv"]
    ok_v, err_v = within(o_v, ref[0], dtype_name, keep)
    ok_j, err_j = within(o_j, ref[0], dtype_name, keep)
    state_same = bits_equal(st_v, st_j)
    ref_same = bits_equal(st_j.cpu(), torch.from_numpy(ref[1]).to(dtype))
    diff = float((o_v.float() - o_j.float()).abs().max())
    tally.add(f"vllm-apc-fn:{index} {dtype_name} w{width} B{B} seqs{nseq} d{dim} "
              f"checkpoints{len(pos)}", ok_j and state_same and ref_same,
              dict(jitconv_within=ok_j, vllm_within=ok_v, state_same=state_same,
                   state_is_reference=ref_same),
              {"jitconv": err_j, "vllm": err_v}, diff)


def vllm_apc_update(rng, tally, vllm_op, jit_op, index):
    """vLLM's causal_conv1d_update with prefix caching: each sequence reads one block's
    line and writes another's (decodes, or spec verify carrying every draft: where
    vLLM's whole-line shift and the contract agree)."""
    dtype_name = rng.choice(list(DTYPES))
    dtype = DTYPES[dtype_name]
    width = rng.choice([2, 3, 4])
    S = width - 1
    batch, K = rng.randint(1, 10), 4
    spec = rng.random() < 0.5
    k = rng.randint(1, 3) if spec else 0
    state_len = S + k
    lines_total = 1 + batch * K
    table = torch.tensor(rng.sample(range(1, lines_total), batch * K),
                         dtype=torch.int32).view(batch, K)
    initial = torch.tensor([rng.randrange(K) for _ in range(batch)], dtype=torch.int32)
    last = torch.tensor([rng.choice([int(i), rng.randrange(K)]) for i in initial],
                        dtype=torch.int32)
    T = k + 1
    n = batch * T
    dim = rng.choice([64, 2048])
    x = torch.randn(n, dim).to(dtype)
    w = torch.randn(dim, width).to(dtype).to(DEV)
    b = torch.randn(dim).to(dtype).to(DEV) if rng.random() < 0.7 else None
    state = torch.randn(lines_total, state_len, dim).to(dtype).to(DEV).transpose(1, 2)
    qsl = np.arange(0, n + 1, T).astype(np.int32)
    accepted = torch.tensor([rng.randint(1, k + 1) for _ in range(batch)], dtype=torch.int32)
    extra = dict(num_accepted_tokens=accepted.to(DEV),
                 query_start_loc=torch.from_numpy(qsl).to(DEV), max_query_len=T) if spec \
        else {}
    results = {}
    for side, op in (("vllm", vllm_op), ("jitconv", jit_op)):
        st = state.clone()
        out = op(x.clone().to(DEV), st, w, b, activation="silu",
                 conv_state_indices=table.to(DEV), block_idx_last_scheduled_token=last.to(DEV),
                 initial_state_idx=initial.to(DEV), **extra)
        sync()
        results[side] = (out.clone(), st)
    rows = np.arange(batch)
    read, write = table[rows, initial].numpy(), table[rows, last].numpy()
    part = "spec" if spec else "non_spec"
    meta = {f"{part}_query_start_loc": qsl, f"{part}_state_indices": read,
            f"{part}_write_indices": write}
    if spec:
        meta["num_accepted_tokens"] = accepted.numpy()
    ref = causal_conv1d_reference(x, w.cpu(), None if b is None else b.cpu(), state.cpu(),
                                  activation="silu", **meta)
    keep = list(range(n))
    (o_v, st_v), (o_j, st_j) = results["vllm"], results["jitconv"]
    ok_v, err_v = within(o_v, ref[0], dtype_name, keep)
    ok_j, err_j = within(o_j, ref[0], dtype_name, keep)
    state_same = bits_equal(st_v, st_j)
    diff = float((o_v.float() - o_j.float()).abs().max())
    tally.add(f"vllm-apc-update:{index} {dtype_name} w{width} b{batch} "
              f"{'spec k' + str(k) if spec else 'decode'} d{dim}", ok_j and state_same,
              dict(jitconv_within=ok_j, vllm_within=ok_v, state_same=state_same),
              {"jitconv": err_j, "vllm": err_v}, diff)


def main(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None)
    parser.add_argument("--device", default="cuda", help="torch device of the tensors")
    parser.add_argument("--jitconv-device", default="cuda:0")
    parser.add_argument("--budget", type=float, default=None,
                        help="stop starting cases after this many seconds (the summary "
                             "says how many ran)")
    parser.add_argument("--only", default="sglang-verify,sglang-prefill,vllm-tree,"
                                           "vllm-apc-fn,vllm-apc-update")
    args = parser.parse_args(argv)
    global DEV
    DEV = args.device
    if os.environ.get("TRITON_INTERPRET") == "1":
        interpreter_masks_as_bool()
    jitconv.set_device(args.jitconv_device)
    rng = random.Random(args.seed)
    torch.manual_seed(args.seed)
    import sglang.kernels.ops.mamba.causal_conv1d_triton as sgl
    import vllm.model_executor.layers.mamba.ops.causal_conv1d as vllm_ops
    from jitconv.vllm import installed, plugin
    vllm_op = vllm_ops.causal_conv1d_update
    made = plugin.replacements(installed.read_module(vllm_ops))
    jit_op = made["causal_conv1d_update"]
    tally = Tally()
    start = time.time()
    only = args.only.split(",")
    for i in range(args.cases):
        if args.budget is not None and time.time() - start > args.budget:
            break
        if i % 10 == 0:
            print(f"round {i}: {tally.cases} cases, {len(tally.failures)} failed, "
                  f"{time.time() - start:.0f} s", flush=True)
        if "sglang-verify" in only:
            sglang_verify(rng, tally, sgl, i)
        if "sglang-prefill" in only:
            sglang_prefill(rng, tally, sgl, i)
        if "vllm-tree" in only:
            vllm_tree(rng, tally, vllm_op, jit_op, i)
        if "vllm-apc-fn" in only:
            vllm_apc_fn(rng, tally, vllm_ops.causal_conv1d_fn, made["causal_conv1d_fn"], i)
        if "vllm-apc-update" in only:
            vllm_apc_update(rng, tally, vllm_op, jit_op, i)
    summary = dict(cases=tally.cases, failures=tally.failures[:20],
                   failed=len(tally.failures), outside_tolerance=tally.outside,
                   peer_outside_by_dtype={d: sum(f" {d} " in c["case"] for c in tally.peer_outside)
                                          for d in DTYPES},
                   peer_cases_outside=tally.peer_outside[:20],
                   max_error_vs_reference=tally.max_err,
                   max_abs_diff_between_sides=tally.max_diff, seconds=time.time() - start,
                   device=torch.cuda.get_device_name() if DEV == "cuda" else DEV,
                   jitconv_device=args.jitconv_device, torch=torch.__version__)
    print(json.dumps(summary, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=1)
    return 0 if not tally.failures else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
