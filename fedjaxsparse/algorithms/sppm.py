"""Cohort-Squeeze: stochastic proximal point with arbitrary cohort sampling, and its relatives.

References:
  Kai Yi, Timur Kharisov, Igor Sokolov, Peter Richtárik (2024). Cohort Squeeze: Beyond a
    Single Communication Round per Cohort in Cross-Device Federated Learning. FL@FM-NeurIPS'24
    workshop (oral). arXiv:2406.01115.
  Tian Li, Anit Kumar Sahu, Manzil Zaheer, Maziar Sanjabi, Ameet Talwalkar, Virginia Smith
    (2020). Federated Optimization in Heterogeneous Networks. MLSys 2020. arXiv:1812.06127.
  Sashank J. Reddi, Zachary Charles, Manzil Zaheer, Zachary Garrett, Keith Rush, Jakub
    Konečný, Sanjiv Kumar, H. Brendan McMahan (2021). Adaptive Federated Optimization. ICLR
    2021. arXiv:2003.00295.
  Sai Praneeth Karimireddy, Martin Jaggi, Satyen Kale, Mehryar Mohri, Sashank J. Reddi,
    Sebastian U. Stich, Ananda Theertha Suresh (2020). Mime: Mimicking Centralized Stochastic
    Algorithms in Federated Learning. arXiv:2008.03606.

**SPPM-AS** (Yi et al. (2024), with its FL form) — :func:`sppm_as`. Each global round the
server samples a cohort ``S ~ 𝒮`` (any :class:`fedjaxsparse.ops.sampling.Sampler`), broadcasts
``x_t``, and the cohort computes

    x_{t+1} ≈ prox_{γ f_S}(x_t) = argmin_z  Σ_{i∈S} f_i(z)/(n p_i) + ‖z − x_t‖²/(2γ)

with a prox solver 𝒜 (:mod:`fedjaxsparse.convex.prox_solvers`) run for K iterations from z₀ = x_t,
each iteration one *local communication round* of the cohort (clients ↔ hub). Clients are
stateless. Special cases: full sampling → **PPM**; one client per round (uniform/nonuniform
sampling) → **SPPM**; the solver ``gd(η, 1)`` → **MB-GD** ``x_t − η ∇f_S(x_t)`` (tested).

**Cohort averages of per-client proxes** — :func:`cohort_average`: K local rounds of
``x_{k+1} = mean_{i∈S} argmin_z ψ_{i,k}(z)`` with
``ψ_{i,k}(z) = f_i(z) [+ ‖z − x_k‖²/(2α)] [+ ‖z − x_{0,t}‖²/(2γ)]``:
**FedProx-SPPM-AS** (the x_k term with α = γ), **FedAvg-SPPM-AS** (as we read the paper's
pseudocode: both terms, the γ term centred at the round's start x_{0,t}),
the FedAvg-style SPPM-AS of the NN experiments (the γ term only, E optimiser steps per local
round), and **LocalGD / MB-LocalGD / FedAvg** on the cohort (no prox term, K = 1, E local GD
steps). The average is uniform over the cohort (the algorithms' ``1/|S_t|``); ``weighting=
"sampling"`` uses the unbiased weights ``1/(n p_i)`` instead. The Cohort-Squeeze paper's NN
solver study compares the workers and servers of this average: **FedSGD** (SGD worker),
**FedAdam** (Adam worker), **FedAdam-Adam** (Adam worker, Adam server over the K local rounds:
``server_optimizer``) and **MimeLite-Adam** (:func:`mime_lite`).

Cost (:class:`SPPMInfo`): each global round reports its local communication rounds K, the
cohort size and the floats sent up and down (d per member per local round); the hierarchical
cost model and cost-to-target are in :mod:`fedjaxsparse.ops.accounting`.

Source for the team: seed 001 chapter 5 and appendix D; spec ``seed001_ch3_ch5.md`` §3, C5-4.
Dissertation numbering: SPPM-AS Algorithm 8 (FL form 14), FedProx-SPPM-AS 12, FedAvg-SPPM-AS
13; Fig. D.10, Theorem D.2.1, §5.4.4.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree

from fedjaxsparse.ops import accounting
from fedjaxsparse.runtime.clients import map_clients
from fedjaxsparse.core import Algorithm, LossFn, as_float, shared_doc
from fedjaxsparse.data.federated import FederatedData, check_data
from fedjaxsparse.convex.prox_solvers import Solver, gd
from fedjaxsparse.ops.sampling import Sampler
from fedjaxsparse.ops.sampling import client_keys
from fedjaxsparse.ops.local import minibatch
from fedjaxsparse.errors import check_int, check_number
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["SPPMState", "SPPMInfo", "sppm_as", "MimeLite", "mime_lite", "cohort_average",
           "fedprox_sppm_as", "fedavg_sppm_as", "local_gd"]
__dir__ = _public_dir(__all__)

WEIGHTINGS = ("uniform", "sampling")


class SPPMState(NamedTuple):
  """Attributes: ``params`` (the server model x_t), ``round`` (global rounds done)."""
  params: Any
  round: jax.Array


class SPPMInfo(NamedTuple):
  """Per global round: ``loss`` (f_S(x_t), the weighted cohort loss at the start),
  ``local_rounds`` (K), ``cohort`` (members), ``floats_up`` / ``floats_down`` (d per member per
  local round), ``bits_up`` / ``bits_down`` (the same in fp32 bits)."""
  loss: jax.Array
  local_rounds: jax.Array
  cohort: jax.Array
  floats_up: jax.Array
  floats_down: jax.Array
  bits_up: jax.Array
  bits_down: jax.Array


def _info(loss, k: int, members, d: int, up: int = 1) -> SPPMInfo:
  floats = as_float(k * d) * members
  return SPPMInfo(loss, jnp.int32(k), members, up * floats, floats,
                  up * floats * accounting.FLOAT_BITS, floats * accounting.FLOAT_BITS)


def _init(key, params, data: FederatedData) -> SPPMState:
  del key
  check_data(data)
  return SPPMState(params, jax.device_put(np.zeros((), np.int32)))  # no program compiled


def _client_objective(loss_fn: LossFn, unravel, batch_size):
  """``(v, key, client data) -> f_i(v)`` on a flat vector (a minibatch with ``batch_size``)."""
  def f(v, key, d):
    return loss_fn(unravel(v), *minibatch(key, d, batch_size))
  return f


_DOC = shared_doc(
    ref_cohort_squeeze="""\
    Kai Yi, Timur Kharisov, Igor Sokolov, Peter Richtárik (2024). Cohort Squeeze: Beyond a
      Single Communication Round per Cohort in Cross-Device Federated Learning.
      FL@FM-NeurIPS'24 workshop (oral). arXiv:2406.01115.""",
    returns="""\
    An :class:`fedjaxsparse.Algorithm` ``(init, step)`` (built by :func:`cohort_average`). The
    state is an :class:`SPPMState`: ``params`` (the server model x_t) and ``round`` (global
    rounds done). ``step(key, state, data)`` returns ``(state, info)``, ``info`` an
    :class:`SPPMInfo` per global round: ``loss`` (``Σ_{i∈S} f_i(x_t)/(n p_i)``, the
    sampling-weighted cohort loss at the start), ``local_rounds`` (K), ``cohort`` (members),
    ``floats_up`` and ``floats_down`` (d floats per member per local round each way; twice
    that up with a :func:`mime_lite` worker, which also uploads a gradient) and ``bits_up`` /
    ``bits_down`` (the same in fp32 bits).""",
    ref_fedavg="""\
    Brendan McMahan, Eider Moore, Daniel Ramage, Seth Hampson, Blaise Agüera y Arcas
      (2017). Communication-Efficient Learning of Deep Networks from Decentralized Data.
      AISTATS 2017. arXiv:1602.05629.""",
)
"""Docstring text the constructors below share (:func:`~fedjaxsparse.core.shared_doc`)."""


