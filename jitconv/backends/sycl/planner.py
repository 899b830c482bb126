"""The device planner (``jitconv.kernels.planner``) on SYCL devices: compiled by numba-dpex
to SPIR-V (kept by ``kernel_cache`` like the conv kernels, and shipped for the usual
metadata types: ``kernel_cache.planner_specializations``), submitted over one work-item
per block slot before the conv launch of a device plan that has no fused kernel.

A device plan's run is one submit where a fused conv kernel can be had
(``launching.fused_kernel``: shipped for ``kernel_cache.FUSED_WIDTHS``, else compiled by
numba-dpex): that kernel computes its block's record itself (``planner.slot_record``)
from the metadata, and ``record_on`` gives its record parameters. Otherwise the planner
writes the records into the plan's table first (``plan_on``); both give the same results.

What a device plan keeps per SYCL queue (``_Tables``): the block-record table the
planner writes and the conv kernel reads (USM device memory; one per queue, since runs
on one in-order queue are ordered and on two they would race for one table) and the
error words (``planner.ERRORS``) that ``read_errors`` reports (or, for plans the one-shot
ops keep, the device's words: ``new_error_words``, ``read_error_words``). The metadata reach the
kernels as USM views (``bridge.to_device``): torch XPU tensors and USM CPU tensors
(``jitconv.empty``) zero-copy, so the packed parameters are kept; other CPU tensors are
copied at every run (that copy is the read of their current values), and the run waits
for its kernel.
"""

import types as pytypes
import weakref

import numpy as np
import torch

from jitconv.backends.sycl import devices, kernel_cache, launching
from jitconv.kernels import planner
from jitconv.kernels.abi import TABLES
from jitconv.backends.sycl import bridge, usm
from jitconv.backends.sycl.state import STATE

# The two planner kernels: "planner" (``planner.plan_slot``, one work-item per block
# slot) and "rules" (``planner.plan_rules``, one work-item per sequence, for plans with
# state rules): (kernel source, argument list, array arguments).
_SOURCES = {
    "planner": ("""
def jitconv_planner(item, {args}):
    plan_slot(item.get_id(0), {call})
""", planner.PLAN_ARGS, planner.METADATA_ARRAYS),
    "rules": ("""
def jitconv_rules(item, {args}):
    plan_rules(item.get_id(0), {call})
""", planner.RULE_ARGS, planner.RULE_ARRAYS),
}
_ARRAYS = planner.METADATA_ARRAYS + ("tables", "errors")


def make_planner_kernel(kind="planner"):
    """The planner of ``kind`` (``_SOURCES``) in a numba-dpex kernel (the range is the
    plan's capacity, or its sequences, exactly)."""
    import numba_dpex as dpex
    from jitconv.backends.sycl.kernels import planner_functions
    namespace = dict(planner_functions())
    if kind == "rules":  # (a device function of its own: planner_functions' are the first's)
        fn = planner.plan_rules
        namespace["plan_rules"] = dpex.device_func(pytypes.FunctionType(
            fn.__code__, namespace, fn.__name__, fn.__defaults__))
    template, args, _arrays = _SOURCES[kind]
    source = template.format(args=", ".join(args), call=", ".join(args[:-1]))
    exec(compile(source, f"<jitconv sycl {kind}>", "exec"), namespace)
    return dpex.kernel(namespace[f"jitconv_{kind}"])


def _signature(element_types, queue, kind):
    from numba import types as nt
    from numba_dpex.core.types.kernel_api.index_space_ids import ItemType
    _template, args, arrays = _SOURCES[kind]
    return nt.void(ItemType(1), *launching.planner_types(args, element_types, queue,
                                                         arrays))


def compile_spirv(element_types, queue, kind="planner"):
    """(SPIR-V bytes, kernel name) of the planner of ``kind`` for these element types."""
    from numba.core.target_extension import target_override
    queue = devices.compile_queue(queue)
    launching.prepare_numba_dpex(queue)
    with target_override("dpex"):
        result = make_planner_kernel(kind).get_compile_result(
            _signature(element_types, queue, kind))
    STATE.planner_stats["compiled"] += 1
    module = result.kernel_device_ir_module
    return module.kernel_bitcode, module.kernel_name


