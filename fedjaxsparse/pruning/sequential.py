"""Block-sequential calibration and pruning of a decoder:

1. the calibration windows are embedded once, ``h [N, T, H]``;
2. for block ℓ = 0, 1, …: one dense forward of block ℓ over ``h`` accumulates, for each of its
   linear layers, the streaming :class:`~fedjaxsparse.pruning.calibration.CalibStats` of its inputs (and
   their Gram matrix ``XᵀX`` when the layer is at most ``gram_limit`` wide, for the
   reconstruction error); every linear layer of the block is then scored, masked (and refined by
   DSnoT) in **one jitted program**; ``h`` is pushed through the *pruned* block, so block ℓ+1
   is calibrated on what the pruned model really feeds it.

Only one block's parameters are on the accelerator at a time; the rest stay in host memory (or
on disk, with :class:`fedjaxsparse.models.hf.Checkpoint`), so a model larger than the accelerator can be
pruned. :func:`perplexity` evaluates the same way, block by block.

A *source* is anything with ``config``, ``outer()`` and ``block(i)`` (host parameters): a
:class:`~fedjaxsparse.models.hf.Checkpoint` or a :class:`ParamsSource`.

Source for the team: seed 001, ch. 6; spec ``seed001_ch4_ch6.md`` §B.3 — what Wanda's and RIA's code
do, which the paper inherits.
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from fedjaxsparse.pruning import calibration, dsnot, posttrain
from fedjaxsparse.models import transformer as T
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["ParamsSource", "LayerReport", "kernels", "prune_block", "prune", "perplexity",
           "logits_fn"]
__dir__ = _public_dir(__all__)


class ParamsSource:
  """A model held in memory: ``params`` with ``layers_{i}`` blocks (numpy or jax arrays)."""

  def __init__(self, config: T.TransformerConfig, params: dict[str, Any]):
    self.config, self.params = config, params

  def outer(self) -> dict[str, Any]:
    return {k: v for k, v in self.params.items() if not k.startswith("layers_")}

  def block(self, i: int) -> dict[str, Any]:
    return self.params[f"layers_{i}"]


class LayerReport(NamedTuple):
  """One linear layer after pruning: ``sparsity`` (zero fraction of its kernel),
  ``recon_error`` ``‖X(W−W̃)‖²_F/‖XW‖²_F`` on the calibration inputs (None above
  ``gram_limit``)."""
  sparsity: float
  recon_error: float | None


@functools.lru_cache(maxsize=None)
def _fns(cfg: T.TransformerConfig):
  model, block = T.Decoder(cfg), T.Block(cfg)
  embed = jax.jit(lambda p, ids: model.apply({"params": p}, ids, method="embed"))
  head = jax.jit(lambda p, h: model.apply({"params": p}, h, method="head"))
  fwd = jax.jit(lambda p, h: block.apply({"params": p}, h))

  @functools.partial(jax.jit, static_argnums=3)
  def calib(p, h, acc, gram_limit):
    _, col = block.apply({"params": p}, h, mutable=["calib"])
    out = {}
    for path, (x,) in _linear_inputs(col["calib"]).items():
      st, g = acc[path]
      xf = x.reshape(-1, x.shape[-1]).astype(jnp.float32)
      out[path] = (calibration.update_stats(st, xf),
                   None if g is None else g + xf.T @ xf)
    return out

  return embed, head, fwd, calib


def _linear_inputs(col: dict[str, Any], prefix: str = "") -> dict[str, tuple]:
  out = {}
  for k, v in col.items():
    if k == "inputs":
      out[prefix[:-1]] = v
    else:
      out.update(_linear_inputs(v, prefix + k + "/"))
  return out


def kernels(p: dict[str, Any], prefix: str = "") -> dict[str, Any]:
  """The ``kernel`` leaves of a nested flax parameter dict by their layer paths,
  ``{"block/Dense_0": kernel}`` (the matrices a block-wise pruner scores)."""
  out = {}
  for k, v in p.items():
    if isinstance(v, dict):
      out.update(kernels(v, prefix + k + "/"))
    elif k == "kernel":
      out[prefix[:-1]] = v
  return out


@functools.partial(jax.jit, static_argnames=("score_fn", "sparsity", "nm", "group", "refine"))
def prune_block(params: dict[str, Any], stats: dict[str, calibration.CalibStats],
                key: jax.Array, *, score_fn, sparsity=None, nm=None, group="per_output",
                refine: dsnot.DSnoTConfig | None = None):
  """Every linear kernel of one block scored, masked and refined in one XLA program:
  :func:`posttrain.prune_params` under ``jit``."""
  return posttrain.prune_params(params, score_fn, sparsity=sparsity, nm=nm, group=group,
                                stats=stats, key=key, refine=refine)


def _batches(x: np.ndarray, batch_size: int):
  return [x[s:s + batch_size] for s in range(0, len(x), batch_size)]


def prune(source, calib_ids: np.ndarray, score_fn, *, sparsity: float | None = None,
          nm: tuple[int, int] | None = None, group: str = "per_output",
          refine: dsnot.DSnoTConfig | None = None, key: jax.Array | None = None,
          batch_size: int = 8, gram_limit: int = 4096, progress: bool = False
          ) -> tuple[ParamsSource, dict[str, LayerReport]]:
  """Prunes every linear layer of every block of ``source`` with ``score_fn``
  (:func:`fedjaxsparse.pruning.scores.by_name`), block-sequentially on ``calib_ids [N, T]``. Returns the
  pruned model (host numpy) and ``{"layers_{i}/<linear>": LayerReport}``."""
  cfg = source.config
  key = jax.random.key(0) if key is None else key
  embed, _, fwd, calib = _fns(cfg)
  outer = source.outer()
  h = [embed(outer, jnp.asarray(b)) for b in _batches(np.asarray(calib_ids), batch_size)]
  pruned = {k: np.asarray(v) if not isinstance(v, dict) else jax.tree.map(np.asarray, v)
            for k, v in outer.items()}
  report: dict[str, LayerReport] = {}
  blocks = range(cfg.num_layers)
  if progress:
    blocks = tqdm(blocks, desc="prune blocks", unit="block")
  for i in blocks:
    p = jax.device_put(source.block(i))
    block_kernels = kernels(p)
    acc = {path: (calibration.init_stats(w.shape[0]),
                  jnp.zeros((w.shape[0],) * 2, jnp.float32) if w.shape[0] <= gram_limit
                  else None) for path, w in block_kernels.items()}
    for hb in h:
      acc = calib(p, hb, acc, gram_limit)
    stats = {path: st for path, (st, _) in acc.items()}
    new, masks = prune_block(p, stats, jax.random.fold_in(key, i), score_fn=score_fn,
                             sparsity=sparsity, nm=nm, group=group, refine=refine)
    new_k, mask_k = kernels(new), kernels(masks)
    for path, w in block_kernels.items():
      _, g = acc[path]
      err = None
      if g is not None:
        d = w - new_k[path]
        err = float(jnp.sum((g @ d) * d) / jnp.maximum(jnp.sum((g @ w) * w), 1e-30))
      report[f"layers_{i}/{path}"] = LayerReport(float(1.0 - jnp.mean(mask_k[path])), err)
    h = [fwd(new, hb) for hb in h]
    pruned[f"layers_{i}"] = jax.tree.map(np.asarray, new)
  return ParamsSource(cfg, pruned), report


def perplexity(source, windows: np.ndarray, batch_size: int = 8) -> float:
  """:func:`fedjaxsparse.pruning.lm.perplexity`'s quantity, computed block by block (one block on the
  accelerator at a time)."""
  cfg = source.config
  embed, head, fwd, _ = _fns(cfg)
  outer = jax.device_put(source.outer())
  h = [embed(outer, jnp.asarray(b)) for b in _batches(windows, batch_size)]
  for i in range(cfg.num_layers):
    p = jax.device_put(source.block(i))
    h = [fwd(p, hb) for hb in h]
  total = 0.0
  for hb, ids in zip(h, _batches(windows, batch_size)):
    total += float(T.next_token_loss(head(outer, hb), jnp.asarray(ids))) * len(ids)
  return float(np.exp(total / len(windows)))


def logits_fn(source):
  """``ids [B, T] -> logits`` of a source held in memory (for :func:`lm.perplexity`)."""
  params = {k: v for k, v in source.outer().items()}
  for i in range(source.config.num_layers):
    params[f"layers_{i}"] = source.block(i)
  model = T.Decoder(source.config)
  return jax.jit(lambda ids: model.apply({"params": params}, ids))

