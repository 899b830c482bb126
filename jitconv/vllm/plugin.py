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

The replacements follow the conventions of the installed vLLM, read from its ops
module's source (``jitconv.vllm.installed``), never from its version number: the null
block when its ``causal_conv1d_update`` takes ``null_block_id`` (lines equal to its
default, NULL_BLOCK_ID = 0, skipped), else the ``pad_slot_id`` convention (lines equal
to PAD_SLOT_ID skipped, line 0 a cache line); the installed ops' parameter order and
defaults. An installed op with a parameter ``jitconv.vllm`` does not know is not
replaced; parameters it knows but does not implement (``jitconv.vllm.NOT_IMPLEMENTED``,
empty since prefix caching, tree verify and circular lines run on jitconv) would raise
NotImplementedError, naming them, when a caller gives them. The log line says which convention was read, and from where. On XPU the plugin
also logs, as each Qwen GDN layer is built, whether its conv reaches jitconv (vLLM's
Triton route) or runs inside vLLM's fused SYCL GDN op (``gdn_route``).

Opt-in whole-step mode (``JITCONV_VLLM_WHOLE_STEP=1``): the Qwen GDN layer's
``_forward_core`` first runs the conv of the whole step through
``jitconv.vllm.gdn_conv_step`` (one launch for spec and non-spec tokens, one plan per
step shared by every layer) and writes it into ``mixed_qkv``; the layer's own conv calls
then hand their input back unchanged, as it is already convolved. In a step with both
parts the conv writes each part's rows into its own tensor instead (split outputs) and
the layer is handed a zero-width view of ``mixed_qkv``: its two ``index_select`` gathers
then move no data, and its conv calls return the split outputs.

