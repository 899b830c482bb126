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


def chain_inputs(window, xs, parents, t):
    """The W inputs of token t's output, oldest first: token t, then its parent, the
    parent's parent, ... (``parents[k]`` is token k's parent, a position before k; token
    0 is the root), and once the chain passes the root the window, newest column first.
    ``parents`` None is the linear chain (``parents[k] = k - 1``): then these are
    u[:, t : t + W] of ``conv_sequence``."""
    S = window.shape[1]
    vals = [xs[t]]
    k = t
    for _ in range(S):
        if k > 0:
            k = k - 1 if parents is None else int(parents[k])
        else:
            k -= 1  # past the root: the window, newest column first
        vals.append(xs[k] if k >= 0 else window[:, S + k])
    return np.stack(vals[::-1], axis=1)  # (dim, W)


def conv_sequence(window, xs, weight, bias, activation, parents=None):
    """Outputs of one sequence, and each token's inputs.

    window: (dim, S) the S inputs before the sequence; xs: (n, dim) its tokens;
    weight: (dim, W). Tap j multiplies the j-th of a token's W inputs (``chain_inputs``),
    tap W-1 the token itself. Returns y (n, dim), u = concat(window, xs^T) (dim, S + n)
    and inputs (n, dim, W), token t's W inputs.
    """
    n = xs.shape[0]
    u = np.concatenate([window, xs.T], axis=1)  # (dim, S + n)
    width = weight.shape[1]
    if n == 0:
        inputs = np.zeros((0, window.shape[0], width))
    elif parents is None:  # the same as chain_inputs of each token, as one view
        inputs = np.lib.stride_tricks.sliding_window_view(u, width, axis=1)[:, :n]
        inputs = inputs.transpose(1, 0, 2)
    else:
        inputs = np.stack([chain_inputs(window, xs, parents, t) for t in range(n)])
    z = (inputs * weight[None]).sum(axis=2)  # (n, dim)
    if bias is not None:
        z = z + bias[None, :]
    y = silu(z) if activation in ("silu", "swish") else z
    return y, u, inputs


def check_parents(parents, n, name):
    """A parent map of n tokens: token 0 is the root, every other token's parent is a
    token before it (so the map is a tree, listed parents first)."""
    for t in range(1, n):
        if not 0 <= parents[t] < t:
            raise ValueError(f"{name}: token {t}'s parent must be in [0, {t}), "
                             f"got {parents[t]}")


