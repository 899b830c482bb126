"""The fp16/bf16 conversions of the kernels (jitconv.bit_conversions): the LLVM IR the
intrinsics emit (compiled here by numba for the CPU: the same IR the SYCL and CUDA
kernels get) and the Python twins numba's CUDA simulator runs instead, both against
torch's own conversions, bit for bit, on random values and the edge cases (ties,
subnormals, overflow to inf, inf, NaN)."""

import numpy as np
import pytest
import torch
from numba import njit
from numba.core.extending import intrinsic

from jitconv import bit_conversions

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
    return torch.cat([rand, any_bits, ties]).to(torch.float32)


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


def test_bf16_rounding_without_nan_check_is_the_same_for_what_arithmetic_gives():
    """f32_to_bf16_arith (the fast silu's store) skips the NaN check: it must equal
    f32_to_bf16 for every non-NaN value and for every quiet NaN with zero low 16 bits
    (what float32 arithmetic on 16-bit inputs gives: an input's payload, or the default
    NaN), intrinsic and Python twin alike. Other NaNs may differ (documented)."""
    values = _float_inputs(3)
    word = values.view(torch.int32)
    quiet_nans = torch.tensor([0x7FC00000, 0xFFC00000, 0x7FC10000, 0x7FFF0000, 0xFFFF0000,
                               0x7FE50000], dtype=torch.int64).to(torch.int32)
    same_as_exact = ~torch.isnan(values) | ((word & 0xFFFF) == 0) & ((word & 0x400000) != 0)
    values = torch.cat([values[same_as_exact], quiet_nans.view(torch.float32)])
    exact, arith = np.empty(len(values), np.int16), np.empty(len(values), np.int16)
    _compiled("f32_to_bf16")(values.numpy(), exact)
    _compiled("f32_to_bf16_arith")(values.numpy(), arith)
    python = np.array([PYTHON["f32_to_bf16_arith"](v) for v in values.numpy()], np.int16)
    want = torch.from_numpy(exact)
    _same(arith, want, "f32_to_bf16_arith intrinsic")
    _same(python, want, "f32_to_bf16_arith python twin")
    # The NaNs it does not handle: low payload bits only (-> inf), or a carry (-> -0).
    odd = torch.tensor([0x7F800001, 0x7FFFFFFF], dtype=torch.int64).to(torch.int32)
    _compiled("f32_to_bf16_arith")(odd.view(torch.float32).numpy(), arith[:2])
    assert [int(v) & 0xFFFF for v in arith[:2]] == [0x7F80, 0x8000]
