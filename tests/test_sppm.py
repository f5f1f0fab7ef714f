"""SPPM-AS and its relatives (seed 001 ch. 5) on strongly convex quadratics with closed forms:
the exact cohort prox, PPM, MB-GD, proximal averaging, Theorem 5.3.2's bound by Monte Carlo,
solvers converging to the exact prox, and the hierarchical cost arithmetic."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fedjaxsparse as fjs

solvers = fjs.convex.prox_solvers

L2 = 0.05
N, M, D = 8, 10, 3


def loss(params, x, y, mask):
  r = x @ params["w"] - y
  return 0.5 * jnp.sum(mask * r ** 2) / jnp.sum(mask) + 0.5 * L2 * jnp.sum(params["w"] ** 2)


@pytest.fixture(scope="module")
def quad():
  """f_i(x) = ½ xᵀH_i x − c_iᵀx + const, heterogeneous (each client its own optimum)."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=(N * M, D)) * np.repeat(rng.uniform(0.5, 2.0, N), M)[:, None]
  y = x @ rng.normal(size=D) + np.repeat(rng.normal(size=N) * 3, M) + rng.normal(size=N * M)
  data = fjs.data.pack_clients(x.astype(np.float32), y.astype(np.float32),
                               np.split(np.arange(N * M), N))
  xs, ys = np.asarray(data.x, np.float64), np.asarray(data.y, np.float64)
  H = np.einsum("nmi,nmj->nij", xs, xs) / M + L2 * np.eye(D)
  c = np.einsum("nmi,nm->ni", xs, ys) / M
  x_opt = np.linalg.solve(H.mean(0), c.mean(0))
  a = np.einsum("nij,j->ni", H, x_opt) - c  # ∇f_i(x⋆), summing to 0
  mu = np.linalg.eigvalsh(H)[:, 0]
  return dict(data=data, H=H, c=c, x_opt=x_opt, a=a, mu=mu,
              w0={"w": jax.device_put(np.array([3.0, -2.0, 1.0], np.float32))})


def _prox(q, ids, weights, x, gamma):
  hs = np.einsum("i,ijk->jk", weights, q["H"][ids])
  cs = weights @ q["c"][ids]
  return np.linalg.solve(hs + np.eye(D) / gamma, cs + x / gamma)


def test_one_newton_step_is_the_exact_cohort_prox(quad):
  s = fjs.sampling.nice(N, 3)
  algo = fjs.sppm_as(loss, s, 2.0, solvers.newton())
  state = algo.init(None, quad["w0"], quad["data"])
  key = jax.random.key(3)
  new, info = jax.jit(algo.step)(key, state, quad["data"])
  cohort = jax.jit(lambda k: s.sample(jax.random.split(k)[0]))(key)
  ids = np.asarray(cohort.ids)
  want = _prox(quad, ids, np.asarray(cohort.weights, np.float64), np.asarray(quad["w0"]["w"]), 2.0)
  np.testing.assert_allclose(new.params["w"], want, rtol=2e-4, atol=2e-5)
  assert int(info.local_rounds) == 1 and float(info.cohort) == 3
  assert float(info.floats_up) == 3 * D and float(info.bits_up) == 3 * D * 32


def test_full_sampling_is_ppm(quad):
  algo = fjs.sppm_as(loss, fjs.sampling.full(N), 0.5, solvers.newton())
  state, step = algo.init(None, quad["w0"], quad["data"]), jax.jit(algo.step)
  x = np.asarray(quad["w0"]["w"], np.float64)
  for t in range(5):
    state, _ = step(jax.random.key(t), state, quad["data"])
    x = _prox(quad, np.arange(N), np.full(N, 1 / N), x, 0.5)
    np.testing.assert_allclose(state.params["w"], x, rtol=1e-4, atol=1e-5)
  # x⋆ is a fixed point of PPM
  state = state._replace(params={"w": jax.device_put(quad["x_opt"].astype(np.float32))})
  np.testing.assert_allclose(step(jax.random.key(9), state, quad["data"])[0].params["w"],
                             quad["x_opt"], atol=1e-4)


