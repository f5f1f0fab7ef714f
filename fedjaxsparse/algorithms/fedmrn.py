"""FedMRN / FedMRNS: clients learn 1-bit masks over seeded random noise during local training, so
the uplink is d bits plus one seed.

References:
  Shiwei Li, Yingyi Cheng, Haozhao Wang, Xing Tang, Shijie Xu, Weihong Luo, et al. (2024).
    Masked Random Noise for Communication-Efficient Federated Learning. ACM Multimedia 2024.
    arXiv:2408.03220.

Round t: the server samples a cohort (K of N, uniform without replacement, or any
:class:`fedjaxsparse.ops.sampling.Sampler`) and broadcasts ``w^t`` (dense). Client k draws its
noise ``n_k = G(s_k^t)`` (seed = ``fold_in(round noise key, client id)``, fresh per client and
round), starts from ``u = 0`` and runs epoch-based SGD — E epochs of minibatches of B without
replacement, ``S_k = E·⌈n_k/B⌉`` steps (each client its own count,
:func:`fedjaxsparse.ops.local.epoch_loop`) — where step τ evaluates the gradient at the progressively masked
update

    û = (1 − P)⊙clip(u, n_k) + P⊙n_k⊙M(u, n_k),   P ~ Bernoulli((τ + 1)/S_k)      (PSM, eq. 10)

and applies it to u (straight-through, eq. 9): ``u ← u − η ∇_û F_k(w^t + û)``. It uploads the
mask ``m_k = M(u, n_k)`` (a fresh SM draw, no PM) and its seed; the server regenerates ``n_k``
from the seed and sets ``w^{t+1} = w^t + Σ_k p'_k n_k⊙m_k`` with data-size weights
``p'_k = n_k/Σ_{j∈C_t} n_j`` renormalised over the participants (eq. 5).

``signed=True`` is FedMRNS ({−1, +1} masks; the paper's noise ±5e-3 instead of ±1e-2). The
ablations of B.8 are options, not copies: ``stochastic=False`` (w/o SM: DM instead of M),
``progressive=False`` (w/o PM: P ≡ 1), both (w/o PSM), ``masking="post"`` (FedAvg w. SM: plain
local SGD, then one SM of the final update) and ``masking="none"`` (the FedAvg backbone: the
dense update u is sent, 32 bits per entry, or compressed once by ``uplink``).

``server_sparsity`` (a schedule ``round -> s_t``, e.g. :func:`fedjaxsparse.ops.sparsity.gmp_sparsity`)
is FedSparsify as seed 000 describes it (l. 108-111, Stripelis et al. 2022): gradual magnitude
pruning at the server, ``w^{t+1} ← MagPrune(w^t + Δ, s_t)`` after every aggregation; the
clients train dense from the pruned model (pruned weights may regrow and are pruned again —
the literal server-side reading; Stripelis et al. also freeze the mask on the clients, which
this option does not) and the downlink is charged by the pruned model's non-zeros.

Messages are *updates* (``u`` or ``n⊙m``), added to ``w^t`` — not models.

Source for the team: seed 003 Algorithm 1; spec ``seed000_003.md`` B.0–B.2, B.8.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from fedjaxsparse.ops import accounting
from fedjaxsparse.ops import noise_masks as M
from fedjaxsparse.ops.aggregation import client_weights
from fedjaxsparse.runtime.clients import map_clients
from fedjaxsparse.core import Algorithm, LossFn, as_float, float_dtype
from fedjaxsparse.data.federated import FederatedData, check_data
from fedjaxsparse.ops.sparsity import magnitude_prune, top_k
from fedjaxsparse.ops.sampling import check_cohort_size, client_keys, sample_cohort
from fedjaxsparse.ops.local import epoch_loop, epoch_steps, max_local_steps
from fedjaxsparse.errors import check_number

MASKINGS = ("learned", "post", "none")


class FedMRNState(NamedTuple):
  """Attributes: ``params`` (w^t), ``round``."""
  params: Any
  round: jax.Array


class FedMRNInfo(NamedTuple):
  """Per round: ``loss`` (participants' data-weighted loss at w^t), ``bits_up`` (d + seed
  bits per masked upload, 32·d dense), ``bits_down`` (32·d per participant),
  ``num_clients``, ``ones`` (fraction of mask entries equal to 1; NaN-free, 0 without
  masks), ``update_linf`` (‖w^{t+1} − w^t‖_∞)."""
  loss: jax.Array
  bits_up: jax.Array
  bits_down: jax.Array
  num_clients: jax.Array
  ones: jax.Array
  update_linf: jax.Array


def _flat_size(tree) -> int:
  return sum(int(a.size) for a in jax.tree.leaves(tree))


def fedmrn(loss_fn: LossFn, lr: float, *, epochs: int = 1, batch_size: int = 64,
           cohort_size: int | None = None, noise_scale: float = 1e-2,
           distribution: str = "uniform", signed: bool = False, stochastic: bool = True,
           progressive: bool = True, masking: str = "learned", uplink: Any = None,
           prune_to: int | None = None,
           server_sparsity: Callable[[jax.Array], Any] | None = None) -> Algorithm:
  """FedMRN (``signed=False``) / FedMRNS (``signed=True``); see the module docstring.

  Args:
    loss_fn: ``(params, x, y, mask) -> F_k`` of one client (mean over the masked examples).
    lr: local SGD step η.
    epochs: local epochs E; batch_size: B (the paper: 10 epochs of 64).
    cohort_size: K clients per round (``None``: all).
    noise_scale: α of the noise (uniform on [−α, α]; paper: 1e-2 FedMRN, 5e-3 FedMRNS).
    distribution: ``"uniform"``, ``"gaussian"`` (std α) or ``"bernoulli"`` (±α).
    stochastic, progressive, masking: the ablations (module docstring).
    uplink: with ``masking="none"``, a :class:`fedjaxsparse.ops.compressors.Compressor` applied
      once to each client's final update before upload (the post-training compressors of
      seed 003's baselines: SignSGD, TernGrad, DRIVE, EDEN, top-k), charged ``uplink.bits(d)``.
    prune_to: with ``masking="none"``, FedSparsify as seed 003 uses it — magnitude pruning
      during local training: after every local step the local model ``w + u`` is pruned to its
      ``prune_to`` largest magnitudes (global Top-K; 97 % sparsity in the paper, schedule
      unspecified there), and the pruned *model* is uploaded (the server's data-weighted
      average of the pruned models); charged by its non-zeros under the cheapest encoding
      (the paper counts the values only). Seed 000's server-side gradual pruning is another
      method of that name: ``server_sparsity``.
    server_sparsity: ``round -> sparsity in [0, 1)``, traceable: the server prunes the new
      global model to it by global magnitude (seed 000's FedSparsify, module docstring).
  """
  if prune_to is not None and (masking != "none" or uplink is not None):
    raise ValueError("prune_to (FedSparsify) needs masking='none' and no uplink.")
  if uplink is not None and masking != "none":
    raise ValueError("uplink (a post-training compressor) needs masking='none'.")
  check_number("lr", lr, 0.0, None, low_open=True)
  check_number("noise_scale", noise_scale, 0.0, None, low_open=True)
  for name, v in (("epochs", epochs), ("batch_size", batch_size)):
    if not isinstance(v, int) or v < 1:
      raise ValueError(f"{name} must be an int >= 1, got {v!r}.")
  if masking not in MASKINGS:
    raise ValueError(f"masking must be one of {MASKINGS}, got {masking!r}.")
  if distribution not in M.DISTRIBUTIONS:
    raise ValueError(f"distribution must be one of {M.DISTRIBUTIONS}, got {distribution!r}.")
  grad = jax.grad(lambda v, w, x, y, m: loss_fn(jax.tree.map(jnp.add, w, v), x, y, m))

  def init(key, params, data: FederatedData) -> FedMRNState:
    del key
    check_data(data)
    check_cohort_size(cohort_size, data.num_clients)
    return FedMRNState(params, jnp.zeros((), jnp.int32))

  def mask_of(key, u, noise):
    """The uploaded mask M(u, n) (or DM without SM), int8."""
    def one(k, ui, ni):
      m = (M.stochastic_mask(k, ui, ni, signed) if stochastic
           else M.deterministic_mask(ui, ni, signed))
      return m.astype(jnp.int8)
    return M.tree_map_keyed(one, key, u, noise)

  def client(w, max_steps, k_noise, k_train, d):
    noise = M.tree_noise(k_noise, w, noise_scale, distribution)
    k_order, k_psm, k_final = jax.random.split(k_train, 3)
    s_k = epoch_steps(d.num_examples, batch_size, epochs)

    def update(t, u, batch):
      if masking == "learned":
        p = M.pm_probability(t, s_k) if progressive else 1.0
        at = M.tree_map_keyed(
            lambda k, ui, ni: M.progressive(k, ui, ni, p, signed, stochastic),
            jax.random.fold_in(k_psm, t), u, noise)
      else:
        at = u
      new = jax.tree.map(lambda ui, gi: ui - lr * gi, u, grad(at, w, *batch))
      if prune_to is not None:  # u such that w + u is the pruned local model
        new = jax.tree.map(jnp.subtract, top_k(jax.tree.map(jnp.add, w, new), prune_to), w)
      return new

    u = epoch_loop(update, jax.tree.map(jnp.zeros_like, w), k_order, d, batch_size, epochs,
                   max_steps)
    message = u if masking == "none" else mask_of(k_final, u, noise)
    return message, loss_fn(w, d.x, d.y, d.mask)

  def step(key, state: FedMRNState, data: FederatedData):
    k_cohort, k_noise, k_train = jax.random.split(key, 3)
    ids = sample_cohort(k_cohort, data.num_clients, cohort_size)
    cdata = data if ids.shape[0] == data.num_clients else data.select(ids)
    max_steps = max_local_steps(data, batch_size, epochs)  # a static bound on S_k
    w = state.params
    noise_keys = client_keys(k_noise, ids)
    messages, losses = map_clients(
        lambda kn, kt, d: client(w, max_steps, kn, kt, d), cdata, noise_keys,
        client_keys(k_train, ids))
    p = client_weights(cdata.num_examples, "num_examples")
    d = _flat_size(w)
    c = ids.shape[0]
    if masking == "none" and prune_to is not None:  # pruned models are sent
      updates, ones = messages, as_float(0)
      models = jax.tree.map(jnp.add, jax.tree.map(lambda a: a[None], w), messages)
      up = jnp.sum(jax.vmap(lambda m: accounting.message_bits(m))(models))
    elif masking == "none" and uplink is None:
      updates, ones = messages, as_float(0)
      up = as_float(c * accounting.dense_bits(d))
    elif masking == "none":
      k_up = jax.random.fold_in(k_train, 1)
      updates = jax.vmap(uplink.compress)(client_keys(k_up, ids), messages)
      ones, up = as_float(0), as_float(c * uplink.bits(d))
    else:  # the server regenerates each participant's noise from its seed
      noises = jax.vmap(lambda k: M.tree_noise(k, w, noise_scale, distribution))(noise_keys)
      updates = jax.tree.map(lambda n, m: n * m.astype(n.dtype), noises, messages)
      ones = sum(jnp.sum(m == 1) for m in jax.tree.leaves(messages)) / as_float(c * d)
      up = as_float(c * accounting.mask_bits(d, with_seed=True))
    delta = jax.tree.map(lambda v: jnp.tensordot(p.astype(v.dtype), v, axes=1), updates)
    linf = jnp.max(jnp.stack([jnp.max(jnp.abs(v)) for v in jax.tree.leaves(delta)]))
    new = jax.tree.map(jnp.add, w, delta)
    if server_sparsity is None:
      down = as_float(c * accounting.dense_bits(d))
    else:
      new = magnitude_prune(new, server_sparsity(state.round))
      down = c * accounting.message_bits(w).astype(float_dtype())  # the pruned w^t is sent
    info = FedMRNInfo(jnp.dot(p, losses), up, down, jnp.int32(c), ones.astype(float_dtype()),
                      linf)
    return FedMRNState(new, state.round + 1), info

  return Algorithm(init, step)
