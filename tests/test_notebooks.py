"""Every notebook in notebooks/ runs from top to bottom without an error.

Each notebook runs in a fresh kernel started from the interpreter running the tests
(nbclient, with a private kernelspec), with notebooks/ as the working
directory and JITCONV_DEVICE set to the device under test (--sycl-device, through the
``sycl_device`` fixture), so notebooks use the same device as the rest of the suite.
If a cell raises, the test fails and shows that cell's source and traceback. Notebooks check
their own results with ``assert``. Outputs are never written back, so the stored notebooks
stay output-free.
"""

import json
import os
import re
import sys
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
CELL_TIMEOUT = 600  # seconds per cell (a first kernel call JIT-compiles)
KERNEL_NAME = "jitconv-tests"
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")

# pytest turns an empty parameter list into a skip; a missing notebook must fail instead.
_PARAMS = [pytest.param(p, id=p.name) for p in NOTEBOOKS] or [
    pytest.param(None, id="no-notebooks-found")]


def _this_interpreters_kernel(tmp_path):
    """A kernel manager that starts ipykernel with the interpreter running the tests.
    A kernel named "python3" is looked up in the user's kernelspecs, where another
    environment's kernel may win; a spec of our own in a private directory cannot."""
    spec_dir = tmp_path / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"jitconv tests ({sys.executable})", "language": "python"}))
    specs = KernelSpecManager(kernel_dirs=[str(spec_dir.parent)], ensure_native_kernel=False)
    km = KernelManager(kernel_name=KERNEL_NAME, kernel_spec_manager=specs)
    assert km.kernel_spec.argv[0] == sys.executable
    return km


@pytest.mark.parametrize("notebook", _PARAMS)
def test_notebook_runs(notebook, request):
    if notebook is None:
        pytest.fail(f"no notebooks found: {NOTEBOOK_DIR}/*.ipynb matched nothing",
                    pytrace=False)
    device = request.getfixturevalue("sycl_device")  # after the check: a skip must not hide it
    nb = nbformat.read(notebook, as_version=4)
    km = _this_interpreters_kernel(request.getfixturevalue("tmp_path"))
    client = NotebookClient(nb, km=km, timeout=CELL_TIMEOUT,
                            resources={"metadata": {"path": str(NOTEBOOK_DIR)}})
    try:
        client.execute(env=dict(os.environ, JITCONV_DEVICE=device))
        error = None
    except CellExecutionError as exc:
        error = _ANSI.sub("", str(exc))
    if error is not None:  # outside the except block: no chained, colour-coded duplicate
        pytest.fail(f"{notebook.name} on {device}: a cell raised\n{error}", pytrace=False)
