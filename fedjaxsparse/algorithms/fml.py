"""Federated Mutual Learning.

References:
  Tao Shen, Jie Zhang, Xinkang Jia, Fengda Zhang, Gang Huang, Pan Zhou, et al. (2020).
    Federated Mutual Learning. arXiv preprint. arXiv:2006.16765.
  Xidong Wu, Wan-Yi Lin, Devin Willmott, Filipe Condessa, Yufei Huang, Zhenzhen Li, et al.
    (2023). Leveraging Foundation Models to Improve Lightweight Clients in Federated Learning.
    NeurIPS 2023 FL workshop. arXiv:2311.08479.

Every client keeps a **private** model φ_i across rounds and trains, each round, a copy of the
shared **meme** model θ alongside it by mutual distillation on its local data:

    L_meme    = α·CE(h(x; θ), y)  + (1 − α)·KL(p_φ ‖ p_θ)
    L_private = β·CE(g(x; φ_i), y) + (1 − β)·KL(p_θ ‖ p_φ)

(each model's KL target is the other's current prediction, held fixed for that step; both
take one optimiser step per local step on the same minibatch). Only the meme models are sent
and averaged (data-size weights); the private models are stacked ``[N, ...]`` in the state and
change only for the round's participants. FML's defaults α = β = 0.5. The global (meme)
model is the one evaluated.

Source for the team: Shen et al. 2020, "Federated Mutual Learning"; the FML baseline of seed 004
Task 3, l. 1645; spec ``seed004.md`` §3.3 — details from the cited paper, not the dissertation.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjaxsparse.ops import accounting
from fedjaxsparse.ops.aggregation import client_weights, weighted_mean
from fedjaxsparse.algorithms.fedavg import FedAvgInfo
from fedjaxsparse.algorithms.fedlpfm import kd_loss
from fedjaxsparse.runtime.clients import local_scan
from fedjaxsparse.core import Algorithm, Model, as_float
from fedjaxsparse.data.federated import FederatedData, check_data
from fedjaxsparse.ops.sampling import check_cohort_size, client_keys, sample_cohort
from fedjaxsparse.ops.local import minibatch


class FMLState(NamedTuple):
  """``params``: the meme (global) model; ``private``: ``[N, ...]`` the clients' private
  models, also read as ``personal`` (:func:`fedjaxsparse.personal_params`); ``round``."""
  params: Any       # the meme (global) model
  private: Any      # [N, ...] the clients' private models
  round: jax.Array

  @property
  def personal(self):
    return self.private


def fml(model: Model, private_model: Model, client_optimizer: optax.GradientTransformation, *,
        alpha: float = 0.5, beta: float = 0.5, temperature: float = 1.0,
        local_steps: int = 1, batch_size: int | None = None, cohort_size: int | None = None,
        weighting: str = "num_examples", augment=None) -> Algorithm:
  """FML; ``init(key, params, data)`` initialises client i's private model with
  ``private_model.init(fold_in(key, i))``."""
  for name, v in (("alpha", alpha), ("beta", beta)):
    if not 0 <= v <= 1:
      raise ValueError(f"{name} must be in [0, 1], got {v!r}.")
  if not isinstance(local_steps, int) or local_steps < 1:
    raise ValueError(f"local_steps must be an int >= 1, got {local_steps!r}.")

  def objective(apply, per_example, weight):
    def loss(params, other_logits, x, y, mask):
      logits = apply(params, x)
      per = (weight * per_example(logits, y) + (1.0 - weight) * kd_loss(
          logits, jax.lax.stop_gradient(other_logits)[:, None], temperature))
      return jnp.sum(per * mask) / jnp.maximum(jnp.sum(mask), 1.0)
    return loss

  meme_loss = objective(model.apply, model.per_example_loss, alpha)
  private_loss = objective(private_model.apply, private_model.per_example_loss, beta)

  def client(key, meme, private, data):
    def step(carry, k):
      m, p, sm, sp = carry
      x, y, mask = minibatch(k, data, batch_size, augment)
      lm, lp = model.apply(m, x), private_model.apply(p, x)
      loss, gm = jax.value_and_grad(meme_loss)(m, lp, x, y, mask)
      gp = jax.grad(private_loss)(p, lm, x, y, mask)
      um, sm = client_optimizer.update(gm, sm, m)
      up, sp = client_optimizer.update(gp, sp, p)
      return (optax.apply_updates(m, um), optax.apply_updates(p, up), sm, sp), loss

    init = (meme, private, client_optimizer.init(meme), client_optimizer.init(private))
    (meme, private, _, _), losses = local_scan(step, init, jax.random.split(key, local_steps))
    return meme, private, losses[0]

  def init(key, params, data: FederatedData) -> FMLState:
    check_data(data)
    check_cohort_size(cohort_size, data.num_clients)
    keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(data.num_clients))
    private = jax.vmap(private_model.init)(keys)
    floats = [a.dtype for a in jax.tree.leaves(params) if jnp.issubdtype(a.dtype, jnp.floating)]
    if floats:   # private models in the meme model's float dtype (float64 runs stay float64)
      private = jax.tree.map(lambda a: a.astype(floats[0]) if jnp.issubdtype(
          a.dtype, jnp.floating) else a, private)
    return FMLState(params, private, jnp.zeros((), jnp.int32))

  def step(key, state: FMLState, data: FederatedData):
    k_cohort, k_clients, _ = jax.random.split(key, 3)   # FedAvg's split: the same draws
    cohort = sample_cohort(k_cohort, data.num_clients, cohort_size)
    cohort_data = data.select(cohort)
    private = jax.tree.map(lambda a: a[cohort], state.private)
    memes, new_private, losses = jax.vmap(client, in_axes=(0, None, 0, 0))(
        client_keys(k_clients, cohort), state.params, private, cohort_data)
    weights = client_weights(cohort_data.num_examples, weighting)
    params = weighted_mean(memes, weights)
    stacked = jax.tree.map(lambda a, n: a.at[cohort].set(n), state.private, new_private)
    c = as_float(cohort.shape[0])
    bits = c * accounting.message_bits(state.params, encoding="dense")
    info = FedAvgInfo(jnp.dot(weights, losses), bits, bits, jnp.int32(cohort.shape[0]))
    return FMLState(params, stacked, state.round + 1), info

  return Algorithm(init, step)
