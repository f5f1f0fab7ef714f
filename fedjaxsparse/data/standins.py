"""Synthetic stand-ins of the papers' data sets, of the same shape, for offline runs.

A paper configuration (:mod:`fedjaxsparse.harness.protocol`) runs on the real data when its files are
present and on one of these otherwise; every output then names the stand-in. They reproduce
the *shape* of a protocol — clients, examples per client, features, classes, heterogeneity —
not its numbers: accuracies and R² on a stand-in are not comparable with the paper's.

* :func:`femnist_standin`: LEAF FEMNIST's shape (28×28×1 in [0, 1], 62 classes, writers of
  log-normal size with LEAF's mean 227 and s.d. 89 examples, digits about half the examples
  as in FEMNIST), each writer with its own stroke offset and label mix; the test split is the
  "unrestricted" kind: examples of the kept writers *and* of as many unseen writers.
* :func:`blogfeedback_standin`: BlogFeedback's shape (554 sites with log-normal sizes, mean
  ≈ 95 and max ≈ 1,100 examples, 280 attributes scaled to [0, 1] plus the bias column, a
  non-negative heavy-tailed target, a pooled test split of 7,624 rows).
* :func:`mushrooms_arrays`: mushrooms' shape (8,124 × 112 one-hot, 22 attributes).
* :func:`binary_arrays_like`: the shapes of LIBSVM's phishing (11,055 × 68), a9a (32,561 ×
  123) and w8a (49,749 × 300) binary sets: 0/1 features of the real set's density and class
  balance.
* :func:`fashion_mnist_standin`: Fashion-MNIST's files (uint8 28×28 images, 10 balanced
  classes), for writing IDX files with :func:`fedjaxsparse.data.fashion_mnist.write_split`.

Source for the team: seed 000 (FEMNIST's unrestricted test set).
"""
from __future__ import annotations

import numpy as np

from fedjaxsparse.data.federated import FederatedDataset, federate
from fedjaxsparse.data.partitions import lognormal_sizes
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["femnist_standin", "fashion_mnist_standin", "blogfeedback_standin", "mushrooms_arrays",
           "binary_arrays_like"]
__dir__ = _public_dir(__all__)

FEMNIST_MEAN, FEMNIST_SD = 226.83, 88.94  # LEAF (Caldas et al. 2018), Table 1
MUSHROOM_CARDINALITIES = (6, 4, 10, 2, 9, 2, 2, 2, 12, 2, 4, 4, 4, 9, 9, 1, 4, 3, 5, 9, 6, 3)
BINARY_SHAPES = {"phishing": (11055, 68, 0.557, 30 / 68), "a9a": (32561, 123, 0.241, 13.87 / 123),
                 "w8a": (49749, 300, 0.0297, 11.65 / 300)}
"""LIBSVM binary sets: ``name -> (examples, features, fraction of class 1, mean fraction of
non-zero features)``, from the LIBSVM data page and the files' statistics."""


def _roll_each(images: np.ndarray, shifts: np.ndarray) -> np.ndarray:
  """``np.stack([np.roll(a, tuple(t), axis=(0, 1)) for a, t in zip(images, shifts)])``, one
  ``np.roll`` per distinct shift instead of one per image."""
  out = np.empty_like(images)
  for t in np.unique(shifts, axis=0):
    sel = np.all(shifts == t, axis=1)
    out[sel] = np.roll(images[sel], tuple(t), axis=(1, 2))
  return out


def _smooth(noise: np.ndarray, passes: int) -> np.ndarray:
  """A 3×3 box blur applied ``passes`` times over the last two axes."""
  for _ in range(passes):
    p = np.pad(noise, [(0, 0)] * (noise.ndim - 2) + [(1, 1), (1, 1)], mode="edge")
    noise = sum(p[..., i:i + noise.shape[-2], j:j + noise.shape[-1]]
                for i in range(3) for j in range(3)) / 9.0
  return noise


