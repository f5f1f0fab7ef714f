"""Datasets by name: ``load_dataset(name, **kwargs) -> FederatedDataset``."""
from __future__ import annotations

import importlib

from fedjaxsparse.data.federated import FederatedDataset

# name -> (module, function); modules are imported on use so a loader's optional
# dependencies never slow down the others.
DATASETS = {
    "digits": ("fedjaxsparse.data.embedded", "digits"),
    "diabetes": ("fedjaxsparse.data.embedded", "diabetes"),
    "synthetic": ("fedjaxsparse.data.embedded", "synthetic"),
    "fashion_mnist": ("fedjaxsparse.data.fashion_mnist", "fashion_mnist"),
    "blogfeedback": ("fedjaxsparse.data.blogfeedback", "blogfeedback"),
    "femnist": ("fedjaxsparse.data.leaf", "femnist"),
    "femnist_standin": ("fedjaxsparse.data.standins", "femnist_standin"),
    "blogfeedback_standin": ("fedjaxsparse.data.standins", "blogfeedback_standin"),
    "libsvm": ("fedjaxsparse.data.libsvm", "libsvm"),
    "shakespeare": ("fedjaxsparse.data.shakespeare", "shakespeare"),
    "cifar10": ("fedjaxsparse.data.tfds_sources", "cifar10"),
    "cifar100": ("fedjaxsparse.data.tfds_sources", "cifar100"),
    "emnist": ("fedjaxsparse.data.tfds_sources", "emnist"),
}
"""``{name: (module, loader)}``: the data sets :func:`load_dataset` (and ``--dataset``) knows,
loaded lazily from their modules."""


def load_dataset(name: str, **kwargs) -> FederatedDataset:
  """Load dataset ``name`` (one of ``DATASETS``) with the loader's keyword arguments."""
  if name not in DATASETS:
    raise ValueError(f"unknown dataset {name!r}; choose from {sorted(DATASETS)}.")
  module, fn = DATASETS[name]
  return getattr(importlib.import_module(module), fn)(**kwargs)
