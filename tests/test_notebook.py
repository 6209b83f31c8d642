"""notebooks/compare_runs.ipynb executes against real runs in a real MLflow store."""

import nbformat
import pytest
from nbclient import NotebookClient

from conftest import ROOT
from test_train import train_run

pytestmark = pytest.mark.slow


def test_compare_runs_notebook_executes(tmp_path, smoke_overrides):
    for heads in (1, 2):
        train_run([*smoke_overrides, f"model.n_heads={heads}"], tmp_path / f"run{heads}")
    notebook = nbformat.read(ROOT / "notebooks" / "compare_runs.ipynb", as_version=4)
    NotebookClient(notebook, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    text = "".join(o.get("text", "") for o in outputs)
    assert "2 runs in experiment 'atis'" in text
    tables = [o["data"]["text/plain"] for o in outputs if "data" in o and "text/plain" in o["data"]]
    assert any("model.n_heads" in t for t in tables)
    assert any("image/png" in o.get("data", {}) for o in outputs)
