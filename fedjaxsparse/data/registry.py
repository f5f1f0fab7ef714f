"""Datasets by name: ``load_dataset(name, **kwargs) -> FederatedDataset``.

Source for the team: seed 001 ch. 4, Table C.1 (``emnist_l10``).
"""
from __future__ import annotations

import importlib
from typing import NamedTuple

from fedjaxsparse.data.federated import FederatedDataset
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["Source", "REGISTRY", "DATASETS", "ARRAYS", "OFFLINE", "load_dataset", "load_arrays",
           "data_status"]
__dir__ = _public_dir(__all__)

class Source(NamedTuple):
  """One data set the library knows by name: how it loads and what a run on it means.

  Attributes:
    federated: ``(module, loader)`` of :func:`load_dataset` (``--dataset``), or ``None``.
    arrays: ``(module, function, its source name, label offset, classes kept)`` of
      :func:`load_arrays`, or ``None``.
    offline: it ships with the package or its dependencies (loads on a machine with nothing
      but the install); otherwise it is read from the user's files.
    standin_of: the real set whose shape this labelled stand-in has (``None``: real data).
    loader: where an experiment-specific loader lives when neither of the above (e.g.
      ``"fedjaxsparse.data.pascal_voc"``).
  """
  federated: tuple[str, str] | None = None
  arrays: tuple | None = None
  offline: bool = False
  standin_of: str | None = None
  loader: str | None = None


_TFDS = "fedjaxsparse.data.tfds_sources"
_FMNIST = ("fedjaxsparse.data.fashion_mnist", "load_arrays", None, 0, None)
REGISTRY = {
    "digits": Source(("fedjaxsparse.data.embedded", "digits"),
                     ("sklearn.datasets", "load_digits", None, 0, None), offline=True),
    "diabetes": Source(("fedjaxsparse.data.embedded", "diabetes"), offline=True),
    "synthetic": Source(("fedjaxsparse.data.embedded", "synthetic"), offline=True),
    "breast_cancer": Source(offline=True, loader="fedjaxsparse.data.libsvm"),
    "shakespeare": Source(("fedjaxsparse.data.shakespeare", "shakespeare"), offline=True),
    "none": Source(offline=True),   # an experiment that reads no data (arithmetic on shapes)
    "fashion_mnist": Source(("fedjaxsparse.data.fashion_mnist", "fashion_mnist"), _FMNIST),
    "fashion_mnist_standin": Source(arrays=_FMNIST, offline=True, standin_of="fashion_mnist"),
    "blogfeedback": Source(("fedjaxsparse.data.blogfeedback", "blogfeedback")),
    "blogfeedback_standin": Source(("fedjaxsparse.data.standins", "blogfeedback_standin"),
                                   offline=True, standin_of="blogfeedback"),
    "femnist": Source(("fedjaxsparse.data.leaf", "femnist")),
    "femnist_standin": Source(("fedjaxsparse.data.standins", "femnist_standin"), offline=True,
                              standin_of="femnist"),
    "libsvm": Source(("fedjaxsparse.data.libsvm", "libsvm")),
    # labelled stand-ins of LIBSVM files' shapes (the real files: --dataset libsvm --data-dir)
    **{f"{n}_standin": Source(offline=True, standin_of="libsvm",
                              loader="fedjaxsparse.data.libsvm")
       for n in ("mushrooms", "phishing", "a9a", "w8a")},
    "cifar10": Source((_TFDS, "cifar10"), (_TFDS, "load_split", "cifar10", 0, None)),
    "cifar100": Source((_TFDS, "cifar100"), (_TFDS, "load_split", "cifar100", 0, None)),
    "emnist": Source((_TFDS, "emnist")),
    "svhn": Source(arrays=(_TFDS, "load_split", "svhn_cropped", 0, None)),
    "emnist_l": Source(arrays=(_TFDS, "load_split", "emnist/letters", 1, None)),
    "emnist_l10": Source(arrays=(_TFDS, "load_split", "emnist/letters", 1, 10)),
    "imagenet": Source(loader="fedjaxsparse.data.imagenet"),
    "voc": Source(loader="fedjaxsparse.data.pascal_voc"),
    "voc_standin": Source(offline=True, standin_of="voc", loader="fedjaxsparse.data.pascal_voc"),
    "wikitext2": Source(loader="fedjaxsparse.pruning.lm"),
}
"""``{name: Source}``: every data set an experiment or loader accepts by name — the one
registry; :data:`DATASETS`, :data:`ARRAYS` and :data:`OFFLINE` are its views."""
DATASETS = {n: s.federated for n, s in REGISTRY.items() if s.federated is not None}
"""``{name: (module, loader)}``: the data sets :func:`load_dataset` (and ``--dataset``) knows,
loaded lazily from their modules (a view of :data:`REGISTRY`)."""


