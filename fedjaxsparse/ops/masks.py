"""Sparse masks over model pytrees: layer-wise densities, exact-count random masks, prune and
regrow, drop-fraction schedules, diagnostics and bit-packed storage. Every sparse-training method
builds on these; FedMRN's masks over noise are another thing (:mod:`fedjaxsparse.ops.noise_masks`).

* **Which leaves are masked.** Leaves with ``ndim ≥ 2`` (conv and dense kernels) are masked;
  biases and norm scales/offsets (``ndim ≤ 1``) stay dense, as in the FLOPs arithmetic of
  FedSpa (Huang et al., 2022, arXiv:2201.11380). :func:`masked_leaves` gives the flags.
* **Densities** (:func:`layer_densities`): ``"erk"`` — Erdős–Rényi-Kernel, raw score
  ``(Σ_i s_i / Π_i s_i)^p`` over the kernel's shape
  (``(n_in + n_out + k_h + k_w)/(n_in n_out k_h k_w)`` for a conv kernel, the FedSpa paper's
  Appendix A), ``"er"`` — the same on the two channel dimensions only, ``"uniform"`` — ``1 − s``
  everywhere. ERK/ER solve ``ε`` so that ``Σ_l density_l |P_l| = (1 − s) Σ_l |P_l|`` over the masked
  leaves, and fix a layer dense whenever ``ε·raw_l > 1``, re-solving until none exceeds 1 (the
  iterative fix of RigL / DisPFL's ``calculate_sparsities``).
* **Exact counts.** Layer ``l`` keeps ``n_l = round(density_l·|P_l|)`` entries
  (:func:`layer_counts`, static Python ints); :func:`random_masks` draws exactly ``n_l`` per
  layer (FedSpa's theory assumes exact counts; the paper does not say how masks are drawn).
* **Prune and regrow** (:func:`prune_regrow`, RigL/SET as modified by FedSpa's Algorithm 2): in
  each masked layer drop the ``c`` active entries of smallest ``|w|`` and activate ``c`` inactive
  entries — largest ``|g|`` (``"gradient"``, RigL) or uniformly at random (``"random"``, SET)
  — with ``c = ceil(α·n_l)`` traced under the static bound ``ceil(α_max·n_l)``, so one
  compiled round serves every ``α_t``. Ties go to the lower flat index.
* **Schedules** of the drop fraction, pure functions of the round: :func:`cosine_drop`
  (``α_t = ½α_0(1 + cos(πt/(T − 1)))``, FedSpa/DisPFL), :func:`linear_drop`,
  :func:`constant_drop`.
* **Diagnostics**: :func:`density_per_layer`, :func:`hamming`, :func:`pairwise_hamming`
  (``K × K``), :func:`coverage` (the fraction of ``∪_k m_k``), :func:`overlap` (with the
  initial mask).
* **Storage**: :func:`pack` / :func:`unpack` — one bit per entry (``uint8``), for the
  ``K × d`` masks a server keeps.

Masks are boolean pytrees with the structure of the parameters (unmasked leaves all True).

Source for the team: seed 002, FedSpa §3 and App. A, l. 399-437, 417, 799-811, 815; spec
``seed002.md`` §3, §6.4, §8.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from fedjaxsparse.ops.sparsity import largest_mask, random_keys
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["DISTRIBUTIONS", "REGROWTHS", "masked_leaves", "layer_densities", "layer_counts",
           "random_masks", "init_masks", "prune_regrow", "cosine_drop", "linear_drop",
           "constant_drop", "DROP_SCHEDULES", "density_per_layer", "hamming", "pairwise_hamming",
           "coverage", "overlap", "pack", "as_bool", "unpack"]
__dir__ = _public_dir(__all__)

DISTRIBUTIONS = ("erk", "er", "uniform")
"""Layer densities of the initial masks: Erdős–Rényi-Kernel, Erdős–Rényi, or the same density
in every masked layer."""
REGROWTHS = ("gradient", "random")
"""How pruned positions regrow: by gradient magnitude (RigL) or at random (SET)."""


def _shape(a: Any) -> tuple:
  """A leaf's shape (arrays or ``jax.ShapeDtypeStruct``: densities need shapes only)."""
  return tuple(int(s) for s in (a.shape if hasattr(a, "shape") else np.shape(a)))


