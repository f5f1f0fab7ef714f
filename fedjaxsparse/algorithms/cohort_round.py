"""One cohort round, written once: a client update in, an :class:`~fedjaxsparse.core.Algorithm`
out.

Cohort methods of the library — FedAvg and its FedOpt/FedProx/FedHT/FedIHT/Fed-LPFM variants,
Ditto and Local, FedSpa, Sub-FedAvg, FedMRN, FedPM, FML, FedSR, FedCR, FedPAC, FedP3 — are each
a :class:`ClientUpdate` (what one client does with the global model, its own state and its own
data) given to :func:`cohort_round`, which owns the rest of the round, so that any sampler,
uplink compressor, aggregation and server optimizer composes with any client update (optax's ``chain`` makes composition a value; blackjax
separates a kernel builder from its one-call constructor).

One round ``t`` with global model ``x_t`` (a pytree; ``d`` entries), per-client states
``s [N, ...]`` and key ``ξ``:

1. ``ξ_S, ξ_C, ξ_U = split(ξ, 3)``; the cohort ``S`` of static length ``m`` is drawn with
   ``ξ_S``: a uniform sample of ``cohort_size`` distinct clients, all ``N`` clients
   (``cohort_size=None``), or ``sampler.sample(ξ_S)`` (any
   :class:`fedjaxsparse.ops.sampling.Sampler`; padding entries have ``member = 0``);
2. every member ``i`` runs ``(msg_i, s_i', metrics_i) = update(fold_in(ξ_C, i), x_t, s_i,
   data_i, t)`` — one function for one client, lifted by
   :func:`fedjaxsparse.runtime.clients.map_clients` (so the runner's client strategy —
   ``vmap``, ``map``, ``unroll`` — applies) — and ``s_i ← s_i'`` is scattered back (the other
   clients' states are kept bit for bit);
3. ``msg_i ← uplink.compress(fold_in(ξ_U, i), msg_i)`` (no change without ``uplink``);
4. weights ``p [m]``: ``"num_examples"`` (``n_i/Σ_S n_j``), ``"uniform"`` (``1/|S|``) or
   ``"sampling"`` (``1/(n p_i)``: the weighted sum is an unbiased estimate of the mean over all
   ``n`` clients); padding gets 0;
5. ``Δ = aggregate(msg, p, x_t)`` (:func:`mean_delta`: ``Σ p_i msg_i``; :func:`mean_model`:
   ``Σ p_i msg_i − x_t`` for clients that upload models);
6. ``x_{t+1} = x_t + Δ`` without a server optimizer, else ``x_t + server_opt(−Δ)`` (FedOpt:
   ``−Δ`` is the pseudo-gradient); then ``server_prox`` (FedHT's Top-K) and
   ``server_sparsity`` (magnitude pruning to a round's sparsity) if given.

The info record: ``loss = Σ_i p_i loss_i`` (each client's ``metrics["loss"]``), ``bits_up``
(``Σ_S uplink.bits(d)`` with an uplink, else ``Σ_S upload_bits(msg_i)``, by default each
message's actual non-zeros under ``encoding``; plus any ``metrics["extra_bits_up"]`` a client
reports, such as FedSpa's changed mask positions), ``bits_down`` (``Σ_S download_bits(x_t)``),
``num_clients`` (``|S|``), every other client metric averaged over the members (summed for
the ledgers a client update names in ``summed``), and the
client update's round-level records (``round_metrics``).

Three methods no paper defines, each a few lines (the family constructors take ``sampler=``,
``uplink=`` and ``server_optimizer=``; a new client update goes straight on the round):

>>> import jax, optax
>>> import fedjaxsparse as fjs
>>> ds = fjs.data.digits(num_clients=6, partition="iid")
>>> model = fjs.models.softmax_regression(64, 10)
>>> loss, d = fjs.models.make_loss(model), 64 * 10 + 10
>>> # 1. FedSpa's sparse masks with an unbiased TernGrad uplink under a FedAdam server
>>> spa = fjs.fedspa(loss, 0.1, num_rounds=10, epochs=1, batch_size=64, cohort_size=3,
...                  uplink=fjs.compressors.terngrad(d), server_optimizer=optax.adam(0.01))
>>> # 2. Ditto with stratified cohorts and their unbiased weights 1/(n p_i)
>>> dit = fjs.ditto(loss, 0.1, global_epochs=1, personal_epochs=1, batch_size=64,
...                 cohort_size=None, sampler=fjs.sampling.stratified([[0, 1], [2, 3, 4], [5]]),
...                 weighting="sampling")
>>> # 3. signSGD-style clients: one local gradient's sign, one bit per entry uploaded
>>> def update(key, w, state, data, t):
...   g = jax.grad(loss)(w, data.x, data.y, data.mask)
...   msg = jax.tree.map(lambda gi: -0.01 * jax.numpy.sign(gi), g)
...   return msg, state, {"loss": loss(w, data.x, data.y, data.mask)}
>>> sign = fjs.cohort_round(fjs.ClientUpdate(lambda key, w, n: (), update,
...                                          upload_bits=lambda msg, w: float(d)),
...                         cohort_size=4, server_optimizer=optax.sgd(1.0, momentum=0.9))
>>> for algo in (spa, dit, sign):
...   state = algo.init(jax.random.key(0), model.init(jax.random.key(0)), ds.train)
...   state, info = jax.jit(algo.step)(jax.random.key(1), state, ds.train)
...   print(int(info.num_clients), float(info.bits_up) > 0)
3 True
3 True
4 True
>>> float(info.bits_up) == 4 * d       # four members, one bit per entry
True

References: FedAvg's round (McMahan et al., 2017, arXiv:1602.05629) with FedOpt's server
optimizer (Reddi et al., 2021, arXiv:2003.00295); full citations in
:mod:`fedjaxsparse.algorithms.fedavg`.
"""
from __future__ import annotations

