"""FedP3, federated personalized and privacy-friendly network pruning.

References:
  Kai Yi, Nidham Gazagnadou, Peter Richtárik, Lingjuan Lyu (2024). FedP3: Federated
    Personalized and Privacy-friendly Network Pruning under Model Heterogeneity. ICLR 2024.
    arXiv:2404.09816.

Every client i has a configuration fixed before training (the FedP3 pseudocode, line 2), stored
as arrays with a leading client axis (:class:`FedP3Config`) so one vmapped kernel serves all
clients:

* ``L_i`` (``train_layers[i]``): the layers it trains **and uploads**;
* ``P_i`` (global pruning): a random mask keeping ``round(r_{i,l}·numel)`` entries of every
  kernel of the layers ``l ∉ L_i`` (biases and norm parameters dense, the masked-leaf rule of
  :mod:`fedjaxsparse.ops.masks`), drawn once from the client's own key and regenerated inside
  ``jit`` (no n×d mask storage);
* ``Q_i`` (local pruning, on the layers ∉ L_i, redrawn every local step k, the paper's
  LocalUpdate):
  ``"fixed"`` (none), ``"uniform"`` (keep each surviving kernel entry with probability
  ``q_{i,k}``, a Bernoulli mask: the paper does not say how entries are chosen),
  ``"ordered_dropout"`` (FjORD: keep the leading ``⌈q·d_in⌉ × ⌈q·d_out⌉`` block of every
  kernel, the bias' leading ``⌈q·d_out⌉``; one q per step for all layers; the network's input
  dimension (first layer) and output dimension (last layer) are never pruned; a dense layer
  after a flatten keeps the inputs of the channels the convolution before it keeps), with
  ``q_{i,k} ~ U[q_range]`` (the paper gives no law: ``q_range=(p, p)`` is a fixed ratio p);
* an aggregation weight: 1 (``"simple"``) or ``N_i = len(L_i)`` (``"weighted"``).

Round t: a cohort C_t (uniform without replacement, ``cohort_size``; ``None``: every client,
what the authors' code always does); client i starts from ``W^l`` for ``l ∈ L_i`` and
``P_i⊙W^l`` otherwise (the downlink, FedP3 lines 5-8), runs K optax steps on minibatches of B
(drawn with replacement, as :func:`fedjaxsparse.algorithms.fedavg.local_sgd`) of the model with
``P_i⊙Q_{i,k}`` applied to the layers ∉ L_i, and uploads ``{W^l_{t,K} : l ∈ L_i}`` only. The
server (the paper's Aggregation) sets ``W^l ← W^l + Σ_{i∈L^l} α_{i,l}(W^l_i − W^l)`` with
``α_{i,l} = a_i / Σ_{j∈L^l} a_j`` over the participants ``L^l`` that returned layer l (the
paper's ``N_i/Σ_{j=1}^n N_j`` does not sum to 1 — an erratum — so it is renormalised over
``L^l``); a layer nobody returned keeps its value. The ``∪_{i∈[n]}`` of FedP3 line 14 is read
as ``i ∈ C_t``.

Choices where the text and pseudocode disagree (options): ``train_non_selected=True`` trains
the pruned layers ∉ L_i locally (the paper's prose, "P_i⊙W_{t,K}"); ``False`` keeps them at
``P_i⊙W_t`` (LocalUpdate, line 3). They are never uploaded either way, and pruned entries stay
zero (the mask is re-applied after every step, so momentum or weight decay cannot revive them).

Privacy structure: the server reads a client's result only through ``where(l ∈ L_i, ·, 0)`` —
the non-uploaded layers cannot influence the global model even if they hold NaN (tested);
:func:`uplink` gives the message as a client sends it, a dict of its ``L_i`` layers only.
Accounting per round (:class:`FedP3Info`): the uploaded floats ``Σ_i Σ_{l∈L_i} |W^l|``, the
downloaded floats (dense ``L_i`` layers plus the ``P_i`` survivors; ``P_i``'s positions come
from the client's own seed, agreed once, so no index bits), and the paper's layer count.

Theorem-side FedP3 (the theoretical algorithm, the sketches, LDP-FedP3) lives in
:mod:`fedjaxsparse.algorithms.fedp3_theory`.

Source for the team: seed 001 ch. 4, l. 1125-1208, 1268-1329; spec ``seed001_ch4_ch6.md``
§A.2-§A.5, §0.1.6-§0.1.7, §A.10.4. The dissertation numbers FedP3 / LocalUpdate / Aggregation
as Algorithms 5-7 and the theoretical FedP3 as Algorithm 10; §4.4.2, Table 4.1, Fig. C.1.
"""
from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjaxsparse.algorithms.cohort_round import (EXTRA_BITS_DOWN, ClientUpdate, CohortState,
                                                   cohort_round)
