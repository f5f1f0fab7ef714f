"""What the tables print: one convention for a missing value ("—" with its footnote), no
standard error from a single seed, "rounds to ε" as the round from which a curve stays below
ε, and a paper's claim printed with this run's verdict."""
import itertools
import json

import jax
import numpy as np
import optax
import pytest

import fedjaxsparse as fjs


def test_a_single_seed_has_no_standard_error_and_prints_a_dash(capsys):
  one, three = fjs.harness.protocol.mean_se([0.8]), fjs.harness.protocol.mean_se([0.7, 0.8, 0.9])
  assert one["se"] is None and one["mean"] == 0.8
  assert three["se"] == pytest.approx(np.std([0.7, 0.8, 0.9], ddof=1) / np.sqrt(3))
  text = fjs.harness.report.print_table(
      [{"method": "A", "acc": one["mean"], "s.e.": one["se"]},
       {"method": "B", "acc": three["mean"], "s.e.": three["se"]}],
      ["method", "acc", "s.e."])
  row_a = text.splitlines()[2]
  assert (row_a.split()[-1] == fjs.harness.report.MISSING and " 0 " not in row_a
          and "x" not in row_a.split())
  assert text.splitlines()[-1] == fjs.harness.report.MISSING_NOTE
  full = fjs.harness.report.print_table([{"method": "B", "s.e.": three["se"]}], ["method", "s.e."])
  assert fjs.harness.report.MISSING_NOTE not in full  # the footnote only where a dash is printed


def test_rounds_to_eps_is_where_the_curve_stays_below():
  dip = [1.0, 0.04, 0.2, 0.3, 0.2, 0.03, 0.02, 0.01]   # first hit at 1, stays below from 5
  assert fjs.accounting.rounds_below(dip, 0.05) == 5
  assert fjs.accounting.cost_to_target(dip, 1, 0.05) == 1.0  # the paper's cost: the first hit
  # ends above: never settled
  assert fjs.accounting.rounds_below([1.0, 0.5, 0.04, 0.06], 0.05) is None
  assert fjs.accounting.rounds_below([0.01, 0.02], 0.05) == 0
  assert fjs.accounting.rounds_below([1.0, np.nan, 0.01], 0.05) == 2  # NaN is not below


def test_a_claim_carries_its_verdict_line():
  check = fjs.harness.protocol.check_claim
  assert check("SS beats BS", True) == {"claim": "SS beats BS", "holds": True,
                                        "text": "the paper: SS beats BS — holds here"}
  assert check("SS beats BS", False)["text"] == "the paper: SS beats BS — does NOT hold here"
  assert check("larger γ is faster", None)["holds"] is None
  assert check("larger γ is faster", None)["text"].endswith("— not checked here")
  assert check("x", np.bool_(True))["holds"] is True   # a NumPy verdict is saved as a bool


def test_steps_report_progress_and_time_left(capsys, monkeypatch):
  """Experiments without a runner progress bar print one line per finished piece, with the
  time spent and the time left at the mean pace so far; ``--no-progress`` silences them."""
  clock = itertools.chain([100.0, 110.0, 130.0], itertools.repeat(130.0))  # start, 1, 2
  monkeypatch.setattr(fjs.harness.running.time, "perf_counter", lambda: next(clock))
  steps = fjs.harness.running.Steps(4, "demo")
  steps.done("first")
  steps.done("second")
  err = capsys.readouterr().err.splitlines()
  assert err == ["[demo 1/4] first done; 10 s so far, about 30 s left",
                 "[demo 2/4] second done; 30 s so far, about 30 s left"]
  quiet = fjs.harness.running.Steps(2, "demo", enabled=False)
  quiet.done("x")
  assert capsys.readouterr().err == ""


_TUNING = {}


