"""Sparse-ProxSkip on a BlogFeedback-shaped problem: 554 clients with log-normal sizes (mean
≈ 85, max ≈ 1,100 examples), d = 281, ridge regression with a sum of squared errors, full
local gradients, 90 % sparsity, 10⁴ iterations (the Sparse-ProxSkip paper's §4.1 setting).

Compared in one process, all timings with ``block_until_ready`` and compile time apart:
  * compiled, padded: the whole run as ``lax.scan`` chunks, every client padded to the
    largest;
  * compiled, bucketed: the same with clients in size buckets (``fedjaxsparse.runtime.clients``);
  * reference: the same mathematics as a Python loop over clients — one jitted gradient step
    per client per iteration on its exact (unpadded) data, the coin drawn on the host, the
    communication done with jitted ops (the papers' per-client style).
The loop and the padded run are timed on fewer iterations and extrapolated linearly to 10⁴
(the per-iteration work is constant); the table says which numbers are measured.

Usage: python benchmarks/bench_blogfeedback.py [--iterations 10000] [--out benchmarks/results]
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


def make_problem(num_clients: int, mean_size: int, sigma: float, seed: int = 0):
  rng = np.random.default_rng(seed)
  sizes = fjs.data.lognormal_sizes(num_clients * mean_size, num_clients, sigma, seed)
  n = int(sizes.sum())
  x = np.concatenate([rng.uniform(0, 1, (n, 280)), np.ones((n, 1))], 1).astype(np.float32)
  y = (x @ rng.normal(size=281) + rng.normal(size=n)).astype(np.float32)
  parts = np.split(np.arange(n), np.cumsum(sizes)[:-1])
  return fjs.data.pack_clients(x, y, parts), x, y, parts


def time_compiled(algo, data, w0, iterations: int, chunk: int) -> tuple[float, float]:
  """(compile seconds, steady seconds for ``iterations``), chunks of ``chunk`` iterations."""
  init_key, rounds_key = fjs.runtime.runner.split_run_key(jax.random.key(0))
  state = algo.init(init_key, w0, data)
  fn = jax.jit(fjs.runtime.runner.build_chunk(algo, chunk, check_every_round=False))
  t = time.perf_counter()
  compiled = fn.lower(rounds_key, state, jnp.int32(0), jnp.int32(iterations), data,
                      None).compile()
  compile_s = time.perf_counter() - t
  t = time.perf_counter()
  for r0 in range(0, iterations, chunk):
    state, _ = compiled(rounds_key, state, jnp.int32(r0), jnp.int32(iterations), data, None)
  jax.block_until_ready(state)
  return compile_s, time.perf_counter() - t


def time_loop(loss, x, y, parts, w0, gamma, p, sparsity, iterations: int) -> float:
  grad = jax.jit(jax.grad(loss))
  step = jax.jit(lambda w, h, xi, yi, mi: fjs.sparsity.top_k(
      jax.tree.map(lambda a, g, c: a - gamma * (g - c), w, grad(w, xi, yi, mi), h),
      sparsity=sparsity))
  local = jax.jit(lambda w, h, xi, yi, mi: jax.tree.map(
      lambda a, g, c: a - gamma * (g - c), w, grad(w, xi, yi, mi), h))
  mean = jax.jit(lambda ws: jax.tree.map(lambda *a: sum(a) / len(a), *ws))
  update_h = jax.jit(lambda h, wbar, wh: jax.tree.map(lambda c, b, a: c + p / gamma * (b - a),
                                                      h, wbar, wh))
  xs = [jnp.asarray(x[ix]) for ix in parts]
  ys = [jnp.asarray(y[ix]) for ix in parts]
  ms = [jnp.ones(len(ix), jnp.float32) for ix in parts]
  n = len(parts)
  w = [w0] * n
  h = [jax.tree.map(jnp.zeros_like, w0)] * n
  # Warm-up: every distinct client size compiles its own program; keep that out of the timing.
  for i in range(n):
    jax.block_until_ready((step(w[i], h[i], xs[i], ys[i], ms[i]),
                           local(w[i], h[i], xs[i], ys[i], ms[i])))
  jax.block_until_ready(update_h(h[0], mean(w), w[0]))
  rng = np.random.default_rng(0)
  t = time.perf_counter()
  for _ in range(iterations):
    if rng.random() < p:
      w_hat = [step(w[i], h[i], xs[i], ys[i], ms[i]) for i in range(n)]
      w_bar = mean(w_hat)
      h = [update_h(h[i], w_bar, w_hat[i]) for i in range(n)]
      w = [w_bar] * n
    else:
      w = [local(w[i], h[i], xs[i], ys[i], ms[i]) for i in range(n)]
  jax.block_until_ready(w)
  return time.perf_counter() - t


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--clients", type=int, default=554)
  ap.add_argument("--mean-size", type=int, default=85, dest="mean_size")
  ap.add_argument("--sigma", type=float, default=1.0)
  ap.add_argument("--iterations", type=int, default=10000)
  ap.add_argument("--padded-iterations", type=int, default=200, dest="padded_iterations")
  ap.add_argument("--loop-iterations", type=int, default=50, dest="loop_iterations")
  ap.add_argument("--buckets", type=int, default=32)
  ap.add_argument("--chunk", type=int, default=500)
  ap.add_argument("--out", default="benchmarks/results")
  args = ap.parse_args()

  data, x, y, parts = make_problem(args.clients, args.mean_size, args.sigma)
  sizes = np.asarray(data.num_examples)
  model = fjs.models.linear_regression(281, l2=500.0, use_bias=False)
  loss = fjs.models.make_loss(model, "sum")
  consts = fjs.convex.constants.linear_model_constants(data, 500.0, "squared", "sum",
                                                     use_bias=False)
  gamma, p, sparsity = 1.0 / consts.L_max, 0.1, 0.9
  algo = fjs.sparse_proxskip(loss, gamma, p, sparsity)
  w0 = model.init(jax.random.key(0))
  bucketed = fjs.runtime.clients.bucketize(data, args.buckets)

  rows = []
  c, s = time_compiled(algo, bucketed, w0, args.iterations, args.chunk)
  rows.append({"variant": f"compiled, {args.buckets} size buckets", "iterations_timed":
               args.iterations, "compile_s": c, "ms_per_iteration": 1e3 * s / args.iterations})
  c, s = time_compiled(algo, data, w0, args.padded_iterations, min(args.chunk,
                                                                  args.padded_iterations))
  rows.append({"variant": "compiled, padded to the largest client", "iterations_timed":
               args.padded_iterations, "compile_s": c,
               "ms_per_iteration": 1e3 * s / args.padded_iterations})
  s = time_loop(loss, x, y, parts, w0, gamma, p, sparsity, args.loop_iterations)
  rows.append({"variant": "Python loop over clients (reference)", "iterations_timed":
               args.loop_iterations, "compile_s": float("nan"),
               "ms_per_iteration": 1e3 * s / args.loop_iterations})
  ref = rows[-1]["ms_per_iteration"]
  for r in rows:
    r["run_s_at_%d" % args.iterations] = r["ms_per_iteration"] * args.iterations / 1e3
    r["speedup_vs_loop"] = ref / r["ms_per_iteration"]
  data_mb = x.nbytes / 1e6
  print(f"BlogFeedback-shaped: {args.clients} clients, sizes mean {sizes.mean():.1f} max "
        f"{sizes.max()}, d=281, {data_mb:.1f} MB of real data, Sparse-ProxSkip p={p}, 90% "
        f"sparsity, backend={jax.default_backend()}")
  cols = list(rows[0])
  print("  ".join(f"{c:>38s}" if c == "variant" else f"{c:>16s}" for c in cols))
  for r in rows:
    print("  ".join(f"{r[c]:>38s}" if c == "variant" else (
        f"{r[c]:>16d}" if isinstance(r[c], int) else f"{r[c]:>16.4g}") for c in cols))
  os.makedirs(args.out, exist_ok=True)
  path = os.path.join(args.out, "bench_blogfeedback.json")
  with open(path, "w") as f:
    json.dump({"config": vars(args), "sizes_mean": float(sizes.mean()),
               "sizes_max": int(sizes.max()), "data_mb": data_mb, "rows": rows}, f, indent=1)
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
