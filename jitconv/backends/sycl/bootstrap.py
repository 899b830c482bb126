"""Make the pip-installed oneAPI runtime importable in a plain virtual environment.

Why this exists: the Intel runtime wheels (intel-sycl-rt, intel-opencl-rt, mkl, ...) put
their shared libraries in ``<prefix>/lib`` with RPATHs that do not point there, and the
OpenCL ICD file they ship names a placeholder build path. Without help, ``import dpctl``
may fail with ``libintlc.so.5: cannot open shared object file`` and, once that is fixed,
``dpctl.get_devices()`` is empty. Conda environments and oneAPI installs set
LD_LIBRARY_PATH / OCL_ICD_FILENAMES themselves; a venv does not.

Where the libraries are: read from the installed distributions' own file lists
(importlib.metadata), starting from the package that needs them (dpctl, dpnp,
numba-dpex) and following its requirements (intel-sycl-rt, intel-cmplr-lib-rt, mkl, ...).
No directory or soname is guessed, so libsycl.so.7 (2024.x), .8 (2025.x) and .9 (2026.x)
are all found the same way.

What it does, before dpctl is imported (and only then):
1. If OCL_ICD_FILENAMES is unset, point it at intel-opencl-rt's ``libintelocl.so`` so the
   OpenCL loader finds the Intel CPU runtime (the ``opencl:cpu`` SYCL device).
2. Unless the runtime's directory is already on LD_LIBRARY_PATH, preload the libraries
   dpctl's extension modules need, transitively. The dynamic loader then finds them by
   soname when the extension modules load. dpnp's and numba-dpex's much larger closures
   (oneMKL) are preloaded only when those packages are imported (a meta-path hook), which
   jitconv itself does only to compile a kernel. RTLD_LAZY matters: MKL's core and
   threading layers need each other's symbols, so neither can be bound eagerly before the
   other is loaded.

3. On a CPU that is not Intel's, with a CPU runtime older than 2026, and only if
   CL_CONFIG_CPU_TARGET_ARCH is unset, set it to the widest instruction set the CPU reports
   (``cpu_target_arch``). The 2024.2 OpenCL CPU runtime does not know AMD Zen 5 ("SYCL CPU
   RT Warning: Unknown host CPU") and then compiles silu wrongly in 12 of every 16 vector
   lanes; told the target, it compiles right. The 2026 runtimes compute right there on
   their own, and their own choice was as fast or faster than ``skx`` (docs/performance.md):
   they are left alone, as Intel CPUs are. The runtime reads the variable when it starts,
   so this must happen before dpctl loads it.

Variables the user set are respected; JITCONV_NO_BOOTSTRAP=1 disables all of this. Whatever
the runtime then compiles, every kernel passes the device check (``device_check``) before
its first launch.
"""

import csv
import ctypes
import functools
import importlib.abc
import importlib.metadata as metadata
import mmap
import os
import re
import struct
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

# Top-level package -> its distribution. dpctl's closure is loaded at import; the others
# when they are first imported.
_DISTRIBUTIONS = {"dpctl": "dpctl", "dpnp": "dpnp", "numba_dpex": "numba-dpex"}
_ICD_DISTRIBUTION = "intel-opencl-rt"  # not a requirement of dpctl 0.22: named here
# Loaded RTLD_GLOBAL: oneMKL's SYCL libraries use mkl_core / threading-layer symbols
# without listing those libraries as needed, and libmkl_sycl_dft needs `fftw3_mkl`, which
# only the interface layers define. We make the LP64 interface global for it, never the
# ILP64 one that dpnp links: a global ILP64 `dgemm_` would shadow torch's LP64 BLAS entry
# points and corrupt every torch matmul in the process (seen: "Parameter 13 was incorrect
# on entry to DGEMM"). Everything else is loaded RTLD_LOCAL: found by soname when an
# extension needs it, never overriding other code's symbols (libimf exports exp/sin/pow).
_GLOBAL = ("libmkl_core.", "libmkl_tbb_thread.", "libmkl_sequential.", "libmkl_intel_thread.",
           "libmkl_gnu_thread.", "libmkl_intel_lp64.")
_LIBRARY = re.compile(r"lib[^/]*\.so(\.\d+)*$")
_PLUGIN = re.compile(r"lib(pi|ur_adapter)_\w+\.so$")


@dataclass(eq=False)
class Runtime:
    """What this process's bootstrap did (once per process: environment variables set and
    libraries loaded cannot be taken back, so nothing here is ever cleared)."""
    # re-entered if reading metadata imports a hooked name
    lock: threading.RLock = field(default_factory=threading.RLock)
    done: bool = False
    skip_preload: bool = False  # the runtime is on LD_LIBRARY_PATH, or bootstrapping is off
    preloaded_for: set = field(default_factory=set)
    preloaded: list = field(default_factory=list)  # sonames loaded, for `jitconv info`
    dpctl_imported_first: bool = False  # dpctl was imported before jitconv could prepare it
    icd_set: object = None  # the OCL_ICD_FILENAMES value we set, if we set one
    cpu_target_set: object = None  # the CL_CONFIG_CPU_TARGET_ARCH value we set, if one


