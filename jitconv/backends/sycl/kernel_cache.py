"""Persistent SPIR-V cache: compile a kernel specialization once per machine, not once
per process.

numba-dpex has no on-disk cache, and a first compile costs 1-3 s (numba typing,
llvm-spirv, OpenCL build). SPIR-V is portable, so jitconv keeps what numba-dpex produced
on disk, with the argument layout it expects, and later processes launch it through dpctl
alone: they import neither numba nor numba-dpex. The same files can ship with the package
(``python -m jitconv build-kernels --ship``), which is what lets jitconv run with dpctl
only (e.g. beside torch XPU, whose SYCL runtime numba-dpex 0.23 cannot share).

Where entries are looked up, in order:
1. ``$JITCONV_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/jitconv`` (``~/.cache/jitconv``):
   read and written;
2. ``jitconv/prebuilt/`` inside the package ("shipped"): read only. The wheel carries
   SPIR-V for every supported width and dtype there (committed, regenerated with
   ``python -m jitconv build-kernels --ship``; tests/test_prebuilt.py fails when they no
   longer match the kernel source). JITCONV_NO_SHIPPED_KERNELS=1 skips them (the test
   suite does, so that the compile path runs).

An entry is ``<key>.spv`` (the SPIR-V) plus ``<key>.json`` (kernel name, argument
layout, SHA-256 of the SPIR-V, and the versions that produced it). The key hashes what
the SPIR-V is made from: the generated kernel source (``source.name_and_source``: the
template, the width, the dtype, silu's variant, one channel per work-item or "wide"),
the code (not the comments or docstrings) of the modules that compile it
(``CODEGEN_FILES``: the intrinsics the source calls), the ABI and jitconv's version. So a
comment or docstring edit rebuilds nothing, and any change of the generated code does.
An entry whose metadata does not parse, whose checksum or ABI does not match, or (when
numba-dpex is installed) that another numba-dpex or numba version produced, is stale: it
is ignored and rebuilt, never trusted. The compiler's versions are checked from the
entry, not hashed into the key: an environment without numba-dpex must still find the
kernels shipped for it.
"""

import ast
import functools
import hashlib
import json
import os
import tempfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from jitconv.version import __version__
from jitconv.backends.sycl.source import name_and_source
from jitconv.backends.sycl.state import STATE
from jitconv.kernels.abi import (CONV_ARGS, STAGE_ARGS, STORAGE, SUPPORTED_WIDTHS,
                                 WIDE_CHANNELS, fast_silu)
from jitconv.kernels.planner import (METADATA_ARRAYS, PLAN_ARGS, RECORD_ARGS, RULE_ARGS,
                                     RULE_ARRAYS)

PREBUILT_DIR = Path(__file__).resolve().parent / "prebuilt"
_PACKAGE_DIR = Path(__file__).resolve().parents[2]  # jitconv/
# The modules that turn the generated source into SPIR-V: the SYCL codegen (numba-dpex
# intrinsics: fdiv, native_exp, word reads, row accesses) and the fp16/bf16 conversions.
CODEGEN_FILES = ("backends/sycl/kernels.py", "kernels/bit_conversions.py")
# The device planner's: its logic and the SYCL kernel around it.
PLANNER_FILES = ("kernels/planner.py", "backends/sycl/planner.py", "backends/sycl/kernels.py")
FORMAT = 1  # bump when the entry format changes


def cache_dir():
    """The writable cache directory (created on first write), or None when there is no
    JITCONV_CACHE_DIR, XDG_CACHE_HOME or home directory to put it in."""
    env = os.environ.get("JITCONV_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME")
    if not base:
        try:
            base = Path.home() / ".cache"
        except (RuntimeError, KeyError):  # no HOME and no passwd entry
            return None
    return Path(base) / "jitconv"


def search_dirs():
    dirs = [cache_dir()]
    if os.environ.get("JITCONV_NO_SHIPPED_KERNELS") != "1":
        dirs.append(PREBUILT_DIR)
    return [d for d in dirs if d is not None]


