"""FedMRN / FedMRNS: clients learn 1-bit masks over seeded random noise during local training, so
the uplink is d bits plus one seed.

References:
  Shiwei Li, Yingyi Cheng, Haozhao Wang, Xing Tang, Shijie Xu, Weihong Luo, et al. (2024).
    Masked Random Noise for Communication-Efficient Federated Learning. ACM Multimedia 2024.
    arXiv:2408.03220.

Round t: the server samples a cohort (K of N, uniform without replacement, or any
:class:`fedjaxsparse.ops.sampling.Sampler`) and broadcasts ``w^t`` (dense). Client k draws its
noise ``n_k = G(s_k^t)`` (its seed fresh per client and round), starts from ``u = 0`` and
runs epoch-based SGD — E epochs of minibatches of B without replacement, ``S_k = E·⌈n_k/B⌉``
steps (each client its own count, :func:`fedjaxsparse.ops.local.epoch_loop`) — where step τ
evaluates the gradient at the progressively masked update

    û = (1 − P)⊙clip(u, n_k) + P⊙n_k⊙M(u, n_k),   P ~ Bernoulli((τ + 1)/S_k)      (PSM, eq. 10)

and applies it to u (straight-through, eq. 9): ``u ← u − η ∇_û F_k(w^t + û)``. It uploads the
mask ``m_k = M(u, n_k)`` (a fresh SM draw, no PM) and its seed; the server regenerates ``n_k``
from the seed and sets ``w^{t+1} = w^t + Σ_k p'_k n_k⊙m_k`` with data-size weights
``p'_k = n_k/Σ_{j∈C_t} n_j`` renormalised over the participants (eq. 5).

``signed=True`` is FedMRNS ({−1, +1} masks; the paper's noise ±5e-3 instead of ±1e-2). The
ablations of the paper's Sections 5.3-5.4 are options, not copies: ``stochastic=False`` (w/o SM:
DM instead of M), ``progressive=False`` (w/o PM: P ≡ 1), both (w/o PSM), ``masking="post"``
(FedAvg w. SM: plain local SGD, then one SM of the final update). The paper's dense baselines
— FedAvg, FedSparsify and the post-training compressors (SignSGD, TernGrad, DRIVE, EDEN,
Top-k) — are :func:`fedjaxsparse.algorithms.fedavg.fedavg` with ``epochs=`` (the same local
protocol), ``uplink=`` and ``local_prox=``/``upload_prox=``: a mask upload is already one bit
per entry, so no uplink compressor composes with FedMRN itself.

``server_sparsity`` (a schedule ``round -> s_t``, e.g.
:func:`fedjaxsparse.ops.sparsity.gmp_sparsity`) is FedSparsify's server-side reading (Stripelis
et al., 2022, "Federated Progressive Sparsification (Purge, Merge, Tune)+", arXiv:2204.12430):
gradual magnitude pruning at the server, ``w^{t+1} ← MagPrune(w^t + Δ, s_t)`` after every
aggregation; the clients train dense from the pruned model (pruned weights may regrow and are
pruned again — the literal server-side reading; Stripelis et al. also freeze the mask on the
clients, which this option does not) and the downlink is charged by the pruned model's non-zeros.

The round is :func:`fedjaxsparse.algorithms.cohort_round.cohort_round` with FedMRN's
:func:`client_update`: any sampler, a server optimizer (FedAdam on ``−Δ``) and an optax client
optimizer (the straight-through gradient turned into the step on ``u``) compose with every
ablation (but no ``uplink``: see above). A client's key is the seed it uploads (``n_k = G(k)``); its local training draws from
``fold_in(k, 1)``. Messages are a mask and a seed that the server decodes into the update
``n⊙m`` (:func:`noise_mask_mean`), added to ``w^t``.

Source for the team: seed 003 Algorithm 1; spec ``seed000_003.md`` B.0–B.2, B.8.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjaxsparse.algorithms.cohort_round import ClientUpdate, cohort_round
from fedjaxsparse.core import Algorithm, LossFn, as_float
from fedjaxsparse.errors import check_int, check_number
from fedjaxsparse.ops import accounting
from fedjaxsparse.ops import noise_masks as M
from fedjaxsparse.ops.aggregation import weighted_mean
from fedjaxsparse.ops.local import at_round, epoch_descent, epoch_steps
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["FedMRNInfo", "MASKINGS", "client_update", "fedmrn", "noise_mask_mean"]
__dir__ = _public_dir(__all__)

MASKINGS = ("learned", "post")
"""FedMRN's masking: masks trained with PSM, or one stochastic mask of plain SGD's final update
(the paper's "FedAvg w. SM")."""


class FedMRNInfo(NamedTuple):
  """Per round: ``loss`` (participants' data-weighted loss at w^t), ``bits_up`` (d + seed
  bits per upload), ``bits_down`` (32·d per
  participant; the pruned model's non-zeros under ``server_sparsity``), ``num_clients``,
  ``ones`` (fraction of mask entries equal to 1, averaged over the participants)."""
  loss: jax.Array
  bits_up: jax.Array
  bits_down: jax.Array
  num_clients: jax.Array
  ones: jax.Array


def noise_mask_mean(noise_scale: float, distribution: str = "uniform") -> Callable:
  """The aggregation of masked-noise uploads ``{"mask": m_i, "seed": s_i}``: the server
  regenerates each member's noise ``n_i = G(s_i)`` (:func:`fedjaxsparse.ops.noise_masks.
  tree_noise`, bit for bit what the client drew) and returns ``Δ = Σ_i p_i n_i⊙m_i``."""
  def aggregate(messages: Any, weights: jax.Array, params: Any) -> Any:
    noises = jax.vmap(lambda k: M.tree_noise(k, params, noise_scale, distribution))(
        messages["seed"])
    updates = jax.tree.map(lambda n, m: n * m.astype(n.dtype), noises, messages["mask"])
    return weighted_mean(updates, weights)
  return aggregate


def _check(lr, noise_scale, epochs, batch_size, masking, distribution):
  check_number("lr", lr, 0.0, None, low_open=True)
  check_number("noise_scale", noise_scale, 0.0, None, low_open=True)
  for name, v in (("epochs", epochs), ("batch_size", batch_size)):
    check_int(name, v, 1)
  if masking not in MASKINGS:
    raise ValueError(f"masking must be one of {MASKINGS}, got {masking!r}.")
  if distribution not in M.DISTRIBUTIONS:
    raise ValueError(f"distribution must be one of {M.DISTRIBUTIONS}, got {distribution!r}.")


def fedmrn(loss_fn: LossFn, lr: float, *, epochs: int = 1, batch_size: int = 64,
           cohort_size: int | None = None, sampler: Any = None,
           weighting: str = "num_examples", noise_scale: float = 1e-2,
           distribution: str = "uniform", signed: bool = False, stochastic: bool = True,
           progressive: bool = True, masking: str = "learned",
           server_sparsity: Callable[[jax.Array], Any] | None = None,
           server_optimizer: optax.GradientTransformation | None = None,
           client_optimizer: optax.GradientTransformation | None = None) -> Algorithm:
  """FedMRN / FedMRNS (Li et al., 2024): each client learns a 1-bit mask over seeded random
  noise during local training and uploads only the mask and the seed (d bits plus one seed per
  round); ``signed=True`` is FedMRNS ({−1, +1} masks).

  Round t: the server broadcasts ``w^t`` (dense) to a cohort ``C_t``. Client k draws its
  noise ``n_k = G(s_k)`` (uniform on [−α, α] by default; its seed ``s_k`` fresh per client
  and round), starts from the update ``u = 0`` and runs ``S_k = E·⌈|D_k|/B⌉`` SGD steps (E
  epochs of minibatches of B of its ``|D_k|`` examples, without replacement). Step τ
  evaluates the gradient at the progressively, stochastically masked update (PSM)

      û = (1 − P)⊙ū + P⊙n_k⊙M(u, n_k),   P ~ Bernoulli((τ + 1)/S_k),

  where ``ū`` is ``u`` clipped elementwise into ``[min(0, n), max(0, n)]`` (signed:
  ``[−|n|, |n|]``) and ``M`` the stochastic mask (binary: ``m = 1`` with probability
  ``clip(u/n, 0, 1)``; either way ``E[n⊙M(u, n)] = ū``), and applies it to u straight
  through: ``u ← u − η ∇_û F_k(w^t + û)``. The client uploads the mask ``m_k = M(u, n_k)``
  (``int8``, a fresh stochastic draw) and its seed; the server regenerates ``n_k`` bit for
  bit and sets ``w^{t+1} = w^t + Σ_{k∈C_t} p_k n_k⊙m_k`` (``p_k = |D_k|/Σ_{C_t} |D_j|`` by
  default).

  The paper's ablations are options: ``stochastic=False`` (w/o SM: a deterministic mask
  ``1[sign u = sign n]``), ``progressive=False`` (w/o PM: ``P ≡ 1``), both (w/o PSM), and
  ``masking="post"`` (FedAvg w. SM: plain local SGD, then one stochastic mask of the final
  update). ``server_sparsity`` adds FedSparsify's server-side gradual magnitude pruning
  (Stripelis et al., 2022), the paper's model-compression baseline. The round is
  :func:`fedjaxsparse.algorithms.cohort_round.cohort_round` with :func:`client_update`,
  aggregated by :func:`noise_mask_mean`. It takes no ``uplink``: its upload is already a 1-bit
  mask and a seed (the paper's dense baselines — FedAvg, SignSGD, TernGrad, DRIVE, EDEN,
  Top-k — are :func:`fedjaxsparse.algorithms.fedavg.fedavg` with ``epochs=`` and
  ``uplink=``). See the module docstring (:mod:`fedjaxsparse.algorithms.fedmrn`) for the full
  story.

  Args:
    loss_fn: ``(params, x, y, mask) -> F_k`` of one client (mean over the masked examples;
      :func:`fedjaxsparse.models.make_loss`).
    lr: local SGD step η on the update u (> 0).
    epochs: local epochs E per round (int ≥ 1; the paper: 10).
    batch_size: minibatch size B of the epoch protocol (int ≥ 1; the paper: 64).
    cohort_size: K clients per round, drawn uniformly without replacement inside ``jit``
      (``None``: all clients).
    sampler: a :class:`fedjaxsparse.ops.sampling.Sampler` drawing each round's cohort
      instead of ``cohort_size``'s uniform one.
    weighting: the aggregation weights ``p_k``: ``"num_examples"``
      (``|D_k|/Σ_{C_t} |D_j|``, the paper's), ``"uniform"`` (``1/K``) or ``"sampling"``
      (``1/(N π_k)``, π_k the ``sampler``'s inclusion probability of client k).
    noise_scale: α of the noise (> 0; the paper: 1e-2 for FedMRN, 5e-3 for FedMRNS).
    distribution: the noise ``G``: ``"uniform"`` (on [−α, α]), ``"gaussian"`` (std α) or
      ``"bernoulli"`` (±α).
    signed: {−1, +1} masks (FedMRNS, ``m = +1`` with probability
      ``clip((u + n)/(2n), 0, 1)``) instead of {0, 1} masks (FedMRN).
    stochastic: the stochastic mask M (``True``, the paper) or, ``False``, the deterministic
      mask ``1[sign u = sign n]`` (signed: ``sign(u)·sign(n)``), the "w/o SM" ablation.
    progressive: progressive masking, ``P ~ Bernoulli((τ + 1)/S_k)`` (``True``, the paper),
      or every step fully masked, ``P ≡ 1`` (``False``, the "w/o PM" ablation).
    masking: ``"learned"`` (masks trained with PSM during local training, FedMRN) or
      ``"post"`` (plain local SGD, then one mask of the final update: "FedAvg w. SM").
    server_sparsity: ``round -> sparsity in [0, 1)``, traceable (e.g.
      :func:`fedjaxsparse.ops.sparsity.gmp_sparsity`): after every aggregation the server
      prunes the new global model to it by global magnitude (FedSparsify's server-side
      gradual pruning; clients train dense from the pruned model, pruned weights may regrow)
      and each download is charged by the pruned model's non-zeros.
    server_optimizer: an optax transformation of the pseudo-gradient ``−Δ``,
      ``Δ = Σ_k p_k n_k⊙m_k`` (FedAdam, server momentum); ``None`` applies ``Δ`` as it is
      (the paper).
    client_optimizer: an optax transformation turning the straight-through gradient into
      the step on ``u`` (its state starts fresh each round), or a function of the round
      returning one; ``None`` is the paper's plain SGD ``u ← u − η g`` (``optax.sgd(lr)``
      computes it bit for bit).

  Returns:
    An :class:`~fedjaxsparse.core.Algorithm`: ``init(key, params, data)`` returns a
    :class:`~fedjaxsparse.algorithms.cohort_round.CohortState` with ``state.params`` (the
    global model ``w^t``), ``state.clients`` (``()``: stateless clients),
    ``state.server_opt_state`` and ``state.round`` (``int32``, rounds completed).
    ``step(key, state, data)`` returns ``(state, info)`` with a :class:`FedMRNInfo`: ``loss``
    (the members' loss at ``w^t`` on all their data, weighted as the aggregation),
    ``bits_up`` (d mask bits plus a 32-bit seed per member, summed over the cohort),
    ``bits_down`` (32·d per member, summed; under ``server_sparsity`` the pruned model's
    non-zeros under the cheapest sparse encoding), ``num_clients`` (``int32``, the cohort
    size) and ``ones`` (the fraction of mask entries equal to 1, averaged over the members).

  References:
    Shiwei Li, Yingyi Cheng, Haozhao Wang, Xing Tang, Shijie Xu, Weihong Luo, et al. (2024).
      Masked Random Noise for Communication-Efficient Federated Learning. ACM Multimedia
      2024. arXiv:2408.03220.
    Stripelis et al. (2022). Federated Progressive Sparsification (Purge, Merge, Tune)+.
      arXiv:2204.12430.

  Source for the team: seed 003 Algorithm 1; spec ``seed000_003.md`` B.0–B.2, B.8.
  """
  client = client_update(loss_fn, lr, epochs=epochs, batch_size=batch_size,
                         noise_scale=noise_scale, distribution=distribution, signed=signed,
                         stochastic=stochastic, progressive=progressive, masking=masking,
                         client_optimizer=client_optimizer)
  return cohort_round(client, cohort_size=cohort_size, sampler=sampler, weighting=weighting,
                      aggregate=noise_mask_mean(noise_scale, distribution),
                      server_optimizer=server_optimizer, server_sparsity=server_sparsity)


def client_update(loss_fn: LossFn, lr: float, *, epochs: int = 1, batch_size: int = 64,
                  noise_scale: float = 1e-2, distribution: str = "uniform",
                  signed: bool = False, stochastic: bool = True, progressive: bool = True,
                  masking: str = "learned",
                  client_optimizer: optax.GradientTransformation | None = None
                  ) -> ClientUpdate:
  """FedMRN's client (stateless). Its key ``k`` is the noise seed it uploads: ``n = G(k)``;
  its local training draws from ``fold_in(k, 1)`` (minibatch order, PSM routing, the final
  stochastic mask). Its message is ``{"mask": M(u, n) (int8), "seed": k}`` — aggregate it
  with :func:`noise_mask_mean`. Its record ``ones`` is the fraction of
  its mask's entries equal to 1. Arguments as :func:`fedmrn`."""
  _check(lr, noise_scale, epochs, batch_size, masking, distribution)
  grad = jax.grad(lambda v, w, x, y, m: loss_fn(jax.tree.map(jnp.add, w, v), x, y, m))

  def mask_of(key, u, noise):
    """The uploaded mask M(u, n) (or DM without SM), int8."""
    def one(k, ui, ni):
      m = (M.stochastic_mask(k, ui, ni, signed) if stochastic
           else M.deterministic_mask(ui, ni, signed))
      return m.astype(jnp.int8)
    return M.tree_map_keyed(one, key, u, noise)

  def update(key, w, state, d, rnd):
    noise = M.tree_noise(key, w, noise_scale, distribution)
    k_order, k_psm, k_final = jax.random.split(jax.random.fold_in(key, 1), 3)
    s_k = epoch_steps(d.num_examples, batch_size, epochs)
    max_steps = epochs * -(-d.mask.shape[0] // batch_size)   # the padded data's bound

    def gradient(t, u, batch):
      if masking == "learned":
        p = M.pm_probability(t, s_k) if progressive else 1.0
        at = M.tree_map_keyed(
            lambda k, ui, ni: M.progressive(k, ui, ni, p, signed, stochastic),
            jax.random.fold_in(k_psm, t), u, noise)
      else:
        at = u
      return grad(at, w, *batch)

    u = epoch_descent(gradient, jax.tree.map(jnp.zeros_like, w), k_order, d, lr=lr,
                      optimizer=at_round(client_optimizer, rnd), epochs=epochs, batch_size=batch_size,
                      max_steps=max_steps)
    metrics = {"loss": loss_fn(w, d.x, d.y, d.mask)}
    mask = mask_of(k_final, u, noise)
    metrics["ones"] = (sum(jnp.sum(m == 1) for m in jax.tree.leaves(mask))
                       / as_float(accounting.num_params(w)))
    return {"mask": mask, "seed": key}, state, metrics

  def upload_bits(message, params):
    return as_float(accounting.mask_bits(accounting.num_params(params), with_seed=True))

  return ClientUpdate(lambda key, params, n: (), update, upload_bits=upload_bits,
                      info_type=FedMRNInfo)
