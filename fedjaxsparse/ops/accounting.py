"""Bits that cross the network, under an explicit encoding.

Conventions:

* A count is per *message* (one client's upload, or one copy of a broadcast) and per
  direction. Algorithms report the sum over the messages of a step in ``info.bits_up`` /
  ``info.bits_down``; the runner accumulates them over steps. Bits per client (the papers'
  "bits per node") are that total divided by the number of clients.
* A dense message of ``d`` entries costs ``d · value_bits`` (fp32 by default).
* A sparse message with ``nnz`` non-zeros out of ``d`` entries, by ``encoding``:

  - ``"indices"``: every value with its index, ``nnz · (value_bits + ⌈log2 d⌉)``;
  - ``"bitmask"``: a ``d``-bit presence mask plus the values, ``d + nnz · value_bits``;
  - ``"values"``: values only, ``nnz · value_bits`` (the support is known to the receiver,
    e.g. rand-k indices from a shared seed; it understates the cost otherwise);
  - ``"dense"``: always ``d · value_bits`` (a sender that never exploits zeros);
  - ``"auto"`` (default): the cheapest of indices, bitmask and dense. Indices win below
    ``nnz = d / ⌈log2 d⌉``, the bitmask up to ``nnz = d·(1 − 1/value_bits)``, dense beyond.

* A 1-bit mask over seeded noise (FedMRN): ``d`` bits plus a ``SEED_BITS`` seed.
* A quantized vector: ``d · bits_per_value`` plus ``overhead_floats`` fp32 scalars (norms,
  scales).
* Rounds instead of bits (the Cohort-Squeeze paper, Yi et al., 2024, arXiv:2406.01115: cross-device
  FL with hubs): a global round t with K_t local communication rounds (clients ↔ hub) costs
  ``c₁·K_t + c₂`` (:func:`round_cost`; c₂ a hub ↔ server round); ``c₁ = 1, c₂ = 0`` is the paper's
  base cost T·K, and LocalGD's one communication per round costs ``c₁ + c₂``. :func:`cost_to_target`
  is the cost paid until an error first falls below ε.

Precision: with Python ints every count is an exact Python int. With a traced ``nnz`` (inside
``jit``), :func:`sparse_bits` returns an exact ``int32`` whenever the largest possible count
of the message fits in int32 (``d ≤ 37,025,580`` at fp32) and the default float dtype
otherwise. :func:`message_bits` returns the default float dtype
(:func:`fedjaxsparse.core.float_dtype`), ready to be summed over clients without int32
overflow: in float32 exact below 2²⁴ bits (relative error below 6e-8 above); under
``jax_enable_x64`` float64, exact below 2⁵³ bits.

Source for the team: DESIGN.md "Accounting and metrics"; seed 000 spec §A.13; seed 001 ch. 5.
"""
from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from fedjaxsparse.core import float_dtype
from fedjaxsparse.ops.sparsity import nnz, num_params
from fedjaxsparse.core import public_dir as _public_dir

FLOAT_BITS = 32
"""Bits of one transmitted float (fp32)."""
SEED_BITS = 32
"""Bits of one transmitted PRNG seed (FedMRN's and FedPM's regenerated noise)."""
ENCODINGS = ("auto", "indices", "bitmask", "values", "dense")
"""Encodings of a sparse message (:func:`sparse_bits`): ``auto`` (the smaller of indices
and bitmask), values plus 32-bit ``indices``, values plus a d-bit ``bitmask``, ``values``
only (some papers' count) and ``dense``."""

_INT32_MAX = 2 ** 31 - 1

__all__ = ["FLOAT_BITS", "SEED_BITS", "ENCODINGS", "num_params", "nnz", "dense_bits",
           "index_bits", "sparse_bits", "message_bits", "mask_bits", "quantized_bits",
           "round_cost", "cost_to_target", "rounds_below"]
__dir__ = _public_dir(__all__)


def _dim(tree_or_num_params: Any) -> int:
  if isinstance(tree_or_num_params, (int, np.integer)):
    return int(tree_or_num_params)
  return num_params(tree_or_num_params)


def dense_bits(tree_or_num_params: Any, value_bits: int = FLOAT_BITS) -> int:
  """Bits of a dense message: ``d · value_bits`` (``d`` from an int or a pytree's shapes)."""
  return _dim(tree_or_num_params) * value_bits


def index_bits(d: int) -> int:
  """Bits of one index into ``d`` entries: ``⌈log2 d⌉`` (0 for ``d = 1``: nothing to say)."""
  if d < 1:
    raise ValueError(f"d must be >= 1, got {d}.")
  return (d - 1).bit_length()


