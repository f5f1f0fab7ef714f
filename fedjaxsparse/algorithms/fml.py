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

FML is a baseline of Wu et al. (2023); its details here follow Shen et al. (2020), "Federated
Mutual Learning", not Wu et al.

Source for the team: the FML baseline of seed 004 Task 3, l. 1645; spec ``seed004.md`` §3.3.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjaxsparse.algorithms.cohort_round import (ClientUpdate, CohortState, cohort_round,
                                                   mean_model)
from fedjaxsparse.algorithms.fedavg import FedAvgInfo
from fedjaxsparse.algorithms.fedlpfm import kd_loss
from fedjaxsparse.core import Algorithm, Model
from fedjaxsparse.ops.local import at_round, minibatch
from fedjaxsparse.runtime.clients import local_scan
from fedjaxsparse.errors import check_int
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["FMLState", "fml", "client_update"]
__dir__ = _public_dir(__all__)


class FMLState(CohortState):
  """:class:`~fedjaxsparse.algorithms.cohort_round.CohortState` whose client states are the
  private models: ``params`` (the meme, global, model), ``clients`` = :attr:`private`
  (``[N, ...]``, also read as :attr:`personal`), ``server_opt_state``, ``round``."""
  __slots__ = ()

  @property
  def private(self) -> Any:
    """``[N, ...]``: the clients' private models."""
    return self.clients

  @property
  def personal(self) -> Any:
    return self.clients


def fml(model: Model, private_model: Model, client_optimizer: optax.GradientTransformation, *,
        alpha: float = 0.5, beta: float = 0.5, temperature: float = 1.0,
        local_steps: int = 1, batch_size: int | None = None, cohort_size: int | None = None,
        weighting: str = "num_examples", augment=None, sampler: Any = None,
        uplink: Any = None, server_optimizer: Any = None) -> Algorithm:
  """FML, Federated Mutual Learning (Shen et al., 2020): every client keeps a private model
  across rounds and, each round, trains it together with a copy of the shared "meme" model by
  mutual distillation on its local data; only the meme models are uploaded and averaged.

  Round t: the server sends the meme model ``θ^t`` to a cohort ``C_t``. Client i, holding its
  private model ``φ_i``, runs ``local_steps`` steps; each step draws one minibatch ``(x, y)``
  and takes one ``client_optimizer`` step on each model, on

      L_meme    = α·CE(h(x; θ), y)   + (1 − α)·T²·KL(p_φ ‖ p_θ)
      L_private = β·CE(g(x; φ_i), y) + (1 − β)·T²·KL(p_θ ‖ p_φ)

  (``h = model.apply``, ``g = private_model.apply``; ``p`` the softmax at temperature ``T``;
  each model's KL target is the other's current prediction, held fixed for that step). It
  uploads its trained meme model (a model, not a delta) and keeps its private model; the
  server sets ``θ^{t+1} = Σ_{i∈C_t} p_i θ_i`` (``p_i = n_i/Σ_{C_t} n_j`` by default). The
  private models are stacked ``[N, ...]`` in the state and change only for the round's
  participants; the meme (global) model is the one evaluated. The round is
  :func:`fedjaxsparse.algorithms.cohort_round.cohort_round` with :func:`client_update` and
  the aggregation :func:`~fedjaxsparse.algorithms.cohort_round.mean_model`. FML is a
  baseline of Wu et al. (2023); its details here follow Shen et al. (2020). See the module
  docstring (:mod:`fedjaxsparse.algorithms.fml`).

  Args:
    model: the meme (shared, global) :class:`~fedjaxsparse.core.Model` ``h``: its ``apply``
      gives the logits and its ``per_example_loss`` the CE term.
    private_model: the clients' private :class:`~fedjaxsparse.core.Model` ``g`` (may differ
      from ``model``); ``init`` gives client i the private model
      ``private_model.init(fold_in(key, i))``, in the meme model's float dtype.
    client_optimizer: the optax transformation of the local steps, applied to the meme and
      the private model with separate states (fresh each round), or a function of the
      round returning one (a round schedule).
    alpha: α ∈ [0, 1], the CE weight of the meme model's loss (1 − α on its KL to the
      private model; FML's default 0.5).
    beta: β ∈ [0, 1], the CE weight of the private model's loss (1 − β on its KL to the meme
      model; FML's default 0.5).
    temperature: the softmax temperature T > 0 of the KL terms (scaled by T²).
    local_steps: local steps per round (int ≥ 1), each one step on each model.
    batch_size: examples per local step, drawn uniformly with replacement from the client's
      data (``None``: its full data every step).
    cohort_size: clients per round, drawn uniformly without replacement inside ``jit``
      (``None``: all clients).
    weighting: the aggregation weights ``p_i``: ``"num_examples"`` (``n_i/Σ_{C_t} n_j``, the
      paper's), ``"uniform"`` or ``"sampling"`` (``1/(N π_i)``, π_i the ``sampler``'s
      inclusion probability of client i).
    augment: ``(key, x) -> x`` applied to every local minibatch inside ``jit``
      (:mod:`fedjaxsparse.ops.augment`); ``None``: none.
    sampler: a :class:`fedjaxsparse.ops.sampling.Sampler` drawing each round's cohort
      (block, stratified, importance, ...) instead of ``cohort_size``'s uniform one, as in
      :func:`fedjaxsparse.algorithms.fedavg.fedavg`.
    uplink: a :class:`fedjaxsparse.ops.compressors.Compressor` applied to every uploaded
      meme model (one key per client), charged ``uplink.bits(d)`` per member, as in
      :func:`fedjaxsparse.algorithms.fedavg.fedavg`; ``None``: dense uploads.
    server_optimizer: an optax transformation of the pseudo-gradient ``θ^t − Σ_i p_i θ_i``
      (FedAdam, server momentum), as in :func:`fedjaxsparse.algorithms.fedavg.fedavg`;
      ``None`` sets ``θ^{t+1} = Σ_i p_i θ_i``.

  Returns:
    An :class:`~fedjaxsparse.core.Algorithm`: ``init(key, params, data)`` takes ``params``
    as the initial meme model and returns an :class:`FMLState`: ``state.params`` (the meme,
    global model), ``state.clients`` (the private models, leaves ``[N, ...]``; also
    ``state.private`` and ``state.personal``), ``state.server_opt_state`` and
    ``state.round`` (``int32``, rounds completed). ``step(key, state, data)`` returns
    ``(state, info)`` with a :class:`~fedjaxsparse.algorithms.fedavg.FedAvgInfo`: ``loss``
    (each member's meme objective ``L_meme`` at the models it started from, on its first
    local minibatch, weighted as the aggregation), ``bits_up`` (32·d per member for the
    dense meme model, or ``uplink.bits(d)``, summed over the cohort), ``bits_down`` (32·d
    per member, summed) and ``num_clients`` (``int32``, the cohort size).

  References:
    Tao Shen, Jie Zhang, Xinkang Jia, Fengda Zhang, Gang Huang, Pan Zhou, et al. (2020).
      Federated Mutual Learning. arXiv preprint. arXiv:2006.16765.
    Xidong Wu, Wan-Yi Lin, Devin Willmott, Filipe Condessa, Yufei Huang, Zhenzhen Li, et al.
      (2023). Leveraging Foundation Models to Improve Lightweight Clients in Federated
      Learning. NeurIPS 2023 FL workshop. arXiv:2311.08479.

  Source for the team: the FML baseline of seed 004 Task 3, l. 1645; spec ``seed004.md`` §3.3.
  """
  return cohort_round(
      client_update(model, private_model, client_optimizer, alpha=alpha, beta=beta,
                    temperature=temperature, local_steps=local_steps, batch_size=batch_size,
                    augment=augment),
      cohort_size=cohort_size, sampler=sampler, weighting=weighting, uplink=uplink,
      aggregate=mean_model, server_optimizer=server_optimizer, encoding="dense")


