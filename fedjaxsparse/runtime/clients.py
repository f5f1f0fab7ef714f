"""Running a one-client kernel over all clients: ``vmap``, optionally per size bucket.

Natural splits are very unequal (BlogFeedback: mean 82, max 1,106 examples per client), so
padding every client to the largest wastes most of the work (DESIGN.md, performance notes).
A :class:`BucketedData` holds the clients in a few size buckets, each padded only to its own
largest client; :func:`map_clients` runs the kernel ``vmap``-ped per bucket (a static Python
loop over a handful of buckets, never over clients) and returns the results **in the original
client order**, so per-client state, client ids and PRNG keys are those of the padded run:
bucketing changes the speed, never the result.

:func:`auto_layout` chooses the buckets: the fewest (at most ``max_buckets``) whose padded
work is within ``max_waste`` of the real work, cut optimally (dynamic programming over the
sorted sizes). Every bucket is one more copy of the kernel in the compiled program, so
compile time grows with the number of buckets; ``max_buckets`` bounds it
(``benchmarks/bench_layout.py`` measures both). Algorithms whose step accepts bucketed data
set ``Algorithm.bucketable``; :func:`fedjaxsparse.runtime.runner.run` then applies
:func:`auto_layout` to unequal training data by itself.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjaxsparse.data.federated import FederatedData
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["BucketedData", "bucketize", "padded_work", "plan_buckets", "auto_layout", "Executed",
           "with_strategy", "loop_free", "local_scan", "client_ids", "map_clients",
           "count_primitive", "conv_flops", "dot_flops", "client_bytes", "arg_signature",
           "traced_step", "cached_step", "choose_strategy"]
__dir__ = _public_dir(__all__)


class BucketedData(NamedTuple):
  """Clients in size buckets.

  Attributes:
    buckets: one ``FederatedData`` per bucket, padded to its own largest client; bucket ``b``
      holds the clients ``order[starts[b] : starts[b] + buckets[b].num_clients]``.
    order: ``int32 [N]`` the original client id of each bucketed position.
    inverse: ``int32 [N]`` the bucketed position of each original client (``argsort(order)``).
  """
  buckets: tuple
  order: Any
  inverse: Any

  @property
  def num_clients(self) -> int:
    return sum(b.num_clients for b in self.buckets)

  @property
  def num_examples(self) -> jax.Array:
    """``[N]`` in the original client order."""
    return jnp.take(jnp.concatenate([b.num_examples for b in self.buckets]), self.inverse)

  @property
  def max_examples(self) -> int:
    return max(b.max_examples for b in self.buckets)


def _split(data: FederatedData, groups: list[np.ndarray]) -> BucketedData:
  """Buckets of the given client-id groups, each trimmed to its largest client."""
  sizes = np.asarray(data.num_examples)
  host = jax.tree.map(np.asarray, data)   # gathered on the host: no program per bucket shape
  buckets = []
  for ids in groups:
    m = max(int(sizes[ids].max()), 1)
    buckets.append(jax.tree.map(
        lambda a: jax.device_put(a[ids][:, :m] if a.ndim >= 2 else a[ids]), host))
  order = np.concatenate(groups).astype(np.int32)
  return BucketedData(tuple(buckets), jax.device_put(order),
                      jax.device_put(np.argsort(order).astype(np.int32)))


def bucketize(data: FederatedData, num_buckets: int) -> BucketedData:
  """Sort clients by size and split them into ``num_buckets`` buckets of (nearly) equal client
  count, each trimmed to its own largest client."""
  if not 1 <= num_buckets <= data.num_clients:
    raise ValueError(f"num_buckets must be in [1, {data.num_clients}], got {num_buckets}.")
  order = np.argsort(np.asarray(data.num_examples), kind="stable")
  return _split(data, np.array_split(order, num_buckets))


def padded_work(sizes: np.ndarray, groups: list[np.ndarray]) -> int:
  """Example slots computed with these buckets: ``Σ_b |b| · max_{i∈b} n_i``."""
  return int(sum(len(g) * max(int(sizes[g].max()), 1) for g in groups))


def plan_buckets(sizes: np.ndarray, max_waste: float = 0.25, max_buckets: int = 8
                 ) -> list[np.ndarray]:
  """Client-id groups of the fewest buckets (``≤ max_buckets``) whose padded work is at most
  ``(1 + max_waste)`` × the real work ``Σ n_i`` (the best ``max_buckets`` cut if none is).

  For each bucket count ``b`` the cut of the sorted sizes minimising the padded work is found
  exactly by dynamic programming, ``O(b · N²)`` numpy work (0.1 s for N = 3,400).
  """
  if not max_waste >= 0:
    raise ValueError(f"max_waste must be >= 0, got {max_waste}.")
  if not max_buckets >= 1:
    raise ValueError(f"max_buckets must be >= 1, got {max_buckets}.")
  sizes = np.asarray(sizes)
  order = np.argsort(sizes, kind="stable")
  s = np.maximum(sizes[order].astype(np.float64), 1.0)
  n, real = len(s), float(np.maximum(sizes, 1).sum())
  cost = s[-1] * n  # one bucket
  prev = np.arange(1, n + 1) * s  # best[1][j]: clients [0, j) in one bucket
  cuts = [np.zeros(n, np.int64)]
  best_b = 1
  for b in range(2, min(max_buckets, n) + 1):
    if cost <= (1 + max_waste) * real:
      break
    cur, arg = np.full(n, np.inf), np.zeros(n, np.int64)
    for j in range(b, n + 1):  # clients [0, j) in b buckets, the last one [i, j)
      i = np.arange(b - 1, j)
      total = prev[i - 1] + (j - i) * s[j - 1]
      k = int(np.argmin(total))
      cur[j - 1], arg[j - 1] = total[k], i[k]
    prev = cur
    cuts.append(arg)
    cost, best_b = cur[-1], b
  bounds, j = [n], n
  for b in range(best_b, 1, -1):
    j = int(cuts[b - 1][j - 1])
    bounds.append(j)
  bounds = sorted(bounds)
  return [order[a:z] for a, z in zip([0] + bounds[:-1], bounds)]


def auto_layout(data: FederatedData, max_waste: float = 0.25, max_buckets: int = 8
                ) -> FederatedData | BucketedData:
  """``data`` itself when padding wastes at most ``max_waste`` of the work (e.g. equal
  clients), else :func:`plan_buckets`' buckets."""
  sizes = np.asarray(data.num_examples)
  real = float(np.maximum(sizes, 1).sum())
  if data.num_clients * max(data.max_examples, 1) <= (1 + max_waste) * real:
    return data
  return _split(data, plan_buckets(sizes, max_waste, max_buckets))


