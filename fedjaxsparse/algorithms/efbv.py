"""EF-BV, EF21, DIANA and proximal gradient descent.

References:
  Laurent Condat, Kai Yi, Peter Richtárik (2022). EF-BV: A Unified Theory of Error Feedback
    and Variance Reduction Mechanisms for Biased and Unbiased Compression in Distributed
    Optimization. NeurIPS 2022. arXiv:2205.04180.
  Peter Richtárik, Igor Sokolov, Ilyas Fatkhullin (2021). EF21: A New, Simpler, Theoretically
    Better, and Practically Faster Error Feedback. NeurIPS 2021. arXiv:2106.05203.
  Ilyas Fatkhullin, Igor Sokolov, Eduard Gorbunov, Zhize Li, Peter Richtárik (2021). EF21 with
    Bells & Whistles: Practical Algorithmic Extensions of Modern Error Feedback. arXiv:2110.03294
    (JMLR 2025).
  Konstantin Mishchenko, Eduard Gorbunov, Martin Takáč, Peter Richtárik (2019). Distributed
    Learning with Compressed Gradient Differences. Optimization Methods and Software (2024).
    arXiv:1901.09269.

Problem ``min (1/n) Σ_i f_i(x) + R(x)`` with full local gradients and uniform averaging. One
iteration of EF-BV (compressor C ∈ C(η, ω), scalings λ, ν ∈ (0, 1]):

    client i:  d_i = C_i(∇f_i(x) − h_i)          (one draw, key fold_in(key, i))
               h_i ← h_i + λ d_i                   upload d_i
    server:    d = (1/n) Σ_i d_i
               g = h + ν d                          (old h)
               h ← h + λ d
               x ← prox_{γR}(x − γ g)               broadcast x

EF21 is ν = λ (``λ = 1`` is the original EF21 for contractive C; the EF-BV paper's experiments
run EF21 with ``ν = λ = λ*``), DIANA is ν = 1, and the identity compressor with λ = ν = 1 is
proximal gradient descent. :func:`efbv_params` gives the theory's λ*, ν*, r, r_av, s* and γ (in
the paper's words, "no parameter left to tune").

Source for the team: seed 001 chapter 2; spec ``specs/seed001_ch2.md`` §3–4; Fig. 2.1,
Thm 2.4.1, Remarks 2.4.3-2.4.4, Prop 2.4.6, eqs. 2.6/2.8/2.11 and Table A.2 of the dissertation.
"""
from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjaxsparse.ops import accounting
from fedjaxsparse.runtime.clients import client_ids, map_clients
from fedjaxsparse.ops.compressors import Compressor, identity
from fedjaxsparse.core import Algorithm, LossFn, as_float, shared_doc
from fedjaxsparse.data.federated import FederatedData, check_data
from fedjaxsparse.runtime.population import CohortAlgorithm
from fedjaxsparse.ops.sampling import client_keys
from fedjaxsparse.errors import check_number, check_positive
from fedjaxsparse.ops.proxes import Prox
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["EFBVState", "EFBVInfo", "ef_bv", "EFBVServer", "ef_bv_pp", "ef21", "diana", "prox_gd",
           "tuned", "diana_params", "efbv_params"]
__dir__ = _public_dir(__all__)



class EFBVState(NamedTuple):
  """Attributes:
    x: the model (no client axis).
    h: server control variate ``h = (1/n) Σ_i h_i`` (kept incrementally, as EF-BV does).
    h_clients: ``[n, ...]`` client control variates ``h_i``.
    t: ``int32[]`` iterations done.
  """
  x: Any
  h: Any
  h_clients: Any
  t: jax.Array

  @property
  def params(self):
    return self.x


class EFBVInfo(NamedTuple):
  """Attributes: ``loss`` ((1/n) Σ f_i(x) before the step), ``bits_up`` (n compressed
  messages), ``bits_down`` (dense x to n clients), ``grad_error`` ((1/n) Σ‖∇f_i(x) − h_i‖²
  before the step, the Lyapunov term of the EF-BV paper's
  convergence theorem), ``g`` is not stored."""
  loss: jax.Array
  bits_up: jax.Array
  bits_down: jax.Array
  grad_error: jax.Array


