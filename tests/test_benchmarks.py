"""The benchmark scripts run in a tiny configuration (so they cannot rot) and their compiled
and Python-loop paths compute the same numbers."""
import io
import json
import os
import runpy
import sys

import pytest

pytestmark = pytest.mark.integration  # the integration tier (README: the test commands)

ROOT = os.path.join(os.path.dirname(__file__), "..")


def _module(script):
  """The globals of ``benchmarks/SCRIPT.py`` (not run as ``__main__``)."""
  import types
  return types.SimpleNamespace(**runpy.run_path(os.path.join(ROOT, "benchmarks",
                                                             script + ".py")))


def _run(script, *args, out):
  """Runs ``benchmarks/SCRIPT`` as ``__main__`` in this process (the subprocess start and a
  second JAX start-up would cost more than most of these tiny runs) and returns its
  printed output."""
  path = os.path.join(ROOT, "benchmarks", script)
  argv, stdout = sys.argv, sys.stdout
  sys.argv, sys.stdout = [path, *args, "--out", str(out)], io.StringIO()
  try:
    runpy.run_path(path, run_name="__main__")
  except SystemExit as e:
    assert not e.code, sys.stdout.getvalue()[-2000:]
  finally:
    text, sys.argv, sys.stdout = sys.stdout.getvalue(), argv, stdout
  return text


def test_bench_round_tiny(tmp_path):
  out = _run("bench_round.py", "--clients", "3", "7", "--repeats", "1", "--scan-rounds", "2",
             out=tmp_path)
  assert "speedup_round" in out
  rows = json.load(open(tmp_path / "bench_round.json"))["rows"]
  assert [r["clients"] for r in rows] == [3, 7]
  assert all(r["max_abs_diff"] < 1e-5 for r in rows)  # compiled round == loop round


def test_bench_blogfeedback_tiny(tmp_path):
  _run("bench_blogfeedback.py", "--clients", "12", "--mean-size", "10", "--iterations", "40",
       "--padded-iterations", "10", "--loop-iterations", "3", "--buckets", "3", "--chunk",
       "10", out=tmp_path)
  rows = json.load(open(tmp_path / "bench_blogfeedback.json"))["rows"]
  assert len(rows) == 3 and all(r["ms_per_iteration"] > 0 for r in rows)


def test_bench_layout_tiny(tmp_path):
  """Every layout computes the padded run's model; the automatic one has less padded work."""
  _run("bench_layout.py", "--iterations", "20", "--chunk", "10", "--sites", "40",
       "--small-clients", "60", "--many-buckets", "10", out=tmp_path)
  rows = json.load(open(tmp_path / "bench_layout.json"))["rows"]
  assert len(rows) == 6
  for r in rows:
    assert r["max |model - padded model|"] < 1e-4, r
  by = {(r["problem"], r["layout"]): r for r in rows}
  for problem in {r["problem"] for r in rows}:
    assert by[problem, "auto"]["padded work / real"] <= by[problem, "padded"]["padded work / real"]
    assert by[problem, "auto"]["buckets"] <= 8


def test_bench_client_strategies_tiny(tmp_path):
  """Every strategy computes vmap's client models (float tolerance: convolutions)."""
  _run("bench_client_strategies.py", "--clients", "3", "--batch", "4", "--repeats", "1",
       "--channels", "2", "4", "--dense", "8", "--loop", "2", "--strategies", "vmap", "map",
       "unroll", "unroll:2", "--rounds", "2", "--local-steps", "2", out=tmp_path)
  result = json.load(open(tmp_path / "bench_client_strategies_cnn_xla.json"))
  rows = result["rows"]
  assert {r["strategy"] for r in rows} >= {"single model", "vmap", "map", "unroll", "unroll:2"}
  for r in rows:
    assert r["max |diff| vs vmap"] < 1e-5, r
  runs = result["runner_rows"][1:]  # vmap, then auto: loop-free on CPU, the same models
  assert [r["strategy"] for r in runs] == ["runner, clients='vmap' (vmap)",
                                           "runner, clients='auto' (unroll)"]
  assert all(r["max |diff| vs first"] < 1e-5 for r in runs), runs


def test_bench_topk_tiny(tmp_path):
  """Both Top-K paths (and argsort) give the same exact-K mask."""
  _run("bench_topk.py", "--dims", "5000", "--fractions", "0.01", "0.3", "--repeats", "1",
       out=tmp_path)
  rows = json.load(open(tmp_path / "bench_topk.json"))["rows"]
  assert len(rows) == 8 and all(r["same mask"] and r["nnz"] == r["k"] for r in rows)


def test_bench_population_tiny(tmp_path):
  """Host- and device-resident client state end with the same model; the host round program
  needs device memory for the cohort only."""
  _run("bench_population.py", "--clients", "400", "--cohort", "10", "--rounds", "2",
       out=tmp_path)
  result = json.load(open(tmp_path / "bench_population.json"))
  assert result["same_final_model"]
  host, device = result["rows"]
  assert host["round program device MB"] < device["round program device MB"] / 5


def test_bench_scafflix_tiny(tmp_path):
  """The compiled Scafflix run and the Python loop over clients compute the same models."""
  out = _run("bench_scafflix.py", "--clients", "7", "9", "--examples", "5", "--dim", "4",
             "--iterations", "10", "--loop-iterations", "10", "--repeats", "1",
             "--presolve-steps", "20", out=tmp_path)
  assert "speedup" in out
  rows = json.load(open(tmp_path / "bench_scafflix.json"))["rows"]
  assert [r["clients"] for r in rows] == [7, 9]
  for r in rows:
    assert r["communications_in_check"] > 0 and r["it_per_s"] > 0 and r["loop_it_per_s"] > 0
    assert r["max_abs_diff"] < 1e-4, r  # compiled iterations == the loop's


