"""The torch bridge's other doors: dpctl usm_ndarrays, dpnp arrays, and any producer of
kDLOneAPI DLPack capsules (the path torch XPU tensors take). All zero-copy; the in-place
state update must be visible in the caller's array."""

import numpy as np
import pytest
import torch

import jitconv
from jitconv.backends.sycl import bridge
from jitconv.reference import causal_conv1d_fn_reference

from helpers import TOLERANCE, cumulative


class OneApiProducer:
    """A foreign array that only speaks DLPack (as a torch XPU tensor does)."""

    def __init__(self, array):
        self._array = array
        self.shape, self.dtype = array.shape, array.dtype

    def __dlpack__(self, *args, **kwargs):
        return self._array.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


class ClassicOneApiProducer(OneApiProducer):
    """A producer from before DLPack 1.0: no max_version, classic "dltensor" capsules."""

    def __dlpack__(self, stream=None):
        return self._array.__dlpack__()


def _host_case(seed, dtype, dim=48, width=4):
    rng = np.random.default_rng(seed)
    lengths = [3, 1, 9, 2]
    n = sum(lengths)
    return dict(
        x=rng.standard_normal((n, dim)).astype(dtype),
        weight=rng.standard_normal((dim, width)).astype(dtype),
        bias=rng.standard_normal(dim).astype(dtype),
        conv_state=rng.standard_normal((6, width - 1 + 2, dim)).astype(dtype),  # SD storage
        query_start_loc=cumulative(lengths).numpy(),
        cache_indices=np.array([4, 0, -1, 2], np.int32),
        has_initial_state=np.array([True, False, True, True]),
    )


def _check(result_host, state_host, case, dtype_name):
    ref_out, ref_state = causal_conv1d_fn_reference(
        case["x"], case["weight"], case["bias"], case["conv_state"].transpose(0, 2, 1),
        case["query_start_loc"], case["cache_indices"], case["has_initial_state"])
    rtol, atol = TOLERANCE[getattr(torch, dtype_name)]
    np.testing.assert_allclose(result_host.astype(np.float64), ref_out, rtol=rtol, atol=atol)
    np.testing.assert_array_equal(state_host.transpose(0, 2, 1),
                                  ref_state.astype(state_host.dtype))


@pytest.mark.parametrize("dtype_name", ["float32", "float16"])
def test_dpctl_usm_ndarrays(sycl_device, dtype_name):
    import dpctl.tensor as dpt
    case = _host_case(1, dtype_name)
    q = jitconv.get_queue()
    dev = {k: dpt.asarray(v, sycl_queue=q) for k, v in case.items()
           if k in ("x", "weight", "bias", "conv_state")}
    jitconv.reset_copy_counts()
    out = jitconv.causal_conv1d_fn(dev["x"], dev["weight"], dev["bias"],
                                   dpt.permute_dims(dev["conv_state"], (0, 2, 1)),
                                   case["query_start_loc"], case["cache_indices"],
                                   case["has_initial_state"])
    assert isinstance(out, dpt.usm_ndarray)
    assert jitconv.copy_counts() == {"to_device": 0, "from_device": 0}
    _check(dpt.asnumpy(out), dpt.asnumpy(dev["conv_state"]), case, dtype_name)


def test_dpnp_arrays(sycl_device):
    import dpnp
    case = _host_case(2, "float32")
    q = jitconv.get_queue()
    dev = {k: dpnp.asarray(v, sycl_queue=q) for k, v in case.items()
           if k in ("x", "weight", "bias", "conv_state")}
    out = jitconv.causal_conv1d_fn(dev["x"], dev["weight"], dev["bias"],
                                   dev["conv_state"].transpose(0, 2, 1),
                                   case["query_start_loc"], case["cache_indices"],
                                   case["has_initial_state"])
    assert isinstance(out, dpnp.ndarray)
    _check(dpnp.asnumpy(out), dpnp.asnumpy(dev["conv_state"]), case, "float32")


def test_kdloneapi_capsules_are_imported_zero_copy(sycl_device):
    import dpctl.tensor as dpt
    import dpnp
    q = jitconv.get_queue()
    for producer in (dpt.reshape(dpt.arange(12, dtype="f4", sycl_queue=q), (3, 4)),
                     dpnp.arange(12, dtype="f4", sycl_queue=q).reshape(3, 4)):
        assert producer.__dlpack_device__()[0] == bridge.KDL_ONEAPI
        for kind in (OneApiProducer, ClassicOneApiProducer):  # versioned, then classic
            view, write_back = bridge.to_device(kind(producer), "x")
            usm = producer if isinstance(producer, dpt.usm_ndarray) else producer.get_array()
            assert view.address == usm.__sycl_usm_array_interface__["data"][0]
            assert view.shape == (3, 4) and view.strides == (4, 1) and write_back is None


