"""Paper protocols: what makes an experiment's numbers comparable with a paper's tables.

* **Validation split** (:func:`validation_split`): a fraction of every client's *training*
  examples, held out deterministically under a seed, on which every tuning decision is made;
  the test split is only used for reporting.
* **Random search** (:func:`two_stage_search`): the protocol of Meinhardt et al. (2024,
  arXiv:2405.20623, Appendices B-C), "first a suitable range for these parameters was
  identified, then in a second random search the best parameters in this range were taken":
  stage 1 samples a wide box, the best ``top_fraction`` of its candidates span the box of
  stage 2, and the best candidate of both stages wins. Candidates are scored by a
  caller-supplied batch function, so all candidates × repetitions of a stage can run as one
  vmapped program (:func:`fedjaxsparse.runtime.sweep.
  run_batched`); hyper-parameters that must stay static (local-step counts) are grouped by
  value by the caller.
* **Seeds** (:func:`mean_se`): every reported number is a mean ± standard error over S runs,
  the per-seed values kept.
* **Paper configurations** (:class:`PaperConfig`): one named configuration per paper table —
  data set, clients, budget, every option the protocol fixes, and the paper's own numbers —
  run with ``fedjaxsparse run EXP --paper NAME``. When the real data is absent it runs on a
  stand-in of the same shape (:func:`load_or_standin`), named as such in every output; the
  paper's numbers are printed beside ours (:func:`paper_table`).

Source for the team: seed 000 (`000:505`, `000:529`).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, NamedTuple, Sequence

import jax
import numpy as np

from fedjaxsparse.data.federated import FederatedData
from fedjaxsparse.errors import ConfigError
from fedjaxsparse.harness.report import Table
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["validation_split", "mean_se", "check_claim", "Dimension", "SearchResult", "sample",
           "two_stage_search", "PaperConfig", "load_or_standin", "paper_table"]
__dir__ = _public_dir(__all__)


def validation_split(data: FederatedData, fraction: float, seed: int
                     ) -> tuple[FederatedData, FederatedData]:
  """``(fit, validation)``: each client's real training examples split at random (under
  ``seed``) into a fitting part and ``round(fraction · n_i)`` validation examples; every client
  keeps at least one fitting example. Both parts keep the client axis (``[N, ...]``) and are
  padded to their own largest client; a client may hold no validation example.
  """
  if not 0.0 < fraction < 1.0:
    raise ConfigError(f"fraction must be in (0, 1), got {fraction}.")
  rng = np.random.default_rng(seed)
  x, y = np.asarray(data.x), np.asarray(data.y)
  counts = np.asarray(data.num_examples)
  fit_idx, val_idx = [], []
  for n in counts:
    perm = rng.permutation(int(n))
    n_val = min(int(round(fraction * n)), int(n) - 1)
    val_idx.append(np.sort(perm[:n_val]))
    fit_idx.append(np.sort(perm[n_val:]))
  return _gather(x, y, fit_idx), _gather(x, y, val_idx)


def _gather(x: np.ndarray, y: np.ndarray, rows: Sequence[np.ndarray]) -> FederatedData:
  n = len(rows)
  m = max(1, max(len(r) for r in rows))
  xs = np.zeros((n, m) + x.shape[2:], x.dtype)
  ys = np.zeros((n, m) + y.shape[2:], y.dtype)
  mask = np.zeros((n, m), np.float32)
  for i, r in enumerate(rows):
    xs[i, :len(r)], ys[i, :len(r)], mask[i, :len(r)] = x[i, r], y[i, r], 1.0
  # device_put, not jnp.asarray: the latter compiles a program per shape
  return FederatedData(*jax.device_put((xs, ys, mask,
                                        np.array([len(r) for r in rows], np.int32))))


def mean_se(values: Sequence[float] | np.ndarray, axis: int = 0) -> dict:
  """``{"mean", "se", "values"}`` over ``axis`` (the seeds): the standard error is the sample
  standard deviation (ddof = 1) over √S; ``None`` for a single seed (one run has no spread to
  estimate it from; tables print "—" with a footnote)."""
  v = np.asarray(values, np.float64)
  s = v.shape[axis]
  se = np.asarray(v.std(axis=axis, ddof=1) / math.sqrt(s)).tolist() if s > 1 else None
  return {"mean": v.mean(axis=axis).tolist(), "se": se, "values": v.tolist()}


def check_claim(claim: str, holds: bool | None) -> dict:
  """A paper's claim with the verdict of this run: ``{"claim", "holds", "text"}``, ``text``
  the line to print under the run's table — "the paper: <claim> — holds here", "does NOT hold
  here" or "not checked here" (``holds=None``: the run lacks what the claim needs)."""
  verdict = ("not checked here" if holds is None else "holds here" if holds
             else "does NOT hold here")
  return {"claim": claim, "holds": None if holds is None else bool(holds),
          "text": f"the paper: {claim} — {verdict}"}


