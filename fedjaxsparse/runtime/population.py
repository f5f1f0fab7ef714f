"""Per-client state of a large population, touched only for the round's cohort — on the device
or in host memory.

Algorithms with partial participation and per-client state (control variates, personal
models, masks) read and write the state of the sampled cohort only. Written as a
:class:`CohortAlgorithm` — a server state, one client's initial state, and a *cohort step* on
the gathered states of the ``C`` sampled clients — such an algorithm runs two ways with the
same keys and the same result:

* :func:`on_device`: an ordinary :class:`~fedjaxsparse.core.Algorithm` whose state holds every
  client's state ``[N, ...]`` on the device; each round samples the cohort inside ``jit``,
  gathers its rows, runs the cohort step and scatters them back (one XLA program per round;
  the runner's chunks, checkpoints and sharding apply).
* :func:`run_on_host`: the population's client state (and its training data) stays in host
  memory as numpy arrays; each round samples the cohort with the same key, gathers its rows
  on the host, runs the same compiled cohort step on the device, and writes the rows back.
  Device memory scales with the cohort, not the population (``benchmarks/bench_population.py``
  measures the peak).

:func:`choose_residence` picks ``"host"`` when the population's client state would take more
than a fraction of the device's memory. Randomness: round ``r`` uses ``fold_in(rounds_key,
r)`` split into the cohort key and the step key, for both residences.
"""
from __future__ import annotations

import time
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from fedjaxsparse.core import Algorithm
from fedjaxsparse.data.federated import FederatedData, check_data
from fedjaxsparse.runtime.runner import EvalFn, History, split_run_key
from fedjaxsparse.ops.sampling import check_cohort_size, sample_cohort
from fedjaxsparse.runtime.runner import run as run_device
from fedjaxsparse.errors import check_int
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["CohortAlgorithm", "PopulationState", "on_device", "state_bytes", "choose_residence",
           "HostRun", "live_device_bytes", "run_on_host", "run"]
__dir__ = _public_dir(__all__)

RESIDENCES = ("auto", "device", "host")


class CohortAlgorithm(NamedTuple):
  """An algorithm whose per-client state is read and written for the cohort only.

  Attributes:
    init: ``(key, params) -> server_state`` (exposes the global model as ``.params``).
    init_client: ``(server_state, client_data) -> one client's state`` (vmapped over clients).
    step: ``(key, server_state, client_states [C, ...], ids int32[C], cohort_data [C, ...],
      num_clients) -> (server_state, client_states [C, ...], info)``; ``num_clients`` is the
      static population size N.
    cohort_size: clients per round ``C`` (static; ``None``: all).
  """
  init: Callable
  init_client: Callable
  step: Callable
  cohort_size: int | None


class PopulationState(NamedTuple):
  """Attributes: ``server`` (the server state) and ``clients`` (``[N, ...]`` client states)."""
  server: Any
  clients: Any

  @property
  def params(self):
    return self.server.params


def _round_keys(key: jax.Array) -> tuple[jax.Array, jax.Array]:
  k_cohort, k_step = jax.random.split(key)
  return k_cohort, k_step


def on_device(algo: CohortAlgorithm) -> Algorithm:
  """``algo`` with every client's state on the device (:class:`PopulationState`)."""

  def init(key, params, data: FederatedData) -> PopulationState:
    check_data(data)
    check_cohort_size(algo.cohort_size, data.num_clients)
    server = algo.init(key, params)
    return PopulationState(server, jax.vmap(algo.init_client, in_axes=(None, 0))(server, data))

  def step(key, state: PopulationState, data: FederatedData):
    n = data.num_clients
    k_cohort, k_step = _round_keys(key)
    ids = sample_cohort(k_cohort, n, algo.cohort_size)
    rows = jax.tree.map(lambda a: jnp.take(a, ids, axis=0), state.clients)
    server, rows, info = algo.step(k_step, state.server, rows, ids, data.select(ids), n)
    clients = jax.tree.map(lambda a, r: a.at[ids].set(r), state.clients, rows)
    return PopulationState(server, clients), info

  return Algorithm(init, step)


def state_bytes(algo: CohortAlgorithm, params: Any, data: FederatedData) -> int:
  """Bytes of the population's client state ``[N, ...]`` (computed abstractly)."""
  server = jax.eval_shape(algo.init, jax.random.key(0), params)
  one = jax.eval_shape(algo.init_client, server, jax.tree.map(lambda a: a[0], data))
  return data.num_clients * sum(int(np.prod(a.shape)) * a.dtype.itemsize
                                for a in jax.tree.leaves(one))


def choose_residence(algo: CohortAlgorithm, params: Any, data: FederatedData,
                     fraction: float = 0.5) -> tuple[str, str]:
  """``("host" | "device", reason)``: host when the client state (plus the training data)
  exceeds ``fraction`` of the device's memory (``memory_stats()['bytes_limit']``; a device that
  reports none, such as the CPU, keeps everything on the device)."""
  need = state_bytes(algo, params, data) + sum(a.nbytes for a in jax.tree.leaves(data))
  stats = jax.devices()[0].memory_stats() or {}
  limit = stats.get("bytes_limit")
  if not limit:
    return "device", f"{jax.devices()[0].platform} reports no memory limit"
  if need > fraction * limit:
    return "host", f"{need / 2**30:.2f} GiB of client state and data > {fraction:.0%} of " \
                   f"{limit / 2**30:.1f} GiB"
  return "device", f"{need / 2**30:.2f} GiB fits"


