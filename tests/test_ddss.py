"""DDSS (fedjaxsparse.algorithms.ddss; seed 004 Task 1, spec §1.8 T5, T7-T12): the estimators'
unbiasedness by exact enumeration over the samples (also after eliminations, thanks to the
cached anchor), E D_i = I and E φ_i = Ω, the fixed point at x*, vanishing variance of the VR
estimators, Theorem 1's linear rate, finite identification of the equicorrelation set, safe
and monotone active sets along runs, and ProxASVRG = a plain numpy Prox-SVRG loop."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjaxsparse as fjs

from test_screening import _fista  # the certified float64 reference optimum

ddss = fjs.algorithms.ddss
screening = fjs.convex.screening
sparse_rows = fjs.data.sparse_rows


@pytest.fixture(autouse=True)
def x64():
  with jax.enable_x64(True):
    yield


def _sparse_instance(n=40, p=15, density=0.3, seed=0):
  rng = np.random.default_rng(seed)
  a = rng.standard_normal((n, p)) * (rng.uniform(size=(n, p)) < density)
  a[np.arange(n), rng.integers(0, p, n)] += 1.0  # every row touches something
  x_true = np.zeros(p)
  x_true[:3] = [1.5, -2.0, 1.0]
  return a, a @ x_true + 0.3 * rng.standard_normal(n)


def _snapshot(prob, data, x0, active):
  res = screening.screen(prob, data, x0, active)
  mask = np.asarray(screening.coordinate_mask(prob, active))
  return np.asarray(res.rho), np.asarray(res.grad) * mask, mask


@functools.partial(jax.jit, static_argnames=("loss", "estimator", "prox"))
def _all_sample_updates(prob, rows, x, mask, rho0, g0, d, eta, *, loss, estimator, prox):
  prob = prob._replace(loss=loss)
  return jax.vmap(lambda i: ddss.sample_update(prob, rows, x, i, mask, rho0, g0, d, eta,
                                               estimator, prox))(jnp.arange(rows.b.shape[0]))


def _sample_updates(prob, rows, x, mask, rho0, g0, d, eta, estimator, prox):
  """``ddss.sample_update`` of every sample i = 0..n-1 (stacked, as NumPy arrays), in one
  compiled program."""
  out = _all_sample_updates(prob._replace(loss=None), rows, x, mask, rho0, g0, d, eta,
                            loss=prob.loss, estimator=estimator, prox=prox)
  return jax.tree.map(np.asarray, out)


_singleton_rows = jax.jit(ddss.block_rows)  # block_rows(data) for singleton blocks (jittable)


def _gradient(data, x):
  """``∇F(x) = Aᵀρ(x)/n`` of the Lasso, by the padded-row products."""
  return np.asarray(sparse_rows.rmatvec(
      data, screening.deriv("squared", sparse_rows.matvec(data, x), data.b))) / data.n


@pytest.mark.parametrize("estimator", ["svrg", "sparse_svrg"])
def test_estimators_are_unbiased_by_enumeration_even_after_elimination(estimator):
  a, b = _sparse_instance()
  data = sparse_rows.from_dense(a, b)
  prob = screening.make_problem(data, 0.2 * screening.lambda_max(data))
  rng = np.random.default_rng(1)
  x0 = rng.standard_normal(15)                   # the snapshot, before elimination
  active = rng.uniform(size=15) > 0.3  # some coordinates eliminated
  rho0, g_full, _ = _snapshot(prob, data, x0, np.ones(15, bool))  # anchor at the full x⁰
  mask = np.asarray(screening.coordinate_mask(prob, active))
  g0 = g_full * mask
  x_hat = rng.standard_normal(15) * mask
  d = ddss.column_weights(data)
  rows = _singleton_rows(data)
  vs = _sample_updates(prob, rows, x_hat, mask, rho0, g0, d, 0.1, estimator, "dense")[1]
  want = _gradient(data, x_hat)
  np.testing.assert_allclose(np.mean(vs, 0), want * mask, atol=1e-12)


def test_column_weights_and_sparse_regulariser_are_unbiased():
  a, b = _sparse_instance(seed=2)
  data = sparse_rows.from_dense(a, b)
  d = ddss.column_weights(data)
  touch = a != 0
  np.testing.assert_allclose((touch * d).mean(0), (touch.sum(0) > 0).astype(float))  # E D_i = I
  x = np.random.default_rng(3).standard_normal(15)
  phi = [(touch[i] * d * np.abs(x)).sum() for i in range(40)]
  assert np.mean(phi) == pytest.approx(np.abs(x)[touch.any(0)].sum(), rel=1e-12)  # E φ_i = Ω
  rows = np.arange(10, 30)
  dk = ddss.column_weights(data, rows)
  np.testing.assert_allclose((touch[rows] * dk).mean(0), (touch[rows].sum(0) > 0) * 1.0)


def test_fixed_point_and_vanishing_variance_at_the_optimum():
  """T8: at x̂ = x⁰ = x* every sparse-prox message δ_i is 0. T9: at x̂ = x⁰ the SVRG directions
  all equal ∇F(x⁰) (variance 0) while SGD's do not."""
  a, b = _sparse_instance(seed=4)
  data = sparse_rows.from_dense(a, b)
  lam = 0.2 * screening.lambda_max(data)
  prob = screening.make_problem(data, lam)
  x_star, gap = _fista(a, b, lam, "squared")
  assert gap < 1e-10
  active = np.ones(15, bool)
  rho0, g0, mask = _snapshot(prob, data, x_star, active)
  d = ddss.column_weights(data)
  rows = _singleton_rows(data)
  deltas = _sample_updates(prob, rows, x_star, mask, rho0, g0, d, 0.05, "sparse_svrg",
                           "sparse")[1]
  for delta in deltas:   # every sample i
    assert np.abs(delta).max() < 1e-9
  svrg = _sample_updates(prob, rows, x_star, mask, rho0, g0, d, 0.05, "svrg", "dense")[1]
  sgd = _sample_updates(prob, rows, x_star, mask, rho0, g0, d, 0.05, "sgd", "dense")[1]
  assert len(svrg) == len(sgd) == data.n
  assert np.var(svrg, 0).sum() < 1e-20
  assert np.var(sgd, 0).sum() > 1e-2


