"""Proximal operators with one signature, shared by every algorithm that takes one (the ProxSkip
family and RandProx, FedHT/FedIHT through FedAvg, EF-BV/EF21/DIANA and proximal GD):

    prox(tree, step) -> prox_{step·R}(tree) = argmin_z  step·R(z) + ½‖z − tree‖²

``tree`` is one client's (or the server's) model, a pytree; ``step`` a scalar (it may be
traced: a hyper-parameter sweep vmaps over it). The algorithm passes its own step: EF-BV and
proximal GD their γ; ProxSkip γ after a local step (L7) and γ/p at upload and on the server
(L9, L11: the prox of ψ scaled by the expected number of local steps); FedAvg, whose client
step lives in an optax optimiser, passes 1. A projection (the prox of an indicator, Top-K)
ignores the step.
"""
from __future__ import annotations

from typing import Any, Callable

import jax

from fedjaxsparse.errors import check_int
from fedjaxsparse.ops.sparsity import k_from_sparsity, soft_threshold, top_k as _top_k
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["Prox", "identity", "l1", "l2", "top_k"]
__dir__ = _public_dir(__all__)

Prox = Callable[[Any, Any], Any]   # (tree, step) -> tree


def identity(tree: Any, step: Any = None) -> Any:
  """The prox of R = 0: ``tree`` unchanged."""
  del step
  return tree


def l1(weight: float) -> Prox:
  """``prox_{step·weight·‖·‖₁}``: soft thresholding at ``step·weight`` (the lasso's prox).

  >>> import jax.numpy as jnp
  >>> l1(0.5)(jnp.array([1.0, -0.2, 0.3]), 1.0).tolist()
  [0.5, -0.0, 0.0]
"""
  return lambda tree, step: soft_threshold(tree, step * weight)


def l2(weight: float) -> Prox:
  """``prox_{step·(weight/2)·‖·‖²}``: shrinkage by ``1/(1 + step·weight)``."""
  return lambda tree, step: jax.tree.map(lambda a: a / (1 + step * weight), tree)


def top_k(k: int | None = None, *, sparsity: float | None = None,
          scope: str = "global") -> Prox:
  """The projection onto K-sparse models (the prox of the indicator of ``‖z‖₀ ≤ K``, for every
  step): :func:`fedjaxsparse.ops.sparsity.top_k` as a prox, with its convention — ``k`` is a
  count of entries kept, a fraction of zeros is always the keyword ``sparsity``.

  Args:
    k: entries kept over the whole model (a static int in ``[0, d]``, checked when the prox
      first sees the model).
    sparsity: instead of ``k``, the target fraction of zeros in ``[0, 1)``:
      ``K = k_from_sparsity(d, sparsity)``.
    scope: ``"global"`` (one Top-K over the whole model, as in Sparse-ProxSkip and FedHT) or
      ``"per_leaf"`` (``sparsity`` in every leaf; needs ``sparsity``).

  Returns:
    A :data:`Prox` ``(tree, step) -> tree`` that ignores ``step``.

  >>> import jax.numpy as jnp
  >>> top_k(sparsity=0.5)(jnp.array([0.5, -3.0, 1.0, 2.0]), 1.0).tolist()
  [0.0, -3.0, 0.0, 2.0]
  >>> top_k(1)(jnp.array([0.5, -3.0, 1.0, 2.0]), 1.0).tolist()
  [0.0, -3.0, 0.0, 0.0]
  """
  if (k is None) == (sparsity is None):
    raise ValueError("proxes.top_k: give exactly one of k (a count of entries kept) and "
                     "sparsity= (a fraction of zeros in [0, 1)).")
  if k is not None:
    if isinstance(k, float):
      raise ValueError(f"proxes.top_k: k is a count of entries kept, got the float {k!r}; "
                       "pass sparsity= for a fraction of zeros.")
    check_int("k", k, 0)
  else:
    k_from_sparsity(1, sparsity)  # validates 0 <= sparsity < 1 at build time
  return lambda tree, step: _top_k(tree, k, sparsity=sparsity, scope=scope)
