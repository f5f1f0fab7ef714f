"""FLIX personalization and Scafflix / i-Scaffnew.

References:
  Kai Yi, Laurent Condat, Peter Richtárik (2023). Explicit Personalization and Local Training:
    Double Communication Acceleration in Federated Learning. TMLR 2025. arXiv:2305.13170.
  Elnur Gasanov, Ahmed Khaled, Samuel Horváth, Peter Richtárik (2022). FLIX: A Simple and
    Communication-Efficient Alternative to Local Methods in Federated Learning. AISTATS 2022.
    arXiv:2111.11556.
  Konstantin Mishchenko, Grigory Malinovsky, Sebastian Stich, Peter Richtárik (2022).
    ProxSkip: Yes! Local Gradient Steps Provably Lead to Communication Acceleration! Finally!
    ICML 2022. arXiv:2202.09357.

FLIX (Gasanov et al., 2022): each client first solves its own problem, ``x_i* = argmin f_i``
(:func:`local_optima`), then all clients train one ``x`` for the personalised objective

    f̃(x) = (1/n) Σ_i f_i(x̃_i),   x̃_i = α_i x + (1 − α_i) x_i*,   α_i ∈ (0, 1]

and client ``i`` uses its personalised model ``x̃_i`` (:func:`personalize`).

Scafflix (Yi et al. (2023), its pseudocode corrected as described below): per-client step sizes
γ_i, one coin θ ~ Bernoulli(p) per iteration shared by all clients (drawn outside the client
vmap)::

    x̂_i = x_i − (γ_i/α_i)(∇f_i(x̃_i) − h_i)                 gradient at the PERSONALISED point
    θ = 1:  x̄ = Σ_j w_j x̂_j,  w_j ∝ α_j²/γ_j             (the paper's index typo fixed)
            h_i ← h_i + (p α_i/γ_i)(x̄ − x̂_i),  x_i ← x̄
    θ = 0:  x_i ← x̂_i

It is i-Scaffnew (the paper's Scaffnew with individual step sizes) applied to FLIX with
``h_i ↦ α_i h_i``, ``γ_i ↦ γ_i/α_i²``; i-Scaffnew is Scafflix with α_i = 1, and i-Scaffnew with
equal γ_i is Scaffnew/ProxSkip (all tested). The preserved quantity is ``Σ_i α_i h_i``, not
``Σ_i h_i`` as the input line of the paper's Scafflix pseudocode says (that initialisation converges
to a wrong point), so ``h_i⁰ = 0``.

Two forms (``form=``), as for ProxSkip: ``"iteration"`` (one local step, then the coin) and
``"round"`` (``L ~ Geometric(p)`` local steps, then a communication). Partial participation (the
paper's neural-network experiments sample 10 clients per round, without a rule) is this library's
choice, round form only: each round a uniform cohort S downloads the current server model, runs the
round's L local steps from it with its own h_i, and is averaged with weights ∝ α_j²/γ_j
*renormalised over S*; only the cohort's h_i change. The renormalisation keeps Σ_{j∈S}
(α_j²/γ_j)(x̄ − x̂_j) = 0, so Σ_i α_i h_i stays exactly preserved; with S = all clients it is the
full-participation round form.

Source for the team: seed 001 ch. 3, app. B, l. 894, 2716; spec ``specs/seed001_ch3_ch5.md``
§2, C3-1, C3-8. Dissertation numbering: Scafflix Algorithm 4,
i-Scaffnew Algorithm 9, Thm 3.2.3, Cor. 3.2.4, Fig. 3.5.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjaxsparse.ops import accounting
from fedjaxsparse.algorithms.proxskip import FORMS, geometric_local_steps
from fedjaxsparse.runtime.clients import map_clients
from fedjaxsparse.runtime.population import CohortAlgorithm
from fedjaxsparse.core import Algorithm, LossFn, as_float, float_dtype
from fedjaxsparse.data.federated import FederatedData, check_data
from fedjaxsparse.ops.sampling import check_cohort_size, client_keys, sample_cohort
from fedjaxsparse.ops.local import minibatch
from fedjaxsparse.errors import check_int, check_number
from fedjaxsparse.convex.constants import client_curvatures
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["personalize", "flix_models", "LocalOptima", "local_optima", "ScafflixState",
           "ScafflixInfo", "check_local_optima", "scafflix", "ScafflixServer", "ScafflixClient",
           "scafflix_cohort", "i_scaffnew", "FlixState", "flix_sgd", "ScafflixConstants",
           "scafflix_constants"]
__dir__ = _public_dir(__all__)



def _per_client(tree, num_clients: int):
  return jax.tree.map(lambda a: jnp.broadcast_to(a, (num_clients,) + jnp.shape(a)), tree)


def personalize(x: Any, x_star: Any, alpha: jax.Array) -> Any:
  """FLIX's personalised models ``x̃_i = α_i x + (1 − α_i) x_i*``: ``[N, ...]``.

  ``x``: the global model (no client axis) or per-client models ``[N, ...]``; ``x_star``:
  local optima ``[N, ...]``; ``alpha``: ``[N]``."""
  def mix(a, s):
    al = alpha.reshape((-1,) + (1,) * (s.ndim - 1))
    return al * a + (1 - al) * s
  return jax.tree.map(mix, x, x_star)


def flix_models(x_star: Any, alpha: Any) -> Callable[[Any], Any]:
  """``params -> [N, ...]``: the clients' FLIX models ``x̃_i = α_i x + (1 − α_i) x_i*`` of a
  global model ``x``, the ``personal`` argument of
  :func:`fedjaxsparse.evaluation.make_personal_eval_fn` (the one personalised evaluator):
  ``make_personal_eval_fn(model, flix_models(x_star, alpha))`` evaluates client i on its own
  test examples with ``x̃_i`` (the paper's personalised accuracy), the global ``x`` beside.

  Args:
    x_star: the local optima ``x_i*``, a pytree with a leading client axis ``[N, ...]``.
    alpha: the personalisation weights, one float or ``[N]``.
  """
  def personal(params):
    n = jax.tree.leaves(x_star)[0].shape[0]
    return personalize(params, x_star, jnp.broadcast_to(
        jnp.asarray(alpha, jnp.result_type(float)), (n,)))

  return personal


class LocalOptima(NamedTuple):
  """Attributes: ``x_star`` (``[N, ...]``), ``steps`` (``int32 [N]`` gradient steps each
  client took: the pre-solve's cost), ``grad_norm`` (``[N]`` ``‖∇f_i(x_i*)‖`` at the end)."""
  x_star: Any
  steps: jax.Array
  grad_norm: jax.Array


def local_optima(loss_fn: LossFn, params: Any, data: FederatedData, *, lr: Any,
                 tol: float = 1e-6, max_steps: int = 1000, batch_size: int | None = None,
                 key: jax.Array | None = None) -> LocalOptima:
  """Each client's ``x_i* = argmin f_i``, by gradient descent from ``params`` with step ``lr``
  (one float, or ``[N]`` per-client steps such as 1/L_i) until ``‖∇f_i‖ < tol`` (the paper's
  stopping rule, default 1e-6) or ``max_steps``; one jitted, vmapped ``while_loop`` (clients
  that are done stop moving).

  With ``batch_size`` the steps are SGD on minibatches drawn with replacement (key
  ``fold_in(fold_in(key, i), step)``; the paper pre-trains its networks this way, batch 100)
  and the stopping test uses the minibatch gradient; ``tol=0`` runs ``max_steps`` steps."""
  lrs = np.broadcast_to(np.asarray(lr, np.float64), (data.num_clients,))
  check_number("lr", float(lrs.min()), 0.0, None, low_open=True)
  max_steps = check_int("max_steps", max_steps, 0)
  grad = jax.grad(loss_fn)
  key = jax.random.key(0) if key is None else key

  def solve(k_client, lr, d):
    def gradient(w, step):
      return grad(w, *minibatch(jax.random.fold_in(k_client, step), d, batch_size))

    def norm(g):
      return jnp.sqrt(sum(jnp.sum(jnp.square(a)) for a in jax.tree.leaves(g)))

    def cond(c):
      return (c[1] < max_steps) & (c[3] >= tol)

    def body(c):
      w, k, g, _ = c
      w = jax.tree.map(lambda a, gi: a - (lr * gi).astype(a.dtype), w, g)
      g = gradient(w, k + 1)
      return w, k + 1, g, norm(g)

    g0 = gradient(params, 0)
    w, steps, _, gnorm = jax.lax.while_loop(cond, body, (params, jnp.int32(0), g0, norm(g0)))
    return w, steps, gnorm

  ids = jnp.arange(data.num_clients, dtype=jnp.int32)
  x_star, steps, gnorm = jax.jit(jax.vmap(solve))(
      client_keys(key, ids), jnp.asarray(lrs, jnp.result_type(float)), data)
  return LocalOptima(x_star, steps, gnorm)


class ScafflixState(NamedTuple):
  """Attributes:
    x: ``[N, ...]`` client iterates ``x_i`` (the round form sets the cohort's rows to x̄ after
      its communication and leaves the other clients' rows as they were: every round starts
      its cohort from ``server`` anyway, and rewriting all N rows would cost O(N·d) a round).
    h: ``[N, ...]`` control variates ``h_i`` (``Σ_i α_i h_i = 0``).
    server: the last broadcast model x̄ (``x⁰`` at the start): the global model.
    x_star: ``[N, ...]`` local optima (constant).
    t: ``int32[]`` local steps done; comms: ``int32[]`` communications done.
    alpha: ``[N]`` personalization factors α_i (constant).

  ``params`` is the global model x̄ and ``personal`` the clients' FLIX models
  ``x̃_i = α_i x̄ + (1 − α_i) x_i*`` (``[N, ...]``, :func:`fedjaxsparse.personal_params`).
  """
  x: Any
  h: Any
  server: Any
  x_star: Any
  t: jax.Array
  comms: jax.Array
  alpha: jax.Array

  @property
  def params(self):
    return self.server

  @property
  def personal(self):
    return personalize(self.server, self.x_star, self.alpha)


class ScafflixInfo(NamedTuple):
  """Attributes (scalars): ``loss`` (mean ``f_i(x̃_i)`` of the participants at the start),
  ``bits_up``, ``bits_down`` (dense fp32 models, summed over participants; 0 without
  communication), ``communicated``, ``local_steps``, ``alpha_h_sum_norm`` (``‖Σ_i α_i h_i‖``,
  the invariant)."""
  loss: jax.Array
  bits_up: jax.Array
  bits_down: jax.Array
  communicated: jax.Array
  local_steps: jax.Array
  alpha_h_sum_norm: jax.Array


def _per_client_values(name: str, value: Any, n: int, dtype) -> jax.Array:
  """``value`` (one number or ``[N]``) as ``dtype[N]``; another length is an error naming
  ``name``."""
  v = jnp.asarray(value, dtype)
  if v.ndim > 1 or (v.ndim == 1 and v.shape[0] not in (1, n)):
    raise ValueError(f"{name} must be one number or one value per client (shape ({n},)), got "
                     f"shape {tuple(v.shape)}.")
  return jnp.broadcast_to(v, (n,))


def check_local_optima(x_star: Any, params: Any, n: int) -> None:
  """``x_star`` must hold one local optimum per client: ``params``' tree with a leading axis
  of ``n`` on every leaf; otherwise a ValueError naming the first leaf that differs."""
  if x_star is None:
    raise ValueError("x_star (the local optima, [N, ...]) is needed; compute it with "
                     "scafflix.local_optima.")
  want, got = jax.tree.structure(params), jax.tree.structure(x_star)
  if want != got:
    raise ValueError(f"x_star must have the structure of params (one local optimum per "
                     f"client); got {got}, expected {want}.")
  for (path, p), s in zip(jax.tree_util.tree_leaves_with_path(params),
                          jax.tree.leaves(x_star)):
    if tuple(jnp.shape(s)) != (n,) + tuple(jnp.shape(p)):
      raise ValueError(f"x_star{jax.tree_util.keystr(path)} has shape {tuple(jnp.shape(s))}; "
                       f"expected ({n}, *{tuple(jnp.shape(p))}) — one local optimum per client "
                       f"(N = {n}) of the model's shape.")


def scafflix(loss_fn: LossFn, gammas: Any, p: float, alphas: Any, x_star: Any = None, *,
             form: str = "iteration", cohort_size: int | None = None,
             batch_size: int | None = None) -> Algorithm:
  """Scafflix (Yi, Condat and Richtárik, 2023): probabilistic local training with control
  variates (i-Scaffnew) applied to FLIX's personalised objective, with per-client step sizes.

  The problem is FLIX (Gasanov et al., 2022): every client first computes its local optimum
  ``x_i* = argmin f_i`` (:func:`local_optima`); then all clients train one global ``x`` for

    f̃(x) = (1/N) Σ_i f_i(x̃_i),   x̃_i = α_i x + (1 − α_i) x_i*,   α_i ∈ (0, 1],

  and client i uses its personalised model ``x̃_i`` (:func:`personalize`). Each iteration every
  client takes one local step with its gradient taken at the *personalised* point, and one coin
  θ ~ Bernoulli(p), shared by all clients, decides whether they communicate::

    x̂_i = x_i − (γ_i/α_i)(∇f_i(x̃_i) − h_i)
    θ = 1:  x̄ = Σ_j w_j x̂_j,   w_j = (α_j²/γ_j) / Σ_k (α_k²/γ_k)     (upload x̂_j, download x̄)
            h_i ← h_i + (p α_i/γ_i)(x̄ − x̂_i),   x_i ← x̄
    θ = 0:  x_i ← x̂_i   (h_i unchanged)

  starting from ``x_i⁰ = params`` and ``h_i⁰ = 0``. The iteration keeps ``Σ_i α_i h_i`` constant
  (= 0; reported as ``info.alpha_h_sum_norm``), and with exact gradients it converges to the FLIX
  solution, where ``h_i = ∇f_i(x̃_i*)``.

  What is corrected relative to the paper's Scafflix pseudocode:

  * the server average: the paper writes ``x̄ = (γ/n) Σ_j (α_i²/γ_i) x̂_j`` with the client index
    i inside a sum over j (a typo); the weight of client j is α_j²/γ_j, and with
    ``γ = ((1/n) Σ_i α_i²/γ_i)^{-1}`` the weights sum to 1 (the w_j above);
  * the initial control variates: the paper's input asks for ``Σ_i h_i⁰ = 0``, but the quantity
    the iteration preserves is ``Σ_i α_i h_i`` (not ``Σ_i h_i``, when the α_i differ), and the
    method reaches the FLIX solution only if it is 0; a start with ``Σ_i h_i⁰ = 0`` but
    ``Σ_i α_i h_i⁰ ≠ 0`` converges to a wrong point. Here ``h_i⁰ = 0``, which satisfies both.

  Special cases (all tested): α_i = 1 for every i is i-Scaffnew (:func:`i_scaffnew`); α_i = 1
  and equal γ_i is Scaffnew/ProxSkip; p = 1 is gradient descent on f̃ with step
  ``((1/N) Σ_i α_i²/γ_i)^{-1}`` (:func:`flix_sgd`). :func:`scafflix_constants` gives the
  theory's choices γ_i = 1/L_i and p = 1/√κ_max. The module docstring has the full story
  (the i-Scaffnew substitution, the round form, partial participation).

  Args:
    loss_fn: ``(params, x, y, mask) -> f_i``: the loss of one client on its examples
      (:func:`fedjaxsparse.models.make_loss`).
    gammas: the individual step sizes γ_i > 0: an ``[N]`` array, or one float for all clients
      (theory: ``1/L_i``).
    p: the communication probability in (0, 1] (theory: ``1/√κ_max``); the expected number of
      local steps between communications is 1/p.
    alphas: the personalization factors α_i ∈ (0, 1]: an ``[N]`` array or one float (1: no
      personalization, every client uses the global model).
    x_star: ``[N, ...]`` the clients' local optima x_i* (``params``' tree with a leading client
      axis; from :func:`local_optima`, exact for quadratics); may be ``None`` only when every
      α_i = 1 (then it is unused).
    form: ``"iteration"``: each ``step`` is one local step followed by the coin; ``"round"``:
      each ``step`` is one communication round, ``L ~ Geometric(p)`` local steps (the last one
      followed by the average), the same process grouped by communications.
    cohort_size: clients per round, a uniform sample without replacement (round form only;
      ``None``: all N). The cohort starts from the server model x̄, its average uses the weights
      α_j²/γ_j renormalised over the cohort, and only its h_i change, so ``Σ_i α_i h_i`` stays
      preserved (this partial-participation rule is the library's; the paper gives none).
    batch_size: examples per local gradient, drawn with replacement; ``None``: the client's full
      data (exact gradients).

  Returns:
    An :class:`fedjaxsparse.Algorithm` ``(init, step)``. ``init(key, params, data)`` returns a
    :class:`ScafflixState` with fields ``x`` (``[N, ...]`` client iterates x_i), ``h``
    (``[N, ...]`` control variates, zero at the start), ``server`` (the last average x̄,
    ``params`` at the start), ``x_star`` (``[N, ...]``), ``t`` (local steps done), ``comms``
    (communications done) and ``alpha`` (``[N]``); ``state.params`` is the global model x̄ and
    ``state.personal`` the clients' FLIX models ``α_i x̄ + (1 − α_i) x_i*`` (``[N, ...]``).
    ``step(key, state, data)`` returns ``(state, info)``, ``info`` a :class:`ScafflixInfo` of
    scalars: ``loss`` (mean ``f_i(x̃_i)`` of the participating clients before the step),
    ``bits_up`` and ``bits_down`` (dense fp32 models, ``32·d`` per participant, 0 when the
    step does not communicate), ``communicated`` (1.0 or 0.0), ``local_steps`` (1, or L in
    the round form) and ``alpha_h_sum_norm`` (``‖Σ_i α_i h_i‖`` over all N clients: the
    invariant, ~0).

  References:
    Kai Yi, Laurent Condat, Peter Richtárik (2023). Explicit Personalization and Local
      Training: Double Communication Acceleration in Federated Learning. TMLR 2025.
      arXiv:2305.13170.
    Elnur Gasanov, Ahmed Khaled, Samuel Horváth, Peter Richtárik (2022). FLIX: A Simple and
      Communication-Efficient Alternative to Local Methods in Federated Learning. AISTATS
      2022. arXiv:2111.11556.
    Konstantin Mishchenko, Grigory Malinovsky, Sebastian Stich, Peter Richtárik (2022).
      ProxSkip: Yes! Local Gradient Steps Provably Lead to Communication Acceleration!
      Finally! ICML 2022. arXiv:2202.09357.

  Source for the team: seed 001 ch. 3 (Scafflix = dissertation Algorithm 4; typo l. 894,
  input l. 876); spec ``specs/seed001_ch3_ch5.md`` §2.1, C3-1, C3-2, C3-8.
  """
  check_number("p (communication probability)", p, 0.0, 1.0, low_open=True)
  if form not in FORMS:
    raise ValueError(f"form must be one of {FORMS}, got {form!r}.")
  if cohort_size is not None and form != "round":
    raise ValueError("cohort_size (partial participation) needs form='round'.")
  # concrete values are checked when given (under a trace, as when the runner's strategy
  # choice traces init, even a reduction of a concrete array is abstract)
  for name, v, high in (("gamma_i", gammas, None), ("alpha_i", alphas, 1.0)):
    if not isinstance(v, jax.core.Tracer):
      v = np.asarray(v, np.float64)
      check_number(name, float(v.min()), 0.0, high, low_open=True)
      check_number(name, float(v.max()), 0.0, high, low_open=True)
      if name == "alpha_i" and x_star is None and float(v.min()) < 1:
        raise ValueError("x_star (the local optima) is needed when some alpha_i < 1; compute "
                         "it with scafflix.local_optima.")
  value_and_grad = jax.value_and_grad(loss_fn)

  def coefficients(n):
    dtype = jnp.result_type(float)  # float64 under x64: the weights α_j²/γ_j and the
    g = _per_client_values("gammas", gammas, n, dtype)  # h-steps pα_i/γ_i must stay
    a = _per_client_values("alphas", alphas, n, dtype)  # proportional (Σα_i h_i = 0)
    return g, a

  def init(key, params, data: FederatedData) -> ScafflixState:
    del key
    check_data(data)
    n = data.num_clients
    check_cohort_size(cohort_size, n)
    _, a = coefficients(n)
    x = _per_client(params, n)
    if x_star is not None:
      check_local_optima(x_star, params, n)
    xs = x if x_star is None else x_star
    return ScafflixState(x, jax.tree.map(jnp.zeros_like, x), params, xs,
                         jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32), a)

  def client_step(key, x, h, xs, alpha, gamma, data):  # one client: x̂_i and f_i(x̃_i)
    # in the model's dtype (the coefficients are float64 under x64; a float32 model stays so)
    xt = jax.tree.map(lambda a, s: (alpha * a + (1 - alpha) * s).astype(a.dtype), x, xs)
    loss, g = value_and_grad(xt, *minibatch(key, data, batch_size))
    return jax.tree.map(lambda a, gi, hi: (a - (gamma / alpha) * (gi - hi)).astype(a.dtype),
                        x, g, h), loss

  def local_step(key, x, h, xs, a, g, data, ids):
    return map_clients(client_step, data, client_keys(key, ids), x, h, xs, a, g)

  def communicate(x_hat, h, a, g):
    w = a ** 2 / g
    w = w / jnp.sum(w)
    # in the model's dtype (a float32 model in a float64 program)
    x_bar = jax.tree.map(lambda v: jnp.tensordot(w.astype(v.dtype), v, axes=1), x_hat)
    coef = p * a / g
    h = jax.tree.map(lambda hi, v, xb: hi + (coef.reshape((-1,) + (1,) * (v.ndim - 1))
                                             * (xb - v)).astype(hi.dtype), h, x_hat, x_bar)
    return x_bar, h

  def info(state, losses, a, c, communicated, steps):
    d = accounting.num_params(state.server)
    bits = communicated * as_float(c * accounting.dense_bits(d))
    ah = jax.tree.map(lambda v: jnp.tensordot(a, v, axes=1), state.h)
    norm = jnp.sqrt(sum(jnp.sum(jnp.square(v)) for v in jax.tree.leaves(ah)))
    return ScafflixInfo(jnp.mean(losses), bits, bits, communicated, steps, norm)

  def iteration_step(key, state: ScafflixState, data: FederatedData):
    n = data.num_clients
    g, a = coefficients(n)
    k_coin, k_local, _ = jax.random.split(key, 3)  # ProxSkip's key layout: same coins
    theta = jax.random.bernoulli(k_coin, p)  # ONE coin for all clients
    ids = jnp.arange(n, dtype=jnp.int32)
    x_hat, losses = local_step(k_local, state.x, state.h, state.x_star, a, g, data, ids)

    def comm(x_hat, h):
      x_bar, h = communicate(x_hat, h, a, g)
      return _per_client(x_bar, n), h, x_bar

    x, h, server = jax.lax.cond(theta, comm, lambda xh, h: (xh, h, state.server), x_hat,
                                state.h)
    new = state._replace(x=x, h=h, server=server, t=state.t + 1,
                         comms=state.comms + theta.astype(jnp.int32))
    return new, info(new, losses, a, n, theta.astype(float_dtype()), jnp.int32(1))

  def round_step(key, state: ScafflixState, data: FederatedData):
    n = data.num_clients
    g_all, a_all = coefficients(n)
    k_len, k_cohort, k_local = jax.random.split(key, 3)
    steps = geometric_local_steps(k_len, p)
    ids = sample_cohort(k_cohort, n, cohort_size)
    take = lambda tree: jax.tree.map(lambda v: jnp.take(v, ids, axis=0), tree)
    c = ids.shape[0]
    cdata = data if c == n else data.select(ids)
    h, xs, a, g = take(state.h), take(state.x_star), a_all[ids], g_all[ids]
    x0 = _per_client(state.server, c)  # the cohort starts from the broadcast model
    x_hat, losses = local_step(jax.random.fold_in(k_local, 0), x0, h, xs, a, g, cdata, ids)

    def body(j, x_hat):
      return local_step(jax.random.fold_in(k_local, j), x_hat, h, xs, a, g, cdata, ids)[0]

    x_hat = jax.lax.fori_loop(1, steps, body, x_hat)
    x_bar, h = communicate(x_hat, h, a, g)
    h_all = jax.tree.map(lambda v, r: v.at[ids].set(r), state.h, h)
    x_all = jax.tree.map(lambda v, r: v.at[ids].set(jnp.broadcast_to(r, (c,) + r.shape)),
                         state.x, x_bar)   # the cohort's rows only: O(c·d), not O(N·d)
    new = state._replace(x=x_all, h=h_all, server=x_bar, t=state.t + steps,
                         comms=state.comms + 1)
    return new, info(new, losses, a_all, c, as_float(1), steps)

  return Algorithm(init, iteration_step if form == "iteration" else round_step)


class ScafflixServer(NamedTuple):
  """The server state of :func:`scafflix_cohort`: ``params`` (the global model x̄), ``t``
  (local steps done) and ``comms`` (communications done)."""
  params: Any
  t: jax.Array
  comms: jax.Array


class ScafflixClient(NamedTuple):
  """One client's state of :func:`scafflix_cohort`: its control variate ``h`` and local optimum
  ``x_star`` (the model's shape each)."""
  h: Any
  x_star: Any


def scafflix_cohort(loss_fn: LossFn, gammas: Any, p: float, alphas: Any, *,
                    optimum_lr: float, optimum_steps: int, optimum_batch_size: int | None = None,
                    cohort_size: int | None = None, batch_size: int | None = None,
                    key: jax.Array | None = None) -> CohortAlgorithm:
  """Scafflix's round form (:func:`scafflix` with ``form="round"``) as a
  :class:`~fedjaxsparse.runtime.population.CohortAlgorithm`: every client's state — its control
  variate h_i and local optimum x_i* — is read and written for the cohort only, so
  :func:`fedjaxsparse.runtime.population.run` can keep the population's state in host memory
  (FEMNIST's 3,400 writers hold two model copies each) while the device holds a cohort.

  The local optimum x_i* is computed when the client's state is made (``init_client``):
  ``optimum_steps`` (S)GD steps of size ``optimum_lr`` on the client's data from the initial
  model (minibatches of ``optimum_batch_size``, keys from ``key``; ``None``: full batch) —
  :func:`local_optima` for one client with ``tol=0``. ``gammas`` and ``alphas``: one number
  for all clients or ``[N]``. Each round: L ~ Geometric(p) local steps of the cohort from x̄,
  the weighted average with weights ∝ α_i²/γ_i over the cohort, the cohort's h_i updated
  (the library's partial-participation rule of :func:`scafflix`). ``info.alpha_h_sum_norm``
  is ``‖Σ_{i∈S} α_i h_i‖`` over the cohort (the population's sum is not on the device); with
  full participation it is the invariant.
  """
  check_number("p (communication probability)", p, 0.0, 1.0, low_open=True)
  check_number("optimum_lr", optimum_lr, 0.0, None, low_open=True)
  optimum_steps = check_int("optimum_steps", optimum_steps, 0)
  value_and_grad, grad = jax.value_and_grad(loss_fn), jax.grad(loss_fn)
  key = jax.random.key(0) if key is None else key

  def init(key_, params) -> ScafflixServer:
    del key_
    return ScafflixServer(params, jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))

  def init_client(server: ScafflixServer, data) -> ScafflixClient:
    def body(step, w):
      g = grad(w, *minibatch(jax.random.fold_in(key, step), data, optimum_batch_size))
      return jax.tree.map(lambda a, gi: a - (optimum_lr * gi).astype(a.dtype), w, g)

    x_star = jax.lax.fori_loop(0, optimum_steps, body, server.params)
    return ScafflixClient(jax.tree.map(jnp.zeros_like, server.params), x_star)

  def client_step(key_, x, h, xs, alpha, gamma, data):
    xt = jax.tree.map(lambda a, s: alpha * a + (1 - alpha) * s, x, xs)
    loss, g = value_and_grad(xt, *minibatch(key_, data, batch_size))
    return jax.tree.map(lambda a, gi, hi: a - (gamma / alpha) * (gi - hi), x, g, h), loss

  def step(key_, server: ScafflixServer, rows: ScafflixClient, ids, data, num_clients: int):
    dtype = jnp.result_type(float)
    g = _per_client_values("gammas", gammas, num_clients, dtype)[ids]
    a = _per_client_values("alphas", alphas, num_clients, dtype)[ids]
    k_len, k_local = jax.random.split(key_)
    steps = geometric_local_steps(k_len, p)
    c = ids.shape[0]
    local = lambda j, x: map_clients(client_step, data, client_keys(  # noqa: E731
        jax.random.fold_in(k_local, j), ids), x, rows.h, rows.x_star, a, g)
    x_hat, losses = local(0, _per_client(server.params, c))
    x_hat = jax.lax.fori_loop(1, steps, lambda j, x: local(j, x)[0], x_hat)
    w = a ** 2 / g
    w = w / jnp.sum(w)
    x_bar = jax.tree.map(lambda v: jnp.tensordot(w, v, axes=1), x_hat)
    coef = p * a / g
    h = jax.tree.map(lambda hi, v, xb: hi + coef.reshape((-1,) + (1,) * (v.ndim - 1))
                     * (xb - v), rows.h, x_hat, x_bar)
    bits = as_float(c * accounting.dense_bits(accounting.num_params(x_bar)))
    ah = jax.tree.map(lambda v: jnp.tensordot(a, v, axes=1), h)
    norm = jnp.sqrt(sum(jnp.sum(jnp.square(v)) for v in jax.tree.leaves(ah)))
    info = ScafflixInfo(jnp.mean(losses), bits, bits, as_float(1), steps, norm)
    new = ScafflixServer(x_bar, server.t + steps, server.comms + 1)
    return new, rows._replace(h=h), info

  return CohortAlgorithm(init, init_client, step, cohort_size)


