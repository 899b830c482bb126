"""Step plans: an engine step's metadata validated and turned into kernel tables ONCE,
then run on every layer.

Every GDN / Mamba layer of one engine step uses the same metadata (query_start_loc, cache
lines, token maps, accepted counts); only x, weight, bias and conv_state change per layer.
``jitconv.plan(...)`` checks the metadata against the step's geometry (rows of x, cache
lines, state_len, width), builds the tables (token rows, block records) and copies them into
USM memory that the plan owns. ``StepPlan.run(x, weight, bias, conv_state)`` then checks
only what can differ per layer (shapes, dtypes, strides, devices against the plan) and
submits one kernel. The one-shot ops (``causal_conv1d_fn`` / ``_update`` / ``_mixed``) are
a plan and one run.

A plan is never written after it is built, so any number of threads may run it (or run
different plans) at once: there is no lock and no shared mutable buffer.

When ``run`` waits: it returns right after the submit when the kernel's results are only
read by later work on the same in-order queue (torch XPU tensors on torch's current stream,
or dpctl/dpnp arrays on an in-order queue). It waits for the kernel when host code may read
the results next: torch CPU tensors (USM shared memory from ``jitconv.empty``, or plain
tensors that were copied and must be copied back), or an out-of-order queue (dpctl's
default), where later work is not ordered after the kernel.
"""

import weakref

import numpy as np
import torch

from . import bridge, cuda_backend, launching, run_cache, usm, validation
from . import device as devices
from .batch import build_batch
from .kernel_abi import TABLES


def _release(memory, queue, state):
    """Finalizer: a kernel that was not waited for may still read the tables."""
    if state["unwaited"]:
        queue.wait()
    del memory


