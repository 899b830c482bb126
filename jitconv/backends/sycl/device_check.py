"""The device check: every SYCL kernel proves itself on a known answer before its first
launch on a device, so that a runtime or driver that compiles it wrongly is refused
instead of returning wrong results.

Why: the same SPIR-V is compiled again by each device's runtime, and a compiler can be
wrong on a host it does not know. The 2024.2 OpenCL CPU runtime on AMD Zen 5 computed silu
wrongly in 12 of every 16 vector lanes while everything else was right; nothing but a
comparison with the reference could tell. An Intel GPU driver can fail the same way.

What runs: the first time a kernel (one specialization: width, dtype, one-channel or wide)
is built on a device, ``verify`` launches it on a small step with every kind of sequence
(a prefill chunk longer than a block, one without initial state, decodes, a decode whose
window starts past column 0, ragged spec verify sequences, a pad of each kind, a row no
sequence covers, rows shuffled, conv_state in vLLM's (lines, state_len, dim) storage) in
two launches, silu with bias and no activation without bias, and compares with the float64
reference (``jitconv.reference``): outputs within the dtype's tolerance, the whole
conv_state bit-exact. Inputs come from a fixed seed, so the answer is known; out is
poisoned first. A GDN stage kernel runs the same step through the stage
(``run_stage_known_answer``: its own nd-range launch and barrier, l2norm from a part's
second sequence on, gates past softplus's threshold) against the stage's reference.

The verdict: a pass is kept in this process and on disk next to the kernel cache
(``<cache dir>/checks/``), keyed by the device's name and driver, the SYCL runtime's
versions, the CPU target the runtime compiles for, and the SHA-256 of the kernel's SPIR-V
(``verdict_key``), so a machine pays for each kernel once and a changed kernel, driver or
runtime is checked again. A failure is never stored: the device is refused for the rest of
the process (``refused``: every later launch on it raises the same ``DeviceCheckError``)
and is checked again in the next one.

JITCONV_DEVICE_CHECK=0 turns the automatic check off (read once, at import); then nothing
stands between a miscompiled kernel and its results. ``python -m jitconv check`` runs the
check of every kernel on a device whatever the stored verdicts say.
"""

import hashlib
import json
import os
import tempfile
from importlib.metadata import PackageNotFoundError, version

import numpy as np
import torch

from jitconv.backends.sycl import bootstrap, devices
from jitconv.backends.sycl import bridge
from jitconv.backends.sycl import kernel_cache
from jitconv.backends.sycl.state import STATE
from jitconv import reference
from jitconv.kernels.batch import Part, build_batch
from jitconv.kernels import planner
from jitconv.backends import StageTensors
from jitconv.kernels.abi import TABLES

ENABLED = os.environ.get("JITCONV_DEVICE_CHECK", "1") != "0"
FORMAT = 1  # bump when the known-answer step or the comparison changes
_SEED = 20261202

class DeviceCheckError(RuntimeError):
    """A kernel computed a wrong answer on a device: jitconv launches nothing there."""


# ------------------------------------------------------------------ what a verdict is for

def _dist_version(name):
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def device_identity(device):
    """What decides how a dpctl.SyclDevice compiles a kernel: the device, its driver, the
    SYCL runtime and, on a CPU device, the instruction set the runtime targets."""
    identity = {
        "filter": devices.name_of(device),
        "name": device.name,
        "vendor": device.vendor,
        "driver": device.driver_version,
        "backend": device.backend.name,
        "type": device.device_type.name,
        "runtime": {name: _dist_version(name) for name in
                    ("dpctl", "intel-sycl-rt", "intel-opencl-rt", "intel-cmplr-lib-ur")},
    }
    if device.device_type.name == "cpu":
        identity["cpu_target"] = os.environ.get(bootstrap.CPU_TARGET_VARIABLE)
    return identity


def verdict_key(identity, spirv):
    """The name of a verdict: a hash of the device's identity (its filter string left
    out: the same device may be listed under another index) and of the kernel's SPIR-V."""
    ident = {k: v for k, v in identity.items() if k != "filter"}
    h = hashlib.sha256(json.dumps([FORMAT, ident], sort_keys=True).encode())
    h.update(hashlib.sha256(spirv).digest())
    return h.hexdigest()[:32]


def verdict_dir():
    directory = kernel_cache.cache_dir()
    return None if directory is None else directory / "checks"


