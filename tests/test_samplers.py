"""The sampler library (seed 001 ch. 5 §5.3, D.2): exact inclusion probabilities against Monte
Carlo draws (tolerances from the sample size), the exact distributions against the marginals,
E f_S = f, and μ_AS / σ²_⋆,AS against brute-force enumeration."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjaxsparse as fjs

N = 6
BLOCKS = [[0], [1, 4], [2, 3, 5]]  # unequal blocks, not contiguous
DRAWS = 20_000


def _all():
  return {
      "full": fjs.sampling.full(N), "uniform": fjs.sampling.uniform(N),
      "nonuniform": fjs.sampling.nonuniform([0.05, 0.1, 0.15, 0.2, 0.2, 0.3]),
      "importance": fjs.sampling.importance([1.0, 2.0, 0.5, 4.0, 1.5, 3.0]),
      "nice1": fjs.sampling.nice(N, 1), "nice3": fjs.sampling.nice(N, 3),
      "block": fjs.sampling.block(BLOCKS), "block_q": fjs.sampling.block(BLOCKS, q=[0.2, 0.3, 0.5]),
      "stratified": fjs.sampling.stratified(BLOCKS),
      "clusters2of3": fjs.sampling.clusters(BLOCKS, 2),
  }


SAMPLERS = _all()


def _indicators(sampler, n_draws, seed=0):
  """``[n_draws, N]`` 0/1 membership of jitted, vmapped draws (one program: the keys are
  split inside it; the membership is counted in NumPy)."""
  c = jax.jit(lambda key: jax.vmap(sampler.sample)(jax.random.split(key, n_draws)))(
      jax.random.key(seed))
  ids, mask = np.asarray(c.ids), np.asarray(c.mask)
  onehot = (ids[..., None] == np.arange(N)) * mask[..., None]
  return onehot.sum(1)


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_inclusion_probabilities_by_monte_carlo(name):
  s = SAMPLERS[name]
  ind = _indicators(s, DRAWS)
  assert ind.max() <= 1  # no client twice in a cohort
  p_hat = ind.mean(0)
  tol = 5 * np.sqrt(s.marginals * (1 - s.marginals) / DRAWS) + 1e-12
  np.testing.assert_array_less(np.abs(p_hat - s.marginals), tol + 1e-9)
  pair_hat = ind.T @ ind / DRAWS
  tol2 = 5 * np.sqrt(s.pair_marginals * (1 - s.pair_marginals) / DRAWS) + 1e-9
  np.testing.assert_array_less(np.abs(pair_hat - s.pair_marginals), tol2)


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_support_is_the_exact_distribution(name):
  """The enumerated distribution sums to 1, reproduces p_i and P_ij, and f_S is unbiased:
  Σ_C p_C Σ_{i∈C} f_i/(n p_i) = (1/n) Σ_i f_i for arbitrary f_i."""
  s = SAMPLERS[name]
  sup = list(s.support())
  assert abs(sum(p for _, p in sup) - 1) < 1e-12
  p, pair = np.zeros(N), np.zeros((N, N))
  for c, pc in sup:
    p[list(c)] += pc
    pair[np.ix_(c, c)] += pc
  np.testing.assert_allclose(p, s.marginals, atol=1e-12)
  np.testing.assert_allclose(pair, s.pair_marginals, atol=1e-12)
  f = np.random.default_rng(1).normal(size=N)
  np.testing.assert_allclose(sum(pc * np.sum(f[list(c)] * s.weights[list(c)]) for c, pc in sup),
                             f.mean(), rtol=1e-12)


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_mu_as_and_sigma2_equal_enumeration(name):
  s = SAMPLERS[name]
  rng = np.random.default_rng(2)
  mu = rng.uniform(0.1, 2.0, N)
  a = rng.normal(size=(N, 3))
  a -= a.mean(0)  # gradients at the optimum sum to zero
  sup = list(s.support())
  brute_mu = min(np.sum(mu[list(c)] * s.weights[list(c)]) for c, _ in sup)
  brute_sigma = sum(pc * np.sum(np.sum(a[list(c)] * s.weights[list(c)][:, None], 0) ** 2)
                    for c, pc in sup)
  np.testing.assert_allclose(fjs.sampling.mu_as(s, mu), brute_mu, rtol=1e-12)
  np.testing.assert_allclose(fjs.sampling.sigma2_star(s, a), brute_sigma, rtol=1e-10, atol=1e-14)


def test_closed_forms_of_the_spec_table():
  """τ-NICE: μ_AS = mean of the τ smallest μ_i and σ² = ((n−τ)/(τ(n−1)))·(1/n)Σ‖a_i‖²;
  full sampling: σ² = 0, μ_AS = mean μ_i; importance sampling: μ_AS = mean μ_i."""
  rng = np.random.default_rng(3)
  mu = rng.uniform(0.1, 2.0, N)
  a = rng.normal(size=(N, 2))
  a -= a.mean(0)
  for tau in range(1, N + 1):
    s = fjs.sampling.nice(N, tau)
    np.testing.assert_allclose(fjs.sampling.mu_as(s, mu), np.sort(mu)[:tau].mean(), rtol=1e-12)
    np.testing.assert_allclose(fjs.sampling.sigma2_star(s, a), (N - tau) / (tau * (N - 1))
                               * np.mean(np.sum(a ** 2, 1)), rtol=1e-10, atol=1e-14)
  assert abs(fjs.sampling.sigma2_star(fjs.sampling.full(N), a)) < 1e-14
  np.testing.assert_allclose(fjs.sampling.mu_as(fjs.sampling.importance(mu), mu), mu.mean(),
                             rtol=1e-12)


def test_example_d613_stratified_can_be_worse_than_nice():
  """Example D.6.13: a = (0,1), (1,0), (0,−1), (−1,0), clusters {1,3}, {2,4}: σ²_SS = 1/2 and
  σ²_NICE(2) = 1/3."""
  a = np.array([[0, 1], [1, 0], [0, -1], [-1, 0]], float)
  np.testing.assert_allclose(
      fjs.sampling.sigma2_star(fjs.sampling.stratified([[0, 2], [1, 3]]), a), 0.5)
  np.testing.assert_allclose(fjs.sampling.sigma2_star(fjs.sampling.nice(4, 2), a), 1 / 3)


def test_two_stage_differs_from_stratified_when_fewer_clusters_are_drawn():
  """Spec C5-6: with C = q Algorithm 14's scheme is SS; with C < q its marginals are
  (C/q)/|C_B(i)|, not SS's 1/|C_B(i)|."""
  two, ss = fjs.sampling.clusters(BLOCKS, 3), fjs.sampling.stratified(BLOCKS)
  np.testing.assert_allclose(two.pair_marginals, ss.pair_marginals)
  fewer = fjs.sampling.clusters(BLOCKS, 2)
  np.testing.assert_allclose(fewer.marginals, (2 / 3) * ss.marginals)