def _sq_norm(tree) -> jax.Array:
  return sum(jnp.sum(jnp.square(a)) for a in jax.tree.leaves(tree))


def _initial_h_impl(loss_fn: LossFn, zero: bool, params, data):
  """``(h, h_clients)`` at ``params``: ``h_i = ∇f_i(params)`` (or zeros shaped like them,
  ``zero``) and their mean."""
  _, g = map_clients(lambda d: jax.value_and_grad(loss_fn)(params, d.x, d.y, d.mask), data)
  h_clients = jax.tree.map(jnp.zeros_like, g) if zero else g
  # the mean of the stored h_i, not fused into their computation: the same bits as op by op
  h_clients = jax.lax.optimization_barrier(h_clients)
  return jax.tree.map(lambda a: jnp.mean(a, 0), h_clients), h_clients


# One compiled program per (loss, h_init, shapes), shared by every EF-BV built on that loss.
_initial_h = jax.jit(_initial_h_impl, static_argnums=(0, 1))


_DOC = shared_doc(
    returns="""\
    An :class:`~fedjaxsparse.core.Algorithm` (``bucketable=True``).
    ``init(key, params, data)`` (``key`` unused) computes the ``h_i⁰`` and returns an
    :class:`~fedjaxsparse.algorithms.efbv.EFBVState`: ``state.x`` (also ``state.params``) the
    model, ``state.h`` the server's ``(1/n) Σ_i h_i`` (kept incrementally), ``state.h_clients``
    the ``[n, ...]`` client control variates ``h_i`` and ``state.t`` (``int32[]``) the
    iterations done. ``step(key, state, data)`` returns ``(state, info)`` with ``info`` an
    :class:`~fedjaxsparse.algorithms.efbv.EFBVInfo`: ``loss`` ((1/n) Σ_i f_i(x) before the
    step), ``bits_up`` (the n compressed messages, ``n · compressor.bits(d)`` for a model of d
    entries, plus ``n · 32·d`` on the first step when ``h_init="grad"``), ``bits_down``
    (dense x to the n clients, ``n · 32·d``) and ``grad_error`` ((1/n) Σ_i ‖∇f_i(x) − h_i‖²
    before the step, the Lyapunov term of the EF-BV paper's convergence theorem).""",
    ref_efbv="""\
    Laurent Condat, Kai Yi, Peter Richtárik (2022). EF-BV: A Unified Theory of Error Feedback
      and Variance Reduction Mechanisms for Biased and Unbiased Compression in Distributed
      Optimization. NeurIPS 2022. arXiv:2205.04180.""",
    ref_ef21_bw="""\
    Ilyas Fatkhullin, Igor Sokolov, Eduard Gorbunov, Zhize Li, Peter Richtárik (2021). EF21
      with Bells & Whistles: Practical Algorithmic Extensions of Modern Error Feedback.
      arXiv:2110.03294 (JMLR 2025).""",
    arg_kwargs="""\
    **kwargs: forwarded to :func:`ef_bv`: ``prox`` (``(tree, step) -> prox_{step·R}(tree)``,
      ``None`` (default) for R = 0) and ``h_init`` (``"grad"``, the default: h_i⁰ = ∇f_i(x⁰),
      one dense upload per client charged to the first step's ``bits_up``; or ``"zero"``).""",
)
"""Docstring text the constructors below share (:func:`~fedjaxsparse.core.shared_doc`)."""


