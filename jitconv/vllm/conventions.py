"""vLLM's batch conventions (as of vLLM 0.33), turned into the core ops' arguments.

The core ops (``jitconv.causal_conv1d_*``) mark a padded sequence with ``pad_slot_id``
(zeros out, state untouched) and reject anything else unusual. vLLM's kernels follow
other rules, and its callers rely on them:

- a sequence whose cache line equals ``null_block_id`` (NULL_BLOCK_ID = 0) is skipped:
  no state read or write, and any number of sequences may carry it; vLLM up to 0.19
  instead marked such sequences with ``pad_slot_id`` (PAD_SLOT_ID = -1), line 0 being a
  cache line like any other (``skipped_ids``);
- a sequence with zero tokens is skipped (state untouched);
- ``causal_conv1d_update`` takes its batch from ``conv_state_indices``: a longer
  ``query_start_loc`` (FULL-graph padding repeats its last value), a longer
  ``num_accepted_tokens`` and extra rows of x are tolerated and ignored.

Here such sequences become the core's pads (``CORE_PAD``) and the metadata is cut to the
batch, so the core ops keep their own validation: whatever is not one of these cases
still raises a named error before anything is launched. Everything runs on the host, on
int64 numpy copies of the metadata.
"""

import numpy as np
import torch

from jitconv.api import validation
from jitconv.api.metadata import StepMetadata

NULL_BLOCK_ID = 0   # vLLM's padding cache line (vllm.v1.attention.backends.utils)
PAD_SLOT_ID = -1    # vLLM's PAD_SLOT_ID: causal_conv1d_fn skips it too
CORE_PAD = -1       # what the core ops are given for a skipped sequence


def query_start_loc(values, batch, name):
    """query_start_loc cut to ``batch`` sequences (vLLM may pass a longer one whose tail
    repeats its last value). ``batch`` None keeps every sequence."""
    qsl = validation.host_ints(values, name)
    validation.check_query_start_loc(qsl, name)
    if batch is None:
        return qsl
    if len(qsl) < batch + 1:
        raise ValueError(f"{name}: expected at least {batch + 1} entries (batch + 1, the "
                         f"batch being the number of cache lines given), got {len(qsl)}")
    return qsl[:batch + 1]


def first_entries(values, batch, name):
    """The first ``batch`` entries of a per-sequence array (vLLM may pass a longer,
    padded one; its kernels read only the first ``batch``)."""
    arr = validation.host_ints(values, name)
    if len(arr) < batch:
        raise ValueError(f"{name}: expected at least {batch} entries (one per sequence), "
                         f"got {len(arr)}")
    return arr[:batch]


def leading_entries(values, batch, name):
    """``first_entries`` without reading the values: a tensor (on any device) is sliced,
    anything else made an array first; None stays None."""
    if values is None:
        return None
    if not isinstance(values, torch.Tensor):
        values = np.asarray(values)
    if values.ndim == 0 or values.shape[0] < batch:
        raise ValueError(f"{name}: expected at least {batch} entries (one per sequence), "
                         f"got shape {tuple(values.shape)}")
    # (a slice is a new tensor: about a microsecond, and vLLM's are usually exact)
    return values if values.shape[0] == batch else values[:batch]


def block_table(values, name):
    """Cache lines as vLLM passes them, read on the host once: (Q,), or its (Q, K) block
    table with K >= 1."""
    table = validation.host_ints(values, name, ndim=(1, 2))
    if table.ndim == 2 and table.shape[1] == 0:
        raise ValueError(f"{name}: expected shape (batch,) or (batch, K) with K >= 1, "
                         f"got {table.shape}")
    return table


def column_zero(table):
    """The cache lines of a ``block_table``: the conv uses column 0 of a 2-D one."""
    return table[:, 0] if table.ndim == 2 else table


def skip_sequences(lines, qsl, name, num_lines, skipped_ids):
    """Cache lines with every sequence vLLM skips replaced by CORE_PAD: lines equal to
    one of ``skipped_ids`` (None entries are ignored) and zero-length sequences. Any
    other line must lie in [0, num_lines): a negative one is not silently a pad."""
    if len(lines) != len(qsl) - 1:
        raise ValueError(f"{name}: expected {len(qsl) - 1} entries (one per sequence), "
                         f"got {len(lines)}")
    skip = np.diff(qsl) == 0
    for value in skipped_ids:
        if value is not None:
            skip |= lines == value
    bad = ~skip & ((lines < 0) | (lines >= num_lines))
    if np.any(bad):
        i = int(np.argmax(bad))
        marks = " or ".join(str(v) for v in skipped_ids if v is not None) or "none"
        raise ValueError(f"{name}: cache line {int(lines[i])} (entry {i}) is out of range "
                         f"[0, {num_lines}) and is not a skipped line ({marks})")
    return np.where(skip, CORE_PAD, lines)


