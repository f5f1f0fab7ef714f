"""Compressors ``C: R^d → R^d`` over pytrees, with their constants exposed (seed 001 §2.2).

Every compressor is a :class:`Compressor` NamedTuple: ``compress(key, tree) -> tree`` (pure,
jittable, static shapes), the class constants of seed 001 — relative bias ``eta`` and relative
variance ``omega`` of ``C(η, ω)`` (``‖E C(x) − x‖ ≤ η‖x‖``, ``E‖C(x) − E C(x)‖² ≤ ω‖x‖²``) —
and ``bits(d)``, the uplink cost of one message under the accounting conventions of
:mod:`fedjaxsparse.accounting`. Sparsifiers act on the whole flattened pytree (global, as
``x ∈ R^d`` in the papers). Constants depend on ``d``, so constructors take ``d``.

Catalogue (spec ``seed001_ch2.md`` §2.1): identity; rand-k (unbiased, ω = d/k − 1); scaled
rand-k (η = 1 − k/d, ω = (k/d)(1 − k/d)); top-k (η = √(1 − k/d), ω = 0); mix-(k, k′);
comp-(k, k′); natural compression (Horváth et al. 2019, unbiased, ω = 1/8); QSGD random
dithering with s levels (Alistarh et al. 2017, unbiased, ω = min(d/s², √d/s)); scaled sign
(Karimireddy et al. 2019, deterministic, η = √(1 − 1/d) worst case). Combinators: ``scale``
(λC, Prop 2.2.1) and ``omega_ran`` (independent clients, m-nice sampling).
"""
from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from fedjaxsparse import accounting
from fedjaxsparse.errors import ConfigError
from fedjaxsparse.sparsity import top_k_indices


class Compressor(NamedTuple):
  """Attributes:
    compress: ``(key, tree) -> tree`` one realisation of C.
    eta: relative bias η ∈ [0, 1).
    omega: relative variance ω ≥ 0.
    bits: ``d -> int`` bits of one compressed message of a d-entry vector.
    name: label.
  """
  compress: Callable[[jax.Array, Any], Any]
  eta: float
  omega: float
  bits: Callable[[int], float]
  name: str

  @property
  def unbiased(self) -> bool:
    return self.eta == 0.0

  @property
  def alpha(self) -> float | None:
    """Contraction α with ``1 − α = η² + ω`` when ``η² + ω < 1`` (eq. 2.3), else ``None``."""
    v = self.eta ** 2 + self.omega
    return 1.0 - v if v < 1 else None


def _flat(fn: Callable[[jax.Array, jax.Array], jax.Array], d: int, name: str) -> Callable:
  """Lift ``(key, v[d]) -> v[d]`` to pytrees by flattening; a tree of another size than the
  ``d`` the compressor was built for is an error (its constants and bits are for ``d``)."""
  def compress(key, tree):
    v, unravel = ravel_pytree(tree)
    if v.size != d:
      raise ConfigError(f"compressor {name} was built for d={d} entries but was applied to a "
                        f"tree of {v.size}; build it with d={v.size} "
                        "(accounting.num_params(tree)).")
    return unravel(fn(key, v))
  return compress


def _check_k(k: int, d: int, name: str = "k") -> None:
  if not isinstance(k, int) or not 1 <= k <= d:
    raise ValueError(f"{name} must be an int in [1, d={d}], got {k!r}.")


def _select(v: jax.Array, idx: jax.Array, scale: float = 1.0) -> jax.Array:
  return jnp.zeros_like(v).at[idx].set(scale * v[idx])


def _random_subset(key: jax.Array, d: int, k: int) -> jax.Array:
  return jax.lax.top_k(jax.random.uniform(key, (d,)), k)[1]


def identity(d: int) -> Compressor:
  return Compressor(_flat(lambda key, v: v, d, "identity"), 0.0, 0.0,
                    lambda n: accounting.dense_bits(n), "identity")


def rand_k(d: int, k: int) -> Compressor:
  """Keep k uniformly random entries, scaled by d/k: unbiased, ``ω = d/k − 1``."""
  _check_k(k, d)
  return Compressor(_flat(lambda key, v: _select(v, _random_subset(key, d, k), d / k), d,
                          f"rand-{k}"),
                    0.0, d / k - 1.0, lambda n: accounting.sparse_bits(k, n), f"rand-{k}")


def scaled_rand_k(d: int, k: int) -> Compressor:
  """Keep k uniformly random entries unscaled, ``(k/d)·rand-k``: ``η = 1 − k/d``,
  ``ω = (k/d)(1 − k/d)``."""
  _check_k(k, d)
  q = k / d
  return Compressor(_flat(lambda key, v: _select(v, _random_subset(key, d, k)), d,
                          f"scaled-rand-{k}"),
                    1.0 - q, q * (1.0 - q), lambda n: accounting.sparse_bits(k, n),
                    f"scaled-rand-{k}")


def top_k(d: int, k: int) -> Compressor:
  """Keep the k largest magnitudes (deterministic): ``η = √(1 − k/d)``, ``ω = 0``."""
  _check_k(k, d)
  return Compressor(_flat(lambda key, v: _select(v, top_k_indices(v, k)), d,
                          f"top-{k}"),
                    math.sqrt(1.0 - k / d), 0.0, lambda n: accounting.sparse_bits(k, n),
                    f"top-{k}")


