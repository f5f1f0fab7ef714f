"""Sub-FedAvg (Un) and (Hy) (Vahidian, Morafah & Lin, ICDCS 2021, arXiv 2105.00562), the
dense-to-sparse personalised-pruning baseline of the FedSpa paper (Huang et al., 2022). Its
details come from its own paper and the authors' code (MMorafah/Sub-FedAvg: ``client_u.py``,
``unstructured.py``, ``sub_fedavg_u.py``, and for (Hy) ``client_s.py``, ``structured.py``), not
from the FedSpa paper, which gives only the hyper-parameters (prune rate 0.05, distance
threshold 1e-4, accuracy threshold 0.5, final density 0.5).

References:
  Saeed Vahidian, Mahdi Morafah, Bill Lin (2021). Personalized Federated Learning by
    Structured and Unstructured Pruning under Data Heterogeneity. IEEE ICDCS Workshops 2021.
    arXiv:2105.00562.
  Tiansheng Huang, Shiwei Liu, Li Shen, Fengxiang He, Weiwei Lin, Dacheng Tao (2022).
    Achieving Personalized Federated Learning with Sparse Local Models. arXiv preprint.
    arXiv:2201.11380.

Every client holds a mask ``m_k`` over the shared model (all ones at the start). Round t, each
client k of a uniform cohort S_t:

1. starts from ``m_k⊙w_t`` and trains E epochs of SGD with the gradient masked by ``m_k``;
2. forms two candidate masks by pruning the smallest-``|w|`` ``r`` of the remaining weights in
   every masked layer (``fake_prune``): ``m¹`` from the weights after the first epoch and
   ``m²`` after the last (the code's epochs 1 and 5); ``r = min(prune_rate, (ρ − ρ*)/ρ)``
   lands on the target density ``ρ* = 1 − target_sparsity`` (the code's last-step
   adjustment) — from above, by less than one pruning unit per layer (``⌊r·n_l⌋`` of a
   layer's ``n_l`` active weights or channels go);
3. if the masks still move — the mean over layers of the normalised Hamming distance of
   ``m¹`` and ``m²`` exceeds ``dist_threshold`` — and the density is above the target, it
   prunes to ``m²`` and keeps the result only if the pruned model's accuracy exceeds
   ``acc_threshold`` (otherwise it keeps the unpruned weights and old mask);
4. uploads ``m_k⊙w_k`` and ``m_k``.

The accuracy is measured on the client's *training* data: the authors' code uses the client's
local test split, which would let test data steer training. With ``epochs=1`` both candidates
come from the same weights: their distance is 0, never above a threshold ``≥ 0``, so no client
prunes.

The server averages every coordinate over the participants that keep it — "the average on the
intersection of unpruned parameters" — ``w_j ← Σ_k m_kj w_kj / Σ_k m_kj``, and keeps ``w_j``
where no participant does. Personalised models are ``m_k⊙w`` (:attr:`FedSpaState.personal`).
Masks (only kernels, ``ndim ≥ 2``) shrink by ``prune_rate`` per pruning round until the
target; biases and norm parameters stay dense.

**Sub-FedAvg (Hy)** (``structure="hybrid"``, the paper's pruning of "parameters and channels";
the authors' ``client_s.py``/``structured.py``): the convolutions are pruned by whole channels —
in every set a convolution writes, the ``r`` fraction of its active channels with the smallest
absolute normalisation scale (network slimming's saliency, as the authors rank their BatchNorm
weights; the channel's weight norm where its set has no norm), at least one channel kept — by
masking every producer slice of the channel (kernel output channel, bias, norm scale and
shift; exact with BatchNorm, whose statistics are per channel), while the dense kernels are
pruned weight by weight as in (Un). The network must declare its channel groups
(:mod:`fedjaxsparse.models.prunable`, e.g. ``lenet5``; pass
:func:`fedjaxsparse.pruning.zig.trace`'s groups as ``zigs``). One target density covers both
(the authors keep separate channel and weight targets); the mask distance and accuracy gate
are (Un)'s. Channels are masked, not removed: the masked model computes what the authors'
physically smaller one does (with BatchNorm), at the full model's cost.

Communication: the paper's ledger counts the values sent (the sparse model both ways, fp32);
the honest one adds their positions (cheaper of bitmap and indices) and the uploaded mask
(``d`` bits).

Source for the team: seed 002 B.3 l. 877-881, hyper-parameters l. 559-561, 574; spec
``seed002.md`` §4.4.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjaxsparse.algorithms.cohort_round import (EXTRA_BITS_DOWN, ClientUpdate, cohort_round,
                                                   masked_mean)
from fedjaxsparse.algorithms.fedspa import FedSpaState
from fedjaxsparse.core import Algorithm, LossFn, as_float, float_dtype
from fedjaxsparse.ops import accounting
from fedjaxsparse.ops.local import Schedule, at_round, check_lr, epoch_sgd
from fedjaxsparse.ops.sparsity import largest_mask, nnz, num_params
from fedjaxsparse.pruning import zig
from fedjaxsparse.errors import check_int, check_number
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["SubFedAvgInfo", "subfedavg", "client_update"]
__dir__ = _public_dir(__all__)



STRUCTURES = ("unstructured", "hybrid")
"""Sub-FedAvg's variants: (Un) prunes weights, (Hy) prunes convolution channels and weights."""


