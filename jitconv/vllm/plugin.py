"""A vLLM plugin that puts jitconv's conv into a vLLM XPU server (and, opted in, a CUDA one).

Installed with jitconv as the entry point ``jitconv = jitconv.vllm.plugin:register`` of
the ``vllm.general_plugins`` group (setup.cfg), which vLLM calls in every process it
starts. On XPU (torch.xpu available and vLLM's current platform XPU), and on CUDA when
``JITCONV_VLLM_ON_CUDA=1`` is set (torch.cuda available, vLLM's platform CUDA, numba-cuda
installed), ``register`` replaces vLLM's Triton conv ops, ``causal_conv1d_fn`` and ``causal_conv1d_update``, by
``jitconv.vllm``'s: in the ops module itself (for modules imported later) and in the
module globals of the layers that imported them already (``TARGETS``: the GDN layers
and the Mamba mixers). A name is replaced only while it still holds vLLM's own op. One
log line says what was replaced; when the platform is not one of those or the targets
are missing, one log line says so and nothing is touched.

The replacements follow the batch conventions of the installed vLLM (``vllm_version``):
0.33 and later pass ``null_block_id`` (line 0 is the null block); up to 0.32 vLLM passed
``pad_slot_id`` (-1) and had no null block, so there ``causal_conv1d_fn`` skips no line 0
and ``causal_conv1d_update`` skips lines equal to PAD_SLOT_ID unless told otherwise.

Opt-in whole-step mode (``JITCONV_VLLM_WHOLE_STEP=1``): the Qwen GDN layer's
``_forward_core`` first runs the conv of the whole step through
``jitconv.vllm.gdn_conv_step`` (one launch for spec and non-spec tokens, one plan per
step shared by every layer) and writes it into ``mixed_qkv``; the layer's own conv calls
then hand their input back unchanged, as it is already convolved. In a step with both
parts the conv writes each part's rows into its own tensor instead (split outputs) and
the layer is handed a zero-width view of ``mixed_qkv``: its two ``index_select`` gathers
then move no data, and its conv calls return the split outputs.
"""

import contextvars
import functools
import importlib
import logging
import os
import sys

from jitconv import vllm as drop_ins
from jitconv.api.plan import SplitOutputs

# A child of vLLM's logger, so the lines appear with vLLM's own logging setup.
logger = logging.getLogger("vllm.plugins.jitconv")

OPS_MODULE = "vllm.model_executor.layers.mamba.ops.causal_conv1d"
GDN_MODULE = "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn"
GDN_LAYER = "QwenGatedDeltaNetAttention"
TARGETS = (
    GDN_MODULE,
    "vllm.model_executor.layers.mamba.gdn.olmo_gdn_linear_attn",
    "vllm.model_executor.layers.mamba.mamba_mixer",
    "vllm.model_executor.layers.mamba.mamba_mixer2",
    "vllm.model_executor.layers.mamba.short_conv",
)
OP_NAMES = ("causal_conv1d_fn", "causal_conv1d_update")
WHOLE_STEP_ENV = "JITCONV_VLLM_WHOLE_STEP"
ON_CUDA_ENV = "JITCONV_VLLM_ON_CUDA"
NULL_BLOCK_SINCE = (0, 33)  # the first vLLM whose conv ops take null_block_id

# Set while a GDN layer runs on a conv the whole-step mode has already done.
_conv_done = contextvars.ContextVar("jitconv_conv_done", default=False)


def register():
    """vLLM's entry point. Returns the names replaced (empty when nothing was)."""
    problem = platform_problem(on_cuda=os.environ.get(ON_CUDA_ENV, "0") == "1")
    if problem is not None:
        logger.info("jitconv: %s; vLLM's conv ops left as they are", problem)
        return []
    return install(whole_step=os.environ.get(WHOLE_STEP_ENV, "0") == "1")