import collections
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjaxsparse.core import Algorithm, as_float, float_dtype
from fedjaxsparse.data.federated import FederatedData, check_data
from fedjaxsparse.ops import accounting
from fedjaxsparse.ops.aggregation import WEIGHTINGS, client_weights, weighted_mean
from fedjaxsparse.ops.proxes import Prox
from fedjaxsparse.ops.sampling import check_cohort_size, client_keys, sample_cohort
from fedjaxsparse.ops.sparsity import magnitude_prune
from fedjaxsparse.runtime.clients import map_clients
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["ClientUpdate", "CohortInfo", "CohortState", "ServerPart", "cohort_round",
           "mean_delta", "mean_model", "masked_mean", "EXTRA_BITS_UP", "EXTRA_BITS_DOWN"]
__dir__ = _public_dir(__all__)

EXTRA_BITS_UP = "extra_bits_up"
"""A client metric counted into ``bits_up`` (bits a client uploads beside its message)."""
EXTRA_BITS_DOWN = "extra_bits_down"
"""A client metric counted into ``bits_down`` (bits a client downloads beside
``download_bits``: a personalised download, say)."""


class ServerPart(NamedTuple):
  """State a method's server keeps beside the global model, broadcast to the cohort with it
  and updated from what the members upload (FedCR's global class distributions, say).

  Attributes:
    init: ``(params, num_clients) -> server_state`` (a pytree).
    update: ``(server_state, messages, weights, params, round) -> server_state``: after the
      aggregation, from the members' messages ``[m, ...]`` (as received: after the uplink),
      the weights ``[m]`` (0 for a sampler's padding entries) and the global model ``x_t``
      the members received.
    reply: ``(member_states, messages, weights, params, server_state) -> member_states``
      (``None``: none): what the server writes into the members' client states (``[m, ...]``,
      as their updates left them) from everything they uploaded — FedPAC's combination of
      the cohort's heads for each member.
  """
  init: Callable
  update: Callable
  reply: Callable | None = None


