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
  """FedProx: every client minimises ``F_i(θ) + (μ/2)‖θ − θ_t‖²`` from the broadcast θ_t with
  ``client_optimizer`` (local SGD in the paper); the rest is FedAvg's cohort round, whose
  keywords (``local_steps``, ``batch_size``, ``cohort_size`` or ``sampler``, ``uplink``,
  ``server_optimizer``, ``weighting``, ...) pass through. ``mu = 0`` is FedAvg bit for bit."""
  return fedavg(loss_fn, optax.chain(proximal(mu), client_optimizer), **fedavg_options)
