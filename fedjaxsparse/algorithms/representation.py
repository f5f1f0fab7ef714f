"""Personalised methods that share a representation and keep a personal head — FedCR,
FedSR(-FT) and FedPAC, baselines of the Scafflix paper (Yi, Condat & Richtárik, arXiv:2305.13170,
its additional-baselines table) and of the FedP3 paper (Yi et al., arXiv:2404.09816, its
FedCR comparison), as those papers ran them (FedCR's code, github.com/haozzh/FedCR). Those papers
do not describe the three methods, so they follow the methods' own papers and that code.

All three train a :class:`fedjaxsparse.models.split.SplitModel` (``{"body", "head"}``) with
any sampler, weighting and server optimiser and epoch-based local training
(:func:`fedjaxsparse.ops.local.epoch_optimize`). Each is a client update on
:func:`fedjaxsparse.algorithms.cohort_round.cohort_round`; FedCR's and FedPAC's servers also
keep class statistics beside the model (a
:class:`~fedjaxsparse.algorithms.cohort_round.ServerPart`):

* :func:`fedcr` — a Gaussian representation regularised towards global class-conditional
  distributions built by products of experts; personal heads; FedCR-OPU3 with
  ``train_layers``;
* :func:`fedsr` — FedAvg with the L2R and CMI regularisers of the representation, then
  fine-tuned (FedSR-FT);
* :func:`fedpac` — feature alignment to global class centroids, classifier combination by a
  quadratic programme on the simplex (:func:`simplex_qp`).

:func:`fine_tune` is the final round of FedCR's code (every client trains its head, or its
projection and head, on its own data); :func:`make_fine_tuned_eval_fn` evaluates that way.

References:
  Hao Zhang, Chenglin Li, Wenrui Dai, Junni Zou, Hongkai Xiong (2023). FedCR: Personalized
    Federated Learning Based on Across-Client Common Representation with Conditional Mutual
    Information Regularization. ICML 2023, PMLR 202:41314-41330.
  Nguyen, A. Tuan; Torr, Philip H. S.; Lim, Ser-Nam (2022). FedSR: A Simple and Effective
    Domain Generalization Method for Federated Learning. NeurIPS 2022.
  Jian Xu, Xinyi Tong, Shao-Lun Huang (2023). Personalized Federated Learning with Feature
    Alignment and Classifier Collaboration. ICLR 2023. arXiv:2306.11867.

Source for the team: seed 001 l. 2919-25, 1285; ``seed001_ch3_ch5.md`` §B.1; ``seed001_ch4_ch6.md``
(FedCR row); dissertation Table B.1 (ch. 3) and Fig. 4.2 (ch. 4).
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjaxsparse import evaluation
from fedjaxsparse.algorithms import fedp3
from fedjaxsparse.algorithms.cohort_round import (ClientUpdate, CohortState, ServerPart,
                                                  cohort_round)
from fedjaxsparse.core import Algorithm, as_float, float_dtype
from fedjaxsparse.data.federated import FederatedData
from fedjaxsparse.errors import check_int, check_number
from fedjaxsparse.models.base import softmax_cross_entropy
from fedjaxsparse.models.split import SplitModel, kl_normal, product_of_normals
from fedjaxsparse.ops import accounting, layer_groups
from fedjaxsparse.ops.aggregation import weighted_mean
from fedjaxsparse.ops.local import Schedule, at_round, check_lr, epoch_optimize, max_local_steps
from fedjaxsparse.ops.sampling import client_keys
from fedjaxsparse.runtime.clients import map_clients
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["FedCRState", "FedSRState", "FedPACState", "RoundInfo", "fedcr", "fedsr", "fedpac",
           "local_optimizer", "fine_tune", "make_fine_tuned_eval_fn", "personal_models",
           "project_to_simplex", "simplex_qp", "features_in_batches", "L2R_FORMS"]
__dir__ = _public_dir(__all__)


class _HeadsState(CohortState):
  """A cohort state whose client states hold personal heads (``clients["head"]``)."""
  __slots__ = ()

  @property
  def heads(self) -> Any:
    """Personal heads, leaves ``[N, ...]``."""
    return self.clients["head"]

  @property
  def personal(self) -> Any:
    """Every client's model ``{"body": φ, "head": h_i}``, leaves ``[N, ...]``."""
    return personal_models(self.params, self.heads)


class FedCRState(_HeadsState):
  """:class:`~fedjaxsparse.algorithms.cohort_round.CohortState` of :func:`fedcr`: ``params``
  (the global ``{"body", "head"}``; the head is the shared one only with ``share_head``),
  ``clients`` (``{"head": personal heads}``, leaves ``[N, ...]``, plus ``"layers"``:
  ``bool[N, L]`` with ``train_layers``), ``server`` (``(prior_mean, prior_std)``, ``[C, d]``
  each: r(z|y)), ``server_opt_state``, ``round``."""
  __slots__ = ()

  @property
  def prior_mean(self) -> jax.Array:
    return self.server[0]

  @property
  def prior_std(self) -> jax.Array:
    return self.server[1]


class RoundInfo(NamedTuple):
  """Per round: ``loss`` (the cohort's first-step loss, weighted as the aggregation),
  ``bits_up`` (bodies — only the ``L_i`` layers with ``train_layers`` — plus the class
  experts sent, 2d floats each), ``bits_down`` (body and r(z|y), fp32), ``num_clients``."""
  loss: jax.Array
  bits_up: jax.Array
  bits_down: jax.Array
  num_clients: jax.Array


