"""A pure-torch implementation of the contract: what a user without custom kernels writes
(per-sequence torch.nn.functional.conv1d, silu, state copies). It is the benchmark's
baseline and is tested against the float64 reference like the kernels are.

It takes ``causal_conv1d_mixed``'s arguments (torch tensors) and computes in the inputs'
dtype, on whatever torch device they live on.
"""

import torch
import torch.nn.functional as F


def _rows_and_lines(qsl, lines, rows, default_start):
    qsl = qsl.tolist()
    lines = lines if lines.dim() == 1 else lines[:, 0]
    if rows is None:
        rows = torch.arange(default_start, default_start + qsl[-1])
    return qsl, lines.tolist(), rows


def causal_conv1d_mixed_torch(x, weight, bias, conv_state, *, non_spec_query_start_loc=None,
                              non_spec_state_indices=None, has_initial_state=None,
                              non_spec_token_indx=None, spec_query_start_loc=None,
                              spec_state_indices=None, spec_token_indx=None,
                              num_accepted_tokens=None, non_spec_num_accepted_tokens=None,
                              activation="silu", pad_slot_id=-1):
    weight = weight.reshape(weight.shape[0], weight.shape[-1])
    dim, width = weight.shape
    S = width - 1
    out = torch.zeros_like(x)
    kernel = weight[:, None, :]

    def conv(window, xs):
        y = F.conv1d(torch.cat([window, xs.T], dim=1)[None], kernel, bias, groups=dim)[0].T
        return F.silu(y) if activation in ("silu", "swish") else y

    n_ns = 0
    if non_spec_query_start_loc is not None:
        qsl, lines, rows = _rows_and_lines(non_spec_query_start_loc, non_spec_state_indices,
                                           non_spec_token_indx, 0)
        n_ns = qsl[-1]
        init = None if has_initial_state is None else has_initial_state.tolist()
        accepted = (None if non_spec_num_accepted_tokens is None
                    else non_spec_num_accepted_tokens.tolist())
        for i, line in enumerate(lines):
            seq_rows = rows[qsl[i]:qsl[i + 1]]
            if line == pad_slot_id:
                continue
            o = 0 if accepted is None else accepted[i] - 1
            st = conv_state[line]
            window = st[:, o:o + S] if init is None or init[i] else x.new_zeros(dim, S)
            xs = x[seq_rows]
            out[seq_rows] = conv(window, xs)
            st[:, 0:S] = torch.cat([window, xs.T], dim=1)[:, -S:]
    if spec_query_start_loc is not None:
        qsl, lines, rows = _rows_and_lines(spec_query_start_loc, spec_state_indices,
                                           spec_token_indx, n_ns)
        accepted = num_accepted_tokens.tolist()
        for i, line in enumerate(lines):
            seq_rows = rows[qsl[i]:qsl[i + 1]]
            if line == pad_slot_id:
                continue
            o = accepted[i] - 1
            st = conv_state[line]
            window = st[:, o:o + S].clone()
            xs = x[seq_rows]
            out[seq_rows] = conv(window, xs)
            st[:, 0:S - 1 + len(seq_rows)] = torch.cat([window[:, 1:], xs.T], dim=1)
    return out
