"""Time a FedAvg round: one compiled program (clients vmapped, rounds under lax.scan) vs the
same mathematics as a Python loop over clients with one jitted call per client per local step
(the way fedjax's jit backend, Flower and the papers' code run clients).

Softmax regression, full-batch local steps, full participation, 10 / 100 / 1000 clients.
Compile time is reported apart from steady-state time; every timing ends with
``block_until_ready``; steady-state numbers are medians over repeats.

Usage: python benchmarks/bench_round.py [--clients 10 100 1000] [--out benchmarks/results]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import fedjaxsparse as fjs


def make_data(num_clients: int, examples: int, dim: int, classes: int, seed: int = 0):
  rng = np.random.default_rng(seed)
  n = num_clients * examples
  x = rng.normal(size=(n, dim)).astype(np.float32)
  y = rng.integers(0, classes, size=n)
  return fjs.data.pack_clients(x, y, np.split(np.arange(n), num_clients))


def timed(fn, repeats: int) -> tuple[float, float]:
  """(first call incl. compile, median of ``repeats`` further calls), seconds."""
  t = time.perf_counter()
  jax.block_until_ready(fn())
  first = time.perf_counter() - t
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t)
  return first, statistics.median(times)


def bench(num_clients: int, args) -> dict:
  data = make_data(num_clients, args.examples, args.dim, args.classes)
  model = fjs.models.softmax_regression(args.dim, args.classes)
  loss = fjs.models.make_loss(model)
  params = model.init(jax.random.key(0))
  algo = fjs.fedavg(loss, optax.sgd(args.lr), local_steps=args.local_steps)
  state = algo.init(jax.random.key(0), params, data)

  # (a) one round = one jitted program.
  step = jax.jit(algo.step)
  key = jax.random.key(1)
  first_round, round_s = timed(lambda: step(key, state, data)[0].params, args.repeats)

  # (b) R rounds under lax.scan in one program (the runner's chunk), per round.
  _, rounds_key = fjs.runtime.runner.split_run_key(key)
  chunk = jax.jit(fjs.runtime.runner.build_chunk(algo, args.scan_rounds, check_every_round=False))
  first_scan, scan_s = timed(
      lambda: chunk(rounds_key, state, jnp.int32(0), jnp.int32(args.scan_rounds), data,
                    None)[0].params, max(1, args.repeats // 2))

  # (c) reference: Python loop over clients, one jitted call per client per local step.
  @jax.jit
  def client_step(p, x, y, m):
    return jax.tree.map(lambda a, g: a - args.lr * g, p, jax.grad(loss)(p, x, y, m))

  average = jax.jit(fjs.aggregation.weighted_mean)

  xs = [data.x[i] for i in range(num_clients)]
  ys = [data.y[i] for i in range(num_clients)]
  ms = [data.mask[i] for i in range(num_clients)]
  n = np.asarray(data.num_examples, np.float64)
  w = jnp.asarray(n / n.sum(), jnp.float32)

  def loop_round():
    locals_ = []
    for i in range(num_clients):
      p = params
      for _ in range(args.local_steps):
        p = client_step(p, xs[i], ys[i], ms[i])
      locals_.append(p)
    return average(jax.tree.map(lambda *a: jnp.stack(a), *locals_), w)

  loop_repeats = max(1, args.repeats // (4 if num_clients >= 1000 else 1))
  first_loop, loop_s = timed(loop_round, loop_repeats)
  # Same mathematics: the compiled round and the loop agree.
  diff = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(
      jax.tree.leaves(step(key, state, data)[0].params), jax.tree.leaves(loop_round())))
  return {"clients": num_clients, "round_ms": 1e3 * round_s,
          "scan_round_ms": 1e3 * scan_s / args.scan_rounds, "loop_round_ms": 1e3 * loop_s,
          "speedup_round": loop_s / round_s,
          "speedup_scan": loop_s / (scan_s / args.scan_rounds),
          "compile_round_s": first_round - round_s, "compile_scan_s": first_scan - scan_s,
          "max_abs_diff": diff}


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--clients", type=int, nargs="+", default=[10, 100, 1000])
  p.add_argument("--examples", type=int, default=32, help="examples per client")
  p.add_argument("--dim", type=int, default=64)
  p.add_argument("--classes", type=int, default=10)
  p.add_argument("--local-steps", type=int, default=5, dest="local_steps")
  p.add_argument("--lr", type=float, default=0.1)
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--scan-rounds", type=int, default=20, dest="scan_rounds")
  p.add_argument("--out", default="benchmarks/results")
  args = p.parse_args()
  rows = [bench(n, args) for n in args.clients]
  cols = ["clients", "round_ms", "scan_round_ms", "loop_round_ms", "speedup_round",
          "speedup_scan", "compile_round_s", "max_abs_diff"]
  print(f"FedAvg round, softmax regression d={args.dim}, C={args.classes}, "
        f"{args.examples} ex/client, {args.local_steps} local steps, "
        f"backend={jax.default_backend()} ({jax.device_count()} device(s))")
  print("  ".join(f"{c:>14s}" for c in cols))
  for r in rows:
    print("  ".join(f"{r[c]:>14.4g}" if isinstance(r[c], float) else f"{r[c]:>14d}"
                    for c in cols))
  os.makedirs(args.out, exist_ok=True)
  path = os.path.join(args.out, "bench_round.json")
  with open(path, "w") as f:
    json.dump({"config": vars(args), "backend": jax.default_backend(),
               "devices": [str(d) for d in jax.devices()], "machine": platform.machine(),
               "cpu_count": os.cpu_count(), "rows": rows}, f, indent=1)
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