def femnist_standin(num_clients: int = 100, seed: int = 0, noise: float = 0.5,
                    test: str = "all") -> FederatedDataset:
  """FEMNIST's shape: ``x [n, 28, 28, 1]`` in [0, 1], 62 classes, one client per writer.

  ``test="all"``: one shared test client with the test examples of twice as many writers
  (FEMNIST's unrestricted test set, as in the Sparse-ProxSkip paper); ``"writers"``: each
  writer's own test examples as its test split (personalised evaluation), as
  :func:`fedjaxsparse.data.leaf.femnist`.

  Class ``c`` has a smooth random stroke image; writer ``w`` shifts it by its own offset
  (up to ±2 pixels) and contrast, draws its labels from its own Dirichlet(1) mix around
  FEMNIST's class frequencies (digits ≈ 50 %), and adds pixel noise of s.d. ``noise``.
  """
  if test not in ("all", "writers"):
    raise ValueError(f"test must be 'all' or 'writers', got {test!r}.")
  own = test == "writers"
  rng = np.random.default_rng(seed)
  protos = _smooth(0.5 * rng.normal(size=(1, 28, 28)) + rng.normal(size=(62, 28, 28)), 3)
  protos = (protos > np.quantile(protos, 0.8, axis=(1, 2), keepdims=True)).astype(np.float32)
  freq = np.r_[np.full(10, 0.05), np.full(52, 0.5 / 52)]

  def writer(n, r):
    labels = r.choice(62, n, p=r.dirichlet(30 * freq))
    shift = r.integers(-2, 3, 2)
    img = np.roll(protos[labels], tuple(shift), axis=(1, 2)) * r.uniform(0.6, 1.0)
    jitter = r.integers(-1, 2, (n, 2))  # each example's own ±1 pixel offset
    img = _roll_each(img, jitter)
    img = img + noise * r.normal(size=img.shape)
    return np.clip(img, 0, 1)[..., None].astype(np.float32), labels.astype(np.int32)

  sigma = np.sqrt(np.log1p((FEMNIST_SD / FEMNIST_MEAN) ** 2))
  sizes = np.maximum(2, np.round(rng.lognormal(np.log(FEMNIST_MEAN) - sigma ** 2 / 2, sigma,
                                               2 * num_clients))).astype(int)
  train, test_parts = [], []
  for w in range(2 * num_clients):  # writers num_clients.. are only in the test split
    x, y = writer(int(sizes[w]), np.random.default_rng([seed, w]))
    n_test = max(1, int(round(0.1 * len(y))))
    if w < num_clients:
      train.append((x[n_test:], y[n_test:]))
    test_parts.append((x[:n_test], y[:n_test]))
  cat = lambda parts, i: np.concatenate([p[i] for p in parts])
  ranges = lambda parts: [np.arange(a, b) for a, b in zip(*(lambda c: (c[:-1], c[1:]))(
      np.cumsum([0] + [len(p[1]) for p in parts])))]
  test = test_parts[:num_clients] if own else test_parts
  return federate(cat(train, 0), cat(train, 1), ranges(train), num_classes=62,
                  name=f"femnist_standin({num_clients} writers, synthetic)",
                  x_test=cat(test, 0), y_test=cat(test, 1),
                  test_indices=ranges(test) if own else None)


def fashion_mnist_standin(num_train: int = 60000, num_test: int = 10000, seed: int = 0,
                          noise: float = 0.35):
  """Fashion-MNIST's arrays: ``((x uint8 [n, 28, 28], y uint8 [n]), (xt, yt))``, 10 classes in
  equal numbers (shuffled), as the IDX files hold them.

  Class ``c`` is a smooth random silhouette; each image scales it by its own contrast, shifts
  it by up to ±2 pixels and adds pixel noise of s.d. ``noise`` — learnable (a small network
  separates the classes) but not trivially (linear models err on a share of it).
  """
  if num_train < 1 or num_test < 1:
    raise ValueError(f"num_train and num_test must be >= 1, got {num_train}, {num_test}.")
  rng = np.random.default_rng(seed)
  protos = _smooth(rng.normal(size=(10, 28, 28)), 3)
  protos = (protos > np.quantile(protos, 0.6, axis=(1, 2), keepdims=True)).astype(np.float64)

  def split(n, r):
    labels = r.permutation(np.arange(n) % 10)
    shift = r.integers(-2, 3, (n, 2))
    img = _roll_each(protos[labels], shift)
    img = img * r.uniform(0.5, 1.0, (n, 1, 1)) + noise * r.normal(size=img.shape)
    return np.round(255 * np.clip(img, 0, 1)).astype(np.uint8), labels.astype(np.uint8)

  return split(num_train, np.random.default_rng([seed, 0])), split(num_test,
                                                                   np.random.default_rng([seed, 1]))


