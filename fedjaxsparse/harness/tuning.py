"""Tuning every method alike on a validation split, then its final runs with seeds: a grid of
candidates (one vmapped program, or one run each), the best by the experiment's metric, and
the chosen method re-run on the full training data for ``seeds`` seeds (:func:`tune_then_run`,
its result a :class:`Tuned`).

For searches over several hyper-parameters, a :class:`Search` (a space of
:class:`~fedjaxsparse.harness.protocol.Dimension` s) replaces the grid: :func:`tune_then_run`
runs :func:`fedjaxsparse.harness.protocol.two_stage_search`'s random search, whose every stage
:func:`candidate_scores` scores — every candidate repeated over seeds — as one vmapped program
per combination of the static hyper-parameters (a local-step count, a batch size);
:func:`seed_histories` runs a chosen setting's seeds as one vmapped program."""
from __future__ import annotations

import dataclasses
import math
import sys
import time
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjaxsparse.core import Algorithm, ParamsFn, float_dtype, global_params
from fedjaxsparse.errors import ConfigError, NonFiniteError
from fedjaxsparse.runtime.population import CohortAlgorithm
from fedjaxsparse.harness.protocol import Dimension, SearchResult, mean_se, two_stage_search
from fedjaxsparse.runtime.runner import EvalFn, state_finite
from fedjaxsparse.harness.options import Config
from fedjaxsparse.harness.running import Steps, first_divergence, format_duration, last, run_method
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["tuning_config", "per_round_config", "Run", "Search", "Tuned", "tune_then_run",
           "candidate_scores", "seed_histories"]
__dir__ = _public_dir(__all__)

def tuning_config(cfg: Config, fraction: float = 0.5, evaluate_once: bool = True) -> Config:
  """The configuration of tuning runs: ``max(1, fraction·rounds)`` rounds (the budget of a
  validation run), no progress bar, a diverging candidate recorded and skipped instead of
  stopping the experiment, and (``evaluate_once``) one evaluation at the end."""
  rounds = max(1, int(cfg.rounds * fraction))
  return dataclasses.replace(cfg, progress=False, on_divergence="skip", rounds=rounds,
                             eval_every=rounds if evaluate_once else cfg.eval_every)


class Run(NamedTuple):
  """What :func:`tune_then_run` asks ``build`` for: a tuning run (``tuning``, on the fitting
  split) or a final one, its ``seed`` index (0 for tuning runs) and its length ``rounds``."""
  seed: int
  rounds: int
  tuning: bool


class Search(NamedTuple):
  """A search space to tune a method over instead of a grid: the two-stage random search of
  Meinhardt et al. (2024) (:func:`fedjaxsparse.harness.protocol.two_stage_search`), every
  stage's candidates scored on the validation split by :func:`candidate_scores` — one
  vmapped program per combination of the ``static`` hyper-parameters, each candidate the
  mean of ``repetitions`` runs.

  Attributes:
    space: ``{name: Dimension}``, the first stage's box.
    static: the names that shape the program (a local-step count, a batch size): passed to
      ``build`` as Python numbers; the others enter it as traced scalars while searching.
    samples: candidates per stage (``(16, 16)``: two stages of 16).
    repetitions: seeds per candidate.
  """
  space: dict[str, Dimension]
  static: tuple[str, ...] = ()
  samples: tuple[int, ...] = (16, 16)
  repetitions: int = 1

  def value(self, name: str, v: float) -> int | float:
    """The value of ``name`` as the final runs receive it — the one the search scored: an
    ``int`` for an integer dimension, a choice among integers, or a whole static value (as
    :func:`candidate_scores` passes static values); else a ``float``."""
    dim = self.space[name]
    integral = dim.integer or (dim.choices and all(float(c).is_integer() for c in dim.choices))
    return _python_scalar(v) if integral or name in self.static else float(v)