def test_one_gd_step_is_minibatch_gd(quad):
  s = fjs.sampling.stratified(fjs.sampling.contiguous_blocks(N, 4))
  eta = 0.05
  new, _ = jax.jit(fjs.sppm_as(loss, s, 10.0, solvers.gd(eta, 1)).step)(
      jax.random.key(1), fjs.algorithms.sppm.SPPMState(quad["w0"], np.int32(0)), quad["data"])
  cohort = jax.jit(lambda k: s.sample(jax.random.split(k)[0]))(jax.random.key(1))
  ids, w = np.asarray(cohort.ids), np.asarray(cohort.weights, np.float64)
  x = np.asarray(quad["w0"]["w"], np.float64)
  grad = w @ (np.einsum("nij,j->ni", quad["H"][ids], x) - quad["c"][ids])
  np.testing.assert_allclose(new.params["w"], x - eta * grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["cg", "bfgs", "lbfgs", "gd"])
def test_solvers_approach_the_exact_prox_as_k_grows(quad, name):
  """‖z_K − prox‖ shrinks with K for every solver (GD with step 1/(L + 1/γ) needs more
  iterations); CG is exact after dim = 3 iterations."""
  gamma, x = 5.0, np.asarray(quad["w0"]["w"], np.float64)
  want = _prox(quad, np.arange(N), np.full(N, 1 / N), x, gamma)
  lr = 1 / (np.linalg.eigvalsh(quad["H"].mean(0))[-1] + 1 / gamma)
  make = {"cg": solvers.cg, "bfgs": solvers.bfgs, "lbfgs": solvers.lbfgs,
          "gd": lambda k: solvers.gd(lr, 10 * k)}[name]
  errs = {}
  # K = 3 is asserted for CG only (exact after dim = 3 iterations): the other solvers skip it
  for k in ((1, 3, 30) if name == "cg" else (1, 30)):
    new, _ = jax.jit(fjs.sppm_as(loss, fjs.sampling.full(N), gamma, make(k)).step)(
        jax.random.key(0), fjs.algorithms.sppm.SPPMState(quad["w0"], np.int32(0)), quad["data"])
    errs[k] = np.linalg.norm(np.asarray(new.params["w"]) - want)
  assert errs[30] < 1e-3 * np.linalg.norm(want - x) and errs[30] <= errs[1], errs
  if name == "cg":
    assert errs[3] < 1e-4 * np.linalg.norm(want - x), errs


def test_theorem_532_bound_holds_by_monte_carlo(quad):
  """E‖x_t − x⋆‖² ≤ (1 + γμ_AS)^{-2t}‖x_0 − x⋆‖² + γσ²/(γμ_AS² + 2μ_AS) (exact prox, NICE τ = 3,
  γ = 2) for the Monte Carlo mean over 1,000 runs, with a 4-s.e. allowance."""
  s, gamma, runs, rounds = fjs.sampling.nice(N, 3), 2.0, 1000, 25
  algo = fjs.sppm_as(loss, s, gamma, solvers.newton())
  step = jax.vmap(algo.step, in_axes=(0, 0, None))
  state = jax.vmap(lambda _: algo.init(None, quad["w0"], quad["data"]))(np.arange(runs))
  errs = []

  @jax.jit
  def run_step(t, state):   # the runs' keys fold_in(key(t), r), drawn inside the program
    keys = jax.vmap(lambda r: jax.random.fold_in(jax.random.key(t), r))(jnp.arange(runs))
    return step(keys, state, quad["data"])

  for t in range(rounds):
    state, _ = run_step(t, state)
    errs.append(np.sum((np.asarray(state.params["w"], np.float64) - quad["x_opt"]) ** 2, 1))
  errs = np.array(errs)  # [rounds, runs]
  d0 = float(np.sum((np.asarray(quad["w0"]["w"], np.float64) - quad["x_opt"]) ** 2))
  bound = fjs.sampling.theorem_bound(s, quad["mu"], quad["a"], gamma, d0, np.arange(1, rounds + 1))
  se = errs.std(1) / np.sqrt(runs)
  assert np.all(errs.mean(1) <= bound + 4 * se + 1e-6), (errs.mean(1), bound)
  # the iterates settle (a stationary neighbourhood, not convergence: σ²_⋆ > 0) inside it
  nb = fjs.sampling.neighbourhood(s, quad["mu"], quad["a"], gamma)
  tail = errs.mean(1)[-5:]
  assert np.ptp(tail) < 0.1 * tail.mean() and 0 < tail.mean() < nb < d0, (tail, nb)