def mix_k(d: int, k: int, k2: int) -> Compressor:
  """mix-(k, k′) (seed 001 A.4): top-k entries plus k′ random others, unscaled:
  ``η = (d−k−k′)/√((d−k)d)``, ``ω = k′(d−k−k′)/((d−k)d)``."""
  _check_k(k, d)
  if not isinstance(k2, int) or not 1 <= k2 <= d - k:
    raise ValueError(f"k2 must be an int in [1, d-k={d - k}], got {k2!r}.")

  def fn(key, v):
    top = top_k_indices(v, k)
    u = jax.random.uniform(key, (d,)).at[top].set(-1.0)
    rest = jax.lax.top_k(u, k2)[1]
    return _select(v, jnp.concatenate([top, rest]))

  return Compressor(_flat(fn, d, f"mix-({k},{k2})"), (d - k - k2) / math.sqrt((d - k) * d),
                    k2 * (d - k - k2) / ((d - k) * d),
                    lambda n: accounting.sparse_bits(k + k2, n), f"mix-({k},{k2})")


def comp_k(d: int, k: int, k2: int) -> Compressor:
  """comp-(k, k′) = rand-k ∘ top-k′ (seed 001 A.5): k random entries of the top k′, scaled
  by k′/k: ``η = √((d−k′)/d)``, ``ω = (k′−k)/k``."""
  _check_k(k2, d, "k2")
  if not isinstance(k, int) or not 1 <= k <= k2:
    raise ValueError(f"k must be an int in [1, k2={k2}], got {k!r}.")

  def fn(key, v):
    top = top_k_indices(v, k2)
    pos = _random_subset(key, k2, k)
    return _select(v, top[pos], k2 / k)

  return Compressor(_flat(fn, d, f"comp-({k},{k2})"), math.sqrt((d - k2) / d), (k2 - k) / k,
                    lambda n: accounting.sparse_bits(k, n), f"comp-({k},{k2})")


def natural(d: int) -> Compressor:
  """Natural compression (Horváth et al. 2019): each entry rounded at random to one of the two
  nearest signed powers of two, unbiased; ``ω = 1/8``; 9 bits per entry (sign + 8-bit
  exponent)."""
  def fn(key, v):
    a = jnp.abs(v)
    low = jnp.exp2(jnp.floor(jnp.log2(jnp.where(a > 0, a, 1.0))))
    prob_up = (a - low) / low
    up = jax.random.uniform(key, v.shape) < prob_up
    return jnp.where(a > 0, jnp.sign(v) * jnp.where(up, 2 * low, low), 0.0)

  return Compressor(_flat(fn, d, "natural"), 0.0, 1.0 / 8.0, lambda n: 9 * n, "natural")


def qsgd(d: int, levels: int) -> Compressor:
  """QSGD random dithering with ``s = levels`` (Alistarh et al. 2017): ``‖x‖·sign(x_i)·ξ_i/s``
  with ξ_i a stochastic rounding of ``s|x_i|/‖x‖``; unbiased, ``ω = min(d/s², √d/s)``; bits:
  sign + ⌈log2(s+1)⌉ per entry plus the fp32 norm."""
  if not isinstance(levels, int) or levels < 1:
    raise ValueError(f"levels must be an int >= 1, got {levels!r}.")

  def fn(key, v):
    norm = jnp.linalg.norm(v)
    scaled = levels * jnp.abs(v) / jnp.where(norm > 0, norm, 1.0)
    low = jnp.floor(scaled)
    xi = low + (jax.random.uniform(key, v.shape) < scaled - low)
    return norm * jnp.sign(v) * xi / levels

  omega = min(d / levels ** 2, math.sqrt(d) / levels)
  bits_per = 1 + math.ceil(math.log2(levels + 1))
  return Compressor(_flat(fn, d, f"qsgd-{levels}"), 0.0, omega,
                    lambda n: accounting.quantized_bits(n, bits_per), f"qsgd-{levels}")


def scaled_sign(d: int) -> Compressor:
  """Scaled sign (Karimireddy et al. 2019): ``(‖x‖₁/d)·sign(x)``, deterministic; contractive
  with ``α = ‖x‖₁²/(d‖x‖²) ≥ 1/d``, so ``η = √(1 − 1/d)`` in the worst case; d + 32 bits."""
  def fn(key, v):
    return jnp.sum(jnp.abs(v)) / d * jnp.sign(v)

  return Compressor(_flat(fn, d, "scaled-sign"), math.sqrt(1.0 - 1.0 / d), 0.0,
                    lambda n: accounting.quantized_bits(n, 1), "scaled-sign")


def scale(c: Compressor, lam: float) -> Compressor:
  """λC (Prop 2.2.1): ``η′ = λη + 1 − λ``, ``ω′ = λ²ω``; same message, same bits."""
  if not 0 < lam <= 1:
    raise ValueError(f"lam must be in (0, 1], got {lam}.")
  return Compressor(lambda key, tree: jax.tree.map(lambda a: lam * a, c.compress(key, tree)),
                    lam * c.eta + 1 - lam, lam ** 2 * c.omega, c.bits, f"{lam:g}·{c.name}")


def omega_ran(omega: float, n: int, sampling: str = "independent", m: int | None = None
              ) -> float:
  """ω_ran of n compressors (eq. 2.4): ``ω/n`` for independent draws; for m-nice client
  sampling (the compressor ``(n/m)·1[i ∈ Ω]``) ``(n−m)/(m(n−1))``."""
  if sampling == "independent":
    return omega / n
  if sampling == "m-nice":
    if m is None or not 1 <= m <= n:
      raise ValueError(f"m must be in [1, n={n}] for m-nice sampling, got {m!r}.")
    return 0.0 if n == 1 else (n - m) / (m * (n - 1))
  raise ValueError(f"sampling must be 'independent' or 'm-nice', got {sampling!r}.")
