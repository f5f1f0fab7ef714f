"""FedSpa: personalised sparse masks over one dense global model, trained sparse-to-sparse, with the
DST (Alg. 2) and RSM (Alg. 3) mask-search plug-ins.

References:
  Tiansheng Huang, Shiwei Liu, Li Shen, Fengxiang He, Weiwei Lin, Dacheng Tao (2022).
    Achieving Personalized Federated Learning with Sparse Local Models. arXiv preprint.
    arXiv:2201.11380.

The server keeps the dense global model ``w_t`` and every client's mask ``m_k`` (stacked,
leading axis N). Round t:

1. a uniform cohort ``S_t`` of S clients without replacement; the others' masks are kept bit
   for bit;
2. client k starts from ``w̃_0 = m_k⊙w_t`` (sparse downlink) and runs E epochs of masked SGD,
   ``w̃ ← w̃ − η_t m_k⊙(∇L(w̃; ξ) + λ_wd w̃)`` (minibatches of B without replacement, ``N_k =
   E⌈n_k/B⌉`` steps; unequal clients share one vmapped loop), and sends ``U_k = w̃_0 − w̃_N``;
3. it computes its next mask (``search``): ``"dst"`` — prune the ``c = ⌈α_t n_l⌉`` active
   entries of smallest ``|w̃_N|`` in every masked layer and regrow ``c`` inactive ones of
   largest ``|g|``, ``g`` the *dense* gradient ``∇_v L(v; ξ')|_{v = w̃_N}`` on one fresh
   minibatch ξ' (w.r.t. the effective weights, not through the mask), ``α_t`` the cosine
   schedule from ``α_0 = 0.5``; ``regrowth="random"`` is the SET ablation. ``"rsm"`` — the mask
   never changes (Alg. 3);
4. ``w_{t+1} = w_t − (1/S) Σ_{k∈S_t} U_k``: uniform weights 1/S, *not* normalised per
   coordinate (a coordinate active at one client moves by 1/S of its update; unlike
   Sub-FedAvg's intersection average), nothing zeroed in ``w`` (a regrown coordinate comes back
   with the current global value, the paper's warm start).

Initial masks: exact per-layer counts (:mod:`fedjaxsparse.ops.masks`) at ERK (or ER / uniform)
densities, from one shared seed (every client the same mask) or per-client seeds
(``shared_init=False``, the "different init" ablation). Kernels are masked, biases and norm
parameters dense. ``η_t`` is ``lr`` or a schedule of the round (the paper: ``0.1·0.998^t``,
``optax.exponential_decay(0.1, 1, 0.998)``). With ``sparsity=0`` FedSpa
is FedAvg with uniform weights (no mask search: every layer is full).

Communication, two ledgers (:class:`FedSpaInfo`): the paper's — values only, fp32, the same
density applied to all d parameters (``2·S·(1−s)·d·32`` bits a round) — and an honest
one: each sparse message charged by its values plus the cheaper of a bitmap and indices
(:func:`fedjaxsparse.ops.accounting.message_bits`), and the uploaded DST mask as the cheaper of
d bits and the changed positions' indices.

Choices where the paper is silent (options): ``c = ⌈α_t n_l⌉`` (RigL/ITOP rounding); just-pruned
entries may be regrown (``regrow_pruned``); ``α_t`` uses ``T − 1`` (``α_{T−1} = 0``); ties go to
the lower index; the regrowth minibatch is a fresh draw of B examples (its own key).

Source for the team: seed 002, Algorithm 1, l. 338-385; spec ``seed002.md`` §2-§3 (ledger: §2.5).
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedjaxsparse.ops import accounting
from fedjaxsparse.ops import masks as MK
from fedjaxsparse.algorithms.cohort_round import (EXTRA_BITS_UP, ClientUpdate, CohortState,
                                                   cohort_round)
from fedjaxsparse.core import Algorithm, LossFn, as_float, float_dtype
from fedjaxsparse.ops.local import Schedule, at_round, check_lr, epoch_minibatch, epoch_sgd
from fedjaxsparse.errors import check_int, check_number
from fedjaxsparse.ops.sparsity import num_params
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["FedSpaState", "FedSpaInfo", "fedspa", "client_update"]
__dir__ = _public_dir(__all__)

SEARCHES = ("dst", "rsm")


class FedSpaState(CohortState):
  """:class:`~fedjaxsparse.algorithms.cohort_round.CohortState` whose client states are the
  masks: ``params`` (the dense global ``w_t``), ``clients`` = :attr:`masks` (bool, or ``uint8``
  packed, leaves ``[N, ...]``), ``server_opt_state``, ``round``. :attr:`personal` gives every
  client's model ``m_k⊙w_t``."""
  __slots__ = ()

  @property
  def masks(self) -> Any:
    """Every client's mask, leaves ``[N, ...]`` (packed ``uint8`` with ``pack_masks``)."""
    return self.clients

  @property
  def personal(self) -> Any:
    """``[N, ...]``: client k's personalised model ``m_k⊙w`` (what it evaluates)."""
    return jax.tree.map(lambda m, w: jnp.where(m, w[None], jnp.zeros_like(w)[None]),
                        MK.as_bool(self.masks, self.params), self.params)


