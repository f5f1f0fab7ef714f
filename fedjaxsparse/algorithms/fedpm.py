"""FedPM: federated *probabilistic masks* over frozen random weights — the mask is the model.

References:
  Berivan Isik, Francesco Pase, Deniz Gündüz, Tsachy Weissman, Michele Zorzi (2023). Sparse
    Random Networks for Communication-Efficient Federated Learning. ICLR 2023.
    arXiv:2209.15328.
  Shiwei Li, Yingyi Cheng, Haozhao Wang, Xing Tang, Shijie Xu, Weihong Luo, et al. (2024).
    Masked Random Noise for Communication-Efficient Federated Learning. ACM Multimedia 2024.
    arXiv:2408.03220.

Every client shares the frozen random weights ``W₀`` (one seed) and the server keeps mask
probabilities ``θ`` (one per weight). Round t: each participant trains scores ``s`` from
``logit(θ^t)`` by epoch-based SGD with the forward model ``W₀ ⊙ m``, ``m ~ Bernoulli(σ(s))``
drawn afresh each step, the gradient passed straight through the sampling to the probability
(``∂L/∂s = ∂L/∂m · σ′(s)``), then uploads one sampled mask ``m_k ~ Bernoulli(σ(s_k))``: d bits.
The server averages the masks, ``θ^{t+1} = clip(mean_k m_k, ε, 1 − ε)`` (the plain mean of the
FedMRN paper (Li et al., 2024), where FedPM is a baseline, with its sum over the participants;
FedPM's Bayesian aggregation is not in that paper) — clipped because ``logit(0 or 1) = ∓∞``.

The deployed model (:attr:`FedPMState.params`) is ``W₀ ⊙ 1[θ ≥ ½]``, the most likely mask (the
FedMRN paper does not say which mask it evaluates).

Source for the team: seed 003's model-compression baseline; spec ``seed000_003.md`` B.5.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedjaxsparse.ops import accounting
from fedjaxsparse.runtime.clients import map_clients
from fedjaxsparse.core import Algorithm, LossFn, as_float, float_dtype
from fedjaxsparse.data.federated import FederatedData, check_data
from fedjaxsparse.ops.noise_masks import tree_map_keyed
from fedjaxsparse.ops.sampling import check_cohort_size, client_keys, sample_cohort
from fedjaxsparse.ops.local import epoch_loop, max_local_steps
from fedjaxsparse.errors import check_number



class FedPMState(NamedTuple):
  """Attributes: ``weights`` (W₀, frozen), ``theta`` (mask probabilities), ``round``."""
  weights: Any
  theta: Any
  round: jax.Array

  @property
  def params(self):
    return jax.tree.map(lambda w, t: w * (t >= 0.5), self.weights, self.theta)


class FedPMInfo(NamedTuple):
  """Per round: ``loss`` (mean participant loss of the deployed model), ``bits_up`` (d per
  upload), ``bits_down`` (32·d for θ), ``num_clients``, ``density`` (mean θ)."""
  loss: jax.Array
  bits_up: jax.Array
  bits_down: jax.Array
  num_clients: jax.Array
  density: jax.Array


def fedpm(loss_fn: LossFn, lr: float, *, epochs: int = 1, batch_size: int = 64,
          cohort_size: int | None = None, clip: float = 1e-3) -> Algorithm:
  """FedPM; ``init(key, params, data)`` takes ``params`` as the frozen random weights W₀.

  Args:
    loss_fn: ``(params, x, y, mask) -> F_k`` of one client.
    lr: SGD step on the scores.
    epochs, batch_size: epoch-based local training (as FedMRN's).
    cohort_size: clients per round (``None``: all).
    clip: ε of ``θ ∈ [ε, 1 − ε]``.
  """
  check_number("lr", lr, 0.0, None, low_open=True)
  check_number("clip", clip, 0.0, 0.5, low_open=True, high_open=True)

  def init(key, params, data: FederatedData) -> FedPMState:
    del key
    check_data(data)
    check_cohort_size(cohort_size, data.num_clients)
    return FedPMState(params, jax.tree.map(lambda w: jnp.full(w.shape, 0.5, w.dtype), params),
                      jnp.zeros((), jnp.int32))

  def masked_loss(s, w0, key, x, y, m):
    def sample(k, si):  # straight-through Bernoulli: forward m, gradient as if m = σ(s)
      p = jax.nn.sigmoid(si)
      b = jax.random.bernoulli(k, p).astype(si.dtype)
      return p + jax.lax.stop_gradient(b - p)
    mask = tree_map_keyed(sample, key, s)
    return loss_fn(jax.tree.map(jnp.multiply, w0, mask), x, y, m)

  grad = jax.grad(masked_loss)

  def client(w0, s0, max_steps, key, d):
    k_order, k_masks, k_final = jax.random.split(key, 3)

    def update(t, s, batch):
      g = grad(s, w0, jax.random.fold_in(k_masks, t), *batch)
      return jax.tree.map(lambda si, gi: si - lr * gi, s, g)

    s = epoch_loop(update, s0, k_order, d, batch_size, epochs, max_steps)
    return tree_map_keyed(lambda k, si: jax.random.bernoulli(k, jax.nn.sigmoid(si)).astype(
        jnp.int8), k_final, s)

  def step(key, state: FedPMState, data: FederatedData):
    k_cohort, k_train = jax.random.split(key)
    ids = sample_cohort(k_cohort, data.num_clients, cohort_size)
    cdata = data if ids.shape[0] == data.num_clients else data.select(ids)
    s0 = jax.tree.map(lambda t: jnp.log(t) - jnp.log1p(-t), state.theta)
    max_steps = max_local_steps(data, batch_size, epochs)
    masks = map_clients(lambda k, d: client(state.weights, s0, max_steps, k, d), cdata,
                        client_keys(k_train, ids))
    theta = jax.tree.map(lambda m, t: jnp.clip(jnp.mean(m.astype(t.dtype), 0), clip, 1 - clip),
                         masks, state.theta)
    new = FedPMState(state.weights, theta, state.round + 1)
    losses = map_clients(lambda d: loss_fn(new.params, d.x, d.y, d.mask), cdata)
    d = sum(int(a.size) for a in jax.tree.leaves(state.weights))
    c = ids.shape[0]
    leaves = jax.tree.leaves(theta)
    density = sum(jnp.sum(t) for t in leaves) / d
    return new, FedPMInfo(jnp.mean(losses), as_float(c * d),
                          as_float(c * accounting.dense_bits(d)), jnp.int32(c),
                          density.astype(float_dtype()))

  return Algorithm(init, step)