def origin(path):
    """'shipped' for an entry inside the package, else 'user cache'."""
    return "shipped" if Path(path).parent == PREBUILT_DIR else "user cache"


def shipped_files():
    """The entry files the package should carry: one .spv and .json per supported
    specialization (``specializations``), named by the current key (silu's math: the
    default of each dtype)."""
    keys = [key(*spec) for spec in specializations()]
    keys += [key(*spec) for spec in fused_specializations()]
    keys += [key(w, d, wide, fast, None, True) for w, d, wide, fast in chain_specializations()]
    keys += [key(w, d, wide, fast, None, chains, True)
             for w, d, wide, fast in stage_specializations() for chains in (False, True)]
    keys += [planner_key(types, kind) for kind in ("planner", "rules")
             for types in planner_specializations(kind)]
    return sorted(f"{k}{suffix}" for k in keys for suffix in (".json", ".spv"))


def specializations():
    """(width, dtype, wide, fast) of every kernel jitconv may launch: each supported width
    and dtype, its wide kernel where the dtype has one, each with silu's two maths."""
    return [(w, d, wide, fast) for w in SUPPORTED_WIDTHS for d in STORAGE
            for wide in ((False, True) if d in WIDE_CHANNELS else (False,))
            for fast in (False, True)]


def _dist_version(name):
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def compiler_versions():
    """Versions of the toolchain that would compile a missing kernel (None if absent)."""
    return {"numba-dpex": _dist_version("numba-dpex"), "numba": _dist_version("numba")}


def _abi(record_types=None, stage=False):
    """The argument layout an entry's SPIR-V expects: ``CONV_ARGS``, and a fused kernel's
    record arguments with its metadata's element types, or a stage kernel's
    ``STAGE_ARGS``."""
    abi = [list(a) for a in CONV_ARGS]
    if record_types is not None:
        abi.append([list(RECORD_ARGS), list(record_types)])
    if stage:
        abi.append([list(a) for a in STAGE_ARGS])
    return abi


@functools.lru_cache(maxsize=None)
def _code_fingerprint(files=CODEGEN_FILES):
    """SHA-256 of the code of ``files`` (paths under jitconv/): their syntax trees without
    docstrings (and so without comments), immune to edits of either, written out by
    ``_tree_text``, which every Python version writes alike."""
    h = hashlib.sha256()
    for name in files:
        tree = ast.parse((_PACKAGE_DIR / name).read_text())
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and \
                    isinstance(getattr(body[0], "value", None), ast.Constant) and \
                    isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
        h.update(_tree_text(tree).encode())
    return h.hexdigest()


def _tree_text(node):
    """A syntax tree as text: each node's type and its fields that hold something. Not
    ``ast.dump``, whose text depends on the Python version for the same code (3.12 added
    an empty ``type_params`` to every function, 3.13 leaves empty fields out), which
    would give shipped kernels keys that only the Python that built them finds."""
    if isinstance(node, ast.AST):
        fields = []
        for name in node._fields:
            value = getattr(node, name, None)
            if value is not None and not (isinstance(value, list) and not value):
                fields.append(f"{name}={_tree_text(value)}")
        return f"{type(node).__name__}({', '.join(fields)})"
    if isinstance(node, list):
        return f"[{', '.join(_tree_text(v) for v in node)}]"
    return repr(node)


def key(width, dtype_name, wide=False, fast=None, record_types=None, chains=False,
        stage=False):
    """Hash of everything that changes the SPIR-V (see the module docstring). ``fast``:
    silu's fast math or not (None: the dtype's default, ``abi.fast_silu``);
    ``record_types``: the fused kernel for device plans with metadata of those element
    types (its code then also comes from PLANNER_FILES); ``chains``: the kernel with the
    chain piece (parent maps, windows); ``stage``: the GDN stage's kernel."""
    fast = fast_silu(dtype_name) if fast is None else fast
    fused = record_types is not None
    name, source = name_and_source(width, dtype_name, fast, wide, fused, chains, stage)
    code = _code_fingerprint() + (_code_fingerprint(PLANNER_FILES) if fused else "")
    h = hashlib.sha256(json.dumps([FORMAT, __version__, _abi(record_types, stage), name,
                                   source, code]).encode())
    kind = f"_fused_{record_types[1]}_{record_types[2]}" if fused else ""
    kind += "_chains" if chains and not fused else ""
    kind += "_gdn" if stage else ""
    return f"conv_w{width}_{dtype_name}{'_wide' if wide else ''}{kind}_{h.hexdigest()[:20]}"