from fedjaxsparse.ops import layer_groups as LY
from fedjaxsparse.ops import masks as MK
from fedjaxsparse.runtime.clients import local_scan
from fedjaxsparse.core import Algorithm, LossFn, float_dtype
from fedjaxsparse.ops.local import at_round, minibatch
from fedjaxsparse.ops.sparsity import largest_mask, random_keys
from fedjaxsparse.errors import check_int, check_number
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["FedP3Config", "FedP3State", "FedP3CohortState", "FedP3Info", "layer_policy",
           "exclude_one_group", "make_config", "global_mask", "ordered_dropout_mask",
           "deployed_models", "uplink", "aggregate", "aggregate_updates", "layer_delta",
           "layer_mean", "fedp3", "client_update", "compress_layer_tree", "deployed_size",
           "num_floats"]
__dir__ = _public_dir(__all__)

LOCAL_RULES = ("fixed", "uniform", "ordered_dropout")
AGGREGATIONS = ("simple", "weighted")
POLICIES = {  # name -> numbers of non-FFC layers a client may draw (uniformly), FFC always added
    "fedavg": None, "opu3": (3,), "opu2": (2,), "lowerb": (1,), "opu1-2-3": (1, 2, 3),
    "opu2-3": (2, 3)}


class FedP3Config(NamedTuple):
  """Per-client configuration (FedP3 line 2), leading axis n:
  ``train_layers`` ``bool[n, L]`` (L_i), ``keep_ratio`` ``float32[n, L]`` (r_{i,l}, used for
  l ∉ L_i), ``mask_keys`` ``key[n]`` (P_i's seeds)."""
  train_layers: jax.Array
  keep_ratio: jax.Array
  mask_keys: jax.Array

  @property
  def num_clients(self) -> int:
    return int(self.train_layers.shape[0])


class FedP3State(NamedTuple):
  """``params`` (the global model W_t) and ``round``: the state of the theory-side FedP3
  (:mod:`fedjaxsparse.algorithms.fedp3_theory`), whose clients keep no state."""
  params: Any
  round: jax.Array


class FedP3CohortState(CohortState):
  """:class:`~fedjaxsparse.algorithms.cohort_round.CohortState` of :func:`fedp3`: ``params``
  (W_t), ``clients`` = :attr:`config` (every client's row of its :class:`FedP3Config`, agreed
  once and never changed: clients keep no trained state, FedP3 line 8), ``server_opt_state``,
  ``round``."""
  __slots__ = ()

  @property
  def config(self) -> "FedP3Config":
    return FedP3Config(*self.clients)


class FedP3Info(NamedTuple):
  """Per round: ``loss`` (cohort mean of each client's first-step loss), ``floats_up`` /
  ``floats_down`` (summed over the cohort), ``bits_up`` / ``bits_down`` (32 per float),
  ``layers_up`` (the paper's count: fraction of layers uploaded, cohort mean),
  ``num_clients``."""
  loss: jax.Array
  floats_up: jax.Array
  floats_down: jax.Array
  bits_up: jax.Array
  bits_down: jax.Array
  layers_up: jax.Array
  num_clients: jax.Array


def layer_policy(key: jax.Array, num_clients: int, num_layers: int, policy: str,
                 always: Sequence[int] = (-1,)) -> np.ndarray:
  """``bool[n, L]`` layer assignments of the paper's layer-overlap experiments:
  ``"opu3"`` / ``"opu2"`` / ``"lowerb"`` — 3 / 2 / 1 layers drawn uniformly without
  replacement from the layers not in ``always`` (default: the final FC layer, "all clients
  participate in training the final FC layer"), plus ``always``; ``"opu1-2-3"`` / ``"opu2-3"``
  — the count itself uniform over {1, 2, 3} / {2, 3}; ``"fedavg"`` — every layer."""
  if policy not in POLICIES:
    raise ValueError(f"policy must be one of {tuple(POLICIES)}, got {policy!r}.")
  fixed = sorted({a % num_layers for a in always})
  out = np.zeros((num_clients, num_layers), bool)
  if POLICIES[policy] is None:
    out[:] = True
    return out
  others = np.array([l for l in range(num_layers) if l not in fixed])
  counts = POLICIES[policy]
  if max(counts) > len(others):
    raise ValueError(f"policy {policy!r} draws up to {max(counts)} layers but only "
                     f"{len(others)} are not in always={tuple(always)}.")
  rng = np.random.default_rng(np.asarray(jax.random.key_data(key)).ravel())
  for i in range(num_clients):
    out[i, rng.choice(others, size=rng.choice(counts), replace=False)] = True
  out[:, fixed] = True
  return out


