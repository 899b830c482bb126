"""Device plans: an engine step whose metadata stays in device tensors.

``jitconv.plan`` reads the metadata once on the host and builds fixed tables: fast to
run, but blind to metadata rewritten later. Engines that capture CUDA graphs keep the
metadata in persistent device tensors and rewrite them in place before each replay;
engines that run eagerly would have to read them back (a synchronization) for every
call. ``jitconv.device_plan`` takes those tensors and never reads their values on the
host: each run launches the device planner (``jitconv.kernels.planner``), which builds
the block records from the tensors' current values into a table of fixed capacity,
then the conv kernel, on the same stream. So every run, and every replay of a graph that
captured runs, follows the values the tensors hold at that moment.

What the host checks (at ``device_plan`` and at every run): shapes, dtypes and devices of
the metadata and the layer's tensors, and the capacity the shapes give. What the device
checks (values): every sequence, by SEMANTICS.md's rules; a bad one is skipped (rows
zeros, state untouched), its error is recorded in the plan's error table and
``check_errors()`` raises it (plans that the one-shot ops keep record into their device's
table instead, which ``jitconv.check_errors`` reads: ``device_errors``). Cache lines named
twice are not detected (the runs of both sequences write that line).

Rows: without token maps each part's tokens are consecutive rows of x, non-spec then spec
(or spec first: ``spec_rows_first``), and the rows after them come out zero. With token
maps (``non_spec_token_indx`` / ``spec_token_indx``, one per part with sequences) a
part's tokens are the rows its map names, and its token count is its map's length (a
shape, read on the host): so runs may split their outputs by part (``run(split=True)``,
``run_stage`` of a mixed step), each part's rows after its last sequence's tokens coming
out zero. A map entry outside x is read as row 0 and reported; rows named twice are not
detected. Runs into x's rows (no split) need maps that name every row of x.

State rules (parent maps, window rows, write lines; SEMANTICS.md "More state rules"):
with them a run launches a second planning kernel after the first, one work-item per
sequence (``planner.plan_rules``), which checks the sequence's rules, writes the links
table the conv kernel's rule pieces read and sets its flags; so every sequence must be
one block (``max_query_len`` <= 16, declared). Checkpoints and circular lines are host
metadata only (``jitconv.plan``).
"""

from typing import Any, Optional

import numpy as np
import torch

from jitconv.api import device_errors, metadata, validation
from jitconv.api.metadata import StepMetadata
from jitconv.api.plan import StepPlan
from jitconv.backends import registry
from jitconv.kernels import planner

_INDEX_DTYPES = (torch.int32, torch.int64)
# The longest sequences a device plan with state rules takes (one block each, declared by
# max_query_len); longer ones are planned on the host.
RULE_TOKENS = planner.BLOCK
_FLAG_DTYPES = (torch.bool, torch.uint8, torch.int32, torch.int64)


def _tensor(value, name, ndim=(1,), dtypes=_INDEX_DTYPES):
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name}: a device plan takes torch tensors (values stay on the "
                        f"device), got {type(value).__name__}")
    if value.dtype not in dtypes:
        raise TypeError(f"{name}: expected dtype {' or '.join(str(d) for d in dtypes)}, "
                        f"got {value.dtype}")
    if value.dim() not in ndim:
        want = " or ".join(f"{n}-D" for n in ndim)
        raise ValueError(f"{name}: expected a {want} tensor, got shape {tuple(value.shape)}")
    return value


def _count(value, name, expected, what):
    if value.shape[0] != expected:
        raise ValueError(f"{name}: expected {expected} entries ({what}), got "
                         f"{value.shape[0]}")


class Signature:
    """A device plan's signature (``DevicePlan.signature``): its values, hashed once. The
    plans an engine's steps rebind (``DevicePlan.rebound``) share one, which backends
    look their prepared launches up by at each step's first run."""

    __slots__ = ("values", "_hash")

    def __init__(self, values):
        self.values = values
        self._hash = hash(values)

    def __hash__(self):
        return self._hash

    def __eq__(self, other):
        return self is other or (isinstance(other, Signature) and self.values == other.values)

    def __repr__(self):
        return f"Signature{self.values!r}"


