"""Streaming calibration statistics of one linear layer's inputs: ``Σ_t x_tj²``, ``Σ_t x_tj`` and
the token count, accumulated batch by batch inside ``jit``, giving ``‖X_{:j}‖₂`` (Wanda, RIA, every
score of :mod:`fedjaxsparse.pruning.scores`), and the per-channel mean and variance (DSnoT). A
uniform rescaling of ``‖X‖`` (e.g. Wanda's code divides by the number of samples) changes no ranking
for α > 0.

Source for the team: seed 001, ch. 6, §B.1.1 and §B.3 of spec ``seed001_ch4_ch6.md``.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["CalibStats", "init_stats", "update_stats"]
__dir__ = _public_dir(__all__)


class CalibStats(NamedTuple):
  """``sumsq`` ``float32[b]`` (Σ x²), ``total`` ``float32[b]`` (Σ x), ``count`` (tokens),
  ``m2`` ``float32[b]`` (Σ (x − μ)², merged batch by batch with Chan et al.'s update, so the
  variance does not cancel catastrophically on channels whose mean dwarfs their spread)."""
  sumsq: jax.Array
  total: jax.Array
  count: jax.Array
  m2: jax.Array

  @property
  def x_norm(self) -> jax.Array:
    """``‖X_{:j}‖₂`` [b]."""
    return jnp.sqrt(self.sumsq)

  @property
  def mean(self) -> jax.Array:
    return self.total / jnp.maximum(self.count, 1.0)

  @property
  def variance(self) -> jax.Array:
    """Population variance per channel, ``Σ(x − μ)²/a``."""
    return self.m2 / jnp.maximum(self.count, 1.0)


def init_stats(num_inputs: int) -> CalibStats:
  z = jnp.zeros((num_inputs,), jnp.float32)
  return CalibStats(z, z, jnp.zeros((), jnp.float32), z)


def update_stats(stats: CalibStats, x: jax.Array, mask: jax.Array | None = None) -> CalibStats:
  """Adds the tokens ``x [..., b]`` (``mask [...]``: 1 for real tokens, 0 for padding)."""
  x = x.reshape(-1, x.shape[-1]).astype(jnp.float32)
  m = jnp.ones(x.shape[0], jnp.float32) if mask is None else mask.reshape(-1).astype(jnp.float32)
  n_b = m.sum()
  mean_b = (m @ x) / jnp.maximum(n_b, 1.0)
  m2_b = m @ jnp.square(x - mean_b)
  n = stats.count + n_b
  delta = mean_b - stats.mean
  m2 = stats.m2 + m2_b + delta ** 2 * stats.count * n_b / jnp.maximum(n, 1.0)
  return CalibStats(stats.sumsq + m @ (x * x), stats.total + m @ x, n, m2)
