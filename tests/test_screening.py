"""Gap-safe screening for the Lasso, ℓ1-logistic regression and the group Lasso
(fedjaxsparse.convex.screening; seed 004 Task 1, spec §1.2 and §1.8 T1-T4, T6): weak duality, dual
feasibility, the closed forms, λ_max, the gap closing at the optimum, and **safety** — every
eliminated block is zero at a float64 reference optimum, while the paper's literal radius is
shown to eliminate an active feature."""
import jax
import numpy as np
import pytest

import fedjaxsparse as fjs

screening = fjs.convex.screening
sparse_rows = fjs.data.sparse_rows


@pytest.fixture(autouse=True)
def x64():
  with jax.enable_x64(True):
    yield


def _lasso_instance(n, p, seed, density=1.0):
  rng = np.random.default_rng(seed)
  a = rng.standard_normal((n, p)) * (rng.uniform(size=(n, p)) < density)
  x_true = np.zeros(p)
  x_true[rng.choice(p, max(1, p // 10), replace=False)] = rng.standard_normal(max(1, p // 10))
  b = a @ x_true + 0.5 * rng.standard_normal(n)
  return a, b


def _fista(a, b, lam, loss, block=None, iters=20000, tol=1e-13):
  """A float64 numpy reference (accelerated proximal gradient), stopped by its own gap."""
  n, p = a.shape
  block = np.arange(p) if block is None else block
  q = block.max() + 1
  lf = 1.0 if loss == "squared" else 0.25
  step = 1.0 / (lf * np.linalg.norm(a, 2) ** 2 / n)

  def grad_rho(x):
    z = a @ x
    rho = z - b if loss == "squared" else -b / (1 + np.exp(b * z))
    return a.T @ rho / n, rho, z

  def prox(u, t):
    nrm = np.sqrt(np.bincount(block, u * u, q))
    return u * np.maximum(0, 1 - t * lam / np.where(nrm > 0, nrm, 1))[block]

  def gap(x):
    g, rho, z = grad_rho(x)
    dn = np.sqrt(np.bincount(block, g * g, q))
    y = -rho / max(1.0, dn.max() / lam)
    reg = lam * np.sqrt(np.bincount(block, x * x, q)).sum()
    if loss == "squared":
      pv, dv = np.mean(0.5 * (b - z) ** 2) + reg, np.mean(b * y - 0.5 * y * y)
    else:
      s = np.clip(b * y, 1e-300, 1 - 1e-16)
      pv = np.mean(np.logaddexp(0, -b * z)) + reg
      dv = -np.mean(s * np.log(s) + (1 - s) * np.log1p(-s))
    return pv - dv, pv

  x = w = np.zeros(p)
  t = 1.0
  for it in range(iters):
    x_new = prox(w - step * grad_rho(w)[0], step * 1.0)
    t_new = (1 + np.sqrt(1 + 4 * t * t)) / 2
    w = x_new + (t - 1) / t_new * (x_new - x)
    x, t = x_new, t_new
    if it % 50 == 0:
      g_, pv = gap(x)
      if g_ <= tol * max(pv, 1e-300):
        break
  return x, gap(x)[0]


def _check_safe(a, b, lam, loss, path_points, block=None, radius="safe"):
  """Screens at each point; returns (eliminated-but-active blocks, eliminated count)."""
  data = sparse_rows.from_dense(a, b)
  prob = screening.make_problem(data, lam, loss, block)
  x_star, g = _fista(a, b, lam, loss, block)
  assert g < 1e-9  # the reference optimum is certified by its duality gap
  bl = np.arange(a.shape[1]) if block is None else block
  nonzero = np.bincount(bl, np.abs(x_star), bl.max() + 1) > 1e-9
  active = np.ones(prob.num_blocks, bool)
  bad, eliminated = 0, 0
  for x in path_points(x_star):
    xm = x * np.asarray(screening.coordinate_mask(prob, active))
    res = screening.screen(prob, data, xm, active, radius)
    new_out = active & ~np.asarray(res.active)
    bad += int(np.sum(new_out & nonzero))
    eliminated += int(new_out.sum())
    active = np.asarray(res.active)
  return bad, eliminated, x_star


def _path(rng_seed):
  def points(x_star):
    rng = np.random.default_rng(rng_seed)
    p = x_star.size
    for eps in (1.0, 0.3, 0.1, 0.03, 1e-2, 1e-3, 1e-5, 0.0):
      yield x_star + eps * rng.standard_normal(p) * (np.abs(x_star).max() + 0.1)
  return points


def test_weak_duality_and_feasibility_of_the_dual_point():
  rng = np.random.default_rng(0)
  for loss in ("squared", "logistic"):
    a, b = _lasso_instance(60, 25, 1)
    if loss == "logistic":
      b = np.where(b >= 0, 1.0, -1.0)
    data = sparse_rows.from_dense(a, b)
    lam = 0.3 * screening.lambda_max(data, loss)
    prob = screening.make_problem(data, lam, loss)
    active = np.ones(25, bool)
    for _ in range(20):
      x = jax.device_put(rng.standard_normal(25) * rng.uniform(0, 2))
      res = screening.screen(prob, data, x, active)
      assert float(res.primal) >= float(res.dual) - 1e-12          # T1
      aty = np.abs(np.asarray(sparse_rows.rmatvec(data, res.y)))
      assert aty.max() <= 60 * lam * (1 + 1e-12)                   # T2: feasible
      if float(res.scale) > 1:
        assert aty.max() == pytest.approx(60 * lam, rel=1e-12)    # tight after scaling
      # any other feasible point is below P too (weak duality, not just at our y)
      u = rng.uniform(0, 1, 60) * (b if loss == "logistic" else rng.standard_normal(60))
      u = u / max(1.0, np.abs(a.T @ u).max() / (60 * lam))
      assert float(res.primal) >= float(screening.dual(prob, data, jax.device_put(u))) - 1e-12


def test_lasso_closed_forms():
  a, b = _lasso_instance(40, 10, 2)
  data = sparse_rows.from_dense(a, b)
  lam = 0.2 * screening.lambda_max(data)
  prob = screening.make_problem(data, lam)
  x = np.random.default_rng(3).standard_normal(10)
  res = screening.screen(prob, data, jax.device_put(x), np.ones(10, bool))
  r = b - a @ x
  y = r / max(1.0, np.abs(a.T @ r).max() / (40 * lam))
  np.testing.assert_allclose(res.y, y, rtol=1e-12)
  assert float(res.primal) == pytest.approx(r @ r / 80 + lam * np.abs(x).sum(), rel=1e-12)
  assert float(res.dual) == pytest.approx((b @ b - (b - y) @ (b - y)) / 80, rel=1e-12)
  assert float(res.radius) == pytest.approx(np.sqrt(2 * 40 * float(res.gap)), rel=1e-12)
  assert screening.lambda_max(data) == pytest.approx(np.abs(a.T @ b).max() / 40, rel=1e-12)


def test_above_lambda_max_everything_is_eliminated_at_zero():
  a, b = _lasso_instance(50, 20, 4)
  data = sparse_rows.from_dense(a, b)
  lmax = screening.lambda_max(data)
  zero, active = np.zeros(20), np.ones(20, bool)
  res = screening.screen(screening.make_problem(data, 1.0001 * lmax), data, zero, active)
  assert float(res.gap) < 1e-12 and not np.any(res.active)            # T6
  res = screening.screen(screening.make_problem(data, lmax), data, zero, active)
  assert np.asarray(res.active)[np.argmax(np.abs(a.T @ b))]          # the argmax survives
  x_star, _ = _fista(a, b, 1.0001 * lmax, "squared")
  assert np.abs(x_star).max() < 1e-12


@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_screening_is_safe_on_many_instances(loss):
  """T4: over random instances — n up to 2000 (the regime where the paper's radius fails),
  λ/λ_max from 0.5 down to 0.01, sparse and dense designs — no block that is non-zero at the
  float64 reference optimum is ever eliminated, and many blocks are."""
  total = 0
  for seed, (n, p, frac, density) in enumerate([(40, 30, 0.5, 1.0), (200, 50, 0.1, 1.0),
                                                (2000, 40, 0.05, 0.2), (300, 60, 0.01, 0.5)]):
    a, b = _lasso_instance(n, p, 10 + seed, density)
    if loss == "logistic":
      b = np.where(b >= 0, 1.0, -1.0)
    lam = frac * screening.lambda_max(sparse_rows.from_dense(a, b), loss)
    bad, elim, _ = _check_safe(a, b, lam, loss, _path(seed))
    assert bad == 0
    total += elim
  assert total > 40


def test_group_lasso_screening_is_safe():
  a, b = _lasso_instance(120, 48, 7)
  block = np.arange(48) // 4
  for frac in (0.5, 0.1):
    lam = frac * screening.lambda_max(sparse_rows.from_dense(a, b), block=block)
    bad, elim, x_star = _check_safe(a, b, lam, "squared", _path(1), block=block)
    assert bad == 0 and elim > 0


def test_gap_closes_and_dual_point_converges_at_the_optimum():
  """T3: at x*, G → 0 and y → −ρ(x*); the radius then screens every block outside the
  equicorrelation set."""
  a, b = _lasso_instance(100, 40, 5)
  data = sparse_rows.from_dense(a, b)
  lam = 0.1 * screening.lambda_max(data)
  x_star, _ = _fista(a, b, lam, "squared")
  res = screening.screen(screening.make_problem(data, lam), data, jax.device_put(x_star),
                         np.ones(40, bool))
  assert float(res.gap) < 1e-10
  np.testing.assert_allclose(res.y, b - a @ x_star, atol=1e-6)
  equi = np.abs(a.T @ (b - a @ x_star)) >= 100 * lam * (1 - 1e-6)
  np.testing.assert_array_equal(np.asarray(res.active), equi)


def test_the_papers_literal_radius_is_unsafe():
  """The printed radius √(2L·G) misses the factor n: on a large-n instance started away from
  the optimum it eliminates a feature that is non-zero at x* (the safe radius does not)."""
  found = False
  for seed in range(6):
    a, b = _lasso_instance(3000, 30, 100 + seed)
    a /= np.sqrt((a ** 2).sum(1, keepdims=True))  # unit rows: Assumption 2's L = 1
    lam = 0.05 * screening.lambda_max(sparse_rows.from_dense(a, b))
    bad, _, _ = _check_safe(a, b, lam, "squared", _path(seed), radius="paper_literal")
    safe_bad, _, _ = _check_safe(a, b, lam, "squared", _path(seed))
    assert safe_bad == 0
    if bad:
      found = True
      break
  assert found


def test_bad_inputs_are_named():
  a, b = _lasso_instance(20, 5, 0)
  data = sparse_rows.from_dense(a, b)
  with pytest.raises(ValueError, match="loss"):
    screening.make_problem(data, 0.1, "hinge")
  with pytest.raises(ValueError, match="lam"):
    screening.make_problem(data, 0.0)
  with pytest.raises(ValueError, match="labels"):
    screening.make_problem(data, 0.1, "logistic")
  with pytest.raises(ValueError, match="radius"):
    screening.screen(screening.make_problem(data, 0.1), data, np.zeros(5), np.ones(5, bool),
                     "tight")


def test_padded_rows_match_the_dense_products():
  import scipy.sparse as sp
  rng = np.random.default_rng(0)
  a = sp.random(30, 50, density=0.1, random_state=1, format="csr")
  data = sparse_rows.from_scipy(a, rng.standard_normal(30))
  x, r = rng.standard_normal(50), rng.standard_normal(30)
  np.testing.assert_allclose(sparse_rows.matvec(data, jax.device_put(x)), a @ x, rtol=1e-12,
                             atol=1e-12)
  np.testing.assert_allclose(sparse_rows.rmatvec(data, jax.device_put(r)), a.T @ r, rtol=1e-12,
                             atol=1e-12)
  np.testing.assert_allclose(data.col_sq, np.asarray(a.multiply(a).sum(0)).ravel())
  planted, x_true = sparse_rows.planted(n=500, p=2000, density=2e-3, support=10, seed=0)
  assert planted.idx.shape[0] == 500 and np.count_nonzero(x_true) == 10
  assert int(np.min(planted.nnz_rows)) >= 1


def test_libsvm_file_is_read_sparse(tmp_path):
  """A LIBSVM file in the real format becomes padded rows without densifying; labels {0, 1}
  map to {−1, +1}; the products equal scikit-learn's sparse reader's."""
  from sklearn.datasets import load_svmlight_file
  path = tmp_path / "tiny.svm"
  path.write_text("1 3:0.5 100000:2.0\n0 1:1.5\n1 7:-1 8:1 9:1 # comment\n")
  data = sparse_rows.from_libsvm(str(path))
  assert data.p == 100000 and data.idx.shape == (3, 3)
  np.testing.assert_array_equal(data.b, [1.0, -1.0, 1.0])
  x, _ = load_svmlight_file(str(path))
  v = np.random.default_rng(0).standard_normal(100000)
  np.testing.assert_allclose(sparse_rows.matvec(data, jax.device_put(v)), x @ v, rtol=1e-12)
  with pytest.raises(FileNotFoundError, match="LIBSVM"):
    sparse_rows.from_libsvm(str(tmp_path / "missing.svm"))


def test_elastic_net_is_an_exact_augmented_lasso():
  """The augmented Lasso's objective is n/ñ times the elastic net's at every x, and its
  gap-safe test is safe for the elastic-net optimum."""
  a, b = _lasso_instance(80, 20, 8)
  data = sparse_rows.from_dense(a, b)
  lam, l2 = 0.2 * screening.lambda_max(data), 0.05
  aug, lam_t = screening.elastic_net(data, lam, l2)
  prob = screening.make_problem(aug, lam_t)
  x = np.random.default_rng(0).standard_normal(20)
  enet = np.sum((b - a @ x) ** 2) / 160 + l2 / 2 * x @ x + lam * np.abs(x).sum()
  assert float(screening.primal(prob, aug, jax.device_put(x))) == pytest.approx(
      enet * 80 / 100, rel=1e-12)
  a_aug = np.vstack([a, np.sqrt(80 * l2) * np.eye(20)])
  b_aug = np.concatenate([b, np.zeros(20)])
  bad, elim, x_star = _check_safe(a_aug, b_aug, lam_t, "squared", _path(2))
  assert bad == 0 and elim > 0
  with pytest.raises(ValueError, match="l2"):
    screening.elastic_net(data, lam, 0.0)


def test_screening_at_an_exact_optimum_keeps_its_support():
  """At a solver's optimum P − D rounds to ≈ 0 (even below): the radius keeps a rounding
  allowance, so features with |a_jᵀy| = nλ(1 ± ε) are not eliminated."""
  for seed, n, frac in ((101, 3000, 0.05), (105, 300, 0.2), (108, 300, 0.05)):
    # instances where, without the allowance, P − D rounds to 0 or −1e-16 and 1-7
    # features of the support were eliminated
    a, b = _lasso_instance(n, 30, seed)
    a /= np.sqrt((a ** 2).sum(1, keepdims=True))
    data = sparse_rows.from_dense(a, b)
    lam = frac * screening.lambda_max(data)
    x_star, gap = _fista(a, b, lam, "squared", tol=1e-16, iters=60000)
    res = screening.screen(screening.make_problem(data, lam), data, jax.device_put(x_star),
                           np.ones(30, bool))
    assert not np.any(~np.asarray(res.active) & (np.abs(x_star) > 1e-12))