def _digits_tuning(tmp_path):
  """(dataset, softmax model, a 6-round config, fitting and validation splits) of the digits,
  the tuning tests' common problem (the data, model and evaluation made once for the module)."""
  if not _TUNING:
    ds = fjs.data.digits(num_clients=4, partition="iid", seed=0)
    model = fjs.models.softmax_regression(64, 10)
    fit, val = fjs.harness.protocol.validation_split(ds.train, 0.25, 0)
    _TUNING.update(ds=ds, model=model, fit=fit, val=val,
                   eval_fn=fjs.evaluation.make_eval_fn(model), fedavg={})
  cfg = fjs.harness.options.Config(rounds=6, eval_every=3, out=str(tmp_path), progress=False)
  return _TUNING["ds"], _TUNING["model"], cfg, _TUNING["fit"], _TUNING["val"]


def _fedavg(lr):
  """The tuning tests' FedAvg with learning rate ``lr``: one algorithm per grid value (a Python
  float), so the runs of a candidate share one compiled chunk across the tests (a traced or
  NumPy ``lr``, in batched tuning, builds its own)."""
  def make():
    return fjs.fedavg(fjs.models.make_loss(_TUNING["model"]), optax.sgd(lr), local_steps=5,
                      batch_size=16)
  if type(lr) is not float:
    return make()
  cache = _TUNING["fedavg"]
  if lr not in cache:
    cache[lr] = make()
  return cache[lr]


def test_tune_then_run_picks_the_best_validation_candidate_and_reports_seeds(tmp_path):
  ds, model, cfg, fit, val = _digits_tuning(tmp_path)
  eval_fn = _TUNING["eval_fn"]
  seen = []

  def build(lr, run):
    seen.append((lr, run))
    return _fedavg(lr)

  tuned = fjs.harness.tuning.tune_then_run(
      cfg, "t", "FedAvg", [1e-3, 0.3], build, model.init(jax.random.key(0)), fit, val, ds.train,
      ds.test, eval_fn,
      tune_cfg=fjs.harness.tuning.tuning_config(cfg), seeds=2)
  assert tuned.best == 0.3 and tuned.scores[0.3] > tuned.scores[1e-3]
  assert [r for _, r in seen[:2]] == [(0, 3, True)] * 2              # half the rounds to tune
  assert [r for _, r in seen[2:]] == [(0, 6, False), (1, 6, False)]  # then every seed, in full
  assert len(tuned.records) == 2 and len(tuned.finals) == 2
  assert tuned.stats["mean"] == pytest.approx(sum(tuned.finals) / 2)
  assert tuned.finals[0] == pytest.approx(100 * tuned.records[0]["final"]["accuracy"])
  single = fjs.harness.tuning.tune_then_run(
      cfg, "t", "one", [0.3], build, model.init(jax.random.key(0)), fit, val, ds.train, ds.test,
      eval_fn, tune_cfg=fjs.harness.tuning.tuning_config(cfg), seeds=1)
  assert single.best == 0.3 and single.scores == {} and single.stats["se"] is None


def test_vmapped_seeds_are_the_sequential_seeds_and_a_round_spends_its_budget_units(tmp_path):
  """``vmap_seeds``: the final runs as one program give the sequential runs' histories (the
  same keys, cfg.seed + 100·s; up to float reassociation); ``per_round``: a method whose round
  spends 2 budget units runs rounds // 2 rounds and evaluates every eval_every // 2, in its
  tuning runs and its final runs alike."""
  import dataclasses

  ds, model, cfg, fit, val = _digits_tuning(tmp_path)
  runs = {v: fjs.harness.tuning.tune_then_run(
      cfg, "t", f"FedAvg vmap={v}", [0.3], lambda lr, run: _fedavg(lr),
      model.init(jax.random.key(0)), fit, val, ds.train, ds.test, _TUNING["eval_fn"],
      tune_cfg=fjs.harness.tuning.tuning_config(cfg), seeds=3, vmap_seeds=v)
      for v in (False, True)}
  for seq, vm in zip(runs[False].records, runs[True].records):
    assert seq["history"]["evals"]["round"] == vm["history"]["evals"]["round"] == [0, 3, 6]
    np.testing.assert_allclose(vm["history"]["evals"]["accuracy"],
                               seq["history"]["evals"]["accuracy"], atol=1e-6)
    np.testing.assert_allclose(vm["history"]["rounds"]["loss"],
                               seq["history"]["rounds"]["loss"], rtol=1e-5)
  assert len({tuple(r["history"]["rounds"]["loss"]) for r in runs[True].records}) == 3
  with pytest.raises(fjs.errors.NonFiniteError, match="seed 0"):   # as a sequential run would
    fjs.harness.tuning.tune_then_run(
        cfg, "t", "FedAvg diverging", [3e38], lambda lr, run: _fedavg(lr),
        model.init(jax.random.key(0)), fit, val, ds.train, ds.test, _TUNING["eval_fn"],
        tune_cfg=fjs.harness.tuning.tuning_config(cfg), seeds=2, vmap_seeds=True)
  seen = []

  def build(lr, run):
    seen.append(run)
    return _fedavg(lr)

  units = dataclasses.replace(cfg, rounds=12, eval_every=6)   # the budget in units
  t = fjs.harness.tuning.tune_then_run(
      units, "t", "FedAvg per round", [1e-3, 0.3], build, model.init(jax.random.key(0)), fit,
      val, ds.train, ds.test, _TUNING["eval_fn"],
      tune_cfg=fjs.harness.tuning.tuning_config(units), seeds=1, per_round=lambda lr: 2)
  assert [r.rounds for r in seen] == [3, 3, 6]   # 6 and 12 units: 3 and 6 rounds of 2 units
  assert t.records[0]["history"]["evals"]["round"] == [0, 3, 6]   # every 6 units: every 3


