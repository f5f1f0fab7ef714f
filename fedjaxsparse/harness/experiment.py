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
harness runs them, tabulates, saves and plots (:func:`declared`) — or, for a protocol of its
own, ``run = experiment.entry(NAME, OPTIONS, body)``, where ``body(cfg, opts) -> dict`` gets
the parsed options, runs its methods with the helpers here (:func:`run_method`,
:func:`tune_then_run`) and returns its results, declaring its tables and figures
(:class:`~fedjaxsparse.harness.report.Table`, :class:`~fedjaxsparse.harness.report.Figure`);
the harness prints, saves and draws them (:func:`finish`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import json
import math
import os
import sys
import time
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjaxsparse.runtime.clients import with_strategy
from fedjaxsparse.core import Algorithm, ParamsFn, float_dtype, global_params
from fedjaxsparse.errors import ConfigError
from fedjaxsparse.runtime import population
from fedjaxsparse.runtime.locking import FolderLock
from fedjaxsparse.runtime.population import CohortAlgorithm
from fedjaxsparse.harness.protocol import PaperConfig, mean_se, validation_split
from fedjaxsparse.harness.report import Figure, Table
from fedjaxsparse.runtime.runner import EvalFn, run, state_finite
from fedjaxsparse.runtime.sharding import client_mesh
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["standin_note", "Config", "Option", "parse_options", "name_list", "identity_options", "with_paper",
           "with_quick", "entry", "Context", "Method", "Tuning", "declared", "finish", "Steps",
           "output_dir", "run_method", "tuning_config", "Run", "Tuned", "tune_then_run",
           "first_divergence", "last", "status", "bits_to_reach", "save_results"]
__dir__ = _public_dir(__all__)

DIVERGENCE = ("error", "skip")
TUNINGS = ("batched", "sequential")
INT32_MAX = 2 ** 31 - 1


@dataclasses.dataclass
class Config:
  """Options common to every experiment (the CLI flags).

  Attributes:
    rounds: the experiment's budget in its own unit (see the module's ``BUDGET``):
      communication rounds for round-based methods.
    clients: number of clients.
    dataset: dataset name (see ``fedjaxsparse.data.load_dataset``).
    seed: run and partition seed.
    out: output directory; results go to ``out/<experiment>/``.
    resume: continue each method from its newest checkpoint (the checkpoint must come from
      the same configuration; see :func:`fedjaxsparse.runtime.runner.run`).
    overwrite: delete checkpoints of an earlier run and start afresh (without it, and without
      ``resume``, an output folder holding checkpoints is an error).
    eval_every: evaluate every this many rounds.
    data_dir: directory with real dataset files (loaders that need them).
    progress: show progress bars.
    on_divergence: ``"error"`` stops the experiment at the first NaN/inf, naming the method,
      round and quantity; ``"skip"`` marks the method diverged in the table and plots and goes
      on with the next method.
    options: experiment-specific options (``--set key=value`` on the CLI), checked against
      the module's ``OPTIONS`` (after :func:`entry`: every option, parsed).
    fingerprint: the options that change what a method computes (set by :func:`entry`), part
      of every checkpoint's fingerprint so a refused resume names the option that changed.
    paper: the name of one of the experiment's paper configurations (``PAPERS``), already
      applied with :func:`with_paper`; it makes the experiment print the paper's numbers
      beside ours and fall back to the stand-in data when the real files are absent.
    execution: how clients execute (``runner.run``'s ``clients``): ``"auto"`` (default),
      ``"vmap"``, ``"map"``, ``"unroll"`` or ``"unroll:G"`` — speed only, never results.
    tuning: how a :class:`Method` declared ``batched`` tunes its grid: ``"batched"`` (default:
      every candidate in one vmapped program, one compile) or ``"sequential"`` (one run per
      candidate, each with checkpoints and a progress line) — the same runs either way.
    quick: the experiment's quick setting (its ``QUICK``) was applied with :func:`with_quick`.
    checkpoint_interval_s: a method's run writes a checkpoint at an evaluation only when at
      least this many seconds passed since its previous one, and always after its last round
      (``runner.run``'s ``checkpoint_interval_s``; 0: at every evaluation). A crash loses at
      most this much training; a run shorter than it writes a single checkpoint.
  """
  rounds: int | None = 100
  clients: int = 20
  dataset: str = "digits"
  seed: int = 0
  out: str = "results"
  resume: bool = False
  overwrite: bool = False
  eval_every: int | None = 10
  data_dir: str | None = None
  progress: bool = True
  on_divergence: str = "error"
  options: dict = dataclasses.field(default_factory=dict)
  fingerprint: dict = dataclasses.field(default_factory=dict)
  paper: str | None = None
  execution: str = "auto"
  tuning: str = "batched"
  quick: bool = False
  checkpoint_interval_s: float = 60.0

  def validate(self) -> "Config":
    for name, low in (("rounds", 1), ("clients", 1), ("eval_every", 1), ("seed", 0)):
      v = getattr(self, name)
      if v is None and name in ("rounds", "eval_every"):  # the experiment chooses (BUDGET)
        continue
      if (not isinstance(v, (int, np.integer)) or isinstance(v, bool)
          or not low <= v <= INT32_MAX):
        raise ConfigError(f"{name} must be an int in [{low}, {INT32_MAX}], got {v!r}.")
    if not (isinstance(self.checkpoint_interval_s, (int, float)) and
            0 <= self.checkpoint_interval_s < float("inf")):
      raise ConfigError("checkpoint_interval_s must be a number of seconds >= 0, got "
                        f"{self.checkpoint_interval_s!r}.")
    if self.on_divergence not in DIVERGENCE:
      raise ConfigError(f"on_divergence must be one of {DIVERGENCE}, got "
                        f"{self.on_divergence!r}.")
    if self.execution != "auto":
      try:
        with_strategy(None, self.execution)
      except ValueError as e:
        raise ConfigError(f"execution: {e} (or 'auto')") from None
    if self.tuning not in TUNINGS:
      raise ConfigError(f"tuning must be one of {TUNINGS}, got {self.tuning!r}.")
    if self.resume and self.overwrite:
      raise ConfigError("resume and overwrite exclude each other: continue the checkpointed "
                        "run (--resume) or delete it (--overwrite).")
    return self


_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")
KINDS = ("float", "int", "bool", "str", "floats")


@dataclasses.dataclass(frozen=True)
class Option:
  """One experiment option, set with ``--set name=value`` (or ``Config.options``).

  Attributes:
    name: the key.
    default: the value when not given (``None``: the experiment derives it, e.g. from theory).
    help: one line for ``fedjaxsparse describe``.
    kind: ``"float"``, ``"int"``, ``"bool"``, ``"str"`` or ``"floats"`` (a list); inferred
      from ``default`` when omitted.
    low, high, low_open, high_open: the allowed interval of a number (each element of a list).
    choices: the allowed values of a ``str`` option.
    identity: whether the option changes what a method computes (part of the checkpoint
      fingerprint); ``False`` for options that only shape tables or select extra runs.
  """
  name: str
  default: Any
  help: str
  kind: str | None = None
  low: float | None = None
  high: float | None = None
  low_open: bool = False
  high_open: bool = False
  choices: tuple | None = None
  identity: bool = True

  @property
  def type(self) -> str:
    if self.kind is not None:
      return self.kind
    d = self.default
    if isinstance(d, bool):
      return "bool"
    if isinstance(d, int):
      return "int"
    if isinstance(d, float):
      return "float"
    if isinstance(d, (list, tuple)):
      return "floats"
    return "str"

  def allowed(self) -> str:
    """The allowed values, in words (for help and errors)."""
    if self.type == "bool":
      return "true or false"
    if self.choices:
      return "one of " + ", ".join(map(str, self.choices)) + (
          " or none" if self.default is None else "")
    if self.type in ("float", "int", "floats"):
      lo = "-inf" if self.low is None else f"{self.low:g}"
      hi = "inf" if self.high is None else f"{self.high:g}"
      interval = (("(" if self.low_open or self.low is None else "[") + f"{lo}, {hi}" +
                  (")" if self.high_open or self.high is None else "]"))
      what = {"float": "a finite number", "int": "a 32-bit integer",
              "floats": "a list of finite numbers"}[self.type]
      return (f"{what} in {interval}" + (", e.g. [0.8,0.9]" if self.type == "floats" else "")
              + (" or none" if self.default is None else ""))
    return "text" + (" or none" if self.default is None else "")

  def parse(self, value: Any) -> Any:
    """``value`` (a string from the CLI or a typed Python value) checked and converted."""
    bad = lambda: ConfigError(f"option {self.name!r}: {value!r} is not allowed; expected "
                              f"{self.allowed()}.")
    if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null")
                         and self.default is None):
      if self.default is None:
        return None
      raise bad()
    kind = self.type
    if kind == "bool":
      if isinstance(value, (bool, np.bool_)):
        return bool(value)
      text = str(value).strip().lower()
      if text in _TRUE:
        return True
      if text in _FALSE:
        return False
      raise bad()
    if kind == "str":
      text = str(value)
      if self.choices and text not in self.choices:
        raise bad()
      return text
    if kind == "floats":
      if isinstance(value, str):
        items = [v for v in value.strip().strip("[]()").replace(" ", "").split(",") if v]
      elif isinstance(value, (list, tuple, np.ndarray)):
        items = list(value)
      else:
        items = [value]
      return [self._number(v, float, bad) for v in items]
    return self._number(value, float if kind == "float" else int, bad)

  def _number(self, value: Any, cast: type, bad: Callable) -> Any:
    if isinstance(value, bool):
      raise bad()
    try:
      v = float(value) if not isinstance(value, str) else float(value.strip())
    except (TypeError, ValueError):
      raise bad() from None
    if not math.isfinite(v) or (cast is int and (v != int(v) or abs(v) > INT32_MAX)):
      raise bad()
    if self.low is not None and (v <= self.low if self.low_open else v < self.low):
      raise bad()
    if self.high is not None and (v >= self.high if self.high_open else v > self.high):
      raise bad()
    return cast(v) if cast is int else v