def client_update(model: Model, private_model: Model,
                  client_optimizer: optax.GradientTransformation, *, alpha: float = 0.5,
                  beta: float = 0.5, temperature: float = 1.0, local_steps: int = 1,
                  batch_size: int | None = None, augment=None) -> ClientUpdate:
  """FML's client (its state: its private model): ``local_steps`` of deep mutual learning of
  the received meme model and its private model, each distilling from the other; it uploads
  the meme model (a model, not a delta). Arguments as :func:`fml`."""
  for name, v in (("alpha", alpha), ("beta", beta)):
    if not 0 <= v <= 1:
      raise ValueError(f"{name} must be in [0, 1], got {v!r}.")
  local_steps = check_int("local_steps", local_steps, 1)

  def objective(apply, per_example, weight):
    def loss(params, other_logits, x, y, mask):
      logits = apply(params, x)
      per = (weight * per_example(logits, y) + (1.0 - weight) * kd_loss(
          logits, jax.lax.stop_gradient(other_logits)[:, None], temperature))
      return jnp.sum(per * mask) / jnp.maximum(jnp.sum(mask), 1.0)
    return loss

  meme_loss = objective(model.apply, model.per_example_loss, alpha)
  private_loss = objective(private_model.apply, private_model.per_example_loss, beta)

  def client(key, meme, private, data, client_optimizer):
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

  def init(key, params, n):
    keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(n))
    private = jax.vmap(private_model.init)(keys)
    floats = [a.dtype for a in jax.tree.leaves(params) if jnp.issubdtype(a.dtype, jnp.floating)]
    if floats:   # private models in the meme model's float dtype (float64 runs stay float64)
      private = jax.tree.map(lambda a: a.astype(floats[0]) if jnp.issubdtype(
          a.dtype, jnp.floating) else a, private)
    return private

  def update(key, meme, private, data, t):
    meme, private, loss = client(key, meme, private, data, at_round(client_optimizer, t))
    return meme, private, {"loss": loss}

  return ClientUpdate(init, update, info_type=FedAvgInfo, state_type=FMLState)