@pytest.mark.integration   # tuning runs of a grid, batched and sequential
def test_batched_tuning_runs_the_grid_as_one_program_with_the_sequential_scores(tmp_path):
  """A grid declared batched (build takes a traced lr) is tuned in one vmapped program: the
  same key, rounds and evaluation as one run per candidate, so the same validation scores (up
  to float reassociation), the same choice, and a diverging candidate found and passed over."""
  import dataclasses

  ds, model, cfg, fit, val = _digits_tuning(tmp_path)
  traced = []

  def build(lr, run):
    traced.append(isinstance(lr, jax.core.Tracer))
    return _fedavg(lr)

  grid = [1e-3, 0.3, 3e38]     # the last one overflows: a non-finite loss
  runs = {}
  for mode in ("batched", "sequential"):
    c = dataclasses.replace(cfg, tuning=mode, on_divergence="skip")
    runs[mode] = fjs.harness.tuning.tune_then_run(
        c, "t", f"FedAvg {mode}", grid, build, model.init(jax.random.key(0)), fit, val,
        ds.train, ds.test, _TUNING["eval_fn"],
        tune_cfg=fjs.harness.tuning.tuning_config(c), seeds=1, batched=True)
    if mode == "batched":
      assert any(traced) and len(traced) < len(grid) + 2   # the grid traced, not run one by one
  b, s = runs["batched"], runs["sequential"]
  assert b.best == s.best == 0.3
  assert b.scores[3e38] == s.scores[3e38] == -1.0            # diverged: never chosen
  for lr in (1e-3, 0.3):
    assert b.scores[lr] == pytest.approx(s.scores[lr], abs=1e-6)
  assert b.finals == pytest.approx(s.finals)                  # the final runs are the same
  with pytest.raises(fjs.errors.ConfigError, match="data per candidate"):
    fjs.harness.tuning.tune_then_run(
        cfg, "t", "x", grid, build, model.init(jax.random.key(0)), fit, val, ds.train,
        ds.test, None, tune_cfg=fjs.harness.tuning.tuning_config(cfg), seeds=1,
        batched=True, data=lambda c, split: split)
  with pytest.raises(fjs.errors.ConfigError, match="tuning must be one of"):
    dataclasses.replace(cfg, tuning="grid").validate()