@_DOC
def sppm_as(loss_fn: LossFn, sampler: Sampler, gamma: float, solver: Solver, *,
            batch_size: int | None = None) -> Algorithm:
  """SPPM-AS (Yi, Kharisov, Sokolov and Richtárik, 2024): stochastic proximal point with
  arbitrary cohort sampling — each global round, the sampled cohort computes the prox of its
  loss, spending K local communication rounds on it ("Cohort Squeeze").

  Each global round t the server samples a cohort ``S ~ 𝒮`` (``sampler``, with marginals
  ``p_i = P(i ∈ S)``), broadcasts the model ``x_t`` (a flat vector of d floats), and the cohort
  approximately solves

    x_{t+1} ≈ prox_{γ f_S}(x_t) = argmin_z  Σ_{i∈S} f_i(z)/(n p_i) + ‖z − x_t‖²/(2γ)

  with the prox solver 𝒜 = ``solver`` started at ``z₀ = x_t`` and run for K =
  ``solver.iterations`` iterations, each one local communication round of the cohort with its
  hub (e.g. the members send their gradients, d floats each, and the hub broadcasts the new
  iterate). The weights ``1/(n p_i)`` make ``f_S`` an unbiased estimate of
  ``f = (1/n) Σ_i f_i``. Clients are stateless. For strongly convex f_i it converges linearly
  to a neighbourhood of the minimiser for any γ > 0. Special cases: full sampling is the
  proximal point method (PPM); one client per round is SPPM; the solver ``gd(η, 1)`` gives
  minibatch GD ``x_t − η ∇f_S(x_t)`` (MB-GD, tested). The module docstring relates it to
  :func:`cohort_average` and its named forms.

  Args:
    loss_fn: ``(params, x, y, mask) -> f_i``: the loss of one client on its examples.
    sampler: the cohort sampling 𝒮, a :class:`fedjaxsparse.ops.sampling.Sampler` over the
      data's n clients (NICE, stratified, block, importance ...); its marginals p_i give the
      weights ``1/(n p_i)``, padding entries of a cohort get weight 0.
    gamma: the prox parameter γ > 0 (the paper's "global learning rate"); any γ > 0
      converges: a larger γ contracts faster, to a neighbourhood that grows with γ but stays
      bounded.
    solver: the prox solver 𝒜 (:mod:`fedjaxsparse.convex.prox_solvers`: CG, BFGS, GD, optax
      steps ...); ``solver.iterations`` is K, the local communication rounds per global round.
    batch_size: examples per client loss and gradient, drawn with replacement; ``None``: the
      client's full data, as in the paper's convex experiments.

  Returns:
    An :class:`fedjaxsparse.Algorithm` ``(init, step)``; ``step`` raises a ValueError if the
    data's number of clients is not the sampler's. The state is an :class:`SPPMState`:
    ``params`` (the server model x_t) and ``round`` (global rounds done). ``step(key, state,
    data)`` returns ``(state, info)``, ``info`` an :class:`SPPMInfo` per global round:
    ``loss`` (``f_S(x_t) = Σ_{i∈S} f_i(x_t)/(n p_i)``, the cohort loss at the start),
    ``local_rounds`` (K), ``cohort`` (members), ``floats_up`` and ``floats_down`` (``K·d`` per
    member: d floats per member per local round each way) and ``bits_up`` / ``bits_down`` (the
    same in fp32 bits, ``32·K·d`` per member).

  References:
    {{ref_cohort_squeeze}}

  Source for the team: seed 001 ch. 5 (SPPM-AS = dissertation Algorithm 8, FL form 14); spec
  ``specs/seed001_ch3_ch5.md`` §3.2, §3.5.
  """
  check_number("gamma", gamma, 0.0, None, low_open=True)

  def step(key, state: SPPMState, data: FederatedData):
    if data.num_clients != sampler.num_clients:
      raise ValueError(f"the sampler is over {sampler.num_clients} clients, the data has "
                       f"{data.num_clients}.")
    k_cohort, k_solve = jax.random.split(key)
    cohort = sampler.sample(k_cohort)
    cdata = data.select(cohort.ids)
    x_t, unravel = ravel_pytree(state.params)
    f = _client_objective(loss_fn, unravel, batch_size)

    def f_s(v, k):  # Σ_{i∈S} f_i(v)/(n p_i), padding weighted 0
      losses = map_clients(lambda kc, d: f(v, kc, d), cdata, client_keys(k, cohort.ids))
      return jnp.sum(cohort.weights * losses)

    def phi(v, k):
      return f_s(v, k) + jnp.sum(jnp.square(v - x_t)) / (2 * gamma)

    z = solver.solve(phi, x_t, k_solve)
    info = _info(f_s(x_t, k_solve), solver.iterations, jnp.sum(cohort.mask), x_t.size)
    return SPPMState(unravel(z), state.round + 1), info

  return Algorithm(_init, step)


