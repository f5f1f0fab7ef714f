"""Post-training pruning of every linear layer of a small LLaMA-style LM: the library's
one-XLA-program-per-block pruning (``fedjaxsparse.pruning.sequential.prune_block``) against a plain
per-layer Python/numpy implementation of the same mathematics, in the same process, from the
same random weights and the same calibration statistics.

Model: ``TransformerConfig(hidden_size=--hidden, intermediate_size=--intermediate,
num_layers=--layers, num_heads=--heads, num_kv_heads=--kv-heads)`` (LLaMA: seven linear layers
a block, q/k/v/o and gate/up/down), random ``normal(0.02)`` kernels (``transformer.init``).
Calibration: for every linear layer of every block, ``--tokens`` random activations of its input
width with non-zero per-channel means and unequal scales (``x = z·s + μ``, ``z ~ N(0, 1)``,
``s ~ U(0.2, 3)``, ``μ ~ N(0, --mean-scale²)``), accumulated with ``calibration.update_stats``.
DSnoT acts on the neurons whose mean error ``|Σ_pruned W μ|`` exceeds 0.1: with ``normal(0.02)``
kernels and unit-scale means only a minority do (raise ``--mean-scale`` for more swaps).

Methods (unstructured, ``--sparsity`` per output neuron — ``posttrain.unstructured_mask``'s
``group="per_output"``): ``magnitude``, ``wanda`` (α = 1), ``ria`` (α = 0.5) — scores and masks
only — and ``wanda+dsnot``: the Wanda mask refined by DSnoT with ``dsnot.dsnot(skip=())``
(every layer; 50 cycles, threshold 0.1, variance power 1, α = 1).

* ``library``: ``sequential.prune_block`` per block (``scores.by_name(method)``; ``refine=``
  the DSnoT config), compiled ahead with ``prune_block.lower(...).compile()`` (``compile s``;
  one program serves every block, their shapes being equal), one warm-up pass over the blocks,
  then the median of ``--repeats`` passes, each ending with ``jax.block_until_ready``.
* ``numpy``: for each block and each linear layer, the score in float32 numpy (the library's
  operations in its order), ``np.argsort(kind="stable")`` per output neuron pruning the
  ``⌊sparsity·b⌋`` lowest, and DSnoT as a Python loop over output neurons, each cycling on its
  own until it stops (float64, the rules of ``tests/test_dsnot.py``'s ``_numpy_reference``; the
  neurons are independent when relative importance is off). Median of ``--numpy-repeats``.

``speed-up`` is numpy seconds over library seconds. ``differing`` counts mask entries on which
the two disagree over all pruned kernels: the scores are the same float32 arithmetic, so
magnitude / Wanda / RIA should agree exactly (a disagreement needs two scores of one neuron
within rounding of each other at the pruning boundary); DSnoT's choices run in float32 in the
library and float64 here, so a near-tie or an error near the threshold can take a neuron down
another path (``differing fraction``). ``dsnot changed`` counts the entries DSnoT moved relative
to the Wanda mask (library), ``numpy swaps`` the swaps the reference made (two entries each: a
swap only touches entries no earlier swap moved), to show the refinement does something.

Usage: python benchmarks/bench_posttrain.py [--hidden 128] [--intermediate 352] [--layers 4]
       [--heads 4] [--kv-heads 2] [--sparsity 0.5] [--tokens 512] [--mean-scale 1]
       [--methods magnitude wanda ria wanda+dsnot] [--repeats 3]
       [--numpy-repeats 1] [--tiny] [--out benchmarks/results]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import fedjaxsparse as fjs

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_io  # noqa: E402  (the benchmarks' shared result writer)

calibration = fjs.pruning.calibration
dsnot = fjs.pruning.dsnot
scores = fjs.pruning.scores
sequential = fjs.pruning.sequential
transformer = fjs.models.transformer

METHODS = ("magnitude", "wanda", "ria", "wanda+dsnot")


# --- inputs ---------------------------------------------------------------------------------

def make_model(args) -> tuple[transformer.TransformerConfig, list[dict], list[dict]]:
  """(config, [block params on the device], [{path: CalibStats}] per block)."""
  cfg = transformer.TransformerConfig(hidden_size=args.hidden,
                                      intermediate_size=args.intermediate,
                                      num_layers=args.layers, num_heads=args.heads,
                                      num_kv_heads=args.kv_heads)
  params = transformer.init(cfg, jax.random.key(args.seed))
  rng = np.random.default_rng(args.seed)
  blocks, stats = [], []
  for i in range(cfg.num_layers):
    p = jax.device_put(transformer.block_params(params, i))
    st = {}
    for path, w in sequential.kernels(p).items():
      b = w.shape[0]
      mu = args.mean_scale * rng.normal(size=b)
      x = rng.normal(size=(args.tokens, b)) * rng.uniform(0.2, 3.0, b) + mu
      st[path] = calibration.update_stats(calibration.init_stats(b), jnp.asarray(x, jnp.float32))
    blocks.append(p)
    stats.append(jax.block_until_ready(st))
  return cfg, blocks, stats


def split(method: str) -> tuple[str, dsnot.DSnoTConfig | None]:
  """(score name, DSnoT config or None)."""
  return ("wanda", dsnot.dsnot(skip=())) if method == "wanda+dsnot" else (method, None)


# --- the library ----------------------------------------------------------------------------

def run_library(method, blocks, stats, sparsity, repeats):
  """(median seconds of a pass over all blocks, compile seconds, [{path: bool mask}])."""
  name, refine = split(method)
  score_fn = scores.by_name(name)  # one object: prune_block's static argument, one compile
  keys = [jax.random.fold_in(jax.random.key(0), i) for i in range(len(blocks))]
  kw = dict(score_fn=score_fn, sparsity=sparsity, refine=refine)
  t = time.perf_counter()
  sequential.prune_block.lower(blocks[0], stats[0], keys[0], **kw).compile()  # fills jit's cache
  compile_s = time.perf_counter() - t

  def one_pass():
    return jax.block_until_ready([sequential.prune_block(p, st, k, **kw)
                                  for p, st, k in zip(blocks, stats, keys)])

  outs = one_pass()  # warm-up
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    one_pass()
    times.append(time.perf_counter() - t)
  masks = [{path: np.asarray(m) for path, m in sequential.kernels(masks).items()}
           for _, masks in outs]
  return statistics.median(times), compile_s, masks


# --- the numpy reference --------------------------------------------------------------------

def np_score(name: str, w: np.ndarray, x_norm: np.ndarray) -> np.ndarray:
  """``scores.by_name(name)`` (default α) in float32 numpy, operations in the library's order."""
  a = np.abs(w)
  if name == "magnitude":
    return a
  if name == "wanda":
    return a * (x_norm ** np.float32(1.0))[:, None]
  if name == "ria":
    rows, cols = a.sum(1), a.sum(0)
    one, zero = np.float32(1), np.float32(0)
    ir = np.where(rows == 0, zero, one / np.where(rows == 0, one, rows))
    ic = np.where(cols == 0, zero, one / np.where(cols == 0, one, cols))
    return a * (ir[:, None] + ic[None, :]) * (x_norm ** np.float32(0.5))[:, None]
  raise ValueError(name)


