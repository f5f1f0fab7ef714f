"""The command line: list, run (JSON + PNG), and resume extending a finished run."""
import json

import numpy as np
import pytest

from fedjaxsparse.cli import main

ARGS = ["--clients", "6", "--eval-every", "2", "--no-progress", "--set", "local_steps=2",
        "--set", "cohort=3"]


def test_list(capsys):
  assert main(["list"]) == 0
  assert "fedavg_digits" in capsys.readouterr().out


def test_run_writes_results_and_plot_and_resumes(tmp_path):
  out = str(tmp_path / "a")
  main(["run", "fedavg_digits", "--rounds", "4", "--out", out] + ARGS)
  res = json.load(open(tmp_path / "a" / "fedavg_digits" / "results.json"))
  assert len(res["methods"]) == 4 and res["config"]["rounds"] == 4
  for record in res["methods"].values():
    h = record["history"]
    assert h["rounds"]["round"] == [1, 2, 3, 4]
    assert h["evals"]["round"] == [0, 2, 4]
    np.testing.assert_allclose(np.cumsum(h["rounds"]["bits_up"]), h["rounds"]["uplink_bits"])
    assert 0.0 <= h["evals"]["accuracy"][-1] <= 1.0
  with open(tmp_path / "a" / "fedavg_digits" / "fedavg_digits.png", "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  # Resume: extend to 6 rounds from the checkpoints; equals a fresh 6-round run.
  main(["run", "fedavg_digits", "--rounds", "6", "--out", out, "--resume"] + ARGS)
  main(["run", "fedavg_digits", "--rounds", "6", "--out", str(tmp_path / "b")] + ARGS)
  resumed = json.load(open(tmp_path / "a" / "fedavg_digits" / "results.json"))
  fresh = json.load(open(tmp_path / "b" / "fedavg_digits" / "results.json"))
  for m in fresh["methods"]:
    assert resumed["methods"][m]["history"]["rounds"] == fresh["methods"][m]["history"]["rounds"]


def test_unknown_experiment_and_bad_option():
  with pytest.raises(SystemExit):
    main(["run", "no_such_experiment"])
  with pytest.raises(SystemExit):
    main(["run", "fedavg_digits", "--set", "novalue"])
