"""Sparsity primitives: exactly K, the K largest magnitudes with lower-index tie-breaking (both
selection paths, against a NumPy stable argsort), projection and idempotence, per-leaf scope,
the soft-threshold prox, uniform random supports, errors, jit and vmap."""
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import fedjaxsparse as fjs


def _flat(tree):
  return np.concatenate([np.asarray(v).ravel() for v in jax.tree.leaves(tree)])


def _reference_mask(values, k):
  """Ones at the k largest |values|, ties to the lower index (a stable argsort)."""
  mask = np.zeros(values.size)
  mask[np.argsort(-np.abs(values), kind="stable")[:k]] = 1
  return mask


@functools.partial(jax.jit, static_argnums=1)
def _mask_top_k_twice(tree, k):
  out = fjs.sparsity.top_k(tree, k)
  return fjs.sparsity.top_k_mask(tree, k), out, fjs.sparsity.top_k(out, k), fjs.sparsity.nnz(out)


# One compiled program per tree shape and k (or sparsity and scope), not one per operation.
_top_k = jax.jit(fjs.sparsity.top_k, static_argnames=("k", "sparsity", "scope"))
_top_k_mask = jax.jit(fjs.sparsity.top_k_mask, static_argnames=("k", "sparsity", "scope"))


# Sizes up to 300 reach both paths: lax.top_k + scatter for k <= d/50, bisection above.
_shapes = st.lists(st.lists(st.integers(1, 10), min_size=0, max_size=2), min_size=1,
                   max_size=3)


