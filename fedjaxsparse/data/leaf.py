"""LEAF's FEMNIST (Caldas et al. 2018): handwritten characters, one client per writer.

Layout of LEAF's preprocessed data (``data/femnist/data`` after ``preprocess.sh``):
``train/*.json`` and ``test/*.json``, each ``{"users": [...], "num_samples": [...],
"user_data": {user: {"x": [[784 floats]], "y": [ints]}}}``. Writers keep their own train and
test examples; ``num_writers`` keeps the first writers in file order (seed 000 uses 100).
"""
from __future__ import annotations

import glob
import json
import os

import numpy as np

from fedjaxsparse.data.federated import FederatedDataset, federate

NUM_CLASSES = 62


def _read_split(directory: str) -> dict:
  paths = sorted(glob.glob(os.path.join(directory, "*.json")))
  users = {}
  for path in paths:
    with open(path) as f:
      blob = json.load(f)
    for u in blob["users"]:
      users[u] = blob["user_data"][u]
  return users


def femnist(data_dir: str, num_writers: int | None = None) -> FederatedDataset:
  """FEMNIST with ``x [n, 28, 28, 1]`` in [0, 1] and 62 classes, natural split by writer."""
  train_dir = os.path.join(data_dir or "", "train")
  test_dir = os.path.join(data_dir or "", "test")
  if not glob.glob(os.path.join(train_dir, "*.json")):
    raise FileNotFoundError(
        f"no LEAF FEMNIST JSON files in {train_dir!r}. Generate them with LEAF "
        "(github.com/TalwalkarLab/leaf, data/femnist: ./preprocess.sh -s niid --sf 1.0 -k 0 "
        "-t sample) and pass the directory holding train/ and test/ as data_dir "
        "(CLI: --data-dir).")
  if num_writers is not None and not num_writers >= 1:
    raise ValueError(f"num_writers must be >= 1, got {num_writers}.")
  train = _read_split(train_dir)
  test = _read_split(test_dir)
  writers = list(train)[:num_writers]

  def stack(split, who):
    xs, ys, parts, start = [], [], [], 0
    for u in who:
      rec = split.get(u, {"x": [], "y": []})
      x = np.asarray(rec["x"], np.float32).reshape(-1, 28, 28, 1)
      xs.append(x)
      ys.append(np.asarray(rec["y"], np.int32))
      parts.append(np.arange(start, start + len(x)))
      start += len(x)
    return np.concatenate(xs), np.concatenate(ys), parts

  x, y, parts = stack(train, writers)
  xt, yt, tparts = stack(test, writers)
  return federate(x, y, parts, num_classes=NUM_CLASSES, name=f"femnist({len(writers)} writers)",
                  x_test=xt, y_test=yt, test_indices=tparts)