def test_prox_asvrg_equals_a_numpy_prox_svrg_loop():
  """T12: no screening, dense prox, SVRG = Xiao & Zhang's Prox-SVRG, on the same sample
  draws (workers=1)."""
  a, b = _sparse_instance(seed=5)
  data = sparse_rows.from_dense(a, b)
  lam = 0.1 * screening.lambda_max(data)
  prob = screening.make_problem(data, lam)
  eta, k_in = 0.05, 30
  algo = fjs.prox_asvrg(prob, data, step_size=eta, inner_steps=k_in)
  st = algo.init(None, np.zeros(15), data)
  keys = [jax.random.key(7), jax.random.key(8)]
  for key in keys:
    st, _ = jax.jit(algo.step)(key, st, data)
  x = np.zeros(15)
  # the library's draw of step t: randint(split(fold_in(key, t), 1)[0], (), 0, n)
  draws = jax.jit(jax.vmap(lambda key, t: jax.random.randint(
      jax.random.split(jax.random.fold_in(key, t), 1)[0], (), 0, 40), in_axes=(None, 0)))
  for key in keys:
    x0 = x.copy()
    rho0 = a @ x0 - b
    g0 = a.T @ rho0 / 40
    samples = np.asarray(draws(key, np.arange(k_in)))
    for t in range(k_in):
      i = int(samples[t])
      v = a[i] * ((a[i] @ x - b[i]) - rho0[i]) + g0
      u = x - eta * v
      x = np.sign(u) * np.maximum(np.abs(u) - eta * lam, 0)
  np.testing.assert_allclose(np.asarray(st.x), x, rtol=1e-10, atol=1e-12)


def test_runs_screen_safely_monotonically_and_identify_the_support():
  """T4/T5/T11 along runs: active sets only shrink, never drop a feature of x*, and Sha-DDSS
  ends with exactly the equicorrelation set; the Naive and distributed variants run too."""
  a, b = _sparse_instance(n=200, p=40, density=0.2, seed=6)
  data = sparse_rows.from_dense(a, b)
  lam = 0.3 * screening.lambda_max(data)
  prob = screening.make_problem(data, lam)
  x_star, _ = _fista(a, b, lam, "squared")
  y_star = b - a @ x_star
  equi = np.abs(a.T @ y_star) >= 200 * lam * (1 - 1e-9)
  nonzero = np.abs(x_star) > 1e-9
  L = float(np.max((a ** 2).sum(1)))
  for name, make in (("sha", fjs.sha_ddss), ("naive", fjs.sha_ddss_naive), ("dis", fjs.dis_ddss)):
    kw = {"workers": 4} if name == "dis" else {}
    algo = make(prob, data, step_size=0.5 / L, inner_steps=400, **kw)
    st = algo.init(None, np.zeros(40), data)
    step = jax.jit(algo.step)
    prev = np.ones(40, bool)
    for s in range(40):
      st, info = step(jax.random.key(s), st, data)
      act = np.asarray(st.active)
      assert not np.any(act & ~prev)             # monotone
      assert not np.any(~act & nonzero)          # safe
      prev = act
    if name == "sha":
      np.testing.assert_array_equal(act, equi)   # finite identification
      assert float(info.gap) < 1e-9
  assert float(st.floats_up) > 0 and float(st.epochs) == pytest.approx(40 * (1 + 400 / 200))