def test_bench_fedmrn_tiny(tmp_path):
  """The compiled FedMRN round and the per-client, per-step Python loop (the same keys, noise,
  PSM draws and masks) compute the same new model."""
  out = _run("bench_fedmrn.py", "--clients", "4", "--cohort", "2", "--epochs", "1", "--batch",
             "8", "--examples", "20", "--channels", "2", "2", "2", "2", "--repeats", "1",
             "--skip-per-client-jit", out=tmp_path)
  assert "speedup" in out
  rows = json.load(open(tmp_path / "bench_fedmrn.json"))["rows"]
  assert [r["variant"] for r in rows] == ["library", "loop"]
  for r in rows:
    assert r["seconds_per_round"] > 0 and r["examples_per_s"] > 0 and r["compile_s"] > 0
    assert r["max_abs_diff"] < 1e-3, r  # the loop's new params == the library's


def test_gpu_suite_tiny(tmp_path):
  """benchmarks/gpu_suite.py in its --tiny mode: every section runs and writes its rows (the
  suite is ready the moment a GPU is at hand); a section past --budget-s is skipped, saying
  so, and what finished is on disk; --estimate costs every full-size round and prints
  its FLOPs."""
  out = _run("gpu_suite.py", "--tiny", out=tmp_path)
  res = json.load(open(tmp_path / "suite.json"))
  assert res["tiny"] and res["device"] and res["jax"] and res["skipped"] == []
  rows = res["rows"]
  assert [r["row"] for r in rows[:3]] == ["fedavg_cnn"] * 3   # the most valuable first
  assert [r["variant"] for r in rows[:3]] == ["library", "per-client jit loop",
                                              "one model, same work"]
  gpu_suite = _module("gpu_suite")
  assert {r["row"] for r in rows} >= {"fedavg_cnn_scaling", "posttrain_wanda", "posttrain_ria",
                                       "ddss", "fedmrn_table1", "ato_resnet20_epoch",
                                       *gpu_suite.FAMILIES}
  assert [r["variant"] for r in rows if r["row"] == "ato_resnet20_epoch"] == [
      "library (scan)", "plain SGD, same steps"]   # the per-step loop: full size only
  full = [r for r in rows if r["row"] == "sparse_proxskip_blogfeedback"]
  assert [r["variant"] for r in full] == ["library", "per-client jit loop",
                                          "one model, same work"]
  timed = [r for r in rows if r["row"] not in gpu_suite.TINY_TRACE_ONLY]
  assert all(r["ms_per_round"] > 0 and r["compile_s"] >= 0 for r in timed)
  assert rows[0]["vs_library"] == 1.0 and "wrote" in out
  cell = next(r for r in rows if r["row"] == "fedmrn_table1")
  assert cell["paper %"] == 88.8 and 0 <= cell["ours %"] <= 100   # FedAvg, Non-IID-2
  _run("gpu_suite.py", "--tiny", "--budget-s", "0", out=tmp_path / "late")
  late = json.load(open(tmp_path / "late" / "suite.json"))
  assert late["rows"] == [] and len(late["skipped"]) == len(gpu_suite.SECTIONS)
  est = _run("gpu_suite.py", "--tiny", "--estimate", out=tmp_path / "est")
  assert est.count("GFLOP/round") == len(gpu_suite.FAMILIES) + 4   # + FedAvg's 3 sizes, ATO


def test_bench_default_strategy_tiny(tmp_path):
  """bench_default_strategy: each family's round under vmap and map, the default named with
  its reason, and the default's time over the best one's."""
  _run("bench_default_strategy.py", "--tiny", "--repeats", "1", "--families", "fedavg_cnn",
       "ef21_mushrooms", out=tmp_path)
  rows = json.load(open(tmp_path / "bench_default_strategy.json"))["rows"]
  assert [r["family"] for r in rows] == ["fedavg_cnn", "ef21_mushrooms"]
  for r in rows:
    times = {s: r[f"{s} ms"] for s in ("vmap", "map")}
    assert r["default"] in times and r["why"] and min(times.values()) > 0
    assert r["default / best"] == times[r["default"]] / times[r["best"]] >= 1.0


def test_bench_vs_loop_without_or_with_pytorch(tmp_path):
  """bench_vs_loop: PyTorch is optional — without it the script says how to get it and writes
  nothing; with it, each family's row compares the two rounds' medians."""
  import importlib.util
  out = _run("bench_vs_loop.py", "--tiny", "--families", "sppm_as_a9a", out=tmp_path)
  path = tmp_path / "bench_vs_loop.json"
  if importlib.util.find_spec("torch") is None:
    assert "pip install torch" in out and not path.exists()
    return
  (row,) = json.load(open(path))["rows"]
  assert row["family"] == "sppm_as_a9a"
  assert row["speed-up"] == row["torch loop ms"] / row["library ms"] > 0


def test_bench_chunk_tiny(tmp_path):
  """The runner's chunk and the scan+cond chunk it replaced end in the same state."""
  _run("bench_chunk.py", "--tiny", out=tmp_path)
  rows = json.load(open(tmp_path / "bench_chunk.json"))["rows"]
  assert [r["clients"] for r in rows] == [4, 8]
  for r in rows:
    assert r["max |state difference|"] == 0.0
    assert r["speed-up"] == r["scan+cond ms/round"] / r["runner chunk ms/round"] > 0
