"""BlogFeedback (Buza 2013, UCI) with its natural federated split.

Files: ``blogData_train.csv`` and the 60 ``blogData_test-2012.*.csv`` files; each row has 280
attributes and the target (comments in the next 24 h) in column 281. Clients are the source
websites: one client per distinct combination of the first 50 columns (554 clients on the
real data). As in the paper, every attribute is scaled to [0, 1] (min/max of the training
set; test values are clipped to [0, 1] so the out-of-distribution test split stays in the
model's range) and a constant-1 column is appended as the bias, so ``d = 281`` and the model
is ``linear_regression(281, use_bias=False)``. The target is left unscaled: the paper's
training losses (≈ 2.8·10⁷ for a sum of squared errors) are on raw comment counts. The test
split is one shared test client.

Source for the team: seed 000, appendix B.
"""
from __future__ import annotations

import glob
import math
import os
import warnings

import numpy as np

from fedjaxsparse.data.federated import FederatedDataset, federate
from fedjaxsparse.data.partitions import natural_partition
from fedjaxsparse.errors import DataError
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["blogfeedback"]
__dir__ = _public_dir(__all__)

TRAIN_FILE = "blogData_train.csv"
TEST_GLOB = "blogData_test-*.csv"
NUM_ATTRIBUTES = 280
SITE_COLUMNS = 50


def _data_lines(path: str):
  """``(line number, fields)`` of each non-blank, non-comment line, as np.loadtxt sees them."""
  with open(path, errors="replace") as f:
    for n, line in enumerate(f, 1):
      line = line.split("#", 1)[0].strip()
      if line:
        yield n, line.split(",")


def _column(c: int) -> str:
  """1-based column ``c`` and its role."""
  return f"column {c} ({'target' if c == NUM_ATTRIBUTES + 1 else 'attribute'})"


def _first_bad_line(path: str) -> str | None:
  """``"line N: why"`` for the first line that is not 281 finite numbers, or None."""
  for n, fields in _data_lines(path):
    if len(fields) != NUM_ATTRIBUTES + 1:
      return (f"line {n}: expected {NUM_ATTRIBUTES + 1} comma-separated values "
              f"({NUM_ATTRIBUTES} attributes and the target), got {len(fields)}")
    for c, field in enumerate(fields, 1):
      try:
        value = float(field)
      except ValueError:
        value = None
      if value is None or "_" in field:  # numpy rejects the 1_000 that float() takes
        return f"line {n}: {_column(c)} is {field.strip()[:40]!r}, not a number"
      if not math.isfinite(value):
        return f"line {n}: non-finite value in {_column(c)}"
  return None


def _read(path: str) -> np.ndarray:
  """The rows of one CSV file as float64 ``[n, 281]``; DataError names the file and line of
  a malformed row or a NaN/infinite value."""
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore", UserWarning)  # "input contained no data"
      data = np.loadtxt(path, delimiter=",", dtype=np.float64, ndmin=2)
  except ValueError as e:
    where = _first_bad_line(path)
    raise DataError(f"{path}, {where} (numpy: {e})" if where else f"{path}: {e}") from e
  if data.size == 0:
    raise DataError(f"{path}: no rows (the file is empty).")
  if data.shape[1] != NUM_ATTRIBUTES + 1 or not np.isfinite(data).all():
    where = _first_bad_line(path)  # every row has the same wrong width, or a NaN/inf
    raise DataError(f"{path}, {where}." if where else f"{path}: malformed, shape {data.shape}.")
  return data


def blogfeedback(data_dir: str | None = None, clip_test: bool = True) -> FederatedDataset:
  """The natural 554-client split of the training file and the pooled test files."""
  train_path = os.path.join(data_dir or "", TRAIN_FILE)
  test_paths = sorted(glob.glob(os.path.join(data_dir or "", TEST_GLOB)))
  if data_dir is None or not os.path.exists(train_path) or not test_paths:
    raise FileNotFoundError(
        f"BlogFeedback files not found in {data_dir!r}: need {TRAIN_FILE} and the "
        f"{TEST_GLOB} files from the UCI archive (BlogFeedback.zip, dataset 304). Unzip them "
        "into one directory and pass it as data_dir (CLI: --data-dir).")
  train = _read(train_path)
  test = np.concatenate([_read(p) for p in test_paths])
  x, y = train[:, :NUM_ATTRIBUTES], train[:, NUM_ATTRIBUTES]
  xt, yt = test[:, :NUM_ATTRIBUTES], test[:, NUM_ATTRIBUTES]
  lo, span = x.min(0), x.max(0) - x.min(0)
  span[span == 0] = 1.0
  x = (x - lo) / span
  xt = (xt - lo) / span
  if clip_test:
    xt = np.clip(xt, 0.0, 1.0)
  parts = natural_partition(train[:, :SITE_COLUMNS])
  bias = lambda a: np.concatenate([a, np.ones((len(a), 1))], 1).astype(np.float32)
  return federate(bias(x), y.astype(np.float32), parts, num_classes=0,
                  name=f"blogfeedback({len(parts)} sites)", x_test=bias(xt),
                  y_test=yt.astype(np.float32))
