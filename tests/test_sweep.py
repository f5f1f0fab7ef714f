"""vmap over whole runs: each repetition of a batched run equals the single run with its key."""
import chex
import jax
import numpy as np
import optax
import pytest

import fedjaxsparse as fjs

pytestmark = pytest.mark.integration  # whole runs, batched and one by one (README: the test commands)


def _run_of(tree, s: int):
  """Run ``s`` of a batched result, read on the host (NumPy: no program per indexing)."""
  return jax.tree.map(lambda a: np.asarray(a)[s], tree)


def _keys(seeds):
  """``[jax.random.key(seed) for seed in seeds]`` stacked: the keys' data joined on the host
  (no program for a vmap of the seeding at this shape)."""
  return jax.random.wrap_key_data(np.stack([np.asarray(jax.random.key_data(jax.random.key(int(s))))
                                            for s in seeds]))


def _key_of(keys, s: int):
  """Key ``s`` of a stack of keys, indexed on the host (no program per indexing)."""
  return jax.random.wrap_key_data(np.asarray(jax.random.key_data(keys))[s])


@pytest.fixture(scope="module")
def setup():
  ds = fjs.data.digits(num_clients=10, partition="dirichlet", alpha=0.5, seed=1)
  model = fjs.models.softmax_regression(64, 10)
  return ds, model


def test_repetitions_equal_single_runs(setup):
  ds, model = setup
  build = lambda _: fjs.fedavg(fjs.models.make_loss(model), optax.sgd(0.3), local_steps=2,
                               batch_size=8, cohort_size=4)
  keys = jax.random.split(jax.random.key(0), 3)
  params = model.init(jax.random.key(1))
  eval_fn = fjs.evaluation.make_eval_fn(model)
  states, histories = fjs.run_batched(build, keys, params, ds.train, ds.test, num_rounds=12,
                                      eval_fn=eval_fn, eval_every=4)
  algo = build(None)   # one algorithm for the single runs: they share one compiled chunk
  for s in range(3):
    single = fjs.run(algo, _key_of(keys, s), params, ds.train, ds.test, num_rounds=12,
                     eval_fn=eval_fn, eval_every=4, progress=False)
    chex.assert_trees_all_close(_run_of(states.params, s),
                                single.state.params, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(histories[s].rounds["loss"], single.history.rounds["loss"],
                               rtol=1e-5)
    np.testing.assert_allclose(histories[s].evals["accuracy"],
                               single.history.evals["accuracy"], atol=1e-6)
  # Different keys give different cohorts, hence different runs.
  assert histories[0].rounds["loss"] != histories[1].rounds["loss"]


def test_learning_rate_grid_matches_single_runs(setup):
  ds, model = setup
  hp = fjs.runtime.sweep.grid(lr=[0.05, 0.5], seed=[0, 1])
  keys = _keys(hp["seed"])
  build = lambda h: fjs.fedavg(fjs.models.make_loss(model), optax.sgd(h["lr"]), local_steps=2)
  params = model.init(jax.random.key(1))
  states, histories = fjs.run_batched(build, keys, params, ds.train, num_rounds=5,
                                      hparams={"lr": hp["lr"].astype(np.float32)})
  assert len(histories) == 4
  for s in (0, 3):
    single = fjs.run(fjs.fedavg(fjs.models.make_loss(model), optax.sgd(float(hp["lr"][s])),
                                local_steps=2),
                     _key_of(keys, s), params, ds.train, num_rounds=5, progress=False)
    chex.assert_trees_all_close(_run_of(states.params, s),
                                single.state.params, rtol=1e-5, atol=1e-6)


def test_grid_is_the_cartesian_product():
  g = fjs.runtime.sweep.grid(a=[1, 2, 3], b=[10, 20])
  assert len(g["a"]) == 6
  assert set(zip(g["a"].tolist(), g["b"].tolist())) == {(a, b) for a in (1, 2, 3)
                                                        for b in (10, 20)}


def test_hparams_need_one_setting_per_key(setup):
  ds, model = setup
  with pytest.raises(ValueError, match="leading axis"):
    fjs.run_batched(lambda h: fjs.fedavg(fjs.models.make_loss(model), optax.sgd(h)),
                    jax.random.split(jax.random.key(0), 3), model.init(jax.random.key(1)),
                    ds.train, num_rounds=2, hparams=np.ones(2, np.float32))


def test_proxskip_step_size_and_p_grid_is_one_program():
  """Seed 000's random search over (γ, p) with repetitions: traced hyper-parameters."""
  ds = fjs.data.ridge_regression_problem(num_clients=4, dim=3, seed=0)
  model = fjs.models.linear_regression(3, l2=0.1)
  loss = fjs.models.make_loss(model)
  hp = fjs.runtime.sweep.grid(gamma=[0.01, 0.03], p=[0.2, 0.6], rep=[0, 1])
  keys = _keys(hp["rep"])
  build = lambda h: fjs.sparse_proxskip(loss, h["gamma"], h["p"], 0.5)
  params = model.init(jax.random.key(0))
  hps = {"gamma": hp["gamma"].astype(np.float32), "p": hp["p"].astype(np.float32)}
  states, hist = fjs.run_batched(build, keys, params, ds.train, num_rounds=30, hparams=hps)
  for s in (0, 5):
    single = fjs.run(fjs.sparse_proxskip(loss, float(hp["gamma"][s]), float(hp["p"][s]), 0.5),
                     _key_of(keys, s), params, ds.train, num_rounds=30, progress=False)
    chex.assert_trees_all_close(_run_of(states.server, s),
                                single.state.server, rtol=1e-4, atol=1e-5)
    assert hist[s].rounds["communicated"] == single.history.rounds["communicated"]