@_DOC
def ef_bv(loss_fn: LossFn, compressor: Compressor, gamma: float, lam: float, nu: float, *,
          prox: Prox | None = None, h_init: str = "grad") -> Algorithm:
  """EF-BV (Condat, Yi & Richtárik, 2022): error feedback and variance reduction in one
  scheme, for ``min_x (1/n) Σ_i f_i(x) + R(x)`` with any compressor C ∈ C(η, ω) (biased or
  unbiased, contractive or not); it contains EF21 (ν = λ) and DIANA (ν = 1).

  Every client computes its full local gradient each iteration and holds a control variate
  ``h_i`` (a tree shaped like the model x); the server keeps ``h = (1/n) Σ_i h_i``. One
  iteration, with one compressor draw per client (key ``fold_in(key, i)``) used for both of
  its updates, and uniform averaging:

      client i:  d_i = C_i(∇f_i(x) − h_i)
                 h_i ← h_i + λ d_i                 upload d_i
      server:    d = (1/n) Σ_i d_i
                 g = h + ν d                        (the old h)
                 h ← h + λ d
                 x ← prox_{γR}(x − γ g)             broadcast x (dense)

  ν = λ is EF21 (:func:`ef21`; ``λ = 1`` the original EF21 for a contractive C), ν = 1 is
  DIANA (:func:`diana`), and the identity compressor with λ = ν = 1 is proximal gradient
  descent (:func:`prox_gd`). :func:`efbv_params` gives the theory's λ*, ν* and γ, and
  :func:`tuned` builds the algorithm with them; the module docstring has the full story.

  Args:
    loss_fn: ``(params, x, y, mask) -> f_i`` of one client; the data may be padded
      ``FederatedData`` or size-bucketed :class:`fedjaxsparse.runtime.clients.BucketedData`.
    compressor: a :class:`~fedjaxsparse.ops.compressors.Compressor` C (constants η, ω;
      an independent draw per client), built for the model's number of entries d.
    gamma: step size γ > 0 (the theory's value: :func:`efbv_params`).
    lam: scaling λ ∈ (0, 1] of the control-variate updates ``h_i ← h_i + λ d_i``.
    nu: scaling ν ∈ (0, 1] of the gradient estimate ``g = h + ν d``.
    prox: ``(tree, step) -> prox_{step·R}(tree)`` (e.g. ``fjs.proxes.l1(weight)``), or
      ``None`` for R = 0.
    h_init: ``"grad"`` (h_i⁰ = ∇f_i(x⁰), so the Lyapunov term starts at 0; the paper does
      not say; this one dense upload per client, ``32·d`` bits, is charged to the first
      step's ``bits_up``) or ``"zero"`` (nothing to upload).

  Returns:
    {{returns}}

  References:
    {{ref_efbv}}

  Source for the team: specs/seed001_ch2.md §4.1 (Fig. 2.1 of the dissertation).
  """
  for name, v in (("lam", lam), ("nu", nu)):
    check_number(name, v, 0.0, 1.0, low_open=True)
  check_positive("gamma", gamma)
  if h_init not in ("grad", "zero"):
    raise ValueError(f"h_init must be 'grad' or 'zero', got {h_init!r}.")
  value_and_grad = jax.value_and_grad(loss_fn)

  def grads(params, data):  # all clients; padded or size-bucketed data
    return map_clients(lambda d: value_and_grad(params, d.x, d.y, d.mask), data)

  try:
    hash(loss_fn)
    initial_h = functools.partial(_initial_h, loss_fn, h_init == "zero")
  except TypeError:   # an unhashable loss: a program of this algorithm's own
    initial_h = jax.jit(functools.partial(_initial_h_impl, loss_fn, h_init == "zero"))

  def init(key, params, data: FederatedData) -> EFBVState:
    del key
    check_data(data)
    h, h_clients = initial_h(params, data)   # one compiled program, not one per operation
    return EFBVState(params, h, h_clients, jax.device_put(np.zeros((), np.int32)))

  def step(key, state: EFBVState, data: FederatedData):
    n = data.num_clients
    losses, g = grads(state.x, data)
    delta = jax.tree.map(jnp.subtract, g, state.h_clients)
    keys = client_keys(key, client_ids(data))
    d_i = jax.vmap(compressor.compress)(keys, delta)
    h_clients = jax.tree.map(lambda h, d: h + lam * d, state.h_clients, d_i)
    d = jax.tree.map(lambda a: jnp.mean(a, 0), d_i)
    g_est = jax.tree.map(lambda h, dd: h + nu * dd, state.h, d)
    h = jax.tree.map(lambda h, dd: h + lam * dd, state.h, d)
    x = jax.tree.map(lambda a, b: a - gamma * b, state.x, g_est)
    if prox is not None:
      x = prox(x, gamma)
    dim = accounting.num_params(state.x)
    up = as_float(n * compressor.bits(dim))
    if h_init == "grad":  # h_i⁰ = ∇f_i(x⁰) was uploaded dense: charged to the first step
      up = up + jnp.where(state.t == 0, as_float(n * accounting.dense_bits(dim)), 0.0)
    info = EFBVInfo(loss=jnp.mean(losses), bits_up=up,
                    bits_down=as_float(n * accounting.dense_bits(dim)),
                    grad_error=jnp.mean(jax.vmap(_sq_norm)(delta)))
    return EFBVState(x, h, h_clients, state.t + 1), info

  return Algorithm(init, step, bucketable=True)


