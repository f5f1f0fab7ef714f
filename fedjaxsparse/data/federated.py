"""The federated dataset pytree: clients on a leading axis, examples padded with a mask.

``FederatedData`` is what algorithms consume; ``FederatedDataset`` bundles a train and a test
split plus static metadata. Builders turn flat arrays plus per-client index lists (from
:mod:`fedjaxsparse.data.partitions`) into padded arrays.
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjaxsparse.errors import DataError
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["FederatedData", "FederatedDataset", "check_data", "pack_clients", "split_clients",
           "federate"]
__dir__ = _public_dir(__all__)


class FederatedData(NamedTuple):
  """One split of a federated dataset, padded to ``M`` examples per client.

  Attributes:
    x: ``[N, M, ...]`` features (float32). Padding rows are zero.
    y: ``[N, M]`` labels (int32 for classification) or ``[N, M]`` / ``[N, M, k]`` float targets.
    mask: ``[N, M]`` float32, 1 for a real example and 0 for padding.
    num_examples: ``[N]`` int32, number of real examples of each client (``mask.sum(1)``).
  """
  x: jax.Array
  y: jax.Array
  mask: jax.Array
  num_examples: jax.Array

  @property
  def num_clients(self) -> int:
    return self.x.shape[0]

  @property
  def max_examples(self) -> int:
    return self.x.shape[1]

  def select(self, client_ids: jax.Array) -> "FederatedData":
    """The rows of ``client_ids`` (shape ``[C]``); works inside ``jit`` (a gather)."""
    return jax.tree.map(lambda a: jnp.take(a, client_ids, axis=0), self)

  def validate(self, split: str = "train", allow_empty: bool = False,
               num_classes: int | None = None) -> "FederatedData":
    """Check the invariants every algorithm relies on; raise :class:`DataError` naming the
    first offending client. Call outside ``jit`` (a no-op on traced data).

    Checks: consistent shapes; ``mask`` is 1 on the first ``num_examples[i]`` rows of client
    ``i`` and 0 after (real examples first — minibatch sampling draws from that prefix);
    every client has an example unless ``allow_empty``; features and float targets are
    finite; integer labels are ``>= 0`` and, given ``num_classes > 0``, ``< num_classes``.
    """
    if any(isinstance(a, jax.core.Tracer) for a in self):
      return self
    n, m = self.mask.shape if np.ndim(self.mask) == 2 else (None, None)
    if (n is None or self.x.shape[:2] != (n, m) or self.y.shape[:2] != (n, m)
        or np.shape(self.num_examples) != (n,)):
      raise DataError(f"{split} data: inconsistent shapes x {self.x.shape}, y {self.y.shape}, "
                      f"mask {np.shape(self.mask)}, num_examples {np.shape(self.num_examples)}; "
                      "expected x [N, M, ...], y [N, M, ...], mask [N, M], num_examples [N].")
    counts = np.asarray(self.num_examples)
    if not np.issubdtype(counts.dtype, np.integer) or counts.min() < 0 or counts.max() > m:
      raise DataError(f"{split} data: num_examples must be integers in [0, M={m}], got "
                      f"values in [{counts.min()}, {counts.max()}] ({counts.dtype}).")
    if num_classes and not jnp.issubdtype(self.y.dtype, jnp.integer):
      raise DataError(f"{split} data: labels of a {num_classes}-class problem must be "
                      f"integers, got {self.y.dtype}.")
    flags = _client_checks(self, num_classes or 0)
    if any(isinstance(v, jax.core.Tracer) for v in flags.values()):
      return self  # called while tracing (e.g. init inside a vmapped sweep): nothing to read
    flags = {k: np.asarray(v) for k, v in flags.items()}
    messages = {
        "mask_prefix": "mask must be 1 on the first num_examples rows and 0 on the padding",
        "empty": "has no example (every training client needs at least one)",
        "x_finite": "has a NaN or infinite feature",
        "y_finite": "has a NaN or infinite target",
        "y_range": (f"has a label outside [0, {num_classes})" if num_classes else
                    "has a negative label"),
    }
    for name, message in messages.items():
      if name == "empty" and allow_empty:
        continue
      bad = np.flatnonzero(~flags[name])
      if bad.size:
        more = f" (and {bad.size - 1} more clients)" if bad.size > 1 else ""
        raise DataError(f"{split} data: client {int(bad[0])} {message}{more}.")
    return self


def _client_checks(data: FederatedData, num_classes: int) -> dict[str, Any]:
  """Per-client ``bool [N]`` flags of :meth:`FederatedData.validate` (True = fine): with NumPy
  where every array is in host memory (NumPy arrays, or JAX arrays on CPU devices that this
  process holds whole: no copy and no compilation — a compiled check costs ~50 ms per new
  shape, once per dataset and split), else as one compiled program on the arrays' devices."""
  on_host = all(isinstance(a, np.ndarray) or (
      isinstance(a, jax.Array) and a.is_fully_addressable
      and all(d.platform == "cpu" for d in a.devices())) for a in data)
  if on_host:
    return _flags(np, FederatedData(*(np.asarray(a) for a in data)), num_classes)
  return _compiled_flags(data, num_classes)


