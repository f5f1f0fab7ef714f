"""The command line: list/describe/run, results JSON + PNG, resume extending a finished run,
and every user error as one clear line with a non-zero exit (options checked against each
experiment's declared OPTIONS, booleans in any case, mismatched resumes, fresh runs over old
checkpoints, diverged runs, locked output folders, missing data)."""
import json
import os

import numpy as np
import pytest

from fedjaxsparse.harness.cli import experiments, main
from fedjaxsparse.harness.options import Config, Option, parse_options

pytestmark = pytest.mark.integration  # the integration tier (README: the test commands)

ARGS = ["--clients", "6", "--eval-every", "2", "--no-progress", "--set", "local_steps=2",
        "--set", "cohort=3"]


def test_list(capsys):
  assert main(["list"]) == 0
  out = capsys.readouterr().out
  assert "fedavg_digits" in out and "communication round" in out


def test_run_writes_results_and_plot_and_resumes(tmp_path):
  out = str(tmp_path / "a")
  assert main(["run", "fedavg_digits", "--rounds", "4", "--out", out] + ARGS) == 0
  res = json.load(open(tmp_path / "a" / "fedavg_digits" / "results.json"))
  assert len(res["methods"]) == 4 and res["config"]["rounds"] == 4
  assert res["config"]["options"]["local_steps"] == 2  # parsed, every option recorded
  for record in res["methods"].values():
    h = record["history"]
    assert h["rounds"]["round"] == [1, 2, 3, 4]
    assert h["evals"]["round"] == [0, 2, 4]
    np.testing.assert_allclose(np.cumsum(h["rounds"]["bits_up"]), h["rounds"]["uplink_bits"])
    assert 0.0 <= h["evals"]["accuracy"][-1] <= 1.0
    assert record["diverged"] is None
  with open(tmp_path / "a" / "fedavg_digits" / "fedavg_digits.png", "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  # a run shorter than --checkpoint-every-s (default 60 s) is checkpointed after its end only
  from fedjaxsparse.runtime.checkpoint import Checkpointer
  folder = tmp_path / "{}" / "fedavg_digits" / "checkpoints"
  steps = lambda run: [Checkpointer(str(folder).format(run) + "/" + m.replace("/", "_")).steps()
                       for m in res["methods"]]
  assert steps("a") == [[4]] * 4
  # Resume: extend to 6 rounds from the checkpoints; equals a fresh 6-round run.
  assert main(["run", "fedavg_digits", "--rounds", "6", "--out", out, "--resume"] + ARGS) == 0
  assert main(["run", "fedavg_digits", "--rounds", "6", "--out", str(tmp_path / "b"),
               "--checkpoint-every-s", "0"] + ARGS) == 0
  assert steps("b") == [[4, 6]] * 4   # at every evaluation (the newest two are kept)
  resumed = json.load(open(tmp_path / "a" / "fedavg_digits" / "results.json"))
  fresh = json.load(open(tmp_path / "b" / "fedavg_digits" / "results.json"))
  for m in fresh["methods"]:
    assert resumed["methods"][m]["history"]["rounds"] == fresh["methods"][m]["history"]["rounds"]
    # the training time covers both parts of the resumed run
    assert resumed["methods"][m]["wall_time_s"] > 0


def _err(capsys, argv, code):
  assert main(argv) == code
  captured = capsys.readouterr()
  err = captured.err.strip()
  assert err.startswith("fedjaxsparse: error: ") and len(err.splitlines()) == 1, err
  assert "Traceback" not in captured.err
  return err


def test_unknown_and_bad_options_name_the_key_and_the_allowed_values(capsys, tmp_path):
  base = ["run", "sparse_proxskip", "--out", str(tmp_path), "--no-progress"]
  err = _err(capsys, base + ["--set", "sparsityy=0.5"], 2)
  assert "unknown option 'sparsityy'" in err and "Did you mean 'sparsity'" in err
  err = _err(capsys, base + ["--set", "sparsity=abc"], 2)
  assert "option 'sparsity'" in err and "[0, 1)" in err
  err = _err(capsys, base + ["--set", "sparsity=1.5"], 2)
  assert "option 'sparsity': '1.5'" in err
  err = _err(capsys, base + ["--set", "gamma=inf"], 2)
  assert "option 'gamma'" in err and "finite" in err
  err = _err(capsys, base + ["--set", "diagnostics=maybe"], 2)
  assert "option 'diagnostics'" in err and "true or false" in err
  err = _err(capsys, base + ["--set", "novalue"], 2)
  assert "KEY=VALUE" in err
  err = _err(capsys, ["run", "no_such_experiment"], 2)
  assert "unknown experiment 'no_such_experiment'" in err and "sparse_proxskip" in err
  assert not os.path.exists(tmp_path / "sparse_proxskip" / "checkpoints")  # nothing ran


@pytest.mark.parametrize("text, value", [("false", False), ("False", False), ("FALSE", False),
                                         ("true", True), ("True", True), ("0", False),
                                         ("yes", True), ("no", False)])
def test_booleans_in_any_case(text, value):
  spec = (Option("diagnostics", True, "x"),)
  assert parse_options(spec, {"diagnostics": text}) == {"diagnostics": value}


def test_options_parse_types_lists_and_defaults():
  spec = (Option("sparsities", [], "x", kind="floats", low=0.0, high=1.0, high_open=True),
          Option("gamma", None, "x", kind="float", low=0.0, low_open=True),
          Option("k", 1, "x", low=1))
  assert parse_options(spec, {"sparsities": "[0.8,0.9]", "k": "3"}) == {
      "sparsities": [0.8, 0.9], "gamma": None, "k": 3}
  assert parse_options(spec, {"gamma": "none"})["gamma"] is None
  for bad in ({"k": "2.5"}, {"k": "0"}, {"sparsities": "[0.8,1.0]"}, {"gamma": "0"},
              {"gamma": "nan"}, {"k": True}):
    with pytest.raises(ValueError, match="option"):
      parse_options(spec, bad)


def test_every_experiment_declares_its_options_budget_and_runtime(capsys):
  for name, module in experiments().items():
    assert module.OPTIONS and module.BUDGET and module.RUNTIME, name
    assert main(["describe", name]) == 0
    text = capsys.readouterr().out
    assert "Expected runtime" in text and "--rounds counts" in text
    for o in module.OPTIONS:
      assert f"  {o.name} = " in text
  assert main(["run", "sparse_proxskip", "--help"]) == 0
  text = capsys.readouterr().out
  assert "sparsity = 0.9" in text and "--resume" in text
  # every general flag is listed, in its group
  groups = text.split("what runs")[1]
  for flag in ("--rounds", "--clients", "--dataset", "--seed", "--eval-every", "--data-dir",
               "--paper", "--quick", "--set", "--out", "--resume", "--overwrite",
               "--no-progress", "--on-divergence", "--execution", "--processes", "--debug"):
    assert f"  {flag}" in groups, flag
  assert groups.index("--rounds") < groups.index("output, checkpoints and progress") \
      < groups.index("--resume") < groups.index("execution:") < groups.index("--processes")


def test_every_experiment_has_a_quick_setting_that_parses(capsys, quick):
  """``QUICK`` names only Config fields and the experiment's own options, with allowed
  values, and ``describe`` states it with its measured runtime; ``--quick`` runs it (the
  per-experiment tests run each quick setting, checking its plots and its time)."""
  from fedjaxsparse.harness.options import Config, parse_options, with_quick
  for name, module in experiments().items():
    cfg = with_quick(Config(**module.DEFAULTS), module.QUICK)
    assert cfg.quick and module.QUICK_RUNTIME, name
    parse_options(module.OPTIONS, cfg.options, name)  # raises on a bad key or value
    assert main(["describe", name]) == 0
    text = capsys.readouterr().out
    assert "Quick setting (--quick" in text and module.QUICK_RUNTIME.split()[0] in text, name
  with pytest.raises(SystemExit):  # a paper configuration and the quick setting exclude
    main(["run", "sparse_proxskip", "--quick", "--paper", "table4"])
  res = quick("fedavg_digits", "--rounds", "6")  # flags override the quick setting
  assert res["config"]["quick"] and res["config"]["rounds"] == 6
  assert res["config"]["clients"] == experiments()["fedavg_digits"].QUICK["clients"]


def test_resume_after_changing_an_option_is_refused_naming_it(capsys, tmp_path):
  out = ["--out", str(tmp_path), "--rounds", "2"] + ARGS + ["--set", "methods=FedSGD"]
  assert main(["run", "fedavg_digits"] + out) == 0
  err = _err(capsys, ["run", "fedavg_digits", "--resume", "--set", "client_lr=0.5"] + out, 1)
  assert "different run" in err and "client_lr" in err and "0.3" in err and "0.5" in err
  err = _err(capsys, ["run", "fedavg_digits", "--resume", "--clients", "7"] + out[:2] +
             ["--rounds", "2", "--eval-every", "2", "--no-progress", "--set", "local_steps=2",
              "--set", "cohort=3", "--set", "methods=FedSGD"], 1)
  assert "clients" in err and "training data differs" in err
  err = _err(capsys, ["run", "fedavg_digits", "--resume"] + out[:2] + ["--rounds", "1"] +
             out[4:], 1)
  assert "already holds 2 rounds" in err
  # A fresh run into the same folder refuses; --overwrite starts afresh.
  err = _err(capsys, ["run", "fedavg_digits"] + out, 1)
  assert "--resume" in err and "--overwrite" in err
  assert main(["run", "fedavg_digits", "--overwrite", "--set", "client_lr=0.5"] + out) == 0


def test_divergence_is_an_error_or_a_marked_skip(capsys, tmp_path):
  argv = ["run", "fedavg_digits", "--out", str(tmp_path), "--rounds", "30", "--set",
          "client_lr=1e30"] + ARGS
  err = _err(capsys, argv, 1)
  assert "FedAdam" in err and "is not finite at round 1" in err and "diverged" in err
  assert not os.path.exists(tmp_path / "fedavg_digits" / "results.json")
  assert main(argv + ["--on-divergence", "skip", "--overwrite"]) == 0
  res = json.load(open(tmp_path / "fedavg_digits" / "results.json"))
  diverged = {m: r["diverged"] for m, r in res["methods"].items() if r["diverged"]}
  assert list(diverged) == ["FedAdam (server Adam 0.01)"]  # the others stay finite
  stop = diverged["FedAdam (server Adam 0.01)"]["round"]
  for m, record in res["methods"].items():
    rounds = record["history"]["rounds"]["round"]
    assert rounds == list(range(1, (stop if m in diverged else 31)))
  assert f"diverged at round {stop}" in res["table_text"]


def test_missing_data_is_one_line_naming_where_to_put_it(capsys, tmp_path):
  err = _err(capsys, ["run", "sparse_proxskip", "--dataset", "blogfeedback", "--out",
                      str(tmp_path)], 1)
  assert "BlogFeedback" in err and "--data-dir" in err
  err = _err(capsys, ["run", "fedavg_digits", "--dataset", "fashion_mnist", "--data-dir",
                      str(tmp_path / "none"), "--out", str(tmp_path)], 1)
  assert "Fashion-MNIST" in err


@pytest.mark.parametrize("wrapped", [False, True])
def test_a_full_disk_is_one_line_saying_what_to_do(capsys, tmp_path, monkeypatch, wrapped):
  """A full disk while writing (the OS error itself, or wrapped by the checkpoint library)
  ends in one line that names the cause and the way out."""
  import errno
  from fedjaxsparse.experiments import fedavg_digits

  def full(*args, **kwargs):
    e = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "results.json"))
    if not wrapped:
      raise e
    raise RuntimeError("orbax: writing the checkpoint failed") from e

  monkeypatch.setattr(fedavg_digits, "run", full)
  err = _err(capsys, ["run", "fedavg_digits", "--out", str(tmp_path)], 1)
  assert "No space left on device" in err or "no space left" in err
  assert "--out" in err and "--resume" in err


def test_debug_shows_the_traceback(tmp_path):
  with pytest.raises(ValueError, match="unknown option"):
    main(["run", "fedavg_digits", "--debug", "--set", "x=1", "--out", str(tmp_path)])


def test_two_runs_in_one_output_folder(capsys, tmp_path, lock_holder):
  folder = str(tmp_path / "fedavg_digits")
  proc = lock_holder(folder)
  err = _err(capsys, ["run", "fedavg_digits", "--out", str(tmp_path)] + ARGS, 1)
  assert f"pid {proc.pid}" in err and "in use by another run" in err
  assert not os.path.exists(os.path.join(folder, "results.json"))


def test_config_validation():
  with pytest.raises(ValueError, match=r"rounds must be an int in \[1, "):
    Config(rounds=0).validate()
  with pytest.raises(ValueError, match="on_divergence"):
    Config(on_divergence="ignore").validate()
  with pytest.raises(ValueError, match="checkpoint_interval_s must be a number of seconds >= 0"):
    Config(checkpoint_interval_s=-5).validate()
