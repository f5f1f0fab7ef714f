"""OTOv2's DHSPG (fedjaxsparse.algorithms.oto): the base optimiser when nothing is penalised,
the partition's K top-scored groups, the adaptive λ's closed form, and training that zeroes
penalised groups exactly, never beyond the sparsity cap, while the others survive."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fedjaxsparse as fjs
from fedjaxsparse.algorithms import oto

Z = fjs.pruning.zig


def _setup(cfg, lr=0.05):
  module, model = fjs.models.prunable.mlp((64,), 10, hidden=(32, 16))
  zigs = Z.trace(module, (64,))
  opt = optax.sgd(lr, momentum=0.9)
  return model, zigs, opt, oto.dhspg(model, zigs, opt, lambda t: lr, cfg)


def _batches(x, y, n=4):
  return [(jnp.asarray(x[i:i + 64]), jnp.asarray(y[i:i + 64])) for i in range(0, 64 * n, 64)]


def test_nothing_penalised_is_the_base_optimiser(digits):
  """λ = 0 and a partition step never reached: the params of the base optimiser, to float
  rounding (one program against another)."""
  model, zigs, opt, algo = _setup(oto.DHSPGConfig(lam=0.0, partition_step=10 ** 6))
  params = model.init(jax.random.key(0))
  st = algo.init(jax.random.key(1), params)
  step = jax.jit(algo.target_step)
  state = opt.init(params)
  want = params
  for xb, yb in _batches(*digits):
    st, _ = step(st, xb, yb)
    g = jax.grad(lambda p: jnp.mean(model.per_example_loss(model.apply(p, xb), yb)))(want)
    u, state = opt.update(g, state, want)
    want = optax.apply_updates(want, u)
  for a, b in zip(jax.tree.leaves(st.params), jax.tree.leaves(want)):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
  assert bool(jnp.all(st.w == 1))


def test_adaptive_lambda_closed_form():
  inner = jnp.asarray([-2.0, -0.001, 1.0, -4.0])
  xn = jnp.asarray([1.0, 1.0, 1.0, 2.0])
  dn = jnp.asarray([3.0, 1.0, 1.0, 1.0])
  lam = oto.adaptive_lambda(inner, xn, dn, 0.1, 2.0, 10.0)
  # group 0: ℓ = 2, 2ℓ = 4 clipped to 1.0 (< υ = 4.5); group 1: ℓ = 0.001, 2ℓ clipped up to λ;
  # group 2: ⟨x, d⟩ ≥ 0 keeps λ; group 3: ℓ = 2, υ = 1·2/4 = 0.5 <= clip(4) = 1 → (2 + 0.5)/2
  np.testing.assert_allclose(lam, [1.0, 0.1, 0.1, 1.25], rtol=1e-6)


def test_partition_takes_the_k_top_scored_groups_and_training_zeroes_them(digits):
  """At the partition step the K = ⌊G·(target + tolerance)⌋ highest scores are penalised; the
  projection then zeroes penalised groups exactly — never more than the cap, never an
  unpenalised one — and zero groups stay zero."""
  x, y = digits
  cfg = oto.DHSPGConfig(target=0.3, tolerance=0.05, lam=2.0, partition_step=2)
  model, zigs, opt, algo = _setup(cfg, lr=0.1)
  params = model.init(jax.random.key(0))
  st = algo.init(jax.random.key(1), params)
  step = jax.jit(algo.target_step)
  batches = _batches(x, y, 8)
  for xb, yb in batches[:2]:
    st, _ = step(st, xb, yb)
  # the score at the partition step, recomputed from its definition
  xb, yb = batches[2]
  g = jax.grad(lambda p: jnp.mean(model.per_example_loss(model.apply(p, xb), yb)))(st.params)
  u, _ = opt.update(g, st.opt_state, st.params)
  d = jax.tree.map(lambda v: -v / 0.1, u)
  xn, dn = Z.group_norms(zigs, st.params), Z.group_norms(zigs, d)
  inner = 0.5 * (Z.group_sq_norms(zigs, jax.tree.map(jnp.add, st.params, d))
                 - Z.group_sq_norms(zigs, st.params) - Z.group_sq_norms(zigs, d))
  sizes = Z.group_sq_norms(zigs, jax.tree.map(jnp.ones_like, st.params))
  scores = np.asarray(oto.partition_scores(xn, inner, dn, sizes))
  k = int(zigs.num_groups * 0.35)
  st, _ = step(st, xb, yb)
  penal = np.asarray(st.w) == 0
  assert penal.sum() == k and set(np.flatnonzero(penal)) == set(np.argsort(-scores)[:k])
  zero_before = np.zeros(zigs.num_groups, bool)
  for _ in range(32):
    for xb, yb in batches:
      st, info = step(st, xb, yb)
      zero = np.asarray(Z.group_norms(zigs, st.params)) == 0
      assert np.all(zero >= zero_before) and not np.any(zero & ~penal)
      assert zero.mean() <= 0.35 + 1e-6
      zero_before = zero
  assert zero_before.mean() >= 0.3 and float(info.zero_groups) == pytest.approx(
      zero_before.mean())


def test_bad_config_is_refused_by_name():
  with pytest.raises(ValueError, match="target"):
    oto.DHSPGConfig(target=1.0).validate()
  with pytest.raises(ValueError, match="partition_step"):
    oto.DHSPGConfig(partition_step=-1).validate()