def exclude_one_group(key: jax.Array, num_clients: int, names: Sequence[str],
                      groups: Sequence[Sequence[str]]) -> tuple[np.ndarray, np.ndarray]:
  """The paper's ResNet-18 variants: every client drops one of ``groups`` (lists of layer
  names, drawn uniformly per client) — it neither trains nor receives it (keep ratio 0; the
  residual path keeps the network valid) — and trains every other layer. Returns
  ``(train_layers bool[n, L], keep_ratio float32[n, L])``, the latter 0 on the dropped layers
  and 1 elsewhere (multiply by r for global pruning of further layers)."""
  missing = {g for grp in groups for g in grp} - set(names)
  if missing:
    raise ValueError(f"groups name layers that are not in names: {sorted(missing)}.")
  rng = np.random.default_rng(np.asarray(jax.random.key_data(key)).ravel())
  train = np.ones((num_clients, len(names)), bool)
  for i in range(num_clients):
    for n in groups[rng.integers(len(groups))]:
      train[i, list(names).index(n)] = False
  return train, np.where(train, 1.0, 0.0).astype(np.float32)


def make_config(key: jax.Array, train_layers: Any, keep_ratio: Any = 0.9) -> FedP3Config:
  """A :class:`FedP3Config` from ``train_layers`` ``bool[n, L]`` and ``keep_ratio`` (a scalar,
  ``[n]`` or ``[n, L]`` in [0, 1]; the paper's default r = 0.9)."""
  train = jnp.asarray(train_layers, bool)
  if train.ndim != 2:
    raise ValueError(f"train_layers must be bool[n, L], got shape {train.shape}.")
  r = np.asarray(keep_ratio, np.float32)
  if np.any(r < 0) or np.any(r > 1) or not np.all(np.isfinite(r)):
    raise ValueError(f"keep_ratio must lie in [0, 1], got {keep_ratio!r}.")
  r = np.broadcast_to(r.reshape(r.shape + (1,) * (2 - r.ndim)) if r.ndim == 1 else r,
                      train.shape)
  return FedP3Config(train, jnp.asarray(r, float_dtype()),
                     jax.random.split(key, train.shape[0]))


def global_mask(key: jax.Array, params: Any, selected: Any, keep: Any) -> Any:
  """P_i of ONE client: a bool pytree like ``params``; leaves of selected layers (``selected``:
  per-leaf bool) are all True, every other kernel keeps exactly ``round(keep·numel)``
  uniformly random entries (``keep``: per-leaf ratio, may be traced), and other 1-D leaves
  (biases, norm parameters) are kept whole unless ``keep = 0`` (a dropped layer is dropped
  entirely: the paper's ResNet-18 block variants)."""
  is_kernel = MK.masked_leaves(params)
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(key, len(leaves))
  out = []
  for k, w, kern, sel, r in zip(keys, leaves, jax.tree.leaves(is_kernel),
                                jax.tree.leaves(selected), jax.tree.leaves(keep)):
    if not kern:
      out.append(jnp.broadcast_to(sel | (r > 0), w.shape))
      continue
    count = jnp.round(r * w.size).astype(jnp.int32)
    kept = largest_mask(random_keys(k, w.size), count).reshape(w.shape)
    out.append(kept | sel)
  return jax.tree.unflatten(tree, out)


def ordered_dropout_mask(shape: tuple, q: jax.Array, prune_in: bool = True,
                         prune_out: bool = True, in_period: int | None = None) -> jax.Array:
  """FjORD's nested mask of one leaf: kernels ``[..., d_in, d_out]`` keep the leading
  ``⌈q·d_in⌉ × ⌈q·d_out⌉`` block, 1-D leaves (biases) the leading ``⌈q·d_out⌉``; an axis
  with ``prune_* = False`` is kept whole. ``in_period = C`` reads the input axis as a flattened
  ``(..., C)`` feature map (a dense layer after a convolution with C channels): input ``j`` is
  kept when channel ``j mod C < ⌈q·C⌉``, the channels the convolution keeps.
  ``mask(q1) ⊆ mask(q2)`` for ``q1 ≤ q2``."""
  def keep(axis_len, on, period=None):
    if not on:
      return jnp.ones(axis_len, bool)
    p = period or axis_len
    return jnp.arange(axis_len) % p < jnp.ceil(q * p)
  out = keep(shape[-1], prune_out)
  if len(shape) >= 2:
    out = keep(shape[-2], prune_in, in_period)[:, None] & out[None, :]
  return jnp.broadcast_to(out, shape)


