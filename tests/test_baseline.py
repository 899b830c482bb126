"""The pure-torch baseline the benchmark compares against computes the same contract."""

import pytest

from jitconv.testing.baseline import causal_conv1d_mixed_torch
from jitconv.reference import causal_conv1d_reference

from helpers import DTYPES, assert_outputs_close, assert_state_exact, build_mixed


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("width", [2, 4])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("non_spec_accepted", [False, True])
def test_baseline_matches_reference(dtype_name, width, shuffle, non_spec_accepted):
    dtype = DTYPES[dtype_name]
    case = build_mixed(7 + width, dtype=dtype, width=width, dim=64, shuffle=shuffle,
                       non_spec_accepted=non_spec_accepted)
    ref_out, ref_state = causal_conv1d_reference(**case)
    out = causal_conv1d_mixed_torch(**case)
    assert_outputs_close(out, ref_out, dtype)
    assert_state_exact(case["conv_state"], ref_state)