def planner_key(element_types, kind="planner"):
    """Hash of everything that changes a device planner's SPIR-V
    (``backends/sycl/planner.py``; ``kind`` "planner" or "rules"): the element types of
    its arrays, its argument list and the code of the modules it is made from
    (PLANNER_FILES)."""
    h = hashlib.sha256(json.dumps([FORMAT, __version__, _planner_abi(element_types, kind),
                                   _code_fingerprint(PLANNER_FILES)]).encode())
    # named by the cache lines' and the flags' types, or the parents' and the write
    # lines' (the hash covers every array's)
    shown = (1, 2) if kind == "planner" else (1, 5)
    return (f"{kind}_{element_types[shown[0]]}_{element_types[shown[1]]}_"
            f"{h.hexdigest()[:20]}")


def _planner_abi(element_types, kind="planner"):
    return [list(PLAN_ARGS if kind == "planner" else RULE_ARGS), list(element_types)]


def planner_specializations(kind="planner"):
    """Element types (``planner.METADATA_ARRAYS`` order, or ``RULE_ARRAYS`` for the rule
    planner) of the planners the package ships: every array int32, or every array
    int64, the initial-state flags either of that type or one byte (bool / uint8).
    Other mixes are compiled where numba-dpex is installed."""
    if kind == "rules":
        return [(index,) * len(RULE_ARRAYS) for index in ("int32", "int64")]
    found = []
    for index in ("int32", "int64"):
        for flags in ("uint8", index):
            found.append(tuple(flags if a == "ns_init" else index for a in METADATA_ARRAYS))
    return found


# The fused conv kernels shipped (device plans: one submit per run), by width: those of
# the models jitconv is for (Qwen3-Next / Qwen3.5 GDN layers and Mamba layers: width 4).
# Other widths compile where numba-dpex is installed, else a device plan submits its
# planner before the kernel that reads the tables.
FUSED_WIDTHS = (4,)


# The kernels with the chain piece shipped (steps with parent maps or intermediate
# windows: EAGLE-tree verify, SGLang's target verify), by width: the engines' width. A
# process that holds torch XPU's SYCL runtime cannot load numba-dpex, so what an engine
# there needs must ship; other widths compile where numba-dpex is installed.
CHAIN_WIDTHS = (4,)


def chain_specializations():
    """(width, dtype, wide, fast) of the kernels with the chain piece the package ships:
    each width of CHAIN_WIDTHS and dtype, one-channel and wide, silu's two maths."""
    return [s for s in specializations() if s[0] in CHAIN_WIDTHS]


# The GDN stage's kernels shipped (``jitconv.gdn_conv_stage``), by width: the GDN layers'.
# With and without the chain piece: a stage of a step with parent maps (a spec tree) runs
# in a process that holds torch XPU's runtime, where nothing compiles.
STAGE_WIDTHS = (4,)


def stage_specializations():
    """(width, dtype, wide, fast) of the GDN stage kernels the package ships, each with and
    without the chain piece: each width of STAGE_WIDTHS and dtype, one-channel and wide,
    silu's default math."""
    return [s for s in specializations()
            if s[0] in STAGE_WIDTHS and s[3] == fast_silu(s[1])]


def fused_specializations():
    """(width, dtype, wide, fast, record types) of the fused kernels the package ships:
    each width of FUSED_WIDTHS and dtype, one-channel and wide, silu's default math, for
    every set of metadata types a planner is shipped for."""
    return [(w, d, wide, fast_silu(d), types) for w in FUSED_WIDTHS for d in STORAGE
            for wide in ((False, True) if d in WIDE_CHANNELS else (False,))
            for types in planner_specializations()]


