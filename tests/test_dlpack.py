"""jitconv.backends.sycl.dlpack, the DLPack capsule reader that replaces dpctl.tensor.from_dlpack:
fields read right from real producers' capsules (classic and versioned), ownership as
DLPack prescribes (the capsule is marked used; the producer's deleter runs once, when our
view dies), and kDLOneAPI tensors used zero-copy by the ops. Needs no dpctl.tensor, so it
also runs in the dpctl-only environments."""

import ctypes
import gc
import weakref

import numpy as np
import pytest
import torch

import jitconv
from jitconv.backends.sycl import bridge
from jitconv.backends.sycl import dlpack
from jitconv.reference import causal_conv1d_reference

from helpers import (DTYPES, assert_outputs_close, assert_state_exact, cumulative,
                     make_state, randn)

_valid = ctypes.pythonapi.PyCapsule_IsValid
_valid.restype, _valid.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]


def _capsule(t, versioned):
    return t.__dlpack__(max_version=(1, 0)) if versioned else t.__dlpack__()


@pytest.mark.parametrize("versioned", [False, True])
@pytest.mark.parametrize("dtype,name", [(torch.float32, "float32"),
                                        (torch.bfloat16, "bfloat16"),
                                        (torch.float16, "float16"),
                                        (torch.int64, "int64"), (torch.bool, "bool")])
def test_fields_of_torch_capsules(versioned, dtype, name):
    base = torch.zeros(6, 10, 4, dtype=dtype)
    t = base.transpose(1, 2)[1:, :, 3:8]  # offset, non-contiguous
    capsule = _capsule(t, versioned)
    kind = b"dltensor_versioned" if versioned else b"dltensor"
    assert _valid(capsule, kind)
    got = dlpack.from_capsule(capsule)
    assert _valid(capsule, b"used_" + kind) and not _valid(capsule, kind)
    assert got.address == t.data_ptr()
    assert got.shape == tuple(t.shape) and got.strides == tuple(t.stride())
    assert got.dtype == name and got.itemsize == t.element_size()
    assert got.device == (dlpack.KDL_CPU, 0)
    assert not got.copied and not got.read_only


def test_a_consumed_capsule_is_refused():
    capsule = torch.zeros(3).__dlpack__()
    keep = dlpack.from_capsule(capsule)
    with pytest.raises(ValueError, match="already consumed"):
        dlpack.from_capsule(capsule)
    del keep


@pytest.mark.parametrize("producer", ["numpy (classic capsule)",
                                      "torch (versioned capsule)"])
def test_producer_memory_lives_until_our_view_dies(producer):
    """The deleter is the only thing keeping the producer's memory: it must run exactly
    when the imported view is collected, not when the capsule goes, and not never."""
    array = np.arange(12, dtype=np.float32)
    alive = weakref.ref(array)
    if producer.startswith("numpy"):
        view = dlpack.import_tensor(array)  # numpy 1.26 knows no max_version: fallback
    else:
        view = dlpack.import_tensor(torch.from_numpy(array))
    address = array.ctypes.data
    del array
    gc.collect()
    assert alive() is not None, "freed while our view still uses it"
    assert view.address == address
    del view
    gc.collect()
    assert alive() is None, "the producer's deleter did not run"


class UsmTorchProducer:
    """A kDLOneAPI producer built from torch's own capsules of a ``jitconv.empty`` tensor:
    that memory IS SYCL USM of the device, which torch's CPU build labels kDLCPU. The
    capsule is relabelled with the device's kDLOneAPI id, as torch XPU would label it."""

    def __init__(self, tensor, versioned):
        self.tensor, self.versioned = tensor, versioned
        self.device_id = bridge.dlpack_device_id(jitconv.get_queue().sycl_device)
        self.shape, self.dtype = tensor.shape, tensor.dtype

    def __dlpack_device__(self):
        return (dlpack.KDL_ONEAPI, self.device_id)

    def __dlpack__(self, max_version=None, stream=None):
        if self.versioned and max_version:
            capsule, kind, struct = (self.tensor.__dlpack__(max_version=max_version),
                                     b"dltensor_versioned", dlpack._ManagedVersioned)
        else:
            capsule, kind, struct = self.tensor.__dlpack__(), b"dltensor", dlpack._Managed
        get = ctypes.pythonapi.PyCapsule_GetPointer
        get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
        managed = ctypes.cast(get(capsule, kind), ctypes.POINTER(struct)).contents
        managed.dl_tensor.device.device_type = dlpack.KDL_ONEAPI
        managed.dl_tensor.device.device_id = self.device_id
        return capsule


