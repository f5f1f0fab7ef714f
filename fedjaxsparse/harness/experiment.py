"""Experiment plumbing shared by the scripts in ``experiments/``: the common configuration,
declared and validated experiment options, running several methods on one dataset with
progress, checkpoints and divergence handling, and writing results (JSON plus PNG plots) to a
locked output folder.

An experiment module defines ``NAME``, ``DESCRIPTION``, ``BUDGET`` (what ``--rounds``
counts), ``RUNTIME`` (measured time of the default configuration on a 2-core CPU), ``QUICK``
(the quick setting, ``--quick``: :class:`Config` fields plus ``"options"``, showing the
table's shape in under two minutes) and ``QUICK_RUNTIME`` (its measured time),
``DEFAULTS`` (a dict of :class:`Config` overrides), ``OPTIONS`` (a tuple of :class:`Option`)
and ``run``: either a declaration, ``run = experiment.declared(NAME, OPTIONS, setup=...,
methods=..., report=...)`` — the experiment says what its data, model and methods are and the
harness runs them, tabulates, saves and plots (:func:`declared`): federated runs (algorithms,
or :class:`Method` s tuned on validation data and run with seeds), convergence studies of a
metric of the state (a :class:`Context` with a ``curve``) or :class:`Trial` s (epochs on pooled
data, one-shot pruning, solvers) — or, for an experiment that runs no method (arithmetic on
the papers' shapes), ``run = experiment.entry(NAME, OPTIONS, body)``, where ``body(cfg, opts) -> dict`` gets
the parsed options, runs its methods with the harness's helpers
(:func:`fedjaxsparse.harness.running.run_method`,
:func:`fedjaxsparse.harness.tuning.tune_then_run`) and returns its results, declaring its tables and figures
(:class:`~fedjaxsparse.harness.report.Table`, :class:`~fedjaxsparse.harness.report.Figure`);
the harness prints, saves and draws them (:func:`fedjaxsparse.harness.running.finish`).
The configuration and options are :mod:`fedjaxsparse.harness.options`'s.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any, Callable, NamedTuple, Sequence

import jax
import numpy as np

from fedjaxsparse.core import ParamsFn, global_params
from fedjaxsparse.data.registry import data_status
from fedjaxsparse.errors import ConfigError
from fedjaxsparse.runtime.locking import FolderLock
from fedjaxsparse.harness.protocol import PaperConfig, validation_split
from fedjaxsparse.harness.report import Figure, Table
from fedjaxsparse.runtime.runner import EvalFn
from fedjaxsparse.harness.options import Config, Option, identity_options, parse_options
from fedjaxsparse.harness.running import Steps, bits_to_reach, finish, standin_note, last, output_dir, run_curves, run_identity, run_method, status
from fedjaxsparse.harness.tuning import Search, tune_then_run, tuning_config
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["entry", "Context", "Method", "Trial", "TrialRun", "Tuning", "declared"]
__dir__ = _public_dir(__all__)

def entry(name: str, spec: Sequence[Option], body: Callable[[Config, dict], dict],
          papers: dict[str, PaperConfig] | None = None) -> Callable[[Config], dict]:
  """An experiment's ``run(cfg)``: validates ``cfg`` and its options, locks the output folder
  for the whole experiment, then calls ``body(cfg, opts)``. ``papers`` are the experiment's
  paper configurations; ``cfg.paper`` must name one of them, and its run's results carry
  ``"paper_configuration"``: the configuration's name, source, deviations and the words the
  reproduction ledger prints (``data``: the data that actually ran; ``scale``, ``reduced``)."""
  @functools.wraps(body)
  def run_experiment(cfg: Config) -> dict:
    if cfg.paper is not None and cfg.paper not in (papers or {}):
      raise ConfigError(f"{name} has no paper configuration {cfg.paper!r}; choose from "
                        f"{', '.join(papers or {}) or 'none'}.")
    cfg.validate()
    opts = parse_options(spec, cfg.options, name)
    cfg = dataclasses.replace(cfg, options=opts, fingerprint=identity_options(spec, opts))
    lock = (FolderLock(output_dir(cfg, name), purpose=f"experiment {name}")
            if jax.process_index() == 0 else contextlib.nullcontext())  # one per experiment
    paper = (papers or {}).get(cfg.paper) if cfg.paper is not None else None
    if paper is not None and paper.reduced:
      print(f"[--paper {paper.name}: reduced — {paper.reduced}]")
    with lock:
      results = body(cfg, opts)
      if paper is not None and "paper_configuration" not in results:
        results = {**results, "paper_configuration": {
            "name": paper.name, "source": paper.source, "scale": paper.scale_status,
            "reduced": paper.reduced, "deviations": paper.deviations,
            "status": paper.status, "missing": paper.missing,
            "data": ("stand-in" if results.get("standin") or standin_note(cfg.dataset or "")
                     else data_status(cfg.dataset) if cfg.dataset else paper.data_status)}}
      return finish(cfg, name, results)
  return run_experiment


class Context(NamedTuple):
  """What a declared experiment's ``setup(cfg, opts)`` returns (one, or one per setting) and
  its ``methods`` and ``report`` receive.

  Attributes:
    data: the :class:`fedjaxsparse.data.FederatedDataset` every method trains and is evaluated
      on (``train``, ``test``, ``num_clients``, ``name``).
    params: the initial model parameters every method starts from.
    eval_fn: ``(params, test) -> {metric: value}`` (``None``: no evaluation).
    extra: whatever ``methods`` and ``report`` also need (the loss, the model, ...).
    setting: the name of this setting of a tuned experiment that runs its methods in several
      (the paper's data splits, say): the table's first column and part of every run's name;
      ``None`` for one setting.
    fit, val: the fitting and validation splits of ``data.train`` that tuning runs train and
      are scored on (tuned experiments; ``None``: the harness splits off the ``validation``
      option's fraction of every client's examples).
    rounds, eval_every: this setting's budget and evaluation interval when they depend on
      the data that loaded (a CPU stand-in's shorter run, say; ``None``: the configuration's):
      its runs, its tuning and its ``methods`` see them; ``report``, ``figure`` and
      ``table`` receive the experiment's configuration.
    curve: ``state -> scalar``, the per-round metric of a convergence study's setting
      (``‖x_t − x⋆‖²`` for a known optimum): every method of the setting runs as
      :func:`~fedjaxsparse.harness.running.run_curves` — the metric at initialisation and
      after every round, for the ``seeds`` option's number of seeds (1 without one), as one
      program — instead of :func:`run_method` (``None``: a run with ``eval_fn``).
    metric: the metric this setting's tuning scores and its table reports when the data that
      loaded decides it (a regression set's ``"r2"``; ``None``: the declaration's ``metric``;
      an untuned study's one table uses the first setting's that sets one).
  """
  data: Any
  params: Any
  eval_fn: EvalFn | None
  extra: dict = {}
  setting: str | None = None
  fit: Any = None
  val: Any = None
  rounds: int | None = None
  eval_every: int | None = None
  curve: Callable[[Any], Any] | None = None
  metric: str | None = None

  def config(self, cfg: Config) -> Config:
    """``cfg`` with this setting's ``rounds`` and ``eval_every`` where it sets them."""
    return dataclasses.replace(cfg, rounds=self.rounds or cfg.rounds,
                               eval_every=self.eval_every or cfg.eval_every)


class Method(NamedTuple):
  """A method of a tuned declared experiment: tuned on validation data over ``grid``, then run
  with several seeds (:func:`tune_then_run`, whose arguments these are).

  Attributes:
    build: ``(candidate, run) -> Algorithm`` or ``-> (Algorithm, eval_fn)`` (:class:`Run`).
    grid: the candidates (one: nothing to tune).
    label: a candidate's name in run names (``lambda lr: f"lr={lr:g}"``).
    params_fn: ``state -> what eval_fn evaluates`` (personalised methods: the state).
    data: ``(candidate, split) -> split`` a candidate trains on, or ``None``.
    residence: where a :class:`~fedjaxsparse.runtime.population.CohortAlgorithm`'s population
      state lives (:func:`run_method`).
    params: the method's initial model when it trains a network of its own (``None``: the
      context's ``params``).
    batched: ``build`` takes a traced candidate (a number entering the algorithm as an array,
      e.g. a learning rate) and returns an :class:`~fedjaxsparse.core.Algorithm`: tuning runs
      the whole grid as one vmapped program (:func:`fedjaxsparse.runtime.sweep.run_batched`)
      when the configuration's ``tuning`` is ``"batched"`` (:func:`tune_then_run`).
    search: a :class:`~fedjaxsparse.harness.tuning.Search` over several hyper-parameters
      instead of ``grid`` (``None``: the grid): ``build`` then receives a ``{name: value}``
      candidate, its non-static values traced while searching; the table shows the chosen
      value of every searched name.
    per_round: ``candidate -> int``, the budget units (what ``--rounds`` counts) one round
      of the candidate spends — FedHT's ``L`` local steps when the budget counts local steps —
      so that every method spends the same budget (``None``: one unit a round;
      :func:`~fedjaxsparse.harness.tuning.tune_then_run`).
    chunk_size: budget units per compiled chunk of the final runs (``None``: the evaluation
      interval): a run evaluated every round takes far fewer dispatches in long chunks.
    vmap_seeds: the final runs' seeds as one vmapped program (no checkpoints, ``chunk_size``
      unused; ``build`` called once and returning an Algorithm) instead of one run each.
  """
  build: Callable[[Any, "Run"], Any]
  grid: Sequence = (None,)
  label: Callable[[Any], str] = str
  params_fn: ParamsFn = global_params
  data: Callable[[Any, Any], Any] | None = None
  residence: str = "auto"
  params: Any = None
  batched: bool = False
  search: Search | None = None
  per_round: Callable[[Any], int] | None = None
  chunk_size: int | None = None
  vmap_seeds: bool = False


class TrialRun(NamedTuple):
  """What a :class:`Trial` runs with: one seed of one method.

  Attributes:
    seed: the run's seed, ``cfg.seed + index``.
    index: which of the ``seeds`` option's runs this is (0, 1, ...).
    checkpoints: the run's own checkpoint folder,
      ``OUT/<experiment>/checkpoints/<method> seed <seed>`` (for
      :class:`~fedjaxsparse.runtime.checkpoint.Checkpointing`; created by whoever writes
      there).
    fingerprint: the settings a resumed run must share with the checkpoints it resumes
      (:func:`~fedjaxsparse.harness.running.run_identity`'s, for this seed).
    earlier: ``{method: record}`` of the trials of the same seed that ran before this one (a
      baseline matched to another method's result: the FLOPs an earlier pruning reached).
    config: the configuration of the run's setting (:meth:`Context.config`).
  """
  seed: int
  index: int
  checkpoints: str
  fingerprint: dict
  earlier: dict
  config: Config


class Trial(NamedTuple):
  """A method of a declared study whose run is not a sequence of federated rounds — training
  for epochs on pooled data (:func:`fedjaxsparse.runtime.epochs.train_epochs`,
  :func:`fedjaxsparse.algorithms.ato.train`), a one-shot pruning, a screening solver: the
  harness runs every trial of a setting once per seed (the ``seeds`` option, 1 without one),
  seed by seed in declaration order, with progress, and keeps each seed's record.

  Attributes:
    run: ``(TrialRun) -> dict``, one seed's run of the method: its JSON-ready record (metrics,
      a per-epoch history, ...), read by the study's ``table``.
    seeds: how many seeds this method runs (``None``: the ``seeds`` option's number; 1 for a
      deterministic method — magnitude pruning — beside a randomised one that is averaged).
  """
  run: Callable[[TrialRun], dict]
  seeds: int | None = None


def _always(cfg: Config, opts: dict) -> Config:
  return tuning_config(cfg)


class Tuning(NamedTuple):
  """How a declared experiment tunes its :class:`Method` s and what its table shows.

  Every method of every setting (:class:`Context` ``.setting``) is tuned alike: the harness
  splits validation data off the training data (or takes the context's ``fit``/``val``), runs
  :func:`tune_then_run` with the ``seeds`` option's number of seeds (1 without one) and adds a
  row ``{setting, "method", candidate: the chosen one, column: mean over seeds, "s.e.",
  **columns(...)}``.

  Attributes:
    candidate: the table column of the chosen candidate (``"lr"``); a candidate that is a
      ``{name: value}`` dict (a :class:`Method` with a ``search``) gets a column per name.
    column: the column of the seeds' mean of ``scale ×`` the final test metric.
    scale: 100 for percentages.
    setting: the column of the setting's name.
    config: ``(cfg, opts) -> Config`` of tuning runs (default :func:`tuning_config`).
    columns: ``(method, tuned, context, cfg, opts) -> dict``, the row's other entries (the
      paper's numbers, bits, times); ``tuned`` is the :class:`Tuned`.
    score: ``(record, cfg, opts) -> comparable``: what tuning maximises instead of the final
      validation metric (e.g. ``(reached, −cost to a target, accuracy)``; ``None``: the
      metric), :func:`tune_then_run`'s ``score``.
  """
  candidate: str = "lr"
  column: str = "ours %"
  scale: float = 100.0
  setting: str = "split"
  config: Callable[[Config, dict], Config] = _always
  columns: Callable[..., dict] | None = None
  score: Callable[..., Any] | None = None


METRIC_COLUMNS = {"accuracy": ("acc %", 100.0), "miou": ("mIoU %", 100.0)}
"""``{metric: (short name, scale)}``: how a declared experiment's table prints a metric kept as
a fraction in the histories — accuracy as ``final acc %``, ``best acc %`` (× 100), the unit the
papers print; other metrics under their own name, unscaled."""


def declared(name: str, spec: Sequence[Option], *,
             setup: Callable[[Config, dict], Any],
             methods: Callable[[Context, Config, dict], dict],
             report: Callable[[dict, Context, Config, dict], dict] | None = None,
             metric: str | Callable[[Config, dict], str] = "accuracy",
             higher_is_better: bool = True,
             papers: dict[str, PaperConfig] | None = None, tuning: Tuning | None = None,
             figure: Callable[[dict, Context, Config, dict], Any] | None = None,
             table: Callable[[dict, list, Config, dict], Table] | None = None,
             float64: Callable[[dict], bool] | None = None
             ) -> Callable[[Config], dict]:
  """An experiment's ``run(cfg)`` from its declaration: ``setup(cfg, opts) -> Context`` (data,
  initial parameters, evaluation; with ``tuning``, an iterable of contexts, one per setting),
  ``methods(context, cfg, opts) -> {paper name: Algorithm}`` (with ``tuning``:
  ``{paper name: Method}``) and, optionally, ``report(results, context, cfg, opts) -> dict``
  (extra :class:`~fedjaxsparse.harness.report.Table` s, statistics and ``"figures"``, merged
  into the results; ``context`` is the last setting's; with ``tuning``, ``results["tuned"]``
  maps each row's method to its :class:`Tuned`, scores of every candidate included). The harness owns the rest, alike for
  every method:

  * without ``tuning``, each runs ``cfg.rounds`` rounds from ``context.params`` through
    :func:`run_method` (progress, checkpoints and resume, divergence handling), then one
    table — final and best ``metric``, uplink bits per client to reach the ``threshold``
    option's value (when the experiment declares one), total uplink bits per client,
    training time and, when a method diverged, a status column;
  * with ``tuning``, each is tuned on validation data and run with seeds (:class:`Tuning`),
    one row per setting and method, mean ± s.e. over seeds;

  then ``results.json`` and the figures (default: ``metric`` against rounds and against
  uplink bits per client, ``<name>.png``; ``figure(results, context, cfg, opts)`` returns
  others — a :class:`~fedjaxsparse.harness.report.Figure` or a list). ``metric`` may be a
  function ``(cfg, opts) -> name`` (an experiment whose task decides it: mIoU for
  segmentation). Validation, the output folder's lock and the rendering are :func:`entry`'s.

  Convergence studies (an optimality gap against rounds, not a score to tune) are declared
  alike, untuned: ``setup`` may yield several settings (one objective per personalisation
  factor α, say — each :class:`Context` with its own ``eval_fn`` measuring the gap to its own
  optimum), every setting's methods run the same way (their names must differ across
  settings), and ``table(records, contexts, cfg, opts) -> Table`` builds the main table from
  the histories (the gap reached, the rounds to a target; the records are left as the runs
  wrote them, so ``table`` may add a per-round quantity for the figures). A setting whose
  context declares a ``curve`` (a metric of the whole state, every round, over seeds) gets
  records ``{"curves": [seeds, rounds + 1], ...}`` from
  :func:`~fedjaxsparse.harness.running.run_curves` instead, and its default figure draws each
  method's mean curve against rounds, a panel per setting. A study with several tables (one
  per sub-study, say) returns them from ``table`` as a dict merged into the results (its
  ``"table"`` entry, if any, the main one).

  Studies whose methods are not federated runs — training for epochs on pooled data, a
  one-shot pruning — declare each method as a :class:`Trial` (every method of the study):
  the harness runs them seed by seed (:class:`TrialRun`), keeps
  ``{method: {"seeds": [record, ...]}}`` as the records and ``table`` builds the tables from
  them (a dict of tables and values, as above; ``ctx.data`` needs no federated splits). ``report`` and
  ``figure`` see every setting as ``results["contexts"]`` (dropped before ``results.json``,
  as ``results["tuned"]``). ``float64(opts) -> bool``: the whole experiment runs with 64-bit
  floats (:func:`jax.enable_x64`), for gaps below float32's resolution."""
  if table is not None and tuning is not None:
    raise ValueError(f"{name}: a tuned experiment's table is the harness's (Tuning.columns "
                     "adds columns); 'table' is for untuned studies.")
  best = max if higher_is_better else min
  metric_of = metric if callable(metric) else (lambda cfg, opts: metric)

  def plain(cfg: Config, opts: dict) -> tuple[dict, Context]:
    made = setup(cfg, opts)
    contexts = [made] if isinstance(made, Context) else list(made)
    metric = next((c.metric for c in contexts if c.metric), None) or metric_of(cfg, opts)
    short, scale = METRIC_COLUMNS.get(metric, (metric, 1.0))
    if not contexts:
      raise ConfigError(f"{name}: setup declared no setting to run.")
    planned = {}   # every setting's methods, checked before anything runs
    for ctx in contexts:
      for m, algo in methods(ctx, ctx.config(cfg), opts).items():
        if m in planned:
          raise ConfigError(f"{name}: two settings declare a method named {m!r}; name each "
                            "setting's methods apart.")
        planned[m] = (algo, ctx)
    trials = [m for m, (algo, _) in planned.items() if isinstance(algo, Trial)]
    if trials and len(trials) < len(planned):
      raise ConfigError(f"{name}: declare every method as a Trial or none ({trials[0]!r} is "
                        "one, not all are).")
    if trials and table is None:
      raise ConfigError(f"{name}: a study of Trials keeps each seed's record; declare its "
                        "'table'.")
    curved = sum(c.curve is not None for _, c in planned.values())
    if curved and table is None:
      raise ConfigError(f"{name}: a convergence study's records are curves of its settings' "
                        "'curve'; declare its 'table'.")
    if trials:
      records = _run_trials(name, planned, cfg, opts)
    else:
      steps = Steps(curved, name, cfg.progress)
      records = {}
      for m, (algo, c) in planned.items():
        if c.curve is None:
          records[m] = run_method(c.config(cfg), name, m, algo, c.params, c.data.train,
                                  c.data.test, c.eval_fn)
          continue
        records[m] = {**run_curves(c.config(cfg), algo, c.params, c.data.train, c.curve,
                                   opts.get("seeds", 1)), "setting": c.setting}
        steps.done(m)
    ctx, ds = contexts[-1], contexts[-1].data
    if table is not None:
      made = table(records, contexts, cfg, opts)
      out = {"experiment": name, "dataset": getattr(ds, "name", None), "metric": metric}
      out.update(made if isinstance(made, dict) else {"table": made})
      return {**out, "methods": records, "contexts": contexts}, ctx
    for r in records.values():
      ev = r["history"]["evals"]
      ev["uplink_bits_per_client"] = [b / ds.num_clients for b in ev.get("uplink_bits", [])]
    threshold = opts.get("threshold")
    rows = []
    for m, r in records.items():
      ev = r["history"]["evals"]
      values = [None if v is None else scale * v for v in ev.get(metric, [])]
      finite = [v for v in values if v is not None]
      row = {"method": m, f"final {short}": last(values),
             f"best {short}": best(finite, default=None)}
      if threshold is not None:
        row[f"uplink bits/client to {threshold:.0%}"] = bits_to_reach(
            ev, metric, threshold, "uplink_bits_per_client")
      row.update({"total uplink bits/client": last(ev["uplink_bits_per_client"]),
                  "time (s)": r["wall_time_s"]})
      if any(rec["diverged"] for rec in records.values()):
        row["status"] = status(r)
      rows.append(row)
    return {"experiment": name, "dataset": ds.name, "metric": metric, "table": Table(rows),
            "methods": records, "contexts": contexts}, ctx

  def tuned(cfg: Config, opts: dict) -> tuple[dict, Context]:
    made = setup(cfg, opts)
    rows, records, found, ctx, contexts = [], {}, {}, None, []
    planned = {}   # every setting's methods, checked before anything runs
    for ctx in [made] if isinstance(made, Context) else made:
      if ctx.curve is not None:
        raise ConfigError(f"{name}: a convergence study ('curve') is not tuned; declare it "
                          "without 'tuning'.")
      if ctx.fit is None:
        fit, val = validation_split(ctx.data.train, opts["validation"], cfg.seed)
        ctx = ctx._replace(fit=fit, val=val)
      contexts.append(ctx)
      run_cfg = ctx.config(cfg)
      for m, method in methods(ctx, run_cfg, opts).items():
        if isinstance(method, Trial):
          raise ConfigError(f"{name}: {m!r} is a Trial; a tuned experiment declares Methods.")
        key = f"{m} ({ctx.setting})" if ctx.setting is not None else m
        if key in planned:
          raise ConfigError(f"{name}: two settings declare a method named {key!r}; name each "
                            "setting apart.")
        planned[key] = (m, method, ctx, run_cfg)
    if ctx is None:
      raise ConfigError(f"{name}: setup declared no setting to run.")
    for key, (m, method, ctx, run_cfg) in planned.items():
      metric = ctx.metric or metric_of(cfg, opts)
      tune_cfg = tuning.config(run_cfg, opts)
      score = None if tuning.score is None else (
        lambda rec, run_cfg=run_cfg: tuning.score(rec, run_cfg, opts))
      where = f"{ctx.setting} {m}" if ctx.setting is not None else m
      start = ctx.params if method.params is None else method.params
      t = tune_then_run(run_cfg, name, where, method.grid, method.build, start, ctx.fit,
                        ctx.val, ctx.data.train, ctx.data.test, ctx.eval_fn,
                        tune_cfg=tune_cfg, seeds=opts.get("seeds", 1), label=method.label,
                        data=method.data, params_fn=method.params_fn, metric=metric,
                        scale=tuning.scale, residence=method.residence,
                        batched=method.batched, score=score, search=method.search,
                        per_round=method.per_round, chunk_size=method.chunk_size,
                        vmap_seeds=method.vmap_seeds)
      records[key], found[key] = t.records[0], t
      row = {tuning.setting: ctx.setting} if ctx.setting is not None else {}
      row["method"] = m
      if isinstance(t.best, dict):   # a searched candidate: a column per name
        row.update(t.best)
      else:
        row[tuning.candidate] = t.best
      row.update({tuning.column: t.stats["mean"], "s.e.": t.stats["se"]})
      if tuning.columns is not None:
        row.update(tuning.columns(m, t, ctx, run_cfg, opts))
      rows.append(row)
    metric = contexts[-1].metric or metric_of(cfg, opts)
    return {"experiment": name, "metric": metric, "table": Table(rows), "methods": records,
            "tuned": found, "contexts": contexts}, contexts[-1]

  def body(cfg: Config, opts: dict) -> dict:
    with jax.enable_x64(bool(float64(opts))) if float64 is not None else \
        contextlib.nullcontext():
      return run_body(cfg, opts)

  def run_body(cfg: Config, opts: dict) -> dict:
    results, ctx = (plain if tuning is None else tuned)(cfg, opts)
    metric = results.get("metric") or metric_of(cfg, opts)
    records = results["methods"]
    if figure is None and records and all(set(r) == {"seeds"} for r in records.values()):
      figures = []   # a study of Trials: its records hold no common curve to draw
    elif figure is None and any(c.curve is not None for c in results["contexts"]):
      figures = [_curve_panels(results, metric, f"{name}: {ctx.data.name}")]
    elif figure is None:
      title = f"{name}: {ctx.data.name}" if tuning is None else \
          f"{name}: {metric} against rounds and uplink bits per client"
      figures = [Figure("methods", dict(methods=_bits_per_client(records, cfg.clients),
                                        metric=metric, title=title,
                                        bits="uplink_bits_per_client"))]
    else:
      made = figure(results, ctx, cfg, opts)
      figures = list(made) if isinstance(made, (list, tuple)) else [made]
    if report is not None:
      extra = report(results, ctx, cfg, opts)
      figures += list(extra.pop("figures", []))
      results.update(extra)
    results.pop("tuned", None)   # the Tuned records: for report, not results.json
    results.pop("contexts", None)
    results["figures"] = figures
    return results

  body.__name__ = body.__qualname__ = f"{name}_declared"
  return entry(name, spec, body, papers)


def _run_trials(name: str, planned: dict, cfg: Config, opts: dict) -> dict:
  """Every :class:`Trial` of ``planned`` (``{method: (trial, context)}``) for each of its
  seeds, seed by seed in declaration order: ``{method: {"seeds": [record per seed]}}``."""
  seeds = {m: opts.get("seeds", 1) if trial.seeds is None else trial.seeds
           for m, (trial, _) in planned.items()}
  for m, n in seeds.items():
    if not isinstance(n, (int, np.integer)) or n < 1:
      raise ConfigError(f"{name}: Trial {m!r} has seeds={n!r}; it must be an int >= 1.")
  steps = Steps(sum(seeds.values()), name, cfg.progress)
  records = {m: {"seeds": []} for m in planned}
  for index in range(max(seeds.values(), default=0)):
    seed, earlier = cfg.seed + index, {}
    for m, (trial, ctx) in planned.items():
      if index >= seeds[m]:
        continue
      folder, fingerprint = run_identity(cfg, name, f"{m} seed {seed}", seed)
      fingerprint["method"] = m
      run = TrialRun(seed=seed, index=index, checkpoints=folder, fingerprint=fingerprint,
                     earlier=dict(earlier), config=ctx.config(cfg))
      earlier[m] = trial.run(run)
      records[m]["seeds"].append(earlier[m])
      steps.done(f"{m} (seed {seed})")
  return records


def _curve_panels(results: dict, metric: str, title: str) -> Figure:
  """A convergence study's default figure: every method's mean curve over seeds against
  rounds, log scale, one panel per setting that declares a ``curve``."""
  planned = {}
  for m, r in results["methods"].items():
    if "curves" in r:
      planned.setdefault(r["setting"], {})[m] = (None, np.mean(r["curves"], 0).tolist())
  return Figure("panels", dict(title=title, panels=[
      {"lines": lines, "logy": True, "xlabel": "round", "ylabel": metric,
       **({"title": s} if s is not None else {})} for s, lines in planned.items()]))


def _bits_per_client(records: dict, clients: int) -> dict:
  """``records`` whose evals gain ``uplink_bits_per_client`` (for plots; copies, so the saved
  histories stay as the runs wrote them)."""
  out = {}
  for m, r in records.items():
    ev = r["history"]["evals"]
    if "uplink_bits_per_client" in ev or "uplink_bits" not in ev:
      out[m] = r
      continue
    per = [None if b is None else b / clients for b in ev["uplink_bits"]]
    out[m] = {**r, "history": {**r["history"], "evals": {**ev, "uplink_bits_per_client": per}}}
  return out
