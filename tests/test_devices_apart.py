"""What jitconv keeps per device stays with its device (issue 35, on one machine).

Two sub-devices of the device under test (the OpenCL CPU device partitioned into its
cores; a GPU's tiles where the driver partitions it), each with a context of its own,
stand in for two GPUs: programs, USM allocations and a plan's tables belong to one
device and context. Runs on the two, interleaved from two threads, must each get their
own kernels and tables and stay exact; memory of one handed to a queue of the other is
refused by name before anything runs. (The runtime here gives every context made for one
device the same context, so sub-devices are the way to two.) The CUDA backend keys the
same caches by device index and stream; with one GPU, that is reviewed, not tested.
"""

import threading
import traceback

import pytest
import torch

import jitconv
from jitconv.backends.sycl import launching, tables
from jitconv.backends.sycl.usm import DeviceArray
from jitconv.reference import causal_conv1d_reference
from jitconv.backends.sycl.state import STATE as SYCL_STATE

from helpers import (DATA_KEYS, TransposedView, assert_outputs_close, assert_state_exact,
                     bits, mixed_step)


@pytest.fixture(scope="module")
def two_contexts(sycl_device):
    """In-order queues on two sub-devices of the device under test, a context each."""
    dpctl = pytest.importorskip("dpctl")
    device = jitconv.get_queue().sycl_device
    try:
        subs = device.create_sub_devices(partition=max(1, device.max_compute_units // 2))
    except Exception as exc:  # a device the driver does not partition
        pytest.skip(f"{device.name} has no sub-devices here ({exc})")
    if len(subs) < 2:
        pytest.skip(f"{device.name} splits into {len(subs)} sub-device")
    queues = [dpctl.SyclQueue(dpctl.SyclContext(d), d, property="in_order")
              for d in subs[:2]]
    assert queues[0].sycl_context != queues[1].sycl_context
    return queues


def _step(seed):
    gen = torch.Generator().manual_seed(seed)
    step = mixed_step(gen, dim=40, width=4, dtype=torch.float32, ns_lengths=[9, 1, 1],
                      sp_lengths=[3, 2], rows="shuffled", initial="alternate",
                      extra_lines=2)
    return {k: step[k] for k in DATA_KEYS}, {k: v for k, v in step.items()
                                              if k not in DATA_KEYS}


def _on(queue, data):
    """The layer's tensors as device memory of ``queue``'s context; conv_state stored
    (lines, state_len, dim) and seen (lines, dim, state_len) through a transposed view."""
    arrays = {k: DeviceArray(data[k], queue) for k in ("x", "weight", "bias")}
    arrays["state"] = DeviceArray(data["conv_state"].transpose(1, 2), queue)
    return arrays


def test_one_plan_in_two_contexts_from_two_threads(two_contexts):
    """One host plan (no queue of its own: each run takes its arrays' queue) run in both
    contexts, three layers' worth each, from two threads at once: every run exact
    against the reference, the tables uploaded once per context, a kernel per context."""
    data, meta = _step(1)
    lines, _dim, state_len = data["conv_state"].shape
    plan = jitconv.plan(data["x"].shape[0], lines, state_len, 4, **meta)
    # the same layer in both contexts; each context's state advances on its own
    expected = []
    state = data["conv_state"].clone()
    for _ in range(3):
        out, ref_state = causal_conv1d_reference(**dict(data, conv_state=state), **meta)
        expected.append((out, ref_state))
        state = torch.as_tensor(ref_state, dtype=torch.float32)  # states are copies: exact
    results, errors = {}, []

    def work(queue):
        try:
            arrays = _on(queue, data)
            out = DeviceArray(torch.full(tuple(data["x"].shape), float("nan")), queue)
            got = []
            for _ in range(3):
                plan.run(arrays["x"], arrays["weight"], arrays["bias"],
                         TransposedView(arrays["state"]), out=out)
                got.append((out.to_tensor(), arrays["state"].to_tensor().transpose(1, 2)))
            results[queue] = got
        except Exception as exc:  # reported below, with the thread's queue
            errors.append(f"{queue}: {type(exc).__name__}: {exc} {traceback.format_exc()}")

    threads = [threading.Thread(target=work, args=(q,)) for q in two_contexts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, "\n".join(errors)
    for queue in two_contexts:
        for (out, state), (ref_out, ref_state) in zip(results[queue], expected):
            assert_state_exact(state, ref_state)
            assert_outputs_close(out, ref_out, torch.float32)
    uploaded = tables._of(plan)["tables"]
    for queue in two_contexts:
        assert queue.sycl_context in uploaded, "a context's tables were not its own"
    built = {key[1] for key in SYCL_STATE.kernels}
    assert all(q.sycl_context in built for q in two_contexts), "a context's kernel is missing"
    names = {launching.devices.name_of(q.sycl_device) for q in two_contexts}
    assert len(names) == 2 and {key[0] for key in SYCL_STATE.kernels} >= names


def test_memory_of_another_context_is_refused_by_name(two_contexts):
    """A plan bound to one sub-device's queue, handed x or conv_state in memory of the
    other: refused by name, both devices named, before anything is launched; the state
    untouched."""
    data, meta = _step(2)
    lines, _dim, state_len = data["conv_state"].shape
    here, there = two_contexts
    plan = jitconv.plan(data["x"].shape[0], lines, state_len, 4, queue=here, **meta)
    mine, other = _on(here, data), _on(there, data)
    for name in ("x", "state", "all"):
        arrays = other if name == "all" else dict(mine, **{name: other[name]})
        before = bits(arrays["state"].to_tensor())
        submitted = SYCL_STATE.stats["submitted"]
        with pytest.raises(ValueError) as err:
            plan.run(arrays["x"], arrays["weight"], arrays["bias"],
                     TransposedView(arrays["state"]))
        # x on the other device: weight is the first tensor apart from x
        arg = {"state": "conv_state", "x": "weight", "all": "x"}[name]
        message = str(err.value)
        assert message.startswith(arg) and all(
            launching.devices.name_of(q.sycl_device) in message for q in two_contexts), \
            message
        assert SYCL_STATE.stats["submitted"] == submitted
        assert torch.equal(bits(arrays["state"].to_tensor()), before)
