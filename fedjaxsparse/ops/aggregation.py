"""Server aggregation over the client axis.

Leaves of a client-stacked pytree have shape ``[C, ...]``; aggregation reduces the leading
axis. Under ``jax.sharding`` with the client axis sharded, these reductions become collectives.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from fedjaxsparse.core import float_dtype
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["WEIGHTINGS", "client_weights", "weighted_mean", "mean"]
__dir__ = _public_dir(__all__)

WEIGHTINGS = ("num_examples", "uniform")
"""Aggregation weights: each client's share of the cohort's examples, or equal weights."""


def client_weights(num_examples: jax.Array, weighting: str,
                   mask: jax.Array | None = None) -> jax.Array:
  """Aggregation weights ``[C]`` summing to 1, in the default float dtype (float64 under
  ``jax_enable_x64``, so float64 runs stay float64-exact).

  Args:
    num_examples: ``int32[C]`` examples held by each client.
    weighting: ``"num_examples"`` (``n_i / Σ n_j``, FedAvg of McMahan et al. 2017) or
      ``"uniform"`` (``1 / C``).
    mask: ``[C]`` 1 for cohort members, 0 for padding (a sampler's padded cohort); padding
      gets weight 0 and the rest is renormalised.
  """
  dtype = float_dtype()
  m = jnp.ones(num_examples.shape, dtype) if mask is None else mask.astype(dtype)
  if weighting == "uniform":
    return m / jnp.sum(m)
  if weighting == "num_examples":
    n = num_examples.astype(dtype) * m
    return n / jnp.sum(n)
  raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}.")


def weighted_mean(tree: Any, weights: jax.Array) -> Any:
  """``Σ_i weights[i] * tree[i]`` over the leading client axis (weights ``[C]`` sum to 1)."""
  return jax.tree.map(lambda a: jnp.tensordot(weights.astype(a.dtype), a, axes=1), tree)


def mean(tree: Any) -> Any:
  """Uniform mean over the leading client axis."""
  return jax.tree.map(lambda a: jnp.mean(a, axis=0), tree)