STRATEGIES = ("vmap", "map", "unroll")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Executed:
  """Clients (padded or bucketed) with the execution strategy :func:`map_clients` uses for
  them (see :func:`with_strategy`); ``strategy`` is static (part of the compiled program)."""
  data: Any
  strategy: str = dataclasses.field(metadata=dict(static=True), default="vmap")

  @property
  def num_clients(self) -> int:
    return self.data.num_clients

  @property
  def num_examples(self) -> jax.Array:
    return self.data.num_examples

  @property
  def max_examples(self) -> int:
    return self.data.max_examples

  def select(self, client_ids: jax.Array) -> "Executed":
    return Executed(self.data.select(client_ids), self.strategy)


def with_strategy(data: Any, strategy: str) -> Executed:
  """``data`` run by :func:`map_clients` with ``strategy``: ``"vmap"`` (one batched kernel),
  ``"map"`` (``lax.map``: one client after another in a loop), ``"unroll"`` (the clients
  written out one after another in the program: compile time grows with the clients) or
  ``"unroll:G"`` (a ``lax.map`` over groups of G unrolled clients: bounded compile time).
  Every strategy computes the same per-client results; only speed and compile time differ
  (``benchmarks/bench_client_strategies.py``)."""
  base, _, group = strategy.partition(":")
  if base not in STRATEGIES or (group and (base != "unroll" or not group.isdigit()
                                           or int(group) < 1)):
    raise ValueError(f"strategy must be one of {STRATEGIES} or 'unroll:G' with an int G >= 1, "
                     f"got {strategy!r}.")
  if isinstance(data, Executed):
    data = data.data
  return Executed(data, strategy)