class SubFedAvgInfo(NamedTuple):
  """Per round: ``loss``, ``bits_up``/``bits_down`` (honest), ``paper_bits_up``/
  ``paper_bits_down`` (values only), ``num_clients``, ``density`` (the participants' mean
  kernel density after the round), ``pruned`` (the fraction of participants that pruned)."""
  loss: jax.Array
  bits_up: jax.Array
  bits_down: jax.Array
  paper_bits_up: jax.Array
  paper_bits_down: jax.Array
  num_clients: jax.Array
  density: jax.Array
  pruned: jax.Array


def _prune_layers(mask: Any, weights: Any, rate: Any, max_ndim: int = 4) -> Any:
  """Drops ``⌊rate·n_l⌋`` of the ``n_l`` active entries of smallest ``|w|`` in every masked
  leaf of 2 to ``max_ndim`` dimensions (``n_l`` and ``rate`` may be traced)."""
  def one(m, w):
    if not 2 <= m.ndim <= max_ndim:
      return m
    flat = m.ravel()
    active = jnp.sum(flat, dtype=jnp.int32)
    keep = active - jnp.floor(rate * active.astype(float_dtype()) + 1e-4).astype(jnp.int32)
    keys = jnp.where(flat, jnp.abs(w.ravel()).astype(float_dtype()), 0.0)
    return (flat & largest_mask(keys, keep)).reshape(m.shape)
  return jax.tree.map(one, mask, weights)


def _prune_channels(mask: Any, weights: Any, rate: Any, zigs: zig.ZIGs,
                    conv: np.ndarray) -> Any:
  """Structured pruning of the convolutions' channels (Sub-FedAvg (Hy)): in every set written
  by a convolution, drops ``⌊rate·n⌋`` of its ``n`` active channels (keeping one at least),
  those of smallest saliency — the absolute scale of the set's normalisation (network slimming, the
  authors' criterion), or the channel's weight norm where the set has none — by masking the
  channel's every producer slice (kernel output channel, bias, norm scale and shift)."""
  as_float = jax.tree.map(lambda m: m.astype(float_dtype()), mask)
  active = (zig.group_sq_norms(zigs, as_float) > 0) & conv
  scales = zig.norm_scales(zigs, weights)
  sal = jnp.where(scales > 0, scales, zig.group_norms(zigs, weights)).astype(float_dtype())
  keep = jnp.ones(zigs.num_groups, bool)
  for st in zigs.prunable:
    sl = slice(st.offset, st.offset + st.size)
    if not conv[sl].any():
      continue
    n = jnp.sum(active[sl], dtype=jnp.int32)
    drop = jnp.minimum(jnp.floor(rate * n.astype(float_dtype()) + 1e-4).astype(jnp.int32),
                       jnp.maximum(n - 1, 0))
    kept = largest_mask(jnp.where(active[sl], sal[sl], -jnp.inf), n - drop) & active[sl]
    keep = keep.at[sl].set(kept)
  scaled = zig.scale_groups(zigs, as_float, keep.astype(float_dtype()))
  return jax.tree.map(lambda m, v: m & (v > 0), mask, scaled)


def _kernel_density(mask: Any) -> jax.Array:
  kept = sum(jnp.sum(m) for m in jax.tree.leaves(mask) if m.ndim >= 2)
  total = sum(m.size for m in jax.tree.leaves(mask) if m.ndim >= 2)
  return kept / max(total, 1)