def test_proximal_averaging_and_local_gd(quad):
  """FedProx-SPPM-AS (K = 1, full cohort, exact client proxes) = mean of the clients' proxes;
  FedAvg-SPPM-AS with α = γ equals it when the round starts there (K = 1); LocalGD = mean of
  E local GD steps."""
  gamma, x = 0.7, np.asarray(quad["w0"]["w"], np.float64)
  st = fjs.algorithms.sppm.SPPMState(quad["w0"], np.int32(0))
  new, info = jax.jit(fjs.fedprox_sppm_as(loss, fjs.sampling.full(N), gamma,
                                          solvers.newton()).step)(
      jax.random.key(0), st, quad["data"])
  want = np.mean([_prox(quad, np.array([i]), np.ones(1), x, gamma) for i in range(N)], 0)
  np.testing.assert_allclose(new.params["w"], want, rtol=1e-4, atol=1e-5)
  # FedAvg-SPPM-AS, K = 1: both prox terms centred at x; 1/(2α) + 1/(2γ) = 1/(2·γα/(γ+α))
  both, _ = jax.jit(fjs.fedavg_sppm_as(loss, fjs.sampling.full(N), gamma, gamma,
                                       solvers.newton()).step)(
      jax.random.key(0), st, quad["data"])
  want2 = np.mean([_prox(quad, np.array([i]), np.ones(1), x, gamma / 2) for i in range(N)], 0)
  np.testing.assert_allclose(both.params["w"], want2, rtol=1e-4, atol=1e-5)
  lr, e = 0.05, 4
  new, info = jax.jit(fjs.local_gd(loss, fjs.sampling.full(N), lr, e).step)(
      jax.random.key(0), st, quad["data"])
  zs = []
  for i in range(N):
    z = x.copy()
    for _ in range(e):
      z = z - lr * (quad["H"][i] @ z - quad["c"][i])
    zs.append(z)
  np.testing.assert_allclose(new.params["w"], np.mean(zs, 0), rtol=1e-4, atol=1e-5)
  assert int(info.local_rounds) == 1


def test_fedavg_style_adam_solver_runs_and_descends(quad):
  """The NN experiments' solver: E Adam steps per member per local round on
  f_i + ‖· − x_t‖²/(2γ), K rounds: the cohort objective decreases."""
  algo = fjs.fedavg_sppm_as(loss, fjs.sampling.nice(N, 4), 1.0, None,
                            solvers.optax_steps(optax.adam(0.05), 3, "adam"), local_rounds=3)
  state, step = algo.init(None, quad["w0"], quad["data"]), jax.jit(algo.step)
  losses = []
  for t in range(30):
    state, info = step(jax.random.key(t), state, quad["data"])
    losses.append(float(info.loss))
  assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5])
  assert int(info.local_rounds) == 3


