"""FedPM: federated *probabilistic masks* over frozen random weights — the mask is the model.

References:
  Berivan Isik, Francesco Pase, Deniz Gündüz, Tsachy Weissman, Michele Zorzi (2023). Sparse
    Random Networks for Communication-Efficient Federated Learning. ICLR 2023.
    arXiv:2209.15328.
  Shiwei Li, Yingyi Cheng, Haozhao Wang, Xing Tang, Shijie Xu, Weihong Luo, et al. (2024).
    Masked Random Noise for Communication-Efficient Federated Learning. ACM Multimedia 2024.
    arXiv:2408.03220.

Every client shares the frozen random weights ``W₀`` (one seed) and the server keeps mask
probabilities ``θ`` (one per weight). Round t: each participant trains scores ``s`` from
``logit(θ^t)`` by epoch-based SGD with the forward model ``W₀ ⊙ m``, ``m ~ Bernoulli(σ(s))``
drawn afresh each step, the gradient passed straight through the sampling to the probability
(``∂L/∂s = ∂L/∂m · σ′(s)``), then uploads one sampled mask ``m_k ~ Bernoulli(σ(s_k))``: d bits.
The server averages the masks, ``θ^{t+1} = clip(mean_k m_k, ε, 1 − ε)`` (the plain mean of the
FedMRN paper (Li et al., 2024), where FedPM is a baseline, with its sum over the participants;
FedPM's Bayesian aggregation is not in that paper) — clipped because ``logit(0 or 1) = ∓∞``.

The deployed model (:attr:`FedPMState.params`) is ``W₀ ⊙ 1[θ ≥ ½]``, the most likely mask (the
FedMRN paper does not say which mask it evaluates).

The round is :func:`fedjaxsparse.algorithms.cohort_round.cohort_round` with FedPM's
:func:`client_update`: its global model is ``θ``, ``W₀`` is the server's part
(:class:`~fedjaxsparse.algorithms.cohort_round.ServerPart`, broadcast with ``θ``, never
updated), the aggregation is :func:`mask_mean` (the weighted mean of the masks minus ``θ``) and
the server's prox the clip — so any sampler, weighting, server optimizer (on the
pseudo-gradient ``θ − mean_k m_k``) and optax client optimizer (on the scores) compose. A mask
is already one bit per entry: no uplink compressor composes with it.

Source for the team: seed 003's model-compression baseline; spec ``seed000_003.md`` B.5.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjaxsparse.algorithms.cohort_round import (ClientUpdate, CohortState, ServerPart,
                                                  cohort_round)
from fedjaxsparse.core import Algorithm, LossFn, as_float, float_dtype
from fedjaxsparse.data.federated import FederatedData
from fedjaxsparse.errors import check_int, check_number
from fedjaxsparse.ops import accounting
from fedjaxsparse.ops.local import at_round, epoch_descent
from fedjaxsparse.ops.noise_masks import tree_map_keyed
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["FedPMInfo", "FedPMState", "client_update", "deployed", "fedpm", "mask_mean"]
__dir__ = _public_dir(__all__)


def deployed(weights: Any, theta: Any) -> Any:
  """FedPM's deployed model ``W₀ ⊙ 1[θ ≥ ½]``: the frozen weights under the most likely
  mask."""
  return jax.tree.map(lambda w, t: w * (t >= 0.5), weights, theta)


class FedPMState(CohortState):
  """FedPM's :class:`~fedjaxsparse.algorithms.cohort_round.CohortState`: its model field holds
  the mask probabilities ``θ`` (:attr:`theta`), its server part the frozen weights ``W₀``
  (:attr:`weights`); :attr:`params` is the deployed model ``W₀ ⊙ 1[θ ≥ ½]``, what the runner
  evaluates."""
  __slots__ = ()

  @property
  def theta(self) -> Any:
    """The mask probabilities θ (one per weight)."""
    return tuple.__getitem__(self, 0)

  @property
  def weights(self) -> Any:
    """The frozen random weights W₀."""
    return self.server

  @property
  def params(self) -> Any:
    """The deployed model ``W₀ ⊙ 1[θ ≥ ½]``."""
    return deployed(self.weights, self.theta)


class FedPMInfo(NamedTuple):
  """Per round: ``loss`` (the participants' loss of the deployed model they received, weighted
  as the aggregation), ``bits_up`` (d per upload), ``bits_down`` (32·d for θ),
  ``num_clients``, ``density`` (mean θ received)."""
  loss: jax.Array
  bits_up: jax.Array
  bits_down: jax.Array
  num_clients: jax.Array
  density: jax.Array


def mask_mean(masks: Any, weights: jax.Array, theta: Any) -> Any:
  """FedPM's aggregation: ``Δ = Σ_k p_k m_k − θ`` of the uploaded binary masks ``m_k``
  (``int8 [m, ...]``), so that the server's new ``θ`` is their weighted mean."""
  return jax.tree.map(
      lambda m, t: jnp.tensordot(weights.astype(t.dtype), m.astype(t.dtype), axes=1) - t,
      masks, theta)


