"""Sparse design matrices as padded CSR rows: every sample ``a_i`` keeps its ``k = max_i nnz(a_i)``
(column, value) pairs, padded with value 0 at column 0, so ``A x`` is a gather and ``Aᵀ r`` a
``segment_sum`` inside ``jit`` — memory ``O(n·k)``, never ``O(n·p)``.

Shapes: ``idx int32[n, k]``, ``val float[n, k]``, ``b float[n]`` (labels), ``num_features`` p.

Source for the team: seed 004, Task 1; spec ``seed004.md`` §1.9.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from fedjaxsparse.data.libsvm import load_sparse
from fedjaxsparse.errors import DataError
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["SparseRows", "from_scipy", "from_libsvm", "from_dense", "matvec", "rmatvec", "planted",
           "SparseCols", "columns"]
__dir__ = _public_dir(__all__)


class SparseRows(NamedTuple):
  """A padded-CSR design with labels (a pytree; ``num_features`` is static metadata kept as a
  0-d array's shape is not needed: use ``p`` from :func:`num_features`)."""
  idx: jax.Array
  val: jax.Array
  b: jax.Array
  col_sq: jax.Array   # ‖A_{:j}‖₂² per column [p]
  nnz_rows: jax.Array  # nnz(a_i) [n]

  @property
  def n(self) -> int:
    return self.idx.shape[0]

  @property
  def p(self) -> int:
    return self.col_sq.shape[0]


def from_scipy(a, b, dtype=np.float64) -> SparseRows:
  """From a ``scipy.sparse`` matrix ``[n, p]`` (any format) and labels ``b [n]``."""
  import scipy.sparse as sp  # deferred: scipy is slow to import
  a = sp.csr_matrix(a, dtype=dtype)
  a.sum_duplicates()
  n, p = a.shape
  if np.shape(b) != (n,):
    raise ValueError(f"b must have shape ({n},), got {np.shape(b)}.")
  counts = np.diff(a.indptr)
  k = max(1, int(counts.max(initial=0)))
  idx = np.zeros((n, k), np.int32)
  val = np.zeros((n, k), dtype)
  pos = np.arange(a.nnz) - np.repeat(a.indptr[:-1], counts)
  rows = np.repeat(np.arange(n), counts)
  idx[rows, pos] = a.indices
  val[rows, pos] = a.data
  col_sq = np.asarray(a.multiply(a).sum(0)).ravel().astype(dtype)
  # device_put, not jnp.asarray: host arrays are copied without compiling a program per shape
  return SparseRows(*jax.device_put((idx, val, np.asarray(b, dtype), col_sq,
                                     counts.astype(np.int32))))


def from_libsvm(path: str, task: str = "classification", num_features: int | None = None,
                dtype=np.float64) -> SparseRows:
  """A LIBSVM / svmlight file kept sparse (:func:`fedjaxsparse.data.libsvm.load_sparse`):
  ``task="classification"`` maps two classes to b ∈ {−1, +1} (the larger label is +1);
  ``"regression"`` keeps the labels."""
  x, y = load_sparse(path, num_features)
  if task == "classification":
    classes = np.unique(y)
    if classes.size != 2:
      raise DataError(f"{path}: a binary problem needs 2 classes, found {classes.size}.")
    y = np.where(y == classes[1], 1.0, -1.0)
  elif task != "regression":
    raise ValueError(f"task must be 'classification' or 'regression', got {task!r}.")
  return from_scipy(x, y, dtype)


def from_dense(a: np.ndarray, b: np.ndarray, dtype=np.float64) -> SparseRows:
  import scipy.sparse as sp  # deferred: scipy is slow to import
  return from_scipy(sp.csr_matrix(np.asarray(a, dtype)), b, dtype)


@jax.jit
def matvec(data: SparseRows, x: jax.Array) -> jax.Array:
  """``A x`` [n] (one compiled program per shape, also when called outside ``jit``)."""
  return jnp.sum(data.val * x[data.idx], axis=1)


@jax.jit
def rmatvec(data: SparseRows, r: jax.Array) -> jax.Array:
  """``Aᵀ r`` [p] (one compiled program per shape, also when called outside ``jit``)."""
  return jax.ops.segment_sum((data.val * r[:, None]).ravel(), data.idx.ravel(),
                             num_segments=data.p)


def planted(n: int = 10_000, p: int = 100_000, density: float = 1e-3, support: int = 100,
            noise: float = 0.1, task: str = "regression", seed: int = 0, dtype=np.float64
            ) -> tuple[SparseRows, np.ndarray]:
  """A synthetic sparse problem with a planted support (the embedded default of Task 1):
  ``A`` with i.i.d. N(0, 1) entries at a random ``density`` (at least one per row), ``x_true``
  with ``support`` non-zeros N(0, 1) on columns that some rows touch, ``b = A x_true + noise``
  (``task="classification"``: ``b = sign(A x_true + noise)`` in {±1}). Returns
  ``(data, x_true)``."""
  import scipy.sparse as sp  # deferred: scipy is slow to import
  if not 0 < density <= 1 or not 0 < support <= p:
    raise ValueError(f"density must lie in (0, 1] and support in [1, p], got {density}, "
                     f"{support}.")
  rng = np.random.default_rng(seed)
  nnz = max(n, int(round(density * n * p)))
  rows = np.concatenate([np.arange(n), rng.integers(0, n, nnz - n)])
  cols = rng.integers(0, p, nnz)
  a = sp.csr_matrix((rng.standard_normal(nnz), (rows, cols)), shape=(n, p), dtype=dtype)
  a.sum_duplicates()
  touched = np.flatnonzero(np.diff(a.tocsc().indptr) > 0)
  x_true = np.zeros(p, dtype)
  x_true[rng.choice(touched, min(support, touched.size), replace=False)] = \
      rng.standard_normal(min(support, touched.size))
  z = a @ x_true + noise * rng.standard_normal(n)
  if task == "classification":
    z = np.where(z >= 0, 1.0, -1.0)
  elif task != "regression":
    raise ValueError(f"task must be 'regression' or 'classification', got {task!r}.")
  return from_scipy(a, z, dtype), x_true


class SparseCols(NamedTuple):
  """The same matrix by columns (padded CSC), for coordinate descent: ``rows int32[p, m]``,
  ``val float[p, m]`` (padding: row 0, value 0)."""
  rows: jax.Array
  val: jax.Array


def columns(data: SparseRows) -> SparseCols:
  """The padded-CSC view of ``data`` (built on the host)."""
  import scipy.sparse as sp  # deferred: scipy is slow to import
  idx, val = np.asarray(data.idx), np.asarray(data.val)
  r = np.repeat(np.arange(data.n), idx.shape[1])
  a = sp.csc_matrix((val.ravel(), (r, idx.ravel())), shape=(data.n, data.p))
  a.eliminate_zeros()
  counts = np.diff(a.indptr)
  m = max(1, int(counts.max(initial=0)))
  rows = np.zeros((data.p, m), np.int32)
  vals = np.zeros((data.p, m), val.dtype)
  pos = np.arange(a.nnz) - np.repeat(a.indptr[:-1], counts)
  cols = np.repeat(np.arange(data.p), counts)
  rows[cols, pos] = a.indices
  vals[cols, pos] = a.data
  return SparseCols(jnp.asarray(rows), jnp.asarray(vals))