class StepPlan:
    """One engine step, ready to run on every layer (build it with ``jitconv.plan``)."""

    def __init__(self, parts, geometry, *, queue=None, row_names="token_indx",
                 line_names="state_indices"):
        geo = self.geometry = geometry
        all_rows = np.concatenate([p.rows for p in parts] + [np.zeros(0, np.int64)])
        validation.check_unique(all_rows, row_names, "row", geo.num_tokens)
        all_lines = np.concatenate([p.lines for p in parts] + [np.zeros(0, np.int64)])
        self.lines = all_lines[all_lines >= 0]  # the cache lines a run writes
        validation.check_unique(self.lines, line_names, "cache line", geo.num_lines)
        self._written = self.lines.tolist()  # the lines a copy-back of conv_state writes
        batch = build_batch(parts, geo.num_tokens)
        self.num_blocks = batch.num_blocks
        # tokens of the longest block (a backend may pick its code by it)
        self.longest_block = int(batch.blk_len.max(initial=0))
        self.longest_sequences = batch.longest_sequences()  # (non-spec, spec)
        self.queue = queue  # None: chosen per run (torch's stream, or the current device)
        self._tables = {}   # queue's context (and queue) -> packed table parameters
        self._host_tables = batch.tables()
        self._state = {"unwaited": False}
        # what run_cache compares: the geometry a run's tensors were checked against
        self.fit = (geo.num_tokens, geo.num_lines, geo.state_len, geo.width)

    # ---------------------------------------------------------------- per layer

    def run(self, x, weight, bias, conv_state, out=None, activation="silu"):
        """The conv of one layer: returns out (new, or the given ``out``, which may alias
        x). conv_state is updated in place. Checks the tensors against the plan before
        launching anything."""
        return self.run_checked((x, weight, bias, conv_state, out), activation)

    def run_checked(self, args, activation, checked=None):
        """``run`` on ``args`` (x, weight, bias, conv_state, out). ``checked``: (normalized
        tensors, dtype name) when the caller has already checked them against this
        plan's geometry (the one-shot ops do), so a run that is not remembered does not
        check them twice."""
        x, weight, bias, conv_state, out = args
        key = None
        if launching.can_resubmit() and not _on_cuda(x):
            key = run_cache.key(x, weight, bias, conv_state, out, activation,
                                self.queue or devices.queue_for(x))
        if key is not None:
            entry = run_cache.find(key, self)
            if entry is not None:  # these tensors passed the checks of this geometry
                result = entry.run(self, x, out)
                if result is not None:
                    return result
        silu = validation.check_activation(activation)
        if checked is None:
            tensors = bridge.normalize_all(x, weight, bias, conv_state, out)
            _dim, width, dtype = validation.check_tensors(*tensors)
            validation.check_fits_plan(self.geometry, tensors[0], tensors[3], width)
        else:
            tensors, dtype = checked
        return self._launch(tensors, silu, dtype, key=key)

    def _launch(self, tensors, silu, dtype, key=None):
        """Launch on checked tensors (``run_checked`` checked them). With a ``key`` a
        zero-copy launch is remembered for the next run with the same key."""
        x, weight, bias, conv_state, out = tensors
        validation.check_writable(x, weight, bias, conv_state, out)
        extents = validation.check_aliasing(x, weight, bias, conv_state, out, self.lines)
        dim = validation.shape_of(x)[1]
        # The kernel needs channels contiguous in x and out (see kernel_abi). out may also
        # alias x, and the kernel reads neighbouring rows of x: then compute into a
        # separate buffer and copy (both rare; correctness over a saved copy).
        x_given, x = x, bridge.channels_contiguous(x)
        x_extent = extents["x"] if x is x_given else bridge.byte_extent(x)
        target = out
        if out is None or bridge.extents_meet(extents["out"], x_extent) or \
                not bridge.has_unit_channel_stride(out):
            if out is not None and not bridge.can_assign(out):
                raise ValueError(f"out: a {type(out.source).__name__} that overlaps x or "
                                 f"has strided channels cannot be written through a copy; "
                                 f"pass out=None or a separate array with contiguous "
                                 f"channels")
            target = bridge.empty_like_output(x, validation.shape_of(x), dtype)
        if dim == 0 or self.num_blocks == 0:
            return _finish(out, target)
        if cuda_backend.wants(x):  # torch CUDA tensors: numba-cuda, torch's stream
            cuda_backend.launch(self, x, weight, bias, conv_state, target, silu, dtype)
            return _finish(out, target)

        queue = self.queue or devices.queue_for(x)
        views, write_backs = {}, []
        for name, t, writable, written in (
                ("x", x, False, None), ("out", target, True, None),
                ("weight", weight, False, None),
                ("conv_state", conv_state, True, self._written)):
            views[name], wb = bridge.to_device(t, name, writable, queue, written)
            if wb is not None:
                write_backs.append(wb)
        if len(views["weight"].shape) == 3:  # (dim, 1, width): drop the unit axis
            w = views["weight"]
            views["weight"] = w._replace(shape=(w.shape[0], w.shape[2]),
                                         strides=(w.strides[0], w.strides[2]))
        if bias is not None:
            views["bias"], _ = bridge.to_device(bias, "bias", False, queue)
        else:
            # The kernel does not read bias then, but the argument must be a valid array.
            views["bias"] = views["weight"]._replace(shape=(1,), strides=(1,))
        host_reads = write_backs or any(isinstance(t, torch.Tensor) and t.device.type == "cpu"
                                        for t in (x, target, conv_state))
        wait = bool(host_reads) or not queue.is_in_order
        if not wait:
            self.mark_unwaited()
        kernel, values, grid = launching.submit_conv(
            queue, self.geometry.width, dtype, views, self.tables_on(queue),
            self.num_blocks, dim, has_bias=bias is not None, silu=silu, wait=wait)
        for wb in write_backs:
            wb()
        # Only zero-copy launches are remembered: a copy is new memory on every run.
        if key is not None and x is x_given and (target is out or out is None) and \
                not any(bridge.is_copy(v) for v in views.values()):
            run_cache.remember(key, tensors, views, extents, self, kernel, queue, values,
                               grid[1], wait, dtype)
        return _finish(out, target)

    def mark_unwaited(self):
        """A kernel of this plan was submitted without a wait: freeing the tables then
        waits for the queue first."""
        self._state["unwaited"] = True

    def tables_on(self, queue):
        """The packed tables parameters, in USM memory of the queue's context (copied
        there once per context)."""
        tables = self._tables.get(queue)  # by queue first: no context lookup per run
        if tables is None:
            context = queue.sycl_context
            tables = self._tables.get(context)
            if tables is None:
                memory, offsets = usm.upload_tables(self._host_tables, queue)
                view = bridge.DeviceView(memory, 0, (memory.nbytes // 4,), (1,), 4, memory)
                weakref.finalize(self, _release, memory, queue, self._state)
                # setdefault: two threads that both uploaded agree on one copy
                tables = self._tables.setdefault(
                    context, launching.table_args(view, dict(zip(TABLES, offsets))))
            self._tables[queue] = tables
        return tables


def _on_cuda(x):
    """Whether this run goes to the CUDA backend (never remembered: run_cache packs SYCL
    launches). A CPU x while a CUDA device is current is reported by ``launch``."""
    try:
        return cuda_backend.wants(x)
    except TypeError:
        return True


def _finish(out, target):
    if out is not None and target is not out:
        bridge.assign(out, target)
        target = out
    return target.source if isinstance(target, bridge.UsmArray) else target
