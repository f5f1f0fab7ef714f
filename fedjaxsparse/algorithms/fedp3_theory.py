"""Theoretical FedP3 with its sketches (the FedP3 paper's Global Pruning Sketch P and
Personalized Model Aggregation Sketch S), and LDP-FedP3, its differentially private variant.

References:
  Kai Yi, Nidham Gazagnadou, Peter Richtárik, Lingjuan Lyu (2024). FedP3: Federated
    Personalized and Privacy-friendly Network Pruning under Model Heterogeneity. ICLR 2024.
    arXiv:2404.09816.

Full participation, n clients, iteration k:

* server: ``P_i^k w^k`` to client i — P_i a *biased* random coordinate mask (the Global
  Pruning Sketch: keep each coordinate, no 1/c rescaling); ``prune=None`` is ``P_i = I``;
* client i: ``u_i = P_i w − γ P_i ∇f_i(P_i w)`` (``local_steps`` such steps; the theory: 1),
  on a minibatch of ``batch_size`` examples drawn without replacement (``None``: the full
  local gradient), each example's gradient clipped to norm ``clip`` if given (the paper's
  bounded-gradient assumption; it has no clipping step — a real guarantee needs one);
* LDP (``noise``): ``"model"`` adds ``ζ ~ N(0, σ²I)`` to ``u_i`` (LDP-FedP3's pseudocode,
  line 8); ``"update"`` adds it to the gradient step, ``u_i = w − γ(g_i − ζ)``, noise ``γσ``
  (the placement the proof of the paper's LDP-FedP3 convergence theorem uses);
* uplink ``v_i = S_i u_i``: the permutation sketch (the Personalized Model Aggregation
  Sketch; ``S_i = n·Diag(1[j ∈ block i])``, blocks of ``d/n`` coordinates under one random
  permutation per iteration shared by all clients), or ``sketch="identity"`` (``S_i = I``, the
  setting of the paper's global-pruning theorem);
* server: ``w^{k+1} = (1/n) Σ_i v_i`` — with the permutation sketch exactly a gather,
  ``w^{k+1}_j = u_{owner(j), j}``, d floats per iteration in total (DGD: n·d).

``block`` > 1 permutes whole blocks of coordinates (the layer-granular version: layers
zero-padded to a uniform size ``block``). The privacy accountant (:func:`ldp_epsilon`,
:func:`ldp_sigma`) is Google's ``dp_accounting`` RDP accountant for the Gaussian mechanism on
minibatches sampled without replacement, per client, with replace-one-example neighbours
(sensitivity 2C/b of the clipped mean gradient; the paper's σ² = cKC² log(1/δ)/(m²ε²) has
unknown constants c, c'); the paper's Rand-t compressor (t = d/n, ω = n − 1) is
:func:`fedjaxsparse.ops.compressors.rand_k`.

Source for the team: spec §A.6-§A.8, §0.1.8; seed 001, Algorithms 10-11, l. 1219-1225, 3051-3062,
3139-3226, 3428-3436. Dissertation numbering: Definitions 4.3.1 (P) and 4.3.2 (S), Theorems 4.3.3
(aggregation) and 4.3.4 (LDP), Assumption C.3.3, Theorem C.3.5, Table C.3.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from fedjaxsparse.algorithms.fedp3 import FedP3State
from fedjaxsparse.core import Algorithm, LossFn, as_float
from fedjaxsparse.data.federated import FederatedData, check_data
from fedjaxsparse.ops.sampling import client_keys
from fedjaxsparse.errors import check_int, check_number
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["permutation_owner", "permutation_sketch", "pruning_mask", "clipped_mean_grad",
           "TheoryInfo", "fedp3_theory", "theorem_433_step", "theorem_433_bound",
           "noise_multiplier", "ldp_epsilon", "ldp_sigma"]
__dir__ = _public_dir(__all__)

NOISES = (None, "model", "update")
SKETCHES = ("permutation", "identity")


def permutation_owner(key: jax.Array, d: int, n: int, block: int = 1) -> jax.Array:
  """``int32[d]``: the client owning each coordinate under the sketch S — a uniformly random
  permutation π of the ``d/block`` blocks, client i owning blocks ``π_{s(i−1)+1..si}``,
  ``s = d/(n·block)``. Needs ``d`` divisible by ``n·block``."""
  _check_permutation(d, n, block)
  return _permutation_owner(key, d, n, block)


def _check_permutation(d: int, n: int, block: int) -> None:
  if d % (n * block):
    raise ValueError(f"the permutation sketch needs d = s·n·block; d={d} is not divisible by "
                     f"n·block = {n}·{block} (zero-pad the model).")


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _permutation_owner(key: jax.Array, d: int, n: int, block: int) -> jax.Array:
  nb = d // block
  perm = jax.random.permutation(key, nb)
  owner_blocks = jnp.zeros(nb, jnp.int32).at[perm].set(jnp.arange(nb, dtype=jnp.int32)
                                                        // (nb // n))
  return jnp.repeat(owner_blocks, block)


def permutation_sketch(owner: jax.Array, i: Any, x: jax.Array, n: int) -> jax.Array:
  """``S_i x = n·x`` on client i's coordinates, 0 elsewhere."""
  return jnp.where(owner == i, n * x, jnp.zeros_like(x))


