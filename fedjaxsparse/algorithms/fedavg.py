"""FedAvg (McMahan et al., 2017) with an optax client optimizer and an optional server
optimizer (FedOpt, Reddi et al., 2021) — the reference algorithm of the library.

References:
  McMahan, H. Brendan; Eider Moore, Daniel Ramage, Seth Hampson, Blaise Agüera y Arcas (2017).
    Communication-Efficient Learning of Deep Networks from Decentralized Data. AISTATS 2017.
    arXiv:1602.05629.
  Sashank J. Reddi, Zachary Charles, Manzil Zaheer, Zachary Garrett, Keith Rush, Jakub
    Konečný, Sanjiv Kumar, H. Brendan McMahan (2021). Adaptive Federated Optimization.
    ICLR 2021. arXiv:2003.00295.

One round: sample a cohort (inside ``jit``), broadcast the global model, run ``local_steps``
steps of the client optimizer on every cohort client (one kernel written for one client,
lifted with ``jax.vmap``), average the model deltas (weighted by client size or uniformly),
and apply the average as the server update. With a server optimizer, the negative average
delta is its pseudo-gradient: ``x ← x + server_opt(−Δ̄)``; without one, ``x ← x + Δ̄``.

FedMRN (Li et al., 2024, arXiv:2408.03220), Section 3, uses this backbone.

Source for the team: seed 003 §3; spec ``specs/seed000_003.md`` B.4; seed 000 §E (clipping).
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjaxsparse.algorithms.cohort_round import (ClientUpdate, cohort_round, mean_delta,
                                                   mean_model)
from fedjaxsparse.core import Algorithm, LossFn
from fedjaxsparse.data.federated import FederatedData
from fedjaxsparse.ops.local import at_round, epoch_loop, minibatch
from fedjaxsparse.ops.proxes import Prox
from fedjaxsparse.runtime.clients import local_scan
from fedjaxsparse.errors import check_int
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["FedAvgInfo", "local_sgd", "epoch_train", "clipped_sgd", "fedavg", "client_update"]
__dir__ = _public_dir(__all__)



class FedAvgInfo(NamedTuple):
  """One round's diagnostics (scalars of the default float dtype unless said).

  Attributes:
    loss: cohort training loss at the broadcast model (each client's loss on its first local
      batch, aggregated with the round's weights).
    bits_up: bits uploaded this round, summed over the cohort (each message charged by its
      non-zeros; dense fp32 deltas for plain FedAvg).
    bits_down: bits of the broadcast model this round, summed over the cohort.
    num_clients: ``int32[]`` cohort size.
  """
  loss: jax.Array
  bits_up: jax.Array
  bits_down: jax.Array
  num_clients: jax.Array


def local_sgd(loss_fn: LossFn, optimizer: optax.GradientTransformation, local_steps: int,
              batch_size: int | None, local_prox: Prox | None = None,
              augment: Callable | None = None) -> Callable:
  """Local training of ONE client: ``(key, params, client_data) -> (params, first_loss)``.

  ``client_data`` is one client's ``FederatedData`` row (``x [M, ...]``, ``mask [M]``).
  With ``batch_size=None`` every step uses the client's full (masked) data; otherwise each
  step draws ``batch_size`` examples uniformly *with replacement* from the client's real
  examples — a static batch shape, so clients of any size share one kernel.
  ``local_prox`` (e.g. Top-K for FedIHT) is applied after every step; ``augment`` transforms
  every minibatch (:mod:`fedjaxsparse.ops.augment`).
  """

  def train(key, params, data: FederatedData):
    opt_state = optimizer.init(params)

    def step(carry, k):
      p, s = carry
      loss, grads = jax.value_and_grad(loss_fn)(p, *minibatch(k, data, batch_size, augment))
      updates, s = optimizer.update(grads, s, p)
      p = optax.apply_updates(p, updates)
      return (local_prox(p, 1.0) if local_prox is not None else p, s), loss

    (params, _), losses = local_scan(step, (params, opt_state),
                                     jax.random.split(key, local_steps))
    return params, losses[0]

  return train


def epoch_train(loss_fn: LossFn, optimizer: optax.GradientTransformation, epochs: int,
                batch_size: int, local_prox: Prox | None = None,
                augment: Callable | None = None) -> Callable:
  """Epoch-based local training of ONE client: ``(key, params, client_data) -> (params,
  loss)``: ``S_i = E·⌈n_i/B⌉`` steps of ``optimizer`` (its state fresh), epoch ``e`` visiting
  the client's ``n_i`` real examples in a random order drawn from ``fold_in(key, e)``, ``B``
  at a time without replacement (:func:`fedjaxsparse.ops.local.epoch_loop`); ``local_prox``
  after every step, ``augment`` on every minibatch (key ``fold_in(k_aug, step)``). ``loss`` is
  the client's loss on all its data at the received model."""
  grad = jax.grad(loss_fn)

  def train(key, params, data: FederatedData):
    k_order, k_aug = jax.random.split(key)

    def step(t, carry, batch):
      p, s = carry
      x, y, m = batch
      if augment is not None:
        x = augment(jax.random.fold_in(k_aug, t), x)
      updates, s = optimizer.update(grad(p, x, y, m), s, p)
      p = optax.apply_updates(p, updates)
      return (local_prox(p, 1.0) if local_prox is not None else p, s)

    max_steps = epochs * -(-data.mask.shape[0] // batch_size)   # the padded data's bound
    local, _ = epoch_loop(step, (params, optimizer.init(params)), k_order, data, batch_size,
                          epochs, max_steps)
    return local, loss_fn(params, data.x, data.y, data.mask)

  return train


CLIP_MODES = ("norm", "value")
"""Gradient clipping of :func:`clipped_sgd`: rescale to a global norm, or clip every entry."""


def clipped_sgd(lr: Any, clip: Any = None, clip_mode: str = "norm"
                ) -> optax.GradientTransformation:
  """Local SGD with gradient clipping, as Meinhardt et al. (2024, arXiv:2405.20623), Appendix E,
  train every method on CIFAR-10 (the paper does not say norm or value clipping):
  ``clip_mode="norm"`` rescales the gradient to a global norm ≤ ``clip``, ``"value"`` clips every
  entry to [−clip, clip]; ``clip=None`` is plain SGD. ``lr`` and ``clip`` may be traced (a vmapped
  hyper-parameter search)."""
  if clip_mode not in CLIP_MODES:
    raise ValueError(f"clip_mode must be one of {CLIP_MODES}, got {clip_mode!r}.")
  if clip is None:
    return optax.sgd(lr)
  clipper = optax.clip_by_global_norm(clip) if clip_mode == "norm" else optax.clip(clip)
  return optax.chain(clipper, optax.sgd(lr))


def fedavg(loss_fn: LossFn, client_optimizer: optax.GradientTransformation, *,
           local_steps: int = 1, batch_size: int | None = None, cohort_size: int | None = None,
           server_optimizer: optax.GradientTransformation | None = None,
           weighting: str = "num_examples", local_prox: Prox | None = None,
           upload_prox: Prox | None = None, server_prox: Prox | None = None,
           uplink: Any = None, encoding: str = "dense",
           augment: Callable | None = None, sampler: Any = None,
           epochs: int | None = None,
           server_sparsity: Callable[[jax.Array], Any] | None = None) -> Algorithm:
  """FedAvg (McMahan et al., 2017): every round, the clients of a cohort train the broadcast
  global model locally with ``client_optimizer`` and the server moves it by their weighted
  mean delta — optionally through a server optimizer (FedOpt, Reddi et al., 2021).

  Round ``t``, global model ``x_t`` (a pytree with ``d`` entries), cohort ``S`` (``|S| = m``
  clients: ``cohort_size`` drawn uniformly without replacement inside ``jit``, all ``N``
  clients, or a ``sampler``'s draw); each member ``i`` holds ``n_i`` real examples::

      x_i  = LocalTrain_i(x_t)       # local_steps steps of client_optimizer (fresh state),
                                     # or E·⌈n_i/B⌉ steps with epochs=E, batch_size=B
      Δ_i  = x_i − x_t               # uploaded (dense; compressed by uplink if given)
      Δ̄    = Σ_{i∈S} p_i Δ_i,        p_i = n_i / Σ_{j∈S} n_j   ("num_examples")
                                     or  p_i = 1/|S|           ("uniform")
      x_{t+1} = x_t + Δ̄              (no server optimizer)
              = x_t + server_opt(−Δ̄) (−Δ̄ is the pseudo-gradient)

  then ``server_prox`` (e.g. FedHT's Top-K) and ``server_sparsity`` (magnitude pruning to
  the round's sparsity) act on ``x_{t+1}`` if given. With ``upload_prox`` a client uploads
  the model ``upload_prox(x_i)`` instead of its delta, and
  ``Δ̄ = Σ_i p_i upload_prox(x_i) − x_t`` (FedIHT). Local training is one kernel written for
  one client, lifted over the cohort (``jax.vmap`` unless the runner picks another client
  strategy); ``local_prox`` acts after every local step. The module docstring
  (:mod:`fedjaxsparse.algorithms.fedavg`) tells the full story;
  :func:`fedjaxsparse.algorithms.cohort_round.cohort_round` runs the round.

  Args:
    loss_fn: ``(params, x, y, mask) -> scalar`` for one client
      (:func:`fedjaxsparse.models.make_loss`).
    client_optimizer: optax transformation used for local steps (e.g. ``optax.sgd(0.1)``);
      its state is re-initialised every round (stateless clients). A function of the round
      index returning one is a round schedule (the papers' "lr 0.01, ×0.1 at round 200":
      ``lambda t: optax.sgd(optax.piecewise_constant_schedule(0.01, {200: 0.1})(t))``).
    local_steps: local optimizer steps per round (static, ≥ 1), each on ``batch_size``
      examples drawn with replacement; ignored with ``epochs``.
    batch_size: examples per local step (static), or ``None`` for full-batch local steps.
    cohort_size: clients per round, sampled uniformly without replacement inside ``jit``;
      ``None`` is full participation.
    server_optimizer: optional optax transformation applied to the pseudo-gradient ``−Δ̄``
      (``optax.sgd(1.0)`` reproduces plain FedAvg); ``None`` applies ``x ← x + Δ̄``.
    weighting: ``"num_examples"`` (``n_i / Σ n_j`` over the cohort, the default),
      ``"uniform"`` (``1/|S|``) or ``"sampling"`` (needs ``sampler``; see there).
    local_prox: a :mod:`fedjaxsparse.ops.proxes` prox applied to the client model after every
      local step. FedAvg's proxes are called with step 1 (the client step lives in the optax
      optimiser): projections such as ``proxes.top_k`` ignore it; for a regulariser R pass the
      prox of ``lr·R``.
    upload_prox: applied to the client's final model, which is then uploaded *as a model*
      (FedIHT uploads Top-K'd models); without it the client uploads its dense delta.
    server_prox: applied (with step 1) to the new global model (FedHT prunes the average).
    uplink: a :class:`fedjaxsparse.ops.compressors.Compressor` applied to every uploaded message
      (independent key per client, ``fold_in`` of its id); charged ``uplink.bits(d)`` each.
    encoding: message encoding for the bit accounting (:mod:`fedjaxsparse.ops.accounting`):
      ``"dense"`` (default, ``32·d`` per message) or a sparse encoding such as ``"auto"``,
      which charges each message by its actual non-zeros.
    augment: ``(key, x) -> x`` applied to every local minibatch inside ``jit``
      (:mod:`fedjaxsparse.ops.augment`).
    sampler: a :class:`fedjaxsparse.ops.sampling.Sampler` drawing each round's cohort (block,
      stratified, importance, ...) instead of ``cohort_size``'s uniform one; padded cohort
      entries get weight 0; ``weighting="sampling"`` aggregates with the unbiased weights
      ``1/(n p_i)`` (not normalised: ``E Σ_{i∈S} Δ_i/(n p_i) = mean_i Δ_i``).
    epochs: the papers' epoch protocol instead of ``local_steps`` (``None``: off): each
      client runs ``E·⌈n_i/B⌉`` steps, every epoch visiting its ``n_i`` examples in a fresh
      random order ``B = batch_size`` at a time, without replacement (the last batch of an
      epoch holds the remainder). Needs ``batch_size``.
    server_sparsity: ``round -> s_t`` (e.g. :func:`fedjaxsparse.ops.sparsity.gmp_sparsity`):
      the new global model is magnitude-pruned to sparsity ``s_t`` after every server step
      (FedSparsify's server-side gradual pruning; see
      :func:`fedjaxsparse.algorithms.cohort_round.cohort_round`).

  Returns:
    An :class:`fedjaxsparse.core.Algorithm` ``(init, step)``. Its state is a
    :class:`fedjaxsparse.algorithms.cohort_round.CohortState`: ``state.params`` (the global
    model ``x_t``), ``state.clients`` (``()``: the clients are stateless),
    ``state.server_opt_state`` (the server optimizer's state; ``optax.EmptyState()`` without
    one), ``state.round`` (``int32[]`` rounds completed) and ``state.server`` (``()``).
    ``step(key, state, data)`` returns ``(state, info)`` with ``info`` a :class:`FedAvgInfo`:
    ``info.loss`` (``Σ_i p_i loss_i``, each client's loss at the broadcast model — on its
    first local batch, or on all its data with ``epochs``), ``info.bits_up`` (bits uploaded,
    summed over the cohort: each message under ``encoding``, or ``uplink.bits(d)`` each with
    an ``uplink``), ``info.bits_down`` (bits of the broadcast model, summed over the cohort)
    and ``info.num_clients`` (``int32[]`` cohort size). The algorithm is bucketable (size
    buckets of unequal clients) under full participation without ``sampler`` or ``epochs``.

  References:
    McMahan, H. Brendan; Eider Moore, Daniel Ramage, Seth Hampson, Blaise Agüera y Arcas
      (2017). Communication-Efficient Learning of Deep Networks from Decentralized Data.
      AISTATS 2017. arXiv:1602.05629.
    Sashank J. Reddi, Zachary Charles, Manzil Zaheer, Zachary Garrett, Keith Rush, Jakub
      Konečný, Sanjiv Kumar, H. Brendan McMahan (2021). Adaptive Federated Optimization.
      ICLR 2021. arXiv:2003.00295.

  Example:
    >>> import jax, optax
    >>> import fedjaxsparse as fjs
    >>> ds = fjs.data.digits(num_clients=4)
    >>> model = fjs.models.softmax_regression(64, 10)
    >>> algo = fjs.fedavg(fjs.models.make_loss(model), optax.sgd(0.1), local_steps=2,
    ...                   batch_size=16, cohort_size=2)
    >>> state = algo.init(jax.random.key(0), model.init(jax.random.key(0)), ds.train)
    >>> state, info = algo.step(jax.random.key(1), state, ds.train)
    >>> int(state.round), int(info.num_clients)
    (1, 2)
    >>> info.bits_up.item() == 2 * 32 * (64 * 10 + 10)     # two dense fp32 deltas
    True
  """
  return cohort_round(
      client_update(loss_fn, client_optimizer, local_steps=local_steps, batch_size=batch_size,
                    local_prox=local_prox, upload_prox=upload_prox, augment=augment,
                    epochs=epochs),
      cohort_size=cohort_size, sampler=sampler, weighting=weighting, uplink=uplink,
      aggregate=mean_model if upload_prox is not None else mean_delta,
      server_optimizer=server_optimizer, server_prox=server_prox,
      server_sparsity=server_sparsity, encoding=encoding)


def client_update(loss_fn: LossFn, client_optimizer: optax.GradientTransformation, *,
                  local_steps: int = 1, batch_size: int | None = None,
                  local_prox: Prox | None = None, upload_prox: Prox | None = None,
                  augment: Callable | None = None, epochs: int | None = None
                  ) -> ClientUpdate:
  """FedAvg's client (stateless): ``local_steps`` steps of ``client_optimizer`` from the
  received model (:func:`local_sgd`) — or, with ``epochs``, the epoch protocol
  (:func:`epoch_train`) — then it uploads its delta ``x_i − x`` — or, with ``upload_prox``,
  the model ``upload_prox(x_i)`` (FedIHT; aggregate it with
  :func:`fedjaxsparse.algorithms.cohort_round.mean_model`). Its ``"loss"`` is its loss at the
  received model: on its first local batch, or on all its data with ``epochs``. Put it under
  any aggregation with :func:`fedjaxsparse.algorithms.cohort_round.cohort_round`."""
  local_steps = check_int("local_steps", local_steps, 1)
  if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
    raise ValueError(f"batch_size must be None or an int >= 1, got {batch_size!r}.")
  if epochs is not None:
    epochs = check_int("epochs", epochs, 1)
    if batch_size is None:
      raise ValueError("epochs (the epoch protocol) needs an int batch_size, got None.")

  def update(key, params, state, data, round):
    optimizer = at_round(client_optimizer, round)
    if epochs is None:
      train = local_sgd(loss_fn, optimizer, local_steps, batch_size, local_prox, augment)
    else:
      train = epoch_train(loss_fn, optimizer, epochs, batch_size, local_prox, augment)
    local, loss = train(key, params, data)
    message = (upload_prox(local, 1.0) if upload_prox is not None else
               jax.tree.map(jnp.subtract, local, params))
    return message, state, {"loss": loss}

  # with local_steps, the step count and batches do not depend on the padded length: size
  # buckets apply (an epoch's random order is drawn over the padded rows: they do not)
  return ClientUpdate(init=lambda key, params, num_clients: (), update=update,
                      info_type=FedAvgInfo, bucketable=epochs is None)
