"""Ditto (Li et al., 2021) and Local, the personalised dense baselines of the FedSpa paper
(Huang et al., 2022).

References:
  Tian Li, Shengyuan Hu, Ahmad Beirami, Virginia Smith (2021). Ditto: Fair and Robust
    Federated Learning Through Personalization. ICML 2021. arXiv:2012.04221.
  Tiansheng Huang, Shiwei Liu, Li Shen, Fengxiang He, Weiwei Lin, Dacheng Tao (2022).
    Achieving Personalized Federated Learning with Sparse Local Models. arXiv preprint.
    arXiv:2201.11380.

Ditto, round t, every client k of a uniform cohort S_t:

(a) global part: ``global_epochs`` of SGD from the received ``w_t`` → ``w_k``, uploaded dense;
    the server sets ``w_{t+1} = w_t − Σ_k p_k (w_t − w_k)`` (FedAvg, uniform or data-size
    weights);
(b) personal part: ``personal_epochs`` of SGD on the client's own model,
    ``v_k ← v_k − η_t(∇L(v_k; ξ) + λ(v_k − w_c) + λ_wd v_k)``, with the proximal centre
    ``w_c = w_t`` (``prox_centre="received"``, original Ditto, default) or the client's
    locally updated ``w_k`` (``"updated"``; the FedSpa paper's prose allows either).
    Non-sampled clients' ``v_k`` do not change; ``v_k`` starts at ``w_0``.

The FedSpa paper (Appendix B.3): λ = 0.5, 2 global + 3 personal epochs (5 in all, like the
other methods). ``Local`` is :func:`local`: no global part and λ = 0 — each sampled client
trains its own model for ``epochs`` epochs, nothing is sent. Evaluation uses the personal models
(:attr:`DittoState.personal`).

Source for the team: seed 002 B.3 l. 853-875; spec ``seed002.md`` §4.2-4.3.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedjaxsparse.algorithms.cohort_round import ClientUpdate, CohortState, cohort_round
from fedjaxsparse.core import Algorithm, LossFn, as_float
from fedjaxsparse.errors import check_number
from fedjaxsparse.ops import accounting
from fedjaxsparse.ops.local import Schedule, at_round, check_lr, epoch_sgd
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["DittoState", "DittoInfo", "client_update", "ditto", "local"]
__dir__ = _public_dir(__all__)

CENTRES = ("received", "updated")


class DittoState(CohortState):
  """:class:`~fedjaxsparse.algorithms.cohort_round.CohortState` whose client states are the
  personal models: ``params`` (the global ``w_t``), ``clients`` = :attr:`personal` (``v_k``,
  leaves ``[N, ...]``), ``server_opt_state``, ``round``."""
  __slots__ = ()

  @property
  def personal(self) -> Any:
    """``[N, ...]``: every client's personal model ``v_k`` (what it evaluates)."""
    return self.clients


class DittoInfo(NamedTuple):
  """Per round: ``loss`` (the cohort's loss of its personal models before training, weighted
  by the round's weights), ``bits_up``, ``bits_down`` (dense fp32 models, 0 for Local),
  ``num_clients``."""
  loss: jax.Array
  bits_up: jax.Array
  bits_down: jax.Array
  num_clients: jax.Array


def _check(lr, lam, weight_decay, global_epochs, personal_epochs, batch_size,
           prox_centre) -> None:
  check_lr(lr)
  check_number("lam", lam, 0.0, None)
  check_number("weight_decay", weight_decay, 0.0, None)
  for name, v, low in (("global_epochs", global_epochs, 0),
                       ("personal_epochs", personal_epochs, 1), ("batch_size", batch_size, 1)):
    if not isinstance(v, int) or v < low:
      raise ValueError(f"{name} must be an int >= {low}, got {v!r}.")
  if prox_centre not in CENTRES:
    raise ValueError(f"prox_centre must be one of {CENTRES}, got {prox_centre!r}.")


