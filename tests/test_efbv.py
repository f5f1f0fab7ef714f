"""EF-BV, EF21, DIANA: exact reductions with shared keys, the invariants of Fig. 2.1, linear
convergence to the closed-form optimum at the theoretical step size, and the parameter rule
checked against Table A.2."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjaxsparse as fjs

efbv = fjs.algorithms.efbv

DIM, L2 = 6, 0.5
D = DIM + 1


@pytest.fixture(scope="module")
def problem():
  ds = fjs.data.ridge_regression_problem(num_clients=5, dim=DIM, examples_per_client=25, seed=2)
  model = fjs.models.linear_regression(DIM, l2=L2)
  return ds, model, fjs.models.make_loss(model)


def _grads(loss, x, data):
  return jax.vmap(jax.grad(loss), in_axes=(None, 0, 0, 0))(x, data.x, data.y, data.mask)


def test_lambda_nu_one_with_top_k_is_original_ef21(problem):
  ds, model, loss = problem
  comp = fjs.compressors.top_k(D, 2)
  gamma = 0.05
  algo = fjs.ef21(loss, comp, gamma, lam=1.0, h_init="zero")
  x0 = jax.tree.map(lambda a: jax.device_put(np.asarray(a) + 0.5), model.init(jax.random.key(0)))
  state = algo.init(None, x0, ds.train)
  # Original EF21 (Richtárik et al. 2021, Alg. 1), written out with g_i.
  n = ds.num_clients

  @jax.jit
  def original(key, x, g_i):
    # EF21 compresses ∇f_i(x^t) − g_i^t at the point where g is used: our iteration order
    # computes the gradient at the current x and updates x with the new estimate.
    grads = _grads(loss, x, ds.train)
    c = jax.vmap(comp.compress)(fjs.sampling.client_keys(key, jnp.arange(n)),
                                jax.tree.map(jnp.subtract, grads, g_i))
    g_i = jax.tree.map(jnp.add, g_i, c)
    x = jax.tree.map(lambda a, b: a - gamma * b, x, jax.tree.map(lambda a: jnp.mean(a, 0), g_i))
    return x, g_i

  x, g_i = x0, jax.tree.map(lambda a: np.zeros((n,) + a.shape, a.dtype), x0)
  step = jax.jit(algo.step)
  for t in range(8):
    key = jax.random.key(t)
    state, _ = step(key, state, ds.train)
    x, g_i = original(key, x, g_i)
    chex.assert_trees_all_close(state.x, x, rtol=1e-5, atol=1e-6)
    chex.assert_trees_all_close(state.h_clients, g_i, rtol=1e-5, atol=1e-6)


def test_server_h_tracks_the_client_mean_and_nu_equal_lambda_gives_g_equal_h(problem):
  ds, model, loss = problem
  comp = fjs.compressors.comp_k(D, 2, 4)
  lam = 0.3
  algo = fjs.ef_bv(loss, comp, 0.02, lam, lam)
  state = algo.init(None, model.init(jax.random.key(0)), ds.train)
  step = jax.jit(algo.step)
  for t in range(6):
    prev = state
    state, _ = step(jax.random.key(t), state, ds.train)
    host, before = jax.tree.map(np.asarray, state), jax.tree.map(np.asarray, prev)
    chex.assert_trees_all_close(host.h, jax.tree.map(lambda a: np.mean(a, 0), host.h_clients),
                                atol=1e-6)
    # ν = λ: x⁺ = x − γ g with g = h⁺ (the EF21 structure).
    chex.assert_trees_all_close(host.x, jax.tree.map(lambda a, h: a - np.float32(0.02) * h,
                                                     before.x, host.h), atol=1e-6)


def test_nu_one_is_diana(problem):
  ds, model, loss = problem
  comp = fjs.compressors.rand_k(D, 3)
  lam, gamma = 1 / (1 + comp.omega), 0.02
  a = fjs.diana(loss, comp, gamma)
  b = fjs.ef_bv(loss, comp, gamma, lam, 1.0)
  x0 = model.init(jax.random.key(0))
  sa, sb = a.init(None, x0, ds.train), b.init(None, x0, ds.train)
  n = ds.num_clients

  @jax.jit
  def written_out(key, x, h_i):
    # DIANA written out: g = mean(h_i + C(∇f_i − h_i)), h_i += λ C(...).
    c = jax.vmap(comp.compress)(fjs.sampling.client_keys(key, jnp.arange(n)),
                                jax.tree.map(jnp.subtract, _grads(loss, x, ds.train), h_i))
    g = jax.tree.map(lambda h, cc: jnp.mean(h + cc, 0), h_i, c)
    h_i = jax.tree.map(lambda h, cc: h + lam * cc, h_i, c)
    x = jax.tree.map(lambda p, gg: p - gamma * gg, x, g)
    return x, h_i

  x, h_i = x0, jax.jit(_grads, static_argnums=0)(loss, x0, ds.train)
  step_a, step_b = jax.jit(a.step), jax.jit(b.step)
  for t in range(5):
    key = jax.random.key(t)
    sa, _ = step_a(key, sa, ds.train)
    sb, _ = step_b(key, sb, ds.train)
    x, h_i = written_out(key, x, h_i)
    chex.assert_trees_all_close(sa.x, x, rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_equal(sa, sb)


def test_identity_is_proximal_gradient_descent(problem):
  ds, model, loss = problem
  gamma, lam1 = 0.05, 0.2
  prox = lambda tree, step: jax.tree.map(
      lambda a: jnp.sign(a) * jnp.maximum(jnp.abs(a) - step * lam1, 0), tree)
  algo = fjs.prox_gd(loss, gamma, D, prox=prox)
  x = model.init(jax.random.key(0))
  state = algo.init(None, x, ds.train)

  @jax.jit
  def prox_step(x):
    g = jax.tree.map(lambda a: jnp.mean(a, 0), _grads(loss, x, ds.train))
    return prox(jax.tree.map(lambda p, gg: p - gamma * gg, x, g), gamma)

  step = jax.jit(algo.step)
  for t in range(5):
    state, _ = step(jax.random.key(t), state, ds.train)
    x = prox_step(x)
    chex.assert_trees_all_close(state.x, x, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["efbv", "ef21", "diana"])
def test_linear_convergence_at_the_theoretical_step_size(problem, name):
  ds, model, loss = problem
  consts = fjs.convex.constants.linear_model_constants(ds.train, L2, "squared", "mean")
  n = ds.num_clients
  comp = fjs.compressors.rand_k(D, 3) if name == "diana" else fjs.compressors.comp_k(D, 2, 4)
  lam_star = min((1 - comp.eta) / ((1 - comp.eta) ** 2 + comp.omega), 1.0)
  nu = {"efbv": None, "ef21": lam_star, "diana": 1.0}[name]  # EF21: ν = λ*; DIANA: ν = 1
  prm = efbv.efbv_params(comp.eta, comp.omega, fjs.compressors.omega_ran(comp.omega, n),
                         consts.L_max, consts.L_tilde, nu=nu)
  algo = fjs.ef_bv(loss, comp, prm["gamma"], prm["lam"], prm["nu"])
  opt = fjs.data.ridge_regression_optimum(ds.train, L2, fjs.data.uniform_weights(ds.train))
  with jax.enable_x64(True):
    data = jax.tree.map(lambda a: jax.device_put(np.asarray(a, np.float64))
                        if np.asarray(a).dtype.kind == "f" else jnp.asarray(a), ds.train)
    x0 = jax.tree.map(lambda a: jax.device_put(np.zeros(a.shape, np.float64)),
                      model.init(jax.random.key(0)))
    errs = []
    for rounds in (3000, 6000):
      res = fjs.run(algo, jax.random.key(0), x0, data, num_rounds=rounds, chunk_size=1000,
                    progress=False)
      flat = np.concatenate([np.ravel(res.state.x["b"]), res.state.x["w"]])
      ref = np.concatenate([np.ravel(opt["b"]), opt["w"]])
      errs.append(np.linalg.norm(flat - ref) / np.linalg.norm(ref))
  rho = max(1 - prm["gamma"] * consts.mu, (prm["r"] + 1) / 2)
  # Converging linearly to the optimum (or already there to float64 precision).
  assert errs[1] < 1e-3 and (errs[1] < 0.5 * errs[0] or errs[1] < 1e-10)
  assert rho < 1


def test_parameter_rule_matches_table_a2():
  """Spec §3 check: comp-(1,56), d = 112, n = 1000, L = L̃ = 3.787 (mushrooms)."""
  comp = fjs.compressors.comp_k(112, 1, 56)
  p = efbv.efbv_params(comp.eta, comp.omega, fjs.compressors.omega_ran(comp.omega, 1000), 3.787,
                       3.787)
  assert p["lam"] == pytest.approx(5.317e-3, rel=1e-3)
  assert p["nu"] == 1.0
  assert p["r"] == pytest.approx(0.998443, abs=2e-6)
  assert p["gamma"] == pytest.approx(1.38e-4, rel=5e-3)  # Table A.2: 1.38e-4
  ef = efbv.efbv_params(comp.eta, comp.omega, fjs.compressors.omega_ran(comp.omega, 1000), 3.787,
                        3.787, nu=p["lam"], r_av_rule="ef21")
  assert ef["gamma"] == pytest.approx(1.03e-4, rel=5e-3)  # Table A.2 EF21: 1.03e-4
  # The paper's EF21 rule: r_av = r, so γ = 1/(L + L̃/s*) exactly.
  assert ef["r_av"] == ef["r"] and ef["gamma"] == pytest.approx(1 / (3.787 + 3.787 / ef["s"]),
                                                                rel=1e-12)
  theory = efbv.efbv_params(comp.eta, comp.omega, fjs.compressors.omega_ran(comp.omega, 1000),
                            3.787, 3.787, nu=p["lam"])
  assert theory["r_av"] < theory["r"] and theory["gamma"] > ef["gamma"]
  idp = efbv.efbv_params(0.0, 0.0, 0.0, 2.0, 2.0)
  assert idp["gamma"] == 0.5 and idp["r"] == 0.0  # identity: γ = 1/L
  with pytest.raises(ValueError, match="r ="):
    efbv.efbv_params(comp.eta, comp.omega, 0.0, 1.0, 1.0, lam=1.0)
  with pytest.raises(ValueError, match="eta"):
    efbv.efbv_params(1.0, 0.0, 0.0, 1.0, 1.0)


# Table A.2 (spec §6.1.3), ξ = 1 columns: d, k, λ*, r, r_av, s*, γ_EF-BV, γ_EF21.
TABLE_A2 = [
    ("mushrooms", 112, 1, 5.32e-3, 0.998, 0.555, 3.90e-4, 1.38e-4, 1.03e-4),
    ("mushrooms", 112, 2, 1.08e-2, 0.997, 0.527, 7.94e-4, 2.87e-4, 2.10e-4),
    ("phishing", 68, 1, 8.85e-3, 0.997, 0.533, 6.50e-4, 2.33e-3, 1.71e-3),
    ("phishing", 68, 2, 1.82e-2, 0.994, 0.516, 1.34e-3, 4.80e-3, 3.49e-3),
    ("a9a", 123, 1, 4.83e-3, 0.999, 0.564, 3.5e-4, 2.53e-4, 1.91e-4),
    ("a9a", 123, 2, 9.8e-3, 0.997, 0.534, 7.13e-4, 5.28e-4, 3.87e-4),
    ("w8a", 300, 1, 1.96e-3, 0.999, 0.649, 1.44e-4, 1.01e-4, 8.12e-5),
    ("w8a", 300, 2, 3.95e-3, 0.999, 0.574, 2.90e-4, 2.15e-4, 1.63e-4),
]


@pytest.mark.parametrize("name, d, k, lam, r, r_av, s, g_efbv, g_ef21", TABLE_A2)
def test_dimensionless_parameters_reproduce_table_a2(name, d, k, lam, r, r_av, s, g_efbv,
                                                     g_ef21):
  comp = fjs.compressors.comp_k(d, k, d // 2)
  om_ran = fjs.compressors.omega_ran(comp.omega, 1000)
  p = efbv.efbv_params(comp.eta, comp.omega, om_ran, 1.0, 1.0)
  assert p["lam"] == pytest.approx(lam, rel=0.01)
  assert p["nu"] == 1.0  # ν* clipped to 1 in every setting
  assert p["r"] == pytest.approx(r, abs=1e-3)
  assert p["r_av"] == pytest.approx(r_av, abs=1.5e-3)
  assert p["s"] == pytest.approx(s, rel=0.02)
  # γ depends on L = L̃ (data), the EF-BV / EF21 ratio does not.
  ef = efbv.efbv_params(comp.eta, comp.omega, om_ran, 1.0, 1.0, nu=p["lam"], r_av_rule="ef21")
  assert p["gamma"] / ef["gamma"] == pytest.approx(g_efbv / g_ef21, rel=0.015)


def test_diana_rule_prop_246():
  """λ = 1/(1+ω), ν = 1, γ = 1/(L_max(1 + (1+√2)² ω_ran)); `tuned` uses it for unbiased C."""
  rk = fjs.compressors.rand_k(100, 5)  # ω = 19
  p = efbv.diana_params(rk.omega, rk.omega / 50, 2.0)
  assert p["lam"] == pytest.approx(1 / 20) and p["nu"] == 1.0
  assert p["gamma"] == pytest.approx(1 / (2.0 * (1 + (1 + np.sqrt(2)) ** 2 * 19 / 50)))
  _, q = efbv.tuned("diana", lambda *a: 0.0, rk, 50, 1.5, 1.5, L_max=2.0)
  assert q == p
  _, biased = efbv.tuned("diana", lambda *a: 0.0, fjs.compressors.comp_k(100, 1, 50), 50, 1.5, 1.5)
  assert "r" in biased  # a biased compressor falls back to the EF-BV rule with ν = 1


def test_constants_from_data_bound_the_true_curvature(problem):
  """L_max from the data is the exact λ_max of each ridge Hessian (autodiff check) and an
  upper bound for the logistic loss, L the λ_max of the average Hessian; μ is the λ_min of
  the average Hessian."""
  ds, model, loss = problem
  consts = fjs.convex.constants.linear_model_constants(ds.train, L2, "squared", "mean")
  x0 = model.init(jax.random.key(0))
  flat0, unravel = jax.flatten_util.ravel_pytree(x0)
  hessians = jax.jit(jax.vmap(jax.hessian(lambda v, x, y, m: loss(unravel(v), x, y, m)),
                              in_axes=(None, 0, 0, 0)))   # one per client
  mats = list(np.asarray(hessians(flat0, ds.train.x, ds.train.y, ds.train.mask)))
  assert len(mats) == ds.num_clients
  hess = [np.linalg.eigvalsh(h) for h in mats]
  assert consts.L_max == pytest.approx(max(h[-1] for h in hess), rel=1e-4)
  # L: the smoothness of the average objective, λ_max of the average Hessian (≤ L_avg)
  assert consts.L == pytest.approx(np.linalg.eigvalsh(np.mean(mats, 0))[-1], rel=1e-4)
  assert consts.L <= consts.L_avg * (1 + 1e-9)
  assert consts.L_tilde == pytest.approx(np.sqrt(np.mean([h[-1] ** 2 for h in hess])), rel=1e-4)
  logi = fjs.convex.constants.linear_model_constants(ds.train, L2, "logistic", "mean",
                                                     use_bias=False)
  lmodel = fjs.models.logistic_regression(DIM, l2=L2)
  lloss = fjs.models.make_loss(lmodel)
  logistic_hessians = jax.jit(jax.vmap(jax.hessian(lambda w, x, y, m: lloss(
      {"w": w}, x, (y > 0).astype(jnp.int32), m)), in_axes=(None, 0, 0, 0)))
  hs = np.asarray(logistic_hessians(np.full(DIM, 0.1, np.float32), ds.train.x, ds.train.y,
                                    ds.train.mask))
  assert len(hs) == ds.num_clients
  for h in hs:   # every client
    assert np.linalg.eigvalsh(h)[-1] <= logi.L_max * (1 + 1e-5)


def test_tuned_constructor_and_l1_prox_reach_the_lasso_solution(problem):
  """EF-BV with an l1 prox and the KL step rule converges to the federated lasso solution
  (computed by proximal GD), with no parameter given by hand."""
  ds, model, loss = problem
  consts = fjs.convex.constants.linear_model_constants(ds.train, L2, "squared", "mean")
  prox = fjs.proxes.l1(0.3)
  algo, p = efbv.tuned("ef-bv", loss, fjs.compressors.comp_k(D, 2, 4), ds.num_clients, consts.L_max,
                       consts.L_tilde, prox=prox)
  assert 0 < p["lam"] <= 1 and p["gamma"] < 1 / (2 * consts.L_max)
  ref_algo = fjs.prox_gd(loss, 1 / consts.L_max, D, prox=prox)
  x0 = model.init(jax.random.key(0))
  with jax.enable_x64(True):
    data = jax.tree.map(lambda a: jax.device_put(np.asarray(a, np.float64))
                        if np.asarray(a).dtype.kind == "f" else jnp.asarray(a), ds.train)
    x0 = jax.tree.map(lambda a: jax.device_put(np.zeros(a.shape, np.float64)), x0)
    ref = fjs.run(ref_algo, jax.random.key(0), x0, data, num_rounds=5000, chunk_size=1000,
                  progress=False).state.x
    got = fjs.run(algo, jax.random.key(0), x0, data, num_rounds=20000, chunk_size=5000,
                  progress=False).state.x
  assert int(np.sum(np.asarray(ref["w"]) == 0)) >= 1  # a sparse solution
  chex.assert_trees_all_close(got, ref, atol=1e-5)
  shrink = fjs.proxes.l2(2.0)({"a": jnp.array([3.0])}, 0.5)["a"]
  np.testing.assert_allclose(shrink, [1.5])
  with pytest.raises(ValueError, match="method"):
    efbv.tuned("sgd", loss, fjs.compressors.identity(D), 5, 1.0, 1.0)


@pytest.mark.parametrize("h_init, extra", [("grad", 5 * 32 * D), ("zero", 0)])
def test_initial_gradient_upload_is_charged(problem, h_init, extra):
  """h_i⁰ = ∇f_i(x⁰) costs each of the 5 clients one dense 32·d-bit upload, charged to the
  first step; later steps pay only the compressed messages."""
  ds, model, loss = problem
  comp = fjs.compressors.top_k(D, 2)
  algo = fjs.ef_bv(loss, comp, 0.05, 1.0, 1.0, h_init=h_init)
  res = fjs.run(algo, jax.random.key(0), model.init(jax.random.key(0)), ds.train, num_rounds=3,
                progress=False)
  assert res.history.rounds["bits_up"] == [5 * comp.bits(D) + extra, 5 * comp.bits(D),
                                           5 * comp.bits(D)]
