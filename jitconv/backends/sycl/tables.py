"""A plan's tables on SYCL devices: copied into USM memory of a queue's context once per
context, kept here (keyed by the plan, which is never written) for as long as the plan
lives, and freed after the last kernel that may read them."""

import weakref

from jitconv.backends.sycl import bridge, launching, planner, usm
from jitconv.backends.sycl.state import STATE
from jitconv.kernels.abi import TABLES


def _release(memory, queue, unwaited):
    """Finalizer: a kernel that was not waited for may still read the tables."""
    if unwaited[0]:
        queue.wait()
    del memory


def _of(plan):
    found = STATE.plan_tables.get(plan)
    if found is None:
        with STATE.tables_lock:
            found = STATE.plan_tables.setdefault(plan, {"tables": {}, "unwaited": [False]})
    return found


def tables_on(plan, queue):
    """The packed tables parameters of ``plan`` in USM memory of the queue's context."""
    state = _of(plan)
    tables = state["tables"].get(queue)  # by queue first: no context lookup per run
    if tables is None:
        context = queue.sycl_context
        tables = state["tables"].get(context)
        if tables is None:
            memory, offsets = usm.upload_tables(plan.host_tables, queue)
            view = bridge.DeviceView(memory=memory, offset=0, shape=(memory.nbytes // 4,),
                                     strides=(1,), itemsize=4, owner=memory)
            weakref.finalize(plan, _release, memory, queue, state["unwaited"])
            # setdefault: two threads that both uploaded agree on one copy
            tables = state["tables"].setdefault(
                context, launching.table_args(view, dict(zip(TABLES, offsets))))
        state["tables"][queue] = tables
    return tables


def for_run(plan, queue, windows=None, l2norm=None):
    """(the conv kernel's packed tables parameters for ``plan`` on ``queue``, an event the
    conv launch must wait for, or None): a host plan's uploaded tables; a device plan's
    table, written now by its planners (submitted here, ``sycl.planner``) for a run with
    ``windows`` (the intermediate windows' view, or None) and ``l2norm`` (a GDN stage
    run's first normalised rows, ``planner.plan_on``)."""
    if plan.on_device:
        return planner.plan_on(plan, queue, windows, l2norm)
    return tables_on(plan, queue), None


def mark_unwaited(plan):
    """A kernel of ``plan`` was submitted without a wait: freeing its tables then waits
    for the queue first."""
    _of(plan)["unwaited"][0] = True
