"""Client sampling inside ``jit``, and per-client randomness.

Shared randomness (the cohort) is drawn once per round from the round key, outside any client
``vmap``. A client's own key is ``fold_in(key, client_id)``, so it depends on the client's
identity only, not on its position in the cohort or on the device count (DESIGN.md).
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from fedjaxsparse.samplers import nice


def check_cohort_size(cohort_size: int | None, num_clients: int) -> int:
  """The static cohort size (``None`` means full participation), validated."""
  if cohort_size is None:
    return num_clients
  if not isinstance(cohort_size, int) or not 1 <= cohort_size <= num_clients:
    raise ValueError(f"cohort_size must be an int in [1, num_clients={num_clients}], got "
                     f"{cohort_size!r}.")
  return cohort_size


def sample_cohort(key: jax.Array, num_clients: int, cohort_size: int | None) -> jax.Array:
  """Client ids ``int32[C]`` of this round's cohort.

  Full participation (``cohort_size`` None or ``num_clients``) returns ``arange(N)``; otherwise
  a uniform sample of ``C`` distinct clients (every C-subset equally likely), sorted: τ-NICE
  of :mod:`fedjaxsparse.samplers`, which has the other samplings.
  """
  return nice(num_clients, check_cohort_size(cohort_size, num_clients)).draw(key)[0]


def client_keys(key: jax.Array, client_ids: jax.Array) -> jax.Array:
  """Per-client keys ``[C]``: ``fold_in(key, client_id)`` for each id in ``client_ids[C]``."""
  return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, client_ids)


def minibatch(key: jax.Array, data, batch_size: int | None, augment=None):
  """One client's ``(x, y, mask)`` for a local step: its full (masked) data when
  ``batch_size`` is ``None``, else ``batch_size`` examples drawn uniformly *with replacement*
  from its real examples (a static shape, so clients of any size share one kernel).
  ``augment(key, x) -> x`` (e.g. :func:`fedjaxsparse.augment.crop_flip`) transforms the
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
  """Epoch-based local training of ONE client under a static step count: ``carry ←
  update(t, carry, (x, y, mask))`` for the client's ``S_k = E·⌈n_k/B⌉`` steps
  (:func:`epoch_minibatch` with ``key``), and unchanged for ``S_k ≤ t < max_steps`` — so clients
  of unequal size share one vmapped ``fori_loop`` of ``max_steps`` (seed 003 B.2, seed 002
  §2.7)."""
  s_k = epoch_steps(data.num_examples, batch_size, epochs)

  def body(t, c):
    new = update(t, c, epoch_minibatch(key, data, batch_size, t))
    return jax.tree.map(lambda old, nw: jnp.where(t < s_k, nw, old), c, new)

  return jax.lax.fori_loop(0, max_steps, body, carry)