def _input_periods(params: Any, depth: int) -> Any:
  """Per leaf: the previous layer's output width C when the leaf is a dense kernel whose input
  is a flattened ``(..., C)`` map (``d_in`` a proper multiple of C), else ``None``. Layers are
  taken in :mod:`fedjaxsparse.ops.layer_groups`' order, which must be the network's (true for
  ``conv1 … fc3`` and ``Dense_0 … Dense_9``)."""
  width = {}
  for leaf, l in zip(jax.tree.leaves(params), jax.tree.leaves(LY.layer_index(params, depth))):
    if np.ndim(leaf) >= 2:
      width[l] = int(np.shape(leaf)[-1])

  def period(leaf, l):
    shape = np.shape(leaf)
    c = width.get(l - 1)
    if len(shape) == 2 and c and shape[0] > c and shape[0] % c == 0:
      return c
    return None
  return jax.tree.map(period, params, LY.layer_index(params, depth))


def deployed_models(params: Any, config: FedP3Config, depth: int = 1) -> Any:
  """``[n, ...]``: every client's deployed model (``W^l`` for ``l ∈ L_i``, ``P_i⊙W^l``
  otherwise), what it evaluates on its local test split."""
  def one(k, train, keep):
    m = global_mask(k, params, LY.per_leaf(train, params, depth),
                    LY.per_leaf(keep, params, depth))
    return jax.tree.map(lambda a, b: jnp.where(b, a, jnp.zeros_like(a)), params, m)
  return jax.vmap(one)(config.mask_keys, config.train_layers, config.keep_ratio)


def uplink(trained: Any, train_layers_row: Any, depth: int = 1) -> dict[str, Any]:
  """The message client i sends, as it sends it: ``{layer name: subtree}`` for its ``L_i``
  layers only (host-side; ``trained`` is its model after local training)."""
  names = LY.layer_names(trained, depth)
  row = np.asarray(train_layers_row, bool)
  out = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(trained)[0]:
    name = LY.path_prefix(path, depth)
    if row[names.index(name)]:
      out.setdefault(name, []).append(leaf)
  return out


def aggregate(params: Any, trained: Any, train_layers: jax.Array, weights: jax.Array,
              depth: int = 1) -> Any:
  """The paper's Aggregation: ``W^l + Σ_i α_{i,l} (W_i^l − W^l)``,
  ``α_{i,l} = a_i t_{i,l} / Σ_j a_j t_{j,l}`` over the participants that returned layer l
  (``train_layers`` ``bool[m, L]``, ``weights`` ``a`` ``[m]``: 1 or ``len(L_i)``); a layer
  nobody returned is unchanged. ``trained`` ``[m, ...]`` is read only where ``t_{i,l}`` holds
  (NaN elsewhere cannot leak)."""
  updates = jax.tree.map(lambda tl, wl: tl - wl[None], trained, params)
  return aggregate_updates(params, updates, train_layers, weights, depth)


def aggregate_updates(params: Any, updates: Any, train_layers: jax.Array, weights: jax.Array,
                      depth: int = 1) -> Any:
  """:func:`aggregate` from the received updates ``W_i^l − W^l`` (``[m, ...]``; compressed by
  an uplink, say) instead of the trained models."""
  return jax.tree.map(jnp.add, params, layer_delta(params, updates, train_layers, weights,
                                                   depth))


def layer_delta(params: Any, updates: Any, train_layers: jax.Array, weights: jax.Array,
                depth: int = 1) -> Any:
  """The Aggregation step ``Δ^l = Σ_i α_{i,l} t_{i,l} (W_i^l − W^l)`` (see :func:`aggregate`)."""
  coef = train_layers * weights[:, None]
  den = jnp.sum(coef, axis=0)
  alpha = coef / jnp.where(den > 0, den, 1.0)

  def one(wl, ul, l):
    sent = train_layers[:, l].reshape((-1,) + (1,) * wl.ndim)
    msg = jnp.where(sent, ul, jnp.zeros_like(ul))
    return jnp.tensordot(alpha[:, l].astype(wl.dtype), msg, axes=1)

  return jax.tree.map(one, params, updates, LY.layer_index(params, depth))