class MimeLite(NamedTuple):
  """MimeLite's worker (:func:`mime_lite`) in place of a prox solver of :func:`cohort_average`:
  ``steps`` steps of ``optimizer`` whose state is the server's, frozen during the steps."""
  optimizer: optax.GradientTransformation
  steps: int


def mime_lite(optimizer: optax.GradientTransformation, steps: int) -> MimeLite:
  """MimeLite (Karimireddy et al., 2020, "Mime: Mimicking Centralized Stochastic Algorithms in
  Federated Learning", arXiv:2008.03606, Algorithm 1 without the control variate) as the cohort
  solver of :func:`cohort_average`: in local round k every member runs ``steps`` steps
  ``z ← z + U(∇ψ_i(z; ζ), s)`` from ``x_k``, where ``U`` is ``optimizer``'s update with the
  server state ``s`` *frozen* (``optimizer.update(g, s, z)[0]``, its new state discarded); the
  members also send ``∇ψ_i(x_k)``, and the server, after averaging the models, advances ``s``
  with the cohort mean of those gradients (``optimizer.update(mean ∇ψ_i(x_k), s, x_k)[1]``).
  Uploads are 2d floats per member per local round (model and gradient). The state starts fresh at
  every global round, like the clients (the Cohort-Squeeze paper leaves it unspecified: each global
  round is a new prox problem). With a stateless optimizer (SGD) this is exactly
  :func:`~fedjaxsparse.convex.prox_solvers.optax_steps`' worker (tested); with Adam it is the
  Cohort-Squeeze paper's "MimeLite-Adam"."""
  steps = check_int("steps", steps, 1)
  return MimeLite(optimizer, steps)