def test_theorem_1_linear_rate_with_one_worker():
  """T10: one worker (τ = 0), η = min(1/(24κL), 1/(2μ)), K = ⌈4 log 3/(ημ)⌉: the mean over 20
  seeds of ‖x_S − x*‖²/‖x_0 − x*‖² is at most (2/3)^S (a strongly convex Lasso: n ≫ p, unit
  rows so Assumption 2's L = 1)."""
  rng = np.random.default_rng(9)
  a = rng.standard_normal((400, 5))
  a /= np.linalg.norm(a, axis=1, keepdims=True)
  b = a @ np.array([1.0, -1.0, 0.0, 0.5, 0.0]) + 0.05 * rng.standard_normal(400)
  data = sparse_rows.from_dense(a, b)
  lam = 0.1 * screening.lambda_max(data)
  prob = screening.make_problem(data, lam)
  mu = float(np.linalg.eigvalsh(a.T @ a / 400)[0])
  L, kappa = 1.0, 1.0 / mu
  eta = min(1 / (24 * kappa * L), 1 / (2 * mu))
  k_in = int(np.ceil(4 * np.log(3) / (eta * mu)))
  x_star, _ = _fista(a, b, lam, "squared")
  algo = fjs.sha_ddss(prob, data, step_size=eta, inner_steps=k_in)
  x_init = np.zeros(5)

  def run(key):
    st = algo.init(None, x_init, data)
    st, _ = jax.lax.scan(lambda c, k: algo.step(k, c, data), st, jax.random.split(key, 3))
    return st.x

  # the 20 seeds' keys split inside the one program
  xs = jax.jit(lambda key: jax.vmap(run)(jax.random.split(key, 20)))(jax.random.key(0))
  ratio = np.mean(np.sum((np.asarray(xs) - x_star) ** 2, 1)) / np.sum(x_star ** 2)
  assert ratio <= (2 / 3) ** 3


UNEVEN = np.array([0, 0, 1, 1, 1, 2, 3, 3, 3, 3, 4, 4, 5, 6, 6])  # block sizes 2,3,1,4,2,1,2


