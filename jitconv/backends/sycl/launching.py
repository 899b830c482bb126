"""Compile, cache and submit kernels.

numba-dpex compiles each kernel specialization once to SPIR-V (kept on disk by
``kernel_cache``); dpctl builds that SPIR-V into a SYCL kernel for the device, and every
launch is a plain ``SyclQueue.submit``. This avoids numba-dpex's per-call dispatch (~215 us
per call on opencl:cpu, against ~20 us for a submit) and compiles one specialization per
(width, dtype) instead of one per combination of argument layouts: the argument types are
fixed by ``kernels.abi.CONV_ARGS`` (flat arrays with explicit strides), so contiguous and
strided tensors share one kernel. With a warm cache numba and numba-dpex are never
imported.

A numba-dpex array argument is flattened into five kernel parameters (its device data
model): nitems (int64), itemsize (int64), data pointer, shape[ndim] (int64) and
strides[ndim] (int64, in bytes). ``_array`` builds exactly that list.
"""

import contextlib
import ctypes
import itertools
import struct
import threading
import warnings
from pathlib import Path

import numpy as np

from jitconv.backends.sycl import device_check
from jitconv.backends.sycl import kernel_cache
from jitconv.kernels.abi import (CONV_ARGS, SPLIT_NONE, SPLIT_PARTS, STAGE_ARGS, STORAGE,
                                 TABLES, WIDE_CHANNELS, fast_silu, rows_aligned,
                                 stage_divisors)
from jitconv.kernels.planner import METADATA_ARRAYS, RECORD_ARGS
from jitconv.backends.sycl import devices
from jitconv.backends.sycl.state import STATE


def prepare_numba_dpex(queue):
    """numba-dpex installs its kernel typing/lowering registries on the first call_kernel.

    Compiling a dispatcher directly (which we do, to get SPIR-V for an explicit signature)
    fails before that with "No definition for lowering static_getitem(UniTuple...)". One
    launch of a trivial kernel on the first compile initialises them.
    """
    if STATE.numba_ready:
        return
    import dpctl.tensor as dpt
    import numba_dpex as dpex

    @dpex.kernel
    def _warmup(item, a):
        a[item.get_id(0)] = a.shape[0]

    a = dpt.zeros(1, dtype="i8", device=queue)
    dpex.call_kernel(_warmup, dpex.Range(1), a)
    STATE.numba_ready = True


def planner_types(names, element_types, queue, arrays=METADATA_ARRAYS):
    """numba-dpex types of ``names`` (``planner.PLAN_ARGS``, ``RECORD_ARGS`` or
    ``RULE_ARGS``): a metadata array 1-D of its element type (``element_types``, in
    ``arrays`` order), the record table and error words int32, every other argument
    int64."""
    from numba import types
    from numba_dpex.core.types import DpctlSyclQueue, USMNdArray
    qtype = DpctlSyclQueue(queue)
    elements = dict(zip(arrays, element_types), tables="int32", errors="int32")
    return [USMNdArray(1, layout="C", dtype=getattr(types, elements[n]), queue=qtype)
            if n in elements else types.int64 for n in names]


def _signature(width, dtype_name, queue, record_types=None, stage=False):
    """The conv kernel's signature (``kernels.abi.CONV_ARGS``), then for a fused kernel
    the record's arguments (``planner.RECORD_ARGS``) with metadata of ``record_types``,
    or a stage kernel's ``abi.STAGE_ARGS`` (its index an nd-item)."""
    from numba import types
    from numba_dpex.core.types import DpctlSyclQueue, USMNdArray
    from numba_dpex.core.types.kernel_api.index_space_ids import ItemType, NdItemType

    ntype = {"raw": getattr(types, np.dtype(STORAGE[dtype_name]).name),
             "int32": types.int32, "int64": types.int64, "float32": types.float32}
    qtype = DpctlSyclQueue(queue)
    args = [NdItemType(2) if stage else ItemType(2)]
    for _name, ndim, elem, layout in CONV_ARGS + (STAGE_ARGS if stage else ()):
        if ndim == 0:
            args.append(ntype[elem])
        else:
            args.append(USMNdArray(ndim, layout=layout, dtype=ntype[elem], queue=qtype))
    if record_types is not None:
        args += planner_types(RECORD_ARGS, record_types, queue)
    return types.void(*args)


