"""jitconv.vllm.plugin: the vLLM general plugin, against a stand-in vLLM package.

vLLM itself cannot be imported in the test environment (it is not installed, and its GDN
module needs vLLM's CUDA-era dependencies), so each test writes a small stand-in package
named ``vllm`` into tmp_path with the same module paths the plugin patches: the ops
module ``...mamba.ops.causal_conv1d`` (ops that fail if ever called), a GDN layer module
whose ``QwenGatedDeltaNetAttention._forward_core`` calls the conv ops the way vLLM
0.33's layer does (our own short code, following its conventions), a mixer module that
imports the same ops, ``vllm.platforms.current_platform``, ``vllm.forward_context`` and
``mamba_utils.is_conv_state_dim_first``. The platform check is tested on this machine as
it is (no torch XPU), without faking torch.
"""

import ast
import json
import logging
import sys
import tempfile
import textwrap
import types
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from jitconv.vllm import installed, plugin as vllm_plugin
from jitconv.reference import causal_conv1d_reference
from jitconv.backends.sycl.state import STATE as SYCL_STATE

from helpers import (assert_outputs_close, assert_state_exact, bits, cumulative, randn,
                     run_checked)

STANDIN = {
    "vllm/__init__.py": "",
    "vllm/platforms/__init__.py": """
        class XPUPlatform:
            def is_xpu(self):
                return True

        class CpuPlatform:
            def is_xpu(self):
                return False

        current_platform = XPUPlatform()
        """,
    "vllm/forward_context.py": """
        import types
        _context = types.SimpleNamespace(attn_metadata=None)

        def get_forward_context():
            return _context
        """,
    "vllm/model_executor/__init__.py": "",
    "vllm/model_executor/layers/__init__.py": "",
    "vllm/model_executor/layers/mamba/__init__.py": "",
    "vllm/model_executor/layers/mamba/mamba_utils.py": """
        DIM_FIRST = False

        def is_conv_state_dim_first():
            return DIM_FIRST
        """,
    "vllm/model_executor/layers/mamba/ops/__init__.py": "",
    # The ops with vLLM 0.33's signatures (the plugin reads them from this source), never
    # to be called.
    "vllm/model_executor/layers/mamba/ops/causal_conv1d.py": """
        NULL_BLOCK_ID, PAD_SLOT_ID = 0, -1

        def causal_conv1d_fn(x, weight, bias, conv_states, query_start_loc,
                             cache_indices=None, has_initial_state=None, activation="silu",
                             pad_slot_id=PAD_SLOT_ID, null_block_id=NULL_BLOCK_ID,
                             metadata=None, validate_data=False):
            raise AssertionError("vLLM's Triton causal_conv1d_fn was called")

        def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None,
                                 conv_state_indices=None, num_accepted_tokens=None,
                                 query_start_loc=None, max_query_len=-1,
                                 null_block_id=NULL_BLOCK_ID, validate_data=False, out=None):
            raise AssertionError("vLLM's Triton causal_conv1d_update was called")
        """,
    "vllm/model_executor/layers/mamba/mamba_mixer2.py": """
        from vllm.model_executor.layers.mamba.ops.causal_conv1d import (
            causal_conv1d_fn, causal_conv1d_update)
        """,
    "vllm/model_executor/layers/mamba/gdn/__init__.py": "",
    "vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py": """
        from vllm.forward_context import get_forward_context
        from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first
        from vllm.model_executor.layers.mamba.ops.causal_conv1d import (
            causal_conv1d_fn, causal_conv1d_update)


        class QwenGatedDeltaNetAttention:
            # The conv stage of vLLM 0.33's GDN layer; the recurrent stage is replaced by
            # storing the conv outputs of both parts in core_attn_out (a dict).
            def __init__(self, prefix, conv1d, kv_cache, activation="silu",
                         gdn_xpu_backend=None):
                self.prefix, self.conv1d = prefix, conv1d
                self.kv_cache, self.activation = kv_cache, activation
                if gdn_xpu_backend is not None:  # vLLM sets it on XPU only
                    self.gdn_xpu_backend = gdn_xpu_backend

            def _forward_core(self, mixed_qkv, b, a, core_attn_out):
                m = get_forward_context().attn_metadata[self.prefix]
                conv_state = (self.kv_cache[0] if is_conv_state_dim_first()
                              else self.kv_cache[0].transpose(-1, -2))
                mixed_qkv = mixed_qkv[:m.num_actual_tokens]
                w = self.conv1d.weight
                w = w.view(w.size(0), w.size(2))
                spec = m.spec_sequence_masks is not None
                x_spec = x_non_spec = None
                if spec and m.num_prefills == 0 and m.num_decodes == 0:
                    x_spec = mixed_qkv
                elif spec:
                    x_spec = mixed_qkv.index_select(0, m.spec_token_indx)
                    x_non_spec = mixed_qkv.index_select(0, m.non_spec_token_indx)
                else:
                    x_non_spec = mixed_qkv
                core_attn_out["gathered"] = [t.shape[1] for t in (x_spec, x_non_spec)
                                             if t is not None]
                if spec:
                    x_spec = causal_conv1d_update(
                        x_spec, conv_state, w, self.conv1d.bias, self.activation,
                        conv_state_indices=m.spec_state_indices_tensor[:, 0][
                            :m.num_spec_decodes],
                        num_accepted_tokens=m.num_accepted_tokens,
                        query_start_loc=m.spec_query_start_loc,
                        max_query_len=m.spec_state_indices_tensor.size(-1),
                        validate_data=False)
                if m.num_prefills > 0:
                    x_non_spec = causal_conv1d_fn(
                        x_non_spec.transpose(0, 1), w, self.conv1d.bias,
                        activation=self.activation, conv_states=conv_state,
                        has_initial_state=m.has_initial_state,
                        cache_indices=m.non_spec_state_indices_tensor,
                        query_start_loc=m.non_spec_query_start_loc,
                        metadata=m).transpose(0, 1)
                elif m.num_decodes > 0:
                    x_non_spec = causal_conv1d_update(
                        x_non_spec, conv_state, w, self.conv1d.bias, self.activation,
                        conv_state_indices=m.non_spec_state_indices_tensor[
                            :m.num_actual_tokens],
                        validate_data=True)
                else:
                    x_non_spec = None
                core_attn_out["spec"], core_attn_out["non_spec"] = x_spec, x_non_spec
        """,
}
TARGET_NAMES = [f"{module}.{op}" for module in (
    "vllm.model_executor.layers.mamba.ops.causal_conv1d",
    "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn",
    "vllm.model_executor.layers.mamba.mamba_mixer2") for op in vllm_plugin.OP_NAMES]


