"""Epoch-based local SGD of ONE client (seed 002's protocol: E epochs of minibatches of B
without replacement, weight decay, a step size set per round), shared by FedSpa, Ditto, Local
and Sub-FedAvg. Clients of unequal size share one vmapped loop of ``max_steps`` steps
(:func:`fedjaxsparse.sampling.epoch_loop`)."""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from fedjaxsparse.sampling import epoch_loop


def epoch_sgd(grad_fn: Callable, params: Any, key: jax.Array, data, *, lr: Any, epochs: int,
              batch_size: int, max_steps: int, weight_decay: float = 0.0, mask: Any = None,
              prox: tuple[float, Any] | None = None) -> Any:
  """``params`` after ``S_k = E⌈n_k/B⌉`` steps of

      v ← v − η·m⊙(∇L(v; ξ) + λ_wd v + μ(v − c)),

  ``grad_fn(params, x, y, mask) -> grads``; ``mask`` (boolean pytree, ``None``: dense) keeps
  the iterate on its support (entries off the mask never move — zero if they start at zero);
  ``prox = (μ, c)`` adds Ditto's proximal pull towards ``c``. ``lr`` may be traced."""
  mu, centre = prox if prox is not None else (0.0, None)

  def update(t, v, batch):
    g = grad_fn(v, *batch)
    g = jax.tree.map(lambda gi, vi: gi + weight_decay * vi, g, v)
    if centre is not None:
      g = jax.tree.map(lambda gi, vi, ci: gi + mu * (vi - ci), g, v, centre)
    if mask is not None:
      g = jax.tree.map(lambda m, gi: jnp.where(m, gi, jnp.zeros_like(gi)), mask, g)
    return jax.tree.map(lambda vi, gi: vi - lr * gi, v, g)

  return epoch_loop(update, params, key, data, batch_size, epochs, max_steps)


def max_local_steps(data, batch_size: int, epochs: int) -> int:
  """The static ``S_max = E⌈max_k n_k/B⌉`` of a (padded) federated dataset."""
  return epochs * -(-data.max_examples // batch_size)
