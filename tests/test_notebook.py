"""Every notebook executes top to bottom in a tiny configuration (its size read from the
environment) without an error, and prints what its text promises.

The quickstart runs in a real Jupyter kernel (nbclient), which proves the notebooks' kernel
path; the others run their code cells in this process, in a fresh namespace and the notebook's
own folder, with their printed output captured (a kernel's start and a second JAX start-up cost
about 2.5 s per notebook, and the worker's compiled small operations are reused). That is
exact for these notebooks, which are plain Python (no magics, no ``display``: checked here),
and global state a notebook changes (``jax_enable_x64``, figures) is restored afterwards."""
import contextlib
import io
import os
import re
import warnings

import jax
import pytest

pytestmark = pytest.mark.integration  # the integration tier (README: the test commands)

NOTEBOOKS = os.path.join(os.path.dirname(__file__), "..", "notebooks")
KERNEL = {"quickstart"}   # run in a Jupyter kernel; the others in this process
_IPYTHON_ONLY = re.compile(r"^\s*[%!]|get_ipython|\bdisplay\(|^\s*await\b", re.M)


def _in_process(nb, name: str, monkeypatch, tmp_path) -> str:
  """Runs ``nb``'s code cells as plain Python in a fresh namespace with ``tmp_path`` as the
  working folder; returns what they printed to stdout."""
  import matplotlib.pyplot as plt
  monkeypatch.chdir(tmp_path)
  x64 = jax.config.jax_enable_x64
  namespace = {"__name__": "__main__"}
  out = io.StringIO()
  try:
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()), \
        warnings.catch_warnings():
      warnings.filterwarnings("ignore", "FigureCanvasAgg is non-interactive")
      for i, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
        assert not _IPYTHON_ONLY.search(cell.source), f"{name} cell {i} needs IPython"
        exec(compile(cell.source, f"<{name}.ipynb code cell {i}>", "exec"), namespace)
  finally:
    jax.config.update("jax_enable_x64", x64)
    plt.close("all")
  return out.getvalue()


def _execute(golden, monkeypatch, tmp_path, name: str, **env) -> str:
  """Runs ``notebooks/<name>.ipynb`` with ``env`` set, checks the numbers it prints against
  the golden ones (tests/conftest.py) and returns its printed text."""
  for k, v in {"MPLBACKEND": "Agg", **env}.items():
    monkeypatch.setenv(k, v)
  # the integration extra's packages (`pip install -e ".[integration]"`), imported here so that
  # the unit tier collects this module without them
  import nbformat
  from nbclient import NotebookClient
  nb = nbformat.read(os.path.join(NOTEBOOKS, f"{name}.ipynb"), as_version=4)
  if name not in KERNEL:
    text = _in_process(nb, name, monkeypatch, tmp_path)
    golden(text)
    return text
  NotebookClient(nb, timeout=300, kernel_name="python3",
                 resources={"metadata": {"path": str(tmp_path)}}).execute()
  outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
  assert not [o for o in outputs if o.get("output_type") == "error"]
  golden("".join(o.get("text", "") for o in outputs if o.get("name") != "stderr"))
  return "".join(o.get("text", "") for o in outputs)


def test_quickstart_notebook_runs(monkeypatch, tmp_path, golden):
  out = _execute(golden, monkeypatch, tmp_path, "quickstart", QUICKSTART_ROUNDS="6",
                 QUICKSTART_CLIENTS="8")
  assert "FedAvg E=10 B=16" in out and "1 trace" in out


def test_compressors_notebook_runs(monkeypatch, tmp_path, golden):
  out = _execute(golden, monkeypatch, tmp_path, "compressors", EFBV_ITERATIONS="50")
  assert "EF-BV: lambda=" in out and "comp-(1,15)" in out


def test_scafflix_notebook_runs(monkeypatch, tmp_path, golden):
  out = _execute(golden, monkeypatch, tmp_path, "scafflix", SCAFFLIX_ROUNDS="8")
  assert "Scafflix α=0.1: final FLIX objective" in out and "local optima:" in out


def test_cohort_squeeze_notebook_runs(monkeypatch, tmp_path, golden):
  out = _execute(golden, monkeypatch, tmp_path, "cohort_squeeze", SPPM_ROUNDS="6")
  assert "stratified(4 blocks): mu_AS" in out and "SPPM-SS K=8: cost" in out
  assert out.count("expected smoothness = ") == 3 and out.count("LocalGD lr=") == 2