@pytest.fixture
def standin(tmp_path, monkeypatch):
    """The stand-in vLLM importable as ``vllm``; removed again afterwards."""
    for path, text in STANDIN.items():
        file = tmp_path / path
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(textwrap.dedent(text))
    assert "vllm" not in sys.modules, "a real vllm is imported in this process"
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
        del sys.modules[name]


def plugin_lines(caplog):
    return [r.getMessage() for r in caplog.records if r.name == vllm_plugin.logger.name]


def test_entry_point_is_declared_in_setup_cfg():
    import configparser
    from pathlib import Path
    cfg = configparser.ConfigParser()
    cfg.read(Path(__file__).resolve().parents[1] / "setup.cfg")
    points = cfg["options.entry_points"]["vllm.general_plugins"].strip()
    assert points == "jitconv = jitconv.vllm.plugin:register"


def test_register_does_nothing_without_torch_xpu(standin, caplog):
    """The stand-in platform says XPU, but this machine has no torch XPU (torch as it
    is, not faked): one log line, nothing replaced."""
    assert not (hasattr(torch, "xpu") and torch.xpu.is_available())
    caplog.set_level(logging.INFO, logger=vllm_plugin.logger.name)
    assert vllm_plugin.register() == []
    lines = plugin_lines(caplog)
    assert len(lines) == 1 and "torch.xpu is not available" in lines[0], lines
    import vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn as gdn
    assert gdn.causal_conv1d_fn.__module__.startswith("vllm.")


def test_install_replaces_the_ops_and_logs_them(standin, caplog):
    caplog.set_level(logging.INFO, logger=vllm_plugin.logger.name)
    replaced = vllm_plugin.install()
    assert replaced == TARGET_NAMES
    import vllm.model_executor.layers.mamba.mamba_mixer2 as mixer
    import vllm.model_executor.layers.mamba.ops.causal_conv1d as ops
    for name in vllm_plugin.OP_NAMES:
        assert getattr(mixer, name) is getattr(ops, name)
        assert getattr(ops, name).jitconv_installed_ops.convention == "null block"
    lines = plugin_lines(caplog)
    assert len(lines) == 1 and all(name in lines[0] for name in TARGET_NAMES), lines
    assert "mamba_mixer (ModuleNotFoundError)" in lines[0]  # not in the stand-in
    assert f"null block 0 (causal_conv1d_update takes null_block_id=0 in {ops.__file__})" \
        in lines[0], lines
    assert "refused" not in lines[0]  # the stand-in's ops take nothing jitconv refuses
    assert vllm_plugin.install() == []  # a second install finds jitconv's ops
    assert len(plugin_lines(caplog)) == 2


def test_install_without_vllm_does_nothing(caplog):
    assert "vllm" not in sys.modules
    caplog.set_level(logging.INFO, logger=vllm_plugin.logger.name)
    assert vllm_plugin.install() == []
    lines = plugin_lines(caplog)
    assert len(lines) == 1 and "not found" in lines[0], lines


def test_register_does_nothing_on_another_platform(standin, monkeypatch, caplog):
    """vLLM's platform (the stand-in's CpuPlatform) is not XPU: one line, nothing done."""
    import vllm.platforms as platforms
    monkeypatch.setattr(platforms, "current_platform", platforms.CpuPlatform())
    caplog.set_level(logging.INFO, logger=vllm_plugin.logger.name)
    assert vllm_plugin.register() == []
    lines = plugin_lines(caplog)
    assert len(lines) == 1 and "CpuPlatform, not XPU" in lines[0], lines