def subfedavg(loss_fn: LossFn, lr: float | Schedule, *, accuracy_fn: Callable, epochs: int = 5,
              batch_size: int = 128,
              cohort_size: int | None = 10, prune_rate: float = 0.05,
              target_sparsity: float = 0.5, acc_threshold: float = 0.5,
              dist_threshold: float = 1e-4, weight_decay: float = 0.0,
              structure: str = "unstructured", zigs: zig.ZIGs | None = None,
              sampler: Any = None, server_optimizer: Any = None,
              client_optimizer: Any = None) -> Algorithm:
  """Sub-FedAvg (Vahidian, Morafah & Lin, 2021): personalised subnetworks found by pruning
  each client's mask from dense towards a target sparsity, (Un) or with
  ``structure="hybrid"`` (Hy); a baseline of the FedSpa paper (Huang et al., 2022).

  Every client holds a mask ``m_k`` over the shared model ``w_t`` (all ones at the start;
  only kernels, ``ndim ≥ 2``, are pruned). Round ``t``, each client ``k`` of a uniform cohort
  ``S_t``:

  1. starts from ``m_k⊙w_t`` and trains ``epochs`` epochs of SGD with the gradient masked by
     ``m_k``, ``w ← w − η_t m_k⊙(∇L(w; ξ) + λ_wd w)``;
  2. forms two candidate masks by pruning, in every masked layer, the fraction
     ``r = min(prune_rate, (ρ − ρ*)/ρ)`` of its remaining weights of smallest ``|w|`` (``ρ``
     the current kernel density, ``ρ* = 1 − target_sparsity``): ``m¹`` from the weights
     after the first epoch, ``m²`` from those after the last;
  3. adopts ``m²`` only if the masks still move (the mean over layers of the normalised
     Hamming distance of ``m¹`` and ``m²`` exceeds ``dist_threshold``), the density is above
     the target, and the pruned model ``m²⊙w`` has an accuracy above ``acc_threshold`` on the
     client's training data; otherwise it keeps its mask;
  4. uploads its sparse model ``m_k⊙w_k`` and its mask ``m_k``.

  The server averages every coordinate over the participants that keep it,
  ``w_j ← Σ_k m_kj w_kj / Σ_k m_kj`` ("the average on the intersection of unpruned
  parameters"), and keeps ``w_j`` where none does. Client ``k``'s personalised model is
  ``m_k⊙w`` (:attr:`FedSpaState.personal`). Sub-FedAvg (Hy) prunes the convolutions by whole
  channels (smallest normalisation scale, network slimming's saliency) and the dense kernels
  weight by weight. With ``epochs=1`` both candidates come from the same weights (distance 0,
  never above ``dist_threshold``), so nothing is pruned. There is no ``uplink``: a client
  uploads its mask with its sparse model, and the average over the clients that keep a
  coordinate reads that mask exactly. The module docstring (:mod:`fedjaxsparse.algorithms.subfedavg`) has the full
  story and where it departs from the authors' code.

  Args:
    loss_fn: ``(params, x, y, mask) -> scalar`` of one client
      (:func:`fedjaxsparse.models.make_loss`).
    lr: the SGD step size η > 0, or a schedule of the round ``t -> η_t`` (an optax schedule).
    accuracy_fn: ``(params, x, y, mask) -> accuracy`` of one client, for the pruning condition
      (:func:`fedjaxsparse.evaluation.client_accuracy`), evaluated on its training data after
      local training.
    epochs: E, local epochs per round (the FedSpa paper: 5); the first epoch's weights give
      ``m¹``, the last's ``m²``.
    batch_size: B, examples per minibatch, drawn without replacement within an epoch (the
      FedSpa paper: 128).
    cohort_size: clients per round, sampled uniformly without replacement (``None``: all
      clients).
    prune_rate: the fraction in (0, 1) of a layer's remaining weights pruned in one pruning
      round (the FedSpa paper: 0.05).
    target_sparsity: the final kernel sparsity in [0, 1) at which pruning stops (the FedSpa
      paper: 0.5, i.e. density 0.5).
    acc_threshold: the accuracy in [0, 1] the pruned model must exceed on the client's
      training data for the pruning to be kept (the FedSpa paper: 0.5).
    dist_threshold: the mean normalised Hamming distance between ``m¹`` and ``m²`` above
      which the client prunes (the FedSpa paper: 1e-4).
    weight_decay: λ_wd ≥ 0 added to the gradient (on active entries).
    structure: ``"unstructured"`` (every kernel pruned weight by weight) or ``"hybrid"``: the
      convolutions pruned by whole channels, the dense kernels weight by weight — the
      paper's pruning of "parameters and channels".
    zigs: the network's channel groups (:func:`fedjaxsparse.pruning.zig.trace` of a
      :mod:`fedjaxsparse.models.prunable` network, e.g. its ``lenet5``), needed by
      ``"hybrid"``.
    sampler: any :class:`fedjaxsparse.ops.sampling.Sampler` drawing the cohort instead of a
      uniform one of ``cohort_size`` (give ``cohort_size=None`` with it); every member that
      keeps a coordinate counts once in its average.
    server_optimizer: an optax transformation of the pseudo-gradient ``x − masked mean``;
      ``None`` sets the global model to the masked mean.
    client_optimizer: an optax transformation instead of the paper's masked SGD with ``η_t``
      (its update zeroed off the mask; its state restarts after the first epoch, where the
      pruning test reads the weights); ``optax.sgd(lr)`` is the paper's step bit for bit. A
      function of the round returning one follows the rounds.

  Returns:
    An :class:`fedjaxsparse.core.Algorithm` (``init(key, params, data)``, ``step(key, state,
    data) -> (state, info)``; :func:`client_update` on
    :func:`~fedjaxsparse.algorithms.cohort_round.cohort_round` with the
    :func:`~fedjaxsparse.algorithms.cohort_round.masked_mean` aggregation and uniform
    weights). Its state is a :class:`~fedjaxsparse.algorithms.fedspa.FedSpaState`:
    ``state.params`` (the global ``w_t``), ``state.clients`` = ``state.masks`` (every
    client's bool mask, leaves ``[N, ...]``), ``state.server_opt_state``, ``state.round``
    (rounds completed) and the property ``state.personal`` (``[N, ...]``: every ``m_k⊙w_t``).
    Each ``step`` reports a :class:`SubFedAvgInfo`: ``loss`` (the cohort's mean loss at its
    downloaded sparse models ``m_k⊙w_t``), ``bits_up`` / ``bits_down`` (the honest ledger,
    summed over the cohort: each sparse model by its values plus the cheaper of a bitmap and
    indices, and ``d`` bits for each uploaded mask), ``paper_bits_up`` / ``paper_bits_down``
    (the paper's, values only: 32 bits per non-zero, summed), ``num_clients`` (int32),
    ``density`` (the participants' mean kernel density after the round) and ``pruned`` (the
    fraction of participants that pruned).

  References:
    Saeed Vahidian, Mahdi Morafah, Bill Lin (2021). Personalized Federated Learning by
      Structured and Unstructured Pruning under Data Heterogeneity. IEEE ICDCS Workshops 2021.
      arXiv:2105.00562.
    Tiansheng Huang, Shiwei Liu, Li Shen, Fengxiang He, Weiwei Lin, Dacheng Tao (2022).
      Achieving Personalized Federated Learning with Sparse Local Models. arXiv preprint.
      arXiv:2201.11380.

  Source for the team: seed 002 B.3 l. 877-881, hyper-parameters l. 559-561, 574; spec
  ``seed002.md`` §4.4.
  """
  return cohort_round(
      client_update(loss_fn, lr, accuracy_fn=accuracy_fn, epochs=epochs,
                    batch_size=batch_size, prune_rate=prune_rate,
                    target_sparsity=target_sparsity, acc_threshold=acc_threshold,
                    dist_threshold=dist_threshold, weight_decay=weight_decay, structure=structure, zigs=zigs,
                    client_optimizer=client_optimizer),
      cohort_size=cohort_size, sampler=sampler, weighting="uniform", aggregate=masked_mean,
      server_optimizer=server_optimizer)


