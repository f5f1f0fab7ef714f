"""FedAvg: reduction to gradient descent, convergence to the closed-form ridge optimum, equality
with a Python-loop reference round, cohort sampling, bits, and argument validation."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fedjaxsparse as fjs

L2 = 0.1


@pytest.fixture(scope="module")
def ridge():
  ds = fjs.data.ridge_regression_problem(num_clients=8, dim=5, examples_per_client=30,
                                         heterogeneity=1.0, seed=3)
  model = fjs.models.linear_regression(5, l2=L2)
  return ds, model


def _smoothness(train, weights):
  """L of Σ_i w_i [mean_j ½(x·w+b−y)² + ½ l2‖w‖²] (bias included as a feature)."""
  x = np.asarray(train.x, np.float64)
  m = np.asarray(train.mask, np.float64)
  n = np.asarray(train.num_examples, np.float64)
  xb = np.concatenate([x, np.ones(x.shape[:2] + (1,))], -1) * m[..., None]
  h = np.einsum("i,imd,ime->de", np.asarray(weights) / n, xb, xb) + L2 * np.diag([1.0] * 5 + [0])
  return np.linalg.eigvalsh(h).max()


@pytest.mark.parametrize("weighting", ["num_examples", "uniform"])
def test_one_local_step_is_gradient_descent_and_converges_to_the_optimum(ridge, weighting):
  ds, model = ridge
  w = (fjs.data.example_weights if weighting == "num_examples"
       else fjs.data.uniform_weights)(ds.train)
  lr = 1.0 / _smoothness(ds.train, w)
  algo = fjs.fedavg(fjs.models.make_loss(model), optax.sgd(lr), local_steps=1, weighting=weighting)
  res = fjs.run(algo, jax.random.key(0), model.init(jax.random.key(0)), ds.train,
                num_rounds=3000, chunk_size=1000, progress=False)
  opt = fjs.data.ridge_regression_optimum(ds.train, L2, w)
  np.testing.assert_allclose(res.state.params["w"], opt["w"], rtol=2e-4, atol=2e-5)
  np.testing.assert_allclose(res.state.params["b"], opt["b"], rtol=2e-4, atol=2e-5)


def test_weighting_changes_the_fixed_point(ridge):
  ds, _ = ridge
  a = fjs.data.ridge_regression_optimum(ds.train, L2, fjs.data.example_weights(ds.train))
  b = fjs.data.ridge_regression_optimum(ds.train, L2, fjs.data.uniform_weights(ds.train))
  assert np.abs(a["w"] - b["w"]).max() > 1e-3  # the test above can tell them apart


def _dense_params():
  """Linear-model parameters with no zero entry (so every update is dense)."""
  return {"w": jax.device_put(np.linspace(-1, 1, 5, dtype=np.float32) + np.float32(0.1)),
          "b": jax.device_put(np.float32(0.3))}


def test_round_equals_python_loop_reference(ridge):
  """Same mathematics as fedjax/the papers: a Python loop over clients and local steps."""
  ds, model = ridge
  loss = fjs.models.make_loss(model)
  lr, steps = 0.05, 4
  algo = fjs.fedavg(loss, optax.sgd(lr), local_steps=steps)
  params = _dense_params()
  state = algo.init(jax.random.key(0), params, ds.train)
  state, info = jax.jit(algo.step)(jax.random.key(1), state, ds.train)

  @jax.jit
  def client(x, y, m):   # one client: its loss at the start and its local steps' delta
    p = params
    start = loss(p, x, y, m)
    for _ in range(steps):
      p = jax.tree.map(lambda a, g: a - lr * g, p, jax.grad(loss)(p, x, y, m))
    return start, jax.tree.map(jnp.subtract, p, params)

  host = jax.tree.map(np.asarray, ds.train)
  deltas, losses = [], []
  for i in range(ds.train.num_clients):
    start, delta = client(host.x[i], host.y[i], host.mask[i])
    losses.append(float(start))
    deltas.append(jax.tree.map(np.asarray, delta))
  n = np.asarray(ds.train.num_examples, np.float64)
  wts = n / n.sum()
  expected = jax.tree.map(lambda p, *d: np.asarray(p) + sum(wi * di for wi, di in zip(wts, d)),
                          params, *deltas)
  chex.assert_trees_all_close(state.params, expected, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(info.loss, np.dot(wts, losses), rtol=1e-5)
  d = 6
  assert (float(info.bits_up) == float(info.bits_down)
          == ds.train.num_clients * fjs.accounting.dense_bits(d))


def test_server_sgd_with_unit_rate_is_plain_fedavg(ridge):
  ds, model = ridge
  params = model.init(jax.random.key(0))
  kw = dict(local_steps=3, batch_size=4, cohort_size=3)
  a = fjs.fedavg(fjs.models.make_loss(model), optax.sgd(0.05), **kw)
  b = fjs.fedavg(fjs.models.make_loss(model), optax.sgd(0.05), server_optimizer=optax.sgd(1.0),
                 **kw)
  ra = fjs.run(a, jax.random.key(2), params, ds.train, num_rounds=20, progress=False)
  rb = fjs.run(b, jax.random.key(2), params, ds.train, num_rounds=20, progress=False)
  chex.assert_trees_all_close(ra.state.params, rb.state.params, rtol=1e-5, atol=1e-6)


def test_cohort_is_uniform_without_replacement():
  n, c, trials = 10, 3, 4000
  cohorts = jax.jit(jax.vmap(lambda k: fjs.sampling.sample_cohort(k, n, c)))(
      jax.random.split(jax.random.key(0), trials))
  cohorts = np.asarray(cohorts)
  assert all(len(set(row)) == c for row in cohorts)  # distinct clients
  freq = np.bincount(cohorts.ravel(), minlength=n) / trials
  p = c / n
  se = np.sqrt(p * (1 - p) / trials)
  np.testing.assert_array_less(np.abs(freq - p), 5 * se)  # 5-sigma, per client
  np.testing.assert_array_equal(fjs.sampling.sample_cohort(jax.random.key(0), n, None),
                                np.arange(n))


def test_client_key_depends_on_identity_not_position():
  key = jax.random.key(3)
  a, b = jax.jit(lambda k: (fjs.sampling.client_keys(k, np.array([3, 5, 9], np.int32)),
                            fjs.sampling.client_keys(k, np.array([5], np.int32))))(key)
  np.testing.assert_array_equal(jax.random.key_data(a[1]), jax.random.key_data(b[0]))


def test_weights():
  w = fjs.aggregation.client_weights(np.array([1, 3], np.int32), "num_examples")
  np.testing.assert_allclose(w, [0.25, 0.75])
  np.testing.assert_allclose(fjs.aggregation.client_weights(np.array([1, 3], np.int32),
                                                            "uniform"),
                             [0.5, 0.5])


@pytest.mark.parametrize("kw, match", [
    (dict(local_steps=0), "local_steps"),
    (dict(batch_size=0), "batch_size"),
    (dict(weighting="median"), "weighting"),
])
def test_bad_arguments(ridge, kw, match):
  _, model = ridge
  with pytest.raises(ValueError, match=match):
    fjs.fedavg(fjs.models.make_loss(model), optax.sgd(0.1), **kw)


def test_cohort_larger_than_population_is_refused(ridge):
  ds, model = ridge
  algo = fjs.fedavg(fjs.models.make_loss(model), optax.sgd(0.1), cohort_size=9)
  with pytest.raises(ValueError, match="cohort_size"):
    algo.init(jax.random.key(0), model.init(jax.random.key(0)), ds.train)


def test_uplink_compressor_plug_in(ridge):
  """FedAvg with an identity uplink equals FedAvg; with rand-k the averaged update is
  unbiased (Monte Carlo over keys) and each message costs rand-k's bits."""
  ds, model = ridge
  d = 6
  params = _dense_params()
  plain = fjs.fedavg(fjs.models.make_loss(model), optax.sgd(0.05), local_steps=2)
  ident = fjs.fedavg(fjs.models.make_loss(model), optax.sgd(0.05), local_steps=2,
                     uplink=fjs.compressors.identity(d))
  s0 = plain.init(None, params, ds.train)
  p1, _ = jax.jit(plain.step)(jax.random.key(0), s0, ds.train)
  p2, _ = jax.jit(ident.step)(jax.random.key(0), s0, ds.train)
  chex.assert_trees_all_close(p1.params, p2.params, rtol=1e-6)
  rk = fjs.fedavg(fjs.models.make_loss(model), optax.sgd(0.05), local_steps=2,
                  uplink=fjs.compressors.rand_k(d, 2))
  step = jax.jit(jax.vmap(lambda k: (lambda st, info: (st.params, info.bits_up))(
      *rk.step(k, s0, ds.train))))
  trials = 4000
  out, bits_up = step(jax.random.split(jax.random.key(1), trials))
  for name in ("w", "b"):
    mean = np.asarray(out[name]).mean(0)
    se = np.asarray(out[name]).std(0) / np.sqrt(trials)
    np.testing.assert_array_less(np.abs(mean - np.asarray(p1.params[name])), 5 * se + 1e-6)
  # every message costs rand-k's bits, on every one of the trials' keys
  np.testing.assert_array_equal(np.asarray(bits_up),
                                ds.train.num_clients * fjs.accounting.sparse_bits(2, d))