class ClientUpdate(NamedTuple):
  """What one client does in a round; everything else belongs to :func:`cohort_round`.

  Attributes:
    init: ``(key, params, num_clients) -> client_states`` — every client's state, leaves
      ``[N, ...]`` (``()`` for stateless clients).
    update: ``(key, global_params, client_state, client_data, round) -> (message,
      client_state, metrics)`` for ONE client: ``client_data`` is its row of the federated
      data (``x [M, ...]``), ``round`` the ``int32[]`` rounds completed, ``message`` a pytree
      the aggregation reads (a model delta for :func:`mean_delta`), ``metrics`` a dict of
      scalars that must hold ``"loss"``.
    upload_bits: ``(message, global_params) -> bits`` of one upload without an uplink
      compressor (default: the message's actual non-zeros under the round's ``encoding``).
    download_bits: ``global_params -> bits`` of one client's download (default: the global
      model under ``encoding``).
    round_metrics: ``(global_params, round, cohort_size) -> dict`` of round-level records
      (a drop fraction, the paper's ledger, ...), or ``None``.
    info_type: the NamedTuple the round's info is returned as (its fields: ``loss``,
      ``bits_up``, ``bits_down``, ``num_clients`` and the metrics' names); ``None`` gives
      :class:`CohortInfo` (with the extra metrics' names as further fields).
    summed: names of metrics summed over the members (ledgers) instead of averaged.
    state_type: the algorithm's state, :class:`CohortState` or a subclass naming the client
      states for its family (``DittoState.personal``, ``FedSpaState.masks``).
    bucketable: whether ``update`` computes the same on size buckets of the clients
      (its result does not depend on the padded length ``M``).
    server: a :class:`ServerPart` (``None``: the server keeps only the global model); with
      one, ``update`` receives ``global_params`` as the pair ``(params, server_state)``.
  """
  init: Callable
  update: Callable
  upload_bits: Callable | None = None
  download_bits: Callable | None = None
  round_metrics: Callable | None = None
  info_type: type | None = None
  summed: tuple[str, ...] = ()
  state_type: type | None = None
  bucketable: bool = False
  server: ServerPart | None = None


class CohortState(NamedTuple):
  """Attributes:
    params: the global model (pytree, no client axis).
    clients: every client's state (leaves ``[N, ...]``; ``()`` for stateless clients).
    server_opt_state: the server optimizer's state (``optax.EmptyState()`` without one).
    round: ``int32[]`` rounds completed.
    server: the state of the client update's :class:`ServerPart` (``()`` without one).
  """
  params: Any
  clients: Any
  server_opt_state: Any
  round: jax.Array
  server: Any = ()


class CohortInfo(NamedTuple):
  """One round's record (default float dtype): ``loss`` (``Σ_i p_i loss_i`` over the cohort),
  ``bits_up``, ``bits_down`` (summed over the cohort), ``num_clients`` (``int32``)."""
  loss: jax.Array
  bits_up: jax.Array
  bits_down: jax.Array
  num_clients: jax.Array


_INFO_TYPES: dict[tuple[str, ...], type] = {}


def _info_type(extra: tuple[str, ...]) -> type:
  """:class:`CohortInfo`, or one NamedTuple per set of extra metric names (cached, so every
  trace of a step returns the same pytree type)."""
  if not extra:
    return CohortInfo
  if extra not in _INFO_TYPES:
    _INFO_TYPES[extra] = collections.namedtuple("CohortInfo", CohortInfo._fields + extra)
  return _INFO_TYPES[extra]


def mean_delta(messages: Any, weights: jax.Array, params: Any) -> Any:
  """The server step ``Δ = Σ_i p_i msg_i`` of clients that upload model deltas."""
  del params
  return weighted_mean(messages, weights)


