"""Fashion-MNIST from its IDX files (Xiao et al. 2017), e.g. as installed by Debian's
``dataset-fashion-mnist`` package in ``/usr/share/datasets/fashion-mnist``.

Where the files are looked for when no folder is given (:func:`default_dir`): the folder named
by the environment variable ``FEDJAXSPARSE_FASHION_MNIST`` if it is set, else Debian's folder.
:func:`write_idx` writes arrays in the same format (a prepared subset, or the stand-in
:func:`fedjaxsparse.data.standins.fashion_mnist_standin`)."""
from __future__ import annotations

import functools
import gzip
import math
import os
import zlib

import numpy as np

from fedjaxsparse.data.federated import FederatedDataset, federate
from fedjaxsparse.data.partitions import partition as partition_fn
from fedjaxsparse.errors import DataError
from fedjaxsparse.data.standins import fashion_mnist_standin
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["default_dir", "write_idx", "write_split", "read_idx", "load_arrays", "fashion_mnist"]
__dir__ = _public_dir(__all__)

DEBIAN_DIR = "/usr/share/datasets/fashion-mnist"
ENV_VAR = "FEDJAXSPARSE_FASHION_MNIST"
FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
         "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
NUM_CLASSES = 10
STANDIN = "fashion_mnist_standin"  # the experiments' name of the labelled stand-in
STANDIN_SIZE = (6000, 1000)         # its train and test images (a tenth of the real set)


def default_dir() -> str:
  """The folder read when none is given: ``$FEDJAXSPARSE_FASHION_MNIST`` if set, else Debian's
  ``/usr/share/datasets/fashion-mnist``."""
  return os.environ.get(ENV_VAR) or DEBIAN_DIR


def write_idx(path: str, array: np.ndarray) -> None:
  """Write ``array`` (values in [0, 255]) as an unsigned-byte IDX file, gzip-compressed if
  ``path`` ends in ``.gz`` — the format :func:`read_idx` reads."""
  a = np.asarray(array)
  if a.size and (a.min() < 0 or a.max() > 255):
    raise ValueError(f"array must hold values in [0, 255] for an unsigned-byte IDX file, got "
                     f"[{a.min()}, {a.max()}].")
  header = bytes([0, 0, 8, a.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in a.shape)
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "wb") as f:
    f.write(header + a.astype(np.uint8).tobytes())


def write_split(data_dir: str, split: str, images: np.ndarray, labels: np.ndarray) -> None:
  """Write one split (``images uint8 [n, 28, 28]``, ``labels [n]``) under the official file
  names (gzip-compressed) into ``data_dir``."""
  os.makedirs(data_dir, exist_ok=True)
  image_stem, label_stem = FILES[split]
  write_idx(os.path.join(data_dir, image_stem + ".gz"), images)
  write_idx(os.path.join(data_dir, label_stem + ".gz"), labels)


def read_idx(path: str) -> np.ndarray:
  """An IDX file (gzip-compressed or not) as a uint8 array of its declared shape.

  Raises DataError if the header is not an unsigned-byte IDX header or the payload is not
  exactly the declared size.
  """
  opener = gzip.open if path.endswith(".gz") else open
  try:
    with opener(path, "rb") as f:
      data = f.read()
  except (EOFError, gzip.BadGzipFile, zlib.error) as e:
    raise DataError(f"{path}: corrupt or truncated gzip file ({e})") from e
  if len(data) < 4 or data[:3] != b"\x00\x00\x08":
    raise DataError(f"{path}: not an unsigned-byte IDX file: expected magic bytes "
                    f"00 00 08 NDIM, got {data[:4].hex(' ') or 'an empty file'}.")
  ndim = data[3]
  header = 4 + 4 * ndim
  if len(data) < header:
    raise DataError(f"{path}: truncated IDX file: the header of {ndim} dimensions needs "
                    f"{header} bytes, found {len(data)} bytes.")
  shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
  expected, found = math.prod(shape), len(data) - header
  if found != expected:
    declared = f"header declares shape ({', '.join(map(str, shape))}) = {expected} bytes"
    if found < expected:
      records = found // max(math.prod(shape[1:]), 1)
      raise DataError(f"{path}: truncated IDX file: {declared}, found {found} bytes "
                      f"({records} complete records).")
    raise DataError(f"{path}: {declared}, found {found} bytes "
                    f"({found - expected} extra bytes at the end).")
  return np.frombuffer(data, np.uint8, offset=header).reshape(shape)