_LOOP_FREE = contextvars.ContextVar("fedjaxsparse_loop_free", default=False)
_MAPPED = contextvars.ContextVar("fedjaxsparse_mapped", default=None)  # choose_strategy's


@contextlib.contextmanager
def loop_free(enabled: bool = True):
  """While tracing under this context, :func:`local_scan` unrolls its loop completely.

  The ``"unroll"`` strategy traces every client's kernel under it, so a client's local steps
  are written out too and the client runs loop-free: on XLA:CPU a convolution inside any loop
  body runs several times slower than outside one (jax-ml/jax#12868,
  ``benchmarks/bench_client_strategies.py``)."""
  token = _LOOP_FREE.set(enabled)
  try:
    yield
  finally:
    _LOOP_FREE.reset(token)


def local_scan(f: Callable, init: Any, xs: Any = None, length: int | None = None):
  """``lax.scan`` for a client's local loop (local steps, epochs): fully unrolled when traced
  under :func:`loop_free` (the ``"unroll"`` strategy), a loop otherwise — the same result."""
  return jax.lax.scan(f, init, xs, length=length, unroll=bool(_LOOP_FREE.get()))


def _unrolled(fn: Callable, args: tuple, data: FederatedData) -> Any:
  outs = []
  with loop_free():
    for i in range(data.num_clients):
      args_i, data_i = jax.tree.map(lambda a: a[i], (args, data))
      outs.append(fn(*args_i, data_i))
  return jax.tree.map(lambda *xs: jnp.stack(xs), *outs)


def _run_block(fn: Callable, data: FederatedData, args: tuple, strategy: str) -> Any:
  """``fn`` over the clients of one padded block, by ``strategy``."""
  if strategy == "vmap":
    return jax.vmap(fn)(*args, data)
  if strategy == "map":
    return jax.lax.map(lambda xs: fn(*xs[0], xs[1]), (args, data))
  if strategy == "unroll":
    return _unrolled(fn, args, data)
  group = int(strategy.split(":")[1])
  n = data.num_clients
  q = n // group
  head = jax.tree.map(lambda a: a[:q * group].reshape((q, group) + a.shape[1:]), (args, data))
  out = jax.lax.map(lambda xs: _unrolled(fn, xs[0], xs[1]), head)
  out = jax.tree.map(lambda a: a.reshape((q * group,) + a.shape[2:]), out)
  if n % group:
    tail = jax.tree.map(lambda a: a[q * group:], (args, data))
    out = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), out, _unrolled(fn, *tail))
  return out


def client_ids(data: FederatedData | BucketedData) -> jax.Array:
  """``int32 [N]``: the original id of each client (for ``fold_in`` keys); results of
  :func:`map_clients` are in this order for both layouts."""
  return jnp.arange(data.num_clients, dtype=jnp.int32)