RUNTIME = Runtime()

CPU_TARGET_VARIABLE = "CL_CONFIG_CPU_TARGET_ARCH"
# The Intel OpenCL CPU runtime's targets, widest first, each with the CPU flags (as Linux
# names them in /proc/cpuinfo) that its code uses: skx = AVX-512 (F, CD, BW, DQ, VL),
# core-avx2 = AVX2 with FMA and BMI2, corei7-avx = AVX, corei7 = SSE4.2.
CPU_TARGETS = (
    ("skx", frozenset({"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"})),
    ("core-avx2", frozenset({"avx2", "fma", "bmi1", "bmi2"})),
    ("corei7-avx", frozenset({"avx", "sse4_2", "popcnt"})),
    ("corei7", frozenset({"sse4_2", "popcnt"})),
)


def cpu_target_arch(vendor, flags):
    """The CL_CONFIG_CPU_TARGET_ARCH to set for a CPU of ``vendor`` (cpuinfo's vendor_id)
    with feature ``flags``: None for Intel CPUs (the runtime knows them), else the widest
    target whose instructions the CPU has (None if it lacks even SSE4.2)."""
    if vendor == "GenuineIntel":
        return None
    flags = set(flags)
    for target, needs in CPU_TARGETS:
        if needs <= flags:
            return target
    return None


def host_cpu(path="/proc/cpuinfo"):
    """(vendor_id, set of flags) of the first CPU in ``path``; (None, set()) where there is
    no such file (not Linux) or it names neither."""
    vendor, flags = None, set()
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "vendor_id" and vendor is None:
                    vendor = value.strip()
                elif key == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        pass
    return vendor, flags


KNOWS_HOSTS_FROM = 2026  # CPU runtimes of this year and later pick their own target


def cpu_runtime_year():
    """The release year of the installed Intel OpenCL CPU runtime (intel-opencl-rt's
    version starts with it), or None when it is not a pip distribution (oneAPI, conda)."""
    try:
        return int(metadata.version(_ICD_DISTRIBUTION).split(".")[0])
    except (metadata.PackageNotFoundError, ValueError):
        return None


def _set_cpu_target():
    if CPU_TARGET_VARIABLE in os.environ:
        return
    year = cpu_runtime_year()
    if year is not None and year >= KNOWS_HOSTS_FROM:
        return
    vendor, flags = host_cpu()
    target = cpu_target_arch(vendor, flags) if vendor else None
    if target is not None:
        os.environ[CPU_TARGET_VARIABLE] = RUNTIME.cpu_target_set = target


def _requirement_names(dist):
    for req in dist.requires or ():
        if "extra ==" not in req:
            yield re.split(r"[\s;<>=!~\[(]", req.strip(), maxsplit=1)[0]


def _closure(name):
    """The installed distribution ``name`` and everything it requires, transitively."""
    found, todo, seen = [], [name], set()
    while todo:
        key = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = metadata.distribution(key)
        except metadata.PackageNotFoundError:
            continue
        found.append(dist)
        todo.extend(_requirement_names(dist))
    return found


def _shared_objects(dist):
    """Absolute paths of the shared objects a distribution installed, from its RECORD.
    Read as CSV here rather than through ``dist.files``: building a path object for each
    of intel-sycl-rt's ~2500 files tripled the import time."""
    paths = []
    lines = [line for line in (dist.read_text("RECORD") or "").splitlines() if ".so" in line]
    for row in csv.reader(lines):
        name = row[0].rsplit("/", 1)[-1] if row else ""
        if name.endswith(".so") or ".so." in name:
            path = Path(dist.locate_file(row[0])).resolve()
            if path.exists():
                paths.append(path)
    return paths


@functools.lru_cache(maxsize=None)
def runtime_libraries(name="dpctl"):
    """soname -> path for every library of ``name``'s distribution closure (and of
    intel-opencl-rt, whose ICD provides opencl:cpu). Cached: installs do not change
    under a running process."""
    libs = {}
    dists = _closure(name) + _closure(_ICD_DISTRIBUTION)
    for dist in dists:
        for path in _shared_objects(dist):
            if _LIBRARY.match(path.name):
                libs.setdefault(path.name, path)
    return libs


def runtime_lib_dir():
    """The directory holding the SYCL runtime (libsycl.so.N, whatever N), or None."""
    for soname, path in runtime_libraries().items():
        if re.fullmatch(r"libsycl\.so\.\d+", soname):
            return path.parent
    return None