# ------------------------------------------------- the GDN layer, with jitconv's ops

NUM_SPEC, DIM, WIDTH = 3, 64, 4


def mixed_step_metadata(non_spec_decodes=False):
    """A mixed step as vLLM's builder lays it out (decodes counted as prefills beside
    spec decodes; maps from a stable argsort, int64), with a null-block spec row;
    ``non_spec_decodes``: the non-spec part only decodes (vLLM's update call for it)."""
    lengths = [4, 1 if non_spec_decodes else 5, 1, 2, 4, 1]  # requests in order
    spec = np.array([True, False, False, True, True, False])
    token_spec = np.repeat(spec, lengths)
    order = torch.argsort(torch.tensor(token_spec), stable=True)
    n_ns = int((~token_spec).sum())
    table = torch.tensor([[3, 9, 10, 11], [0, 0, 0, 0], [6, 12, 13, 14]], dtype=torch.int32)
    initial = torch.tensor([True] * 3 if non_spec_decodes else [False, True, True])
    meta = types.SimpleNamespace(
        num_prefills=0 if non_spec_decodes else 3, num_decodes=3 if non_spec_decodes else 0,
        num_spec_decodes=3, num_actual_tokens=sum(lengths),
        spec_sequence_masks=torch.tensor(spec),
        spec_token_indx=order[n_ns:], non_spec_token_indx=order[:n_ns],
        spec_state_indices_tensor=table, spec_query_start_loc=cumulative([4, 2, 4]),
        num_accepted_tokens=torch.tensor([2, 1, 3], dtype=torch.int32),
        non_spec_query_start_loc=cumulative([lengths[1], 1, 1]),
        non_spec_state_indices_tensor=torch.tensor([5, 7, 8], dtype=torch.int32),
        has_initial_state=None if non_spec_decodes else initial)
    reference = dict(
        non_spec_query_start_loc=meta.non_spec_query_start_loc,
        non_spec_state_indices=meta.non_spec_state_indices_tensor,
        has_initial_state=initial, non_spec_token_indx=order[:n_ns],
        spec_query_start_loc=meta.spec_query_start_loc,
        spec_state_indices=torch.tensor([3, -1, 6]), spec_token_indx=order[n_ns:],
        num_accepted_tokens=meta.num_accepted_tokens)
    return meta, reference


@pytest.mark.parametrize("non_spec_decodes", [False, True], ids=["prefills", "decodes"])
@pytest.mark.parametrize("dim_first", [False, True], ids=["state_major", "dim_first"])
@pytest.mark.parametrize("whole_step", [False, True], ids=["per_call", "whole_step"])
def test_gdn_layer_runs_on_jitconv(cpu_tensor_device, standin, whole_step, dim_first,
                                   non_spec_decodes):
    """The stand-in GDN layer's conv stage, after install(): outputs of both parts and
    the cache against the reference, null block 0 untouched; the whole-step mode does
    the step in one launch with split outputs, the layer's gathers move no data and its
    own conv calls become hand-backs."""
    vllm_plugin.install(whole_step=whole_step)
    import vllm.forward_context as context
    import vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn as gdn
    import vllm.model_executor.layers.mamba.mamba_utils as utils
    utils.DIM_FIRST = dim_first
    gen = torch.Generator().manual_seed(5)
    meta, reference = mixed_step_metadata(non_spec_decodes)
    storage = (16, DIM, WIDTH - 1 + NUM_SPEC) if dim_first else (16, WIDTH - 1 + NUM_SPEC, DIM)
    cache = randn(gen, storage, torch.float32)
    conv_state = cache if dim_first else cache.transpose(-1, -2)
    conv1d = types.SimpleNamespace(weight=randn(gen, (DIM, 1, WIDTH), torch.float32),
                                   bias=randn(gen, (DIM,), torch.float32))
    layer = gdn.QwenGatedDeltaNetAttention("layers.0", conv1d, [cache])
    mixed_qkv = randn(gen, (meta.num_actual_tokens + 2, DIM), torch.float32)
    ref_out, ref_state = causal_conv1d_reference(
        mixed_qkv[:meta.num_actual_tokens], conv1d.weight, conv1d.bias, conv_state,
        **reference)
    context._context.attn_metadata = {"layers.0": meta}
    before = bits(conv_state)
    launches = SYCL_STATE.stats["submitted"]
    result = {}
    # vLLM's custom op calls it with keywords
    layer._forward_core(mixed_qkv=mixed_qkv, b=None, a=None, core_attn_out=result)
    assert SYCL_STATE.stats["submitted"] - launches == (1 if whole_step else 2)
    assert result["gathered"] == [0 if whole_step else DIM] * 2
    assert_outputs_close(result["spec"], ref_out[reference["spec_token_indx"].numpy()],
                         torch.float32)
    assert_outputs_close(result["non_spec"],
                         ref_out[reference["non_spec_token_indx"].numpy()], torch.float32)
    assert_state_exact(conv_state, ref_state)
    assert torch.equal(bits(conv_state)[0], before[0]), "the null block was written"


