"""Put jitconv's SGLang drop-ins into SGLang's attention backends.

SGLang's GDN backend (``sglang.srt.layers.attention.linear.gdn_backend``) and Mamba2
backend (``sglang.srt.layers.attention.mamba.mamba``) import the conv ops as module
globals and look them up at call time, so replacing those globals reaches every layer.
``install()`` replaces a global only where it still holds SGLang's Triton op with the
signature of the drop-in that replaces it (read from the installed SGLang, not from its
version): a platform op bound there instead (SGLang's CUDA JIT wrapper, NPU or CPU
kernels) or a signature jitconv does not know is left alone and reported. It logs one
line per replacement.
"""

import importlib
import inspect
import logging

from jitconv.sglang import dropins

log = logging.getLogger("jitconv.sglang")

TRITON_MODULE = "sglang.kernels.ops.mamba.causal_conv1d_triton"
# module -> {global name: the drop-in for it}
TARGETS = {
    "sglang.srt.layers.attention.linear.gdn_backend": {
        "causal_conv1d_fn": dropins.causal_conv1d_fn,
        "causal_conv1d_update": dropins.causal_conv1d_update},
    "sglang.srt.layers.attention.mamba.mamba": {
        "causal_conv1d_fn": dropins.causal_conv1d_fn,
        "causal_conv1d_update": dropins.causal_conv1d_update,
        "causal_conv1d_fn_triton": dropins.causal_conv1d_fn,
        "causal_conv1d_update_triton": dropins.causal_conv1d_update},
}


def _parameters(fn):
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()
            if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]


def check_replaceable(current, dropin):
    """None if ``current`` is SGLang's Triton op with ``dropin``'s parameters (names,
    order, defaults), else why not."""
    if getattr(current, "__module__", None) != TRITON_MODULE:
        return (f"holds {getattr(current, '__module__', '?')}."
                f"{getattr(current, '__name__', current)!s}, not SGLang's Triton op")
    theirs, ours = _parameters(current), _parameters(dropin)
    if theirs != ours[:len(theirs)] or len(theirs) != len(ours):
        return f"its parameters {theirs} differ from the drop-in's {ours}"
    return None


def install(modules=None):
    """Replace SGLang's Triton conv ops in its GDN and Mamba backends by jitconv's
    drop-ins. ``modules``: module names to patch (default: those of ``TARGETS`` that
    import). Returns {"module.global": "replaced" or the reason it was not}."""
    report = {}
    for name, replacements in TARGETS.items():
        if modules is not None and name not in modules:
            continue
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            report[name] = f"not imported: {exc}"
            continue
        for attr, dropin in replacements.items():
            key = f"{name}.{attr}"
            current = getattr(module, attr, None)
            if current is None:
                report[key] = "absent"
                continue
            if current is dropin:
                report[key] = "replaced"
                continue
            why = check_replaceable(current, dropin)
            if why is not None:
                report[key] = f"not replaced: {why}"
                log.info("jitconv.sglang: %s not replaced: %s", key, why)
                continue
            setattr(module, attr, dropin)
            report[key] = "replaced"
            log.info("jitconv.sglang: %s -> jitconv.sglang.%s (SGLang's signature read "
                     "from %s)", key, dropin.__name__, inspect.getsourcefile(current))
    return report