def pruning_mask(key: jax.Array, d: int, keep: float) -> jax.Array:
  """``bool[d]``: the diagonal of the global-pruning sketch P, each coordinate
  kept independently with probability ``keep`` (``c_j = keep``); ``E[P w] = keep·w`` —
  biased, the weights are not rescaled."""
  return jax.random.uniform(key, (d,)) < keep


def clipped_mean_grad(loss_fn: LossFn, params: Any, x: jax.Array, y: jax.Array,
                      mask: jax.Array, clip: float | None) -> Any:
  """``(1/b) Σ_j clip_C(∇ℓ_j)`` over the examples with ``mask`` 1 (``b`` = their count;
  ``clip=None``: no clipping, the plain mean gradient), ``clip_C(g) = g·min(1, C/‖g‖)``."""
  if clip is None:
    return jax.grad(loss_fn)(params, x, y, mask)
  one = lambda xi, yi: jax.grad(loss_fn)(params, xi[None], yi[None], jnp.ones((1,)))
  per = jax.vmap(one)(x, y)
  norms = jnp.sqrt(sum(jnp.sum(jnp.reshape(g, (g.shape[0], -1)) ** 2, axis=1)
                       for g in jax.tree.leaves(per)))
  scale = mask * jnp.minimum(1.0, clip / jnp.maximum(norms, 1e-30))
  b = jnp.maximum(jnp.sum(mask), 1.0)
  return jax.tree.map(lambda g: jnp.tensordot(scale, g, axes=1) / b, per)


class TheoryInfo(NamedTuple):
  """Per iteration: ``loss`` f(w^k) = mean_i f_i(w^k) on the full local data, ``grad_norm_sq``
  ‖∇f(w^k)‖², ``floats_up`` (uplink floats summed over clients: d with the permutation
  sketch, n·d without)."""
  loss: jax.Array
  grad_norm_sq: jax.Array
  floats_up: jax.Array


