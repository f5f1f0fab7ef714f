"""Post-training pruning scores (seed 001 ch. 6, Table 6.1; spec §B.2-§B.4, §B.8): Lemma 6.3.1
and E.2's identity exactly, every special case equal to the general form with its X and Y,
ℓ0-RI ranking like Wanda, stochRIA at β = 1 equal to RIA, exact counts per group and per N:M
block, determinism under the key, streaming statistics equal to batch ones."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjaxsparse as fjs

scores = fjs.pruning.scores

RNG = np.random.default_rng(0)
B, C, A, D = 12, 8, 30, 5
W = jnp.asarray(RNG.normal(size=(B, C)), jnp.float32)
X = jnp.asarray(RNG.normal(size=(A, B)), jnp.float32)
Y = jnp.asarray(RNG.normal(size=(C, D)), jnp.float32)
XN = jnp.linalg.norm(X, axis=0)  # ‖X_{:j}‖₂
YN = jnp.linalg.norm(Y, axis=1)  # ‖Y_{k:}‖₂


def test_lemma_631_and_the_squared_identity_exactly():
  """Zeroing only W_jk: ‖X(W̃−W)‖_F + ‖(W̃−W)Y‖_F = S_jk; squared objective = S'_jk²."""
  s, s2 = (np.asarray(a) for a in jax.jit(
      lambda w, xn, yn: (scores.general(w, xn, yn), scores.general(w, xn, yn, squared=True)))(
          W, XN, YN))

  @jax.jit   # one program for every (j, k)
  def objectives(j, k):
    delta = jnp.zeros_like(W).at[j, k].set(-W[j, k])
    return (jnp.linalg.norm(X @ delta) + jnp.linalg.norm(delta @ Y),
            jnp.linalg.norm(X @ delta) ** 2 + jnp.linalg.norm(delta @ Y) ** 2)

  for j, k in [(0, 0), (3, 5), (11, 7), (6, 2)]:
    g, g2 = objectives(j, k)
    np.testing.assert_allclose(g, s[j, k], rtol=1e-5)
    np.testing.assert_allclose(g2, s2[j, k] ** 2, rtol=1e-5)


def _col_norms(x):  # ‖X_{:j}‖ for every j
  return jnp.linalg.norm(x, axis=0)


def _row_norms(y):  # ‖Y_{k:}‖ for every k
  return jnp.linalg.norm(y, axis=1)


