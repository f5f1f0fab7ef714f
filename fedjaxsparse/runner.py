"""Running an :class:`~fedjaxsparse.core.Algorithm` for many rounds.

Rounds run under ``lax.scan`` in chunks; one chunk is one ``jit``-compiled program (traced
once per run, even for the last, shorter chunk: rounds past the end are masked with
``lax.cond``), so the host sees one dispatch per chunk. Between chunks the host updates the
progress bar, appends to the history and writes an orbax checkpoint. Evaluation runs inside
the scan every ``eval_every`` rounds (and after the last round) behind a ``lax.cond`` on the
unbatched round counter, so it costs nothing on other rounds.

Randomness: the run key splits into an init key and a rounds key; round ``r`` (0-based) uses
``fold_in(rounds_key, r)``. A run therefore does not depend on the chunk size, and a run
stopped after any chunk and resumed from its checkpoint is bitwise identical (on CPU) to an
uninterrupted one.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from fedjaxsparse.checkpoint import Checkpointer
from fedjaxsparse.core import Algorithm, ParamsFn, global_params
from fedjaxsparse.sharding import shard_clients

EvalFn = Callable[[Any, Any], dict]  # (params, test_data) -> {name: scalar}


class ChunkOutput(NamedTuple):
  """What one chunk returns to the host, stacked over its rounds ``[chunk]``.

  Attributes:
    info: the algorithm's ``info`` of every round (zeros for masked rounds past the end).
    metrics: evaluation metrics (NaN on rounds without evaluation).
    evaluated: ``bool[chunk]``, whether the round was evaluated.
  """
  info: Any
  metrics: dict
  evaluated: jax.Array


def split_run_key(key: jax.Array) -> tuple[jax.Array, jax.Array]:
  """``(init_key, rounds_key)`` of a run."""
  init_key, rounds_key = jax.random.split(key)
  return init_key, rounds_key


def build_chunk(algo: Algorithm, chunk_size: int, eval_fn: EvalFn | None = None,
                eval_every: int = 1, params_fn: ParamsFn = global_params) -> Callable:
  """The pure function that runs ``chunk_size`` rounds under ``lax.scan``.

  Returns ``chunk(rounds_key, state, start_round, num_rounds, train, test) ->
  (state, ChunkOutput)``; ``start_round`` and ``num_rounds`` are traced int32 scalars, so one
  compilation serves every chunk of a run. Rounds ``r >= num_rounds`` leave the state unchanged.
  """
  if chunk_size < 1:
    raise ValueError(f"chunk_size must be >= 1, got {chunk_size}.")
  if eval_every < 1:
    raise ValueError(f"eval_every must be >= 1, got {eval_every}.")

  def chunk(rounds_key, state, start_round, num_rounds, train, test):
    def step(s, r):
      return algo.step(jax.random.fold_in(rounds_key, r), s, train)

    info_shape = jax.eval_shape(step, state, start_round)[1]
    if eval_fn is not None:
      metrics_shape = jax.eval_shape(lambda s: eval_fn(params_fn(s), test), state)

    def body(s, r):
      active = r < num_rounds
      s, info = jax.lax.cond(
          active, step,
          lambda s, r: (s, jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), info_shape)),
          s, r)
      if eval_fn is None:
        return s, ChunkOutput(info, {}, jnp.zeros((), bool))
      evaluated = active & (((r + 1) % eval_every == 0) | (r + 1 == num_rounds))
      metrics = jax.lax.cond(
          evaluated, lambda s: eval_fn(params_fn(s), test),
          lambda s: jax.tree.map(lambda a: jnp.full(a.shape, jnp.nan, a.dtype), metrics_shape),
          s)
      return s, ChunkOutput(info, metrics, evaluated)

    rounds = start_round + jnp.arange(chunk_size, dtype=jnp.int32)
    return jax.lax.scan(body, state, rounds)

  return chunk


def _scalar_fields(info: Any) -> dict[str, np.ndarray]:
  """The scalar fields of a stacked ``info`` NamedTuple, as numpy ``[chunk]`` arrays."""
  fields = info._asdict() if hasattr(info, "_asdict") else dict(info)
  return {k: np.asarray(v) for k, v in fields.items() if np.ndim(v) == 1}


@dataclasses.dataclass
class History:
  """The metrics of a run, JSON-serialisable via :meth:`to_dict`.

  ``rounds`` holds one entry per completed round (1-based round number, every scalar ``info``
  field, cumulative ``uplink_bits``/``downlink_bits`` summed over clients); ``evals`` one entry
  per evaluation (round 0 is the initial model), with the cumulative bits at that round.
  """
  rounds: dict[str, list] = dataclasses.field(default_factory=dict)
  evals: dict[str, list] = dataclasses.field(default_factory=dict)

  def to_dict(self) -> dict:
    return {"rounds": self.rounds, "evals": self.evals}

  @classmethod
  def from_dict(cls, d: dict) -> "History":
    return cls(rounds={k: list(v) for k, v in d["rounds"].items()},
               evals={k: list(v) for k, v in d["evals"].items()})

  def _cumulative(self, name: str) -> float:
    values = self.rounds.get(name)
    return float(values[-1]) if values else 0.0

  def add_eval(self, round_: int, metrics: dict) -> None:
    row = {"round": round_, "uplink_bits": self._cumulative("uplink_bits"),
           "downlink_bits": self._cumulative("downlink_bits"),
           **{k: float(v) for k, v in metrics.items()}}
    for k, v in row.items():
      self.evals.setdefault(k, []).append(v)

  def add_chunk(self, start_round: int, out: ChunkOutput, num_active: int) -> None:
    fields = _scalar_fields(out.info)
    up = self._cumulative("uplink_bits")
    down = self._cumulative("downlink_bits")
    for j in range(num_active):
      up += float(fields.get("bits_up", np.zeros(num_active))[j])
      down += float(fields.get("bits_down", np.zeros(num_active))[j])
      row = {"round": start_round + j + 1, **{k: v[j].item() for k, v in fields.items()},
             "uplink_bits": up, "downlink_bits": down}
      for k, v in row.items():
        self.rounds.setdefault(k, []).append(v)
      if bool(out.evaluated[j]):
        self.add_eval(start_round + j + 1, {k: v[j] for k, v in out.metrics.items()})

  def last(self, table: str, name: str, default=float("nan")):
    values = getattr(self, table).get(name)
    return values[-1] if values else default


class RunResult(NamedTuple):
  """Attributes: the final ``state``; the :class:`History`; ``num_traces`` of the chunk
  function during this call (1 for a whole run); ``num_dispatches``: chunks sent to the device
  by this call."""
  state: Any
  history: History
  num_traces: int
  num_dispatches: int


def _progress_postfix(history: History) -> dict:
  post = {"loss": f"{history.last('rounds', 'loss'):.4g}",
          "up_bits": f"{history.last('rounds', 'uplink_bits', 0.0):.3g}"}
  for name in ("accuracy", "r2"):
    if name in history.evals:
      post[name] = f"{history.last('evals', name):.4f}"
  return post


def run(algo: Algorithm, key: jax.Array, params: Any, train: Any, test: Any = None, *,
        num_rounds: int, eval_fn: EvalFn | None = None, eval_every: int = 10,
        chunk_size: int | None = None, params_fn: ParamsFn = global_params,
        checkpoint_dir: str | None = None, checkpoint_every: int = 1, resume: bool = False,
        mesh: jax.sharding.Mesh | None = None, progress: bool = True, desc: str = "",
        on_chunk: Callable[[int, Any, History], None] | None = None) -> RunResult:
  """Run ``num_rounds`` rounds of ``algo``.

  Args:
    algo: the algorithm.
    key: the run's PRNG key.
    params: the initial global model.
    train: training data, passed to ``algo.init`` and ``algo.step`` (clients on axis 0).
    test: evaluation data, passed to ``eval_fn``.
    num_rounds: total rounds of the run (including rounds done before a resume).
    eval_fn: ``(params, test) -> {metric: scalar}``, e.g.
      :func:`fedjaxsparse.evaluation.make_eval_fn`; ``None`` disables evaluation.
    eval_every: evaluate every this many rounds (and after the last round).
    chunk_size: rounds per compiled chunk (default ``eval_every``, capped at ``num_rounds``).
    params_fn: ``state -> global model`` (default ``state.params``).
    checkpoint_dir: where to write orbax checkpoints (none if ``None``).
    checkpoint_every: checkpoint after every this many chunks (and after the last).
    resume: continue from the newest checkpoint in ``checkpoint_dir`` if there is one.
    mesh: shard the client axis of data and per-client state over this mesh
      (:func:`fedjaxsparse.sharding.client_mesh`).
    progress: show a progress bar (round, loss, metric, cumulative uplink bits).
    desc: progress bar label.
    on_chunk: called as ``on_chunk(round, state, history)`` after each chunk (logging, early
      stopping by raising).
  """
  if not isinstance(num_rounds, int) or num_rounds < 1:
    raise ValueError(f"num_rounds must be an int >= 1, got {num_rounds!r}.")
  if eval_every < 1:
    raise ValueError(f"eval_every must be >= 1, got {eval_every}.")
  chunk_size = min(chunk_size or eval_every, num_rounds)
  num_clients = jax.tree.leaves(train)[0].shape[0]
  if mesh is not None:
    train = shard_clients(train, mesh, num_clients)
    if test is not None:
      test_clients = jax.tree.leaves(test)[0].shape[0]
      if test_clients % mesh.shape["clients"] == 0:
        test = shard_clients(test, mesh, test_clients)
  init_key, rounds_key = split_run_key(key)

  ckpt = Checkpointer(checkpoint_dir) if checkpoint_dir is not None else None
  run_id = np.asarray(jax.random.key_data(key)).tolist()
  start = 0
  history = History()
  if ckpt is not None and resume and ckpt.latest_round() is not None:
    abstract = jax.eval_shape(algo.init, init_key, params, train)
    state, meta = ckpt.restore(abstract)
    if meta["run_id"] != run_id:
      raise ValueError(f"the checkpoint in {ckpt.directory} belongs to a run with another key "
                       f"({meta['run_id']} vs {run_id}); use another checkpoint_dir or the same "
                       "seed.")
    start, history = int(meta["round"]), History.from_dict(meta["history"])
  else:
    state = algo.init(init_key, params, train)
  if mesh is not None:
    state = shard_clients(state, mesh, num_clients)

  traces = [0]

  def counted_chunk(*args):
    traces[0] += 1
    return chunk_fn(*args)

  chunk_fn = build_chunk(algo, chunk_size, eval_fn, eval_every, params_fn)
  jitted = jax.jit(counted_chunk)
  if start == 0 and eval_fn is not None:
    history.add_eval(0, jax.device_get(jax.jit(eval_fn)(params_fn(state), test)))

  dispatches = 0
  bar = tqdm(total=num_rounds, initial=start, desc=desc, disable=not progress, unit="round",
             dynamic_ncols=True, leave=True)
  try:
    num_chunks = math.ceil((num_rounds - start) / chunk_size)
    for c in range(num_chunks):
      r0 = start + c * chunk_size
      state, out = jitted(rounds_key, state, jnp.int32(r0), jnp.int32(num_rounds), train, test)
      dispatches += 1
      active = min(chunk_size, num_rounds - r0)
      history.add_chunk(r0, jax.device_get(out), active)
      bar.update(active)
      bar.set_postfix(_progress_postfix(history), refresh=False)
      done = r0 + active
      if ckpt is not None and ((c + 1) % checkpoint_every == 0 or done == num_rounds):
        ckpt.save(done, state, {"round": done, "run_id": run_id, "history": history.to_dict()})
      if on_chunk is not None:
        on_chunk(done, state, history)
  finally:
    bar.close()
    if ckpt is not None:
      ckpt.close()
  return RunResult(state, history, traces[0], dispatches)