@pytest.mark.parametrize("prefills", [True, False], ids=["prefills", "decodes"])
def test_gdn_layer_steps_without_spec_part(cpu_tensor_device, standin, prefills):
    """Whole-step mode on steps without spec part, outputs and cache against the
    reference, one launch: prefill chunks (with a decode) go through the layer's
    causal_conv1d_fn, which returns a new tensor as vLLM's does, so mixed_qkv is left as
    it was; decode-only steps through causal_conv1d_update, whose rows the layer reads
    from mixed_qkv afterwards, so they are written there."""
    vllm_plugin.install(whole_step=True)
    import vllm.forward_context as context
    import vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn as gdn
    import vllm.model_executor.layers.mamba.mamba_utils as utils
    utils.DIM_FIRST = False
    gen = torch.Generator().manual_seed(9)
    lengths = [5, 1, 7] if prefills else [1, 1, 1, 1]
    lines = torch.tensor([4, 9, 2, 6][:len(lengths)], dtype=torch.int32)
    initial = torch.tensor([False, True, True, True][:len(lengths)])
    meta = types.SimpleNamespace(
        num_prefills=2 if prefills else 0, num_decodes=1 if prefills else len(lengths),
        num_spec_decodes=0, num_actual_tokens=sum(lengths), spec_sequence_masks=None,
        spec_token_indx=None, non_spec_token_indx=None, spec_state_indices_tensor=None,
        spec_query_start_loc=None, num_accepted_tokens=None,
        non_spec_query_start_loc=cumulative(lengths), non_spec_state_indices_tensor=lines,
        has_initial_state=initial if prefills else None)
    cache = randn(gen, (12, WIDTH - 1 + NUM_SPEC, DIM), torch.float32)
    conv_state = cache.transpose(-1, -2)
    conv1d = types.SimpleNamespace(weight=randn(gen, (DIM, 1, WIDTH), torch.float32),
                                   bias=randn(gen, (DIM,), torch.float32))
    layer = gdn.QwenGatedDeltaNetAttention("layers.0", conv1d, [cache])
    mixed_qkv = randn(gen, (meta.num_actual_tokens + 2, DIM), torch.float32)
    given = bits(mixed_qkv)
    ref_out, ref_state = causal_conv1d_reference(
        mixed_qkv[:meta.num_actual_tokens], conv1d.weight, conv1d.bias, conv_state,
        non_spec_query_start_loc=meta.non_spec_query_start_loc,
        non_spec_state_indices=lines, has_initial_state=initial if prefills else None)
    context._context.attn_metadata = {"layers.0": meta}
    launches = SYCL_STATE.stats["submitted"]
    result = {}
    layer._forward_core(mixed_qkv=mixed_qkv, b=None, a=None, core_attn_out=result)
    assert SYCL_STATE.stats["submitted"] - launches == 1
    assert_outputs_close(result["non_spec"], ref_out, torch.float32)
    assert_state_exact(conv_state, ref_state)
    if prefills:
        assert torch.equal(bits(mixed_qkv), given), "mixed_qkv was written"


def test_whole_step_mode_reads_whether_the_stage_answers_the_layer(standin, caplog):
    """The stand-in layer's _forward_core calls the conv ops only (no rearrange_mixed_qkv
    or fused_post_conv_prep, which vLLM 0.32's calls): whole-step mode runs the conv
    alone there and says why, read from the installed layer
    (tests/test_real_vllm.py has the layer whose chain the stage answers)."""
    caplog.set_level(logging.INFO, logger=vllm_plugin.logger.name)
    replaced = vllm_plugin.install(whole_step=True)
    assert f"{vllm_plugin.GDN_MODULE}.{vllm_plugin.GDN_LAYER}._forward_core (whole-step " \
        "mode)" in replaced, replaced
    (line,) = [x for x in plugin_lines(caplog) if "whole-step mode runs the conv only" in x]
    assert "does not call rearrange_mixed_qkv, fused_post_conv_prep" in line, line


# ------------------------------------------------------ platforms and vLLM versions

def test_register_on_cuda_only_when_asked(standin, monkeypatch, caplog):
    """A CUDA platform: nothing replaced unless JITCONV_VLLM_ON_CUDA=1; with it, the
    CUDA checks run (this machine has no CUDA GPU: one line saying so)."""
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here: the plugin's no-GPU line cannot be seen")
    import vllm.platforms as platforms

    class CudaPlatform:
        def is_xpu(self):
            return False

        def is_cuda(self):
            return True
    monkeypatch.setattr(platforms, "current_platform", CudaPlatform())
    caplog.set_level(logging.INFO, logger=vllm_plugin.logger.name)
    monkeypatch.delenv(vllm_plugin.ON_CUDA_ENV, raising=False)
    assert vllm_plugin.register() == []
    monkeypatch.setenv(vllm_plugin.ON_CUDA_ENV, "1")
    assert not torch.cuda.is_available()
    assert vllm_plugin.register() == []
    lines = plugin_lines(caplog)
    assert len(lines) == 2, lines
    assert f"on CUDA only with {vllm_plugin.ON_CUDA_ENV}=1" in lines[0], lines
    assert "torch.cuda is not available" in lines[1], lines