def compile_and_store(element_types, queue, directory=None, kind="planner"):
    """Compile, build and store one planner (``build-kernels``). Returns (kernel, path)."""
    spirv, name = compile_spirv(element_types, queue, kind)
    kernel = launching.program(queue, spirv, name)
    return kernel, kernel_cache.store_planner(element_types, spirv, name, directory, kind)


def get_planner(element_types, queue, kind="planner"):
    """The built planner of ``kind`` for the queue's device and context: from this
    process's table, the disk cache (user cache, then shipped), or a numba-dpex
    compile, in that order."""
    key = (devices.name_of(queue.sycl_device), queue.sycl_context, element_types, kind)
    kernel = STATE.planners.get(key)
    if kernel is None:
        with STATE.planners_lock:
            kernel = STATE.planners.get(key)
            if kernel is None:
                kernel = STATE.planners[key] = _build(element_types, queue, kind)
    return kernel


def _build(element_types, queue, kind):
    entry = kernel_cache.load_planner(element_types, kind)
    if entry is not None:
        spirv, name, _path = entry
        STATE.planner_stats["built"] += 1
        return launching.program(queue, spirv, name)
    if not launching.have_compiler():
        shipped = [", ".join(t) for t in kernel_cache.planner_specializations(kind)]
        what = "planner for metadata" if kind == "planner" else "rule planner for rules"
        raise launching.KernelUnavailableError(
            f"device plan: no {what} of element types {element_types} "
            f"({', '.join(_SOURCES[kind][2])}) and numba-dpex is not installed to "
            f"compile one; the package ships those for: {'; '.join(shipped)} (pass "
            f"the metadata as one index dtype, flags as bool or that dtype)")
    spirv, name = compile_spirv(element_types, queue, kind)
    kernel = launching.program(queue, spirv, name)
    try:
        kernel_cache.store_planner(element_types, spirv, name, kind=kind)
    except OSError:  # an unwritable cache: compiled in this process only
        pass
    return kernel


class _Tables:
    """A device plan's memory on one queue: the record table (what the conv kernel's
    ``tables`` argument is; a fused kernel never reads it) and the error words; the
    planner's packed launch and the fused kernel's record parameters once the metadata
    views are known to be zero-copy."""

    def __init__(self, plan, queue):
        import dpctl.memory as dpm
        words, offsets = plan.table_layout()
        self.memory = dpm.MemoryUSMDevice(4 * words, queue=queue)
        self.views = {
            "tables": bridge.DeviceView(memory=self.memory, offset=0, shape=(words,),
                                        strides=(1,), itemsize=4, owner=self.memory)}
        if plan.error_words is None:  # the plan's own words
            self.errors = dpm.MemoryUSMDevice(4 * len(planner.ERRORS), queue=queue)
            self.errors.memset()
            self.views["errors"] = bridge.DeviceView(
                memory=self.errors, offset=0, shape=(len(planner.ERRORS),), strides=(1,),
                itemsize=4, owner=self.errors)
        else:  # the device's words (``new_error_words``: USM memory, never a copy)
            self.errors = None
            self.views["errors"], _ = bridge.to_device(plan.error_words, "errors", True,
                                                       queue)
            if bridge.is_copy(self.views["errors"]):
                raise RuntimeError("device plan: its error words are not device memory "
                                   "of this queue")
        self.offsets = offsets
        self.table_args = launching.table_args(self.views["tables"],
                                               dict(zip(TABLES, offsets)))
        self.queue = queue
        # (kernel, packed values) by the run's l2norm rows (``plan_on``), kept when every
        # view is zero-copy
        self.launch = {}
        self.record = None  # the fused kernel's record parameters, kept likewise
        # the rule planner's (kernel, packed values) by the windows' (rows, steps), kept
        # likewise
        self.rules = {}