class EFBVServer(NamedTuple):
  """Server state of :func:`ef_bv_pp`: the model ``x``, ``h = (1/n) Σ_i h_i`` and ``t``."""
  x: Any
  h: Any
  t: jax.Array

  @property
  def params(self):
    return self.x


@_DOC
def ef_bv_pp(loss_fn: LossFn, compressor: Compressor, gamma: float, lam: float, nu: float,
             cohort_size: int | None, *, prox: Prox | None = None) -> CohortAlgorithm:
  """EF-BV with partial participation: EF-BV (Condat, Yi & Richtárik, 2022) with the client
  sampling of EF21-PP (Fatkhullin et al., 2021); each round only a uniform cohort of C clients
  computes, compresses and uploads, and only their control variates change.

  A :class:`~fedjaxsparse.runtime.population.CohortAlgorithm`: run it with ``fjs.run`` (which
  keeps the population on the device), :func:`~fedjaxsparse.runtime.population.on_device` or
  :func:`~fedjaxsparse.runtime.population.run_on_host` (client state in host memory). Each
  round a uniform cohort S of C distinct clients (every C-subset equally likely) does

      client i ∈ S:  d_i = C_i(∇f_i(x) − h_i)
                     h_i ← h_i + λ d_i             upload d_i    (the others keep h_i)
      server:        d = (1/n) Σ_{i∈S} d_i
                     g = h + ν d                    (the old h)
                     h ← h + λ d
                     x ← prox_{γR}(x − γ g)         broadcast x to the cohort

  The weights are 1/n, not 1/C, so ``h = (1/n) Σ_i h_i`` stays exact. With λ = ν = 1 this is
  EF21-PP (Algorithm 3 of "EF21 with Bells & Whistles"); with C = n it is :func:`ef_bv`
  (``h_init="zero"``; tested). The EF-BV paper runs full participation only; here
  ``h_i⁰ = 0`` (no dense first upload), since ``h⁰ = (1/n) Σ ∇f_i(x⁰)`` would need every
  client at once.

  Args:
    loss_fn: ``(params, x, y, mask) -> f_i`` of one client (vmapped over the cohort's padded
      data).
    compressor: a :class:`~fedjaxsparse.ops.compressors.Compressor` C (an independent draw per
      participating client, key ``fold_in(key, i)``), built for the model's d entries.
    gamma: step size γ > 0.
    lam: scaling λ ∈ (0, 1] of the control-variate updates ``h_i ← h_i + λ d_i``.
    nu: scaling ν ∈ (0, 1] of the gradient estimate ``g = h + ν d``.
    cohort_size: clients per round C (a static int, at most the population size n), or
      ``None`` for all n clients every round.
    prox: ``(tree, step) -> prox_{step·R}(tree)``, or ``None`` for R = 0.

  Returns:
    A :class:`~fedjaxsparse.runtime.population.CohortAlgorithm` with ``cohort_size``.
    ``init(key, params)`` (``key`` unused) returns the server state
    :class:`~fedjaxsparse.algorithms.efbv.EFBVServer`: ``x`` (also ``.params``), ``h`` (zeros)
    and ``t`` (``int32[]``); ``init_client`` gives each client ``h_i⁰ = 0`` (a tree like x);
    ``step(key, server, h_cohort, ids, data, num_clients)`` returns
    ``(server, h_cohort, info)``, ``info`` an :class:`~fedjaxsparse.algorithms.efbv.EFBVInfo`
    over the cohort: ``loss`` (mean of the participants' f_i(x) before the step), ``bits_up``
    (``C · compressor.bits(d)``), ``bits_down`` (dense x to the cohort, ``C · 32·d``) and
    ``grad_error`` (mean of the participants' ‖∇f_i(x) − h_i‖² before the step). Through
    :func:`~fedjaxsparse.runtime.population.on_device` the state is a
    :class:`~fedjaxsparse.runtime.population.PopulationState`: ``state.server`` (the above),
    ``state.clients`` (the ``[n, ...]`` h_i) and ``state.params`` (x).

  References:
    {{ref_efbv}}
    {{ref_ef21_bw}}
  """
  for name, v in (("lam", lam), ("nu", nu)):
    check_number(name, v, 0.0, 1.0, low_open=True)
  check_positive("gamma", gamma)
  value_and_grad = jax.value_and_grad(loss_fn)

  def init(key, params) -> EFBVServer:
    del key
    return EFBVServer(params, jax.tree.map(jnp.zeros_like, params), jnp.zeros((), jnp.int32))

  def init_client(server: EFBVServer, data):
    del data
    return jax.tree.map(jnp.zeros_like, server.x)

  def step(key, server: EFBVServer, h_cohort, ids, data, num_clients: int):
    losses, g = jax.vmap(lambda d: value_and_grad(server.x, d.x, d.y, d.mask))(data)
    delta = jax.tree.map(jnp.subtract, g, h_cohort)
    d_i = jax.vmap(compressor.compress)(client_keys(key, ids), delta)
    h_cohort = jax.tree.map(lambda h, d: h + lam * d, h_cohort, d_i)
    d = jax.tree.map(lambda a: jnp.sum(a, 0) / num_clients, d_i)
    g_est = jax.tree.map(lambda h, dd: h + nu * dd, server.h, d)
    h = jax.tree.map(lambda h, dd: h + lam * dd, server.h, d)
    x = jax.tree.map(lambda a, b: a - gamma * b, server.x, g_est)
    if prox is not None:
      x = prox(x, gamma)
    c, dim = ids.shape[0], accounting.num_params(server.x)
    info = EFBVInfo(loss=jnp.mean(losses), bits_up=as_float(c * compressor.bits(dim)),
                    bits_down=as_float(c * accounting.dense_bits(dim)),
                    grad_error=jnp.mean(jax.vmap(_sq_norm)(delta)))
    return EFBVServer(x, h, server.t + 1), h_cohort, info

  return CohortAlgorithm(init, init_client, step, cohort_size)