def test_special_cases_are_the_general_form_with_their_x_and_y():
  u = RNG.normal(size=(A,)).astype(np.float32)
  v = RNG.normal(size=(D,)).astype(np.float32)

  @jax.jit   # every pair below in one program (not one per eager operation)
  def pairs(W, XN, YN, u, v):
    zeros_y = jnp.zeros((C, D))
    out = {
        "wanda: Y = 0": (scores.wanda(W, XN), scores.general(W, XN, _row_norms(zeros_y))),
        "magnitude: X = I, Y = 0": (scores.magnitude(W), scores.general(
            W, _col_norms(jnp.eye(B)), _row_norms(zeros_y))),
        "owanda: X = 0": (scores.owanda(W, YN), scores.general(W, jnp.zeros(B), YN)),
        "symmetric: X = Y = Wᵀ": (scores.symmetric(W), scores.general(
            W, _col_norms(W.T), _row_norms(W.T))),
        "symmetric squared": (scores.symmetric(W, squared=True), scores.general(
            W, _col_norms(W.T), _row_norms(W.T), squared=True)),
    }
    r1, c1 = jnp.abs(W).sum(1), jnp.abs(W).sum(0)
    v1 = scores.general(W, _col_norms(jnp.ones((B, B)) / (jnp.sqrt(B) * r1)[None, :]),  # RI v1
                        _row_norms(jnp.ones((C, C)) / (jnp.sqrt(C) * c1)[:, None]))
    v2 = scores.general(W, _col_norms(jnp.diag(1 / r1)), _row_norms(jnp.diag(1 / c1)))   # RI v2
    out["ri v1"] = (scores.ri(W), v1)
    out["ri v2"] = (scores.ri(W), v2)
    out["ria"] = (scores.ria(W, XN, 0.5), scores.ri(W) * jnp.sqrt(XN)[:, None])
    out["general_diagonal"] = (scores.general_diagonal(W, XN, YN),
                               scores.general(W, XN / r1, YN / c1))
    rp, cp = (jnp.abs(W) ** 3).sum(1) ** (1 / 3), (jnp.abs(W) ** 3).sum(0) ** (1 / 3)
    u, v = u / jnp.linalg.norm(u), v / jnp.linalg.norm(v)  # ℓp v2 (Lemma 6.3.9), unit u, v
    out["lp S1"] = (scores.lp(W, 3.0), scores.general(
        W, _col_norms(u[:, None] / rp[None, :]), _row_norms((1 / cp)[:, None] * v[None, :])))
    out["lp S2"] = (scores.lp(W, 3.0, "S2"), jnp.abs(W) / (rp[:, None] + cp[None, :]))
    out["lp S3"] = (scores.lp(W, 3.0, "S3"), jnp.abs(W) * (rp[:, None] + cp[None, :]))
    out["lp S4"] = (scores.lp(W, 3.0, "S4"), jnp.abs(W) / (1 / rp[:, None] + 1 / cp[None, :]))
    out["lp inf"] = (scores.lp(W, jnp.inf), jnp.abs(W) * (1 / jnp.abs(W).max(1)[:, None]
                                                          + 1 / jnp.abs(W).max(0)[None, :]))
    out["relative inputs"] = (scores.relative_importance(W, "inputs", XN, 1.0),
                              jnp.abs(W) / c1[None, :] * XN[:, None])
    out["relative outputs"] = (scores.relative_importance(W, "outputs", XN, 1.0),
                               jnp.abs(W) / r1[:, None] * XN[:, None])
    return out

  got = pairs(W, XN, YN, u, v)
  assert len(got) == 16
  for name, (a, b) in got.items():
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7, err_msg=name)


def test_l0_ri_ranks_like_wanda():
  a, b = (np.asarray(s).ravel() for s in jax.jit(lambda w, x: (
      scores.lp(w, 0.0, x_norm=x, alpha=1.0), scores.wanda(w, x)))(W, XN))
  np.testing.assert_array_equal(np.argsort(a, kind="stable"), np.argsort(b, kind="stable"))


def test_stoch_ria_beta_one_is_ria_on_square_layers_and_deterministic():
  w = RNG.normal(size=(9, 9)).astype(np.float32)
  xn = RNG.uniform(0.5, 2.0, 9).astype(np.float32)
  key = jax.random.key(3)
  stoch1, ria = jax.jit(lambda w, k, x: (scores.stoch_ria(w, k, 1.0, x, 0.5),
                                         scores.ria(w, x, 0.5)))(w, key, xn)
  np.testing.assert_allclose(stoch1, ria, rtol=1e-5)
  # two separately traced programs (each runs the score's Python anew): the same key, the same
  # scores
  first = jax.jit(lambda w, k, x: (scores.stoch_ria(w, k, 0.5, x), scores.ria(w, x, 0.5)))
  second = jax.jit(lambda w, k, x: scores.stoch_ria(w, k, 0.5, x))
  (a, ria_w), b = first(W, key, XN), second(W, key, XN)
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, second(W, jax.random.key(4), XN))
  # τ = round(0.5·min(12, 8)) = 4 entries per row: the row term ≥ RIA's (a partial ℓ1 sum)
  assert np.all(np.asarray(a) >= np.asarray(ria_w) - 1e-6)


@pytest.mark.parametrize("group,axis,n", [("per_output", 0, B), ("per_input", 1, C),
                                          ("per_layer", None, B * C)])
