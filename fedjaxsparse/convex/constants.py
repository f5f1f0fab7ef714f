"""Smoothness and strong-convexity constants of linear federated problems, from the data.

For client ``i`` with design matrix ``A_i`` (features plus a ones column when the model has a
bias) and ``f_i(w) = r(A_i w) + ½·l2·‖W‖²``:

* least squares (``r = ½‖A_i w − b_i‖²``, mean or sum over the client's examples):
  ``∇²f_i = A_iᵀA_i / n_i + l2·I`` (``/ n_i`` only for the mean), exact;
* softmax cross-entropy: ``∇²f_i ⪯ ½·A_iᵀA_i / n_i ⊗ I_C + l2·I`` (the softmax Hessian
  ``diag(p) − ppᵀ ⪯ ½ I``), an upper bound;
* binary logistic loss: ``∇²f_i ⪯ ¼·A_iᵀA_i / n_i + l2·I`` (σ′ ≤ ¼), an upper bound (the
  EF-BV experiments of Kai Yi's dissertation, its appendix A.3, use the looser
  ``l2 + (1/(4n_i)) Σ_j ‖a_ij‖²``, the trace instead of λ_max).

``L_i = λ_max(∇²f_i)``; ``L_max = max_i L_i``; ``L_avg = mean_i L_i``;
``L_tilde = sqrt(mean_i L_i²)`` (EF21/EF-BV's L̃); ``mu`` = λ_min of the average Hessian for
least squares, and ``l2`` for softmax (its curvature can vanish elsewhere; the bias is not
regularised, so ``mu`` is a lower bound only on the weights).

Source for the team: seed 001 A.3 (the trace rule).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from fedjaxsparse.data.federated import FederatedData
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["Constants", "client_curvatures", "linear_model_constants", "logistic_optimum"]
__dir__ = _public_dir(__all__)


class Constants(NamedTuple):
  """``L_max``, ``L_avg``, ``L_tilde``, ``mu`` (see the module docstring) and ``L``, the
  smoothness of the average ``(1/N) Σ_i f_i`` (λ_max of the average bounding Hessian; ``L ≤
  L_avg``)."""
  L_max: float
  L_avg: float
  L_tilde: float
  mu: float
  L: float

  @property
  def kappa(self) -> float:
    return self.L_max / self.mu


def _data_hessians(data: FederatedData, l2: float, loss: str, reduction: str, use_bias: bool,
                   scale: float) -> tuple[np.ndarray, np.ndarray]:
  """``(H [N, d, d], reg [d])``: each client's (bounding) Hessian of its data term and the
  diagonal of the regulariser's (the bias is not regularised)."""
  if loss not in ("squared", "softmax", "logistic"):
    raise ValueError(f"loss must be 'squared', 'softmax' or 'logistic', got {loss!r}.")
  if reduction not in ("mean", "sum"):
    raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}.")
  n_clients = data.num_clients
  x = np.asarray(data.x, np.float64).reshape(n_clients, data.max_examples, -1)
  mask = np.asarray(data.mask, np.float64)
  if use_bias:
    x = np.concatenate([x, np.ones(x.shape[:2] + (1,))], -1)
  x = x * mask[..., None]
  h = scale * {"squared": 1.0, "softmax": 0.5, "logistic": 0.25}[loss] * np.einsum(
      "nmi,nmj->nij", x, x)
  if reduction == "mean":
    h = h / np.maximum(mask.sum(1), 1.0)[:, None, None]
  reg = np.full(x.shape[-1], float(l2))
  if use_bias:
    reg[-1] = 0.0
  return h, reg


