"""Step plans: an engine step's metadata validated and turned into kernel tables ONCE,
then run on every layer.

Every GDN / Mamba layer of one engine step uses the same metadata (query_start_loc, cache
lines, token maps, accepted counts); only x, weight, bias and conv_state change per layer.
``jitconv.plan(...)`` checks the metadata against the step's geometry (rows of x, cache
lines, state_len, width), builds the tables (token rows, block records) and copies them into
USM memory that the plan owns. ``StepPlan.run(x, weight, bias, conv_state)`` then checks
only what can differ per layer (shapes, dtypes, strides, devices against the plan) and
submits one kernel. The one-shot ops (``causal_conv1d_fn`` / ``_update`` / ``_mixed``) are
a plan and one run.

A plan's fields are never written after it is built, so any number of threads may run it
(or run different plans) at once: there is no lock and no shared mutable buffer. Only
``derived`` grows: what backends work out from the plan and keep with it (see
``jitconv.backends``).
"""

from typing import Any, NamedTuple, Optional

import numpy as np
import torch

from jitconv.api import validation
from jitconv.kernels.batch import DEFAULT_BLOCK_TOKENS, build_batch
from jitconv.backends import Launch, StageTensors, registry
from jitconv.kernels.abi import SPLIT_NONE, SPLIT_PARTS, SPLIT_SLOTS
from jitconv.memory import arrays


class SplitOutputs(NamedTuple):
    """A run's outputs split by part (``out_spec`` / ``out_non_spec``): row k of each is
    the part's k-th token, what ``out.index_select(0, token_indx)`` gives for the part's
    token map. None for a part without tokens that got no tensor."""
    spec: Any
    non_spec: Any


class StageOutputs(NamedTuple):
    """One part's outputs of the GDN conv stage, row k its k-th token (the part's token
    order, as ``SplitOutputs``): q and k (tokens, num_k_heads, head_k_dim), v (tokens,
    num_v_heads, head_v_dim) in x's dtype, contiguous; g and beta (tokens, num_v_heads)
    float32."""
    q: Any
    k: Any
    v: Any
    g: Any
    beta: Any


class StageResult(NamedTuple):
    """``StepPlan.run_stage``'s result: each part's ``StageOutputs`` (None for a part
    without tokens)."""
    spec: Any
    non_spec: Any


