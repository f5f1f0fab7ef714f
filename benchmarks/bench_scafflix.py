"""Scafflix iterations/s with many clients: the library's compiled run against a Python loop
over clients doing the same mathematics in numpy, in the same process (the authors' code is a
per-client loop).

Scafflix (Yi, Condat and Richtárik 2023), Algorithm 4 of Kai Yi's dissertation (chapter 3;
``fedjaxsparse.algorithms.scafflix``, iteration form): per
iteration every client i takes x̂_i = x_i − (γ_i/α_i)(∇f_i(x̃_i) − h_i) at its personalised
point x̃_i = α_i x_i + (1 − α_i) x_i*; with probability p (one coin for all clients) the
server averages x̄ = Σ_j w_j x̂_j, w_j ∝ α_j²/γ_j, and h_i ← h_i + (p α_i/γ_i)(x̄ − x̂_i),
x_i ← x̄. Problem: l2-regularised binary logistic regression (μ = ``--mu``, no bias) on
synthetic data, ``--examples`` per client, feature scales differing per client so the L_i
do; γ_i = 1/L_i, L_i = μ + (1/(4 n_i)) Σ_j ‖a_ij‖²; α_i = ``--alpha``; x_i* from
``local_optima`` (not timed).

  * compiled: ``jax.jit`` of a ``lax.scan`` over ``--iterations`` steps (keys from
    ``jax.random.split``), compiled ahead (compile time reported apart), one warm-up run,
    then the median of ``--repeats`` runs, each ending with ``block_until_ready``;
  * loop: float32 numpy, ``for i in range(n)`` per iteration (personalised point, the
    client's logistic-loss gradient, local step), then, when the coin — the compiled run's
    own, drawn from the same keys — is 1, the weighted average and the h update; timed on
    ``--loop-iterations`` iterations.
Both run ``--loop-iterations`` iterations from the same state; ``max_abs_diff`` is the largest
difference of their server models and client iterates x_i.

Usage: python benchmarks/bench_scafflix.py [--clients 1000] [--iterations 2000]
       [--loop-iterations 50] [--out benchmarks/results]

Source for the team: seed 001 chapter 3, Algorithm 4.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import jax
import numpy as np

import fedjaxsparse as fjs


def make_problem(num_clients: int, examples: int, dim: int, seed: int = 0):
  """Clients with their own feature scale (log-uniform over [0.3, 3]) and labels from their
  own noisy linear rule; returns the packed data and the per-client arrays."""
  rng = np.random.default_rng(seed)
  scale = np.exp(rng.uniform(np.log(0.3), np.log(3.0), num_clients))
  a = (rng.normal(size=(num_clients, examples, dim)) * scale[:, None, None]).astype(np.float32)
  w = rng.normal(size=(num_clients, dim)) / np.sqrt(dim)
  z = np.einsum("nmd,nd->nm", a, w) + rng.normal(scale=0.5, size=(num_clients, examples))
  y = (z > 0).astype(np.int32)
  n = num_clients * examples
  data = fjs.data.pack_clients(a.reshape(n, dim), y.reshape(n), np.split(np.arange(n), num_clients))
  return data, a, y


def loop_run(state, a, y, gammas, alphas, p: float, mu: float, coins
             ) -> tuple[np.ndarray, np.ndarray]:
  """The reference: Scafflix's iterations as a Python loop over clients (float32 numpy);
  returns the final server model and client iterates ``[N, d]``."""
  n = len(a)
  f32 = np.float32
  x = [np.array(v, f32) for v in np.asarray(state.x["w"])]
  h = [np.array(v, f32) for v in np.asarray(state.h["w"])]
  xs = [np.array(v, f32) for v in np.asarray(state.x_star["w"])]
  b = [(2 * yi - 1).astype(f32) for yi in y]
  g, al, mu = gammas.astype(f32), alphas.astype(f32), f32(mu)
  w = al ** 2 / g
  w = w / w.sum()
  coef = f32(p) * al / g
  server = np.array(state.server["w"], f32)
  for theta in coins:
    x_hat = []
    for i in range(n):  # one client: gradient at its personalised point, one local step
      xt = al[i] * x[i] + (1 - al[i]) * xs[i]
      u = -b[i] * (a[i] @ xt)  # loss log(1 + e^u), derivative sigmoid(u)
      s = np.exp(np.minimum(u, 0)) / (1 + np.exp(-np.abs(u)))
      grad = a[i].T @ (-b[i] * s) / f32(len(b[i])) + mu * xt
      x_hat.append(x[i] - (g[i] / al[i]) * (grad - h[i]))
    if theta:
      server = sum(w[j] * x_hat[j] for j in range(n))
      for i in range(n):
        h[i] = h[i] + coef[i] * (server - x_hat[i])
        x[i] = server
    else:
      x = x_hat
  return server, np.stack(x)


def bench(num_clients: int, args) -> dict:
  data, a, y = make_problem(num_clients, args.examples, args.dim)
  model = fjs.models.logistic_regression(args.dim, l2=args.mu, use_bias=False)
  loss = fjs.models.make_loss(model)
  li = args.mu + np.sum(a.astype(np.float64) ** 2, (1, 2)) / (4 * args.examples)
  gammas = (1 / li).astype(np.float32)
  alphas = np.full(num_clients, args.alpha, np.float32)
  w0 = model.init(jax.random.key(0))
  x_star = fjs.algorithms.scafflix.local_optima(loss, w0, data, lr=float(1 / li.max()),
                                                max_steps=args.presolve_steps).x_star
  algo = fjs.scafflix(loss, gammas, args.p, alphas, x_star)
  state = algo.init(jax.random.key(0), w0, data)

  @jax.jit
  def run(state, keys, data):
    return jax.lax.scan(lambda s, k: (algo.step(k, s, data)[0], None), state, keys)[0]

  keys = jax.random.split(jax.random.key(1), args.iterations)
  t = time.perf_counter()
  compiled = run.lower(state, keys, data).compile()
  compile_s = time.perf_counter() - t
  jax.block_until_ready(compiled(state, keys, data))  # warm-up
  times = []
  for _ in range(args.repeats):
    t = time.perf_counter()
    jax.block_until_ready(compiled(state, keys, data))
    times.append(time.perf_counter() - t)
  compiled_s = statistics.median(times)

  # The loop on the first L keys, with the coins scafflix.py's iteration_step draws.
  short = keys[:args.loop_iterations]
  coins = [bool(c) for c in jax.vmap(
      lambda k: jax.random.bernoulli(jax.random.split(k, 3)[0], args.p))(short)]
  t = time.perf_counter()
  server, x = loop_run(state, a, y, gammas, alphas, args.p, args.mu, coins)
  loop_s = time.perf_counter() - t
  ref = run(state, short, data)
  diff = max(float(np.max(np.abs(np.asarray(ref.server["w"]) - server))),
             float(np.max(np.abs(np.asarray(ref.x["w"]) - x))))
  ips, loop_ips = args.iterations / compiled_s, args.loop_iterations / loop_s
  return {"clients": num_clients, "iterations": args.iterations, "it_per_s": ips,
          "loop_iterations": args.loop_iterations, "loop_it_per_s": loop_ips,
          "speedup": ips / loop_ips, "compile_s": compile_s,
          "communications_in_check": sum(coins), "max_abs_diff": diff}


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--clients", type=int, nargs="+", default=[1000])
  p.add_argument("--examples", type=int, default=50, help="examples per client")
  p.add_argument("--dim", type=int, default=100)
  p.add_argument("--mu", type=float, default=0.1, help="l2 regularisation")
  p.add_argument("--alpha", type=float, default=0.5, help="personalization factor (all)")
  p.add_argument("--p", type=float, default=0.2, help="communication probability")
  p.add_argument("--iterations", type=int, default=2000, help="compiled run, per repeat")
  p.add_argument("--loop-iterations", type=int, default=50, dest="loop_iterations")
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--presolve-steps", type=int, default=300, dest="presolve_steps",
                 help="gradient steps for the local optima x_i* (not timed)")
  p.add_argument("--out", default="benchmarks/results")
  args = p.parse_args()
  if not 1 <= args.loop_iterations <= args.iterations:
    p.error("--loop-iterations must be in [1, --iterations].")
  rows = [bench(n, args) for n in args.clients]
  cols = ["clients", "it_per_s", "loop_it_per_s", "speedup", "compile_s", "max_abs_diff"]
  print(f"Scafflix (iteration form), logistic regression d={args.dim}, {args.examples} "
        f"ex/client, alpha={args.alpha:g}, p={args.p:g}, backend={jax.default_backend()} "
        f"({jax.device_count()} device(s))")
  print("  ".join(f"{c:>14s}" for c in cols))
  for r in rows:
    print("  ".join(f"{r[c]:>14.4g}" if isinstance(r[c], float) else f"{r[c]:>14d}"
                    for c in cols))
  os.makedirs(args.out, exist_ok=True)
  path = os.path.join(args.out, "bench_scafflix.json")
  with open(path, "w") as f:
    json.dump({"config": vars(args), "platform": jax.devices()[0].platform,
               "jax": jax.__version__, "devices": [str(d) for d in jax.devices()],
               "machine": platform.machine(), "cpu_count": os.cpu_count(), "rows": rows},
              f, indent=1)
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
