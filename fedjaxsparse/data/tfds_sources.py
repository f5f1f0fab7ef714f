"""CIFAR-10/100 and EMNIST through ``tensorflow_datasets`` data sources (no TensorFlow).

``tfds.data_source`` reads prepared ``array_record`` files with random access and needs no
TensorFlow. Nothing is downloaded here: the data must have been prepared before, e.g. on a
machine with network, ``tfds build cifar10 --data_dir DIR`` (array_record is the default
format of recent tfds), then ``data_dir=DIR``. With the data missing the loader fails at once
(tfds would otherwise retry downloads for minutes).

Source for the team: ``environment.md`` §2 (download retries); seed 000 (CIFAR-10 setting).
"""
from __future__ import annotations

import numpy as np

from fedjaxsparse.data.federated import FederatedDataset, federate
from fedjaxsparse.data.partitions import partition as partition_fn
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["data_source", "load_split", "cifar10", "cifar100", "emnist"]
__dir__ = _public_dir(__all__)


def data_source(name: str, split: str, data_dir: str | None):
  """tfds' random-access data source of a *prepared* dataset; a missing one fails at once with
  how to prepare it (nothing is downloaded)."""
  import tensorflow_datasets as tfds  # deferred: tensorflow-datasets is slow to import
  # deferred: tensorflow-datasets is slow to import
  from tensorflow_datasets.core.download import downloader
  downloader.MAX_RETRIES = 0  # belt and braces: download=False already avoids the network
  try:
    return tfds.data_source(name, split=split, data_dir=data_dir, download=False)
  except Exception as e:  # tfds raises AssertionError / NotImplementedError / FileNotFound
    where = (f"in {data_dir!r}" if data_dir else
             "(no --data-dir given, so tfds looked in its default folder ~/tensorflow_datasets)")
    cause = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
    raise FileNotFoundError(
        f"tfds dataset {name!r} ({split}) is not prepared {where}. On a machine with network "
        f"run `tfds build {name} --data_dir DIR`, copy DIR here and pass it with --data-dir "
        f"(Python: data_dir=DIR). tfds said: {cause}") from e


def load_split(name: str, split: str, data_dir: str | None,
               image_key: str = "image", label_key: str = "label"):
  """``(x float32 [n, H, W, C] in [0, 1], y int32 [n])`` from a prepared tfds dataset."""
  source = data_source(name, split, data_dir)
  n = len(source)
  records = [source[i] for i in range(n)]
  x = np.stack([np.asarray(r[image_key]) for r in records]).astype(np.float32) / 255.0
  y = np.asarray([r[label_key] for r in records], np.int32)
  return x, y


def _federated(name: str, classes: int, data_dir, num_clients, partition, alpha, seed,
               shards_per_client, sigma) -> FederatedDataset:
  x, y = load_split(name, "train", data_dir)
  xt, yt = load_split(name, "test", data_dir)
  parts = partition_fn(y, num_clients, partition, seed, alpha=alpha,
                       shards_per_client=shards_per_client, sigma=sigma)
  label = f"{name}/{partition}" + {"dirichlet": f"({alpha})", "lognormal": f"({sigma})",
                                    "dirichlet_lognormal": f"({alpha}, {sigma})"}.get(
                                        partition, "")
  return federate(x, y, parts, num_classes=classes, name=label, x_test=xt, y_test=yt)


def cifar10(data_dir: str | None = None, num_clients: int = 10, partition: str = "dirichlet",
            alpha: float = 0.3, seed: int = 0, shards_per_client: int = 2,
            sigma: float = 0.3) -> FederatedDataset:
  """CIFAR-10 (the ResNet-18 setting of the Sparse-ProxSkip paper, Meinhardt et al. 2024: 10
  clients, Dirichlet 0.3)."""
  return _federated("cifar10", 10, data_dir, num_clients, partition, alpha, seed,
                    shards_per_client, sigma)


def cifar100(data_dir: str | None = None, num_clients: int = 10, partition: str = "dirichlet",
             alpha: float = 0.3, seed: int = 0, shards_per_client: int = 2,
             sigma: float = 0.3) -> FederatedDataset:
  """CIFAR-100 (fine labels)."""
  return _federated("cifar100", 100, data_dir, num_clients, partition, alpha, seed,
                    shards_per_client, sigma)


def emnist(data_dir: str | None = None, num_clients: int = 100, partition: str = "dirichlet",
           alpha: float = 0.5, seed: int = 0, config: str = "balanced",
           shards_per_client: int = 2, sigma: float = 0.3) -> FederatedDataset:
  """EMNIST (tfds config ``emnist/<config>``, default "balanced", 47 classes)."""
  classes = {"balanced": 47, "byclass": 62, "bymerge": 47, "digits": 10, "letters": 37,
             "mnist": 10}[config]
  return _federated(f"emnist/{config}", classes, data_dir, num_clients, partition, alpha,
                    seed, shards_per_client, sigma)
