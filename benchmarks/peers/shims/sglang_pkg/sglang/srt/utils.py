# shim for a side-by-side run, not SGLang's code
# Provides: sglang.srt.utils.get_device (CUDA/CPU branches of upstream's
# sglang/srt/utils/common.py::get_device).
from typing import Optional

import torch


def get_device(device_id: Optional[int] = None) -> str:
    if torch.cuda.is_available():
        return "cuda" if device_id is None else "cuda:{}".format(device_id)
    return "cpu"