def i_scaffnew(loss_fn: LossFn, gammas: Any, p: float, **kw) -> Algorithm:
  """i-Scaffnew (Yi, Condat and Richtárik, 2023): Scaffnew (ProxSkip for federated learning)
  with individual step sizes γ_i — :func:`scafflix` with every α_i = 1 (no personalization).

  Each iteration every client takes one local step corrected by its control variate, and one coin
  θ ~ Bernoulli(p), shared by all clients, decides whether they communicate::

    x̂_i = x_i − γ_i (∇f_i(x_i) − h_i)
    θ = 1:  x̄ = Σ_j w_j x̂_j,   w_j = (1/γ_j) / Σ_k (1/γ_k)     (upload x̂_j, download x̄)
            h_i ← h_i + (p/γ_i)(x̄ − x̂_i),   x_i ← x̄
    θ = 0:  x_i ← x̂_i   (h_i unchanged)

  from ``x_i⁰ = params`` and ``h_i⁰ = 0``; ``Σ_i h_i`` stays 0. The weights are ∝ 1/γ_j: the
  paper's pseudocode writes ``1/γ_i`` inside the sum over j, an index typo fixed here. With equal
  γ_i it is Scaffnew/ProxSkip (tested). See :func:`scafflix` and the module docstring.

  Args:
    loss_fn: ``(params, x, y, mask) -> f_i``: the loss of one client on its examples.
    gammas: the individual step sizes γ_i > 0: an ``[N]`` array, or one float for all clients
      (theory: ``1/L_i``).
    p: the communication probability in (0, 1].
    **kwargs: forwarded to :func:`scafflix`: ``form`` (``"iteration"``: one local step per
      ``step``; ``"round"``: one communication round of ``L ~ Geometric(p)`` local steps per
      ``step``), ``cohort_size`` (clients per round, round form only; ``None``: all) and
      ``batch_size`` (examples per local gradient, with replacement; ``None``: full data).

  Returns:
    An :class:`fedjaxsparse.Algorithm` as :func:`scafflix`'s with α_i = 1: its state is a
    :class:`ScafflixState` (``x`` and ``h`` ``[N, ...]``, ``server``, ``x_star`` — a copy of
    the initial per-client models, unused —, ``t``, ``comms``, ``alpha`` = 1;
    ``state.params`` is the global model x̄, ``state.personal`` equals it on every client), and
    ``step`` reports a :class:`ScafflixInfo` (``loss``, ``bits_up``, ``bits_down``,
    ``communicated``, ``local_steps``, ``alpha_h_sum_norm`` = ``‖Σ_i h_i‖``).

  References:
    Kai Yi, Laurent Condat, Peter Richtárik (2023). Explicit Personalization and Local
      Training: Double Communication Acceleration in Federated Learning. TMLR 2025.
      arXiv:2305.13170.
    Konstantin Mishchenko, Grigory Malinovsky, Sebastian Stich, Peter Richtárik (2022).
      ProxSkip: Yes! Local Gradient Steps Provably Lead to Communication Acceleration!
      Finally! ICML 2022. arXiv:2202.09357.

  Source for the team: seed 001 app. B (i-Scaffnew = dissertation Algorithm 9, typo l. 2716);
  spec ``specs/seed001_ch3_ch5.md`` §2.2, C3-2.
  """
  return scafflix(loss_fn, gammas, p, 1.0, None, **kw)