def test_group_blocks_layout_weights_unbiasedness_and_fixed_point():
  """Group Lasso (spec §1.3): Ψ_i's blocks laid out whole, E D_i = I and E φ_i = Ω per block,
  the sparse VR direction unbiased by enumeration with blocks eliminated, and the fixed point
  x* = prox_{ηλφ_i}(x* − ηD_i∇F(x*)) for every i at a certified group-Lasso optimum."""
  a, b = _sparse_instance(seed=7, density=0.15)
  data = sparse_rows.from_dense(a, b)
  rows = ddss.block_rows(data, UNEVEN)
  touch_blk = np.stack([np.isin(UNEVEN, UNEVEN[a[i] != 0]) for i in range(40)])  # [n, p]
  rows_idx, rows_val, rows_valid = (np.asarray(v) for v in (rows.idx, rows.val, rows.valid))
  for i in range(40):
    idx, ok = rows_idx[i][rows_valid[i]], np.flatnonzero(touch_blk[i])
    np.testing.assert_array_equal(np.sort(idx), ok)       # every coordinate of Ψ_i, once
    np.testing.assert_array_equal(rows_val[i][rows_valid[i]], a[i, idx])
  d = ddss.column_weights(data, block=UNEVEN)
  np.testing.assert_allclose((touch_blk * d).mean(0), touch_blk.any(0) * 1.0)   # E D_i = I
  rng = np.random.default_rng(8)
  w = rng.uniform(0.5, 2.0, 7)
  x = rng.standard_normal(15)
  gnorm = np.sqrt(np.bincount(UNEVEN, x * x, 7))
  phi = [sum(d[np.flatnonzero(UNEVEN == g)[0]] * w[g] * gnorm[g] for g in np.unique(
      UNEVEN[a[i] != 0])) for i in range(40)]
  assert np.mean(phi) == pytest.approx((w * gnorm)[np.unique(UNEVEN[(a != 0).any(0)])].sum(),
                                       rel=1e-12)                                # E φ_i = Ω
  prob = screening.make_problem(data, 0.3 * screening.lambda_max(data, block=UNEVEN, weights=w),
                                block=UNEVEN, weights=w)
  active = np.array([True, False, True, True, True, False, True])
  rho0, _, _ = _snapshot(prob, data, rng.standard_normal(15), np.ones(7, bool))
  g_full = _snapshot(prob, data, rng.standard_normal(15), np.ones(7, bool))[1]
  mask = np.asarray(screening.coordinate_mask(prob, active))
  x_hat = rng.standard_normal(15) * mask
  vs = _sample_updates(prob, rows, x_hat, mask, rho0, g_full * mask, d, 0.1, "sparse_svrg",
                       "dense")[1]
  assert len(vs) == 40
  grad = _gradient(data, x_hat)
  # E v = ∇F(x̂) − (1/n)Σ a_i ρ⁰_i + E[D_i] g⁰ on the active blocks; ρ⁰ and g⁰ come from two
  # different points here, so each of the three terms is checked separately
  anchor = np.asarray(sparse_rows.rmatvec(data, rho0)) / 40
  want = (grad - anchor + g_full) * mask
  want = want * touch_blk.any(0)
  np.testing.assert_allclose(np.mean(vs, 0), want, atol=1e-12)
  lam = 0.3 * screening.lambda_max(data, block=UNEVEN)
  prob = screening.make_problem(data, lam, block=UNEVEN)
  x_star, gap = _fista(a, b, lam, "squared", UNEVEN)
  assert gap < 1e-10 and 0 < np.sum(np.abs(x_star) > 1e-9) < 15
  rho0, g0, mask = _snapshot(prob, data, x_star, np.ones(7, bool))
  deltas = _sample_updates(prob, rows, x_star, mask, rho0, g0, d, 0.05, "sparse_svrg",
                           "sparse")[1]
  assert len(deltas) == 40
  for delta in deltas:   # every sample i
    assert np.abs(delta).max() < 1e-9


def test_group_lasso_runs_screen_safely_and_converge():
  """Sha-DDSS, Dis-DDSS and ProxASAGA (shared memory and over 4 sample shards) on a group Lasso
  with uneven blocks: the gap goes to ~0, the active blocks only shrink and keep every non-zero
  block of the certified x*."""
  a, b = _sparse_instance(n=200, p=15, density=0.2, seed=9)
  data = sparse_rows.from_dense(a, b)
  lam = 0.4 * screening.lambda_max(data, block=UNEVEN)
  prob = screening.make_problem(data, lam, block=UNEVEN)
  x_star, _ = _fista(a, b, lam, "squared", UNEVEN)
  nonzero = np.bincount(UNEVEN, x_star ** 2, 7) > 1e-18
  assert 0 < nonzero.sum() < 7
  L = float(np.max((a ** 2).sum(1)))
  for make in (fjs.sha_ddss, lambda *a_, **k: fjs.dis_ddss(*a_, workers=4, **k), fjs.prox_asaga,
               lambda *a_, **k: fjs.prox_asaga(*a_, workers=4, shards=4, **k)):
    algo = make(prob, data, step_size=0.5 / L, inner_steps=400)
    st = algo.init(None, np.zeros(15), data)
    step = jax.jit(algo.step)
    prev = np.ones(7, bool)
    for s in range(30):
      st, info = step(jax.random.key(s), st, data)
      act = np.asarray(getattr(st, "active", prev))
      assert not np.any(act & ~prev) and not np.any(~act & nonzero)
      prev = act
    assert float(info.gap) < 1e-9
  np.testing.assert_allclose(np.asarray(st.x), x_star, atol=1e-5)


def test_bad_configurations_are_named():
  a, b = _sparse_instance()
  data = sparse_rows.from_dense(a, b)
  prob = screening.make_problem(data, 0.1)
  with pytest.raises(ValueError, match="estimator"):
    ddss.ddss(prob, data=data, step_size=0.1, inner_steps=4, estimator="saga2")
  with pytest.raises(ValueError, match="multiple of workers"):
    ddss.ddss(prob, data=data, step_size=0.1, inner_steps=5, workers=2)
  with pytest.raises(ValueError, match="prox='sparse'"):
    ddss.ddss(prob, data=data, step_size=0.1, inner_steps=4, estimator="svrg", prox="sparse")