class StepPlan:
    """One engine step, ready to run on every layer (build it with ``jitconv.plan``)."""

    # Whether runs read the step's metadata on the device (``DevicePlan``): only those
    # follow metadata rewritten in place, so only those may be captured in a CUDA graph.
    on_device = False
    # A device plan's token maps: the parts' token slots (non-spec, spec); None: none
    # (a host plan's maps are in its tables)
    maps = None
    # What plans whose runs may share prepared launches have in common (device plans:
    # ``DevicePlan.signature``); None: a plan's launches are its own
    signature = None

    def __init__(self, parts, geometry, *, queue=None, row_names="token_indx",
                 line_names="state_indices"):
        geo = geometry
        all_rows = np.concatenate([p.rows for p in parts] + [np.zeros(0, np.int64)])
        validation.check_unique(all_rows, row_names, "row", geo.num_tokens)
        all_lines = np.concatenate([p.lines for p in parts] + [np.zeros(0, np.int64)])
        validation.check_unique(all_lines[all_lines >= 0], line_names, "cache line",
                                geo.num_lines)
        # the cache lines a run reads or writes (write lines and checkpoints included)
        lines = validation.check_written_lines(
            parts, "non_spec_write_indices/spec_write_indices/non_spec_checkpoint_indices")
        window_rows, window_steps = [], 0  # rows of the intermediate windows written
        for p in parts:
            if p.window_rows is not None:
                used = p.window_rows >= 0
                window_rows.append(p.window_rows[used])
                window_steps = max(window_steps,
                                   int(np.diff(p.query_start_loc)[used].max(initial=0)))
        window_rows = np.concatenate(window_rows + [np.zeros(0, np.int64)])
        validation.check_unique(window_rows, "spec_window_rows/non_spec_window_rows",
                                "windows row", int(window_rows.max(initial=-1)) + 1)
        batch = build_batch(parts, geo.num_tokens)
        longest_sequences = batch.longest_sequences()
        self._init_common(
            geometry=geo, lines=lines, written_lines=lines.tolist(),
            num_blocks=batch.num_blocks, longest_block=int(batch.blk_len.max(initial=0)),
            longest_sequences=longest_sequences, uniform_decode=batch.uniform_decode(),
            # Every sequence with a cache line in one block: then each element of x is
            # read and its output written by one work-item, reads first, so out may be x.
            # Not with chains: a token's inputs are other tokens' rows of x.
            in_place=(max(longest_sequences) <= DEFAULT_BLOCK_TOKENS
                      and not batch.has_chain_tokens()),
            queue=queue, has_chains=batch.has_chains(), window_rows=window_rows,
            window_steps=window_steps)
        self.host_tables = batch.tables()  # the kernel's int32 tables (kernels.abi.TABLES)
        # Tokens per part (spec, non-spec: validation.SPLIT_NAMES' order) and the spec
        # part's first token slot: what split outputs need. The non-spec part's slots
        # start at 0 (its part comes first, as every plan builder orders them).
        counts = {True: 0, False: 0}
        starts = {True: [], False: []}  # each part's rows that begin a sequence
        for p in parts:
            starts[p.spec].append(counts[p.spec] + np.asarray(p.query_start_loc[:-1]))
            counts[p.spec] += int(p.query_start_loc[-1])
        self.sequence_starts = {
            name: np.concatenate(starts[spec] + [np.zeros(0, np.int64)]).astype(np.int64)
            for name, spec in (("spec", True), ("non_spec", False))}
        if parts and parts[0].spec and len(parts) > 1:
            raise ValueError("plan: the non-spec part must come before the spec part")
        self.part_tokens = (counts[True], counts[False])
        self.spec_slot0 = counts[False]

    def _init_common(self, *, geometry, lines, written_lines, num_blocks, longest_block,
                     longest_sequences, uniform_decode, in_place, queue, has_chains=False,
                     window_rows=np.zeros(0, np.int64), window_steps=0):
        """The fields every plan has (host and device plans alike), set by both
        constructors through this one call. ``window_rows`` None: a device plan whose
        sequences have window rows on the device."""
        # parent maps, windows, write lines, checkpoints or rings: a kernel with the rule
        # pieces
        self.has_chains = has_chains
        # runs take intermediate_windows (and are never remembered)
        self.takes_windows = window_rows is None or len(window_rows) > 0
        # rows of intermediate_windows a run writes (None: not known on the host)
        self.window_rows = window_rows
        self.window_steps = window_steps  # steps they need (the longest such sequence)
        self.derived = {}  # (see the module docstring)
        self.geometry = geometry
        self.lines = lines  # the cache lines a run may write
        self.written_lines = written_lines  # what a copy-back of conv_state writes (None: all)
        self.num_blocks = num_blocks
        self.longest_block = longest_block  # tokens of the longest block (picks code)
        self.longest_sequences = longest_sequences  # (non-spec, spec)
        self.uniform_decode = uniform_decode
        self.in_place = in_place  # out may be x itself
        self.queue = queue  # None: chosen per run (torch's stream, or the current device)
        # what a remembered launch compares: the geometry its tensors were checked against
        self.fit = (geometry.num_tokens, geometry.num_lines, geometry.state_len,
                    geometry.width)

    # ---------------------------------------------------------------- per layer

    def run(self, x: Any, weight: Any, bias: Optional[Any], conv_state: Any,
            out: Optional[Any] = None, activation: Optional[str] = "silu",
            math: Optional[str] = None, *, split: bool = False,
            out_spec: Optional[Any] = None, out_non_spec: Optional[Any] = None,
            intermediate_windows: Optional[Any] = None) -> Any:
        """The conv of one layer, with the plan's metadata.

        Parameters
        ----------
        x : tensor, (num_tokens, dim)
            The layer's inputs; rows may be strided.
        weight : tensor, (dim, width) or (dim, 1, width)
        bias : tensor, (dim,), or None
        conv_state : tensor, viewed as (num_cache_lines, dim, state_len)
            Updated in place: only the cache lines the plan's sequences name.
        out : tensor, (num_tokens, dim), optional
            Where the outputs go (may alias x); a new tensor when None.
        activation : {"silu", "swish", None}
        math : {None, "exact", "fast"}
            silu's math (see ``jitconv.causal_conv1d_mixed``).
        split : bool
            Return the outputs split by part, instead of one tensor in x's rows:
            ``SplitOutputs(spec, non_spec)``, each part's rows in a tensor of shape
            (part tokens, dim), row k the part's k-th token (what
            ``out.index_select(0, spec_token_indx)`` and ``(0, non_spec_token_indx)``
            give), written by the same launch. New tensors (views of one, so that a
            layer's next runs are remembered launches), or ``out_spec`` /
            ``out_non_spec`` when given.
        out_spec, out_non_spec : tensors, optional
            The split outputs to write (implies ``split``; not with ``out``). A part
            with tokens needs its tensor. Neither may overlap x, weight, bias,
            conv_state or the other.
        intermediate_windows : tensor, (rows, steps, dim, width - 1), optional
            Required when the plan's sequences have window rows: see
            ``jitconv.causal_conv1d_mixed``.

        Returns
        -------
        tensor or SplitOutputs
            ``out``, or the new output tensor; with split outputs a ``SplitOutputs``
            (None for a part without tokens, unless its tensor was given).

        The tensors are checked against the plan (shapes, dtypes, strides, devices,
        overlaps) before anything is launched; a bad one raises and leaves conv_state as
        it was.
        """
        return self.run_checked((x, weight, bias, conv_state, out), activation, None, math,
                                split_request(split, out_spec, out_non_spec),
                                intermediate_windows)

    def run_checked(self, args, activation, checked=None, math=None, split=None,
                    windows=None):
        """``run`` on ``args`` (x, weight, bias, conv_state, out). ``checked``: (normalized
        tensors, dtype name) when the caller has already checked them against this
        plan's geometry (the one-shot ops do), so a run that is not remembered does not
        check them twice. ``split``: from ``split_request``; ``windows``: the
        intermediate windows (runs with windows are never remembered)."""
        backend = registry.for_call(args[0])
        if self.on_device and backend is not self.backend:
            raise ValueError(f"x: runs on the {backend.name} backend, but this plan's "
                             f"metadata tensors are on {self.device}; put x, weight, bias "
                             f"and conv_state where the metadata are")
        mode = SPLIT_NONE if split is None else SPLIT_SLOTS if split is True else SPLIT_PARTS
        if self.on_device and self.maps is not None and mode == SPLIT_NONE and \
                sum(self.maps) < self.geometry.num_tokens:
            raise ValueError(f"split: this device plan's token maps name "
                             f"{sum(self.maps)} rows of x's {self.geometry.num_tokens}, so "
                             f"a run into x's rows would leave the others unwritten; take "
                             f"split outputs (split=True, or out_spec / out_non_spec)")
        if mode != SPLIT_NONE:
            if self.part_tokens is None:
                raise ValueError("split: split outputs need each part's token count on "
                                 "the host; a device plan of both parts without token maps "
                                 "does not read it there: give the plan "
                                 "non_spec_token_indx / spec_token_indx (their lengths are "
                                 "the counts), or use a plan built from host metadata "
                                 "(jitconv.plan)")
            validation.check_no_out(args[4])
        result = key = None
        if windows is None and not self.takes_windows:
            result, key = backend.remembered(self, args, activation, math, mode)
        if result is not None:  # these tensors passed the checks of this geometry
            return self._split_views(result) if mode == SPLIT_SLOTS else result
        silu = validation.check_activation(activation)
        validation.check_math(math)
        if checked is None:
            tensors = registry.normalize_all(*args)
            _dim, width, dtype = validation.check_tensors(*tensors)
            validation.check_fits_plan(self.geometry, tensors[0], tensors[3], width)
        else:
            tensors, dtype = checked
        if windows is not None:
            windows = registry.normalize(windows, "intermediate_windows")
        if mode == SPLIT_PARTS:
            return self._launch_split(backend, tensors, silu, math, dtype, split, windows)
        result = self._launch(backend, tensors, silu, math, dtype, key, mode, windows)
        return self._split_views(result) if mode == SPLIT_SLOTS else result

    def run_stage(self, x: Any, weight: Any, bias: Optional[Any], conv_state: Any, a: Any,
                  b: Any, A_log: Any, dt_bias: Any, *, num_k_heads: int, head_k_dim: int,
                  head_v_dim: int, use_l2norm: Any = True, exp_g: bool = False,
                  activation: Optional[str] = "silu", math: Optional[str] = None,
                  checked=None) -> StageResult:
        """The GDN conv stage of one layer with the plan's metadata, in one launch
        (``jitconv.gdn_conv_stage`` documents the arguments): the conv and state update
        as ``run``'s, then per token of each part q, k (l2-normalised where
        ``use_l2norm`` says), v, g (exp(g) with ``exp_g``) and beta. Every argument
        is checked before anything is launched. ``checked``: as ``run_checked``'s. A
        device plan takes a step of one part, whose outputs have a row per row of x
        (docs/SEMANTICS.md, "The GDN conv stage")."""
        backend = registry.for_call(x)
        if self.on_device:
            if backend is not self.backend:
                raise ValueError(f"x: runs on the {backend.name} backend, but this plan's "
                                 f"metadata tensors are on {self.device}; put the layer's "
                                 f"tensors where the metadata are")
            if self.part_tokens is None:
                raise ValueError("plan: the GDN stage on a device plan without token maps "
                                 "takes a step of one part (non-spec or spec sequences): a "
                                 "mixed step's part token counts are on the device, where "
                                 "the host does not read them; give the plan "
                                 "non_spec_token_indx / spec_token_indx (their lengths are "
                                 "the counts), or plan it from host metadata (jitconv.plan)")
        if self.takes_windows:
            raise ValueError("spec_window_rows/non_spec_window_rows: the GDN stage does "
                             "not write intermediate windows; plan the step without them")
        heads = (num_k_heads, head_k_dim, head_v_dim)
        rows = self._stage_rows()
        l2norm = validation.l2norm_parts(use_l2norm, self.sequence_starts, rows)
        stage_args = (a, b, A_log, dt_bias, heads, l2norm, exp_g)
        buffer, key = backend.remembered_stage(self, (x, weight, bias, conv_state, None),
                                               stage_args, activation, math)
        if buffer is not None:  # these tensors passed the checks of this geometry
            return self._stage_views(buffer, heads, validation.shape_of(A_log)[0])
        silu = validation.check_activation(activation)
        validation.check_math(math)
        if checked is None:
            tensors = registry.normalize_all(x, weight, bias, conv_state, None)
            _dim, width, dtype = validation.check_tensors(*tensors)
            validation.check_fits_plan(self.geometry, tensors[0], tensors[3], width)
        else:
            tensors, dtype = checked
        x_given, weight, bias, conv_state, _ = tensors
        for name, t in (("x", x_given), ("a", a), ("b", b), ("A_log", A_log),
                        ("dt_bias", dt_bias)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name}: the GDN stage takes torch tensors, got "
                                f"{type(t).__name__}")
        hv = validation.check_stage(x_given, conv_state, a, b, A_log, dt_bias, *heads)
        refusal = backend.stage_refusal(head_k_dim, head_v_dim)
        if refusal is not None:
            raise ValueError(refusal)
        if not isinstance(exp_g, (bool, np.bool_)):
            raise TypeError(f"exp_g: expected True or False, got {exp_g!r}")
        validation.check_writable(x_given, weight, bias, conv_state, None)
        extents = validation.check_aliasing(x_given, weight, bias, conv_state, None,
                                            self.lines)
        (ns_rows, spec_rows), spec_slot0 = self.stage_layout()
        dim = validation.shape_of(x_given)[1]
        sizes = _stage_sizes(ns_rows + spec_rows, dim, hv, x_given.element_size())
        buffer = backend.empty_output(x_given, (sizes["total"],), dtype)
        if dim and self.num_blocks:
            x = registry.channels_contiguous(x_given)
            parts = [buffer[first:first + n * dim].view(n, dim) if n else None
                     for n, first in ((ns_rows, 0), (spec_rows, ns_rows * dim))]
            stage = StageTensors(
                a=a, b=b, A_log=backend.as_floats(A_log), dt_bias=backend.as_floats(dt_bias),
                buffer=buffer, gates=buffer[sizes["gates"]:].view(torch.float32),
                part_rows=(ns_rows, spec_rows), head_k_dim=head_k_dim,
                qk=num_k_heads * head_k_dim, vdim=hv * head_v_dim, head_v_dim=head_v_dim,
                l2norm=l2norm, exp_g=bool(exp_g))
            backend.launch(self, Launch(
                x=x, weight=weight, bias=bias, conv_state=conv_state, out=None,
                target=parts[0], silu=silu, math=math, dtype=dtype, extents=extents,
                zero_copy=x is x_given, key=key, split=SPLIT_PARTS, out2=parts[1],
                spec_slot0=spec_slot0, stage=stage))
        return self._stage_views(buffer, heads, hv)

    def stage_layout(self):
        """((non-spec rows, spec rows), the spec part's first token slot) of a stage
        run's outputs: what its launch's output parameters depend on."""
        rows = self._stage_rows()
        # (a device plan's one part starts at slot 0: its planner's tail blocks, the rows
        # after the tokens, are that part's too, ``planner.slot_record``)
        return (rows["non_spec"], rows["spec"]), self.spec_slot0

    def _stage_rows(self):
        """Rows of each part's stage output ("non_spec", "spec"): its tokens."""
        spec, non_spec = self.part_tokens
        return {"non_spec": non_spec, "spec": spec}

    def _stage_views(self, buffer, heads, hv):
        """A stage run's ``StageResult``: views of its one output (``_stage_sizes``)."""
        num_k_heads, head_k_dim, head_v_dim = heads
        rows = self._stage_rows()
        ns_rows, spec_rows = rows["non_spec"], rows["spec"]
        qk = num_k_heads * head_k_dim
        dim = 2 * qk + hv * head_v_dim
        sizes = _stage_sizes(ns_rows + spec_rows, dim, hv, buffer.element_size())
        gates = buffer[sizes["gates"]:].view(torch.float32)
        outputs = []
        for rows, first, g0 in ((ns_rows, 0, 0),
                                (spec_rows, ns_rows * dim, 2 * ns_rows * hv)):
            if not rows:
                outputs.append(None)
                continue
            qk_rows, g_rows = rows * qk, rows * hv
            outputs.append(StageOutputs(
                q=buffer[first:first + qk_rows].view(rows, num_k_heads, head_k_dim),
                k=buffer[first + qk_rows:first + 2 * qk_rows].view(rows, num_k_heads,
                                                                    head_k_dim),
                v=buffer[first + 2 * qk_rows:first + rows * dim].view(rows, hv, head_v_dim),
                g=gates[g0:g0 + g_rows].view(rows, hv),
                beta=gates[g0 + g_rows:g0 + 2 * g_rows].view(rows, hv)))
        return StageResult(spec=outputs[1], non_spec=outputs[0])

    def _split_views(self, slots):
        """The parts' rows of an output written in slot order (SPLIT_SLOTS): the non-spec
        part's slots first, then the spec part's."""
        spec, non_spec = self.part_tokens
        return SplitOutputs(slots[non_spec:non_spec + spec] if spec else None,
                            slots[:non_spec] if non_spec else None)

    def _check_windows(self, windows, x, extents):
        return validation.check_windows(windows, x, self.window_rows, self.window_steps,
                                        self.geometry.width, extents)

    def _launch_split(self, backend, tensors, silu, math, dtype, split, windows=None):
        """Launch with split outputs (``run``'s out_spec / out_non_spec), checked first."""
        x, weight, bias, conv_state, out = tensors
        validation.check_writable(x, weight, bias, conv_state, out)
        extents = validation.check_aliasing(x, weight, bias, conv_state, out, self.lines)
        self._check_windows(windows, x, extents)
        out_spec, out_non_spec = (registry.normalize(t, n)
                                  for t, n in zip(split, validation.SPLIT_NAMES))
        validation.check_split_outputs(x, weight, bias, conv_state, (out_spec, out_non_spec),
                                       self.part_tokens, extents)
        result = SplitOutputs(*split)
        if validation.shape_of(x)[1] == 0 or self.num_blocks == 0 or \
                (out_spec is None and out_non_spec is None):
            return result
        # A part without tokens writes no row: the backend passes x in its place.
        x = registry.channels_contiguous(x)
        backend.launch(self, Launch(x=x, weight=weight, bias=bias, conv_state=conv_state,
                                    out=None, target=out_non_spec, silu=silu, math=math,
                                    dtype=dtype, extents=extents, zero_copy=False, key=None,
                                    split=SPLIT_PARTS, out2=out_spec,
                                    spec_slot0=self.spec_slot0, windows=windows))
        return result

    def _launch(self, backend, tensors, silu, math, dtype, key, split=SPLIT_NONE,
                windows=None):
        """Launch on checked tensors (``run_checked`` checked them). With a ``key`` the
        backend may keep a zero-copy launch for the next run with the same key.
        ``split``: SPLIT_NONE, or SPLIT_SLOTS (out is None: a new output in slot order)."""
        x, weight, bias, conv_state, out = tensors
        validation.check_writable(x, weight, bias, conv_state, out)
        extents = validation.check_aliasing(x, weight, bias, conv_state, out, self.lines)
        self._check_windows(windows, x, extents)
        dim = validation.shape_of(x)[1]
        # The kernel needs channels contiguous in x and out (see kernels.abi). out may also
        # alias x, and the kernel reads neighbouring rows of x: then compute into a
        # separate buffer and copy (both rare; correctness over a saved copy).
        x_given, x = x, registry.channels_contiguous(x)
        x_extent = extents["x"] if x is x_given else arrays.byte_extent(x)
        target = out
        into_x = self.in_place and x is x_given and out is not None and \
            extents["out"] == x_extent and validation.shape_of(out) == validation.shape_of(x) \
            and tuple(out.stride()) == tuple(x.stride())
        if out is None or (arrays.extents_meet(extents["out"], x_extent) and not into_x) or \
                not arrays.has_unit_channel_stride(out):
            if out is not None and not arrays.can_assign(out):
                raise ValueError(f"out: a {type(out.source).__name__} that overlaps x or "
                                 f"has strided channels cannot be written through a copy; "
                                 f"pass out=None or a separate array with contiguous "
                                 f"channels")
            target = backend.empty_output(x, validation.shape_of(x), dtype)
        if dim == 0 or self.num_blocks == 0:
            return _finish(out, target)
        zero_copy = x is x_given and (target is out or out is None)
        backend.launch(self, Launch(x=x, weight=weight, bias=bias, conv_state=conv_state,
                                    out=out, target=target, silu=silu, math=math, dtype=dtype,
                                    extents=extents, zero_copy=zero_copy, key=key,
                                    split=split, windows=windows))
        return _finish(out, target)


def _stage_sizes(rows, dim, hv, itemsize):
    """Where a stage run's one output (elements of x's dtype) of ``rows`` rows in all
    holds what: the non-spec part's q | k | v from 0, the spec part's after it, then
    (from "gates", 16-byte aligned) the float32 gates: the non-spec part's g and beta,
    then the spec part's; "total" elements in all."""
    per16 = 16 // itemsize
    gates = -(-rows * dim // per16) * per16
    return dict(gates=gates, total=gates + 2 * rows * hv * 4 // itemsize)


def split_request(split, out_spec, out_non_spec):
    """What ``run_checked`` takes for a call's split arguments: None (one output), True
    (new split outputs) or (out_spec, out_non_spec) (the caller's)."""
    if out_spec is not None or out_non_spec is not None:
        return (out_spec, out_non_spec)
    if not isinstance(split, (bool, np.bool_)):
        raise TypeError(f"split: expected True or False, got {split!r}")
    return True if split else None


def _finish(out, target):
    if out is not None and target is not out:
        arrays.assign(out, target)
        target = out
    return target.source if isinstance(target, arrays.UsmArray) else target
