"""NVIDIA GPUs as jitconv devices ("cuda:N"), through numba-cuda; numba's CUDA simulator
(NUMBA_ENABLE_CUDASIM=1) lists one simulated "cuda:0" whose tensors are torch CPU
tensors. Importing this module imports neither numba nor numba-cuda.
"""

import functools
import importlib.util
import os

import torch

from jitconv.backends.cuda.state import STATE


@functools.lru_cache(maxsize=None)
def have_numba_cuda():
    # Looked up once: find_spec searches sys.path (tens of µs), and launches ask often.
    return importlib.util.find_spec("numba_cuda") is not None


def simulating():
    """numba's CUDA simulator is on (it must be set before numba.cuda is imported)."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" and have_numba_cuda()


def devices():
    """'cuda:N' for each NVIDIA GPU torch sees, when numba-cuda is installed (one
    simulated 'cuda:0' under the simulator)."""
    if not have_numba_cuda():
        return []
    if simulating():
        return ["cuda:0"]
    if not torch.cuda.is_available():
        return []
    return [f"cuda:{i}" for i in range(torch.cuda.device_count())]


def why_unavailable():
    if not have_numba_cuda():
        return "numba-cuda is not installed: pip install 'jitconv[cuda]'"
    if not simulating() and not torch.cuda.is_available():
        return "torch sees no CUDA GPU"
    return "no such device"


def is_cuda_name(name):
    return isinstance(name, str) and (name.strip() == "cuda" or name.strip().startswith("cuda:"))


def resolve(name):
    """The canonical 'cuda:N' for a device name, or None when there is no such GPU."""
    name = name.strip()
    name = "cuda:0" if name == "cuda" else name
    return name if name in devices() else None


def torch_device(name):
    """The torch device holding a CUDA device's tensors (the CPU under the simulator)."""
    return torch.device("cpu") if simulating() else torch.device(name)




def _compute_capability(device):
    found = STATE.capability.get(device.index)
    if found is None:
        found = STATE.capability.setdefault(device.index,
                                            torch.cuda.get_device_capability(device))
    return found


def native_bf16(device):
    """Whether the GPU rounds to bfloat16 itself (PTX cvt.rn.bf16.f32: compute capability
    8.0 and later); never under the simulator."""
    return not simulating() and _compute_capability(device) >= (8, 0)


def architecture(device):
    """"sm_XY" of a CUDA device (its compute capability), the tuning table's key."""
    major, minor = _compute_capability(device)
    return f"sm_{major}{minor}"