class DevicePlan(StepPlan):
    """One engine step whose metadata the device reads at every run (build it with
    ``jitconv.device_plan``). ``run`` is ``StepPlan.run``; runs may be captured in a CUDA
    graph, and replays follow the metadata tensors' values at replay time."""

    on_device = True
    sequence_starts = None  # (the GDN stage's) where each sequence begins: on the device

    def __init__(self, *, geometry, arrays, names, counts, max_len, null_line, skip_empty,
                 device, backend, spec_first=False, error_words=None, rules=None,
                 maps=None):
        self.arrays = arrays  # planner.METADATA_ARRAYS name -> (tensor, element stride)
        # planner.RULE_ARRAYS name -> (tensor, row stride, column stride): the state
        # rules the rule planner (``planner.plan_rules``) reads; empty: none
        self.rules = rules or {}
        # every METADATA_ARRAYS name -> (tensor, stride), and the argument name it came as
        self.kernel_arrays, self.names = _with_placeholders(arrays, names)
        self.names.update({k: names[k] for k in self.rules})
        # the arrays' element types (bool flags as the byte they are), in that order: what
        # a planner kernel or a fused conv kernel is compiled for
        self.element_types = tuple(
            "uint8" if t.dtype == torch.bool else str(t.dtype).split(".")[-1]
            for t, _stride in self.kernel_arrays.values())
        self.backend = backend  # the backend of the metadata's device
        self.num_ns, self.num_sp, self.ns_implicit = counts
        self.max_len = max_len  # None: no bound
        self.null_line, self.skip_empty = null_line, skip_empty
        self.device = device
        # token maps: the parts' token slots (non-spec, spec), their maps' lengths; None:
        # no maps (each part's tokens are consecutive rows of x)
        self.maps = maps
        # what split outputs need (``StepPlan``'s fields): each map's length, or a plan
        # of one part's every row of x (its tokens, then zeros); None: both parts
        # without maps (their token counts are on the device)
        self.part_tokens, self.spec_slot0 = None, 0
        if maps is not None:
            self.part_tokens, self.spec_slot0 = (maps[1], maps[0]), maps[0]
        elif not (counts[0] and counts[1]):
            rows = geometry.num_tokens
            self.part_tokens = (rows, 0) if counts[1] else (0, rows)
        # None: the plan's own error words (``check_errors``); else the words of the
        # device that ``jitconv.check_errors`` reads (plans the one-shot ops keep)
        self.error_words = error_words
        self.planner_scalars = planner.scalars(  # the planner's (planner.PLAN_ARGS)
            num_ns=self.num_ns, num_sp=self.num_sp, ns_implicit=self.ns_implicit,
            has_ns_init="ns_init" in arrays, has_ns_accepted="ns_accepted" in arrays,
            num_tokens=geometry.num_tokens, num_lines=geometry.num_lines,
            state_len=geometry.state_len, width=geometry.width,
            pad_line=geometry.pad_slot_id, null_line=null_line, skip_empty=skip_empty,
            max_len=max_len, spec_first=spec_first, maps=maps)
        self.one_slot = bool(self.planner_scalars["one_slot"])
        self.tail_first = self.planner_scalars["tail_first"]
        bound = max_len if max_len is not None else geometry.num_tokens
        ns_max = (1 if self.ns_implicit else bound) if self.num_ns else 0
        if self.rules:
            self.rule_arrays, self.rule_types = _rule_placeholders(self.rules)
            self.rule_scalars = dict(  # the rule planner's (planner.RULE_ARGS) but windows'
                ns_parents_cstride=self.rule_arrays["ns_parents"][2],
                sp_parents_cstride=self.rule_arrays["sp_parents"][2],
                given=sum(planner.rule_bit(k) for k in self.rules), num_ns=self.num_ns,
                num_sp=self.num_sp, spec_first=int(spec_first),
                num_tokens=geometry.num_tokens, num_lines=geometry.num_lines,
                count=self.num_ns + self.num_sp)
            self.links_words = planner.links_words(geometry.num_tokens,
                                                   self.num_ns + self.num_sp)
        else:
            self.rule_arrays = self.rule_types = self.rule_scalars = None
            self.links_words = 0
        chains = any(k.endswith(("parents", "windows")) for k in self.rules)
        self._init_common(
            geometry=geometry, lines=range(geometry.num_lines),  # any line may be written
            written_lines=None,  # so a copied conv_state is copied back whole
            num_blocks=self.planner_scalars["capacity"],
            longest_block=min(planner.BLOCK, bound),
            longest_sequences=(ns_max, bound if self.num_sp else 0),
            uniform_decode=(self.ns_implicit and self.num_ns > 0 and not self.num_sp
                            and "ns_accepted" not in arrays and not self.rules
                            and maps is None),
            # a token's chain reads other tokens' rows of x; with maps, rows no map names
            # are not written
            in_place=self.one_slot and not chains and maps is None, queue=None,
            has_chains=bool(self.rules),
            window_rows=(None if any(k.endswith("windows") for k in self.rules)
                         else np.zeros(0, np.int64)))
        # Everything a run's launches depend on but the addresses of the plan's own
        # memory (metadata arrays, table, error words): plans of one signature run the
        # same launches with those addresses replaced (backends keep their prepared
        # launches by it). None with state rules (their windows and tables differ).
        self.signature = None if self.rules else Signature((
            "device plan", self.fit, str(device), tuple(self.planner_scalars.items()),
            self.element_types, tuple(s for _t, s in self.kernel_arrays.values()),
            tuple(arrays), maps, self.longest_block, self.longest_sequences,
            self.uniform_decode, self.in_place, error_words is None))

    def rebound(self, given):
        """A plan of this one's ``layout`` whose runs read the metadata tensors ``given``
        (tensor or None by ``planner.METADATA_ARRAYS`` name, as ``build`` takes them)
        instead of this plan's: an engine's metadata tensors are new at every step, but
        their layout (shapes, strides, dtypes, devices) and so every host check and
        every field of the plan are the same, and its runs share this plan's signature
        (the launches prepared for it, ``StepPlan.signature``). Only for ``given`` of
        this plan's layout (``layout``: the caller looked this plan up by it; plans with
        state rules have none, so they are never rebound); the error words are those of
        the device now (``device_errors``, which ``clear_caches`` replaces)."""
        plan = object.__new__(type(self))
        plan.__dict__.update(self.__dict__)
        plan.arrays = {k: (given[k], stride) for k, (_t, stride) in self.arrays.items()}
        plan.kernel_arrays = _placeholders(plan.arrays)
        plan.derived = {}
        if self.error_words is not None:
            plan.error_words = device_errors.words_for(self.backend, self.device)
        return plan

    def _stage_rows(self):
        """A GDN stage run's outputs (``StepPlan.run_stage``): with token maps each
        part's map length; without, the plan's one part takes every row of x, its tokens
        in their rows and zeros in the rows after them (the host does not read the token
        count)."""
        spec, non_spec = self.part_tokens
        return {"non_spec": non_spec, "spec": spec}

    def scalars_for(self, l2norm=None):
        """The planner's scalars for a run whose GDN stage normalises each part from the
        rows ``l2norm`` (the stage's (non-spec, spec), which the planner checks; None: a
        conv run)."""
        if l2norm is None:
            return self.planner_scalars
        return dict(self.planner_scalars, l2norm_ns=l2norm[0], l2norm_sp=l2norm[1])

    def table_layout(self):
        """(words of the table its planners write, offsets of ``abi.TABLES`` in it): the
        rows table (unused without token maps), the block records, then with rules the
        links."""
        rows = planner.rows_words(self.maps)
        blocks = rows + self.num_blocks * planner.NF
        return blocks + self.links_words, (0, rows, blocks if self.links_words else 0)

    def rule_values(self, windows_shape):
        """The rule planner's scalars (``planner.RULE_ARGS`` but arrays and tables) for a
        run whose intermediate windows have shape ``windows_shape`` (None: none)."""
        rows, steps = (0, 0) if windows_shape is None else (int(windows_shape[0]),
                                                            int(windows_shape[1]))
        return dict(self.rule_scalars, win_rows=rows, win_steps=steps)

    def check_errors(self) -> None:
        """Raise ValueError if a run since the last check met bad metadata values (which
        sequences were skipped, and why), then clear the record. Waits for the device's
        work so far; not allowed while a CUDA graph is being captured."""
        if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("check_errors: waits for the device, which a CUDA graph "
                               "capture does not allow; call it after the replay")
        found = self.backend.read_errors(self)  # the planner's error words, cleared
        if any(found):
            kinds = "; ".join(planner.ERRORS[i] for i, v in enumerate(found) if v)
            raise ValueError(f"device plan: bad metadata values were met on the device "
                             f"and those sequences skipped (outputs zero, states "
                             f"untouched): {kinds}")


