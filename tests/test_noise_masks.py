"""FedMRN's masking operators (seed 003 §3, spec B.1): SM's exact mean and variance by Monte
Carlo (tolerances from the sample size and the two-point law's fourth moment), PSM unbiased
w.r.t. the clipped update with the routed fraction p_τ, the masking error's p_τ law (not eq.
31's p_τ²), the signed/binary identity, the STE, seeded noise regenerated bitwise."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjaxsparse as fjs

noise_masks = fjs.ops.noise_masks

DRAWS = 200_000
# (u, n) pairs: inside the range, outside it on both sides, opposite signs, n = 0
U = np.array([0.3, -0.2, 0.9, 1.5, -0.7, 0.0, 0.4, -0.01, 0.2], np.float32)
N = np.array([1.0, -0.5, 1.0, 1.0, 0.5, 0.8, 0.0, -1.0, -0.3], np.float32)


def _draws(signed):
  keys = jax.random.split(jax.random.key(0), DRAWS)
  m = jax.jit(jax.vmap(
      lambda k: noise_masks.stochastic_mask(k, jnp.asarray(U), jnp.asarray(N), signed)))(keys)
  return np.asarray(N, np.float64) * np.asarray(m, np.float64)  # [DRAWS, 9] values of n·M


@pytest.mark.parametrize("signed", [False, True])
def test_sm_mean_and_variance_by_monte_carlo(signed):
  x = _draws(signed)
  mean, var = noise_masks.sm_moments(U, N, signed)
  se = np.sqrt(var / DRAWS)
  np.testing.assert_array_less(np.abs(x.mean(0) - mean), 5 * se + 1e-7)
  # two-point law: Var of the sample variance ≈ (μ4 − σ⁴)/N with μ4 = πq(b−a)⁴(1 − 3πq)
  lo, hi = (np.minimum(0, N), np.maximum(0, N)) if not signed else (-np.abs(N), np.abs(N))
  width = (hi - lo).astype(np.float64)
  pq = np.where(width > 0, var / np.where(width > 0, width, 1) ** 2, 0)
  mu4 = pq * width ** 4 * (1 - 3 * pq)
  se_var = np.sqrt(np.maximum(mu4 - var ** 2, 0) / DRAWS)
  # (+ the O(1/N) term of the squared sample mean, which dominates at π = ½)
  np.testing.assert_array_less(np.abs(x.var(0) - var), 5 * se_var + 25 * var / DRAWS + 1e-7)
  assert np.all(np.isfinite(x))  # n = 0 is guarded
  if not signed:   # x is _draws(False): the same draws (key 0), not compiled a second time
    assert set(np.unique(x[:, 6])) == {0.0}  # n = 0: never masked in


@pytest.mark.parametrize("signed", [False, True])
def test_psm_is_unbiased_for_the_clipped_update_and_routes_p(signed):
  p = 0.3
  keys = jax.random.split(jax.random.key(1), DRAWS)
  u, n = jax.device_put(U), jax.device_put(N)
  uhat = np.asarray(jax.jit(jax.vmap(lambda k: noise_masks.progressive(k, u, n, p, signed)))(keys),
                    np.float64)
  ubar, var = noise_masks.sm_moments(U, N, signed)
  np.testing.assert_array_less(np.abs(uhat.mean(0) - ubar), 5 * np.sqrt(p * var / DRAWS) + 1e-7)
  # the masking error shrinks by p (not p²): E(û − ū)² = p·Var[n·M]
  err = ((uhat - ubar) ** 2).mean(0)
  inside = var > 0.01
  np.testing.assert_allclose(err[inside], p * var[inside], rtol=0.05)
  # routed fraction: coordinate 0 (u = 0.3 inside (0, n = 1)) differs from ū exactly when it
  # is routed through SM (whose values are 0/n or ±n), so it measures P's rate p
  routed = np.mean(uhat[:, 0] != ubar[0])
  assert abs(routed - p) < 5 * np.sqrt(p * (1 - p) / DRAWS), routed


def test_pm_schedule_and_the_papers_factors():
  """p_τ = (τ+1)/S with the last step fully masked; Prop. 1's √(Σ τ²/S³) is 1, 0.62, 0.58 for
  S = 1, 10, 100; the law that holds averages p_τ: (S + 1)/(2S) (0.55 at S = 10)."""
  s = 10
  p = np.asarray(jax.jit(noise_masks.pm_probability)(np.arange(s, dtype=np.int32), s))
  np.testing.assert_allclose(p, np.arange(1, s + 1) / s)
  assert p[-1] == 1.0
  assert [round(noise_masks.prop1_factor(k), 2) for k in (1, 10, 100)] == [1.0, 0.62, 0.58]
  assert noise_masks.pm_error_factor(10) == pytest.approx(np.mean(p)) == pytest.approx(0.55)
  # at p = 1 PSM is plain SM: û = n·M(u, n) for the same mask draw (one program)
  full, sm = jax.jit(lambda key, u, n: (
      noise_masks.progressive(key, u, n, 1.0, False),
      n * noise_masks.stochastic_mask(jax.random.split(key)[1], u, n, False)))(
          jax.random.key(3), jax.device_put(U), jax.device_put(N))
  np.testing.assert_array_equal(full, sm)


def test_signed_mask_is_a_binary_mask_over_twice_the_noise():
  """G⊙m_s = 2G⊙m − G: the signed mask over n equals, draw for draw, 2·(binary mask of u + n
  over 2n) − 1."""
  u, n = jax.device_put(U), jax.device_put(N)
  both = jax.jit(lambda key: (n * noise_masks.stochastic_mask(key, u, n, True),
                              2 * n * noise_masks.stochastic_mask(key, u + n, 2 * n, False) - n))
  for k in range(5):
    signed, binary = both(jax.random.key(k))
    np.testing.assert_array_equal(np.asarray(signed)[N != 0], np.asarray(binary)[N != 0])


def test_deterministic_mask_and_straight_through():
  f = lambda v: jnp.sum(jnp.sin(v) * jnp.arange(9.0))

  @jax.jit   # one program for every value checked below
  def values(key, u, n):
    mb, ms = noise_masks.deterministic_mask(u, n, False), noise_masks.deterministic_mask(u, n, True)
    fwd = noise_masks.progressive(key, u, n, 0.5, True)
    g = jax.grad(lambda v: f(noise_masks.straight_through(v, fwd)))(u)
    return mb, n * ms, fwd, g, jax.grad(f)(fwd), noise_masks.straight_through(u, fwd)

  mb, nms, fwd, g, g_at_fwd, through = values(jax.random.key(0), jax.device_put(U),
                                              jax.device_put(N))
  np.testing.assert_array_equal(mb, (np.sign(U) == np.sign(N)) & (N != 0))
  np.testing.assert_array_equal(nms, np.abs(N) * np.sign(U) * (N != 0))
  np.testing.assert_allclose(g, g_at_fwd, rtol=1e-6)  # the gradient at û, applied to u
  np.testing.assert_array_equal(through, fwd)


def test_seeded_noise_is_regenerated_bitwise():
  like = {"a": jax.device_put(np.zeros((3, 4), np.float32)),
          "b": jax.device_put(np.zeros(7, np.float32))}
  key = jax.random.fold_in(jax.random.fold_in(jax.random.key(5), 12), 3)  # (round, client)
  for dist in noise_masks.DISTRIBUTIONS:
    # the client draws inside its vmapped local training, the server alone: same bits (the
    # uniform and Bernoulli noise even eagerly, being exact; Gaussian noise within compiled
    # code — its erfinv may round differently op by op)
    keys = jnp.stack([key, jax.random.fold_in(key, 9)])
    a = jax.tree.map(lambda v: np.asarray(v)[0], jax.jit(jax.vmap(
        lambda k: noise_masks.tree_noise(k, like, 0.01, dist)))(keys))
    server = jax.jit(lambda k: noise_masks.tree_noise(k, like, 0.01, dist))
    b = server(key)  # "the server"
    if dist != "gaussian":
      for x, y in zip(jax.tree.leaves(noise_masks.tree_noise(key, like, 0.01, dist)),
                      jax.tree.leaves(b)):
        np.testing.assert_array_equal(x, y)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
      np.testing.assert_array_equal(x, y)
    other = server(jax.random.fold_in(key, 1))
    assert not np.array_equal(a["b"], other["b"])
  noise = jax.jit(noise_masks.noise, static_argnums=(1, 2, 3))   # one program per draw below
  big = np.asarray(noise(jax.random.key(0), (100_000,), 0.5, "uniform"))
  assert float(np.max(np.abs(big))) <= 0.5
  assert set(np.unique(np.asarray(
      noise(jax.random.key(0), (1000,), 0.5, "bernoulli")))) == {-0.5, 0.5}
  g = np.asarray(noise(jax.random.key(0), (100_000,), 0.5, "gaussian"))
  assert abs(g.std() - 0.5) < 5 * 0.5 / np.sqrt(2 * 100_000)
  with pytest.raises(ValueError, match="distribution"):
    noise_masks.noise(jax.random.key(0), (3,), 0.1, "laplace")