def mean_model(messages: Any, weights: jax.Array, params: Any) -> Any:
  """The server step ``Δ = Σ_i p_i msg_i − x`` of clients that upload models (FedIHT)."""
  return jax.tree.map(jnp.subtract, weighted_mean(messages, weights), params)


def masked_mean(messages: Any, weights: jax.Array, params: Any) -> Any:
  """The server step of clients that upload a sparse model and its mask,
  ``messages = {"model": m_i⊙x_i, "mask": m_i}``: every coordinate becomes the mean over the
  members that keep it, ``Σ_i m_ij x_ij / Σ_i m_ij``, and stays ``x_j`` where none does
  (Sub-FedAvg's "average on the intersection"); ``Δ`` is that model minus ``x``. Members are
  the entries of positive weight (whatever the weighting, each keeper counts once)."""
  member = weights > 0

  def one(x, v, m):
    keep = m & member.reshape((-1,) + (1,) * (m.ndim - 1))
    count = jnp.sum(keep, axis=0)
    total = jnp.sum(jnp.where(keep, v, jnp.zeros_like(v)), axis=0)
    return jnp.where(count > 0, total / jnp.maximum(count, 1), x) - x

  return jax.tree.map(one, params, messages["model"], messages["mask"])


_WEIGHTINGS = WEIGHTINGS + ("sampling",)


class _Cohort(NamedTuple):
  """One round's cohort of static length ``m``: ``ids int32[m]``, ``member [m]`` (1 for a real
  member, 0 for a sampler's padding entry, which repeats a member), ``sampling_weights [m]``
  (``1/(n p_i)`` of a sampler, 0 for padding; ones for uniform cohorts) and ``data``, the
  cohort's rows of the federated data."""
  ids: jax.Array
  member: jax.Array
  sampling_weights: jax.Array
  data: FederatedData

  @property
  def size(self) -> jax.Array:
    """The number of real members (a float scalar: samplers' cohorts vary in size)."""
    return jnp.sum(self.member)


def _check_options(cohort_size: int | None, sampler: Any, weighting: str) -> None:
  """Rejects contradicting cohort options with a message naming them."""
  if sampler is not None and cohort_size is not None:
    raise ValueError("give either cohort_size (uniform cohorts) or sampler, not both.")
  if weighting not in _WEIGHTINGS:
    raise ValueError(f"weighting must be one of {_WEIGHTINGS}, got {weighting!r}.")
  if weighting == "sampling" and sampler is None:
    raise ValueError("weighting='sampling' needs a sampler (its marginals give 1/(n p_i)).")


def _draw(key: jax.Array, data: FederatedData, cohort_size: int | None,
          sampler: Any) -> _Cohort:
  """This round's cohort: a uniform sample of ``cohort_size`` distinct clients (all clients for
  ``None``), or ``sampler.sample(key)``."""
  if sampler is None:
    ids = sample_cohort(key, data.num_clients, cohort_size)
    ones = jnp.ones(ids.shape, float_dtype())
    cdata = data if ids.shape[0] == data.num_clients else data.select(ids)
    return _Cohort(ids, ones, ones, cdata)
  drawn = sampler.sample(key)
  return _Cohort(drawn.ids, drawn.mask.astype(float_dtype()),
                 drawn.weights.astype(float_dtype()), data.select(drawn.ids))


def _weights(cohort: _Cohort, weighting: str) -> jax.Array:
  """Aggregation weights ``[m]``: ``"num_examples"`` (n_i / Σ n_j over members),
  ``"uniform"`` (1/|S|) or ``"sampling"`` (``1/(n p_i)``); padding entries get 0."""
  if weighting == "sampling":
    return cohort.sampling_weights
  return client_weights(cohort.data.num_examples, weighting, cohort.member)


