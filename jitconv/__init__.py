"""jitconv: the fused causal-conv1d + conv-state update of hybrid LLMs' Gated DeltaNet and
Mamba layers, any mix of prefill chunks, decodes and spec-decode verify in one launch.

Kernels are written in Python: one template, JIT-compiled with numba-dpex for the SYCL
device dpctl selects (an Intel GPU through Level Zero, or the Intel OpenCL CPU device; the
package ships them as SPIR-V) or with numba-cuda for NVIDIA GPUs. The public names are
below; the vLLM drop-ins and plugin are ``jitconv.vllm``, the float64 contract
``jitconv.reference``.
"""

from jitconv.version import __version__  # noqa: E402,F401

# torch first: our runtime bootstrap loads oneAPI libraries, and torch must keep its own.
import torch  # noqa: F401,E402

from jitconv.backends.devices import (DeviceNotFoundError, devices, get_device,  # noqa: E402
                                      get_queue, set_device)
from jitconv.backends.registry import empty, zeros  # noqa: E402
from jitconv.backends.sycl.bridge import (CopyRequiredError, copy_counts,  # noqa: E402
                                          reset_copy_counts, set_allow_copies)
from jitconv.backends.sycl.usm import pool_bytes, set_pool_limit  # noqa: E402
from jitconv.kernels.abi import SUPPORTED_WIDTHS  # noqa: E402
from jitconv.api.ops import clear_caches, plan  # noqa: E402
# The public ops: eager jitconv.api.ops, custom ops under torch.compile.
from jitconv.integrations.torch_ops import (causal_conv1d_fn, causal_conv1d_mixed,  # noqa: E402
                                            causal_conv1d_update)
from jitconv.api.plan import SplitOutputs, StageOutputs, StageResult, StepPlan  # noqa: E402
from jitconv.api.stage import gdn_conv_stage  # noqa: E402
from jitconv.api.device_plan import DevicePlan, device_plan  # noqa: E402
from jitconv.api.device_errors import check_errors  # noqa: E402
from jitconv.backends.sycl.device_check import DeviceCheckError  # noqa: E402
# Submodules as attributes: `jitconv.vllm.gdn_conv_step` works after `import jitconv`.
from jitconv import reference
from jitconv import vllm  # noqa: E402

__all__ = [
    "causal_conv1d_fn", "causal_conv1d_update", "causal_conv1d_mixed", "plan", "StepPlan",
    "clear_caches", "SplitOutputs", "gdn_conv_stage", "StageOutputs", "StageResult",
    "device_plan", "DevicePlan", "check_errors", "devices",
    "get_device", "set_device", "get_queue", "empty", "zeros", "copy_counts",
    "reset_copy_counts", "set_allow_copies", "set_pool_limit", "pool_bytes", "CopyRequiredError",
    "DeviceNotFoundError", "DeviceCheckError", "SUPPORTED_WIDTHS", "reference", "vllm",
]