class HostRun(NamedTuple):
  """Attributes: ``server`` (final server state), ``clients`` (numpy ``[N, ...]`` client
  states), ``history``, ``train_time_s``, ``peak_device_bytes`` (largest total of live device
  buffers seen at a round boundary)."""
  server: Any
  clients: Any
  history: History
  train_time_s: float
  peak_device_bytes: int


def live_device_bytes() -> int:
  """Bytes held by every live JAX array of this process (what :func:`run_on_host` reports as
  its peak device memory)."""
  return sum(a.nbytes for a in jax.live_arrays())


def run_on_host(algo: CohortAlgorithm, key: jax.Array, params: Any, train: FederatedData,
                test: Any = None, *, num_rounds: int, eval_fn: EvalFn | None = None,
                eval_every: int = 10, progress: bool = True, desc: str = "") -> HostRun:
  """Run ``algo`` for ``num_rounds`` rounds with the client state and ``train`` in host
  memory (the same result as ``runner.run(on_device(algo), ...)`` with the same key)."""
  num_rounds = check_int("num_rounds", num_rounds, 1)
  if eval_every < 1:
    raise ValueError(f"eval_every must be >= 1, got {eval_every}.")
  train.validate("train")
  n = train.num_clients
  c = check_cohort_size(algo.cohort_size, n)
  host = jax.tree.map(np.asarray, train)
  t_start = time.perf_counter()
  init_key, rounds_key = split_run_key(key)
  server = jax.jit(algo.init)(init_key, params)
  init_rows = jax.jit(jax.vmap(algo.init_client, in_axes=(None, 0)))
  clients = None
  for lo in range(0, n, c):  # the initial client states, a cohort-sized block at a time
    ids = np.arange(lo, min(lo + c, n))
    rows = jax.device_get(init_rows(server, jax.tree.map(lambda a: a[ids], host)))
    if clients is None:
      clients = jax.tree.map(lambda r: np.empty((n,) + r.shape[1:], r.dtype), rows)
    jax.tree.map(lambda a, r: a.__setitem__(ids, r), clients, rows)

  @jax.jit
  def cohort(key):
    k_cohort, _ = _round_keys(key)
    return sample_cohort(k_cohort, n, algo.cohort_size)

  @jax.jit
  def round_step(key, server, rows, ids, data):
    return algo.step(_round_keys(key)[1], server, rows, ids, data, n)

  evaluate = jax.jit(eval_fn) if eval_fn is not None else None
  history = History()
  if evaluate is not None:
    history.add_eval(0, jax.device_get(evaluate(server.params, test)))
  peak = live_device_bytes()
  bar = tqdm(total=num_rounds, desc=desc, disable=not progress, unit="round", leave=True)
  try:
    for r in range(num_rounds):
      key_r = jax.random.fold_in(rounds_key, r)
      ids = np.asarray(cohort(key_r))
      rows = jax.tree.map(lambda a: a[ids], clients)
      server, rows, info = round_step(key_r, server, rows, ids,
                                      jax.tree.map(lambda a: a[ids], host))
      jax.tree.map(lambda a, v: a.__setitem__(ids, v), clients, jax.device_get(rows))
      peak = max(peak, live_device_bytes())
      info = {k: np.asarray(v)[None] for k, v in info._asdict().items() if np.ndim(v) == 0}
      out = _HostChunk(info)
      history.add_chunk(r, out, 1)
      if evaluate is not None and ((r + 1) % eval_every == 0 or r + 1 == num_rounds):
        history.add_eval(r + 1, jax.device_get(evaluate(server.params, test)))
      bar.update(1)
  finally:
    bar.close()
  return HostRun(server, clients, history, time.perf_counter() - t_start, peak)


class _HostChunk(NamedTuple):  # what History.add_chunk reads
  info: dict
  evaluated: np.ndarray = np.zeros(1, bool)
  metrics: dict = {}


def run(algo: CohortAlgorithm, key: jax.Array, params: Any, train: FederatedData,
        test: Any = None, *, num_rounds: int, residence: str = "auto", **kw):
  """Run ``algo`` with its client state where ``residence`` says: ``"device"``
  (:func:`fedjaxsparse.runtime.runner.run` of :func:`on_device`; returns its ``RunResult``),
  ``"host"`` (:func:`run_on_host`; returns a :class:`HostRun`) or ``"auto"``
  (:func:`choose_residence`). ``kw`` go to the chosen runner (``eval_fn``, ``eval_every``,
  ``progress``, ``desc``; the device runner also takes checkpoints, mesh, ...)."""
  if residence not in RESIDENCES:
    raise ValueError(f"residence must be one of {RESIDENCES}, got {residence!r}.")
  if residence == "auto":
    residence = choose_residence(algo, params, train)[0]
  if residence == "host":
    return run_on_host(algo, key, params, train, test, num_rounds=num_rounds, **kw)
  return run_device(on_device(algo), key, params, train, test, num_rounds=num_rounds, **kw)
