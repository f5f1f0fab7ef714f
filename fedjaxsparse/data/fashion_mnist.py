"""Fashion-MNIST from its IDX files (Xiao et al. 2017), e.g. as installed by Debian's
``dataset-fashion-mnist`` package in ``/usr/share/datasets/fashion-mnist``."""
from __future__ import annotations

import gzip
import os

import numpy as np

from fedjaxsparse.data.federated import FederatedDataset, federate
from fedjaxsparse.data.partition import partition as partition_fn

DEFAULT_DIR = "/usr/share/datasets/fashion-mnist"
FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
         "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}


def read_idx(path: str) -> np.ndarray:
  """An IDX file (gzip-compressed or not) as a uint8 array of its declared shape."""
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rb") as f:
    data = f.read()
  if data[:2] != b"\x00\x00" or data[2] != 0x08:
    raise ValueError(f"{path} is not an unsigned-byte IDX file.")
  ndim = data[3]
  shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
  return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(shape)


def _find(data_dir: str, stem: str) -> str:
  for name in (stem + ".gz", stem):
    path = os.path.join(data_dir, name)
    if os.path.exists(path):
      return path
  raise FileNotFoundError(
      f"Fashion-MNIST file {stem}[.gz] not found in {data_dir!r}. Install Debian's package "
      "(`apt-get install dataset-fashion-mnist`, files in "
      f"{DEFAULT_DIR}) or put the four IDX files (train/t10k images and labels) there and "
      "pass data_dir (CLI: --data-dir).")


def load_arrays(data_dir: str = DEFAULT_DIR, split: str = "train"):
  """``(x float32 [n, 28, 28, 1] in [0, 1], y int32 [n])`` of one split."""
  images, labels = (read_idx(_find(data_dir, s)) for s in FILES[split])
  return (images[..., None].astype(np.float32) / 255.0), labels.astype(np.int32)


def fashion_mnist(data_dir: str = DEFAULT_DIR, num_clients: int = 100,
                  partition: str = "dirichlet", alpha: float = 0.5, seed: int = 0,
                  shards_per_client: int = 2, sigma: float = 0.3) -> FederatedDataset:
  """The 60k training images split over clients by ``partition``; the official 10k test
  images are the shared test set (one test client), as in FedAvg-style evaluations."""
  x, y = load_arrays(data_dir, "train")
  xt, yt = load_arrays(data_dir, "test")
  parts = partition_fn(y, num_clients, partition, seed, alpha=alpha,
                       shards_per_client=shards_per_client, sigma=sigma)
  name = f"fashion_mnist/{partition}" + (f"({alpha})" if partition == "dirichlet" else "")
  return federate(x, y, parts, num_classes=10, name=name, x_test=xt, y_test=yt)
