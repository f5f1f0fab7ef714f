"""Local training of ONE client: minibatches (with replacement, :func:`minibatch`; or epochs without
replacement, :func:`epoch_minibatch`), the epoch loop under a static step count
(:func:`epoch_loop`), epoch-based local SGD shared by FedSpa, Ditto, Local and Sub-FedAvg, and
epoch-based training with any optax optimiser, a stochastic loss, frozen parts and statistics
of the forward passes (:func:`epoch_optimize`: FedCR, FedSR, FedPAC).
Clients of unequal size share one vmapped loop of ``max_steps`` steps.

:func:`epoch_sgd` follows the protocol of the FedSpa paper (Huang et al., 2022, arXiv:2201.11380):
E epochs of minibatches of B, weight decay, a step size set per round.

Source for the team: seed 002 (:func:`epoch_sgd`); spec ``seed000_003.md`` B.2, ``seed002.md`` §2.7
(:func:`epoch_loop`).
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from fedjaxsparse.errors import check_number
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["Schedule", "at_round", "check_lr", "minibatch", "epoch_steps", "epoch_minibatch",
           "epoch_loop", "epoch_descent", "epoch_sgd", "max_local_steps", "epoch_optimize"]
__dir__ = _public_dir(__all__)

Schedule = Callable[[jax.Array], Any]
"""A function of the round index ``t`` (``int32[]``, rounds completed), traceable: an optax
schedule such as ``optax.exponential_decay(0.1, 1, 0.998)`` (``η_t = 0.1·0.998^t``) or
``optax.piecewise_constant_schedule(0.01, {200: 0.1})``."""


def at_round(value: Any, t: jax.Array) -> Any:
  """A per-round quantity at round ``t``: ``value(t)`` for a :data:`Schedule` (or a function
  of the round returning an optax transformation: a client optimizer whose step size follows
  the rounds, ``lambda t: optax.sgd(schedule(t))``), else ``value`` itself (a number, an optax
  transformation)."""
  if isinstance(value, optax.GradientTransformation) or not callable(value):
    return value
  return value(t)


def check_lr(lr: Any, name: str = "lr") -> None:
  """``lr`` must be a number > 0 or a :data:`Schedule` of the round."""
  if not callable(lr):
    check_number(name, lr, 0.0, None, low_open=True)


def minibatch(key: jax.Array, data, batch_size: int | None, augment=None):
  """One client's ``(x, y, mask)`` for a local step: its full (masked) data when
  ``batch_size`` is ``None``, else ``batch_size`` examples drawn uniformly *with replacement*
  from its real examples (a static shape, so clients of any size share one kernel).
  ``augment(key, x) -> x`` (e.g. :func:`fedjaxsparse.ops.augment.crop_flip`) transforms the
  drawn images with its own key; ``data`` is one client's row (``x [M, ...]``)."""
  if batch_size is None:
    x, y, mask = data.x, data.y, data.mask
  else:
    idx = jax.random.randint(key, (batch_size,), 0, jnp.maximum(data.num_examples, 1))
    x, y, mask = data.x[idx], data.y[idx], jnp.ones((batch_size,), data.mask.dtype)
  return (x if augment is None else augment(jax.random.fold_in(key, 1), x)), y, mask


