"""The protocol layer: validation split (disjoint, deterministic, a partition of each client's
training examples), mean ± s.e. over seeds (vmapped seeds equal separate runs), and the
two-stage random search (finds the optimum of a known score, narrows its box, never picks a
diverged candidate)."""
import jax
import numpy as np
import optax
import pytest

import fedjaxsparse as fjs


@pytest.fixture(scope="module")
def ds():
  return fjs.data.digits(num_clients=8, partition="dirichlet", alpha=0.5, seed=0)


def _rows(data, i):
  """Client ``i``'s examples as a set of rows (NumPy: no program compiled per client)."""
  n = int(np.asarray(data.num_examples)[i])
  return {tuple(np.round(r, 6)) + (int(l),)
          for r, l in zip(np.asarray(data.x)[i, :n], np.asarray(data.y)[i, :n])}


def test_validation_split_partitions_each_client(ds):
  fit, val = fjs.harness.protocol.validation_split(ds.train, 0.2, seed=3)
  fit.validate("fit")
  val.validate("validation", allow_empty=True)
  n_fit, n_val = np.asarray(fit.num_examples), np.asarray(val.num_examples)
  for i in range(ds.num_clients):
    whole, a, b = _rows(ds.train, i), _rows(fit, i), _rows(val, i)
    n = int(np.asarray(ds.train.num_examples)[i])
    assert int(n_fit[i]) + int(n_val[i]) == n
    assert int(n_val[i]) == min(round(0.2 * n), n - 1) and int(n_fit[i])
    assert a | b == whole and not a & b  # disjoint, together the client's training data
    assert not (b & _rows(ds.test, i))    # and disjoint from the test split
  again = fjs.harness.protocol.validation_split(ds.train, 0.2, seed=3)[1]
  np.testing.assert_array_equal(again.x, val.x)
  other = fjs.harness.protocol.validation_split(ds.train, 0.2, seed=4)[1]
  assert not np.array_equal(other.x, val.x)


def test_mean_se_of_vmapped_seeds_equals_separate_runs(ds):
  model = fjs.models.softmax_regression(64, 10)
  algo = fjs.fedavg(fjs.models.make_loss(model), optax.sgd(0.3), local_steps=2, batch_size=8,
                    cohort_size=4)
  params = model.init(jax.random.key(0))
  keys = jax.random.split(jax.random.key(1), 5)
  _, hist = fjs.run_batched(lambda hp: algo, keys, params, ds.train, ds.test, num_rounds=12,
                            eval_fn=fjs.evaluation.make_eval_fn(model), eval_every=12)
  batched = fjs.harness.protocol.mean_se([h.evals["accuracy"][-1] for h in hist])
  separate = fjs.harness.protocol.mean_se(
      [fjs.run(algo, k, params, ds.train, ds.test, num_rounds=12,
               eval_fn=fjs.evaluation.make_eval_fn(model), eval_every=12, progress=False)
       .history.evals["accuracy"][-1] for k in keys])
  np.testing.assert_allclose(batched["values"], separate["values"], atol=1e-6)
  np.testing.assert_allclose([batched["mean"], batched["se"]],
                             [separate["mean"], separate["se"]], atol=1e-6)
  v = np.asarray(separate["values"])
  assert separate["se"] == pytest.approx(v.std(ddof=1) / np.sqrt(5))
  assert separate["se"] > 0  # the cohorts differ between seeds