def _release(where):
    """Finalizer of a plan: its kernels may still be queued (runs do not always wait)."""
    where.queue.wait()


def _tables_of(plan, queue):
    per_queue = STATE.plan_records.get(plan)
    if per_queue is None:
        with STATE.tables_lock:
            per_queue = STATE.plan_records.setdefault(plan, {})
    found = per_queue.get(queue)
    if found is None:
        with STATE.tables_lock:
            found = per_queue.get(queue)
            if found is None:
                found = per_queue[queue] = _Tables(plan, queue)
                weakref.finalize(plan, _release, found)
    return found


def _metadata(plan, queue):
    """(the metadata's USM views by ``planner.METADATA_ARRAYS`` name, their element
    strides, whether every view is zero-copy). A copy lives as long as its view."""
    views, strides, zero_copy = {}, {}, True
    for name in planner.METADATA_ARRAYS:
        t, _stride = plan.kernel_arrays[name]
        if t.dtype == torch.bool:
            t = t.view(torch.uint8)
        view, _ = bridge.to_device(t, plan.names[name], False, queue)
        zero_copy = zero_copy and not bridge.is_copy(view)
        views[name] = view
        strides[name] = view.strides[0] if name in plan.arrays else 0
    return views, strides, zero_copy


def _packed(plan, queue, where, l2norm):
    """(planner kernel, packed values, whether every metadata view is zero-copy; the
    values hold the views' memory, copies included, until they are dropped)."""
    views, strides, zero_copy = _metadata(plan, queue)
    values = launching.metadata_params(planner.PLAN_ARGS, {**views, **where.views}, strides,
                                       plan.scalars_for(l2norm))
    return get_planner(plan.element_types, queue), values, zero_copy


def record_on(plan, queue):
    """What a fused conv kernel (``launching.fused_kernel``) of ``plan`` takes on
    ``queue``: (the plan's table parameters, valid memory the kernel never reads; its
    record parameters, ``planner.RECORD_ARGS``; whether those hold copies of the
    metadata, which the kernel must then be waited for)."""
    where = _tables_of(plan, queue)
    if where.record is not None:
        return where.table_args, where.record, False
    views, strides, zero_copy = _metadata(plan, queue)
    values = launching.record_params({**views, "errors": where.views["errors"]}, strides,
                                     plan.planner_scalars)
    if zero_copy and launching.can_resubmit():
        where.record = launching.addresses(values, launching.RECORD_POINTERS)
        return where.table_args, where.record, False
    return where.table_args, values, not zero_copy


# Which packed parameters of the planner are USM pointers (an array's third of five).
_POINTERS = launching.pointer_layout(planner.PLAN_ARGS, _ARRAYS)


def plan_on(plan, queue, windows=None, l2norm=None):
    """Submit ``plan``'s planner on ``queue`` (not waited for), and with state rules its
    rule planner after it, for a run with ``windows`` (the intermediate windows' view,
    or None) and, for a GDN stage run, its first normalised rows ``l2norm`` (which the
    planner checks). Returns (the conv kernel's packed tables parameters, the last
    planner's event to make the conv launch wait for: None on an in-order queue, which
    orders them already)."""
    where = _tables_of(plan, queue)
    depend = not queue.is_in_order
    # an out-of-order queue does not order the rule planner after this one: wait
    wait = bool(plan.rules) and depend
    kept = where.launch.get(l2norm)
    if kept is not None:
        kernel, values = kept
        event = launching.submit_planner(kernel, queue, values, _POINTERS, plan.num_blocks,
                                         depend and not wait, wait=wait)
    else:
        kernel, values, zero_copy = _packed(plan, queue, where, l2norm)
        if not zero_copy:  # copies of the metadata: freed with ``values``, so wait
            launching.submit_planner(kernel, queue, values, _POINTERS, plan.num_blocks,
                                     False, wait=True)
            event = None
        else:
            if launching.can_resubmit():
                where.launch[l2norm] = (kernel, launching.addresses(values, _POINTERS))
            event = launching.submit_planner(kernel, queue, values, _POINTERS,
                                             plan.num_blocks, depend and not wait,
                                             wait=wait)
    if plan.rules:
        event = _plan_rules_on(plan, queue, where, windows)
    return where.table_args, event