class FedSpaInfo(NamedTuple):
  """Per round (default float dtype unless said): ``loss`` (the cohort's mean loss at its downloaded
  sparse models), ``bits_up`` / ``bits_down`` (the honest ledger, summed over the cohort),
  ``paper_bits_up`` / ``paper_bits_down`` (the paper's), ``num_clients`` (int32), ``alpha``
  (the drop fraction α_t), ``mask_change`` (mean Hamming distance between a participant's old
  and new mask)."""
  loss: jax.Array
  bits_up: jax.Array
  bits_down: jax.Array
  paper_bits_up: jax.Array
  paper_bits_down: jax.Array
  num_clients: jax.Array
  alpha: jax.Array
  mask_change: jax.Array


def fedspa(loss_fn: LossFn, lr: float | Schedule, *, num_rounds: int, sparsity: float = 0.5,
           search: str = "dst", epochs: int = 5, batch_size: int = 128,
           cohort_size: int | None = 10, distribution: str = "erk", shared_init: bool = True,
           alpha0: float = 0.5, schedule: str = "cosine", regrowth: str = "gradient",
           regrow_pruned: bool = True,
           weight_decay: float = 0.0, weighting: str = "uniform",
           pack_masks: bool = False, uplink: Any = None, sampler: Any = None,
           server_optimizer: Any = None,
           client_optimizer: Any = None) -> Algorithm:
  """FedSpa (Huang et al., 2022): personalised sparse masks over one dense global model.

  The server keeps the dense global model ``w_t`` (a pytree of ``d`` entries) and one mask
  ``m_k`` per client (leaves ``[N, ...]``; all kernels masked at density ``1 − sparsity``,
  biases and norm parameters dense). Round ``t``, each client ``k`` of a uniform cohort
  ``S_t`` of ``S = cohort_size`` clients:

  1. starts from its sparse model ``w̃_0 = m_k⊙w_t`` (the sparse download) and runs
     ``epochs`` epochs of masked SGD on minibatches of ``batch_size`` (``E⌈n_k/B⌉`` steps),
     ``w̃ ← w̃ − η_t m_k⊙(∇L(w̃; ξ) + λ_wd w̃)``, and uploads its dense-shaped update
     ``U_k = w̃_0 − w̃_N`` (zero off its mask);
  2. searches its next mask: ``search="dst"`` (the paper's Algorithm 2) prunes, in every
     masked layer, the ``⌈α_t n_l⌉`` active entries of smallest ``|w̃_N|`` and regrows as many
     inactive ones of largest dense gradient ``|∇L(w̃_N; ξ')|`` on one fresh minibatch ``ξ'``
     (``regrowth="random"``: SET's random regrowth), with the drop fraction ``α_t`` annealed
     from ``alpha0`` (cosine: ``α_t = ½α_0(1 + cos(π t/(T − 1)))``); ``search="rsm"``
     (Algorithm 3) keeps the mask fixed;
  3. the server sets ``w_{t+1} = w_t − (1/S) Σ_{k∈S_t} U_k`` (uniform weights, not normalised
     per coordinate; nothing in ``w`` is zeroed, so a regrown entry comes back at the current
     global value). Clients outside the cohort keep their masks bit for bit.

  Client ``k``'s personalised model is ``m_k⊙w_t`` (:attr:`FedSpaState.personal`). With
  ``sparsity=0`` FedSpa is FedAvg with uniform weights. See the module docstring
  (:mod:`fedjaxsparse.algorithms.fedspa`) for the initial masks, the two communication ledgers
  and the choices where the paper is silent.

  Args:
    loss_fn: ``(params, x, y, mask) -> scalar`` of one client
      (:func:`fedjaxsparse.models.make_loss`).
    lr: the SGD step size η > 0, or a schedule of the round ``t -> η_t`` (the paper:
      ``optax.exponential_decay(0.1, 1, 0.998)``, ``η_t = 0.1·0.998^t``).
    num_rounds: T, for the drop-fraction schedule (``α_{T−1} = 0`` with the cosine one).
    sparsity: s in [0, 1), of the masked (kernel) leaves.
    search: ``"dst"`` (Algorithm 2, dynamic sparse training of the masks) or ``"rsm"``
      (Algorithm 3, random static masks).
    epochs: E, local epochs per round (the paper: 5).
    batch_size: B, examples per minibatch, drawn without replacement within an epoch (the
      paper: 128).
    cohort_size: S, clients per round, sampled uniformly without replacement (``None``: all
      clients).
    distribution: ``"erk"``, ``"er"`` or ``"uniform"`` layer densities of the initial masks
      (the paper's Table 4 ablation).
    shared_init: one initial mask for all clients (the paper) or one per client (its Fig. 6
      ablation).
    alpha0: the initial drop fraction α_0 of the DST search (the paper: 0.5).
    schedule: the drop fraction's schedule over the rounds, ``"cosine"`` (the paper),
      ``"linear"`` or ``"constant"`` (``masks.DROP_SCHEDULES``).
    regrowth: ``"gradient"`` (RigL) or ``"random"`` (SET, the paper's Fig. 7 ablation).
    regrow_pruned: whether entries pruned in a round may be regrown in it.
    weight_decay: λ_wd added to the gradient (on active entries; the paper: 5e-4).
    weighting: ``"uniform"`` (1/S, FedSpa's Eq. 4), ``"sampling"`` (with ``sampler``) or
      ``"num_examples"`` (n_k/Σ_{S_t} n_j, FedAvg as McMahan et al. and FedML weight it; the
      paper does not say which its FedAvg baseline used).
    pack_masks: store the N masks one bit per entry (``uint8``, 8× less server memory: ResNet-18
      × 100 clients is 140 MB instead of 1.1 GB); the S sampled rows are unpacked and packed
      back inside the round. The results are the same.
    uplink: any :class:`fedjaxsparse.ops.compressors.Compressor` applied to every uploaded
      ``U_k`` (its own key per client and round: ``fold_in`` of the client id), charged
      ``uplink.bits(d)`` per client (plus the DST mask changes) — e.g. TernGrad, EDEN, rand-k
      (:func:`~fedjaxsparse.algorithms.cohort_round.cohort_round` compresses). The paper's
      Subsampling baseline is FedAvg with a seeded random-half uplink
      (:func:`fedjaxsparse.ops.compressors.scaled_rand_k`).
    sampler: any :class:`fedjaxsparse.ops.sampling.Sampler` drawing the cohort instead of a
      uniform one of ``cohort_size`` (give ``cohort_size=None`` with it); with
      ``weighting="sampling"`` the dense update is aggregated with its unbiased weights
      ``1/(n p_i)``.
    server_optimizer: an optax transformation of the pseudo-gradient ``(1/S) Σ_k U_k``
      (FedAdam, server momentum); ``None`` is the paper's ``w − (1/S) Σ_k U_k``.
    client_optimizer: an optax transformation instead of the paper's masked SGD with ``η_t``
      (fed the same masked gradient with weight decay, its update zeroed off the mask);
      ``optax.sgd(lr)`` is the paper's step bit for bit. A function of the round returning
      one follows the rounds.

  Returns:
    An :class:`fedjaxsparse.core.Algorithm` (``init(key, params, data)``, ``step(key, state,
    data) -> (state, info)``; :func:`client_update` on
    :func:`~fedjaxsparse.algorithms.cohort_round.cohort_round`). Its state is a
    :class:`FedSpaState`: ``state.params`` (the dense global ``w_t``), ``state.clients`` =
    ``state.masks`` (every client's mask, leaves ``[N, ...]``, bool or packed ``uint8``),
    ``state.server_opt_state``, ``state.round`` (rounds completed) and the property
    ``state.personal`` (``[N, ...]``: every ``m_k⊙w_t``). Each ``step`` reports a
    :class:`FedSpaInfo`: ``loss`` (the cohort's loss at its downloaded sparse models, weighted
    by the round's weights), ``bits_up`` / ``bits_down`` (the honest ledger, summed over the
    cohort: each sparse model by its values plus the cheaper of a bitmap and indices, or
    ``uplink.bits(d)`` per upload, plus the DST mask's changed positions up),
    ``paper_bits_up`` / ``paper_bits_down`` (the paper's ledger: ``S·(1−s)·d·32`` bits each
    way, or ``S·uplink.bits(d)`` up), ``num_clients`` (int32), ``alpha`` (this round's drop
    fraction α_t) and ``mask_change`` (the mean Hamming distance between a participant's old
    and new mask).

  References:
    Tiansheng Huang, Shiwei Liu, Li Shen, Fengxiang He, Weiwei Lin, Dacheng Tao (2022).
      Achieving Personalized Federated Learning with Sparse Local Models. arXiv preprint.
      arXiv:2201.11380.

  Source for the team: seed 002, Algorithm 1, l. 338-385; spec ``seed002.md`` §2-§3.
  """
  return cohort_round(
      client_update(loss_fn, lr, num_rounds=num_rounds, sparsity=sparsity, search=search,
                    epochs=epochs, batch_size=batch_size, distribution=distribution,
                    shared_init=shared_init, alpha0=alpha0, schedule=schedule,
                    regrowth=regrowth, regrow_pruned=regrow_pruned,
                    weight_decay=weight_decay, pack_masks=pack_masks, uplink=uplink,
                    client_optimizer=client_optimizer),
      cohort_size=cohort_size, sampler=sampler, weighting=weighting, uplink=uplink,
      server_optimizer=server_optimizer)


