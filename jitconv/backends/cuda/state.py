"""Everything the CUDA backend keeps between calls, in one object: ``STATE``, which is
the CUDA backend object's ``state`` (``CudaBackend.state``). Modules of the backend read
and fill its fields; ``clear`` forgets every cache (for tests and long-lived processes:
what was forgotten is made again on its next use). What each plan derives (prepared
launches, remembered runs) is kept in the plan's own ``derived`` dict and goes with it;
``clear`` forgets the remembered runs of every plan that has some."""

import threading
import weakref
from dataclasses import dataclass, field, fields


@dataclass(eq=False)
class CudaState:
    # Compiled code (``launching``, ``planner``, ``kernels``).
    kernels: dict = field(default_factory=dict)  # source.KernelSpec -> dispatcher
    layouts: set = field(default_factory=set)  # layouts compiled into kernels so far
    planners: dict = field(default_factory=dict)  # (kind, element types) -> dispatcher
    planner_functions: dict = field(default_factory=dict)  # name -> device function
    device_functions: dict = field(default_factory=dict)  # (what, key) -> device function
    # What runs keep.
    plans_with_runs: weakref.WeakSet = field(default_factory=weakref.WeakSet)
    # device plan signature -> {run key: a run prepared for a plan of that signature}
    # (``launching._signed``; plans keep a reference to their signature's dict,
    # ``forget_signed``)
    signed_runs: dict = field(default_factory=dict)
    error_words: dict = field(default_factory=dict)  # torch device -> one-shot calls' words
    capability: dict = field(default_factory=dict)  # device index -> compute capability
    # The driver library, loaded once (``driver``); kept by ``clear``.
    driver: object = None
    # Locks, kept by ``clear``.
    lock: threading.Lock = field(default_factory=threading.Lock)
    planner_lock: threading.RLock = field(default_factory=threading.RLock)
    errors_lock: threading.Lock = field(default_factory=threading.Lock)
    thread: threading.local = field(default_factory=threading.local)  # driver's per thread

    KEPT = ("driver", "lock", "planner_lock", "errors_lock", "thread")

    def forget_signed(self):
        """Empty every signature's runs, then forget the signatures (under ``lock``):
        plans that found a signature's dict keep it, so it must hold no run from before."""
        for runs in self.signed_runs.values():
            runs.clear()
        self.signed_runs.clear()

    def forget_runs(self):
        """Forget every remembered run, each plan's and each signature's (the next launch
        of each is prepared again)."""
        with self.lock:
            for plan in list(self.plans_with_runs):
                plan.derived.get("cuda", {}).pop("runs", None)
            self.plans_with_runs.clear()
            self.forget_signed()

    def clear(self):
        """Forget every cache (kernels, planners, remembered runs, error words not yet
        read); keep the driver library and the locks."""
        self.forget_runs()
        fresh = CudaState()
        for f in fields(self):
            if f.name not in self.KEPT:
                setattr(self, f.name, getattr(fresh, f.name))


STATE = CudaState()