def client_curvatures(data: FederatedData, l2: float, loss: str = "squared",
                      reduction: str = "mean", use_bias: bool = True, scale: float = 1.0,
                      bound: str = "eigen") -> tuple[np.ndarray, np.ndarray]:
  """Per-client ``(L_i, μ_i)``, ``[N]`` each, of ``f_i`` for ``loss`` in ``"squared"``,
  ``"softmax"``, ``"logistic"`` (see the module docstring); ``scale`` multiplies the data term
  as in :func:`fedjaxsparse.models.make_loss`.

  ``bound="eigen"``: ``L_i = λ_max`` of the (bounding) Hessian; ``"trace"``: ``l2`` plus the
  trace of the data term, ``l2 + c·(1/n_i) Σ_j ‖a_ij‖²`` (the looser rule of Kai Yi's
  dissertation, appendix A.3, c = ¼ for the logistic loss). ``μ_i``: λ_min of the Hessian for
  least squares, ``l2`` otherwise."""
  if bound not in ("eigen", "trace"):
    raise ValueError(f"bound must be 'eigen' or 'trace', got {bound!r}.")
  h, reg = _data_hessians(data, l2, loss, reduction, use_bias, scale)
  eig = np.linalg.eigvalsh(h + np.diag(reg))
  ls = l2 + np.trace(h, axis1=1, axis2=2) if bound == "trace" else eig[:, -1]
  return ls, (eig[:, 0] if loss == "squared" else np.full(len(ls), float(l2)))


def linear_model_constants(data: FederatedData, l2: float, loss: str = "squared",
                           reduction: str = "mean", use_bias: bool = True,
                           scale: float = 1.0) -> Constants:
  """The constants of ``(1/N) Σ_i f_i`` for ``loss`` in ``"squared"``, ``"softmax"``,
  ``"logistic"``; ``scale`` multiplies the data term as in
  :func:`fedjaxsparse.models.make_loss`."""
  ls, _ = client_curvatures(data, l2, loss, reduction, use_bias, scale)
  h, reg = _data_hessians(data, l2, loss, reduction, use_bias, scale)
  eig = np.linalg.eigvalsh(h.mean(0) + np.diag(reg))
  mu = float(eig[0]) if loss == "squared" else float(l2)
  return Constants(float(ls.max()), float(ls.mean()), float(np.sqrt(np.mean(ls ** 2))), mu,
                   float(eig[-1]))


def logistic_optimum(x: np.ndarray, y: np.ndarray, parts, mu: float, alpha: float = 1.0,
                     x_star: np.ndarray | None = None, return_x: bool = False):
  """``min_w (1/n) Σ_i f_i(α w + (1 − α) x_i*)`` for l2-logistic clients ``f_i(v) =
  mean_j log(1 + exp(−b_ij v·a_ij)) + (μ/2)‖v‖²`` (labels {0,1} ↦ b ∈ {−1,+1}; client i holds
  the rows ``parts[i]``), by L-BFGS in float64. ``α = 1`` is the plain federated objective;
  otherwise FLIX's, with the local optima ``x_star [n, d]``. With ``return_x``:
  ``(minimum, minimiser)``."""
  from scipy.optimize import minimize  # deferred: scipy is slow to import
  from scipy.special import expit  # deferred: scipy is slow to import
  b = 2.0 * np.asarray(y, np.float64) - 1.0
  shifts = np.zeros((len(parts), x.shape[1])) if x_star is None else (1 - alpha) * x_star
  blocks = [(x[p].astype(np.float64), b[p], s) for p, s in zip(parts, shifts)]

  def fun(w):
    f, g = 0.0, np.zeros_like(w)
    for a, bb, s in blocks:
      v = alpha * w + s
      z = -bb * (a @ v)
      f += np.mean(np.logaddexp(0, z)) + 0.5 * mu * v @ v
      g += alpha * (a.T @ (-bb * expit(z)) / len(a) + mu * v)
    return f / len(blocks), g / len(blocks)

  res = minimize(fun, np.zeros(x.shape[1]), jac=True, method="L-BFGS-B",
                 options={"gtol": 1e-13, "ftol": 0.0, "maxiter": 20000})
  return (float(res.fun), res.x) if return_x else float(res.fun)
