"""The GDN conv stage as one op (SEMANTICS.md "The GDN conv stage"): a Gated DeltaNet
layer's conv, state update, q / k / v split in head layout, l2norm of q and k, and gates,
for every part of an engine step, in one launch. ``StepPlan.run_stage`` runs it on a
plan; ``gdn_conv_stage`` is a plan (kept by the metadata's content) and one run."""

from typing import Any, Optional

from jitconv.api import plan_cache
from jitconv.api.metadata import StepMetadata
from jitconv.api.ops import plan_from, prepare
from jitconv.api.plan import StageResult


def gdn_conv_stage(x: Any, weight: Any, bias: Optional[Any], conv_state: Any, a: Any,
                   b: Any, A_log: Any, dt_bias: Any, *, num_k_heads: int, head_k_dim: int,
                   head_v_dim: int, use_l2norm: Any = True, exp_g: bool = False,
                   activation: Optional[str] = "silu", math: Optional[str] = None,
                   pad_slot_id: int = -1, **metadata: Any) -> StageResult:
    """The conv stage of a Gated DeltaNet layer for one engine step, in one launch.

    Parameters
    ----------
    x : tensor, (num_tokens, dim)
        mixed_qkv: per token [q | k | v] with dim = 2 * num_k_heads * head_k_dim +
        num_v_heads * head_v_dim (the layer's flat layout).
    weight, bias, conv_state, activation, math, pad_slot_id
        As in ``jitconv.causal_conv1d_mixed``; conv_state is updated in place.
    a, b : tensors, (num_tokens, num_v_heads)
        The gate inputs per token, in x's dtype, heads contiguous (views of one
        projection output are fine).
    A_log, dt_bias : tensors, (num_v_heads,)
        Floating; used as float32.
    num_k_heads, head_k_dim, head_v_dim : int
        The heads; num_v_heads is len(A_log).
    use_l2norm : bool, part names, or {part name: first row}
        Divide each q and k head by sqrt(sum of its squares + 1e-6) (vLLM's eps): in
        both parts (True), neither (False), every row of the parts named (e.g.
        ("non_spec",)), or a part's rows from the one given on, which must begin one of
        its sequences (e.g. {"non_spec": 3}: vLLM normalises only the prefill tokens of
        its non-spec part, which follow its decodes, and leaves the decodes' and the
        spec part's to the recurrent kernels).
    exp_g : bool
        Return exp(g) instead of g.
    **metadata
        The step: ``jitconv.causal_conv1d_mixed``'s metadata keywords (parts, token
        maps, accepted counts, parent maps, write lines, checkpoints). Not intermediate
        windows (no ``intermediate_windows`` argument here).

    Returns
    -------
    StageResult(spec, non_spec)
        Each part's ``StageOutputs(q, k, v, g, beta)``, row k its k-th token in the
        part's token order (as split outputs): q, k (tokens, num_k_heads, head_k_dim), v
        (tokens, num_v_heads, head_v_dim) contiguous in x's dtype, g and beta (tokens,
        num_v_heads) float32; None for a part without tokens. A padded sequence's tokens
        get zero q, k and v.

    Runs on CUDA devices (head_k_dim 32, 64, 128 or 256) and SYCL devices (head_k_dim up
    to 256); a device that cannot take the heads says so by name. Every argument is checked before anything is launched; a bad one raises and
    leaves conv_state as it was.
    """
    meta = StepMetadata.of(metadata)
    geo, checked = prepare(x, weight, bias, conv_state, None, activation, math, pad_slot_id)
    plan = plan_cache.plan_for(plan_cache.key("mixed", geo, meta.all_values()),
                               lambda: plan_from(meta, geo))
    return plan.run_stage(x, weight, bias, conv_state, a, b, A_log, dt_bias,
                          num_k_heads=num_k_heads, head_k_dim=head_k_dim,
                          head_v_dim=head_v_dim, use_l2norm=use_l2norm, exp_g=exp_g,
                          activation=activation, math=math, checked=checked)