def test_state_update_visible_through_dlpack_producer(sycl_device):
    """conv_state handed over only as a DLPack producer: the kernel writes the caller's
    memory (no copy exists that could be written back)."""
    import dpctl.tensor as dpt
    case = _host_case(3, "float32")
    q = jitconv.get_queue()
    state_storage = dpt.asarray(case["conv_state"], sycl_queue=q)
    state_ds = dpt.permute_dims(state_storage, (0, 2, 1))
    x = dpt.asarray(case["x"], sycl_queue=q)
    w = dpt.asarray(case["weight"], sycl_queue=q)
    b = dpt.asarray(case["bias"], sycl_queue=q)
    out = jitconv.causal_conv1d_fn(OneApiProducer(x), OneApiProducer(w), OneApiProducer(b),
                                   OneApiProducer(state_ds), case["query_start_loc"],
                                   case["cache_indices"], case["has_initial_state"])
    _check(np.asarray(out), dpt.asnumpy(state_storage), case, "float32")


def test_empty_recycles_memory_only_after_every_view_is_gone(sycl_device):
    import gc
    a = jitconv.empty((4099,), torch.float32)  # an unusual size: nothing else pooled
    address = a.data_ptr()
    view = a[10:]
    del a
    gc.collect()
    b = jitconv.empty((4099,), torch.float32)
    assert b.data_ptr() != address, "memory still used by a view must not be handed out"
    del view
    gc.collect()
    c = jitconv.empty((4099,), torch.float32)
    assert c.data_ptr() == address, "released memory is reused"
    assert bridge.is_usm(c.data_ptr())


def test_device_metadata_strided_x_and_aliased_out(sycl_device):
    """Metadata given as dpnp arrays is read by memcpy; x with strided channels is copied
    by dpnp itself; out aliasing x is written through a separate buffer."""
    import dpnp
    case = _host_case(4, "float32")
    q = jitconv.get_queue()
    x_t = dpnp.asarray(np.ascontiguousarray(case["x"].T), sycl_queue=q)  # (dim, tokens)
    x = x_t.T  # (tokens, dim), channel stride = tokens
    assert x.__sycl_usm_array_interface__["strides"][1] != 1
    state = dpnp.asarray(case["conv_state"], sycl_queue=q)
    meta = {k: dpnp.asarray(case[k], sycl_queue=q)
            for k in ("query_start_loc", "cache_indices", "has_initial_state")}
    out = jitconv.causal_conv1d_fn(x, dpnp.asarray(case["weight"], sycl_queue=q),
                                   dpnp.asarray(case["bias"], sycl_queue=q),
                                   state.transpose(0, 2, 1), **meta)
    _check(dpnp.asnumpy(out), dpnp.asnumpy(state), case, "float32")

    case = _host_case(5, "float32")
    x = dpnp.asarray(case["x"], sycl_queue=q)
    state = dpnp.asarray(case["conv_state"], sycl_queue=q)
    result = jitconv.causal_conv1d_fn(x, dpnp.asarray(case["weight"], sycl_queue=q),
                                      dpnp.asarray(case["bias"], sycl_queue=q),
                                      state.transpose(0, 2, 1), case["query_start_loc"],
                                      case["cache_indices"], case["has_initial_state"],
                                      out=x)
    assert result is x
    _check(dpnp.asnumpy(x), dpnp.asnumpy(state), case, "float32")


def test_copy_path_from_several_threads(sycl_device):
    """Plain CPU tensors are copied in and out with dpctl.memory + queue.memcpy, which is
    safe from several threads (dpctl 0.17's dpt.asarray / asnumpy aborted the process)."""
    import threading
    errors = []

    def worker(seed):
        try:
            for rep in range(3):
                case = {k: torch.from_numpy(v) for k, v in
                        _host_case(100 * seed + rep, "float32").items()}
                state = case["conv_state"].clone()
                out = jitconv.causal_conv1d_fn(
                    case["x"], case["weight"], case["bias"], state.transpose(1, 2),
                    case["query_start_loc"], case["cache_indices"],
                    case["has_initial_state"])
                _check(out.numpy(), state.numpy(),
                       {k: v.numpy() for k, v in case.items()}, "float32")
        except Exception as exc:  # reported below, with the thread's traceback lost
            errors.append(repr(exc))

    jitconv.reset_copy_counts()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert jitconv.copy_counts()["from_device"] > 0  # the copy path ran
