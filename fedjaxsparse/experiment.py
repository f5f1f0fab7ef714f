"""Experiment plumbing shared by the scripts in ``experiments/``: the common configuration,
running several methods on one dataset with progress and checkpoints, and writing results
(JSON plus a PNG plot) to the output directory.

An experiment module defines ``NAME``, ``DESCRIPTION``, ``DEFAULTS`` (a dict of
:class:`Config` overrides) and ``run(cfg: Config) -> dict`` (the results written to JSON).
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any

import jax
import numpy as np

from fedjaxsparse.core import Algorithm, ParamsFn, global_params
from fedjaxsparse.runner import EvalFn, run


@dataclasses.dataclass
class Config:
  """Options common to every experiment (the CLI flags).

  Attributes:
    rounds: communication rounds (or iterations, for iteration-level methods) per method.
    clients: number of clients.
    dataset: dataset name (see ``fedjaxsparse.data.load_dataset``).
    seed: run and partition seed.
    out: output directory; results go to ``out/<experiment>/``.
    resume: continue each method from its newest checkpoint.
    eval_every: evaluate every this many rounds.
    data_dir: directory with real dataset files (loaders that need them).
    progress: show progress bars.
    options: experiment-specific options (``--set key=value`` on the CLI).
  """
  rounds: int = 100
  clients: int = 20
  dataset: str = "digits"
  seed: int = 0
  out: str = "results"
  resume: bool = False
  eval_every: int = 10
  data_dir: str | None = None
  progress: bool = True
  options: dict = dataclasses.field(default_factory=dict)


def output_dir(cfg: Config, name: str) -> str:
  path = os.path.join(cfg.out, name)
  os.makedirs(path, exist_ok=True)
  return path


def run_method(cfg: Config, experiment: str, method: str, algo: Algorithm, params: Any,
               train: Any, test: Any, eval_fn: EvalFn | None, *, key: jax.Array | None = None,
               params_fn: ParamsFn = global_params, chunk_size: int | None = None) -> dict:
  """Run one method with progress bar and checkpoints; return its JSON-ready record."""
  key = jax.random.key(cfg.seed) if key is None else key
  ckpt = os.path.join(output_dir(cfg, experiment), "checkpoints", method)
  start = time.perf_counter()
  res = run(algo, key, params, train, test, num_rounds=cfg.rounds, eval_fn=eval_fn,
            eval_every=cfg.eval_every, chunk_size=chunk_size, params_fn=params_fn,
            checkpoint_dir=ckpt, resume=cfg.resume, progress=cfg.progress, desc=method)
  return {"history": res.history.to_dict(), "wall_time_s": time.perf_counter() - start,
          "final": {k: v[-1] for k, v in res.history.evals.items()},
          "state": res.state}


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
  clean = {**results, "config": dataclasses.asdict(cfg), "jax_backend": jax.default_backend(),
           "methods": {m: {k: v for k, v in r.items() if k != "state"}
                       for m, r in results["methods"].items()}}

  def default(o):
    if isinstance(o, (np.generic, np.ndarray)):
      return o.tolist()
    raise TypeError(f"not JSON-serialisable: {type(o)}")

  with open(path, "w") as f:
    json.dump(clean, f, indent=1, default=default)
  return path


def print_table(rows: list[dict], columns: list[str]) -> str:
  """A plain-text table of ``rows`` (dicts) with the given ``columns``; returns and prints it."""
  def fmt(v):
    if v is None:
      return "x"
    if isinstance(v, float):
      return f"{v:.4g}"
    return str(v)

  cells = [[fmt(r.get(c)) for c in columns] for r in rows]
  widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
  lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)),
           "  ".join("-" * w for w in widths)]
  lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
  text = "\n".join(lines)
  print(text)
  return text