Where the installed layer's chain after the conv is vLLM 0.32's (``stage_problem`` reads
it: conv calls, then ``rearrange_mixed_qkv`` or ``fused_post_conv_prep``), steps with
prefill or spec tokens run the GDN stage instead (``jitconv.vllm.gdn_conv_stage_step``:
conv, state update, q / k / v in head layout, the prefill tokens' l2norm and gates, in
one launch): the layer's conv calls hand back zero-width row markers, and its
``rearrange_mixed_qkv`` and ``fused_post_conv_prep`` answer from the stage's outputs,
which go to the recurrent kernels as they are. Decode-only steps run the conv alone
(the stage would save only the rearrange copy there, and vLLM may take its packed decode
path, which reads the conv output itself). A layer that hands a marker anywhere else, or
leaves stage rows unanswered, raises RuntimeError: never a silent wrong answer.
"""

import contextvars
import functools
import importlib
import logging
import inspect
import os

import torch

from jitconv import vllm as drop_ins
from jitconv.vllm import installed
from jitconv.api.plan import SplitOutputs
from jitconv.backends.cuda.devices import have_numba_cuda

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
OP_NAMES = installed.OP_NAMES
WHOLE_STEP_ENV = "JITCONV_VLLM_WHOLE_STEP"
ON_CUDA_ENV = "JITCONV_VLLM_ON_CUDA"

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
    if not have_numba_cuda():
        return "numba-cuda is not installed (pip install 'jitconv[cuda]')"
    return None


def install(whole_step=False):
    """Replace vLLM's conv ops by jitconv's (see the module docstring); the platform is
    not checked here. The replacements follow the conventions read from the installed
    ops module (``jitconv.vllm.installed``); when they cannot be read, or an op takes an
    argument jitconv does not know, nothing is replaced. Returns the replaced names as
    "module.name"."""
    try:
        ops_module = importlib.import_module(OPS_MODULE)
        originals = {name: getattr(ops_module, name) for name in OP_NAMES}
    except (ImportError, AttributeError) as exc:
        logger.info("jitconv: vLLM's conv ops not found (%s); nothing replaced", exc)
        return []
    if any(hasattr(originals[name], INSTALLED_MARK) for name in OP_NAMES):
        logger.info("jitconv: vLLM's conv ops are jitconv's already; nothing to do")
        return []
    try:
        ops = installed.read_module(ops_module)
        ours = replacements(ops)
    except installed.ConventionError as exc:
        logger.info("jitconv: %s; vLLM's conv ops left as they are", exc)
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
    refused = [f"{op}({', '.join(names)})" for op, names in refused_arguments(ops).items()
               if names]
    logger.info("jitconv: replaced %s%s; conventions read from the installed vLLM: %s%s",
                ", ".join(replaced), f"; not found: {', '.join(missing)}" if missing else "",
                ops.describe(),
                f"; refused when given: {'; '.join(refused)}" if refused else "")
    if modules.get(GDN_MODULE) is not None:
        _watch_gdn_route(modules[GDN_MODULE])
    return replaced


DROP_INS = {"causal_conv1d_fn": drop_ins.causal_conv1d_fn,
            "causal_conv1d_update": drop_ins.causal_conv1d_update}
INSTALLED_MARK = "jitconv_installed_ops"  # attribute of the ops install() puts in place


def refused_arguments(ops):
    """Per op, the installed op's parameters that jitconv refuses when given (a value
    other than the default): ``jitconv.vllm.NOT_IMPLEMENTED``."""
    return {name: [p for p in ops.op(name).parameters if p in drop_ins.NOT_IMPLEMENTED]
            for name in OP_NAMES}


def replacements(ops):
    """The ops that replace vLLM's, for the installed ops ``ops`` (an ``InstalledOps``):
    each takes its arguments as the installed op does (positions, defaults) and calls
    jitconv's drop-in by name. Raises ConventionError when an installed op takes a
    parameter the drop-in does not know, or where a call the installed op accepts would
    leave out one the drop-in needs."""
    made = {}
    for name in OP_NAMES:
        signature = ops.op(name)
        drop_in = DROP_INS[name]
        ours = inspect.signature(drop_in).parameters
        unknown = [p for p in signature.parameters if p not in ours]
        if unknown:
            raise installed.ConventionError(
                f"{name} in {ops.where} takes {', '.join(unknown)}, which jitconv does "
                f"not know")
        theirs = dict(signature.defaults)
        needed = [p for p, q in ours.items() if q.default is inspect.Parameter.empty
                  and (p in theirs or p not in signature.parameters)]
        if needed:
            raise installed.ConventionError(
                f"{name} in {ops.where} may be called without {', '.join(needed)}, which "
                f"jitconv needs")
        fixed = {}  # the installed defaults that differ from the drop-in's
        for p, value in theirs.items():
            if isinstance(value, installed.Unresolved):
                raise installed.ConventionError(
                    f"the default of {name}'s {p} in {ops.where} ({value}) cannot be read")
            if not _same_value(value, ours[p].default):
                fixed[p] = value
        if ops.convention == installed.PAD_SLOT:  # no null block in that convention
            fixed["null_block_id"] = None
        made[name] = _replacement(name, drop_in, signature, fixed, ops)
    return made


def _same_value(a, b):
    return type(a) is type(b) and a == b


def _replacement(name, drop_in, signature, fixed, ops):
    """What replaces one of vLLM's ops: arguments bound as the installed op binds them,
    its defaults where they differ from the drop-in's, then the drop-in (or, while the
    whole-step mode has done the layer's conv, its hand-back)."""
    installed_names = signature.parameters
    ours = tuple(inspect.signature(drop_in).parameters)
    same = 0  # leading positions that name the same parameter in both
    while same < min(len(ours), len(installed_names)) and \
            ours[same] == installed_names[same]:
        same += 1
    position = {p: (installed_names.index(p) if p in installed_names else ours.index(p))
                for p in fixed}
    fixed = tuple((p, value, position[p]) for p, value in fixed.items())
    hand_back = _HAND_BACKS[name]

    def replacement(*args, **kwargs):
        if len(args) > same:
            args, kwargs = _by_name(name, installed_names, same, args, kwargs)
        for p, value, at in fixed:
            if at >= len(args) and p not in kwargs:
                kwargs[p] = value
        done = _conv_done.get()
        if done:
            return hand_back(done, ours, args, kwargs)
        return drop_in(*args, **kwargs)

    replacement.__name__ = replacement.__qualname__ = name
    replacement.__doc__ = (f"jitconv.vllm.{name}, called as {ops.where}'s {name} is "
                           f"(convention: {ops.convention}).")
    setattr(replacement, INSTALLED_MARK, ops)
    return replacement


