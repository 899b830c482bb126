"""Drop-in entry points with vLLM's own argument conventions.

vLLM's GDN / Mamba layers call ``causal_conv1d_fn`` (prefill, x channel-major) and
``causal_conv1d_update`` (decode / spec verify) from
``vllm.model_executor.layers.mamba.ops.causal_conv1d``. The functions here take the same
arguments and return the same shapes, mapped onto jitconv's single-launch machinery, so
an XPU build can call them where it calls the Triton ops. ``gdn_conv_step`` goes further:
it takes a whole engine step (spec and non-spec tokens together) straight from vLLM's
``GDNAttentionMetadata`` in one launch, which is what the C++ XPU kernel could not do.

Not supported (raise NotImplementedError): automatic prefix caching block indices
(block_idx_*, initial_state_idx, num_computed_tokens) and EAGLE tree verification
(retrieve_parent_token).
"""

import torch

from . import ops

PAD_SLOT_ID = -1


def _activation(activation):
    if isinstance(activation, bool):
        return "silu" if activation else None
    return activation


def _unsupported(**features):
    for name, value in features.items():
        if value is not None:
            raise NotImplementedError(
                f"{name}: jitconv does not support vLLM's prefix-caching / EAGLE-tree "
                f"arguments; pass None")


def _to_state_dtype(conv_state, *tensors):
    """vLLM's kernels compute in the conv cache's dtype (mamba_cache_dtype may differ from
    the model's): x, weight and bias are converted to it, as the Triton ops do for x and
    read weight/bias in any dtype. Weights are tiny; None stays None."""
    return [None if t is None else t.to(conv_state.dtype) for t in tensors]


def _lines(indices, batch, device):
    if indices is not None:
        return indices
    return torch.arange(batch, dtype=torch.int32, device=device)


def causal_conv1d_fn(x, weight, bias, conv_states, query_start_loc, cache_indices=None,
                     has_initial_state=None, activation="silu", pad_slot_id=PAD_SLOT_ID,
                     block_idx_first_scheduled_token=None,
                     block_idx_last_scheduled_token=None, initial_state_idx=None,
                     num_computed_tokens=None, block_size_to_align=0, metadata=None,
                     validate_data=False):
    """vLLM's prefill op. x: (dim, cu_seqlen) (usually a transposed token-major view);
    conv_states: (lines, dim, state_len) view, updated in place. Returns (dim, cu_seqlen)
    in x's dtype. ``metadata`` and ``block_size_to_align`` only tune Triton launches and
    are ignored; validation always runs (``validate_data`` is accepted for compatibility).
    """
    _unsupported(block_idx_first_scheduled_token=block_idx_first_scheduled_token,
                 block_idx_last_scheduled_token=block_idx_last_scheduled_token,
                 initial_state_idx=initial_state_idx,
                 num_computed_tokens=num_computed_tokens)
    original_dtype = x.dtype
    # (cu_seqlen, dim): a view when no conversion is needed
    tokens, weight, bias = _to_state_dtype(conv_states, x.transpose(0, 1), weight, bias)
    batch = int(query_start_loc.shape[0]) - 1
    used = int(query_start_loc[-1])
    token_indx = None
    if used != tokens.shape[0]:  # vLLM tolerates padded x: extra rows come out zero here
        token_indx = torch.arange(used, dtype=torch.int32)
    out = ops.causal_conv1d_fn(tokens, weight, bias, conv_states, query_start_loc,
                               _lines(cache_indices, batch, x.device), has_initial_state,
                               activation=_activation(activation), pad_slot_id=pad_slot_id,
                               token_indx=token_indx)
    return out.transpose(0, 1).to(original_dtype)


def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None,
                         conv_state_indices=None, num_accepted_tokens=None,
                         query_start_loc=None, max_query_len=-1, pad_slot_id=PAD_SLOT_ID,
                         block_idx_last_scheduled_token=None, initial_state_idx=None,
                         retrieve_parent_token=None, validate_data=False):
    """vLLM's decode op. x is (batch, dim) (one token each), (batch, dim, seqlen), or
    (num_tokens, dim) with ``query_start_loc`` (varlen). conv_state: (lines, dim,
    state_len) view. With ``num_accepted_tokens`` the spec-decode sliding-window rule
    applies. Returns a new tensor of x's shape and dtype; padded entries come out zero.
    """
    _unsupported(block_idx_last_scheduled_token=block_idx_last_scheduled_token,
                 initial_state_idx=initial_state_idx,
                 retrieve_parent_token=retrieve_parent_token)
    original_dtype = x.dtype
    x, weight, bias = _to_state_dtype(conv_state, x, weight, bias)
    activation = _activation(activation)
    if query_start_loc is not None:
        batch = int(query_start_loc.shape[0]) - 1
        tokens, restore = x, (lambda y: y)
        qsl = query_start_loc
    elif x.dim() == 2:
        batch = x.shape[0]
        tokens, restore, qsl = x, (lambda y: y), None
    else:
        batch, dim, seqlen = x.shape
        # (batch, dim, seqlen) -> token-major (batch * seqlen, dim); reshape copies only
        # when the strides do not allow a view.
        tokens = x.transpose(1, 2).reshape(batch * seqlen, dim)
        qsl = torch.arange(0, batch * seqlen + 1, seqlen, dtype=torch.int32)

        def restore(y):
            return y.reshape(batch, seqlen, dim).transpose(1, 2)
    out = ops.causal_conv1d_update(tokens, weight, bias, conv_state,
                                   _lines(conv_state_indices, batch, x.device),
                                   query_start_loc=qsl,
                                   num_accepted_tokens=num_accepted_tokens,
                                   activation=activation, pad_slot_id=pad_slot_id)
    return restore(out).to(original_dtype)