def layer_mean(depth: int = 1) -> Callable:
  """The paper's Aggregation as a cohort-round aggregation: messages ``{"update": W_i − W, "train":
  t_i bool[L], "weight": a_i}`` give ``Δ^l = Σ_i α_{i,l} (W_i^l − W^l)`` with ``α_{i,l} =
  a_i t_{i,l} / Σ_j a_j t_{j,l}`` over the members (positive round weight) that returned layer
  l (:func:`aggregate_updates`); a layer nobody returned is unchanged."""
  def aggregate_layers(messages, weights, params):
    member = (weights > 0).astype(float_dtype())
    return layer_delta(params, messages["update"], messages["train"],
                       messages["weight"] * member, depth)
  return aggregate_layers


def fedp3(loss_fn: LossFn, client_optimizer: optax.GradientTransformation,
          config: FedP3Config, *, local_steps: int = 10, batch_size: int | None = 48,
          cohort_size: int | None = None, local_rule: str = "fixed",
          q_range: tuple[float, float] = (0.5, 1.0), aggregation: str = "simple",
          train_non_selected: bool = True, depth: int = 1,
          uplink: Callable[[int], Any] | None = None, sampler: Any = None,
          server_optimizer: optax.GradientTransformation | None = None) -> Algorithm:
  """FedP3 (Yi, Gazagnadou, Richtárik and Lyu, 2024): federated personalized and
  privacy-friendly network pruning, in which every client trains and uploads only its own
  layers ``L_i`` of a model pruned for it, and the server averages each layer over the clients
  that returned it.

  Every client i has a configuration fixed before training (``config``, the FedP3 pseudocode,
  line 2; its rows carry a leading client axis so one vmapped kernel serves all clients):

  * ``L_i`` (``config.train_layers[i]``, ``bool[L]``): the layers it trains **and uploads**;
  * ``P_i`` (global pruning): a random mask keeping ``round(r_{i,l}·numel)`` entries of every
    kernel of the layers ``l ∉ L_i`` (``r_{i,l}`` = ``config.keep_ratio[i, l]``; biases and
    norm parameters dense), drawn once from the client's own seed (``config.mask_keys[i]``) and
    regenerated inside ``jit``;
  * an aggregation weight ``a_i``: 1 (``aggregation="simple"``) or ``N_i = len(L_i)``
    (``"weighted"``).

  Round t, global model ``W_t`` (one entry ``W^l`` per layer l), cohort ``C_t`` (uniform
  without replacement, ``cohort_size``; ``None``: every client; or any ``sampler``):

  1. client i starts from ``W^l`` for ``l ∈ L_i`` and ``P_i⊙W^l`` otherwise (the downlink);
  2. it runs K = ``local_steps`` steps of ``client_optimizer`` (the paper's LocalUpdate) on
     minibatches of B = ``batch_size`` examples drawn with replacement, on the model with
     ``P_i⊙Q_{i,k}`` applied to the layers ∉ L_i. The local pruning ``Q_{i,k}``, redrawn every
     step k, is ``local_rule``: ``"fixed"`` (none), ``"uniform"`` (keep each surviving kernel
     entry with probability ``q_{i,k}``, a Bernoulli mask) or ``"ordered_dropout"`` (FjORD's
     ordered dropout, Horváth et al., 2021: keep the leading ``⌈q·d_in⌉ × ⌈q·d_out⌉`` block of
     every kernel, one q per step for all layers, the network's input and output dimensions
     never pruned), with ``q_{i,k} ~ U[q_range]``. Pruned entries stay zero (the mask is
     re-applied after every step, so momentum or weight decay cannot revive them);
  3. it uploads ``{W^l_i − W^l : l ∈ L_i}`` only, each layer compressed on its own by
     ``uplink`` if given; the other layers never leave the client (the server reads a result
     only through ``where(l ∈ L_i, ·, 0)``);
  4. the server (the paper's Aggregation, :func:`layer_mean`) sets

         W^l ← W^l + Δ^l,   Δ^l = Σ_{i∈L^l} α_{i,l} (W^l_i − W^l),   α_{i,l} = a_i / Σ_{j∈L^l} a_j,

     over the cohort members ``L^l`` that returned layer l (the paper's ``N_i/Σ_j N_j`` does
     not sum to 1, so it is renormalised over ``L^l``); a layer nobody returned keeps its
     value. With ``server_optimizer`` the pseudo-gradient ``−Δ`` goes through it instead.

  Clients keep no trained state; client i's deployed (personal) model, what it evaluates on
  its own test split, is ``deployed_models(state.params, state.config)[i]``
  (:func:`deployed_models`). Built as :func:`client_update` on
  :func:`~fedjaxsparse.algorithms.cohort_round.cohort_round` with the per-layer mean
  :func:`layer_mean`. The module docstring has the full story (the choices where the paper's
  text and pseudocode disagree, the privacy structure, the accounting, the layer-overlap
  policies of :func:`layer_policy`); the theory-side FedP3 is in
  :mod:`fedjaxsparse.algorithms.fedp3_theory`.

  Args:
    loss_fn: ``(params, x, y, mask) -> scalar``, the loss of one client's minibatch.
    client_optimizer: optax transformation of the K local steps (re-initialised each round;
      a function of the round returning one is also accepted).
    config: the :class:`FedP3Config` of every client (``L_i``, ``r_i``, ``P_i``'s seed), e.g.
      ``make_config(key, layer_policy(key, n, L, "opu2"), keep_ratio=0.9)``
      (:func:`make_config`, :func:`layer_policy`, :func:`exclude_one_group`);
      ``config.train_layers`` must be ``bool[N, L]`` for the N clients and L layers.
    local_steps: K, local optimizer steps per round (the paper: 10).
    batch_size: B, examples per local step, drawn with replacement (the paper: 48; ``None``:
      the client's whole data set).
    cohort_size: clients per round, uniform without replacement (``None``: all, what the
      authors' code does).
    local_rule: the local pruning ``Q_i`` of the layers ∉ ``L_i``, one of ``"fixed"``,
      ``"uniform"`` and ``"ordered_dropout"`` (``LOCAL_RULES``).
    q_range: ``(low, high)`` with ``0 < low ≤ high ≤ 1``: ``q_{i,k} ~ U[low, high]`` for
      ``"uniform"`` and ``"ordered_dropout"`` (``low == high``: a fixed ratio; the paper gives
      no law).
    aggregation: ``"simple"`` (``a_i = 1``) or ``"weighted"`` (``a_i = len(L_i)``); α is
      normalised per layer over the clients that returned it. The paper's third option,
      attention averaging, is refused with the reason: the paper leaves its learned map
      undefined (no architecture, no training signal, no source, no result).
    train_non_selected: ``True`` trains the pruned layers ∉ L_i locally (the paper's prose,
      "P_i⊙W_{t,K}"); ``False`` freezes them at ``P_i⊙W_t`` (LocalUpdate's pseudocode). They
      are never uploaded either way.
    depth: the path-prefix length that defines a layer
      (:mod:`fedjaxsparse.ops.layer_groups`; 1: the top-level keys of ``params``).
    uplink: ``d_l -> Compressor``: every uploaded layer's update (``d_l`` entries) is
      compressed by ``uplink(d_l)`` (e.g. ``lambda d: compressors.rand_k(d, d // 4)``) with
      the client's own key per layer; ``bits_up`` charges ``Σ_i Σ_{l∈L_i}
      uplink(d_l).bits(d_l)`` (``floats_up`` keeps the paper's count of uploaded floats). A
      factory of the layer size, not one compressor of the whole model: a client uploads only
      its layers ``L_i``, each compressed on its own. ``None``: no compression.
    sampler: any :class:`fedjaxsparse.ops.sampling.Sampler` drawing the cohort instead of a
      uniform one of ``cohort_size`` (give ``cohort_size=None`` with it).
    server_optimizer: an optax transformation of the pseudo-gradient ``−Δ`` (the
      Aggregation step ``Δ``); ``None`` is the paper's ``W + Δ``.

  Returns:
    An :class:`~fedjaxsparse.core.Algorithm` whose state is a :class:`FedP3CohortState`:
    ``state.params`` (the global model W_t), ``state.clients`` = ``state.config`` (every
    client's :class:`FedP3Config` row, agreed once and never changed), ``state.server_opt_state``
    (``optax.EmptyState()`` without a server optimizer) and ``state.round`` (rounds completed).
    ``step(key, state, data)`` returns ``(state, info)``, ``info`` a :class:`FedP3Info`:
    ``loss`` (cohort mean of each client's first-step loss), ``floats_up`` (uploaded floats
    ``Σ_i Σ_{l∈L_i} |W^l|``, summed over the cohort), ``floats_down`` (downloaded floats: the
    dense ``L_i`` layers plus the ``P_i`` survivors, summed; no index bits, ``P_i`` comes
    from an agreed seed), ``bits_up`` (32 per uploaded float, or the ``uplink`` compressors'
    bits), ``bits_down`` (32 per downloaded float), ``layers_up`` (the paper's count: the
    fraction of layers uploaded, cohort mean) and ``num_clients`` (cohort size).

  References:
    Kai Yi, Nidham Gazagnadou, Peter Richtárik, Lingjuan Lyu (2024). FedP3: Federated
      Personalized and Privacy-friendly Network Pruning under Model Heterogeneity. ICLR 2024.
      arXiv:2404.09816.
  """
  return cohort_round(
      client_update(loss_fn, client_optimizer, config, local_steps=local_steps,
                    batch_size=batch_size, local_rule=local_rule, q_range=q_range,
                    aggregation=aggregation, train_non_selected=train_non_selected,
                    depth=depth, uplink=uplink),
      cohort_size=cohort_size, sampler=sampler, weighting="uniform",
      aggregate=layer_mean(depth), server_optimizer=server_optimizer)