def _stored(key):
    directory = verdict_dir()
    if directory is None:
        return False
    try:
        verdict = json.loads((directory / f"{key}.json").read_text())
    except (OSError, ValueError):
        return False
    return verdict.get("format") == FORMAT and verdict.get("passed") is True


def _store(key, identity, kernel):
    """Write a pass atomically; an unwritable cache keeps the verdict in this process only
    (the kernel cache warns about that directory already)."""
    directory = verdict_dir()
    if directory is None:
        return
    record = {"format": FORMAT, "passed": True, "device": identity, "kernel": kernel}
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{key}", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(record, f, indent=1)
        os.replace(tmp, directory / f"{key}.json")
        STATE.check_stats["stored"] += 1
    except OSError:
        pass


# ------------------------------------------------------------------ the known-answer step

def known_answer_step(width, dtype_name, consecutive=False):
    """The step every kernel is checked on: host torch tensors (x, weight, bias, conv_state
    viewed (lines, dim, state_len) from (lines, state_len, dim) storage), the two parts as
    ``batch.Part``s, and the same step in ``jitconv.reference``'s keyword arguments.
    ``consecutive``: each part's tokens in consecutive rows, non-spec then spec, the
    uncovered row last (a device plan's layout: what a fused kernel is checked on)."""
    S = width - 1
    dim = 128  # 8 16-lane vectors of one-channel work-items, 2 of wide ones
    gen = torch.Generator().manual_seed(_SEED + width)
    # non-spec: a chunk of 2 blocks, a fresh chunk, decodes (one with its window at
    # column 2), a pad; spec: ragged 1 + k with various accepted counts, a pad.
    ns_len, ns_init, ns_accepted = [21, 3, 1, 1, 2], [1, 0, 1, 1, 1], [1, 1, 1, 3, 1]
    sp_len, sp_accepted = [4, 2, 3, 1], [2, 1, 4, 1]
    ns_pad, sp_pad = 4, 3
    state_len = S - 1 + max(sp_len)  # room for the longest spec sequence and o + S
    num_seqs = len(ns_len) + len(sp_len)
    num_lines = num_seqs + 2  # two lines no sequence uses: they must stay untouched
    lines = torch.randperm(num_lines, generator=gen)[:num_seqs].to(torch.int32)
    ns_lines, sp_lines = lines[:len(ns_len)].clone(), lines[len(ns_len):].clone()
    ns_lines[ns_pad], sp_lines[sp_pad] = -1, -1
    n_ns, n_sp = sum(ns_len), sum(sp_len)
    num_tokens = n_ns + n_sp + 1  # one row no sequence covers: zeros
    rows = torch.randperm(num_tokens, generator=gen).to(torch.int32)
    if consecutive:
        rows = torch.arange(num_tokens, dtype=torch.int32)

    def values(*shape):
        return torch.randn(shape, generator=gen, dtype=torch.float32).to(
            getattr(torch, dtype_name))

    x, weight, bias = values(num_tokens, dim), values(dim, width), values(dim)
    conv_state = values(num_lines, state_len, dim).transpose(1, 2)

    def cumulative(lengths):
        return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)

    ns_rows, sp_rows = rows[:n_ns], rows[n_ns:n_ns + n_sp]
    parts = [
        Part(query_start_loc=cumulative(ns_len), lines=ns_lines.numpy().astype(np.int64),
             rows=ns_rows.numpy().astype(np.int64),
             offsets=np.where(ns_lines.numpy() >= 0, np.array(ns_accepted) - 1, 0),
             initial=np.array(ns_init, bool), spec=False),
        Part(query_start_loc=cumulative(sp_len), lines=sp_lines.numpy().astype(np.int64),
             rows=sp_rows.numpy().astype(np.int64),
             offsets=np.where(sp_lines.numpy() >= 0, np.array(sp_accepted) - 1, 0),
             initial=np.ones(len(sp_len), bool), spec=True),
    ]
    kwargs = dict(non_spec_query_start_loc=cumulative(ns_len), non_spec_state_indices=ns_lines,
                  has_initial_state=torch.tensor(ns_init, dtype=torch.bool),
                  non_spec_token_indx=ns_rows,
                  non_spec_num_accepted_tokens=torch.tensor(ns_accepted, dtype=torch.int32),
                  spec_query_start_loc=cumulative(sp_len), spec_state_indices=sp_lines,
                  spec_token_indx=sp_rows,
                  num_accepted_tokens=torch.tensor(sp_accepted, dtype=torch.int32))
    return dict(x=x, weight=weight, bias=bias, conv_state=conv_state), parts, kwargs