def _by_name(name, installed_names, same, args, kwargs):
    """Positional arguments after the first ``same`` passed by the installed op's names."""
    if len(args) > len(installed_names):
        raise TypeError(f"{name}() takes {len(installed_names)} positional arguments but "
                        f"{len(args)} were given")
    kwargs = dict(kwargs)
    for p, value in zip(installed_names[same:], args[same:]):
        if p in kwargs:
            raise TypeError(f"{name}() got multiple values for argument {p!r}")
        kwargs[p] = value
    return args[:same], kwargs


def _argument(p, ours, args, kwargs):
    at = ours.index(p)
    return args[at] if at < len(args) else kwargs.get(p)


def _fn_hand_back(done, ours, args, kwargs):
    """While the whole-step mode has done the current layer's conv: x itself (or the
    non-spec part's split output or stage marker, as the (dim, tokens) view the layer
    transposes back)."""
    x = args[0] if args else kwargs["x"]
    if isinstance(done, _StageStep):
        return done.marker(spec=False).transpose(0, 1)
    return done.non_spec.transpose(0, 1) if isinstance(done, SplitOutputs) else x


def _update_hand_back(done, ours, args, kwargs):
    """While the whole-step mode has done the layer's conv: x (copied into ``out`` when
    given), or the call's part of the split outputs or the stage's markers (the spec
    part's call passes its query_start_loc)."""
    x = args[0] if args else kwargs["x"]
    spec = _argument("query_start_loc", ours, args, kwargs) is not None or \
        _argument("num_accepted_tokens", ours, args, kwargs) is not None
    out = _argument("out", ours, args, kwargs)
    if isinstance(done, _StageStep):
        if out is not None:
            raise RuntimeError("jitconv whole-step mode: the layer passed causal_conv1d_"
                               "update an out tensor, which the GDN stage does not fill")
        return done.marker(spec)
    if isinstance(done, SplitOutputs):
        x = done.spec if spec else done.non_spec
    if out is None:
        return x
    out.copy_(x)
    return out


_HAND_BACKS = {"causal_conv1d_fn": _fn_hand_back, "causal_conv1d_update": _update_hand_back}


def gdn_route(layer):
    """(reaches jitconv, why) for a constructed Qwen GDN layer on XPU, read from the
    layer: the route vLLM chose for it (``gdn_xpu_backend``, set from
    ``--gdn-prefill-backend`` and whether vllm-xpu-kernels has the fused op), or, where
    the layer has no such choice, what its XPU forward calls."""
    backend = getattr(layer, "gdn_xpu_backend", None)
    if backend == "triton":
        return True, ("vLLM's Qwen GDN layers take the Triton route "
                      "(gdn_xpu_backend='triton'): their conv runs on jitconv")
    if backend is not None:
        return False, (f"vLLM's Qwen GDN layers run the fused SYCL op "
                       f"torch.ops._xpu_C.gdn_attention (gdn_xpu_backend={backend!r}): "
                       f"their conv does not reach jitconv; start vLLM with "
                       f"--gdn-prefill-backend triton to run it on jitconv")
    forward = getattr(type(layer), "forward_xpu", None)
    names = getattr(getattr(forward, "__code__", None), "co_names", ())
    if "gdn_attention_core_xpu" in names and "gdn_xpu_backend" not in names:
        return False, ("this vLLM's Qwen GDN layer has no Triton route on XPU (its "
                       "forward_xpu always runs torch.ops.vllm.gdn_attention_core_xpu): "
                       "its conv does not reach jitconv; Mamba layers' does")
    return False, ("jitconv cannot tell which route this vLLM's Qwen GDN layer takes on "
                   "XPU (no gdn_xpu_backend)")


def _watch_gdn_route(gdn):
    """On XPU, log which route vLLM's Qwen GDN layers take, once per route, as they are
    built (the choice is made in their constructor, from the engine's config)."""
    try:
        from vllm.platforms import current_platform  # optional dependency: vLLM
        on_xpu = current_platform.is_xpu()
    except Exception:  # no platform to ask: nothing to say
        return
    layer = getattr(gdn, GDN_LAYER, None)
    if not on_xpu or layer is None:
        return
    available = getattr(gdn, "xpu_gdn_kernel_available", None)
    if available is not None:
        logger.info("jitconv: the fused SYCL GDN op (torch.ops._xpu_C.gdn_attention) is "
                    "%s: Qwen GDN layers reach jitconv %s", "built" if available() else
                    "not built", "only with --gdn-prefill-backend triton" if available()
                    else "(Triton route)")
    original = layer.__init__
    said = set()

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        reaches, why = gdn_route(self)
        if why not in said:
            said.add(why)
            logger.info("jitconv: %s", why)

    layer.__init__ = __init__


