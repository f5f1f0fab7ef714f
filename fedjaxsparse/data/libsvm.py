"""LIBSVM / svmlight files (a9a, w8a, mushrooms, phishing, ...) via scikit-learn's reader.

Binary labels are mapped to {0, 1}: the smaller label value becomes 0 ({-1, +1} → {0, 1},
{1, 2} → {0, 1}); multi-class labels are mapped to 0..C−1 in sorted order.
"""
from __future__ import annotations

import os

import numpy as np

from fedjaxsparse.data.federated import FederatedDataset, federate
from fedjaxsparse.data.partition import partition as partition_fn


def load_arrays(path: str, num_features: int | None = None):
  """``(x float32 [n, d] dense, y int32 [n] in 0..C−1)`` of one svmlight file."""
  from sklearn.datasets import load_svmlight_file
  if not path or not os.path.exists(path):
    raise FileNotFoundError(
        f"LIBSVM file {path!r} not found. Download it from the LIBSVM datasets page "
        "(binary classification: a9a, w8a, mushrooms, phishing, ...) and pass its path "
        "(CLI: --data-dir PATH).")
  x, y = load_svmlight_file(path, n_features=num_features)
  _, y = np.unique(y, return_inverse=True)
  return np.asarray(x.todense(), np.float32), y.astype(np.int32)


def libsvm(data_dir: str, num_clients: int = 10, partition: str = "iid", seed: int = 0,
           alpha: float = 0.5, test_path: str | None = None,
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