class Dimension(NamedTuple):
  """One searched hyper-parameter: log-uniform on ``[low, high]``, rounded to an integer if
  ``integer``; or, with ``choices``, uniform over those values (``low``/``high`` ignored)."""
  low: float
  high: float
  integer: bool = False
  choices: tuple | None = None


class SearchResult(NamedTuple):
  """Attributes: ``best`` (``{name: value}``), ``best_score``, and per stage the candidates
  (``{name: [values]}``), their scores and the box searched (``{name: (low, high)}``)."""
  best: dict
  best_score: float
  stages: list


def sample(space: dict[str, Dimension], n: int, rng: np.random.Generator) -> dict:
  """``n`` log-uniform candidates ``{name: float64[n]}`` (integers rounded)."""
  out = {}
  for name, dim in space.items():
    if dim.choices:
      out[name] = np.asarray(dim.choices, np.float64)[rng.integers(0, len(dim.choices), n)]
      continue
    if not 0 < dim.low <= dim.high:
      raise ConfigError(f"search range of {name} must satisfy 0 < low <= high, got "
                        f"[{dim.low}, {dim.high}].")
    v = np.exp(rng.uniform(np.log(dim.low), np.log(dim.high), n))
    out[name] = np.round(v) if dim.integer else v
  return out


def two_stage_search(score: Callable[[dict], np.ndarray], space: dict[str, Dimension],
                     samples: Sequence[int], seed: int, top_fraction: float = 0.25
                     ) -> SearchResult:
  """The two-stage random search of Meinhardt et al. (2024), maximising ``score``.

  Args:
    score: ``{name: values[n]} -> float[n]``, the validation score of each candidate (e.g.
      the mean over repetitions of the final validation metric; NaN/inf count as -inf, so a
      diverged candidate never wins).
    space: the stage-1 box.
    samples: candidates per stage, e.g. ``(16, 16)``; one stage is a plain random search.
    seed: the search's seed.
    top_fraction: the best fraction of a stage's candidates whose range (per dimension, in
      log space; the values they use, for a choice) is the next stage's box.
  """
  rng = np.random.default_rng(seed)
  box = dict(space)
  stages, best, best_score = [], None, -np.inf
  for n in samples:
    cand = sample(box, n, rng)
    s = np.asarray(score(cand), np.float64)
    s = np.where(np.isfinite(s), s, -np.inf)
    stages.append({"candidates": {k: v.tolist() for k, v in cand.items()},
                   "scores": s.tolist(), "box": {k: (d.low, d.high) for k, d in box.items()}})
    i = int(np.argmax(s))
    if s[i] > best_score:
      best, best_score = {k: float(v[i]) for k, v in cand.items()}, float(s[i])
    top = np.argsort(-s, kind="stable")[:max(1, int(math.ceil(top_fraction * n)))]
    top = top[np.isfinite(s[top])]
    if top.size:
      box = {k: d._replace(low=float(cand[k][top].min()), high=float(cand[k][top].max()),
                           choices=d.choices and tuple(sorted(set(cand[k][top].tolist()))))
             for k, d in box.items()}
  if best is None:
    raise ConfigError("every candidate of the random search diverged; widen or lower the "
                      "search range.")
  return SearchResult(best, best_score, stages)