def _costs(d: int, value_bits: int) -> dict[str, tuple[int, int]]:
  """Every encoding's cost as ``(slope, intercept)``: ``bits = slope · nnz + intercept``."""
  return {"indices": (value_bits + index_bits(d), 0), "bitmask": (value_bits, d),
          "values": (value_bits, 0), "dense": (0, d * value_bits)}


def sparse_bits(nnz: Any, d: int, value_bits: int = FLOAT_BITS, encoding: str = "auto"):
  """Bits of a message with ``nnz`` non-zeros out of ``d`` entries (see the module docstring).

  Args:
    nnz: a Python int (exact Python-int result) or a traced integer scalar (``int32`` result
      when exact, else the default float dtype).
    d: number of entries of the message (static).
    value_bits: bits per transmitted value.
    encoding: one of ``ENCODINGS``.

  >>> sparse_bits(10, 1000)     # 10 values + 10 indices of 10 bits (< 32 values + a 1000-bit mask)
  420
  >>> sparse_bits(600, 1000)    # 600 values + a 1000-bit mask (< 600 indices)
  20200
  >>> sparse_bits(600, 1000, encoding="values")   # some papers count the values only
  19200
  """
  if encoding not in ENCODINGS:
    raise ValueError(f"encoding must be one of {ENCODINGS}, got {encoding!r}.")
  costs = _costs(d, value_bits)
  names = ("indices", "bitmask", "dense") if encoding == "auto" else (encoding,)
  if isinstance(nnz, (int, np.integer)):
    return min(slope * int(nnz) + intercept for slope, intercept in
               (costs[name] for name in names))
  largest = max(slope * d + intercept for slope, intercept in costs.values())
  n = jnp.asarray(nnz, jnp.int32 if largest <= _INT32_MAX else float_dtype())
  out = [slope * n + jnp.asarray(intercept, n.dtype) for slope, intercept in
         (costs[name] for name in names)]
  return out[0] if len(out) == 1 else jnp.minimum(jnp.minimum(out[0], out[1]), out[2])


def message_bits(tree: Any, value_bits: int = FLOAT_BITS, encoding: str = "auto"):
  """Default-float scalar: bits of sending ``tree`` as it is, by its actual non-zeros under
  ``encoding`` (``"auto"`` falls back to dense when that is cheaper). Traceable."""
  return jnp.asarray(sparse_bits(nnz(tree), num_params(tree), value_bits, encoding),
                     float_dtype())


def mask_bits(d: int, with_seed: bool = True) -> int:
  """A 1-bit-per-entry mask, ``d`` bits, plus the ``SEED_BITS`` seed of the noise it masks
  (FedMRN)."""
  return d + (SEED_BITS if with_seed else 0)


def quantized_bits(d: int, bits_per_value: float, overhead_floats: int = 1) -> float:
  """``d`` values at ``bits_per_value`` bits plus ``overhead_floats`` fp32 scalars."""
  return d * bits_per_value + overhead_floats * FLOAT_BITS


def round_cost(local_rounds: Any, c1: float = 1.0, c2: float = 0.0) -> float:
  """Total cost ``Σ_t (c₁ K_t + c₂)`` of global rounds with ``local_rounds[t] = K_t`` local
  communication rounds each (a sequence, or one K for a single round)."""
  k = np.atleast_1d(np.asarray(local_rounds, np.float64))
  return float(np.sum(c1 * k + c2))


def rounds_below(errors: Any, eps: float) -> int | None:
  """The first round ``t`` from which the curve stays below ``eps`` (``errors[t:] < eps``
  everywhere; ``errors[0]`` is the start); ``None`` if its last value is not below. Unlike a
  first hit, a curve that dips under ``eps`` and climbs back does not count as there."""
  e = np.asarray(errors, np.float64)
  above = np.flatnonzero(~(e < eps))
  if not above.size:
    return 0
  t = int(above[-1]) + 1
  return t if t < len(e) else None


def cost_to_target(errors: Any, local_rounds: Any, eps: float, c1: float = 1.0,
                   c2: float = 0.0) -> float | None:
  """The cost until the error first drops below ``eps``: ``errors[t]`` is measured after t
  global rounds (``errors[0]``: the start), ``local_rounds[t]`` the K of round t + 1 (or one K
  for all). ``None`` if it never does; the paper's ``min T·K s.t. ‖x_T − x⋆‖² < ε`` with the
  defaults."""
  e = np.asarray(errors, np.float64)
  k = np.broadcast_to(np.asarray(local_rounds, np.float64), (max(len(e) - 1, 0),))
  hit = np.flatnonzero(e < eps)
  if not hit.size:
    return None
  return round_cost(k[:hit[0]], c1, c2) if hit[0] else 0.0