def test_ddss_lasso_experiment_tiny(tmp_path, quick):
  res = quick("ddss_lasso")  # n = 200, p = 600, 3 outer iterations
  from fedjaxsparse.experiments.ddss_lasso import METHODS
  assert [r["method"] for r in res["table"]] == list(METHODS)
  sweep = {f"Sha-DDSS, workers={w}": w for w in (1, 2)}   # Sha-DDSS at its chosen step
  assert list(res["methods"]) == list(METHODS) + list(sweep)
  for name, rec in res["methods"].items():
    (run,) = rec["seeds"]
    ev = run if name in sweep else run["history"]["evals"]
    assert np.all(np.diff(ev["p_active"]) <= 0) and np.all(np.isfinite(ev["gap"]))
    if name.startswith("Sha-"):
      assert ev["floats"][-1] == 0  # shared memory: nothing communicated
  assert res["methods"]["Dis-DDSS"]["seeds"][0]["history"]["evals"]["floats"][-1] > 0
  assert [r["workers"] for r in res["worker_sweep"]] == [1, 2]
  assert [r["final gap"] for r in res["worker_sweep"]] == [
      res["methods"][name]["seeds"][0]["gap"][-1] for name in sweep]
  for png in ("gap_vs_epochs", "gap_vs_touched", "gap_vs_floats", "active"):
    assert (tmp_path / "ddss_lasso" / f"ddss_lasso_{png}.png").read_bytes()[:4] == b"\x89PNG"


def test_bounded_staleness_reads_old_iterates_and_still_converges():
  """staleness=τ: workers read iterates up to τ ticks old; the run differs from the
  same-read one, stays safe, and still closes the gap on a small Lasso."""
  a, b = _sparse_instance(n=200, p=40, density=0.2, seed=6)
  data = sparse_rows.from_dense(a, b)
  lam = 0.3 * screening.lambda_max(data)
  prob = screening.make_problem(data, lam)
  x_star, _ = _fista(a, b, lam, "squared")
  L = float(np.max((a ** 2).sum(1)))
  out = {}
  for tau in (0, 3):
    algo = fjs.sha_ddss(prob, data, step_size=0.3 / L, inner_steps=400, workers=4, staleness=tau)
    st = algo.init(None, np.zeros(40), data)
    step = jax.jit(algo.step)
    first = None
    for s in range(40):
      st, info = step(jax.random.key(s), st, data)
      first = np.asarray(st.x) if first is None else first
      assert not np.any(~np.asarray(st.active) & (np.abs(x_star) > 1e-9))
    out[tau] = (first, float(info.gap))
  assert not np.allclose(out[0][0], out[3][0], atol=1e-9)  # the same draws, older reads
  assert out[3][1] < 1e-6
  with pytest.raises(ValueError, match="staleness"):
    fjs.sha_ddss(prob, data, step_size=0.1, inner_steps=4, staleness=-1)


def test_distributed_prox_asaga_charges_its_messages():
  """ProxASAGA over 4 shards (like Dis-DDSS): per update the worker sends δ's support as values
  and indices plus α_i and i, and reads x and ᾱ on its sample's support; shared memory sends
  nothing."""
  a, b = _sparse_instance()
  data = sparse_rows.from_dense(a, b)
  prob = screening.make_problem(data, 0.1)
  L = float(np.max((a ** 2).sum(1)))
  for shards in (None, 4):
    algo = fjs.prox_asaga(prob, data, step_size=0.5 / L, inner_steps=40, workers=4,
                          shards=shards)
    st = algo.init(None, np.zeros(data.p), data)
    new, info = jax.jit(algo.step)(jax.random.key(0), st, data)
    touched = float(np.asarray(new.touched) - np.asarray(st.touched))  # host: no program
    if shards is None:
      assert float(info.bits_up) == float(info.bits_down) == 0.0
    else:
      assert float(info.bits_up) == 32.0 * (2 * touched + 2 * 40)
      rows = np.asarray(data.nnz_rows)
      assert 32.0 * 2 * 40 * rows.min() <= float(info.bits_down) <= 32.0 * 2 * 40 * rows.max()
  with pytest.raises(ValueError, match="shards must equal workers"):
    fjs.prox_asaga(prob, data, step_size=0.1, inner_steps=8, workers=4, shards=2)