def client_update(loss_fn: LossFn, client_optimizer: optax.GradientTransformation,
                  config: FedP3Config, *, local_steps: int = 10, batch_size: int | None = 48,
                  local_rule: str = "fixed", q_range: tuple[float, float] = (0.5, 1.0),
                  aggregation: str = "simple", train_non_selected: bool = True,
                  depth: int = 1, uplink: Callable[[int], Any] | None = None
                  ) -> ClientUpdate:
  """FedP3's client (FedP3 with LocalUpdate): its state is its row of ``config`` (L_i, r_i, P_i's
  seed); it trains K optax steps on its pruned model and uploads ``{"update": W_i − W`` on
  its layers ``L_i`` (compressed per layer by ``uplink``), ``"train": L_i, "weight": a_i}``
  for :func:`layer_mean`. Records: ``floats_up``/``floats_down`` (summed), ``layers_up``.
  Arguments as :func:`fedp3`."""
  if local_rule not in LOCAL_RULES:
    raise ValueError(f"local_rule must be one of {LOCAL_RULES}, got {local_rule!r}.")
  if aggregation == "attention":
    raise ValueError(
        "aggregation='attention' is not available: the FedP3 paper names attention averaging "
        "(a learned map h over the returned layers, 'encompassing simple and weighted "
        "averaging') but defines neither h's architecture nor what trains it, cites no source "
        "for it and reports no result with it. Use 'simple' or 'weighted', or pass your own "
        "layer-wise rule as the cohort round's aggregate (see layer_mean).")
  if aggregation not in AGGREGATIONS:
    raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}.")
  lo, hi = q_range
  check_number("q_range[0]", lo, 0.0, 1.0, low_open=True)
  check_number("q_range[1]", hi, lo, 1.0)
  local_steps = check_int("local_steps", local_steps, 1)
  if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
    raise ValueError(f"batch_size must be None or an int >= 1, got {batch_size!r}.")
  def local_mask(key, params, layer_of, selected, num_layers):
    """Q_{i,k} on the layers ∉ L_i (True on selected layers)."""
    if local_rule == "fixed":
      return None
    q = jax.random.uniform(key, (), minval=lo, maxval=hi)
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.fold_in(key, 1), len(leaves))
    periods = jax.tree.leaves(_input_periods(params, depth), is_leaf=lambda x: x is None)
    out = []
    for k, w, l, sel, per in zip(keys, leaves, jax.tree.leaves(layer_of),
                                 jax.tree.leaves(selected), periods):
      if local_rule == "uniform":  # on kernels, as P_i
        m = (jax.random.uniform(k, w.shape) < q if w.ndim >= 2
             else jnp.ones(w.shape, bool))
      else:
        m = ordered_dropout_mask(w.shape, q, prune_in=l != 0, prune_out=l != num_layers - 1,
                                 in_period=per)
      out.append(m | sel)
    return jax.tree.unflatten(tree, out)

  def train_client(key, w, train_row, keep_row, mask_key, data, client_optimizer):
    layer_of = LY.layer_index(w, depth)
    selected = LY.per_leaf(train_row, w, depth)
    pmask = global_mask(mask_key, w, selected, LY.per_leaf(keep_row, w, depth))
    zero = lambda m, a: jnp.where(m, a, jnp.zeros_like(a))
    start = jax.tree.map(zero, pmask, w)
    num_layers = int(train_row.shape[0])

    def step(carry, k):
      p, s = carry
      q = local_mask(jax.random.fold_in(k, 1), p, layer_of, selected, num_layers)
      m = pmask if q is None else jax.tree.map(jnp.logical_and, pmask, q)
      loss, g = jax.value_and_grad(lambda v, *b: loss_fn(jax.tree.map(zero, m, v), *b))(
          p, *minibatch(k, data, batch_size))
      if not train_non_selected:
        g = jax.tree.map(zero, selected, g)
      updates, s = client_optimizer.update(g, s, p)
      p = jax.tree.map(zero, pmask, optax.apply_updates(p, updates))
      return (p, s), loss

    (trained, _), losses = local_scan(step, (start, client_optimizer.init(start)),
                                      jax.random.split(key, local_steps))
    return trained, losses[0], jax.tree.map(lambda a: jnp.sum(a, dtype=float_dtype()), pmask)

  def init(key, params, n):
    del key
    names = LY.layer_names(params, depth)
    if config.train_layers.shape != (n, len(names)):
      raise ValueError(f"config.train_layers must be bool[{n}, {len(names)}] "
                       f"(clients, layers {names}), got {config.train_layers.shape}.")
    return tuple(config)

  def layer_bits(params):   # bits of each layer's upload
    sizes = LY.layer_sizes(params, depth)
    if uplink is None:
      return jnp.asarray([32.0 * d_l for d_l in sizes], float_dtype())
    return jnp.asarray([uplink(int(d_l)).bits(int(d_l)) for d_l in sizes], float_dtype())

  def update(key, w, row, d, t):
    train, keep, mask_key = row
    trained, loss, kept = train_client(key, w, train, keep, mask_key, d,
                                       at_round(client_optimizer, t))
    delta = jax.tree.map(jnp.subtract, trained, w)
    if uplink is not None:   # each layer by its own compressor, its own key
      delta = compress_layer_tree(jax.random.fold_in(key, 1), delta, uplink, depth)
    a = (jnp.ones((), float_dtype()) if aggregation == "simple"
         else jnp.sum(train, dtype=jnp.int32).astype(float_dtype()))
    sizes = jnp.asarray(LY.layer_sizes(w, depth), float_dtype())
    floats_down = sum(jax.tree.leaves(kept))
    metrics = {"loss": loss, "floats_up": train.astype(float_dtype()) @ sizes,
               "floats_down": floats_down, EXTRA_BITS_DOWN: 32.0 * floats_down,
               "layers_up": jnp.mean(train.astype(float_dtype()))}
    return {"update": delta, "train": train, "weight": a}, row, metrics

  def upload_bits(message, params):
    return message["train"].astype(float_dtype()) @ layer_bits(params)

  return ClientUpdate(init, update, upload_bits=upload_bits,
                      download_bits=lambda params: jnp.zeros((), float_dtype()),
                      info_type=FedP3Info, summed=("floats_up", "floats_down"),
                      state_type=FedP3CohortState)


