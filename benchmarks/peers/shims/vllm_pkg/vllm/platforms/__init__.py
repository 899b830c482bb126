# shim for a side-by-side run, not vLLM's code
# Provides: vllm.platforms.current_platform with seed_everything (same body as
# upstream vllm/platforms/interface.py::Platform.seed_everything).
import random

import numpy as np
import torch


class _Platform:
    device_type = "cuda"

    @classmethod
    def seed_everything(cls, seed=None) -> None:
        if seed is not None:
            random.seed(seed)
            np.random.seed(seed)
            torch.manual_seed(seed)


current_platform = _Platform()