def device_plan(num_tokens: int, num_cache_lines: int, state_len: int, width: int, *,
                non_spec_query_start_loc: Optional[Any] = None,
                non_spec_state_indices: Optional[Any] = None,
                has_initial_state: Optional[Any] = None,
                spec_query_start_loc: Optional[Any] = None,
                spec_state_indices: Optional[Any] = None,
                num_accepted_tokens: Optional[Any] = None,
                non_spec_num_accepted_tokens: Optional[Any] = None,
                spec_parent_token: Optional[Any] = None,
                non_spec_parent_token: Optional[Any] = None,
                spec_window_rows: Optional[Any] = None,
                non_spec_window_rows: Optional[Any] = None,
                spec_write_indices: Optional[Any] = None,
                non_spec_write_indices: Optional[Any] = None,
                non_spec_token_indx: Optional[Any] = None,
                spec_token_indx: Optional[Any] = None,
                max_query_len: Optional[int] = None, pad_slot_id: int = -1,
                null_block_id: Optional[int] = None,
                skip_empty: bool = False, spec_rows_first: bool = False) -> DevicePlan:
    """A plan whose metadata stays on the device: runs read the tensors' values when
    they run (see the module docstring), so they follow values rewritten in place and
    may be captured in CUDA graphs.

    Parameters
    ----------
    num_tokens, num_cache_lines, state_len, width : int
        As in ``jitconv.plan``.
    non_spec_query_start_loc : tensor, (P+1,), optional
        The non-spec part's cumulative token counts. None with
        ``non_spec_state_indices`` given: a decode step, one token per sequence (rows
        0..P-1).
    non_spec_state_indices, has_initial_state, non_spec_num_accepted_tokens : tensors, (P,)
    spec_query_start_loc : tensor, (Q+1,)
    spec_state_indices : tensor, (Q,) or (Q, K) (column 0 used)
    num_accepted_tokens : tensor, (Q,)
        As in ``jitconv.causal_conv1d_mixed``; int32 or int64 tensors (has_initial_state
        also bool) on the device the runs use, rewritten in place between runs as the
        engine likes. The spec part's tokens follow the non-spec part's (see
        ``spec_rows_first``).
    spec_parent_token, non_spec_parent_token : tensors, (sequences, >= max_query_len)
    spec_window_rows, non_spec_window_rows, spec_write_indices, non_spec_write_indices :
    tensors, (sequences,)
        The state rules of ``jitconv.plan`` (SEMANTICS.md "More state rules": parent
        maps, intermediate windows, write lines), read on the device like the rest;
        they need ``max_query_len`` <= 16. Checkpoints and circular lines are planned
        on the host only (``jitconv.plan``). Window rows and written lines that two
        sequences share are not detected.
    non_spec_token_indx, spec_token_indx : tensors, (part tokens,)
        Token maps (one per part the step has, or none): the row of x of each of the
        part's tokens, in the part's order, as in ``jitconv.causal_conv1d_mixed``. A
        map's length is its part's token count (read from its shape, not its values), so
        runs may split their outputs by part and ``run_stage`` takes mixed steps; the
        part's rows after its last sequence's tokens come out zero. An entry outside x
        is read as row 0 and reported by ``check_errors``; rows named twice are not
        detected. Without maps each part's tokens are consecutive rows of x.
    max_query_len : int, optional
        The most tokens any sequence holds (declared, not read): with 16 or fewer the
        planner takes one block per sequence, and short steps (decode, spec verify) run
        the short kernels. A longer sequence is a bad value. None: no bound.
    pad_slot_id : int
        A cache line that marks a padded sequence (outputs zeros, no state touched).
    null_block_id : int, optional
        A second such line (vLLM's null block 0).
    skip_empty : bool
        Sequences without tokens are skipped too (vLLM's kernels do so).
    spec_rows_first : bool
        The spec part's tokens are the first rows of x and the non-spec part's follow
        (vLLM's layout of a mixed step); default: non-spec first. Not with token maps.

    Returns
    -------
    DevicePlan
        ``run(x, weight, bias, conv_state, out=None, activation="silu", math=None)``
        (``split=True`` with token maps); ``run_stage(...)`` (the GDN stage,
        ``StepPlan.run_stage``) on a step of one part, or of both with token maps;
        ``check_errors()``.
    """
    meta = StepMetadata.of({n: v for n, v in locals().items() if n in metadata.ALL_NAMES})
    geo = validation.check_geometry(num_tokens, num_cache_lines, state_len, width,
                                    pad_slot_id)
    return build(geo, meta.device_arrays(), ARGUMENT_NAMES, max_query_len=max_query_len,
                 null_block_id=null_block_id, skip_empty=skip_empty,
                 spec_rows_first=spec_rows_first, rules=meta.device_rules())