def _install_whole_step():
    """Wrap the Qwen GDN layer's _forward_core (see the module docstring); in stage mode
    (``stage_problem`` finds none) also its ``rearrange_mixed_qkv`` and the module's
    ``fused_post_conv_prep``. Returns what was wrapped, or None (logged) when the layer
    is not as expected."""
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
    problem = stage_problem(gdn, layer)
    if problem is None:
        _install_stage_answers(gdn, layer)
    else:
        logger.info("jitconv: whole-step mode runs the conv only: %s", problem)
    core = inspect.signature(original)

    @functools.wraps(original)
    def _forward_core(self, mixed_qkv, *args, **kwargs):
        metadata = get_forward_context().attn_metadata
        if isinstance(metadata, dict):
            metadata = metadata.get(self.prefix)
        if metadata is None:  # warm-up / profiling run: the layer's own path
            return original(self, mixed_qkv, *args, **kwargs)
        rows = mixed_qkv[:metadata.num_actual_tokens]
        weight = self.conv1d.weight
        weight = weight.view(weight.size(0), weight.size(-1))
        conv_state = drop_ins.conv_state_view(self.kv_cache[0], is_conv_state_dim_first())
        spec = getattr(metadata, "spec_sequence_masks", None) is not None
        if problem is None and (spec or metadata.num_prefills > 0):
            bound = core.bind(self, mixed_qkv, *args, **kwargs)
            step = _run_stage(self, rows, bound.arguments["a"], bound.arguments["b"],
                              weight, conv_state, metadata)
            if step is not None:
                bound.arguments["mixed_qkv"] = mixed_qkv[:, :0]
                token = _conv_done.set(step)
                try:
                    result = original(*bound.args, **bound.kwargs)
                finally:
                    _conv_done.reset(token)
                step.check_answered()
                return result
        # Split outputs: the layer gets a zero-width view, so its gathers move no data,
        # and its conv calls hand back the parts; a new tensor: its causal_conv1d_fn call
        # hands it back (``whole_step_outputs``).
        both, fn_only = whole_step_outputs(metadata)
        result = drop_ins.gdn_conv_step(rows, weight, self.conv1d.bias, conv_state, metadata,
                                        activation=self.activation, split=both,
                                        out=None if both or fn_only else rows)
        if both:
            mixed_qkv = mixed_qkv[:, :0]
        token = _conv_done.set(result if both else SplitOutputs(None, result) if fn_only
                               else True)
        try:
            return original(self, mixed_qkv, *args, **kwargs)
        finally:
            _conv_done.reset(token)

    layer._forward_core = _forward_core
    return f"{GDN_MODULE}.{GDN_LAYER}._forward_core (whole-step mode" + \
        (", GDN stage)" if problem is None else ")")


def whole_step_outputs(metadata):
    """Where whole-step mode's ``gdn_conv_step`` writes a step's conv, as (split, new):
    split outputs where the step has both parts (the layer gathers each part's rows out
    of mixed_qkv before its conv calls); a new tensor for prefills without spec part (the
    layer's causal_conv1d_fn returns one, as vLLM's does); else neither: mixed_qkv's rows,
    where vLLM's update path reads them after its calls."""
    spec = getattr(metadata, "spec_sequence_masks", None) is not None
    return (spec and (metadata.num_prefills > 0 or metadata.num_decodes > 0),
            not spec and metadata.num_prefills > 0)


# ------------------------------------------------ whole-step mode with the GDN stage

PREP = "fused_post_conv_prep"
# vLLM's fused_post_conv_prep, as the stage answers it: its parameters, in order.
PREP_PARAMETERS = ("conv_output", "a", "b", "A_log", "dt_bias", "num_k_heads",
                   "head_k_dim", "head_v_dim", "apply_l2norm", "output_g_exp")
# What the installed _forward_core must call for the stage to answer its chain.
STAGE_CHAIN = ("causal_conv1d_fn", "causal_conv1d_update", "rearrange_mixed_qkv", PREP)