def test_hierarchical_cost_reproduces_the_papers_arithmetic():
  """§5.4.5 (spec C5-7): SPPM-SS with K = 10 for one round at c₁ = 1, c₂ = 0 costs 10 against
  LocalGD's 39: 74.36 % saved; with hubs (c₁ = 0.1, c₂ = 1) it costs 2: 94.87 % saved (charging
  LocalGD (c₁ + c₂)·39 instead gives 95.34 %)."""
  local_gd_cost = fjs.accounting.round_cost(np.ones(39))
  assert local_gd_cost == 39
  assert round(100 * (1 - fjs.accounting.round_cost(10) / local_gd_cost), 2) == 74.36
  assert fjs.accounting.round_cost(10, c1=0.1, c2=1.0) == pytest.approx(2.0)
  assert round(100 * (1 - fjs.accounting.round_cost(10, 0.1, 1.0) / local_gd_cost), 2) == 94.87
  assert round(100 * (1 - 2.0 / fjs.accounting.round_cost(np.ones(39), 0.1, 1.0)), 2) == 95.34
  errs = [1.0, 0.5, 0.1, 0.01, 0.001]
  assert fjs.accounting.cost_to_target(errs, 4, 0.05) == 12  # 3 rounds of K = 4
  assert fjs.accounting.cost_to_target(errs, 4, 0.05, c1=0.5, c2=2) == 12
  assert fjs.accounting.cost_to_target(errs, 4, 1e-9) is None
  assert fjs.accounting.cost_to_target(errs, 4, 2.0) == 0.0


def test_bad_arguments(quad):
  with pytest.raises(ValueError, match="gamma"):
    fjs.sppm_as(loss, fjs.sampling.full(N), 0.0, solvers.newton())
  with pytest.raises(ValueError, match="iterations"):
    solvers.cg(0)
  with pytest.raises(ValueError, match="weighting"):
    fjs.algorithms.sppm.cohort_average(loss, fjs.sampling.full(N), solvers.newton(),
                                       weighting="size")
  with pytest.raises(ValueError, match="sampler"):
    fjs.sppm_as(loss, fjs.sampling.full(N + 1), 1.0, solvers.newton()).step(
        jax.random.key(0), fjs.algorithms.sppm.SPPMState(quad["w0"], jnp.int32(0)), quad["data"])


def test_fedavg_takes_any_sampler(quad):
  """FedAvg with a padded block cohort: padding gets weight 0 and is not charged; with
  ``weighting="sampling"`` the update is Σ_{i∈S} Δ_i/(n p_i), whose mean over the exact cohort
  distribution is the full-participation mean update (one local GD step)."""
  blocks = [[0], [1, 4], [2, 3, 5, 6, 7]]
  s = fjs.sampling.block(blocks, q=[0.2, 0.3, 0.5])
  lr = 0.1
  x = np.asarray(quad["w0"]["w"], np.float64)
  deltas = -lr * (np.einsum("nij,j->ni", quad["H"], x) - quad["c"])  # one GD step each
  sample = jax.jit(lambda k: s.sample(jax.random.split(k, 3)[0]))
  for weighting in ("uniform", "sampling"):
    algo = fjs.fedavg(loss, optax.sgd(lr), sampler=s, weighting=weighting)
    state = algo.init(None, quad["w0"], quad["data"])
    key = jax.random.key(4)
    new, info = jax.jit(algo.step)(key, state, quad["data"])
    co = sample(key)
    ids, m = np.asarray(co.ids), np.asarray(co.mask, bool)
    if weighting == "uniform":
      want = x + deltas[ids[m]].mean(0)
    else:
      want = x + np.asarray(co.weights, np.float64)[m] @ deltas[ids[m]]
    np.testing.assert_allclose(new.params["w"], want, rtol=1e-4, atol=1e-5)
    assert float(info.bits_up) == m.sum() * D * 32 and int(info.num_clients) == m.sum()
  # unbiasedness of the sampling weights over the exact distribution
  mean_update = sum(pc * (s.weights[list(c)] @ deltas[list(c)]) for c, pc in s.support())
  np.testing.assert_allclose(mean_update, deltas.mean(0), rtol=1e-12)
  with pytest.raises(ValueError, match="sampler"):
    fjs.fedavg(loss, optax.sgd(lr), weighting="sampling")


