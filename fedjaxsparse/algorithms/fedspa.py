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
parameters dense. ``η_t = lr·lr_decay^t`` (the paper: 0.1·0.998^t). With ``sparsity=0`` FedSpa
is FedAvg with uniform weights (no mask search: every layer is full).

Communication, two ledgers (:class:`FedSpaInfo`): the paper's — values only, fp32, the same
density applied to all d parameters (``2·S·(1−s)·d·32`` bits a round, §2.5) — and an honest
one: each sparse message charged by its values plus the cheaper of a bitmap and indices
(:func:`fedjaxsparse.ops.accounting.message_bits`), and the uploaded DST mask as the cheaper of
d bits and the changed positions' indices.

Choices where the paper is silent (options): ``c = ⌈α_t n_l⌉`` (RigL/ITOP rounding); just-pruned
entries may be regrown (``regrow_pruned``); ``α_t`` uses ``T − 1`` (``α_{T−1} = 0``); ties go to
the lower index; the regrowth minibatch is a fresh draw of B examples (its own key).

Source for the team: seed 002, Algorithm 1, l. 338-385; spec ``seed002.md`` §2-§3.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedjaxsparse.ops import accounting
from fedjaxsparse.ops import compressors as C
from fedjaxsparse.ops import masks as MK
from fedjaxsparse.runtime import cohort as cohorts
from fedjaxsparse.runtime.clients import map_clients
from fedjaxsparse.core import Algorithm, LossFn, as_float, float_dtype
from fedjaxsparse.data.federated import FederatedData, check_data
from fedjaxsparse.ops.local import epoch_sgd, max_local_steps
from fedjaxsparse.ops.sampling import check_cohort_size, client_keys
from fedjaxsparse.ops.local import epoch_minibatch
from fedjaxsparse.errors import check_number
from fedjaxsparse.ops.sparsity import num_params

SEARCHES = ("dst", "rsm")


class FedSpaState(NamedTuple):
  """Attributes: ``params`` (the dense global ``w_t``), ``masks`` (bool, leaves ``[N, ...]``),
  ``round``. :attr:`personal` gives every client's model ``m_k⊙w_t``."""
  params: Any
  masks: Any
  round: jax.Array

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