def _elf_needed(path):
    """DT_NEEDED entries of a little-endian ELF64 shared object (empty on anything else)."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            if m[:4] != b"\x7fELF" or m[4] != 2 or m[5] != 1:
                return []
            shoff, = struct.unpack_from("<Q", m, 0x28)
            shentsize, shnum = struct.unpack_from("<HH", m, 0x3A)
            sections = [struct.unpack_from("<IIQQQQII", m, shoff + i * shentsize)
                        for i in range(shnum)]
            needed = []
            for _name, sh_type, _fl, _addr, off, size, link, _info in sections:
                if sh_type != 6:  # SHT_DYNAMIC
                    continue
                stroff = sections[link][4]
                for pos in range(off, off + size, 16):
                    tag, val = struct.unpack_from("<qQ", m, pos)
                    if tag == 0:
                        break
                    if tag == 1:  # DT_NEEDED
                        end = m.find(b"\0", stroff + val)
                        needed.append(m[stroff + val:end].decode())
            return needed
    except (OSError, ValueError, struct.error, IndexError):
        return []


def _load_order(roots, libs):
    """Post-order walk of the needed-library graph restricted to ``libs``, so that a
    library comes after what it needs. Children are walked in reverse: link lines list
    high-level libraries before the ones they rely on (mkl_sycl_* ... mkl_core), and some
    of them (mkl_sycl_*) use mkl_core symbols in constructors without declaring it."""
    order, seen = [], set()

    def visit(path):
        for name in reversed(_elf_needed(path)):
            if name not in seen and name in libs:
                seen.add(name)
                visit(libs[name])
                order.append(name)

    for root in roots:
        visit(root)
    if "libmkl_sycl_dft.so.4" in order and "libmkl_intel_lp64.so.2" in libs:
        order.insert(order.index("libmkl_sycl_dft.so.4"), "libmkl_intel_lp64.so.2")
    return order


def _preload(package):
    """Load the libraries ``package``'s extension modules need (once per package)."""
    with RUNTIME.lock:
        if package in RUNTIME.preloaded_for or RUNTIME.skip_preload:
            return
        RUNTIME.preloaded_for.add(package)
        try:
            dist = metadata.distribution(_DISTRIBUTIONS[package])
        except metadata.PackageNotFoundError:
            return
        libs = runtime_libraries(dist.metadata["Name"])
        roots = [p for p in _shared_objects(dist) if not _LIBRARY.match(p.name)]
        if package == "dpctl":
            # Opened by path at device discovery, not linked: the OpenCL ICD, and the
            # SYCL runtime's backend plugins (libpi_* in 2024.x, libur_adapter_* later;
            # 2026.2 builds the OpenCL adapter into libsycl). Their own dependencies
            # (libOpenCL.so.1, libtbb, ...) must be loadable by soname.
            roots += [path for soname, path in libs.items()
                      if soname == "libintelocl.so" or _PLUGIN.match(soname)]
        pending = [name for name in _load_order(roots, libs) if name not in RUNTIME.preloaded]
        while pending:
            failed = []
            for name in pending:
                flags = os.RTLD_LAZY | (os.RTLD_GLOBAL if name.startswith(_GLOBAL)
                                        else os.RTLD_LOCAL)
                try:
                    ctypes.CDLL(str(libs[name]), mode=flags)
                    RUNTIME.preloaded.append(name)
                except OSError:
                    failed.append(name)  # a dependency is not loaded yet: retry next round
            if len(failed) == len(pending):
                break  # no progress; the import itself will report what is missing
            pending = failed


class _PreloadOnImport(importlib.abc.MetaPathFinder):
    """Preloads dpnp's / numba-dpex's libraries right before their first import, then
    lets the normal finders import them."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname in _DISTRIBUTIONS:
            _preload(fullname)
        return None


def bootstrap():
    with RUNTIME.lock:
        if RUNTIME.done:
            return
        RUNTIME.done = True
    if os.environ.get("JITCONV_NO_BOOTSTRAP") == "1":
        return
    RUNTIME.dpctl_imported_first = "dpctl" in sys.modules
    _set_cpu_target()
    libs = runtime_libraries()
    icd = libs.get("libintelocl.so")
    if "OCL_ICD_FILENAMES" not in os.environ and icd is not None:
        os.environ["OCL_ICD_FILENAMES"] = RUNTIME.icd_set = str(icd)
    lib_dir = runtime_lib_dir()
    on_path = [Path(p) for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p]
    if lib_dir is None or any(p.exists() and p.resolve() == lib_dir for p in on_path):
        RUNTIME.skip_preload = True
        return
    _preload("dpctl")
    sys.meta_path.insert(0, _PreloadOnImport())


def no_device_hint():
    """Why there may be no SYCL device, when jitconv can tell (for error messages)."""
    if RUNTIME.dpctl_imported_first and RUNTIME.icd_set:
        return (" dpctl was imported before jitconv, so the OpenCL loader had already "
                "started without OCL_ICD_FILENAMES (jitconv sets it to "
                f"{RUNTIME.icd_set}): import jitconv before dpctl, or set OCL_ICD_FILENAMES "
                "yourself.")
    return ""