def np_mask(score: np.ndarray, sparsity: float) -> np.ndarray:
  """Per output neuron (column), prune the ``⌊sparsity·b⌋`` lowest scores (stable sort)."""
  b, c = score.shape
  order = np.argsort(score, axis=0, kind="stable")
  mask = np.ones((b, c), bool)
  np.put_along_axis(mask, order[:int(sparsity * b)], False, axis=0)
  return mask


def np_dsnot(w: np.ndarray, m0: np.ndarray, st: calibration.CalibStats, cfg: dsnot.DSnoTConfig
             ) -> tuple[np.ndarray, int]:
  """(refined mask, swaps made): DSnoT, one output neuron at a time, one swap per cycle
  (``tests/test_dsnot.py``)."""
  if cfg.grow_relative or cfg.prune_relative or cfg.gamma_grow or cfg.gamma_prune \
      or cfg.accept != "threshold":
    raise NotImplementedError("the numpy reference implements plain DSnoT only")
  w = np.asarray(w, np.float64)
  sumsq, total = np.asarray(st.sumsq, np.float64), np.asarray(st.total, np.float64)
  count = max(float(st.count), 1.0)
  mu = total / count
  var = np.maximum(sumsq / count - mu ** 2, 0.0)
  inv_var = 1.0 / np.maximum(var, 1e-12 * var.max() + 1e-30) ** cfg.variance_power
  act = np.sqrt(sumsq) ** cfg.alpha
  m, swaps = m0.copy(), 0
  for q in range(w.shape[1]):
    wq, m0q, mq = w[:, q], m0[:, q], m[:, q]  # mq: a view into m
    e = np.sum(np.where(m0q, 0.0, wq) * mu)
    grow_base, prune_base, delta = wq * mu * inv_var, np.abs(wq) * act, wq * mu
    for _ in range(cfg.max_cycles):
      if abs(e) * cfg.error_scale <= cfg.update_threshold:
        break
      s = np.sign(e)
      grow_ok = ~mq & ~m0q
      prune_ok = mq & m0q & (s * delta < 0)
      if not (grow_ok.any() and prune_ok.any()):
        break
      i = int(np.argmax(np.where(grow_ok, s * grow_base, -np.inf)))
      j = int(np.argmin(np.where(prune_ok, prune_base, np.inf)))
      mq[i], mq[j] = True, False
      e += wq[j] * mu[j] - wq[i] * mu[i]
      swaps += 1
  return m, swaps