def _known_answer_record(kwargs, num_tokens, num_lines, state_len, width, record_types,
                         queue):
    """A fused kernel's record of the known-answer step (``consecutive``): (metadata
    views by ``planner.METADATA_ARRAYS`` name, and "errors": zeroed error words; their
    element strides; the planner's scalars)."""
    values = dict(ns_qsl=kwargs["non_spec_query_start_loc"],
                  ns_lines=kwargs["non_spec_state_indices"],
                  ns_init=kwargs["has_initial_state"],
                  ns_accepted=kwargs["non_spec_num_accepted_tokens"],
                  sp_qsl=kwargs["spec_query_start_loc"],
                  sp_lines=kwargs["spec_state_indices"],
                  sp_accepted=kwargs["num_accepted_tokens"])
    # (a fused kernel takes no token maps: the record's arrays are the others)
    views = {name: _upload(torch.as_tensor(values[name]).to(getattr(torch, element)), queue)
             for name, element in zip(planner.METADATA_ARRAYS, record_types)
             if name in values}
    views["errors"] = _upload(torch.zeros(len(planner.ERRORS), dtype=torch.int32), queue)
    num_ns, num_sp = len(values["ns_lines"]), len(values["sp_lines"])
    scalars = planner.scalars(num_ns=num_ns, num_sp=num_sp, ns_implicit=False,
                              has_ns_init=True, has_ns_accepted=True, num_tokens=num_tokens,
                              num_lines=num_lines, state_len=state_len, width=width,
                              pad_line=-1, null_line=None, skip_empty=False, max_len=None,
                              spec_first=False)
    strides = {name: 1 for name in planner.METADATA_ARRAYS}
    return views, strides, scalars


def _upload_tables(batch, queue):
    """The known-answer step's kernel tables (``batch.tables()``) in USM device memory of
    ``queue``: (a DeviceView of them, each of ``abi.TABLES``' offset in it)."""
    import dpctl.memory as dpm  # (the SYCL backend's optional dependency)
    host_tables = batch.tables()
    sizes = [len(t) for t in host_tables]
    tables = dpm.MemoryUSMDevice(4 * sum(sizes), queue=queue)
    tables.copy_from_host(np.concatenate(host_tables).astype(np.int32).view(np.uint8))
    offsets = dict(zip(TABLES, np.cumsum([0] + sizes[:-1]).tolist()))
    return bridge.DeviceView(memory=tables, offset=0, shape=(sum(sizes),), strides=(1,),
                             itemsize=4, owner=tables), offsets


def expected(tensors, kwargs, activation, with_bias):
    """The known answer: (out, new conv_state) in float64 (``jitconv.reference``)."""
    return reference.causal_conv1d_reference(
        tensors["x"], tensors["weight"], tensors["bias"] if with_bias else None,
        tensors["conv_state"], activation=activation, **kwargs)


def _upload(t, queue):
    """A DeviceView of a copy of host tensor ``t`` (its storage, same strides) in USM
    device memory of ``queue``."""
    import dpctl.memory as dpm
    storage = t if t.is_contiguous() else t.transpose(1, 2).contiguous()
    raw = storage.view(torch.int16) if storage.element_size() == 2 else storage
    data = raw.contiguous().numpy().tobytes()
    memory = dpm.MemoryUSMDevice(max(len(data), 64), queue=queue)
    memory.copy_from_host(np.frombuffer(data, np.uint8))
    strides = t.stride()  # the view's, over storage laid out as its own
    return bridge.DeviceView(memory=memory, offset=0, shape=tuple(t.shape),
                             strides=tuple(strides), itemsize=t.element_size(), owner=memory)


def _download(view, like):
    """The device copy behind ``view`` as a host tensor shaped and strided like ``like``."""
    host = np.empty(view.memory.nbytes, np.uint8)
    view.memory.copy_to_host(host)
    storage = like if like.is_contiguous() else like.transpose(1, 2)
    n = storage.numel()
    raw_dtype = torch.int16 if like.element_size() == 2 else like.dtype
    flat = torch.from_numpy(host[:n * like.element_size()].copy()).view(raw_dtype)
    result = flat.view(like.dtype if raw_dtype is torch.int16 else raw_dtype)
    result = result.reshape(storage.shape)
    return result if like.is_contiguous() else result.transpose(1, 2)


def _bits(t):
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)