def masked_leaves(params: Any) -> Any:
  """A pytree of Python bools: True for the leaves that are masked (``ndim ≥ 2``)."""
  return jax.tree.map(lambda a: len(_shape(a)) >= 2, params)


def _raw(shape: tuple, distribution: str, power: float) -> float:
  dims = shape if distribution == "erk" else shape[-2:]  # ER: (n_in, n_out) only
  return (sum(dims) / math.prod(dims)) ** power


def layer_densities(params: Any, sparsity: float, distribution: str = "erk",
                    power: float = 1.0) -> Any:
  """A pytree of Python floats: each leaf's density (1.0 for unmasked leaves) at the overall
  ``sparsity`` of the masked leaves (module docstring). ``power`` is ERK's "scale parameter"
  (the FedSpa paper uses 1)."""
  if not 0.0 <= sparsity < 1.0:
    raise ValueError(f"sparsity must be in [0, 1), got {sparsity}.")
  if distribution not in DISTRIBUTIONS:
    raise ValueError(f"distribution must be one of {DISTRIBUTIONS}, got {distribution!r}.")
  leaves, treedef = jax.tree.flatten(params)
  shapes = [_shape(a) for a in leaves]
  masked = [len(s) >= 2 for s in shapes]
  dens = [1.0] * len(leaves)
  idx = [i for i, m in enumerate(masked) if m]
  if distribution == "uniform" or not idx:
    dens = [1.0 - sparsity if m else 1.0 for m in masked]
    return jax.tree.unflatten(treedef, dens)
  sizes = {i: math.prod(shapes[i]) for i in idx}
  raw = {i: _raw(shapes[i], distribution, power) for i in idx}
  budget = (1.0 - sparsity) * sum(sizes.values())
  dense: set[int] = set()
  while True:
    free = [i for i in idx if i not in dense]
    left = budget - sum(sizes[i] for i in dense)
    eps = left / sum(raw[i] * sizes[i] for i in free) if free else 0.0
    over = [i for i in free if eps * raw[i] > 1.0]
    if not over:
      break
    dense.update(over)
  for i in idx:
    dens[i] = 1.0 if i in dense else eps * raw[i]
  return jax.tree.unflatten(treedef, dens)


def layer_counts(params: Any, densities: Any) -> Any:
  """A pytree of Python ints: entries kept per leaf, ``round(density·|P|)`` (at least 1 in a
  masked leaf; all in an unmasked one)."""
  def count(a, dn):
    size = math.prod(_shape(a))
    return size if len(_shape(a)) < 2 else max(1, min(size, int(round(dn * size))))
  return jax.tree.map(count, params, densities)


def random_masks(key: jax.Array, params: Any, counts: Any) -> Any:
  """Boolean masks with exactly ``counts`` True per leaf on uniformly random supports (leaf
  ``i`` from ``fold_in(key, i)``); unmasked leaves all True. The same ``key`` gives every client
  the same mask (FedSpa's shared initial mask); ``jax.vmap`` over keys gives per-client
  masks of the same per-layer counts."""
  leaves, treedef = jax.tree.flatten(params)
  shapes = tuple(tuple(int(n) for n in _shape(a)) for a in leaves)
  return jax.tree.unflatten(treedef, _random_masks(
      key, shapes, tuple(int(c) for c in jax.tree.leaves(counts))))


@functools.partial(jax.jit, static_argnums=(1, 2))
def _random_masks(key: jax.Array, shapes: tuple, counts: tuple) -> list:
  """:func:`random_masks` of leaves of ``shapes`` (one program for the whole tree)."""
  out = []
  for i, (shape, c) in enumerate(zip(shapes, counts)):
    size = math.prod(shape)
    if c >= size:
      out.append(jnp.ones(shape, bool))
      continue
    keys = random_keys(jax.random.fold_in(key, i), size)
    idx = jax.lax.top_k(keys, c)[1]
    out.append(jnp.zeros(size, bool).at[idx].set(True).reshape(shape))
  return out


def init_masks(key: jax.Array, params: Any, sparsity: float, distribution: str = "erk",
               power: float = 1.0) -> Any:
  """``random_masks`` at :func:`layer_densities`' exact counts."""
  return random_masks(key, params, layer_counts(params, layer_densities(
      params, sparsity, distribution, power)))


