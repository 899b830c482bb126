"""The SYCL conv kernel's source: the template (``jitconv.kernels.template``) with what is
SYCL's (the work-item's index: ``item.get_id``, an exact range, no bounds guard; the
stride-specific read paths, ``unit_stride_reads``), as text. No numba import: the kernel
cache's key, ``python -m jitconv show-kernel`` and the golden kernels in the tests read it
anywhere; ``kernels`` compiles it."""

import dataclasses

import numpy as np

from jitconv.kernels.abi import STORAGE, SUPPORTED_WIDTHS, WIDE_CHANNELS, fast_silu
from jitconv.kernels.planner import RECORD_ARGS
from jitconv.kernels.template import Backend, kernel_source as _template_source

SYCL = Backend(
    name="sycl", index_arg="item, ", extra_args="", unit_stride_reads=True,
    index="    c = item.get_id(0) * {C}  # first channel: the fastest index\n"
          "    b = item.get_id(1)  # block")


# The GDN stage's kernels (``stage``): an nd-range, each work-group the head_k_dim / C
# work-items of one q, k or v head and one token block (the host launches that local
# range), the range rounded up to whole work-groups (the guard), and the template's
# group_barrier l2norm (``template.Backend``): the work-group's barrier, whose fence
# covers global memory (numba-dpex's group_barrier: sequentially consistent, every
# address space).
SYCL_STAGE = dataclasses.replace(
    SYCL, group_barrier="group_barrier(item.get_group(), MemoryScope.WORK_GROUP)",
    index="    c = item.get_global_id(0) * {C}  # first channel: the fastest index\n"
          "    b = item.get_global_id(1)  # block\n"
          "    if c >= 2 * qk + vdim:\n"
          "        return  # the range is rounded up to whole work-groups (v heads only)")


def kernel_source(width, name, dtype_name, wide=False, record_args=None, chains=False,
                  stage=False, **backend_options):
    """The Python source of the SYCL conv kernel for one width and dtype: one channel per
    work-item, or with ``wide`` (a dtype of ``kernels.abi.WIDE_CHANNELS``) that many, each
    row of x, out and the conv state accessed that many channels at once.
    ``record_args``: the fused kernel's (``template.kernel_source``); ``chains``: the
    template's chain piece. ``backend_options``: other values of ``SYCL``'s flags (e.g.
    ``unit_stride_reads=False``: the kernel without its stride-specific reads), only for
    same-run comparisons."""
    backend = dataclasses.replace(SYCL_STAGE if stage else SYCL, **backend_options)
    channels = 1
    if wide:
        if dtype_name not in WIDE_CHANNELS or not backend.unit_stride_reads:
            raise ValueError(f"no wide kernel for {dtype_name} (wide kernels: "
                             f"{sorted(WIDE_CHANNELS)}, with unit_stride_reads)")
        channels = WIDE_CHANNELS[dtype_name]
    return _template_source(
        width, name, backend, channels=channels, row_group=channels,
        word_taps=backend.unit_stride_reads and width == 4 and STORAGE[dtype_name] == np.int16,
        record_args=record_args, chains=chains, stage=stage)


def name_and_source(width, dtype_name, fast=None, wide=False, fused=False, chains=False,
                    stage=False, **backend_options):
    """(kernel name, Python source) of one specialization. ``fast``: the fast silu (None:
    the dtype's default, ``abi.fast_silu``); ``wide``, ``backend_options``: as in
    ``kernel_source``; ``fused``: the kernel that computes its block's record from a
    device plan's metadata (``template.kernel_source``'s ``record_args``: it also takes
    ``planner.RECORD_ARGS``) instead of reading it from the tables; ``chains``: the
    kernel with the template's chain piece (for plans with parent maps or windows; the
    others run the kernel without it, which the chain piece made up to 1.12x slower on
    opencl:cpu: docs/performance.md); ``stage``: the GDN conv stage's kernel (an
    nd-range kernel: ``SYCL_STAGE``)."""
    if width not in SUPPORTED_WIDTHS:
        raise ValueError(f"width must be one of {SUPPORTED_WIDTHS}, got {width}")
    if fast is None:
        fast = fast_silu(dtype_name)
    chains = backend_options.pop("chains", chains) and not fused
    name = (f"jitconv_conv_w{width}_{dtype_name}" + ("_fast" if fast else "")
            + ("_wide" if wide else "") + ("_fused" if fused else "")
            + ("_chains" if chains else "") + ("_gdn" if stage else ""))
    return name, kernel_source(width, name, dtype_name, wide,
                               RECORD_ARGS if fused else None, chains=chains, stage=stage,
                               **backend_options)