def cohort_average(loss_fn: LossFn, sampler: Sampler, solver: Solver | MimeLite, *,
                   local_rounds: int = 1, alpha: float | None = None,
                   gamma: float | None = None, weighting: str = "uniform",
                   batch_size: int | None = None,
                   server_optimizer: optax.GradientTransformation | None = None) -> Algorithm:
  """K = ``local_rounds`` rounds of ``x_{k+1} = avg_{i∈S} argmin ψ_{i,k}`` (see the module
  docstring), each client's argmin by ``solver`` from ``x_k``.

  ``alpha``: the local prox term ``‖z − x_k‖²/(2α)`` (``None``: none); ``gamma``: the global
  one ``‖z − x_{0,t}‖²/(2γ)`` centred at the round's start (``None``: none). Named forms:
  :func:`fedprox_sppm_as`, :func:`fedavg_sppm_as`, :func:`local_gd`.

  ``server_optimizer`` (FedOpt, Reddi et al., 2021, arXiv:2003.00295): the server treats
  ``x_k − avg_i z_i`` as a pseudo-gradient, ``x_{k+1} = x_k + u`` with
  ``(u, s) = server_optimizer.update(x_k − avg_i z_i, s, x_k)``; its state lives over the K
  local rounds of one global round (``optax.sgd(1.0)`` is the plain average). With Adam at
  the server and an Adam worker (``optax_steps(optax.adam(η), E)``) this is the Cohort-Squeeze
  paper's "FedAdam-Adam" solver. ``solver`` may also be :func:`mime_lite`'s worker
  ("MimeLite-Adam").
  """
  local_rounds = check_int("local_rounds (K)", local_rounds, 1)
  for name, v in (("alpha", alpha), ("gamma", gamma)):
    if v is not None:
      check_number(name, v, 0.0, None, low_open=True)
  if weighting not in WEIGHTINGS:
    raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}.")
  mime = solver if isinstance(solver, MimeLite) else None

  def step(key, state: SPPMState, data: FederatedData):
    k_cohort, k_local = jax.random.split(key)
    cohort = sampler.sample(k_cohort)
    cdata = data.select(cohort.ids)
    x0, unravel = ravel_pytree(state.params)
    f = _client_objective(loss_fn, unravel, batch_size)
    w = cohort.mask if weighting == "uniform" else cohort.weights
    w = (w / jnp.sum(w)).astype(x0.dtype)   # the model's dtype (a float32 model, x64 on)

    def objective(xk, d):
      def psi(v, kk):
        out = f(v, kk, d)
        if alpha is not None:
          out = out + jnp.sum(jnp.square(v - xk)) / (2 * alpha)
        if gamma is not None:
          out = out + jnp.sum(jnp.square(v - x0)) / (2 * gamma)
        return out
      return psi

    def mime_client(kc, xk, d, s):
      psi = objective(xk, d)

      def body(j, v):
        g = jax.grad(psi)(v, jax.random.fold_in(kc, j))
        return optax.apply_updates(v, mime.optimizer.update(g, s, v)[0])  # s frozen

      return jax.lax.fori_loop(0, mime.steps, body, xk), jax.grad(psi)(xk, kc)

    def local_round(k, carry):
      xk, s_mime, s_server = carry
      keys = client_keys(jax.random.fold_in(k_local, k), cohort.ids)
      if mime is None:
        z = map_clients(lambda kc, d: solver.solve(objective(xk, d), xk, kc), cdata, keys)
      else:
        z, g = map_clients(lambda kc, d: mime_client(kc, xk, d, s_mime), cdata, keys)
        s_mime = mime.optimizer.update(jnp.tensordot(w, g, axes=1), s_mime, xk)[1]
      avg = jnp.tensordot(w, z, axes=1)
      if server_optimizer is None:
        return avg, s_mime, s_server
      u, s_server = server_optimizer.update(xk - avg, s_server, xk)
      return optax.apply_updates(xk, u), s_mime, s_server

    init = (x0, mime.optimizer.init(x0) if mime else (),
            server_optimizer.init(x0) if server_optimizer is not None else ())
    x = jax.lax.fori_loop(0, local_rounds, local_round, init)[0]
    losses = map_clients(lambda kc, d: f(x0, kc, d), cdata, client_keys(k_local, cohort.ids))
    info = _info(jnp.sum(cohort.weights * losses), local_rounds, jnp.sum(cohort.mask), x0.size,
                 up=2 if mime else 1)
    return SPPMState(unravel(x), state.round + 1), info

  return Algorithm(_init, step)