class FlixState(NamedTuple):
  """Attributes: ``params`` (the global x), ``x_star`` (``[N, ...]``), ``round``, ``alpha``
  (``[N]``); ``personal``: the clients' models ``x̃_i = α_i x + (1 − α_i) x_i*``."""
  params: Any
  x_star: Any
  round: jax.Array
  alpha: jax.Array

  @property
  def personal(self):
    return personalize(self.params, self.x_star, self.alpha)


def flix_sgd(loss_fn: LossFn, lr: float, alphas: Any, x_star: Any, *,
             cohort_size: int | None = None, batch_size: int | None = None) -> Algorithm:
  """FLIX (Gasanov, Khaled, Horváth and Richtárik, 2022) solved by distributed (S)GD — the
  baseline "FLIX" of the Scafflix paper (Yi et al., 2023): one communication per step.

  FLIX's objective, with each client's local optimum ``x_i* = argmin f_i``
  (:func:`local_optima`) and personalization factors α_i ∈ (0, 1]::

    f̃(x) = (1/N) Σ_i f_i(x̃_i),   x̃_i = α_i x + (1 − α_i) x_i*

  One step: the server broadcasts x to a cohort S; each member sends ``α_i ∇f_i(x̃_i)`` (the
  gradient of its term of f̃, on a minibatch with ``batch_size``); the server steps
  ``x ← x − lr · (1/|S|) Σ_{i∈S} α_i ∇f_i(x̃_i)``. Client i finally uses ``x̃_i``
  (:func:`personalize`). A natural step is ``lr ≤ 1/((1/N) Σ_i α_i² L_i)``, the bound on f̃'s
  smoothness (:func:`scafflix_constants`' ``flix_lr``). With full participation and
  ``lr = ((1/N) Σ_i α_i²/γ_i)^{-1}`` it is :func:`scafflix` with p = 1 (tested).

  Args:
    loss_fn: ``(params, x, y, mask) -> f_i``: the loss of one client on its examples.
    lr: the server step size η > 0.
    alphas: the personalization factors α_i ∈ (0, 1]: an ``[N]`` array or one float.
    x_star: ``[N, ...]`` the clients' local optima x_i* (``params``' tree with a leading
      client axis; from :func:`local_optima`); required.
    cohort_size: clients per step, a uniform sample without replacement; ``None``: all N (the
      average is uniform over the cohort).
    batch_size: examples per client gradient, drawn with replacement; ``None``: the client's
      full data (exact gradients, GD on f̃).

  Returns:
    An :class:`fedjaxsparse.Algorithm` ``(init, step)``. Its state is a :class:`FlixState`:
    ``params`` (the global x), ``x_star`` (``[N, ...]``), ``round`` (steps done) and ``alpha``
    (``[N]``); ``state.personal`` is the clients' models ``α_i x + (1 − α_i) x_i*``
    (``[N, ...]``). ``step(key, state, data)`` returns ``(state, info)``, ``info`` a
    :class:`ScafflixInfo`: ``loss`` (mean ``f_i(x̃_i)`` of the cohort before the step),
    ``bits_up`` and ``bits_down`` (``32·d`` per cohort member: one dense fp32 vector each way),
    ``communicated`` (always 1.0), ``local_steps`` (always 1) and ``alpha_h_sum_norm``
    (always 0: FLIX keeps no control variates).

  References:
    Elnur Gasanov, Ahmed Khaled, Samuel Horváth, Peter Richtárik (2022). FLIX: A Simple and
      Communication-Efficient Alternative to Local Methods in Federated Learning. AISTATS
      2022. arXiv:2111.11556.
    Kai Yi, Laurent Condat, Peter Richtárik (2023). Explicit Personalization and Local
      Training: Double Communication Acceleration in Federated Learning. TMLR 2025.
      arXiv:2305.13170.

  Source for the team: seed 001 ch. 3; spec ``specs/seed001_ch3_ch5.md`` §2.4, C3-9.
  """
  check_number("lr", lr, 0.0, None, low_open=True)
  value_and_grad = jax.value_and_grad(loss_fn)

  def init(key, params, data: FederatedData) -> FlixState:
    del key
    check_data(data)
    check_cohort_size(cohort_size, data.num_clients)
    check_local_optima(x_star, params, data.num_clients)
    a = _per_client_values("alphas", alphas, data.num_clients, jnp.result_type(float))
    return FlixState(params, x_star, jnp.zeros((), jnp.int32), a)

  def client(key, params, xs, alpha, data):
    xt = jax.tree.map(lambda a, s: alpha * a + (1 - alpha) * s, params, xs)
    loss, g = value_and_grad(xt, *minibatch(key, data, batch_size))
    return jax.tree.map(lambda v: alpha * v, g), loss

  def step(key, state: FlixState, data: FederatedData):
    n = data.num_clients
    a = jnp.broadcast_to(jnp.asarray(alphas, jnp.result_type(float)), (n,))
    k_cohort, k_local = jax.random.split(key)
    ids = sample_cohort(k_cohort, n, cohort_size)
    c = ids.shape[0]
    cdata = data if c == n else data.select(ids)
    xs = jax.tree.map(lambda v: jnp.take(v, ids, axis=0), state.x_star)
    grads, losses = map_clients(lambda k, s, al, d: client(k, state.params, s, al, d), cdata,
                                client_keys(k_local, ids), xs, a[ids])
    params = jax.tree.map(lambda x, g: x - lr * jnp.mean(g, 0), state.params, grads)
    bits = as_float(c * accounting.dense_bits(accounting.num_params(params)))
    info = ScafflixInfo(jnp.mean(losses), bits, bits, as_float(1), jnp.int32(1),
                        as_float(0))
    return state._replace(params=params, round=state.round + 1), info

  return Algorithm(init, step)


