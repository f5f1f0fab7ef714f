"""Convex federated problems whose optimum the tests can compute.

The objective is ``F(w) = Σ_i c_i · f_i(w)`` with client weights ``c`` (summing to 1, e.g.
:func:`example_weights` or :func:`uniform_weights`) and
``f_i(w) = mean_j ℓ(w; x_ij, y_ij) + ½·l2·‖W‖²`` (``"sum"`` reduction: a sum over the
client's examples), matching :func:`fedjaxsparse.models.make_loss` with
:func:`~fedjaxsparse.models.linear_regression` / :func:`~fedjaxsparse.models.softmax_regression`
(bias not regularised). Optima are computed in float64 with numpy / scipy.
"""
from __future__ import annotations

import numpy as np

from fedjaxsparse.data.federated import FederatedData, FederatedDataset, federate
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["uniform_weights", "example_weights", "ridge_regression_problem",
           "ridge_regression_optimum", "softmax_regression_optimum"]
__dir__ = _public_dir(__all__)


def uniform_weights(data: FederatedData) -> np.ndarray:
  """``c_i = 1/N``."""
  return np.full(data.num_clients, 1.0 / data.num_clients)


def example_weights(data: FederatedData) -> np.ndarray:
  """``c_i = n_i / n``."""
  n = np.asarray(data.num_examples, np.float64)
  return n / n.sum()


def ridge_regression_problem(num_clients: int = 10, dim: int = 5,
                             examples_per_client: int = 30, heterogeneity: float = 1.0,
                             seed: int = 0, noise: float = 0.1) -> FederatedDataset:
  """Heterogeneous least squares: client ``i`` has features ``x ~ N(μ_i, I)`` with
  ``μ_i ~ N(0, heterogeneity²)``, its own true weights ``w_i = w + heterogeneity·δ_i`` and
  ``y = x·w_i + noise·ε``; sizes vary between ``examples_per_client/2`` and
  ``3·examples_per_client/2``."""
  rng = np.random.default_rng(seed)
  w = rng.normal(size=dim)
  lo, hi = max(1, examples_per_client // 2), max(2, 3 * examples_per_client // 2)
  xs, ys, parts, start = [], [], [], 0
  for _ in range(num_clients):
    m = int(rng.integers(lo, hi + 1))
    x = rng.normal(rng.normal(0, heterogeneity, dim), 1.0, (m, dim))
    y = x @ (w + heterogeneity * rng.normal(size=dim)) + noise * rng.normal(size=m)
    xs.append(x)
    ys.append(y)
    parts.append(np.arange(start, start + m))
    start += m
  return federate(np.concatenate(xs).astype(np.float32), np.concatenate(ys).astype(np.float32),
                  parts, num_classes=0, name="ridge", test_fraction=0.2, seed=seed)


def _client_arrays(data: FederatedData):
  x = np.asarray(data.x, np.float64).reshape(data.num_clients, data.max_examples, -1)
  return x, np.asarray(data.y), np.asarray(data.mask, np.float64)


def _scale(data: FederatedData, client_weights, reduction: str) -> np.ndarray:
  """Per-example weight ``c_i / n_i`` (mean) or ``c_i`` (sum), ``[N, M]`` incl. mask."""
  if reduction not in ("mean", "sum"):
    raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}.")
  c = np.asarray(client_weights, np.float64)
  n = np.maximum(np.asarray(data.num_examples, np.float64), 1.0)
  per_client = c / n if reduction == "mean" else c
  return per_client[:, None] * np.asarray(data.mask, np.float64)


def ridge_regression_optimum(data: FederatedData, l2: float, client_weights,
                             reduction: str = "mean", use_bias: bool = True) -> dict:
  """The minimiser ``{'w': [d], 'b': []}`` of ``Σ_i c_i f_i`` for ridge regression (normal
  equations in float64)."""
  x, y, _ = _client_arrays(data)
  s = _scale(data, client_weights, reduction)
  d = x.shape[-1]
  a = np.concatenate([x, np.ones(x.shape[:2] + (1,))], -1) if use_bias else x
  h = np.einsum("im,imd,ime->de", s, a, a)
  g = np.einsum("im,imd,im->d", s, a, y.astype(np.float64))
  reg = np.zeros(a.shape[-1])
  reg[:d] = l2 * np.sum(client_weights)
  sol = np.linalg.solve(h + np.diag(reg), g)
  return {"w": sol[:d], "b": sol[d]} if use_bias else {"w": sol}


def softmax_regression_optimum(data: FederatedData, num_classes: int, l2: float,
                               client_weights, reduction: str = "mean", use_bias: bool = True,
                               tol: float = 1e-10) -> dict:
  """The minimiser ``{'w': [d, C], 'b': [C]}`` of ``Σ_i c_i f_i`` for softmax regression.

  The loss is invariant to adding a constant to every bias, so the bias is pinned by
  ``Σ_c b_c = 0`` (gradient descent from ``b = 0`` keeps that sum, since the bias gradient
  sums to zero over classes). Solved with L-BFGS in float64 to gradient norm ``tol``.
  """
  from scipy.optimize import minimize  # deferred: scipy is slow to import
  from scipy.special import logsumexp  # deferred: scipy is slow to import
  if not l2 > 0:
    raise ValueError(f"l2 must be > 0 for a unique optimum, got {l2}.")
  x, y, _ = _client_arrays(data)
  s = _scale(data, client_weights, reduction).reshape(-1)
  x = x.reshape(-1, x.shape[-1])
  onehot = np.eye(num_classes)[np.asarray(y).reshape(-1).astype(int)]
  keep = s > 0
  x, onehot, s = x[keep], onehot[keep], s[keep]
  d, c = x.shape[1], num_classes
  total_weight = float(np.sum(client_weights))

  def unpack(theta):
    w = theta[:d * c].reshape(d, c)
    b = theta[d * c:] if use_bias else np.zeros(c)
    return w, b

  def fun(theta):
    w, b = unpack(theta)
    z = x @ w + b
    lse = logsumexp(z, axis=1)
    p = np.exp(z - lse[:, None])
    f = np.sum(s * (lse - np.sum(onehot * z, 1))) + 0.5 * l2 * total_weight * np.sum(w * w)
    gz = s[:, None] * (p - onehot)
    gw = x.T @ gz + l2 * total_weight * w
    grad = np.concatenate([gw.ravel(), gz.sum(0)]) if use_bias else gw.ravel()
    return f, grad

  theta0 = np.zeros(d * c + (c if use_bias else 0))
  res = minimize(fun, theta0, jac=True, method="L-BFGS-B",
                 options={"maxiter": 20000, "gtol": tol, "ftol": 0.0})
  w, b = unpack(res.x)
  b = b - b.mean()
  return {"w": w, "b": b} if use_bias else {"w": w}