def fedp3_theory(loss_fn: LossFn, gamma: float, *, local_steps: int = 1,
                 prune: float | None = None, sketch: str = "permutation", block: int = 1,
                 batch_size: int | None = None, clip: float | None = None,
                 noise: str | None = None, sigma: float = 0.0) -> Algorithm:
  """Theoretical FedP3 and LDP-FedP3 (Yi, Gazagnadou, Richtárik and Lyu, 2024): the FedP3
  paper's analysed algorithm — global pruning sketches on the downlink, one local gradient
  step, a permutation sketch on the uplink — and, with ``noise``, its locally differentially
  private variant (Gaussian noise on each client's step).

  Full participation, n clients, iteration k, the model flattened to ``w ∈ ℝ^d``:

  * server → client i: ``P_i w^k``, P_i a biased random coordinate mask redrawn every
    iteration (the Global Pruning Sketch: each coordinate kept with probability ``prune``,
    no rescaling; ``prune=None`` is ``P_i = I``);
  * client i: ``u_i = P_i w − γ P_i ∇f_i(P_i w)`` (``local_steps`` such steps; the theory:
    1), on a minibatch of ``batch_size`` examples drawn without replacement (``None``: the
    full local gradient), each example's gradient clipped to norm ``clip`` if given (the
    paper assumes bounded gradients and has no clipping step; a real privacy guarantee
    needs one);
  * LDP-FedP3: ``noise="model"`` adds ``ζ ~ N(0, σ²I)`` to ``u_i`` after each step (the
    paper's LDP-FedP3 pseudocode); ``noise="update"`` adds it to the gradient,
    ``u_i = w − γ(g_i − ζ)``, noise ``γσ`` on the model (the placement its convergence
    proof uses);
  * client → server: ``v_i = S_i u_i``, with the permutation sketch (the Personalized Model
    Aggregation Sketch, ``S_i = n·Diag(1[j ∈ block i])``, blocks of ``d/n`` coordinates
    under one random permutation per iteration shared by all clients) or ``S_i = I``
    (``sketch="identity"``, the setting of the paper's global-pruning theorem);
  * server: ``w^{k+1} = (1/n) Σ_i v_i`` — with the permutation sketch exactly a gather,
    ``w^{k+1}_j = u_{owner(j), j}``: d floats uploaded per iteration in all (DGD: n·d).

  :func:`theorem_433_step` and :func:`theorem_433_bound` give the step size and the bound of
  the paper's Personalized Model Aggregation theorem; :func:`ldp_sigma` and
  :func:`ldp_epsilon` calibrate σ to a per-client (ε, δ) budget with an RDP accountant. See
  the module docstring (:mod:`fedjaxsparse.algorithms.fedp3_theory`) for the full story; the
  practical FedP3 (per-client layer subsets and pruning, cohorts, local training) is
  :func:`fedjaxsparse.algorithms.fedp3.fedp3`.

  Args:
    loss_fn: ``(params, x, y, mask) -> scalar`` of one client (``f_i`` its mean loss over
      the masked examples).
    gamma: the step size γ > 0 (:func:`theorem_433_step` gives the step of the
      Personalized Model Aggregation theorem).
    local_steps: local gradient steps per iteration (int ≥ 1; the theory: 1).
    prune: keep probability of each coordinate in the pruning sketch P_i, in (0, 1],
      redrawn every iteration for every client (``None``: ``P_i = I``, no pruning).
    sketch: the uplink sketch: ``"permutation"`` (the Personalized Model Aggregation Sketch
      S; needs ``d`` divisible by ``n·block``) or ``"identity"`` (``S_i = I``).
    block: coordinates per permuted block (int ≥ 1; > 1: layer-granular ownership, layers
      zero-padded to a uniform size ``block``).
    batch_size: b examples per local step, drawn without replacement (``None``: the full
      local gradient; at most the clients' padded size, a smaller client uses all its
      examples).
    clip: per-example gradient norm bound C (> 0; ``None``: no clipping).
    noise: where the Gaussian mechanism adds its noise: ``None`` (no noise, theoretical
      FedP3), ``"model"`` (on ``u_i``) or ``"update"`` (on the gradient) — LDP-FedP3.
    sigma: the noise's standard deviation σ ≥ 0 (unused with ``noise=None``; see
      :func:`ldp_sigma`).

  Returns:
    An :class:`~fedjaxsparse.core.Algorithm`: ``init(key, params, data)`` (``key`` unused;
    raises ``ValueError`` if the permutation sketch does not divide ``d`` or ``batch_size``
    exceeds the clients' padded size) returns a
    :class:`~fedjaxsparse.algorithms.fedp3.FedP3State`: ``state.params`` (the global model
    ``w^k``, the pytree ``params`` came as) and ``state.round`` (``int32``, iterations
    done); clients keep no state. ``step(key, state, data)`` returns ``(state, info)`` with a
    :class:`TheoryInfo` measured at ``w^k`` before the step: ``loss`` (``f(w^k) = mean_i
    f_i(w^k)`` on the full local data), ``grad_norm_sq`` (``‖∇f(w^k)‖²``) and ``floats_up``
    (floats uploaded, summed over the clients: d with the permutation sketch, n·d without).

  References:
    Kai Yi, Nidham Gazagnadou, Peter Richtárik, Lingjuan Lyu (2024). FedP3: Federated
      Personalized and Privacy-friendly Network Pruning under Model Heterogeneity. ICLR
      2024. arXiv:2404.09816.

  Source for the team: spec §A.6-§A.8, §0.1.8; seed 001, Algorithms 10-11, l. 1219-1225,
  3051-3062, 3139-3226, 3428-3436; Theorems 4.3.3 (aggregation) and 4.3.4 (LDP).
  """
  check_number("gamma", gamma, 0.0, None, low_open=True)
  check_number("sigma", sigma, 0.0, None)
  if prune is not None:
    check_number("prune", prune, 0.0, 1.0, low_open=True)
  if clip is not None:
    check_number("clip", clip, 0.0, None, low_open=True)
  if sketch not in SKETCHES:
    raise ValueError(f"sketch must be one of {SKETCHES}, got {sketch!r}.")
  if noise not in NOISES:
    raise ValueError(f"noise must be one of {NOISES}, got {noise!r}.")
  local_steps = check_int("local_steps", local_steps, 1)

  def init(key, params, data: FederatedData):
    del key
    check_data(data)
    d = ravel_pytree(params)[0].shape[0]
    if sketch == "permutation":
      _check_permutation(d, data.num_clients, block)
    if batch_size is not None and batch_size > data.max_examples:
      raise ValueError(f"batch_size must be <= the clients' padded size {data.max_examples}, "
                       f"got {batch_size} (a smaller client uses all its examples).")
    return FedP3State(params, jnp.zeros((), jnp.int32))

  def client(key, w_flat, unravel, data):
    k_prune, k_steps = jax.random.split(key)
    d = w_flat.shape[0]
    p = jnp.ones(d, bool) if prune is None else pruning_mask(k_prune, d, prune)
    u = jnp.where(p, w_flat, 0.0)
    for s, k in enumerate(jax.random.split(k_steps, local_steps)):
      k_batch, k_noise = jax.random.split(k)
      if batch_size is None:
        x, y, m = data.x, data.y, data.mask
      else:
        scores = jnp.where(data.mask > 0, jax.random.uniform(k_batch, data.mask.shape), -1.0)
        idx = jax.lax.top_k(scores, batch_size)[1]
        x, y, m = data.x[idx], data.y[idx], data.mask[idx]
      g = ravel_pytree(clipped_mean_grad(loss_fn, unravel(u), x, y, m, clip))[0]
      g = jnp.where(p, g, 0.0)
      zeta = (sigma * jax.random.normal(k_noise, (d,), u.dtype) if noise is not None
              else jnp.zeros(d, u.dtype))   # the model's dtype (float32 under x64 too)
      u = u - gamma * (g - zeta) if noise == "update" else u - gamma * g + zeta
    return u

  def step(key, state, data: FederatedData):
    n = data.num_clients
    w_flat, unravel = ravel_pytree(state.params)
    d = w_flat.shape[0]
    k_perm, k_clients = jax.random.split(key)
    rows = jax.vmap(lambda k, dt: client(k, w_flat, unravel, dt))(
        client_keys(k_clients, jnp.arange(n)), data)
    f = lambda v: jnp.mean(jax.vmap(lambda dt: loss_fn(unravel(v), dt.x, dt.y, dt.mask))(data))
    loss, grad = jax.value_and_grad(f)(w_flat)
    if sketch == "permutation":
      owner = permutation_owner(k_perm, d, n, block)
      new = jnp.sum(jax.vmap(lambda i, u: permutation_sketch(owner, i, u, n))(
          jnp.arange(n), rows), axis=0) / n
      up = as_float(d)
    else:
      new, up = jnp.mean(rows, axis=0), as_float(n * d)
    return FedP3State(unravel(new), state.round + 1), TheoryInfo(loss, jnp.sum(grad ** 2), up)

  return Algorithm(init, step)