@_DOC
def fedprox_sppm_as(loss_fn: LossFn, sampler: Sampler, gamma: float, solver: Solver,
                    local_rounds: int = 1, **kw) -> Algorithm:
  """FedProx-SPPM-AS (Yi, Kharisov, Sokolov and Richtárik, 2024), "proximal averaging": each
  cohort member computes its own prox (a FedProx-style local problem) and the hub averages,
  for K local communication rounds per global round.

  Each global round the server samples a cohort ``S ~ 𝒮`` and broadcasts ``x_0 = x_t``; then
  for k = 0, …, K − 1 (one local communication round each)::

    x_{k+1} = (1/|S|) Σ_{i∈S} prox_{γ f_i}(x_k),
    prox_{γ f_i}(x_k) = argmin_z  f_i(z) + ‖z − x_k‖²/(2γ)

  each member's argmin computed by ``solver`` started at ``x_k``, and ``x_{t+1} = x_K``. It is
  not SPPM-AS (:func:`sppm_as`): a mean of proxes is not the prox of the mean. The paper's
  theorem for it covers K = 1 (linear convergence to a neighbourhood for strongly convex f_i).
  It is :func:`cohort_average` with ``alpha=gamma`` (the local prox term) and no global term;
  see the module docstring.

  Args:
    loss_fn: ``(params, x, y, mask) -> f_i``: the loss of one client on its examples.
    sampler: the cohort sampling 𝒮, a :class:`fedjaxsparse.ops.sampling.Sampler` over the
      data's n clients.
    gamma: the prox parameter γ > 0 of every member's prox ``prox_{γ f_i}``.
    solver: each member's local prox solver (:mod:`fedjaxsparse.convex.prox_solvers`, e.g.
      ``gd(η, E)`` or ``optax_steps(optax.adam(η), E)``), run from x_k in every local round;
      or a :func:`mime_lite` worker.
    local_rounds: K ≥ 1, the local communication rounds (prox-and-average steps) per global
      round.
    **kwargs: forwarded to :func:`cohort_average`: ``weighting`` (``"uniform"``: the cohort
      mean, as in the paper; ``"sampling"``: the unbiased weights ``1/(n p_i)``, normalised),
      ``batch_size`` (examples per client loss and gradient, with replacement; ``None``: the
      client's full data) and ``server_optimizer`` (an optax transformation applied at the hub
      to ``x_k − average`` as a pseudo-gradient, its state kept over the K local rounds;
      ``None``: plain averaging).

  Returns:
    {{returns}}

  References:
    {{ref_cohort_squeeze}}
    Tian Li, Anit Kumar Sahu, Manzil Zaheer, Maziar Sanjabi, Ameet Talwalkar, Virginia Smith
      (2020). Federated Optimization in Heterogeneous Networks. MLSys 2020. arXiv:1812.06127.

  Source for the team: seed 001 app. D (FedProx-SPPM-AS = dissertation Algorithm 12, Theorem
  D.2.1); spec ``specs/seed001_ch3_ch5.md`` §3.6.
  """
  return cohort_average(loss_fn, sampler, solver, local_rounds=local_rounds, alpha=gamma, **kw)


