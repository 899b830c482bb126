"""The SYCL backend: a run's tensors as USM views on the queue the call runs on (torch
XPU's current stream, a dpctl/dpnp array's own queue, or the current device's), one
submit of the conv kernel (for a device plan, the fused kernel that computes its block
records from the metadata itself, or where none can be had its planner's submit first:
``sycl.planner``), and the launch remembered for the next run with the same tensors
(``run_cache``).

When a run waits: right after the submit it returns when the kernel's results are only
read by later work on the same in-order queue (torch XPU tensors on torch's current stream,
or dpctl/dpnp arrays on an in-order queue). It waits for the kernel when host code may read
the results next: torch CPU tensors (USM shared memory from ``jitconv.empty``, or plain
tensors that were copied and must be copied back), or an out-of-order queue (dpctl's
default), where later work is not ordered after the kernel.
"""

import dataclasses

import torch

from jitconv.backends import devices as current
from jitconv.backends.sycl import bridge, devices, launching, planner, run_cache, tables, usm
from jitconv.backends.sycl.state import STATE
from jitconv.kernels.abi import SPLIT_NONE, SPLIT_PARTS, fast_silu
from jitconv.memory.arrays import UsmArray, is_device_array


def _stage_tensors(stage):
    """The stage's tensors as ``launch``'s (name, tensor, writable, written) entries."""
    if stage is None:
        return ()
    return (("ga", stage.a, False, None), ("gb", stage.b, False, None),
            ("alog", stage.A_log, False, None), ("dtb", stage.dt_bias, False, None),
            ("gates", stage.gates, True, None))