def write_ops(standin, text):
    """Replace the stand-in's ops module (before anything imports it)."""
    path = standin / "vllm/model_executor/layers/mamba/ops/causal_conv1d.py"
    path.write_text(textwrap.dedent(text))


# vLLM 0.11's signatures: pad_slot_id and no null block, cache_seqlens in the update.
PAD_SLOT_OPS = """
    PAD_SLOT_ID = -1

    def causal_conv1d_fn(x, weight, bias, conv_states, query_start_loc, cache_indices=None,
                         has_initial_state=None, activation="silu", pad_slot_id=PAD_SLOT_ID,
                         metadata=None, validate_data=False):
        raise AssertionError("vLLM's causal_conv1d_fn was called")

    def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None,
                             cache_seqlens=None, conv_state_indices=None,
                             num_accepted_tokens=None, query_start_loc=None,
                             max_query_len=-1, pad_slot_id=PAD_SLOT_ID,
                             validate_data=False):
        raise AssertionError("vLLM's causal_conv1d_update was called")
    """


def test_install_follows_ops_without_a_null_block(cpu_tensor_device, standin, caplog):
    """Ops that take pad_slot_id and no null_block_id (vLLM 0.11's): the ops installed
    skip pad_slot_id (-1) lines and treat line 0 as a cache line, as those callers expect;
    a positional call binds by the installed op's order (cache_seqlens sixth: circular
    lines)."""
    write_ops(standin, PAD_SLOT_OPS)
    caplog.set_level(logging.INFO, logger=vllm_plugin.logger.name)
    assert vllm_plugin.install() == TARGET_NAMES
    line = plugin_lines(caplog)[0]
    assert "conventions read from the installed vLLM: pad slot -1 (causal_conv1d_update " \
        "takes pad_slot_id=-1" in line, line
    assert "refused" not in line, line  # cache_seqlens: circular lines
    import vllm.model_executor.layers.mamba.mamba_mixer2 as mixer
    gen = torch.Generator().manual_seed(32)
    lines = torch.tensor([0, -1, 3, 2], dtype=torch.int32)
    state = randn(gen, (5, DIM, WIDTH - 1), torch.float32)
    w, b = randn(gen, (DIM, WIDTH), torch.float32), randn(gen, (DIM,), torch.float32)
    x = randn(gen, (4, DIM), torch.float32)
    ref_out, ref_state = causal_conv1d_reference(
        x, w, b, state, non_spec_query_start_loc=[0, 1, 2, 3, 4],
        non_spec_state_indices=lines, activation="silu")
    before = bits(state)
    # every argument by position, in vLLM 0.11's order
    out = mixer.causal_conv1d_update(x.clone(), state, w, b, "silu", None, lines, None, None,
                                     -1, -1, False)
    assert_outputs_close(out, ref_out, torch.float32)
    assert_state_exact(state, ref_state)
    assert not torch.equal(bits(state)[0], before[0]), "line 0 was skipped"
    # causal_conv1d_fn: one prefill sequence on line 0, one pad
    qsl = torch.tensor([0, 3, 5], dtype=torch.int32)
    tokens = randn(gen, (5, DIM), torch.float32)
    fn_lines = torch.tensor([0, -1], dtype=torch.int32)
    ref_out, ref_state = causal_conv1d_reference(
        tokens, w, b, state, non_spec_query_start_loc=qsl, non_spec_state_indices=fn_lines,
        has_initial_state=torch.tensor([True, True]), activation="silu")
    out = mixer.causal_conv1d_fn(tokens.t(), w, b, state, qsl, fn_lines,
                                 torch.tensor([True, True]))
    assert_outputs_close(out.t(), ref_out, torch.float32)
    assert_state_exact(state, ref_state)
    # cache_seqlens (sixth): circular lines, as Dao-AILab/causal-conv1d's op defines them
    counts = torch.tensor([1, 0, 5, 2], dtype=torch.int32)
    ref_out, ref_state = causal_conv1d_reference(
        x, w, b, state, non_spec_query_start_loc=[0, 1, 2, 3, 4],
        non_spec_state_indices=lines, non_spec_cache_seqlens=counts, activation="silu")
    out = mixer.causal_conv1d_update(x.clone(), state, w, b, "silu", counts, lines)
    assert_outputs_close(out, ref_out, torch.float32)
    assert_state_exact(state, ref_state)


