"""The fp16/bf16 conversions of the kernels (jitconv.kernels.bit_conversions): the LLVM IR the
intrinsics emit (compiled here by numba for the CPU: the same IR the SYCL and CUDA
kernels get) and the Python twins numba's CUDA simulator runs instead, both against
torch's own conversions, bit for bit, on random values and the edge cases (ties,
subnormals, overflow to inf, inf, NaN)."""

import numpy as np
import pytest
import torch
from numba import njit
from numba.core.extending import intrinsic

from jitconv.kernels import bit_conversions

INTRINSICS = bit_conversions.intrinsics(intrinsic)
PYTHON = bit_conversions.python_converters()


def _compiled(name):
    op = INTRINSICS[name]

    @njit
    def apply(values, out):
        for i in range(values.shape[0]):
            out[i] = op(values[i])
    return apply


def _float_inputs(seed):
    gen = torch.Generator().manual_seed(seed)
    rand = torch.randn(4000, generator=gen) * torch.exp2(torch.randint(-30, 30, (4000,), generator=gen).float())
    bits = torch.randint(-(1 << 31), (1 << 31) - 1, (4000,), generator=gen, dtype=torch.int64)
    any_bits = bits.to(torch.int32).view(torch.float32)  # every pattern: NaNs, subnormals
    ties = torch.tensor([1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -11, 1 + 3 * 2 ** -11,
                         65504.0, 65520.0, 70000.0, 6e-8, 3e-8, 1e-40, -0.0, 0.0,
                         float("inf"), -float("inf"), float("nan"), 3.4e38])
    # NaNs a rounding without its NaN check would turn into inf (payload in the low 16
    # bits only) or, by the carry, into -0.0 / +0.0 (all-ones mantissa).
    nans = torch.tensor([0x7F800001, 0xFF800001, 0x7F807FFF, 0x7FFFFFFF, 0xFFFFFFFF,
                         0x7FC00000, 0x7FBFFFFF], dtype=torch.int64).to(torch.int32)
    return torch.cat([rand, any_bits, ties, nans.view(torch.float32)]).to(torch.float32)


def _same(got_bits, want_bits, what):
    got, want = np.asarray(got_bits, np.int16), want_bits.numpy()
    bad = np.flatnonzero(got != want)
    assert not len(bad), f"{what}: {len(bad)} differ, first at {bad[0]}: {got[bad[0]]:#x} vs {want[bad[0]]:#x}"


@pytest.mark.parametrize("target,torch_dtype", [("bf16", torch.bfloat16), ("f16", torch.float16)])
def test_float32_to_16_bit_rounds_as_torch(target, torch_dtype):
    values = _float_inputs(1)
    want = values.to(torch_dtype).view(torch.int16)
    nan = torch.isnan(values)
    name = f"f32_to_{target}"
    out = np.empty(len(values), np.int16)
    _compiled(name)(values.numpy(), out)
    python = np.array([PYTHON[name](v) for v in values.numpy()], np.int16)
    for what, got in (("intrinsic", out), ("python twin", python)):
        # NaNs: any quiet NaN is fine (payloads may differ from torch's)
        as_float = torch.from_numpy(got).view(torch_dtype).float()
        assert torch.isnan(as_float[nan]).all(), what
        _same(got[~nan.numpy()], want[~nan], f"{name} {what}")


@pytest.mark.parametrize("source,torch_dtype", [("bf16", torch.bfloat16), ("f16", torch.float16)])
def test_16_bit_to_float32_is_exact(source, torch_dtype):
    patterns = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16)
    want = patterns.view(torch_dtype).float()
    name = f"{source}_to_f32"
    out = np.empty(len(patterns), np.float32)
    _compiled(name)(patterns.numpy(), out)
    python = np.array([PYTHON[name](v) for v in patterns.numpy()], np.float32)
    for what, got in (("intrinsic", out), ("python twin", python)):
        got = torch.from_numpy(got)
        nan = torch.isnan(want)
        assert torch.isnan(got[nan]).all(), what
        assert torch.equal(got[~nan].view(torch.int32), want[~nan].view(torch.int32)), what


def test_a_wrong_rounding_is_caught():
    """Truncation instead of round-to-nearest-even must fail the comparison above."""
    values = _float_inputs(2)
    truncated = (values.view(torch.int32) >> 16).to(torch.int16)
    want = values.to(torch.bfloat16).view(torch.int16)
    ok = ~torch.isnan(values)
    with pytest.raises(AssertionError):
        _same(truncated[ok].numpy(), want[ok], "truncation")