def theorem_433_step(l_bar: float, l_max: float, num_iters: int) -> float:
  """The γ = min{1/L_max, 1/√(L̄ L_max K)} of the Personalized Model Aggregation theorem
  (the paper's "{…}" read as min, its L̂ as L̄)."""
  return min(1.0 / l_max, 1.0 / (l_bar * l_max * num_iters) ** 0.5)


def theorem_433_bound(delta0: float, gamma: float, l_bar: float, l_max: float,
                      num_iters: int) -> float:
  """The bound of the Personalized Model Aggregation theorem on ``min_{k<K} E‖∇f(w^k)‖²``:
  ``2(1 + L̄ L_max γ²)^K Δ_0/(γK)``."""
  return 2.0 * (1.0 + l_bar * l_max * gamma ** 2) ** num_iters * delta0 / (gamma * num_iters)


def noise_multiplier(sigma: float, clip: float, batch_size: int, gamma: float,
                     noise: str) -> float:
  """σ over the replace-one L2 sensitivity of what one step releases: the clipped mean
  gradient ḡ moves by at most ``2C/b`` when one example is replaced, so the model placement
  (noise σ on ``w − γḡ``) has multiplier ``σb/(2γC)`` and the update one (noise γσ on γḡ)
  ``σb/(2C)``."""
  if noise not in ("model", "update"):
    raise ValueError(f"noise must be 'model' or 'update', got {noise!r}.")
  return sigma * batch_size / (2.0 * clip * (gamma if noise == "model" else 1.0))