def client_update(loss_fn: LossFn, lr: float | Schedule, *, accuracy_fn: Callable, epochs: int = 5,
                  batch_size: int = 128, prune_rate: float = 0.05,
                  target_sparsity: float = 0.5, acc_threshold: float = 0.5,
                  dist_threshold: float = 1e-4,
                  weight_decay: float = 0.0, structure: str = "unstructured",
                  zigs: zig.ZIGs | None = None, client_optimizer: Any = None) -> ClientUpdate:
  """Sub-FedAvg's client (its state: its mask, all ones at the start): masked SGD from
  ``m_k⊙w_t``, the pruning test, and the upload ``{"model": m_k⊙w_k, "mask": m_k}`` (for
  :func:`~fedjaxsparse.algorithms.cohort_round.masked_mean`). Its records: ``density`` (kernel
  density after the round), ``pruned`` (whether it pruned), the paper's values-only ledger
  (``paper_bits_up``/``paper_bits_down``, summed). Arguments as :func:`subfedavg`."""
  if structure not in STRUCTURES:
    raise ValueError(f"structure must be one of {STRUCTURES}, got {structure!r}.")
  if structure == "hybrid" and zigs is None:
    raise ValueError("structure='hybrid' needs zigs, the network's channel groups "
                     "(fedjaxsparse.pruning.zig.trace of a models.prunable network).")
  conv = zig.conv_groups(zigs) if zigs is not None else None
  check_lr(lr)
  check_number("prune_rate", prune_rate, 0.0, 1.0, low_open=True, high_open=True)
  check_number("target_sparsity", target_sparsity, 0.0, 1.0, high_open=True)
  check_number("acc_threshold", acc_threshold, 0.0, 1.0)
  check_number("dist_threshold", dist_threshold, 0.0, None)
  for name, v in (("epochs", epochs), ("batch_size", batch_size)):
    check_int(name, v, 1)
  grad = jax.grad(loss_fn)
  count = lambda m: nnz(jax.tree.map(lambda x: x.astype(jnp.int8), m))

  def init(key, params, n):
    del key
    return jax.tree.map(lambda a: jnp.ones((n,) + a.shape, bool), params)

  def update(key, w, mask, d, t):
    k_first, k_rest = jax.random.split(key)
    eta = at_round(lr, t)
    per_epoch = -(-d.mask.shape[0] // batch_size)          # the padded data's bound
    start = jax.tree.map(lambda m, a: jnp.where(m, a, jnp.zeros_like(a)), mask, w)
    sgd = dict(lr=eta, batch_size=batch_size, weight_decay=weight_decay, mask=mask,
               optimizer=at_round(client_optimizer, t))
    first = epoch_sgd(grad, start, k_first, d, epochs=1, max_steps=per_epoch, **sgd)
    trained = (epoch_sgd(grad, first, k_rest, d, epochs=epochs - 1,
                         max_steps=per_epoch * max(epochs - 1, 1), **sgd)
               if epochs > 1 else first)
    density = _kernel_density(mask)
    rate = jnp.clip((density - (1.0 - target_sparsity)) / density, 0.0, prune_rate)
    if structure == "hybrid":   # conv channels whole, dense kernels weight by weight
      m1, m2 = (_prune_layers(_prune_channels(mask, v, rate, zigs, conv), v, rate, max_ndim=2)
                for v in (first, trained))
    else:
      m1, m2 = (_prune_layers(mask, v, rate) for v in (first, trained))
    layers = [(a, b) for a, b in zip(jax.tree.leaves(m1), jax.tree.leaves(m2)) if a.ndim >= 2]
    dist = sum(jnp.mean(a != b) for a, b in layers) / max(len(layers), 1)
    pruned = jax.tree.map(lambda m, a: jnp.where(m, a, jnp.zeros_like(a)), m2, trained)
    acc = accuracy_fn(pruned, d.x, d.y, d.mask)
    prune = (dist > dist_threshold) & (rate > 0) & (acc > acc_threshold)
    new_mask = jax.tree.map(lambda a, b: jnp.where(prune, b, a), mask, m2)
    sent = jax.tree.map(lambda m, a: jnp.where(m, a, jnp.zeros_like(a)), new_mask, trained)
    dim = num_params(w)
    n_down, n_up = count(mask), count(new_mask)
    metrics = {"loss": loss_fn(start, d.x, d.y, d.mask),
               EXTRA_BITS_DOWN: accounting.sparse_bits(n_down, dim),
               "paper_bits_up": 32.0 * n_up.astype(float_dtype()),
               "paper_bits_down": 32.0 * n_down.astype(float_dtype()),
               "density": _kernel_density(new_mask), "pruned": prune.astype(float_dtype())}
    return {"model": sent, "mask": new_mask}, new_mask, metrics

  def upload_bits(message, params):   # the sparse model's values and positions, and the mask
    dim = num_params(params)
    return as_float(accounting.sparse_bits(count(message["mask"]), dim)) + dim

  return ClientUpdate(init, update, upload_bits=upload_bits,
                      download_bits=lambda params: as_float(0.0), info_type=SubFedAvgInfo,
                      summed=("paper_bits_up", "paper_bits_down"), state_type=FedSpaState)