def leading_rows(count, num_rows, name):
    """Token map for tokens stored as the first ``count`` rows of x: None when they are
    all of x (the core then needs no map), else 0..count-1 (the extra rows of x belong
    to no sequence)."""
    if count > num_rows:
        raise ValueError(f"{name}: covers {count} tokens, but x has only {num_rows} rows")
    return None if count == num_rows else np.arange(count)


class _Default:
    """causal_conv1d_update's null_block_id when the caller gives none (see skipped_ids)."""

    def __repr__(self):
        return "NULL_BLOCK_ID (None with pad_slot_id)"


DEFAULT = _Default()


def skipped_ids(null_block_id, pad_slot_id):
    """(null_block_id, pad_slot_id) of a ``causal_conv1d_update`` call, checked. vLLM 0.20
    and later pass null_block_id (default NULL_BLOCK_ID); vLLM up to 0.19 passed pad_slot_id
    (PAD_SLOT_ID) and knew no null block, so with pad_slot_id given and null_block_id not,
    no line is the null block."""
    if null_block_id is DEFAULT:
        if pad_slot_id is None:  # (vLLM's call at every layer: nothing to check)
            return NULL_BLOCK_ID, None
        null_block_id = None
    return (check_skipped_id(null_block_id, "null_block_id"),
            check_skipped_id(pad_slot_id, "pad_slot_id"))


def check_skipped_id(value, name):
    if value is not None and (isinstance(value, bool)
                              or not isinstance(value, (int, np.integer))):
        raise TypeError(f"{name}: expected an int or None, got {value!r}")
    return None if value is None else int(value)


def _rows(token_indx, count, num_rows, name):
    """Rows of a part's tokens: the first ``count`` entries of its map when one is given
    (vLLM's maps may be longer: padded buffers, or aranges sized for the padded batch),
    else the first rows of x."""
    if token_indx is not None:
        return first_entries(token_indx, count, name)
    if count > num_rows:
        raise ValueError(f"{name}: None, so the {count} tokens are the first rows of "
                         f"mixed_qkv, but it has only {num_rows} rows")
    return np.arange(count)


def gdn_step_metadata(m, num_rows, num_lines, null_block_id,
                      non_spec_num_accepted_tokens=None):
    """The ``StepMetadata`` of one engine step (what ``jitconv.plan`` takes), read from vLLM 0.33's
    GDNAttentionMetadata ``m`` the way its GDN layer (``_forward_core``) reads it:

    - spec part when ``spec_sequence_masks`` is set: the first ``num_spec_decodes``
      entries of column 0 of ``spec_state_indices_tensor``, of ``spec_query_start_loc``
      (+1) and of ``num_accepted_tokens`` (FULL graphs pad all three);
    - non-spec part as ``causal_conv1d_fn`` gets it when ``num_prefills`` > 0 (every
      sequence of ``non_spec_query_start_loc``, with ``has_initial_state``), else as
      ``causal_conv1d_update`` gets it when ``num_decodes`` > 0 (one token per line of
      ``non_spec_state_indices_tensor[:num_actual_tokens]``, no initial-state flags);
    - token maps whenever given (cut to the part's token count, the last entry of its
      cut query_start_loc), else the part's tokens are the first rows;
    - null-block lines and zero-length sequences skipped.
    """
    kwargs = {}
    if m.spec_sequence_masks is not None:
        n = int(m.num_spec_decodes)
        table = column_zero(block_table(m.spec_state_indices_tensor,
                                        "spec_state_indices_tensor"))
        if len(table) < n:
            raise ValueError(f"spec_state_indices_tensor: expected at least "
                             f"num_spec_decodes={n} rows, got {len(table)}")
        qsl = query_start_loc(m.spec_query_start_loc, n, "spec_query_start_loc")
        kwargs.update(
            spec_query_start_loc=qsl,
            spec_state_indices=skip_sequences(table[:n], qsl, "spec_state_indices_tensor",
                                              num_lines, (null_block_id,)),
            spec_token_indx=_rows(m.spec_token_indx, int(qsl[-1]), num_rows,
                                  "spec_token_indx"),
            num_accepted_tokens=first_entries(m.num_accepted_tokens, n,
                                              "num_accepted_tokens"))
    if m.num_prefills > 0:
        qsl = query_start_loc(m.non_spec_query_start_loc, None, "non_spec_query_start_loc")
        lines = validation.host_ints(m.non_spec_state_indices_tensor,
                                     "non_spec_state_indices_tensor")
        initial = m.has_initial_state
    elif m.num_decodes > 0:
        lines = validation.host_ints(m.non_spec_state_indices_tensor,
                                     "non_spec_state_indices_tensor")[:int(m.num_actual_tokens)]
        qsl = np.arange(len(lines) + 1)
        initial = None  # decodes continue from their state
    else:
        return StepMetadata(**kwargs)
    batch = len(qsl) - 1
    kwargs.update(
        non_spec_query_start_loc=qsl,
        non_spec_state_indices=skip_sequences(lines, qsl, "non_spec_state_indices_tensor",
                                              num_lines, (null_block_id,)),
        has_initial_state=initial,
        non_spec_token_indx=_rows(m.non_spec_token_indx, int(qsl[-1]), num_rows,
                                  "non_spec_token_indx"))
    if non_spec_num_accepted_tokens is not None:
        kwargs["non_spec_num_accepted_tokens"] = first_entries(
            non_spec_num_accepted_tokens, batch, "non_spec_num_accepted_tokens")
    return StepMetadata(**kwargs)