class ScafflixConstants(NamedTuple):
  """Step sizes and communication probability of Scafflix from the data (Yi et al. (2023)).

  Attributes: ``gammas`` ``[N]`` (``1/L_i``, or ``1/max_i L_i`` for all with global steps),
  ``p`` (``1/√κ_max``, the paper's corollary), ``L`` and ``mu`` ``[N]`` (the clients' L_i, μ_i),
  ``kappa_max`` (``max_i L_i/μ_i``), ``flix_lr`` (``1/((1/N) Σ_i α_i² L_i)``, GD on FLIX's
  step: that sum bounds f̃'s smoothness)."""
  gammas: np.ndarray
  p: float
  L: np.ndarray
  mu: np.ndarray
  kappa_max: float
  flix_lr: float


def scafflix_constants(data: FederatedData, l2: float, loss: str = "logistic",
                       alphas=1.0, individual: bool = True, **kw) -> ScafflixConstants:
  """Theory's choices for Scafflix on a linear model (keywords of
  :func:`client_curvatures`): γ_i = 1/L_i (the paper's convergence theorem with exact gradients,
  A_i = L_i) or, with ``individual=False``, one step 1/max_i L_i (the paper's "global
  stepsize");
  p = 1/√κ_max with κ_max = max_i L_i/μ_i — the rate and p depend on f_i's constants, not on
  α (f̃_i's are α_i² times f_i's, and Scafflix's steps γ_i/α_i account for that)."""
  ls, mus = client_curvatures(data, l2, loss, **kw)
  if np.min(mus) <= 0:
    raise ValueError(f"l2 (or the data) must make every f_i strongly convex for p = "
                     f"1/sqrt(kappa_max); min mu_i = {np.min(mus):.3g}.")
  kappa = float(np.max(ls / mus))
  a = np.broadcast_to(np.asarray(alphas, np.float64), ls.shape)
  gammas = 1 / ls if individual else np.full_like(ls, 1 / ls.max())
  return ScafflixConstants(gammas, float(min(1.0, 1 / np.sqrt(kappa))), ls, mus, kappa,
                           float(1 / np.mean(a ** 2 * ls)))