def parse_options(spec: Sequence[Option], given: dict, experiment: str = "") -> dict:
  """Every option of ``spec`` with its parsed value (defaults filled in); an unknown key is a
  :class:`ConfigError` listing the known ones (and the closest match)."""
  known = {o.name: o for o in spec}
  for key in given:
    if key not in known:
      close = difflib.get_close_matches(key, known, n=1)
      hint = f" Did you mean {close[0]!r}?" if close else ""
      raise ConfigError(f"unknown option {key!r}{' for ' + experiment if experiment else ''}."
                        f"{hint} Known options: {', '.join(sorted(known)) or 'none'}.")
  return {name: o.parse(given[name]) if name in given else o.default
          for name, o in known.items()}


def name_list(text: str, option: str, allowed: Sequence[str] | None = None,
          default: Sequence[str] | None = None) -> list[str]:
  """The comma-separated names of a list option (``methods``, ``splits``, ...), checked: each
  one of ``allowed`` (when given), none twice, and at least one — an empty list is
  ``default`` when one is given, else an error. Every problem is a :class:`ConfigError`
  naming the option and the allowed names."""
  got = [n.strip() for n in str(text).split(",") if n.strip()]
  choices = f"; choose from {', '.join(allowed)}" if allowed is not None else ""
  if not got:
    if default is not None:
      return list(default)
    raise ConfigError(f"option {option!r} names nothing{choices}.")
  for n in got:
    if allowed is not None and n not in allowed:
      close = difflib.get_close_matches(n, list(allowed), n=1)
      hint = f" (did you mean {close[0]!r}?)" if close else ""
      raise ConfigError(f"option {option!r}: unknown name {n!r}{hint}{choices}.")
  twice = sorted({n for n in got if got.count(n) > 1})
  if twice:
    raise ConfigError(f"option {option!r} names {', '.join(map(repr, twice))} more than once; "
                      f"name each once.")
  return got