def test_fedmrn_notebook_runs(monkeypatch, tmp_path, golden):
  out = _execute(golden, monkeypatch, tmp_path, "fedmrn", FEDMRN_ROUNDS="4")
  ratio = float(out.split("max |MC mean - clip(u, n)| / tol:")[1].split()[0])
  assert ratio < 1.0  # the Monte Carlo mean within 4 standard errors everywhere
  assert "FedMRN α=0.1: final test accuracy" in out and "FedMRNS α=0.05: final" in out


def test_fedspa_notebook_runs(monkeypatch, tmp_path, golden):
  out = _execute(golden, monkeypatch, tmp_path, "fedspa", FEDSPA_ROUNDS="4")
  assert "'conv2': 0.477, 'fc1': 0.485" in out and "FLOPs ratio at s = 0.5: 0.547" in out
  assert "FedSpa (DST): personalised test accuracy" in out and "coverage" in out


def test_fedp3_notebook_runs(monkeypatch, tmp_path, golden):
  out = _execute(golden, monkeypatch, tmp_path, "fedp3", FEDP3_ROUNDS="3", FEDP3_EPSILONS="1")
  assert "(max-min)/min uplink: 10815.25 %" in out and "at r = 0.5: 57.93 %" in out
  assert "LowerB: personalised test accuracy" in out and "epsilon=1.0: sigma=" in out


def test_posttrain_notebook_runs(monkeypatch, tmp_path, golden):
  out = _execute(golden, monkeypatch, tmp_path, "posttrain", POSTTRAIN_STEPS="20", POSTTRAIN_HIDDEN="32",
                 POSTTRAIN_LAYERS="1", POSTTRAIN_CALIB="16", POSTTRAIN_EVAL="64",
                 POSTTRAIN_LEVELS="60")
  assert "dense test perplexity:" in out and "stochria" in out
  assert "'2:4': 0.5" in out and "sparsity unchanged by refinement: True" in out
  assert "wanda+R²-DSnoT" in out and "wanda+DSnoT (same sign)" in out


def test_ddss_notebook_runs(monkeypatch, tmp_path, golden):
  out = _execute(golden, monkeypatch, tmp_path, "ddss", DDSS_N="320", DDSS_P="3000", DDSS_DENSITY="0.01",
                 DDSS_ROUNDS="6", DDSS_STEP_GRID="1")
  assert "safe radius: 0 non-zero features of x* eliminated" in out
  assert "paper's literal radius: 4 non-zero features of x* eliminated" in out
  assert out.count("(certified: True)") == 2 and "every run kept all non-zeros of x*: True" in out
  assert all(m in out for m in ("Sha-DDSS-Naive", "Dis-DDSS", "ProxASVRG", "ProxASAGA", "PSE-Safe"))


def test_ato_notebook_runs(monkeypatch, tmp_path, golden):
  out = _execute(golden, monkeypatch, tmp_path, "ato", ATO_EPOCHS="3", ATO_WIDTH="4", ATO_TRAIN="128")
  assert "ResNet-56 on 32×32×3: 125,485,696 MACs per example" in out
  assert "outputs equal: True" in out
  assert "exactly those with ‖g‖ ≤ t_g: True; the others shrank by t_g: True" in out
  assert "exactly those with zᵀM < ε‖M‖²: True" in out
  assert "P(1) = P_total: True" in out and "equal to the rebuilt model's MACs: True" in out
  assert "∂R/∂w ≥ 0 there: True" in out
  assert "ATO: test accuracy" in out and "Uniform: test accuracy" in out


def test_fedlpfm_notebook_runs(monkeypatch, tmp_path, golden):
  out = _execute(golden, monkeypatch, tmp_path, "fedlpfm", FEDLPFM_ROUNDS="3", FEDLPFM_TEACHER_STEPS="200")
  assert "student = teacher: 0.0e+00; zero: True" in out
  assert "> 0: True; two identical teachers give twice the KD: True" in out
  assert "λ = 1 Fed-LPFM equals FedAvg bit for bit after 3 rounds on every split: True" in out
  for split in ("IID", "Dirichlet α=0.1", "class split"):
    line = out.split(f"{split}: final test accuracy ")[1].split("\n")[0]
    assert all(f"{m} " in line for m in ("FedAvg", "FedProx", "FML", "Fed-LPFM"))