def _searched(search: Search, build: Callable, tune_cfg: Config, params: Any, fit: Any,
              val: Any, eval_fn: EvalFn | None, params_fn: ParamsFn, metric: str,
              name: str, shown: bool, per_round: Callable | None = None) -> SearchResult:
  """:func:`tune_then_run`'s search: every stage scored by :func:`candidate_scores` on the
  validation split, over ``tune_cfg.rounds`` rounds, keyed and drawn from ``tune_cfg.seed``."""
  if eval_fn is None:
    raise ConfigError(f"{name}: a searched method needs an evaluation to score candidates.")
  unknown = [k for k in search.static if k not in search.space]
  if unknown:
    raise ConfigError(f"{name}: static names {unknown} are not in the search space "
                      f"{sorted(search.space)}.")
  stage = [0]

  def score(candidates: dict) -> np.ndarray:
    stage[0] += 1
    t0 = time.perf_counter()
    rounds = lambda fixed: per_round_config(tune_cfg, per_round, fixed).rounds  # noqa: E731
    out = candidate_scores(lambda h, s: build({**h, **s}, Run(0, rounds(s), True)),
                           candidates, static=search.static, repetitions=search.repetitions,
                           seed=tune_cfg.seed, params=params, train=fit, test=val,
                           num_rounds=rounds, eval_fn=eval_fn, metric=metric,
                           params_fn=params_fn)
    if shown:
      print(f"[{name} search] stage {stage[0]}: {len(out)} candidates, best {metric} "
            f"{np.max(out):.4g}; {format_duration(time.perf_counter() - t0)}",
            file=sys.stderr, flush=True)
    return out

  return two_stage_search(score, search.space, search.samples, seed=tune_cfg.seed)


@dataclasses.dataclass
class Tuned:
  """One method tuned on validation data, then run with several seeds (:func:`tune_then_run`).

  Attributes:
    best: the chosen candidate (the grid's only value when there is nothing to tune).
    scores: ``{candidate: final validation metric}`` (−1 for a diverged, non-finite or
      unevaluated run), or ``{candidate: score(record)}`` (``None``: diverged); empty when
      there was nothing to tune. A searched method's: ``{label(candidate): mean validation
      metric}`` over every stage (``-inf`` for a candidate that diverged in any repetition;
      its stages, in order, are in ``search``).
    records: one :func:`run_method` record per seed (the first is the one plotted).
    finals: ``scale ×`` the final test metric of every seed that did not diverge.
    stats: :func:`fedjaxsparse.harness.protocol.mean_se` of ``finals`` (mean and se ``None``
      when every seed diverged).
    search: a searched method's :class:`~fedjaxsparse.harness.protocol.SearchResult` (every
      stage's candidates and scores; ``best`` is its best candidate, ``{name: value}``), else
      ``None``.
  """
  best: Any
  scores: dict
  records: list
  finals: list
  stats: dict
  search: SearchResult | None = None


def _built(built: Any, eval_fn: EvalFn | None) -> tuple[Algorithm, EvalFn | None]:
  if hasattr(built, "init") and hasattr(built, "step"):   # an algorithm (itself a NamedTuple)
    return built, eval_fn
  return built