def identity_options(spec: Sequence[Option], opts: dict) -> dict:
  """The options that change what a method computes (for the checkpoint fingerprint)."""
  return {o.name: opts[o.name] for o in spec if o.identity}


def with_paper(cfg: Config, paper: PaperConfig, explicit: Sequence[str] = ()) -> Config:
  """``cfg`` with the paper configuration applied: its dataset, clients, rounds, eval_every
  (except the fields named in ``explicit``, which the user set) and its options (options in
  ``cfg.options`` win)."""
  common = {k: v for k, v in paper.common().items() if k not in explicit}
  return dataclasses.replace(cfg, **common, options={**paper.options, **cfg.options},
                             paper=paper.name)


def with_quick(cfg: Config, quick: dict) -> Config:
  """``cfg`` with an experiment's quick setting applied: ``quick`` (the module's ``QUICK``)
  holds :class:`Config` fields and ``"options"``; options already in ``cfg.options`` win."""
  fields = {k: v for k, v in quick.items() if k != "options"}
  unknown = set(fields) - set(Config.__dataclass_fields__)
  if unknown:
    raise ValueError(f"QUICK sets unknown Config fields {sorted(unknown)}.")
  return dataclasses.replace(cfg, **fields, options={**quick.get("options", {}), **cfg.options},
                             quick=True)