def test_static_shapes_determinism_and_weights():
  for s in SAMPLERS.values():
    # two separately traced programs (each runs the sampler's Python anew; eagerly every
    # operation would compile a program of its own): the same key, the same cohort
    a = jax.jit(lambda k: s.sample(k))(jax.random.key(7))
    b = jax.jit(s.sample)(jax.random.key(7))
    assert a.ids.shape == a.mask.shape == a.weights.shape == (s.size,)
    np.testing.assert_array_equal(a.ids, b.ids)
    np.testing.assert_allclose(a.weights, s.weights[np.asarray(a.ids)] * np.asarray(a.mask),
                               rtol=1e-6)
  c = jax.jit(fjs.sampling.block(BLOCKS).sample)(jax.random.key(0))  # padded: largest block
  assert c.ids.shape == (3,) and set(np.asarray(c.mask).tolist()) <= {0.0, 1.0}


def test_theorem_bound_and_lemma_d611():
  """μ_NICE(τ) nondecreasing in τ, σ²_NICE(τ) ≤ σ²_NICE(1)/τ (Lemma D.6.11); the Theorem 5.3.2
  neighbourhood is ≤ σ²/μ² for every γ."""
  rng = np.random.default_rng(4)
  mu = rng.uniform(0.1, 2.0, N)
  a = rng.normal(size=(N, 2))
  a -= a.mean(0)
  mus = [fjs.sampling.mu_as(fjs.sampling.nice(N, t), mu) for t in range(1, N + 1)]
  sig = [fjs.sampling.sigma2_star(fjs.sampling.nice(N, t), a) for t in range(1, N + 1)]
  assert np.all(np.diff(mus) >= -1e-12)
  assert all(sig[t - 1] <= sig[0] / t + 1e-12 for t in range(1, N + 1))
  s = fjs.sampling.nice(N, 2)
  for gamma in (0.01, 1.0, 100.0, 1e5):
    nb = fjs.sampling.neighbourhood(s, mu, a, gamma)
    assert nb <= fjs.sampling.sigma2_star(s, a) / fjs.sampling.mu_as(s, mu) ** 2 + 1e-12


