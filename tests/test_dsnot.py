"""DSnoT / R²-DSnoT (fedjaxsparse.pruning.dsnot): constant per-neuron sparsity at every cycle, the
reconstruction error they minimise, the threshold stopping rule, and agreement with a plain
per-neuron numpy loop of the same rules."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjaxsparse as fjs

dsnot = fjs.pruning.dsnot

B, C, A = 48, 12, 400


def _problem(seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(A, B)) * rng.uniform(0.2, 3.0, B) + rng.normal(size=B)  # non-zero means
  w = rng.normal(size=(B, C)).astype(np.float32)
  st = fjs.pruning.calibration.update_stats(fjs.pruning.calibration.init_stats(B),
                                            jnp.asarray(x, jnp.float32))
  m0 = fjs.pruning.posttrain.unstructured_mask(
      fjs.pruning.scores.wanda(jnp.asarray(w), st.x_norm), 0.6)
  return jnp.asarray(w), st, m0


def _error(w, m, mu):
  return np.abs(np.sum(np.where(m, 0.0, w) * mu[:, None], axis=0))


def _numpy_reference(w, m0, st, cfg):
  """Every output neuron on its own, one swap per cycle, plain numpy (same rules)."""
  w, m0 = np.asarray(w, np.float64), np.asarray(m0)
  mu, n = np.asarray(st.mean, np.float64), np.asarray(st.x_norm, np.float64)
  inv_var = 1.0 / np.asarray(st.variance, np.float64) ** cfg.variance_power
  m = m0.copy()
  e = np.sum(np.where(m0, 0.0, w) * mu[:, None], axis=0)
  active = np.ones(C, bool)
  for _ in range(cfg.max_cycles):
    if not active.any():
      break
    for q in range(C):
      s = np.sign(e[q])
      grow = np.where(~m[:, q] & ~m0[:, q], s * w[:, q] * mu * inv_var, -np.inf)
      ok = m[:, q] & m0[:, q] & (s * w[:, q] * mu < 0)
      prune = np.where(ok, np.abs(w[:, q]) * n ** cfg.alpha, np.inf)
      go = active[q] and np.isfinite(grow.max()) and ok.any() and abs(e[q]) > cfg.update_threshold
      active[q] = go
      if go:
        i, j = int(np.argmax(grow)), int(np.argmin(prune))
        m[i, q], m[j, q] = True, False
        e[q] += w[j, q] * mu[j] - w[i, q] * mu[i]
  return m


@pytest.mark.parametrize("cfg", [dsnot.dsnot(), dsnot.r2_dsnot("wanda"),
                                 dsnot.r2_dsnot("ria", p=np.inf), dsnot.dsnot(accept="decrease"),
                                 dsnot.dsnot(accept="same_sign")])
def test_sparsity_constant_at_every_cycle_and_error_reduced(cfg):
  w, st, m0 = _problem()
  counts0 = np.asarray(m0).sum(0)
  run = jax.jit(dsnot.refine, static_argnums=3)
  prev = _error(np.asarray(w), np.asarray(m0), np.asarray(st.mean))
  for t in (1, 3):
    m, info = run(w, m0, st, cfg._replace(max_cycles=t))
    np.testing.assert_array_equal(np.asarray(m).sum(0), counts0)       # per-neuron sparsity
    err = _error(np.asarray(w), np.asarray(m), np.asarray(st.mean))
    np.testing.assert_allclose(err, np.asarray(info.error_after), rtol=1e-4, atol=1e-4)
    if cfg.accept == "decrease":                                         # monotone by design
      assert np.all(err <= prev + 1e-5)
    prev = err
  final, info = run(w, m0, st, cfg)
  before, after = np.asarray(info.error_before), np.asarray(info.error_after)
  assert int(info.swaps.sum()) > 0
  assert after.sum() < 0.5 * before.sum()                                # planted: large gain


def test_matches_plain_numpy_loop():
  w, st, m0 = _problem(1)
  cfg = dsnot.dsnot(max_cycles=30)
  m, _ = dsnot.refine(w, m0, st, cfg)
  np.testing.assert_array_equal(np.asarray(m), _numpy_reference(w, m0, st, cfg))


def test_threshold_stops_rows():
  w, st, m0 = _problem(2)
  e0 = _error(np.asarray(w), np.asarray(m0), np.asarray(st.mean))
  thr = float(np.median(e0))
  m, info = dsnot.refine(w, m0, st, dsnot.dsnot(update_threshold=thr))
  quiet = e0 <= thr
  assert quiet.any() and (~quiet).any()
  np.testing.assert_array_equal(np.asarray(m)[:, quiet], np.asarray(m0)[:, quiet])
  assert np.all(np.asarray(info.swaps)[quiet] == 0)
  # error_scale multiplies |e| before the comparison
  m_big, info_big = dsnot.refine(w, m0, st, dsnot.dsnot(update_threshold=thr, error_scale=1e-9))
  np.testing.assert_array_equal(np.asarray(m_big), np.asarray(m0))
  assert int(info_big.cycles) == 1


def test_regulariser_depends_on_the_candidate():
  a = jnp.array([3.0, 1.0, 2.0, 5.0])
  kept = jnp.array([True, True, False, False])
  np.testing.assert_allclose(dsnot._post_swap_norm(a, kept, 2.0, grow=True),
                             np.sqrt(10 + a ** 2), rtol=1e-6)
  np.testing.assert_allclose(dsnot._post_swap_norm(a, kept, 1.0, grow=False)[:2], 4 - a[:2])
  np.testing.assert_allclose(dsnot._post_swap_norm(a, kept, np.inf, grow=False)[:2], [1.0, 3.0])
  np.testing.assert_allclose(dsnot._post_swap_norm(a, kept, np.inf, grow=True), [3, 3, 3, 5])


def test_bad_config_is_named():
  with pytest.raises(ValueError, match="accept"):
    dsnot.dsnot(accept="always")
  with pytest.raises(ValueError, match="p must"):
    dsnot.r2_dsnot(p=3)
  with pytest.raises(ValueError, match="base"):
    dsnot.r2_dsnot("sparsegpt")


def test_r2_dsnot_overrides_replace_the_preset():
  """A key the preset sets (``gamma_prune``, ``prune_relative``) can be overridden; the
  other preset values stay."""
  cfg = dsnot.r2_dsnot("wanda", gamma_prune=0.0)
  assert cfg.gamma_prune == 0.0 and cfg.prune_relative and cfg.alpha == 0.5 and cfg.p == 2.0
  cfg = dsnot.r2_dsnot("ria", grow_relative=False, gamma_prune=5e-4, alpha=0.25)
  assert (cfg.grow_relative, cfg.gamma_prune, cfg.alpha) == (False, 5e-4, 0.25)
  assert dsnot.r2_dsnot("ria").gamma_prune == 1e-4 and dsnot.r2_dsnot("ria").grow_relative


def test_prune_params_refines_through_calib_stats():
  w, st, _ = _problem(3)
  params = {"Dense_0": {"kernel": w, "bias": jnp.zeros(C)}}
  fn = lambda w_, x, k: fjs.pruning.scores.wanda(w_, x)  # noqa: E731
  _, m_plain = fjs.pruning.posttrain.prune_params(params, fn, sparsity=0.6, stats={"Dense_0": st})
  _, m_ref = fjs.pruning.posttrain.prune_params(params, fn, sparsity=0.6, stats={"Dense_0": st},
                                                refine=dsnot.dsnot())
  direct, _ = dsnot.refine(w, m_plain["Dense_0"]["kernel"], st, dsnot.dsnot())
  np.testing.assert_array_equal(np.asarray(m_ref["Dense_0"]["kernel"]), np.asarray(direct))
  with pytest.raises(ValueError, match="refine"):
    fjs.pruning.posttrain.prune_params(params, fn, nm=(2, 4), stats={"Dense_0": st},
                                       refine=dsnot.dsnot())
  # DSnoT's default skips MLP layers (they keep the score's mask); skip=() refines them too
  nested = {"mlp": params}
  _, m_skip = fjs.pruning.posttrain.prune_params(nested, fn, sparsity=0.6,
                                                 stats={"mlp/Dense_0": st}, refine=dsnot.dsnot())
  _, m_all = fjs.pruning.posttrain.prune_params(nested, fn, sparsity=0.6, stats={"mlp/Dense_0": st},
                                                refine=dsnot.dsnot(skip=()))
  np.testing.assert_array_equal(m_skip["mlp"]["Dense_0"]["kernel"], m_plain["Dense_0"]["kernel"])
  np.testing.assert_array_equal(m_all["mlp"]["Dense_0"]["kernel"], np.asarray(direct))
  assert not np.array_equal(np.asarray(direct), np.asarray(m_plain["Dense_0"]["kernel"]))