def entry(name: str, spec: Sequence[Option], body: Callable[[Config, dict], dict],
          papers: dict[str, PaperConfig] | None = None) -> Callable[[Config], dict]:
  """An experiment's ``run(cfg)``: validates ``cfg`` and its options, locks the output folder
  for the whole experiment, then calls ``body(cfg, opts)``. ``papers`` are the experiment's
  paper configurations; ``cfg.paper`` must name one of them."""
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
    with lock:
      return finish(cfg, name, body(cfg, opts))
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
  """
  data: Any
  params: Any
  eval_fn: EvalFn | None
  extra: dict = {}
  setting: str | None = None
  fit: Any = None
  val: Any = None


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
  """
  build: Callable[[Any, "Run"], Any]
  grid: Sequence = (None,)
  label: Callable[[Any], str] = str
  params_fn: ParamsFn = global_params
  data: Callable[[Any, Any], Any] | None = None
  residence: str = "auto"
  params: Any = None
  batched: bool = False


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
    candidate: the table column of the chosen candidate (``"lr"``).
    column: the column of the seeds' mean of ``scale ×`` the final test metric.
    scale: 100 for percentages.
    setting: the column of the setting's name.
    config: ``(cfg, opts) -> Config`` of tuning runs (default :func:`tuning_config`).
    columns: ``(method, tuned, context, cfg, opts) -> dict``, the row's other entries (the
      paper's numbers, bits, times); ``tuned`` is the :class:`Tuned`.
  """
  candidate: str = "lr"
  column: str = "ours %"
  scale: float = 100.0
  setting: str = "split"
  config: Callable[[Config, dict], Config] = _always
  columns: Callable[..., dict] | None = None


METRIC_COLUMNS = {"accuracy": "acc"}
"""Short names of metrics in a declared experiment's table (``final acc``, ``best acc``)."""