def test_searched_values_reach_the_final_runs_as_the_search_scored_them():
  """``Search.value``: integer dimensions and integer choices as ints, a static value as the
  number the search passed (an int only when whole), every other value a float."""
  dim = fjs.harness.protocol.Dimension
  search = fjs.harness.tuning.Search(
      {"lr": dim(0.01, 1.0), "clip": dim(0.1, 0.9), "steps": dim(1, 9, integer=True),
       "batch": dim(32, 64, choices=(32, 64)), "frac": dim(0.5, 1.0, choices=(0.5, 1.0))},
      static=("clip", "batch"))
  got = {k: search.value(k, v) for k, v in
         {"lr": 0.3, "clip": 0.3, "steps": 4.0, "batch": 32.0, "frac": 1.0}.items()}
  assert got == {"lr": 0.3, "clip": 0.3, "steps": 4, "batch": 32, "frac": 1.0}
  assert [type(got[k]) for k in ("lr", "clip", "steps", "batch", "frac")] == [
      float, float, int, int, float]
  assert type(search.value("clip", 2.0)) is int    # a whole static value, as it was passed


@pytest.mark.integration   # two searches of two stages and their final runs
def test_a_searched_method_is_tuned_on_validation_data_by_the_random_search(tmp_path):
  """A :class:`~fedjaxsparse.harness.tuning.Search` instead of a grid: every stage of the
  two-stage random search is scored on the validation split, the best candidate of all stages
  is chosen — a static or integer value as a Python int, the others floats — and run on the
  training data; relabelling the test split moves the final accuracy but not one score of
  the search."""
  ds, model, cfg, fit, val = _digits_tuning(tmp_path)
  dim = fjs.harness.protocol.Dimension
  search = fjs.harness.tuning.Search(
      {"lr": dim(0.01, 1.0), "steps": dim(5, 5, integer=True, choices=(5,))},
      static=("steps",), samples=(8, 4))
  seen = []

  def build(c, run):
    seen.append((type(c["steps"]), isinstance(c["lr"], jax.core.Tracer), run.tuning))
    return _fedavg(c["lr"])    # 5 local steps, as c["steps"] says

  runs = {}
  relabelled = ds.test._replace(y=(ds.test.y + 3) % 10)
  for tag, test in (("clean", ds.test), ("relabelled", relabelled)):
    runs[tag] = fjs.harness.tuning.tune_then_run(
        cfg, "t", f"FedAvg {tag}", [None], build, model.init(jax.random.key(0)), fit, val,
        ds.train, test, _TUNING["eval_fn"], tune_cfg=fjs.harness.tuning.tuning_config(cfg),
        seeds=1, search=search)
  t = runs["clean"]
  stages = t.search.stages
  assert [len(st["scores"]) for st in stages] == [8, 4]
  flat = [(score, lr) for st in stages for score, lr in zip(st["scores"],
                                                           st["candidates"]["lr"])]
  best_score = max(score for score, _ in flat)
  best_lr = next(lr for score, lr in flat if score == best_score)   # the first of equals
  assert t.search.best_score == best_score and t.best == {"lr": best_lr, "steps": 5}
  assert type(t.best["lr"]) is float and type(t.best["steps"]) is int
  top = sorted(range(8), key=lambda i: -stages[0]["scores"][i])[:2]   # stage 1's best quarter
  first = [stages[0]["candidates"]["lr"][i] for i in top]
  lo, hi = stages[1]["box"]["lr"]          # the second stage searched exactly its range
  assert (lo, hi) == (min(first), max(first)) and hi - lo < 1.0 - 0.01
  assert all(lo <= v <= hi for v in stages[1]["candidates"]["lr"])
  assert (int, True, True) in seen and (int, False, False) in seen   # searched traced, then run
  assert all(typ is int for typ, _, _ in seen)
  assert runs["relabelled"].search == t.search            # the test split was never read
  assert runs["relabelled"].finals != t.finals
  assert t.finals[0] == pytest.approx(100 * t.records[0]["final"]["accuracy"])
  assert t.scores[str(t.best)] == best_score


def test_first_divergence_names_the_first_non_finite_round_and_quantity():
  first = fjs.harness.running.first_divergence
  h = {"rounds": {"round": [1, 2, 3], "loss": [1.0, 2.0, float("nan")],
                  "bits_up": [1.0, float("inf"), 1.0]},
       "evals": {"round": [0, 3], "accuracy": [0.1, float("nan")]}}
  assert first(h) == {"round": 2, "quantity": "bits_up"}
  h["rounds"]["bits_up"] = [1.0, 1.0, 1.0]
  assert first(h) == {"round": 3, "quantity": "loss"}
  assert first({"rounds": {"round": [1], "loss": [0.5]}, "evals": {"round": []}}) is None