def client_update(loss_fn: LossFn, lr: float | Schedule, *, num_rounds: int, sparsity: float = 0.5,
                  search: str = "dst", epochs: int = 5, batch_size: int = 128,
                  distribution: str = "erk", shared_init: bool = True, alpha0: float = 0.5,
                  schedule: str = "cosine", regrowth: str = "gradient",
                  regrow_pruned: bool = True,
                  weight_decay: float = 0.0, pack_masks: bool = False,
                  uplink: Any = None,
                  client_optimizer: Any = None) -> ClientUpdate:
  """FedSpa's client (its state: its mask): masked SGD from ``m_k⊙w_t``, the update
  ``w̃_N − w̃_0`` uploaded, and
  the next mask from the DST search (or the same mask, RSM). Its records: ``mask_change``
  (Hamming distance of its old and new mask), ``extra_bits_up`` (the DST mask's changed
  positions), and per round the drop fraction ``alpha`` and the paper's ledger
  (``paper_bits_up``/``paper_bits_down``). ``uplink`` is only read for the paper's ledger
  (``cohort_round`` compresses). Arguments as :func:`fedspa`."""
  check_lr(lr)
  check_number("weight_decay", weight_decay, 0.0, None)
  if search not in SEARCHES:
    raise ValueError(f"search must be one of {SEARCHES}, got {search!r}.")
  if schedule not in MK.DROP_SCHEDULES:
    raise ValueError(f"schedule must be one of {tuple(MK.DROP_SCHEDULES)}, got {schedule!r}.")
  for name, v in (("epochs", epochs), ("batch_size", batch_size), ("num_rounds", num_rounds)):
    check_int(name, v, 1)
  MK._check_alpha(alpha0, num_rounds)  # validates alpha0 (as every drop schedule does)
  if regrowth not in MK.REGROWTHS:
    raise ValueError(f"regrowth must be one of {MK.REGROWTHS}, got {regrowth!r}.")
  drop = MK.DROP_SCHEDULES[schedule]
  grad = jax.grad(loss_fn)

  def counts_of(params):
    return MK.layer_counts(params, MK.layer_densities(params, sparsity, distribution))

  def init(key, params, n):
    counts = counts_of(params)
    key = jax.random.key(0) if key is None else key
    if shared_init:
      one = MK.random_masks(key, params, counts)
      stacked = jax.tree.map(lambda m: jnp.broadcast_to(m, (n,) + m.shape), one)
    else:
      stacked = jax.vmap(lambda k: MK.random_masks(k, params, counts))(
          jax.random.split(key, n))
    return jax.vmap(MK.pack)(stacked) if pack_masks else stacked

  def update(key, w, stored, d, t):
    k_order, k_grow, k_random = jax.random.split(key, 3)
    mask = MK.unpack(stored, w) if pack_masks else stored
    counts = counts_of(w)
    eta = at_round(lr, t)
    alpha = drop(t, alpha0, num_rounds)
    max_steps = epochs * -(-d.mask.shape[0] // batch_size)   # the padded data's bound
    start = jax.tree.map(lambda m, a: jnp.where(m, a, jnp.zeros_like(a)), mask, w)
    trained = epoch_sgd(grad, start, k_order, d, lr=eta, epochs=epochs, batch_size=batch_size,
                        max_steps=max_steps, weight_decay=weight_decay, mask=mask,
                        optimizer=at_round(client_optimizer, t))
    message = jax.tree.map(jnp.subtract, trained, start)     # −U_k
    if search == "dst":
      dense_g = grad(trained, *epoch_minibatch(k_grow, d, batch_size, jnp.int32(0)))
      new_mask = MK.prune_regrow(mask, trained, dense_g, alpha, counts, max_fraction=alpha0,
                                 regrowth=regrowth, key=k_random,
                                 regrow_pruned=regrow_pruned)
    else:
      new_mask = mask
    change = MK.hamming(mask, new_mask).astype(float_dtype())
    metrics = {"loss": loss_fn(start, d.x, d.y, d.mask), "mask_change": change}
    if search == "dst":   # the changed positions: the cheaper of a bitmap and their indices
      dim = as_float(num_params(w))
      metrics[EXTRA_BITS_UP] = jnp.minimum(dim, change * accounting.index_bits(num_params(w)))
    return message, (MK.pack(new_mask) if pack_masks else new_mask), metrics

  def active_bits(params):   # a sparse model: values plus positions
    active = sum(jax.tree.leaves(counts_of(params)))
    return as_float(accounting.sparse_bits(active, num_params(params)))


  def round_metrics(params, t, size):
    d = num_params(params)
    paper = size * as_float(accounting.dense_bits(round((1.0 - sparsity) * d)))
    if uplink is not None:
      paper_up = size * as_float(uplink.bits(d))
    else:
      paper_up = paper
    return {"paper_bits_up": paper_up, "paper_bits_down": paper,
            "alpha": jnp.asarray(drop(t, alpha0, num_rounds), float_dtype())}

  return ClientUpdate(init, update, upload_bits=lambda message, params: active_bits(params),
                      download_bits=active_bits,
                      round_metrics=round_metrics, info_type=FedSpaInfo,
                      state_type=FedSpaState)
