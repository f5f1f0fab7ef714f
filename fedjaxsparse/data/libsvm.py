"""LIBSVM / svmlight files (a9a, w8a, mushrooms, phishing, ...) via scikit-learn's reader.

Binary labels are mapped to {0, 1}: the smaller label value becomes 0 ({-1, +1} → {0, 1},
{1, 2} → {0, 1}); multi-class labels are mapped to 0..C−1 in sorted order.
"""
from __future__ import annotations

import bz2
import gzip
import math
import os
import zlib

import numpy as np

from fedjaxsparse.data.federated import FederatedDataset, federate
from fedjaxsparse.data.partitions import partition as partition_fn
from fedjaxsparse.errors import DataError
from fedjaxsparse.errors import ConfigError
from fedjaxsparse.data.standins import BINARY_SHAPES, binary_arrays_like, mushrooms_arrays
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["load_sparse", "load_arrays", "libsvm", "binary_arrays"]
__dir__ = _public_dir(__all__)

FORMAT = "LABEL INDEX:VALUE ..."


def _open(path: str):
  """The file as bytes, decompressed by extension as scikit-learn's reader does."""
  if path.endswith(".gz"):
    return gzip.open(path, "rb")
  if path.endswith(".bz2"):
    return bz2.BZ2File(path, "rb")
  return open(path, "rb")


def _bad_number(token: bytes) -> str | None:
  """Why ``token`` is not a finite number (None if it is one)."""
  try:
    value = float(token)
  except ValueError:
    return "not a number"
  return None if math.isfinite(value) else "not finite"


def _line_problem(line: bytes) -> str | None:
  """Why one svmlight line is malformed (None if it is fine), checked as scikit-learn parses
  it: a label, an optional ``qid:Q``, then ``INDEX:VALUE`` pairs with increasing integer
  indices >= 0 (the reader guesses zero- or one-based) and finite values; ``#`` starts a
  comment."""
  tokens = line.split(b"#", 1)[0].split()
  if not tokens:
    return None
  reason = _bad_number(tokens[0])
  if reason:
    return f"label {tokens[0].decode(errors='replace')!r} is {reason}"
  features = tokens[1:]
  if features and features[0].startswith(b"qid"):
    qid = features.pop(0)
    if b":" not in qid:
      return f"{qid.decode(errors='replace')!r} is not 'qid:VALUE'"
  previous = -1
  for token in features:
    text = token.decode(errors="replace")
    if b":" not in token:
      return f"{text!r} is not INDEX:VALUE"
    index, value = token.split(b":", 1)
    try:
      index = int(index)
    except ValueError:
      return f"index in {text!r} is not an integer"
    if index < 0:
      return f"index in {text!r} is negative"
    if index <= previous:
      return f"index in {text!r} is not larger than the previous index {previous}"
    previous = index
    reason = _bad_number(value)
    if reason:
      return f"value in {text!r} is {reason}"
  return None


def _first_bad_line(path: str) -> DataError | None:
  """A DataError naming the first malformed line of ``path``, or None if all lines parse."""
  with _open(path) as f:
    for n, line in enumerate(f, 1):
      reason = _line_problem(line)
      if reason is not None:
        text = line.rstrip(b"\r\n").decode(errors="replace")[:80]
        return DataError(f"{path}, line {n}: expected {FORMAT!r}, got {text!r} ({reason})")
  return None


def load_sparse(path: str, num_features: int | None = None):
  """``(x scipy.sparse.csr_matrix float64 [n, d], y float64 [n])`` of one svmlight file, kept
  sparse (KDD2010- or Avazu-sized files fit in memory only this way) with the raw labels.

  Raises DataError naming the first malformed line (or the file, if it holds no examples).
  """
  from sklearn.datasets import load_svmlight_file  # deferred: scikit-learn is slow to import
  if not path or not os.path.exists(path):
    raise FileNotFoundError(
        f"LIBSVM file {path!r} not found. Download it from the LIBSVM datasets page "
        "(binary classification: a9a, w8a, rcv1, real-sim, kdd2010, avazu, ...) and pass its "
        "path (CLI: --data-dir PATH).")
  try:
    x, y = load_svmlight_file(path, n_features=num_features)
  except ValueError as e:
    raise (_first_bad_line(path) or DataError(f"{path}: {e}")) from e
  except (EOFError, gzip.BadGzipFile, zlib.error) as e:
    raise DataError(f"{path}: corrupt or truncated compressed file ({e})") from e
  if not (np.isfinite(x.data).all() and np.isfinite(y).all()):
    raise _first_bad_line(path) or DataError(f"{path}: non-finite label or value")
  if x.shape[0] == 0:
    with _open(path) as f:
      empty = not f.read(1)
    raise DataError(f"{path}: no examples (the file is "
                    + ("empty)" if empty else "all comments and blank lines)"))
  return x.tocsr(), y


