"""Every notebook in notebooks/ runs from top to bottom without an error.

Each notebook runs in a fresh "python3" kernel (nbclient), with notebooks/ as the working
directory and JITCONV_DEVICE set to the device under test (--sycl-device, through the
``sycl_device`` fixture), so notebooks use the same device as the rest of the suite.
If a cell raises, the test fails and shows that cell's source and traceback. Notebooks check
their own results with ``assert``. Outputs are never written back, so the stored notebooks
stay output-free.
"""

import os
import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
CELL_TIMEOUT = 600  # seconds per cell (a first kernel call JIT-compiles)
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")

# pytest turns an empty parameter list into a skip; a missing notebook must fail instead.
_PARAMS = [pytest.param(p, id=p.name) for p in NOTEBOOKS] or [
    pytest.param(None, id="no-notebooks-found")]


@pytest.mark.parametrize("notebook", _PARAMS)
def test_notebook_runs(notebook, request):
    if notebook is None:
        pytest.fail(f"no notebooks found: {NOTEBOOK_DIR}/*.ipynb matched nothing",
                    pytrace=False)
    device = request.getfixturevalue("sycl_device")  # after the check: a skip must not hide it
    nb = nbformat.read(notebook, as_version=4)
    client = NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOK_DIR)}})
    try:
        client.execute(env=dict(os.environ, JITCONV_DEVICE=device))
        error = None
    except CellExecutionError as exc:
        error = _ANSI.sub("", str(exc))
    if error is not None:  # outside the except block: no chained, colour-coded duplicate
        pytest.fail(f"{notebook.name} on {device}: a cell raised\n{error}", pytrace=False)