@settings(max_examples=15, deadline=None)
@given(shapes=_shapes, frac=st.floats(0.0, 1.0), small_k=st.booleans(),
       ties=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_global_top_k_equals_the_stable_argsort_reference(shapes, frac, small_k, ties, seed):
  rng = np.random.default_rng(seed)
  shapes = [tuple(s) for s in shapes] + [(rng.integers(1, 200),)]
  draw = (lambda s: rng.integers(-2, 3, s)) if ties else (lambda s: rng.normal(size=s))
  tree = {f"l{i}": jax.device_put(np.asarray(draw(s), np.float32))
          for i, s in enumerate(shapes)}
  flat = _flat(tree)
  k = int(frac * flat.size // 50) if small_k else int(round(frac * flat.size))

  mask, out, again, nnz_out = _mask_top_k_twice(tree, k)
  assert jax.tree.structure(mask) == jax.tree.structure(tree)
  np.testing.assert_array_equal(_flat(mask), _reference_mask(flat, k))
  np.testing.assert_array_equal(_flat(out), flat * _reference_mask(flat, k))
  assert int(nnz_out) == min(k, np.count_nonzero(flat))
  # A projection onto {||w||_0 <= k}: the error is the sum of the d - k smallest squares.
  sq = np.sort(flat.astype(np.float64) ** 2)
  np.testing.assert_allclose(np.sum((flat - _flat(out)).astype(np.float64) ** 2),
                             np.sum(sq[:flat.size - k]), rtol=1e-6)
  np.testing.assert_array_equal(_flat(again), _flat(out))  # idempotent


@pytest.mark.parametrize("k", [3, 400])  # lax.top_k path, then bisection path
def test_ties_keep_exactly_k_lower_flat_indices_first(k):
  tree = {"a": np.ones(600, np.float32), "b": -np.ones((2, 100), np.float32)}
  mask = _top_k_mask(tree, k)
  np.testing.assert_array_equal(_flat(mask), np.arange(800) < k)
  # NaN ranks above every number, zeros below; a selected zero stays zero.
  x = np.zeros(800, np.float32)
  x[700], x[5] = np.nan, 1.0
  got = np.asarray(_top_k_mask({"x": x}, k)["x"])
  assert got.sum() == k and got[700] == 1 and got[5] == 1
  x = x.copy()
  x[700] = 2.0
  assert int(jax.jit(fjs.sparsity.nnz)(_top_k({"x": x}, k))) == 2


def test_per_leaf_scope_keeps_the_fraction_in_every_leaf():
  rng = np.random.default_rng(0)
  tree = {"a": rng.normal(size=10), "b": rng.normal(size=(4, 5)), "c": rng.normal(size=3),
          "e": np.zeros((0,))}
  tree = jax.device_put(tree)   # float32 (x64 off)
  mask = jax.tree.map(np.asarray, _top_k_mask(tree, sparsity=0.7, scope="per_leaf"))
  assert {n: int(v.sum()) for n, v in mask.items()} == {"a": 3, "b": 6, "c": 1, "e": 0}
  for name in "abc":
    np.testing.assert_array_equal(mask[name].ravel(),
                                  _reference_mask(np.asarray(tree[name]).ravel(),
                                                  int(mask[name].sum())))
  out = _top_k(tree, sparsity=0.7, scope="per_leaf")
  assert int(jax.jit(fjs.sparsity.nnz)(out)) == 10


def test_k_from_sparsity_rounding_rule():
  assert fjs.sparsity.k_from_sparsity(281, 0.9) == 28  # 28.1
  assert fjs.sparsity.k_from_sparsity(1000, 0.9) == 100  # (1 - 0.9)·1000 = 99.99999999999997
  assert fjs.sparsity.k_from_sparsity(10, 0.99) == 1  # at least one entry
  assert fjs.sparsity.k_from_sparsity(7, 0.0) == 7
  assert fjs.sparsity.k_from_sparsity(11_173_962, 0.9) == 1_117_396


def test_errors_at_the_boundary():
  tree = {"a": jnp.ones(3)}
  for bad in (1.0, -0.1, float("nan")):
    with pytest.raises(ValueError, match="sparsity"):
      fjs.sparsity.k_from_sparsity(10, bad)
  with pytest.raises(ValueError, match=r"k must be in \[0, 3\]"):
    fjs.sparsity.top_k(tree, 4)
  with pytest.raises(ValueError, match="k must be"):
    fjs.sparsity.top_k(tree, -1)
  with pytest.raises(ValueError, match="static int"):
    fjs.sparsity.top_k(tree, 1.5)
  with pytest.raises(ValueError, match="k must be"):
    fjs.sparsity.random_mask(jax.random.key(0), tree, 4)
  with pytest.raises(ValueError, match="exactly one"):
    fjs.sparsity.top_k(tree, 1, sparsity=0.5)
  with pytest.raises(ValueError, match="per_leaf"):
    fjs.sparsity.top_k(tree, 2, scope="per_leaf")
  with pytest.raises(ValueError, match="sparsity"):
    fjs.sparsity.top_k(tree, sparsity=1.0, scope="per_leaf")
  with pytest.raises(ValueError, match="scope"):
    fjs.sparsity.top_k(tree, 1, scope="layer")
  with pytest.raises(ValueError, match="threshold"):
    fjs.sparsity.hard_threshold(tree, -1.0)
  with pytest.raises(ValueError, match="threshold"):
    fjs.sparsity.soft_threshold(tree, -0.5)


def test_soft_threshold_is_the_l1_prox():
  """prox_{t|.|}(v) = argmin_x ½(x − v)² + t|x|: a brute-force grid search, and the optimality
  condition v − x ∈ t·∂|x|."""
  v = np.array([-2.0, -0.5, -0.3, 0.0, 0.2, 0.5, 0.9, 3.0])
  t = 0.5
  x = np.asarray(jax.jit(fjs.sparsity.soft_threshold, static_argnums=1)(
      {"v": v.astype(np.float32)}, t)["v"])
  grid = np.linspace(-4, 4, 80001)
  brute = [grid[np.argmin(0.5 * (grid - vi) ** 2 + t * np.abs(grid))] for vi in v]
  np.testing.assert_allclose(x, brute, atol=1e-4)
  nz = x != 0
  np.testing.assert_allclose((v - x)[nz], t * np.sign(x[nz]), atol=1e-6)
  assert np.all(np.abs(v[~nz]) <= t)
  # A traced threshold works under jit.
  got = jax.jit(fjs.sparsity.soft_threshold)({"v": jax.device_put(v)}, jnp.float32(t))["v"]
  np.testing.assert_allclose(got, x)


def test_hard_threshold_is_strict():
  x = {"a": jnp.array([0.1, -0.5, 2.0, 0.0, 0.3, -0.3])}
  at_03, at_0 = jax.jit(lambda x: (fjs.sparsity.hard_threshold(x, 0.3),
                                   fjs.sparsity.hard_threshold(x, 0.0)))(x)
  np.testing.assert_array_equal(at_03["a"], [0, -0.5, 2.0, 0, 0, 0])
  np.testing.assert_array_equal(at_0["a"], x["a"])
  got = jax.jit(fjs.sparsity.hard_threshold)(x, jnp.float32(0.3))["a"]
  np.testing.assert_array_equal(got, [0, -0.5, 2.0, 0, 0, 0])


def test_mask_utilities_and_counts():
  a = {"m": jnp.array([1.0, 0.0, 1.0, 0.0])}
  b = {"m": jnp.array([1.0, 1.0, 0.0, 0.0])}
  x = {"m": jnp.array([jnp.inf, 2.0, -3.0, jnp.nan])}
  union, both, applied = jax.jit(lambda a, b, x: (
      fjs.sparsity.mask_union(a, b), fjs.sparsity.mask_intersection(a, b),
      fjs.sparsity.apply_mask(x, a)))(a, b, x)
  np.testing.assert_array_equal(union["m"], [1, 1, 1, 0])
  np.testing.assert_array_equal(both["m"], [1, 0, 0, 0])
  np.testing.assert_array_equal(applied["m"], [jnp.inf, 0, -3.0, 0])
  tree = {"w": jnp.array([[0.0, 1.0], [2.0, 0.0]]), "b": jnp.zeros(4)}
  assert fjs.sparsity.num_params(tree) == 8
  assert int(jax.jit(fjs.sparsity.nnz)(tree)) == 2
  np.testing.assert_allclose(jax.jit(fjs.sparsity.density)(tree), 0.25)


def test_flat_index_primitives():
  x = jnp.array([0.5, -3.0, 2.0, -2.0, 0.0])
  np.testing.assert_array_equal(fjs.sparsity.top_k_indices(x, 3), [1, 2, 3])
  idx = np.asarray(fjs.sparsity.random_indices(jax.random.key(0), 1000, 100))
  assert len(set(idx.tolist())) == 100 and idx.min() >= 0 and idx.max() < 1000


def test_random_mask_is_a_uniform_k_subset():
  """Exactly k ones; with d = 5, k = 2 (bisection path) each of the 10 supports has
  probability 1/10 (chi-square bound); with d = 200, k = 2 (lax.top_k path) every entry has
  marginal k/d (5 standard errors)."""
  n = 4000
  keys = jax.random.split(jax.random.key(0), n)
  masks = np.asarray(jax.jit(jax.vmap(
      lambda key: fjs.sparsity.random_mask(key, {"a": jnp.zeros(5)}, 2)["a"]))(keys))
  np.testing.assert_array_equal(masks.sum(1), 2)
  supports = {s: 0 for s in itertools.combinations(range(5), 2)}
  for row in masks:
    supports[tuple(np.flatnonzero(row))] += 1
  counts = np.array(list(supports.values()))
  chi2 = np.sum((counts - n / 10) ** 2 / (n / 10))
  assert chi2 < 27.9  # the 0.999 quantile of chi-square with 9 degrees of freedom

  tree = {"a": np.zeros((10, 10), np.float32), "b": np.zeros(100, np.float32)}
  masks = jax.jit(jax.vmap(lambda key: fjs.sparsity.random_mask(key, tree, 2)))(keys)
  flat = np.concatenate([np.asarray(masks["a"]).reshape(n, -1), np.asarray(masks["b"])], 1)
  np.testing.assert_array_equal(flat.sum(1), 2)
  p = 2 / 200
  np.testing.assert_array_less(np.abs(flat.mean(0) - p), 5 * np.sqrt(p * (1 - p) / n))

  per_leaf = jax.jit(lambda key: fjs.sparsity.random_mask(key, tree, sparsity=0.9,
                                                          scope="per_leaf"))(keys[0])
  assert [int(np.asarray(v).sum()) for v in jax.tree.leaves(per_leaf)] == [10, 10]


@pytest.mark.parametrize("k", [2, 70])  # lax.top_k path, then bisection path
def test_top_k_under_jit_and_client_vmap_equals_a_loop(k):
  x = np.asarray(jax.random.normal(jax.random.key(0), (5, 100)))  # 5 clients
  tree = {"w": x[:, :60].reshape(5, 6, 10), "b": x[:, 60:]}
  out = jax.tree.map(np.asarray, jax.jit(jax.vmap(lambda t: fjs.sparsity.top_k(t, k)))(tree))
  for i in range(5):
    client = jax.tree.map(lambda a: a[i], tree)
    expected = _top_k(client, k)
    for got, want in zip(jax.tree.leaves(out), jax.tree.leaves(expected)):
      np.testing.assert_array_equal(got[i], want)
    np.testing.assert_array_equal(
        _flat(jax.tree.map(lambda a: a[i], out)) != 0, _reference_mask(_flat(client), k))


@pytest.mark.parametrize("k", [3, 900])  # the lax.top_k path and the bisection path
def test_float64_top_k_keeps_the_truly_largest(k):
  """Entries that differ only below float32 resolution are ranked by their float64 values,
  in sparsity.top_k and in the top-k compressor alike (one implementation)."""
  with jax.enable_x64(True):
    rng = np.random.default_rng(0)
    base = 1.0 + rng.permutation(1000) * 1e-12  # distinct in float64, equal in float32
    assert len(np.unique(base.astype(np.float32))) == 1
    x = jax.device_put(base * np.where(rng.random(1000) < 0.5, -1, 1))
    expected = np.sort(np.argsort(-np.abs(base), kind="stable")[:k])
    compressor = fjs.compressors.top_k(1000, k)
    top, compressed = jax.jit(lambda x: (fjs.sparsity.top_k(x, k),
                                         compressor.compress(None, x)))(x)
    got = np.flatnonzero(np.asarray(top))
    np.testing.assert_array_equal(got, expected)
    comp = np.flatnonzero(np.asarray(compressed))
    np.testing.assert_array_equal(comp, expected)


def test_gmp_sparsity_is_zhu_and_gupta_cubic_ramp():
  """s_i before t0, s_f from t1 on, s_f + (s_i − s_f)/8 halfway, non-decreasing, and held
  constant between updates every Δ steps."""
  ramp = jax.jit(fjs.sparsity.gmp_sparsity,
                 static_argnames=("final", "begin", "end", "initial", "every"))
  f = lambda t, **kw: float(ramp(t, final=0.9, begin=10, end=30, initial=0.1, **kw))
  assert f(0) == pytest.approx(0.1) and f(10) == pytest.approx(0.1)
  assert f(30) == pytest.approx(0.9) and f(99) == pytest.approx(0.9)
  assert f(20) == pytest.approx(0.9 - 0.8 / 8)
  vals = [f(t) for t in range(40)]
  assert all(b >= a for a, b in zip(vals, vals[1:]))
  assert f(21, every=5) == f(24, every=5) == pytest.approx(f(20))
  with pytest.raises(ValueError, match="final"):
    fjs.sparsity.gmp_sparsity(0, 1.0, begin=0, end=1)
  with pytest.raises(ValueError, match="begin"):
    fjs.sparsity.gmp_sparsity(0, 0.5, begin=3, end=3)


@functools.cache
@jax.jit
def _prune_tree():
  return {"a": jax.random.normal(jax.random.key(1), (37, 5)),
          "b": jnp.round(jax.random.normal(jax.random.key(2), (50,)), 1)}  # ties


@pytest.mark.parametrize("s", [0.0, 0.5, 0.97])
def test_magnitude_prune_with_a_traced_sparsity_is_top_k(s):
  tree = _prune_tree()
  k = fjs.sparsity.k_from_sparsity(235, s)
  got = jax.jit(fjs.sparsity.magnitude_prune)(tree, jnp.float32(s))
  for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(_top_k(tree, k))):
    np.testing.assert_array_equal(x, y)


def test_largest_mask_methods_agree_with_ties_and_name_a_bad_method():
  keys = jax.device_put(np.random.default_rng(3).integers(0, 20, 500).astype(np.float32))  # ties
  order = np.argsort(-np.asarray(keys), kind="stable")
  for k in (1, 7, 250, 500):
    want = np.zeros(500, bool)
    want[order[:k]] = True       # the k largest, ties to the lower index
    for method in fjs.sparsity.LARGEST_METHODS:
      np.testing.assert_array_equal(np.asarray(fjs.sparsity.largest_mask(keys, k, method)), want)
  with pytest.raises(ValueError, match="method must be one of"):
    fjs.sparsity.largest_mask(keys, 3, "sort")


def test_one_top_k_convention_a_count_k_or_the_keyword_sparsity():
  """``sparsity.top_k``, its mask and ``proxes.top_k`` read ``k`` as a count of entries kept and
  a fraction of zeros only as ``sparsity=``: the prox is the projection itself at both, and a
  float where the count goes is refused with the keyword to use."""
  from fedjaxsparse.ops import proxes, sparsity
  x = {"w": jnp.arange(-6.0, 6.0).reshape(3, 4), "b": jnp.array([0.5, -7.0])}
  for k, s in ((3, None), (None, 0.5), (14, None), (0, None)):
    want = sparsity.top_k(x, k, sparsity=s)
    got = proxes.top_k(k, sparsity=s)(x, 0.3)
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), got, want))
  kept = sum(int(jnp.count_nonzero(a)) for a in jax.tree.leaves(proxes.top_k(3)(x, 1.0)))
  assert kept == 3
  for bad in (lambda: proxes.top_k(0.9), lambda: sparsity.top_k(x, 0.9)):
    with pytest.raises(ValueError, match="sparsity="):
      bad()
  with pytest.raises(ValueError, match="exactly one"):
    proxes.top_k()
  with pytest.raises(ValueError, match="exactly one"):
    proxes.top_k(3, sparsity=0.5)