def blogfeedback_standin(num_clients: int = 554, seed: int = 0) -> FederatedDataset:
  """BlogFeedback's shape: ``x [n, 281]`` (280 attributes in [0, 1] and the bias column),
  a non-negative target, ``num_clients`` sites with log-normal sizes (σ = 1, mean 94.6
  examples as the real 52,397 / 554), and one pooled test client of 7,624 rows.

  Each site has its own attribute profile; the target is a sparse linear function of the
  attributes plus heavy-tailed (Student-t, 3 d.o.f.) noise, clipped at 0 like comment counts.
  """
  rng = np.random.default_rng(seed)
  sizes = lognormal_sizes(int(round(94.6 * num_clients)), num_clients, 1.0, seed)
  profile = rng.beta(0.5, 2.0, (num_clients, 280))
  w = rng.normal(size=280) * (rng.random(280) < 0.2) * 20.0

  def rows(site):
    # clip(profile[site] + 0.15 z, 0, 1), in place (the same numbers, no temporaries the
    # size of x)
    x = rng.normal(size=(len(site), 280))
    x *= 0.15
    x += profile[site]
    np.clip(x, 0, 1, out=x)
    y = np.maximum(0.0, x @ w - np.quantile(profile @ w, 0.5) + 15 * rng.standard_t(3, len(site)))
    out = np.empty((len(site), 281), np.float32)   # [x, 1] as float32
    out[:, :280] = x
    out[:, 280] = 1.0
    return out, y.astype(np.float32)

  site = np.repeat(np.arange(num_clients), sizes)
  x, y = rows(site)
  xt, yt = rows(rng.integers(0, num_clients, 7624))
  bounds = np.cumsum(np.r_[0, sizes])
  return federate(x, y, [np.arange(a, b) for a, b in zip(bounds[:-1], bounds[1:])],
                  num_classes=0, name=f"blogfeedback_standin({num_clients} sites, synthetic)",
                  x_test=xt, y_test=yt)


def mushrooms_arrays(num_examples: int = 8124, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """``(x float32 [n, 112] one-hot, y int32 [n])``: a synthetic data set of mushrooms' shape.

  The label is drawn first (51.8 % class 1, as in mushrooms), then every attribute from its
  own class-conditional categorical distribution (Dirichlet(0.5) probabilities per class), so
  the Bayes posterior is exactly a logistic model of the one-hot features.
  """
  rng = np.random.default_rng(seed)
  y = (rng.random(num_examples) < 0.518).astype(np.int32)
  blocks = []
  for card in MUSHROOM_CARDINALITIES:
    probs = rng.dirichlet(np.full(card, 0.5), size=2)  # [class, value]
    u = rng.random(num_examples)[:, None]
    values = (u > np.cumsum(probs[y], axis=1)).sum(1).clip(0, card - 1)
    blocks.append(np.eye(card, dtype=np.float32)[values])
  return np.concatenate(blocks, 1), y


def binary_arrays_like(name: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """``(x float32 [n, d] in {0, 1}, y int32 [n])`` of the shape of LIBSVM's ``name``
  (:data:`BINARY_SHAPES`: phishing, a9a, w8a): the label is drawn with the real set's class
  balance, then every feature independently with a class-conditional probability (per class
  and feature, Beta-distributed around the real set's mean density), so the Bayes posterior
  is a logistic model of the features."""
  if name not in BINARY_SHAPES:
    raise ValueError(f"name must be one of {sorted(BINARY_SHAPES)}, got {name!r}.")
  n, d, positive, density = BINARY_SHAPES[name]
  rng = np.random.default_rng(seed)
  y = (rng.random(n) < positive).astype(np.int32)
  concentration = 2.0
  probs = rng.beta(density * concentration, (1 - density) * concentration, size=(2, d))
  x = (rng.random((n, d)) < probs[y]).astype(np.float32)
  return x, y