def _adam(state, g, lr, b1=0.9, b2=0.999, eps=1e-8):
  """optax.adam's step in float64: ``(update, new state)``, state ``(count, mu, nu)``."""
  count, mu, nu = state
  mu, nu, count = b1 * mu + (1 - b1) * g, b2 * nu + (1 - b2) * g * g, count + 1
  mh, nh = mu / (1 - b1 ** count), nu / (1 - b2 ** count)
  return -lr * mh / (np.sqrt(nh) + eps), (count, mu, nu)


def test_fig_d10_solvers_against_independent_float64_oracles(quad):
  """Fig. D.10's solvers on quadratics with exact gradients, K = 2 local rounds, E = 2 worker
  steps, full participation, ψ_i = f_i + ‖· − x_0‖²/(2γ): FedAdam-Adam (Adam worker from a
  fresh state, Adam server on x_k − mean z_i over the K rounds) and MimeLite-Adam (Adam
  updates with the server state frozen during the worker steps, the state advanced by the mean
  of ∇ψ_i(x_k)) equal NumPy float64 re-implementations; an SGD server at step 1 is the plain
  average and MimeLite with SGD is the SGD worker (bit for bit), uploading twice the floats."""
  gamma, lr, slr, K, E = 1.0, 0.05, 0.3, 2, 2
  x0 = np.asarray(quad["w0"]["w"], np.float64)
  H, c = quad["H"], quad["c"]
  grad = lambda i, v: H[i] @ v - c[i] + (v - x0) / gamma
  zero = (0, np.zeros(D), np.zeros(D))
  # FedAdam-Adam
  x, s_srv = x0.copy(), zero
  for _ in range(K):
    zs = []
    for i in range(N):
      z, st = x.copy(), zero
      for _ in range(E):
        u, st = _adam(st, grad(i, z), lr)
        z = z + u
      zs.append(z)
    u, s_srv = _adam(s_srv, x - np.mean(zs, 0), slr)
    x = x + u
  fedadam_adam = x
  # MimeLite-Adam
  x, s = x0.copy(), zero
  for _ in range(K):
    zs = []
    for i in range(N):
      z = x.copy()
      for _ in range(E):
        z = z + _adam(s, grad(i, z), lr)[0]   # the server state, frozen
      zs.append(z)
    s = _adam(s, np.mean([grad(i, x) for i in range(N)], 0), lr)[1]
    x = np.mean(zs, 0)
  mime = x
  full = fjs.sampling.full(N)
  cohort_average = fjs.algorithms.sppm.cohort_average
  run = lambda algo: jax.jit(algo.step)(jax.random.key(0),
                                        algo.init(None, quad["w0"], quad["data"]), quad["data"])
  adam_worker = solvers.optax_steps(optax.adam(lr), E, "adam")
  got, _ = run(cohort_average(loss, full, adam_worker, local_rounds=K, gamma=gamma,
                              server_optimizer=optax.adam(slr)))
  np.testing.assert_allclose(got.params["w"], fedadam_adam, rtol=2e-4, atol=2e-5)
  got, info = run(cohort_average(loss, full, fjs.algorithms.sppm.mime_lite(optax.adam(lr), E),
                                 local_rounds=K, gamma=gamma))
  np.testing.assert_allclose(got.params["w"], mime, rtol=2e-4, atol=2e-5)
  assert float(info.floats_up) == 2 * float(info.floats_down) == 2 * K * N * D
  assert np.abs(mime - fedadam_adam).max() > 1e-3   # the two solvers differ
  sgd = solvers.optax_steps(optax.sgd(lr), E, "sgd")
  plain, _ = run(cohort_average(loss, full, sgd, local_rounds=K, gamma=gamma))
  served, _ = run(cohort_average(loss, full, sgd, local_rounds=K, gamma=gamma,
                                 server_optimizer=optax.sgd(1.0)))
  mime_sgd, _ = run(cohort_average(loss, full, fjs.algorithms.sppm.mime_lite(optax.sgd(lr), E),
                                   local_rounds=K, gamma=gamma))
  np.testing.assert_allclose(served.params["w"], plain.params["w"], rtol=1e-6, atol=1e-7)
  np.testing.assert_array_equal(mime_sgd.params["w"], plain.params["w"])
