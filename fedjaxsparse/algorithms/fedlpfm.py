"""Fed-LPFM: FedAvg over a lightweight student whose local loss distils from each client's private,
frozen foundation models,

References:
  Xidong Wu, Wan-Yi Lin, Devin Willmott, Filipe Condessa, Yufei Huang, Zhenzhen Li, et al.
    (2023). Leveraging Foundation Models to Improve Lightweight Clients in Federated Learning.
    NeurIPS 2023 FL workshop. arXiv:2311.08479.

    L(D_i; θ) = λ·E ℓ_CE(h(x; θ), y) + (1 − λ)·Σ_{m=1}^{M_i} E ℓ_KL[h(x; θ) ‖ M_i^m(x)]

— a *sum* over teachers; aggregation by data size; teachers are never communicated
(the messages are FedAvg's: dense models). Teacher logits are computed **once** per example
(:func:`fedjaxsparse.models.clip_teacher.cached_logits` for CLIP, or any ``logits_fn``) and
carried with the data: :func:`pack_targets` stores label and teacher logits in the float
targets ``y [N, M, 1 + T·K]`` of a :class:`~fedjaxsparse.data.federated.FederatedData`, so
FedAvg's minibatch sampling draws an example's teachers with it and no teacher runs inside the round.

The paper leaves the KL direction and temperature open: ``direction="forward"``
(default, Hinton KD) is ``KL(softmax(M/T) ‖ softmax(h/T))``, ``"reverse"`` is
``KL(softmax(h/T) ‖ softmax(M/T))`` (the printed ``ℓ_KL[h ‖ M]`` read literally); both are
multiplied by ``T²`` (Hinton et al.'s gradient-scale correction; 1 at the default ``T = 1``).
Every client carries the same number ``T`` of teacher slots; ``teacher_mask [N, T]`` switches
slots off per client (``M_i < T``, as in mixed-teacher ablations).

Baselines: FedAvg is ``lam=1`` (bit for bit: the KL term is not even traced), FedProx is
:func:`fedjaxsparse.algorithms.fedprox.proximal`, FML is :mod:`fedjaxsparse.algorithms.fml`.

Source for the team: seed 004 Task 3, Algorithm 10, l. 1500-1556, eqs. (5-2)-(5-5); spec
``seed004.md`` §3.1-§3.2.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjaxsparse.algorithms.fedavg import fedavg
from fedjaxsparse.core import Algorithm, Model, float_dtype
from fedjaxsparse.data.federated import FederatedData
from fedjaxsparse.models.base import make_loss
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["kd_loss", "pack_targets", "unpack_targets", "fedlpfm_loss", "fedlpfm"]
__dir__ = _public_dir(__all__)

DIRECTIONS = ("forward", "reverse")


def kd_loss(student: jax.Array, teachers: jax.Array, temperature: float = 1.0,
            direction: str = "forward", teacher_mask: jax.Array | None = None) -> jax.Array:
  """``Σ_m T²·KL`` between the student ``[B, K]`` and teachers ``[B, T, K]`` logits, per
  example ``[B]`` (``teacher_mask [T]`` or ``[B, T]`` switches teachers off)."""
  if direction not in DIRECTIONS:
    raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}.")
  if not temperature > 0:
    raise ValueError(f"temperature must be > 0, got {temperature!r}.")
  log_s = jax.nn.log_softmax(student / temperature, axis=-1)[:, None, :]
  log_t = jax.nn.log_softmax(teachers / temperature, axis=-1)
  if direction == "forward":
    kl = jnp.sum(jnp.exp(log_t) * (log_t - log_s), axis=-1)
  else:
    kl = jnp.sum(jnp.exp(log_s) * (log_s - log_t), axis=-1)
  if teacher_mask is not None:
    kl = kl * teacher_mask
  return temperature ** 2 * jnp.sum(kl, axis=-1)


def pack_targets(data: FederatedData, teacher_logits: np.ndarray,
                 teacher_mask: np.ndarray | None = None) -> FederatedData:
  """``data`` with ``y [N, M, 1 + T·(K + 1)]``: the label, then each teacher's logits
  ``[N, M, T, K]`` and its on/off flag (``teacher_mask [N, T]``, default all on)."""
  dtype = float_dtype()            # float64 under jax_enable_x64
  logits = np.asarray(teacher_logits, dtype)
  n, m = np.shape(data.y)[:2]
  if logits.ndim != 4 or logits.shape[:2] != (n, m):
    raise ValueError(f"teacher_logits must be [N={n}, M={m}, T, K], got {logits.shape}.")
  t = logits.shape[2]
  flags = np.ones((n, t), dtype) if teacher_mask is None else np.asarray(
      teacher_mask, dtype)
  if flags.shape != (n, t):
    raise ValueError(f"teacher_mask must be [N={n}, T={t}], got {flags.shape}.")
  flags = np.broadcast_to(flags[:, None, :, None], (n, m, t, 1))
  teach = np.concatenate([logits, flags], axis=-1).reshape(n, m, -1)
  y = np.concatenate([np.asarray(data.y, dtype)[..., None], teach], axis=-1)
  return data._replace(y=jax.device_put(y))


def unpack_targets(y: jax.Array, num_classes: int):
  """``y [B, 1 + T·(K + 1)] -> (labels int32[B], logits [B, T, K], mask [B, T])``."""
  rest = y[:, 1:].reshape(y.shape[0], -1, num_classes + 1)
  return y[:, 0].astype(jnp.int32), rest[..., :num_classes], rest[..., num_classes]


def fedlpfm_loss(model: Model, num_classes: int, lam: float = 0.5, temperature: float = 1.0,
                 direction: str = "forward"):
  """The local objective (module docstring) as ``loss(params, x, y_packed, mask)`` (mean over
  the real examples); ``lam = 1`` is exactly FedAvg's cross-entropy (:func:`make_loss`)."""
  if not 0 <= lam <= 1:
    raise ValueError(f"lam must be in [0, 1], got {lam!r}.")
  jax.eval_shape(lambda s, t: kd_loss(s, t, temperature, direction),   # validate (traced only)
                 jax.ShapeDtypeStruct((1, 2), float_dtype()),
                 jax.ShapeDtypeStruct((1, 1, 2), float_dtype()))
  ce = make_loss(model)

  def loss(params, x, y, mask):
    labels, teachers, on = unpack_targets(y, num_classes)
    if lam == 1.0:
      return ce(params, x, labels, mask)
    logits = model.apply(params, x)
    per = (lam * model.per_example_loss(logits, labels)
           + (1.0 - lam) * kd_loss(logits, teachers, temperature, direction, on))
    return jnp.sum(per * mask) / jnp.maximum(jnp.sum(mask), 1.0)

  return loss