# vLLM 0.32's signatures: the null block and the prefix-caching arguments.
PREFIX_CACHING_OPS = """
    NULL_BLOCK_ID, PAD_SLOT_ID = 0, -1

    def causal_conv1d_fn(x, weight, bias, conv_states, query_start_loc, cache_indices=None,
                         has_initial_state=None, activation="silu", pad_slot_id=PAD_SLOT_ID,
                         null_block_id=NULL_BLOCK_ID, block_idx_first_scheduled_token=None,
                         block_idx_last_scheduled_token=None, initial_state_idx=None,
                         num_computed_tokens=None, block_size_to_align=0, metadata=None,
                         validate_data=False):
        raise AssertionError("vLLM's causal_conv1d_fn was called")

    def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None,
                             conv_state_indices=None, num_accepted_tokens=None,
                             query_start_loc=None, max_query_len=-1,
                             null_block_id=NULL_BLOCK_ID, block_idx_last_scheduled_token=None,
                             initial_state_idx=None, validate_data=False, out=None):
        raise AssertionError("vLLM's causal_conv1d_update was called")
    """


def _prefix_caching_step(gen):
    """Two prefill chunks of vLLM 0.32's prefix caching in 'all' mode (block size 16),
    with the rules they mean worked out by hand: sequence 0 (20 tokens after 10) starts
    in block 0 of its table row and ends in block 1 (one boundary, at position 6, into
    block 0: the line it read); sequence 1 (40 tokens after 32, its state read from
    block 1's line) crosses blocks 2, 3, 4 (boundaries at positions 16 and 32 into blocks
    2 and 3). Unused entries hold the null block 0."""
    table = torch.tensor([[4, 7, 0, 0, 0], [0, 5, 9, 1, 6]], dtype=torch.int32)
    apc = dict(block_idx_first_scheduled_token=torch.tensor([0, 2], dtype=torch.int32),
               block_idx_last_scheduled_token=torch.tensor([1, 4], dtype=torch.int32),
               initial_state_idx=torch.tensor([0, 1], dtype=torch.int32),
               num_computed_tokens=torch.tensor([10, 32], dtype=torch.int32),
               block_size_to_align=16)
    rules = dict(non_spec_state_indices=[4, 5], non_spec_write_indices=[7, 6],
                 non_spec_checkpoint_loc=[0, 1, 3], non_spec_checkpoint_pos=[6, 16, 32],
                 non_spec_checkpoint_indices=[4, 9, 1])
    qsl = torch.tensor([0, 20, 60], dtype=torch.int32)
    return table, apc, rules, qsl


def test_installed_op_runs_prefix_caching(cpu_tensor_device, standin):
    """vLLM 0.32's prefix-caching arguments, given to the installed ops (by keyword, and
    the update's by position): the read line, the write line and every block-boundary
    checkpoint as SEMANTICS.md translates them, in one launch, against the reference
    (states bit-exact, everything else untouched)."""
    write_ops(standin, PREFIX_CACHING_OPS)
    assert vllm_plugin.install() == TARGET_NAMES
    import vllm.model_executor.layers.mamba.mamba_mixer2 as mixer
    gen = torch.Generator().manual_seed(3)
    table, apc, rules, qsl = _prefix_caching_step(gen)
    state = randn(gen, (12, DIM, WIDTH - 1), torch.float32)
    w, b = randn(gen, (DIM, WIDTH), torch.float32), randn(gen, (DIM,), torch.float32)
    tokens = randn(gen, (60, DIM), torch.float32)
    init = torch.tensor([True, False])
    ref_out, ref_state = causal_conv1d_reference(
        tokens, w, b, state, non_spec_query_start_loc=qsl, has_initial_state=init,
        activation="silu", **rules)
    out = mixer.causal_conv1d_fn(tokens.t(), w, b, state, qsl, table, init, **apc)
    assert_outputs_close(out.t(), ref_out, torch.float32)
    assert_state_exact(state, ref_state)
    # the update: decodes read column initial_state_idx, write block_idx_last_...
    state = randn(gen, (12, DIM, WIDTH - 1), torch.float32)
    x = randn(gen, (2, DIM), torch.float32)
    last = torch.tensor([1, 3], dtype=torch.int32)
    initial = torch.tensor([0, 2], dtype=torch.int32)
    ref_out, ref_state = causal_conv1d_reference(
        x, w, b, state, non_spec_query_start_loc=[0, 1, 2], non_spec_state_indices=[4, 9],
        non_spec_write_indices=[7, 1], activation="silu")
    positional = [x.clone(), state, w, b, "silu", table, None, None, -1, 0, last, initial]
    out = mixer.causal_conv1d_update(*positional)
    assert_outputs_close(out, ref_out, torch.float32)
    assert_state_exact(state, ref_state)


