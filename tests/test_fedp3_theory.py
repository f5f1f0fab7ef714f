"""Theoretical FedP3 (seed 001, Alg. 10-11, Def. 4.3.1-4.3.2, Thm 4.3.3 / C.3.5; spec §A.6-§A.8,
§A.11 items 1-3, 9-10): the permutation sketch's identities (every draw and by Monte Carlo),
aggregation = gather, the theorem's bound on a smooth problem at its step size, Thm C.3.5's
update matrix, LDP noise variances, per-example clipping, the accountant, Rand-t's ω."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjaxsparse as fjs

fedp3_theory = fjs.algorithms.fedp3_theory


def ls_loss(w, x, y, m):
  return 0.5 * jnp.sum(m * (x @ w - y) ** 2) / jnp.maximum(jnp.sum(m), 1.0)


_client_grads = jax.jit(jax.vmap(jax.grad(ls_loss), in_axes=(None, 0, 0, 0)))
_client_losses = jax.jit(jax.vmap(ls_loss, in_axes=(None, 0, 0, 0)))


def _problem(n=4, m=30, d=8, seed=0, interpolate=False):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n * m, d)).astype(np.float32) * rng.uniform(0.5, 2.0, size=d)
  w_star = rng.normal(size=d).astype(np.float32)
  y = (x @ w_star * (0 if interpolate else 1) + (0 if interpolate else 0.3)
       * rng.normal(size=n * m)).astype(np.float32)
  data = fjs.data.pack_clients(x, y, [np.arange(i * m, (i + 1) * m) for i in range(n)])
  ls = [np.linalg.eigvalsh(x[i * m:(i + 1) * m].T @ x[i * m:(i + 1) * m] / m).max()
        for i in range(n)]
  return data, x, y, np.array(ls)


def test_permutation_sketch_identities_on_every_draw_and_in_expectation():
  n, d = 5, 40
  x = np.random.default_rng(0).normal(size=d).astype(np.float32)
  sketches = jax.jit(lambda owner: jnp.stack([
      fedp3_theory.permutation_sketch(owner, i, jnp.ones(d), n) for i in range(n)]))
  for s in range(20):
    owner = fedp3_theory.permutation_owner(jax.random.key(s), d, n)
    sk = np.asarray(sketches(owner))
    np.testing.assert_array_equal(sk.sum(0), n * np.ones(d))  # Σ_i S_i = nI
    assert ((sk > 0).sum(0) == 1).all() and ((sk > 0).sum(1) == d // n).all()
  draws = 20000
  ys = np.random.default_rng(1).normal(size=(n, d)).astype(np.float32)

  @jax.jit
  def moments(key):  # the Monte Carlo moments over `draws` permutations, in one program
    owners = jax.vmap(lambda k: fedp3_theory.permutation_owner(k, d, n))(
        jax.random.split(key, draws))
    sx = jax.vmap(lambda o: fedp3_theory.permutation_sketch(o, 2, x, n))(owners)  # client 2
    sq = jnp.sum(sx ** 2, 1)
    agg = jax.vmap(lambda o: jnp.sum(jnp.stack([fedp3_theory.permutation_sketch(o, i, ys[i], n)
                                                for i in range(n)]), 0) / n)(owners)
    sq_agg = jnp.sum(agg ** 2, 1)
    return (sx.mean(0), sx.std(0), sq.mean(), sq.std(), n * jnp.sum(x ** 2), sq_agg.mean(),
            sq_agg.std(), jnp.sum(ys ** 2) / n)

  mean, std, sq_mean, sq_std, want_sq, agg_mean, agg_std, want_agg = jax.tree.map(
      np.asarray, moments(jax.random.key(1)))
  se = std / np.sqrt(draws)
  assert np.all(np.abs(mean - x) < 5 * se + 1e-6)  # E[S_i x] = x
  assert abs(sq_mean - want_sq) < 5 * sq_std / np.sqrt(draws)
  # E‖(1/n)Σ S_i y_i‖² = (1/n)Σ‖y_i‖² (disjoint supports)
  assert abs(agg_mean - want_agg) < 5 * agg_std / np.sqrt(draws)
  blocks = np.asarray(fedp3_theory.permutation_owner(jax.random.key(3), 24, 3, block=4))
  assert (blocks.reshape(-1, 4) == blocks.reshape(-1, 4)[:, :1]).all()
  with pytest.raises(ValueError, match="divisible"):
    fedp3_theory.permutation_owner(jax.random.key(0), 10, 3)


def test_aggregation_is_a_gather_and_gamma_zero_is_a_fixed_point():
  data, *_ = _problem(n=4, d=8)
  w0 = jax.device_put(np.arange(8, dtype=np.float32))
  key = jax.random.key(4)
  algo = fjs.fedp3_theory(ls_loss, 0.05)
  new, info = jax.jit(algo.step)(key, algo.init(None, w0, data), data)
  owner = np.asarray(jax.jit(lambda key: fedp3_theory.permutation_owner(  # k_perm = split[0]
      jax.random.split(key)[0], 8, 4))(key))
  us = np.asarray(w0) - 0.05 * np.asarray(_client_grads(w0, data.x, data.y, data.mask))
  gathered = us[owner, np.arange(8)]
  np.testing.assert_allclose(new.params, gathered, rtol=1e-6, atol=1e-7)
  assert float(info.floats_up) == 8
  still = fjs.fedp3_theory(lambda w, x, y, m: 0.0 * jnp.sum(w), 1.0)
  np.testing.assert_array_equal(
      jax.jit(still.step)(key, still.init(None, w0, data), data)[0].params, w0)


def test_theorem_433_bound_holds_at_the_prescribed_step():
  data, x, y, ls = _problem(n=4, d=8, seed=1)
  K = 200
  gamma = fedp3_theory.theorem_433_step(ls.mean(), ls.max(), K)
  algo = fjs.fedp3_theory(ls_loss, gamma)
  f = lambda w: np.mean([float(v) for v in np.asarray(_client_losses(w, data.x, data.y,
                                                                     data.mask))])
  w_inf = np.linalg.lstsq(np.asarray(x, np.float64), np.asarray(y, np.float64), rcond=None)[0]
  delta0 = f(np.zeros(8, np.float32)) - f(w_inf.astype(np.float32))
  run = jax.jit(lambda key: jax.lax.scan(
      lambda s, k: algo.step(k, s, data), algo.init(None, jnp.zeros(8), data),
      jax.random.split(key, K))[1].grad_norm_sq)
  g = np.mean([np.asarray(run(jax.random.key(s))) for s in range(10)], axis=0)  # E‖∇f(w^k)‖²
  bound = fedp3_theory.theorem_433_bound(delta0, gamma, ls.mean(), ls.max(), K)
  assert g.min() <= bound
  assert g[-1] < 1e-2 * g[0]  # it also converges, far inside the bound


def test_theorem_c35_update_matrix_and_biased_pruning():
  """S_i = I, b_i = 0: one step is w ← (P − γB̄)w with P = (1/n)ΣP_i, B̄ = (1/n)ΣP_i L_i P_i."""
  n, d = 3, 6
  data, *_ = _problem(n=n, d=d, interpolate=True)
  w = jax.device_put(np.linspace(-1.0, 1.0, d, dtype=np.float32))
  key = jax.random.key(9)
  algo = fjs.fedp3_theory(ls_loss, 0.1, prune=0.6, sketch="identity")
  new = jax.jit(algo.step)(key, algo.init(None, w, data), data)[0].params
  # client i's pruning key, as the step derives it: split(fold_in(k_clients, i))[0] with
  # k_clients = split(key)[1]
  client_masks = np.asarray(jax.jit(lambda key: jnp.stack([
      fedp3_theory.pruning_mask(jax.random.split(jax.random.fold_in(
          jax.random.split(key)[1], i))[0], d, 0.6)
      for i in range(n)]))(key), np.float64)
  xs = np.asarray(data.x, np.float64)
  P, B = np.zeros((d, d)), np.zeros((d, d))
  for i in range(n):
    Pi = np.diag(client_masks[i])
    xi = xs[i]
    Li = xi.T @ xi / xi.shape[0]
    P += Pi / n
    B += Pi @ Li @ Pi / n
  np.testing.assert_allclose(new, (P - 0.1 * B) @ np.asarray(w), rtol=1e-5, atol=1e-6)
  draws = 20000
  masks = np.asarray(jax.jit(lambda key: jax.vmap(lambda k: fedp3_theory.pruning_mask(
      k, d, 0.6))(jax.random.split(key, draws)))(key))
  w = np.asarray(w)
  pw = masks * w
  assert np.all(np.abs(pw.mean(0) - 0.6 * w) < 5 * pw.std(0) / np.sqrt(draws) + 1e-6)


@pytest.mark.parametrize("placement,scale", [("model", 1.0), ("update", 0.3)])
def test_ldp_noise_variance_after_aggregation(placement, scale):
  """Zero gradients: w^{k+1} − w^k is the aggregated noise; per coordinate it has variance σ²
  (model) or γ²σ² (update) — each coordinate carries exactly one client's noise."""
  n, d, sigma, gamma = 5, 4000, 0.7, 0.3
  data, *_ = _problem(n=n, d=2)  # the loss ignores the data
  algo = fjs.fedp3_theory(lambda w, x, y, m: 0.0 * jnp.sum(w), gamma, noise=placement,
                          sigma=sigma)
  state = algo.init(None, np.zeros(d, np.float32), data)
  step = jax.jit(algo.step)
  diffs = np.concatenate([np.asarray(step(jax.random.key(s), state, data)[0].params)
                          for s in range(3)])
  var, want = diffs.var(), (sigma * scale) ** 2
  assert abs(var - want) < 5 * want * np.sqrt(2.0 / diffs.size)