def compress_layer_tree(key: jax.Array, update: Any, uplink: Callable[[int], Any],
                        depth: int = 1) -> Any:
  """ONE client's update compressed layer by layer: layer l (its leaves flattened together,
  ``d_l`` entries) by ``uplink(d_l)`` with the key ``fold_in(key, l)``."""
  sizes = LY.layer_sizes(update, depth)
  leaves, treedef = jax.tree.flatten(update)
  index = jax.tree.leaves(LY.layer_index(update, depth))
  for l, d_l in enumerate(sizes):
    pos = [j for j, li in enumerate(index) if li == l]
    out = uplink(int(d_l)).compress(jax.random.fold_in(key, l), [leaves[j] for j in pos])
    for j, o in zip(pos, out):
      leaves[j] = o
  return jax.tree.unflatten(treedef, leaves)


def deployed_size(layer_sizes: Sequence[float], train_layers_row: Any, keep: float) -> float:
  """The paper's deployed (downlink) size of one client,
  ``Σ_{l∈L_i}|W^l| + r Σ_{l∉L_i}|W^l|``, for per-layer sizes counted as the paper counts them."""
  s = np.asarray(layer_sizes, np.float64)
  row = np.asarray(train_layers_row, bool)
  return float(s[row].sum() + keep * s[~row].sum())


def num_floats(tree: Any) -> int:
  """Floats in a pytree (e.g. an :func:`uplink` message)."""
  return sum(math.prod(np.shape(a)) for a in jax.tree.leaves(tree))
