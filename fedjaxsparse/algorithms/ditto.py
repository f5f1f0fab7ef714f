"""Ditto (Li et al. 2021) and Local, the personalised dense baselines of seed 002.

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
    locally updated ``w_k`` (``"updated"``; seed 002's prose allows either). Non-sampled
    clients' ``v_k`` do not change; ``v_k`` starts at ``w_0``.

The paper: λ = 0.5, 2 global + 3 personal epochs (5 in all, like the other methods). ``Local``
is :func:`local`: no global part and λ = 0 — each sampled client trains its own model for
``epochs`` epochs, nothing is sent. Evaluation uses the personal models
(:attr:`DittoState.personal`).

Source for the team: B.3 l. 853-875; spec ``seed002.md`` §4.2-4.3.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedjaxsparse.ops import accounting
from fedjaxsparse.runtime import cohort as cohorts
from fedjaxsparse.runtime.clients import map_clients
from fedjaxsparse.core import Algorithm, LossFn, as_float, float_dtype
from fedjaxsparse.data.federated import FederatedData, check_data
from fedjaxsparse.ops.local import epoch_sgd, max_local_steps
from fedjaxsparse.ops.sampling import check_cohort_size, client_keys
from fedjaxsparse.errors import check_number

CENTRES = ("received", "updated")


class DittoState(NamedTuple):
  """Attributes: ``params`` (the global ``w_t``), ``personal`` (``v_k``, leaves ``[N, ...]``),
  ``round``."""
  params: Any
  personal: Any
  round: jax.Array


class DittoInfo(NamedTuple):
  """Per round: ``loss`` (the cohort's mean loss of its personal models before training),
  ``bits_up``, ``bits_down`` (dense fp32 models, 0 for Local), ``num_clients``."""
  loss: jax.Array
  bits_up: jax.Array
  bits_down: jax.Array
  num_clients: jax.Array


def ditto(loss_fn: LossFn, lr: float, *, lam: float = 0.5, global_epochs: int = 2,
          personal_epochs: int = 3, batch_size: int = 128, cohort_size: int | None = 10,
          prox_centre: str = "received", lr_decay: float = 1.0, weight_decay: float = 0.0,
          weighting: str = "uniform", sampler: Any = None) -> Algorithm:
  """Ditto; see the module docstring. ``global_epochs=0`` skips the global part (then nothing
  is communicated and ``w`` never changes: :func:`local` with ``lam=0``). ``η_t = lr·lr_decay^t``.

  ``sampler``: any :class:`fedjaxsparse.ops.sampling.Sampler` drawing the cohort instead of a
  uniform one of ``cohort_size`` (give ``cohort_size=None`` with it); ``weighting="sampling"``
  then aggregates the global updates with its unbiased weights ``1/(n p_i)``, so the expected
  global step is the full-participation one (:mod:`fedjaxsparse.runtime.cohort`).
  """
  check_number("lr", lr, 0.0, None, low_open=True)
  check_number("lam", lam, 0.0, None)
  check_number("lr_decay", lr_decay, 0.0, 1.0, low_open=True)
  check_number("weight_decay", weight_decay, 0.0, None)
  for name, v, low in (("global_epochs", global_epochs, 0),
                       ("personal_epochs", personal_epochs, 1), ("batch_size", batch_size, 1)):
    if not isinstance(v, int) or v < low:
      raise ValueError(f"{name} must be an int >= {low}, got {v!r}.")
  if prox_centre not in CENTRES:
    raise ValueError(f"prox_centre must be one of {CENTRES}, got {prox_centre!r}.")
  cohorts.check_options(cohort_size, sampler, weighting)
  grad = jax.grad(loss_fn)

  def init(key, params, data: FederatedData) -> DittoState:
    del key
    check_data(data)
    check_cohort_size(cohort_size, data.num_clients)
    personal = jax.tree.map(lambda a: jnp.broadcast_to(a, (data.num_clients,) + a.shape),
                            params)
    return DittoState(params, personal, jnp.zeros((), jnp.int32))

  def client(w, v, eta, key, d, steps_g, steps_p):
    k_global, k_personal, _ = jax.random.split(key, 3)  # k_global as FedSpa's order key
    loss = loss_fn(v, d.x, d.y, d.mask)
    sgd = dict(lr=eta, batch_size=batch_size, weight_decay=weight_decay)
    if global_epochs:
      w_k = epoch_sgd(grad, w, k_global, d, epochs=global_epochs, max_steps=steps_g, **sgd)
    else:
      w_k = w
    centre = w if prox_centre == "received" else w_k
    v_new = epoch_sgd(grad, v, k_personal, d, epochs=personal_epochs, max_steps=steps_p,
                      prox=(lam, centre), **sgd)
    return jax.tree.map(jnp.subtract, w, w_k), v_new, loss

  def step(key, state: DittoState, data: FederatedData):
    k_cohort, k_train = jax.random.split(key)
    cohort = cohorts.draw(k_cohort, data, cohort_size, sampler)
    ids, cdata = cohort.ids, cohort.data
    w, t = state.params, state.round
    eta = lr * as_float(lr_decay) ** t.astype(float_dtype())
    steps_g = max_local_steps(data, batch_size, max(global_epochs, 1))
    steps_p = max_local_steps(data, batch_size, personal_epochs)
    v_old = jax.tree.map(lambda a: a[ids], state.personal)
    updates, v_new, losses = map_clients(
        lambda v, k, d: client(w, v, eta, k, d, steps_g, steps_p), cdata, v_old,
        client_keys(k_train, ids))
    s = ids.shape[0]
    if sampler is None and weighting == "uniform":
      p = jnp.full((s,), 1.0 / s)
    else:
      p = cohorts.weights(cohort, weighting)
    new_w = jax.tree.map(lambda a, u: a - jnp.tensordot(p.astype(u.dtype), u, axes=1), w,
                         updates)
    # padding entries of a sampler's cohort repeat a member (same key and data: same v_new)
    personal = jax.tree.map(lambda all_, new: all_.at[ids].set(new), state.personal, v_new)
    size = cohort.size
    bits = size * as_float(accounting.dense_bits(w) if global_epochs else 0.0)
    loss = jnp.sum(cohort.member * losses) / size
    info = DittoInfo(loss, bits, bits, size.astype(jnp.int32))
    return DittoState(new_w, personal, t + 1), info

  return Algorithm(init, step)


def local(loss_fn: LossFn, lr: float, *, epochs: int = 5, batch_size: int = 128,
          cohort_size: int | None = 10, lr_decay: float = 1.0,
          weight_decay: float = 0.0) -> Algorithm:
  """Local (seed 002 B.3 l. 870-875): each round S sampled clients train their own models for
  ``epochs`` epochs; no communication. :func:`ditto` with no global part and λ = 0."""
  return ditto(loss_fn, lr, lam=0.0, global_epochs=0, personal_epochs=epochs,
               batch_size=batch_size, cohort_size=cohort_size, lr_decay=lr_decay,
               weight_decay=weight_decay)