@_DOC
def ef21(loss_fn: LossFn, compressor: Compressor, gamma: float, lam: float = 1.0,
         **kw) -> Algorithm:
  """EF21 (Richtárik, Sokolov & Fatkhullin, 2021; proximal version: Fatkhullin et al., 2021):
  error feedback for contractive compressors, built as EF-BV (:func:`ef_bv`) with ν = λ.

  Every client holds ``h_i`` (a tree shaped like the model x), the server
  ``h = (1/n) Σ_i h_i``, which is also the gradient estimate; one iteration:

      client i:  d_i = C_i(∇f_i(x) − h_i)
                 h_i ← h_i + λ d_i                 upload d_i
      server:    h ← h + λ d,  d = (1/n) Σ_i d_i
                 x ← prox_{γR}(x − γ h)             broadcast x (dense)

  ``lam=1`` is the original EF21 for a contractive compressor C ∈ B(α); ``lam=λ*`` is EF21
  run on the pre-scaled compressor λ*·C (what the EF-BV paper's experiments ran, with
  ν = λ = λ* and γ = 1/(L + L̃/s*); :func:`tuned` with ``"ef21"`` builds it). See the module
  docstring for the whole family.

  Args:
    loss_fn: ``(params, x, y, mask) -> f_i`` of one client (padded or size-bucketed data).
    compressor: a :class:`~fedjaxsparse.ops.compressors.Compressor` C (an independent draw per
      client), built for the model's d entries.
    gamma: step size γ > 0.
    lam: λ ∈ (0, 1], used for both EF-BV scalings (ν = λ); default 1, the original EF21.
    {{arg_kwargs}}

  Returns:
    {{returns}}

  References:
    Peter Richtárik, Igor Sokolov, Ilyas Fatkhullin (2021). EF21: A New, Simpler,
      Theoretically Better, and Practically Faster Error Feedback. NeurIPS 2021.
      arXiv:2106.05203.
    {{ref_ef21_bw}}
    {{ref_efbv}}
  """
  return ef_bv(loss_fn, compressor, gamma, lam, lam, **kw)