@pytest.mark.parametrize("bad, error, message", [
    ("no_last", ValueError, "^initial_state_idx: given without "
                            "block_idx_last_scheduled_token"),
    ("no_first", ValueError, "^block_idx_first_scheduled_token: required with "
                             "block_idx_last_scheduled_token"),
    ("align", ValueError, "^block_size_to_align: expected a positive multiple of 8"),
    ("column", ValueError, "^block_idx_last_scheduled_token: entry 1 is 5; expected a "
                           "column of the block table in \\[0, 5\\)"),
    ("boundary", ValueError, "^block_idx_first_scheduled_token / num_computed_tokens: "
                             "sequence 1"),
    ("one_d", ValueError, "^cache_indices: expected vLLM's 2-D block table"),
    ("written_twice", ValueError, "cache line 6 is written twice"),
])
def test_bad_prefix_caching_is_refused_by_name(cpu_tensor_device, standin, bad, error,
                                               message):
    """Prefix-caching arguments that vLLM would misread: an error naming vLLM's argument
    before anything runs, conv_state untouched."""
    write_ops(standin, PREFIX_CACHING_OPS)
    vllm_plugin.install()
    import vllm.model_executor.layers.mamba.mamba_mixer2 as mixer
    gen = torch.Generator().manual_seed(5)
    table, apc, _rules, qsl = _prefix_caching_step(gen)
    state = randn(gen, (12, DIM, WIDTH - 1), torch.float32)
    w = randn(gen, (DIM, WIDTH), torch.float32)
    tokens = randn(gen, (DIM, 60), torch.float32)
    if bad == "no_last":
        apc = dict(initial_state_idx=apc["initial_state_idx"])
    elif bad == "no_first":
        apc["block_idx_first_scheduled_token"] = None
    elif bad == "align":
        apc["block_size_to_align"] = 12
    elif bad == "column":
        apc["block_idx_last_scheduled_token"] = torch.tensor([1, 5], dtype=torch.int32)
    elif bad == "boundary":
        apc["num_computed_tokens"] = torch.tensor([10, 12], dtype=torch.int32)
    elif bad == "one_d":
        table = table[:, 0]
    elif bad == "written_twice":
        table[0, 1] = 6
    before = bits(state)
    with pytest.raises(error, match=message):
        mixer.causal_conv1d_fn(tokens, w, None, state, qsl, table, None, **apc)
    assert torch.equal(bits(state), before)


def test_a_block_table_without_prefix_caching_means_column_0(cpu_tensor_device, standin):
    """vLLM's kernels read column 0 of a 2-D cache_indices when no block index is given:
    so does the installed causal_conv1d_fn."""
    write_ops(standin, PREFIX_CACHING_OPS)
    vllm_plugin.install()
    import vllm.model_executor.layers.mamba.mamba_mixer2 as mixer
    gen = torch.Generator().manual_seed(6)
    table, _apc, _rules, qsl = _prefix_caching_step(gen)
    state = randn(gen, (12, DIM, WIDTH - 1), torch.float32)
    w = randn(gen, (DIM, WIDTH), torch.float32)
    tokens = randn(gen, (60, DIM), torch.float32)
    table[1, 0] = 2
    ref_out, ref_state = causal_conv1d_reference(
        tokens, w, None, state, non_spec_query_start_loc=qsl, non_spec_state_indices=[4, 2],
        activation="silu")
    out = mixer.causal_conv1d_fn(tokens.t(), w, None, state, qsl, table)
    assert_outputs_close(out.t(), ref_out, torch.float32)
    assert_state_exact(state, ref_state)


def test_install_refuses_ops_with_an_argument_jitconv_does_not_know(standin, caplog):
    """An installed op taking an argument jitconv has never heard of: nothing replaced,
    one line naming it (a caller passing it would otherwise be served wrongly)."""
    write_ops(standin, PREFIX_CACHING_OPS.replace(
        "validate_data=False, out=None)", "validate_data=False, out=None, tree_mask=None)"))
    caplog.set_level(logging.INFO, logger=vllm_plugin.logger.name)
    assert vllm_plugin.install() == []
    (line,) = plugin_lines(caplog)
    assert "causal_conv1d_update in " in line and "takes tree_mask, which jitconv does " \
        "not know; vLLM's conv ops left as they are" in line, line
    import vllm.model_executor.layers.mamba.mamba_mixer2 as mixer
    assert not hasattr(mixer.causal_conv1d_update, vllm_plugin.INSTALLED_MARK)


@pytest.mark.parametrize("backend, reaches", [("triton", True), ("sycl", False)])
def test_gdn_route_is_logged_on_xpu(standin, caplog, backend, reaches):
    """On XPU (the stand-in's platform), each route a Qwen GDN layer takes is logged once,
    as the layers are built: the Triton route reaches jitconv, the fused SYCL op does not
    (and the line says how to choose)."""
    caplog.set_level(logging.INFO, logger=vllm_plugin.logger.name)
    vllm_plugin.install()
    import vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn as gdn
    for _ in range(3):
        layer = gdn.QwenGatedDeltaNetAttention("layers.0", None, [], gdn_xpu_backend=backend)
    assert vllm_plugin.gdn_route(layer)[0] is reaches
    lines = plugin_lines(caplog)[1:]
    assert len(lines) == 1, lines
    if reaches:
        assert "take the Triton route (gdn_xpu_backend='triton'): their conv runs on " \
            "jitconv" in lines[0], lines
    else:
        assert "run the fused SYCL op torch.ops._xpu_C.gdn_attention (gdn_xpu_backend=" \
            "'sycl'): their conv does not reach jitconv; start vLLM with " \
            "--gdn-prefill-backend triton" in lines[0], lines


