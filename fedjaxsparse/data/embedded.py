"""Datasets that need no network and no files: scikit-learn's bundled sets and the
synthetic(α, β) benchmark. These are the embedded defaults of the experiments."""
from __future__ import annotations

import numpy as np

from fedjaxsparse.data.federated import FederatedDataset, federate
from fedjaxsparse.data.partitions import lognormal_sizes, partition
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["digits", "diabetes", "synthetic"]
__dir__ = _public_dir(__all__)


def digits(num_clients: int = 20, partition: str = "dirichlet", alpha: float = 0.5,
           seed: int = 0, test_fraction: float = 0.2, shards_per_client: int = 2,
           sigma: float = 0.3) -> FederatedDataset:
  """scikit-learn's handwritten digits (1,797 real 8×8 images, 10 classes), ``x [.., 64]``
  scaled to [0, 1], split over clients by ``partition`` ("iid", "dirichlet", "shards",
  "lognormal", "dirichlet_lognormal"); each client's examples are split into its own train/test parts."""
  from sklearn.datasets import load_digits  # deferred: scikit-learn is slow to import
  x, y = load_digits(return_X_y=True)
  parts = _partition(y, num_clients, partition, seed, alpha, shards_per_client, sigma)
  name = f"digits/{partition}" + {"dirichlet": f"({alpha})", "lognormal": f"({sigma})",
                                   "dirichlet_lognormal": f"({alpha}, {sigma})"}.get(partition, "")
  return federate((x / 16.0).astype(np.float32), y.astype(np.int32), parts, num_classes=10,
                  name=name, test_fraction=test_fraction, seed=seed)


def diabetes(num_clients: int = 10, partition: str = "iid", seed: int = 0,
             test_fraction: float = 0.2, sigma: float = 0.3) -> FederatedDataset:
  """scikit-learn's diabetes regression set (442 patients, 10 features); features and target
  standardised to zero mean and unit variance; ``partition`` is "iid" or "lognormal"."""
  from sklearn.datasets import load_diabetes  # deferred: scikit-learn is slow to import
  x, y = load_diabetes(return_X_y=True)
  x = (x - x.mean(0)) / x.std(0)
  y = (y - y.mean()) / y.std()
  if partition not in ("iid", "lognormal"):
    raise ValueError(f"partition must be 'iid' or 'lognormal' for regression, got "
                     f"{partition!r}.")
  parts = _partition(y, num_clients, partition, seed, 1.0, 2, sigma)
  return federate(x.astype(np.float32), y.astype(np.float32), parts, num_classes=0,
                  name=f"diabetes/{partition}", test_fraction=test_fraction, seed=seed)


def _partition(y, num_clients, method, seed, alpha, shards_per_client, sigma):
  return partition(y, num_clients, method, seed, alpha=alpha,
                   shards_per_client=shards_per_client, sigma=sigma)


def synthetic(alpha: float = 1.0, beta: float = 1.0, num_clients: int = 30, dim: int = 60,
              num_classes: int = 10, seed: int = 0, iid: bool = False,
              mean_examples: int = 100, sigma: float = 1.0,
              test_fraction: float = 0.2) -> FederatedDataset:
  """synthetic(α, β) of FedProx (Li et al. 2020, §5.1; LEAF's ``synthetic`` generator).

  Client ``k`` has its own softmax model and input distribution:
  ``u_k ~ N(0, α)``, ``W_k ~ N(u_k, 1)^{C×d}``, ``b_k ~ N(u_k, 1)^C`` (model heterogeneity α);
  ``B_k ~ N(0, β)``, ``v_k ~ N(B_k, 1)^d``, ``x ~ N(v_k, Σ)`` with ``Σ_jj = j^{-1.2}`` (data
  heterogeneity β); ``y = argmax softmax(W_k x + b_k)``. ``iid=True`` shares one ``W, b``
  (drawn from N(0, 1)) and one ``v`` (from N(0, 1)) across clients. Client sizes are
  log-normal with mean about ``mean_examples`` (the FedProx generator draws power-law sizes;
  the log-normal is its usual stand-in), at least 5 each.
  """
  for name, v in (("alpha", alpha), ("beta", beta)):
    if not v >= 0:
      raise ValueError(f"{name} must be >= 0, got {v}.")
  rng = np.random.default_rng(seed)
  sizes = np.maximum(lognormal_sizes(mean_examples * num_clients, num_clients, sigma, seed), 5)
  cov = np.arange(1, dim + 1, dtype=np.float64) ** -1.2
  if iid:
    w_shared = rng.normal(0, 1, (num_classes, dim))
    b_shared = rng.normal(0, 1, num_classes)
    v_shared = rng.normal(0, 1, dim)
  xs, ys, parts, start = [], [], [], 0
  for k in range(num_clients):
    if iid:
      w, b, v = w_shared, b_shared, v_shared
    else:
      u = rng.normal(0, np.sqrt(alpha))
      w = rng.normal(u, 1, (num_classes, dim))
      b = rng.normal(u, 1, num_classes)
      v = rng.normal(rng.normal(0, np.sqrt(beta)), 1, dim)
    x = rng.normal(v, np.sqrt(cov), (sizes[k], dim))
    xs.append(x)
    ys.append(np.argmax(x @ w.T + b, axis=1))
    parts.append(np.arange(start, start + sizes[k]))
    start += sizes[k]
  name = "synthetic(iid)" if iid else f"synthetic({alpha},{beta})"
  return federate(np.concatenate(xs).astype(np.float32),
                  np.concatenate(ys).astype(np.int32), parts, num_classes=num_classes,
                  name=name, test_fraction=test_fraction, seed=seed)