def _select(scores: jax.Array, count: jax.Array, bound: int) -> jax.Array:
  """``bool[n]``: the ``count ≤ bound`` entries of largest ``scores`` (ties to the lower index);
  ``count`` may be traced, ``bound`` is static. By bisection on the scores' bit patterns
  (:func:`fedjaxsparse.ops.sparsity.largest_mask`: linear work, where ``lax.top_k`` of
  ``bound`` entries sorts them — on a CPU, about 90 ms against 20 per LeNet-5 client and round):
  exactly the set the stable top-k returns."""
  if bound == 0:
    return jnp.zeros(scores.shape[0], bool)
  return largest_mask(scores, jnp.asarray(count, jnp.int32), "bisection")


def prune_regrow(mask: Any, weights: Any, scores: Any, fraction: Any, counts: Any, *,
                 max_fraction: float, regrowth: str = "gradient", key: jax.Array | None = None,
                 regrow_pruned: bool = True) -> Any:
  """One prune-and-regrow update of every masked leaf (FedSpa's Algorithm 2).

  Args:
    mask: boolean masks; weights: the trained (sparse) weights ``w̃``; scores: the regrowth
      scores — the *dense* gradient ``∇_v L(v)|_{v = w̃}`` for ``"gradient"`` (ignored for
      ``"random"``); all with the structure of the parameters.
    fraction: ``α`` in ``[0, max_fraction]``, may be traced; ``c_l = ceil(α·n_l)``.
    counts: the static active counts ``n_l`` (:func:`layer_counts`).
    max_fraction: the static bound of ``α`` (``α_0``).
    regrowth: ``"gradient"`` (largest ``|g|``, RigL) or ``"random"`` (SET; needs ``key``).
    regrow_pruned: whether entries pruned in this call may be regrown (ITOP-style default).

  Every layer keeps exactly ``n_l`` active entries; unmasked leaves are returned unchanged.
  """
  if regrowth not in REGROWTHS:
    raise ValueError(f"regrowth must be one of {REGROWTHS}, got {regrowth!r}.")
  if regrowth == "random" and key is None:
    raise ValueError("regrowth='random' needs a key.")
  if not 0.0 <= max_fraction <= 1.0:
    raise ValueError(f"max_fraction must be in [0, 1], got {max_fraction}.")
  leaves, treedef = jax.tree.flatten(mask)
  ws, gs, ns = (jax.tree.leaves(t) for t in (weights, scores, counts))
  out = []
  for i, (m, w, g, n) in enumerate(zip(leaves, ws, gs, ns)):
    if m.ndim < 2 or n >= m.size:
      out.append(m)
      continue
    bound = min(math.ceil(max_fraction * n), m.size - n)
    c = jnp.minimum(jnp.ceil(fraction * n - 1e-6).astype(jnp.int32), bound)
    flat = m.ravel()
    prune = _select(jnp.where(flat, -jnp.abs(w.ravel()).astype(jnp.float32), -jnp.inf), c,
                    bound)
    half = flat & ~prune
    grow_ok = ~half if regrow_pruned else ~flat
    if regrowth == "gradient":
      s = jnp.abs(g.ravel()).astype(jnp.float32)
    else:
      s = random_keys(jax.random.fold_in(key, i), m.size)
    grow = _select(jnp.where(grow_ok, s, -jnp.inf), c, bound)
    out.append((half | grow).reshape(m.shape))
  return jax.tree.unflatten(treedef, out)


def cosine_drop(t: Any, alpha0: float, num_rounds: int) -> jax.Array:
  """``α_t = ½α_0(1 + cos(π t/(T − 1)))`` for ``t = 0..T−1``: ``α_0`` at the first round, 0 at the
  last (the FedSpa paper, Section 4.2 and Appendix A; DisPFL's
  ``anneal_factor/2·(1 + cos(round·π/comm_round))`` with ``T − 1``, so the final round leaves masks
  unchanged). ``T = 1``: ``α_0``."""
  _check_alpha(alpha0, num_rounds)
  frac = jnp.asarray(t, jnp.float32) / max(num_rounds - 1, 1)
  return jnp.float32(alpha0) * 0.5 * (1.0 + jnp.cos(jnp.pi * jnp.clip(frac, 0.0, 1.0)))


def linear_drop(t: Any, alpha0: float, num_rounds: int) -> jax.Array:
  """``α_t = α_0(1 − t/(T − 1))``, clipped at 0."""
  _check_alpha(alpha0, num_rounds)
  frac = jnp.asarray(t, jnp.float32) / max(num_rounds - 1, 1)
  return jnp.float32(alpha0) * jnp.clip(1.0 - frac, 0.0, 1.0)