def test_batched_tuning_marks_a_candidate_whose_state_ends_non_finite_as_diverged(tmp_path):
  """A candidate whose state goes NaN while every reported number stays finite (an argmax
  accuracy, a loss of the incoming state) is diverged in batched tuning too: never chosen."""
  import jax.numpy as jnp

  def build(lr, run):   # lr = 2 goes NaN at round 4; lr = 1 stays finite
    def init(key, params, data):
      return {"w": jnp.zeros(3), "t": jnp.zeros((), jnp.int32)}

    def step(key, s, data):
      t = s["t"] + 1
      w = jnp.where((t == 4) & (lr > 1.5), jnp.nan, s["w"] + lr * jnp.arange(3.0))
      return {"w": w, "t": t}, {"loss": jnp.sum(s["w"])}
    return fjs.Algorithm(init, step)

  def eval_fn(state, test):   # finite even for a NaN state
    return {"accuracy": (jnp.argmax(state["w"]) == 2).astype(jnp.float32)}

  cfg = fjs.harness.options.Config(rounds=8, eval_every=4, out=str(tmp_path), progress=False,
                                      on_divergence="skip")
  tuned = fjs.harness.tuning.tune_then_run(
      cfg, "t", "m", [2.0, 1.0], build, {"p": jax.device_put(np.zeros(1, np.float32))},
      jax.device_put(np.ones((4, 3), np.float32)), None,
      jax.device_put(np.ones((4, 3), np.float32)), None, eval_fn, tune_cfg=fjs.harness.tuning.tuning_config(cfg),
      seeds=1, params_fn=lambda s: s, batched=True)
  assert tuned.scores == {2.0: -1.0, 1.0: 1.0} and tuned.best == 1.0


def test_a_run_on_a_standin_says_it_is_not_comparable(tmp_path, capsys):
  """``--dataset *_standin``: results.json's ``standin`` and every table's title say the
  numbers are not comparable with the paper's; a run on real data carries no such flag, and
  an experiment's own stand-in note is kept."""
  from fedjaxsparse.harness.options import Config
  from fedjaxsparse.harness.running import finish
  from fedjaxsparse.harness.report import Table
  table = {"table": Table([{"method": "FedAvg", "ours %": 50.0}], title="Table 1")}
  out = finish(Config(dataset="fashion_mnist_standin", out=str(tmp_path)), "x", table)
  printed = capsys.readouterr().out
  saved = json.load(open(tmp_path / "x" / "results.json"))
  assert "not comparable with the paper's" in saved["standin"] == out["standin"]
  assert printed.index("not comparable") < printed.index("Table 1")
  real = finish(Config(dataset="fashion_mnist", out=str(tmp_path)), "y", table)
  assert "standin" not in real and "not comparable" not in capsys.readouterr().out
  own = finish(Config(dataset="femnist_standin", out=str(tmp_path)), "z",
               {**table, "standin": "the experiment's own note"})
  assert own["standin"] == "the experiment's own note"


def test_fedspa_table5_never_prints_a_negative_share_of_time():
  """Table 5's line: a DST − RSM difference below zero means the mask search is within the
  round's timing noise, and is said so — no negative percentage is printed."""
  import re
  from fedjaxsparse.experiments.fedspa_table1 import _share_text
  base = {"train_s": 0.5, "repeats": 20}
  clear = _share_text(dict(base, mask_s=0.05, ratio=0.1, ratio_iqr=[0.06, 0.14]))
  assert "10.0 %" in clear and "interquartile range 6.0 to 14.0 %" in clear
  noisy = _share_text(dict(base, mask_s=0.01, ratio=0.02, ratio_iqr=[-0.03, 0.05]))
  within = _share_text(dict(base, mask_s=-0.01, ratio=-0.02, ratio_iqr=[-0.06, 0.01]))
  assert "timing noise" in noisy and "timing noise" in within and "2.0 %" in noisy
  for text in (clear, noisy, within):
    assert not re.search(r"-\d", text), text