class SyclBackend:
    name = "sycl"
    state = STATE  # everything the backend keeps between calls (``sycl.state``)

    def clear(self):
        """Forget every cache and counter of the backend (``SyclState.clear``)."""
        self.state.clear()

    def forget_runs(self):
        """Drop every remembered launch (the next run of each is checked and packed)."""
        self.state.runs.clear()

    def devices(self):
        return [d.filter_string for d in devices.sycl_devices()]

    def takes(self, x):
        """A torch XPU or CPU tensor, or an array in USM memory (dpctl, dpnp, a
        ``__sycl_usm_array_interface__`` or kDLOneAPI DLPack producer)."""
        if isinstance(x, torch.Tensor):
            return x.is_xpu or x.is_cpu
        return isinstance(x, UsmArray) or is_device_array(x)

    @staticmethod
    def _queue(plan, x):
        return plan.queue or current.queue_for(x)

    def remembered(self, plan, args, activation, math, split=SPLIT_NONE):
        if split == SPLIT_PARTS or not launching.can_resubmit():
            return None, None
        x, weight, bias, conv_state, out = args
        key = run_cache.key(x, weight, bias, conv_state, out, activation, math,
                            self._queue(plan, x), split, launch_kind(plan))
        return self._kept(plan, key, lambda entry: entry.run(plan, x, out))

    @staticmethod
    def _kept(plan, key, run):
        """(``run(entry)``'s output, key) for the launch kept under ``key``, or (None,
        key) when none is kept or it cannot run (key None: never to be kept)."""
        if key is None:
            return None, None
        entry = run_cache.find(key, plan)
        if entry is not None:  # these tensors passed the checks of this geometry
            result = run(entry)
            if result is not None:
                return result, key
        return None, key

    def launch(self, plan, launch):
        x, weight, bias, conv_state = launch.x, launch.weight, launch.bias, launch.conv_state
        out, target = launch.out, launch.target
        queue = self._queue(plan, x)
        views, write_backs = {}, []
        for name, t, writable, written in (
                ("x", x, False, None), ("out", target, True, None),
                ("weight", weight, False, None),
                ("conv_state", conv_state, True, plan.written_lines),
                ("out2", launch.out2, True, None),
                ("win", launch.windows, True,
                 None if launch.windows is None or plan.window_rows is None
                 else plan.window_rows.tolist())) + _stage_tensors(launch.stage):
            if t is None:  # a split part without tokens: x stands in (see Launch)
                continue
            views[name], wb = bridge.to_device(t, name, writable, queue, written)
            if wb is not None:
                write_backs.append(wb)
        if launch.split == SPLIT_PARTS:
            views.setdefault("out", views["x"])
            views.setdefault("out2", views["x"])
        if len(views["weight"].shape) == 3:  # (dim, 1, width): drop the unit axis
            w = views["weight"]
            views["weight"] = dataclasses.replace(w, shape=(w.shape[0], w.shape[2]),
                                                  strides=(w.strides[0], w.strides[2]))
        if bias is not None:
            views["bias"], _ = bridge.to_device(bias, "bias", False, queue)
        else:
            # The kernel does not read bias then, but the argument must be a valid array.
            views["bias"] = dataclasses.replace(views["weight"], shape=(1,), strides=(1,))
        host_reads = write_backs or any(isinstance(t, torch.Tensor) and t.device.type == "cpu"
                                        for t in (x, target, conv_state, launch.out2,
                                                  launch.windows))
        wait = bool(host_reads) or not queue.is_in_order
        if not wait:
            tables.mark_unwaited(plan)
        dim = int(views["x"].shape[1])
        fast = fast_silu(launch.dtype, launch.math)
        fused = record = None
        # one submit where a fused kernel can be had (not with rules: the rule planner
        # amends the planner's table; not for the stage, whose kernel reads that table)
        if plan.on_device and not plan.rules and launch.stage is None and \
                plan.maps is None:
            fused = launching.fused_kernel(plan.geometry.width, launch.dtype, queue,
                                           launching.wide_fits(views, dim, launch.dtype),
                                           fast, plan.element_types)
        if fused is not None:
            table_args, record, copies = planner.record_on(plan, queue)
            after, wait = None, wait or copies  # copied metadata lives until the wait
        else:
            table_args, after = tables.for_run(
                plan, queue, views.get("win"),
                None if launch.stage is None else launch.stage.l2norm)
        if launch.stage is not None:
            kernel, values, grid, local = launching.submit_stage(
                queue, plan.geometry.width, launch.dtype, views, table_args,
                plan.num_blocks, dim, launch.stage, has_bias=bias is not None,
                silu=launch.silu, fast=fast, wait=wait, after=after,
                spec_slot0=launch.spec_slot0, chains=plan.has_chains)
            for wb in write_backs:
                wb()
            self._remember_stage(plan, launch, views, kernel, queue, values, grid, local,
                                 wait)
            return
        kernel, values, grid = launching.submit_conv(
            queue, plan.geometry.width, launch.dtype, views, table_args, plan.num_blocks,
            dim, has_bias=bias is not None, silu=launch.silu, fast=fast, wait=wait,
            after=after, split=launch.split, spec_slot0=launch.spec_slot0, fused=fused,
            record=record, chains=plan.has_chains)
        for wb in write_backs:
            wb()
        # Only zero-copy launches are remembered: a copy is new memory on every run.
        if launch.key is not None and launch.zero_copy and \
                not any(bridge.is_copy(v) for v in views.values()):
            run_cache.remember(launch.key, (x, weight, bias, conv_state, out), views,
                               launch.extents, plan, kernel, queue, values, grid[1], wait,
                               launch.dtype)

    @staticmethod
    def _remember_stage(plan, launch, views, kernel, queue, values, grid, local, wait):
        """Keep a zero-copy stage launch for the next run with the same tensors (each
        run a new output: ``run_cache._StageEntry``)."""
        if launch.key is None or not launch.zero_copy or \
                any(bridge.is_copy(v) for v in views.values()):
            return
        stage, buffer = launch.stage, launch.stage.buffer
        tensors = (launch.x, launch.weight, launch.bias, launch.conv_state, stage.a,
                   stage.b, stage.A_log, stage.dt_bias)
        gates_at = (stage.gates.data_ptr() - buffer.data_ptr()) // buffer.element_size()
        run_cache.remember_stage(
            launch.key, tensors, views, launch.extents, plan, kernel, queue, values, grid,
            local, wait, dict(x_like=launch.dtype, total=buffer.shape[0],
                              itemsize=buffer.element_size(), dim=int(views["x"].shape[1]),
                              part_rows=stage.part_rows, gates_at=gates_at,
                              gate_count=stage.gates.shape[0], l2norm=stage.l2norm,
                              spec_slot0=launch.spec_slot0,
                              # a wide kernel's C-element words, the float32 gates
                              align=16))

    def normalize(self, t, name):
        """A non-torch array (dpctl, dpnp, a USM-interface or kDLOneAPI DLPack producer)
        as a ``memory.arrays.UsmArray``, zero-copy."""
        return bridge.normalize(t, name)

    def host_array(self, t, name):
        """A non-torch device array's values, copied into a numpy array."""
        return bridge.host_array(t, name)

    def channels_contiguous(self, t, name):
        return bridge.channels_contiguous(t, name)

    def empty_output(self, x, shape, dtype):
        return bridge.empty_like_output(x, shape, dtype)

    def remembered_stage(self, plan, args, stage_args, activation, math):
        if not launching.can_resubmit():
            return None, None
        x, weight, bias, conv_state, _ = args
        key = run_cache.stage_key(x, weight, bias, conv_state, activation, math,
                                  self._queue(plan, x), stage_args, launch_kind(plan))
        return self._kept(plan, key,
                          lambda entry: entry.run(plan, x, stage_args[0], stage_args[1]))

    def stage_refusal(self, head_k_dim, head_v_dim):
        # one work-group per head: at most 256 work-items (every SYCL GPU's limit is
        # higher), one channel each at worst
        if head_k_dim > 256:
            return f"head_k_dim: at most 256 on SYCL devices, got {head_k_dim}"
        return None

    def as_floats(self, t):
        return t.to(torch.float32).contiguous()

    def empty(self, shape, dtype, device):
        return usm.empty(shape, dtype, device)

    def read_errors(self, plan):
        return planner.read_errors(plan)

    def new_error_words(self, device):
        return planner.new_error_words(device)

    def read_error_words(self, words):
        return planner.read_error_words(words)


BACKEND = SyclBackend()


def launch_kind(plan):
    """What of a plan a remembered launch's kernel and parameters depend on besides the
    geometry (``run_cache``'s keys): a device plan's metadata element types and token
    maps (whether a fused kernel plans its own blocks), and the rule pieces (the kernel
    with the chain piece)."""
    return (plan.element_types if plan.on_device else None, plan.maps is not None,
            plan.has_chains)
