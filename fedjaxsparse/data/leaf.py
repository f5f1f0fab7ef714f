"""LEAF's FEMNIST (Caldas et al. 2018): handwritten characters, one client per writer.

Layout of LEAF's preprocessed data (``data/femnist/data`` after ``preprocess.sh``):
``train/*.json`` and ``test/*.json``, each ``{"users": [...], "num_samples": [...],
"user_data": {user: {"x": [[784 floats]], "y": [ints]}}}``. Writers keep their own train and
test examples; ``num_clients`` keeps the first writers in file order (the Sparse-ProxSkip
paper, Meinhardt et al. 2024, uses 100).

Source for the team: seed 000 (100 writers), §4.2 (unrestricted test set).
"""
from __future__ import annotations

import glob
import json
import os

import numpy as np

from fedjaxsparse.data.federated import FederatedDataset, federate
from fedjaxsparse.errors import DataError
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["read_leaf_json", "femnist"]
__dir__ = _public_dir(__all__)

NUM_CLASSES = 62
NUM_PIXELS = 28 * 28


def _user_arrays(path: str, user: str, rec) -> tuple[np.ndarray, np.ndarray]:
  """One writer's ``(x float32 [n, 28, 28, 1], y int32 [n])``; DataError names the file, the
  writer and the example (counted from 0) that is malformed."""
  where = f"{path}, user {user!r}"
  if not isinstance(rec, dict):
    raise DataError(f"{where}: expected an object with 'x' and 'y', got {type(rec).__name__}.")
  for key in ("x", "y"):
    if key not in rec:
      raise DataError(f"{where}: missing key {key!r}.")
    if not isinstance(rec[key], list):
      raise DataError(f"{where}: {key!r} must be a list, got {type(rec[key]).__name__}.")
  xs, ys = rec["x"], rec["y"]
  if len(xs) != len(ys):
    raise DataError(f"{where}: {len(xs)} images in 'x' but {len(ys)} labels in 'y'.")
  for i, image in enumerate(xs):
    if not isinstance(image, list) or len(image) != NUM_PIXELS:
      got = len(image) if isinstance(image, list) else type(image).__name__
      raise DataError(f"{where}, example {i}: expected {NUM_PIXELS} pixel values, got {got}.")
  try:
    x = np.asarray(xs, np.float32).reshape(-1, NUM_PIXELS)
  except (TypeError, ValueError):
    x = None
  if x is None or not np.isfinite(x).all():
    for i, image in enumerate(xs):
      try:
        row = np.asarray(image, np.float32)
      except (TypeError, ValueError):
        raise DataError(f"{where}, example {i}: pixel values must be numbers.") from None
      if not np.isfinite(row).all():
        j = int(np.flatnonzero(~np.isfinite(row))[0])
        raise DataError(f"{where}, example {i}: pixel value at position {j} is not finite "
                        "(NaN, infinity or null).")
  for i, label in enumerate(ys):
    if (isinstance(label, bool) or not isinstance(label, (int, float))
        or isinstance(label, float) and not label.is_integer()):
      raise DataError(f"{where}, example {i}: label {label!r} is not an integer.")
    if not 0 <= label < NUM_CLASSES:
      raise DataError(f"{where}, example {i}: label {label!r} outside [0, {NUM_CLASSES}).")
  return x.reshape(-1, 28, 28, 1), np.asarray(ys, np.int32)


def read_leaf_json(path: str) -> dict:
  """One LEAF JSON file, checked for LEAF's layout (an object with a ``users`` list and a
  ``user_data`` object); DataError names the file and the problem."""
  try:
    with open(path, encoding="utf-8") as f:
      blob = json.load(f)
  except json.JSONDecodeError as e:
    raise DataError(f"{path}: invalid JSON at line {e.lineno}, column {e.colno}: "
                    f"{e.msg}.") from e
  except UnicodeDecodeError as e:
    raise DataError(f"{path}: not UTF-8 text ({e}).") from e
  if not isinstance(blob, dict):
    raise DataError(f"{path}: expected a JSON object with 'users' and 'user_data', got "
                    f"{type(blob).__name__}.")
  for key in ("users", "user_data"):
    if key not in blob:
      raise DataError(f"{path}: missing key {key!r}.")
  if not isinstance(blob["users"], list) or not isinstance(blob["user_data"], dict):
    raise DataError(f"{path}: 'users' must be a list and 'user_data' an object.")
  return blob


def _read_split(directory: str) -> dict:
  """``{writer: (x, y)}`` of all JSON files in ``directory``; DataError names the file (and
  the writer and example) of malformed content."""
  paths = sorted(glob.glob(os.path.join(directory, "*.json")))
  users = {}
  for path in paths:
    blob = read_leaf_json(path)
    for u in blob["users"]:
      if u not in blob["user_data"]:
        raise DataError(f"{path}, user {u!r}: listed in 'users' but missing from "
                        "'user_data'.")
      users[u] = _user_arrays(path, u, blob["user_data"][u])
  return users


TEST_SETS = ("writers", "all")


def femnist(data_dir: str | None = None, num_clients: int | None = None,
            test: str = "writers") -> FederatedDataset:
  """FEMNIST with ``x [n, 28, 28, 1]`` in [0, 1] and 62 classes, natural split by writer.

  ``test="writers"``: each kept writer's own test examples (a per-client test split);
  ``test="all"``: the standard *unrestricted* test set — the test examples of every writer in
  the files, also those not kept by ``num_clients`` — as one shared test client (Section 4.2
  of the Sparse-ProxSkip paper restricts training to 100 writers but evaluates on the
  unrestricted test set).
  """
  if test not in TEST_SETS:
    raise ValueError(f"test must be one of {TEST_SETS}, got {test!r}.")
  train_dir = os.path.join(data_dir or "", "train")
  test_dir = os.path.join(data_dir or "", "test")
  if data_dir is None or not glob.glob(os.path.join(train_dir, "*.json")):
    raise FileNotFoundError(
        f"no LEAF FEMNIST JSON files in {train_dir!r}. Generate them with LEAF "
        "(github.com/TalwalkarLab/leaf, data/femnist: ./preprocess.sh -s niid --sf 1.0 -k 0 "
        "-t sample) and pass the directory holding train/ and test/ as data_dir "
        "(CLI: --data-dir).")
  if num_clients is not None and not num_clients >= 1:
    raise ValueError(f"num_clients must be >= 1, got {num_clients}.")
  train = _read_split(train_dir)
  test_split = _read_split(test_dir)
  writers = list(train)[:num_clients]

  def stack(split, who):
    xs, ys, parts, start = [], [], [], 0
    for u in who:
      x, y = split.get(u, (np.zeros((0, 28, 28, 1), np.float32), np.zeros(0, np.int32)))
      xs.append(x)
      ys.append(y)
      parts.append(np.arange(start, start + len(x)))
      start += len(x)
    return np.concatenate(xs), np.concatenate(ys), parts

  x, y, parts = stack(train, writers)
  if test == "all":
    xt, yt, _ = stack(test_split, list(test_split))
    tparts = None  # one shared test client
  else:
    xt, yt, tparts = stack(test_split, writers)
  return federate(x, y, parts, num_classes=NUM_CLASSES,
                  name=f"femnist({len(writers)} writers, test={test})", x_test=xt, y_test=yt,
                  test_indices=tparts)