def test_a_convergence_study_declares_its_settings_and_its_table(tmp_path):
  """An untuned declared study with two settings (ridge regression at two l2 strengths, each
  its own optimum and gap evaluation), its own table and float64: FedSGD with full
  participation is gradient descent on the average objective, so its gap to the closed-form
  optimum falls geometrically far below float32's resolution; the table sees every setting,
  results.json does not keep them, and two settings may not reuse a method's name."""
  from fedjaxsparse.errors import ConfigError
  from fedjaxsparse.harness.experiment import Context, Tuning, declared
  from fedjaxsparse.harness.options import Config
  from fedjaxsparse.harness.report import Table
  rng = np.random.default_rng(0)
  xs = [rng.normal(size=(8, 3)) / np.sqrt(3) for _ in range(3)]
  ys = [x @ np.array([1.0, -2.0, 0.5]) + 0.1 * rng.normal(size=8) for x in xs]
  data = fjs.data.pack_clients(np.concatenate(xs), np.concatenate(ys),
                               [np.arange(8 * i, 8 * i + 8) for i in range(3)])
  seen = {}

  def setup(cfg, opts):
    d = data._replace(x=data.x.astype(np.float64), y=data.y.astype(np.float64),
                      mask=data.mask.astype(np.float64))
    ds = fjs.data.FederatedDataset(d, d, 0, "ridge")
    for l2 in opts["l2s"]:
      model = fjs.models.linear_regression(3, l2=l2, use_bias=False)
      loss = fjs.models.make_loss(model)
      h = sum(x.T @ x / 8 for x in xs) / 3 + l2 * np.eye(3)   # F = (1/3) Σ_i f_i
      w_star = np.linalg.solve(h, sum(x.T @ y / 8 for x, y in zip(xs, ys)) / 3)
      f = lambda w, t, loss=loss: jax.numpy.mean(jax.vmap(loss, in_axes=(None, 0, 0, 0))(
          w, t.x, t.y, t.mask))
      f_star = float(f({"w": jax.numpy.asarray(w_star)}, d))
      yield Context(ds, {"w": jax.numpy.zeros(3)}, lambda p, t, f=f, s=f_star: {"gap": f(p, t) - s},
                    {"loss": loss, "lr": 1 / np.linalg.eigvalsh(h).max()}, setting=f"l2={l2:g}")

  def methods(ctx, cfg, opts):
    return {f"{opts['name']} ({ctx.setting})": fjs.fedavg(ctx.extra["loss"],
                                                          optax.sgd(ctx.extra["lr"]))}

  def table(records, contexts, cfg, opts):
    seen["settings"] = [c.setting for c in contexts]
    return Table([{"method": m, "final gap": r["history"]["evals"]["gap"][-1]}
                  for m, r in records.items()])

  options = (fjs.harness.options.Option("l2s", [0.5, 1.0], "l2 strengths", kind="floats"),
             fjs.harness.options.Option("name", "GD", "method name", kind="str"))
  run = declared("study", options, setup=setup, methods=methods, table=table, metric="gap",
                 higher_is_better=False, float64=lambda opts: True, figure=lambda *a: [],
                 report=lambda results, ctx, cfg, opts: {"settings run": len(results["contexts"])})
  cfg = Config(rounds=60, clients=3, eval_every=60, out=str(tmp_path), progress=False)
  res = run(cfg)
  assert seen["settings"] == ["l2=0.5", "l2=1"] and res["settings run"] == 2
  assert [r["method"] for r in res["table"]] == ["GD (l2=0.5)", "GD (l2=1)"]
  for row in res["table"]:   # float32 would stop near 1e-8 of f* ≈ 0.3
    assert -1e-13 <= row["final gap"] < 1e-12
  saved = json.load(open(tmp_path / "study" / "results.json"))
  assert "contexts" not in saved and len(saved["methods"]) == 2
  with pytest.raises(ConfigError, match="name each setting's methods apart"):
    declared("same", options, setup=setup, methods=lambda ctx, cfg, opts: {
        "GD": methods(ctx, cfg, opts).popitem()[1]}, table=table, float64=lambda opts: True,
             figure=lambda *a: [])(cfg)
  with pytest.raises(ValueError, match="untuned"):
    declared("both", options, setup=setup, methods=methods, table=table, tuning=Tuning())