def declared(name: str, spec: Sequence[Option], *,
             setup: Callable[[Config, dict], Any],
             methods: Callable[[Context, Config, dict], dict],
             report: Callable[[dict, Context, Config, dict], dict] | None = None,
             metric: str | Callable[[Config, dict], str] = "accuracy",
             higher_is_better: bool = True,
             papers: dict[str, PaperConfig] | None = None, tuning: Tuning | None = None,
             figure: Callable[[dict, Context, Config, dict], Any] | None = None
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
  segmentation). Validation, the output folder's lock and the rendering are :func:`entry`'s."""
  best = max if higher_is_better else min
  metric_of = metric if callable(metric) else (lambda cfg, opts: metric)

  def plain(cfg: Config, opts: dict) -> tuple[dict, Context]:
    metric = metric_of(cfg, opts)
    short = METRIC_COLUMNS.get(metric, metric)
    ctx = setup(cfg, opts)
    algos = methods(ctx, cfg, opts)
    ds = ctx.data
    records = {m: run_method(cfg, name, m, algo, ctx.params, ds.train, ds.test, ctx.eval_fn)
               for m, algo in algos.items()}
    for r in records.values():
      ev = r["history"]["evals"]
      ev["uplink_bits_per_client"] = [b / ds.num_clients for b in ev.get("uplink_bits", [])]
    threshold = opts.get("threshold")
    rows = []
    for m, r in records.items():
      ev = r["history"]["evals"]
      values = ev.get(metric, [])
      row = {"method": m, f"final {short}": last(values),
             f"best {short}": best(values, default=None)}
      if threshold is not None:
        row[f"uplink bits/client to {threshold:.0%}"] = bits_to_reach(
            ev, metric, threshold, "uplink_bits_per_client")
      row.update({"total uplink bits/client": last(ev["uplink_bits_per_client"]),
                  "time (s)": r["wall_time_s"]})
      if any(rec["diverged"] for rec in records.values()):
        row["status"] = status(r)
      rows.append(row)
    return {"experiment": name, "dataset": ds.name, "metric": metric, "table": Table(rows),
            "methods": records}, ctx

  def tuned(cfg: Config, opts: dict) -> tuple[dict, Context]:
    metric = metric_of(cfg, opts)
    made = setup(cfg, opts)
    rows, records, found, ctx = [], {}, {}, None
    for ctx in [made] if isinstance(made, Context) else made:
      if ctx.fit is None:
        fit, val = validation_split(ctx.data.train, opts["validation"], cfg.seed)
        ctx = ctx._replace(fit=fit, val=val)
      tune_cfg = tuning.config(cfg, opts)
      for m, method in methods(ctx, cfg, opts).items():
        where = f"{ctx.setting} {m}" if ctx.setting is not None else m
        start = ctx.params if method.params is None else method.params
        t = tune_then_run(cfg, name, where, method.grid, method.build, start, ctx.fit,
                          ctx.val, ctx.data.train, ctx.data.test, ctx.eval_fn,
                          tune_cfg=tune_cfg, seeds=opts.get("seeds", 1), label=method.label,
                          data=method.data, params_fn=method.params_fn, metric=metric,
                          scale=tuning.scale, residence=method.residence,
                          batched=method.batched)
        key = f"{m} ({ctx.setting})" if ctx.setting is not None else m
        records[key], found[key] = t.records[0], t
        row = {tuning.setting: ctx.setting} if ctx.setting is not None else {}
        row.update({"method": m, tuning.candidate: t.best, tuning.column: t.stats["mean"],
                    "s.e.": t.stats["se"]})
        if tuning.columns is not None:
          row.update(tuning.columns(m, t, ctx, cfg, opts))
        rows.append(row)
    if ctx is None:
      raise ConfigError(f"{name}: setup declared no setting to run.")
    return {"experiment": name, "table": Table(rows), "methods": records, "tuned": found}, ctx

  def body(cfg: Config, opts: dict) -> dict:
    metric = metric_of(cfg, opts)
    results, ctx = (plain if tuning is None else tuned)(cfg, opts)
    records = results["methods"]
    if figure is None:
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
    results["figures"] = figures
    return results

  body.__name__ = body.__qualname__ = f"{name}_declared"
  return entry(name, spec, body, papers)


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


def standin_note(dataset: str) -> str | None:
  """The flag of a run on a labelled stand-in (``--dataset *_standin``): its numbers are not
  comparable with the paper's; ``None`` for any other data."""
  if "standin" not in dataset:
    return None
  return (f"--dataset {dataset}: a labelled stand-in of the real data's shape; its numbers are "
          "not comparable with the paper's")


def finish(cfg: Config, name: str, results: dict) -> dict:
  """Render what an experiment's body returned: every :class:`~fedjaxsparse.harness.report.Table`
  value (at any depth of nested dicts) is printed and saved as its rows (and ``<key>_text``),
  ``results.json`` is written (:func:`save_results`), then every
  :class:`~fedjaxsparse.harness.report.Figure` of ``results["figures"]`` is drawn in the output
  folder; prints the paths and returns the results as saved (methods' final states kept). A
  run on a stand-in (:func:`standin_note`) says so in ``results["standin"]`` (unless the
  experiment set it) and above every table."""
  flag = standin_note(cfg.dataset or "")
  if flag and not results.get("standin"):
    results = {**results, "standin": flag}

  def rendered(tree: dict) -> dict:   # Tables at any depth of nested dicts
    out = {}
    for k, v in tree.items():
      if isinstance(v, Table):
        if flag:
          v = dataclasses.replace(v, title=f"[{flag}]" + (f"\n{v.title}" if v.title else ""))
        out[k], out[f"{k}_text"] = v.rows, v.render()
      elif isinstance(v, dict) and any(isinstance(x, (Table, dict)) for x in v.values()):
        out[k] = rendered(v)
      else:
        out[k] = v
    return out

  out = rendered({k: v for k, v in results.items() if k != "figures"})
  path = save_results(cfg, name, out)
  folder = output_dir(cfg, name)
  pngs = [f.draw(folder, name) for f in results.get("figures", ())]
  print(f"results: {path}")
  if pngs:
    print(("plot: " if len(pngs) == 1 else "plots: ") + ", ".join(pngs))
  return out