def _find(data_dir: str, stem: str) -> str:
  for name in (stem + ".gz", stem):
    path = os.path.join(data_dir, name)
    if os.path.exists(path):
      return path
  raise FileNotFoundError(
      f"Fashion-MNIST file {stem}[.gz] not found in {data_dir!r}. Install Debian's package "
      "(`apt-get install dataset-fashion-mnist`, files in "
      f"{DEBIAN_DIR}) or put the four IDX files (train/t10k images and labels) in a folder "
      f"and pass it as data_dir (CLI: --data-dir) or in ${ENV_VAR}.")


@functools.lru_cache(maxsize=1)
def _standins() -> tuple:
  """Both stand-in splits, generated once (a train and a test load each need one)."""
  return fashion_mnist_standin(*STANDIN_SIZE, seed=0)


def _standin_split(split: str):
  train, test = _standins()
  return train if split == "train" else test


def load_arrays(data_dir: str | None = None, split: str = "train", standin: bool = False):
  """``(x float32 [n, 28, 28, 1] in [0, 1], y int32 [n])`` of one split.

  Raises DataError if the files disagree on the count, an image is not 28x28 or a label is
  not in [0, 10) (records count from 0). ``data_dir=None`` reads :func:`default_dir`.
  ``standin=True`` reads nothing: the labelled stand-in of Fashion-MNIST's shape
  (:func:`fedjaxsparse.data.standins.fashion_mnist_standin`, ``STANDIN_SIZE`` images; the
  experiments' ``--dataset fashion_mnist_standin``).
  """
  if split not in FILES:
    raise ValueError(f"split must be one of {tuple(FILES)}, got {split!r}.")
  if standin:
    x, y = _standin_split(split)
    return x[..., None].astype(np.float32) / 255.0, y.astype(np.int32)  # fresh copies
  data_dir = data_dir or default_dir()
  image_path, label_path = (_find(data_dir, s) for s in FILES[split])
  images, labels = read_idx(image_path), read_idx(label_path)
  if images.ndim != 3 or images.shape[1:] != (28, 28):
    raise DataError(f"{image_path}: expected images of shape (N, 28, 28), got "
                    f"{images.shape}.")
  if labels.ndim != 1:
    raise DataError(f"{label_path}: expected labels of shape (N,), got {labels.shape}.")
  if len(images) != len(labels):
    raise DataError(f"{image_path} holds {len(images)} images but {label_path} holds "
                    f"{len(labels)} labels.")
  bad = np.flatnonzero(labels >= NUM_CLASSES)
  if bad.size:
    raise DataError(f"{label_path}, record {bad[0]}: label {labels[bad[0]]} outside "
                    f"[0, {NUM_CLASSES}).")
  return (images[..., None].astype(np.float32) / 255.0), labels.astype(np.int32)


def fashion_mnist(data_dir: str | None = None, num_clients: int = 100,
                  partition: str = "dirichlet", alpha: float = 0.5, seed: int = 0,
                  shards_per_client: int = 2, sigma: float = 0.3,
                  labels_per_client: int = 3, standin: bool = False) -> FederatedDataset:
  """The 60k training images split over clients by ``partition``; the official 10k test
  images are the shared test set (one test client), as in FedAvg-style evaluations.
  ``standin=True``: the labelled stand-in instead (see :func:`load_arrays`)."""
  x, y = load_arrays(data_dir, "train", standin)
  xt, yt = load_arrays(data_dir, "test", standin)
  parts = partition_fn(y, num_clients, partition, seed, alpha=alpha,
                       shards_per_client=shards_per_client, sigma=sigma,
                       labels_per_client=labels_per_client)
  name = (STANDIN if standin else "fashion_mnist") + f"/{partition}" + (f"({alpha})" if partition == "dirichlet" else
                                         f"({labels_per_client})" if partition == "labels"
                                         else "")
  return federate(x, y, parts, num_classes=NUM_CLASSES, name=name, x_test=xt, y_test=yt)
