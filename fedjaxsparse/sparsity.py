"""Sparsification primitives over pytrees, jittable with a static K.

* ``top_k`` / ``top_k_mask``: keep the ``k`` entries of largest magnitude (hard thresholding,
  the prox of the indicator of ``{‖w‖₀ ≤ k}``; seed 000 §3 "TopK"). ``scope="global"`` ranks
  all entries of the pytree together (``w ∈ R^d`` as in the papers); ``scope="per_leaf"``
  keeps the same *fraction* in every leaf (per-layer Top-K, a different operator).
  Exactly ``k`` entries are selected (indices from ``lax.top_k`` and a scatter, never a
  ``|x| ≥ kth-value`` threshold, which keeps more than ``k`` under ties). Ties are broken
  towards the lower flat index (``lax.top_k`` is stable). A selected entry that is zero stays
  zero, so ``nnz(top_k(x, k)) ≤ k``.
* ``hard_threshold`` / ``soft_threshold``: elementwise, by a threshold.
* masks: ``random_mask`` (uniform random support of exactly ``k``), ``apply_mask``,
  ``density``.

XLA:CPU's sort is slow (environment.md §4); everything here uses ``lax.top_k``.
"""
from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

SCOPES = ("global", "per_leaf")


def _size(tree: Any) -> int:
  return sum(int(math.prod(jnp.shape(leaf))) for leaf in jax.tree.leaves(tree))


def k_from_sparsity(num_params: int, sparsity: float) -> int:
  """Entries kept at ``sparsity`` (fraction of zeros): ``max(1, round((1 − s)·d))``."""
  if not 0.0 <= sparsity < 1.0:
    raise ValueError(f"sparsity must be in [0, 1), got {sparsity}.")
  if num_params < 1:
    raise ValueError(f"num_params must be >= 1, got {num_params}.")
  return max(1, int(round((1.0 - sparsity) * num_params)))


def _mask_flat(scores: jax.Array, k: int) -> jax.Array:
  """A {0,1} vector with ones at the ``k`` largest ``scores`` (ties: lower index first)."""
  _, idx = jax.lax.top_k(scores, k)
  return jnp.zeros(scores.shape, scores.dtype).at[idx].set(1)


def top_k_mask(tree: Any, k: int | None = None, *, sparsity: float | None = None,
               scope: str = "global") -> Any:
  """A {0,1} mask pytree (dtype of ``tree``) selecting the largest-magnitude entries.

  Args:
    tree: a pytree of arrays.
    k: entries kept in total (``scope="global"``); static.
    sparsity: fraction of zeros instead of ``k``; required for ``scope="per_leaf"``, where
      each leaf keeps ``k_from_sparsity(leaf.size, sparsity)`` entries.
    scope: ``"global"`` or ``"per_leaf"``.
  """
  if scope not in SCOPES:
    raise ValueError(f"scope must be one of {SCOPES}, got {scope!r}.")
  if (k is None) == (sparsity is None):
    raise ValueError("give exactly one of k and sparsity.")
  if scope == "per_leaf":
    if sparsity is None:
      raise ValueError("scope='per_leaf' takes sparsity (a fraction), not k.")
    return jax.tree.map(
        lambda a: _mask_flat(jnp.abs(a).ravel(), k_from_sparsity(a.size, sparsity)
                             ).reshape(a.shape), tree)
  d = _size(tree)
  if k is None:
    k = k_from_sparsity(d, sparsity)
  if not isinstance(k, (int,)) or not 0 <= k <= d:
    raise ValueError(f"k must be an int in [0, {d}] (the number of parameters), got {k!r}.")
  flat, unravel = ravel_pytree(tree)
  return unravel(_mask_flat(jnp.abs(flat), k))


def top_k(tree: Any, k: int | None = None, *, sparsity: float | None = None,
          scope: str = "global") -> Any:
  """``tree ⊙ top_k_mask(tree, ...)``: hard thresholding to the ``k`` largest magnitudes."""
  return apply_mask(tree, top_k_mask(tree, k, sparsity=sparsity, scope=scope))


def apply_mask(tree: Any, mask: Any) -> Any:
  """Elementwise ``tree ⊙ mask``."""
  return jax.tree.map(lambda a, m: a * m.astype(a.dtype), tree, mask)


def hard_threshold(tree: Any, threshold: float) -> Any:
  """Keep entries with ``|x| > threshold``, zero the rest."""
  if not threshold >= 0:
    raise ValueError(f"threshold must be >= 0, got {threshold}.")
  return jax.tree.map(lambda a: jnp.where(jnp.abs(a) > threshold, a, 0), tree)


def soft_threshold(tree: Any, threshold: Any) -> Any:
  """``sign(x)·max(|x| − t, 0)``, the prox of ``t·‖·‖₁`` (``t ≥ 0``, may be traced)."""
  if isinstance(threshold, (int, float)) and not threshold >= 0:
    raise ValueError(f"threshold must be >= 0, got {threshold}.")
  return jax.tree.map(lambda a: jnp.sign(a) * jnp.maximum(jnp.abs(a) - threshold, 0), tree)


def random_mask(key: jax.Array, tree: Any, k: int) -> Any:
  """A {0,1} mask with exactly ``k`` ones at a uniformly random support (rand-k)."""
  d = _size(tree)
  if not isinstance(k, int) or not 0 <= k <= d:
    raise ValueError(f"k must be an int in [0, {d}] (the number of parameters), got {k!r}.")
  flat, unravel = ravel_pytree(tree)
  return unravel(_mask_flat(jax.random.uniform(key, flat.shape, flat.dtype), k))


def density(tree: Any) -> jax.Array:
  """Fraction of non-zero entries, ``float32[]``."""
  nnz = sum(jnp.count_nonzero(a) for a in jax.tree.leaves(tree))
  return nnz / _size(tree)