class Steps:
  """Progress of an experiment whose pieces do not run through :func:`run_method` (which
  shows its own bar): after each of ``total`` pieces, one line on stderr with the time spent
  and an estimate of the time left (the mean piece time so far). Silent when ``enabled`` is
  false (``--no-progress``)."""

  def __init__(self, total: int, desc: str, enabled: bool = True):
    self.total, self.desc, self.enabled = max(1, int(total)), desc, enabled
    self.count, self.start = 0, time.perf_counter()

  def done(self, what: str) -> None:
    self.count += 1
    if not self.enabled:
      return
    spent = time.perf_counter() - self.start
    left = spent / self.count * max(0, self.total - self.count)
    print(f"[{self.desc} {self.count}/{self.total}] {what} done; {_duration(spent)} so far, "
          f"about {_duration(left)} left", file=sys.stderr, flush=True)


def _duration(seconds: float) -> str:
  seconds = int(round(seconds))
  return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


def output_dir(cfg: Config, name: str) -> str:
  path = os.path.join(cfg.out, name)
  os.makedirs(path, exist_ok=True)
  return path


def run_method(cfg: Config, experiment: str, method: str, algo: Algorithm | CohortAlgorithm,
               params: Any, train: Any, test: Any, eval_fn: EvalFn | None, *,
               key: jax.Array | None = None, params_fn: ParamsFn = global_params,
               chunk_size: int | None = None, residence: str = "auto") -> dict:
  """Run one method with progress bar and checkpoints; return its JSON-ready record.

  The record holds the ``history``, ``final`` metrics, ``wall_time_s`` (training time summed
  over every resume of the run), ``diverged`` (``None`` or ``{"round", "quantity"}`` with
  ``cfg.on_divergence == "skip"``) and ``clients``, the client execution strategy that ran. The checkpoint fingerprint includes the experiment, the
  method, the dataset options and the experiment options that change the computation.

  ``algo`` may be a :class:`~fedjaxsparse.runtime.population.CohortAlgorithm` (per-client state
  touched per cohort): ``residence`` — ``"device"``, ``"host"`` or ``"auto"``
  (:func:`~fedjaxsparse.runtime.population.choose_residence`) — says where the population's
  state lives. On the device it runs as any algorithm (its state a
  :class:`~fedjaxsparse.runtime.population.PopulationState`, ``params_fn`` applied to it); on
  the host it runs through :func:`~fedjaxsparse.runtime.population.run_on_host`, which
  evaluates ``eval_fn`` on the global model, keeps no checkpoints and stops at nothing
  (``clients`` is ``"host"``).
  """
  key = jax.random.key(cfg.seed) if key is None else key
  if isinstance(algo, CohortAlgorithm):
    if residence not in population.RESIDENCES:
      raise ConfigError(f"residence must be one of {population.RESIDENCES}, got "
                        f"{residence!r}.")
    if residence == "auto":
      residence = population.choose_residence(algo, params, train)[0]
    if residence == "host":
      res = population.run_on_host(algo, key, params, train, test, num_rounds=cfg.rounds,
                                   eval_fn=eval_fn, eval_every=cfg.eval_every or cfg.rounds,
                                   progress=cfg.progress, desc=method)
      return {"history": res.history.to_dict(), "wall_time_s": res.train_time_s,
              "diverged": None, "clients": "host",
              "final": {k: last(v) for k, v in res.history.evals.items()},
              "state": population.PopulationState(res.server, res.clients)}
    algo = population.on_device(algo)
  ckpt = os.path.join(output_dir(cfg, experiment), "checkpoints", method.replace("/", "_"))
  identity = {"experiment": experiment, "method": method, "dataset": cfg.dataset,
              "clients": cfg.clients, "seed": cfg.seed, "data_dir": cfg.data_dir,
              **{f"--set {k}": v for k, v in cfg.fingerprint.items()}}
  res = run(algo, key, params, train, test, num_rounds=cfg.rounds, eval_fn=eval_fn,
            eval_every=cfg.eval_every, chunk_size=chunk_size, params_fn=params_fn,
            checkpoint_dir=ckpt, checkpoint_interval_s=cfg.checkpoint_interval_s,
            resume=cfg.resume, overwrite=cfg.overwrite, fingerprint=identity,
            on_nonfinite="stop" if cfg.on_divergence == "skip" else "raise",
            progress=cfg.progress, desc=method, clients=cfg.execution,
            mesh=client_mesh() if jax.process_count() > 1 else None)
  return {"history": res.history.to_dict(), "wall_time_s": res.train_time_s,
          "diverged": res.diverged, "clients": res.clients,
          "final": {k: last(v) for k, v in res.history.evals.items()},
          "state": res.state}


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