def causal_conv1d_reference(
        x, weight, bias, conv_state, *,
        non_spec_query_start_loc=None, non_spec_state_indices=None,
        has_initial_state=None, non_spec_token_indx=None,
        spec_query_start_loc=None, spec_state_indices=None, spec_token_indx=None,
        num_accepted_tokens=None, non_spec_num_accepted_tokens=None,
        activation="silu", pad_slot_id=-1,
        spec_parent_token=None, non_spec_parent_token=None,
        intermediate_windows=None, spec_window_rows=None, non_spec_window_rows=None,
        spec_write_indices=None, non_spec_write_indices=None,
        non_spec_checkpoint_loc=None, non_spec_checkpoint_pos=None,
        non_spec_checkpoint_indices=None, non_spec_cache_seqlens=None):
    """Mixed batch: non-spec sequences (prefill chunks, decodes) and spec verify sequences,
    with the state rules of SEMANTICS.md ("More state rules"): parent maps (tree verify),
    intermediate windows, separate write lines, checkpoints, circular lines.

    conv_state is viewed as (lines, dim, state_len): pass a transposed view for the
    (lines, state_len, dim) storage. Output rows that no sequence covers are zeros.
    Returns (out, new_state), and the windows (a float64 copy of ``intermediate_windows``
    after the call) third when ``intermediate_windows`` is given.
    """
    if activation not in (None, "silu", "swish"):
        raise ValueError(f"activation must be 'silu', 'swish' or None, got {activation!r}")
    x = as_float64(x)
    weight = as_float64(weight)
    weight = weight.reshape(weight.shape[0], weight.shape[-1])  # accept (dim, 1, W)
    bias = as_float64(bias)
    state = as_float64(conv_state)
    windows = as_float64(intermediate_windows)
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

    def run(i, seq_rows, read_line, write_line, o, initial, spec, parents, window_rows,
            part):
        """One sequence: outputs, then its writes (state, windows)."""
        n = len(seq_rows)
        circular = part == "non_spec" and non_spec_cache_seqlens is not None
        st = cache_line(read_line)
        if circular:
            c = int(as_int(non_spec_cache_seqlens)[i]) % state_len
            cols = [(c - S + k) % state_len for k in range(S)]
        else:
            if o + S > state_len or (spec and S - 1 + n > state_len):
                raise ValueError("state_len too small for this sequence")
            cols = list(range(o, o + S))
        window = st[:, cols].copy() if initial else np.zeros((dim, S))
        if parents is not None:
            parents = as_int(parents)[i]
            check_parents(parents, n, f"{part}_parent_token")
        y, u, inputs = conv_sequence(window, x[seq_rows], weight, bias, activation, parents)
        out[seq_rows] = y
        dst = cache_line(write_line)
        if circular:
            for k in range(n):  # in token order: with n > state_len the last ones stay
                dst[:, (c + k) % state_len] = u[:, S + k]
        elif spec:
            # Keep the newest S-1 old columns, then all n tokens: u[:, 1:].
            dst[:, 0:S - 1 + n] = u[:, 1:]
        else:
            dst[:, 0:S] = u[:, u.shape[1] - S:]
        if part == "non_spec" and non_spec_checkpoint_loc is not None:
            loc = as_int(non_spec_checkpoint_loc)
            pos = as_int(non_spec_checkpoint_pos)[loc[i]:loc[i + 1]]
            if len(pos) and (pos.min() < 1 or pos.max() > n or (np.diff(pos) <= 0).any()):
                raise ValueError("non_spec_checkpoint_pos: increasing, within [1, n]")
            for p, line in zip(pos, as_int(non_spec_checkpoint_indices)[loc[i]:loc[i + 1]]):
                # The S inputs before token p: the state after the sequence's first p.
                cache_line(line)[:, 0:S] = u[:, p:p + S]
        if window_rows is not None and as_int(window_rows)[i] >= 0:  # -1: no windows
            # Token t's window: its last S inputs (the state after it, along its chain).
            windows[as_int(window_rows)[i], :n] = inputs[:, :, 1:]

    qsl = as_int(non_spec_query_start_loc)
    n_ns = 0 if qsl is None else int(qsl[-1])
    sqsl = as_int(spec_query_start_loc)
    n_sp = 0 if sqsl is None else int(sqsl[-1])

    if qsl is not None:
        rows = as_int(non_spec_token_indx)
        if rows is None:
            rows = np.arange(n_ns)
        lines = as_int(non_spec_state_indices)
        writes = as_int(non_spec_write_indices)
        init = (np.ones(len(lines), bool) if has_initial_state is None
                else as_int(has_initial_state).astype(bool))
        accepted = as_int(non_spec_num_accepted_tokens)
        for i, line in enumerate(lines):
            seq_rows = rows[qsl[i]:qsl[i + 1]]
            if line == pad_slot_id:
                out[seq_rows] = 0.0
                continue
            o = 0 if accepted is None else window_start(int(accepted[i]))
            run(i, seq_rows, line, line if writes is None else writes[i], o, init[i], False,
                non_spec_parent_token, non_spec_window_rows, "non_spec")

    if sqsl is not None:
        rows = as_int(spec_token_indx)
        if rows is None:
            rows = np.arange(n_ns, n_ns + n_sp)
        lines = as_int(spec_state_indices)
        if lines.ndim == 2:
            lines = lines[:, 0]
        writes = as_int(spec_write_indices)
        accepted = as_int(num_accepted_tokens)
        for i, line in enumerate(lines):
            seq_rows = rows[sqsl[i]:sqsl[i + 1]]
            if line == pad_slot_id:
                out[seq_rows] = 0.0
                continue
            run(i, seq_rows, line, line if writes is None else writes[i],
                window_start(int(accepted[i])), True, True, spec_parent_token,
                spec_window_rows, "spec")
    if intermediate_windows is not None:
        return out, state, windows
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


# The GDN layer's conv stage (SEMANTICS.md "The GDN conv stage"): the constants of the
# chain it replaces (vLLM's fused post-conv kernel, 2026-12).
L2NORM_EPS = 1e-6
SOFTPLUS_THRESHOLD = 20.0
STAGE_PARTS = ("spec", "non_spec")


