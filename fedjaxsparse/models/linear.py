"""Linear models: ridge linear regression, multinomial (softmax) and binary logistic
regression.

Inputs of any shape are flattened: ``x [B, ...] -> [B, d]``. The ridge term ``½·l2·‖w‖²`` is
added once per client loss (see :func:`~fedjaxsparse.models.base.make_loss`) and does not
include the bias. ``init="zeros"`` starts at 0; ``init="lecun"`` draws ``w ~ N(0, 1/d)``
(bias 0); ``init="pytorch"`` is ``torch.nn.Linear``'s default — weight and bias both
``U(−1/√d, 1/√d)`` (kaiming_uniform with a = √5), which the Sparse-ProxSkip paper (Meinhardt
et al., 2024, its appendix C) uses for FEMNIST.

Source for the team: seed 000 §C (FEMNIST init); seed 001 A.3 (logistic regression).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from fedjaxsparse.models.base import softmax_cross_entropy, squared_error
from fedjaxsparse.core import CLASSIFICATION, Model, REGRESSION
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["linear_regression", "softmax_regression", "logistic_loss", "logistic_regression"]
__dir__ = _public_dir(__all__)

INITS = ("zeros", "lecun", "pytorch")


def _check(num_features: int, l2: float, init: str) -> None:
  if num_features < 1:
    raise ValueError(f"num_features must be >= 1, got {num_features}.")
  if l2 < 0 or not math.isfinite(l2):
    raise ValueError(f"l2 must be a finite number >= 0, got {l2}.")
  if init not in INITS:
    raise ValueError(f"init must be one of {INITS}, got {init!r}.")


def _init(key: jax.Array, init: str, num_features: int, out: tuple, use_bias: bool) -> dict:
  """``{'w': [d, *out], 'b': [*out]}`` (no ``'b'`` without bias) drawn by ``init``."""
  shape = (num_features,) + out
  if init == "zeros":
    w, b = jnp.zeros(shape), jnp.zeros(out)
  elif init == "lecun":
    w, b = jax.random.normal(key, shape) / math.sqrt(num_features), jnp.zeros(out)
  else:  # pytorch
    kw, kb = jax.random.split(key)
    bound = 1.0 / math.sqrt(num_features)
    w = jax.random.uniform(kw, shape, minval=-bound, maxval=bound)
    b = jax.random.uniform(kb, out, minval=-bound, maxval=bound)
  return {"w": w, "b": b} if use_bias else {"w": w}


def _ridge(l2: float):
  """``params -> ½·l2·‖w‖²`` (``None`` when ``l2 = 0``)."""
  return (lambda p: 0.5 * l2 * jnp.sum(jnp.square(p["w"]))) if l2 > 0 else None


def _affine(params, x: jax.Array) -> jax.Array:
  """``x[B, ...] -> x.reshape(B, -1) @ w (+ b)``."""
  out = x.reshape(x.shape[0], -1) @ params["w"]
  return out + params["b"] if "b" in params else out


def linear_regression(num_features: int, l2: float = 0.0, use_bias: bool = True,
                      init: str = "zeros") -> Model:
  """``pred[B] = x·w + b``; params ``{'w': float32[d], 'b': float32[]}`` (no ``'b'`` if
  ``use_bias=False``); per-example loss ``½(pred − y)²``; regulariser ``½·l2·‖w‖²``; task
  "regression"."""
  _check(num_features, l2, init)

  init_fn = lambda key: _init(key, init, num_features, (), use_bias)
  return Model(init_fn, _affine, squared_error, _ridge(l2), REGRESSION)


def softmax_regression(num_features: int, num_classes: int, l2: float = 0.0,
                       use_bias: bool = True, init: str = "zeros") -> Model:
  """``logits[B, C] = x·W + b``; params ``{'w': float32[d, C], 'b': float32[C]}`` (no ``'b'``
  if ``use_bias=False``); cross-entropy with integer labels; regulariser ``½·l2·‖W‖²``."""
  _check(num_features, l2, init)
  if num_classes < 2:
    raise ValueError(f"num_classes must be >= 2, got {num_classes}.")

  init_fn = lambda key: _init(key, init, num_features, (num_classes,), use_bias)
  return Model(init_fn, _affine, softmax_cross_entropy, _ridge(l2), CLASSIFICATION)


def logistic_loss(z: jax.Array, y: jax.Array) -> jax.Array:
  """``log(1 + exp(−b·z))`` with ``b = 2y − 1 ∈ {−1, +1}`` for labels ``y ∈ {0, 1}``."""
  return jnp.logaddexp(0.0, -(2.0 * y - 1.0) * z)


def logistic_regression(num_features: int, l2: float = 0.0, use_bias: bool = False,
                        init: str = "zeros") -> Model:
  """Binary logistic regression (as in the EF-BV experiments of Kai Yi's dissertation, its
  appendix A.3): ``z = x·w (+ b)``, per-example loss
  ``log(1 + exp(−b z))`` with labels {0, 1} ↦ b ∈ {−1, +1}, regulariser ``½·l2·‖w‖²``;
  ``apply`` returns the score z (task "regression": evaluate with the loss, not accuracy)."""
  base = linear_regression(num_features, l2=l2, use_bias=use_bias, init=init)
  return Model(base.init, base.apply, logistic_loss, base.regularizer, REGRESSION)