@_DOC
def fedavg_sppm_as(loss_fn: LossFn, sampler: Sampler, gamma: float, alpha: float | None,
                   solver: Solver, local_rounds: int = 1, **kw) -> Algorithm:
  """FedAvg-SPPM-AS (Yi, Kharisov, Sokolov and Richtárik, 2024): FedAvg-style local rounds on
  the cohort's prox problem — K rounds of averaged local proxes of ``f_i`` plus a global prox
  term centred at the round's start.

  As we read the paper's pseudocode: each global round the server samples a cohort ``S ~ 𝒮``
  and broadcasts ``x_{0,t} = x_t``; every member forms
  ``f̃_{i,t}(z) = f_i(z) + ‖z − x_{0,t}‖²/(2γ)`` (centred at the round's start), then for
  k = 0, …, K − 1 (one local communication round each)::

    x_{k+1} = (1/|S|) Σ_{i∈S} prox_{α f̃_{i,t}}(x_k)
            = (1/|S|) Σ_{i∈S} argmin_z f_i(z) + ‖z − x_k‖²/(2α) + ‖z − x_{0,t}‖²/(2γ)

  each member's argmin computed by ``solver`` started at ``x_k``, and ``x_{t+1} = x_K``. (The
  paper's prose instead centres both terms at x_k with coefficients 2/γ and 2/α; this follows
  its pseudocode.) ``alpha=None`` drops the local prox term: each member then runs ``solver``
  (e.g. E Adam steps) on f̃_{i,t} from x_k — the FedAvg-style solver of the paper's neural-network
  experiments. It is :func:`cohort_average` with both terms; see the module docstring.

  Args:
    loss_fn: ``(params, x, y, mask) -> f_i``: the loss of one client on its examples.
    sampler: the cohort sampling 𝒮, a :class:`fedjaxsparse.ops.sampling.Sampler` over the
      data's n clients.
    gamma: γ > 0, the global prox parameter: the term ``‖z − x_{0,t}‖²/(2γ)`` centred at the
      round's start.
    alpha: α > 0, the local prox parameter: the term ``‖z − x_k‖²/(2α)`` centred at the local
      round's start (a step size, not FLIX's α); ``None``: no local term.
    solver: each member's local solver (:mod:`fedjaxsparse.convex.prox_solvers`, e.g.
      ``gd(η, E)`` or ``optax_steps(optax.adam(η), E)``), run from x_k in every local round;
      or a :func:`mime_lite` worker.
    local_rounds: K ≥ 1, the local communication rounds per global round.
    **kwargs: forwarded to :func:`cohort_average`: ``weighting`` (``"uniform"``: the cohort
      mean, as in the paper; ``"sampling"``: the unbiased weights ``1/(n p_i)``, normalised),
      ``batch_size`` (examples per client loss and gradient, with replacement; ``None``: the
      client's full data) and ``server_optimizer`` (an optax transformation applied at the hub
      to ``x_k − average`` as a pseudo-gradient, its state kept over the K local rounds;
      ``optax.adam`` with an Adam worker is the paper's "FedAdam-Adam"; ``None``: plain
      averaging).

  Returns:
    {{returns}}

  References:
    {{ref_cohort_squeeze}}
    {{ref_fedavg}}
    Sashank J. Reddi, Zachary Charles, Manzil Zaheer, Zachary Garrett, Keith Rush, Jakub
      Konečný, Sanjiv Kumar, H. Brendan McMahan (2021). Adaptive Federated Optimization. ICLR
      2021. arXiv:2003.00295.

  Source for the team: seed 001 app. D (FedAvg-SPPM-AS = dissertation Algorithm 13; NN
  solver study §5.4.4, Fig. D.10); spec ``specs/seed001_ch3_ch5.md`` §3.7, §3.5, C5-4.
  """
  return cohort_average(loss_fn, sampler, solver, local_rounds=local_rounds, alpha=alpha,
                        gamma=gamma, **kw)