# ------------------------------------------------- the ops files of real vLLM releases

# What the plugin must read from each release's ops file: the convention and skipped
# line, and the arguments refused per op. 0.19.0 is the last release without the null
# block.
RELEASES = {
    "0.11.0": ("pad slot", -1, [], []),
    "0.19.0": ("pad slot", -1, [], []),
    "0.32.0": ("null block", 0, [], []),
    "0.33.0": ("null block", 0, [], []),
    "0.34.0": ("null block", 0, [], []),
}
OPS_FILE = "vllm/model_executor/layers/mamba/ops/causal_conv1d.py"
RELEASE_CACHE = Path(__file__).resolve().parents[1] / ".vllm-ops"


def release_ops(version):
    """(ops file text, its module constants) of vLLM ``version``, read out of its wheel
    (``pip download --no-deps``, nothing installed); kept in .vllm-ops/ at the repo root
    (never committed). The constants are the literal assignments of the module the ops
    file imports NULL_BLOCK_ID / PAD_SLOT_ID from."""
    cache = RELEASE_CACHE / version
    if not (cache / "constants.json").exists():
        with tempfile.TemporaryDirectory() as tmp:
            run_checked([sys.executable, "-m", "pip", "download", "--no-deps", "-q",
                         "--only-binary", ":all:", "--disable-pip-version-check", "-d", tmp,
                         f"vllm=={version}"], timeout=900)
            (wheel,) = Path(tmp).glob("vllm-*.whl")
            with zipfile.ZipFile(wheel) as archive:
                text = archive.read(OPS_FILE).decode()
                constants = {}
                for node in ast.parse(text).body:
                    if isinstance(node, ast.ImportFrom) and {"NULL_BLOCK_ID", "PAD_SLOT_ID"} \
                            & {a.name for a in node.names}:
                        source = archive.read(node.module.replace(".", "/") + ".py").decode()
                        for assign in ast.parse(source).body:
                            if isinstance(assign, ast.Assign) and \
                                    isinstance(assign.targets[0], ast.Name):
                                try:
                                    constants[assign.targets[0].id] = \
                                        ast.literal_eval(assign.value)
                                except ValueError:
                                    pass
        cache.mkdir(parents=True, exist_ok=True)
        (cache / "causal_conv1d.py").write_text(text)
        (cache / "constants.json").write_text(json.dumps(constants))
    return ((cache / "causal_conv1d.py").read_text(),
            json.loads((cache / "constants.json").read_text()))


@pytest.mark.slow
@pytest.mark.parametrize("version", sorted(RELEASES))
def test_conventions_read_from_real_release_files(cpu_tensor_device, version):
    """The ops file of each release, read as the plugin reads an installed one: the
    convention, the refused arguments, and the replacements built for its signatures,
    called with every argument by position in that release's order (null block or pad
    line, and a sequence on line 0) against the reference."""
    convention, skipped, fn_refused, update_refused = RELEASES[version]
    text, constants = release_ops(version)
    unresolved = installed.read_source(text, f"vllm {version}")
    assert unresolved.convention == convention
    assert isinstance(unresolved.skipped_line, installed.Unresolved)  # a name, no value
    ops = installed.read_source(text, f"vllm {version}", constants)
    assert (ops.convention, ops.skipped_line) == (convention, skipped)
    assert vllm_plugin.refused_arguments(ops) == {"causal_conv1d_fn": fn_refused,
                                                  "causal_conv1d_update": update_refused}
    made = vllm_plugin.replacements(ops)
    gen = torch.Generator().manual_seed(11)
    state = randn(gen, (5, DIM, WIDTH - 1), torch.float32)
    w, b = randn(gen, (DIM, WIDTH), torch.float32), randn(gen, (DIM,), torch.float32)
    x = randn(gen, (4, DIM), torch.float32)
    lines = torch.tensor([0, skipped, 3, 2], dtype=torch.int32)  # line 0 real, or null
    reference_lines = lines.clone()
    if convention == "null block":
        reference_lines[lines == 0] = -1
    ref_out, ref_state = causal_conv1d_reference(
        x, w, b, state, non_spec_query_start_loc=[0, 1, 2, 3, 4],
        non_spec_state_indices=reference_lines.clamp(min=-1), activation="silu")
    given = dict(x=x.clone(), conv_state=state, weight=w, bias=b, activation="silu",
                 conv_state_indices=lines)
    signature = ops.update
    positional = [given.get(p, dict(signature.defaults).get(p)) for p in signature.parameters]
    out = made["causal_conv1d_update"](*positional)
    ref_out[reference_lines.numpy() == -1] = 0  # skipped sequences: zeros
    assert_outputs_close(out, ref_out, torch.float32)
    assert_state_exact(state, ref_state)
