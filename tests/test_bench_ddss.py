"""benchmarks/bench_ddss.py in its tiny configuration, in-process: one Sha-DDSS outer iteration
of the library equals the sequential numpy/scipy reference (same sample draws, float64), and
scikit-learn's Lasso is run to at least the library's duality gap."""
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


def test_bench_ddss_tiny(tmp_path, capsys):
  bench = _load("bench_ddss.py")
  out = tmp_path / "bench_ddss.json"
  returned = bench.main(["--tiny", "--out", str(out)])
  assert "wrote" in capsys.readouterr().out
  result = json.load(open(out))
  assert result["rows"] == json.loads(json.dumps(returned["rows"]))
  one, many = result["rows"]
  for r in (one, many):
    assert r["library s"] > 0 and r["reference s"] > 0 and r["compile s"] > 0, r
    assert r["speed-up"] > 0, r
  # the same outer iteration: same draws, same screening, same iterate (float64 rounding)
  assert one["max |dx|"] < 1e-9, one
  assert one["active lib"] == one["active ref"] and one["nnz lib"] == one["nnz ref"], one
  assert one["active lib"] < result["problem"]["p"], one  # screening eliminated something
  # sklearn's coordinate descent reached the library's gap after S outer iterations
  assert 0 < many["gap lib"] and many["gap ref"] <= many["gap lib"], many
  gaps = result["problem"]["gap_history"]
  assert gaps[-1] < gaps[0], gaps                       # the library's iterations progress
  assert abs(result["problem"]["library_gap_screen"] - many["gap lib"]) <= 1e-9 * max(
      1.0, many["gap lib"])                             # the numpy gap is screening's gap
