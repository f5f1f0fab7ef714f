"""Sparse masks (seed 002 §3, App. A): ERK densities against the spec's oracles, exact
counts, prune/regrow's ordering invariants and constant counts with a traced fraction, the
drop schedules, diagnostics and bit packing."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjaxsparse as fjs

S = jax.ShapeDtypeStruct
F = jnp.float32


def lenet5_caffe(classes=26):
  return {"conv1": {"kernel": S((5, 5, 1, 20), F), "bias": S((20,), F)},
          "conv2": {"kernel": S((5, 5, 20, 50), F), "bias": S((50,), F)},
          "fc1": {"kernel": S((800, 500), F), "bias": S((500,), F)},
          "fc2": {"kernel": S((500, classes), F), "bias": S((classes,), F)}}


def vgg11():
  ch = [3, 64, 128, 256, 256, 512, 512, 512, 512]
  tree = {f"conv{i + 1}": {"kernel": S((3, 3, ch[i], ch[i + 1]), F), "gn_scale": S((ch[i + 1],), F)}
          for i in range(8)}
  tree["fc"] = {"kernel": S((512, 10), F), "bias": S((10,), F)}
  return tree


def test_erk_densities_equal_the_spec_oracles():
  """spec seed002 §3.1: LeNet5-Caffe at s = 0.5: conv1 1.0, conv2 ≈ 0.477, fc1 ≈ 0.485,
  fc2 1.0; VGG11 conv1-3 1.0, conv4 ≈ 0.849, conv5 ≈ 0.634, conv6-8 ≈ 0.422, fc 1.0; the
  budget (1 − s)·Σ|P_l| over the kernels is met; 1-D leaves stay dense."""
  d = fjs.masks.layer_densities(lenet5_caffe(), 0.5)
  got = [d["conv1"]["kernel"], d["conv2"]["kernel"], d["fc1"]["kernel"], d["fc2"]["kernel"]]
  np.testing.assert_allclose(got, [1.0, 0.477, 0.485, 1.0], atol=1e-3)
  assert d["fc1"]["bias"] == 1.0
  v = fjs.masks.layer_densities(vgg11(), 0.5)
  np.testing.assert_allclose([v[f"conv{i}"]["kernel"] for i in range(1, 9)] + [v["fc"]["kernel"]],
                             [1, 1, 1, 0.849, 0.634, 0.422, 0.422, 0.422, 1], atol=1e-3)
  for tree, dens in ((lenet5_caffe(), d), (vgg11(), v)):
    sizes = [math.prod(a.shape) for a in jax.tree.leaves(tree)]
    kept = [dn * n for dn, n, a in zip(jax.tree.leaves(dens), sizes, jax.tree.leaves(tree))
            if len(a.shape) >= 2]
    total = [n for n, a in zip(sizes, jax.tree.leaves(tree)) if len(a.shape) >= 2]
    assert sum(kept) == pytest.approx(0.5 * sum(total))
  u = fjs.masks.layer_densities(vgg11(), 0.3, "uniform")
  assert all(x == pytest.approx(0.7) for x in (u["conv1"]["kernel"], u["fc"]["kernel"]))
  with pytest.raises(ValueError, match="sparsity"):
    fjs.masks.layer_densities(vgg11(), 1.0)


def _tree(seed, shapes):
  """Standard normal float32 leaves ``l0, l1, ...`` of ``shapes`` (drawn in NumPy)."""
  rng = np.random.default_rng(seed)
  return {f"l{i}": jax.device_put(rng.standard_normal(s).astype(np.float32))
          for i, s in enumerate(shapes)}


def test_random_masks_have_exact_counts_and_shared_or_own_supports():
  params = _tree(0, [(30, 20), (20,), (3, 3, 4, 8)])
  counts = fjs.masks.layer_counts(params, fjs.masks.layer_densities(params, 0.7))
  m = fjs.masks.random_masks(jax.random.key(1), params, counts)
  for leaf, c in zip(jax.tree.leaves(m), jax.tree.leaves(counts)):
    assert int(np.asarray(leaf).sum()) == c
  assert bool(np.asarray(m["l1"]).all())
  many = jax.jit(jax.vmap(lambda k: fjs.masks.random_masks(k, params, counts)))(
      jax.random.split(jax.random.key(2), 5))
  assert [int(x) for x in np.asarray(many["l0"]).reshape(5, -1).sum(1)] == [counts["l0"]] * 5
  dist = np.asarray(fjs.masks.pairwise_hamming(many))
  assert np.all(np.diag(dist) == 0) and np.all(dist[~np.eye(5, dtype=bool)] > 0)
  np.testing.assert_array_equal(dist, dist.T)
  assert int(dist[0, 1]) == int(fjs.masks.hamming(jax.tree.map(lambda a: np.asarray(a)[0], many),
                                                  jax.tree.map(lambda a: np.asarray(a)[1], many)))


@pytest.mark.parametrize("regrowth", ["gradient", "random"])
def test_prune_regrow_keeps_counts_and_orders_by_magnitude_and_gradient(regrowth):
  """Per layer: exactly n_l active after the update, c = ⌈α n_l⌉ pruned and regrown (α
  traced), every pruned |w| ≤ every surviving |w|, every regrown |g| ≥ every inactive
  non-regrown |g| (gradient regrowth)."""
  params = _tree(0, [(40, 30), (30,), (3, 3, 6, 10)])
  grads = _tree(1, [(40, 30), (30,), (3, 3, 6, 10)])
  counts = fjs.masks.layer_counts(params, fjs.masks.layer_densities(params, 0.6))
  m = fjs.masks.random_masks(jax.random.key(2), params, counts)
  w = jax.tree.map(lambda a, k: jax.device_put(np.where(np.asarray(k), np.asarray(a), 0)),
                   params, m)
  f = jax.jit(lambda m, w, g, a: fjs.masks.prune_regrow(m, w, g, a, counts, max_fraction=0.5,
                                                        regrowth=regrowth, key=jax.random.key(3),
                                                        regrow_pruned=False))
  for alpha in (0.5, 0.3, 0.0):
    new = f(m, w, grads, jnp.float32(alpha))
    for name in ("l0", "l2"):
      old_m, new_m = np.asarray(m[name]).ravel(), np.asarray(new[name]).ravel()
      a, g = np.abs(np.asarray(w[name])).ravel(), np.abs(np.asarray(grads[name])).ravel()
      c = math.ceil(alpha * counts[name] - 1e-6)
      assert new_m.sum() == counts[name]
      pruned, grown = old_m & ~new_m, new_m & ~old_m
      assert pruned.sum() == grown.sum() == c
      if c:
        assert a[pruned].max() <= a[old_m & new_m].min()
        if regrowth == "gradient":
          assert g[grown].min() >= g[~old_m & ~new_m].max()
    np.testing.assert_array_equal(new["l1"], m["l1"])
  assert int(fjs.masks.hamming(m, f(m, w, grads, jnp.float32(0.0)))) == 0


def test_drop_schedules():
  t = np.arange(11, dtype=np.int32)
  schedules = jax.jit(lambda t: (   # one program
      fjs.masks.cosine_drop(t, 0.5, 11), fjs.masks.cosine_drop(0, 0.5, 1),
      fjs.masks.linear_drop(t, 0.5, 11), fjs.masks.constant_drop(t, 0.2, 11)))
  a, single, linear, constant = (np.asarray(v) for v in schedules(t))
  assert a[0] == pytest.approx(0.5) and a[-1] == pytest.approx(0.0, abs=1e-7)
  assert a[5] == pytest.approx(0.25) and np.all(np.diff(a) <= 0)
  assert float(single) == pytest.approx(0.5)
  np.testing.assert_allclose(linear, 0.5 * (1 - t / 10), atol=1e-7)
  np.testing.assert_allclose(constant, 0.2)
  with pytest.raises(ValueError, match="alpha0"):
    fjs.masks.cosine_drop(0, 1.5, 10)


def test_diagnostics_and_bit_packing():
  params = _tree(0, [(13, 7), (5,)])
  counts = fjs.masks.layer_counts(params, fjs.masks.layer_densities(params, 0.5))
  many = jax.jit(jax.vmap(lambda k: fjs.masks.random_masks(k, params, counts)))(
      jax.random.split(jax.random.key(1), 4))
  union = np.asarray(many["l0"]).any(0).sum() + 5
  assert float(fjs.masks.coverage(many)) == pytest.approx(union / (13 * 7 + 5))
  one = jax.tree.map(lambda a: np.asarray(a)[0], many)
  assert float(fjs.masks.overlap(one, one)) == 1.0
  packed = jax.jit(jax.vmap(fjs.masks.pack))(many)
  assert packed["l0"].shape == (4, math.ceil(91 / 8)) and packed["l0"].dtype == jnp.uint8
  back = jax.jit(jax.vmap(lambda p: fjs.masks.unpack(p, params)))(packed)
  for x, y in zip(jax.tree.leaves(back), jax.tree.leaves(many)):
    np.testing.assert_array_equal(x, y)
  dens = fjs.masks.density_per_layer(one)
  assert float(dens["l0"]) == pytest.approx(counts["l0"] / 91)


def test_prune_regrow_selection_is_the_stable_top_k():
  """The masks' top-``count`` selection (a bisection on the scores' 32-bit order, linear work)
  is exactly the set ``lax.top_k`` returns with ties to the lower index — on scores with many
  ties, −inf exclusions, signed zeros and infinities, for every count up to the static bound."""
  from fedjaxsparse.ops.masks import _select
  rng = np.random.default_rng(0)
  n, bound, trials = 200, 120, 64
  kinds = [rng.normal(size=(trials, n)), rng.integers(-3, 3, (trials, n)).astype(float),
           np.where(rng.random((trials, n)) < 0.5, -np.inf, rng.normal(size=(trials, n))),
           rng.choice([0.0, -0.0, np.inf, -np.inf, 1.0], (trials, n))]
  scores = jnp.asarray(np.concatenate(kinds).astype(np.float32))
  counts = jnp.asarray(rng.integers(0, bound + 1, len(scores)), jnp.int32)

  def stable_top_k(s, c):
    idx = jax.lax.top_k(s, bound)[1]
    return jnp.zeros(n, bool).at[idx].max(jnp.arange(bound) < c)

  got = jax.jit(jax.vmap(lambda s, c: _select(s, c, bound)))(scores, counts)
  want = jax.jit(jax.vmap(stable_top_k))(scores, counts)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  np.testing.assert_array_equal(np.asarray(got).sum(1), np.asarray(counts))