def _compare(dtype_name, out, state, ref_out, ref_state):
    """'' when out and state match the known answer, else what differs."""
    rtol, atol = reference.TOLERANCE[dtype_name]
    got = out.to(torch.float64).numpy()
    bad = ~(np.abs(got - ref_out) <= atol + rtol * np.abs(ref_out))  # NaN counts as bad
    problems = []
    if bad.any():
        channels = sorted(set(np.nonzero(bad)[1].tolist()))
        err = np.abs(got - ref_out)[bad]
        problems.append(f"{int(bad.sum())} of {bad.size} outputs wrong (max |error| "
                        f"{np.nanmax(err) if not np.isnan(err).all() else 'nan'}; "
                        f"channels {channels[:8]}{'...' if len(channels) > 8 else ''})")
    want = torch.from_numpy(ref_state).to(state.dtype)
    if not torch.equal(_bits(state.contiguous()), _bits(want.contiguous())):
        wrong = int((_bits(state.contiguous()) != _bits(want.contiguous())).sum())
        problems.append(f"{wrong} of {want.numel()} conv_state values differ")
    return "; ".join(problems)


def run_known_answer(queue, width, dtype_name, launch, record_types=None):
    """Run the known-answer step through ``launch(views, tables_view, offsets, num_blocks,
    dim, has_bias, silu, record)`` (one waited launch of the kernel under test) and return
    '' or what was wrong. ``record_types``: a fused kernel's (its metadata's element
    types), which computes the step's records itself from the metadata (``record``: see
    ``_known_answer_record``) over the device plan's capacity of blocks; its error words
    must stay zero (pads are not errors)."""
    fused = record_types is not None
    tensors, parts, kwargs = known_answer_step(width, dtype_name, consecutive=fused)
    x = tensors["x"]
    batch = build_batch(parts, x.shape[0])
    tables_view, offsets = _upload_tables(batch, queue)
    problems = []
    for activation, with_bias in (("silu", True), (None, False)):
        views = {name: _upload(tensors[name], queue) for name in ("x", "weight", "bias",
                                                                 "conv_state")}
        poison = torch.full(x.shape, float("nan"), dtype=x.dtype)
        views["out"] = _upload(poison, queue)
        record, num_blocks = None, batch.num_blocks
        if fused:
            state = tensors["conv_state"]
            record = _known_answer_record(kwargs, x.shape[0], state.shape[0],
                                          state.shape[2], width, record_types, queue)
            num_blocks = record[2]["capacity"]
        launch(views, tables_view, offsets, num_blocks, x.shape[1], with_bias,
               activation is not None, record)
        out = _download(views["out"], poison)
        state = _download(views["conv_state"], tensors["conv_state"])
        ref_out, ref_state = expected(tensors, kwargs, activation, with_bias)
        problem = _compare(dtype_name, out, state, ref_out, ref_state)
        if fused:
            words = _download(record[0]["errors"], torch.zeros(record[0]["errors"].shape,
                                                                dtype=torch.int32)).tolist()
            if any(words):
                problem = "; ".join(p for p in (problem, f"error words set on valid "
                                                f"metadata: {words}") if p)
        if problem:
            problems.append(f"{activation or 'no activation'}: {problem}")
    return "; ".join(problems)


# The stage's known answer: one q / k head and two v heads of 32 over the step's 128
# channels, the non-spec part normalised from its second sequence on, the spec part
# wholly; some a + dt_bias past softplus's threshold.
STAGE_HEADS = dict(num_k_heads=1, head_k_dim=32, head_v_dim=32)
STAGE_L2NORM = {"non_spec": 21, "spec": 0}  # 21: the first non-spec sequence's length
STAGE_GATE_TOLERANCE = (2e-5, 2e-6)  # float32 gates from float32 math (rtol, atol)