@_DOC
def diana(loss_fn: LossFn, compressor: Compressor, gamma: float, lam: float | None = None,
          **kw) -> Algorithm:
  """DIANA (Mishchenko, Gorbunov, Takáč & Richtárik, 2019): compressed gradient differences
  with learned shifts h_i for unbiased compressors C ∈ U(ω), built as EF-BV (:func:`ef_bv`)
  with ν = 1; default λ = 1/(1 + ω).

  Every client holds a shift ``h_i`` (a tree shaped like the model x), the server
  ``h = (1/n) Σ_i h_i``; one iteration:

      client i:  d_i = C_i(∇f_i(x) − h_i)
                 h_i ← h_i + λ d_i                 upload d_i
      server:    d = (1/n) Σ_i d_i
                 g = h + d                          (the old h)
                 h ← h + λ d
                 x ← prox_{γR}(x − γ g)             broadcast x (dense)

  With an unbiased C, ``g`` is an unbiased estimate of ∇f(x). The EF-BV paper also proves
  that DIANA converges with a biased C ∈ C(η, ω) for any λ with r < 1. DIANA's own step size
  is :func:`diana_params` (``γ = 1/(L_max(1 + (1+√2)² ω_ran))``, λ = 1/(1 + ω)), the EF-BV
  rule with ν = 1 is ``efbv_params(..., nu=1)``; :func:`tuned` with ``"diana"`` picks one.
  See the module docstring for the whole family.

  Args:
    loss_fn: ``(params, x, y, mask) -> f_i`` of one client (padded or size-bucketed data).
    compressor: a :class:`~fedjaxsparse.ops.compressors.Compressor` C (an independent draw per
      client), built for the model's d entries; its ``omega`` sets the default λ.
    gamma: step size γ > 0.
    lam: scaling λ ∈ (0, 1] of the shift updates ``h_i ← h_i + λ d_i``; ``None`` (default)
      for 1/(1 + ω).
    {{arg_kwargs}}

  Returns:
    {{returns}}

  References:
    Konstantin Mishchenko, Eduard Gorbunov, Martin Takáč, Peter Richtárik (2019). Distributed
      Learning with Compressed Gradient Differences. Optimization Methods and Software (2024).
      arXiv:1901.09269.
    {{ref_efbv}}
  """
  lam = 1.0 / (1.0 + compressor.omega) if lam is None else lam
  return ef_bv(loss_fn, compressor, gamma, lam, 1.0, **kw)