def personal_models(params: Any, heads: Any) -> Any:
  """``{"body": φ broadcast to [N, ...], "head": heads}`` for heads with leaves ``[N, ...]``."""
  n = jax.tree.leaves(heads)[0].shape[0]
  return {"body": jax.tree.map(lambda a: jnp.broadcast_to(a, (n,) + a.shape), params["body"]),
          "head": heads}


def local_optimizer(lr: Any, momentum: float = 0.0, weight_decay: float = 0.0,
                    clip: float | None = 10.0) -> optax.GradientTransformation:
  """FedCR's local optimiser (PyTorch's SGD after ``clip_grad_norm_``): the gradient's global
  norm clipped at ``clip`` (``None``: no clipping), plus ``weight_decay·w``, then SGD with
  heavy-ball ``momentum`` (``buf ← m·buf + g``, ``w ← w − lr·buf``)."""
  parts = [] if clip is None else [optax.clip_by_global_norm(clip)]
  if weight_decay:
    parts.append(optax.add_decayed_weights(weight_decay))
  parts.append(optax.sgd(lr, momentum=momentum or None))
  return optax.chain(*parts)


def _sampled_cross_entropy(model: SplitModel, head: Any, mu: jax.Array,
                           sigma: jax.Array | None, key: jax.Array, samples: int,
                           y: jax.Array) -> tuple[jax.Array, jax.Array]:
  """``(z [S, B, d], ce [B])``: ``S = samples`` draws ``z = μ + σ ⊙ ε`` (``z = μ``, one draw,
  for ``sigma`` None) and every example's cross-entropy of ``head(z)`` averaged over them."""
  z = mu[None] if sigma is None else (
      mu[None] + sigma[None] * jax.random.normal(key, (samples,) + mu.shape, mu.dtype))
  logits = jax.vmap(model.head, in_axes=(None, 0))(head, z)            # [S, B, C]
  return z, jnp.mean(jax.vmap(softmax_cross_entropy, in_axes=(0, None))(logits, y), axis=0)


