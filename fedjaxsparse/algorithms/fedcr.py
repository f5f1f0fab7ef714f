"""FedCR: personalised federated learning with a shared Gaussian representation regularised
towards global class-conditional distributions (built by products of experts), and personal
heads; FedCR-OPU3 trains a subset of the body's layers per client (``train_layers``, FedP3's
layer policies). A baseline of the Scafflix paper (its additional-baselines table) and of the
FedP3 paper (its FedCR comparison), run as FedCR's code runs it (github.com/haozzh/FedCR);
the shared pieces of the representation families (personal heads, FedCR's local optimiser,
the final fine-tuning round) are in :mod:`fedjaxsparse.algorithms.representation`.

References:
  Hao Zhang, Chenglin Li, Wenrui Dai, Junni Zou, Hongkai Xiong (2023). FedCR: Personalized
    Federated Learning Based on Across-Client Common Representation with Conditional Mutual
    Information Regularization. ICML 2023, PMLR 202:41314-41330.

Source for the team: seed 001 l. 2919-25, 1285; ``seed001_ch3_ch5.md`` §B.1;
``seed001_ch4_ch6.md`` (FedCR row).
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from fedjaxsparse.algorithms import fedp3
from fedjaxsparse.algorithms.cohort_round import ClientUpdate, ServerPart, cohort_round
from fedjaxsparse.algorithms.representation import (HeadsState, RoundInfo, check_options,
                                                    local_optimizer, sampled_cross_entropy)
from fedjaxsparse.core import Algorithm, as_float, float_dtype
from fedjaxsparse.errors import check_number
from fedjaxsparse.models.split import SplitModel, kl_normal, product_of_normals
from fedjaxsparse.ops import accounting, layer_groups
from fedjaxsparse.ops.aggregation import weighted_mean
from fedjaxsparse.ops.local import Schedule, at_round, epoch_optimize
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["FedCRState", "fedcr"]
__dir__ = _public_dir(__all__)


class FedCRState(HeadsState):
  """:class:`~fedjaxsparse.algorithms.cohort_round.CohortState` of :func:`~fedjaxsparse.algorithms.fedcr.fedcr`: ``params``
  (the global ``{"body", "head"}``; the head is the shared one only with ``share_head``),
  ``clients`` (``{"head": personal heads}``, leaves ``[N, ...]``, or ``{"shared_head":
  bool[N]}`` with ``share_head``; plus ``"layers"``: ``bool[N, L]`` with ``train_layers``),
  ``server`` (``(prior_mean, prior_std)``, ``[C, d]``
  each: r(z|y)), ``server_opt_state``, ``round``."""
  __slots__ = ()

  @property
  def prior_mean(self) -> jax.Array:
    return self.server[0]

  @property
  def prior_std(self) -> jax.Array:
    return self.server[1]


def fedcr(model: SplitModel, lr: float | Schedule, *, beta: float = 1e-3, beta2: float = 1.0,
          samples: int = 15, epochs: int = 2, batch_size: int = 48,
          cohort_size: int | None = 10, momentum: float = 0.0, weight_decay: float = 0.0,
          clip: float | None = 10.0, weighting: str = "uniform",
          share_head: bool = False, deterministic: bool = False,
          train_layers: Any = None, sampler: Any = None,
          server_optimizer: optax.GradientTransformation | None = None,
          client_optimizer: Any = None) -> Algorithm:
  """FedCR (Zhang et al., 2023): a shared Gaussian representation regularised towards global
  class-conditional distributions (a conditional-mutual-information bound), personal heads.

  Model: a :class:`fedjaxsparse.models.split.SplitModel` with a Gaussian representation — a
  shared body ``φ`` giving ``p(z|x) = N(μ_φ(x), diag σ_φ(x)²)``, ``z ∈ R^d``, and a personal
  linear head ``h_i`` (``[C, d]`` logits from ``z``). The server keeps global class-conditional
  distributions ``r(z|y=c) = N(m_c, diag s_c²)`` (``m, s [C, d]``, initially ``N(0, I)``).

  Round t, every client i of the cohort S_t (uniform, ``cohort_size``, or any sampler):

  1. starts from the global body ``φ_t`` and its own head ``h_i``;
  2. runs ``epochs`` epochs of minibatch SGD (batch B; gradient norm clipped at ``clip``, weight
     decay, momentum: FedCR's local optimiser) on

         L_i(φ, h) = mean_b [ (1/S) Σ_s CE(h(μ_b + σ_b ⊙ ε_{b,s}), y_b)
                              + β KL( r(z|y_b) ‖ p(z|x_b) ) ],      ε ~ N(0, I),

     with S = ``samples`` draws per example (FedCR: ``num_avg_train``);
  3. during its last epoch, accumulates every example's ``p(z|x_b)`` (from the step's forward
     pass) into one Gaussian per class by the product of experts,
     ``τ_ic = Σ_{b: y_b = c} σ_b^{-2}``, ``μ_ic = τ_ic^{-1} Σ_{b: y_b = c} μ_b σ_b^{-2}``
     (:func:`fedjaxsparse.models.split.product_of_normals`);
  4. uploads ``φ_i`` and ``(μ_ic, τ_ic^{-1/2})`` for the classes it saw; keeps ``h_i``.

  The server sets ``φ_{t+1}`` to the cohort's average (uniform weights as FedCR's code, or data
  sizes; any ``server_optimizer`` on the pseudo-gradient) and, for every class c seen by the
  cohort, the product of the clients' experts with a standard normal prior,
  ``T_c = 1 + Σ_i s_ic^{-2}``, ``m̂_c = T_c^{-1} Σ_i μ_ic s_ic^{-2}``, ``ŝ_c = T_c^{-1/2}``
  (``s_ic = τ_ic^{-1/2}``, the sums over the clients that saw c), then moves
  ``(m_c, s_c) ← (1 − β₂)(m_c, s_c) + β₂ (m̂_c, ŝ_c)`` (FedCR's code; β₂ = 1 replaces them).

  Evaluation: client i's model is ``(φ, h_i)`` with ``z = μ`` (the mean of the logits over draws
  of ``z``, which FedCR's code estimates with 30 draws; the head is linear). FedCR's final round
  trains every client's head alone on its own data (the body frozen) before the last test:
  :func:`~fedjaxsparse.algorithms.representation.fine_tune` (``trainable="head"``), applied to a copy of the state by the experiments.

  Choices taken from FedCR's code: the KL is ``KL(r(z|y) ‖ p(z|x))``, in the code's argument
  order; the class experts use only the last local epoch's examples; the global product
  includes the ``N(0, I)`` prior. ``share_head=True`` averages the head too (FedCR's regulariser on
  FedAvg); with ``beta=0`` and ``deterministic=True`` (``z = μ``) that is FedAvg on the network
  ``head(μ_φ(x))`` (tested).

  FedCR-OPU3 (the FedP3 paper's FedCR comparison): ``train_layers`` ``bool[N, L]`` over the body's
  layers (:func:`fedjaxsparse.algorithms.fedp3.layer_policy`): client i uploads only its layers
  ``L_i`` and each layer is averaged over the clients that returned it (FedP3's Aggregation,
  :func:`fedjaxsparse.algorithms.fedp3.aggregate_updates`).

  No ``uplink``: a client uploads class statistics (means, scales, the classes it saw) beside
  its body, which a compressor of the body's update must not touch.

  Args:
    model: a :class:`~fedjaxsparse.models.split.SplitModel` with a Gaussian representation
      (:func:`fedjaxsparse.models.split.fedcr_net` with ``gaussian=True``).
    lr: the local step size η, or a schedule of the round ``t -> η_t`` (FedCR's code:
      ``optax.exponential_decay(lr, 1, 0.997)``, 0.997 per round by
      default, 1 in its README's commands).
    beta: β ≥ 0, the weight of the KL term (FedCR's code: 1e-3; 1e-4 for CIFAR-100).
    beta2: β₂ ∈ [0, 1], the server's step towards the new class distributions (the README: 1).
    samples: S, draws of z per example (``num_avg_train``: 15; 18 for CIFAR-100); must be 1
      with ``deterministic``.
    epochs: E, local epochs per round (the code: 2; the README: 10).
    batch_size: B, examples per local step (the code: 48).
    cohort_size: clients per round, uniform without replacement (the code: 10 % of 100);
      ``None``: all.
    momentum: heavy-ball momentum of :func:`~fedjaxsparse.algorithms.representation.local_optimizer` (the code: 0).
    weight_decay: weight decay of :func:`~fedjaxsparse.algorithms.representation.local_optimizer` (the code: 0).
    clip: the global norm the local gradient is clipped at (:func:`~fedjaxsparse.algorithms.representation.local_optimizer`; the
      code: 10; ``None``: no clipping).
    weighting: the body's aggregation weights, ``"uniform"`` (the code) or ``"num_examples"``
      (``"sampling"`` with a sampler).
    share_head: average the head as well (FedAvg with FedCR's regulariser); then there are no
      personal heads (``state.clients`` holds ``"shared_head"``) and ``state.heads`` and
      ``state.personal`` give every client the global head of ``state.params``.
    deterministic: ``z = μ`` (no sampling; then ``samples`` must be 1) — the reduction to FedAvg.
    train_layers: ``bool[N, L]`` over the body's layers (FedCR-OPU3; ``None``: every layer);
      not combinable with ``share_head``.
    sampler: a :class:`fedjaxsparse.ops.sampling.Sampler` drawing each round's cohort instead
      of a uniform one of ``cohort_size``; forwarded to
      :func:`~fedjaxsparse.algorithms.cohort_round.cohort_round`.
    server_optimizer: an optax transformation of the body's pseudo-gradient ``−Δ`` (FedAdam,
      server momentum); ``None`` applies the average as it is. Forwarded to
      :func:`~fedjaxsparse.algorithms.cohort_round.cohort_round`.
    client_optimizer: an optax transformation (or a function of the round returning one)
      instead of :func:`~fedjaxsparse.algorithms.representation.local_optimizer` (``lr``, ``momentum``, ``weight_decay`` and ``clip``
      are then unused).

  Returns:
    An :class:`~fedjaxsparse.core.Algorithm` whose state is a :class:`FedCRState`:
    ``state.params`` (the global ``{"body", "head"}``; the head is the shared one only with
    ``share_head``), ``state.clients`` (``{"head": personal heads}``, leaves ``[N, ...]``, plus
    ``"layers"``: ``bool[N, L]`` with ``train_layers``), ``state.heads`` (the personal heads),
    ``state.personal`` (every client's ``{"body": φ, "head": h_i}``, leaves ``[N, ...]``),
    ``state.server`` = ``(state.prior_mean, state.prior_std)`` (``m, s [C, d]``: r(z|y)),
    ``state.server_opt_state`` and ``state.round``. ``step(key, state, data)`` returns
    ``(state, info)``, ``info`` a :class:`~fedjaxsparse.algorithms.representation.RoundInfo`: ``loss`` (the cohort's first-step loss,
    weighted as the aggregation), ``bits_up`` (summed over the cohort: the bodies — only the
    ``L_i`` layers with ``train_layers``; the heads too with ``share_head`` — plus 2d floats
    for every class a client saw, 32 bits a float), ``bits_down`` (body, and head with
    ``share_head``, and r(z|y)'s 2Cd floats, fp32, per member) and ``num_clients``.

  References:
    Hao Zhang, Chenglin Li, Wenrui Dai, Junni Zou, Hongkai Xiong (2023). FedCR: Personalized
      Federated Learning Based on Across-Client Common Representation with Conditional Mutual
      Information Regularization. ICML 2023, PMLR 202:41314-41330. (Code:
      github.com/haozzh/FedCR.)
    Kai Yi, Nidham Gazagnadou, Peter Richtárik, Lingjuan Lyu (2024). FedP3: Federated
      Personalized and Privacy-friendly Network Pruning under Model Heterogeneity. ICLR 2024.
      arXiv:2404.09816. (FedCR-OPU3.)
  """
  check_options(lr, epochs, batch_size, samples, momentum, weight_decay, clip)
  check_number("beta", beta, 0.0, None)
  check_number("beta2", beta2, 0.0, 1.0)
  if not model.gaussian:
    raise ValueError("fedcr needs a SplitModel with a Gaussian representation "
                     "(fedcr_net(..., gaussian=True)).")
  if deterministic and samples != 1:
    raise ValueError(f"deterministic=True draws no z: samples must be 1, got {samples}.")
  if share_head and train_layers is not None:
    raise ValueError("train_layers (FedCR-OPU3) assigns the body's layers; it cannot be "
                     "combined with share_head=True.")
  d = model.dim

  def loss_fn(p, key, x, y, mask, prior_mean, prior_std):
    mu, sigma = model.representation(p["body"], x)
    _, ce = sampled_cross_entropy(model, p["head"], mu, None if deterministic else sigma,
                                   key, samples, y)
    per = ce + beta * kl_normal(prior_mean[y], prior_std[y], mu, sigma) if beta else ce
    total = jnp.sum(per * mask) / jnp.maximum(jnp.sum(mask), 1.0)
    return total, (mu, sigma)

  def client(w, head, key, data, opt, steps, prior_mean, prior_std):
    num_classes = prior_mean.shape[0]
    per_epoch = (jnp.maximum(data.num_examples, 1) + batch_size - 1) // batch_size
    last_epoch_from = (epochs - 1) * per_epoch

    def observe(obs, aux, batch, t):
      mu, sigma = aux
      _, y, mask = batch
      on = mask * (t >= last_epoch_from)
      onehot = jax.nn.one_hot(y, num_classes, dtype=mu.dtype) * on[:, None]   # [B, C]
      prec = 1.0 / jnp.square(sigma)
      tau, num = obs
      return tau + onehot.T @ prec, num + onehot.T @ (mu * prec)

    zeros = jnp.zeros((num_classes, d), float_dtype())
    start = {"body": w["body"], "head": w["head"] if share_head else head}
    trained, (tau, num), loss = epoch_optimize(
        lambda p, k, x, y, m: loss_fn(p, k, x, y, m, prior_mean, prior_std), start,
        opt, key, data, epochs=epochs,
        batch_size=batch_size, max_steps=steps, observe=observe, observed=(zeros, zeros))
    mean, std = product_of_normals(tau, num)
    return trained, mean, std, jnp.any(tau > 0, axis=1), loss

  def init(key, params, n):
    del key
    if share_head:   # no personal heads: every client's head is the global one
      clients = {"shared_head": jnp.ones((n,), bool)}
    else:
      clients = {"head": jax.tree.map(lambda a: jnp.broadcast_to(a, (n,) + a.shape),
                                      params["head"])}
    if train_layers is not None:
      names = layer_groups.layer_names(params["body"], 1)
      if tuple(train_layers.shape) != (n, len(names)):
        raise ValueError(f"train_layers must be bool[{n}, {len(names)}] "
                         f"(clients, body layers {names}), got {tuple(train_layers.shape)}.")
      clients["layers"] = jnp.asarray(train_layers, bool)
    return clients

  def server_init(params, n):
    del n
    num_classes = jax.tree.leaves(params["head"])[-1].shape[-1]
    return (jnp.zeros((num_classes, d), float_dtype()),
            jnp.ones((num_classes, d), float_dtype()))

  def update(key, broadcast, st, dd, t):
    w, (prior_mean, prior_std) = broadcast
    steps = epochs * -(-dd.mask.shape[0] // batch_size)    # the padded data's bound
    opt = at_round(client_optimizer, t) or local_optimizer(at_round(lr, t), momentum,
                                                           weight_decay, clip)
    trained, mean, std, seen, loss = client(w, w["head"] if share_head else st["head"], key,
                                            dd, opt, steps, prior_mean, prior_std)
    message = {"body": jax.tree.map(jnp.subtract, trained["body"], w["body"]),
               "mean": mean, "std": std, "seen": seen}
    if share_head:
      message["head"] = jax.tree.map(jnp.subtract, trained["head"], w["head"])
    if train_layers is not None:
      message["layers"] = st["layers"]
    new = st if share_head else dict(st, head=trained["head"])
    return message, new, {"loss": loss}

  def aggregate(messages, weights, w):
    zeros = jax.tree.map(jnp.zeros_like, w["head"])
    if train_layers is not None:    # FedCR-OPU3: layer l averaged over the clients sending it
      rows = messages["layers"] & (weights > 0)[:, None]
      return {"body": fedp3.layer_delta(w["body"], messages["body"], rows, weights, 1),
              "head": zeros}
    return {"body": weighted_mean(messages["body"], weights),
            "head": weighted_mean(messages["head"], weights) if share_head else zeros}

  def server_update(server, messages, weights, w, t):
    """The global class distributions: the product of the cohort's experts and N(0, I)."""
    del w, t
    prior_mean, prior_std = server
    on = messages["seen"] * (weights > 0).astype(float_dtype())[:, None]   # [m, C]
    prec = on[:, :, None] / jnp.square(messages["std"])                    # [m, C, d]
    new_mean, new_std = product_of_normals(jnp.sum(prec, 0),
                                           jnp.sum(prec * messages["mean"], 0), 1.0)
    any_seen = jnp.any(on > 0, axis=0)[:, None]
    return (jnp.where(any_seen, (1 - beta2) * prior_mean + beta2 * new_mean, prior_mean),
            jnp.where(any_seen, (1 - beta2) * prior_std + beta2 * new_std, prior_std))

  def body_bits(w):
    return accounting.dense_bits(w["body"]) + (
        accounting.dense_bits(w["head"]) if share_head else 0.0)

  def upload_bits(message, w):
    if train_layers is not None:   # the layers sent: 32 bits a float
      sizes = jnp.asarray(layer_groups.layer_sizes(w["body"], 1), float_dtype())
      models = 32.0 * (message["layers"].astype(float_dtype()) @ sizes)
    else:
      models = as_float(body_bits(w))
    return models + 32.0 * 2 * d * jnp.sum(message["seen"].astype(float_dtype()))

  def download_bits(w):
    num_classes = jax.tree.leaves(w["head"])[-1].shape[-1]
    return as_float(body_bits(w) + 32.0 * 2 * d * num_classes)

  return cohort_round(
      ClientUpdate(init, update, upload_bits=upload_bits, download_bits=download_bits,
                   info_type=RoundInfo, state_type=FedCRState,
                   server=ServerPart(server_init, server_update)),
      cohort_size=cohort_size, sampler=sampler, weighting=weighting, aggregate=aggregate,
      server_optimizer=server_optimizer)
