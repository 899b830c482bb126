"""The tuning table: the values each kind of CUDA kernel gets (the ones measured and
kept, docs/design.md), overrides checked by name and value and undone after their block,
and the kernel each kind of launch asks for. Pure Python: no device needed."""

import dataclasses

import pytest

from jitconv.backends.cuda import launching
from jitconv.backends.cuda.source import STATE_CHUNK_EXTRA, KernelSpec
from jitconv.kernels import tuning


def test_table_values_by_kind_and_dtype():
    general = tuning.cuda("sm_90", "bfloat16", "general")
    assert (general.channels, general.row_group, general.group_state,
            general.early_weights) == (2, 2, False, False)
    assert (general.lookahead, general.short_lookahead, general.long_lookahead) == (0, 4, 8)
    assert (general.threads, general.max_registers) == (128, 64)
    assert all((general.short_kernel, general.vector_taps, general.constant_layout,
                general.compact_args, general.fixed_block, general.exact_grid,
                general.uniform_decode)) and not general.fastmath
    decode = tuning.cuda("sm_90", "bfloat16", "decode")
    assert (decode.row_group, decode.group_state, decode.early_weights) == (2, True, True)
    assert tuning.cuda("sm_90", "bfloat16", "spec").row_group == 1  # 16-bit spec: single
    assert tuning.cuda("sm_90", "float16", "spec").row_group == 1
    assert tuning.cuda("sm_90", "float32", "spec").row_group == 2
    assert tuning.cuda("simulator", "float32", "general").threads == 32


def test_override_is_checked_and_undone():
    with tuning.override(lookahead=16, row_group=1):
        assert tuning.cuda("sm_90", "float32", "general").lookahead == 16
        assert tuning.cuda("sm_90", "float32", "spec").row_group == 1
        with tuning.override(lookahead=2):
            assert tuning.cuda("sm_90", "float32", "decode").lookahead == 2
        assert tuning.cuda("sm_90", "float32", "decode").lookahead == 16
    assert tuning.cuda("sm_90", "float32", "general") == \
        tuning.cuda("sm_90", "float32", "general")  # noqa: PLR0124 (frozen, comparable)
    assert tuning.cuda("sm_90", "float32", "general").lookahead == 0


@pytest.mark.parametrize("values, name", [
    ({"channels": 3}, "channels"), ({"lookahead": 3}, "lookahead"),
    ({"max_registers": 60}, "max_registers"), ({"threads": 100}, "threads"),
    ({"row_group": 3}, "row_group"), ({"short_kernel": 1}, "short_kernel"),
    ({"constant_layout": "yes"}, "constant_layout"), ({"channel": 2}, "channel"),
])
def test_bad_override_is_refused_by_name(values, name):
    with pytest.raises(ValueError, match=name):
        with tuning.override(**values):
            pass
    assert tuning.overrides() == ()


def test_channels_and_lookahead_rules():
    assert [launching.channels_for(dim, 4) for dim in (12, 10, 9)] == [4, 2, 1]
    auto = tuning.CudaTuning()
    assert [launching.lookahead_for(auto, n) for n in (0, 1, 4, 5, 16)] == [4, 4, 4, 8, 8]
    assert launching.lookahead_for(dataclasses.replace(auto, lookahead=16), 1) == 16


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_each_kind_asks_for_its_kernel(dtype_name):
    general = launching.kind_spec(4, dtype_name, "general")
    decode = launching.kind_spec(4, dtype_name, "decode")
    spec = launching.kind_spec(4, dtype_name, "spec")
    assert (general.short_tokens, decode.short_tokens, spec.short_tokens) == \
        (0, 1, 3 + STATE_CHUNK_EXTRA)
    assert (general.lookahead, decode.lookahead, spec.lookahead) == (8, 4, 4)
    assert decode.uniform_decode and not general.uniform_decode and not spec.uniform_decode
    assert general.vector_taps and not launching.kind_spec(3, dtype_name, "decode").vector_taps
    assert spec.row_group == (2 if dtype_name == "float32" else 1)
    with tuning.override(short_kernel=False):
        assert launching.kind_spec(4, dtype_name, "decode").short_tokens == 0
    with pytest.raises(ValueError, match="kind"):
        launching.kind_spec(4, dtype_name, "prefill")


def test_kernel_spec_normalizes_what_has_no_effect():
    """One kernel, one spec: the bf16 instruction only for bfloat16, compact arguments
    only with a layout, the exact grid only with a fixed block."""
    assert KernelSpec(width=4, dtype_name="float32", native_bf16=True) == \
        KernelSpec(width=4, dtype_name="float32")
    assert KernelSpec(width=4, dtype_name="bfloat16", native_bf16=True).native_bf16
    assert not KernelSpec(width=4, dtype_name="float32", compact_args=True).compact_args
    assert not KernelSpec(width=4, dtype_name="float32", exact_grid=True).exact_grid
    spec = KernelSpec(width=4, dtype_name="float32", layout=(1, 2), block=(32, 1))
    assert spec.compact_args and spec.exact_grid
