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

    line 6  ŵ_i = w_i − γ (∇f_i(w_i) − h_i)                  (all clients, one vmapped kernel)
    line 7  [local_prox]   ŵ_i = prox(ŵ_i)                      Sparse-ProxSkip-Local: TopK
    line 8  with probability p (ONE coin θ_t for all clients, drawn outside the vmap):
    line 9    [upload_prox] m_i = prox(ŵ_i); stored back into ŵ_i if ``write_back``
                                                                Sparse-ProxSkip: TopK, written back
    line 10   w̄ = (1/N) Σ_j m_j                                 (uniform mean = consensus prox)
    line 11   [server_prox] w_out = prox(w̄)                     Accelerated-Server-Pruning: TopK
    line 12   h_i ← h_i + (p/γ) (r − ŵ_i),  r = w_out (``h_after_server_prox``) or w̄
              w_i ← w_out
    line 14 otherwise w_i ← ŵ_i, h_i unchanged.

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
from fedjaxsparse.core import Algorithm, LossFn, as_float, float_dtype, shared_doc
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
  """The state of the ProxSkip family: every client's iterate and control variate, and the
  server's last broadcast.

  Attributes:
    w: ``[N, ...]`` client iterates ``w_i``.
    h: ``[N, ...]`` control variates ``h_i`` (``Σ_i h_i = 0`` for the drift-free variants).
    server: ``[...]`` the model the server broadcast last (``w_out`` after line 11 of
      Algorithm 1; ``w_0`` at start).
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
    local_step: ``(key, state, data) -> (w_hat [N, ...], losses [N])``, lines 6–7 for all
      clients.
    communicate: ``(state, w_hat, key=None, ids=None) -> (state, (bits_up, bits_down,
      upload_nnz))``, lines 9–12 (the key feeds an uplink compressor, folded with each client's
      original id ``ids[N]`` — :func:`fedjaxsparse.runtime.clients.client_ids` — so bucketed and
      padded runs draw the same compressions).
    skip: ``(state, w_hat) -> state``, line 14.
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
    local_prox, upload_prox, server_prox: the operators of lines 7 / 9 / 11 of Algorithm 1
      (``None`` = identity).
    write_back: line 9 stores the upload back into ``ŵ_i`` (Sparse-ProxSkip) or not
      (Sparse-ProxSkip-modified).
    h_after_server_prox: line 12 uses ``w_out = server_prox(w̄)`` (Algorithm 1, ASP) or ``w̄``
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


_DOC = shared_doc(
    common_args="""\
    loss_fn: ``(params, x, y, mask) -> f_i``, the loss of one client
      (:func:`fedjaxsparse.models.make_loss`).
    gamma: step size γ > 0 of the local gradient steps.
    p: communication probability p ∈ (0, 1]: one communication every ``1/p`` local steps on
      average.""",
    sparsity_args="""\
    sparsity: target fraction of zeros in [0, 1); Top-K keeps ``K = max(1, round((1 −
      sparsity)·d))`` of the ``d`` parameters.
    scope: ``"global"`` (one Top-K over the whole model, as in the paper) or ``"per_leaf"``
      (``sparsity`` in every leaf of the parameter pytree).""",
    kwargs="""\
    **kwargs: further options of :func:`meta_sparse_proxskip`: ``form`` (``"iteration"`` or
      ``"round"``), ``batch_size`` (examples per local gradient; ``None`` = full gradient),
      ``clip`` / ``clip_mode`` (gradient clipping), ``uplink`` (a compressor for the uploads),
      ``encoding`` (the bit accounting of sparse messages) and ``augment`` (minibatch
      augmentation).""",
    returns="""\
    An ``fjs.Algorithm`` (bucketable; see :func:`meta_sparse_proxskip`). ``init(key, params,
    data)`` gives a :class:`ProxSkipState`: ``w`` and ``h`` (``[N, ...]`` client iterates and
    control variates), ``server`` (the model the server broadcast last, the initial ``params``
    before the first communication; also ``state.params``), ``t`` (local steps done) and
    ``comms`` (communications done). ``step(key, state, data) -> (state, info)`` reports a
    :class:`ProxSkipInfo` of scalars: ``loss`` (mean client loss at the start of the step),
    ``bits_up`` / ``bits_down`` (bits sent up / down in the step, summed over clients),
    ``communicated`` (1.0 or 0.0), ``local_steps``, ``sum_h_norm`` (``‖Σ_i h_i‖``),
    ``mean_h_norm`` (``(1/N) Σ_i ‖h_i‖``), ``upload_nnz`` (mean non-zeros of the uploads) and
    ``server_norm`` (``‖state.server‖``).""",
    ref_meinhardt="""\
    Georg Meinhardt, Kai Yi, Laurent Condat, Peter Richtárik (2024). Prune at the Clients, Not
      the Server: Accelerated Sparse Training in Federated Learning. arXiv preprint.
      arXiv:2405.20623.""",
    ref_proxskip="""\
    Konstantin Mishchenko, Grigory Malinovsky, Sebastian Stich, Peter Richtárik (2022).
      ProxSkip: Yes! Local Gradient Steps Provably Lead to Communication Acceleration! Finally!
      ICML 2022. arXiv:2202.09357.""",
)
"""Docstring text the constructors below share (:func:`~fedjaxsparse.core.shared_doc`)."""


@_DOC
def meta_sparse_proxskip(loss_fn: LossFn, gamma: float, p: float, *,
                         form: str = "iteration", **kernel_kwargs) -> Algorithm:
  """Meta Sparse-ProxSkip (Meinhardt et al., 2024, Algorithm 1): ProxSkip with three prox hooks.

  Every named constructor of this module (ProxSkip, Sparse-ProxSkip, Sparse-ProxSkip-Local,
  Sparse-ProxSkip-modified, Accelerated-Server-Pruning and its modified form, RandProx-l1) is one
  call of this function with different hooks and flags. Problem: ``min_w (1/N) Σ_i f_i(w)``
  (plus a constraint or a regulariser through the hooks) in consensus form over ``N`` clients.
  Client ``i`` keeps an iterate ``w_i`` and a control variate ``h_i`` (pytrees shaped like the
  model, stacked on a leading client axis ``[N, ...]``; ``w_i = params``, ``h_i = 0`` at start).
  One iteration, by the lines of Algorithm 1::

    line 6   ŵ_i = w_i − γ (∇f_i(w_i) − h_i)        (all clients, one vmapped kernel)
    line 7   ŵ_i ← local_prox(ŵ_i, γ)               [Sparse-ProxSkip-Local: Top-K]
    line 8   with probability p (ONE coin θ_t for all clients, drawn outside the vmap):
    line 9     m_i = upload_prox(ŵ_i, γ/p)          [Sparse-ProxSkip: Top-K]
               (then compressed by ``uplink`` if set); ŵ_i ← m_i if ``write_back``
    line 10    w̄ = (1/N) Σ_j m_j                    (uniform mean = consensus prox)
    line 11    w_out = server_prox(w̄, γ/p)          [Accelerated-Server-Pruning: Top-K]
    line 12    h_i ← h_i + (p/γ) (r − ŵ_i),  r = w_out if ``h_after_server_prox`` else w̄;
               w_i ← w_out
    line 14  otherwise w_i ← ŵ_i, h_i unchanged.

  At a communication every client uploads ``m_i`` and the server sends ``r`` to every client
  (the dense ``w̄`` for ASP-modified, whose clients prune it themselves). ``Σ_i h_i`` is
  conserved exactly when the vector the h-update subtracts (``ŵ_i``) averages to ``r`` — true for
  ProxSkip, Sparse-ProxSkip, Sparse-ProxSkip-Local and ASP-modified, false for ASP
  (``ΔΣh = (pN/γ)(TopK(w̄) − w̄)``) and Sparse-ProxSkip-modified
  (``ΔΣh = (p/γ) Σ_i (TopK(ŵ_i) − ŵ_i)``).

  Two forms: ``"iteration"`` — ``step`` is one iteration (a local step, the coin, maybe a
  communication); ``"round"`` — ``step`` draws the number of local steps ``L ~ Geometric(p)`` on
  {1, 2, …} inside ``jit`` (:func:`geometric_local_steps`), runs them, then communicates. The
  round form is the iteration form grouped between successive coins θ = 1.

  Evaluation (Meinhardt et al. (2024), Appendix B: "every method's model is TopK'd before any
  evaluation"): ``state.params`` is the last model the server broadcast; apply
  :func:`fedjaxsparse.ops.sparsity.top_k` in the runner's ``params_fn`` for the sparse
  evaluation.

  Args:
    {{common_args}}
    form: ``"iteration"`` (default) or ``"round"``, as above.
    **kernel_kwargs: the hooks and options below (keyword-only, all optional), passed on to
      :func:`proxskip_kernel`.
    local_prox: a :mod:`fedjaxsparse.ops.proxes` prox ``(tree, step) -> tree`` applied after
      every local step with step γ (line 7); ``None`` = identity.
    upload_prox: applied with step γ/p to every client's iterate before it is uploaded (line 9);
      ``None`` = identity.
    write_back: ``True`` (default): the upload (after ``upload_prox`` and ``uplink``) replaces
      ``ŵ_i`` in the h-update (Sparse-ProxSkip); ``False``: the client keeps its dense ``ŵ_i``
      (Sparse-ProxSkip-modified).
    server_prox: applied with step γ/p to the average ``w̄`` at the server (line 11); ``None`` =
      identity.
    h_after_server_prox: ``True`` (default): line 12 uses ``r = server_prox(w̄)`` (Algorithm 1,
      ASP); ``False``: ``r = w̄`` (ASP-modified: the h-update before the pruning).
    batch_size: examples per local gradient (drawn with replacement; static), or ``None``
      (default) for the full local gradient (the convex experiments of Meinhardt et al. (2024)).
    clip: gradient clipping threshold, or ``None`` (default). Meinhardt et al. (2024),
      Appendix E: ProxSkip on ResNet-18 "would run into NaN errors" without it; the paper does
      not say norm or value clipping.
    clip_mode: ``"norm"`` (default: rescale the gradient to global norm ≤ ``clip``) or
      ``"value"`` (clip every entry to [−clip, clip]).
    uplink: a :class:`fedjaxsparse.ops.compressors.Compressor` applied to every uploaded vector
      after ``upload_prox`` (independent key per client, folded with its original id); the
      compressed vector is the message (and is written back when ``write_back``), charged
      ``uplink.bits(d)`` per client. ``None`` (default): no compression.
    encoding: sparse-message encoding for the bit accounting (:mod:`fedjaxsparse.ops.accounting`):
      ``"auto"`` (default: the cheapest of indices, bitmask and dense, by the message's actual
      non-zeros) or another of its encodings such as ``"dense"``.
    augment: ``(key, x) -> x`` applied to every local minibatch inside ``jit``
      (:mod:`fedjaxsparse.ops.augment`; the flip/crop/normalise of Meinhardt et al. (2024),
      Appendix E, for CIFAR-10), or ``None``.

  Returns:
    An ``fjs.Algorithm`` with ``bucketable=True`` (it also runs on size-bucketed clients).
    ``init(key, params, data)`` gives a :class:`ProxSkipState`:

    * ``w``: ``[N, ...]`` client iterates ``w_i`` (``params`` broadcast at start);
    * ``h``: ``[N, ...]`` control variates ``h_i`` (zeros at start);
    * ``server``: the model the server broadcast last (``w_out`` of line 11; ``params`` before
      the first communication), also read as ``state.params``;
    * ``t``: ``int32`` iterations (local steps) done; ``comms``: ``int32`` communications done.

    ``step(key, state, data)`` returns ``(state, info)``, ``info`` a :class:`ProxSkipInfo` of
    scalars:

    * ``loss``: ``(1/N) Σ_i f_i(w_i)`` at the start of the step (on the minibatch when
      ``batch_size`` is set);
    * ``bits_up``: uplink bits of the step, summed over clients (0 without communication);
    * ``bits_down``: downlink bits of the step, summed over clients (``r`` to every client);
    * ``communicated``: 1.0 if the step communicated (always 1.0 in the round form);
    * ``local_steps``: ``int32`` local steps in the step (1 in the iteration form, ``L`` in the
      round form);
    * ``sum_h_norm``: ``‖Σ_i h_i‖`` after the step (the zero-sum diagnostic);
    * ``mean_h_norm``: ``(1/N) Σ_i ‖h_i‖`` after the step;
    * ``upload_nnz``: mean non-zeros of the uploaded vectors (0 without communication);
    * ``server_norm``: ``‖state.server‖`` after the step.

  References:
    {{ref_meinhardt}}
    {{ref_proxskip}}

  Source for the team: seed 000 (§3, §B, §E); spec ``specs/seed000_003.md`` A.2–A.11;
  Algorithm 1 "Meta Sparse-ProxSkip" (L6–L14).
  """
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


@_DOC
def proxskip(loss_fn: LossFn, gamma: float, p: float, **kw) -> Algorithm:
  """ProxSkip / Scaffnew (Mishchenko et al., 2022): local gradient steps with control variates,
  averaging only with probability p; dense uploads, no pruning.

  For ``min_w (1/N) Σ_i f_i(w)``: every client ``i`` keeps ``w_i`` and a control variate ``h_i``
  (``Σ_i h_i = 0``). Each iteration every client takes ``ŵ_i = w_i − γ (∇f_i(w_i) − h_i)``; with
  probability p (one coin for all clients) the clients upload ``ŵ_i``, the server averages them
  to ``w̄ = (1/N) Σ_j ŵ_j`` and broadcasts it, and ``h_i ← h_i + (p/γ)(w̄ − ŵ_i)``,
  ``w_i ← w̄``; otherwise ``w_i ← ŵ_i``. This is Algorithm 1 of Meinhardt et al. (2024) with all
  three prox hooks the identity (see :func:`meta_sparse_proxskip` and the module docstring).

  Final-TopK (the baseline of Meinhardt et al., 2024) is this training run evaluated (and
  finished) with ``top_k``: pass e.g. ``params_fn=lambda s:
  fjs.ops.sparsity.top_k(s.params, sparsity=0.9)`` to the runner.

  Args:
    {{common_args}}
    **kwargs: further options of :func:`meta_sparse_proxskip`: ``form`` (``"iteration"`` or
      ``"round"``), ``batch_size`` (examples per local gradient; ``None`` = full gradient),
      ``clip`` / ``clip_mode`` (gradient clipping), ``uplink`` (a compressor for the uploads),
      ``encoding`` (the bit accounting of sparse messages) and ``augment`` (minibatch
      augmentation); also the prox hooks ``local_prox``, ``upload_prox``,
      ``server_prox``, ``write_back`` and ``h_after_server_prox`` (all off by default).

  Returns:
    {{returns}}
    The uploads and ``state.params`` are dense; ``sum_h_norm`` stays 0 up to rounding.

  References:
    {{ref_proxskip}}
    {{ref_meinhardt}}

  Source for the team: Algorithm 1 with L7, L9, L11 off; spec ``specs/seed000_003.md`` A.4
  (ProxSkip) and A.5 (Final-TopK).
  """
  return meta_sparse_proxskip(loss_fn, gamma, p, **kw)


@_DOC
def sparse_proxskip(loss_fn: LossFn, gamma: float, p: float, sparsity: float, *,
                    scope: str = "global", **kw) -> Algorithm:
  """Sparse-ProxSkip (Meinhardt et al., 2024): ProxSkip whose clients Top-K their iterate right
  before each communication and keep the pruned iterate, so ``Σ_i h_i`` stays 0.

  The method of Meinhardt et al. (2024): Algorithm 1 with the Top-K prox at line 9. Every local
  step is ``ŵ_i = w_i − γ (∇f_i(w_i) − h_i)``; with probability p (one coin for all clients) each
  client uploads ``m_i = TopK(ŵ_i)`` (K-sparse) and *writes it back*, ``ŵ_i ← m_i``; the server
  averages ``w̄ = (1/N) Σ_j m_j`` and broadcasts it, and ``h_i ← h_i + (p/γ)(w̄ − ŵ_i)``,
  ``w_i ← w̄``; otherwise ``w_i ← ŵ_i``. Since the ``ŵ_i`` average to ``w̄``, ``Σ_i h_i`` stays 0
  (see :func:`meta_sparse_proxskip` and the module docstring).

  Args:
    {{common_args}}
    {{sparsity_args}}
    {{kwargs}}

  Returns:
    {{returns}}
    Uploads have K non-zeros (``bits_up`` is charged by them under ``encoding``); the average
    ``state.params`` of K-sparse uploads need not be K-sparse (Top-K it for evaluation);
    ``sum_h_norm`` stays 0 up to rounding.

  References:
    {{ref_meinhardt}}
    {{ref_proxskip}}

  Source for the team: L9 of Algorithm 1; spec ``specs/seed000_003.md`` A.9.
  """
  return meta_sparse_proxskip(loss_fn, gamma, p,
                              upload_prox=proxes.top_k(sparsity=sparsity, scope=scope), **kw)


@_DOC
def sparse_proxskip_local(loss_fn: LossFn, gamma: float, p: float, sparsity: float, *,
                          scope: str = "global", **kw) -> Algorithm:
  """Sparse-ProxSkip-Local (Meinhardt et al., 2024): ProxSkip with Top-K after every local step —
  RandProx with the ℓ0-ball indicator, whose prox is Top-K.

  Algorithm 1 of Meinhardt et al. (2024) with the Top-K prox at line 7: every local step is
  ``ŵ_i = TopK(w_i − γ (∇f_i(w_i) − h_i))``, so every local iterate and upload is K-sparse; with
  probability p (one coin for all clients) the clients upload ``ŵ_i``, the server averages them
  to ``w̄`` and broadcasts it, and ``h_i ← h_i + (p/γ)(w̄ − ŵ_i)``, ``w_i ← w̄``; otherwise
  ``w_i ← ŵ_i``. ``Σ_i h_i`` stays 0. Nonconvex: no convergence guarantee (see
  :func:`meta_sparse_proxskip` and the module docstring).

  Args:
    {{common_args}}
    {{sparsity_args}}
    {{kwargs}}

  Returns:
    {{returns}}
    Uploads have at most K non-zeros; the average ``state.params`` need not be K-sparse;
    ``sum_h_norm`` stays 0 up to rounding.

  References:
    {{ref_meinhardt}}
    Laurent Condat, Peter Richtárik (2023). RandProx: Primal-Dual Optimization Algorithms with
      Randomized Proximal Updates. ICLR 2023. arXiv:2207.12891.
    {{ref_proxskip}}

  Source for the team: L7 of Algorithm 1; spec ``specs/seed000_003.md`` A.8.
  """
  return meta_sparse_proxskip(loss_fn, gamma, p,
                              local_prox=proxes.top_k(sparsity=sparsity, scope=scope), **kw)


@_DOC
def sparse_proxskip_modified(loss_fn: LossFn, gamma: float, p: float, sparsity: float, *,
                             scope: str = "global", **kw) -> Algorithm:
  """Sparse-ProxSkip-modified (Meinhardt et al., 2024, Appendix D): the upload is Top-K'd but the
  client keeps its dense ŵ_i for the h-update, which breaks ``Σ_i h_i = 0`` (a diagnostic).

  Algorithm 1 of Meinhardt et al. (2024) with the Top-K prox at line 9 but without writing it
  back: with probability p each client uploads ``m_i = TopK(ŵ_i)``, the server averages
  ``w̄ = (1/N) Σ_j m_j`` and broadcasts it, and ``h_i ← h_i + (p/γ)(w̄ − ŵ_i)`` with the *dense*
  ``ŵ_i``, ``w_i ← w̄``. Each communication changes ``Σ_i h_i`` by
  ``(p/γ) Σ_i (TopK(ŵ_i) − ŵ_i)``. A diagnostic: it does worse than :func:`sparse_proxskip`,
  which differs only by the write-back and keeps the invariant (see :func:`meta_sparse_proxskip`).

  Args:
    {{common_args}}
    {{sparsity_args}}
    {{kwargs}}

  Returns:
    {{returns}}
    Uploads have K non-zeros; ``sum_h_norm`` grows away from 0.

  References:
    {{ref_meinhardt}}
    {{ref_proxskip}}

  Source for the team: L9 of Algorithm 1 without the write-back; spec ``specs/seed000_003.md``
  A.10.
  """
  return meta_sparse_proxskip(loss_fn, gamma, p,
                              upload_prox=proxes.top_k(sparsity=sparsity, scope=scope),
                              write_back=False, **kw)


@_DOC
def accelerated_server_pruning(loss_fn: LossFn, gamma: float, p: float, sparsity: float, *,
                               scope: str = "global", **kw) -> Algorithm:
  """Accelerated-Server-Pruning (Meinhardt et al., 2024): ProxSkip with dense uploads and Top-K of
  the average at the server before the h-update, which breaks ``Σ_i h_i = 0``.

  The baseline Meinhardt et al. (2024) show to fail: Algorithm 1 with the Top-K prox at line 11.
  With probability p the clients upload their dense ``ŵ_i``, the server forms
  ``w_out = TopK((1/N) Σ_j ŵ_j)`` and broadcasts it, and ``h_i ← h_i + (p/γ)(w_out − ŵ_i)``,
  ``w_i ← w_out``. Each communication changes ``Σ_i h_i`` by ``(pN/γ)(TopK(w̄) − w̄)`` (see
  :func:`meta_sparse_proxskip` and the module docstring).

  Args:
    {{common_args}}
    {{sparsity_args}}
    {{kwargs}}

  Returns:
    {{returns}}
    Uploads are dense; ``state.params`` (the broadcast ``w_out``) is K-sparse after the first
    communication; ``sum_h_norm`` grows away from 0.

  References:
    {{ref_meinhardt}}
    {{ref_proxskip}}

  Source for the team: L11 of Algorithm 1; spec ``specs/seed000_003.md`` A.6.
  """
  return meta_sparse_proxskip(loss_fn, gamma, p,
                              server_prox=proxes.top_k(sparsity=sparsity, scope=scope), **kw)


@_DOC
def accelerated_server_pruning_modified(loss_fn: LossFn, gamma: float, p: float,
                                        sparsity: float, *,
                                        scope: str = "global", **kw) -> Algorithm:
  """ASP-modified (Meinhardt et al., 2024, Appendix D): Accelerated-Server-Pruning with lines 11
  and 12 of Algorithm 1 swapped, so ``Σ_i h_i = 0`` holds (dense up- and downlink).

  With probability p the clients upload their dense ``ŵ_i``; the server averages them to
  ``w̄ = (1/N) Σ_j ŵ_j`` and sends the dense ``w̄`` back; the h-update uses it,
  ``h_i ← h_i + (p/γ)(w̄ − ŵ_i)``, and then the clients prune it themselves,
  ``w_i ← TopK(w̄)``. Competitive with :func:`sparse_proxskip` but impractical, as neither link
  is compressed (see :func:`meta_sparse_proxskip` and the module docstring).

  Args:
    {{common_args}}
    {{sparsity_args}}
    {{kwargs}}

  Returns:
    {{returns}}
    Uploads and the downlink (``bits_down``, charged for ``w̄``) are dense; ``state.params`` is
    ``TopK(w̄)`` after the first communication; ``sum_h_norm`` stays 0 up to rounding.

  References:
    {{ref_meinhardt}}
    {{ref_proxskip}}

  Source for the team: L11 and L12 of Algorithm 1 swapped; spec ``specs/seed000_003.md`` A.7.
  """
  return meta_sparse_proxskip(loss_fn, gamma, p,
                              server_prox=proxes.top_k(sparsity=sparsity, scope=scope),
                              h_after_server_prox=False, **kw)


@_DOC
def randprox_l1(loss_fn: LossFn, gamma: float, p: float, lam: float, **kw) -> Algorithm:
  """RandProx-l1 (Meinhardt et al., 2024, Section 3.2; Condat & Richtárik, 2023): RandProx for the
  federated lasso ``min_w (1/N) Σ_i f_i(w) + λ‖w‖₁`` — ProxSkip with a soft threshold after
  every local step.

  Meinhardt et al. (2024) give no pseudocode; this follows Algorithm 1 of Condat & Richtárik
  (2023). RandProx solves ``min f(x) + g(x) + h(Kx)`` by
  ``x̂ = prox_{γg}(x − γ∇f(x) − γK*u)``,
  ``u⁺ = u + R(prox_{τh*}(u + τKx̂) − u)/(1+ω)``, ``x⁺ = x̂ − γ(1+ω)K*(u⁺ − u)``.
  Lifted to clients (``x = (w_1..w_N)``, ``f = (1/N)Σ f_i``, ``g = (λ/N)Σ‖w_i‖₁``, ``h`` the
  consensus indicator, ``K = I``), with the Bernoulli(p) estimator ``R(v) = θv/p``
  (``ω = 1/p − 1``), ``τ = p/γ`` and control variates ``h_i = −u_i``, this is exactly Algorithm 1
  of Meinhardt et al. (2024) with the soft threshold ``prox_{γλ‖·‖₁}`` at line 7: every local
  step is ``ŵ_i = S_{γλ}(w_i − γ (∇f_i(w_i) − h_i))`` (``S_t`` shrinks every entry towards 0 by
  ``t``), and a communication (probability p) averages, ``w̄ = (1/N) Σ_j ŵ_j``,
  ``h_i ← h_i + (p/γ)(w̄ − ŵ_i)``, ``w_i ← w̄``. The unit tests check the equality against the
  primal-dual form. The ℓ1 term covers every parameter, biases included (as Top-K does;
  BlogFeedback's bias is a feature column). Zeros appear only gradually (no guarantee on the
  sparsity level), so uploads are charged by their actual non-zeros.

  Args:
    {{common_args}}
    lam: the ℓ1 weight λ ≥ 0 (soft threshold ``γλ`` after every local step); ``ValueError``
      if negative.
    **kwargs: further options of :func:`meta_sparse_proxskip`: ``form`` (``"iteration"`` or
      ``"round"``), ``batch_size`` (examples per local gradient; ``None`` = full gradient),
      ``clip`` / ``clip_mode`` (gradient clipping), ``uplink`` (a compressor for the uploads),
      ``encoding`` (the bit accounting of sparse messages) and ``augment`` (minibatch
      augmentation); also the hooks ``upload_prox``, ``server_prox``, ``write_back``
      and ``h_after_server_prox`` (off by default).

  Returns:
    {{returns}}
    Uploads are charged by their actual non-zeros (``"auto"`` encoding); ``sum_h_norm`` stays 0
    up to rounding.

  References:
    {{ref_meinhardt}}
    Laurent Condat, Peter Richtárik (2023). RandProx: Primal-Dual Optimization Algorithms with
      Randomized Proximal Updates. ICLR 2023. arXiv:2207.12891.
    {{ref_proxskip}}

  Source for the team: L7 of Algorithm 1; spec ``specs/seed000_003.md`` A.11;
  ``tests/test_proxskip.py`` checks the equality against the primal-dual form.
  """
  if not lam >= 0:
    raise ValueError(f"lam (the l1 weight) must be >= 0, got {lam}.")
  return meta_sparse_proxskip(loss_fn, gamma, p,
                              local_prox=proxes.l1(lam), **kw)