def run_stage_known_answer(queue, width, dtype_name, launch):
    """Run the known-answer step through a GDN stage kernel, ``launch(views, tables_view,
    offsets, num_blocks, dim, stage, has_bias, silu, spec_slot0)`` (one waited launch),
    and return '' or what was wrong: each part's q, k, v within the dtype's tolerance of
    ``reference.gdn_conv_stage_reference``, g and beta within float32's, the conv_state
    bit-exact; outputs poisoned first."""
    tensors, parts, kwargs = known_answer_step(width, dtype_name)
    x = tensors["x"]
    T, dim = x.shape
    H, K, V = (STAGE_HEADS[k] for k in ("num_k_heads", "head_k_dim", "head_v_dim"))
    HV = (dim - 2 * H * K) // V
    gen = torch.Generator().manual_seed(_SEED + 100 + width)
    ab = (torch.randn((T, 2 * HV), generator=gen) * 3).to(x.dtype)
    ab[::5, 0] = 30.0  # a + dt_bias past softplus's threshold
    gates = dict(a=ab[:, :HV], b=ab[:, HV:],
                 A_log=torch.randn(HV, generator=gen), dt_bias=torch.randn(HV, generator=gen))
    batch = build_batch(parts, T)
    tables_view, offsets = _upload_tables(batch, queue)
    rows = {p.spec: int(p.query_start_loc[-1]) for p in parts}
    ns_rows, sp_rows = rows[False], rows[True]
    l2norm = tuple(STAGE_L2NORM.get(p, 2 ** 62) for p in ("non_spec", "spec"))
    stage = StageTensors(a=gates["a"], b=gates["b"], A_log=gates["A_log"],
                         dt_bias=gates["dt_bias"], buffer=None, gates=None,
                         part_rows=(ns_rows, sp_rows), head_k_dim=K, qk=H * K, vdim=HV * V,
                         head_v_dim=V, l2norm=l2norm, exp_g=False)
    problems = []
    for activation, with_bias in (("silu", True), (None, False)):
        views = {name: _upload(tensors[name], queue) for name in ("x", "weight", "bias",
                                                                 "conv_state")}
        poison = {"out": torch.full((ns_rows, dim), float("nan"), dtype=x.dtype),
                  "out2": torch.full((sp_rows, dim), float("nan"), dtype=x.dtype),
                  "gates": torch.full((2 * (ns_rows + sp_rows) * HV,), float("nan"))}
        views.update({name: _upload(t, queue) for name, t in poison.items()})
        views.update(ga=_upload_rows(ab, 0, HV, queue), gb=_upload_rows(ab, HV, HV, queue),
                     alog=_upload(gates["A_log"], queue), dtb=_upload(gates["dt_bias"], queue))
        launch(views, tables_view, offsets, batch.num_blocks, dim, stage, with_bias,
               activation is not None, ns_rows)
        got = {name: _download(views[name], t) for name, t in poison.items()}
        state = _download(views["conv_state"], tensors["conv_state"])
        want, want_state = reference.gdn_conv_stage_reference(
            x, tensors["weight"], tensors["bias"] if with_bias else None,
            tensors["conv_state"], **gates, **STAGE_HEADS, activation=activation,
            use_l2norm=STAGE_L2NORM, **kwargs)
        problem = _compare_stage(dtype_name, got, state, want, want_state, H * K, HV)
        if problem:
            problems.append(f"{activation or 'no activation'}: {problem}")
    return "; ".join(problems)


def _upload_rows(t, first, count, queue):
    """A DeviceView of columns first..first + count of host matrix ``t``: a and b as
    views of one projection output, as the layer has them."""
    whole = _upload(t, queue)
    return bridge.DeviceView(memory=whole.memory, offset=first, shape=(t.shape[0], count),
                             strides=t.stride(), itemsize=t.element_size(), owner=whole.owner)


def _compare_stage(dtype_name, got, state, want, want_state, qk, HV):
    """'' when a stage run's outputs (``got``: out, out2, gates as stored) and state match
    the known answer, else what differs."""
    problems, gate_at = [], 0
    for part, buffer in (("non_spec", got["out"]), ("spec", got["out2"])):
        n, ref = buffer.shape[0], want[part]
        flat = buffer.reshape(-1)
        fields = {"q": flat[:n * qk], "k": flat[n * qk:2 * n * qk], "v": flat[2 * n * qk:]}
        for name, values in fields.items():
            problems.append(_compare_values(f"{part} {name}", values.to(torch.float64),
                                            ref[name].reshape(-1),
                                            reference.TOLERANCE[dtype_name]))
        for name in ("g", "beta"):
            values = got["gates"][gate_at:gate_at + n * HV].to(torch.float64)
            gate_at += n * HV
            problems.append(_compare_values(f"{part} {name}", values, ref[name].reshape(-1),
                                            STAGE_GATE_TOLERANCE))
    want_state = torch.from_numpy(want_state).to(state.dtype)
    if not torch.equal(_bits(state.contiguous()), _bits(want_state.contiguous())):
        wrong = int((_bits(state.contiguous()) != _bits(want_state.contiguous())).sum())
        problems.append(f"{wrong} of {want_state.numel()} conv_state values differ")
    return "; ".join(p for p in problems if p)