def _server_update(params: Any, opt_state: Any, delta: Any,
                   server_optimizer: optax.GradientTransformation | None) -> tuple[Any, Any]:
  """``params + delta`` (no server optimizer), else the optax step on the pseudo-gradient
  ``−delta`` (FedOpt: FedAdam, FedYogi, server momentum, ...)."""
  if server_optimizer is None:
    return jax.tree.map(jnp.add, params, delta), opt_state
  updates, opt_state = server_optimizer.update(jax.tree.map(jnp.negative, delta), opt_state,
                                               params)
  return optax.apply_updates(params, updates), opt_state


def _member_mean(member: jax.Array, values: jax.Array) -> jax.Array:
  """The mean of ``values [m]`` over the cohort's members."""
  return jnp.sum(member * values) / jnp.sum(member)


def cohort_round(client: ClientUpdate, *, cohort_size: int | None = None, sampler: Any = None,
                 weighting: str = "num_examples", uplink: Any = None,
                 aggregate: Callable = mean_delta,
                 server_optimizer: optax.GradientTransformation | None = None,
                 server_prox: Prox | None = None,
                 server_sparsity: Callable[[jax.Array], Any] | None = None,
                 encoding: str = "dense") -> Algorithm:
  """The algorithm that runs ``client`` in cohort rounds; see the module docstring.

  Args:
    client: the :class:`ClientUpdate` of a method (``fjs.fedavg``'s, ``fjs.ditto``'s, a new
      one).
    cohort_size: clients per round, sampled uniformly without replacement inside ``jit``;
      ``None`` (and no ``sampler``) is full participation.
    sampler: a :class:`fedjaxsparse.ops.sampling.Sampler` drawing each round's cohort
      (block, stratified, importance, ...) instead of ``cohort_size``'s uniform one.
    weighting: ``"num_examples"``, ``"uniform"`` or ``"sampling"`` (needs ``sampler``).
    uplink: a :class:`fedjaxsparse.ops.compressors.Compressor` applied to every message, one
      key per client (``fold_in`` of its id), charged ``uplink.bits(d)`` per member.
    aggregate: ``(messages [m, ...], weights [m], params) -> Δ`` (:func:`mean_delta`,
      :func:`mean_model`, or a method's own).
    server_optimizer: an optax transformation of the pseudo-gradient ``−Δ`` (FedAdam,
      FedYogi, server momentum); ``None`` applies ``Δ`` as it is.
    server_prox: a prox applied (with step 1) to the new global model, e.g.
      :func:`fedjaxsparse.ops.proxes.top_k` (FedHT).
    server_sparsity: ``round -> s_t ∈ [0, 1)`` (traceable, e.g.
      :func:`fedjaxsparse.ops.sparsity.gmp_sparsity`): the new global model is pruned to
      sparsity ``s_t`` by global magnitude after the server step (FedSparsify's server-side
      gradual pruning), and each download is charged by the pruned model's non-zeros under
      the cheapest encoding.
    encoding: the bit accounting of the default ``upload_bits``/``download_bits``
      (:mod:`fedjaxsparse.ops.accounting`): ``"dense"`` (``32·d``) or a sparse encoding.

  Returns:
    An :class:`~fedjaxsparse.core.Algorithm` over :class:`CohortState`; it is bucketable
    (size buckets, :func:`fedjaxsparse.runtime.clients.auto_layout`) when every client takes
    part every round and ``client.bucketable``.
  """
  _check_options(cohort_size, sampler, weighting)
  if not isinstance(client, ClientUpdate):
    raise TypeError(f"client must be a ClientUpdate, got {type(client).__name__}.")
  if not callable(aggregate):
    raise TypeError(f"aggregate must be callable (messages, weights, params) -> delta, got "
                    f"{aggregate!r}.")
  if encoding not in accounting.ENCODINGS:
    raise ValueError(f"encoding must be one of {accounting.ENCODINGS}, got {encoding!r}.")
  upload_bits = client.upload_bits or (
      lambda m, params: accounting.message_bits(m, encoding=encoding))
  state_type = client.state_type or CohortState
  download_bits = client.download_bits or (
      lambda params: accounting.message_bits(
          params, encoding="auto" if server_sparsity is not None else encoding))

  def init(key, params, data: FederatedData) -> CohortState:
    check_data(data)
    check_cohort_size(cohort_size, data.num_clients)
    states = client.init(key, params, data.num_clients)
    extra = () if client.server is None else client.server.init(params, data.num_clients)
    return state_type(params, states, (server_optimizer or optax.identity()).init(params),
                      jnp.zeros((), jnp.int32), extra)

  def step(key, state: CohortState, data: FederatedData):
    k_cohort, k_clients, k_uplink = jax.random.split(key, 3)
    cohort = _draw(k_cohort, data, cohort_size, sampler)
    # the model field itself (a state type may expose another model as ``params``: FedPM's
    # deployed mask of its frozen weights)
    ids, params, t = cohort.ids, tuple.__getitem__(state, 0), state.round
    full = ids.shape[0] == data.num_clients and sampler is None   # ids = arange(N)
    stateful = bool(jax.tree.leaves(state.clients))
    old = (state.clients if full or not stateful else
           jax.tree.map(lambda a: a[ids], state.clients))
    broadcast = params if client.server is None else (params, state.server)
    messages, new, metrics = map_clients(
        lambda s, k, d: client.update(k, broadcast, s, d, t), cohort.data, old,
        client_keys(k_clients, ids))
    if uplink is not None:   # each member's own key: fold_in of its id
      messages = jax.vmap(uplink.compress)(client_keys(k_uplink, ids), messages)
    weights = _weights(cohort, weighting)
    delta = aggregate(messages, weights, params)
    new_params, opt_state = _server_update(params, state.server_opt_state, delta,
                                           server_optimizer)
    if server_prox is not None:
      new_params = server_prox(new_params, 1.0)
    if server_sparsity is not None:
      new_params = magnitude_prune(new_params, server_sparsity(t))
    extra = (state.server if client.server is None else
             client.server.update(state.server, messages, weights, params, t))
    if client.server is not None and client.server.reply is not None:
      new = client.server.reply(new, messages, weights, params, extra)
    if stateful:
      # a sampler's padding entries repeat a member (same key and data: the same new state)
      clients = new if full else jax.tree.map(lambda a, b: a.at[ids].set(b), state.clients,
                                              new)
    else:
      clients = state.clients

    member, size = cohort.member, cohort.size
    if uplink is not None:
      up = cohort.size * as_float(uplink.bits(accounting.num_params(params)))
    else:
      up = jnp.sum(member * jax.vmap(lambda m: upload_bits(m, params))(messages))
    metrics = dict(metrics)
    if "loss" not in metrics:
      raise ValueError("a ClientUpdate's metrics must hold 'loss' (its loss this round).")
    member_sum = lambda v: jnp.sum(member * v.astype(float_dtype()))
    if EXTRA_BITS_UP in metrics:
      up = up + member_sum(metrics.pop(EXTRA_BITS_UP))
    down = size * download_bits(params)
    if EXTRA_BITS_DOWN in metrics:
      down = down + member_sum(metrics.pop(EXTRA_BITS_DOWN))
    losses = metrics.pop("loss")
    record = dict(loss=jnp.dot(weights, losses.astype(weights.dtype)),
                  bits_up=as_float(up),
                  bits_down=as_float(down),
                  num_clients=size.astype(jnp.int32))
    if client.round_metrics is not None:
      record.update(client.round_metrics(params, t, size))
    for name, values in metrics.items():
      record[name] = (member_sum(values) if name in client.summed else
                      _member_mean(member, values.astype(float_dtype())))
    info_type = client.info_type or _info_type(tuple(k for k in record
                                                     if k not in CohortInfo._fields))
    info = info_type(**record)
    return state_type(new_params, clients, opt_state, t + 1, extra), info

  bucketable = cohort_size is None and sampler is None and client.bucketable
  return Algorithm(init, step, bucketable=bucketable)
