"""Bits that cross the network, under an explicit encoding.

Conventions (DESIGN.md "Accounting and metrics"; seed 000 spec A.13):

* Counts are per *message* (one client's upload, or one copy of a broadcast) and per
  direction. Algorithms report the sum over the messages of a step in ``info.bits_up`` /
  ``info.bits_down``; the runner accumulates them. Bits per client are total / clients.
* Dense messages: ``d · value_bits`` (fp32 by default).
* Sparse messages with ``nnz`` non-zeros out of ``d`` entries, by ``encoding``:

  - ``"indices"``: values plus an index per value, ``nnz · (value_bits + ⌈log2 d⌉)``;
  - ``"bitmask"``: a d-bit presence mask plus the values, ``d + nnz · value_bits``;
  - ``"values"``: values only, ``nnz · value_bits`` (the index-free convention some papers
    use, e.g. EF21's code; it understates the cost and is never the default);
  - ``"auto"`` (default): the cheapest of indices, bitmask and dense;
  - ``"dense"``: always ``d · value_bits`` (a sender that never exploits zeros).

* 1-bit masks on seeded noise (FedMRN): ``d`` bits plus a 32-bit seed.
* Quantized vectors: ``d · bits_per_value`` plus ``overhead_floats`` fp32 scalars (norms,
  scales).

Functions taking ``nnz`` accept Python ints (exact Python-int result) or traced integer
arrays (float32 result inside ``jit``; exact while below 2^24 bits per message, and relative
error below 6e-8 beyond).
"""
from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

FLOAT_BITS = 32
SEED_BITS = 32
ENCODINGS = ("auto", "indices", "bitmask", "values", "dense")


def num_params(tree_or_size: Any) -> int:
  """Total number of entries of a pytree (static), or the int itself."""
  if isinstance(tree_or_size, int):
    return tree_or_size
  return sum(int(math.prod(jnp.shape(leaf))) for leaf in jax.tree.leaves(tree_or_size))


def dense_bits(tree_or_size: Any, value_bits: int = FLOAT_BITS) -> int:
  """Bits of a dense message: ``d · value_bits``."""
  return num_params(tree_or_size) * value_bits


def index_bits(d: int) -> int:
  """Bits of one index into ``d`` entries: ``⌈log2 d⌉`` (0 for ``d = 1``)."""
  if d < 1:
    raise ValueError(f"d must be >= 1, got {d}.")
  return (d - 1).bit_length()


def sparse_bits(nnz: Any, d: int, value_bits: int = FLOAT_BITS, encoding: str = "auto"):
  """Bits of a message with ``nnz`` non-zeros out of ``d`` entries (see module docstring)."""
  if encoding not in ENCODINGS:
    raise ValueError(f"encoding must be one of {ENCODINGS}, got {encoding!r}.")
  traced = not isinstance(nnz, int)
  if traced:
    nnz = jnp.asarray(nnz, jnp.float32)
  indices = nnz * (value_bits + index_bits(d))
  bitmask = d + nnz * value_bits
  if encoding == "indices":
    return indices
  if encoding == "bitmask":
    return bitmask
  if encoding == "values":
    return nnz * value_bits
  dense = d * value_bits
  if encoding == "dense":
    return jnp.float32(dense) if traced else dense
  if traced:
    return jnp.minimum(jnp.minimum(indices, bitmask), dense)
  return min(indices, bitmask, dense)


def nnz(tree: Any) -> jax.Array:
  """Number of non-zero entries of a pytree, ``int32[]`` (traceable)."""
  return sum(jnp.count_nonzero(leaf).astype(jnp.int32) for leaf in jax.tree.leaves(tree))


def message_bits(tree: Any, value_bits: int = FLOAT_BITS, encoding: str = "auto") -> jax.Array:
  """Bits of sending ``tree`` as is: sparse by its actual non-zeros under ``encoding``
  (``"auto"`` falls back to dense when that is cheaper). ``float32[]``, traceable."""
  return jnp.asarray(sparse_bits(nnz(tree), num_params(tree), value_bits, encoding),
                     jnp.float32)


def mask_bits(d: int, with_seed: bool = True) -> int:
  """A 1-bit-per-entry mask, plus the 32-bit seed of the noise it masks (FedMRN)."""
  return d + (SEED_BITS if with_seed else 0)


def quantized_bits(d: int, bits_per_value: float, overhead_floats: int = 1) -> float:
  """``d`` values at ``bits_per_value`` bits plus ``overhead_floats`` fp32 scalars."""
  return d * bits_per_value + overhead_floats * FLOAT_BITS