@dataclasses.dataclass(frozen=True)
class PaperConfig:
  """A paper table's protocol as data.

  Attributes:
    name: the ``--paper`` name, e.g. ``"table4"``.
    source: the paper's label, section and table (free text printed beside the results),
      e.g. ``"<paper> §4.2, Table 4 (FEMNIST)"``.
    dataset: the real data set's loader name, with ``data_kwargs``.
    standin: the loader name of a data set of the same shape, used when the real files are
      absent (``None``: the real data is required).
    clients, rounds, eval_every: the common settings (``rounds`` in the experiment's unit
      after ``options`` are applied, e.g. communication rounds with ``budget=communications``).
    options: the experiment options (``--set``) the protocol fixes.
    paper: the paper's numbers, ``{column: {method: value}}``, as printed in the paper.
    unit: how ``paper``'s values read, e.g. ``"% test accuracy"``, ``"Mbit uplink per
      client"``; ``ours`` is converted to it by :func:`paper_table`'s ``convert``.
    deviations: what still differs from the paper's protocol, and why.
    reduced: what this configuration runs smaller than the paper (a subset of the data, a
      shorter budget, fewer seeds), and why; ``""`` when it runs the paper's whole protocol.
      :attr:`scale_status` reads it; the reproduction ledger's words come from these
      properties, never typed beside them.
    missing: what of the paper's table or figure this configuration does not produce (a
      panel, the cited baselines' rows), and why; ``""`` when it produces all of it.
      :attr:`status` reads it.
  """
  name: str
  source: str
  dataset: str
  standin: str | None
  clients: int
  rounds: int
  eval_every: int
  options: dict
  paper: dict
  unit: str
  data_kwargs: dict = dataclasses.field(default_factory=dict)
  deviations: str = ""
  reduced: str = ""
  missing: str = ""

  @property
  def data_status(self) -> str:
    """``"real offline"``, ``"real with files"`` or ``"stand-in"``: what :attr:`dataset` is
    (:func:`fedjaxsparse.data.registry.data_status`)."""
    from fedjaxsparse.data.registry import data_status
    return data_status(self.dataset)

  @property
  def scale_status(self) -> str:
    """``"paper protocol"``, or ``"reduced"`` when :attr:`reduced` says what is smaller."""
    return "reduced" if self.reduced else "paper protocol"

  @property
  def status(self) -> str:
    """``"reproduced"`` (a command runs the whole protocol), or ``"partial"`` when
    :attr:`missing` names what it leaves out."""
    return "partial" if self.missing else "reproduced"

  def common(self) -> dict:
    """The :class:`fedjaxsparse.harness.options.Config` fields this configuration sets."""
    return {"dataset": self.dataset, "clients": self.clients, "rounds": self.rounds,
            "eval_every": self.eval_every}


def load_or_standin(paper: PaperConfig | None, dataset: str, data_dir: str | None,
                    load: Callable[[str], Any]) -> tuple[Any, str | None]:
  """``(data, stand-in note)``: ``load(dataset)``, or — for a paper configuration whose real
  files are absent and no ``data_dir`` was given — ``load(paper.standin)`` with a short note
  for labels, e.g. ``"stand-in for femnist"`` (``None`` when the real data ran). A ``data_dir``
  that lacks the files is an error, never silently replaced."""
  try:
    return load(dataset), None
  except FileNotFoundError as e:
    if paper is None or paper.standin is None or data_dir or dataset != paper.dataset:
      raise
    note = f"stand-in for {paper.dataset}"
    print(f"{paper.source}: {paper.dataset} files not found; running the stand-in "
          f"{paper.standin} (same shape; its numbers are not comparable with the paper's)."
          f"\n  To run on the real data: {str(e).splitlines()[0]}")
    return load(paper.standin), note


def paper_table(paper: PaperConfig, ours: dict, label: str,
                convert: Callable[[Any], Any] = lambda v: v, note: str | None = None) -> Table:
  """The paper's numbers beside ours as a :class:`~fedjaxsparse.harness.report.Table`: rows
  ``{"method", "ours COL", "paper COL", ...}`` for every method and column of
  ``paper.paper``; ``ours`` is ``{column: {method: value}}`` (missing: ``None``), converted
  to the paper's unit by ``convert``; titled with both sources, ``note`` below."""
  methods = list(dict.fromkeys(m for col in paper.paper.values() for m in col))
  rows = []
  for m in methods:
    row = {"method": m}
    for col, values in paper.paper.items():
      v = ours.get(col, {}).get(m)
      row[f"ours {col}"] = None if v is None else convert(v)
      row[f"paper {col}"] = values.get(m)
    rows.append(row)
  return Table(rows, title=f"\n{paper.unit}: ours ({label}) beside the paper ({paper.source}):",
               note=note)