def compile_spirv(width, dtype_name, queue, wide=False, fast=None, record_types=None,
                  chains=False, stage=False):
    """SPIR-V bytes and kernel name of one specialization, compiled by numba-dpex
    (``record_types``: the fused kernel for device plans with metadata of those element
    types, ``planner.METADATA_ARRAYS`` order; None: the kernel that reads the tables)."""
    from numba.core.target_extension import target_override

    from jitconv.backends.sycl.kernels import make_conv_kernel

    queue = devices.compile_queue(queue)
    prepare_numba_dpex(queue)
    dispatcher = make_conv_kernel(width, dtype_name, fast, wide=wide,
                                  fused=record_types is not None, chains=chains,
                                  stage=stage)
    with target_override("dpex"):
        result = dispatcher.get_compile_result(_signature(width, dtype_name, queue,
                                                          record_types, stage))
    STATE.stats["compiled"] += 1
    module = result.kernel_device_ir_module
    return module.kernel_bitcode, module.kernel_name


class KernelUnavailableError(RuntimeError):
    """No usable SPIR-V for a specialization, and numba-dpex is not there to compile it."""


def have_compiler():
    import importlib.util
    return importlib.util.find_spec("numba_dpex") is not None


def program(queue, spirv, name):
    import dpctl.program as dpp
    kernel = dpp.create_program_from_spirv(queue, spirv).get_sycl_kernel(name)
    STATE.stats["built"] += 1
    return kernel


def _build(width, dtype_name, queue, wide, fast=None, record_types=None, chains=False,
           stage=False):
    """Disk cache first (no numba-dpex import at all), else compile and store. Returns
    (kernel, its SPIR-V)."""
    entry = kernel_cache.load(width, dtype_name, wide, fast, record_types, chains, stage)
    if entry is not None:
        spirv, name, path = entry
        try:
            kernel = program(queue, spirv, name)
            STATE.stats["cache_hits"] += 1
            return kernel, spirv
        except Exception as exc:  # dpctl could not build it for this device
            STATE.rejected.append((str(path), f"build failed: {exc}"))
            warnings.warn(f"jitconv: ignoring the {kernel_cache.origin(path)} kernel "
                          f"{path}: the device rejected it ({exc})", RuntimeWarning)
    if not have_compiler():
        raise KernelUnavailableError(
            f"no usable prebuilt kernel for width={width}, dtype={dtype_name}"
            f"{' (wide)' if wide else ''}"
            f"{f' (fused, metadata {record_types})' if record_types else ''}"
            f"{' (with the chain piece: parent maps or windows)' if chains else ''}"
            f"{' (the GDN stage)' if stage else ''} in "
            f"{[str(d) for d in kernel_cache.search_dirs()]} and numba-dpex is not "
            f"installed to compile one; run `python -m jitconv build-kernels` where "
            f"numba-dpex is installed and point JITCONV_CACHE_DIR at the result"
            + (f" (ignored: {STATE.rejected})" if STATE.rejected else ""))
    return compile_and_store(width, dtype_name, queue, required=False, wide=wide,
                             with_spirv=True, fast=fast, record_types=record_types,
                             chains=chains, stage=stage)


def compile_and_store(width, dtype_name, queue, directory=None, required=True, wide=False,
                      with_spirv=False, fast=None, record_types=None, chains=False,
                      stage=False):
    """Compile with numba-dpex, build (only what builds is stored), store the SPIR-V.
    Returns (kernel, path of the stored SPIR-V), or (kernel, SPIR-V bytes) ``with_spirv``.
    With ``required=False`` a cache that cannot be written (read-only, no home directory)
    costs a warning, once per directory, and the kernel is still returned (path None):
    compiled once, not cached."""
    spirv, name = compile_spirv(width, dtype_name, queue, wide, fast, record_types, chains,
                                stage)
    kernel = program(queue, spirv, name)
    try:
        path = kernel_cache.store(width, dtype_name, spirv, name, directory, wide, fast,
                                  record_types, chains, stage)
        return kernel, spirv if with_spirv else path
    except OSError as exc:
        if required:
            raise
        where = str(directory or kernel_cache.cache_dir())
        STATE.rejected.append((where, f"not writable: {exc}"))
        if where not in STATE.warned_dirs:
            STATE.warned_dirs.add(where)
            warnings.warn(
                f"jitconv: cannot write the kernel cache {where} ({exc}); kernels are "
                f"compiled in every new process until it is writable. Set "
                f"JITCONV_CACHE_DIR to a writable directory.", RuntimeWarning, stacklevel=2)
        return kernel, spirv if with_spirv else None