def test_a_curve_study_records_the_state_metric_of_every_round_and_seed(tmp_path):
  """A setting that declares a ``curve`` runs its methods as state curves: gradient descent on
  a quadratic (FedSGD, full participation) has w_t − w⋆ = (I − ηH)^t (w_0 − w⋆) exactly, so
  the recorded ‖w_t − w⋆‖² matches the closed form at every round, for every seed, from the
  initial point on; a study's table may return several tables as a dict, and the default
  figure draws one panel per setting."""
  from fedjaxsparse.errors import ConfigError
  from fedjaxsparse.harness.experiment import Context, declared
  from fedjaxsparse.harness.options import Config, Option
  from fedjaxsparse.harness.report import Table
  rng = np.random.default_rng(1)
  f32 = lambda a: a.astype(np.float32).astype(np.float64)   # the data as packed (float32)
  xs = [f32(rng.normal(size=(6, 2))) for _ in range(2)]
  ys = [f32(x @ np.array([0.5, -1.0]) + 0.1 * rng.normal(size=6)) for x in xs]
  data = fjs.data.pack_clients(np.concatenate(xs), np.concatenate(ys),
                               [np.arange(6 * i, 6 * i + 6) for i in range(2)])
  h = sum(x.T @ x / 6 for x in xs) / 2            # F = (1/2) Σ_i f_i, f_i = mean of squares/2
  w_star = np.linalg.solve(h, sum(x.T @ y / 6 for x, y in zip(xs, ys)) / 2)
  etas = {s: float(np.float32(f / np.linalg.eigvalsh(h).max()))   # float32 steps: exact in
          for s, f in (("slow", 0.2), ("fast", 0.9))}                  # either precision

  def setup(cfg, opts):
    d = data._replace(x=data.x.astype(np.float64), y=data.y.astype(np.float64),
                      mask=data.mask.astype(np.float64))
    ds = fjs.data.FederatedDataset(d, d, 0, "least squares")
    gap = lambda state: jax.numpy.sum(jax.numpy.square(state.params["w"] - w_star))
    loss = fjs.models.make_loss(fjs.models.linear_regression(2, use_bias=False))
    for speed in ("slow", "fast"):
      yield Context(ds, {"w": jax.numpy.zeros(2)}, None, {"loss": loss}, setting=speed,
                    rounds=7 if speed == "slow" else 5, curve=gap)

  def methods(ctx, cfg, opts):
    return {f"GD ({ctx.setting})": fjs.fedavg(ctx.extra["loss"], optax.sgd(etas[ctx.setting]))}

  def table(records, contexts, cfg, opts):
    return {"final": Table([{"method": m, "gap": float(r["curves"][0, -1])}
                            for m, r in records.items()]), "settings": len(contexts)}

  options = (Option("seeds", 3, "seeds", low=1),)
  run = declared("curves", options, setup=setup, methods=methods, table=table,
                 metric="‖w_t − w⋆‖²", float64=lambda opts: True)
  res = run(Config(rounds=50, clients=2, out=str(tmp_path), progress=False))
  saved = json.load(open(tmp_path / "curves" / "results.json"))
  assert res["settings"] == 2 and [r["method"] for r in res["final"]] == ["GD (slow)", "GD (fast)"]
  for speed, rounds in (("slow", 7), ("fast", 5)):
    rec = saved["methods"][f"GD ({speed})"]
    m = np.eye(2) - etas[speed] * h
    want = [float(np.sum(np.square(np.linalg.matrix_power(m, t) @ w_star)))
            for t in range(rounds + 1)]
    assert rec["seeds"] == 3 and rec["rounds"] == rounds and rec["setting"] == speed
    np.testing.assert_allclose(rec["curves"], [want] * 3, rtol=1e-10)
  assert (tmp_path / "curves" / "curves.png").exists()
  with pytest.raises(ConfigError, match="declare its 'table'"):
    declared("untabled", options, setup=setup, methods=methods, float64=lambda opts: True)(
        Config(rounds=5, clients=2, out=str(tmp_path), progress=False))
  from fedjaxsparse.harness.experiment import Tuning
  with pytest.raises(ConfigError, match="is not tuned"):   # refused, not run without its curve
    declared("tuned", options, setup=setup, methods=methods, tuning=Tuning(),
             float64=lambda opts: True)(
        Config(rounds=5, clients=2, out=str(tmp_path), progress=False))