def _box(clip: float):
  """The projection onto ``[ε, 1 − ε]`` of every entry (a prox: the box's indicator)."""
  return lambda tree, step: jax.tree.map(lambda t: jnp.clip(t, clip, 1 - clip), tree)


def fedpm(loss_fn: LossFn, lr: float, *, epochs: int = 1, batch_size: int = 64,
          cohort_size: int | None = None, clip: float = 1e-3, sampler: Any = None,
          weighting: str = "uniform",
          server_optimizer: optax.GradientTransformation | None = None,
          client_optimizer: Any = None) -> Algorithm:
  """FedPM (Isik, Pase, Gündüz, Weissman and Zorzi, 2023): federated probabilistic masks over
  frozen random weights — the clients learn which weights to keep, the mask is the model, and
  each client uploads one sampled binary mask (1 bit per weight).

  All clients share the frozen random weights ``W₀`` (the ``params`` given to ``init``); the
  server keeps one mask probability per weight, ``θ`` (``θ⁰ = ½`` everywhere). Round t, for a
  cohort ``C_t`` of K clients:

  * client k starts scores ``s = logit(θ^t)`` and runs ``E·⌈n_k/B⌉`` SGD steps (``E`` epochs
    of minibatches of ``B`` drawn without replacement) on ``F_k(W₀ ⊙ m)``, with
    ``m ~ Bernoulli(σ(s))`` drawn afresh each step and the gradient passed straight through
    the sampling (``∂F/∂s = ∂F/∂m · σ′(s)``);
  * it uploads one sampled mask ``m_k ~ Bernoulli(σ(s_k))`` (``int8``, d bits);
  * the server sets ``θ^{t+1} = clip(Σ_{k∈C_t} p_k m_k, ε, 1 − ε)`` (``p_k = 1/K`` by
    default: the plain mean of the masks) — clipped because ``logit(0 or 1) = ∓∞``.

  The deployed (evaluated) model is ``W₀ ⊙ 1[θ ≥ ½]``, the most likely mask. The plain mean
  is the form of FedPM given by the FedMRN paper (Li et al., 2024), where FedPM is a baseline;
  the original FedPM's Bayesian aggregation is not implemented. The round is
  :func:`fedjaxsparse.algorithms.cohort_round.cohort_round` with :func:`client_update` and
  the aggregation :func:`mask_mean`, so any sampler, weighting, server optimizer (on the
  pseudo-gradient ``θ − Σ_k p_k m_k``) and optax client optimizer (on the scores) compose; a
  mask is already one bit per entry, so no uplink compressor composes with it. See the
  module docstring (:mod:`fedjaxsparse.algorithms.fedpm`) for the full story.

  Args:
    loss_fn: ``(params, x, y, mask) -> F_k``, one client's mean loss over the masked
      examples (:func:`fedjaxsparse.models.make_loss`).
    lr: SGD step η on the scores, ``s ← s − η g`` (> 0).
    epochs: local epochs E per round (int ≥ 1); each client runs ``E·⌈n_k/B⌉`` steps.
    batch_size: minibatch size B of the epoch protocol (int ≥ 1; the last batch of an epoch
      holds the remainder).
    cohort_size: clients per round, drawn uniformly without replacement inside ``jit``
      (``None``: all clients, full participation).
    clip: ε of the box ``θ ∈ [ε, 1 − ε]`` applied after every server step (in (0, ½)).
    sampler: a :class:`fedjaxsparse.ops.sampling.Sampler` drawing each round's cohort
      (block, stratified, importance, ...) instead of ``cohort_size``'s uniform one.
    weighting: the aggregation weights ``p_k``: ``"uniform"`` (``1/K``, the plain mean of
      the masks, as in the paper), ``"num_examples"`` (``n_k/Σ_{C_t} n_j``) or
      ``"sampling"`` (``1/(N π_k)``, π_k the ``sampler``'s inclusion probability of client
      k: unbiased weights).
    server_optimizer: an optax transformation of the pseudo-gradient ``θ − Σ_k p_k m_k``
      (FedAdam, server momentum), clipped to the box after it; ``None`` sets
      ``θ ← Σ_k p_k m_k`` (the paper).
    client_optimizer: an optax transformation of the straight-through gradient on the scores
      (its state fresh each round), or a function of the round returning one; ``None`` is
      the paper's plain SGD ``s ← s − η g`` (``optax.sgd(lr)`` computes it bit for bit).

  Returns:
    An :class:`~fedjaxsparse.core.Algorithm`. ``init(key, params, data)`` takes ``params`` as
    the frozen random weights ``W₀`` and returns a :class:`FedPMState`: ``state.theta`` (the
    mask probabilities θ, one per weight), ``state.weights`` (``W₀``, never updated),
    ``state.params`` (the deployed model ``W₀ ⊙ 1[θ ≥ ½]``, what is evaluated),
    ``state.clients`` (``()``: stateless clients), ``state.server_opt_state`` and
    ``state.round`` (``int32``, rounds completed). ``step(key, state, data)`` returns
    ``(state, info)`` with a :class:`FedPMInfo`: ``loss`` (the members' loss of the deployed
    model they received, on all their data, weighted as the aggregation), ``bits_up`` (d
    bits per member, summed over the cohort), ``bits_down`` (32·d per member for the dense θ,
    summed), ``num_clients`` (``int32``, the cohort size) and ``density`` (the mean of the θ
    received this round).

  References:
    Berivan Isik, Francesco Pase, Deniz Gündüz, Tsachy Weissman, Michele Zorzi (2023).
      Sparse Random Networks for Communication-Efficient Federated Learning. ICLR 2023.
      arXiv:2209.15328.
    Shiwei Li, Yingyi Cheng, Haozhao Wang, Xing Tang, Shijie Xu, Weihong Luo, et al. (2024).
      Masked Random Noise for Communication-Efficient Federated Learning. ACM Multimedia
      2024. arXiv:2408.03220.

  Source for the team: seed 003's model-compression baseline; spec ``seed000_003.md`` B.5.
  """
  check_number("clip", clip, 0.0, 0.5, low_open=True, high_open=True)
  base = cohort_round(
      client_update(loss_fn, lr, epochs=epochs, batch_size=batch_size,
                    client_optimizer=client_optimizer),
      cohort_size=cohort_size, sampler=sampler, weighting=weighting, aggregate=mask_mean,
      server_optimizer=server_optimizer, server_prox=_box(clip))

  def init(key, params, data: FederatedData) -> FedPMState:
    theta = jax.tree.map(lambda w: jnp.full(w.shape, 0.5, w.dtype), params)
    return base.init(key, theta, data)._replace(server=params)

  return Algorithm(init, base.step)