def get_conv_kernel(width, dtype_name, queue, wide=False, fast=None, record_types=None,
                    chains=False, stage=False):
    """The built SYCL kernel for (the queue's device and context, width, dtype, wide or
    not, silu's math: ``fast``, None for the dtype's default; ``record_types``: the fused
    kernel for device plans with metadata of those element types; ``chains``: the kernel
    with the chain piece, for plans with parent maps or windows; ``stage``: the GDN
    stage's nd-range kernel): from this process's
    table, the disk cache, or a fresh numba-dpex compile, in that order. A program belongs
    to one context: a queue of another context (torch's, a user's) gets its own build of
    the same SPIR-V."""
    fast = fast_silu(dtype_name) if fast is None else fast
    key = (devices.name_of(queue.sycl_device), queue.sycl_context, width, dtype_name, wide,
           fast, chains, stage, record_types)
    kernel = STATE.kernels.get(key)
    if kernel is None:
        with STATE.kernels_lock:
            kernel = STATE.kernels.get(key)
            if kernel is None:
                refused = device_check.refusal(key[0])
                if refused is not None:
                    raise refused
                kernel, spirv = _build(width, dtype_name, queue, wide, fast, record_types,
                                       chains, stage)
                # Before its first launch: a kernel that fails is never kept or launched.
                launch = (_known_answer_stage_launch(kernel, queue, dtype_name, wide) if stage
                          else _known_answer_launch(kernel, queue, dtype_name, wide,
                                                    record_types))
                device_check.verify(queue, width, dtype_name, wide, spirv, launch,
                                    fast=fast, record_types=record_types, chains=chains,
                                    stage=stage)
                STATE.kernels[key] = kernel
    return kernel



def fused_kernel(width, dtype_name, queue, wide, fast, record_types):
    """The fused conv kernel (``get_conv_kernel`` with ``record_types``), or None where
    none is shipped or cached for it and numba-dpex is not there to compile one: a device
    plan then submits its planner before the kernel that reads the tables (two submits,
    the same results). Remembered per process, so a miss costs one lookup."""
    fast = fast_silu(dtype_name) if fast is None else fast
    miss = (devices.name_of(queue.sycl_device), width, dtype_name, wide, fast, record_types)
    if miss in STATE.unavailable:
        return None
    try:
        return get_conv_kernel(width, dtype_name, queue, wide, fast, record_types)
    except KernelUnavailableError:
        STATE.unavailable.add(miss)
        return None


def check_kernel(width, dtype_name, queue, wide=False, fast=None, record_types=None,
                 stage=False):
    """Build one specialization for ``queue`` and run its device check now, whatever the
    stored verdicts say (``python -m jitconv check``). Raises DeviceCheckError on a wrong
    answer (the device is then refused in this process)."""
    kernel, spirv = _build(width, dtype_name, queue, wide, fast, record_types, stage=stage)
    launch = (_known_answer_stage_launch(kernel, queue, dtype_name, wide) if stage else
              _known_answer_launch(kernel, queue, dtype_name, wide, record_types))
    device_check.verify(queue, width, dtype_name, wide, spirv, launch, force=True,
                        fast=fast, record_types=record_types, stage=stage)


def _known_answer_stage_launch(kernel, queue, dtype_name, wide):
    """How the device check launches a stage kernel: once, on its own arrays (views as
    ``submit_stage``'s), waited for, and not counted as a submit of the caller's."""
    def launch(views, tables_view, offsets, num_blocks, dim, stage, has_bias, silu,
               spec_slot0):
        values, grid, local = _stage_values(dtype_name, wide, views,
                                            table_args(tables_view, offsets), num_blocks,
                                            dim, stage, has_bias, silu, spec_slot0)
        _submit(kernel, queue, values, grid, wait=True, local=local,
                pointers=_POINTERS + STAGE_POINTERS)
    return launch