def _flags(xp, data: FederatedData, num_classes: int) -> dict[str, Any]:
  """The flags computed with ``xp`` (``numpy`` or ``jax.numpy``)."""
  m = data.mask.shape[1]
  real = (data.mask != 0)
  expected = xp.arange(m)[None, :] < data.num_examples[:, None]
  per_client = lambda a: a.reshape(a.shape[0], -1).all(1)
  flags = {"mask_prefix": per_client((data.mask == expected.astype(data.mask.dtype))),
           "empty": data.num_examples > 0}
  if not jnp.issubdtype(data.x.dtype, jnp.inexact):
    flags["x_finite"] = xp.ones(data.x.shape[0], bool)
  elif xp is np:   # a few clients at a time: no temporary the size of x (page faults)
    x = data.x
    step = max(1, (1 << 22) // max(1, x[:1].size))
    flags["x_finite"] = np.concatenate(
        [per_client(np.isfinite(x[a:a + step])) for a in range(0, x.shape[0], step)])
  else:
    flags["x_finite"] = per_client(xp.isfinite(data.x))
  y = data.y
  real_y = real.reshape(real.shape + (1,) * (y.ndim - 2))
  if jnp.issubdtype(y.dtype, jnp.inexact):
    flags["y_finite"] = per_client(xp.isfinite(y) | ~real_y)
    flags["y_range"] = xp.ones(y.shape[0], bool)
  else:
    flags["y_finite"] = xp.ones(y.shape[0], bool)
    in_range = (y >= 0) & ((y < num_classes) if num_classes > 0 else True)
    flags["y_range"] = per_client(in_range | ~real_y)
  return flags


_compiled_flags = jax.jit(functools.partial(_flags, jnp), static_argnums=1)


class FederatedDataset(NamedTuple):
  """A train and a test split with static metadata.

  Attributes:
    train: training split, ``FederatedData`` with ``N`` clients.
    test: test split: either ``N`` clients (each client's own test examples, possibly none),
      or a single client holding a shared global test set (``num_clients == 1``), as used when
      a dataset ships its own test split (BlogFeedback, FEMNIST's standard test set).
    num_classes: number of classes, or 0 for regression.
    name: a human-readable name, e.g. ``"digits/dirichlet(0.5)"``.
  """
  train: FederatedData
  test: FederatedData
  num_classes: int
  name: str

  @property
  def num_clients(self) -> int:
    return self.train.num_clients

  def validate(self) -> "FederatedDataset":
    """Validate both splits (test clients may be empty); labels must be in
    ``[0, num_classes)`` for classification."""
    self.train.validate("train", num_classes=self.num_classes)
    self.test.validate("test", allow_empty=True, num_classes=self.num_classes)
    return self


def check_data(data) -> None:
  """Validate ``data`` if it is concrete :class:`FederatedData` (what algorithms call in
  ``init``; bucketed or traced data pass through)."""
  if isinstance(data, FederatedData):
    data.validate("train")
  for bucket in getattr(data, "buckets", ()):  # clients.BucketedData
    check_data(bucket)
  if hasattr(data, "strategy"):  # clients.Executed
    check_data(data.data)


def pack_clients(x: np.ndarray, y: np.ndarray, client_indices: Sequence[np.ndarray],
                 max_examples: int | None = None, allow_empty: bool = False) -> FederatedData:
  """Stack per-client examples into padded arrays.

  Args:
    x: ``[n, ...]`` all examples.
    y: ``[n, ...]`` all labels/targets.
    client_indices: one integer index array per client (into ``x``/``y``).
    max_examples: pad to this many examples per client (default: the largest client).
    allow_empty: whether a client may have no example (true for test splits).

  Returns:
    ``FederatedData`` with ``N = len(client_indices)`` and ``M = max_examples``.
  """
  x = np.asarray(x)
  y = np.asarray(y)
  if x.shape[0] != y.shape[0]:
    raise ValueError(f"x and y must have the same number of examples, got {x.shape[0]} and "
                     f"{y.shape[0]}.")
  if len(client_indices) == 0:
    raise ValueError("client_indices must contain at least one client.")
  if np.issubdtype(x.dtype, np.floating) and not np.all(np.isfinite(x)):
    rows = np.flatnonzero(~np.isfinite(x.reshape(len(x), -1)).all(1))
    raise DataError(f"x contains NaN or infinite values (example {rows[0]}"
                    f"{f' and {rows.size - 1} more' if rows.size > 1 else ''}).")
  if np.issubdtype(y.dtype, np.floating) and not np.all(np.isfinite(y)):
    rows = np.flatnonzero(~np.isfinite(y.reshape(len(y), -1)).all(1))
    raise DataError(f"y contains NaN or infinite targets (example {rows[0]}"
                    f"{f' and {rows.size - 1} more' if rows.size > 1 else ''}).")
  sizes = np.array([len(ix) for ix in client_indices], dtype=np.int32)
  if not allow_empty and np.any(sizes == 0):
    raise ValueError(f"client(s) {np.flatnonzero(sizes == 0).tolist()} have no example; every "
                     "client needs at least one training example.")
  m = int(sizes.max()) if max_examples is None else int(max_examples)
  if m < sizes.max():
    raise ValueError(f"max_examples={m} is smaller than the largest client ({sizes.max()}).")
  m = max(m, 1)
  n = len(client_indices)
  xs = _host_zeros((n, m) + x.shape[1:], np.float32 if np.issubdtype(x.dtype, np.floating)
                   or np.issubdtype(x.dtype, np.integer) else x.dtype)
  ys = _host_zeros((n, m) + y.shape[1:], y.dtype)
  mask = _host_zeros((n, m), np.float32)
  for i, ix in enumerate(client_indices):
    ix = np.asarray(ix, dtype=np.int64)
    xs[i, :len(ix)] = x[ix]
    ys[i, :len(ix)] = y[ix]
    mask[i, :len(ix)] = 1.0
  if np.issubdtype(ys.dtype, np.integer) and ys.dtype != np.int32:
    ys = _host_copy(ys, np.int32)
  elif np.issubdtype(ys.dtype, np.floating) and ys.dtype != np.float32:
    ys = _host_copy(ys, np.float32)
  # device_put, not jnp.asarray: a host array is copied to the device without compiling a
  # program per shape (jnp.asarray of a NumPy array compiles one); on CPU an array aligned
  # like XLA's buffers (_host_zeros) is not even copied: the device array uses its memory
  return FederatedData(*jax.device_put((xs, ys, mask, sizes)))


_ALIGN = 64   # bytes: XLA:CPU's buffer alignment (a host array so aligned is used in place)


def _host_zeros(shape: tuple, dtype) -> np.ndarray:
  """``np.zeros(shape, dtype)`` whose data start on a ``_ALIGN``-byte boundary: on CPU
  ``jax.device_put`` uses such an array's memory instead of copying it (a padded dataset can
  take gigabytes; the arrays built here are not written after ``device_put``). Zeroed lazily
  by the allocator (calloc), like ``np.zeros``: the padding is never written."""
  dtype = np.dtype(dtype)
  if dtype.hasobject:
    return np.zeros(shape, dtype)
  nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
  raw = np.zeros(nbytes + _ALIGN, np.uint8)
  start = -raw.ctypes.data % _ALIGN
  return raw[start:start + nbytes].view(dtype).reshape(shape)


def _host_copy(a: np.ndarray, dtype) -> np.ndarray:
  """``a.astype(dtype)`` in an aligned array (:func:`_host_zeros`)."""
  out = _host_zeros(a.shape, dtype)
  np.copyto(out, a, casting="unsafe")
  return out


def split_clients(client_indices: Sequence[np.ndarray], test_fraction: float,
                  seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
  """Split each client's examples into its own train and test part (LEAF style).

  Every client keeps at least one training example. Deterministic under ``seed``.
  """
  if not 0.0 <= test_fraction < 1.0:
    raise ValueError(f"test_fraction must be in [0, 1), got {test_fraction}.")
  rng = np.random.default_rng(seed)
  train, test = [], []
  for ix in client_indices:
    ix = rng.permutation(np.asarray(ix))
    n_test = min(int(round(test_fraction * len(ix))), max(len(ix) - 1, 0))
    test.append(np.sort(ix[:n_test]))
    train.append(np.sort(ix[n_test:]))
  return train, test


def federate(x: np.ndarray, y: np.ndarray, client_indices: Sequence[np.ndarray], *,
             num_classes: int, name: str, test_fraction: float = 0.2, seed: int = 0,
             x_test: np.ndarray | None = None, y_test: np.ndarray | None = None,
             test_indices: Sequence[np.ndarray] | None = None) -> FederatedDataset:
  """Build a :class:`FederatedDataset` from flat arrays and a partition.

  Either each client's examples are split into train/test (``test_fraction``), or a separate
  test set is given (``x_test``, ``y_test`` with ``test_indices`` per client; if
  ``test_indices`` is omitted, the test split is one client holding the whole test set).
  """
  if x_test is None:
    tr, te = split_clients(client_indices, test_fraction, seed)
    return FederatedDataset(pack_clients(x, y, tr), pack_clients(x, y, te, allow_empty=True),
                            num_classes, name).validate()
  if test_indices is None:
    test_indices = [np.arange(len(x_test))]
  return FederatedDataset(pack_clients(x, y, client_indices),
                          pack_clients(x_test, y_test, test_indices, allow_empty=True),
                          num_classes, name).validate()