def _check(lr, epochs, batch_size, samples, momentum, weight_decay, clip):
  check_lr(lr)
  check_number("momentum", momentum, 0.0, 1.0, high_open=True)
  check_number("weight_decay", weight_decay, 0.0, None)
  if clip is not None:
    check_number("clip", clip, 0.0, None, low_open=True)
  for name, v in (("epochs", epochs), ("batch_size", batch_size), ("samples", samples)):
    check_int(name, v, 1)


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
  :func:`fine_tune` (``trainable="head"``), applied to a copy of the state by the experiments.

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
    momentum: heavy-ball momentum of :func:`local_optimizer` (the code: 0).
    weight_decay: weight decay of :func:`local_optimizer` (the code: 0).
    clip: the global norm the local gradient is clipped at (:func:`local_optimizer`; the
      code: 10; ``None``: no clipping).
    weighting: the body's aggregation weights, ``"uniform"`` (the code) or ``"num_examples"``
      (``"sampling"`` with a sampler).
    share_head: average the head as well (FedAvg with FedCR's regulariser); then the personal
      heads in ``state.clients`` are not trained and every client's model is
      ``state.params``.
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
      instead of :func:`local_optimizer` (``lr``, ``momentum``, ``weight_decay`` and ``clip``
      are then unused).

  Returns:
    An :class:`~fedjaxsparse.core.Algorithm` whose state is a :class:`FedCRState`:
    ``state.params`` (the global ``{"body", "head"}``; the head is the shared one only with
    ``share_head``), ``state.clients`` (``{"head": personal heads}``, leaves ``[N, ...]``, plus
    ``"layers"``: ``bool[N, L]`` with ``train_layers``), ``state.heads`` (the personal heads),
    ``state.personal`` (every client's ``{"body": φ, "head": h_i}``, leaves ``[N, ...]``),
    ``state.server`` = ``(state.prior_mean, state.prior_std)`` (``m, s [C, d]``: r(z|y)),
    ``state.server_opt_state`` and ``state.round``. ``step(key, state, data)`` returns
    ``(state, info)``, ``info`` a :class:`RoundInfo`: ``loss`` (the cohort's first-step loss,
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
  _check(lr, epochs, batch_size, samples, momentum, weight_decay, clip)
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
    _, ce = _sampled_cross_entropy(model, p["head"], mu, None if deterministic else sigma,
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
    trained, mean, std, seen, loss = client(w, st["head"], key, dd, opt, steps, prior_mean,
                                            prior_std)
    message = {"body": jax.tree.map(jnp.subtract, trained["body"], w["body"]),
               "mean": mean, "std": std, "seen": seen}
    if share_head:
      message["head"] = jax.tree.map(jnp.subtract, trained["head"], w["head"])
    if train_layers is not None:
      message["layers"] = st["layers"]
    new = dict(st, head=st["head"] if share_head else trained["head"])
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


def fine_tune(model: SplitModel, personal: Any, data: FederatedData, key: jax.Array, *,
              lr: float, epochs: int = 10, batch_size: int = 48, trainable: str = "head",
              samples: int = 1, momentum: float = 0.0, weight_decay: float = 0.0,
              clip: float | None = 10.0) -> Any:
  """Every client's model after ``epochs`` epochs of training the parts named by ``trainable``
  on its own data, the rest frozen — the final round of FedCR's code for FedCR, FedSR-FT and
  FedPAC, and FedAvg-FT's fine-tuning. ``personal``: ``{"body", "head"}`` with leaves
  ``[N, ...]`` (:func:`personal_models`). ``trainable``: ``"head"`` (FedCR, FedPAC),
  ``"projection+head"`` (FedSR-FT: the Gaussian projection layer and the head) or
  ``"all"``. The loss is the cross-entropy of ``samples`` draws of ``z`` (a Gaussian
  representation) or of the features. Returns the fine-tuned ``personal``."""
  _check(lr, epochs, batch_size, samples, momentum, weight_decay, clip)
  choices = ("head", "projection+head", "all")
  if trainable not in choices:
    raise ValueError(f"trainable must be one of {choices}, got {trainable!r}.")
  one = jax.tree.map(lambda a: a[0], personal)
  mask = {"body": jax.tree_util.tree_map_with_path(
              lambda path, _: trainable == "all" or (
                  trainable == "projection+head" and
                  getattr(path[0], "key", None) == "projection"), one["body"]),
          "head": jax.tree.map(lambda _: True, one["head"])}
  if trainable == "projection+head" and not any(jax.tree.leaves(mask["body"])):
    raise ValueError("trainable='projection+head' needs a body with a 'projection' layer "
                     "(a Gaussian fedcr_net).")

  def loss_fn(p, k, x, y, m):
    mu, sigma = model.representation(p["body"], x)
    _, ce = _sampled_cross_entropy(model, p["head"], mu, sigma, k, samples, y)
    return jnp.sum(ce * m) / jnp.maximum(jnp.sum(m), 1.0), None

  opt = local_optimizer(lr, momentum, weight_decay, clip)
  steps = max_local_steps(data, batch_size, epochs)
  n = data.num_clients

  def client(p, k, d):
    return epoch_optimize(loss_fn, p, opt, k, d, epochs=epochs, batch_size=batch_size,
                          max_steps=steps, trainable=mask)[0]

  # the client ids inside the program (an eager arange compiles a program of its own)
  return jax.jit(lambda p, k, dd: map_clients(client, dd, p, client_keys(k, jnp.arange(n))))(
      personal, key, data)


# --------------------------------------------------------------------------------------------
# FedSR


class FedSRState(CohortState):
  """:class:`~fedjaxsparse.algorithms.cohort_round.CohortState` whose client states are the
  references: ``params`` (the global ``{"body", "head"}``), ``clients`` = :attr:`reference`:
  every client's own reference distributions ``(r_mean [N, C, d], r_scale [N, C, d], c [N])``
  — ``r(z|y=c) = N(r_mean, softplus(r_scale)²)`` and the representation's scale ``C`` —
  never communicated; ``server_opt_state``, ``round``."""
  __slots__ = ()

  @property
  def reference(self) -> tuple:
    return self.clients

  @property
  def personal(self) -> Any:
    """FedSR trains one global model: every client's model is it (``[N, ...]``);
    FedSR-FT's personal models are :func:`fine_tune`'s."""
    n = self.reference[2].shape[0]
    return jax.tree.map(lambda a: jnp.broadcast_to(a, (n,) + a.shape), self.params)


L2R_FORMS = ("norm", "squared")
"""FedSR's L2R term: the mean Euclidean norm of z (its code) or its mean square (the paper)."""


def fedsr(model: SplitModel, lr: float | Schedule, *, l2r: float = 1e-3, cmi: float = 1e-3,
          l2r_form: str = "norm", learn_reference: bool = True, samples: int = 1,
          epochs: int = 2, batch_size: int = 48, cohort_size: int | None = 10,
          momentum: float = 0.0, weight_decay: float = 0.0, clip: float | None = 10.0,
          weighting: str = "uniform", deterministic: bool = False,
          sampler: Any = None,
          server_optimizer: optax.GradientTransformation | None = None,
          uplink: Any = None,
          client_optimizer: Any = None) -> Algorithm:
  """FedSR (Nguyen, Torr and Lim 2022): FedAvg on a Gaussian-representation network with two
  regularisers of the representation, run as the personalised baseline FedSR-FT (then
  :func:`fine_tune` with ``trainable="projection+head"``, FedCR's final round).

  Every client of the cohort starts from the global ``{"body", "head"}`` and runs ``epochs``
  epochs of :func:`local_optimizer` steps on

      mean_b CE(h(z_b), y_b) + l2r·L2R + cmi·mean_b KL( N(Cμ_b, C²σ_b²) ‖ r(z|y_b) ),

  ``z_b = μ_b + σ_b ⊙ ε`` (``samples`` draws), ``L2R = mean_b ‖z_b‖₂`` (``l2r_form="norm"``,
  FedSR's code) or ``mean_b ‖z_b‖²₂`` (``"squared"``, the paper's E‖z‖²), and the client's
  own reference ``r(z|y=c) = N(r_c, softplus(ρ_c)²)`` with the scale ``C`` (initially
  ``r = 0``, ``ρ = 1``, ``C = 1``), trained along with the model (``learn_reference``; FedCR's
  copy of FedSR leaves them fixed on a GPU, ``learn_reference=False``). The server averages
  the models (uniform weights, or ``weighting``); the references stay on the clients.

  With ``l2r = cmi = 0`` and ``deterministic=True`` (``z = μ``) FedSR is FedAvg with epoch-based
  local SGD (tested). A client update on
  :func:`~fedjaxsparse.algorithms.cohort_round.cohort_round`: it uploads its model delta (any
  ``uplink`` compressor applies), its references are its state and are never communicated.

  Args:
    model: a :class:`~fedjaxsparse.models.split.SplitModel` with a Gaussian representation
      (:func:`fedjaxsparse.models.split.fedcr_net` with ``gaussian=True``).
    lr: the local step size η > 0, or a schedule of the round ``t -> η_t``.
    l2r: the weight (≥ 0) of the L2R term, the representation's norm.
    cmi: the weight (≥ 0) of the CMI term, the KL to the client's reference ``r(z|y)``.
    l2r_form: ``"norm"`` (``mean_b ‖z_b‖₂``, FedSR's code) or ``"squared"``
      (``mean_b ‖z_b‖²₂``, the paper's E‖z‖²); :data:`L2R_FORMS`.
    learn_reference: train the client's reference ``(r, ρ, C)`` along with the model (FedSR);
      ``False`` keeps them fixed at their initial values (FedCR's copy of FedSR on a GPU).
    samples: S, draws of ``z`` per example averaged in the cross-entropy; must be 1 with
      ``deterministic``.
    epochs: E, local epochs per round.
    batch_size: B, examples per local step.
    cohort_size: clients per round, uniform without replacement; ``None``: all.
    momentum: heavy-ball momentum of :func:`local_optimizer`.
    weight_decay: weight decay of :func:`local_optimizer`.
    clip: the global norm the local gradient is clipped at (:func:`local_optimizer`;
      ``None``: no clipping).
    weighting: the models' aggregation weights, ``"uniform"`` (FedCR's code) or
      ``"num_examples"`` (``"sampling"`` with a sampler).
    deterministic: ``z = μ`` (no sampling; then ``samples`` must be 1) — with ``l2r = cmi =
      0``, the reduction to FedAvg.
    sampler: a :class:`fedjaxsparse.ops.sampling.Sampler` drawing each round's cohort instead
      of a uniform one of ``cohort_size``; forwarded to
      :func:`~fedjaxsparse.algorithms.cohort_round.cohort_round`.
    server_optimizer: an optax transformation of the pseudo-gradient ``−Δ`` (FedAdam, server
      momentum); ``None`` applies the average as it is. Forwarded to
      :func:`~fedjaxsparse.algorithms.cohort_round.cohort_round`.
    uplink: a :class:`fedjaxsparse.ops.compressors.Compressor` applied to every client's model
      delta (one key per client), charged ``uplink.bits(d)`` per member; ``None``: dense
      uploads. Forwarded to :func:`~fedjaxsparse.algorithms.cohort_round.cohort_round`.
    client_optimizer: an optax transformation (or a function of the round returning one)
      instead of :func:`local_optimizer` (``lr``, ``momentum``, ``weight_decay`` and ``clip``
      are then unused).

  Returns:
    An :class:`~fedjaxsparse.core.Algorithm` whose state is a :class:`FedSRState`:
    ``state.params`` (the global ``{"body", "head"}``), ``state.clients`` =
    ``state.reference`` (every client's ``(r_mean [N, C, d], r_scale [N, C, d], c [N])``),
    ``state.personal`` (the global model broadcast to ``[N, ...]``; FedSR-FT's personal models
    are :func:`fine_tune`'s), ``state.server_opt_state`` and ``state.round``.
    ``step(key, state, data)`` returns ``(state, info)``, ``info`` a :class:`RoundInfo`:
    ``loss`` (the cohort's first-step loss, weighted as the aggregation), ``bits_up`` (the
    dense model, 32 bits a float, per member; ``uplink.bits(d)`` per member with an uplink),
    ``bits_down`` (the dense model per member) and ``num_clients``.

  References:
    Nguyen, A. Tuan; Torr, Philip H. S.; Lim, Ser-Nam (2022). FedSR: A Simple and Effective
      Domain Generalization Method for Federated Learning. NeurIPS 2022. (Code:
      github.com/atuannguyen/FedSR.)
    Hao Zhang, Chenglin Li, Wenrui Dai, Junni Zou, Hongkai Xiong (2023). FedCR: Personalized
      Federated Learning Based on Across-Client Common Representation with Conditional Mutual
      Information Regularization. ICML 2023, PMLR 202:41314-41330. (FedSR-FT as run in
      FedCR's code.)
  """
  _check(lr, epochs, batch_size, samples, momentum, weight_decay, clip)
  check_number("l2r", l2r, 0.0, None)
  check_number("cmi", cmi, 0.0, None)
  if l2r_form not in L2R_FORMS:
    raise ValueError(f"l2r_form must be one of {L2R_FORMS}, got {l2r_form!r}.")
  if not model.gaussian:
    raise ValueError("fedsr needs a SplitModel with a Gaussian representation "
                     "(fedcr_net(..., gaussian=True)).")
  if deterministic and samples != 1:
    raise ValueError(f"deterministic=True draws no z: samples must be 1, got {samples}.")
  d = model.dim

  def loss_fn(both, key, x, y, mask):
    p, (r_mean, r_scale, c) = both
    mu, sigma = model.representation(p["body"], x)
    z, per = _sampled_cross_entropy(model, p["head"], mu, None if deterministic else sigma,
                                    key, samples, y)
    if l2r:
      norms = jnp.sum(jnp.square(z), axis=-1)
      # ‖z‖ with a zero (not infinite) gradient at z = 0 (a deterministic z = μ can be 0)
      safe = jnp.where(norms > 0, jnp.sqrt(jnp.where(norms > 0, norms, 1.0)), 0.0)
      per = per + l2r * jnp.mean(norms if l2r_form == "squared" else safe, axis=0)
    if cmi:
      per = per + cmi * kl_normal(c * mu, c * sigma, r_mean[y], jax.nn.softplus(r_scale[y]))
    return jnp.sum(per * mask) / jnp.maximum(jnp.sum(mask), 1.0), None

  def init(key, params, n):
    del key
    num_classes = jax.tree.leaves(params["head"])[-1].shape[-1]
    return (jnp.zeros((n, num_classes, d), float_dtype()),
            jnp.ones((n, num_classes, d), float_dtype()), jnp.ones((n,), float_dtype()))

  def update(k, w, ref, dd, t):
    opt = at_round(client_optimizer, t) or local_optimizer(at_round(lr, t), momentum,
                                                           weight_decay, clip)
    steps = epochs * -(-dd.mask.shape[0] // batch_size)    # the padded data's bound
    mask = (jax.tree.map(lambda _: True, w),
            jax.tree.map(lambda _: learn_reference, ref))
    (p, new_ref), _, loss = epoch_optimize(
        loss_fn, (w, ref), opt, k, dd, epochs=epochs, batch_size=batch_size, max_steps=steps,
        trainable=None if learn_reference else mask)
    return jax.tree.map(jnp.subtract, p, w), new_ref, {"loss": loss}

  dense = lambda *a: as_float(accounting.dense_bits(a[-1]))
  return cohort_round(
      ClientUpdate(init, update, upload_bits=dense, download_bits=dense, info_type=RoundInfo,
                   state_type=FedSRState),
      cohort_size=cohort_size, sampler=sampler, weighting=weighting,
      server_optimizer=server_optimizer, uplink=uplink)


# --------------------------------------------------------------------------------------------
# FedPAC


class FedPACState(_HeadsState):
  """:class:`~fedjaxsparse.algorithms.cohort_round.CohortState` of :func:`fedpac`: ``params``
  (the global ``{"body", "head"}``; its head is unused), ``clients`` (``{"head": personal
  heads}``, leaves ``[N, ...]``), ``server`` (``(centroids [C, F], has_centroid bool[C])``:
  the global feature centroids ``c_k`` and whether some client of the last cohort held class
  k), ``server_opt_state``, ``round``."""
  __slots__ = ()

  @property
  def centroids(self) -> jax.Array:
    return self.server[0]

  @property
  def has_centroid(self) -> jax.Array:
    return self.server[1]


def project_to_simplex(v: jax.Array, valid: jax.Array | None = None) -> jax.Array:
  """The Euclidean projection of ``v [m]`` onto the probability simplex
  ``{a ≥ 0, Σ a = 1}`` (Duchi et al., 2008, by sorting); coordinates with ``valid`` false are
  held at 0 (the projection onto the face of the valid ones)."""
  big = jnp.asarray(jnp.finfo(v.dtype).max / 4, v.dtype)
  w = v if valid is None else jnp.where(valid, v, -big)
  u = jnp.sort(w)[::-1]
  cssv = jnp.cumsum(jnp.where(u > -big, u, 0.0)) - 1.0
  k = jnp.arange(1, v.shape[0] + 1, dtype=v.dtype)
  cond = (u - cssv / k > 0) & (u > -big)
  rho = jnp.max(jnp.where(cond, jnp.arange(v.shape[0]), 0))
  theta = cssv[rho] / (rho + 1).astype(v.dtype)
  return jnp.maximum(w - theta, 0.0)


def simplex_qp(p: jax.Array, valid: jax.Array | None = None, iterations: int = 500
               ) -> jax.Array:
  """``argmin_{a ∈ Δ} aᵀ P a`` for a symmetric positive semi-definite ``P [m, m]`` over the
  probability simplex (restricted to the ``valid`` coordinates): accelerated projected
  gradient (FISTA) with step ``1/(2λ_max(P))`` from the uniform point, ``iterations`` steps
  (FedPAC's classifier-combination problem; its code calls CVXPY)."""
  m = p.shape[0]
  ok = jnp.ones((m,), bool) if valid is None else valid
  lam = 2.0 * jnp.max(jnp.linalg.eigvalsh(p))
  step = 1.0 / jnp.maximum(lam, jnp.finfo(p.dtype).tiny)
  a0 = ok.astype(p.dtype) / jnp.maximum(jnp.sum(ok), 1).astype(p.dtype)

  def body(_, carry):
    a, y, t = carry
    a_new = project_to_simplex(y - step * 2.0 * (p @ y), ok)
    t_new = 0.5 * (1.0 + jnp.sqrt(1.0 + 4.0 * t * t))
    y_new = a_new + ((t - 1.0) / t_new) * (a_new - a)
    return a_new, y_new, t_new

  a, _, _ = jax.lax.fori_loop(0, iterations, body, (a0, a0, jnp.ones((), p.dtype)))
  return a


def fedpac(model: SplitModel, lr: float | Schedule, *, lam: float = 1.0, epochs: int = 1,
           head_epochs: int = 1, head_lr: float = 0.1, batch_size: int = 50,
           cohort_size: int | None = 10, momentum: float = 0.5, weight_decay: float = 5e-4,
           clip: float | None = None, weighting: str = "num_examples",
           combine_heads: bool = True, min_weight: float = 1e-3, qp_iterations: int = 500,
           sampler: Any = None,
           server_optimizer: optax.GradientTransformation | None = None,
           client_optimizer: Any = None) -> Algorithm:
  """FedPAC (Xu, Tong and Huang 2023): feature alignment to global class centroids and
  personalised classifier combination.

  Round t, every client i of the cohort, starting from ``(φ_t, h_i)``:

  1. statistics of its training data under ``φ_t`` (features ``f ∈ R^F``): class shares
     ``p_ik = n_ik/n_i``, class centroids ``μ_ik``,
     ``V_i = (Σ_k p_ik tr(E[f fᵀ | k]) − Σ_k p_ik² ‖μ_ik‖²) / n_i`` and ``H_i[k] = p_ik μ_ik``;
  2. ``head_epochs`` epochs on the head alone (step ``head_lr``), then ``epochs`` epochs on the
     body alone with ``CE + λ·mean_{b,j} (f_j(x_b) − c_{y_b, j})²`` — ``c_k`` the global
     centroid, or the client's own ``μ_ik`` where no global one exists; no alignment term in the
     first round (SGD with ``momentum``, ``weight_decay``; FedPAC's code: 0.5 and 5e-4);
  3. uploads ``φ_i``, ``ĥ_i``, the trained model's class centroids ``μ'_ik`` with ``n_ik``,
     and ``(V_i, H_i)``.

  The server averages the bodies (data-size weights), sets ``c_k = Σ_i n_ik μ'_ik / Σ_i n_ik``
  over the cohort (classes nobody in it holds have none), and gives every cohort client the
  combined head ``h_i = Σ_j α_ij ĥ_j / Σ_j α_ij`` with

      α_i = argmin_{α ∈ Δ} Σ_j α_j² V_j + Σ_k ‖Σ_j α_j (H_i[k] − H_j[k])‖²
          = argmin αᵀ (diag V + D_i) α,   D_i[j, j'] = Σ_k (H_i[k] − H_j[k])·(H_i[k] − H_j'[k]),

  (:func:`simplex_qp`), weights below ``min_weight`` set to 0 (FedPAC's code). With
  ``combine_heads=False`` each client keeps its ``ĥ_i``.

  A client update on :func:`~fedjaxsparse.algorithms.cohort_round.cohort_round`: the global
  centroids are its server part, the combined heads the server's reply to the members.

  No ``uplink``: the upload holds class statistics beside the body.

  Choices from FedPAC's code where the paper is silent: the statistics use the model the
  client receives, before training; the alignment loss is the mean squared error over the
  batch and the F features; ``V_i`` is divided by ``n_i``. FedPAC's code projects ``P`` onto
  the positive semi-definite cone when CVXPY would refuse it; ``diag V + D_i`` is a Gram
  matrix plus a non-negative diagonal, so it never needs to.

  Args:
    model: a :class:`~fedjaxsparse.models.split.SplitModel` with a deterministic
      representation (:func:`fedjaxsparse.models.split.fedcr_net` with ``gaussian=False``).
    lr: the body's step size η > 0, or a schedule of the round ``t -> η_t``.
    lam: λ ≥ 0, the weight of the feature alignment term (the paper: 1).
    epochs: local epochs on the body per round (≥ 1).
    head_epochs: local epochs on the head alone, before the body's (≥ 0).
    head_lr: the head's step size (FedPAC's code: 0.1).
    batch_size: B examples per local step.
    cohort_size: clients per round, uniform without replacement (``None``: all).
    momentum: heavy-ball momentum of :func:`local_optimizer`, for both parts (FedPAC's code:
      0.5).
    weight_decay: weight decay of :func:`local_optimizer`, for both parts (FedPAC's code:
      5e-4).
    clip: the global norm the local gradient is clipped at (:func:`local_optimizer`, both
      parts; ``None``: no clipping).
    weighting: the bodies' aggregation weights: ``"num_examples"`` (the paper), ``"uniform"``
      or ``"sampling"`` (with ``sampler``).
    combine_heads: give every member the combination of the cohort's heads (else each keeps
      its own).
    min_weight: combination weights below it are set to 0 (FedPAC's code: 1e-3).
    qp_iterations: iterations of :func:`simplex_qp`.
    sampler: a :class:`fedjaxsparse.ops.sampling.Sampler` drawing each round's cohort instead
      of a uniform one of ``cohort_size``; forwarded to
      :func:`~fedjaxsparse.algorithms.cohort_round.cohort_round`.
    server_optimizer: an optax transformation of the bodies' pseudo-gradient ``−Δ``; ``None``
      applies the average as it is. Forwarded to
      :func:`~fedjaxsparse.algorithms.cohort_round.cohort_round`.
    client_optimizer: an optax transformation (or a function of the round returning one) for
      the body's epochs instead of :func:`local_optimizer` with ``lr`` (the head keeps its SGD
      with ``head_lr``).

  Returns:
    An :class:`~fedjaxsparse.core.Algorithm` whose state is a :class:`FedPACState`:
    ``state.params`` (the global ``{"body", "head"}``; its head is unused),
    ``state.clients`` (``{"head": personal heads}``, leaves ``[N, ...]``), ``state.heads``,
    ``state.personal`` (every client's ``{"body": φ, "head": h_i}``, leaves ``[N, ...]``),
    ``state.server`` = ``(state.centroids [C, F], state.has_centroid bool[C])`` (the global
    centroids ``c_k`` and whether some client of the last cohort held class k),
    ``state.server_opt_state`` and ``state.round``. ``step(key, state, data)`` returns
    ``(state, info)``, ``info`` a :class:`RoundInfo`: ``loss`` (the cohort's first-step loss
    — of the head's epochs, or of the body's with ``head_epochs=0`` — weighted as the
    aggregation), ``bits_up`` (per member: body, head and the statistics ``V_i``, ``H_i``,
    centroids and counts, ``1 + 2CF + C`` floats, 32 bits a float), ``bits_down`` (per
    member: the body and the C·F global centroids, fp32) and ``num_clients``.

  References:
    Jian Xu, Xinyi Tong, Shao-Lun Huang (2023). Personalized Federated Learning with Feature
      Alignment and Classifier Collaboration. ICLR 2023. arXiv:2306.11867. (Code:
      github.com/JianXu95/FedPAC.)
  """
  _check(lr, epochs, batch_size, 1, momentum, weight_decay, clip)
  check_number("head_lr", head_lr, 0.0, None, low_open=True)
  check_number("lam", lam, 0.0, None)
  check_number("min_weight", min_weight, 0.0, 1.0, high_open=True)
  for name, v in (("head_epochs", head_epochs), ("qp_iterations", qp_iterations)):
    check_int(name, v, 0)
  if model.gaussian:
    raise ValueError("fedpac needs a SplitModel with a deterministic representation "
                     "(fedcr_net(..., gaussian=False)).")

  def ce_loss(p, key, x, y, mask, centroids, align):
    del key
    f = model.features(p["body"], x)
    per = softmax_cross_entropy(model.head(p["head"], f), y)
    count = jnp.maximum(jnp.sum(mask), 1.0)
    total = jnp.sum(per * mask) / count
    if lam:
      sq = jnp.mean(jnp.square(f - centroids[y]), axis=-1)
      total = total + align * lam * jnp.sum(sq * mask) / count
    return total, None

  def statistics(body, data, num_classes):
    """Class counts [C], centroids [C, F] and mean squared norms [C] of φ's features."""
    f = features_in_batches(model, body, data.x, batch_size)
    onehot = jax.nn.one_hot(data.y, num_classes, dtype=f.dtype) * data.mask[:, None]
    counts = jnp.sum(onehot, axis=0)
    safe = jnp.maximum(counts, 1.0)
    return counts, (onehot.T @ f) / safe[:, None], (onehot.T @ jnp.sum(f * f, -1)) / safe

  def client(w, head, key, data, body_opt, round_, centroids, has, steps_head, steps_body):
    num_classes = centroids.shape[0]
    counts, mu, sq = statistics(w["body"], data, num_classes)
    n = jnp.maximum(jnp.sum(counts), 1.0)
    share = counts / n
    v = (jnp.sum(share * sq) - jnp.sum(jnp.square(share) * jnp.sum(mu * mu, -1))) / n
    h_ref = share[:, None] * mu
    target = jnp.where(has[:, None], centroids, mu)
    align = (round_ > 0).astype(mu.dtype)
    loss = lambda p, k, x, y, m: ce_loss(p, k, x, y, m, target, align)
    start = {"body": w["body"], "head": head}
    only = lambda part: {"body": jax.tree.map(lambda _: part == "body", w["body"]),
                         "head": jax.tree.map(lambda _: part == "head", head)}
    k_head, k_body = jax.random.split(key)
    p, first = start, jnp.zeros((), mu.dtype)
    if head_epochs:
      p, _, first = epoch_optimize(
          loss, p, local_optimizer(head_lr, momentum, weight_decay, clip), k_head, data,
          epochs=head_epochs, batch_size=batch_size,
          max_steps=steps_head, trainable=only("head"))
    p, _, body_first = epoch_optimize(
        loss, p, body_opt, k_body, data,
        epochs=epochs, batch_size=batch_size,
        max_steps=steps_body, trainable=only("body"))
    new_counts, new_mu, _ = statistics(p["body"], data, num_classes)
    return p, new_counts, new_mu, v, h_ref, first if head_epochs else body_first

  def init(key, params, n):
    del key
    return {"head": jax.tree.map(lambda a: jnp.broadcast_to(a, (n,) + a.shape),
                                 params["head"])}

  def server_init(params, n):
    del n
    num_classes = jax.tree.leaves(params["head"])[-1].shape[-1]
    return (jnp.zeros((num_classes, model.dim), float_dtype()),
            jnp.zeros((num_classes,), bool))

  def update(key, broadcast, st, dd, t):
    w, (centroids, has) = broadcast
    per_epoch = -(-dd.mask.shape[0] // batch_size)       # the padded data's bound
    body_opt = at_round(client_optimizer, t) or local_optimizer(at_round(lr, t), momentum,
                                                                weight_decay, clip)
    p, counts, mu, v, h_ref, loss = client(
        w, st["head"], key, dd, body_opt, t, centroids, has,
        max(head_epochs, 1) * per_epoch, epochs * per_epoch)
    message = {"body": jax.tree.map(jnp.subtract, p["body"], w["body"]), "head": p["head"],
               "counts": counts, "mu": mu, "v": v, "h_ref": h_ref}
    return message, {"head": p["head"]}, {"loss": loss}

  def aggregate(messages, weights, w):
    return {"body": weighted_mean(messages["body"], weights),
            "head": jax.tree.map(jnp.zeros_like, w["head"])}

  def server_update(server, messages, weights, w, t):
    """The global centroids: every class's features averaged over the members holding it."""
    del server, w, t
    held = messages["counts"] * (weights > 0).astype(float_dtype())[:, None]   # [m, C]
    total = jnp.sum(held, axis=0)
    centroids = (jnp.einsum("mc,mcf->cf", held, messages["mu"])
                 / jnp.maximum(total, 1.0)[:, None])
    return centroids, total > 0

  def reply(states, messages, weights, w, server):
    """Each member's head: the combination of the cohort's heads (the simplex QP)."""
    del w, server
    if not combine_heads:
      return states
    valid = weights > 0
    h_ref, v, heads = messages["h_ref"], messages["v"], messages["head"]
    flat = h_ref.reshape(h_ref.shape[0], -1)                            # [m, C·F]

    def combine(i):
      diff = flat[i][None] - flat                                       # [m, C·F]
      alpha = simplex_qp(jnp.diag(v) + diff @ diff.T, valid, qp_iterations)
      alpha = jnp.where(alpha >= min_weight, alpha, 0.0)
      alpha = alpha / jnp.maximum(jnp.sum(alpha), jnp.finfo(alpha.dtype).tiny)
      return jax.tree.map(lambda hh: jnp.tensordot(alpha.astype(hh.dtype), hh, axes=1), heads)

    return {"head": jax.lax.map(combine, jnp.arange(flat.shape[0]))}

  def stats_floats(w):   # V_i, H_i, centroids, counts
    c = jax.tree.leaves(w["head"])[-1].shape[-1]
    return 1 + 2 * c * model.dim + c

  def upload_bits(message, w):
    del message
    return as_float(accounting.dense_bits(w["body"]) + accounting.dense_bits(w["head"])
                    + 32.0 * stats_floats(w))

  def download_bits(w):
    c = jax.tree.leaves(w["head"])[-1].shape[-1]
    return as_float(accounting.dense_bits(w["body"]) + 32.0 * c * model.dim)

  return cohort_round(
      ClientUpdate(init, update, upload_bits=upload_bits, download_bits=download_bits,
                   info_type=RoundInfo, state_type=FedPACState,
                   server=ServerPart(server_init, server_update, reply)),
      cohort_size=cohort_size, sampler=sampler, weighting=weighting, aggregate=aggregate,
      server_optimizer=server_optimizer)


def features_in_batches(model: SplitModel, body: Any, x: jax.Array, batch_size: int
                        ) -> jax.Array:
  """``model.features(body, x)`` for one client's ``x [M, ...]``, computed ``batch_size`` rows
  at a time (``lax.map``; rows padded to a multiple), so a client's whole data set never sits
  in one activation tensor."""
  m = x.shape[0]
  b = min(batch_size, m)
  pad = -m % b
  xp = jnp.concatenate([x, jnp.zeros((pad,) + x.shape[1:], x.dtype)]) if pad else x
  out = jax.lax.map(lambda xb: model.features(body, xb), xp.reshape((-1, b) + x.shape[1:]))
  return out.reshape((-1,) + out.shape[2:])[:m]


def make_fine_tuned_eval_fn(model: SplitModel, train: FederatedData, key: jax.Array, *,
                            lr: float, epochs: int = 10, batch_size: int = 48,
                            trainable: str = "head", samples: int = 1,
                            batch_size_eval: int | None = None
                            ) -> Callable[[Any, FederatedData], dict[str, jax.Array]]:
  """``(state, test) -> metrics`` for the runner: every client's model ``state.personal``
  fine-tuned on its own training examples ``train`` by :func:`fine_tune` (on a copy — the
  state is not changed), then evaluated on its own test examples
  (:func:`fedjaxsparse.evaluation.evaluate_personal`'s keys), the models before fine-tuning
  beside as ``before_accuracy``. FedCR's code evaluates its last round this way."""
  net = model.as_model()

  def eval_fn(state, test):
    personal = state.personal
    tuned = fine_tune(model, personal, train, key, lr=lr, epochs=epochs,
                      batch_size=batch_size, trainable=trainable, samples=samples)
    out = evaluation.evaluate_personal(net, tuned, test, batch_size_eval)
    out["before_accuracy"] = evaluation.evaluate_personal(
        net, personal, test, batch_size_eval, per_client=False)["accuracy"]
    return out

  return eval_fn