def test_a_study_of_trials_runs_every_method_seed_by_seed_in_declaration_order(tmp_path):
  """Trials (methods that are not federated runs) run once per seed, seed by seed (a Trial
  with ``seeds=1`` only for the first), each seeing only the records of its own seed's earlier
  trials, each with its own checkpoint folder and a fingerprint naming its seed; the table reads ``{method: {"seeds": [...]}}``; a study mixing
  Trials with algorithms, or without a table, is refused."""
  from fedjaxsparse.errors import ConfigError
  from fedjaxsparse.harness.experiment import Context, Trial, declared
  from fedjaxsparse.harness.options import Config, Option
  from fedjaxsparse.harness.report import Table
  order, runs = [], []

  def least_squares(run):   # a closed-form "training": the mean of seeded draws
    order.append(("fit", run.seed))
    runs.append(run)
    draws = np.random.default_rng(run.seed).normal(3.0, 1.0, size=400)
    return {"estimate": float(draws.mean())}

  def matched(run):         # a baseline matched to the same seed's earlier result
    order.append(("matched", run.seed))
    assert set(run.earlier) == {"fit"}   # this seed's only
    return {"estimate": run.earlier["fit"]["estimate"] / 2}

  def once(run):            # a deterministic method: one seed
    order.append(("once", run.seed))
    return {"estimate": 3.0}

  def methods(ctx, cfg, opts):
    return {"fit": Trial(least_squares), "matched": Trial(matched),
            "once": Trial(once, seeds=1)}

  def table(records, contexts, cfg, opts):
    return Table([{"method": m, "mean": float(np.mean([r["estimate"] for r in rec["seeds"]]))}
                  for m, rec in records.items()])

  options = (Option("seeds", 3, "seeds", low=1),)
  run = declared("trials", options, setup=lambda cfg, opts: Context(None, None, None),
                 methods=methods, table=table)
  res = run(Config(seed=5, out=str(tmp_path), progress=False))
  assert order == [("fit", 5), ("matched", 5), ("once", 5)] + [
      (m, s) for s in (6, 7) for m in ("fit", "matched")]
  assert len({r.checkpoints for r in runs}) == 3
  assert [r.fingerprint["seed"] for r in runs] == [5, 6, 7]
  assert [r.index for r in runs] == [0, 1, 2]
  fits = [np.random.default_rng(s).normal(3.0, 1.0, size=400).mean() for s in (5, 6, 7)]
  rows = {r["method"]: r["mean"] for r in res["table"]}
  assert rows["fit"] == pytest.approx(np.mean(fits)) and rows["matched"] == pytest.approx(
      np.mean(fits) / 2)
  # the mean of 3 × 400 draws of N(3, 1): within 5 standard errors of 3
  assert abs(rows["fit"] - 3.0) < 5 / np.sqrt(1200)
  saved = json.load(open(tmp_path / "trials" / "results.json"))
  assert [len(saved["methods"][m]["seeds"]) for m in ("fit", "matched", "once")] == [3, 3, 1]
  assert rows["once"] == 3.0
  with pytest.raises(ConfigError, match="declare its 'table'"):
    declared("untabled", options, setup=lambda cfg, opts: Context(None, None, None),
             methods=methods)(Config(out=str(tmp_path), progress=False))
  with pytest.raises(ConfigError, match="every method as a Trial or none"):
    declared("mixed", options, setup=lambda cfg, opts: Context(None, None, None),
             methods=lambda ctx, cfg, opts: {"fit": Trial(least_squares), "GD": object()},
             table=table)(Config(out=str(tmp_path), progress=False))