def platform_problem(on_cuda=False):
    """Why jitconv does not replace the ops in this process (None when it does): vLLM's
    current platform must be XPU with torch.xpu available, or, with ``on_cuda``, CUDA
    with torch.cuda available and numba-cuda installed."""
    try:
        from vllm.platforms import current_platform
    except ImportError as exc:
        return f"vllm.platforms cannot be imported ({exc})"
    import torch
    name = type(current_platform).__name__
    if current_platform.is_xpu():
        if not (hasattr(torch, "xpu") and torch.xpu.is_available()):
            return "torch.xpu is not available"
        return None
    is_cuda = getattr(current_platform, "is_cuda", None)
    if not (is_cuda is not None and is_cuda()):
        return f"vLLM's platform is {name}, not XPU or CUDA"
    if not on_cuda:
        return f"vLLM's platform is {name}: on CUDA only with {ON_CUDA_ENV}=1"
    if not torch.cuda.is_available():
        return "torch.cuda is not available"
    from jitconv.backends.cuda.devices import have_numba_cuda
    if not have_numba_cuda():
        return "numba-cuda is not installed (pip install 'jitconv[cuda]')"
    return None


def vllm_version():
    """(major, minor) of the vLLM in this process (``vllm.__version__``, else its
    distribution's version), or None when neither says."""
    import importlib.metadata
    import re
    text = getattr(sys.modules.get("vllm"), "__version__", None)
    if not text:
        try:
            text = importlib.metadata.version("vllm")
        except importlib.metadata.PackageNotFoundError:
            return None
    found = re.match(r"(\d+)\.(\d+)", str(text))
    return (int(found.group(1)), int(found.group(2))) if found else None


def install(whole_step=False):
    """Replace vLLM's conv ops by jitconv's (see the module docstring); the platform is
    not checked here. Returns the replaced names as "module.name"."""
    try:
        ops_module = importlib.import_module(OPS_MODULE)
        originals = {name: getattr(ops_module, name) for name in OP_NAMES}
    except (ImportError, AttributeError) as exc:
        logger.info("jitconv: vLLM's conv ops not found (%s); nothing replaced", exc)
        return []
    version = vllm_version()
    legacy = version is not None and version < NULL_BLOCK_SINCE
    ours = ({"causal_conv1d_fn": causal_conv1d_fn_pad_slot,
             "causal_conv1d_update": causal_conv1d_update_pad_slot} if legacy else
            {"causal_conv1d_fn": causal_conv1d_fn,
             "causal_conv1d_update": causal_conv1d_update})
    every = (causal_conv1d_fn, causal_conv1d_update, causal_conv1d_fn_pad_slot,
             causal_conv1d_update_pad_slot)
    if any(originals[name] in every for name in OP_NAMES):
        logger.info("jitconv: vLLM's conv ops are jitconv's already; nothing to do")
        return []
    # Import every target before patching: one imported afterwards would bind our ops
    # through the patched ops module and not be counted.
    modules, missing = {OPS_MODULE: ops_module}, []
    for module_name in TARGETS:
        try:
            modules[module_name] = importlib.import_module(module_name)
        except Exception as exc:  # a layer vLLM cannot import here is not ours to fix
            missing.append(f"{module_name} ({type(exc).__name__})")
    replaced = []
    for module_name, module in modules.items():
        for name in OP_NAMES:
            if getattr(module, name, None) is originals[name]:
                setattr(module, name, ours[name])
                replaced.append(f"{module_name}.{name}")
    if whole_step:
        whole = _install_whole_step()
        replaced += [whole] if whole else []
    if replaced == [f"{OPS_MODULE}.{name}" for name in OP_NAMES]:
        missing.insert(0, "no layer module uses them")
    convention = "pad_slot_id, no null block" if legacy else "null block 0"
    where = "unknown" if version is None else ".".join(map(str, version))
    logger.info("jitconv: replaced %s%s (vLLM %s conventions: %s)", ", ".join(replaced),
                f"; not found: {', '.join(missing)}" if missing else "", where, convention)
    return replaced


