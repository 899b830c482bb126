"""The CUDA backend: torch CUDA tensors (or, under numba's CUDA simulator, torch CPU
tensors while "cuda:N" is the current device), launched by ``launching``."""

import torch

from jitconv import device as current
from jitconv.backends.cuda import devices, launching


class CudaBackend:
    name = "cuda"

    def devices(self):
        return devices.devices()

    def takes(self, x):
        """A torch CUDA tensor; a torch CPU tensor while a simulated CUDA device is
        current. A CPU tensor while a real CUDA device is current is an error: its memory
        is not the GPU's."""
        if not isinstance(x, torch.Tensor) or x.device.type not in ("cuda", "cpu"):
            return False
        if x.device.type == "cuda":
            return True
        try:
            name = current.get_device()
        except current.DeviceNotFoundError:
            return False
        if not devices.is_cuda_name(name):
            return False
        if devices.simulating():
            return True
        raise TypeError(f"x: a CPU tensor, but the current device is {name}: pass torch "
                        f"CUDA tensors (x.to('{name}')) or select a SYCL device")

    def remembered(self, plan, args, activation, math):
        return None, None  # each run is packed anew (see launching for its cost)

    def launch(self, plan, launch):
        launching.launch(plan, launch.x, launch.weight, launch.bias, launch.conv_state,
                         launch.target, launch.silu, launch.dtype, launch.math)


BACKEND = CudaBackend()
