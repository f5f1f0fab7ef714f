"""Losses of the model interface (:class:`fedjaxsparse.core.Model`: pure functions of one
client's parameters and a batch).

A :class:`~fedjaxsparse.core.Model` is written for *one* client; algorithms lift it over the client axis with
``jax.vmap``. Shapes: ``x`` is ``[B, ...]``, ``y`` is ``[B]`` (class ids, int32) or ``[B]``
(regression targets, float32), ``mask`` is ``[B]`` float32 (1 for a real example, 0 for
padding).

Source for the team: seed 000 (BlogFeedback objective), §4.2 (FEMNIST objective).
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from fedjaxsparse.core import CLASSIFICATION, Model
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["softmax_cross_entropy", "from_flax", "squared_error", "make_loss", "global_mean_scale"]
__dir__ = _public_dir(__all__)


def softmax_cross_entropy(logits: jax.Array, y: jax.Array) -> jax.Array:
  """``[B, C], [B] -> [B]`` cross-entropy with integer labels."""
  logz = jax.nn.logsumexp(logits, axis=-1)
  return logz - jnp.take_along_axis(logits, y[:, None].astype(jnp.int32), axis=-1)[:, 0]


def from_flax(module, input_shape, model_shape=None) -> Model:
  """A flax ``module`` as a classification :class:`~fedjaxsparse.core.Model` (softmax cross
  entropy, no regulariser): ``init(key)`` initialises it on one zero input of ``model_shape``
  (default ``input_shape``), and ``apply(params, x)`` reshapes ``x [B, *input_shape]`` to
  ``[B, *model_shape]`` first (flat pixels to images, say)."""
  model_shape = tuple(input_shape if model_shape is None else model_shape)

  @jax.jit   # one program: initialising op by op compiles every eager operation apart
  def init(key):
    return module.init(key, jnp.zeros((1,) + model_shape, jnp.float32))["params"]

  def apply(params, x):
    return module.apply({"params": params}, x.reshape((x.shape[0],) + model_shape))

  return Model(init, apply, softmax_cross_entropy, None, CLASSIFICATION)


def squared_error(pred: jax.Array, y: jax.Array) -> jax.Array:
  """``[B], [B] -> [B]`` half squared error ``(pred - y)^2 / 2``."""
  return 0.5 * jnp.square(pred - y)


def make_loss(model: Model, reduction: str = "mean", scale: float = 1.0
              ) -> Callable[..., jax.Array]:
  """``loss(params, x, y, mask) -> scalar`` for one client.

  Args:
    model: the model.
    reduction: ``"mean"`` averages the per-example losses over the real examples (padding
      excluded; a client with no example contributes 0); ``"sum"`` sums them (the BlogFeedback
      objective of the Sparse-ProxSkip paper, Meinhardt et al. 2024, uses a sum of squared
      errors).
    scale: multiplies the data term (not the regulariser). With ``reduction="sum"`` and
      ``scale = N / n`` (:func:`global_mean_scale`), ``(1/N) Σ_i f_i`` is the global sample
      mean ``(1/n) Σ_ij ℓ_ij`` + regulariser — the FEMNIST objective of the Sparse-ProxSkip
      paper (its Section 4.2), where clients with more examples weigh more.
  """
  if reduction not in ("mean", "sum"):
    raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}.")
  if not (np.isfinite(scale) and scale > 0):
    raise ValueError(f"scale must be a finite number > 0, got {scale!r}.")

  def loss(params, x, y, mask):
    per_example = model.per_example_loss(model.apply(params, x), y)
    total = jnp.sum(per_example * mask)
    if reduction == "mean":
      total = total / jnp.maximum(jnp.sum(mask), 1.0)
    if scale != 1.0:
      total = scale * total
    if model.regularizer is not None:
      total = total + model.regularizer(params)
    return total

  return loss


def global_mean_scale(num_examples) -> float:
  """``N / n``: the ``scale`` of :func:`make_loss` (``reduction="sum"``) that turns the
  client average ``(1/N) Σ_i f_i`` into the global sample mean; ``num_examples`` is ``[N]``."""
  counts = np.asarray(num_examples, np.float64)
  return float(len(counts) / counts.sum())
