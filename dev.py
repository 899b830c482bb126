#!/usr/bin/env python3
"""Run jitconv's jobs in the project's own virtual environment (.venv at the repo root).

    python3 dev.py demo              # main job: a verified step on the default device
    python3 dev.py test [ARGS...]    # the test suite (ARGS go to pytest)
    python3 dev.py info              # versions and SYCL devices
    python3 dev.py python [ARGS...]  # the venv's python

Needs only python3 (3.11). Creates .venv when it is missing and (re)installs the package
with its pinned dependencies when setup.cfg, pyproject.toml or constraints.txt changed
since the last install. Standard library only.
"""

import hashlib
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
PY = VENV / "bin" / "python"
STAMP = VENV / ".jitconv-install-stamp"
INPUTS = ("setup.cfg", "pyproject.toml", "constraints.txt")


def _fingerprint():
    h = hashlib.sha256()
    for name in INPUTS:
        h.update((ROOT / name).read_bytes())
    return h.hexdigest()


def ensure_venv():
    if sys.version_info[:2] != (3, 11):
        sys.exit(f"dev.py: jitconv's pinned stack (numba-dpex 0.23) needs Python 3.11, "
                 f"this is {sys.version.split()[0]}")
    if not PY.exists():
        print("dev.py: creating .venv", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    want = _fingerprint()
    if STAMP.exists() and STAMP.read_text() == want:
        return
    print("dev.py: installing jitconv and its pinned dependencies into .venv "
          "(a few minutes the first time)", flush=True)
    pip = [str(PY), "-m", "pip", "install", "--disable-pip-version-check"]
    subprocess.run(pip + ["-c", str(ROOT / "constraints.txt"), "-e", f"{ROOT}[test,compile]"],
                   check=True, cwd=ROOT)
    STAMP.write_text(want)


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    job, rest = argv[0], argv[1:]
    commands = {
        "demo": [str(PY), "-m", "jitconv", "demo", *rest],
        "info": [str(PY), "-m", "jitconv", "info", *rest],
        "test": [str(PY), "-m", "pytest", *rest],
        "python": [str(PY), *rest],
    }
    if job not in commands:
        print(f"dev.py: unknown job {job!r}; expected one of {sorted(commands)}",
              file=sys.stderr)
        return 2
    ensure_venv()
    os.chdir(ROOT)
    return subprocess.call(commands[job])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