def _compare_values(what, got, want, tolerance):
    rtol, atol = tolerance
    got = got.numpy()
    bad = ~(np.abs(got - want) <= atol + rtol * np.abs(want))  # NaN counts as bad
    if not bad.any():
        return ""
    return f"{int(bad.sum())} of {bad.size} {what} outputs wrong"


# ------------------------------------------------------------------ the gate

def refusal(device_filter):
    """The DeviceCheckError that refused this device in this process, or None."""
    return STATE.refused.get(device_filter)


def refused_any():
    """Whether any device was refused in this process (one test per launch)."""
    return bool(STATE.refused)


def verify(queue, width, dtype_name, wide, spirv, launch, force=False, fast=None,
           record_types=None, chains=False, stage=False):
    """Make sure the kernel whose SPIR-V is ``spirv``, built for ``queue``'s device, passed
    the known-answer check there: from this process, the stored verdicts or a run now
    (always a run with ``force``). Raises DeviceCheckError (and refuses the device) when
    it computes a wrong answer. Returns 'passed', 'stored' or 'checked' (how it was
    known), or 'off' when the automatic check is disabled."""
    device = queue.sycl_device
    if not force:
        if not ENABLED:
            return "off"
        refused = STATE.refused.get(devices.name_of(device))
        if refused is not None:
            raise refused
    identity = device_identity(device)
    key = verdict_key(identity, spirv)
    if not force:
        if key in STATE.checks_passed:
            return "passed"
        if _stored(key):
            STATE.checks_passed.add(key)
            STATE.check_stats["read"] += 1
            return "stored"
    kernel = {"width": width, "dtype": dtype_name, "wide": bool(wide),
              "cache_key": kernel_cache.key(width, dtype_name, wide, fast, record_types,
                                            chains, stage)}
    if record_types is not None:
        kernel["record_types"] = list(record_types)
    if stage:
        kernel["stage"] = True
        problem = run_stage_known_answer(queue, width, dtype_name, launch)
    else:
        problem = run_known_answer(queue, width, dtype_name, launch, record_types)
    STATE.check_stats["checked"] += 1
    if problem:
        error = DeviceCheckError(_message(identity, kernel, problem))
        STATE.refused.setdefault(devices.name_of(device), error)
        raise error
    STATE.checks_passed.add(key)
    _store(key, identity, kernel)
    return "checked"


def _message(identity, kernel, problem):
    runtime = ", ".join(f"{k} {v}" for k, v in identity["runtime"].items() if v)
    lines = [
        f"jitconv: the device check failed on {identity['filter']} ({identity['name']}, "
        f"driver {identity['driver']}; {runtime or 'runtime version unknown'}): the "
        f"kernel width={kernel['width']} dtype={kernel['dtype']}"
        f"{' (wide)' if kernel['wide'] else ''}"
        f"{' (fused, for device plans)' if 'record_types' in kernel else ''}"
        f"{' (the GDN stage)' if kernel.get('stage') else ''} "
        f"[{kernel['cache_key']}] computed a wrong "
        f"answer on the known-answer step: {problem}.",
        "jitconv launches nothing more on this device in this process; no result of it "
        "was returned.",
        "What to try:"]
    if identity["type"] == "cpu":
        target = identity.get("cpu_target")
        lines.append(
            f"- the CPU runtime compiled for CL_CONFIG_CPU_TARGET_ARCH={target or '(unset)'}"
            f": set it before the process starts to another target your CPU supports "
            f"(skx = AVX-512, core-avx2 = AVX2, corei7-avx = AVX, corei7 = SSE4.2), and "
            f"import jitconv before dpctl so that its own choice is made in time;")
        lines.append("- the 2026 SYCL runtime (requirements-dpctl-0.22.txt: dpctl 0.22.1 "
                     "with the intel-*-rt 2026.2 wheels), which computes correctly where "
                     "2024.2 was seen not to;")
    else:
        lines.append("- another driver version for this GPU, or the 2026 SYCL runtime "
                     "(requirements-dpctl-0.22.txt);")
    lines.append("- `python -m jitconv check` prints every kernel's verdict on this device. "
                 "JITCONV_DEVICE_CHECK=0 skips the check, and with it the only guard "
                 "against wrong results.")
    return "\n".join(lines)
