"""Running an experiment's methods and keeping their results: one method's run with progress,
checkpoints and resume, and divergence handling (:func:`run_method`), a convergence study's
per-round curves of a metric of the state over several seeds (:func:`run_curves`), the output folder
(locked while a run writes it), ``results.json`` and the rendering of tables and figures
(:func:`finish`), and the small readers of a run's history (:func:`last`, :func:`status`,
:func:`bits_to_reach`, :func:`first_divergence`)."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from typing import Any, Callable, Sequence

import jax
import numpy as np

from fedjaxsparse.core import Algorithm, ParamsFn, global_params
from fedjaxsparse.errors import ConfigError
from fedjaxsparse.runtime import population
from fedjaxsparse.runtime.checkpoint import Checkpointing
from fedjaxsparse.runtime.population import CohortAlgorithm
from fedjaxsparse.harness.report import Table
from fedjaxsparse.runtime.runner import EvalFn, run
from fedjaxsparse.runtime.sharding import client_mesh
from fedjaxsparse.runtime.sweep import state_curves
from fedjaxsparse.harness.options import Config
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["standin_note", "finish", "Steps", "format_duration", "output_dir", "run_identity",
           "run_method", "run_curves", "first_divergence", "last", "status", "bits_to_reach", "save_results"]
__dir__ = _public_dir(__all__)


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
    print(f"[{self.desc} {self.count}/{self.total}] {what} done; {format_duration(spent)} so far, "
          f"about {format_duration(left)} left", file=sys.stderr, flush=True)


def format_duration(seconds: float) -> str:
  seconds = int(round(seconds))
  return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


def output_dir(cfg: Config, name: str) -> str:
  path = os.path.join(cfg.out, name)
  os.makedirs(path, exist_ok=True)
  return path


def run_identity(cfg: Config, experiment: str, run: str,
                 seed: int | None = None) -> tuple[str, dict]:
  """``(checkpoint folder, fingerprint)`` of one run of an experiment: the folder
  ``OUT/<experiment>/checkpoints/<run>`` and the settings a resumed run must share with the
  checkpoints it resumes — experiment, method, dataset, clients, seed (``cfg.seed`` unless
  given), data folder and the experiment options that change the computation."""
  folder = os.path.join(output_dir(cfg, experiment), "checkpoints", run.replace("/", "_"))
  return folder, {"experiment": experiment, "method": run, "dataset": cfg.dataset,
                  "clients": cfg.clients, "seed": cfg.seed if seed is None else seed,
                  "data_dir": cfg.data_dir,
                  **{f"--set {k}": v for k, v in cfg.fingerprint.items()}}


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
  ckpt, identity = run_identity(cfg, experiment, method)
  res = run(algo, key, params, train, test, num_rounds=cfg.rounds, eval_fn=eval_fn,
            eval_every=cfg.eval_every, chunk_size=chunk_size, params_fn=params_fn,
            checkpoint=Checkpointing(ckpt, interval_s=cfg.checkpoint_interval_s,
                                     resume=cfg.resume, overwrite=cfg.overwrite,
                                     fingerprint=identity),
            on_nonfinite="stop" if cfg.on_divergence == "skip" else "raise",
            progress=cfg.progress, desc=method, clients=cfg.execution,
            mesh=client_mesh() if jax.process_count() > 1 else None)
  return {"history": res.history.to_dict(), "wall_time_s": res.train_time_s,
          "diverged": res.diverged, "clients": res.clients,
          "final": {k: last(v) for k, v in res.history.evals.items()},
          "state": res.state}


def run_curves(cfg: Config, algo: Algorithm, params: Any, train: Any,
               metric: Callable[[Any], jax.Array], seeds: int) -> dict:
  """A convergence study's run of one method: ``metric(state)`` at initialisation and after
  every one of ``cfg.rounds`` rounds, for ``seeds`` runs keyed
  ``jax.random.split(jax.random.key(cfg.seed), seeds)`` — one compiled program, seeds vmapped
  and rounds scanned (:func:`fedjaxsparse.runtime.sweep.state_curves`).

  Returns the record ``{"curves": float64 [seeds, rounds + 1], "seeds", "rounds",
  "wall_time_s"}`` (compilation included). Such a run keeps no checkpoint: it is one program
  of a few seconds, and a resumed study runs it again."""
  keys = jax.random.split(jax.random.key(cfg.seed), seeds)
  start = time.perf_counter()
  curves = state_curves(algo, keys, params, train, cfg.rounds, metric)
  return {"curves": curves, "seeds": int(seeds), "rounds": int(cfg.rounds),
          "wall_time_s": time.perf_counter() - start}


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