def client_update(loss_fn: LossFn, lr: float | Schedule, *, lam: float = 0.5,
                  global_epochs: int = 2, personal_epochs: int = 3, batch_size: int = 128,
                  prox_centre: str = "received", weight_decay: float = 0.0,
                  client_optimizer: Any = None) -> ClientUpdate:
  """Ditto's client: (a) ``global_epochs`` of SGD from the received ``w_t`` to ``w_k``, uploaded
  as the delta ``w_k − w_t``; (b) ``personal_epochs`` of SGD on its personal model ``v_k``
  (its state, starting at ``w_0``) with the proximal pull ``λ(v_k − w_c)``. Step size
  ``η_t = lr`` or ``lr(t)`` for a schedule of the round. With ``global_epochs=0`` it uploads
  nothing (0 bits; Local). ``client_optimizer``: an optax transformation (or a function of the
  round returning one) taking the place of the SGD step in both parts (its state starts fresh
  in each; ``lr`` is then unused), fed the same gradient with weight decay and the proximal
  pull."""
  _check(lr, lam, weight_decay, global_epochs, personal_epochs, batch_size, prox_centre)
  grad = jax.grad(loss_fn)
  bits = (lambda *a: as_float(accounting.dense_bits(a[-1]) if global_epochs else 0.0))

  def init(key, params, num_clients):
    del key
    return jax.tree.map(lambda a: jnp.broadcast_to(a, (num_clients,) + a.shape), params)

  def update(key, w, v, d, t):
    k_global, k_personal, _ = jax.random.split(key, 3)  # k_global as FedSpa's order key
    eta = at_round(lr, t)
    per_epoch = -(-d.mask.shape[0] // batch_size)        # the padded data's static bound
    loss = loss_fn(v, d.x, d.y, d.mask)
    sgd = dict(lr=eta, batch_size=batch_size, weight_decay=weight_decay,
               optimizer=at_round(client_optimizer, t))
    if global_epochs:
      w_k = epoch_sgd(grad, w, k_global, d, epochs=global_epochs,
                      max_steps=global_epochs * per_epoch, **sgd)
    else:
      w_k = w
    centre = w if prox_centre == "received" else w_k
    v_new = epoch_sgd(grad, v, k_personal, d, epochs=personal_epochs,
                      max_steps=personal_epochs * per_epoch, prox=(lam, centre), **sgd)
    return jax.tree.map(jnp.subtract, w_k, w), v_new, {"loss": loss}

  return ClientUpdate(init, update, upload_bits=bits, download_bits=bits,
                      info_type=DittoInfo, state_type=DittoState)


def ditto(loss_fn: LossFn, lr: float | Schedule, *, lam: float = 0.5, global_epochs: int = 2,
          personal_epochs: int = 3, batch_size: int = 128, cohort_size: int | None = 10,
          prox_centre: str = "received", weight_decay: float = 0.0,
          weighting: str = "uniform", sampler: Any = None, uplink: Any = None,
          server_optimizer: Any = None, client_optimizer: Any = None) -> Algorithm:
  """Ditto (Li et al., 2021): FedAvg on a global model plus a proximally regularised personal
  model on every client, as run in the FedSpa paper's baselines (Huang et al., 2022).

  The server keeps the global model ``w_t``; client ``k`` keeps its personal model ``v_k``
  (starting at ``w_0``). Round ``t``, each client ``k`` of a uniform cohort ``S_t``:

  (a) global part: ``global_epochs`` epochs of SGD from the received ``w_t`` to ``w_k``; it
      uploads the dense delta ``w_k − w_t`` and the server sets
      ``w_{t+1} = w_t − Σ_k p_k (w_t − w_k)`` (FedAvg, uniform or data-size weights ``p_k``);
  (b) personal part: ``personal_epochs`` epochs of SGD on ``v_k``,
      ``v_k ← v_k − η_t(∇L(v_k; ξ) + λ(v_k − w_c) + λ_wd v_k)``, pulled towards the proximal
      centre ``w_c = w_t`` (``prox_centre="received"``, original Ditto) or ``w_c = w_k``
      (``"updated"``).

  Clients outside the cohort keep ``v_k`` unchanged; evaluation uses the personal models
  (:attr:`DittoState.personal`). ``global_epochs=0`` skips the global part: nothing is
  communicated and ``w`` never changes (with ``lam=0`` this is :func:`local`). The FedSpa
  paper (Appendix B.3) uses λ = 0.5 with 2 global + 3 personal epochs. Full description in the
  module docstring (:mod:`fedjaxsparse.algorithms.ditto`).

  Args:
    loss_fn: ``(params, x, y, mask) -> scalar`` of one client
      (:func:`fedjaxsparse.models.make_loss`).
    lr: the SGD step size η > 0, or a schedule of the round ``t -> η_t`` (an optax schedule:
      ``optax.exponential_decay(lr, 1, 0.998)`` is ``η_t = lr·0.998^t``).
    lam: λ ≥ 0, the strength of the personal model's proximal pull ``λ(v_k − w_c)`` towards
      the global model (the FedSpa paper: 0.5).
    global_epochs: local epochs of the global part (a), ≥ 0 (the FedSpa paper: 2; 0 skips it).
    personal_epochs: local epochs of the personal part (b), ≥ 1 (the FedSpa paper: 3).
    batch_size: B, examples per minibatch, drawn without replacement within an epoch (the
      FedSpa paper: 128); each epoch is ``⌈n_k/B⌉`` steps.
    cohort_size: clients per round, sampled uniformly without replacement (``None``: all
      clients).
    prox_centre: the proximal centre ``w_c``: ``"received"`` (the received ``w_t``, original
      Ditto, default) or ``"updated"`` (the client's locally updated ``w_k``; the FedSpa
      paper's prose allows either).
    weight_decay: λ_wd ≥ 0 added to the gradient in both parts.
    weighting: the aggregation weights ``p_k`` of the global deltas: ``"uniform"`` (1/S, the
      default), ``"num_examples"`` (n_k/Σ_{S_t} n_j) or ``"sampling"`` (with ``sampler``).
    sampler: any :class:`fedjaxsparse.ops.sampling.Sampler` drawing the cohort instead of a
      uniform one of ``cohort_size`` (give ``cohort_size=None`` with it); ``weighting=
      "sampling"`` then aggregates the global updates with its unbiased weights ``1/(n p_i)``,
      so the expected global step is the full-participation one.
    uplink: a :class:`fedjaxsparse.ops.compressors.Compressor` applied to every uploaded global
      delta (one key per client), charged ``uplink.bits(d)`` per member.
    server_optimizer: an optax transformation of the pseudo-gradient ``−Σ_k p_k (w_k − w_t)``
      (FedAdam, server momentum); ``None`` is the paper's plain average.
    client_optimizer: an optax transformation for both local parts instead of the paper's
      SGD with ``η_t`` (``optax.sgd(lr)`` is the paper's step bit for bit; its state starts
      fresh in each part; ``lr`` is then unused; it is fed the same gradient with weight decay
      and the proximal pull), or a function of the round returning one
      (``lambda t: optax.sgd(schedule(t))``).

  Returns:
    An :class:`fedjaxsparse.core.Algorithm` (``init(key, params, data)``, ``step(key, state,
    data) -> (state, info)``; :func:`client_update` on
    :func:`~fedjaxsparse.algorithms.cohort_round.cohort_round`). Its state is a
    :class:`DittoState`: ``state.params`` (the global ``w_t``), ``state.clients`` =
    ``state.personal`` (every personal model ``v_k``, leaves ``[N, ...]``),
    ``state.server_opt_state`` and ``state.round`` (rounds completed). Each ``step`` reports a
    :class:`DittoInfo`: ``loss`` (the cohort's loss of its personal models before training,
    weighted by the round's weights), ``bits_up`` / ``bits_down`` (summed over the cohort:
    dense fp32 models, ``32·d`` per member each way, 0 with ``global_epochs=0``; with an
    ``uplink``, ``uplink.bits(d)`` per member up) and ``num_clients`` (int32).

  References:
    Tian Li, Shengyuan Hu, Ahmad Beirami, Virginia Smith (2021). Ditto: Fair and Robust
      Federated Learning Through Personalization. ICML 2021. arXiv:2012.04221.
    Tiansheng Huang, Shiwei Liu, Li Shen, Fengxiang He, Weiwei Lin, Dacheng Tao (2022).
      Achieving Personalized Federated Learning with Sparse Local Models. arXiv preprint.
      arXiv:2201.11380.

  Source for the team: seed 002 B.3 l. 853-875; spec ``seed002.md`` §4.2-4.3.
  """
  return cohort_round(
      client_update(loss_fn, lr, lam=lam, global_epochs=global_epochs,
                    personal_epochs=personal_epochs, batch_size=batch_size,
                    prox_centre=prox_centre, weight_decay=weight_decay,
                    client_optimizer=client_optimizer),
      cohort_size=cohort_size, sampler=sampler, weighting=weighting, uplink=uplink,
      server_optimizer=server_optimizer)


def local(loss_fn: LossFn, lr: float | Schedule, *, epochs: int = 5, batch_size: int = 128,
          cohort_size: int | None = 10, weight_decay: float = 0.0) -> Algorithm:
  """Local (the FedSpa paper, Appendix B.3): each round S sampled clients train their own models for
  ``epochs`` epochs; no communication. :func:`ditto` with no global part and λ = 0."""
  return ditto(loss_fn, lr, lam=0.0, global_epochs=0, personal_epochs=epochs,
               batch_size=batch_size, cohort_size=cohort_size, weight_decay=weight_decay)
