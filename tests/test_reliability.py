"""What a hostile or careless caller does: threads sharing one state, tensors that
overlap, read-only or autograd tensors, integers that do not fit, a server whose sizes
change every step. Each case ends in the right answer or in a ValueError / TypeError that
names the argument, with conv_state bit-identical; never a crash, a hang or a silent
wrong result."""

import json
import os
import subprocess
import sys
import threading
import weakref

import numpy as np
import pytest
import torch

import jitconv
from jitconv.backends.sycl import usm
from jitconv.reference import causal_conv1d_reference

from helpers import assert_outputs_close, assert_state_exact, bits, cumulative, randn

DIM, WIDTH = 48, 4


def decode_case(gen, lines=6, state_len=3, usm_memory=False):
    return dict(weight=randn(gen, (DIM, WIDTH), torch.float32, usm_memory),
                bias=randn(gen, (DIM,), torch.float32, usm_memory),
                conv_state=randn(gen, (lines, state_len, DIM), torch.float32,
                                 usm_memory).transpose(1, 2))


def i32(*values):
    return torch.tensor(values, dtype=torch.int32)


# ------------------------------------------------------------------------ threads

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("usm_memory", [False, True], ids=["plain", "usm"])
def test_threads_update_disjoint_lines_of_one_state(sycl_device, usm_memory, dtype):
    """4 threads x 12 decode calls, each thread on its own 2 lines of ONE state tensor
    (plain CPU tensors take the copy path: only the call's lines may be copied back)."""
    gen = torch.Generator().manual_seed(1)
    threads, calls, per_thread = 4, 12, 2
    case = {k: v.to(dtype) if not usm_memory else v for k, v in
            decode_case(gen, lines=threads * per_thread + 2, usm_memory=False).items()}
    if usm_memory:
        case = {k: _to_usm(v, dtype) for k, v in case.items()}
    state = case["conv_state"]
    initial = state.clone()
    xs = [[randn(gen, (per_thread, DIM), dtype, usm_memory) for _ in range(calls)]
          for _ in range(threads)]
    owned = [list(range(t * per_thread, (t + 1) * per_thread)) for t in range(threads)]
    outs, errors = {}, []
    start = threading.Barrier(threads)

    def work(t):
        try:
            start.wait()
            outs[t] = [jitconv.causal_conv1d_update(x, case["weight"], case["bias"], state,
                                                    i32(*owned[t])) for x in xs[t]]
        except Exception as exc:  # reported below
            errors.append(exc)

    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join(timeout=300)
    assert not errors, errors
    # Each thread's lines evolve as if it were alone: replay it on the reference.
    ref_state = initial.to(torch.float64).numpy()
    for t in range(threads):
        for x, out in zip(xs[t], outs[t]):
            ref_out, ref_state = causal_conv1d_reference(
                x, case["weight"], case["bias"], ref_state,
                non_spec_query_start_loc=cumulative([1] * per_thread),
                non_spec_state_indices=owned[t])
            assert_outputs_close(out, ref_out, dtype)
    assert_state_exact(state, ref_state)  # the two unowned lines included


def _to_usm(t, dtype):
    """``t`` in ``dtype`` in USM memory, keeping its strides (conv_state is a view)."""
    if t.dim() == 3:  # the transposed (lines, dim, state_len) view of conv_state
        stored = jitconv.empty(tuple(t.transpose(1, 2).shape), dtype)
        stored.copy_(t.transpose(1, 2))
        return stored.transpose(1, 2)
    u = jitconv.empty(tuple(t.shape), dtype)
    u.copy_(t)
    return u


FIRST_CALLS = """
import json, sys, threading, torch, jitconv
results, errors = [], []
start = threading.Barrier(8)
def work(seed):
    try:
        g = torch.Generator().manual_seed(seed)
        x, w, st = (torch.randn(s, generator=g) for s in ((3, 40), (40, 4), (3, 40, 3)))
        ref, ref_state = jitconv.reference.causal_conv1d_reference(
            x, w, None, st, non_spec_query_start_loc=[0, 1, 2, 3],
            non_spec_state_indices=[0, 1, 2])
        start.wait()
        out = jitconv.causal_conv1d_update(x, w, None, st, torch.arange(3, dtype=torch.int32))
        results.append(bool((abs(out.double().numpy() - ref) <= 1e-3 + 3e-4 * abs(ref)).all()
                            and torch.equal(st, torch.from_numpy(ref_state).float())))
    except Exception as exc:
        errors.append(repr(exc))
threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps({"results": results, "errors": errors}))
"""