@pytest.mark.parametrize("weighting", ["num_examples", "uniform"])
def test_float64_one_full_batch_step_is_gradient_descent_to_1e12(ridge, weighting):
  """Under x64 the aggregation weights are float64 too, so a FedAvg round with one
  full-batch local step equals a hand-written float64 gradient step to 1e-12."""
  ds, model = ridge
  with jax.enable_x64(True):
    train = jax.tree.map(lambda a: jax.device_put(np.asarray(a, np.float64))
                         if np.issubdtype(np.asarray(a).dtype, np.floating) else a, ds.train)
    params = jax.tree.map(lambda a: jax.device_put(np.asarray(a, np.float64)),
                          model.init(jax.random.key(0)))
    loss = fjs.models.make_loss(model)
    algo = fjs.fedavg(loss, optax.sgd(0.05), local_steps=1, weighting=weighting)
    w = fjs.aggregation.client_weights(train.num_examples, weighting)
    assert w.dtype == jnp.float64

    @jax.jit
    def gd_step(x):   # the hand-written float64 gradient step
      grads = jax.vmap(jax.grad(loss), in_axes=(None, 0, 0, 0))(x, train.x, train.y, train.mask)
      return jax.tree.map(lambda p, g: p - 0.05 * jnp.tensordot(w, g, axes=1), x, grads)

    state = algo.init(None, params, train)
    step = jax.jit(algo.step)
    x = params
    for t in range(20):
      state, _ = step(jax.random.key(t), state, train)
      x = gd_step(x)
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(x)):
      assert a.dtype == jnp.float64
      np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_clipped_sgd_rescales_to_the_norm_or_clips_each_value():
  g = {"a": np.array([3.0, -4.0], np.float32), "b": np.array([0.0], np.float32)}  # norm 5
  step = lambda opt: jax.jit(lambda g: opt.update(g, opt.init(g))[0])(g)  # noqa: E731
  np.testing.assert_allclose(step(fjs.algorithms.fedavg.clipped_sgd(0.5, 1.0, "norm"))["a"],
                             [-0.3, 0.4], rtol=1e-6)
  np.testing.assert_allclose(step(fjs.algorithms.fedavg.clipped_sgd(0.5, 3.5, "value"))["a"],
                             [-1.5, 1.75])
  np.testing.assert_allclose(step(fjs.algorithms.fedavg.clipped_sgd(0.5))["a"],
                             [-1.5, 2.0])   # no clipping
  with pytest.raises(ValueError, match="clip_mode must be one of"):
    fjs.algorithms.fedavg.clipped_sgd(0.5, 1.0, "max")