@contextlib.contextmanager
def _quiet_accountant():
  """dp_accounting logs a warning per RDP order it drops; keep them out of experiment logs."""
  from absl import logging as absl_logging  # deferred: absl (with dp-accounting) is slow to import
  level = absl_logging.get_verbosity()
  absl_logging.set_verbosity(absl_logging.ERROR)
  try:
    yield
  finally:
    absl_logging.set_verbosity(level)


def _event(multiplier: float, dataset_size: int, batch_size: int, steps: int):
  import dp_accounting  # deferred: dp-accounting is slow to import
  return dp_accounting.SelfComposedDpEvent(dp_accounting.SampledWithoutReplacementDpEvent(
      dataset_size, batch_size, dp_accounting.GaussianDpEvent(multiplier)), steps)


def _accountant():
  import dp_accounting  # deferred: dp-accounting is slow to import
  return dp_accounting.rdp.RdpAccountant(
      neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)


def ldp_epsilon(multiplier: float, dataset_size: int, batch_size: int, steps: int,
                delta: float) -> float:
  """ε of one client's (ε, δ)-LDP (replace-one neighbours) after ``steps`` Gaussian steps of
  noise ``multiplier``, each on a minibatch of ``batch_size`` of its ``dataset_size`` examples
  drawn without replacement — the sampling the algorithm does (``dp_accounting``'s RDP
  accountant; ``steps`` counts every noisy local step: iterations × ``local_steps``)."""
  check_number("delta", delta, 0.0, 1.0, low_open=True, high_open=True)
  if not 1 <= batch_size <= dataset_size:
    raise ValueError(f"batch_size must lie in [1, dataset_size={dataset_size}], got "
                     f"{batch_size}.")
  event = _event(float(multiplier), int(dataset_size), int(batch_size), int(steps))
  return _event_epsilon(event, float(delta))


@functools.lru_cache(maxsize=1024)
def _event_epsilon(event, delta: float) -> float:
  """ε at ``delta`` of a DP event on a fresh RDP accountant (a pure function of the event, an
  immutable value: cached, as a study asks for the same event again)."""
  with _quiet_accountant():
    return float(_accountant().compose(event).get_epsilon(delta))


def ldp_sigma(epsilon: float, delta: float, steps: int, dataset_size: int, clip: float,
              batch_size: int, gamma: float, noise: str) -> float:
  """The σ that makes ``steps`` noisy steps (ε, δ)-LDP per client (inverts
  :func:`ldp_epsilon` by bisection on the noise multiplier)."""
  check_number("epsilon", epsilon, 0.0, None, low_open=True)
  z = _calibrated_multiplier(float(epsilon), float(delta), int(steps), int(dataset_size),
                             int(batch_size))
  return z / noise_multiplier(1.0, clip, batch_size, gamma, noise)


@functools.lru_cache(maxsize=256)
def _calibrated_multiplier(epsilon: float, delta: float, steps: int, dataset_size: int,
                           batch_size: int) -> float:
  """The noise multiplier of :func:`ldp_sigma` (a pure function of its arguments, cached: the
  RDP accountant's bisection takes seconds, and a tuning grid over γ or a second seed asks
  for the same ε again)."""
  import dp_accounting  # deferred: dp-accounting is slow to import
  with _quiet_accountant():
    return float(dp_accounting.calibrate_dp_mechanism(
        _accountant, lambda m: _event(m, dataset_size, batch_size, steps), epsilon, delta,
        bracket_interval=dp_accounting.mechanism_calibration.LowerEndpointAndGuess(0.05, 1.0)))