def stage_problem(gdn, layer):
    """Why the whole-step mode cannot answer the installed GDN layer's conv chain with
    the GDN stage (None when it can), read from the installed vLLM: its
    ``_forward_core`` (parameters mixed_qkv, b, a; calls STAGE_CHAIN), the module's
    ``fused_post_conv_prep`` (PREP_PARAMETERS). vLLM 0.32's layer: mixed_qkv goes through the conv ops, then
    ``rearrange_mixed_qkv`` (q, k, v of the decodes and spec tokens, which the recurrent
    kernels normalise and gate themselves) or ``fused_post_conv_prep`` (q, k normalised,
    v, g, beta of the prefill tokens)."""
    core = getattr(layer, "_forward_core", None)
    names = getattr(getattr(core, "__code__", None), "co_names", ())
    missing = [n for n in STAGE_CHAIN if n not in names]
    if missing:
        return f"{GDN_LAYER}._forward_core does not call {', '.join(missing)}"
    parameters = tuple(inspect.signature(core).parameters)
    if parameters[1:4] != ("mixed_qkv", "b", "a"):
        return f"{GDN_LAYER}._forward_core takes {parameters[1:]}, not (mixed_qkv, b, a, ...)"
    prep = getattr(gdn, PREP, None)
    if prep is None:
        return f"{GDN_MODULE} has no {PREP}"
    given = tuple(inspect.signature(prep).parameters)
    if given != PREP_PARAMETERS:
        return f"{PREP} takes {given}, the stage answers {PREP_PARAMETERS}"
    return None


def _install_stage_answers(gdn, layer):
    """The layer's ``rearrange_mixed_qkv`` and the module's ``fused_post_conv_prep``
    answer from the step's stage run when handed one of its row markers
    (``_StageStep``), and call vLLM's own otherwise."""
    rearrange = layer.rearrange_mixed_qkv
    prep = getattr(gdn, PREP)
    prep_signature = inspect.signature(prep)  # read once: the answer runs every layer

    @functools.wraps(rearrange)
    def rearrange_mixed_qkv(self, mixed_qkv):
        step = _conv_done.get()
        if isinstance(step, _StageStep) and step.owns(mixed_qkv):
            return step.rearranged(mixed_qkv)
        return rearrange(self, mixed_qkv)

    @functools.wraps(prep)
    def fused_post_conv_prep(*args, **kwargs):
        step = _conv_done.get()
        call = prep_signature.bind(*args, **kwargs)
        call.apply_defaults()
        if isinstance(step, _StageStep) and step.owns(call.arguments["conv_output"]):
            return step.prepared(**call.arguments)
        return prep(*args, **kwargs)

    layer.rearrange_mixed_qkv = rearrange_mixed_qkv
    setattr(gdn, PREP, fused_post_conv_prep)


def _run_stage(layer, rows, a, b, weight, conv_state, metadata):
    """The stage of the layer's step (a ``_StageStep``), or None where the stage cannot
    take these tensors as they are (mixed_qkv not in the conv cache's dtype, a or b not
    in its dtype or without contiguous heads): the conv-only whole step then."""
    n = rows.shape[0]
    a, b = a[:n], b[:n]
    if not (rows.dtype == conv_state.dtype == a.dtype == b.dtype and a.stride(-1) == 1
            and b.stride(-1) == 1):
        return None
    # vLLM's layer normalises q and k of the prefill tokens only (fused_post_conv_prep),
    # which follow the non-spec part's decodes when there is no spec part.
    l2norm = False
    if metadata.num_prefills > 0:
        peeled = metadata.spec_sequence_masks is None and metadata.num_decodes > 0
        l2norm = {"non_spec": int(metadata.num_decode_tokens) if peeled else 0}
    heads = dict(num_k_heads=layer.num_k_heads // layer.tp_size,
                 head_k_dim=layer.head_k_dim, head_v_dim=layer.head_v_dim)
    result = drop_ins.gdn_conv_stage_step(
        rows, weight, layer.conv1d.bias, conv_state, a, b, layer.A_log, layer.dt_bias,
        metadata, use_l2norm=l2norm, activation=layer.activation, **heads)
    return _StageStep(rows, result, l2norm, heads)


