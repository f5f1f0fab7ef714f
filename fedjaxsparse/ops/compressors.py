"""Compressors ``C: R^d → R^d`` over pytrees, with their constants exposed.

References:
  Laurent Condat, Kai Yi, Peter Richtárik (2022). EF-BV: A Unified Theory of Error Feedback
    and Variance Reduction Mechanisms for Biased and Unbiased Compression in Distributed
    Optimization. NeurIPS 2022. arXiv:2205.04180.

Every compressor is a :class:`Compressor` NamedTuple: ``compress(key, tree) -> tree`` (pure,
jittable, static shapes), the class constants of the EF-BV paper — relative bias ``eta`` and
relative variance ``omega`` of ``C(η, ω)`` (``‖E C(x) − x‖ ≤ η‖x‖``,
``E‖C(x) − E C(x)‖² ≤ ω‖x‖²``) — and ``bits(d)``, the uplink cost of one message under the
accounting conventions of :mod:`fedjaxsparse.ops.accounting`. Sparsifiers act on the whole
flattened pytree (global, as ``x ∈ R^d`` in the papers). Constants depend on ``d``, so
constructors take ``d``.

Catalogue: identity; rand-k (unbiased, ω = d/k − 1); scaled rand-k (η = 1 − k/d,
ω = (k/d)(1 − k/d)); top-k (η = √(1 − k/d), ω = 0); mix-(k, k′); comp-(k, k′); natural
compression (Horváth et al., 2019, unbiased, ω = 1/8); QSGD random dithering with s levels
(Alistarh et al., 2017, unbiased, ω = min(d/s², √d/s)); scaled sign (Karimireddy et al., 2019,
deterministic, η = √(1 − 1/d) worst case); the 1-bpp update compressors of the FedMRN paper
(Li et al., 2024, arXiv:2408.03220): stochastic sign (SignSGD), TernGrad, DRIVE and EDEN
(randomised Hadamard rotation, :func:`hadamard`), and FedMRN's stochastic noise mask
(:func:`noise_mask`). Combinators: ``scale`` (λC, the EF-BV paper's scaling proposition) and
``omega_ran`` (independent clients, m-nice sampling).

Source for the team: seed 001 §2.2; seed 003; spec ``seed001_ch2.md`` §2.1, ``seed000_003.md`` B.7;
dissertation A.4-A.5 (mix, comp) and Prop 2.2.1 (scaling).
"""
from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from fedjaxsparse.ops import accounting
from fedjaxsparse.ops import noise_masks as M
from fedjaxsparse.errors import ConfigError, check_int
from fedjaxsparse.ops.sparsity import top_k_indices
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["Compressor", "identity", "rand_k", "scaled_rand_k", "top_k", "mix_k", "comp_k",
           "natural", "qsgd", "scaled_sign", "stochastic_sign", "terngrad", "noise_mask",
           "hadamard", "ROTATIONS", "drive", "eden", "scale", "omega_ran"]
__dir__ = _public_dir(__all__)


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


def _subset_bits(k: int, seeded: bool) -> Callable[[int], float]:
  """Bits of k kept values: with their positions (the cheaper of indices and a bitmap), or
  with the seed that regenerates them (``seeded``)."""
  if seeded:
    return lambda n: accounting.dense_bits(k) + accounting.SEED_BITS
  return lambda n: accounting.sparse_bits(k, n)


def rand_k(d: int, k: int, seeded: bool = False) -> Compressor:
  """Keep k uniformly random entries, scaled by d/k: unbiased, ``ω = d/k − 1``.

  ``seeded``: the positions are drawn from a seed the message carries, and the receiver draws
  them again (Konečný et al., 2016, arXiv:1610.05492, "random mask" updates): a message is
  ``32·k`` bits of values plus a ``SEED_BITS`` seed instead of values and positions.

  >>> import jax, jax.numpy as jnp
  >>> c = rand_k(100, 10)
  >>> c.eta, c.omega, c.bits(100)     # 10 values of 32 bits + 10 indices of 7 bits
  (0.0, 9.0, 390)
  >>> x_hat = c.compress(jax.random.key(0), jnp.ones(100))
  >>> int((x_hat != 0).sum()), float(x_hat.max())
  (10, 10.0)
"""
  _check_k(k, d)
  return Compressor(_flat(lambda key, v: _select(v, _random_subset(key, d, k), d / k), d,
                          f"rand-{k}"),
                    0.0, d / k - 1.0, _subset_bits(k, seeded), f"rand-{k}")


