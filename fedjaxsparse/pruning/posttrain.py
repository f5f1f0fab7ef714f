"""Scores to masks, and masks to a pruned model: one-shot, training-free ``W ↦ W⊙M`` for every dense
kernel ``W[b, c]`` (flax's ``(in, out)`` layout) of a parameter pytree.

* **Unstructured** at sparsity ε with exact counts in a comparison group (SymWanda, Yi and
  Richtárik 2025, never states it): ``"per_output"`` (the peers' default — Wanda's and RIA's
  code rank within each output neuron: ``⌊ε·b⌋`` pruned per column), ``"per_input"``
  (``⌊ε·c⌋`` per row) or ``"per_layer"`` (``⌊ε·b·c⌋``). Ties prune the lower index first (a
  stable sort).
* **N:M** (2:4, 4:8; "plain N:M without channel permutation", in the words of Kai Yi's
  dissertation): in every group of M consecutive *inputs* of each output neuron, the N of
  largest score survive.

:func:`prune_params` applies a score to every 2-D ``kernel`` leaf (by path), with per-layer
calibration statistics (``{path: CalibStats}``, or ``{path: x_norm}``) and a per-leaf key
(``fold_in`` of its index) for the stochastic scores, so masks are deterministic under the key;
``refine=`` a :class:`~fedjaxsparse.pruning.dsnot.DSnoTConfig` then refines every unstructured mask with
DSnoT / R²-DSnoT (which needs the full :class:`~fedjaxsparse.pruning.calibration.CalibStats`).

:func:`prune_model` calibrates and prunes any flax model in one call (layer-sequentially, via
``flax.linen.intercept_methods``); :func:`one_shot` tabulates a trained federated model's
metrics after one-shot pruning, calibrated on the clients' data (:func:`client_batches`).

Source for the team: seed 001, ch. 6, l. 1838 (N:M); spec ``seed001_ch4_ch6.md`` §B.3, §0.2.14
(group).
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import flax.linen as nn

from fedjaxsparse.pruning import dsnot
from fedjaxsparse.pruning.calibration import CalibStats
from fedjaxsparse.pruning.calibration import init_stats, update_stats
from fedjaxsparse.pruning.scores import by_name
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["unstructured_mask", "nm_mask", "layer_mask", "prune_params", "calibrate", "prune_model",
           "client_batches", "one_shot"]
__dir__ = _public_dir(__all__)

GROUPS = ("per_output", "per_input", "per_layer")
ScoreFn = Callable[[jax.Array, Any, jax.Array], jax.Array]  # (W, x_norm | None, key) -> S


@functools.partial(jax.jit, static_argnums=(1, 2))   # one program, not one per eager op
def _keep_largest(score: jax.Array, prune: int, axis: int) -> jax.Array:
  """``bool`` mask keeping all but the ``prune`` smallest entries along ``axis``."""
  order = jnp.argsort(score, axis=axis, stable=True)
  shape = [1] * score.ndim
  shape[axis] = score.shape[axis]
  keep = jnp.broadcast_to((jnp.arange(score.shape[axis]) >= prune).reshape(shape), score.shape)
  return jnp.put_along_axis(jnp.zeros(score.shape, bool), order, keep, axis=axis, inplace=False)


def unstructured_mask(score: jax.Array, sparsity: float, group: str = "per_output"
                      ) -> jax.Array:
  """``bool[b, c]``: prune ``⌊sparsity·n⌋`` lowest-score entries per group of n entries."""
  if not 0.0 <= sparsity < 1.0:
    raise ValueError(f"sparsity must lie in [0, 1), got {sparsity!r}.")
  b, c = score.shape
  if group == "per_output":
    return _keep_largest(score, int(sparsity * b), axis=0)
  if group == "per_input":
    return _keep_largest(score, int(sparsity * c), axis=1)
  if group == "per_layer":
    return _keep_largest(score.reshape(-1), int(sparsity * b * c), axis=0).reshape(b, c)
  raise ValueError(f"group must be one of {GROUPS}, got {group!r}.")


def nm_mask(score: jax.Array, n: int, m: int) -> jax.Array:
  """``bool[b, c]``: N:M along the inputs — in every block of ``m`` consecutive inputs of each
  output, the ``n`` largest scores survive (exactly n per block)."""
  b, c = score.shape
  if not (isinstance(n, int) and isinstance(m, int) and 0 < n <= m):
    raise ValueError(f"N:M needs ints 0 < n <= m, got {n}:{m}.")
  if b % m:
    raise ValueError(f"N:M needs the input size {b} divisible by m={m}.")
  return _keep_largest(score.reshape(b // m, m, c), m - n, axis=1).reshape(b, c)


def layer_mask(w: jax.Array, score_fn: ScoreFn, key: jax.Array, stats: Any = None, *,
               sparsity: float | None = None, nm: tuple[int, int] | None = None,
               group: str = "per_output", refine: dsnot.DSnoTConfig | None = None
               ) -> jax.Array:
  """``bool[b, c]``: the mask of one kernel ``w [b, c]`` (``stats``: its inputs'
  :class:`CalibStats`, an ``x_norm [b]``, or None)."""
  x_norm = stats.x_norm if isinstance(stats, CalibStats) else stats
  s = score_fn(w, x_norm, key)
  m = unstructured_mask(s, sparsity, group) if nm is None else nm_mask(s, *nm)
  if refine is not None:
    if not isinstance(stats, CalibStats) or nm is not None or group != "per_output":
      raise ValueError("refine (DSnoT) needs CalibStats and unstructured per_output masks.")
    m = dsnot.refine(w, m, stats, refine)[0]
  return m


def prune_params(params: Any, score_fn: ScoreFn, *, sparsity: float | None = None,
                 nm: tuple[int, int] | None = None, group: str = "per_output",
                 stats: dict[str, Any] | None = None, key: jax.Array | None = None,
                 refine: dsnot.DSnoTConfig | None = None, only: Any = None
                 ) -> tuple[Any, Any]:
  """``(pruned params, masks)``: every 2-D leaf named ``kernel`` masked by :func:`layer_mask`
  with ``stats.get(path)`` and ``fold_in(key, leaf index)``; other leaves untouched (mask all
  True). ``path`` is the leaf's ``"/"``-joined key path without ``/kernel`` (e.g.
  ``"Dense_0"``); ``only``: a set of paths to prune (None: all)."""
  if (sparsity is None) == (nm is None):
    raise ValueError("give exactly one of sparsity (unstructured) or nm=(n, m).")
  key = jax.random.key(0) if key is None else key
  stats = stats or {}
  flat, tree = jax.tree_util.tree_flatten_with_path(params)
  pruned, masks = [], []
  for i, (path, w) in enumerate(flat):
    names = [str(getattr(k, "key", getattr(k, "name", k))) for k in path]
    if names[-1] != "kernel" or w.ndim != 2 or (
        only is not None and "/".join(names[:-1]) not in only):
      pruned.append(w)
      masks.append(jnp.ones(w.shape, bool))
      continue
    path = "/".join(names[:-1])
    skip = refine is not None and any(n in refine.skip for n in names[:-1])
    m = layer_mask(w, score_fn, jax.random.fold_in(key, i), stats.get(path),
                   sparsity=sparsity, nm=nm, group=group, refine=None if skip else refine)
    pruned.append(jnp.where(m, w, jnp.zeros_like(w)))
    masks.append(m)
  return jax.tree.unflatten(tree, pruned), jax.tree.unflatten(tree, masks)


@functools.partial(jax.jit, static_argnums=0)
def _captured_inputs(apply_fn: Callable, params: Any, x: jax.Array) -> dict[str, jax.Array]:
  """``{path: input}`` of every flax module call whose parameters hold a 2-D ``kernel``
  (``nn.Dense`` and the like), in call order, via ``flax.linen.intercept_methods``."""
  seen: dict[str, jax.Array] = {}

  def interceptor(next_fun, args, kwargs, context):
    if context.method_name == "__call__" and args:
      names = "/".join(str(n) for n in context.module.path)
      node = params
      for n in context.module.path:
        node = node.get(n, {}) if isinstance(node, dict) else {}
      k = node.get("kernel") if isinstance(node, dict) else None
      if k is not None and getattr(k, "ndim", 0) == 2:
        seen.setdefault(names, args[0])
    return next_fun(*args, **kwargs)

  with nn.intercept_methods(interceptor):
    apply_fn(params, x)
  return seen


def calibrate(apply_fn: Callable, params: Any, batches) -> dict[str, CalibStats]:
  """``{path: CalibStats}`` of the inputs of every dense layer of a flax model
  (``apply_fn(params, x)``, e.g. ``Model.apply``) over the calibration ``batches``."""
  stats: dict[str, CalibStats] = {}
  for x in batches:
    for path, inp in _captured_inputs(apply_fn, params, jnp.asarray(x)).items():
      st = stats.get(path) or init_stats(inp.shape[-1])
      stats[path] = update_stats(st, inp)
  return stats


def prune_model(apply_fn: Callable, params: Any, batches, score_fn: ScoreFn, *,
                sparsity: float | None = None, nm: tuple[int, int] | None = None,
                group: str = "per_output", refine: dsnot.DSnoTConfig | None = None,
                sequential: bool = True, key: jax.Array | None = None) -> tuple[Any, Any]:
  """One call: calibrate and prune every dense layer of a trained flax model (a federated
  global model, say) — ``(pruned params, masks)``. ``sequential=True`` prunes layer by layer in
  call order, each calibrated on the outputs of the already-pruned layers before it (as Wanda
  and RIA do per block); ``False`` takes every layer's statistics from the dense model.
  ``batches``: an iterable of input arrays (kept as a list). Kernels that are not 2-D (convs)
  are left dense."""
  batches = list(batches)
  key = jax.random.key(0) if key is None else key
  kw = dict(sparsity=sparsity, nm=nm, group=group, refine=refine, key=key)
  stats = calibrate(apply_fn, params, batches)
  if not sequential:
    return prune_params(params, score_fn, stats=stats, **kw)
  masks = jax.tree.map(lambda w: jnp.ones(w.shape, bool), params)
  for path in list(stats):  # call order
    st = calibrate(apply_fn, params, batches)[path]
    params, m = prune_params(params, score_fn, stats={path: st}, only={path}, **kw)
    masks = jax.tree.map(jnp.logical_and, masks, m)
  return params, masks


def client_batches(data: Any, per_client: int | None = None) -> list[jax.Array]:
  """Each client's real inputs (the first ``per_client``, or all), one batch per client, from
  :class:`~fedjaxsparse.data.federated.FederatedData`. The statistics are sums, so the
  server's :func:`calibrate` over these equals the sum of per-client statistics each client
  could compute and send (one extra round per layer for ``sequential`` pruning)."""
  counts = np.asarray(data.num_examples)
  take = counts if per_client is None else np.minimum(counts, per_client)
  x = np.asarray(data.x)   # sliced on the host: slicing the device array eagerly compiles a
  return [jnp.asarray(x[i, :int(n)]) for i, n in enumerate(take) if n > 0]   # program a size


def one_shot(apply_fn: Callable, params: Any, batches, evaluate: Callable[[Any], dict],
             sparsities, score_names=("magnitude", "wanda", "ria"), **kw) -> list[dict]:
  """Rows ``{"score", "sparsity", **evaluate(pruned params)}``: a trained (e.g. federated
  global) model pruned one-shot by :func:`prune_model` with each named score
  (:func:`fedjaxsparse.pruning.scores.by_name` defaults) at each sparsity."""
  batches = list(batches)
  rows = [{"score": "dense", "sparsity": 0.0,
           **{k: float(v) for k, v in evaluate(params).items()}}]
  for name in score_names:
    for s in sparsities:
      pruned, _ = prune_model(apply_fn, params, batches, by_name(name), sparsity=s, **kw)
      rows.append({"score": name, "sparsity": float(s),
                   **{k: float(v) for k, v in evaluate(pruned).items()}})
  return rows
