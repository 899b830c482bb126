"""Float64 reference of the whole contract (docs/SEMANTICS.md), written to be read.

Every kernel is tested against this. It is deliberately plain numpy: one sequence at a
time, the formulas of SEMANTICS.md line by line. Inputs may be numpy arrays or torch
tensors (any float dtype); the math runs in float64.

Returns ``(out, new_state)``: ``out`` is (num_tokens, dim) float64; ``new_state`` is a
float64 copy of conv_state viewed as (lines, dim, state_len) after the update. New state
values are copies of inputs, so casting ``new_state`` back to the state's dtype is exact.
"""

import numpy as np

# Output tolerances (rtol, atol) against this reference, by dtype name (SEMANTICS.md).
TOLERANCE = {"float32": (3e-4, 1e-3), "float16": (3e-3, 5e-3), "bfloat16": (1e-2, 5e-2)}


def as_float64(a):
    """numpy float64 copy of a numpy array or torch tensor (bfloat16 included)."""
    if a is None:
        return None
    if hasattr(a, "detach"):  # torch tensor
        import torch
        return a.detach().to("cpu", torch.float64).numpy().copy()
    return np.asarray(a, dtype=np.float64).copy()


def as_int(a):
    if a is None:
        return None
    if hasattr(a, "detach"):
        a = a.detach().cpu().numpy()
    return np.asarray(a).astype(np.int64)


def silu(z):
    with np.errstate(over="ignore", invalid="ignore"):  # +-inf and NaN inputs are allowed
        return z / (1.0 + np.exp(-z))


def conv_sequence(window, xs, weight, bias, activation):
    """Outputs of one sequence.

    window: (dim, S) the S inputs before the sequence; xs: (n, dim) its tokens;
    weight: (dim, W). Tap j multiplies u[:, t + j], tap W-1 the current token.
    """
    width = weight.shape[1]
    u = np.concatenate([window, xs.T], axis=1)  # (dim, S + n)
    n = xs.shape[0]
    # z[:, t] = sum_j weight[:, j] * u[:, t + j]
    z = sum(weight[:, j:j + 1] * u[:, j:j + n] for j in range(width))
    if bias is not None:
        z = z + bias[:, None]
    y = (silu(z) if activation in ("silu", "swish") else z).T
    return y, u


def causal_conv1d_reference(
        x, weight, bias, conv_state, *,
        non_spec_query_start_loc=None, non_spec_state_indices=None,
        has_initial_state=None, non_spec_token_indx=None,
        spec_query_start_loc=None, spec_state_indices=None, spec_token_indx=None,
        num_accepted_tokens=None, non_spec_num_accepted_tokens=None,
        activation="silu", pad_slot_id=-1):
    """Mixed batch: non-spec sequences (prefill chunks, decodes) and spec verify sequences.

    conv_state is viewed as (lines, dim, state_len): pass a transposed view for the
    (lines, state_len, dim) storage. Output rows that no sequence covers are zeros.
    """
    if activation not in (None, "silu", "swish"):
        raise ValueError(f"activation must be 'silu', 'swish' or None, got {activation!r}")
    x = as_float64(x)
    weight = as_float64(weight)
    weight = weight.reshape(weight.shape[0], weight.shape[-1])  # accept (dim, 1, W)
    bias = as_float64(bias)
    state = as_float64(conv_state)
    num_tokens, dim = x.shape
    width = weight.shape[1]
    S = width - 1
    state_len = state.shape[2]
    out = np.zeros((num_tokens, dim))

    def cache_line(line):
        # Checked, not asserted: numpy would silently wrap a negative index.
        if not 0 <= line < state.shape[0]:
            raise ValueError(f"cache line {line} out of range and not pad_slot_id")
        return state[line]

    def window_start(a):
        if a < 1:
            raise ValueError(f"num_accepted_tokens must be >= 1, got {a}")
        return a - 1

    qsl = as_int(non_spec_query_start_loc)
    n_ns = 0 if qsl is None else int(qsl[-1])
    sqsl = as_int(spec_query_start_loc)
    n_sp = 0 if sqsl is None else int(sqsl[-1])

    if qsl is not None:
        rows = as_int(non_spec_token_indx)
        if rows is None:
            rows = np.arange(n_ns)
        lines = as_int(non_spec_state_indices)
        init = (np.ones(len(lines), bool) if has_initial_state is None
                else as_int(has_initial_state).astype(bool))
        accepted = as_int(non_spec_num_accepted_tokens)
        for i, line in enumerate(lines):
            seq_rows = rows[qsl[i]:qsl[i + 1]]
            if line == pad_slot_id:
                out[seq_rows] = 0.0
                continue
            o = 0 if accepted is None else window_start(int(accepted[i]))
            if o + S > state_len:
                raise ValueError("window beyond state_len")
            st = cache_line(line)
            window = st[:, o:o + S].copy() if init[i] else np.zeros((dim, S))
            y, u = conv_sequence(window, x[seq_rows], weight, bias, activation)
            out[seq_rows] = y
            st[:, 0:S] = u[:, u.shape[1] - S:]

    if sqsl is not None:
        rows = as_int(spec_token_indx)
        if rows is None:
            rows = np.arange(n_ns, n_ns + n_sp)
        lines = as_int(spec_state_indices)
        if lines.ndim == 2:
            lines = lines[:, 0]
        accepted = as_int(num_accepted_tokens)
        for i, line in enumerate(lines):
            seq_rows = rows[sqsl[i]:sqsl[i + 1]]
            if line == pad_slot_id:
                out[seq_rows] = 0.0
                continue
            n = len(seq_rows)
            o = window_start(int(accepted[i]))
            if o + S > state_len or S - 1 + n > state_len:
                raise ValueError("state_len too small for this spec sequence")
            st = cache_line(line)
            window = st[:, o:o + S].copy()
            y, u = conv_sequence(window, x[seq_rows], weight, bias, activation)
            out[seq_rows] = y
            # Keep the newest S-1 old columns, then all n tokens: u[:, 1:].
            st[:, 0:S - 1 + n] = u[:, 1:]
    return out, state


def causal_conv1d_fn_reference(x, weight, bias, conv_state, query_start_loc, cache_indices,
                               has_initial_state=None, activation="silu", pad_slot_id=-1,
                               token_indx=None, num_accepted_tokens=None):
    """Non-spec only: the reference of ``jitconv.causal_conv1d_fn``."""
    return causal_conv1d_reference(
        x, weight, bias, conv_state,
        non_spec_query_start_loc=query_start_loc, non_spec_state_indices=cache_indices,
        has_initial_state=has_initial_state, non_spec_token_indx=token_indx,
        non_spec_num_accepted_tokens=num_accepted_tokens,
        activation=activation, pad_slot_id=pad_slot_id)
