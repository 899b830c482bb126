"""Engine steps with random data: what the demo, the benchmark and the tests feed the ops.

A step of a hybrid model holds non-spec sequences (prefill chunks and plain decodes) and
spec-decode verify sequences. ``mixed_step`` builds the keyword arguments of
``causal_conv1d_mixed`` (the same names serve ``jitconv.reference``) for given sequence
lengths; ``split_step`` turns one step into the two calls (non-spec, then spec) that
engines without a mixed kernel make; ``fn_arguments`` gives a non-spec-only step in
``causal_conv1d_fn``'s names. Data is standard normal (never zeros, so an untouched or
unwritten value shows), drawn from one torch.Generator: a seed reproduces a step.
"""

import torch

from jitconv.backends.registry import empty

SPEC_KEYS = ("spec_query_start_loc", "spec_state_indices", "spec_token_indx",
             "num_accepted_tokens")
NON_SPEC_KEYS = ("non_spec_query_start_loc", "non_spec_state_indices", "has_initial_state",
                 "non_spec_token_indx", "non_spec_num_accepted_tokens")
DATA_KEYS = ("x", "weight", "bias", "conv_state")
ROW_LAYOUTS = ("vllm", "shuffled", "plain")


def cumulative(lengths):
    """query_start_loc of sequences of these lengths: (n+1,) int32, starting at 0."""
    counts = torch.tensor([0] + [int(n) for n in lengths], dtype=torch.int64)
    return torch.cumsum(counts, 0).to(torch.int32)


def random_values(gen, shape, dtype, usm=False):
    """Standard normal values in ``dtype``; in USM memory (``jitconv.empty``) when ``usm``."""
    values = torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype)
    if not usm:
        return values
    t = empty(shape, dtype)
    t.copy_(values)
    return t


def _choose(gen, n, k):
    """k distinct indices of range(n), in random order."""
    return torch.randperm(n, generator=gen)[:k]


def mixed_step(gen, *, dim, width, dtype, ns_lengths=(), sp_lengths=(), rows="vllm",
               ns_pads=0, sp_pads=0, initial="all", spec_columns=1, state_len=None,
               extra_state_columns=0, extra_lines=0, layout="SD", bias=True, usm=False,
               strided=False, non_spec_accepted=False):
    """kwargs of ``causal_conv1d_mixed`` for one step.

    ns_lengths / sp_lengths: token counts of the non-spec and spec sequences (either may
    be empty). rows: "vllm" lays x out as vLLM does (spec rows first, each sequence's rows
    contiguous; token maps only when both kinds are present), "shuffled" gives every
    token a random row (maps always), "plain" gives no maps (non-spec rows, then spec
    rows). ns_pads / sp_pads: how many sequences of each kind get cache line -1 (pads).
    initial: "all" (every has_initial_state True), None (the argument left out),
    "alternate" (every other one False, in random order) or a list of bools.
    spec_columns: 1 gives spec_state_indices of shape (Q,), K > 1 vLLM's (Q, K) block
    table whose column 0 is the line. state_len defaults to the least the step needs
    plus ``extra_state_columns``; cache lines are the sequences' plus ``extra_lines``
    unused ones, assigned at random. layout "SD" stores conv_state as vLLM does,
    (lines, state_len, dim), and passes the transposed view; "DS" stores (lines, dim,
    state_len). strided: x is a column slice of a wider tensor (row stride > dim).
    num_accepted_tokens (and non_spec_num_accepted_tokens when asked for) are random
    within what state_len allows.
    """
    if rows not in ROW_LAYOUTS:
        raise ValueError(f"rows: expected one of {ROW_LAYOUTS}, got {rows!r}")
    ns_lengths, sp_lengths = [int(n) for n in ns_lengths], [int(n) for n in sp_lengths]
    S = width - 1
    if state_len is None:
        state_len = max([S] + [S - 1 + n for n in sp_lengths]) + extra_state_columns
    n_ns, n_sp = sum(ns_lengths), sum(sp_lengths)
    nseq = len(ns_lengths) + len(sp_lengths)
    num_lines = nseq + extra_lines
    lines = _choose(gen, num_lines, nseq).to(torch.int32)
    ns_lines, sp_lines = lines[:len(ns_lengths)].clone(), lines[len(ns_lengths):].clone()
    ns_lines[_choose(gen, len(ns_lines), ns_pads)] = -1
    sp_lines[_choose(gen, len(sp_lines), sp_pads)] = -1
    max_accepted = state_len - S + 1  # the window a-1 .. a-1+S must fit in state_len

    def accepted(n):
        return torch.randint(1, max_accepted + 1, (n,), generator=gen, dtype=torch.int32)

    num_tokens = n_ns + n_sp
    if strided:  # the first dim channels of a wider projection
        x = random_values(gen, (num_tokens, dim + 24), dtype, usm)[:, 8:8 + dim]
    else:
        x = random_values(gen, (num_tokens, dim), dtype, usm)
    storage = (num_lines, state_len, dim) if layout == "SD" else (num_lines, dim, state_len)
    state = random_values(gen, storage, dtype, usm)
    step = dict(x=x, weight=random_values(gen, (dim, width), dtype, usm),
                bias=random_values(gen, (dim,), dtype, usm) if bias else None,
                conv_state=state.transpose(1, 2) if layout == "SD" else state)

    row_of = None
    if rows == "shuffled":
        row_of = torch.randperm(num_tokens, generator=gen).to(torch.int32)
    elif rows == "vllm" and ns_lengths and sp_lengths:
        row_of = torch.cat([torch.arange(n_sp, num_tokens), torch.arange(n_sp)]).to(
            torch.int32)
    if ns_lengths:
        step.update(non_spec_query_start_loc=cumulative(ns_lengths),
                    non_spec_state_indices=ns_lines)
        if initial is not None:
            step["has_initial_state"] = _initial(gen, initial, len(ns_lengths))
        if row_of is not None:
            step["non_spec_token_indx"] = row_of[:n_ns]
        if non_spec_accepted:
            step["non_spec_num_accepted_tokens"] = accepted(len(ns_lengths))
    if sp_lengths:
        table = sp_lines
        if spec_columns > 1:  # the other columns are other layers' business: random
            others = torch.randint(0, 99, (len(sp_lines), spec_columns - 1), generator=gen,
                                   dtype=torch.int32)
            table = torch.cat([sp_lines[:, None], others], 1)
        step.update(spec_query_start_loc=cumulative(sp_lengths), spec_state_indices=table,
                    num_accepted_tokens=accepted(len(sp_lengths)))
        if row_of is not None:
            step["spec_token_indx"] = row_of[n_ns:]
    return step


