"""Bad metadata values met on the device by calls whose metadata stays there.

The one-shot ops (``jitconv.causal_conv1d_fn`` / ``_update`` / ``_mixed``) and the
``jitconv.vllm`` drop-ins, given metadata in tensors on x's GPU, never read those values
on the host: they run a device plan that checks each sequence on the device, skips a bad
one (its output rows zeros, its cache line untouched) and sets a word of its kind
(``kernels.planner.ERRORS``). The plans these calls keep come and go (``plan_cache``), so
their words are not the plan's but one set per device, kept in the backend's state;
``check_errors`` reads them. A ``jitconv.device_plan`` built by the caller has words of its own
(``DevicePlan.check_errors``).
"""

import torch

from jitconv.backends import registry
from jitconv.kernels import planner


def words_for(backend, device):
    """The error words of ``device`` (a torch device of ``backend``), made on first use and
    kept in the backend's state."""
    words = backend.state.error_words
    found = words.get(device)
    if found is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            # made inside the capture, the words would be zeroed by every replay
            raise RuntimeError(f"the first call with metadata on {device} is being "
                               f"captured in a CUDA graph; make one such call eagerly "
                               f"before capturing (engines warm up first)")
        with backend.state.errors_lock:
            found = words.get(device)
            if found is None:
                found = words[device] = backend.new_error_words(device)
    return found


def check_errors(device=None) -> None:
    """Raise ValueError if one-shot calls with metadata on the device met bad metadata
    values since the last check: which kinds, and that those sequences were skipped
    (outputs zero, cache lines untouched). Clears what it reports.

    ``device``: a torch device (or its name) to check; None: every device such calls ran
    on. Waits for the device's work so far (call it where the engine synchronizes anyway,
    e.g. after sampling); not allowed while a CUDA graph is being captured. A kind of bad
    value met by work that other threads queue while this runs is reported by this check
    or the next one.
    """
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("check_errors: waits for the device, which a CUDA graph capture "
                           "does not allow; call it after the replay")
    wanted = None if device is None else torch.device(device)
    found = []
    for backend in registry.BACKENDS:
        for where, words in list(backend.state.error_words.items()):
            if wanted is not None and not _same(wanted, where):
                continue
            values = backend.read_error_words(words)
            if any(values):
                found.append((where, values))
    if found:
        raise ValueError(_message(found))


def _same(wanted, where):
    if wanted.type != where.type:
        return False
    index = 0 if wanted.index is None else wanted.index
    return (0 if where.index is None else where.index) == index


def _message(found):
    parts = []
    for where, values in found:
        kinds = "; ".join(planner.ERRORS[i] for i, v in enumerate(values) if v)
        parts.append(f"on {where}: {kinds}")
    return ("bad metadata values were met on the device by calls that keep metadata "
            "there, and those sequences were skipped (outputs zero, cache lines "
            "untouched): " + " | ".join(parts))