def test_unstructured_masks_have_exact_counts_per_group(group, axis, n):
  score = jax.jit(scores.wanda)(W, XN)
  for eps in (0.0, 0.5, 0.6, 0.7):
    m = np.asarray(fjs.pruning.posttrain.unstructured_mask(score, eps, group))
    kept = m.sum() if axis is None else m.sum(axis)
    assert np.all(kept == n - int(eps * n))
    pruned, survivors = np.asarray(score)[~m], np.asarray(score)[m]
    if axis is None and pruned.size:
      assert pruned.max() <= survivors.min()


def test_nm_masks_keep_exactly_n_per_block_of_inputs():
  score = scores.magnitude(W)
  for n, m in ((2, 4), (1, 4), (4, 4)):
    mask = np.asarray(fjs.pruning.posttrain.nm_mask(score, n, m)).reshape(B // m, m, C)
    assert np.all(mask.sum(1) == n)
    s = np.asarray(score).reshape(B // m, m, C)
    assert np.all(np.where(mask, s, np.inf).min(1) >= np.where(mask, -np.inf, s).max(1))
  with pytest.raises(ValueError, match="divisible"):
    fjs.pruning.posttrain.nm_mask(score, 2, 5)


def test_prune_params_by_path_with_stats_and_keys():
  params = {"Dense_0": {"kernel": W, "bias": jax.device_put(np.ones(C, np.float32))},
            "Dense_1": {"kernel": jax.device_put(np.asarray(W).T)}}
  fn = lambda w, x, k: scores.stoch_ria(w, k, 0.5, x)
  stats = {"Dense_0": XN, "Dense_1": jax.device_put(np.ones(C, np.float32))}
  # two separately traced programs (each runs prune_params' Python anew), the same key
  p1, m1 = jax.jit(lambda p, s, k: fjs.pruning.posttrain.prune_params(
      p, fn, sparsity=0.5, stats=s, key=k))(params, stats, jax.random.key(1))
  p2, _ = jax.jit(lambda p, s, k: fjs.pruning.posttrain.prune_params(
      p, fn, sparsity=0.5, stats=s, key=k))(params, stats, jax.random.key(1))
  for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p2)):
    np.testing.assert_array_equal(a, b)
  assert bool(np.asarray(m1["Dense_0"]["bias"]).all())
  assert int((np.asarray(p1["Dense_0"]["kernel"]) != 0).sum()) == C * (B - B // 2)
  _, m24 = jax.jit(lambda p: fjs.pruning.posttrain.prune_params(
      p, lambda w, x, k: scores.magnitude(w), nm=(2, 4)))(params)
  assert int(np.asarray(m24["Dense_1"]["kernel"]).sum()) == C * B // 2
  with pytest.raises(ValueError, match="exactly one"):
    fjs.pruning.posttrain.prune_params(params, fn)


def test_streaming_statistics_equal_the_batch_ones():
  x = RNG.normal(size=(7, 9, B)).astype(np.float32)
  mask = (RNG.uniform(size=(7, 9)) > 0.2).astype(np.float32)
  st = fjs.pruning.calibration.init_stats(B)
  for i in range(7):
    st = jax.jit(fjs.pruning.calibration.update_stats)(st, x[i], mask[i])
  real = np.asarray(x)[np.asarray(mask) > 0]
  np.testing.assert_allclose(st.x_norm, np.linalg.norm(real, axis=0), rtol=1e-5)
  np.testing.assert_allclose(st.mean, real.mean(0), rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(st.variance, real.var(0), rtol=1e-4, atol=1e-6)
  assert float(st.count) == real.shape[0]


def test_streaming_variance_is_stable_for_large_means():
  """Channels with mean 50 and spread 0.1 (Σx²/n − μ² would lose ~7 % in float32): the merged
  centred sums keep the variance to 1e-3, batch after batch."""
  x = 50.0 + 0.1 * RNG.standard_normal((64, 4096, 3))
  st = fjs.pruning.calibration.init_stats(3)
  for i in range(64):
    st = jax.jit(fjs.pruning.calibration.update_stats)(st, jnp.asarray(x[i], jnp.float32))
  np.testing.assert_allclose(st.variance, x.reshape(-1, 3).var(0), rtol=1e-3)