def map_clients(fn: Callable, data: FederatedData | BucketedData | Executed,
                *client_args: Any) -> Any:
  """``vmap(fn)(*client_args, data)`` for padded data, per bucket for bucketed data, and by
  the chosen strategy for :class:`Executed` data (:func:`with_strategy`).

  ``client_args`` are pytrees with leading client axis ``[N, ...]`` in the original client
  order; so is the result, for every layout and strategy.
  """
  strategy = "vmap"
  if _MAPPED.get() is not None:
    _MAPPED.get().append(data.num_clients)
  if isinstance(data, Executed):
    data, strategy = data.data, data.strategy
  if isinstance(data, FederatedData):
    return _run_block(fn, data, client_args, strategy)
  outs, start = [], 0
  for bucket in data.buckets:
    n = bucket.num_clients
    ids = data.order[start:start + n]
    args = jax.tree.map(lambda a: jnp.take(a, ids, axis=0), client_args)
    outs.append(_run_block(fn, bucket, args, strategy))
    start += n
  return jax.tree.map(lambda *xs: jnp.take(jnp.concatenate(xs), data.inverse, axis=0), *outs)


MAX_UNROLLED_CONVS = 256
"""Largest number of XLA convolutions (forward and backward, counted over unrolled clients
and local steps) the automatic choice writes out loop-free: XLA:CPU compiles 50–90 ms of
program per convolution (FedAvg CNN, 250 convolutions: 12.6 s; 1,000: 90 s). The library's
own models avoid the question on CPU: their convolutions are patches times a matrix
(:mod:`fedjaxsparse.models.conv`), fast under ``vmap`` and in loops."""


def count_primitive(jaxpr: Any, name: str) -> int:
  """Occurrences of primitive ``name`` in a (closed) jaxpr and all its sub-jaxprs, a scan's
  body counted ``length`` times (the work of an unrolled program)."""
  jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
  total = 0
  for eqn in jaxpr.eqns:
    total += eqn.primitive.name == name
    times = eqn.params.get("length", 1) if eqn.primitive.name == "scan" else 1
    for value in eqn.params.values():
      for sub in (value if isinstance(value, (tuple, list)) else (value,)):
        if hasattr(sub, "eqns") or hasattr(getattr(sub, "jaxpr", None), "eqns"):
          total += times * count_primitive(sub, name)
  return total


def conv_flops(jaxpr: Any) -> float:
  """Floating-point operations of the convolutions in a (closed) jaxpr and its sub-jaxprs, a
  scan's body counted ``length`` times: ``2 · |output| · |kernel| / out_features`` each."""
  jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
  total = 0.0
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "conv_general_dilated":
      out, rhs = eqn.outvars[0].aval, eqn.invars[1].aval
      out_features = rhs.shape[eqn.params["dimension_numbers"].rhs_spec[0]]
      total += 2.0 * np.prod(out.shape) * np.prod(rhs.shape) / out_features
    times = eqn.params.get("length", 1) if eqn.primitive.name == "scan" else 1
    for value in eqn.params.values():
      for sub in (value if isinstance(value, (tuple, list)) else (value,)):
        if hasattr(sub, "eqns") or hasattr(getattr(sub, "jaxpr", None), "eqns"):
          total += times * conv_flops(sub)
  return total


def dot_flops(jaxpr: Any) -> float:
  """Floating-point operations of the matrix products (``dot_general``) in a (closed) jaxpr and
  its sub-jaxprs, each loop body counted ONCE (the work of one local step, not of the loop):
  ``2 · |output| · |contracted dims|`` each."""
  jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
  total = 0.0
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general":
      (contract, _), _ = eqn.params["dimension_numbers"]
      lhs = eqn.invars[0].aval.shape
      total += 2.0 * np.prod(eqn.outvars[0].aval.shape) * np.prod([lhs[i] for i in contract])
    for value in eqn.params.values():
      for sub in (value if isinstance(value, (tuple, list)) else (value,)):
        if hasattr(sub, "eqns") or hasattr(getattr(sub, "jaxpr", None), "eqns"):
          total += dot_flops(sub)
  return total