@_DOC
def local_gd(loss_fn: LossFn, sampler: Sampler, lr: float, local_steps: int, **kw
             ) -> Algorithm:
  """LocalGD / MB-LocalGD / FedAvg (McMahan et al., 2017) on a sampled cohort: the
  local-training baselines of the Cohort Squeeze paper (Yi, Kharisov, Sokolov and Richtárik,
  2024).

  Each global round the server samples a cohort ``S ~ 𝒮`` and broadcasts x_t; every member runs
  E = ``local_steps`` gradient-descent steps on its own loss from x_t,
  ``z ← z − lr ∇f_i(z)``, and the server averages, ``x_{t+1} = (1/|S|) Σ_{i∈S} z_i``: one
  communication per global round, no local communication rounds (K = 1). With full sampling
  it is LocalGD, with a sampled cohort (a minibatch of clients) the paper's MB-LocalGD, i.e.
  FedAvg with GD local steps; with ``batch_size`` the local steps are SGD steps. It is
  :func:`cohort_average` with the solver ``gd(lr, local_steps)``, K = 1 and no prox term; see
  the module docstring.

  Args:
    loss_fn: ``(params, x, y, mask) -> f_i``: the loss of one client on its examples.
    sampler: the cohort sampling 𝒮, a :class:`fedjaxsparse.ops.sampling.Sampler` over the
      data's n clients.
    lr: the local step size η > 0.
    local_steps: E ≥ 1, the local GD steps per global round (the paper's default: 5).
    **kwargs: forwarded to :func:`cohort_average`: ``weighting`` (``"uniform"``: the cohort
      mean; ``"sampling"``: the unbiased weights ``1/(n p_i)``, normalised), ``batch_size``
      (examples per local gradient, with replacement; ``None``: the client's full data),
      ``server_optimizer`` (an optax transformation applied to ``x_t − average`` as a
      pseudo-gradient, i.e. FedOpt; ``None``: plain averaging), and ``alpha`` / ``gamma``
      (optional prox terms ``‖z − x_t‖²/(2α)`` and ``‖z − x_t‖²/(2γ)`` added to f_i; default
      none).

  Returns:
    An :class:`fedjaxsparse.Algorithm` ``(init, step)`` (built by :func:`cohort_average`). The
    state is an :class:`SPPMState`: ``params`` (the server model x_t) and ``round`` (global
    rounds done). ``step(key, state, data)`` returns ``(state, info)``, ``info`` an
    :class:`SPPMInfo` per global round: ``loss`` (``Σ_{i∈S} f_i(x_t)/(n p_i)``, the
    sampling-weighted cohort loss at the start), ``local_rounds`` (always 1), ``cohort``
    (members), ``floats_up`` and ``floats_down`` (d per member: one model each way) and
    ``bits_up`` / ``bits_down`` (the same in fp32 bits, ``32·d`` per member).

  References:
    {{ref_cohort_squeeze}}
    {{ref_fedavg}}

  Source for the team: seed 001 ch. 5 (baselines, §5.4.4); spec ``specs/seed001_ch3_ch5.md``
  §3.8, C5-14.
  """
  return cohort_average(loss_fn, sampler, gd(lr, local_steps), local_rounds=1, **kw)
