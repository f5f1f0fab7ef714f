"""ProxSkip / Scaffnew and the Sparse-ProxSkip family.

References:
  Konstantin Mishchenko, Grigory Malinovsky, Sebastian Stich, Peter Richtárik (2022).
    ProxSkip: Yes! Local Gradient Steps Provably Lead to Communication Acceleration! Finally!
    ICML 2022. arXiv:2202.09357.
  Georg Meinhardt, Kai Yi, Laurent Condat, Peter Richtárik (2024). Prune at the Clients, Not
    the Server: Accelerated Sparse Training in Federated Learning. arXiv preprint.
    arXiv:2405.20623.
  Laurent Condat, Peter Richtárik (2023). RandProx: Primal-Dual Optimization Algorithms with
    Randomized Proximal Updates. ICLR 2023. arXiv:2207.12891.

Problem: ``min_w (1/N) Σ_i f_i(w)`` in consensus form. Every client ``i`` keeps an iterate
``w_i`` and a control variate ``h_i`` with ``Σ_i h_i = 0``. One *iteration*::

    L6   ŵ_i = w_i − γ (∇f_i(w_i) − h_i)                  (all clients, one vmapped kernel)
    L7   [local_prox]   ŵ_i = prox(ŵ_i)                      Sparse-ProxSkip-Local: TopK
    L8   with probability p (ONE coin θ_t for all clients, drawn outside the vmap):
    L9     [upload_prox] m_i = prox(ŵ_i); stored back into ŵ_i if ``write_back``
                                                             Sparse-ProxSkip: TopK, written back
    L10    w̄ = (1/N) Σ_j m_j                                 (uniform mean = consensus prox)
    L11    [server_prox] w_out = prox(w̄)                     Accelerated-Server-Pruning: TopK
    L12    h_i ← h_i + (p/γ) (r − ŵ_i),  r = w_out (``h_after_server_prox``) or w̄
           w_i ← w_out
    L14  otherwise w_i ← ŵ_i, h_i unchanged.

The variants differ only in the three prox hooks and two flags; each named constructor is
one call of :func:`meta_sparse_proxskip`. Σ_i h_i is conserved exactly when the vector the
h-update subtracts (ŵ_i) averages to the reference r — true for ProxSkip, Sparse-ProxSkip,
Sparse-ProxSkip-Local and ASP-modified, false for ASP (``ΔΣh = (pN/γ)(TopK(w̄) − w̄)``) and
Sparse-ProxSkip-modified (``ΔΣh = (p/γ) Σ_i (TopK(ŵ_i) − ŵ_i)``).

Two forms (``form=``): ``"iteration"`` — ``step`` is one iteration of Algorithm 1 (a local
step, the coin, maybe a communication); ``"round"`` — ``step`` draws the number of local steps
``L ~ Geometric(p)`` on {1, 2, …} inside ``jit``, runs them (a ``while_loop``), then
communicates. The round form is the iteration form grouped between successive coins θ = 1.

Evaluation (Meinhardt et al. (2024), Appendix B: "every method's model is TopK'd before any
evaluation"): the state's ``params`` is the last model the server broadcast; apply ``top_k`` in
the runner's ``params_fn`` for the sparse evaluation (see the ``sparse_proxskip`` experiment).

Source for the team: seed 000 (§3, §B, §E); spec ``specs/seed000_003.md`` A.2–A.11;
Algorithm 1 "Meta Sparse-ProxSkip".
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from fedjaxsparse.ops import accounting
from fedjaxsparse.runtime.clients import client_ids, map_clients
from fedjaxsparse.core import Algorithm, LossFn, as_float, float_dtype
from fedjaxsparse.data.federated import FederatedData, check_data
from fedjaxsparse.ops.sampling import client_keys
from fedjaxsparse.ops.local import minibatch
from fedjaxsparse.errors import check_number, check_positive
from fedjaxsparse.ops import proxes
from fedjaxsparse.ops.proxes import Prox
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["ProxSkipState", "ProxSkipInfo", "ProxSkipKernel", "proxskip_kernel",
           "geometric_local_steps", "meta_sparse_proxskip", "proxskip", "sparse_proxskip",
           "sparse_proxskip_local", "sparse_proxskip_modified", "accelerated_server_pruning",
           "accelerated_server_pruning_modified", "randprox_l1"]
__dir__ = _public_dir(__all__)

FORMS = ("iteration", "round")


class ProxSkipState(NamedTuple):
  """Attributes:
    w: ``[N, ...]`` client iterates ``w_i``.
    h: ``[N, ...]`` control variates ``h_i`` (``Σ_i h_i = 0`` for the drift-free variants).
    server: ``[...]`` the model the server broadcast last (``w̄`` after L11; ``w_0`` at start).
    t: ``int32[]`` iterations (local steps) done.
    comms: ``int32[]`` communications done.
  """
  w: Any
  h: Any
  server: Any
  t: jax.Array
  comms: jax.Array

  @property
  def params(self):
    return self.server


class ProxSkipInfo(NamedTuple):
  """Attributes (scalars):
    loss: ``(1/N) Σ_i f_i(w_i)`` at the start of the step.
    bits_up: uplink bits of the step, summed over clients (0 without communication).
    bits_down: downlink bits of the step, summed over clients.
    communicated: 1.0 if the step communicated.
    local_steps: ``int32`` local steps in the step (1 in the iteration form).
    sum_h_norm: ``‖Σ_i h_i‖`` after the step (the zero-sum diagnostic, Figs 6-8).
    mean_h_norm: ``(1/N) Σ_i ‖h_i‖`` after the step.
    upload_nnz: mean non-zeros of the uploaded vectors (0 without communication).
    server_norm: ``‖w_server‖`` after the step (Fig 8's ‖w‖).
  """
  loss: jax.Array
  bits_up: jax.Array
  bits_down: jax.Array
  communicated: jax.Array
  local_steps: jax.Array
  sum_h_norm: jax.Array
  mean_h_norm: jax.Array
  upload_nnz: jax.Array
  server_norm: jax.Array


class ProxSkipKernel(NamedTuple):
  """The low-level pieces, for composing new methods and for tests.

  Attributes:
    init: as ``Algorithm.init``.
    local_step: ``(key, state, data) -> (w_hat [N, ...], losses [N])``, L6–L7 for all clients.
    communicate: ``(state, w_hat, key=None, ids=None) -> (state, (bits_up, bits_down,
      upload_nnz))``, L9–L12 (the key feeds an uplink compressor, folded with each client's
      original id ``ids[N]`` — :func:`fedjaxsparse.runtime.clients.client_ids` — so bucketed and
      padded runs draw the same compressions).
    skip: ``(state, w_hat) -> state``, L14.
  """
  init: Callable
  local_step: Callable
  communicate: Callable
  skip: Callable


def _tree_norm(tree) -> jax.Array:
  return jnp.sqrt(sum(jnp.sum(jnp.square(a)) for a in jax.tree.leaves(tree)))


def _check(gamma, p) -> None:
  """Validate concrete hyper-parameters; traced ones (inside a vmapped sweep) pass through."""
  check_positive("gamma (step size)", gamma)
  check_number("p (communication probability)", p, 0.0, 1.0, low_open=True)


def proxskip_kernel(loss_fn: LossFn, gamma: float, p: float, *,
                    local_prox: Prox | None = None, upload_prox: Prox | None = None,
                    write_back: bool = True, server_prox: Prox | None = None,
                    h_after_server_prox: bool = True, batch_size: int | None = None,
                    clip: float | None = None, clip_mode: str = "norm",
                    uplink: Any = None, encoding: str = "auto",
                    augment: Callable | None = None) -> ProxSkipKernel:
  """The pieces of Algorithm 1 (see the module docstring for the hooks).

  Args:
    loss_fn: ``(params, x, y, mask) -> f_i`` for one client. The data may be a
      ``FederatedData`` or size-bucketed :class:`fedjaxsparse.runtime.clients.BucketedData`.
    gamma: step size γ.
    p: communication probability p ∈ (0, 1].
    local_prox, upload_prox, server_prox: the L7 / L9 / L11 operators (``None`` = identity).
    write_back: L9 stores the upload back into ``ŵ_i`` (Sparse-ProxSkip) or not
      (Sparse-ProxSkip-modified).
    h_after_server_prox: L12 uses ``w_out = server_prox(w̄)`` (Algorithm 1, ASP) or ``w̄``
      (ASP-modified: the h-update before the pruning).
    batch_size: examples per local gradient (with replacement; static) or ``None`` for the
      full local gradient (the convex experiments of Meinhardt et al. (2024)).
    clip: gradient clipping threshold (Meinhardt et al. (2024), Appendix E: ProxSkip on
      ResNet-18 "would run into NaN errors" without it; the paper does not say norm or value
      clipping), or ``None``.
    clip_mode: ``"norm"`` (rescale the gradient to global norm ≤ clip) or ``"value"``
      (clip every entry to [−clip, clip]).
    uplink: a :class:`fedjaxsparse.ops.compressors.Compressor` applied to every uploaded vector
      after ``upload_prox`` (independent key per client); the compressed vector is the message
      (and is written back when ``write_back``), charged ``uplink.bits(d)`` per client.
    encoding: sparse-message encoding for the bit accounting (:mod:`fedjaxsparse.ops.accounting`).
    augment: ``(key, x) -> x`` applied to every local minibatch inside ``jit``
      (:mod:`fedjaxsparse.ops.augment`; the flip/crop/normalise of Meinhardt et al. (2024),
      Appendix E, for CIFAR-10).
  """
  _check(gamma, p)
  if clip_mode not in ("norm", "value"):
    raise ValueError(f"clip_mode must be 'norm' or 'value', got {clip_mode!r}.")
  if clip is not None:
    check_positive("clip", clip)  # traced in a search: unchecked
  local_prox = local_prox or proxes.identity
  upload_prox = upload_prox or proxes.identity
  server_prox = server_prox or proxes.identity
  grad_fn = jax.value_and_grad(loss_fn)

  def init(key, params, data: FederatedData) -> ProxSkipState:
    del key
    check_data(data)
    n = data.num_clients
    w = jax.tree.map(lambda a: jnp.broadcast_to(a, (n,) + jnp.shape(a)), params)
    h = jax.tree.map(jnp.zeros_like, w)
    return ProxSkipState(w, h, params, jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))

  def client_step(key, w, h, data: FederatedData):  # one client
    loss, g = grad_fn(w, *minibatch(key, data, batch_size, augment))
    if clip is not None and clip_mode == "norm":
      g = jax.tree.map(lambda a: a * jnp.minimum(1.0, clip / (_tree_norm(g) + 1e-12)), g)
    elif clip is not None:
      g = jax.tree.map(lambda a: jnp.clip(a, -clip, clip), g)
    w_hat = jax.tree.map(lambda a, gi, hi: a - gamma * (gi - hi), w, g, h)
    return local_prox(w_hat, gamma), loss

  def local_step(key, state: ProxSkipState, data):
    keys = client_keys(key, client_ids(data))
    return map_clients(client_step, data, keys, state.w, state.h)

  def communicate(state: ProxSkipState, w_hat, key=None, ids=None):
    n = jax.tree.leaves(w_hat)[0].shape[0]
    messages = jax.vmap(lambda m: upload_prox(m, gamma / p))(w_hat)
    if uplink is not None:
      if key is None:
        raise ValueError("communicate needs a key when an uplink compressor is set.")
      ids = jnp.arange(n, dtype=jnp.int32) if ids is None else ids
      messages = jax.vmap(uplink.compress)(client_keys(key, ids), messages)
    if write_back:
      w_hat = messages
    w_bar = jax.tree.map(lambda m: jnp.mean(m, axis=0), messages)
    w_out = server_prox(w_bar, gamma / p)
    ref = w_out if h_after_server_prox else w_bar
    h = jax.tree.map(lambda hi, r, wh: hi + (p / gamma) * (r - wh), state.h, ref, w_hat)
    w = jax.tree.map(lambda a: jnp.broadcast_to(a, (n,) + a.shape), w_out)
    if uplink is not None:
      up = as_float(n * uplink.bits(accounting.num_params(state.server)))
    else:
      up = jnp.sum(jax.vmap(lambda m: accounting.message_bits(m, encoding=encoding))(messages))
    # ASP-modified broadcasts the dense average and the clients prune it themselves.
    down = n * accounting.message_bits(ref, encoding=encoding)
    nnz = jnp.mean(jax.vmap(accounting.nnz)(messages).astype(float_dtype()))
    new = state._replace(w=w, h=h, server=w_out, comms=state.comms + 1)
    return new, (up, down, nnz)

  def skip(state: ProxSkipState, w_hat):
    return state._replace(w=w_hat)

  return ProxSkipKernel(init, local_step, communicate, skip)


def geometric_local_steps(key: jax.Array, p: float) -> jax.Array:
  """``L ~ Geometric(p)`` on {1, 2, …}: ``P(L = l) = (1 − p)^{l−1} p``, mean ``1/p``."""
  u = jax.random.uniform(key, minval=jnp.finfo(float_dtype()).tiny, maxval=1.0)
  steps = 1 + jnp.floor(jnp.log(u) / jnp.log1p(-jnp.minimum(p, 1 - 1e-7)))
  return jnp.where(p >= 1, 1, steps).astype(jnp.int32)


def meta_sparse_proxskip(loss_fn: LossFn, gamma: float, p: float, *,
                         form: str = "iteration", **kernel_kwargs) -> Algorithm:
  """Algorithm 1 of Meinhardt et al. (2024) with the given hooks (``kernel_kwargs``: see
  :func:`proxskip_kernel`) in the iteration or the round form."""
  if form not in FORMS:
    raise ValueError(f"form must be one of {FORMS}, got {form!r}.")
  kernel = proxskip_kernel(loss_fn, gamma, p, **kernel_kwargs)

  def finish(state, losses, comm_out, communicated, steps):
    up, down, nnz = comm_out
    h_sum = jax.tree.map(lambda a: jnp.sum(a, 0), state.h)
    h_norms = jax.vmap(_tree_norm)(state.h)
    info = ProxSkipInfo(loss=jnp.mean(losses), bits_up=up, bits_down=down,
                        communicated=communicated.astype(float_dtype()), local_steps=steps,
                        sum_h_norm=_tree_norm(h_sum), mean_h_norm=jnp.mean(h_norms),
                        upload_nnz=nnz, server_norm=_tree_norm(state.server))
    return state._replace(t=state.t + steps), info

  zero = lambda: (as_float(0), as_float(0), as_float(0))   # at trace time: the dtype then

  def iteration_step(key, state: ProxSkipState, data: FederatedData):
    k_coin, k_local, k_comm = jax.random.split(key, 3)
    theta = jax.random.bernoulli(k_coin, p)  # ONE coin for all clients (L2)
    w_hat, losses = kernel.local_step(k_local, state, data)
    ids = client_ids(data)
    state, comm = jax.lax.cond(theta, lambda s, wh, k: kernel.communicate(s, wh, k, ids),
                               lambda s, wh, k: (kernel.skip(s, wh), zero()), state, w_hat,
                               k_comm)
    return finish(state, losses, comm, theta, jnp.int32(1))

  def round_step(key, state: ProxSkipState, data: FederatedData):
    k_len, k_local, k_comm = jax.random.split(key, 3)
    num_steps = geometric_local_steps(k_len, p)
    w_hat, first_losses = kernel.local_step(jax.random.fold_in(k_local, 0), state, data)

    def body(j, carry):
      s, wh = carry
      s = kernel.skip(s, wh)
      wh, _ = kernel.local_step(jax.random.fold_in(k_local, j), s, data)
      return s, wh

    state, w_hat = jax.lax.fori_loop(1, num_steps, body, (state, w_hat))
    state, comm = kernel.communicate(state, w_hat, k_comm, client_ids(data))
    return finish(state, first_losses, comm, jnp.bool_(True), num_steps)

  return Algorithm(kernel.init, iteration_step if form == "iteration" else round_step,
                   bucketable=True)


def proxskip(loss_fn: LossFn, gamma: float, p: float, **kw) -> Algorithm:
  """ProxSkip / Scaffnew (Mishchenko et al., 2022): dense uploads, no pruning. Final-TopK is
  this training run evaluated (and finished) with ``top_k``."""
  return meta_sparse_proxskip(loss_fn, gamma, p, **kw)


def sparse_proxskip(loss_fn: LossFn, gamma: float, p: float, sparsity: float, *,
                    scope: str = "global", **kw) -> Algorithm:
  """Sparse-ProxSkip (the method of Meinhardt et al. (2024), L9): Top-K of the local iterate
  right before communication, *written back* into ŵ_i, so Σ_i h_i stays 0."""
  return meta_sparse_proxskip(loss_fn, gamma, p, upload_prox=proxes.top_k(sparsity, scope), **kw)


def sparse_proxskip_local(loss_fn: LossFn, gamma: float, p: float, sparsity: float, *,
                          scope: str = "global", **kw) -> Algorithm:
  """Sparse-ProxSkip-Local (L7): Top-K after every local step — RandProx with the
  ℓ0-ball indicator, whose prox is Top-K."""
  return meta_sparse_proxskip(loss_fn, gamma, p, local_prox=proxes.top_k(sparsity, scope), **kw)


def sparse_proxskip_modified(loss_fn: LossFn, gamma: float, p: float, sparsity: float, *,
                             scope: str = "global", **kw) -> Algorithm:
  """Sparse-ProxSkip-modified (appendix D): the upload is Top-K'd but the client keeps its
  dense ŵ_i for the h-update, which breaks Σ_i h_i = 0 (a diagnostic)."""
  return meta_sparse_proxskip(loss_fn, gamma, p, upload_prox=proxes.top_k(sparsity, scope),
                              write_back=False, **kw)


def accelerated_server_pruning(loss_fn: LossFn, gamma: float, p: float, sparsity: float, *,
                               scope: str = "global", **kw) -> Algorithm:
  """Accelerated-Server-Pruning (L11): dense uploads, Top-K of the average at the server
  before the h-update, which breaks Σ_i h_i = 0 (the baseline shown to fail)."""
  return meta_sparse_proxskip(loss_fn, gamma, p, server_prox=proxes.top_k(sparsity, scope), **kw)


def accelerated_server_pruning_modified(loss_fn: LossFn, gamma: float, p: float,
                                        sparsity: float, *,
                                        scope: str = "global", **kw) -> Algorithm:
  """ASP-modified (appendix D): L11 and L12 swapped — the h-update uses the dense average,
  then the clients prune it; Σ_i h_i = 0 holds (dense up- and downlink)."""
  return meta_sparse_proxskip(loss_fn, gamma, p, server_prox=proxes.top_k(sparsity, scope),
                              h_after_server_prox=False, **kw)


def randprox_l1(loss_fn: LossFn, gamma: float, p: float, lam: float, **kw) -> Algorithm:
  """RandProx-l1 (Meinhardt et al. (2024), Section 3.2; Condat & Richtárik 2023, "RandProx:
  primal-dual optimization algorithms with randomized proximal updates", ICLR, Algorithm 1)
  for the federated lasso ``min (1/N) Σ_i f_i(w) + λ‖w‖₁``.

  Meinhardt et al. (2024) give no pseudocode. RandProx solves ``min f(x) + g(x) + h(Kx)`` by
  ``x̂ = prox_{γg}(x − γ∇f(x) − γK*u)``,
  ``u⁺ = u + R(prox_{τh*}(u + τKx̂) − u)/(1+ω)``, ``x⁺ = x̂ − γ(1+ω)K*(u⁺ − u)``.
  Lifted to clients (``x = (w_1..w_N)``, ``f = (1/N)Σ f_i``, ``g = (λ/N)Σ‖w_i‖₁``, ``h`` the
  consensus indicator, ``K = I``), with the Bernoulli(p) estimator ``R(v) = θv/p``
  (``ω = 1/p − 1``), ``τ = p/γ`` and control variates ``h_i = −u_i``, this is exactly
  Algorithm 1 of Meinhardt et al. (2024) with the soft threshold ``prox_{γλ‖·‖₁}`` at L7 —
  every local step ends with a soft threshold, and communication averages.
  ``tests/test_proxskip.py`` checks the equality against the primal-dual form. The ℓ1 term covers
  every parameter, biases included (as Top-K does; BlogFeedback's bias is a feature column). Zeros
  appear only gradually, so uploads are charged by their actual non-zeros.
  """
  if not lam >= 0:
    raise ValueError(f"lam (the l1 weight) must be >= 0, got {lam}.")
  return meta_sparse_proxskip(loss_fn, gamma, p,
                              local_prox=proxes.l1(lam), **kw)