@_DOC
def prox_gd(loss_fn: LossFn, gamma: float, d: int, **kw) -> Algorithm:
  """Proximal gradient descent, the limit case of EF-BV (Condat, Yi & Richtárik, 2022):
  ``x ← prox_{γR}(x − γ ∇f(x))`` with ``∇f = (1/n) Σ_i ∇f_i``, built as EF-BV (:func:`ef_bv`)
  with the identity compressor and λ = ν = 1 (a remark of the EF-BV paper).

  Every client uploads its dense full local gradient each iteration: in EF-BV's terms
  ``d_i = ∇f_i(x) − h_i``, ``h_i ← ∇f_i(x)`` and ``g = h + d = ∇f(x)``, whatever ``h_init``.
  A sanity baseline for the compressed methods (and a way to compute f*). See the module
  docstring for the whole family.

  Args:
    loss_fn: ``(params, x, y, mask) -> f_i`` of one client (padded or size-bucketed data).
    gamma: step size γ > 0.
    d: the model's number of entries (all leaves of the params tree,
      ``fedjaxsparse.ops.accounting.num_params(params)``), the size the identity compressor
      is built for.
    {{arg_kwargs}}

  Returns:
    An :class:`~fedjaxsparse.core.Algorithm` (``bucketable=True``).
    ``init(key, params, data)`` (``key`` unused) computes the ``h_i⁰`` and returns an
    :class:`~fedjaxsparse.algorithms.efbv.EFBVState`: ``state.x`` (also ``state.params``) the
    model, ``state.h`` the server's ``(1/n) Σ_i h_i`` (kept incrementally), ``state.h_clients``
    the ``[n, ...]`` client control variates ``h_i`` and ``state.t`` (``int32[]``) the
    iterations done. ``step(key, state, data)`` returns ``(state, info)`` with ``info`` an
    :class:`~fedjaxsparse.algorithms.efbv.EFBVInfo`: ``loss`` ((1/n) Σ_i f_i(x) before the
    step), ``bits_up`` (the n dense gradients, ``n · 32·d``, plus another ``n · 32·d`` on the
    first step when ``h_init="grad"``), ``bits_down`` (dense x to the n clients, ``n · 32·d``)
    and ``grad_error`` ((1/n) Σ_i ‖∇f_i(x) − h_i‖² before the step; here h_i is ∇f_i at the
    previous iterate, or h_i⁰ on the first step).

  References:
    {{ref_efbv}}
  """
  return ef_bv(loss_fn, identity(d), gamma, 1.0, 1.0, **kw)


def tuned(method: str, loss_fn: LossFn, compressor: Compressor, num_clients: int, L: float,
          L_tilde: float, *, prox: Prox | None = None, L_max: float | None = None,
          **kw) -> tuple[Algorithm, dict]:
  """``method`` ("ef-bv", "ef21" or "diana") with λ, ν, γ from the theory; ω_ran = ω/n for
  independent compressors. EF-BV: :func:`efbv_params` (``"KL"`` step rule when a prox is
  given, ``"PL"`` otherwise); EF21: the rule the EF-BV paper's experiments ran, ν = λ = λ*
  and r_av = r, i.e. γ = 1/(L + L̃/s*) (``r_av_rule="ef21"``); DIANA with an unbiased
  compressor and no prox: its own rule (:func:`diana_params`, ``L_max`` default ``L``),
  otherwise the EF-BV rule with ν = 1. Returns the algorithm and the parameters."""
  omega_ran = compressor.omega / num_clients
  setting = "KL" if prox is not None else "PL"
  if method == "ef-bv":
    p = efbv_params(compressor.eta, compressor.omega, omega_ran, L, L_tilde, setting)
  elif method == "ef21":
    a = 1.0 - compressor.eta
    lam = min(a / (a * a + compressor.omega), 1.0)
    p = efbv_params(compressor.eta, compressor.omega, omega_ran, L, L_tilde, setting, lam=lam,
                    nu=lam, r_av_rule="ef21")
  elif method == "diana" and compressor.unbiased and prox is None:
    p = diana_params(compressor.omega, omega_ran, L if L_max is None else L_max)
  elif method == "diana":
    p = efbv_params(compressor.eta, compressor.omega, omega_ran, L, L_tilde, setting, nu=1.0)
  else:
    raise ValueError(f"method must be 'ef-bv', 'ef21' or 'diana', got {method!r}.")
  return ef_bv(loss_fn, compressor, p["gamma"], p["lam"], p["nu"], prox=prox, **kw), p