def fedlpfm(model: Model, num_classes: int, client_optimizer: optax.GradientTransformation, *,
            lam: float = 0.5, temperature: float = 1.0, direction: str = "forward",
            **fedavg_kwargs: Any) -> Algorithm:
  """Fed-LPFM (Wu et al., 2023): FedAvg (McMahan et al., 2017) over a lightweight student
  whose local loss distils from each client's private, frozen foundation models (zero-shot
  CLIP in the paper), which are never communicated.

  Client ``i`` holds ``M_i`` teachers ``M_i^m``; its local objective is ::

      L(D_i; θ) = λ·E ℓ_CE(h(x; θ), y) + (1 − λ)·Σ_{m=1}^{M_i} E ℓ_KL[h(x; θ) ‖ M_i^m(x)]

  — a *sum* over teachers, each expectation a mean over a batch's real examples, each KL at
  temperature ``T`` and multiplied by ``T²`` (Hinton et al.'s gradient-scale correction; 1 at
  the default ``T = 1``). The round is FedAvg's: every cohort client runs local steps of
  ``client_optimizer`` on ``L`` from the broadcast θ_t and uploads its dense delta; the server
  sets ``θ_{t+1} = θ_t + Σ_{i∈S} p_i (θ_i − θ_t)`` with data-size weights
  ``p_i = |D_i| / Σ_{j∈S} |D_j|`` (FedAvg's default; ``θ_{t+1} = Σ_i p_i θ_i``); clients keep
  no state.

  Teacher logits are computed once per example
  (:func:`fedjaxsparse.models.clip_teacher.cached_logits` for CLIP, or any logits function) and
  carried with the data: the ``data`` given to ``init`` and ``step`` must come from
  :func:`pack_targets`, whose float targets ``y [N, M, 1 + T·(K + 1)]`` hold each example's
  label, its ``T`` teachers' logits ``[T, K]`` (``K = num_classes``) and their on/off flags
  (``teacher_mask [N, T]`` switches slots off per client, ``M_i < T``), so no teacher runs
  inside the round. ``lam = 1`` is FedAvg bit for bit (the KL term is not even traced). The
  module docstring (:mod:`fedjaxsparse.algorithms.fedlpfm`) tells the full story.

  Args:
    model: the student, a :class:`fedjaxsparse.core.Model` (``model.apply(params, x)`` gives
      logits ``[B, K]``).
    num_classes: ``K``, the number of classes (the width of each teacher's logits).
    client_optimizer: the optax transformation of the local steps (the paper: SGD, lr 0.01,
      weight decay 5e-4), re-initialised every round; a function of the round returning one
      is a round schedule.
    lam: λ ∈ [0, 1], the weight of the cross-entropy; ``1 − λ`` weighs the distillation sum.
    temperature: ``T > 0``, the softmax temperature of the KL terms (the paper leaves it
      open; default 1).
    direction: ``"forward"`` (default, Hinton KD: ``KL(softmax(M/T) ‖ softmax(h/T))``) or
      ``"reverse"`` (``KL(softmax(h/T) ‖ softmax(M/T))``, the printed ``ℓ_KL[h ‖ M]`` read
      literally); the paper leaves the direction open.
    **fedavg_kwargs: forwarded to :func:`fedjaxsparse.algorithms.fedavg.fedavg`:
      ``local_steps`` (local steps per round), ``batch_size`` (examples per step; ``None``:
      full batch), ``epochs`` (epoch protocol instead of ``local_steps``), ``cohort_size``
      (clients per round; ``None``: all) or ``sampler``, ``weighting`` (``"num_examples"`` by
      default, as in the paper), ``server_optimizer``, ``uplink``, ``encoding``, ``augment``,
      ``local_prox``, ``upload_prox``, ``server_prox``, ``server_sparsity``.

  Returns:
    FedAvg's :class:`fedjaxsparse.core.Algorithm`: its state is a
    :class:`fedjaxsparse.algorithms.cohort_round.CohortState` — ``state.params`` (the
    student θ_t), ``state.clients`` (``()``, stateless clients; the teachers live in the
    data), ``state.server_opt_state``, ``state.round`` (``int32[]``), ``state.server``
    (``()``) — and ``step`` reports a :class:`fedjaxsparse.algorithms.fedavg.FedAvgInfo`:
    ``info.loss`` (the cohort's weighted local objective ``L`` at the broadcast model, on each
    client's first local batch or, with ``epochs``, all its data), ``info.bits_up`` and
    ``info.bits_down`` (the student's messages, summed over the cohort: dense ``32·d`` each
    by default; teachers cost no bits) and ``info.num_clients`` (``int32[]`` cohort size).

  References:
    Xidong Wu, Wan-Yi Lin, Devin Willmott, Filipe Condessa, Yufei Huang, Zhenzhen Li, et al.
      (2023). Leveraging Foundation Models to Improve Lightweight Clients in Federated
      Learning. NeurIPS 2023 FL workshop. arXiv:2311.08479.
    McMahan, H. Brendan; Eider Moore, Daniel Ramage, Seth Hampson, Blaise Agüera y Arcas
      (2017). Communication-Efficient Learning of Deep Networks from Decentralized Data.
      AISTATS 2017. arXiv:1602.05629.
  """
  return fedavg(fedlpfm_loss(model, num_classes, lam, temperature, direction),
                client_optimizer, **fedavg_kwargs)