def test_clipping_bounds_every_per_example_gradient():
  data, *_ = _problem(n=2, d=8)
  w = np.full(8, 3.0, np.float32)
  x, y, m = (np.asarray(a)[0] for a in (data.x, data.y, data.mask))
  per = np.asarray(jax.jit(jax.vmap(
      lambda xi, yi: jax.grad(ls_loss)(w, xi[None], yi[None], jnp.ones(1))))(x, y))
  norms = np.linalg.norm(per, axis=1)
  c = float(np.median(norms))
  clipped = jax.jit(lambda clip: fedp3_theory.clipped_mean_grad(ls_loss, w, x, y, m, clip))
  g = clipped(c)
  want = (per * np.minimum(1.0, c / norms)[:, None]).mean(0)
  np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-6)
  assert np.linalg.norm(g) <= c + 1e-5
  np.testing.assert_allclose(clipped(1e9), jax.jit(jax.grad(ls_loss))(w, x, y, m), rtol=1e-4,
                             atol=1e-5)


def test_accountant_is_monotone_and_inverts():
  sigma = fedp3_theory.ldp_sigma(2.0, 1e-5, 100, 100, clip=1.0, batch_size=10, gamma=0.1,
                                 noise="update")
  z = fedp3_theory.noise_multiplier(sigma, 1.0, 10, 0.1, "update")
  eps_z = fedp3_theory.ldp_epsilon(z, 100, 10, 100, 1e-5)
  assert abs(eps_z - 2.0) < 0.05
  # ε decreases in the multiplier: 0.8 < 1.2 < z (≈ 4.5, the inversion's, whose ε is known)
  assert z > 1.2
  eps = [fedp3_theory.ldp_epsilon(m, 100, 10, 100, 1e-5) for m in (0.8, 1.2)] + [eps_z]
  assert eps[0] > eps[1] > eps[2] > 0
  assert fedp3_theory.ldp_epsilon(1.2, 100, 10, 400, 1e-5) > eps[1]  # more steps, more ε
  assert fedp3_theory.ldp_epsilon(1.2, 100, 20, 100, 1e-5) > eps[1]  # larger sampling rate, more ε
  assert np.isclose(z, sigma * 10 / 2.0)  # replace-one sensitivity of the mean: 2C/b
  assert np.isclose(fedp3_theory.noise_multiplier(sigma * 0.1, 1.0, 10, 0.1, "model"), z)
  with pytest.raises(ValueError, match="batch_size"):
    fedp3_theory.ldp_epsilon(1.0, 10, 20, 5, 1e-5)


def test_rand_t_with_t_d_over_n_has_omega_n_minus_one():
  n, d = 4, 64
  comp = fjs.compressors.rand_k(d, d // n)
  assert comp.omega == n - 1
  x = np.random.default_rng(2).normal(size=d).astype(np.float32)
  draws = 20000
  err = np.asarray(jax.jit(lambda key: jax.vmap(  # the keys split inside the one program
      lambda k: jnp.sum((comp.compress(k, x) - x) ** 2))(jax.random.split(key, draws)))(
          jax.random.key(0)))
  assert abs(err.mean() - (n - 1) * np.sum(x ** 2)) < 5 * err.std() / np.sqrt(draws)
