"""FedProx's proximal term as an optax transformation: the local objective ``F_i(θ) + (μ/2)‖θ −
θ_t‖²`` adds ``μ(θ − θ_t)`` to every local gradient.

References:
  Tian Li, Anit Kumar Sahu, Manzil Zaheer, Maziar Sanjabi, Ameet Talwalkar, Virginia Smith
    (2020). Federated Optimization in Heterogeneous Networks. MLSys 2020. arXiv:1812.06127.

FedAvg (:func:`fedjaxsparse.algorithms.fedavg.fedavg`) re-initialises the client optimiser
with the broadcast model θ_t at the start of every round, so the anchor is exactly θ_t:
:func:`fedprox` is ``fedavg(loss, optax.chain(proximal(mu), client_optimizer), ...)`` and takes
every option of FedAvg's cohort round (``sampler=``, ``uplink=``, ``server_optimizer=``,
``weighting=``). ``mu = 0`` is FedAvg bit for bit (the term adds ``0·(θ − θ_t)``).

Source for the team: Li et al., MLSys 2020; the baseline of seed 004 Task 3, spec §3.3.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import optax

from fedjaxsparse.algorithms.fedavg import fedavg
from fedjaxsparse.core import Algorithm, LossFn
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["ProximalState", "proximal", "fedprox"]
__dir__ = _public_dir(__all__)


class ProximalState(NamedTuple):
  anchor: Any   # θ_t, the params the optimiser was initialised with


def proximal(mu: float) -> optax.GradientTransformation:
  """``g ← g + μ(θ − θ_t)``, θ_t = the params given to ``init``."""
  if not mu >= 0:
    raise ValueError(f"mu must be >= 0, got {mu!r}.")

  def init(params):
    return ProximalState(params)

  def update(updates, state, params=None):
    if params is None:
      raise ValueError("proximal(mu) needs params in update(updates, state, params).")
    return jax.tree.map(lambda g, p, a: g + mu * (p - a), updates, params,
                        state.anchor), state

  return optax.GradientTransformation(init, update)


def fedprox(loss_fn: LossFn, client_optimizer: optax.GradientTransformation, mu: float,
            **fedavg_options: Any) -> Algorithm:
  """FedProx (Li et al., 2020): every client minimises ``F_i(θ) + (μ/2)‖θ − θ_t‖²`` from the
  broadcast θ_t with ``client_optimizer`` (local SGD in the paper); the rest is FedAvg's
  (McMahan et al., 2017) cohort round. ``mu = 0`` is FedAvg bit for bit.

  The proximal term is the optax transformation :func:`proximal`, which adds ``μ(θ − θ_t)``
  to every local gradient before ``client_optimizer`` sees it; the client optimizer is
  re-initialised with θ_t every round, so the anchor is exactly the broadcast model. With
  ``client_optimizer = optax.sgd(η)`` a local step reads::

      θ ← θ − η·(∇F_i(θ; batch) + μ·(θ − θ_t)),     θ ← θ_t at the start of the round

  and the server step is FedAvg's: ``θ_{t+1} = θ_t + Σ_{i∈S} p_i (θ_i − θ_t)`` (or a server
  optimizer on the pseudo-gradient). The function is
  ``fedavg(loss_fn, optax.chain(proximal(mu), client_optimizer), **fedavg_options)``; see the
  module docstring (:mod:`fedjaxsparse.algorithms.fedprox`).

  Args:
    loss_fn: ``(params, x, y, mask) -> scalar``, one client's local loss ``F_i``
      (:func:`fedjaxsparse.models.make_loss`).
    client_optimizer: the optax transformation of the local steps (e.g. ``optax.sgd(0.1)``),
      applied to the proximal gradient; its state is re-initialised every round.
    mu: μ ≥ 0, the weight of the proximal term (``ValueError`` if negative).
    **fedavg_options: forwarded to :func:`fedjaxsparse.algorithms.fedavg.fedavg`:
      ``local_steps`` (local steps per round), ``batch_size`` (examples per step, ``None``:
      full batch), ``epochs`` (epoch protocol instead of ``local_steps``), ``cohort_size``
      (clients per round; ``None``: all) or ``sampler`` (a cohort sampler), ``weighting``
      (``"num_examples"`` by default, ``"uniform"``, ``"sampling"``), ``server_optimizer``
      (optax transformation of the pseudo-gradient), ``uplink`` (a compressor of the
      uploads), ``encoding`` (bit accounting), ``augment``, ``local_prox``, ``upload_prox``,
      ``server_prox``, ``server_sparsity``.

  Returns:
    FedAvg's :class:`fedjaxsparse.core.Algorithm`: its state is a
    :class:`fedjaxsparse.algorithms.cohort_round.CohortState` — ``state.params`` (the global
    model θ_t), ``state.clients`` (``()``, stateless clients), ``state.server_opt_state``,
    ``state.round`` (``int32[]``), ``state.server`` (``()``) — and ``step`` reports a
    :class:`fedjaxsparse.algorithms.fedavg.FedAvgInfo`: ``info.loss`` (the cohort's weighted
    loss ``F_i`` at the broadcast model, without the proximal term), ``info.bits_up``,
    ``info.bits_down`` (bits summed over the cohort; FedProx sends FedAvg's messages, dense
    deltas by default) and ``info.num_clients`` (``int32[]`` cohort size).

  References:
    Tian Li, Anit Kumar Sahu, Manzil Zaheer, Maziar Sanjabi, Ameet Talwalkar, Virginia Smith
      (2020). Federated Optimization in Heterogeneous Networks. MLSys 2020. arXiv:1812.06127.
    McMahan, H. Brendan; Eider Moore, Daniel Ramage, Seth Hampson, Blaise Agüera y Arcas
      (2017). Communication-Efficient Learning of Deep Networks from Decentralized Data.
      AISTATS 2017. arXiv:1602.05629.
  """
  return fedavg(loss_fn, optax.chain(proximal(mu), client_optimizer), **fedavg_options)