def run_numpy(method, blocks_np, stats, sparsity, repeats):
  """(median seconds of a pass over all blocks, [{path: bool mask}], DSnoT swaps)."""
  name, refine = split(method)
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    masks, swaps = [], 0
    for kernels, st in zip(blocks_np, stats):
      out = {}
      for path, w in kernels.items():
        x_norm = np.sqrt(np.asarray(st[path].sumsq, np.float32))
        m = np_mask(np_score(name, w, x_norm), sparsity)
        if refine is not None:
          m, n = np_dsnot(w, m, st[path], refine)
          swaps += n
        out[path] = m
      masks.append(out)
    times.append(time.perf_counter() - t)
  return statistics.median(times), masks, swaps


# --- the benchmark --------------------------------------------------------------------------

def _differing(a: list[dict], b: list[dict]) -> tuple[int, int]:
  diff = sum(int(np.sum(x[p] != y[p])) for x, y in zip(a, b) for p in x)
  total = sum(x[p].size for x in a for p in x)
  return diff, total


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--hidden", type=int, default=128, help="hidden_size")
  p.add_argument("--intermediate", type=int, default=352, help="intermediate_size (MLP)")
  p.add_argument("--layers", type=int, default=4, help="decoder blocks")
  p.add_argument("--heads", type=int, default=4)
  p.add_argument("--kv-heads", type=int, default=2, dest="kv_heads")
  p.add_argument("--sparsity", type=float, default=0.5, help="pruned fraction per neuron")
  p.add_argument("--tokens", type=int, default=512, help="calibration tokens per layer")
  p.add_argument("--mean-scale", type=float, default=1.0, dest="mean_scale",
                 help="standard deviation of the activations' per-channel means")
  p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
  p.add_argument("--repeats", type=int, default=3, help="library passes timed")
  p.add_argument("--numpy-repeats", type=int, default=1, dest="numpy_repeats",
                 help="numpy passes timed")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--tiny", action="store_true",
                 help="hidden 32, intermediate 88, 2 layers, 128 tokens, 1 repeat (tests)")
  p.add_argument("--out", default="benchmarks/results",
                 help="folder for bench_posttrain.json, or a path ending in .json")
  args = p.parse_args(argv)
  if args.tiny:
    args.hidden, args.intermediate, args.layers, args.tokens = 32, 88, 2, 128
    args.repeats = args.numpy_repeats = 1
  return args


def main(argv=None) -> dict:
  args = parse_args(argv)
  cfg, blocks, stats = make_model(args)
  blocks_np = [{path: np.asarray(w, np.float32) for path, w in sequential.kernels(p).items()}
               for p in blocks]
  shapes = {path: list(w.shape) for path, w in blocks_np[0].items()}
  rows, lib_masks = [], {}
  for method in args.methods:
    lib_s, compile_s, lib_m = run_library(method, blocks, stats, args.sparsity, args.repeats)
    np_s, np_m, swaps = run_numpy(method, blocks_np, stats, args.sparsity, args.numpy_repeats)
    lib_masks[method] = lib_m
    diff, total = _differing(lib_m, np_m)
    kept = sum(int(m.sum()) for blk in lib_m for m in blk.values())
    row = {"method": method, "library s": lib_s, "compile s": compile_s, "numpy s": np_s,
           "speed-up": np_s / lib_s, "differing": diff, "differing fraction": diff / total,
           "entries": total, "sparsity": 1.0 - kept / total}
    if method == "wanda+dsnot":
      row["numpy swaps"] = swaps
      if "wanda" in lib_masks:
        row["dsnot changed"] = _differing(lib_m, lib_masks["wanda"])[0]
    rows.append(row)

  n_params = sum(int(np.prod(s)) for s in shapes.values()) * cfg.num_layers
  print(f"Post-training pruning of all {7 * cfg.num_layers} linear layers "
        f"({n_params:,} weights) of a LLaMA-style LM: hidden {cfg.hidden_size}, "
        f"intermediate {cfg.intermediate_size}, {cfg.num_layers} blocks, heads "
        f"{cfg.num_heads}/{cfg.num_kv_heads}; sparsity {args.sparsity} per output neuron; "
        f"{jax.default_backend()} ({jax.devices()[0].device_kind}), {os.cpu_count()} CPUs")
  cols = ["method", "library s", "compile s", "numpy s", "speed-up", "differing",
          "differing fraction", "dsnot changed", "numpy swaps"]
  print("  ".join(f"{c:>18s}" for c in cols))
  for r in rows:
    cells = []
    for c in cols:
      v = r.get(c, "")
      cells.append(f"{v:>18.4g}" if isinstance(v, float) else f"{v!s:>18s}")
    print("  ".join(cells))

  result = {"config": vars(args), "transformer": {k: getattr(cfg, k) for k in (
                "hidden_size", "intermediate_size", "num_layers", "num_heads",
                "num_kv_heads")},
            "kernel_shapes": shapes, "weights_pruned": n_params,
            "dsnot_config": dsnot.dsnot()._asdict(), **bench_io.environment(), "rows": rows}
  bench_io.write_result(result, args.out, "bench_posttrain")
  return result


if __name__ == "__main__":
  main()