_RULE_POINTERS = launching.pointer_layout(planner.RULE_ARGS,
                                          planner.RULE_ARRAYS + ("tables", "errors"))


def _plan_rules_on(plan, queue, where, windows):
    """Submit the rule planner of ``plan`` (``planner.plan_rules``) over its sequences,
    amending the table the planner wrote. Returns its event (out-of-order queues)."""
    shape = None if windows is None else windows.shape
    count = plan.num_ns + plan.num_sp
    depend = not queue.is_in_order
    kept = where.rules.get(shape and shape[:2])
    if kept is not None:
        kernel, values = kept
        return launching.submit_planner(kernel, queue, values, _RULE_POINTERS, count,
                                        depend)
    views, strides, zero_copy = {}, {}, True
    scalars = plan.rule_values(shape)
    for name in planner.RULE_ARRAYS:
        t, _stride, _cstride = plan.rule_arrays[name]
        view, _ = bridge.to_device(t, plan.names.get(name, name), False, queue)
        zero_copy = zero_copy and not bridge.is_copy(view)
        views[name] = view
        given = name in plan.rules
        strides[name] = view.strides[0] if given else 0
        if name.endswith("parents"):
            scalars[name + "_cstride"] = view.strides[1] if given else 0
    views.update(tables=where.views["tables"], errors=where.views["errors"])
    scalars.update(blocks=where.offsets[1], links=where.offsets[2])
    values = launching.metadata_params(planner.RULE_ARGS, views, strides, scalars)
    kernel = get_planner(plan.rule_types, queue, "rules")
    if not zero_copy:  # copies: freed with ``values``, so wait
        launching.submit_planner(kernel, queue, values, _RULE_POINTERS, count, False,
                                 wait=True)
        return None
    if launching.can_resubmit():
        where.rules[shape and shape[:2]] = (kernel,
                                            launching.addresses(values, _RULE_POINTERS))
    return launching.submit_planner(kernel, queue, values, _RULE_POINTERS, count, depend)


def read_errors(plan):
    """The error words the planner set on every queue ``plan`` ran on (each word: how
    many queues set it), cleared; waits for those queues."""
    if plan.error_words is not None:
        return read_error_words(plan.error_words)
    found = [0] * len(planner.ERRORS)
    for where in list(STATE.plan_records.get(plan, {}).values()):
        where.queue.wait()
        words = np.frombuffer(where.errors.copy_to_host(), dtype=np.int32)
        if words.any():
            where.errors.memset()
        for i, v in enumerate(words):
            found[i] += int(v != 0)
    return found


def new_error_words(device):
    """Zeroed error words for device plans whose metadata is on ``device``: a torch XPU
    tensor there, or for CPU tensors USM memory of the current SYCL device."""
    if device.type == "cpu":
        return usm.zeros((len(planner.ERRORS),), torch.int32)
    return torch.zeros(len(planner.ERRORS), dtype=torch.int32, device=device)


def read_error_words(words):
    """Error words shared by device plans (``new_error_words``), cleared when any is set;
    waits for the queues of every plan that writes them (XPU: the whole device)."""
    if words.device.type == "xpu":
        torch.xpu.synchronize(words.device)
    with STATE.tables_lock:
        queues = {where.queue for plan, per_queue in list(STATE.plan_records.items())
                  if plan.error_words is words for where in per_queue.values()}
    for queue in queues:
        queue.wait()
    found = words.tolist()
    if any(found):
        for i, value in enumerate(found):
            if value:  # only the words reported: a word set meanwhile is not lost
                words[i] = 0
        if words.device.type == "xpu":
            torch.xpu.synchronize(words.device)
    return found