def constant_drop(t: Any, alpha0: float, num_rounds: int) -> jax.Array:
  """``α_t = α_0``."""
  _check_alpha(alpha0, num_rounds)
  return jnp.full(jnp.shape(t), alpha0, jnp.float32)


DROP_SCHEDULES: dict[str, Callable] = {"cosine": cosine_drop, "linear": linear_drop,
                                       "constant": constant_drop}
"""The drop-fraction schedules ``(t, alpha0, num_rounds) -> α_t`` by name."""


def _check_alpha(alpha0: float, num_rounds: int) -> None:
  if not 0.0 <= alpha0 <= 1.0:
    raise ValueError(f"alpha0 (the initial drop fraction) must be in [0, 1], got {alpha0}.")
  if num_rounds < 1:
    raise ValueError(f"num_rounds must be >= 1, got {num_rounds}.")


@jax.jit   # exact (counts of booleans): one program, not one per eager operation
def density_per_layer(mask: Any) -> Any:
  """``float32[]`` per leaf: the fraction of True entries (a leading client axis, if any, is
  averaged over)."""
  return jax.tree.map(lambda m: jnp.mean(m.astype(jnp.float32)), mask)


def _flat(mask: Any) -> jax.Array:
  return jnp.concatenate([m.reshape(m.shape[0], -1) for m in jax.tree.leaves(mask)], axis=1)


@jax.jit   # integer counts: one program, not one per eager operation
def hamming(mask_a: Any, mask_b: Any) -> jax.Array:
  """``int32[]``: entries where two masks differ, ``|m_a ⊕ m_b|``."""
  return sum((jnp.sum(a != b, dtype=jnp.int32) for a, b in zip(jax.tree.leaves(mask_a),
                                                               jax.tree.leaves(mask_b))),
             jnp.int32(0))


@jax.jit   # integer counts: one program, not one per eager operation
def pairwise_hamming(masks: Any) -> jax.Array:
  """``int32[K, K]``: Hamming distances between the ``K`` stacked masks (leading axis K)."""
  f = _flat(masks).astype(jnp.int32)
  ones = jnp.sum(f, axis=1)
  return ones[:, None] + ones[None, :] - 2 * (f @ f.T)


@jax.jit   # exact (counts of booleans): one program, not one per eager operation
def coverage(masks: Any) -> jax.Array:
  """``float32[]``: the fraction of entries active in at least one of the stacked masks,
  ``|∪_k m_k| / d``."""
  return jnp.mean(jnp.any(_flat(masks), axis=0).astype(jnp.float32))


@jax.jit   # integer counts and one division: one program, not one per eager operation
def overlap(mask: Any, reference: Any) -> jax.Array:
  """``float32[]``: ``|m ∩ m_ref| / |m_ref|``, e.g. how much of the initial mask survives."""
  inter = sum(jnp.sum(a & b) for a, b in zip(jax.tree.leaves(mask), jax.tree.leaves(reference)))
  total = sum(jnp.sum(b) for b in jax.tree.leaves(reference))
  return (inter / jnp.maximum(total, 1)).astype(jnp.float32)


def pack(mask: Any) -> Any:
  """One bit per entry: each leaf (``n`` entries) → ``uint8[ceil(n/8)]``; ``jax.vmap(pack)``
  packs ``K`` stacked client masks to ``uint8[K, ceil(n/8)]`` per leaf (8× less than bool)."""
  return jax.tree.map(lambda m: jnp.packbits(m.ravel()), mask)


def as_bool(masks: Any, like: Any) -> Any:
  """Stacked client masks as booleans ``[K, *shape]``: unpacks ``uint8`` (packed) leaves,
  passes boolean ones through; ``like`` has the unstacked parameter shapes."""
  return jax.tree.map(
      lambda m, a: m if m.dtype == jnp.bool_ else jax.vmap(
          lambda p: jnp.unpackbits(p, count=int(np.size(a))).astype(bool).reshape(
              jnp.shape(a)))(m), masks, like)


def unpack(packed: Any, like: Any) -> Any:
  """Inverse of :func:`pack`: boolean masks shaped like ``like``."""
  return jax.tree.map(
      lambda p, a: jnp.unpackbits(p, count=int(np.size(a))).astype(bool).reshape(jnp.shape(a)),
      packed, like)