def epoch_steps(num_examples: jax.Array, batch_size: int, epochs: int) -> jax.Array:
  """``S_k = E·⌈n_k/B⌉`` local steps of epoch-based training (``int32``, per client)."""
  return epochs * ((num_examples + batch_size - 1) // batch_size)


def epoch_minibatch(key: jax.Array, data, batch_size: int, step: jax.Array):
  """One client's ``(x, y, mask)`` for local step ``step`` of epoch-based training: epoch
  ``e = step // ⌈n/B⌉`` visits the client's n real examples in a fresh random order (key
  ``fold_in(key, e)``), B at a time, without replacement; the last batch of an epoch holds
  ``n − (⌈n/B⌉ − 1)·B`` examples (``mask`` marks them). Static shapes: ``[B, ...]``."""
  m = data.mask.shape[0]
  n = jnp.maximum(data.num_examples, 1)
  per_epoch = (n + batch_size - 1) // batch_size
  epoch, j = step // per_epoch, step % per_epoch
  score = jax.random.uniform(jax.random.fold_in(key, epoch), (m,))
  order = jnp.argsort(jnp.where(jnp.arange(m) < n, score, 2.0))  # real rows first, shuffled
  padded = jnp.concatenate([order, jnp.zeros((batch_size,), order.dtype)])
  idx = jax.lax.dynamic_slice(padded, (j * batch_size,), (batch_size,))
  mask = ((j * batch_size + jnp.arange(batch_size)) < n).astype(data.mask.dtype)
  return data.x[idx], data.y[idx], mask


def epoch_loop(update, carry: Any, key: jax.Array, data, batch_size: int, epochs: int,
               max_steps: int) -> Any:
  """Epoch-based local training of ONE client: ``carry ← update(t, carry, (x, y, mask))`` for
  the client's ``S_k = E·⌈n_k/B⌉`` steps (:func:`epoch_minibatch` with ``key``; at most
  ``max_steps``, the static bound of the padded data, :func:`max_local_steps`).

  The trip count is the client's own (a ``while`` loop): a client
  run alone or under the ``"map"`` strategy takes exactly its S_k steps; clients of unequal size
  vmapped together take the *cohort's* largest S_k, each keeping its carry once its own steps
  are done (JAX's batched ``while``). An earlier layout ran every client ``max_steps`` steps with
  the extra ones masked out — the same result, up to ``S_max/S_k`` times the work. Not
  reverse-differentiable (a ``while`` loop); nothing differentiates through local training."""
  s_k = jnp.minimum(epoch_steps(data.num_examples, batch_size, epochs), max_steps)
  return jax.lax.fori_loop(
      0, s_k, lambda t, c: update(t, c, epoch_minibatch(key, data, batch_size, t)), carry)


def epoch_descent(gradient: Callable, params: Any, key: jax.Array, data, *, lr: Any,
                  optimizer: Any, epochs: int, batch_size: int, max_steps: int) -> Any:
  """``params`` after the client's ``S_k = E⌈n_k/B⌉`` epoch steps (:func:`epoch_loop`) of
  ``v ← v − η g`` with ``g = gradient(t, v, batch)`` (``t`` the step index: a step-dependent
  draw, a progressive schedule), or — with ``optimizer`` (an optax transformation, resolved for
  the round with :func:`at_round`) — its update of ``g`` (its state fresh). ``optax.sgd(η)`` computes the plain step bit for bit."""
  if optimizer is None:
    return epoch_loop(lambda t, v, batch: jax.tree.map(lambda vi, gi: vi - lr * gi, v,
                                                       gradient(t, v, batch)),
                      params, key, data, batch_size, epochs, max_steps)

  def step(t, carry, batch):
    v, s = carry
    u, s = optimizer.update(gradient(t, v, batch), s, v)
    return optax.apply_updates(v, u), s

  return epoch_loop(step, (params, optimizer.init(params)), key, data, batch_size, epochs,
                    max_steps)[0]


def epoch_sgd(grad_fn: Callable, params: Any, key: jax.Array, data, *, lr: Any, epochs: int,
              batch_size: int, max_steps: int, weight_decay: float = 0.0, mask: Any = None,
              prox: tuple[float, Any] | None = None,
              optimizer: optax.GradientTransformation | None = None) -> Any:
  """``params`` after ``S_k = E⌈n_k/B⌉`` steps of

      v ← v − η·m⊙(∇L(v; ξ) + λ_wd v + μ(v − c)),

  ``grad_fn(params, x, y, mask) -> grads``; ``mask`` (boolean pytree, ``None``: dense) keeps
  the iterate on its support (entries off the mask never move — zero if they start at zero);
  ``prox = (μ, c)`` adds Ditto's proximal pull towards ``c``. ``lr`` may be traced.

  ``optimizer``: an optax transformation (its state starts fresh) that turns the same
  gradient ``g = ∇L + λ_wd v + μ(v − c)`` into the step instead of ``−η g`` (``lr`` is then
  unused); its update is zeroed off the mask. ``optax.sgd(η)`` computes ``v + (−η g)``, the
  plain step bit for bit."""
  mu, centre = prox if prox is not None else (0.0, None)

  def gradient(v, batch):
    g = grad_fn(v, *batch)
    g = jax.tree.map(lambda gi, vi: gi + weight_decay * vi, g, v)
    if centre is not None:
      g = jax.tree.map(lambda gi, vi, ci: gi + mu * (vi - ci), g, v, centre)
    if mask is not None:
      g = jax.tree.map(lambda m, gi: jnp.where(m, gi, jnp.zeros_like(gi)), mask, g)
    return g

  if optimizer is None:
    def update(t, v, batch):   # in the iterate's dtype (a float64 step of a float32 model)
      return jax.tree.map(lambda vi, gi: (vi - lr * gi).astype(vi.dtype), v,
                          gradient(v, batch))

    return epoch_loop(update, params, key, data, batch_size, epochs, max_steps)

  def update_optax(t, carry, batch):
    v, s = carry
    u, s = optimizer.update(gradient(v, batch), s, v)
    if mask is not None:
      u = jax.tree.map(lambda m, ui: jnp.where(m, ui, jnp.zeros_like(ui)), mask, u)
    return optax.apply_updates(v, u), s

  return epoch_loop(update_optax, (params, optimizer.init(params)), key, data, batch_size,
                    epochs, max_steps)[0]


def max_local_steps(data, batch_size: int, epochs: int) -> int:
  """The static ``S_max = E⌈max_k n_k/B⌉`` of a (padded) federated dataset."""
  return epochs * -(-data.max_examples // batch_size)


def epoch_optimize(loss_fn: Callable, params: Any, optimizer: Any, key: jax.Array, data, *,
                   epochs: int, batch_size: int, max_steps: int, trainable: Any = None,
                   observe: Callable | None = None, observed: Any = None
                   ) -> tuple[Any, Any, jax.Array]:
  """Epoch-based local training of ONE client with an optax ``optimizer`` (its state starts
  fresh): ``S_k = E⌈n_k/B⌉`` steps on :func:`epoch_minibatch` batches of

      (loss, aux) = loss_fn(params, key_t, x, y, mask),   key_t = fold_in(k_noise, t),

  so a stochastic loss (a sampled representation, say) draws fresh noise every step.

  ``trainable``: a boolean pytree like ``params`` (``None``: all); frozen leaves keep their
  values exactly (the optimizer's update is zeroed there, weight decay included).
  ``observe(observed, aux, (x, y, mask), t) -> observed`` folds statistics of every step's
  forward pass (taken before the step's update) into ``observed``.

  Returns ``(params, observed, loss)``, ``loss`` the first step's (the received model's loss on
  its first batch, the convention of :class:`fedjaxsparse.algorithms.fedavg.FedAvgInfo`)."""
  k_order, k_noise = jax.random.split(key)
  grad = jax.value_and_grad(loss_fn, has_aux=True)
  frozen = lambda m, a: jnp.where(m, a, jnp.zeros_like(a))

  def update(t, carry, batch):
    p, s, obs, first = carry
    (loss, aux), g = grad(p, jax.random.fold_in(k_noise, t), *batch)
    if trainable is not None:    # frozen leaves have no gradient (nor a share of a clip norm)
      g = jax.tree.map(frozen, trainable, g)
    u, s = optimizer.update(g, s, p)
    if trainable is not None:
      u = jax.tree.map(frozen, trainable, u)
    p = optax.apply_updates(p, u)
    if observe is not None:
      obs = observe(obs, aux, batch, t)
    return p, s, obs, jnp.where(t == 0, loss, first)

  zero = jnp.zeros((), jnp.result_type(float))
  p, _, obs, first = epoch_loop(update, (params, optimizer.init(params), observed, zero),
                                k_order, data, batch_size, epochs, max_steps)
  return p, obs, first