MAP_MIN_FLOPS = 3e7
"""On CPU, clients whose step does at least this many matrix-product FLOPs each (one local
step, :func:`dot_flops` per mapped client) run ``"map"`` — one client after another, each at the
speed of an unbatched program — rather than ``"vmap"``: XLA:CPU runs a batched product of
per-client weights as one small product per client anyway, and the batched layout adds copies
(and makes every client wait for the cohort's longest local loop). Measured with
``benchmarks/bench_default_strategy.py`` (FedAvg MLPs of 10 clients: ``vmap`` faster up to
hidden width 64, 20 MFLOP a step; ``map`` from width 128, 39 MFLOP; FedAvg CNN and FedMRN's CNN
``map`` 1.15–1.45× faster)."""


MAP_MIN_CLIENT_BYTES = 32 * 1024
MAP_MIN_MAPPED_BYTES = 8 * 1024 * 1024
"""On CPU, clients of small models also run ``"map"`` when each holds at least
:data:`MAP_MIN_CLIENT_BYTES` of data and one ``map_clients`` call maps at least
:data:`MAP_MIN_MAPPED_BYTES` of it: a gradient step reads a client's data twice (forward and
backward). Batched over the clients, each pass streams all of it from memory; one client at a
time, its data is still in the core's cache for the second pass. Measured on a 2-core EPYC
(1 MiB L2 a core, 8 MiB L3) with ``bench_default_strategy.py``'s Sparse-ProxSkip on the
BlogFeedback shape (85 × 281 floats, 95 KiB a client): 55 clients (5 MiB) ``vmap`` 1.54 ms vs
``map`` 1.64; 138 clients (12.6 MiB) 3.75 vs 3.04; 554 (50 MiB) 11.0 vs 9.7. At 50 MiB in all,
clients of 11 / 23 / 46 KiB: ``vmap`` 13.6 / 12.2 / 11.2 ms, ``map`` 17.6 / 12.7 / 10.6 (the
loop's cost per client outweighs the cache below 32 KiB: EF21's 3.5 KiB clients run ``vmap``
1.75× faster even at 55 MiB)."""


def client_bytes(train: Any) -> float:
  """Mean bytes of one client's data (every per-client array of ``train``, padding included;
  0 for data that is not client-indexed)."""
  data = train.data if isinstance(train, Executed) else train
  if not hasattr(data, "num_clients"):
    return 0.0
  n = max(int(data.num_clients), 1)
  return float(sum(np.prod(np.shape(a)) * np.dtype(a.dtype).itemsize
                   for a in jax.tree.leaves(data))) / n


_LAST_TRACE: list = []   # [(step, signature, closed jaxpr, out shapes, mapped)]: the last trace


def arg_signature(args: Any) -> tuple:
  """A hashable key of the types of ``args`` (tree structure; each leaf's shape, dtype and weak
  type): equal keys mean a jitted function traces ``args`` alike."""
  leaves, treedef = jax.tree.flatten(args)
  return treedef, tuple((tuple(np.shape(a)), str(getattr(a, "dtype", type(a))),
                         bool(getattr(a, "weak_type", False))) for a in leaves)


def traced_step(step: Callable, key: Any, state: Any, train: Any):
  """``(closed jaxpr of step(key, state, train), [clients mapped by each map_clients call])``.

  The runner needs one step's trace three times before compiling — to choose the client
  strategy, for the run's fingerprint and inside the compiled chunk (:func:`cached_step`) —
  at the same argument types; the last trace is kept and reused when the same ``step`` is
  traced again at the same types (the jaxpr depends on nothing else). Tracing a network's
  step is the larger part of a small run's start-up, so it is done once.
  """
  sig = arg_signature((key, state, train))
  if _LAST_TRACE and _LAST_TRACE[0][0] is step and _LAST_TRACE[0][1] == sig:
    _, _, closed, _, mapped = _LAST_TRACE[0]
    return closed, list(mapped)
  mapped = []
  token = _MAPPED.set(mapped)
  try:
    closed, shapes = jax.make_jaxpr(step, return_shape=True)(key, state, train)
  finally:
    _MAPPED.reset(token)
  _LAST_TRACE[:] = [(step, sig, closed, shapes, tuple(mapped))]
  return closed, mapped