def causal_conv1d_fn(x, *args, **kwargs):
    """What replaces vLLM's op: ``jitconv.vllm.causal_conv1d_fn``, or, while the
    whole-step mode has done the current layer's conv already, x itself (or the
    non-spec part's split output, as the (dim, tokens) view the layer transposes back)."""
    done = _conv_done.get()
    if done:
        return done.non_spec.transpose(0, 1) if isinstance(done, SplitOutputs) else x
    return drop_ins.causal_conv1d_fn(x, *args, **kwargs)


def causal_conv1d_update(x, *args, **kwargs):
    """What replaces vLLM's op: ``jitconv.vllm.causal_conv1d_update``, or, while the
    whole-step mode has done the layer's conv already, x (copied into ``out`` when given)
    or the call's part of the split outputs (the spec part's call passes its
    query_start_loc)."""
    done = _conv_done.get()
    if done:
        if isinstance(done, SplitOutputs):
            spec = kwargs.get("query_start_loc") is not None or \
                kwargs.get("num_accepted_tokens") is not None
            x = done.spec if spec else done.non_spec
        out = kwargs.get("out")
        if out is None:
            return x
        out.copy_(x)
        return out
    return drop_ins.causal_conv1d_update(x, *args, **kwargs)


def causal_conv1d_fn_pad_slot(x, *args, **kwargs):
    """``causal_conv1d_fn`` for vLLM up to 0.32: no null block (line 0 is a cache line),
    lines equal to pad_slot_id skipped."""
    kwargs.setdefault("null_block_id", None)
    return causal_conv1d_fn(x, *args, **kwargs)


def causal_conv1d_update_pad_slot(x, *args, **kwargs):
    """``causal_conv1d_update`` for vLLM up to 0.32: lines equal to pad_slot_id
    (PAD_SLOT_ID when not given) skipped, no null block."""
    kwargs.setdefault("pad_slot_id", drop_ins.PAD_SLOT_ID)
    return causal_conv1d_update(x, *args, **kwargs)


def _install_whole_step():
    """Wrap the Qwen GDN layer's _forward_core (see the module docstring). Returns what
    was wrapped, or None (logged) when the layer is not as expected."""
    try:
        gdn = importlib.import_module(GDN_MODULE)
        layer = getattr(gdn, GDN_LAYER)
        original = layer._forward_core
        from vllm.forward_context import get_forward_context
        from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first
    except Exception as exc:
        logger.info("jitconv: whole-step mode not installed (%s: %s)",
                    type(exc).__name__, exc)
        return None

    @functools.wraps(original)
    def _forward_core(self, mixed_qkv, *args, **kwargs):
        metadata = get_forward_context().attn_metadata
        if isinstance(metadata, dict):
            metadata = metadata.get(self.prefix)
        if metadata is None:  # warm-up / profiling run: the layer's own path
            return original(self, mixed_qkv, *args, **kwargs)
        rows = mixed_qkv[:metadata.num_actual_tokens]
        weight = self.conv1d.weight
        conv_state = drop_ins.conv_state_view(self.kv_cache[0], is_conv_state_dim_first())
        # Both parts in the step: the layer gathers each part's rows out of mixed_qkv
        # before its conv calls. The conv writes them split instead (one launch), the
        # layer gets a zero-width view, so its gathers move no data, and its conv calls
        # hand back the split outputs.
        both = getattr(metadata, "spec_sequence_masks", None) is not None and \
            (metadata.num_prefills > 0 or metadata.num_decodes > 0)
        result = drop_ins.gdn_conv_step(rows, weight.view(weight.size(0), weight.size(-1)),
                                        self.conv1d.bias, conv_state, metadata,
                                        activation=self.activation, split=both)
        if both:
            mixed_qkv = mixed_qkv[:, :0]
        else:
            rows.copy_(result)
        token = _conv_done.set(result if both else True)
        try:
            return original(self, mixed_qkv, *args, **kwargs)
        finally:
            _conv_done.reset(token)

    layer._forward_core = _forward_core
    return f"{GDN_MODULE}.{GDN_LAYER}._forward_core (whole-step mode)"
