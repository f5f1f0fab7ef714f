"""Top-K and thresholds: exact K, the K largest magnitudes, tie-breaking, idempotence, the
soft-threshold prox optimality condition, per-leaf scope, jit and vmap."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fedjaxsparse import sparsity
from fedjaxsparse.accounting import nnz


def _tree(rng, shapes):
  return {f"l{i}": jnp.asarray(rng.normal(size=s), jnp.float32) for i, s in enumerate(shapes)}


@settings(max_examples=25, deadline=None)
@given(shapes=st.lists(st.lists(st.integers(1, 5), min_size=1, max_size=3), min_size=1,
                       max_size=3),
       frac=st.floats(0.0, 1.0), seed=st.integers(0, 1000))
def test_global_top_k_keeps_exactly_the_k_largest(shapes, frac, seed):
  tree = _tree(np.random.default_rng(seed), [tuple(s) for s in shapes])
  flat = np.concatenate([np.asarray(v).ravel() for v in jax.tree.leaves(tree)])
  k = int(round(frac * flat.size))
  mask = sparsity.top_k_mask(tree, k)
  flat_mask = np.concatenate([np.asarray(v).ravel() for v in jax.tree.leaves(mask)])
  assert flat_mask.sum() == k
  kept = np.abs(flat[flat_mask > 0])
  dropped = np.abs(flat[flat_mask == 0])
  if kept.size and dropped.size:
    assert kept.min() >= dropped.max()
  out = sparsity.top_k(tree, k)
  assert int(nnz(out)) == k  # normal draws have no zeros
  again = sparsity.top_k(out, k)
  for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(again)):
    np.testing.assert_array_equal(a, b)  # idempotent


def test_ties_keep_exactly_k_with_lower_indices_first():
  x = {"a": jnp.ones(6), "b": jnp.ones(4)}
  m = sparsity.top_k_mask(x, 3)
  np.testing.assert_array_equal(m["a"], [1, 1, 1, 0, 0, 0])
  np.testing.assert_array_equal(m["b"], [0, 0, 0, 0])
  # A vector with fewer than K non-zeros: nnz stays below K.
  z = sparsity.top_k({"a": jnp.array([0.0, 2.0, 0.0, -1.0])}, 3)
  assert int(nnz(z)) == 2


def test_per_leaf_scope_keeps_the_fraction_in_every_leaf():
  rng = np.random.default_rng(0)
  tree = _tree(rng, [(10,), (4, 5), (3,)])
  m = sparsity.top_k_mask(tree, sparsity=0.7, scope="per_leaf")
  assert [int(v.sum()) for v in jax.tree.leaves(m)] == [3, 6, 1]
  for leaf, mk in zip(jax.tree.leaves(tree), jax.tree.leaves(m)):
    a = np.abs(np.asarray(leaf)).ravel()
    np.testing.assert_array_equal(np.sort(np.flatnonzero(np.asarray(mk).ravel())),
                                  np.sort(np.argsort(-a, kind="stable")[:int(mk.sum())]))


def test_k_from_sparsity_rule_and_errors():
  assert sparsity.k_from_sparsity(281, 0.9) == 28
  assert sparsity.k_from_sparsity(10, 0.99) == 1
  with pytest.raises(ValueError, match="sparsity"):
    sparsity.k_from_sparsity(10, 1.0)
  with pytest.raises(ValueError, match="k must be"):
    sparsity.top_k({"a": jnp.ones(3)}, 4)
  with pytest.raises(ValueError, match="per_leaf"):
    sparsity.top_k({"a": jnp.ones(3)}, 2, scope="per_leaf")
  with pytest.raises(ValueError, match="threshold"):
    sparsity.hard_threshold({"a": jnp.ones(3)}, -1.0)


def test_soft_threshold_is_the_l1_prox():
  """prox_{t|.|}(v) = argmin_x ½(x − v)² + t|x|: compare with a brute-force grid search."""
  v = np.array([-2.0, -0.3, 0.0, 0.2, 0.9, 3.0])
  t = 0.5
  got = np.asarray(sparsity.soft_threshold({"v": jnp.asarray(v)}, t)["v"])
  grid = np.linspace(-4, 4, 80001)
  brute = [grid[np.argmin(0.5 * (grid - vi) ** 2 + t * np.abs(grid))] for vi in v]
  np.testing.assert_allclose(got, brute, atol=1e-4)


def test_hard_threshold_and_density():
  x = {"a": jnp.array([0.1, -0.5, 2.0, 0.0])}
  np.testing.assert_array_equal(sparsity.hard_threshold(x, 0.3)["a"], [0, -0.5, 2.0, 0])
  np.testing.assert_allclose(sparsity.density(x), 0.75)


def test_random_mask_has_exactly_k_and_a_uniform_support():
  tree = {"a": jnp.zeros(8)}
  keys = jax.random.split(jax.random.key(0), 4000)
  masks = jax.vmap(lambda k: sparsity.random_mask(k, tree, 3)["a"])(keys)
  np.testing.assert_array_equal(masks.sum(1), 3)
  freq = np.asarray(masks.mean(0))
  p = 3 / 8
  se = np.sqrt(p * (1 - p) / 4000)
  np.testing.assert_array_less(np.abs(freq - p), 5 * se)


def test_top_k_under_jit_and_client_vmap():
  x = jax.random.normal(jax.random.key(0), (5, 50))  # 5 clients
  out = jax.jit(jax.vmap(lambda v: sparsity.top_k({"w": v}, 7)["w"]))(x)
  np.testing.assert_array_equal(np.count_nonzero(np.asarray(out), axis=1), 7)
  for i in range(5):
    expected = np.argsort(-np.abs(np.asarray(x[i])), kind="stable")[:7]
    np.testing.assert_array_equal(np.sort(np.flatnonzero(np.asarray(out[i]))),
                                  np.sort(expected))
