"""Top-K masks on large vectors: ``lax.top_k`` + scatter against the bisection on the bit
pattern of the k-th largest magnitude (``fedjaxsparse.ops.sparsity``'s two paths; the library
takes ``lax.top_k`` for k ≤ d/50) and a full ``argsort``.

For d in ``--dims`` (default 1e5, 1e6 and ResNet-18's 11.2M) and k in ``--fractions`` of d:
compile seconds and steady ms per mask (median of ``--repeats``, ``block_until_ready``),
each path's time relative to the library's choice, and whether all paths give the same mask.

Usage: python benchmarks/bench_topk.py [--dims 100000 1000000 11173962]
       [--fractions 0.01 0.1 0.5] [--repeats 3] [--out benchmarks/results]
"""
from __future__ import annotations

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

import fedjaxsparse as fjs


def _argsort(keys, k):
  order = jnp.argsort(-keys, stable=True)
  return jnp.zeros(keys.shape, bool).at[order[:k]].set(True)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--dims", type=int, nargs="+", default=[100_000, 1_000_000, 11_173_962])
  parser.add_argument("--fractions", type=float, nargs="+", default=[0.01, 0.1, 0.5])
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--out", default="benchmarks/results")
  args = parser.parse_args()
  method = lambda m: lambda keys, k: fjs.sparsity.largest_mask(keys, k, m)  # noqa: E731
  paths = {"library": method("auto"), "lax.top_k": method("top_k"),
           "bisection": method("bisection"), "argsort": _argsort}
  rows = []
  for d in args.dims:
    keys = jnp.abs(jax.random.normal(jax.random.key(0), (d,)))
    for frac in args.fractions:
      k = max(1, int(frac * d))
      masks, ms, comp = {}, {}, {}
      for name, fn in paths.items():
        t = time.perf_counter()
        compiled = jax.jit(fn, static_argnums=1).lower(keys, k).compile()
        comp[name] = time.perf_counter() - t
        masks[name] = jax.block_until_ready(compiled(keys))
        times = []
        for _ in range(args.repeats):
          t = time.perf_counter()
          jax.block_until_ready(compiled(keys))
          times.append(time.perf_counter() - t)
        ms[name] = 1e3 * float(np.median(times))
      same = all(bool(jnp.array_equal(masks[n], masks["library"])) for n in paths)
      for name in paths:
        rows.append({"d": d, "k": k, "path": name, "compile s": comp[name],
                     "ms": ms[name], "vs library": ms[name] / ms["library"],
                     "same mask": same, "nnz": int(masks[name].sum())})
  cols = list(rows[0])
  print(" | ".join(cols))
  for r in rows:
    print(" | ".join(f"{r[c]:.3g}" if isinstance(r[c], float) else str(r[c]) for c in cols))
  os.makedirs(args.out, exist_ok=True)
  path = os.path.join(args.out, "bench_topk.json")
  with open(path, "w") as f:
    json.dump({"backend": jax.default_backend(), "device": str(jax.devices()[0]),
               "rows": rows}, f, indent=1)
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