def test_candidate_scores_and_seed_histories_are_their_runs(ds):
  """harness.tuning's batched scoring of a search stage: a candidate's score is the mean of
  its repetitions' final metric, whatever the other candidates sharing its static local-step
  count (whose budget sets its rounds) — the same runs as seed_histories' seeds of that
  setting (seed 0: both key run r with r); a candidate that diverges scores −inf."""
  from fedjaxsparse.harness.tuning import candidate_scores, seed_histories
  model = fjs.models.softmax_regression(64, 10)
  loss = fjs.models.make_loss(model)
  params = model.init(jax.random.key(0))
  ev = lambda p, t: {"neg_loss": -fjs.evaluation.make_eval_fn(model)(p, t)["loss"]}
  build = lambda h, s: fjs.fedavg(loss, optax.sgd(h["lr"]), local_steps=s["steps"],
                                  batch_size=8, cohort_size=4)
  cands = {"lr": np.array([0.3, 0.1, np.inf, 0.3]), "steps": np.array([2, 1, 2, 1])}
  got = candidate_scores(build, cands, static=("steps",), repetitions=2, seed=0,
                         params=params, train=ds.train, test=ds.test,
                         num_rounds=lambda s: 6 // s["steps"], eval_fn=ev, metric="neg_loss")
  assert got[2] == -np.inf and np.isfinite(got[[0, 1, 3]]).all() and got[0] != got[3]
  hist = seed_histories(lambda h: build({"lr": 0.3}, {"steps": 1}), 2, seed=0, params=params,
                        train=ds.train, test=ds.test, num_rounds=6, eval_fn=ev)
  final = [h.evals["neg_loss"][-1] for h in hist]
  np.testing.assert_allclose(got[3], np.mean(final), rtol=1e-5)
  assert final[0] != final[1]   # the seeds differ


def test_state_curves_are_the_runs_metric_after_every_round(ds):
  """runtime.sweep.state_curves (a convergence study's curves): row s is the metric of the
  state of the run keyed keys[s] — init with fold_in(key, R), round t with fold_in(key, t) —
  before the first round and after every round; the seeds' random cohorts differ."""
  model = fjs.models.softmax_regression(64, 10)
  algo = fjs.fedavg(fjs.models.make_loss(model), optax.sgd(0.3), local_steps=1, cohort_size=3)
  params = model.init(jax.random.key(0))
  dist = lambda state: sum(jax.numpy.sum(jax.numpy.square(a)) for a in jax.tree.leaves(
      jax.tree.map(lambda x, y: x - y, state.params, params)))   # ‖w_t − w_0‖²
  keys = jax.random.split(jax.random.key(4), 2)
  got = fjs.runtime.sweep.state_curves(algo, keys, params, ds.train, 3, dist)
  assert got.shape == (2, 4) and got.dtype == np.float64 and np.all(got[:, 0] == 0)
  step = jax.jit(algo.step)
  state = algo.init(jax.random.fold_in(keys[1], 3), params, ds.train)
  for t in range(3):
    state, _ = step(jax.random.fold_in(keys[1], t), state, ds.train)
    np.testing.assert_allclose(got[1, t + 1], float(dist(state)), rtol=1e-5)
  assert not np.allclose(got[0], got[1])


def test_two_stage_search_finds_the_optimum_and_narrows():
  best = {"gamma": 0.03, "steps": 20.0}
  calls = []

  def score(c):
    calls.append(len(c["gamma"]))
    return -(np.log(c["gamma"] / best["gamma"]) ** 2 + np.log(c["steps"] / best["steps"]) ** 2)

  space = {"gamma": fjs.harness.protocol.Dimension(1e-4, 10.0),
           "steps": fjs.harness.protocol.Dimension(1, 500, integer=True)}
  res = fjs.harness.protocol.two_stage_search(score, space, (40, 40), seed=0)
  assert calls == [40, 40]  # each stage scored as one batch
  assert abs(np.log(res.best["gamma"] / 0.03)) < 0.5 and abs(np.log(res.best["steps"] / 20)) < 0.5
  (lo1, hi1), (lo2, hi2) = res.stages[0]["box"]["gamma"], res.stages[1]["box"]["gamma"]
  assert lo1 <= lo2 < hi2 <= hi1 and hi2 / lo2 < hi1 / lo1 / 10  # stage 2 searches a narrower box
  assert all(float(s).is_integer() for s in res.stages[1]["candidates"]["steps"])
  assert res.best_score == max(max(st["scores"]) for st in res.stages)


def test_diverged_candidates_never_win():
  def score(c):  # the larger the step size the better, but above 1 the run diverges
    return np.where(c["gamma"] > 1.0, np.nan, np.log(c["gamma"]))

  res = fjs.harness.protocol.two_stage_search(
      score, {"gamma": fjs.harness.protocol.Dimension(1e-3, 1e3)}, (30, 30), seed=1)
  assert res.best["gamma"] <= 1.0 and np.isfinite(res.best_score)
  with pytest.raises(ValueError, match="every candidate"):
    fjs.harness.protocol.two_stage_search(lambda c: np.full(len(c["gamma"]), np.nan),
                                          {"gamma": fjs.harness.protocol.Dimension(1e-3, 1.0)},
                                          (5,), seed=0)


def test_a_paper_runs_results_say_what_data_ran_and_what_was_reduced(tmp_path, capsys):
  """The words the reproduction ledger prints come from the configuration and the data that
  ran: a reduced configuration says so before it runs and in results.json, and a run on a
  stand-in is a stand-in whatever the configuration names."""
  from fedjaxsparse.data.registry import data_status
  from fedjaxsparse.harness.experiment import entry
  from fedjaxsparse.harness.options import Config
  from fedjaxsparse.harness.protocol import PaperConfig
  assert [data_status(n) for n in ("digits", "shakespeare", "femnist", "femnist_standin")] == [
      "real offline", "real offline", "real with files", "stand-in"]
  papers = {"full": PaperConfig("full", "Table 1", "digits", None, 2, 1, 1, {}, {}, "%"),
            "small": PaperConfig("small", "Table 2", "femnist", "femnist_standin", 2, 1, 1, {},
                                 {}, "%", reduced="a tenth of the writers")}
  run = entry("toy", [], lambda cfg, opts: {"value": 1.0}, papers)
  got = {}
  for name, dataset in (("full", "digits"), ("small", "femnist"), ("small", "femnist_standin")):
    got[name, dataset] = run(Config(paper=name, dataset=dataset, rounds=1, clients=2,
                                    out=str(tmp_path / dataset), progress=False)
                             )["paper_configuration"]
  assert (got["full", "digits"]["scale"], got["full", "digits"]["data"]) == (
      "paper protocol", "real offline")
  assert (got["small", "femnist"]["scale"], got["small", "femnist"]["data"]) == (
      "reduced", "real with files")
  assert got["small", "femnist"]["reduced"] == "a tenth of the writers"
  assert got["small", "femnist_standin"]["data"] == "stand-in"
  assert "[--paper small: reduced — a tenth of the writers]" in capsys.readouterr().out
