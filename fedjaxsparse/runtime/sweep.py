"""Many runs as one compiled program: ``vmap`` a whole run over seeds and hyper-parameters.

``run_batched`` compiles ``init`` plus all rounds (the runner's scan, one chunk of
``num_rounds``) and vmaps it over ``S`` run keys and, optionally, ``S`` hyper-parameter
settings. Repetition ``s`` computes exactly what :func:`fedjaxsparse.runtime.runner.run` computes for
``keys[s]`` (same key derivation), so five repetitions or a learning-rate grid are one XLA
program. Hyper-parameters must enter the algorithm as arrays (e.g. an optax learning rate),
not as static Python values (local step counts, K in Top-K and cohort sizes stay static).

``state_curves`` is the convergence study's form: a metric of the whole algorithm state
(a distance to a known optimum, a control variate's norm) after every round of ``S`` runs,
rounds scanned and runs vmapped, without the runner's evaluation schedule.
"""
from __future__ import annotations

import itertools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from fedjaxsparse.core import Algorithm, ParamsFn, global_params
from fedjaxsparse.data.federated import check_data
from fedjaxsparse.runtime.runner import EvalFn, History, arrange, build_chunk, split_run_key
from fedjaxsparse.errors import check_int
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["grid", "run_batched", "state_curves"]
__dir__ = _public_dir(__all__)


def grid(**axes: Any) -> dict[str, np.ndarray]:
  """The Cartesian product of the given value lists, flattened: ``{name: float32[S]}``.

  Example: ``grid(lr=[0.1, 0.3], seed=[0, 1, 2])`` has ``S = 6`` settings.
  """
  names = list(axes)
  rows = list(itertools.product(*(axes[n] for n in names)))
  return {n: np.asarray([r[i] for r in rows]) for i, n in enumerate(names)}


def run_batched(build_algo: Callable[[Any], Algorithm], keys: jax.Array, params: Any,
                train: Any, test: Any = None, *, num_rounds: int, hparams: Any = None,
                eval_fn: EvalFn | None = None, eval_every: int = 10,
                params_fn: ParamsFn = global_params, layout: str = "auto",
                clients: str = "vmap") -> tuple[Any, list[History]]:
  """Run ``S`` complete runs as one ``jit(vmap(...))`` program.

  Args:
    build_algo: ``hparams_s -> Algorithm`` (called inside the vmapped program with one
      setting's traced hyper-parameters; receives ``None`` when ``hparams`` is ``None``).
    keys: ``[S]`` run keys (e.g. ``jax.random.split(key, S)``).
    params: the initial global model, shared by all runs.
    train, test: data shared by all runs.
    num_rounds: rounds per run.
    hparams: a pytree whose leaves have leading axis ``S``, or ``None``.
    eval_fn, eval_every, params_fn, layout, clients: as in :func:`fedjaxsparse.runtime.runner.run`.

  Returns:
    ``(states, histories)``: final states with leading axis ``S``, and one :class:`History`
    per run.
  """
  num_rounds = check_int("num_rounds", num_rounds, 1)
  check_data(train)
  num_runs = keys.shape[0]
  if hparams is not None:
    for leaf in jax.tree.leaves(hparams):
      if np.shape(leaf)[:1] != (num_runs,):
        raise ValueError(f"every hparams leaf needs leading axis S={num_runs} (one setting per "
                         f"key), got shape {np.shape(leaf)}.")

  first = None if hparams is None else jax.tree.map(lambda a: a[0], hparams)
  train = arrange(build_algo(first), train, layout, clients=clients, params=params)

  def one_run(key, hp, params, train, test):  # data as arguments: never folded as constants
    algo = build_algo(hp)
    init_key, rounds_key = split_run_key(key)
    state = algo.init(init_key, params, train)
    initial = eval_fn(params_fn(state), test) if eval_fn is not None else {}
    chunk = build_chunk(algo, num_rounds, eval_fn, eval_every, params_fn)
    state, out = chunk(rounds_key, state, jnp.int32(0), jnp.int32(num_rounds), train, test)
    return state, initial, out

  hp_axes = None if hparams is None else 0
  batched = jax.vmap(one_run, in_axes=(0, hp_axes, None, None, None))
  states, initial, out = jax.jit(batched)(keys, hparams, params, train, test)
  initial, out = jax.device_get((initial, out))
  histories = []
  for s in range(num_runs):
    history = History()
    if eval_fn is not None:
      history.add_eval(0, {k: v[s] for k, v in initial.items()})
    history.add_chunk(0, jax.tree.map(lambda a: a[s], out), num_rounds)
    histories.append(history)
  return states, histories


def state_curves(algo: Algorithm, keys: jax.Array, params: Any, train: Any, num_rounds: int,
                 metric: Callable[[Any], jax.Array]) -> np.ndarray:
  """``metric(state)`` at initialisation and after every round of ``S`` runs, float64
  ``[S, num_rounds + 1]``, as one compiled program (runs vmapped over ``keys [S]``, rounds
  scanned).

  Run ``s`` starts from ``algo.init(fold_in(keys[s], num_rounds), params, train)`` and takes
  round ``t`` (``t = 0 … num_rounds − 1``) with key ``fold_in(keys[s], t)``; ``metric`` maps
  a state to a scalar (``‖x_t − x⋆‖²`` for a known optimum ``x⋆``, say). The curves of a
  convergence study — the error against rounds, its mean over seeds, the round from which it
  stays below a target — are rows of the result."""
  check_int("num_rounds", num_rounds, 1)
  check_data(train)

  def one(key):
    def body(state, t):
      state, _ = algo.step(jax.random.fold_in(key, t), state, train)
      return state, metric(state)
    state = algo.init(jax.random.fold_in(key, num_rounds), params, train)
    curve = jax.lax.scan(body, state, jnp.arange(num_rounds))[1]
    return jnp.concatenate([jnp.asarray(metric(state))[None], curve])

  return np.asarray(jax.jit(jax.vmap(one))(keys), np.float64)