def _known_answer_launch(kernel, queue, dtype_name, wide, record_types=None):
    """How the device check launches ``kernel``: once, on its own arrays, waited for, and
    not counted as a submit of the caller's. ``record``: a fused kernel's (metadata
    views by ``planner.METADATA_ARRAYS`` name and "errors", scalars by name)."""
    def launch(views, tables_view, offsets, num_blocks, dim, has_bias, silu, record=None):
        values = _pack(views, table_args(tables_view, offsets), has_bias, silu)
        grid = (num_blocks, dim // WIDE_CHANNELS[dtype_name] if wide else dim)
        if record_types is not None:
            values += record_params(*record)
        _submit(kernel, queue, values, grid, wait=True)
    return launch


def wide_fits(views, dim, dtype_name):
    """Whether a launch can take the wide kernel (``kernels.abi.WIDE_CHANNELS``): a dtype
    that has one, dim a multiple of its channel count C, and every row of x, out (and
    out2) and the conv state (channels contiguous) starting at a multiple of C elements,
    so that its C-channel words are aligned (``kernels.abi.rows_aligned``; the conv state's view is
    (lines, dim, state_len), channels on axis 1 like x's and out's). Everything else
    takes the one-channel kernel."""
    group = WIDE_CHANNELS.get(dtype_name)
    if group is None or dim % group:
        return False
    return all(rows_aligned(v.address, v.itemsize, v.shape, v.strides, group)
               for v in (views["x"], views["out"], views["conv_state"], views.get("out2"))
               if v is not None)


def _array_params(nitems, itemsize, pointer, *scalars):
    """A flat 1-D numba-dpex array of ``nitems`` as its five kernel parameters (see the
    module docstring), then ``scalars``. The pointer is the third (``_ARRAY_POINTER``)."""
    return [nitems, itemsize, pointer, nitems, itemsize, *scalars]


_ARRAY_POINTER = 2


def array_args(view, *scalars):
    """One array argument as the kernel's parameters: the view's whole allocation as a
    flat 1-D array, then ``scalars`` (its element offset and strides, passed
    separately)."""
    extent = 1
    for n, s in zip(view.shape, view.strides):
        if n > 0:
            extent += (n - 1) * s
    return _array_params(view.offset + extent, view.itemsize, view.memory, *scalars)


# submit_conv packs the arguments in this order; a change of the ABI must change both.
_PACKED = (("x", "x_offset", "x_row_stride", "out", "out_offset", "out_row_stride",
            "weight", "weight_offset", "weight_stride_c", "weight_stride_k", "bias",
            "bias_offset", "bias_stride", "state", "state_offset", "state_stride_line",
            "state_stride_c", "state_stride_col", "tables") + TABLES + ("has_bias", "silu",
            "out2", "out2_offset", "out2_row_stride", "split", "spec_slot0", "win",
            "win_offset", "win_stride_row", "win_stride_step", "win_stride_c",
            "win_stride_col"))
if tuple(a[0] for a in CONV_ARGS) != _PACKED:
    raise ImportError("kernels.abi.CONV_ARGS changed: update launching.submit_conv")
# Which packed parameters are USM pointers (the third of an array's five).
_POINTERS = tuple(p for _name, ndim, _e, _l in CONV_ARGS
                  for p in ([i == _ARRAY_POINTER for i in range(5)] if ndim else (False,)))


def pointer_layout(names, arrays):
    """Which packed parameters of ``names`` are USM pointers, where those in ``arrays``
    are arrays (five parameters each, ``metadata_params``) and the rest scalars."""
    return tuple(p for name in names
                 for p in ([i == _ARRAY_POINTER for i in range(5)] if name in arrays
                           else [False]))


# A fused kernel's record parameters (``planner.RECORD_ARGS``): which are USM pointers.
RECORD_POINTERS = pointer_layout(RECORD_ARGS, METADATA_ARRAYS + ("errors",))


CONV_PARAMS = len(_POINTERS)  # a conv kernel's packed parameters (a fused kernel's first)


def pointers_of(count):
    """Which of ``count`` packed conv parameters are USM pointers: a conv kernel's, or a
    fused kernel's (its record's after them)."""
    return _POINTERS if count == len(_POINTERS) else _POINTERS + RECORD_POINTERS


def metadata_params(names, arrays, strides, scalars):
    """Packed parameters of ``names`` (``planner.PLAN_ARGS`` or ``RECORD_ARGS``): an
    array of ``arrays`` (DeviceViews by name) as its five, ``<array>_offset`` its view's
    element offset, ``<array>_stride`` its element stride (``strides``: 0 for a
    placeholder, never read), anything else from ``scalars``."""
    values = []
    for name in names:
        base = name.rsplit("_", 1)[0]
        if name in arrays:
            values += array_args(arrays[name])
        elif name.endswith("_offset") and base in arrays:
            values.append(arrays[base].offset)
        elif name.endswith("_stride") and base in arrays:
            values.append(strides[base])
        else:
            values.append(scalars[name])
    return values


def record_params(arrays, strides, scalars):
    """A fused kernel's record parameters (``metadata_params`` of ``RECORD_ARGS``)."""
    return metadata_params(RECORD_ARGS, arrays, strides, scalars)


def table_args(view, offsets):
    """The packed parameters of the tables argument: constant for a plan, built once."""
    return array_args(view, *(offsets[name] for name in TABLES))


def _pack(views, tables, has_bias, silu, split=SPLIT_NONE, spec_slot0=0):
    """The kernel's parameters in order: ints, and dpctl memory objects where a USM
    pointer goes (``_POINTERS``). ``tables``: from ``table_args``. ``split``,
    ``spec_slot0``: the kernel's (kernels.abi); with SPLIT_PARTS views "out" (the
    non-spec part's) and "out2" (the spec part's), else out2's parameters repeat out's
    (not read)."""
    x, out, w, b, st = views["x"], views["out"], views["weight"], views["bias"], \
        views["conv_state"]
    out2 = views["out2"] if split == SPLIT_PARTS else out
    values = array_args(x, x.offset, x.strides[0])
    values += array_args(out, out.offset, out.strides[0])
    values += array_args(w, w.offset, *w.strides)
    values += array_args(b, b.offset, b.strides[0])
    values += array_args(st, st.offset, *st.strides)
    values += tables
    values.append(1 if has_bias else 0)
    values.append(1 if silu else 0)
    values += array_args(out2, out2.offset, out2.strides[0])
    values += [int(split), int(spec_slot0)]
    win = views.get("win")
    if win is None:  # no windows: x stands in (never read)
        values += array_args(x, x.offset, 0, 0, 0, 0)
    else:
        values += array_args(win, win.offset, *win.strides)
    return values


def submit_conv(queue, width, dtype_name, views, tables, num_blocks, dim, *, has_bias,
                silu, fast=None, wait=True, after=None, split=SPLIT_NONE, spec_slot0=0,
                fused=None, record=None, chains=False):
    """Pack the conv kernel's arguments (kernels.abi.CONV_ARGS, in order) and submit it
    over (num_blocks, dim / C) work-items on ``queue`` (C channels per work-item: 1, or
    the wide kernel's where ``wide_fits``); wait for it when ``wait``.

    views: "x", "out", "weight", "bias", "conv_state" -> bridge.DeviceView in memory of
    the queue's context, and "out2" with SPLIT_PARTS (``split``: see ``_pack``);
    tables: the plan's ``table_args``; after: as in ``submit_packed``; ``fused``: a fused
    kernel (``fused_kernel``, for these views) and ``record`` its record parameters
    (``sycl.planner.record_on``). Returns (kernel, values, grid): what ``submit_packed``
    needs to submit the same launch again.
    """
    wide = wide_fits(views, dim, dtype_name)
    kernel = fused or get_conv_kernel(width, dtype_name, queue, wide, fast, chains=chains)
    values = _pack(views, tables, has_bias, silu, split, spec_slot0)
    if fused is not None:
        values += record
    # SYCL order (slowest first): the kernel's get_id(0) is the last, fastest dimension.
    grid = (int(num_blocks), int(dim) // WIDE_CHANNELS[dtype_name] if wide else int(dim))
    submit_packed(kernel, queue, values, grid, wait, after)
    return kernel, values, grid


def can_resubmit():
    """Whether packed values with plain addresses (``addresses``) can be submitted: the
    C path takes raw USM pointers; dpctl's Python submit needs memory objects."""
    return _c_submit is not None


def addresses(values, pointers=None):
    """``values`` with each USM memory object replaced by its address (an int);
    ``pointers``: which values are USM pointers (a conv kernel's by default)."""
    pointers = pointers or pointers_of(len(values))
    return [v._pointer if p and v.__class__ is not int else v
            for v, p in zip(values, pointers)]


# Where each argument of CONV_ARGS starts among the packed parameters.
_START = dict(zip((a[0] for a in CONV_ARGS),
                  itertools.accumulate([0] + [5 if a[1] else 1 for a in CONV_ARGS])))


_TABLES_AT = slice(_START["tables"], _START["has_bias"])  # the plan's part


def with_tables(values, tables):
    """A copy of packed ``values`` with the tables parameters of another plan
    (``table_args``): the layer's part stays."""
    values = list(values)
    values[_TABLES_AT] = tables
    pointer = _TABLES_AT.start + _ARRAY_POINTER
    if values[pointer].__class__ is not int:
        values[pointer] = values[pointer]._pointer
    return values


def with_record(values, tables, record):
    """A copy of a fused kernel's packed ``values`` with another device plan's table
    parameters and record parameters (``sycl.planner.record_on``)."""
    return with_tables(values[:CONV_PARAMS], tables) + list(record)


# Where each argument of STAGE_ARGS starts among a stage kernel's packed parameters.
_STAGE_START = dict(zip((a[0] for a in STAGE_ARGS), itertools.accumulate(
    [CONV_PARAMS] + [5 if a[1] else 1 for a in STAGE_ARGS])))


def set_stage_output(values, address, itemsize, dim, part_rows, gates_at, gate_count):
    """Replace the output parameters in a stage kernel's packed ``values`` (with
    addresses) by those of a new stage output at ``address`` (``plan._stage_sizes``'
    layout: each part's rows of ``dim`` elements, the non-spec part's first, the float32
    gates from element ``gates_at``, ``gate_count`` of them). A part without rows keeps
    its stand-in (never written)."""
    ns_rows, sp_rows = part_rows
    for name, rows, first in (("out", ns_rows, 0), ("out2", sp_rows, ns_rows * dim)):
        if rows:
            start = _START[name]
            values[start:start + 7] = _array_params(rows * dim, itemsize,
                                                    address + first * itemsize, 0, dim)
    start = _STAGE_START["gates"]
    spec_gates = values[start + 6] - values[start + 5]  # the spec part's, from the first
    values[start:start + 7] = _array_params(gate_count, 4, address + gates_at * itemsize, 0,
                                            spec_gates)


def set_out(values, address, shape):
    """Replace out's parameters in packed ``values`` (with addresses) by those of a new
    contiguous 2-D array of ``shape`` at ``address`` (same dtype)."""
    for name in ("out", "out2"):  # out2 repeats out without split outputs
        set_array(values, name, address, shape[0] * shape[1], 0, shape[1])


def set_array(values, name, address, nitems, *scalars):
    """Replace the parameters of array argument ``name`` (of CONV_ARGS or STAGE_ARGS) in
    packed ``values`` (with addresses) by those of ``nitems`` elements at ``address``
    (same element size), then ``scalars`` (its offset and strides)."""
    first = _START[name] if name in _START else _STAGE_START[name]
    packed = _array_params(nitems, values[first + 1], address, *scalars)
    values[first:first + len(packed)] = packed


def submit_packed(kernel, queue, values, grid, wait, after=None, local=None, pointers=None):
    """Submit the conv kernel with packed parameters (from ``_pack``: USM memory objects
    or, on the C path, plain addresses where a pointer goes) over ``grid``; ``after``:
    an event of ``submit_planner`` that the kernel must wait for (consumed); ``local``,
    ``pointers``: a stage kernel's work-group shape and pointer layout
    (``submit_stage``)."""
    if device_check.refused_any():  # a device failed its check: launch nothing there
        refused = device_check.refusal(devices.name_of(queue.sycl_device))
        if refused is not None:
            raise refused
    sink = getattr(STATE.recording, "events", None)
    event = _submit(kernel, queue, values, grid, wait, keep_event=sink is not None,
                    after=after, local=local, pointers=pointers)
    if sink is not None:
        sink.append(event)
    STATE.stats["submitted"] += 1


# A stage kernel's parameters after the conv kernel's (``abi.STAGE_ARGS``): which are USM
# pointers.
STAGE_POINTERS = tuple(p for _name, ndim, _e, _l in STAGE_ARGS
                       for p in ([i == _ARRAY_POINTER for i in range(5)] if ndim else (False,)))


STAGE_KERNEL_POINTERS = _POINTERS + STAGE_POINTERS  # a stage kernel's, in all


def submit_stage(queue, width, dtype_name, views, tables, num_blocks, dim, stage, *,
                 has_bias, silu, fast=None, wait=True, after=None, spec_slot0=0,
                 chains=False):
    """The GDN stage's launch (``backends.StageTensors``; views as ``submit_conv``'s with
    split outputs, and "ga", "gb", "alog", "dtb", "gates"): one work-group per head and
    token block, head_k_dim / C work-items (C: the wide kernel's channels where it fits
    and divides both head dims, else 1), the channel range rounded up to whole
    work-groups (the kernel's guard). The kernel passes its own device check before its
    first launch on a device (``device_check.run_stage_known_answer``). Returns (kernel,
    values, grid, local): what ``run_cache`` needs to submit the same launch again."""
    wide = stage_wide(views, dim, dtype_name, stage)
    kernel = get_conv_kernel(width, dtype_name, queue, wide, fast, chains=chains, stage=True)
    values, grid, local = _stage_values(dtype_name, wide, views, tables, num_blocks, dim,
                                        stage, has_bias, silu, spec_slot0)
    submit_packed(kernel, queue, values, grid, wait, after, local=local,
                  pointers=_POINTERS + STAGE_POINTERS)
    return kernel, values, grid, local


def stage_wide(views, dim, dtype_name, stage):
    """Whether a stage launch takes the wide kernel: it fits (``wide_fits``) and its
    channel count divides both head dims."""
    group = WIDE_CHANNELS.get(dtype_name, 1)
    return wide_fits(views, dim, dtype_name) and stage.head_k_dim % group == 0 and \
        stage.head_v_dim % group == 0


def _stage_values(dtype_name, wide, views, tables, num_blocks, dim, stage, has_bias, silu,
                  spec_slot0):
    """A stage launch's (packed parameters, grid, work-group shape) (``submit_stage``)."""
    channels = WIDE_CHANNELS[dtype_name] if wide else 1
    values = _pack(views, tables, has_bias, silu, SPLIT_PARTS, spec_slot0)
    ga, gb, gates = views["ga"], views["gb"], views["gates"]
    rows_ns, rows_sp = stage.part_rows
    divisors = stage_divisors(stage.head_k_dim, stage.head_v_dim, stage.vdim)
    nhv = divisors[0]
    values += array_args(ga, ga.offset, ga.strides[0])
    values += array_args(gb, gb.offset, gb.strides[0])
    values += array_args(views["alog"], views["alog"].offset)
    values += array_args(views["dtb"], views["dtb"].offset)
    values += array_args(gates, gates.offset, gates.offset + 2 * rows_ns * nhv)
    values += [rows_ns, rows_sp, stage.qk, stage.head_k_dim, stage.vdim, stage.head_v_dim,
               *divisors, *stage.l2norm, int(stage.exp_g)]
    lanes = stage.head_k_dim // channels
    grid = (int(num_blocks), -(-(int(dim) // channels) // lanes) * lanes)
    return values, grid, (1, lanes)


def submit_planner(kernel, queue, values, pointers, slots, depend, wait=False):
    """Submit a device plan's planner (``backends/sycl/planner.py``) over ``slots``
    work-items. With ``depend``, returns its event for the conv launch's ``after`` (an
    out-of-order queue does not order the two); else None."""
    if _c_submit is not None:
        return _c_submit(kernel, queue, values, pointers, (slots,), wait, handle=depend)
    args = [v if p else ctypes.c_int64(v) for v, p in zip(values, pointers)]
    event = queue.submit(kernel, args, [slots])
    if wait:
        event.wait()
    return event if depend else None


def _submit(kernel, queue, values, grid, wait, keep_event=False, after=None, local=None,
            pointers=None):
    """``local``: the work-group's shape (an nd-range launch), else None (a range)."""
    pointers = pointers or pointers_of(len(values))
    if _c_submit is not None:
        return _c_submit(kernel, queue, values, pointers, grid, wait, keep_event=keep_event,
                         after=after, local=local)
    args = [v if p else ctypes.c_int64(v) for v, p in zip(values, pointers)]
    ranges = [list(grid)] + ([list(local)] if local is not None else [])
    if after is not None:
        event = queue.submit(kernel, args, *ranges, dEvents=[after])
    else:
        event = queue.submit(kernel, args, *ranges)
    if wait:
        event.wait()
    return event


@contextlib.contextmanager
def recording():
    """Collect the dpctl.SyclEvent of every conv kernel this thread submits inside the
    block (the benchmark reads kernel times from them on a profiling queue)."""
    events = STATE.recording.events = []
    try:
        yield events
    finally:
        STATE.recording.events = None


class _CSubmit:
    """Submit through dpctl's C interface (libDPCTLSyclInterface: DPCTLQueue_SubmitRange),
    the same call dpctl's Python ``SyclQueue.submit`` makes, without its per-argument
    Python type dispatch (~65 us for this kernel's 52 arguments on opencl:cpu). The
    interface takes an array of void*: for an int64 argument the address of its value,
    for a USM pointer argument the pointer itself. The arrays are per thread and reused,
    so a call writes only the values and the pointers."""

    INT64, VOID_PTR = 6, 10  # DPCTLKernelArgType in dpctl 0.17 - 0.22 (same prefix)

    def __init__(self, lib):
        self.submit = lib.DPCTLQueue_SubmitRange
        self.submit.restype = ctypes.c_void_p
        self.submit.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                                ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t)
        # the same with a work-group shape (global range, local range, dimensions)
        self.submit_nd = lib.DPCTLQueue_SubmitNDRange
        self.submit_nd.restype = ctypes.c_void_p
        self.submit_nd.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                   ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                                   ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                                   ctypes.c_size_t)
        self.wait, self.delete = lib.DPCTLEvent_Wait, lib.DPCTLEvent_Delete
        for f in (self.wait, self.delete):
            f.restype, f.argtypes = None, (ctypes.c_void_p,)
        self.local = threading.local()

    def _slots(self, pointers):
        """This thread's argument arrays for one pointer layout: the values (int64), the
        void* array (the addresses of the scalar values are constant: set once; the USM
        pointers are written per call), the argument types and the range."""
        slots = getattr(self.local, "slots", None)
        if slots is None:
            slots = self.local.slots = {}
        found = slots.get(pointers)
        if found is None:
            n = len(pointers)
            values, args = (ctypes.c_int64 * n)(), (ctypes.c_void_p * n)()
            base = ctypes.addressof(values)
            for i, p in enumerate(pointers):
                args[i] = None if p else base + 8 * i
            types = (ctypes.c_int * n)(*[self.VOID_PTR if p else self.INT64 for p in pointers])
            where = tuple(i for i, p in enumerate(pointers) if p)
            found = slots[pointers] = (values, args, types, (ctypes.c_size_t * 3)(),
                                       struct.Struct(f"{n}q"), where)
        return found

    def __call__(self, kernel, queue, values, pointers, grid, wait, keep_event=False,
                 handle=False, after=None, local=None):
        """Submit; returns a dpctl.SyclEvent with ``keep_event``, the raw event handle
        with ``handle`` (for a later call's ``after``, which deletes it), else None.
        ``local``: the work-group's shape (an nd-range launch; rare: its range array is
        made per call), else None."""
        buf, args, types, rng, layout, where = self._slots(pointers)
        for i in where:
            if values[i].__class__ is not int:  # memory objects: their addresses
                values = addresses(values, pointers)
                break
        for i in where:
            args[i] = values[i]
        layout.pack_into(buf, 0, *values)  # pointer slots of buf are not read
        rng[:len(grid)] = grid
        deps, n_deps = None, 0
        if after is not None:
            deps, n_deps = (ctypes.c_void_p * 1)(after), 1
        if local is None:
            event = self.submit(kernel.addressof_ref(), queue.addressof_ref(), args, types,
                                len(pointers), rng, len(grid), deps, n_deps)
        else:
            event = self.submit_nd(kernel.addressof_ref(), queue.addressof_ref(), args,
                                   types, len(pointers), rng,
                                   (ctypes.c_size_t * 3)(*local), len(grid), deps, n_deps)
        if after is not None:
            self.delete(after)
        if not event:
            raise RuntimeError("jitconv: the SYCL runtime refused the kernel submission "
                               "(DPCTLQueue_SubmitRange returned no event; see stderr)")
        if wait:
            self.wait(event)
        if handle:
            return event
        kept = None
        if keep_event:  # dpctl copies the event out of a "SyclEventRef" capsule
            import dpctl
            kept = dpctl.SyclEvent(devices.capsule(event, b"SyclEventRef"))
        self.delete(event)  # the handle only: the work is not cancelled
        return kept


def _load_c_submit():
    """The C submit path if dpctl's interface library is there, else None: dpctl's Python
    submit is used (a test or benchmark sets ``_c_submit = None`` for that path too)."""
    try:
        import dpctl
    except ImportError:  # a CUDA-only install: nothing is submitted through SYCL
        return None
    for path in sorted(Path(dpctl.__file__).parent.glob("libDPCTLSyclInterface.so*")):
        try:
            return _CSubmit(ctypes.CDLL(str(path)))
        except (OSError, AttributeError):
            continue
    return None


_c_submit = _load_c_submit()
