"""Paper protocols: what makes an experiment's numbers comparable with a paper's tables.

* **Validation split** (:func:`validation_split`): a fraction of every client's *training*
  examples, held out deterministically under a seed, on which every tuning decision is made;
  the test split is only used for reporting.
* **Random search** (:func:`two_stage_search`): seed 000's protocol, "first a suitable range
  for these parameters was identified, then in a second random search the best parameters in
  this range were taken" (`000:505`, `000:529`): stage 1 samples a wide box, the best
  ``top_fraction`` of its candidates span the box of stage 2, and the best candidate of both
  stages wins. Candidates are scored by a caller-supplied batch function, so all candidates ×
  repetitions of a stage can run as one vmapped program (:func:`fedjaxsparse.sweep.
  run_batched`); hyper-parameters that must stay static (local-step counts) are grouped by
  value by the caller.
* **Seeds** (:func:`mean_se`): every reported number is a mean ± standard error over S runs,
  the per-seed values kept.
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple, Sequence

import jax.numpy as jnp
import numpy as np

from fedjaxsparse.data.federated import FederatedData
from fedjaxsparse.errors import ConfigError


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
  return FederatedData(jnp.asarray(xs), jnp.asarray(ys), jnp.asarray(mask),
                       jnp.asarray(np.array([len(r) for r in rows], np.int32)))


def mean_se(values: Sequence[float] | np.ndarray, axis: int = 0) -> dict:
  """``{"mean", "se", "values"}`` over ``axis`` (the seeds): the standard error is the sample
  standard deviation (ddof = 1) over √S; 0 for a single seed."""
  v = np.asarray(values, np.float64)
  s = v.shape[axis]
  se = v.std(axis=axis, ddof=1) / math.sqrt(s) if s > 1 else np.zeros_like(v.mean(axis))
  return {"mean": v.mean(axis=axis).tolist(), "se": np.asarray(se).tolist(),
          "values": v.tolist()}


class Dimension(NamedTuple):
  """One searched hyper-parameter: log-uniform on ``[low, high]``, rounded to an integer if
  ``integer``."""
  low: float
  high: float
  integer: bool = False


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
    if not 0 < dim.low <= dim.high:
      raise ConfigError(f"search range of {name} must satisfy 0 < low <= high, got "
                        f"[{dim.low}, {dim.high}].")
    v = np.exp(rng.uniform(np.log(dim.low), np.log(dim.high), n))
    out[name] = np.round(v) if dim.integer else v
  return out


def two_stage_search(score: Callable[[dict], np.ndarray], space: dict[str, Dimension],
                     samples: Sequence[int], seed: int, top_fraction: float = 0.25
                     ) -> SearchResult:
  """Seed 000's two-stage random search, maximising ``score``.

  Args:
    score: ``{name: values[n]} -> float[n]``, the validation score of each candidate (e.g.
      the mean over repetitions of the final validation metric; NaN/inf count as -inf, so a
      diverged candidate never wins).
    space: the stage-1 box.
    samples: candidates per stage, e.g. ``(16, 16)``; one stage is a plain random search.
    seed: the search's seed.
    top_fraction: the best fraction of a stage's candidates whose range (per dimension, in
      log space) is the next stage's box.
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
      box = {k: Dimension(float(cand[k][top].min()), float(cand[k][top].max()), d.integer)
             for k, d in box.items()}
  if best is None:
    raise ConfigError("every candidate of the random search diverged; widen or lower the "
                      "search range.")
  return SearchResult(best, best_score, stages)
