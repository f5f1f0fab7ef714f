"""Masked random noise: the pieces that let a client *learn* a 1-bit uplink — a mask ``m`` over
seeded noise ``G(s)`` — during training.

References:
  Shiwei Li, Yingyi Cheng, Haozhao Wang, Xing Tang, Shijie Xu, Weihong Luo, et al. (2024).
    Masked Random Noise for Communication-Efficient Federated Learning. ACM Multimedia 2024.
    arXiv:2408.03220.

Per element, with update ``u`` and noise ``n`` (all functions are elementwise on arrays; the
pytree helpers at the end apply them leaf by leaf with per-leaf keys):

* :func:`noise` — ``G(s)``: uniform on [−α, α] (on a grid of 2²⁴ points, computed exactly),
  Gaussian N(0, α²) (α the standard deviation —
  the paper leaves std vs variance open) or Bernoulli {−α, α}, regenerated bitwise by the server
  from the client's key (:func:`tree_noise`; uniform and Bernoulli noise are exact, the same
  bits anywhere; Gaussian noise is the same bits within compiled code, where client and server
  run — eager op-by-op evaluation of its erfinv can differ in the last bit).
* :func:`deterministic_mask` (DM, the "w/o SM" ablation): binary ``m = 1[sign u = sign n]``;
  signed ``m = sign(u)·sign(n)`` (not written in the paper; so that ``n·m = |n| sign u``).
* :func:`stochastic_mask` (SM's generator M): binary ``m = 1`` w.p. ``clip(u/n, 0, 1)`` (eq. 6);
  signed ``m = +1`` w.p. ``clip((u + n)/(2n), 0, 1)`` (eq. 7, the fraction (u+n)/(2n)); the
  division is guarded (``n = 0`` gives probability 0, binary; ½, signed). Then
  ``E[n·M(u, n)] = clip(u, n) =: ū`` — ``[min(0, n), max(0, n)]`` binary, ``[−|n|, |n|]``
  signed — with variance ``(ū)(n − ū)`` binary and ``n² − ū²`` signed (:func:`sm_moments`).
* :func:`progressive` (PSM, eq. 10): ``û = (1 − P)⊙ū + P⊙n⊙M(u, n)``, ``P ~ Bernoulli(p_τ)``
  with ``p_τ = (τ + 1)/S`` for the 0-based step τ of a client with S local steps (appendix E's
  ``(τ % S + 1)/S``; the last step is fully masked). Each element goes through SM with
  probability p_τ, so ``E‖û − ū‖² = p_τ·E‖n⊙M − ū‖²``: the masking error shrinks by p_τ, *not*
  p_τ² as the paper's eq. (31) has it (Prop. 1's factor ``√(Σ τ²/S³)`` rests on that slip;
  the law that holds is ``(1/S) Σ_τ p_τ = (S + 1)/(2S)``, :func:`pm_error_factor`).
* :func:`straight_through` — STE: the forward value ``û`` with ``∂û/∂u = 1`` (eq. 9: the
  gradient w.r.t. the masked update is applied to u).

``signed=True`` selects FedMRNS's {−1, +1} masks. The identity ``G⊙m_s = 2G⊙m − G`` links them
(a signed mask is a binary one over noise of twice the amplitude).

Source for the team: seed 003, FedMRN §3; spec ``seed000_003.md`` B.1.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["DISTRIBUTIONS", "noise", "clip_to_noise", "mask_probability", "stochastic_mask",
           "deterministic_mask", "sm_moments", "pm_probability", "progressive",
           "straight_through", "prop1_factor", "pm_error_factor", "tree_noise", "tree_map_keyed"]
__dir__ = _public_dir(__all__)

DISTRIBUTIONS = ("uniform", "gaussian", "bernoulli")
"""The noise ``G(s)`` masks are learned over: uniform on [−α, α], Gaussian of std α, or ±α."""


def noise(key: jax.Array, shape, scale: float, distribution: str = "uniform",
          dtype=jnp.float32) -> jax.Array:
  """``G(s)`` of ``shape``: uniform on [−scale, scale], N(0, scale²) or {−scale, +scale}."""
  if distribution == "uniform":  # a grid of 2^24 odd multiples of scale/2^24 from integer
    bits = jax.random.randint(key, shape, 0, 2 ** 24, jnp.int32)  # bits: one exact product,
    return (2 * bits + 1 - 2 ** 24).astype(dtype) * jnp.asarray(scale / 2 ** 24, dtype)  # so
    # the same bits wherever it is computed (no fused multiply-add can change it)
  if distribution == "gaussian":
    return scale * jax.random.normal(key, shape, dtype)
  if distribution == "bernoulli":
    return scale * (2.0 * jax.random.bernoulli(key, 0.5, shape).astype(dtype) - 1.0)
  raise ValueError(f"distribution must be one of {DISTRIBUTIONS}, got {distribution!r}.")


def clip_to_noise(u: jax.Array, n: jax.Array, signed: bool) -> jax.Array:
  """``ū``: u clipped into ``[min(0, n), max(0, n)]`` (binary) or ``[−|n|, |n|]`` (signed)."""
  if signed:
    return jnp.clip(u, -jnp.abs(n), jnp.abs(n))
  return jnp.clip(u, jnp.minimum(0.0, n), jnp.maximum(0.0, n))


def mask_probability(u: jax.Array, n: jax.Array, signed: bool) -> jax.Array:
  """``P(m = 1)``: ``clip(u/n, 0, 1)`` (eq. 6) or ``clip((u + n)/(2n), 0, 1)`` (eq. 7);
  0 (binary) or ½ (signed) where ``n = 0``."""
  safe = jnp.where(n == 0, 1.0, n)
  if signed:
    return jnp.where(n == 0, 0.5, jnp.clip((u + safe) / (2 * safe), 0.0, 1.0))
  return jnp.where(n == 0, 0.0, jnp.clip(u / safe, 0.0, 1.0))


def stochastic_mask(key: jax.Array, u: jax.Array, n: jax.Array, signed: bool) -> jax.Array:
  """M(u, n): binary {0, 1} or signed {−1, +1} mask, float like ``u``."""
  b = jax.random.bernoulli(key, mask_probability(u, n, signed)).astype(u.dtype)
  return 2.0 * b - 1.0 if signed else b


def deterministic_mask(u: jax.Array, n: jax.Array, signed: bool) -> jax.Array:
  """DM: ``1[sign u = sign n]`` (binary) or ``sign(u)·sign(n)`` (signed; 0 where u or n is 0)."""
  if signed:
    return jnp.sign(u) * jnp.sign(n)
  return (jnp.sign(u) == jnp.sign(n)).astype(u.dtype) * (n != 0)


def sm_moments(u, n, signed: bool) -> tuple[np.ndarray, np.ndarray]:
  """Exact mean and variance of ``n·M(u, n)``: ``(ū, ū(n − ū))`` binary, ``(ū, n² − ū²)``
  signed."""
  u, n = np.asarray(u, np.float64), np.asarray(n, np.float64)
  if signed:
    m = np.clip(u, -np.abs(n), np.abs(n))
    return m, n ** 2 - m ** 2
  m = np.clip(u, np.minimum(0, n), np.maximum(0, n))
  return m, m * (n - m)


def pm_probability(step: jax.Array, num_steps: jax.Array) -> jax.Array:
  """``p_τ = (τ + 1)/S`` for the 0-based step τ of S (each client's own S)."""
  return jnp.minimum((step + 1) / jnp.maximum(num_steps, 1), 1.0)


def progressive(key: jax.Array, u: jax.Array, n: jax.Array, p: jax.Array, signed: bool,
                stochastic: bool = True) -> jax.Array:
  """PSM's forward value ``û = (1 − P)⊙ū + P⊙n⊙M(u, n)``, ``P ~ Bernoulli(p)``; ``p = 1`` is
  plain SM (the "w/o PM" ablation), ``stochastic=False`` uses DM (the "w/o SM" ablation)."""
  k_route, k_mask = jax.random.split(key)
  m = stochastic_mask(k_mask, u, n, signed) if stochastic else deterministic_mask(u, n, signed)
  masked = n * m
  route = jax.random.bernoulli(k_route, p, u.shape)
  return jnp.where(route, masked, clip_to_noise(u, n, signed))


def straight_through(u: jax.Array, forward: jax.Array) -> jax.Array:
  """``forward`` in the forward pass, identity gradient to ``u`` (eq. 9's STE)."""
  return u + jax.lax.stop_gradient(forward - u)


def prop1_factor(num_steps: int) -> float:
  """Prop. 1's claimed reduction ``√(Σ_{τ=1}^S τ²/S³)`` of the average masking error (1 at
  S = 1, → 1/√3); it assumes an error ∝ p_τ², see :func:`pm_error_factor`."""
  s = np.arange(1, num_steps + 1, dtype=np.float64)
  return float(np.sqrt(np.sum(s ** 2) / num_steps ** 3))


def pm_error_factor(num_steps: int) -> float:
  """The factor that holds: the mean over τ of ``E‖û − ū‖²/E‖n⊙M − ū‖² = p_τ``, i.e.
  ``(S + 1)/(2S)`` (0.55 at S = 10, where eq. 31's p_τ² law gives 0.385)."""
  return (num_steps + 1) / (2 * num_steps)


def _leaf_keys(key: jax.Array, tree: Any) -> Any:
  leaves, treedef = jax.tree.flatten(tree)
  return jax.tree.unflatten(treedef, [jax.random.fold_in(key, i) for i in range(len(leaves))])


def tree_noise(key: jax.Array, like: Any, scale: float, distribution: str = "uniform") -> Any:
  """``G(s)`` for every leaf of ``like`` (leaf i from ``fold_in(key, i)``): what a client draws
  and what the server regenerates from the same key, bitwise."""
  return jax.tree.map(lambda k, a: noise(k, a.shape, scale, distribution, a.dtype),
                      _leaf_keys(key, like), like)


def tree_map_keyed(fn, key: jax.Array, *trees: Any) -> Any:
  """``fn(leaf_key, *leaves)`` over pytrees, an independent key per leaf."""
  return jax.tree.map(fn, _leaf_keys(key, trees[0]), *trees)