def test_first_calls_from_many_threads_in_a_fresh_process(sycl_device, tmp_path):
    """8 threads make their first call at once in a new process with an empty kernel
    cache (one compiles, the others wait for it): all correct, no crash, no deadlock."""
    env = dict(os.environ, JITCONV_CACHE_DIR=str(tmp_path), JITCONV_DEVICE=sycl_device)
    done = subprocess.run([sys.executable, "-c", FIRST_CALLS], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["errors"] == [] and got["results"] == [True] * 8, got


# ----------------------------------------------------------------- overlap, aliasing

def _mixed_inputs(gen):
    case = decode_case(gen)
    case["x"] = randn(gen, (2, DIM), torch.float32)
    return case


def _alias(case, kind):
    """Change ``case`` so that two of its tensors share memory; returns the call's out."""
    state_storage = case["conv_state"].transpose(1, 2)  # (lines, state_len, dim)
    if kind == "out over the state's lines":
        return state_storage[0, :2, :]
    if kind == "x over the state":
        case["x"] = state_storage[1, :2, :]
        return None
    if kind == "out over weight":
        return case["weight"].t()[:2, :]
    if kind == "out rows of stride 0":
        return torch.empty(DIM).expand(2, DIM)
    if kind == "state lines that are one line (expand)":
        case["conv_state"] = state_storage[:1].expand(6, -1, -1).transpose(1, 2)
        return None
    if kind == "state lines that overlap (as_strided)":
        flat = torch.randn(6 * 3 * DIM)
        case["conv_state"] = flat.as_strided((6, DIM, 3), (DIM, 1, DIM))
        return None
    raise AssertionError(kind)


@pytest.mark.parametrize("kind,message", [
    ("out over the state's lines", "out and conv_state overlap in memory"),
    ("x over the state", "conv_state and x overlap in memory"),
    ("out over weight", "out and weight overlap in memory"),
    ("out rows of stride 0", "out: its elements overlap in memory"),
    ("state lines that are one line (expand)", "conv_state: the cache lines this call "
                                                "updates overlap in memory"),
    ("state lines that overlap (as_strided)", "conv_state: the cache lines this call "
                                               "updates overlap in memory"),
])
def test_overlapping_outputs_and_inputs_are_rejected(sycl_device, kind, message):
    gen = torch.Generator().manual_seed(2)
    case = _mixed_inputs(gen)
    out = _alias(case, kind)
    storage = case["conv_state"]
    snapshot = {k: bits(v) for k, v in case.items()}
    with pytest.raises(ValueError, match=message):
        jitconv.causal_conv1d_update(case["x"], case["weight"], case["bias"], storage,
                                     i32(0, 1), out=out)
    for k, v in case.items():
        assert torch.equal(bits(v), snapshot[k]), f"{k} changed"


def test_state_lines_may_share_memory_when_only_one_is_written(sycl_device):
    """An expand()ed state is fine while the call writes a single line of it."""
    gen = torch.Generator().manual_seed(3)
    case = _mixed_inputs(gen)
    storage = case["conv_state"].transpose(1, 2)[:1].expand(6, -1, -1).transpose(1, 2)
    x = case["x"][:1]
    ref_out, ref_state = causal_conv1d_reference(
        x, case["weight"], case["bias"], storage, non_spec_query_start_loc=[0, 1],
        non_spec_state_indices=[4])
    out = jitconv.causal_conv1d_update(x, case["weight"], case["bias"], storage, i32(4))
    assert_outputs_close(out, ref_out, torch.float32)
    assert torch.equal(bits(storage[4]), bits(torch.from_numpy(ref_state[4]).float()))


@pytest.mark.parametrize("tokens", [1, 40], ids=["one-block", "three-blocks"])
def test_out_may_still_alias_x_exactly(sycl_device, monkeypatch, tokens):
    """out=x is allowed. When every sequence fits one block, each element of x is read and
    its output written by one work-item, reads first: the kernel writes into x itself.
    Otherwise later blocks read earlier rows of x, so the kernel must write another
    buffer (the race rarely shows on the CPU device, so the launch is checked too)."""
    from jitconv.backends.sycl import launching
    launched = []
    submit = launching.submit_conv
    monkeypatch.setattr(launching, "submit_conv",
                        lambda queue, width, dtype, views, *a, **k:
                        launched.append(views) or submit(queue, width, dtype, views, *a, **k))
    gen = torch.Generator().manual_seed(4)
    case = decode_case(gen, usm_memory=True)  # zero-copy: x and out are one memory
    case["x"] = randn(gen, (2 * tokens, DIM), torch.float32, usm=True)
    qsl = [0, tokens, 2 * tokens]
    ref_out, ref_state = causal_conv1d_reference(
        case["x"], case["weight"], case["bias"], case["conv_state"],
        non_spec_query_start_loc=qsl, non_spec_state_indices=[0, 1])
    x = case["x"]
    assert jitconv.causal_conv1d_update(x, case["weight"], case["bias"], case["conv_state"],
                                        i32(0, 1), query_start_loc=i32(*qsl), out=x) is x
    assert_outputs_close(x, ref_out, torch.float32)
    assert_state_exact(case["conv_state"], ref_state)
    (views,) = launched
    if tokens == 1:
        assert views["out"].address == views["x"].address, "a copy where none is needed"
    else:
        assert views["out"].address != views["x"].address, "the kernel wrote into x"


# ------------------------------------------------------- read-only and autograd

class _Usm:
    """A jitconv.empty tensor seen through ``__sycl_usm_array_interface__``, whose
    producer may mark it read-only (the interface's data[1])."""

    def __init__(self, t, read_only=False):
        self.keep = t
        self.__sycl_usm_array_interface__ = {
            "data": (t.data_ptr(), read_only), "shape": tuple(t.shape),
            "strides": tuple(t.stride()), "typestr": "<f4", "version": 1,
            "syclobj": jitconv.get_queue()}


@pytest.mark.parametrize("target", ["conv_state", "out"])
def test_read_only_targets_are_rejected(sycl_device, target):
    gen = torch.Generator().manual_seed(5)
    x = randn(gen, (2, DIM), torch.float32, usm=True)
    w, b = randn(gen, (DIM, WIDTH), torch.float32, True), randn(gen, (DIM,), torch.float32, True)
    state = randn(gen, (3, DIM, 3), torch.float32, usm=True)
    out = jitconv.empty((2, DIM))
    before = bits(state)
    args = {"conv_state": _Usm(state, target == "conv_state"),
            "out": _Usm(out, target == "out")}
    with pytest.raises(ValueError, match=f"{target}: the array is read-only"):
        jitconv.causal_conv1d_update(_Usm(x), _Usm(w), _Usm(b), args["conv_state"],
                                     i32(0, 1), out=args["out"])
    assert torch.equal(bits(state), before)
    # the same call with writable arrays runs
    jitconv.causal_conv1d_update(_Usm(x), _Usm(w), _Usm(b), _Usm(state), i32(0, 1),
                                 out=_Usm(out))
    assert not torch.equal(bits(state), before)


def test_read_only_out_that_is_x_is_rejected_as_read_only(sycl_device):
    """out=x on a read-only array: the error names the read-only target (not the copy
    path that an out overlapping x takes), and nothing is written."""
    gen = torch.Generator().manual_seed(7)
    x = randn(gen, (2, DIM), torch.float32, usm=True)
    w, b = randn(gen, (DIM, WIDTH), torch.float32, True), randn(gen, (DIM,), torch.float32, True)
    state = randn(gen, (3, DIM, 3), torch.float32, usm=True)
    before, x_before = bits(state), bits(x)
    x_ro = _Usm(x, True)
    with pytest.raises(ValueError, match="out: the array is read-only"):
        jitconv.causal_conv1d_update(x_ro, _Usm(w), _Usm(b), _Usm(state), i32(0, 1),
                                     out=x_ro)
    assert torch.equal(bits(state), before) and torch.equal(bits(x), x_before)


@pytest.mark.parametrize("target", ["conv_state", "out"])
def test_inference_tensors_outside_inference_mode_are_rejected(sycl_device, target):
    gen = torch.Generator().manual_seed(6)
    case = _mixed_inputs(gen)
    with torch.inference_mode():
        made = {"conv_state": case["conv_state"].clone(), "out": torch.empty(2, DIM)}
    state = made["conv_state"] if target == "conv_state" else case["conv_state"]
    out = made["out"] if target == "out" else None
    before = bits(state)
    with pytest.raises(ValueError, match=f"{target}: an inference tensor cannot be updated"):
        jitconv.causal_conv1d_update(case["x"], case["weight"], case["bias"], state,
                                     i32(0, 1), out=out)
    assert torch.equal(bits(state), before)
    with torch.inference_mode():  # where torch allows it, it works
        jitconv.causal_conv1d_update(case["x"], case["weight"], case["bias"], state,
                                     i32(0, 1), out=out)


@pytest.mark.parametrize("which", ["x", "weight", "conv_state"])
def test_tensors_requiring_grad_are_rejected_while_grad_is_on(sycl_device, which):
    """The conv has no autograd: with grad mode on, a tensor that requires grad is an
    error (before anything runs); under no_grad the same call runs."""
    gen = torch.Generator().manual_seed(7)
    case = _mixed_inputs(gen)
    case[which] = case[which].detach().requires_grad_(True) if which != "conv_state" \
        else torch.randn(6, 3, DIM).requires_grad_(True).transpose(1, 2)
    state = case["conv_state"]
    before = bits(state)
    with pytest.raises(TypeError, match=f"{which}: requires grad, but jitconv's conv has "
                                        f"no autograd"):
        jitconv.causal_conv1d_update(case["x"], case["weight"], case["bias"], state,
                                     i32(0, 1))
    assert torch.equal(bits(state), before)
    with torch.no_grad():
        ref_out, ref_state = causal_conv1d_reference(
            case["x"], case["weight"], case["bias"], state,
            non_spec_query_start_loc=[0, 1, 2], non_spec_state_indices=[0, 1])
        out = jitconv.causal_conv1d_update(case["x"], case["weight"], case["bias"], state,
                                           i32(0, 1))
    assert_outputs_close(out, ref_out, torch.float32)
    assert_state_exact(state, ref_state)


# ------------------------------------------------------------------ integer metadata

@pytest.mark.parametrize("lines,message", [
    (np.array([1, 2**64 - 1], dtype=np.uint64), "value 18446744073709551615 does not fit"),
    (torch.tensor([1, 2**63 - 1], dtype=torch.int64), "value 9223372036854775807 does not"),
    (np.array([1, 2**31], dtype=np.int64), "value 2147483648 does not fit the int32"),
    (torch.tensor([1, 2], dtype=torch.int32, device="meta"), "meta device"),
])
def test_cache_lines_that_do_not_fit_are_errors(sycl_device, lines, message):
    gen = torch.Generator().manual_seed(8)
    case = _mixed_inputs(gen)
    before = bits(case["conv_state"])
    with pytest.raises((ValueError, TypeError), match=f"conv_state_indices: .*{message}"):
        jitconv.causal_conv1d_update(case["x"], case["weight"], case["bias"],
                                     case["conv_state"], lines)
    assert torch.equal(bits(case["conv_state"]), before)


def test_torch_uint64_lines_that_wrap_are_errors(sycl_device):
    if not hasattr(torch, "uint64"):
        pytest.skip("this torch has no uint64")
    gen = torch.Generator().manual_seed(9)
    case = _mixed_inputs(gen)
    lines = torch.tensor([1, 2**64 - 1], dtype=torch.uint64)
    with pytest.raises(ValueError, match="conv_state_indices: value 18446744073709551615"):
        jitconv.causal_conv1d_update(case["x"], case["weight"], case["bias"],
                                     case["conv_state"], lines)


def test_spec_indices_with_no_columns_name_the_argument(sycl_device):
    gen = torch.Generator().manual_seed(10)
    case = _mixed_inputs(gen)
    with pytest.raises(ValueError, match=r"spec_state_indices: expected shape \(num_seqs,\) "
                                         r"or \(num_seqs, K\) with K >= 1, got \(2, 0\)"):
        jitconv.causal_conv1d_mixed(
            case["x"], case["weight"], case["bias"], case["conv_state"],
            spec_query_start_loc=[0, 1, 2], spec_state_indices=torch.zeros(2, 0, dtype=torch.int32),
            num_accepted_tokens=[1, 1])


def test_two_d_python_lists_are_accepted_like_arrays(sycl_device):
    gen = torch.Generator().manual_seed(11)
    case = _mixed_inputs(gen)
    case["conv_state"] = randn(gen, (6, 4, DIM), torch.float32).transpose(1, 2)
    twin = case["conv_state"].clone()
    table = [[3, 9, 9], [5, 9, 9]]
    meta = dict(spec_query_start_loc=[0, 1, 2], num_accepted_tokens=[1, 2])
    ref_out, ref_state = causal_conv1d_reference(
        case["x"], case["weight"], case["bias"], case["conv_state"],
        spec_state_indices=np.array(table), **meta)
    out = jitconv.causal_conv1d_mixed(case["x"], case["weight"], case["bias"],
                                      case["conv_state"], spec_state_indices=table, **meta)
    assert_outputs_close(out, ref_out, torch.float32)
    assert_state_exact(case["conv_state"], ref_state)
    jitconv.causal_conv1d_mixed(case["x"], case["weight"], case["bias"], twin,
                                spec_state_indices=np.array(table, np.int32), **meta)
    assert torch.equal(bits(twin), bits(case["conv_state"]))


# ------------------------------------------------------------------------- memory

POOL_FINALIZERS = """
import gc, json, torch, jitconv
from jitconv.backends.sycl import usm
found = lambda t: usm.find_allocation(t.data_ptr()) is not None
seen = {}
jitconv.set_pool_limit(1 << 20)
t = jitconv.empty((1000,), torch.uint8); t.fill_(1)
address = t.data_ptr()
del t; gc.collect()
seen["kept"] = jitconv.pool_bytes()
jitconv.set_pool_limit(0)          # evicts the last reference: its finalizer runs inside
seen["after_limit_0"] = jitconv.pool_bytes()
seen["forgotten"] = usm.find_allocation(address) is None
t = jitconv.empty((2000,), torch.uint8)
with usm._pool.lock:               # a finalizer on the thread that holds the pool's lock
    del t; gc.collect()            # (as when the garbage collector starts inside the pool)
seen["after_release"] = jitconv.pool_bytes()
jitconv.set_pool_limit(1 << 20)
u = jitconv.empty((3000,), torch.uint8); v = jitconv.empty((3000,), torch.uint8)
seen["live_found"] = found(u) and found(v)
del u; gc.collect()
w = jitconv.empty((3000,), torch.uint8)  # reuses u's memory
seen["reused_found"] = found(w) and found(v)
print(json.dumps(seen))
"""


def test_pool_finalizers_never_wait_for_the_pool(sycl_device, tmp_path):
    """Freed memory comes back to the pool through finalizers, which run wherever the last
    reference goes: also inside the pool's own methods (an eviction drops the last
    reference) or on a thread holding its lock. None of that may deadlock; the changes are
    applied once the lock is free. In a subprocess, so a deadlock fails this test instead
    of hanging the run."""
    env = dict(os.environ, JITCONV_CACHE_DIR=str(tmp_path), JITCONV_DEVICE=sycl_device)
    try:
        done = subprocess.run([sys.executable, "-c", POOL_FINALIZERS], env=env,
                              capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("the pool deadlocked on its own finalizers")
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"kept": 1000, "after_limit_0": 0, "forgotten": True, "after_release": 0,
                    "live_found": True, "reused_found": True}, seen


def test_a_late_gone_change_keeps_a_new_allocation_at_the_same_address(sycl_device):
    """An allocation's "gone" change can be applied after a new allocation at the same
    address was registered (the finalizer ran while the lock was held): the registry must
    keep the new one. (The USM allocator rarely reuses an address at once, so the
    registry's order of events is set up by hand on a pool of its own.)"""
    pool = usm._Pool(0)
    old = pool.take(jitconv.get_device(), 4096)
    base = old._pointer
    pool.lock.acquire()
    del old  # its finalizer queues ("gone", base): the lock is held
    pool.lock.release()
    assert list(pool.pending) == [("gone", base)]
    new = usm._SharedAllocation(4096, queue=jitconv.get_queue())
    pool.sizes[base] = (weakref.ref(new), 4096)  # as if ``new`` had landed at ``base``
    pool._settle()
    assert pool.find(base + 8) == (new, 8)


def test_output_pool_is_bounded_by_bytes_and_keeps_the_newest(sycl_device):
    """Freed jitconv.empty buffers of ever-changing sizes: the pool never holds more than
    its limit, and it evicts the least recently freed buffers (not the newest)."""
    mib = 1 << 20
    previous = jitconv.set_pool_limit(3 * mib)
    try:
        device = jitconv.get_device()
        sizes = [mib + 4096 * i for i in range(1, 7)]  # all different, ~1 MiB each
        for n in sizes:
            t = jitconv.empty((n,), torch.uint8)
            t.fill_(1)
            del t
            assert jitconv.pool_bytes() <= 3 * mib
        kept = {key[1] for key in usm._pool.free if key[0] == device}
        assert kept == set(sizes[-2:]), kept  # 2 x ~1 MiB fit, the newest
        jitconv.set_pool_limit(0)
        assert jitconv.pool_bytes() == 0
        with pytest.raises(ValueError, match="nbytes: expected an int >= 0"):
            jitconv.set_pool_limit(-1)
    finally:
        jitconv.set_pool_limit(previous)