def _initial(gen, initial, n):
    if initial == "all":
        return torch.ones(n, dtype=torch.bool)
    if initial == "alternate":
        pattern = torch.tensor([i % 2 == 0 for i in range(n)])
        return pattern[torch.randperm(n, generator=gen)]
    flags = torch.tensor([bool(v) for v in initial])
    if len(flags) != n:
        raise ValueError(f"initial: expected {n} flags (one per non-spec sequence), "
                         f"got {len(flags)}")
    return flags


def token_rows(step, part):
    """Rows of x of the "non_spec" or "spec" part's tokens, in sequence order."""
    key = f"{part}_token_indx"
    if step.get(key) is not None:
        return step[key].long()
    n_ns = int(step["non_spec_query_start_loc"][-1]) if "non_spec_query_start_loc" in step \
        else 0
    if part == "non_spec":
        return torch.arange(n_ns)
    return torch.arange(n_ns, n_ns + int(step["spec_query_start_loc"][-1]))


def split_step(step, conv_state=None):
    """The step as two calls, (non-spec kwargs, spec kwargs), each with explicit token maps
    (so that neither has to cover all of x). ``conv_state``: the state both calls update
    (default: the step's own). Either is None when its part is absent."""
    common = {k: step[k] for k in DATA_KEYS if k in step}
    if conv_state is not None:
        common["conv_state"] = conv_state
    calls = []
    for part, keys in (("non_spec", NON_SPEC_KEYS), ("spec", SPEC_KEYS)):
        if f"{part}_query_start_loc" not in step:
            calls.append(None)
            continue
        call = dict(common, **{k: step[k] for k in keys if k in step})
        call[f"{part}_token_indx"] = token_rows(step, part).to(torch.int32)
        calls.append(call)
    return tuple(calls)


def fn_arguments(step):
    """A non-spec-only step in ``causal_conv1d_fn``'s argument names."""
    if any(k in step for k in SPEC_KEYS):
        raise ValueError("step: causal_conv1d_fn takes non-spec sequences only")
    return dict({k: step[k] for k in DATA_KEYS},
                query_start_loc=step["non_spec_query_start_loc"],
                cache_indices=step["non_spec_state_indices"],
                has_initial_state=step.get("has_initial_state"),
                token_indx=step.get("non_spec_token_indx"))
