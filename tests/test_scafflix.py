"""Scafflix / i-Scaffnew / FLIX (seed 001 ch. 3) on strongly convex quadratics with closed-form
optima: convergence to the FLIX optimum x* = (Σ α_i² A_i)^{-1} Σ α_i² A_i x_i*, h_i → ∇f_i(x̃_i*),
Σ α_i h_i preserved, and the reductions (α = 1 and equal γ: ProxSkip; p = 1: GD on FLIX)."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjaxsparse as fjs

L2 = 0.1
ALPHA = np.array([0.2, 0.5, 0.9, 1.0, 0.7], np.float32)


def loss(params, x, y, mask):
  r = x @ params["w"] - y
  return 0.5 * jnp.sum(mask * r ** 2) / jnp.sum(mask) + 0.5 * L2 * jnp.sum(params["w"] ** 2)


def _problem(x, y, n):
  """``n`` equal clients of (x, y) with their closed forms (float64)."""
  m, d = len(x) // n, x.shape[1]
  data = fjs.data.pack_clients(x, y, np.split(np.arange(n * m), n))
  xs = np.asarray(data.x, np.float64)
  A = np.einsum("nmi,nmj->nij", xs, xs) / m + L2 * np.eye(d)
  c = np.linalg.solve(A, (np.einsum("nmi,nm->ni", xs, np.asarray(data.y, np.float64)) / m)[..., None])[..., 0]
  L = np.linalg.eigvalsh(A)[:, -1]
  a2A = (ALPHA.astype(np.float64) ** 2)[:, None, None] * A
  x_opt = np.linalg.solve(a2A.sum(0), np.einsum("nij,nj->i", a2A, c))
  x_tilde = ALPHA[:, None] * x_opt + (1 - ALPHA[:, None]) * c
  h_opt = np.einsum("nij,nj->ni", A, x_tilde - c)  # ∇f_i(x̃_i*)
  return dict(data=data, A=A, c=c, L=L, x_opt=x_opt, h_opt=h_opt,
              w0={"w": jnp.zeros(d, jnp.float32)})


@pytest.fixture(scope="module")
def quad():
  rng = np.random.default_rng(0)
  n, m, d = 5, 12, 3
  x = rng.normal(size=(n * m, d)).astype(np.float32) * np.repeat(
      rng.uniform(0.5, 2.0, n), m)[:, None].astype(np.float32)  # different L_i
  y = (x @ rng.normal(size=d) + rng.normal(size=n * m)).astype(np.float32)
  return _problem(x, y, n)


def _steps(algo, first, count):
  """A jitted ``(state, data) -> (state, infos stacked over the steps)``: ``count`` steps of
  ``algo``, step ``t`` with the key ``jax.random.key(first + t)``, in one ``lax.scan`` (one
  dispatch instead of one per step)."""
  @jax.jit
  def run(state, data):
    def body(state, t):
      return algo.step(jax.random.key(first + t), state, data)
    return jax.lax.scan(body, state, jnp.arange(count))
  return run


def _run(algo, q, steps, key=0):
  state = algo.init(None, q["w0"], q["data"])
  state, infos = _steps(algo, key * 100_000, steps)(state, q["data"])
  return state, jax.tree.map(np.asarray, infos)


def test_local_optima_reach_the_closed_form(quad):
  opt = fjs.algorithms.scafflix.local_optima(loss, quad["w0"], quad["data"],
                                             lr=float(1 / quad["L"].max()), tol=1e-5,
                                             max_steps=5000)
  np.testing.assert_allclose(opt.x_star["w"], quad["c"], atol=1e-4)
  assert np.all(np.asarray(opt.grad_norm) < 1e-5) and np.all(np.asarray(opt.steps) > 0)


def test_local_optima_by_sgd_approach_the_closed_form(quad):
  """Minibatch SGD (the chapter's pre-training of networks) with a fixed budget gets near
  x_i*; tol = 0 runs exactly max_steps steps."""
  opt = fjs.algorithms.scafflix.local_optima(loss, quad["w0"], quad["data"],
                                             lr=float(0.3 / quad["L"].max()), tol=0.0,
                                             max_steps=3000, batch_size=12, key=jax.random.key(5))
  np.testing.assert_array_equal(opt.steps, 3000)
  err = np.linalg.norm(np.asarray(opt.x_star["w"]) - quad["c"], axis=1)
  assert np.all(err < 0.1 * np.linalg.norm(quad["c"], axis=1)), err


def test_scafflix_converges_to_the_flix_optimum(quad):
  x_star = {"w": jnp.asarray(quad["c"], jnp.float32)}
  algo = fjs.scafflix(loss, 1 / quad["L"], 0.3, ALPHA, x_star)
  state, info = _run(algo, quad, 3000)
  np.testing.assert_allclose(state.server["w"], quad["x_opt"], atol=2e-4)
  np.testing.assert_allclose(state.h["w"], quad["h_opt"], atol=2e-4)
  # Σ α_i h_i stays 0 (float32 round-off) while Σ h_i does not
  assert float(np.max(info.alpha_h_sum_norm)) < 1e-4
  assert float(np.linalg.norm(np.sum(quad["h_opt"], 0))) > 0.1
  # the personalised models are x̃_i* = α_i x* + (1 − α_i) x_i*
  tilde = fjs.algorithms.scafflix.personalize(state.server, x_star, jnp.asarray(ALPHA))
  np.testing.assert_allclose(tilde["w"], ALPHA[:, None] * quad["x_opt"]
                             + (1 - ALPHA[:, None]) * quad["c"], atol=2e-4)
  # ... and are what the state reads out as its personal models (the uniform reader)
  chex.assert_trees_all_equal(fjs.personal_params(state), tilde)


def test_round_form_with_partial_participation_keeps_the_invariant(quad):
  x_star = {"w": jnp.asarray(quad["c"], jnp.float32)}
  algo = fjs.scafflix(loss, 1 / quad["L"], 0.3, ALPHA, x_star, form="round", cohort_size=2)
  state, info = _run(algo, quad, 400)
  assert float(np.max(info.alpha_h_sum_norm)) < 1e-4
  assert set(np.unique(info.bits_up)) == {2 * 32 * 3}  # two dense uploads of d = 3 per round
  start = np.linalg.norm(quad["x_opt"])
  assert np.linalg.norm(np.asarray(state.server["w"]) - quad["x_opt"]) < 0.05 * start


def test_equal_steps_and_no_personalization_is_proxskip(quad):
  gamma = float(1 / quad["L"].max())
  a, _ = _run(fjs.i_scaffnew(loss, gamma, 0.3), quad, 200)
  b, _ = _run(fjs.proxskip(loss, gamma, 0.3), quad, 200)
  chex.assert_trees_all_close(a.server, b.server, rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_close(a.h, b.h, rtol=1e-5, atol=1e-5)
  assert int(a.comms) == int(b.comms) > 0


def test_p_one_is_gradient_descent_on_flix(quad):
  x_star = {"w": jnp.asarray(quad["c"], jnp.float32)}
  gammas = 1 / quad["L"]
  lr = float(1 / np.mean(ALPHA ** 2 / gammas))
  a, _ = _run(fjs.scafflix(loss, gammas, 1.0, ALPHA, x_star), quad, 50)
  b, _ = _run(fjs.flix_sgd(loss, lr, ALPHA, x_star), quad, 50)
  chex.assert_trees_all_close(a.server, b.params, rtol=1e-4, atol=1e-5)
  # both read out the same personalised models x̃_i = α_i x + (1 − α_i) x_i*
  chex.assert_trees_all_close(fjs.personal_params(a), fjs.personal_params(b), rtol=1e-4,
                              atol=1e-5)
  np.testing.assert_allclose(fjs.personal_params(b)["w"][3], b.params["w"])  # α = 1


def test_bad_arguments(quad):
  x_star = {"w": jnp.asarray(quad["c"], jnp.float32)}
  with pytest.raises(fjs.errors.ConfigError, match="alpha_i"):
    fjs.scafflix(loss, 0.1, 0.3, np.array([0.0, 1, 1, 1, 1]), x_star).init(None, quad["w0"],
                                                                           quad["data"])
  with pytest.raises(ValueError, match="x_star"):
    fjs.scafflix(loss, 0.1, 0.3, 0.5).init(None, quad["w0"], quad["data"])
  with pytest.raises(ValueError, match="form='round'"):
    fjs.scafflix(loss, 0.1, 0.3, 0.5, x_star, cohort_size=2)
  with pytest.raises(fjs.errors.ConfigError, match="p"):
    fjs.scafflix(loss, 0.1, 0.0, 0.5, x_star)
  # per-client values given as jax arrays are checked when given, and init traces with them
  # (the runner's client-strategy choice traces it)
  gammas = np.full(5, 0.1, np.float32)
  bad = gammas.copy()
  bad[2] = 0.0
  with pytest.raises(fjs.errors.ConfigError, match="gamma_i"):
    fjs.scafflix(loss, jax.device_put(bad), 0.3, 0.5, x_star)
  gammas = jax.device_put(gammas)
  assert fjs.runtime.clients.choose_strategy(fjs.scafflix(loss, gammas, 0.3, 0.5, x_star),
                                             quad["w0"], quad["data"])[0] == "vmap"


def test_personal_evaluation_uses_each_clients_own_model():
  """α = 1: every client uses the global model (= pooled evaluation); α → 0: client i uses
  its own x_i*: the per-client values are the clients' own-model metrics, the example-weighted
  average pools them, the client mean averages them; a client without test examples is NaN
  in the vector and left out of the mean; the global model is reported beside them."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=(60, 4)).astype(np.float32)
  y = rng.integers(0, 3, 60).astype(np.int32)
  parts = [np.arange(0, 10), np.arange(10, 40), np.arange(40, 60), np.arange(0)]
  data = fjs.data.pack_clients(x, y, parts, allow_empty=True)
  model = fjs.models.softmax_regression(4, 3)
  g = jax.jit(model.init)(jax.random.key(0))
  own = jax.tree.map(
      lambda a: jax.device_put(rng.normal(size=(4,) + a.shape).astype(np.float32)), g)
  # every evaluation jitted, as the runner runs it (one program each, not one per operation)
  glob = jax.jit(fjs.evaluation.make_personal_eval_fn(
      model, fjs.algorithms.scafflix.flix_models(own, 1.0)))(g, data)
  pooled = jax.jit(lambda g, data: fjs.evaluation.evaluate(model, g, data))(g, data)
  for k in ("loss", "accuracy"):
    np.testing.assert_allclose(glob[k], pooled[k], rtol=1e-6)
    np.testing.assert_allclose(glob[f"global_{k}"], pooled[k], rtol=1e-6)
  personal = jax.jit(fjs.evaluation.make_personal_eval_fn(
      model, fjs.algorithms.scafflix.flix_models(own, 1e-7)))(g, data)
  per = jax.jit(lambda own, data: fjs.evaluation.evaluate_per_client(model, own, data))(
      own, data)
  personal, per = jax.device_get((personal, per))
  sizes = np.array([len(p) for p in parts])
  for k in ("loss", "accuracy"):
    v = np.asarray(per[k])[:3]
    np.testing.assert_allclose(personal[f"{k}_per_client"][:3], v, rtol=1e-5)
    assert np.isnan(personal[f"{k}_per_client"][3])
    np.testing.assert_allclose(personal[f"{k}_client_mean"], v.mean(), rtol=1e-5)
    np.testing.assert_allclose(personal[k], np.sum(v * sizes[:3]) / 60, rtol=1e-5)
    np.testing.assert_allclose(personal[f"global_{k}"], pooled[k], rtol=1e-6)


def test_runner_records_per_client_metrics(quad):
  """Vector metrics land in the history as lists (one value per client), NaN for a client
  without test data does not count as divergence, and both evaluation paths agree."""
  model = fjs.models.linear_regression(3, use_bias=False)
  x_star = {"w": jnp.asarray(quad["c"], jnp.float32)}
  algo = fjs.scafflix(loss, 1 / quad["L"], 0.3, ALPHA, x_star, form="round")
  d = quad["data"]
  mask, num_examples = np.array(d.mask), np.array(d.num_examples)
  mask[4], num_examples[4] = 0.0, 0
  test = d._replace(mask=jax.device_put(mask), num_examples=jax.device_put(num_examples))

  def eval_fn(params, test):
    return fjs.evaluation.evaluate_personal(
        model, fjs.algorithms.scafflix.personalize(params, x_star, jnp.asarray(ALPHA)), test)

  runs = [fjs.run(algo, jax.random.key(0), quad["w0"], quad["data"], test, num_rounds=4,
                  eval_fn=eval_fn, eval_every=2, chunk_size=c, progress=False) for c in (2, 4)]
  for r in runs:
    per = np.array(r.history.evals["loss_per_client"])
    assert per.shape == (3, 5) and np.all(np.isnan(per[:, 4])) and np.all(per[:, :4] > 0)
    np.testing.assert_allclose(r.history.evals["loss_client_mean"], per[:, :4].mean(1),
                               rtol=1e-5)
  np.testing.assert_allclose(runs[0].history.evals["loss_per_client"],
                             runs[1].history.evals["loss_per_client"], rtol=1e-6)


def _x64(q):
  d = q["data"]
  return {**q, "data": d._replace(x=d.x.astype(jnp.float64), y=d.y.astype(jnp.float64),
                                  mask=d.mask.astype(jnp.float64)),
          "w0": {"w": jnp.zeros(3, jnp.float64)}}


def test_automatic_constants_match_the_closed_form(quad):
  """γ_i = 1/L_i with L_i = λ_max(∇²f_i), p = 1/√κ_max, μ_i = λ_min(∇²f_i) (least squares);
  the global switch uses 1/max_i L_i for every client; the trace bound (l2 + tr of the data
  term, d = 3) is looser."""
  eig = np.linalg.eigvalsh(quad["A"])
  c = fjs.algorithms.scafflix.scafflix_constants(quad["data"], L2, "squared", ALPHA, use_bias=False)
  np.testing.assert_allclose(c.gammas, 1 / eig[:, -1], rtol=1e-6)
  np.testing.assert_allclose(c.mu, eig[:, 0], rtol=1e-6)
  np.testing.assert_allclose(c.p, 1 / np.sqrt(np.max(eig[:, -1] / eig[:, 0])), rtol=1e-6)
  np.testing.assert_allclose(c.flix_lr, 1 / np.mean(ALPHA.astype(float) ** 2 * eig[:, -1]),
                             rtol=1e-6)
  g = fjs.algorithms.scafflix.scafflix_constants(quad["data"], L2, "squared", individual=False,
                                                 use_bias=False)
  np.testing.assert_allclose(g.gammas, np.full(5, 1 / eig[:, -1].max()), rtol=1e-6)
  t = fjs.algorithms.scafflix.scafflix_constants(quad["data"], L2, "squared", bound="trace",
                                                 use_bias=False)
  np.testing.assert_allclose(t.L, np.trace(quad["A"], axis1=1, axis2=2) - 2 * L2, rtol=1e-6)
  assert np.all(t.L >= c.L)
  with pytest.raises(ValueError, match="strongly convex"):
    fjs.algorithms.scafflix.scafflix_constants(quad["data"], 0.0, "logistic", use_bias=False)


def test_float64_convergence_with_fewer_communications_than_flix_gd(quad):
  """Exact gradients, theory constants, float64: Scafflix reaches the closed-form FLIX optimum
  to relative error < 1e-8 and needs fewer communications for it than GD on FLIX with its
  theory step (not within 3× as many), on an ill-conditioned problem (κ_max > 50)."""
  x = np.asarray(quad["data"].x).reshape(60, 3) * np.array([4.0, 1.0, 0.1], np.float32)
  ill = _problem(x, np.asarray(quad["data"].y).reshape(60), 5)  # κ_max in the hundreds
  with jax.enable_x64(True):
    q = _x64(ill)
    c = fjs.algorithms.scafflix.scafflix_constants(q["data"], L2, "squared", ALPHA, use_bias=False)
    x_star = {"w": jnp.asarray(q["c"])}
    target = np.linalg.norm(q["x_opt"])

    def comms_to_target(algo, max_comms, chunk=250):
      """The communications after the first step whose model is within 1e-8·‖x*‖ of x*
      (None if ``max_comms`` are done first, or after 100·max_comms steps); the steps run
      ``chunk`` at a time in one scan, and are then checked one by one."""
      state = algo.init(None, q["w0"], q["data"])

      @jax.jit
      def run(state, first):
        def body(state, t):
          state, _ = algo.step(jax.random.key(t), state, q["data"])
          server = state.params if hasattr(state, "params") else state.server
          return state, (server["w"], state.comms if hasattr(state, "comms") else t + 1)
        return jax.lax.scan(body, state, first + jnp.arange(chunk))

      for first in range(0, 100 * max_comms, chunk):
        state, (w, comms) = run(state, first)
        errors = np.linalg.norm(np.asarray(w) - q["x_opt"], axis=1)
        for t, error, c in zip(range(first, 100 * max_comms), errors, np.asarray(comms)):
          if error < 1e-8 * target:
            return int(c)
          if c >= max_comms:
            return None
      return None

    assert c.kappa_max > 50
    sx = comms_to_target(fjs.scafflix(loss, c.gammas, c.p, ALPHA, x_star, form="round"), 2000)
    assert sx is not None
    # GD on FLIX does not get there in three times as many communications
    assert comms_to_target(fjs.flix_sgd(loss, c.flix_lr, ALPHA, x_star), 3 * sx) is None


def test_wrong_initialisation_converges_to_a_wrong_point(quad):
  """Spec C3-1: Algorithm 4's Σ_i h_i⁰ = 0 is not the invariant when the α_i differ. From
  h⁰ with Σ h_i⁰ = 0 but Σ α_i h_i⁰ ≠ 0 Scafflix converges away from the FLIX optimum; the
  library's default h⁰ = 0 converges to it (float64, exact gradients)."""
  with jax.enable_x64(True):
    q = _x64(quad)
    c = fjs.algorithms.scafflix.scafflix_constants(q["data"], L2, "squared", ALPHA, use_bias=False)
    algo = fjs.scafflix(loss, c.gammas, 0.3, ALPHA, {"w": jnp.asarray(q["c"])})
    steps = _steps(algo, 0, 4000)   # 4,000 steps, keys 0, 1, ...
    h0 = np.random.default_rng(1).normal(size=(5, 3))
    h0 -= h0.mean(0)  # Σ h_i⁰ = 0
    assert np.linalg.norm(ALPHA.astype(float) @ h0) > 0.1  # but Σ α_i h_i⁰ ≠ 0
    errors = []
    for h in (None, h0):
      state = algo.init(None, q["w0"], q["data"])
      if h is not None:
        state = state._replace(h={"w": jax.device_put(h)})
      state, _ = steps(state, q["data"])
      errors.append(np.linalg.norm(np.asarray(state.server["w"]) - q["x_opt"]))
    assert errors[0] < 1e-10 and errors[1] > 1e-3, errors


def test_small_alpha_gives_the_local_optima(quad):
  """α → 0: the personalised models x̃_i* = α x* + (1 − α) x_i* tend to the local optima
  (distance O(α)); Scafflix runs with a tiny α and its personal models are within 2α·‖x*‖."""
  x_star = {"w": jnp.asarray(quad["c"], jnp.float32)}
  alpha = 1e-3
  state, _ = _run(fjs.scafflix(loss, alpha ** 2 / quad["L"], 0.5, alpha, x_star), quad, 200)
  tilde = fjs.algorithms.scafflix.personalize(state.server, x_star, jnp.full((5,), alpha))
  gap = np.linalg.norm(np.asarray(tilde["w"]) - quad["c"], axis=1)
  assert np.all(gap <= 2 * alpha * max(np.linalg.norm(quad["x_opt"]), 1.0)), gap


def _partial_cohort(quad):
  """scafflix_cohort with a cohort of 2 and p = 0.3, x_i* by 3,000 GD steps of 1/max_i L_i
  (the cohort tests share it: their host-resident runs compile the same programs)."""
  return fjs.algorithms.scafflix.scafflix_cohort(
      loss, 1 / quad["L"], 0.3, ALPHA, optimum_lr=float(1 / quad["L"].max()),
      optimum_steps=3000, cohort_size=2)


def test_cohort_form_for_host_resident_populations(quad):
  """scafflix_cohort (client state h_i, x_i* read and written for the cohort only): its
  init_client's GD reaches the closed-form local optima; with p = 1 and every client it is
  Scafflix's round form from those optima, round for round; with a cohort of 2 and p = 0.3
  the host-resident run equals the device-resident one bit for bit, Σ_i α_i h_i over the whole
  population stays 0 and x̄ approaches the FLIX optimum."""
  population = fjs.runtime.population
  lr = float(1 / quad["L"].max())
  kw = dict(optimum_lr=lr, optimum_steps=3000)
  full = fjs.algorithms.scafflix.scafflix_cohort(loss, 1 / quad["L"], 1.0, ALPHA, **kw)
  res = fjs.run(population.on_device(full), jax.random.key(0), quad["w0"], quad["data"],
                num_rounds=20, progress=False)
  x_star = res.state.clients.x_star
  np.testing.assert_allclose(x_star["w"], quad["c"], atol=1e-4)
  ref, _ = _run(fjs.scafflix(loss, 1 / quad["L"], 1.0, ALPHA, x_star, form="round"), quad, 20)
  np.testing.assert_allclose(res.state.server.params["w"], ref.server["w"], rtol=1e-5,
                             atol=1e-6)
  np.testing.assert_allclose(res.state.clients.h["w"], ref.h["w"], rtol=1e-5, atol=1e-6)
  part = _partial_cohort(quad)
  key = jax.random.key(7)
  dev = fjs.run(population.on_device(part), key, quad["w0"], quad["data"], num_rounds=30,
                progress=False)
  host = population.run_on_host(part, key, quad["w0"], quad["data"], num_rounds=30,
                                progress=False)
  chex.assert_trees_all_equal(jax.device_get(dev.state.server), jax.device_get(host.server))
  chex.assert_trees_all_equal(jax.device_get(dev.state.clients), host.clients)
  assert np.linalg.norm(ALPHA @ host.clients.h["w"]) < 1e-4
  long = fjs.run(population.on_device(part), key, quad["w0"], quad["data"], num_rounds=400,
                 progress=False)
  gap = np.linalg.norm(np.asarray(long.state.server.params["w"]) - quad["x_opt"])
  assert gap < 0.05 * np.linalg.norm(quad["x_opt"])


def test_experiments_run_the_cohort_form_on_the_host_or_the_device(quad, tmp_path):
  """harness.running.run_method takes a CohortAlgorithm: with the population in host memory
  it records the same rounds and evaluations as with it on the device (same key); an unknown
  residence is refused naming the allowed ones."""
  from fedjaxsparse.harness.options import Config
  from fedjaxsparse.harness.running import run_method
  algo = _partial_cohort(quad)
  cfg = Config(rounds=6, eval_every=3, out=str(tmp_path), progress=False)
  ev = lambda w, test: {"norm": jnp.sqrt(jnp.sum(w["w"] ** 2))}  # noqa: E731
  recs = {r: run_method(cfg, "t", r, algo, quad["w0"], quad["data"], None, ev, residence=r)
          for r in ("device", "host")}
  assert recs["host"]["clients"] == "host"
  for table in ("rounds", "evals"):
    a, b = (recs[r]["history"][table] for r in ("device", "host"))
    for col in ("round", "loss", "uplink_bits", "norm"):
      if col in a:
        np.testing.assert_array_equal(a[col], b[col])
  with pytest.raises(Exception, match="residence must be one of"):
    run_method(cfg, "t", "x", algo, quad["w0"], quad["data"], None, ev, residence="gpu")
