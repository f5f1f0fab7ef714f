"""Several processes joined by jax.distributed (gloo collectives on CPU) compute the run of
one process: the same final model, client state and history, to float rounding.

Each process runs SCRIPT (launched by fedjaxsparse.runtime.distributed.launch, coordinator on
localhost) and writes what it holds; the reference is the same script in this process."""
import json
import os
import sys

import numpy as np
import pytest

from fedjaxsparse.runtime.distributed import launch

pytestmark = pytest.mark.integration  # the integration tier (README: the test commands)

SCRIPT = r'''
import json, sys
from fedjaxsparse.runtime import distributed
distributed.initialize_from_env()
import jax, optax
from fedjaxsparse.algorithms import proxskip as ps
from fedjaxsparse.algorithms.fedavg import fedavg
from fedjaxsparse.data.embedded import digits
from fedjaxsparse.evaluation import make_eval_fn
from fedjaxsparse.models import make_loss, softmax_regression
from fedjaxsparse.runtime.checkpoint import Checkpointing
from fedjaxsparse.runtime.runner import run
from fedjaxsparse.runtime.sharding import client_mesh

ds = digits(num_clients=8, partition="dirichlet", alpha=0.5, seed=0)
model = softmax_regression(64, 10)
loss = make_loss(model)
params = model.init(jax.random.key(0))
algos = {"fedavg": fedavg(loss, optax.sgd(0.3), local_steps=3, batch_size=8, cohort_size=4),
         "sparse_proxskip": ps.sparse_proxskip(loss, 0.3, 0.3, 0.8, batch_size=8)}
out = {"processes": jax.process_count(), "devices": jax.device_count()}
for name, algo in algos.items():
  res = run(algo, jax.random.key(1), params, ds.train, ds.test, num_rounds=12,
            eval_fn=make_eval_fn(model), eval_every=4, mesh=client_mesh(), progress=False)
  state = distributed.to_host(res.state)
  out[name] = {"params": jax.tree.map(lambda a: a.tolist(), distributed.to_host(res.state.params)),
               "h": state.h["w"].tolist() if hasattr(state, "h") else None,
               "loss": res.history.rounds["loss"], "accuracy": res.history.evals["accuracy"],
               "uplink_bits": res.history.rounds["uplink_bits"]}
if jax.process_count() > 1:  # a checkpoint written by every process resumes in every process
  algo = algos["sparse_proxskip"]
  kw = dict(mesh=client_mesh(), progress=False, eval_every=3)
  ck = Checkpointing(sys.argv[1] + ".ck")
  run(algo, jax.random.key(1), params, ds.train, num_rounds=6, checkpoint=ck, **kw)
  resumed = run(algo, jax.random.key(1), params, ds.train, num_rounds=12,
                checkpoint=ck._replace(resume=True), **kw)
  whole = run(algo, jax.random.key(1), params, ds.train, num_rounds=12, **kw)
  a, b = distributed.to_host((resumed.state, whole.state))
  out["resumed"] = {"dispatches": resumed.num_dispatches,
                    "rounds": resumed.history.rounds["round"],
                    "equal": all(bool((x == y).all()) for x, y in zip(jax.tree.leaves(a),
                                                                      jax.tree.leaves(b)))}
with open(sys.argv[1] + f".{jax.process_index()}.json", "w") as f:
  json.dump(out, f)
print("DISTRIBUTED-OK", jax.process_index())
'''


def _results(tmp_path, num_processes):
  script = tmp_path / "script.py"
  script.write_text(SCRIPT)
  prefix = str(tmp_path / f"out{num_processes}")
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  if num_processes == 1:
    runs = [__import__("subprocess").run([sys.executable, str(script), prefix], env=env,
                                         capture_output=True, text=True, timeout=300)]
  else:
    runs = launch([str(script), prefix], num_processes, timeout_s=300, env=env)
  for r in runs:
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
  return [json.load(open(f"{prefix}.{i}.json")) for i in range(num_processes)]


@pytest.fixture(scope="module")
def single_process_run(tmp_path_factory):
  """The reference: SCRIPT in one process (shared by the 2- and 4-process comparisons)."""
  (one,) = _results(tmp_path_factory.mktemp("one"), 1)
  return one


@pytest.mark.parametrize("num_processes", [2])  # 4 fake devices: tests/test_sharding.py
def test_several_processes_compute_the_single_process_run(tmp_path, num_processes,
                                                          single_process_run):
  """The processes' run equals one process's; and a checkpoint written by every process
  resumes in every process, bit for bit the uninterrupted run (a run of 6 rounds, then
  resumed to 12: 2 dispatches, rounds 1..12)."""
  one = single_process_run
  many = _results(tmp_path, num_processes)
  for got in many:
    assert got["processes"] == got["devices"] == num_processes
    for name in ("fedavg", "sparse_proxskip"):
      a, b = one[name], got[name]
      for k in a["params"]:
        np.testing.assert_allclose(b["params"][k], a["params"][k], rtol=1e-5, atol=1e-6)
      if a["h"] is not None:  # per-client state, gathered from every process
        np.testing.assert_allclose(b["h"], a["h"], rtol=1e-5, atol=1e-5)
      np.testing.assert_allclose(b["loss"], a["loss"], rtol=1e-5)
      np.testing.assert_allclose(b["accuracy"], a["accuracy"], atol=1e-6)
      np.testing.assert_array_equal(b["uplink_bits"], a["uplink_bits"])
    assert got["resumed"] == {"dispatches": 2, "rounds": list(range(1, 13)), "equal": True}


def test_launch_reports_a_failing_process_without_hanging(tmp_path):
  script = tmp_path / "fail.py"
  script.write_text("import os, sys, time\n"
                    "if os.environ['FEDJAXSPARSE_PROCESS_ID'] == '1': sys.exit(3)\n"
                    "time.sleep(60)\n")
  runs = launch([str(script)], 2, timeout_s=30)
  assert runs[1].returncode == 3 and runs[0].returncode != 0  # the sleeper was killed


def test_cli_processes_flag_reproduces_the_single_process_experiment(tmp_path):
  import subprocess
  from fedjaxsparse.harness.cli import main
  results = {}
  args = ["run", "fedavg_digits", "--rounds", "2", "--clients", "8", "--eval-every", "1",
          "--no-progress", "--set", "methods=FedAvg-partial,FedAdam"]
  assert main([*args, "--out", str(tmp_path / "p1")]) == 0  # one process: this one
  proc = subprocess.run(
      [sys.executable, "-m", "fedjaxsparse.harness.cli", *args, "--processes", "2",
       "--out", str(tmp_path / "p2")], capture_output=True, text=True, timeout=400,
      env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  for n in (1, 2):
    results[n] = json.load(open(tmp_path / f"p{n}" / "fedavg_digits" / "results.json"))
  assert results[2]["methods"].keys() == results[1]["methods"].keys()
  for method, rec in results[1]["methods"].items():
    other = results[2]["methods"][method]["history"]["evals"]
    np.testing.assert_allclose(other["accuracy"], rec["history"]["evals"]["accuracy"],
                               atol=1e-6)
    np.testing.assert_allclose(other["loss"], rec["history"]["evals"]["loss"], rtol=1e-5)
