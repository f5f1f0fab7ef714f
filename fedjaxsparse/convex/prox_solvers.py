"""Prox solvers 𝒜: approximately minimise a smooth objective ``φ(v)`` over a flat parameter vector
``v`` in a fixed number of iterations ``K`` (static, so a solve is one jitted program).

In SPPM-AS (:mod:`fedjaxsparse.algorithms.sppm`) ``φ`` is the cohort's prox objective
``Φ_t(z) = f_S(z) + ‖z − x_t‖²/(2γ)`` and **one solver iteration is one local communication
round** of the cohort (each member sends its ∇f_i, or its model for the FedAvg-style solver):
the K of the Cohort-Squeeze paper (Yi et al., 2024, arXiv:2406.01115), as we read it. What an
iteration costs beyond that is reported in :attr:`Solver.oracle_calls` (CG also needs a
Hessian–vector product, BFGS evaluates φ in its line search).

Solvers: :func:`newton` (exact in one iteration for quadratics — the exact cohort prox),
:func:`gd`, :func:`cg` (nonlinear conjugate gradients, Polak–Ribière+, with the step that
minimises the local quadratic model; it is linear CG on quadratics, exact after ``dim``
iterations), :func:`bfgs` (``jax.scipy.optimize.minimize``, BFGS with its line search, capped
at K iterations), :func:`lbfgs` (optax's L-BFGS with its zoom line search) and
:func:`optax_steps` (K steps of any optax optimiser, e.g. Adam, on a possibly stochastic
objective — the FedAvg-style inner loop).

``φ(v, key)``: the key draws minibatches for stochastic objectives; deterministic solvers pass
one fixed key.

Source for the team: seed 001 ch. 5 §5.4.3, Tables 5.2/D.1; spec §3.5, C5-13.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.scipy.optimize
import jax.numpy as jnp
import optax
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["Solver", "newton", "gd", "cg", "bfgs", "lbfgs", "optax_steps"]
__dir__ = _public_dir(__all__)

Objective = Callable[[jax.Array, jax.Array], jax.Array]


class Solver(NamedTuple):
  """``solve(phi, v0, key) -> v``; ``iterations`` = K; ``oracle_calls`` = evaluations of φ's
  gradient (or Hessian products) per iteration, for the record."""
  name: str
  iterations: int
  oracle_calls: float
  solve: Callable[[Objective, jax.Array, jax.Array], jax.Array]


def _check_iterations(k) -> int:
  if not isinstance(k, int) or k < 1:
    raise ValueError(f"iterations (K, local communication rounds) must be an int >= 1, got "
                     f"{k!r}.")
  return k


def newton(iterations: int = 1) -> Solver:
  """K Newton steps ``v ← v − ∇²φ(v)^{-1} ∇φ(v)`` (dense Hessian: small models). For a
  quadratic φ one step is the exact minimiser, i.e. the exact prox."""
  k = _check_iterations(iterations)

  def solve(phi, v0, key):
    f = lambda v: phi(v, key)

    def body(_, v):
      return v - jnp.linalg.solve(jax.hessian(f)(v), jax.grad(f)(v))

    return jax.lax.fori_loop(0, k, body, v0)

  return Solver("newton", k, 1.0, solve)


def gd(lr: float, iterations: int) -> Solver:
  """K gradient steps of size ``lr`` (with K = 1 inside SPPM-AS: minibatch GD, MB-GD)."""
  k = _check_iterations(iterations)
  if not lr > 0:
    raise ValueError(f"lr must be > 0, got {lr!r}.")

  def solve(phi, v0, key):
    def body(j, v):
      return v - lr * jax.grad(phi)(v, jax.random.fold_in(key, j))

    return jax.lax.fori_loop(0, k, body, v0)

  return Solver(f"gd(lr={lr:g})", k, 1.0, solve)


def cg(iterations: int) -> Solver:
  """Nonlinear conjugate gradients (Polak–Ribière+, restarted at 0), each step the minimiser
  of φ's local quadratic model along the direction: ``α = −∇φ·d / dᵀ∇²φ d`` (one
  Hessian–vector product). On a quadratic this is linear CG: exact after ``dim`` iterations."""
  k = _check_iterations(iterations)

  def solve(phi, v0, key):
    grad = jax.grad(lambda v: phi(v, key))

    def body(_, c):
      v, g, d = c
      hd = jax.jvp(grad, (v,), (d,))[1]
      curv = jnp.vdot(d, hd)
      alpha = jnp.where(curv > 0, -jnp.vdot(g, d) / jnp.where(curv > 0, curv, 1.0), 0.0)
      v = v + alpha * d
      g_new = grad(v)
      beta = jnp.maximum(0.0, jnp.vdot(g_new, g_new - g) / jnp.maximum(jnp.vdot(g, g), 1e-300))
      return v, g_new, -g_new + beta * d

    g0 = grad(v0)
    return jax.lax.fori_loop(0, k, body, (v0, g0, -g0))[0]

  return Solver("cg", k, 2.0, solve)


def bfgs(iterations: int) -> Solver:
  """BFGS of ``jax.scipy.optimize.minimize`` capped at K iterations (``maxiter``), tolerance
  0 so it runs them all unless it converges exactly; its line search evaluates φ several times
  per iteration (``oracle_calls`` is nominal)."""
  k = _check_iterations(iterations)

  def solve(phi, v0, key):
    res = jax.scipy.optimize.minimize(lambda v: phi(v, key), v0, method="BFGS",
                                      options={"maxiter": k, "gtol": 0.0})
    return res.x

  return Solver("bfgs", k, 1.0, solve)


def lbfgs(iterations: int, memory: int = 10) -> Solver:
  """optax's L-BFGS (``optax.lbfgs``, zoom line search) for K iterations."""
  k = _check_iterations(iterations)
  opt = optax.lbfgs(memory_size=memory)

  def solve(phi, v0, key):
    f = lambda v: phi(v, key)
    value_and_grad = optax.value_and_grad_from_state(f)

    def body(_, c):
      v, state = c
      value, g = value_and_grad(v, state=state)
      updates, state = opt.update(g, state, v, value=value, grad=g, value_fn=f)
      return optax.apply_updates(v, updates), state

    return jax.lax.fori_loop(0, k, body, (v0, opt.init(v0)))[0]

  return Solver("lbfgs", k, 1.0, solve)


def optax_steps(optimizer: optax.GradientTransformation, steps: int,
                name: str = "optax") -> Solver:
  """``steps`` steps of an optax optimiser from a fresh state (stateless: Adam's moments start
  at zero in every solve), key ``fold_in(key, j)`` for step j's minibatch."""
  k = _check_iterations(steps)

  def solve(phi, v0, key):
    def body(j, c):
      v, state = c
      g = jax.grad(phi)(v, jax.random.fold_in(key, j))
      updates, state = optimizer.update(g, state, v)
      return optax.apply_updates(v, updates), state

    return jax.lax.fori_loop(0, k, body, (v0, optimizer.init(v0)))[0]

  return Solver(name, k, 1.0, solve)
