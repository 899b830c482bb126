"""Everything the SYCL backend keeps between calls, in one object: ``STATE``, which is
the SYCL backend object's ``state`` (``SyclBackend.state``). Modules of the backend read
and fill its fields; ``clear`` forgets every cache and counter (for tests and long-lived
processes: what was forgotten is made again on its next use).

Not here: the USM allocations of ``jitconv.empty`` tensors and their pool (``usm``: live
memory, not a cache) and the runtime bootstrap (``bootstrap``: what this process loaded
and set before dpctl was imported).
"""

import os
import threading
import weakref
from dataclasses import dataclass, field, fields


def _counters(*names):
    return lambda: dict.fromkeys(names, 0)


@dataclass(eq=False)
class SyclState:
    # Devices and queues (``devices``, ``bridge``).
    queues: dict = field(default_factory=dict)  # filter string -> dpctl's cached queue
    device_names: dict = field(default_factory=dict)  # dpctl.SyclDevice -> its name
    queues_by_address: dict = field(default_factory=dict)  # sycl::queue* -> SyclQueue
    queue_devices: dict = field(default_factory=dict)  # SyclQueue -> its device's name
    dlpack_ids: dict = field(default_factory=dict)  # SyclDevice -> DLPack device id
    dlpack_devices: dict = field(default_factory=dict)  # DLPack device id -> name
    # Kernels (``launching``, ``planner``, ``kernel_cache``).
    kernels: dict = field(default_factory=dict)  # (device, context, kind...) -> SyclKernel
    planners: dict = field(default_factory=dict)  # (device, context, types) -> SyclKernel
    unavailable: set = field(default_factory=set)  # fused kernels no cache holds
    warned_dirs: set = field(default_factory=set)  # unwritable cache dirs reported
    rejected: list = field(default_factory=list)  # (path, reason) of ignored cache entries
    numba_ready: bool = False  # numba-dpex's target set up (``launching``)
    # What runs keep (``tables``, ``planner``, ``run_cache``, device plans' errors).
    plan_tables: weakref.WeakKeyDictionary = field(
        default_factory=weakref.WeakKeyDictionary)  # plan -> its tables per queue
    plan_records: weakref.WeakKeyDictionary = field(
        default_factory=weakref.WeakKeyDictionary)  # device plan -> record tables per queue
    runs: dict = field(default_factory=dict)  # run key -> remembered launch (``run_cache``)
    error_words: dict = field(default_factory=dict)  # torch device -> one-shot calls' words
    placeholders: dict = field(default_factory=dict)  # context -> memory no kernel reads
    # The device check (``device_check``).
    checks_passed: set = field(default_factory=set)  # verdict keys passed or read
    refused: dict = field(default_factory=dict)  # device name -> its DeviceCheckError
    # Counters.
    stats: dict = field(default_factory=_counters("compiled", "built", "cache_hits",
                                                  "submitted"))
    planner_stats: dict = field(default_factory=_counters("compiled", "built"))
    check_stats: dict = field(default_factory=_counters("checked", "stored", "read"))
    copies: dict = field(default_factory=_counters("to_device", "from_device"))
    # A setting, kept by ``clear``: whether a needed host<->device copy may be made.
    allow_copies: bool = os.environ.get("JITCONV_ALLOW_COPIES", "1") != "0"
    # Locks, kept by ``clear``: each guards the making of one kind of entry.
    kernels_lock: threading.Lock = field(default_factory=threading.Lock)
    planners_lock: threading.Lock = field(default_factory=threading.Lock)
    tables_lock: threading.Lock = field(default_factory=threading.Lock)
    names_lock: threading.Lock = field(default_factory=threading.Lock)
    errors_lock: threading.Lock = field(default_factory=threading.Lock)
    recording: threading.local = field(default_factory=threading.local)  # launching.recording

    KEPT = ("allow_copies", "kernels_lock", "planners_lock", "tables_lock", "names_lock",
            "errors_lock", "recording")

    def clear(self):
        """Forget every cache and counter (queues, kernels, tables, remembered runs,
        device-check verdicts, error words not yet read); keep the settings and locks."""
        fresh = SyclState()
        for f in fields(self):
            if f.name not in self.KEPT:
                setattr(self, f.name, getattr(fresh, f.name))


STATE = SyclState()