def tune_then_run(cfg: Config, experiment: str, name: str, grid: Sequence,
                  build: Callable[[Any, Run], Any], params: Any, fit: Any, val: Any,
                  train: Any, test: Any, eval_fn: EvalFn | None, *, tune_cfg: Config,
                  seeds: int, label: Callable[[Any], str] = str,
                  data: Callable[[Any, Any], Any] | None = None,
                  params_fn: ParamsFn = global_params, metric: str = "accuracy",
                  scale: float = 100.0, score: Callable[[dict], Any] | None = None,
                  residence: str = "auto", batched: bool = False,
                  search: Search | None = None,
                  per_round: Callable[[Any], int] | None = None,
                  chunk_size: int | None = None, vmap_seeds: bool = False) -> Tuned:
  """The protocol every method of a tuned experiment follows: each candidate of ``grid`` runs
  ``tune_cfg.rounds`` rounds on the fitting split ``fit`` and is scored by its final ``metric``
  on ``val`` (never on test); the best (the first of equals) then runs ``seeds`` times on
  ``train``/``test`` with keys ``cfg.seed + 100·s``. A grid of one value is not tuned.

  ``build(candidate, run) -> Algorithm`` (``run``: a :class:`Run` — seed index, length, whether
  it is a tuning run — for schedules or noise calibrations that depend on them), or
  ``-> (Algorithm, eval_fn)`` when the evaluation
  depends on what was built (per-client models of a drawn configuration, say) — then it
  replaces ``eval_fn``; ``data(candidate, split)``
  turns a split into the one that candidate trains on (e.g. targets packed in); run names are
  ``"{name} tune {label(candidate)}"`` and ``"{name} seed {s}"`` (their checkpoint folders).
  ``score(record)`` replaces the final validation ``metric`` as what is maximised (any values
  that compare, e.g. ``(reached, −cost, accuracy)``); a diverged candidate is never chosen
  (the first candidate when every one diverged). ``residence``: where a
  :class:`~fedjaxsparse.runtime.population.CohortAlgorithm`'s population lives
  (:func:`run_method`).

  ``batched`` (``build`` takes a traced candidate, :class:`Method`): with ``cfg.tuning ==
  "batched"`` the candidates' tuning runs are one vmapped program (the same key, rounds and
  evaluation as the sequential runs, so the same scores up to float reassociation; no
  checkpoints; several processes tune sequentially, on the client mesh); ``data`` must then
  be ``None``, the candidates numbers and ``build`` return an Algorithm (not a population's
  ``CohortAlgorithm``).

  ``search`` (a :class:`Search`) replaces ``grid``: the candidates are ``{name: value}``
  dicts drawn by the two-stage random search, every stage one vmapped program per static
  combination (``build`` receives the non-static values traced and must return an Algorithm;
  ``data`` and ``score`` must be ``None``; one process; ``batched`` is not used: a search is
  always vmapped; ``residence`` applies to the final runs); ``scores`` maps ``label(candidate)`` to its validation score and
  ``Tuned.search`` keeps the stages.

  ``per_round(candidate) -> int``: the budget units one round of a candidate spends when
  ``cfg.rounds`` counts something finer than rounds (local steps, with a method of ``L``
  local steps a round): its runs take ``max(1, rounds // per_round)`` rounds and evaluate
  every ``max(1, eval_every // per_round)`` (:func:`per_round_config`); in a search it sees
  the static values only (the program's shape), and a grid with it tunes one run at a time.
  ``chunk_size``: budget units per compiled chunk of the final runs (``run_method``'s, in
  rounds ``max(1, chunk_size // per_round)``, at most the run's; ``None``: the evaluation
  interval) — a run evaluated every round dispatches far fewer programs with long chunks.

  ``vmap_seeds``: with more than one seed, the final runs are one vmapped program
  (:func:`fedjaxsparse.runtime.sweep.run_batched`, keys as the sequential runs', the same
  numbers up to float reassociation) — no checkpoints (a resumed experiment runs them again),
  a line at its start and end instead of a bar, ``chunk_size`` not used, one compilation
  instead of one per seed; a diverged seed stops the experiment unless
  ``cfg.on_divergence == "skip"``, as a sequential run would; ``build`` is then called once,
  with seed index 0, and must return an Algorithm (one process)."""
  grid = list(grid)
  prep = data or (lambda candidate, split: split)
  scores = {}
  found = None
  if search is not None:
    if data is not None:
      raise ConfigError(f"{name}: a searched method cannot change the data per candidate "
                        "(data=...).")
    if score is not None:
      raise ConfigError(f"{name}: a searched method is scored by its final validation metric "
                        "(candidate_scores); a score=... function needs a grid.")
    if jax.process_count() > 1:
      raise ConfigError(f"{name}: a searched method tunes in one process (its stages are "
                        "vmapped programs); run the search without --processes.")
    shown = cfg.progress and jax.process_index() == 0
    if shown:
      print(f"{name}: searching {' + '.join(map(str, search.samples))} candidates "
            f"(x{search.repetitions} seeds), {_budget(tune_cfg, per_round)} each on the "
            "validation split", file=sys.stderr, flush=True)
    found = _searched(search, build, tune_cfg, params, fit, val, eval_fn, params_fn, metric,
                      name, shown, per_round)
    for st in found.stages:
      for i, sc in enumerate(st["scores"]):
        scores[label({k: search.value(k, v[i]) for k, v in st["candidates"].items()})] = sc
    grid = [{k: search.value(k, v) for k, v in found.best.items()}]
  elif (len(grid) > 1 and batched and cfg.tuning == "batched" and jax.process_count() == 1
        and per_round is None):
    if data is not None:
      raise ConfigError(f"{name}: a batched grid cannot change the data per candidate "
                        "(data=...); declare the method with batched=False.")
    shown = cfg.progress and jax.process_index() == 0
    if shown:
      print(f"{name}: tuning {len(grid)} candidates as one program, {tune_cfg.rounds} "
            "round(s) each on the validation split", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    records = _tune_batched(tune_cfg, grid, build, params, fit, val, eval_fn, params_fn, name)
    for c, rec in zip(grid, records):
      scores[c] = _candidate_score(rec, score, metric)
    if shown:
      print(f"[{name} tuning] " + ", ".join(f"{label(c)} {scores[c]}" for c in grid)
            + f"; {format_duration(time.perf_counter() - t0)}", file=sys.stderr, flush=True)
  elif len(grid) > 1:
    shown = cfg.progress and jax.process_index() == 0
    if shown:   # tuning runs have no bars of their own: a line per candidate instead
      print(f"{name}: tuning {len(grid)} candidates, {_budget(tune_cfg, per_round)} each on "
            "the validation split", file=sys.stderr, flush=True)
    steps = Steps(len(grid), f"{name} tuning", enabled=shown)
    for c in grid:
      c_cfg = per_round_config(tune_cfg, per_round, c)
      algo, ev = _built(build(c, Run(0, c_cfg.rounds, True)), eval_fn)
      rec = run_method(c_cfg, experiment, f"{name} tune {label(c)}", algo, params,
                       prep(c, fit), val, ev, params_fn=params_fn, residence=residence)
      scores[c] = _candidate_score(rec, score, metric)
      if score is not None:
        steps.done(f"{label(c)} ({'diverged' if rec['diverged'] else scores[c]})")
      else:
        value = _usable_metric(rec, metric)
        steps.done(f"{label(c)} ({metric} {'diverged' if value is None else f'{value:.4g}'})")
  ok = [c for c in scores if scores[c] is not None]
  best = grid[0] if found is not None else max(ok, key=scores.get) if ok else grid[0]
  records, finals = [], []
  run_cfg = per_round_config(cfg, per_round, best)
  units = 1 if per_round is None else int(per_round(best))   # checked >= 1 just above
  chunk = None if chunk_size is None else max(1, min(run_cfg.rounds, int(chunk_size) // units))
  if vmap_seeds and seeds > 1:
    if jax.process_count() > 1:
      raise ConfigError(f"{name}: vmapped seeds run in one process; run without --processes.")
    keys = jax.vmap(jax.random.key)(
        np.asarray([cfg.seed + 100 * s for s in range(seeds)], np.uint32))
    shown = cfg.progress and jax.process_index() == 0
    if shown:
      print(f"{name}: {seeds} seeds x {run_cfg.rounds} rounds as one program",
            file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    records = _batched_records(run_cfg, lambda _: build(best, Run(0, run_cfg.rounds, False)),
                               keys, None, params, prep(best, train), test, eval_fn, params_fn,
                               name)
    if shown:
      print(f"[{name}] {seeds} seeds done; {format_duration(time.perf_counter() - t0)}",
            file=sys.stderr, flush=True)
    bad = next((s for s, r in enumerate(records) if r["diverged"]), None)
    if bad is not None and cfg.on_divergence != "skip":   # as run_method: stop the experiment
      d = records[bad]["diverged"]
      raise NonFiniteError.diverged(f"{name} seed {bad}", d["round"], d["quantity"])
  else:
    for s in range(seeds):
      algo, ev = _built(build(best, Run(s, run_cfg.rounds, False)), eval_fn)
      records.append(run_method(run_cfg, experiment, f"{name} seed {s}", algo, params,
                                prep(best, train), test, ev, params_fn=params_fn,
                                key=jax.random.key(cfg.seed + 100 * s), residence=residence,
                                chunk_size=chunk))
  for rec in records:
    if not rec["diverged"]:
      finals.append(scale * last(rec["history"]["evals"][metric]))
  stats = mean_se(finals) if finals else {"mean": None, "se": None}
  return Tuned(best, scores, records, finals, stats, found)


def _budget(cfg: Config, per_round: Callable[[Any], int] | None) -> str:
  """A tuning run's length as the progress lines say it: rounds, or budget units when a
  round spends several (``per_round``)."""
  return (f"{cfg.rounds} round(s)" if per_round is None
          else f"{cfg.rounds} budget units (rounds of several units)")


def per_round_config(cfg: Config, per_round: Callable[[Any], int] | None,
                     candidate: Any) -> Config:
  """``cfg`` for a candidate whose round spends ``per_round(candidate)`` budget units:
  ``max(1, rounds // units)`` rounds, an evaluation every ``max(1, eval_every // units)``
  (``cfg`` itself without ``per_round``)."""
  if per_round is None:
    return cfg
  units = int(per_round(candidate))
  if units < 1:
    raise ConfigError(f"per_round must give an int >= 1 budget units a round, got {units}.")
  return dataclasses.replace(
      cfg, rounds=max(1, cfg.rounds // units),
      eval_every=None if cfg.eval_every is None else max(1, cfg.eval_every // units))


def _usable_metric(rec: dict, metric: str) -> float | None:
  """A tuning run's final validation ``metric``, or ``None`` when it diverged, was never
  evaluated or is not finite."""
  value = last(rec["history"]["evals"].get(metric, []))
  return None if rec["diverged"] or value is None or not math.isfinite(value) else value


def _candidate_score(rec: dict, score: Callable[[dict], Any] | None, metric: str) -> Any:
  """A tuning run's score: ``score(rec)`` (``None`` when it diverged) or its final validation
  ``metric`` (−1 when :func:`_usable_metric` has none)."""
  if score is not None:
    return None if rec["diverged"] else score(rec)
  value = _usable_metric(rec, metric)
  return -1.0 if value is None else value


def _tune_batched(tune_cfg: Config, grid: list, build: Callable, params: Any, fit: Any,
                  val: Any, eval_fn: EvalFn | None, params_fn: ParamsFn, name: str) -> list:
  """The tuning runs of ``grid`` as one ``run_batched`` program: one record per candidate
  (``history``, ``diverged``, ``final``, ``wall_time_s`` — the whole program's time)."""
  try:
    hp = np.asarray(grid, dtype=float_dtype())   # the sequential runs' precision (x64 too)
  except (TypeError, ValueError):
    raise ConfigError(f"{name}: a batched grid's candidates must be numbers, got "
                      f"{grid!r}.") from None
  key = jax.random.key(tune_cfg.seed)    # every candidate's run key, as run_method's
  keys = jax.random.wrap_key_data(np.broadcast_to(
      np.asarray(jax.random.key_data(key)), (len(grid),) + jax.random.key_data(key).shape))
  return _batched_records(tune_cfg, lambda c: build(c, Run(0, tune_cfg.rounds, True)), keys,
                          hp, params, fit, val, eval_fn, params_fn, name)


def _batched_records(cfg: Config, build_algo: Callable, keys: jax.Array, hp: Any, params: Any,
                     train: Any, test: Any, eval_fn: EvalFn | None, params_fn: ParamsFn,
                     name: str) -> list:
  """``len(keys)`` runs of ``cfg.rounds`` rounds as one ``run_batched`` program (``hp``: their
  traced hyper-parameters, or ``None``): one record per run as :func:`run_method`'s
  (``history``, ``diverged``, ``final``, ``wall_time_s`` — the whole program's time,
  ``clients``, ``state``)."""
  from fedjaxsparse.runtime import sweep   # noqa: PLC0415  (only batched runs need it)

  def checked(c):
    algo = build_algo(c)
    if not (hasattr(algo, "init") and hasattr(algo, "step")) or isinstance(
        algo, CohortAlgorithm):
      raise ConfigError(f"{name}: a batched method's build must return an Algorithm (not an "
                        "(algorithm, eval_fn) pair or a CohortAlgorithm); declare it with "
                        "batched=False.")
    return algo

  t = time.perf_counter()
  states, histories = sweep.run_batched(
      checked, keys, params, train, test, num_rounds=cfg.rounds, hparams=hp,
      eval_fn=eval_fn, eval_every=cfg.eval_every or cfg.rounds, params_fn=params_fn,
      clients=cfg.execution)
  wall = time.perf_counter() - t
  finite = np.asarray(jax.vmap(lambda st: jnp.all(state_finite(st)))(states))
  records = []
  for s, h in enumerate(histories):
    diverged = first_divergence(h.to_dict())
    if diverged is None and not finite[s]:   # a state NaN no reported number showed
      diverged = {"round": cfg.rounds, "quantity": "state (at the end of the run)"}
    records.append({"history": h.to_dict(), "diverged": diverged,
                    "final": {k: last(v) for k, v in h.evals.items()}, "wall_time_s": wall,
                    "clients": cfg.execution,
                    "state": jax.tree.map(lambda a, s=s: a[s], states)})
  return records


def _python_scalar(v: Any) -> int | float:
  v = float(v)
  return int(v) if v.is_integer() else v


def candidate_scores(build: Callable[[dict, dict], Algorithm], candidates: dict, *,
                     static: Sequence[str] = (), repetitions: int = 1, seed: int = 0,
                     params: Any, train: Any, test: Any,
                     num_rounds: int | Callable[[dict], int], eval_fn: EvalFn, metric: str,
                     params_fn: ParamsFn = global_params) -> np.ndarray:
  """The mean final ``metric`` over ``repetitions`` runs of every candidate, ``[n]``.

  ``candidates`` maps each hyper-parameter to ``[n]`` values. The ``static`` ones shape the
  program (a local-step count, a batch size): the candidates that share their values run as one
  :func:`~fedjaxsparse.runtime.sweep.run_batched` program of ``len × repetitions`` runs
  (run ``r`` of a candidate keyed ``r + 1000·seed``), ``build(traced, static)`` receiving the
  other hyper-parameters as traced scalars and the static ones as Python numbers;
  ``num_rounds`` may depend on the static values (a budget counted in local steps). A
  candidate with a non-finite final metric in any repetition scores ``−inf``, so a diverging
  candidate never wins. The metric is evaluated once, after the last round, on ``test`` (a
  validation split while tuning)."""
  from fedjaxsparse.runtime.sweep import run_batched   # noqa: PLC0415
  n = len(next(iter(candidates.values())))
  traced = [k for k in candidates if k not in static]
  out = np.full(n, -np.inf)
  if static:
    values = np.stack([np.asarray(candidates[k], float) for k in static], 1)
    groups = [(dict(zip(static, map(_python_scalar, row))),
               np.flatnonzero((values == row).all(1))) for row in np.unique(values, axis=0)]
  else:
    groups = [({}, np.arange(n))]
  for fixed, idx in groups:
    hp = {k: np.repeat(np.asarray(candidates[k])[idx], repetitions) for k in traced}
    keys = jax.vmap(jax.random.key)(
        (np.tile(np.arange(repetitions), len(idx)) + 1000 * seed).astype(np.uint32))
    rounds = num_rounds(fixed) if callable(num_rounds) else num_rounds
    _, hist = run_batched(lambda h, fixed=fixed: build(h, fixed), keys, params, train, test,
                          num_rounds=rounds, hparams=hp, eval_fn=eval_fn, eval_every=rounds,
                          params_fn=params_fn)
    final = np.array([h.evals[metric][-1] for h in hist]).reshape(len(idx), repetitions)
    out[idx] = np.where(np.isfinite(final), final, -np.inf).mean(1)
  return out


def seed_histories(build: Callable[[Any], Algorithm], seeds: int, seed: int = 0, *,
                   params: Any, train: Any, test: Any, num_rounds: int, eval_fn: EvalFn,
                   eval_every: int | None = None, params_fn: ParamsFn = global_params,
                   hparams: Any = None) -> list:
  """``seeds`` runs of one chosen setting as one vmapped program (run ``s`` keyed
  ``s + 7919·seed``): their :class:`~fedjaxsparse.runtime.runner.History` s, from which an
  experiment reports the mean ± s.e. of a final metric (:func:`~fedjaxsparse.harness.protocol.
  mean_se`), the seeds' mean curve, or the bits at which that curve reaches a target.
  ``build(hparams)`` as for :func:`~fedjaxsparse.runtime.sweep.run_batched` (``hparams``:
  ``[seeds]`` leaves, or ``None``)."""
  from fedjaxsparse.runtime.sweep import run_batched   # noqa: PLC0415
  keys = jax.vmap(jax.random.key)(np.arange(seeds, dtype=np.uint32) + 7919 * seed)
  _, hist = run_batched(build, keys, params, train, test, num_rounds=num_rounds,
                        hparams=hparams, eval_fn=eval_fn, eval_every=eval_every or num_rounds,
                        params_fn=params_fn)
  return hist