def client_update(loss_fn: LossFn, lr: float, *, epochs: int = 1, batch_size: int = 64,
                  client_optimizer: Any = None) -> ClientUpdate:
  """FedPM's client (stateless). It receives ``(θ, W₀)``, trains scores ``s`` from
  ``logit(θ)`` for ``E·⌈n_k/B⌉`` steps (:func:`fedjaxsparse.ops.local.epoch_loop`) with the
  forward model ``W₀ ⊙ m``, ``m ~ Bernoulli(σ(s))`` drawn afresh each step and the gradient
  passed straight through to ``σ(s)``, and uploads one sampled mask ``Bernoulli(σ(s))``
  (``int8``, d bits). Its key splits into the minibatch order, the training masks and the
  uploaded mask. Its ``"loss"`` is its loss of the deployed model ``W₀ ⊙ 1[θ ≥ ½]`` it
  received. Arguments as :func:`fedpm`."""
  check_number("lr", lr, 0.0, None, low_open=True)
  for name, v in (("epochs", epochs), ("batch_size", batch_size)):
    check_int(name, v, 1)

  def masked_loss(s, w0, key, x, y, m):
    def sample(k, si):  # straight-through Bernoulli: forward m, gradient as if m = σ(s)
      p = jax.nn.sigmoid(si)
      b = jax.random.bernoulli(k, p).astype(si.dtype)
      return p + jax.lax.stop_gradient(b - p)
    mask = tree_map_keyed(sample, key, s)
    return loss_fn(jax.tree.map(jnp.multiply, w0, mask), x, y, m)

  grad = jax.grad(masked_loss)

  def update(key, received, state, d, t):
    theta, w0 = received
    k_order, k_masks, k_final = jax.random.split(key, 3)
    s0 = jax.tree.map(lambda p: jnp.log(p) - jnp.log1p(-p), theta)
    max_steps = epochs * -(-d.mask.shape[0] // batch_size)   # the padded data's bound
    gradient = lambda t, s, batch: grad(s, w0, jax.random.fold_in(k_masks, t), *batch)
    s = epoch_descent(gradient, s0, k_order, d, lr=lr,
                      optimizer=at_round(client_optimizer, t), epochs=epochs,
                      batch_size=batch_size, max_steps=max_steps)
    mask = tree_map_keyed(lambda k, si: jax.random.bernoulli(k, jax.nn.sigmoid(si)).astype(
        jnp.int8), k_final, s)
    return mask, state, {"loss": loss_fn(deployed(w0, theta), d.x, d.y, d.mask)}

  def round_metrics(theta, t, size):
    del t, size
    total = sum(jnp.sum(a) for a in jax.tree.leaves(theta))
    return {"density": (total / accounting.num_params(theta)).astype(float_dtype())}

  return ClientUpdate(
      init=lambda key, params, n: (), update=update,
      upload_bits=lambda mask, theta: as_float(accounting.mask_bits(
          accounting.num_params(theta), with_seed=False)),
      round_metrics=round_metrics, info_type=FedPMInfo, state_type=FedPMState,
      server=ServerPart(init=lambda params, n: (), update=lambda w0, *args: w0))