def test_clustering_helpers_and_bad_input():
  blocks = fjs.sampling.contiguous_blocks(10, 3)
  assert [len(b) for b in blocks] == [4, 3, 3]
  feats = np.concatenate([np.zeros((4, 2)), np.ones((5, 2)) * 10]) + \
      np.random.default_rng(0).normal(size=(9, 2)) * 0.1
  km = fjs.sampling.kmeans_blocks(feats, 2)
  assert sorted(map(len, km)) == [4, 5]
  with pytest.raises(ValueError, match="tau"):
    fjs.sampling.nice(4, 5)
  with pytest.raises(ValueError, match="partition"):
    fjs.sampling.stratified([[0, 1], [1, 2]])
  with pytest.raises(ValueError, match="probs"):
    fjs.sampling.nonuniform([0.5, 0.6])
  with pytest.raises(ValueError, match="q must"):
    fjs.sampling.block(BLOCKS, q=[0.5, 0.5])
  with pytest.raises(ValueError, match="num_clusters"):
    fjs.sampling.clusters(BLOCKS, 4)


def test_epoch_minibatches_visit_every_example_once_per_epoch():
  """Epoch-based local training: S_k = E·⌈n_k/B⌉; each epoch's batches cover the client's real
  examples exactly once (last batch partial), in a new order each epoch."""
  x = np.arange(23, dtype=np.float32)[:, None]
  data = fjs.data.pack_clients(x, np.zeros(23, np.int32), [np.arange(0, 7), np.arange(7, 23)])
  steps = np.asarray(fjs.ops.local.epoch_steps(np.asarray(data.num_examples), 3, 2))
  np.testing.assert_array_equal(steps, [2 * 3, 2 * 6])
  minibatch = jax.jit(fjs.ops.local.epoch_minibatch, static_argnums=2)   # one program
  for i in range(2):
    row = jax.tree.map(lambda a: np.asarray(a)[i], data)
    seen = []
    for s in range(int(steps[i])):
      bx, _, bm = minibatch(jax.random.key(i), row, 3, jnp.int32(s))
      seen.append(np.asarray(bx[:, 0])[np.asarray(bm) > 0])
    per = len(seen) // 2
    ep1, ep2 = np.concatenate(seen[:per]), np.concatenate(seen[per:])
    real = np.asarray(row.x[:int(row.num_examples), 0])
    np.testing.assert_array_equal(np.sort(ep1), np.sort(real))
    np.testing.assert_array_equal(np.sort(ep2), np.sort(real))
    assert not np.array_equal(ep1, ep2)  # reshuffled