# The names of vLLM's GDNAttentionMetadata fields by device planner array
# (``kernels.planner.METADATA_ARRAYS``): what a device plan's errors name.
GDN_DEVICE_NAMES = dict(
    ns_qsl="non_spec_query_start_loc", ns_lines="non_spec_state_indices_tensor",
    ns_init="has_initial_state", ns_accepted="non_spec_num_accepted_tokens",
    sp_qsl="spec_query_start_loc", sp_lines="spec_state_indices_tensor",
    sp_accepted="num_accepted_tokens", ns_map="non_spec_token_indx",
    sp_map="spec_token_indx")


def gdn_step_arrays(m, non_spec_num_accepted_tokens=None):
    """The device planner's arrays (``kernels.planner.METADATA_ARRAYS`` name -> value or
    None) and the declared longest sequence (None: no bound) of one engine step, read
    from GDNAttentionMetadata ``m`` as ``gdn_step_metadata`` reads it but without
    reading any value (slices of the given tensors, cut by the metadata's host counts):
    the spec part's first ``num_spec_decodes`` sequences (its block table whole: a
    device plan reads column 0), the non-spec part as ``causal_conv1d_fn`` or
    ``causal_conv1d_update`` gets it, and the token maps where the step has both parts
    (the layer gathers each part's rows by them; a part alone takes the first rows)."""
    arrays = dict.fromkeys(GDN_DEVICE_NAMES)
    declared = None
    spec = m.spec_sequence_masks is not None
    if spec:
        n = int(m.num_spec_decodes)
        table = m.spec_state_indices_tensor
        arrays.update(sp_qsl=leading_entries(m.spec_query_start_loc, n + 1,
                                             "spec_query_start_loc"),
                      sp_lines=leading_entries(table, n, "spec_state_indices_tensor"),
                      sp_accepted=leading_entries(m.num_accepted_tokens, n,
                                                  "num_accepted_tokens"))
        if getattr(table, "ndim", 1) == 2 and table.shape[1] > 0:
            declared = int(table.shape[1])  # what vLLM's layer declares: 1 + drafts
    if m.num_prefills > 0:
        qsl = m.non_spec_query_start_loc
        batch = int(qsl.shape[0]) - 1
        arrays.update(ns_qsl=qsl, ns_lines=leading_entries(
            m.non_spec_state_indices_tensor, batch, "non_spec_state_indices_tensor"),
            ns_init=m.has_initial_state)
        declared = None
    elif m.num_decodes > 0:
        lines = m.non_spec_state_indices_tensor[:int(m.num_actual_tokens)]
        batch = int(lines.shape[0])
        arrays["ns_lines"] = lines
        declared = 1 if not spec else declared
    else:
        return arrays, declared
    if non_spec_num_accepted_tokens is not None:
        arrays["ns_accepted"] = leading_entries(non_spec_num_accepted_tokens, batch,
                                                "non_spec_num_accepted_tokens")
    if spec:
        arrays.update(ns_map=m.non_spec_token_indx, sp_map=m.spec_token_indx)
    return arrays, declared
