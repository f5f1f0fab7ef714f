"""The common configuration of every experiment (:class:`Config`: output folder, data set,
clients, rounds, seed, execution) and the options an experiment declares (:class:`Option`:
kind, range, choices), parsed and validated with errors that name the option and its allowed
values; paper configurations and the quick setting applied to a configuration."""
from __future__ import annotations

import dataclasses
import difflib
import math
from typing import Any, Callable, Sequence

import numpy as np

from fedjaxsparse.runtime.clients import with_strategy
from fedjaxsparse.errors import ConfigError
from fedjaxsparse.harness.protocol import PaperConfig
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["Config", "Option", "parse_options", "name_list", "identity_options", "with_paper", "with_quick", "DIVERGENCE", "TUNINGS"]
__dir__ = _public_dir(__all__)

_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")  # a bool option's spellings

DIVERGENCE = ("error", "skip")
"""What a run does when a method diverges (``--on-divergence``): stop with the error, or skip
the method and report it diverged."""
TUNINGS = ("batched", "sequential")
"""How a tuning grid runs (``--tuning``): as one vmapped program, or one run per candidate."""
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
      (``Checkpointing.interval_s`` of the run's ``checkpoint``; 0: at every evaluation). A
      crash loses at most this much training; a run shorter than it writes a single
      checkpoint.
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
