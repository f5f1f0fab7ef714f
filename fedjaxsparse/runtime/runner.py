"""Running an :class:`~fedjaxsparse.core.Algorithm` for many rounds.

Rounds run in chunks; one chunk is one ``jit``-compiled program, a loop over its rounds
(traced once per run, even for the last, shorter chunk: the loop's trip count is a traced
number, so no round past the end runs and no ``lax.cond`` wraps the step — the state is
updated in place), so the host sees one dispatch per chunk. Between chunks the host updates the
progress bar, appends to the history and writes an orbax checkpoint. Evaluation (every
``eval_every`` rounds and after the last round) is a program of its own run after the chunk
that ends on an evaluation round when chunks end on every such round (the default
``chunk_size = eval_every``), else it runs inside the loop behind a ``lax.cond`` on the
unbatched round counter. Loop-free runs (clients ``"unroll"``, chosen automatically for
convolutional clients on CPU) dispatch one round at a time with no loop and no ``cond``.

Randomness: the run key splits into an init key and a rounds key; round ``r`` (0-based) uses
``fold_in(rounds_key, r)``. A run therefore does not depend on the chunk size, and a run
stopped after any chunk and resumed from its checkpoint is bitwise identical (on CPU) to an
uninterrupted one.

Trust: a checkpoint records the run's fingerprint (:mod:`fedjaxsparse.runtime.fingerprint`), a digest
of its state and the total training time; ``resume`` refuses a checkpoint of another run and
falls back past damaged steps; a fresh run refuses to write over an earlier run's checkpoints
unless told to; the checkpoint folder is locked while a run uses it. Every chunk also reports
whether the loss, the other ``info`` scalars, the evaluated metrics and every state leaf are
finite, so a diverging run stops at once with the round and quantity named.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import math
import time
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm
from jax.experimental import multihost_utils
from flax import errors as flax_errors

from fedjaxsparse.runtime.checkpoint import (Checkpointing, check_checkpointing,
                                             check_resumable, open_checkpoint)
from fedjaxsparse.runtime.clients import (Executed, arg_signature, auto_layout, cached_step,
                                          choose_strategy, with_strategy)
from fedjaxsparse.core import Algorithm, ParamsFn, global_params
from fedjaxsparse.data.federated import FederatedData
from fedjaxsparse.errors import NonFiniteError, UserError, check_int
from fedjaxsparse.runtime.fingerprint import run_fingerprint
from fedjaxsparse.runtime.locking import FolderLock
from fedjaxsparse.runtime.sharding import shard_clients
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["ChunkOutput", "split_run_key", "build_chunk", "state_finite", "History", "RunResult",
           "first_nonfinite", "run", "arrange"]
__dir__ = _public_dir(__all__)

EvalFn = Callable[[Any, Any], dict]  # (params, test_data) -> {name: scalar}


class ChunkOutput(NamedTuple):
  """What one chunk returns to the host, stacked over its rounds ``[chunk]``.

  Attributes:
    info: the algorithm's ``info`` of every round (zeros for rounds past the end, not run).
    metrics: evaluation metrics (NaN on rounds without evaluation).
    evaluated: ``bool[chunk]``, whether the round was evaluated.
    state_ok: ``bool[chunk]``, whether the state is finite after each round (the leaves the
      round changed; with ``build_chunk(check_every_round=False)`` only the last round's entry
      is checked, on the whole state, and the others are True).
    state_finite: ``bool[L]``, whether each floating leaf of the state (in ``jax.tree``
      order) is finite at the end of the chunk (names the leaf). Both are the divergence
      check, computed inside the compiled chunk so the host reads booleans, not the state.
  """
  info: Any
  metrics: dict
  evaluated: jax.Array
  state_ok: jax.Array
  state_finite: jax.Array


@jax.jit
def split_run_key(key: jax.Array) -> tuple[jax.Array, jax.Array]:
  """``(init_key, rounds_key)`` of a run (one compiled program, not an eager op each)."""
  init_key, rounds_key = jax.random.split(key)
  return init_key, rounds_key


# the key of round 0 (the step's trace at a round's key types), compiled rather than eager
_round0_key = jax.jit(lambda rounds_key: jax.random.fold_in(rounds_key, 0))


def build_chunk(algo: Algorithm, chunk_size: int, eval_fn: EvalFn | None = None,
                eval_every: int = 1, params_fn: ParamsFn = global_params,
                traced: tuple[Callable, Any] | None = None,
                check_every_round: bool = True) -> Callable:
  """The pure function that runs up to ``chunk_size`` rounds in one loop.

  ``traced``: ``(step_fn, (state, info) shapes)`` of :func:`fedjaxsparse.runtime.clients.cached_step`
  — the algorithm's step already traced, evaluated from its jaxpr instead of tracing it again.

  Returns ``chunk(rounds_key, state, start_round, num_rounds, train, test) ->
  (state, ChunkOutput)``; ``start_round`` and ``num_rounds`` (the run's end, exclusive) are
  traced int32 scalars, so one compilation serves every chunk of a run. Rounds
  ``r >= num_rounds`` do not run (their ``info`` rows are zeros) — and a chunk of one round is
  one plain step with no loop and no ``lax.cond`` around it (loop-free rounds: a convolution
  inside a loop or a ``cond`` is several times slower on XLA:CPU), which must not be called
  past the end.

  ``check_every_round``: ``state_ok`` tells after every round whether the state's changed
  leaves are finite (the exact round of a divergence); ``False`` checks the state once, after
  the chunk's last round (``state_ok`` is True before it): one pass over the state a chunk
  instead of one a round (a per-client state of N × d floats is read every round otherwise).
  The runner uses ``False`` and re-runs a chunk whose final state is not finite with ``True``.
  """
  if chunk_size < 1:
    raise ValueError(f"chunk_size must be >= 1, got {chunk_size}.")
  if eval_every < 1:
    raise ValueError(f"eval_every must be >= 1, got {eval_every}.")

  step_fn, shapes = traced if traced is not None else (algo.step, None)

  def chunk(rounds_key, state, start_round, num_rounds, train, test):
    def step(s, r):
      return step_fn(jax.random.fold_in(rounds_key, r), s, train)

    info_shape = (shapes if shapes is not None else jax.eval_shape(step, state, start_round))[1]
    if eval_fn is not None:
      metrics_shape = jax.eval_shape(lambda s: eval_fn(params_fn(s), test), state)

    def evaluate(s, r):
      evaluated = ((r + 1) % eval_every == 0) | (r + 1 == num_rounds)
      metrics = jax.lax.cond(
          evaluated, lambda s: eval_fn(params_fn(s), test),
          lambda s: jax.tree.map(lambda a: jnp.full(a.shape, jnp.nan, a.dtype), metrics_shape),
          s)
      return metrics, evaluated

    passed = []   # indices of the leaves the step passes through unchanged (set when traced)

    def round_(s, r):
      """One round: the state, its info, metrics, whether evaluated, whether finite."""
      new, info = step(s, r)
      # leaves the step passed through unchanged (constants: x*, masks kept) are not re-read
      # every round: they are checked once, on the chunk's input state (below)
      pairs = list(zip(jax.tree.leaves(new), jax.tree.leaves(s)))
      passed[:] = [i for i, (a, b) in enumerate(pairs) if a is b]
      changed = [a for a, b in pairs if a is not b]
      ok = jnp.all(state_finite(changed)) if check_every_round else jnp.ones((), bool)
      if eval_fn is None:
        return new, info, {}, jnp.zeros((), bool), ok
      metrics, evaluated = evaluate(new, r)
      return new, info, metrics, evaluated, ok

    if chunk_size == 1:   # loop- and cond-free round (the runner never dispatches one past
      state, info, metrics, evaluated, _ = round_(state, start_round)   # the end)
      finite = state_finite(state)
      return state, ChunkOutput(*jax.tree.map(lambda a: a[None], (
          info, metrics, evaluated, jnp.all(finite))), finite)
    # Rounds start_round .. min(start_round + chunk_size, num_rounds) - 1 in a loop of that
    # many trips, each writing its row of the outputs: no lax.cond around the step, so state
    # updates happen in place (a cond keeps the old state alive for its other branch: two
    # copies of every updated per-client array a round).
    outs = (jax.tree.map(lambda a: jnp.zeros((chunk_size,) + a.shape, a.dtype), info_shape),
            {} if eval_fn is None else jax.tree.map(
                lambda a: jnp.full((chunk_size,) + a.shape, jnp.nan, a.dtype), metrics_shape),
            jnp.zeros((chunk_size,), bool), jnp.ones((chunk_size,), bool))

    def body(r, carry):
      s, outs = carry
      s, *row = round_(s, r)
      i = r - start_round
      return s, jax.tree.map(lambda buf, v: buf.at[i].set(v), outs, tuple(row))

    end = jnp.minimum(start_round + chunk_size, num_rounds)
    start_leaves = jax.tree.leaves(state)
    state, (info, metrics, evaluated, ok) = jax.lax.fori_loop(start_round, end, body,
                                                              (state, outs))
    finite = state_finite(state)
    if check_every_round:   # a passed-through leaf is what it was when the chunk started
      ok = ok & jnp.all(state_finite([start_leaves[i] for i in passed]))
    else:                   # the whole state once, as the last round's flag
      ok = ok.at[end - 1 - start_round].set(jnp.all(finite))
    return state, ChunkOutput(info, metrics, evaluated, ok, finite)

  return chunk


def _float_leaves(tree: Any) -> list[tuple[str, jax.Array]]:
  """``(path, leaf)`` of the floating-point leaves of ``tree``, in ``jax.tree`` order."""
  return [(jax.tree_util.keystr(path), leaf)
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
          if jnp.issubdtype(jnp.result_type(leaf), jnp.inexact)]


@jax.jit
def state_finite(state: Any) -> jax.Array:
  """``bool[L]``: whether each floating leaf of ``state`` is all-finite (jittable; compiled
  as one program where it is called outside a trace, not an eager op per leaf)."""
  flags = [jnp.all(jnp.isfinite(leaf)) for _, leaf in _float_leaves(state)]
  return jnp.stack(flags) if flags else jnp.ones((0,), bool)


def _scalar_fields(info: Any) -> dict[str, np.ndarray]:
  """The scalar fields of a stacked ``info`` NamedTuple, as numpy ``[chunk]`` arrays."""
  fields = info._asdict() if hasattr(info, "_asdict") else dict(info)
  return {k: np.asarray(v) for k, v in fields.items() if np.ndim(v) == 1}


def _metric_value(v):
  """A scalar metric as a float, a vector one (per-client values) as a list of floats."""
  v = np.asarray(v)
  return float(v) if v.ndim == 0 else v.astype(float).tolist()


@dataclasses.dataclass
class History:
  """The metrics of a run, JSON-serialisable via :meth:`to_dict`.

  ``rounds`` holds one entry per completed round (1-based round number, every scalar ``info``
  field, cumulative ``uplink_bits``/``downlink_bits`` summed over clients); ``evals`` one entry
  per evaluation (round 0 is the initial model), with the cumulative bits at that round; a
  vector metric (per-client values, e.g. ``accuracy_per_client``) is stored as a list.
  """
  rounds: dict[str, list] = dataclasses.field(default_factory=dict)
  evals: dict[str, list] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    for table in (self.rounds, self.evals):  # present even when a run stopped at once
      for name in ("round", "uplink_bits", "downlink_bits"):
        table.setdefault(name, [])

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
           **{k: _metric_value(v) for k, v in metrics.items()}}
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

  def drop_last_eval(self) -> None:
    for values in self.evals.values():
      values.pop()

  def last(self, table: str, name: str, default=float("nan")):
    values = getattr(self, table).get(name)
    return values[-1] if values else default


class RunResult(NamedTuple):
  """Attributes: the final ``state``; the :class:`History`; ``num_traces`` of the chunk
  function during this call (1 for a whole run); ``num_dispatches``: chunks sent to the device
  by this call; ``train_time_s``: wall time of the whole run, summed over every call that
  resumed it; ``diverged``: ``None``, or ``{"round", "quantity"}`` when the run stopped on a
  non-finite value with ``on_nonfinite="stop"``; ``clients``: the client execution strategy
  that ran (``clients="auto"`` resolved)."""
  state: Any
  history: History
  num_traces: int
  num_dispatches: int
  train_time_s: float = 0.0
  diverged: dict | None = None
  clients: str = "vmap"


NONFINITE = ("raise", "stop")
LAYOUTS = ("auto", "padded")


def _progress_postfix(history: History) -> dict:
  post = {"loss": f"{history.last('rounds', 'loss'):.4g}",
          "up_bits": f"{history.last('rounds', 'uplink_bits', 0.0):.3g}"}
  for name in ("accuracy", "r2"):
    if name in history.evals:
      post[name] = f"{history.last('evals', name):.4f}"
  return post


def first_nonfinite(out: ChunkOutput, start_round: int, num_active: int,
                    state_paths: list[str]) -> tuple[int, str, float | None] | None:
  """``(round, quantity, value)`` of the first non-finite value a chunk produced, or ``None``.

  Scalar ``info`` fields, evaluated metrics and the state are all checked round by round, so
  the round is exact; a state found non-finite after round r, before any scalar showed it, is
  named by its first non-finite leaf at the end of the chunk (value ``None``).
  """
  first = None
  metrics = {k: v for k, v in out.metrics.items() if np.ndim(v) == 1}  # [rounds]; per-client
  for table, fields in (("", _scalar_fields(out.info)), ("test ", metrics)):  # vectors (NaN
    for name, values in fields.items():  # for a client without test data) are checked
      values = np.asarray(values)[:num_active]  # through their scalar summaries
      if table:
        values = np.where(np.asarray(out.evaluated)[:num_active], values, 0.0)
      bad = np.flatnonzero(~np.isfinite(values))
      if bad.size and (first is None or bad[0] < first[0]):
        first = (int(bad[0]), table + name, float(values[bad[0]]))
  bad_state = np.flatnonzero(~np.asarray(out.state_ok)[:num_active])
  if bad_state.size and (first is None or bad_state[0] < first[0]):
    finite = np.asarray(out.state_finite)
    leaf = state_paths[int(np.argmin(finite))] if not finite.all() else ""
    first = (int(bad_state[0]), "state" + leaf, None)
  if first is not None:
    return start_round + first[0] + 1, first[1], first[2]
  return None


def _label_hint(*datasets: Any) -> str:
  """What the run's integer labels span (real examples only): a label outside the model's
  classes makes the cross-entropy non-finite, and the runner does not know the classes."""
  spans = []
  for data in datasets:
    y, mask = getattr(data, "y", None), getattr(data, "mask", None)
    if y is None or mask is None or isinstance(y, jax.core.Tracer):
      continue
    try:   # (arrays spread over several processes are not readable here: no hint)
      y, mask = np.asarray(y), np.asarray(mask)
    except Exception:   # noqa: BLE001
      continue
    if not np.issubdtype(y.dtype, np.integer) or y.shape[:2] != mask.shape:
      continue
    real = y[mask > 0]
    if real.size:
      spans.append((int(real.min()), int(real.max())))
  if not spans:
    return ""
  lo, hi = min(s[0] for s in spans), max(s[1] for s in spans)
  return (f" The integer labels span [{lo}, {hi}]: a label outside [0, number of classes) "
          "also makes the loss non-finite.")


def run(algo: Algorithm, key: jax.Array, params: Any, train: Any, test: Any = None, *,
        num_rounds: int, eval_fn: EvalFn | None = None, eval_every: int = 10,
        chunk_size: int | None = None, params_fn: ParamsFn = global_params,
        checkpoint: Checkpointing | None = None,
        on_nonfinite: str = "raise", mesh: jax.sharding.Mesh | None = None,
        progress: bool = True, desc: str = "", estimate_after_s: float = 60.0,
        on_chunk: Callable[[int, Any, History], None] | None = None,
        layout: str = "auto", clients: str = "auto") -> RunResult:
  """Run ``num_rounds`` rounds of ``algo``.

  Args:
    algo: the algorithm; a :class:`~fedjaxsparse.runtime.population.CohortAlgorithm` (per-client
      state read and written for the cohort only, e.g. ``fjs.ef_bv_pp``) runs with its
      population on the device (:func:`~fedjaxsparse.runtime.population.on_device`;
      :func:`~fedjaxsparse.runtime.population.run_on_host` keeps it in host memory).
    key: the run's PRNG key.
    params: the initial global model.
    train: training data, passed to ``algo.init`` and ``algo.step`` (clients on axis 0);
      a :class:`~fedjaxsparse.data.FederatedData` is validated first (``validate()``).
    test: evaluation data, passed to ``eval_fn``.
    num_rounds: total rounds of the run (including rounds done before a resume). What a round
      is, is the algorithm's: one communication round for FedAvg-style methods, one iteration
      (local step, communicating with probability p) for the iteration form of ProxSkip.
    eval_fn: ``(params, test) -> {metric: scalar}``, e.g.
      :func:`fedjaxsparse.evaluation.make_eval_fn`; ``None`` disables evaluation.
    eval_every: evaluate every this many rounds (and after the last round).
    chunk_size: rounds per compiled chunk (default ``eval_every``, capped at ``num_rounds``).
    params_fn: ``state -> global model`` (default ``state.params``).
    checkpoint: the run's orbax checkpoints, a
      :class:`~fedjaxsparse.runtime.checkpoint.Checkpointing` — ``fjs.Checkpointing(directory,
      every=1, interval_s=0.0, resume=False, overwrite=False, fingerprint=None)``: the folder
      (locked while the run is active), every how many chunks and seconds to save, whether to
      resume the same run (up to ``num_rounds``) or delete an earlier run's checkpoints, and
      extra components of the run's identity (each field described there). ``None``
      (default): no checkpoints.
    on_nonfinite: what a NaN/inf in the loss, any ``info`` scalar, an evaluated metric or the
      state does: ``"raise"`` a :class:`~fedjaxsparse.errors.NonFiniteError` naming the round
      and quantity, or ``"stop"`` the run there and return it with ``diverged`` set (its
      history holds the rounds before the first non-finite one). Checked inside the compiled
      chunk, read at every chunk boundary.
    mesh: shard the client axis of data and per-client state over this mesh
      (:func:`fedjaxsparse.runtime.sharding.client_mesh`).
    progress: show a progress bar (round, loss, metric, cumulative uplink bits), and an
      estimate of the remaining time when it exceeds ``estimate_after_s``.
    desc: progress bar label (and the run's name in errors).
    on_chunk: called as ``on_chunk(round, state, history)`` after each chunk (logging, early
      stopping by raising).
    layout: ``"auto"`` puts unequal clients of a :class:`~fedjaxsparse.data.FederatedData`
      into size buckets (:func:`fedjaxsparse.runtime.clients.auto_layout`) when the algorithm is
      ``bucketable`` and no ``mesh`` is given — the same result, less padded work;
      ``"padded"`` runs ``train`` as given.
    clients: how the clients' kernels execute (:func:`fedjaxsparse.runtime.clients.with_strategy`):
      ``"auto"`` (default: :func:`fedjaxsparse.runtime.clients.choose_strategy`, ``"vmap"`` unless
      convolutional clients on CPU), ``"vmap"``, ``"map"``, ``"unroll"`` or ``"unroll:G"`` —
      the same results, different speed and compile time
      (``benchmarks/bench_client_strategies.py``). Under ``"unroll"`` rounds run loop-free:
      one round per dispatch (``chunk_size`` defaults to 1) and evaluation as its own program.
  """
  from fedjaxsparse.runtime import population   # population builds on this module
  if isinstance(algo, population.CohortAlgorithm):
    algo = population.on_device(algo)
  num_rounds = check_int("num_rounds", num_rounds, 1)
  eval_every = check_int("eval_every", eval_every, 1)
  if chunk_size is not None:
    chunk_size = check_int("chunk_size", chunk_size, 1)
  if on_nonfinite not in NONFINITE:
    raise ValueError(f"on_nonfinite must be one of {NONFINITE}, got {on_nonfinite!r}.")
  checkpoint = check_checkpointing(checkpoint, min_every=1)
  if isinstance(train, FederatedData):
    train.validate("train")
  if isinstance(test, FederatedData):
    test.validate("test", allow_empty=True)
  with _params_fit(params, train, desc):
    train = arrange(algo, train, layout, mesh, clients, params)
    if checkpoint is None:
      return _run(algo, key, params, train, test, num_rounds, eval_fn, eval_every, chunk_size,
                  params_fn, None, None, on_nonfinite, mesh, progress, desc, estimate_after_s,
                  on_chunk)
    lock = (FolderLock(checkpoint.directory, purpose=f"checkpoints of {desc or 'a run'}")
            if jax.process_index() == 0 else contextlib.nullcontext())  # one lock per run
    with lock:
      ckpt = open_checkpoint(checkpoint.directory, resume=checkpoint.resume,
                             overwrite=checkpoint.overwrite)
      try:
        return _run(algo, key, params, train, test, num_rounds, eval_fn, eval_every,
                    chunk_size, params_fn, ckpt, checkpoint, on_nonfinite, mesh, progress, desc,
                    estimate_after_s, on_chunk)
      finally:
        ckpt.close()


_SHAPE_MESSAGES = ("dot_general requires", "incompatible shapes", "shape mismatch",
                   "cannot reshape", "must have the same shape", "shapes must be equal",
                   "got incompatible shapes", "conv_general_dilated lhs feature dimension",
                   "size of the input")


def _shape_error(e: BaseException) -> bool:
  """Whether ``e`` (raised while tracing a run) says that arrays of mismatched shapes met."""
  if isinstance(e, UserError):
    return False
  if isinstance(e, flax_errors.ScopeParamShapeError):
    return True
  msg = str(e).lower()
  return isinstance(e, (TypeError, ValueError)) and any(m in msg for m in _SHAPE_MESSAGES)


@contextlib.contextmanager
def _params_fit(params: Any, train: Any, desc: str):
  """Turns a shape clash inside the traced model into one error naming ``params`` and the
  data's feature shape (the usual cause: params of another model, or another input size)."""
  try:
    yield
  except Exception as e:  # noqa: BLE001  (re-raised unless it is a shape clash)
    if not _shape_error(e):
      raise
    leaves = jax.tree_util.tree_leaves_with_path(params)
    shapes = ", ".join(f"{jax.tree_util.keystr(p)}: {tuple(np.shape(v))}"
                       for p, v in leaves[:3]) + (", ..." if len(leaves) > 3 else "")
    data = getattr(train, "data", train)
    feat = tuple(np.shape(data.x)[2:]) if hasattr(data, "x") else "?"
    first = str(e).strip().splitlines()[0][:240] if str(e).strip() else type(e).__name__
    raise ValueError(
        f"run{' (' + desc + ')' if desc else ''}: params do not fit the model or the data — "
        f"{first}. params: {shapes}; the data's examples have shape {feat}. Pass the params "
        "of the model the algorithm's loss uses (model.init), built for inputs of that "
        "shape.") from e


def arrange(algo: Algorithm, train: Any, layout: str, mesh=None, clients: str = "vmap",
            params: Any = None) -> Any:
  """``train`` in the layout and client execution strategy to run (see :func:`run`);
  ``clients="auto"`` needs the initial ``params`` (it traces one step) and means ``"vmap"``
  under a ``mesh`` (the devices split the batched kernel); any other strategy also runs on a
  sharded client axis, the same result."""
  if layout not in LAYOUTS:
    raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}.")
  if (layout == "auto" and getattr(algo, "bucketable", False) and mesh is None
      and isinstance(train, FederatedData)):
    train = auto_layout(train)
  if clients == "auto":
    if mesh is not None or params is None:
      return train
    clients = choose_strategy(algo, params, train)[0]
  if clients != "vmap":
    train = with_strategy(train, clients)
  return train


def _run(algo, key, params, train, test, num_rounds, eval_fn, eval_every, chunk_size,
         params_fn, ckpt, checkpoint: Checkpointing | None, on_nonfinite, mesh, progress, desc,
         estimate_after_s, on_chunk) -> RunResult:
  t_start = time.perf_counter()
  progress = progress and jax.process_index() == 0  # several processes: one bar
  strategy = train.strategy if isinstance(train, Executed) else "vmap"
  loop_free = strategy == "unroll"
  # (with ``ckpt``, ``checkpoint`` is its validated record)
  checkpoint_rounds = checkpoint.every * (chunk_size or eval_every) if ckpt is not None else 0
  chunk_size = min(chunk_size or (1 if loop_free else eval_every), num_rounds)
  init_key, rounds_key = split_run_key(key)
  run_id = np.asarray(jax.random.key_data(key)).tolist()
  fp = None
  if ckpt is not None:
    plain = train.data if isinstance(train, Executed) else train  # execution: speed only
    fp = run_fingerprint(algo, init_key, params, plain, test, run_id=run_id, eval_fn=eval_fn,
                         params_fn=params_fn, eval_every=eval_every,
                         config=checkpoint.fingerprint)
  num_clients = train.num_clients if hasattr(train, "num_clients") else \
      jax.tree.leaves(train)[0].shape[0]

  start, history, prior_time = 0, History(), 0.0
  if ckpt is not None and ckpt.latest_round() is not None:  # resume (run() checked the flag)
    abstract = jax.eval_shape(algo.init, init_key, params, train)
    state, meta = ckpt.restore_latest(  # the fingerprint is checked before a state is read
        abstract, lambda meta: check_resumable(ckpt, meta, fp, 0, num_rounds))
    start = int(meta["round"])
    check_resumable(ckpt, meta, fp, start, num_rounds)
    history, prior_time = History.from_dict(meta["history"]), float(meta["train_time_s"])
    if start < num_rounds and start % eval_every and history.last("evals", "round", -1) == start:
      history.drop_last_eval()  # the shorter run's final-round evaluation: not on schedule
  else:
    state = algo.init(init_key, params, train)
  if mesh is not None:  # after init: with several processes the host reads local data only
    state = shard_clients(state, mesh, num_clients)
    train = shard_clients(train, mesh, num_clients)
    if test is not None:
      test_clients = jax.tree.leaves(test)[0].shape[0]
      if test_clients % mesh.shape["clients"] == 0:
        test = shard_clients(test, mesh, test_clients)
  state_paths = [p for p, _ in _float_leaves(state)]

  # Chunks ending on every evaluation round: evaluate as a program of its own, after them.
  host_eval = eval_fn is not None and eval_every % chunk_size == 0 and start % chunk_size == 0
  # the step's trace kept from choosing the strategy / the fingerprint, at these types
  traced = None if mesh is not None else cached_step(
      algo.step, _round0_key(rounds_key), state, train)
  jitted, traces = _compiled_chunk(
      algo, chunk_size, None if host_eval else eval_fn, eval_every, params_fn, traced,
      None if mesh is not None else (rounds_key, state, train, test))
  exact = []   # the chunk checking the state every round, compiled when a state goes NaN
  jitted_eval = jax.jit(eval_fn) if eval_fn is not None else None
  if start == 0 and eval_fn is not None:
    initial = jax.device_get(jitted_eval(params_fn(state), test))
    bad = [(k, float(v)) for k, v in initial.items() if np.ndim(v) == 0 and not np.isfinite(v)]
    if bad:
      err = NonFiniteError.diverged(desc, 0, "test " + bad[0][0], bad[0][1],
                                    _label_hint(train, test))
      if on_nonfinite == "raise":
        raise err
      return RunResult(state, history, 0, 0, time.perf_counter() - t_start,
                       {"round": 0, "quantity": err.quantity})
    history.add_eval(0, initial)

  dispatches, diverged, since_checkpoint = 0, None, 0
  last_checkpoint = time.perf_counter()
  chunk_times = []
  bar = tqdm(total=num_rounds, initial=start, desc=desc, disable=not progress, unit="round",
             dynamic_ncols=True, leave=True)
  try:
    num_chunks = math.ceil((num_rounds - start) / chunk_size)
    for c in range(num_chunks):
      r0 = start + c * chunk_size
      t0 = time.perf_counter()
      active = min(chunk_size, num_rounds - r0)

      def dispatch(fn, st):
        st, out = fn(rounds_key, st, jnp.int32(r0), jnp.int32(num_rounds), train, test)
        if host_eval and ((r0 + active) % eval_every == 0 or r0 + active == num_rounds):
          out = _with_metrics(out, jitted_eval(params_fn(st), test), active - 1)
        return st, jax.device_get(out)

      before = state
      state, out = dispatch(jitted, state)
      chunk_times.append(time.perf_counter() - t0)
      dispatches += 1
      bad = first_nonfinite(out, r0, active, state_paths)
      if active > 1 and not bool(np.all(out.state_ok[:active])):
        # the state ended the chunk non-finite (checked once): run the chunk again from its
        # start, checking the state after every round, for the exact round and quantity (a
        # state can go NaN a round before any reported number shows it)
        if not exact:
          exact.append(jax.jit(build_chunk(algo, chunk_size, None if host_eval else eval_fn,
                                           eval_every, params_fn)))
        state, out = dispatch(exact[0], before)
        dispatches += 1
        bad = first_nonfinite(out, r0, active, state_paths)
      if bad is not None:
        err = NonFiniteError.diverged(desc, *bad, hint=_label_hint(train, test))
        if on_nonfinite == "raise":
          raise err
        history.add_chunk(r0, out, bad[0] - 1 - r0)
        diverged = {"round": bad[0], "quantity": bad[1]}
        if progress:
          bar.write(f"{desc or 'run'}: diverged ({bad[1]} not finite at round {bad[0]}); "
                    "stopped.")
        break
      history.add_chunk(r0, out, active)
      bar.update(active)
      bar.set_postfix(_progress_postfix(history), refresh=False)
      done = r0 + active
      if progress and c == 1 and num_chunks > 2:
        left = chunk_times[1] * (num_chunks - 2)
        if left > estimate_after_s:
          bar.write(f"{desc or 'run'}: about {_duration(left)} left ({chunk_times[1]:.2g} s "
                    f"per {chunk_size}-round chunk; the first, with compilation, took "
                    f"{chunk_times[0]:.2g} s).")
      since_checkpoint += active
      if ckpt is not None and (done == num_rounds or (
          since_checkpoint >= checkpoint_rounds
          and _interval_passed(last_checkpoint, checkpoint.interval_s))):
        since_checkpoint, last_checkpoint = 0, time.perf_counter()
        ckpt.save(done, state, {"round": done, "run_id": run_id, "fingerprint": fp,
                                "history": history.to_dict(),
                                "train_time_s": prior_time + time.perf_counter() - t_start})
      if on_chunk is not None:
        on_chunk(done, state, history)
  finally:
    bar.close()
  return RunResult(state, history, traces[0], dispatches,
                   prior_time + time.perf_counter() - t_start, diverged, strategy)


_CHUNKS: collections.OrderedDict = collections.OrderedDict()
_CHUNKS_KEPT = 8


def _compiled_chunk(algo, chunk_size, eval_fn, eval_every, params_fn, traced, args
                    ) -> tuple[Callable, list]:
  """``(jitted chunk, [number of traces])`` of :func:`build_chunk` (the state checked once a
  chunk). Runs of the same algorithm, evaluation and chunking at the same argument types
  (``args``: rounds key, state, train and test data; ``None``: do not reuse) share one jitted
  chunk — seeds, resumed runs and repeated runs compile once — among the last
  ``_CHUNKS_KEPT`` such programs."""
  try:
    key = None if args is None else (algo, chunk_size, eval_fn, eval_every, params_fn,
                                     arg_signature(args))
    hash(key)
  except TypeError:  # an algorithm or function that cannot be a dictionary key
    key = None
  if key is not None and key in _CHUNKS:
    _CHUNKS.move_to_end(key)
    return _CHUNKS[key]
  chunk_fn = build_chunk(algo, chunk_size, eval_fn, eval_every, params_fn, traced,
                         check_every_round=False)
  traces = [0]

  def counted_chunk(*a):
    traces[0] += 1
    return chunk_fn(*a)

  entry = (jax.jit(counted_chunk), traces)
  if key is not None:
    _CHUNKS[key] = entry
    while len(_CHUNKS) > _CHUNKS_KEPT:
      _CHUNKS.popitem(last=False)
  return entry


def _interval_passed(since: float, interval_s: float) -> bool:
  """Whether ``interval_s`` seconds passed since ``since`` (process 0's answer for all)."""
  if interval_s <= 0:
    return True
  passed = time.perf_counter() - since >= interval_s
  if jax.process_count() > 1:   # every process must take part in the same saves
    passed = bool(multihost_utils.broadcast_one_to_all(np.asarray(passed)))
  return passed


@jax.jit   # one program (a run's position is a traced int), not one per eager operation
def _with_metrics(out: ChunkOutput, metrics: dict, position: int) -> ChunkOutput:
  """``out`` with ``metrics`` (evaluated after the chunk) recorded at round ``position``."""
  n = out.evaluated.shape[0]
  at = jnp.arange(n) == position
  return out._replace(
      metrics={k: jnp.where(at.reshape((n,) + (1,) * jnp.ndim(v)), v, jnp.nan).astype(
          jnp.result_type(v)) for k, v in metrics.items()},
      evaluated=at)


def _duration(seconds: float) -> str:
  if seconds < 90:
    return f"{seconds:.0f} s"
  if seconds < 5400:
    return f"{seconds / 60:.0f} min"
  return f"{seconds / 3600:.1f} h"
