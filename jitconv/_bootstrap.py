"""Make the pip-installed oneAPI runtime importable in a plain virtual environment.

Why this exists: the Intel runtime wheels (intel-sycl-rt, intel-opencl-rt, mkl, ...) put
their shared libraries in ``<prefix>/lib`` with RPATHs that do not point there, and the
OpenCL ICD file they ship names a placeholder build path. Without help, ``import dpctl``
fails with ``libintlc.so.5: cannot open shared object file`` and, once that is fixed,
``dpctl.get_devices()`` is empty. Conda environments and oneAPI installs set
LD_LIBRARY_PATH / OCL_ICD_FILENAMES themselves; a venv does not.

What it does, before dpctl / dpnp / numba_dpex are imported (and only then):
1. If OCL_ICD_FILENAMES is unset, point it at ``<prefix>/lib/libintelocl.so`` so the
   OpenCL loader finds the Intel CPU runtime (the ``opencl:cpu`` SYCL device).
2. Unless ``<prefix>/lib`` is already on LD_LIBRARY_PATH, preload the libraries of
   ``<prefix>/lib`` that the extension modules of those packages need, transitively. The
   dynamic loader then finds them by soname when the extension modules load. RTLD_LAZY
   matters: MKL's core and threading layers need each other's symbols, so neither can be
   bound eagerly before the other is loaded.

Variables the user set are respected; JITCONV_NO_BOOTSTRAP=1 disables all of this.
"""

import ctypes
import importlib.util
import mmap
import os
import struct
from pathlib import Path

_PACKAGES = ("dpctl", "dpnp", "numba_dpex")
# Loaded RTLD_GLOBAL: oneMKL's SYCL libraries use mkl_core / threading-layer symbols
# without listing those libraries as needed, and libmkl_sycl_dft needs `fftw3_mkl`, which
# only the interface layers define. We make the LP64 interface global for it, never the
# ILP64 one that dpnp links: a global ILP64 `dgemm_` would shadow torch's LP64 BLAS entry
# points and corrupt every torch matmul in the process (seen: "Parameter 13 was incorrect
# on entry to DGEMM"). Everything else is loaded RTLD_LOCAL: found by soname when an
# extension needs it, never overriding other code's symbols (libimf exports exp/sin/pow).
_GLOBAL = ("libmkl_core.", "libmkl_tbb_thread.", "libmkl_sequential.", "libmkl_intel_thread.",
           "libmkl_gnu_thread.", "libmkl_intel_lp64.")
_done = False
preloaded = []  # sonames this module loaded, for `python -m jitconv info`


def runtime_lib_dir():
    """The ``<prefix>/lib`` directory that holds the oneAPI runtime libraries, or None."""
    spec = importlib.util.find_spec("dpctl")
    if spec is None or spec.origin is None:
        return None
    # <prefix>/lib/pythonX.Y/site-packages/dpctl/__init__.py -> <prefix>/lib
    lib = Path(spec.origin).resolve().parents[3]
    return lib if (lib / "libsycl.so.7").exists() or (lib / "libintelocl.so").exists() else None


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


def _preload(lib):
    roots = []
    for pkg in _PACKAGES:
        spec = importlib.util.find_spec(pkg)
        if spec is not None and spec.submodule_search_locations:
            for d in spec.submodule_search_locations:
                roots.extend(Path(d).rglob("*.so"))
    # Post-order walk of the needed-library graph restricted to <prefix>/lib, so that a
    # library comes after what it needs. Children are walked in reverse: link lines list
    # high-level libraries before the ones they rely on (mkl_sycl_* ... mkl_core), and some
    # of them (mkl_sycl_*) use mkl_core symbols in constructors without declaring it.
    order, seen = [], set()

    def visit(path):
        for name in reversed(_elf_needed(path)):
            cand = lib / name
            if name not in seen and cand.exists():
                seen.add(name)
                visit(cand)
                order.append(name)

    for root in roots:
        visit(root)
    if "libmkl_sycl_dft.so.4" in order and (lib / "libmkl_intel_lp64.so.2").exists():
        order.insert(order.index("libmkl_sycl_dft.so.4"), "libmkl_intel_lp64.so.2")
    pending = order
    while pending:
        failed = []
        for name in pending:
            flags = os.RTLD_LAZY | (os.RTLD_GLOBAL if name.startswith(_GLOBAL) else os.RTLD_LOCAL)
            try:
                ctypes.CDLL(str(lib / name), mode=flags)
                preloaded.append(name)
            except OSError:
                failed.append(name)  # a dependency is not loaded yet: retry next round
        if len(failed) == len(pending):
            break  # no progress; the import itself will report what is missing
        pending = failed


def bootstrap():
    global _done
    if _done:
        return
    _done = True
    if os.environ.get("JITCONV_NO_BOOTSTRAP") == "1":
        return
    lib = runtime_lib_dir()
    if lib is None:
        return
    icd = lib / "libintelocl.so"
    if "OCL_ICD_FILENAMES" not in os.environ and icd.exists():
        os.environ["OCL_ICD_FILENAMES"] = str(icd)
    on_path = [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p]
    if not any(Path(p).resolve() == lib for p in on_path if Path(p).exists()):
        _preload(lib)