# The argument names of ``device_plan`` by ``planner.METADATA_ARRAYS`` and
# ``planner.RULE_ARRAYS`` name.
ARGUMENT_NAMES = {**metadata.DEVICE_ARRAYS, **metadata.DEVICE_RULES}


def build(geo, given, names, *, max_query_len=None, null_block_id=None, skip_empty=False,
          spec_rows_first=False, shared_errors=False, rules=None):
    """The DevicePlan of checked geometry ``geo`` and metadata ``given`` (tensor or None
    by ``planner.METADATA_ARRAYS`` name) and state rules ``rules`` (likewise by
    ``planner.RULE_ARRAYS`` name), checked on the host as ``device_plan`` says;
    errors name each array as ``names`` does (the caller's argument names).
    ``shared_errors``: runs record bad values in the device's words that
    ``jitconv.check_errors`` reads (``device_errors``), not in words of the plan's own."""
    if null_block_id is not None:
        if isinstance(null_block_id, bool) or not isinstance(null_block_id, int):
            raise TypeError(f"null_block_id: expected an int or None, got {null_block_id!r}")
    max_query_len = validation.check_max_query_len(max_query_len)
    for flag, name in ((skip_empty, "skip_empty"), (spec_rows_first, "spec_rows_first")):
        if not isinstance(flag, bool):
            raise TypeError(f"{name}: expected a bool, got {flag!r}")
    arrays, tensors = {}, []

    def take(key, **kw):
        t = _tensor(given[key], names[key], **kw)
        tensors.append((names[key], t))
        arrays[key] = (t, int(t.stride(0)))
        return t

    num_ns, implicit = 0, True
    if given["ns_qsl"] is not None:
        qsl = take("ns_qsl")
        if qsl.shape[0] < 1:
            raise ValueError(f"{names['ns_qsl']}: expected at least 1 entry")
        num_ns, implicit = qsl.shape[0] - 1, False
        if given["ns_lines"] is None:
            raise ValueError(f"{names['ns_lines']}: required with {names['ns_qsl']} (one "
                             f"cache line per sequence)")
    if given["ns_lines"] is not None:
        lines = take("ns_lines")
        if implicit:
            num_ns = lines.shape[0]
            if num_ns > geo.num_tokens:
                raise ValueError(f"{names['ns_lines']}: {num_ns} decode sequences (one "
                                 f"row each), but x has {geo.num_tokens} rows")
        _count(lines, names["ns_lines"], num_ns, "one per sequence")
        for key, dtypes in (("ns_init", _FLAG_DTYPES), ("ns_accepted", _INDEX_DTYPES)):
            if given[key] is not None:
                _count(take(key, dtypes=dtypes), names[key], num_ns, "one per sequence")
    else:
        for key in ("ns_init", "ns_accepted"):
            if given[key] is not None:
                raise ValueError(f"{names[key]}: given without {names['ns_lines']}")
    num_sp = 0
    if given["sp_qsl"] is not None:
        qsl = take("sp_qsl")
        if qsl.shape[0] < 1:
            raise ValueError(f"{names['sp_qsl']}: expected at least 1 entry")
        num_sp = qsl.shape[0] - 1
        for key in ("sp_lines", "sp_accepted"):
            if given[key] is None:
                raise ValueError(f"{names[key]}: required with {names['sp_qsl']}")
        lines = take("sp_lines", ndim=(1, 2))
        if lines.dim() == 2 and lines.shape[1] == 0:
            raise ValueError(f"{names['sp_lines']}: expected shape (Q,) or (Q, K) with K "
                             f">= 1, got {tuple(lines.shape)}")
        _count(lines, names["sp_lines"], num_sp, "one per sequence")
        _count(take("sp_accepted"), names["sp_accepted"], num_sp, "one per sequence")
    else:
        for key in ("sp_lines", "sp_accepted"):
            if given[key] is not None:
                raise ValueError(f"{names[key]}: given without {names['sp_qsl']}")
    if not tensors:
        raise ValueError(f"device_plan: no metadata given (pass {names['ns_lines']}, or "
                         f"{names['sp_qsl']} with its arrays)")
    maps = _maps(given, names, take, num_ns, implicit, geo, spec_rows_first)
    if implicit and num_ns and max_query_len is None:
        max_query_len = 1 if not num_sp else None
    taken = _rules(rules or {}, names, {"ns": num_ns, "sp": num_sp}, given, max_query_len,
                   tensors)
    device = tensors[0][1].device
    for name, t in tensors[1:]:
        if t.device != device:
            raise ValueError(f"{name}: on {t.device}, but {tensors[0][0]} is on {device}; "
                             f"a plan's metadata lives on one device")
    backend = registry.for_call(tensors[0][1])
    words = device_errors.words_for(backend, device) if shared_errors else None
    return DevicePlan(geometry=geo, arrays=arrays,
                      names={k: names[k] for k in list(arrays) + list(taken)},
                      counts=(num_ns, num_sp, implicit), max_len=max_query_len,
                      null_line=null_block_id, skip_empty=skip_empty, device=device,
                      backend=backend, spec_first=spec_rows_first, error_words=words,
                      rules=taken, maps=maps)


