"""The quickstart notebook executes top to bottom with a tiny configuration."""
import os

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOK = os.path.join(os.path.dirname(__file__), "..", "notebooks", "quickstart.ipynb")


def test_quickstart_notebook_runs(monkeypatch, tmp_path):
  monkeypatch.setenv("QUICKSTART_ROUNDS", "6")
  monkeypatch.setenv("QUICKSTART_CLIENTS", "8")
  monkeypatch.setenv("MPLBACKEND", "Agg")
  nb = nbformat.read(NOTEBOOK, as_version=4)
  NotebookClient(nb, timeout=300, kernel_name="python3",
                 resources={"metadata": {"path": str(tmp_path)}}).execute()
  outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                    for o in c.get("outputs", []))
  assert "FedAvg E=10 B=16" in outputs
  assert "1 trace" in outputs
  errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
            if o.get("output_type") == "error"]
  assert not errors


def test_compressors_notebook_runs(monkeypatch, tmp_path):
  monkeypatch.setenv("EFBV_ITERATIONS", "50")
  monkeypatch.setenv("MPLBACKEND", "Agg")
  nb = nbformat.read(os.path.join(os.path.dirname(NOTEBOOK), "compressors.ipynb"),
                     as_version=4)
  NotebookClient(nb, timeout=300, kernel_name="python3",
                 resources={"metadata": {"path": str(tmp_path)}}).execute()
  outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                    for o in c.get("outputs", []))
  assert "EF-BV: lambda=" in outputs and "comp-(1,15)" in outputs


def test_scafflix_notebook_runs(monkeypatch, tmp_path):
  monkeypatch.setenv("SCAFFLIX_ROUNDS", "8")
  monkeypatch.setenv("MPLBACKEND", "Agg")
  nb = nbformat.read(os.path.join(os.path.dirname(NOTEBOOK), "scafflix.ipynb"), as_version=4)
  NotebookClient(nb, timeout=300, kernel_name="python3",
                 resources={"metadata": {"path": str(tmp_path)}}).execute()
  outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                    for o in c.get("outputs", []))
  assert "Scafflix α=0.1: final FLIX objective" in outputs and "local optima:" in outputs
  errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
            if o.get("output_type") == "error"]
  assert not errors


def test_cohort_squeeze_notebook_runs(monkeypatch, tmp_path):
  monkeypatch.setenv("SPPM_ROUNDS", "6")
  monkeypatch.setenv("MPLBACKEND", "Agg")
  nb = nbformat.read(os.path.join(os.path.dirname(NOTEBOOK), "cohort_squeeze.ipynb"),
                     as_version=4)
  NotebookClient(nb, timeout=300, kernel_name="python3",
                 resources={"metadata": {"path": str(tmp_path)}}).execute()
  outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                    for o in c.get("outputs", []))
  assert "stratified(4 blocks): mu_AS" in outputs and "SPPM-SS K=8: cost" in outputs
  errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
            if o.get("output_type") == "error"]
  assert not errors


def test_fedmrn_notebook_runs(monkeypatch, tmp_path):
  monkeypatch.setenv("FEDMRN_ROUNDS", "4")
  monkeypatch.setenv("MPLBACKEND", "Agg")
  nb = nbformat.read(os.path.join(os.path.dirname(NOTEBOOK), "fedmrn.ipynb"), as_version=4)
  NotebookClient(nb, timeout=300, kernel_name="python3",
                 resources={"metadata": {"path": str(tmp_path)}}).execute()
  outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                    for o in c.get("outputs", []))
  ratio = float(outputs.split("max |MC mean - clip(u, n)| / tol:")[1].split()[0])
  assert ratio < 1.0  # the Monte Carlo mean within 4 standard errors everywhere
  assert "FedMRN α=0.1: final test accuracy" in outputs and "FedMRNS α=0.05: final" in outputs
  errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
            if o.get("output_type") == "error"]
  assert not errors


def test_fedspa_notebook_runs(monkeypatch, tmp_path):
  monkeypatch.setenv("FEDSPA_ROUNDS", "4")
  monkeypatch.setenv("MPLBACKEND", "Agg")
  nb = nbformat.read(os.path.join(os.path.dirname(NOTEBOOK), "fedspa.ipynb"), as_version=4)
  NotebookClient(nb, timeout=300, kernel_name="python3",
                 resources={"metadata": {"path": str(tmp_path)}}).execute()
  outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                    for o in c.get("outputs", []))
  assert "'conv2': 0.477, 'fc1': 0.485" in outputs and "FLOPs ratio at s = 0.5: 0.547" in outputs
  assert "FedSpa (DST): personalised test accuracy" in outputs and "coverage" in outputs
  errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
            if o.get("output_type") == "error"]
  assert not errors