def diana_params(omega: float, omega_ran: float, L_max: float) -> dict:
  """DIANA's own parameters (as the EF-BV paper states them; unbiased ``C ∈ U(ω)``, f
  strongly convex):
  ``λ = 1/(1+ω)``, ``ν = 1``, ``γ = 1/(L_max + L_max(1+√2)² ω_ran)`` (the text's ω_max is
  ω_ran); the rate is ``max(1 − γμ, (1/2 + ω)/(1 + ω))``."""
  if omega < 0 or omega_ran < 0 or not L_max > 0:
    raise ValueError(f"need omega, omega_ran >= 0 and L_max > 0, got {omega}, {omega_ran}, "
                     f"{L_max}.")
  return {"lam": 1.0 / (1.0 + omega), "nu": 1.0, "omega_ran": omega_ran,
          "gamma": 1.0 / (L_max * (1.0 + (1.0 + math.sqrt(2.0)) ** 2 * omega_ran)),
          "rate_floor": (0.5 + omega) / (1.0 + omega)}


def efbv_params(eta: float, omega: float, omega_ran: float, L: float, L_tilde: float,
                setting: str = "PL", lam: float | None = None, nu: float | None = None,
                r_av_rule: str = "theory") -> dict:
  """The theory's parameters (the EF-BV paper's λ*, ν*, s* and γ), computed in float64 on
  the host.

  ``λ* = min((1−η)/((1−η)²+ω), 1)``, ``ν* = min((1−η)/((1−η)²+ω_ran), 1)``,
  ``r = (1−λ+λη)² + λ²ω``, ``r_av = (1−ν+νη)² + ν²ω_ran``, ``s* = √((1+r)/(2r)) − 1``
  (``s = 1/√r − 1`` nonconvex), ``γ = 1/(cL + L̃·√(r_av/r)/s)`` with c = 2 for ``"KL"`` (R ≠ 0)
  and 1 otherwise. Pass ``nu=lam`` for EF21 and ``nu=1`` for DIANA. Uses the cancellation-free
  ``1 − r = 2λ(1−η) − λ²((1−η)² + ω)`` since r is within 1e-3 of 1 in the experiments.

  ``r_av_rule="ef21"`` sets ``r_av = r`` — what the EF-BV paper's experiments ran for EF21
  (its parameter table, "r_av EF21 (= r)": γ = 1/(L + L̃/s*)); with ``nu=lam`` the theory's
  ``r_av = (1−ν+νη)² + ν²ω_ran`` is slightly smaller (a γ about 4 % larger on mushrooms).
  """
  if r_av_rule not in ("theory", "ef21"):
    raise ValueError(f"r_av_rule must be 'theory' or 'ef21', got {r_av_rule!r}.")
  if not 0 <= eta < 1:
    raise ValueError(f"eta must be in [0, 1), got {eta}.")
  if setting not in ("PL", "KL", "nonconvex"):
    raise ValueError(f"setting must be 'PL', 'KL' or 'nonconvex', got {setting!r}.")
  a = 1.0 - eta
  lam = min(a / (a * a + omega), 1.0) if lam is None else lam
  nu = min(a / (a * a + omega_ran), 1.0) if nu is None else nu
  one_minus_r = 2 * lam * a - lam * lam * (a * a + omega)
  r = 1.0 - one_minus_r
  r_av = r if r_av_rule == "ef21" else (1 - nu * a) ** 2 + nu * nu * omega_ran
  if not r < 1:
    raise ValueError(f"r = {r} >= 1: this (compressor, lam) pair has no guarantee; use "
                     "lam = lambda* (lam=None).")
  c = 2.0 if setting == "KL" else 1.0
  if one_minus_r >= 1.0:  # r = 0: identity compressor, proximal gradient descent
    return {"lam": lam, "nu": nu, "r": 0.0, "r_av": r_av, "s": math.inf, "theta": math.inf,
            "gamma": 1.0 / (c * L)}
  if setting == "nonconvex":
    s = one_minus_r / (math.sqrt(r) * (1 + math.sqrt(r)))
  else:
    e = one_minus_r / (2 * r)
    s = e / (1 + math.sqrt(1 + e))
  gamma = 1.0 / (c * L + L_tilde * math.sqrt(r_av / r) / s)
  theta = s * (1 + s) * r / r_av if r_av > 0 else math.inf
  return {"lam": lam, "nu": nu, "r": r, "r_av": r_av, "s": s, "theta": theta, "gamma": gamma}
