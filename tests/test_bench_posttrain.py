"""benchmarks/bench_posttrain.py in its tiny configuration, in-process: the library's per-block
pruning (scores, masks, DSnoT) and the plain numpy reference give the same masks."""
import importlib.util
import json
import os

import pytest

pytestmark = pytest.mark.integration  # the integration tier (README: the test commands)

ROOT = os.path.join(os.path.dirname(__file__), "..")


def _load(script):
  path = os.path.join(ROOT, "benchmarks", script)
  spec = importlib.util.spec_from_file_location(script[:-3], path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_bench_posttrain_tiny(tmp_path, capsys):
  bench = _load("bench_posttrain.py")
  out = tmp_path / "bench_posttrain.json"
  returned = bench.main(["--tiny", "--out", str(out)])
  assert "wrote" in capsys.readouterr().out
  result = json.load(open(out))
  assert result["rows"] == json.loads(json.dumps(returned["rows"]))
  rows = {r["method"]: r for r in result["rows"]}
  assert set(rows) == {"magnitude", "wanda", "ria", "wanda+dsnot"}
  for r in rows.values():
    assert r["library s"] > 0 and r["numpy s"] > 0 and r["compile s"] > 0, r
    assert r["speed-up"] > 0 and r["entries"] > 0, r
    assert abs(r["sparsity"] - 0.5) < 1e-9, r         # exact per-neuron counts (even widths)
  for m in ("magnitude", "wanda", "ria"):
    assert rows[m]["differing"] == 0, rows[m]          # the same float32 scores, stable sort
  dsnot = rows["wanda+dsnot"]
  assert dsnot["differing fraction"] < 0.01, dsnot     # up to float ties
  assert dsnot["numpy swaps"] > 0 and dsnot["dsnot changed"] > 0, dsnot  # DSnoT did swap