def scaled_rand_k(d: int, k: int, seeded: bool = False) -> Compressor:
  """Keep k uniformly random entries unscaled, ``(k/d)·rand-k``: ``η = 1 − k/d``,
  ``ω = (k/d)(1 − k/d)``; ``seeded`` as :func:`rand_k`."""
  _check_k(k, d)
  q = k / d
  return Compressor(_flat(lambda key, v: _select(v, _random_subset(key, d, k)), d,
                          f"scaled-rand-{k}"),
                    1.0 - q, q * (1.0 - q), _subset_bits(k, seeded), f"scaled-rand-{k}")


def top_k(d: int, k: int) -> Compressor:
  """Keep the k largest magnitudes (deterministic): ``η = √(1 − k/d)``, ``ω = 0``."""
  _check_k(k, d)
  return Compressor(_flat(lambda key, v: _select(v, top_k_indices(v, k)), d,
                          f"top-{k}"),
                    math.sqrt(1.0 - k / d), 0.0, lambda n: accounting.sparse_bits(k, n),
                    f"top-{k}")


def mix_k(d: int, k: int, k2: int) -> Compressor:
  """mix-(k, k′) (the EF-BV paper's appendix): top-k entries plus k′ random others, unscaled:
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
  """comp-(k, k′) = rand-k ∘ top-k′ (the EF-BV paper's appendix): k random entries of the top
  k′, scaled by k′/k: ``η = √((d−k′)/d)``, ``ω = (k′−k)/k``."""
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
  """Natural compression (Horváth et al., 2019): each entry rounded at random to one of the two
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
  """QSGD random dithering with ``s = levels`` (Alistarh et al., 2017): ``‖x‖·sign(x_i)·ξ_i/s``
  with ξ_i a stochastic rounding of ``s|x_i|/‖x‖``; unbiased, ``ω = min(d/s², √d/s)``; bits:
  sign + ⌈log2(s+1)⌉ per entry plus the fp32 norm."""
  levels = check_int("levels", levels, 1)

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
  """Scaled sign (Karimireddy et al., 2019): ``(‖x‖₁/d)·sign(x)``, deterministic; contractive
  with ``α = ‖x‖₁²/(d‖x‖²) ≥ 1/d``, so ``η = √(1 − 1/d)`` in the worst case; d + 32 bits."""
  def fn(key, v):
    return jnp.sum(jnp.abs(v)) / d * jnp.sign(v)

  return Compressor(_flat(fn, d, "scaled-sign"), math.sqrt(1.0 - 1.0 / d), 0.0,
                    lambda n: accounting.quantized_bits(n, 1), "scaled-sign")


def stochastic_sign(d: int) -> Compressor:
  """SignSGD as the FedMRN paper runs it, "stochastic binarisation of the update" (the paper
  gives no formula; this unbiased form is an assumption): ``r = ‖x‖_∞``, each entry ``+r`` with
  probability ``(1 + x_i/r)/2``, else ``−r``. ``E = x``; variance ``Σ(r² − x_i²) ≤ (d − 1)‖x‖²``;
  d sign bits + the fp32 r."""
  def fn(key, v):
    r = jnp.max(jnp.abs(v))
    up = jax.random.bernoulli(key, 0.5 * (1 + v / jnp.where(r > 0, r, 1.0)))
    return jnp.where(up, r, -r)

  return Compressor(_flat(fn, d, "signsgd"), 0.0, d - 1.0,
                    lambda n: accounting.quantized_bits(n, 1), "signsgd")


def terngrad(d: int) -> Compressor:
  """TernGrad (Wen et al., 2017): ``s = ‖x‖_∞``, ``s·sign(x_i)·b_i`` with ``b_i ~ Bern(|x_i|/s)``;
  unbiased, variance ``s‖x‖₁ − ‖x‖² ≤ (√d − 1)‖x‖²``; log2(3) ≈ 1.585 bits per entry (the
  paper's count; a ternary digit packing reaches it) + the fp32 s."""
  def fn(key, v):
    s = jnp.max(jnp.abs(v))
    keep = jax.random.bernoulli(key, jnp.abs(v) / jnp.where(s > 0, s, 1.0))
    return jnp.where(keep, s * jnp.sign(v), 0.0)

  return Compressor(_flat(fn, d, "terngrad"), 0.0, math.sqrt(d) - 1.0,
                    lambda n: accounting.quantized_bits(n, math.log2(3)), "terngrad")


def noise_mask(d: int, scale: float, distribution: str = "uniform",
               signed: bool = False) -> Compressor:
  """FedMRN's stochastic noise mask (SM, Li et al., 2024, arXiv:2408.03220) as a compressor
  applied once to a finished update — FedMRN's "FedAvg w. SM" ablation, for any method with an
  ``uplink=``: the client draws seeded noise ``n = G(s)`` (:func:`fedjaxsparse.ops.noise_masks.
  tree_noise`: uniform on [−scale, scale], Gaussian or Bernoulli ±scale) and uploads a 1-bit mask
  ``m = M(u, n)`` (binary {0, 1}, or {−1, +1} with ``signed=True``, FedMRNS) and the seed; the
  server regenerates ``n`` and receives ``n ⊙ m``. Per entry ``E[n·m | n] = clip(u, n)``
  (:func:`fedjaxsparse.ops.noise_masks.sm_moments`): with Bernoulli noise and ``|u| ≤ scale``
  the signed mask is unbiased (``E = u``) and the binary one halves the update (``E = u/2``).
  No class constants hold for every ``u`` (the clip is a bias up to ``‖u‖``, the variance
  ``n² − ū²`` does not shrink with ``u``): ``eta = 1``, ``omega = inf`` (no contraction).
  Bits: ``d + SEED_BITS`` (:func:`fedjaxsparse.ops.accounting.mask_bits`)."""
  if not scale > 0:
    raise ValueError(f"scale must be > 0, got {scale!r}.")
  if distribution not in M.DISTRIBUTIONS:
    raise ValueError(f"distribution must be one of {M.DISTRIBUTIONS}, got {distribution!r}.")
  name = f"noise-mask{'-signed' if signed else ''}({distribution} {scale:g})"

  def compress(key, tree):
    size = sum(a.size for a in jax.tree.leaves(tree))
    if size != d:
      raise ConfigError(f"compressor {name} was built for d={d} entries but was applied to a "
                        f"tree of {size}; build it with d={size} (accounting.num_params(tree)).")
    k_noise, k_mask = jax.random.split(key)
    n = M.tree_noise(k_noise, tree, scale, distribution)
    m = M.tree_map_keyed(lambda k, u, ni: M.stochastic_mask(k, u, ni, signed), k_mask, tree, n)
    return jax.tree.map(jnp.multiply, n, m)

  return Compressor(compress, 1.0, math.inf, lambda n: accounting.mask_bits(n, with_seed=True),
                    name)


def hadamard(v: jax.Array) -> jax.Array:
  """The orthonormal Walsh–Hadamard transform ``H v/√n`` of ``v [n]`` (n a power of two),
  by log2 n butterfly stages: O(n log n); its own inverse."""
  n = v.shape[0]
  if n & (n - 1):
    raise ValueError(f"hadamard needs a power-of-two length, got {n}.")
  h = 1
  while h < n:
    x = v.reshape(-1, 2, h)
    v = jnp.stack([x[:, 0] + x[:, 1], x[:, 0] - x[:, 1]], axis=1).reshape(n)
    h *= 2
  return v / math.sqrt(n)


ROTATIONS = ("hadamard", "uniform")
"""The random rotations of :func:`drive` and :func:`eden`: a randomised Hadamard transform or
a uniformly random orthogonal matrix."""


def _padded(d: int) -> int:
  return 1 << max(0, (d - 1).bit_length())


def _rotation(key: jax.Array, d: int, kind: str):
  """A random rotation from the key shared with the server, ``(R, R⁻¹, its size)``:
  ``"hadamard"``: ``R = H·diag(ξ)``, ξ Rademacher, on ``d`` entries zero-padded to
  ``2^⌈log2 d⌉`` (O(d log d)); ``"uniform"``: a Haar-random orthogonal d × d matrix (QR of a
  Gaussian one, sign-corrected; O(d²): small d, the exact form of the papers' theorems)."""
  if kind == "hadamard":
    dp = _padded(d)
    xi = jax.random.rademacher(key, (dp,), jnp.int8)           # ±1, exact in any dtype
    return (lambda v: hadamard(xi.astype(v.dtype) * jnp.pad(v, (0, dp - d))),
            lambda y: (xi.astype(y.dtype) * hadamard(y))[:d], dp)
  q, r = jnp.linalg.qr(jax.random.normal(key, (d, d)))
  q = q * jnp.sign(jnp.diagonal(r))[None, :]
  return (lambda v: q.T @ v), (lambda y: q @ y), d


def _rotated_sign(d: int, rotation: str, name: str, scale_fn) -> Callable:
  if rotation not in ROTATIONS:
    raise ValueError(f"rotation must be one of {ROTATIONS}, got {rotation!r}.")

  def fn(key, v):
    rot, inv, n = _rotation(key, d, rotation)
    y = rot(v)
    return inv(scale_fn(v, y, n) * jnp.sign(y))

  return _flat(fn, d, name)


def _sign_bits(rotation: str) -> Callable[[int], float]:
  return lambda n: accounting.quantized_bits(_padded(n) if rotation == "hadamard" else n, 1)


def drive(d: int, rotation: str = "hadamard") -> Compressor:
  """DRIVE (Vargaftik et al., 2021), 1 bit per rotated entry: ``x̂ = α R⁻¹ sign(R x)`` with a
  random rotation R (seed shared with the server) and ``α = ‖Rx‖₁/d′`` — the scale minimising
  ``‖x − x̂‖`` (the FedMRN paper's description). Biased: ``‖x − x̂‖² = ‖x‖² − ‖Rx‖₁²/d′ ≤
  (1 − 1/d′)‖x‖²``, so the class bounds are the worst case ``η = √(1 − 1/d′)``,
  ``ω = 1 − 1/d′`` (d′: the padded length for the Hadamard rotation); d′ sign bits + fp32 α."""
  dp = _padded(d) if rotation == "hadamard" else d
  return Compressor(_rotated_sign(d, rotation, "drive",
                                  lambda v, y, n: jnp.sum(jnp.abs(y)) / n),
                    math.sqrt(1 - 1 / dp), 1 - 1 / dp, _sign_bits(rotation), "drive")


def _eden_scale(v, y, n):
  l1 = jnp.sum(jnp.abs(y))
  return jnp.sum(v * v) / jnp.where(l1 > 0, l1, 1.0)


def eden(d: int, rotation: str = "hadamard") -> Compressor:
  """EDEN (Vargaftik et al., 2022) at 1 bit per rotated entry: DRIVE's signs with EDEN's scale
  ``S = ‖x‖²/⟨Rx, sign(Rx)⟩ = ‖x‖²/‖Rx‖₁``, so ``⟨x̂, x⟩ = ‖x‖²`` exactly. With a uniform
  rotation the estimate is unbiased (EDEN's theorem; ``η = 0``, worst case ``ω = d − 1``).
  The randomised Hadamard rotation (the papers' practical choice) makes it only nearly so — no
  bound is established, so ``η`` is NaN there (measure it; ``rotation="uniform"`` for the
  exact form)."""
  dp = _padded(d) if rotation == "hadamard" else d
  return Compressor(_rotated_sign(d, rotation, "eden", _eden_scale),
                    float("nan") if rotation == "hadamard" else 0.0, dp - 1.0,
                    _sign_bits(rotation), "eden")


def scale(c: Compressor, lam: float) -> Compressor:
  """λC (the EF-BV paper's scaling proposition): ``η′ = λη + 1 − λ``, ``ω′ = λ²ω``; same
  message, same bits."""
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
