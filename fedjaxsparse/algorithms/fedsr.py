"""FedSR(-FT): FedAvg on a Gaussian-representation network with the L2R and CMI regularisers
of the representation, then fine-tuned (FedCR's final round,
:func:`fedjaxsparse.algorithms.representation.fine_tune`) — the personalised baseline
FedSR-FT of the Scafflix paper's additional-baselines table, as FedCR's code runs it.

References:
  Nguyen, A. Tuan; Torr, Philip H. S.; Lim, Ser-Nam (2022). FedSR: A Simple and Effective
    Domain Generalization Method for Federated Learning. NeurIPS 2022.

Source for the team: seed 001 l. 2919-25; ``seed001_ch3_ch5.md`` §B.1.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from fedjaxsparse.algorithms.cohort_round import ClientUpdate, CohortState, cohort_round
from fedjaxsparse.algorithms.representation import (RoundInfo, check_options,
                                                    local_optimizer, sampled_cross_entropy)
from fedjaxsparse.core import Algorithm, as_float, float_dtype
from fedjaxsparse.errors import check_number
from fedjaxsparse.models.split import SplitModel, kl_normal
from fedjaxsparse.ops import accounting
from fedjaxsparse.ops.local import Schedule, at_round, epoch_optimize
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["FedSRState", "fedsr", "L2R_FORMS"]
__dir__ = _public_dir(__all__)


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
    FedSR-FT's personal models are :func:`~fedjaxsparse.algorithms.representation.fine_tune`'s."""
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
  :func:`~fedjaxsparse.algorithms.representation.fine_tune` with ``trainable="projection+head"``, FedCR's final round).

  Every client of the cohort starts from the global ``{"body", "head"}`` and runs ``epochs``
  epochs of :func:`~fedjaxsparse.algorithms.representation.local_optimizer` steps on

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
    momentum: heavy-ball momentum of :func:`~fedjaxsparse.algorithms.representation.local_optimizer`.
    weight_decay: weight decay of :func:`~fedjaxsparse.algorithms.representation.local_optimizer`.
    clip: the global norm the local gradient is clipped at (:func:`~fedjaxsparse.algorithms.representation.local_optimizer`;
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
      instead of :func:`~fedjaxsparse.algorithms.representation.local_optimizer` (``lr``, ``momentum``, ``weight_decay`` and ``clip``
      are then unused).

  Returns:
    An :class:`~fedjaxsparse.core.Algorithm` whose state is a :class:`FedSRState`:
    ``state.params`` (the global ``{"body", "head"}``), ``state.clients`` =
    ``state.reference`` (every client's ``(r_mean [N, C, d], r_scale [N, C, d], c [N])``),
    ``state.personal`` (the global model broadcast to ``[N, ...]``; FedSR-FT's personal models
    are :func:`~fedjaxsparse.algorithms.representation.fine_tune`'s), ``state.server_opt_state`` and ``state.round``.
    ``step(key, state, data)`` returns ``(state, info)``, ``info`` a :class:`~fedjaxsparse.algorithms.representation.RoundInfo`:
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
  check_options(lr, epochs, batch_size, samples, momentum, weight_decay, clip)
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
    z, per = sampled_cross_entropy(model, p["head"], mu, None if deterministic else sigma,
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