def softplus(z):
    """log(1 + exp(z)), and z itself above the threshold (as the engines' kernels)."""
    with np.errstate(over="ignore"):
        return np.where(z > SOFTPLUS_THRESHOLD, z, np.log1p(np.exp(np.minimum(
            z, SOFTPLUS_THRESHOLD))))


def l2norm(v):
    """v / sqrt(sum(v^2) + eps) over the last axis."""
    return v / np.sqrt((v * v).sum(axis=-1, keepdims=True) + L2NORM_EPS)


def gdn_conv_stage_reference(x, weight, bias, conv_state, a, b, A_log, dt_bias, *,
                             num_k_heads, head_k_dim, head_v_dim, activation="silu",
                             use_l2norm=True, exp_g=False, pad_slot_id=-1, **metadata):
    """The GDN layer's conv stage of one engine step, in float64: the conv and state
    update of ``causal_conv1d_reference`` (``metadata``: its keywords), then for each
    token of each part, in the part's token order (its token map's, else its rows of
    ``causal_conv1d_reference``'s default layout), from the token's conv output
    y = [q | k | v] (H = num_k_heads heads of head_k_dim for q and for k, HV =
    len(A_log) heads of head_v_dim for v):

    - q, k: (H, K), each head l2-normalised (``l2norm``) where ``use_l2norm`` says: True
      (both parts), False, the part names it holds ("spec", "non_spec"), or a dict
      {part name: first row} (that part's rows from there on);
    - v: (HV, V);
    - g = -exp(A_log) * softplus(a + dt_bias) (HV,) (exp(g) with ``exp_g``);
    - beta = sigmoid(b) (HV,), from the token's rows of a and b (T, HV).

    Returns ({part: {"q", "k", "v", "g", "beta"}} for "spec" and "non_spec", each
    array (tokens of the part, ...) float64; new_state) (new_state as
    ``causal_conv1d_reference``'s). A padded sequence's tokens come out with zero q, k
    and v (its conv outputs are zeros) and their g and beta from a and b as any other's.
    """
    H, K, V = num_k_heads, head_k_dim, head_v_dim
    A_log, dt_bias = as_float64(A_log), as_float64(dt_bias)
    a, b = as_float64(a), as_float64(b)
    HV = len(A_log)
    dim = as_float64(weight).shape[0]
    if dim != 2 * H * K + HV * V:
        raise ValueError(f"num_k_heads, head_k_dim, head_v_dim: 2 * {H} * {K} + "
                         f"len(A_log)={HV} * {V} = {2 * H * K + HV * V}, but the conv "
                         f"has {dim} channels")
    y, new_state = causal_conv1d_reference(x, weight, bias, conv_state,
                                           activation=activation, pad_slot_id=pad_slot_id,
                                           **metadata)[:2]
    rows = _part_rows(metadata)
    parts = {}
    for part in STAGE_PARTS:
        r = rows[part]
        yp = y[r]
        q = yp[:, :H * K].reshape(len(r), H, K)
        k = yp[:, H * K:2 * H * K].reshape(len(r), H, K)
        v = yp[:, 2 * H * K:].reshape(len(r), HV, V)
        if isinstance(use_l2norm, dict):
            first = use_l2norm.get(part, len(r))
        elif isinstance(use_l2norm, (bool, np.bool_)):
            first = 0 if use_l2norm else len(r)
        else:
            first = 0 if part in use_l2norm else len(r)
        q, k = q.copy(), k.copy()
        q[first:], k[first:] = l2norm(q[first:]), l2norm(k[first:])
        g = -np.exp(A_log)[None, :] * softplus(a[r] + dt_bias[None, :])
        parts[part] = dict(q=q, k=k, v=v, g=np.exp(g) if exp_g else g,
                           beta=1.0 / (1.0 + np.exp(-b[r])))
    return parts, new_state


def _part_rows(metadata):
    """Each part's rows of x, in its token order: its token map's first tokens, else the
    default layout of ``causal_conv1d_reference`` (non-spec rows first)."""
    counts = {}
    for part in STAGE_PARTS:
        qsl = as_int(metadata.get(f"{part}_query_start_loc"))
        counts[part] = 0 if qsl is None else int(qsl[-1])
    rows = {}
    for part, first in (("non_spec", 0), ("spec", counts["non_spec"])):
        given = as_int(metadata.get(f"{part}_token_indx"))
        rows[part] = (np.arange(first, first + counts[part]) if given is None
                      else given[:counts[part]])
    return rows
