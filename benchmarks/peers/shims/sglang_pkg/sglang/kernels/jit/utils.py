# shim for a side-by-side run, not SGLang's code
# Provides: sglang.kernels.jit.utils.is_arch_support_pdl (used by
# sglang/kernels/ops/mamba/causal_conv1d_triton.py).
# Upstream (sglang/kernels/jit/utils/arch.py) returns True on CUDA sm90+.
# Default here is False (no PDL launch); set PEERS_SGL_PDL=1 to mirror the
# upstream rule (CUDA compute capability major >= 9).
import os

import torch


def is_arch_support_pdl() -> bool:
    if os.environ.get("PEERS_SGL_PDL", "0") != "1":
        return False
    if getattr(torch.version, "hip", None) or not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability()[0] >= 9