def layout(geo, given, names, options):
    """What ``build(geo, given, names, **options)`` reads besides the metadata tensors'
    addresses, as a key: the geometry, the argument names, the options, and each given
    tensor's shape, strides, dtype and device. Builds of one layout pass the same checks
    and make the same plan but for the tensors (``DevicePlan.rebound``). None for calls
    not to key: state rules (their plans are built anew), or an argument that is not a
    tensor (``build`` says why)."""
    if options.get("rules"):
        return None
    tensors = []
    for name, t in given.items():
        if t is not None:
            if not isinstance(t, torch.Tensor):
                return None
            tensors.append((name, t.shape, t.stride(), t.dtype, t.is_cuda, t.is_xpu,
                            t.get_device()))
    return (geo, id(names), tuple(kv for kv in options.items() if kv[0] != "rules"),
            tuple(tensors))


def _maps(given, names, take, num_ns, implicit, geo, spec_rows_first):
    """The token maps' lengths (non-spec, spec), checked on the host (``take`` keeps
    each map given), or None without maps: one map per part that has its arrays, 1-D,
    together no longer than x, and no ``spec_rows_first`` (the maps say where rows are)."""
    parts = {"ns_map": "ns_lines", "sp_map": "sp_qsl"}
    if all(given[k] is None for k in parts):
        return None
    lengths = []
    for key, owner in parts.items():
        if given[owner] is None:
            if given[key] is not None:
                raise ValueError(f"{names[key]}: given without {names[owner]}")
            lengths.append(0)
            continue
        if given[key] is None:
            other = names["sp_map" if key == "ns_map" else "ns_map"]
            raise ValueError(f"{names[key]}: required with {other} (token maps number "
                             f"each part's tokens: give one per part)")
        lengths.append(int(take(key).shape[0]))
    if spec_rows_first:
        raise ValueError("spec_rows_first: not with token maps (the maps say which rows "
                         "each part's tokens are)")
    if sum(lengths) > geo.num_tokens:
        raise ValueError(f"{names['ns_map']}/{names['sp_map']}: {sum(lengths)} entries "
                         f"in all, but x has {geo.num_tokens} rows (each row is at most "
                         f"one token)")
    if implicit and lengths[0] < num_ns:
        raise ValueError(f"{names['ns_map']}: expected at least {num_ns} entries (one per "
                         f"decode sequence), got {lengths[0]}")
    return tuple(lengths)