def load(width, dtype_name, wide=False, fast=None, record_types=None, chains=False,
         stage=False):
    """(spirv bytes, kernel name, path) of a valid entry, or None. Stale entries are
    recorded in the backend state's ``rejected`` and ignored."""
    return _load(key(width, dtype_name, wide, fast, record_types, chains, stage),
                 _abi(record_types, stage))


def load_planner(element_types, kind="planner"):
    """``load`` for the device planner of ``kind`` for these element types."""
    return _load(planner_key(element_types, kind), _planner_abi(element_types, kind))


def _load(k, abi):
    # The compiler's versions are checked here rather than hashed into the key: an
    # environment without numba-dpex must still find the entries shipped for it. numba
    # alone is not a compiler of ours (vLLM installs numba, never numba-dpex): its
    # version matters only beside numba-dpex.
    versions = compiler_versions()
    installed = {k: v for k, v in versions.items() if v} if versions["numba-dpex"] else {}
    for directory in search_dirs():
        meta_path, spv_path = directory / f"{k}.json", directory / f"{k}.spv"
        if not meta_path.exists():
            continue
        problem = None
        try:
            meta = json.loads(meta_path.read_text())
            spirv = spv_path.read_bytes()
            if meta.get("format") != FORMAT or meta.get("abi") != abi:
                problem = "format or argument layout differs"
            elif hashlib.sha256(spirv).hexdigest() != meta.get("sha256"):
                problem = "checksum mismatch (corrupt SPIR-V)"
            elif any(meta.get(tool) != v for tool, v in installed.items()):
                tool = next(t for t, v in installed.items() if meta.get(t) != v)
                problem = f"built by {tool} {meta.get(tool)}, {installed[tool]} is installed"
        except (OSError, ValueError, AttributeError) as exc:
            problem = f"unreadable ({exc})"
        if problem:
            STATE.rejected.append((str(meta_path), problem))
            continue
        return spirv, meta["kernel_name"], spv_path
    return None



def store(width, dtype_name, spirv, kernel_name, directory=None, wide=False, fast=None,
          record_types=None, chains=False, stage=False):
    """Write an entry atomically (a concurrent reader sees the old state or the new one,
    never half a file). Returns the path of the SPIR-V file."""
    fast = fast_silu(dtype_name) if fast is None else fast
    meta = {"width": width, "dtype": dtype_name, "wide": wide, "fast": fast,
            "abi": _abi(record_types, stage)}
    if record_types is not None:
        meta["record_types"] = list(record_types)
    if chains:
        meta["chains"] = True
    if stage:
        meta["stage"] = True
    return _store(key(width, dtype_name, wide, fast, record_types, chains, stage), meta, spirv,
                  kernel_name, directory)


def store_planner(element_types, spirv, kernel_name, directory=None, kind="planner"):
    """``store`` for the device planner of ``kind`` for these element types."""
    meta = {kind: list(element_types), "abi": _planner_abi(element_types, kind)}
    return _store(planner_key(element_types, kind), meta, spirv, kernel_name, directory)


def _store(k, meta, spirv, kernel_name, directory):
    directory = Path(directory) if directory else cache_dir()
    if directory is None:
        raise OSError("no cache directory (no home directory; JITCONV_CACHE_DIR unset)")
    directory.mkdir(parents=True, exist_ok=True)
    meta = {"format": FORMAT, "kernel_name": kernel_name, **meta,
            "sha256": hashlib.sha256(spirv).hexdigest(), **compiler_versions()}
    # SPIR-V first, metadata last: an entry without metadata is never read.
    for suffix, data in ((".spv", spirv), (".json", json.dumps(meta, indent=1).encode())):
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{k}", suffix=suffix)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, directory / f"{k}{suffix}")
    return directory / f"{k}.spv"