@dataclasses.dataclass
class Tuned:
  """One method tuned on validation data, then run with several seeds (:func:`tune_then_run`).

  Attributes:
    best: the chosen candidate (the grid's only value when there is nothing to tune).
    scores: ``{candidate: final validation metric}`` (−1 for a diverged, non-finite or
      unevaluated run), or ``{candidate: score(record)}`` (``None``: diverged); empty when
      there was nothing to tune.
    records: one :func:`run_method` record per seed (the first is the one plotted).
    finals: ``scale ×`` the final test metric of every seed that did not diverge.
    stats: :func:`fedjaxsparse.harness.protocol.mean_se` of ``finals`` (mean and se ``None``
      when every seed diverged).
  """
  best: Any
  scores: dict
  records: list
  finals: list
  stats: dict


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
                  residence: str = "auto", batched: bool = False) -> Tuned:
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
  ``CohortAlgorithm``)."""
  grid = list(grid)
  prep = data or (lambda candidate, split: split)
  scores = {}
  if len(grid) > 1 and batched and cfg.tuning == "batched" and jax.process_count() == 1:
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
            + f"; {_duration(time.perf_counter() - t0)}", file=sys.stderr, flush=True)
  elif len(grid) > 1:
    shown = cfg.progress and jax.process_index() == 0
    if shown:   # tuning runs have no bars of their own: a line per candidate instead
      print(f"{name}: tuning {len(grid)} candidates, {tune_cfg.rounds} round(s) each on the "
            "validation split", file=sys.stderr, flush=True)
    steps = Steps(len(grid), f"{name} tuning", enabled=shown)
    for c in grid:
      algo, ev = _built(build(c, Run(0, tune_cfg.rounds, True)), eval_fn)
      rec = run_method(tune_cfg, experiment, f"{name} tune {label(c)}", algo, params,
                       prep(c, fit), val, ev, params_fn=params_fn, residence=residence)
      scores[c] = _candidate_score(rec, score, metric)
      if score is not None:
        steps.done(f"{label(c)} ({'diverged' if rec['diverged'] else scores[c]})")
      else:
        value = _usable_metric(rec, metric)
        steps.done(f"{label(c)} ({metric} {'diverged' if value is None else f'{value:.4g}'})")
  ok = [c for c in scores if scores[c] is not None]
  best = max(ok, key=scores.get) if ok else grid[0]
  records, finals = [], []
  for s in range(seeds):
    algo, ev = _built(build(best, Run(s, cfg.rounds, False)), eval_fn)
    rec = run_method(cfg, experiment, f"{name} seed {s}", algo, params, prep(best, train), test,
                     ev, params_fn=params_fn, key=jax.random.key(cfg.seed + 100 * s),
                     residence=residence)
    records.append(rec)
    if not rec["diverged"]:
      finals.append(scale * last(rec["history"]["evals"][metric]))
  stats = mean_se(finals) if finals else {"mean": None, "se": None}
  return Tuned(best, scores, records, finals, stats)


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
  from fedjaxsparse.runtime import sweep   # noqa: PLC0415  (only batched tuning needs it)
  try:
    hp = np.asarray(grid, dtype=float_dtype())   # the sequential runs' precision (x64 too)
  except (TypeError, ValueError):
    raise ConfigError(f"{name}: a batched grid's candidates must be numbers, got "
                      f"{grid!r}.") from None

  def build_algo(c):
    algo = build(c, Run(0, tune_cfg.rounds, True))
    if not (hasattr(algo, "init") and hasattr(algo, "step")) or isinstance(
        algo, CohortAlgorithm):
      raise ConfigError(f"{name}: a batched method's build must return an Algorithm (not an "
                        "(algorithm, eval_fn) pair or a CohortAlgorithm); declare it with "
                        "batched=False.")
    return algo

  key = jax.random.key(tune_cfg.seed)    # every candidate's run key, as run_method's
  keys = jax.random.wrap_key_data(np.broadcast_to(
      np.asarray(jax.random.key_data(key)), (len(grid),) + jax.random.key_data(key).shape))
  t = time.perf_counter()
  states, histories = sweep.run_batched(
      build_algo, keys, params, fit, val, num_rounds=tune_cfg.rounds, hparams=hp,
      eval_fn=eval_fn, eval_every=tune_cfg.eval_every or tune_cfg.rounds, params_fn=params_fn,
      clients=tune_cfg.execution)
  wall = time.perf_counter() - t
  finite = np.asarray(jax.vmap(lambda st: jnp.all(state_finite(st)))(states))
  records = []
  for s, h in enumerate(histories):
    diverged = first_divergence(h.to_dict())
    if diverged is None and not finite[s]:   # a state NaN no reported number showed
      diverged = {"round": tune_cfg.rounds, "quantity": "state (at the end of the run)"}
    records.append({"history": h.to_dict(), "diverged": diverged,
                    "final": {k: last(v) for k, v in h.evals.items()}, "wall_time_s": wall,
                    "clients": tune_cfg.execution,
                    "state": jax.tree.map(lambda a, s=s: a[s], states)})
  return records


def first_divergence(history: dict) -> dict | None:
  """``{"round", "quantity"}`` of a history's first non-finite scalar (a round's info field or
  an evaluated metric, ``"test "``-prefixed as the runner names it), or ``None``."""
  first = None
  for table, prefix in ((history["rounds"], ""), (history["evals"], "test ")):
    rounds = table.get("round", [])
    for q, values in table.items():
      for r, v in zip(rounds, values):
        if isinstance(v, (int, float)) and not math.isfinite(v):
          if first is None or r < first["round"]:
            first = {"round": int(r), "quantity": prefix + q}
          break
  return first


def last(values: Sequence) -> Any:
  """The last value of a history column, or ``None`` when it is empty (a run that diverged
  at once)."""
  return values[-1] if values else None


def status(record: dict) -> str:
  """``"ok"`` or ``"diverged at round R (quantity)"`` for a table's status column."""
  d = record.get("diverged")
  return "ok" if not d else f"diverged at round {d['round']} ({d['quantity']})"