def _rules(rules, names, counts, given, max_query_len, tensors):
    """The state rules given (``planner.RULE_ARRAYS`` name -> (tensor, row stride, column
    stride)), checked on the host: each with its part, one entry (parents: one row) per
    sequence, parents with a column per token, and every sequence one block."""
    taken = {}
    for key in planner.RULE_ARRAYS:
        value = rules.get(key)
        if value is None:
            continue
        part = key[:2]
        if given[f"{part}_lines"] is None:
            raise ValueError(f"{names[key]}: given without {names[f'{part}_lines']}")
        if max_query_len is None or max_query_len > RULE_TOKENS:
            raise ValueError(
                f"max_query_len: a device plan with {names[key]} takes sequences of at most "
                f"{RULE_TOKENS} tokens (declared, one block each), got {max_query_len}; "
                f"plan longer steps on the host (jitconv.plan)")
        parents = key.endswith("parents")
        t = _tensor(value, names[key], ndim=(2,) if parents else (1,))
        tensors.append((names[key], t))
        _count(t, names[key], counts[part], "one per sequence")
        if parents and t.shape[1] < max_query_len:
            raise ValueError(f"{names[key]}: expected at least max_query_len = "
                             f"{max_query_len} columns (a token's parent each), got "
                             f"{t.shape[1]}")
        if counts[part]:  # (a part without sequences has nothing to plan)
            taken[key] = (t, int(t.stride(0)), int(t.stride(1)) if parents else 0)
    return taken


