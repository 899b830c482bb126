"""One-shot calls whose metadata stays on the device.

A one-shot op (``jitconv.causal_conv1d_fn`` / ``_update`` / ``_mixed``) or a
``jitconv.vllm`` drop-in whose x is a CUDA or XPU tensor and whose metadata are tensors on
x's device (``on_device``) never reads the metadata's values on the host: it runs a
device plan (``device_plan.build``) kept for that set of metadata tensors, so the call
neither waits for the device nor refuses a CUDA graph capture, and a replay reads the
values the tensors hold then. Bad values are found on the device: the sequence is
skipped and its kind recorded in the device's error words (``device_errors``,
``jitconv.check_errors``).

Plans are kept by what the metadata tensors are (address, shape, strides, dtype,
device), never by their values, in the one-shot ops' plan cache (``plan_cache``):
engines pass the same persistent buffers, or the same slices of them, at every layer and
step. A kept plan holds its tensors, so their memory is not handed to other tensors
while the plan is kept.
"""

import torch

from jitconv.api import device_plan, plan_cache
from jitconv.kernels import planner

NO_ARRAYS = dict.fromkeys(planner.METADATA_ARRAYS)  # a call's arrays start from none


def on_device(x, *metadata):
    """Whether a call takes the device-metadata path: x a 2-D CUDA or XPU tensor, at
    least one metadata argument given, and every one given a tensor on x's device."""
    # is_cuda / is_xpu / get_device, not .device: a torch.device is built per access
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        return False
    cuda, xpu = x.is_cuda, x.is_xpu
    if not (cuda or xpu):
        return False
    index = x.get_device()
    given = False
    for m in metadata:
        if m is None:
            continue
        if not (isinstance(m, torch.Tensor) and m.is_cuda == cuda and m.is_xpu == xpu
                and m.get_device() == index):
            return False
        given = True
    return given


def describe(t):
    """What a metadata tensor (or None) is, for a kept plan's key (its device: that of
    x, in the key through ``shapes``)."""
    return None if t is None else (t.data_ptr(), t.shape, t.stride(), t.dtype)


def shapes(x, weight, conv_state):
    """x's device and the shapes of a call's tensors, for a kept plan's key (x: a CUDA
    or XPU tensor, ``on_device``)."""
    return (x.is_cuda, x.get_device(), x.shape, getattr(weight, "shape", None),
            getattr(conv_state, "shape", None))


def kept_plan(key, build):
    """The device plan kept under ``key`` (a tuple: the op's name and what the call's
    geometry, options and metadata tensors are), else ``build()``'s, then kept."""
    return plan_cache.plan_for(("device plan",) + key, build)


def build(geo, given, names, **options):
    """A device plan whose bad values go to the device's error words (``device_errors``):
    where a plan of the same layout was built before (``device_plan.layout``: an
    engine's metadata tensors are new at every step, their layout is not), that plan
    rebound to these tensors (``DevicePlan.rebound``: no check or field worked out
    again, the launches prepared for its signature shared), else a new one."""
    options["shared_errors"] = True
    layout = device_plan.layout(geo, given, names, options)
    if layout is not None:
        template = plan_cache.template(layout, names)
        if template is not None:
            return template.rebound(given)
    plan = device_plan.build(geo, given, names, **options)
    plan_cache.keep_template(layout, names, plan)
    return plan