def bits_to_reach(evals: dict, metric: str, threshold: float,
                  bits: str = "uplink_bits") -> float | None:
  """Cumulative ``bits`` at the first evaluation where ``metric >= threshold`` (None: never)."""
  for value, b in zip(evals[metric], evals[bits]):
    if value >= threshold:
      return b
  return None


def save_results(cfg: Config, experiment: str, results: dict) -> str:
  """Write ``results.json`` (methods' states are dropped) and return its path."""
  path = os.path.join(output_dir(cfg, experiment), "results.json")
  config = dataclasses.asdict(cfg)
  clean = {**results, "config": config, "jax_backend": jax.default_backend()}
  if "methods" in results:
    clean["methods"] = {m: {k: v for k, v in r.items() if k != "state"}
                        for m, r in results["methods"].items()}

  def default(o):
    if isinstance(o, (np.generic, np.ndarray)):
      return o.tolist()
    raise TypeError(f"not JSON-serialisable: {type(o)}")

  if jax.process_index() == 0:  # several processes: the first writes
    with open(path, "w") as f:   # compact: long histories
      json.dump(_shortest_floats(json.loads(json.dumps(clean, default=default))), f,
                separators=(",", ":"))
  return path


def _shortest_floats(tree: Any) -> Any:
  """``tree`` with every float that is exactly a float32 number written as the shortest
  decimal that reads back as that float32 (``0.1`` rather than ``0.10000000149011612``):
  float32 histories take half the space and read back bit for bit in float32; float64
  values (not float32 numbers) are kept as they are."""
  if isinstance(tree, dict):
    return {k: _shortest_floats(v) for k, v in tree.items()}
  if isinstance(tree, list):
    return [_shortest_floats(v) for v in tree]
  if isinstance(tree, float) and math.isfinite(tree):
    single = np.float32(tree)
    if float(single) == tree:
      return float(str(single))   # numpy prints a float32 as its shortest round-trip decimal
  return tree