def _rule_placeholders(rules):
    """Every array of ``planner.RULE_ARRAYS`` as (tensor, row stride, column stride): the
    given ones, and for each absent one (never read: its bit of "given" is 0) a given one
    with strides 0; and their element types, in that order (what a rule planner is
    compiled for)."""
    key = next(iter(rules))
    full = {k: rules.get(k, (rules[key][0], 0, 0)) for k in planner.RULE_ARRAYS}
    types = tuple(str(t.dtype).split(".")[-1] for t, _s, _c in full.values())
    return full, types


def _with_placeholders(arrays, names):
    """Every array of ``planner.METADATA_ARRAYS`` (``_placeholders``), and the argument
    name of each (the placeholder's: that of the array it is), for errors."""
    key = next(k for k in arrays if k != "ns_init")
    return (_placeholders(arrays),
            {k: names.get(k, names[key]) for k in planner.METADATA_ARRAYS})


def _placeholders(arrays):
    """Every array of ``planner.METADATA_ARRAYS``: the given ones, and for each absent one
    (never read: its "has_" word is 0) a given index array with stride 0. So the planner's
    element types are those of the metadata given: all int32, or all int64, is one
    planner kernel (and one of those the SYCL backend ships)."""
    key = next(k for k in arrays if k != "ns_init")
    return {k: arrays.get(k, (arrays[key][0], 0)) for k in planner.METADATA_ARRAYS}