def fedspa(loss_fn: LossFn, lr: float, *, num_rounds: int, sparsity: float = 0.5,
           search: str = "dst", epochs: int = 5, batch_size: int = 128,
           cohort_size: int | None = 10, distribution: str = "erk", shared_init: bool = True,
           alpha0: float = 0.5, schedule: str = "cosine", regrowth: str = "gradient",
           regrow_pruned: bool = True, lr_decay: float = 1.0,
           weight_decay: float = 0.0, weighting: str = "uniform",
           subsample: float | None = None, rescale: bool = False,
           pack_masks: bool = False, uplink: Any = None, sampler: Any = None) -> Algorithm:
  """FedSpa (DST or RSM); see the module docstring.

  Args:
    loss_fn: ``(params, x, y, mask) -> scalar`` of one client.
    lr, lr_decay: ``η_t = lr·lr_decay^t`` (the paper: 0.1, 0.998).
    num_rounds: T, for the drop-fraction schedule (``α_{T−1} = 0`` with the cosine one).
    sparsity: s in [0, 1), of the masked (kernel) leaves.
    search: ``"dst"`` (Alg. 2) or ``"rsm"`` (Alg. 3).
    epochs, batch_size: E local epochs of minibatches of B (the paper: 5, 128).
    cohort_size: S (``None``: all clients).
    distribution: ``"erk"``, ``"er"`` or ``"uniform"`` layer densities (Table 4's ablation).
    shared_init: one initial mask for all (the paper) or one per client (Fig. 6's ablation).
    alpha0, schedule: the drop fraction α_0 and its schedule (``masks.DROP_SCHEDULES``).
    regrowth: ``"gradient"`` (RigL) or ``"random"`` (SET, Fig. 7's ablation).
    regrow_pruned: whether entries pruned in a round may be regrown in it.
    weight_decay: λ_wd added to the gradient (on active entries; the paper: 5e-4).
    weighting: ``"uniform"`` (1/S, FedSpa's Eq. 4), ``"sampling"`` (with ``sampler``) or
      ``"num_examples"`` (n_k/Σ_{S_t} n_j, FedAvg as McMahan et al. and FedML weight it; the
      paper does not say which its FedAvg baseline used).
    subsample, rescale: keep a fresh uniformly random ``round(q·d)`` entries of every
      ``U_k`` (its own key per client and round), scaled by ``1/q`` with ``rescale`` (then
      unbiased): with ``sparsity=0`` and ``search="rsm"`` the Subsampling baseline (Konečný et
      al. 2016; keep ratio 0.5 inferred from the 0.75× comm, no rescaling in the paper's
      text). Charged ``32·round(q·d)`` bits (paper) and values plus positions (honest).
    pack_masks: store the N masks one bit per entry (``uint8``, 8× less server memory: ResNet-18
      × 100 clients is 140 MB instead of 1.1 GB); the S sampled rows are unpacked and packed
      back inside the round. The results are the same.
    uplink: any :class:`fedjaxsparse.ops.compressors.Compressor` applied to every uploaded
      ``U_k`` (its own key per client and round: ``fold_in`` of the client id), charged
      ``uplink.bits(d)`` per client (plus the DST mask changes) — e.g. TernGrad, EDEN, rand-k.
    sampler: any :class:`fedjaxsparse.ops.sampling.Sampler` drawing the cohort instead of a
      uniform one of ``cohort_size`` (give ``cohort_size=None`` with it); with
      ``weighting="sampling"`` the dense update is aggregated with its unbiased weights
      ``1/(n p_i)`` (:mod:`fedjaxsparse.runtime.cohort`).
  """
  check_number("lr", lr, 0.0, None, low_open=True)
  check_number("lr_decay", lr_decay, 0.0, 1.0, low_open=True)
  check_number("weight_decay", weight_decay, 0.0, None)
  if search not in SEARCHES:
    raise ValueError(f"search must be one of {SEARCHES}, got {search!r}.")
  if schedule not in MK.DROP_SCHEDULES:
    raise ValueError(f"schedule must be one of {tuple(MK.DROP_SCHEDULES)}, got {schedule!r}.")
  for name, v in (("epochs", epochs), ("batch_size", batch_size), ("num_rounds", num_rounds)):
    if not isinstance(v, int) or v < 1:
      raise ValueError(f"{name} must be an int >= 1, got {v!r}.")
  MK._check_alpha(alpha0, num_rounds)  # validates alpha0 (as every drop schedule does)
  if subsample is not None and uplink is not None:
    raise ValueError("give either subsample (the paper's rand-k baseline) or uplink, not both.")
  if subsample is not None:
    check_number("subsample", subsample, 0.0, 1.0, low_open=True)
  cohorts.check_options(cohort_size, sampler, weighting)
  if regrowth not in MK.REGROWTHS:
    raise ValueError(f"regrowth must be one of {MK.REGROWTHS}, got {regrowth!r}.")
  drop = MK.DROP_SCHEDULES[schedule]
  grad = jax.grad(loss_fn)

  def counts_of(params):
    return MK.layer_counts(params, MK.layer_densities(params, sparsity, distribution))

  def init(key, params, data: FederatedData) -> FedSpaState:
    check_data(data)
    check_cohort_size(cohort_size, data.num_clients)
    counts = counts_of(params)
    n = data.num_clients
    key = jax.random.key(0) if key is None else key
    if shared_init:
      one = MK.random_masks(key, params, counts)
      stacked = jax.tree.map(lambda m: jnp.broadcast_to(m, (n,) + m.shape), one)
    else:
      stacked = jax.vmap(lambda k: MK.random_masks(k, params, counts))(
          jax.random.split(key, n))
    if pack_masks:
      stacked = jax.vmap(MK.pack)(stacked)
    return FedSpaState(params, stacked, jnp.zeros((), jnp.int32))

  def client(w, mask, eta, alpha, counts, max_steps, key, d):
    k_order, k_grow, k_random = jax.random.split(key, 3)
    start = jax.tree.map(lambda m, a: jnp.where(m, a, jnp.zeros_like(a)), mask, w)

    trained = epoch_sgd(grad, start, k_order, d, lr=eta, epochs=epochs, batch_size=batch_size,
                        max_steps=max_steps, weight_decay=weight_decay, mask=mask)
    message = jax.tree.map(jnp.subtract, start, trained)  # U_k
    if search == "dst":
      dense_g = grad(trained, *epoch_minibatch(k_grow, d, batch_size, jnp.int32(0)))
      new_mask = MK.prune_regrow(mask, trained, dense_g, alpha, counts, max_fraction=alpha0,
                                 regrowth=regrowth, key=k_random,
                                 regrow_pruned=regrow_pruned)
    else:
      new_mask = mask
    return message, new_mask, loss_fn(start, d.x, d.y, d.mask)

  def step(key, state: FedSpaState, data: FederatedData):
    k_cohort, k_train = jax.random.split(key)
    cohort = cohorts.draw(k_cohort, data, cohort_size, sampler)
    ids, cdata = cohort.ids, cohort.data
    w, t = state.params, state.round
    counts = counts_of(w)
    eta = lr * as_float(lr_decay) ** t.astype(float_dtype())
    alpha = drop(t, alpha0, num_rounds)
    max_steps = max_local_steps(data, batch_size, epochs)
    old = MK.as_bool(jax.tree.map(lambda m: m[ids], state.masks), w)
    messages, new_masks, losses = map_clients(
        lambda m, k, d: client(w, m, eta, alpha, counts, max_steps, k, d), cdata, old,
        client_keys(k_train, ids))
    s = ids.shape[0]
    d = num_params(w)
    active = sum(jax.tree.leaves(counts))
    if sampler is not None:   # a sampler's cohort varies in size: count its members
      s = cohort.size
    paper = as_float(s * accounting.dense_bits(round((1.0 - sparsity) * d)))
    down = as_float(s * accounting.sparse_bits(active, d))
    up, paper_up = down, paper
    if subsample is not None:
      k = min(d, max(1, round(subsample * d)))
      comp = (C.rand_k if rescale else C.scaled_rand_k)(d, k)
      messages = jax.vmap(comp.compress)(client_keys(jax.random.fold_in(k_train, 1), ids),
                                         messages)
      up = as_float(s * comp.bits(d))
      paper_up = as_float(s * accounting.dense_bits(k))
    if uplink is not None:   # any compressor of the cohort round, one key per client
      messages = cohorts.upload(jax.random.fold_in(k_train, 1), cohort, messages, uplink)
      up = paper_up = as_float(s * uplink.bits(d))
    p = (jnp.full((ids.shape[0],), 1.0 / ids.shape[0])
         if weighting == "uniform" and sampler is None else cohorts.weights(cohort, weighting))
    new_w = jax.tree.map(lambda a, u: a - jnp.tensordot(p.astype(u.dtype), u, axes=1), w,
                         messages)
    stored = jax.vmap(MK.pack)(new_masks) if pack_masks else new_masks
    masks = jax.tree.map(lambda all_, new: all_.at[ids].set(new), state.masks, stored)
    change = jax.vmap(MK.hamming)(old, new_masks)
    if search == "dst":
      mask_up = jnp.minimum(as_float(d), change.astype(float_dtype())
                            * accounting.index_bits(d))
      up = up + jnp.sum(cohort.member * mask_up)
    mean = (jnp.mean if sampler is None else
            lambda v: jnp.sum(cohort.member * v) / cohort.size)   # over members only
    info = FedSpaInfo(mean(losses), up, down, paper_up, paper, jnp.asarray(s, jnp.int32),
                      jnp.asarray(alpha, float_dtype()), mean(change.astype(float_dtype())))
    return FedSpaState(new_w, masks, t + 1), info

  return Algorithm(init, step)