def _logistic_clients(seed=0, d=3, m=8):
  """N l2-logistic clients ``f_i(x) = mean_j log(1 + exp(−b_ij a_ij·x)) + ½μ‖x‖²``: their
  gradients, losses, L_i (λ_max of ¼ A_iᵀA_i/m + μI), L of the average, and x⋆ (Newton)."""
  rng = np.random.default_rng(seed)
  mu = 0.05
  a = rng.normal(size=(N, m, d)) * rng.uniform(0.3, 3.0, (N, 1, 1))  # unequal L_i
  b = np.where(rng.random((N, m)) < 0.5, -1.0, 1.0)
  hess = np.einsum("nmi,nmj->nij", a, a) / (4 * m) + mu * np.eye(d)
  l_i = np.linalg.eigvalsh(hess)[:, -1]
  l_avg = np.linalg.eigvalsh(hess.mean(0))[-1]

  def grads(x):
    s = 1 / (1 + np.exp(b * np.einsum("nmi,i->nm", a, x)))  # σ(−b a·x)
    return -np.einsum("nm,nmi->ni", s * b, a) / m + mu * x

  def losses(x):
    return np.logaddexp(0, -b * np.einsum("nmi,i->nm", a, x)).mean(1) + 0.5 * mu * x @ x

  x = np.zeros(d)
  for _ in range(50):  # Newton on the average
    z = b * np.einsum("nmi,i->nm", a, x)
    w = 1 / (1 + np.exp(-z)) / (1 + np.exp(z))
    h = np.einsum("nm,nmi,nmj->ij", w, a, a) / (m * N) + mu * np.eye(d)
    x = x - np.linalg.solve(h, grads(x).mean(0))
  assert np.linalg.norm(grads(x).mean(0)) < 1e-12
  return grads, losses, l_i, l_avg, x


def test_expected_smoothness_closed_forms():
  """Gower et al. (2019) Prop. 3.8 for τ-NICE, L for full participation, L_max for one
  uniform client, and ``L + (|B|/n)(L_max − L)`` for stratified sampling."""
  L, lmax = 1.3, 4.0
  es = fjs.sampling.expected_smoothness
  for tau in range(1, N + 1):
    gower = N * (tau - 1) / (tau * (N - 1)) * L + (N - tau) / (tau * (N - 1)) * lmax
    assert es(fjs.sampling.nice(N, tau), L, lmax) == pytest.approx(gower, rel=1e-9)
  assert es(fjs.sampling.full(N), L, lmax) == pytest.approx(L, rel=1e-9)
  assert es(fjs.sampling.uniform(N), L, lmax) == pytest.approx(lmax, rel=1e-9)
  assert es(fjs.sampling.stratified(BLOCKS), L, lmax) == pytest.approx(
      L + 3 / N * (lmax - L), rel=1e-7)
  with pytest.raises(ValueError, match="client_smoothness"):
    es(fjs.sampling.nice(N, 2), L, [1.0] * (N - 1) + [-1.0])
  with pytest.raises(ValueError, match="smoothness"):
    es(fjs.sampling.nice(N, 2), 0.0, lmax)


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_expected_smoothness_bounds_the_exact_second_moment(name):
  """``E‖∇f_S(x) − ∇f_S(x⋆)‖² ≤ 2𝓛 (f(x) − f⋆)`` at random points of a logistic problem with
  unequal L_i, the expectation summed over the sampling's exact cohort distribution (not
  the pair-marginal matrix the constant is built from), for per-client L_i and for L_max."""
  s = SAMPLERS[name]
  grads, losses, l_i, l_avg, x_opt = _logistic_clients()
  g_opt, f_opt = grads(x_opt), losses(x_opt).mean()
  consts = [fjs.sampling.expected_smoothness(s, l_avg, c) for c in (l_i, l_i.max())]
  assert consts[0] <= consts[1] * (1 + 1e-9)  # per-client constants are never worse
  v = 1 / (N * s.marginals)
  rng = np.random.default_rng(1)
  worst = 0.0
  for scale in (0.01, 0.3, 3.0):
    for x in x_opt + scale * rng.normal(size=(20, 3)):
      diff = (grads(x) - g_opt) * v[:, None]
      moment = sum(p * np.sum(diff[list(c)].sum(0) ** 2) for c, p in s.support())
      worst = max(worst, moment / (2 * (losses(x).mean() - f_opt)))
  assert worst <= consts[0] * (1 + 1e-9), (worst, consts)
  assert worst >= consts[0] / 4  # and not vacuous: within a factor 4 of the worst measured