class _StageStep:
    """One layer's stage run in whole-step mode, and the row markers that stand for its
    parts' conv outputs in the layer: zero-width views of mixed_qkv's storage, the
    non-spec part's rows first, then the spec part's (so a marker's storage offset says
    its part and first row, and the layer's row slices of a marker stay markers). A
    zero-width tensor that reaches anything but the answers fails there; each part's
    rows must be answered exactly once (``check_answered``)."""

    def __init__(self, rows, result, l2norm, heads):
        self.heads = heads
        self.parts = {"non_spec": result.non_spec, "spec": result.spec}
        self.counts = {p: 0 if o is None else o.q.shape[0] for p, o in self.parts.items()}
        self.first_normalised = {p: (l2norm.get(p, self.counts[p]) if l2norm else
                                     self.counts[p]) for p in self.parts}
        self.answered = dict.fromkeys(self.parts, 0)
        self.stride, self.base = rows.stride(0), rows.storage_offset()
        self.storage = rows.untyped_storage().data_ptr()
        ns = self.counts["non_spec"]
        self.markers = {"non_spec": rows.as_strided((ns, 0), (self.stride, 1), self.base),
                        "spec": rows.as_strided((self.counts["spec"], 0), (self.stride, 1),
                                                self.base + ns * self.stride)}

    def owns(self, t):
        return isinstance(t, torch.Tensor) and t.dim() == 2 and t.shape[1] == 0 and \
            t.stride(0) == self.stride and t.untyped_storage().data_ptr() == self.storage

    def _rows(self, t, what):
        """(part, first row, rows) of a marker (or a row slice of one)."""
        at = (t.storage_offset() - self.base) // self.stride
        ns = self.counts["non_spec"]
        part, first = ("non_spec", at) if at < ns else ("spec", at - ns)
        if first + t.shape[0] > self.counts[part] or self.parts[part] is None:
            raise RuntimeError(f"jitconv whole-step mode: {what} was given rows {first}.."
                               f"{first + t.shape[0]} of the {part} part, which has "
                               f"{self.counts[part]}: the layer's chain is not the one "
                               f"the GDN stage answers")
        self.answered[part] += t.shape[0]
        return part, first, t.shape[0]

    def marker(self, spec):
        return self.markers["spec" if spec else "non_spec"]

    def rearranged(self, t):
        """``rearrange_mixed_qkv``'s answer: q, k, v (1, rows, heads, dim), as stored by
        the stage (not normalised)."""
        part, first, n = self._rows(t, "rearrange_mixed_qkv")
        if first + n > self.first_normalised[part]:
            raise RuntimeError(f"jitconv whole-step mode: rearrange_mixed_qkv was given "
                               f"rows {first}..{first + n} of the {part} part, whose q "
                               f"and k the stage normalised from row "
                               f"{self.first_normalised[part]} on")
        out = self.parts[part]
        return tuple(x[first:first + n].unsqueeze(0) for x in (out.q, out.k, out.v))

    def prepared(self, conv_output, a, b, A_log, dt_bias, num_k_heads, head_k_dim,
                 head_v_dim, apply_l2norm, output_g_exp):
        """``fused_post_conv_prep``'s answer: q, k (normalised), v (rows, heads, dim), g
        and beta (rows, heads) float32, from the stage (which computed the gates from
        the same rows of a and b, and the layer's A_log and dt_bias)."""
        part, first, n = self._rows(conv_output, PREP)
        asked = dict(num_k_heads=num_k_heads, head_k_dim=head_k_dim, head_v_dim=head_v_dim)
        normalised = first >= self.first_normalised[part]
        if asked != self.heads or bool(apply_l2norm) != normalised or output_g_exp:
            raise RuntimeError(
                f"jitconv whole-step mode: {PREP} asked for {asked}, apply_l2norm="
                f"{apply_l2norm}, output_g_exp={output_g_exp}; the stage ran {self.heads}, "
                f"l2norm {'on' if normalised else 'off'} for these rows, g (not exp(g))")
        out = self.parts[part]
        return tuple(x[first:first + n] for x in out)

    def check_answered(self):
        if self.answered != self.counts:
            raise RuntimeError(f"jitconv whole-step mode: the layer took rows "
                               f"{self.answered} of the GDN stage's {self.counts}: its "
                               f"chain is not the one the stage answers")