@pytest.mark.parametrize("versioned", [False, True])
@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_kdloneapi_capsules_run_zero_copy(sycl_device, versioned, dtype_name):
    dtype = DTYPES[dtype_name]
    gen = torch.Generator().manual_seed(7)
    dim, width, lengths = 40, 4, [3, 1, 6]
    x = randn(gen, (sum(lengths), dim), dtype, usm=True)
    weight = randn(gen, (dim, width), dtype, usm=True)
    bias = randn(gen, (dim,), dtype, usm=True)
    state = make_state(gen, 5, dim, width + 1, dtype, "SD", usm=True)
    meta = dict(non_spec_query_start_loc=cumulative(lengths),
                non_spec_state_indices=torch.tensor([4, 0, 2], dtype=torch.int32),
                has_initial_state=torch.tensor([True, False, True]))
    ref_out, ref_state = causal_conv1d_reference(x, weight, bias, state, **meta)
    jitconv.reset_copy_counts()
    out = jitconv.causal_conv1d_mixed(
        *(UsmTorchProducer(t, versioned) for t in (x, weight, bias, state)), **meta)
    assert jitconv.copy_counts() == {"to_device": 0, "from_device": 0}
    assert isinstance(out, torch.Tensor) and bridge.is_usm(out.data_ptr())
    assert_outputs_close(out, ref_out, dtype)
    assert_state_exact(state, ref_state)  # written through the imported capsule


def test_wrong_device_type_and_read_only_are_refused(sycl_device):
    with pytest.raises(TypeError, match="x: expected a torch tensor"):
        bridge.normalize(np.zeros((2, 3), np.float32), "x")  # kDLCPU producer
    cpu = UsmTorchProducer(jitconv.empty((2, 3)), versioned=True)
    cpu.device_id = 0
    cpu.__dlpack_device__ = lambda: (dlpack.KDL_CPU, 0)
    with pytest.raises(TypeError, match="x: expected a torch tensor"):
        bridge.normalize(cpu, "x")
    arr = bridge.normalize(UsmTorchProducer(jitconv.empty((2, 3)), versioned=True),
                           "conv_state")
    arr.read_only = True
    with pytest.raises(ValueError, match="conv_state: the array is read-only"):
        bridge.to_device(arr, "conv_state", writable=True)


def test_empty_cache_and_unsupported_dtype(sycl_device):
    """A conv_state with no cache lines (every sequence padded) has no memory to speak of;
    a dtype DLPack can describe but jitconv cannot use is refused naming the argument."""
    dim, width = 16, 3
    x = jitconv.empty((2, dim))
    x.copy_(torch.randn(2, dim))
    weight = jitconv.empty((dim, width))
    weight.copy_(torch.randn(dim, width))
    state = jitconv.empty((0, 2, dim)).transpose(1, 2)
    out = jitconv.causal_conv1d_fn(
        *(UsmTorchProducer(t, versioned=True) for t in (x, weight)), None,
        UsmTorchProducer(state, versioned=True), cumulative([1, 1]),
        torch.tensor([-1, -1], dtype=torch.int32))
    assert torch.equal(out, torch.zeros(2, dim))
    with pytest.raises(TypeError, match="x: DLPack dtype .code=5"):
        bridge.normalize(UsmTorchProducer(jitconv.empty((2, 2), torch.complex64), True), "x")