def load_dataset(name: str, **kwargs) -> FederatedDataset:
  """Load dataset ``name`` (one of ``DATASETS``) with the loader's keyword arguments."""
  if name not in DATASETS:
    raise ValueError(f"unknown dataset {name!r}; choose from {sorted(DATASETS)}.")
  module, fn = DATASETS[name]
  return getattr(importlib.import_module(module), fn)(**kwargs)


ARRAYS = {n: s.arrays for n, s in REGISTRY.items() if s.arrays is not None}
"""``{name: ...}``: the classification sets :func:`load_arrays` reads as centralised arrays (a
view of :data:`REGISTRY`).
``emnist_l`` is EMNIST Letters' 26 classes; ``emnist_l10`` its first ten (a-j), the
"EMNIST-L" of FedCR-style personalisation papers (e.g. FedP3, Yi et al. 2024; Table C.1 of Kai
Yi's dissertation: 10 classes, 48K + 8K examples — Letters holds 4,800 training and 800 test
images per class)."""
DIGITS_TRAIN = 1400
"""digits has no split of its own: its train split is the first ``DIGITS_TRAIN`` examples of a
fixed permutation (seed 0), its test split the other 397."""


def load_arrays(name: str, split: str = "train", data_dir: str | None = None):
  """``(x float32 [n, ...] in [0, 1], y int32 [n])``: one split of a classification set as
  centralised arrays, before any federation — ``"train"``, ``"test"`` or ``"all"`` (both, in
  that order; digits: its natural order). For experiments that partition pooled data their own
  way. ``fashion_mnist`` reads the IDX files (``data_dir`` or the default folder),
  ``fashion_mnist_standin`` their labelled stand-in, ``digits`` scikit-learn's bundled set,
  and ``cifar10``, ``cifar100``, ``svhn``, ``emnist_l`` (26 letters, labels from 0) and
  ``emnist_l10`` (letters a-j) tensorflow-datasets' prepared files (``data_dir``)."""
  import numpy as np
  if name not in ARRAYS:
    raise ValueError(f"load_arrays: name must be one of {sorted(ARRAYS)}, got {name!r}.")
  if split not in ("train", "test", "all"):
    raise ValueError(f"load_arrays: split must be 'train', 'test' or 'all', got {split!r}.")
  if name == "digits":
    from sklearn.datasets import load_digits
    x, y = load_digits(return_X_y=True)
    x, y = (x / 16.0).astype(np.float32), y.astype(np.int32)
    if split == "all":
      return x, y
    perm = np.random.default_rng(0).permutation(len(y))
    keep = perm[:DIGITS_TRAIN] if split == "train" else perm[DIGITS_TRAIN:]
    return x[keep], y[keep]
  if split == "all":
    parts = [load_arrays(name, s, data_dir) for s in ("train", "test")]
    return tuple(np.concatenate(a) for a in zip(*parts))
  module, fn, source, offset, classes = ARRAYS[name]
  loader = getattr(importlib.import_module(module), fn)
  if source is None:   # the Fashion-MNIST IDX files or their stand-in
    return loader(data_dir, split, name.endswith("_standin"))
  x, y = loader(source, split, data_dir)
  y = y - offset if offset else y
  if classes is not None:
    keep = (y >= 0) & (y < classes)
    x, y = x[keep], y[keep]
  return x, y


OFFLINE = frozenset(n for n, s in REGISTRY.items() if s.offline and s.standin_of is None)
"""The real data sets that ship with the package or its dependencies (scikit-learn's bundled
sets, the plays in ``fedjaxsparse/data``; ``"none"``: an experiment that reads no data): they
load on a machine with nothing but the install. Every other real set is read from the user's
files (a view of :data:`REGISTRY`)."""


def data_status(name: str) -> str:
  """What running on data set ``name`` means for a reader comparing with a paper:
  ``"stand-in"`` (a labelled substitute of the real data's shape: a ``*_standin`` name),
  ``"real offline"`` (one of :data:`OFFLINE`) or ``"real with files"`` (the real data, read from
  files the user supplies)."""
  source = REGISTRY.get(name)
  if (source is not None and source.standin_of is not None) or name.endswith("_standin"):
    return "stand-in"
  return "real offline" if name in OFFLINE else "real with files"