def load_arrays(path: str, num_features: int | None = None):
  """``(x float32 [n, d] dense, y int32 [n] in 0..C−1)`` of one svmlight file (see
  :func:`load_sparse` for the checks)."""
  x, y = load_sparse(path, num_features)
  _, y = np.unique(y, return_inverse=True)
  return np.asarray(x.todense(), np.float32), y.astype(np.int32)


def libsvm(data_dir: str | None = None, num_clients: int = 10, partition: str = "iid",
           seed: int = 0, alpha: float = 0.5, test_path: str | None = None,
           test_fraction: float = 0.2) -> FederatedDataset:
  """The file at ``data_dir`` (a path) split over clients; with ``test_path`` the test file
  is the shared test set, otherwise each client holds out ``test_fraction`` of its data."""
  x, y = load_arrays(data_dir)
  parts = partition_fn(y, num_clients, partition, seed, alpha=alpha)
  name = f"libsvm:{os.path.basename(data_dir)}/{partition}"
  num_classes = int(y.max()) + 1
  if test_path is None:
    return federate(x, y, parts, num_classes=num_classes, name=name,
                    test_fraction=test_fraction, seed=seed)
  xt, yt = load_arrays(test_path, num_features=x.shape[1])
  return federate(x, y, parts, num_classes=num_classes, name=name, x_test=xt, y_test=yt)


def binary_arrays(name: str, data_dir: str | None, experiment: str = "") -> tuple:
  """``(x, y, label)`` of a binary classification set for the convex experiments:
  ``"libsvm"`` (the LIBSVM file at ``data_dir``), ``"mushrooms_standin"`` (the labelled
  synthetic stand-in of mushrooms' shape), ``"phishing_standin"``, ``"a9a_standin"``,
  ``"w8a_standin"`` (:func:`fedjaxsparse.data.standins.binary_arrays_like`) or
  ``"breast_cancer"`` (scikit-learn's real set, features scaled to [0, 1])."""
  if name == "libsvm":
    if not data_dir:
      raise FileNotFoundError("no LIBSVM file given: download it from "
                              "https://www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets/binary/ "
                              "and pass its path as --data-dir FILE.")
    x, y = load_arrays(data_dir)
    if y.max() != 1:
      raise ConfigError(f"{experiment} needs a binary classification file; {data_dir} has "
                        f"{int(y.max()) + 1} classes.")
    return x, y, f"libsvm:{os.path.basename(data_dir)}"
  if name == "mushrooms_standin":
    x, y = mushrooms_arrays()
    return x, y, "synthetic stand-in of mushrooms' shape (8124 x 112 one-hot)"
  if name.endswith("_standin") and name[:-len("_standin")] in BINARY_SHAPES:
    x, y = binary_arrays_like(name[:-len("_standin")])
    return x, y, f"synthetic stand-in of {name[:-len('_standin')]}'s shape ({x.shape[0]} x " \
                 f"{x.shape[1]} binary)"
  if name != "breast_cancer":
    others = ", ".join(f"{k}_standin" for k in BINARY_SHAPES)
    raise ConfigError(f"{experiment} runs on --dataset mushrooms_standin, {others} or "
                      f"breast_cancer (embedded) or libsvm (with --data-dir FILE), got {name!r}.")
  from sklearn.datasets import load_breast_cancer  # deferred: scikit-learn is slow to import
  x, y = load_breast_cancer(return_X_y=True)
  x = (x - x.min(0)) / (x.max(0) - x.min(0))
  return x.astype(np.float32), y.astype(np.int32), "breast_cancer (embedded stand-in)"