def gdn_conv_step(mixed_qkv, weight, bias, conv_state, attn_metadata, activation="silu",
                  pad_slot_id=PAD_SLOT_ID, non_spec_num_accepted_tokens=None):
    """The conv of one GDN layer for a whole engine step, from vLLM's GDNAttentionMetadata.

    mixed_qkv: (num_tokens, conv_dim) projection output (rows beyond
    ``attn_metadata.num_actual_tokens`` are padding and come out zero); conv_state: the
    layer's conv cache viewed as (lines, conv_dim, state_len) (vLLM:
    ``self.kv_cache[...][0].transpose(-1, -2)``). Prefill chunks, plain decodes and spec
    verify sequences are done in ONE launch. Computes in conv_state's dtype like vLLM's
    ops; returns (num_tokens, conv_dim) in mixed_qkv's dtype.
    """
    m = attn_metadata
    has_spec = getattr(m, "spec_query_start_loc", None) is not None
    has_non_spec = getattr(m, "non_spec_query_start_loc", None) is not None
    kwargs = {}
    if has_non_spec:
        kwargs.update(non_spec_query_start_loc=m.non_spec_query_start_loc,
                      non_spec_state_indices=m.non_spec_state_indices_tensor,
                      has_initial_state=m.has_initial_state,
                      non_spec_num_accepted_tokens=non_spec_num_accepted_tokens)
    if has_spec:
        kwargs.update(spec_query_start_loc=m.spec_query_start_loc,
                      spec_state_indices=m.spec_state_indices_tensor,
                      num_accepted_tokens=m.num_accepted_tokens)
    if has_spec and has_non_spec:
        # vLLM gives row maps only when both kinds are present.
        kwargs.update(non_spec_token_indx=m.non_spec_token_indx,
                      spec_token_indx=m.spec_token_indx)
    else:
        actual = int(getattr(m, "num_actual_tokens", mixed_qkv.shape[0]))
        if actual != mixed_qkv.shape[0]:  # padded batch: map the real rows explicitly
            rows = torch.arange(actual, dtype=torch.int32)
            kwargs["spec_token_indx" if has_spec else "non_spec_token_indx"] = rows
    original_dtype = mixed_qkv.dtype
    mixed_qkv, weight, bias = _to_state_dtype(conv_state, mixed_qkv, weight, bias)
    lines, _dim, state_len = conv_state.shape
    geometry = (int(mixed_qkv.shape[0]), int(lines), int(state_len), int(weight.shape[-1]),
                int(pad_slot_id))
    plan = _step_plan(m, geometry, non_spec_num_accepted_tokens, kwargs)
    out = plan.run(mixed_qkv, weight, bias, conv_state, activation=_activation(activation))
    return out.to(original_dtype)


def _step_plan(attn_metadata, geometry, extra, kwargs):
    """The plan of this step for this geometry: built by the first layer that asks, kept
    on the metadata object (vLLM builds a new one every step), reused by every later
    layer, so the metadata is validated and read back once per step, not once per layer.
    Objects that take no new attributes just get a plan per call."""
    plans = getattr(attn_metadata, "_jitconv_plans", None)
    if plans is None:
        plans = {}
        try:
            attn_metadata._jitconv_plans = plans
        except AttributeError:
            pass
    cached = plans.get(geometry)
    if cached is not None and cached[0] is extra:
        return cached[1]
    num_tokens, lines, state_len, width, pad_slot_id = geometry
    plan = ops.plan(num_tokens, lines, state_len, width, pad_slot_id=pad_slot_id, **kwargs)
    plans[geometry] = (extra, plan)  # `extra`: the plan is valid for this object only
    return plan


__all__ = ["causal_conv1d_fn", "causal_conv1d_update", "gdn_conv_step", "PAD_SLOT_ID"]
