"""The vLLM drop-ins as torch custom ops (``torch.ops.jitconv.vllm_*``), and the public
drop-ins that route to them while torch.compile traces (as ``jitconv.integrations.
torch_ops`` does for the core ops): eagerly ``jitconv.vllm.dropins``' functions, inside a
compiled function one opaque op each, mutations declared."""

from typing import Optional

import torch
from torch import Tensor
from torch.library import custom_op

from jitconv.integrations.torch_ops import as_tensor, compile_aware
from jitconv.vllm import dropins
from jitconv.vllm.conventions import DEFAULT, NULL_BLOCK_ID, PAD_SLOT_ID, skipped_ids


@custom_op("jitconv::vllm_causal_conv1d_fn", mutates_args=("conv_states",))
def fn_op(x: Tensor, weight: Tensor, bias: Optional[Tensor], conv_states: Tensor,
          query_start_loc: Tensor, cache_indices: Optional[Tensor],
          has_initial_state: Optional[Tensor], activation: Optional[str],
          pad_slot_id: Optional[int], null_block_id: Optional[int]) -> Tensor:
    return dropins.causal_conv1d_fn(x, weight, bias, conv_states, query_start_loc,
                                    cache_indices, has_initial_state, activation,
                                    pad_slot_id, null_block_id)


@fn_op.register_fake
def _(x, *args):
    return torch.empty(tuple(x.shape), dtype=x.dtype, device=x.device)  # (dim, tokens)


@custom_op("jitconv::vllm_causal_conv1d_update", mutates_args=("x", "conv_state", "out"))
def update_op(x: Tensor, conv_state: Tensor, weight: Tensor, bias: Optional[Tensor],
              activation: Optional[str], conv_state_indices: Optional[Tensor],
              num_accepted_tokens: Optional[Tensor], query_start_loc: Optional[Tensor],
              max_query_len: int, null_block_id: Optional[int], pad_slot_id: Optional[int],
              out: Optional[Tensor]) -> None:
    # Written into out, or into x when out is None (vLLM's convention): both declared
    # mutated, the caller returns the one written.
    dropins.causal_conv1d_update(x, conv_state, weight, bias, activation,
                                 conv_state_indices, num_accepted_tokens, query_start_loc,
                                 max_query_len, null_block_id=null_block_id, out=out,
                                 pad_slot_id=pad_slot_id)


@update_op.register_fake
def _(*args):
    return None


# Where the prefix-caching arguments are refused (vLLM calls the conv inside its opaque
# layer ops, so only a caller's own torch.compile'd code reaches this).
_COMPILED = "in jitconv's custom op for torch.compile'd graphs (device metadata)"


def _traced_fn(x, weight, bias, conv_states, query_start_loc, cache_indices=None,
               has_initial_state=None, activation="silu", pad_slot_id=PAD_SLOT_ID,
               null_block_id=NULL_BLOCK_ID, metadata=None, validate_data=False, *,
               block_idx_first_scheduled_token=None, block_idx_last_scheduled_token=None,
               initial_state_idx=None, num_computed_tokens=None, block_size_to_align=0):
    dropins.refuse_prefix_caching(
        _COMPILED, block_idx_first_scheduled_token=block_idx_first_scheduled_token,
        block_idx_last_scheduled_token=block_idx_last_scheduled_token,
        initial_state_idx=initial_state_idx, num_computed_tokens=num_computed_tokens,
        block_size_to_align=block_size_to_align)
    if cache_indices is not None and getattr(cache_indices, "ndim", 1) != 1:
        raise NotImplementedError(
            f"cache_indices: a {cache_indices.ndim}-D block table is not implemented "
            f"{_COMPILED}. Expected shape (batch,); the eager drop-in takes it")
    return torch.ops.jitconv.vllm_causal_conv1d_fn(
        x, weight, bias, conv_states, as_tensor(query_start_loc), as_tensor(cache_indices),
        as_tensor(has_initial_state), dropins.activation_name(activation), pad_slot_id,
        null_block_id)


def _traced_update(x, conv_state, weight, bias=None, activation=None,
                   conv_state_indices=None, num_accepted_tokens=None, query_start_loc=None,
                   max_query_len=-1, null_block_id=DEFAULT, validate_data=False, out=None,
                   pad_slot_id=None, *, block_idx_last_scheduled_token=None,
                   initial_state_idx=None, retrieve_parent_token=None, cache_seqlens=None):
    if cache_seqlens is not None:
        raise NotImplementedError(
            f"cache_seqlens: circular lines are not implemented {_COMPILED}. Expected "
            f"None; the eager drop-in takes them")
    dropins.refuse_prefix_caching(
        _COMPILED, block_idx_last_scheduled_token=block_idx_last_scheduled_token,
        initial_state_idx=initial_state_idx)
    if retrieve_parent_token is not None:
        raise NotImplementedError(
            "retrieve_parent_token: EAGLE tree verify runs in eager code only (vLLM calls "
            "the conv inside its opaque layer op); jitconv's custom op for torch.compile'd "
            "graphs takes no parent map. Expected None here")
    null_block_id, pad_slot_id = skipped_ids(null_block_id, pad_slot_id)
    torch.ops.jitconv.vllm_causal_conv1d_update(
        x, conv_state, weight, bias, dropins.activation_name(activation),
        as_tensor(conv_state_indices), as_tensor(num_accepted_tokens),
        as_tensor(query_start_loc), int(max_query_len), null_block_id, pad_slot_id, out)
    return x if out is None else out


causal_conv1d_fn = compile_aware(dropins.causal_conv1d_fn, _traced_fn)
causal_conv1d_update = compile_aware(dropins.causal_conv1d_update, _traced_update)