def cached_step(step: Callable, key: Any, state: Any, train: Any
                ) -> tuple[Callable, Any] | None:
  """``(step_fn, out_shapes)`` from the kept trace of ``step`` at the types of
  ``(key, state, train)`` (:func:`traced_step`), or ``None`` when there is none: ``step_fn``
  evaluates the jaxpr (the same computation, without tracing the algorithm's Python again)
  and ``out_shapes`` are the ``(state, info)`` shapes. Releases the kept trace."""
  if not (_LAST_TRACE and _LAST_TRACE[0][0] is step
          and _LAST_TRACE[0][1] == arg_signature((key, state, train))):
    return None
  _, _, closed, shapes, _ = _LAST_TRACE.pop()
  out_tree = jax.tree.structure(shapes)

  def step_fn(k, s, tr):
    out = jax.core.eval_jaxpr(closed.jaxpr, closed.consts, *jax.tree.leaves((k, s, tr)))
    return jax.tree.unflatten(out_tree, out)

  return step_fn, shapes


def choose_strategy(algo: Any, params: Any, train: Any) -> tuple[str, str]:
  """The client execution strategy for ``algo`` on ``train`` and why: ``(strategy, reason)``.

  A rule from ``benchmarks/bench_client_strategies.py``: on CPU, clients whose kernel holds
  XLA convolutions (``lax.conv_general_dilated``: grouped under ``vmap``, slow in loops) run
  ``"unroll"`` (loop-free: 0.75× the single-model time per FedAvg CNN round, where ``vmap``
  takes 14×) unless that writes out more than :data:`MAX_UNROLLED_CONVS` convolutions
  (compile time); clients of at least :data:`MAP_MIN_FLOPS` of matrix products a step (MLPs,
  patch convolutions, :mod:`fedjaxsparse.models.conv`) run ``"map"`` on CPU, as do clients of
  small models whose data outgrows the cache together but not one at a time
  (:data:`MAP_MIN_CLIENT_BYTES`, :data:`MAP_MIN_MAPPED_BYTES`); other small models run
  ``"vmap"``, as does everything on GPU/TPU (the layout accelerators batch best; the rule's
  measurements: ``benchmarks/bench_default_strategy.py``). Decided by tracing one step (no
  compile): the convolutions of the ``vmap``-ed step times the clients one ``map_clients`` call
  maps, its matrix-product FLOPs per mapped client, and the bytes of data those clients hold.
  """
  if jax.default_backend() != "cpu":
    return "vmap", f"{jax.default_backend()} backend"
  key = jax.random.key(0)
  state = jax.eval_shape(algo.init, key, params, train)
  closed, mapped = traced_step(algo.step, key, state, train)
  convs = count_primitive(closed, "conv_general_dilated")
  if not convs:
    per_client = dot_flops(closed) / max(sum(mapped), 1)
    if mapped and per_client >= MAP_MIN_FLOPS:
      return "map", f"{per_client / 1e6:.0f} MFLOP of matrix products per client step on CPU"
    each = client_bytes(train)
    if mapped and each >= MAP_MIN_CLIENT_BYTES and max(mapped) * each >= MAP_MIN_MAPPED_BYTES:
      return "map", (f"{max(mapped) * each / 2**20:.0f} MiB of client data a step on CPU, "
                     f"{each / 1024:.0f} KiB a client (cache-resident one at a time)")
    return "vmap", "no convolutions"
  convs *= max(mapped, default=1)
  if convs > MAX_UNROLLED_CONVS:
    return "vmap", (f"{convs} convolutions unrolled would exceed {MAX_UNROLLED_CONVS} "
                    "(compile time)")
  return "unroll", f"convolutions on CPU ({convs} written out loop-free)"