def test_a_client_optimizer_of_the_round_switches_step_size_at_its_milestone():
  """A round schedule: ``client_optimizer = lambda t: optax.sgd(schedule(t))`` runs rounds
  before the milestone as ``optax.sgd(lr)`` and rounds from it on as ``optax.sgd(lr·factor)``,
  from the same state and keys."""
  ds = fjs.data.digits(num_clients=4, partition="iid", seed=0)
  model = fjs.models.softmax_regression(64, 10)
  loss = fjs.models.make_loss(model)
  build = lambda opt: fjs.fedavg(loss, opt, local_steps=2, batch_size=8)  # noqa: E731
  params = model.init(jax.random.key(0))
  keys = jax.random.split(jax.random.key(1), 3)
  schedule = optax.piecewise_constant_schedule(0.5, {2: 0.1})
  decayed = build(lambda t: optax.sgd(schedule(t)))
  st = decayed.init(keys[0], params, ds.train)
  want = st
  phase_steps = {lr: jax.jit(build(optax.sgd(lr)).step) for lr in (0.5, 0.05)}
  decayed_step = jax.jit(decayed.step)
  for r, k in enumerate(keys):
    st, _ = decayed_step(k, st, ds.train)
    want, _ = phase_steps[0.5 if r < 2 else 0.05](k, want, ds.train)
    for a, b in zip(jax.tree.leaves(st.params), jax.tree.leaves(want.params)):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
