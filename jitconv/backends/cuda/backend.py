"""The CUDA backend: torch CUDA tensors (or, under numba's CUDA simulator, torch CPU
tensors while "cuda:N" is the current device), launched by ``launching``."""

import torch

from jitconv.backends import devices as current
from jitconv.backends.cuda import devices, launching
from jitconv.backends.cuda.state import STATE
from jitconv.kernels.abi import SPLIT_NONE, SPLIT_PARTS


class CudaBackend:
    name = "cuda"
    state = STATE  # everything the backend keeps between calls (``cuda.state``)

    def clear(self):
        """Forget every cache of the backend (``CudaState.clear``)."""
        self.state.clear()

    def forget_runs(self):
        """Drop every remembered run (``CudaState.forget_runs``): tests that watch
        which kernel a launch chooses (a remembered run chooses none)."""
        self.state.forget_runs()

    def devices(self):
        return devices.devices()

    def takes(self, x):
        """A torch CUDA tensor; a torch CPU tensor while a simulated CUDA device is
        current (numba's simulator runs on the host)."""
        # is_cuda, not device.type: a torch.device is built per access (a few hundred ns,
        # on every run's path)
        if not isinstance(x, torch.Tensor):
            return False
        if x.is_cuda:
            return True
        return x.is_cpu and devices.simulating() and current_is_cuda()

    @staticmethod
    def _refuse_capture(plan, x):
        if not plan.on_device and x.is_cuda and _capturing():
            raise RuntimeError(
                "plan: built from metadata values read on the host, so a CUDA graph that "
                "captured this run would replay those values even after the metadata "
                "tensors are rewritten; capture runs of jitconv.device_plan (which reads "
                "the metadata on the device at every replay), or run this plan eagerly")

    def remembered(self, plan, args, activation, math, split=SPLIT_NONE):
        self._refuse_capture(plan, args[0])
        if split == SPLIT_PARTS:
            return None, None
        return launching.run_remembered(plan, args, activation, math, split)

    def launch(self, plan, launch):
        if launch.windows is not None:  # a run with windows is never remembered
            self._refuse_capture(plan, launch.x)
        target, out2, parts = launch.target, launch.out2, launch.split == SPLIT_PARTS
        if parts:  # x for a part without tokens: never written (see Launch)
            target = launch.x if target is None else target
            out2 = launch.x if out2 is None else out2
        launching.launch(plan, launch.x, launch.weight, launch.bias, launch.conv_state,
                         target, launch.silu, launch.dtype, launch.math,
                         launch.key if launch.zero_copy else None,
                         (launch.out is None and not parts) or launch.stage is not None,
                         out2, launch.split,
                         launch.spec_slot0, launch.windows, launch.stage)

    def empty_output(self, x, shape, dtype):
        return torch.empty(shape, dtype=x.dtype, device=x.device)

    def remembered_stage(self, plan, args, stage_args, activation, math):
        if isinstance(args[0], torch.Tensor):
            self._refuse_capture(plan, args[0])
        return launching.stage_remembered(plan, args, stage_args, activation, math)

    def stage_refusal(self, head_k_dim, head_v_dim):
        # one warp per q or k head (launching.launch): head_k_dim / 32 channels per
        # thread, which must also divide head_v_dim
        channels = head_k_dim // 32
        if head_k_dim % 32 or channels not in (1, 2, 4, 8):
            return (f"head_k_dim: the CUDA stage kernel takes 32, 64, 128 or 256 (one "
                    f"warp per head), got {head_k_dim}")
        if head_v_dim % channels:
            return (f"head_v_dim: must be a multiple of head_k_dim / 32 = {channels} on "
                    f"CUDA, got {head_v_dim}")
        return None

    def as_floats(self, t):
        return t.to(torch.float32).contiguous()

    def empty(self, shape, dtype, device):
        """torch's own memory of the GPU (the CPU under numba's simulator): its allocator
        already pools."""
        return torch.empty(shape, dtype=dtype, device=devices.torch_device(device))

    def read_errors(self, plan):
        return launching.read_errors(plan)

    def new_error_words(self, device):
        return launching.new_error_words(device)

    def read_error_words(self, words):
        return launching.read_error_words(words)


def current_is_cuda():
    """Whether the current device is a CUDA device (False when none can be chosen)."""
    try:
        return devices.is_cuda_name(current.get_device())
    except current.DeviceNotFoundError:
        return False


try:  # torch's own test, without making a Stream object
    _capturing = torch._C._cuda_isCurrentStreamCapturing
except AttributeError:  # pragma: no cover
    _capturing = torch.cuda.is_current_stream_capturing


BACKEND = CudaBackend()
