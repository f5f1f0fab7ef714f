"""Client execution strategies for convolutional clients: one local SGD step of the FedAvg
CNN (McMahan et al. 2017) for C clients × B images, against one model on all C·B images.

Strategies (``fedjaxsparse.runtime.clients.STRATEGIES``, all behind ``map_clients``): ``vmap`` (one
batched kernel: under vmap each convolution becomes a grouped convolution), ``map``
(``lax.map``, one client at a time in a loop), ``unroll`` (the clients written out one after
another inside the jitted program) and ``unroll:G`` (``lax.map`` over groups of G unrolled
clients, which bounds the compile time). Reported per strategy: compile seconds, ms per
client-step (steady, ``block_until_ready``, median of interleaved repeats), the ratio to the
single-model throughput (the goal is ≤ 1.2), and the largest difference from ``vmap``.
The "in scan" rows run the same cohort step ``--loop`` times inside a ``lax.scan`` — where
the runner's chunks and the local-step loops put it: on XLA:CPU a convolution inside a loop
body is several times slower than outside one (jax-ml/jax#12868), whatever the strategy;
``unroll=True`` removes the loop.

The runner rows run whole FedAvg rounds (``--local-steps`` steps each) through
``runner.run`` with ``clients="vmap"`` and ``"auto"`` (loop-free rounds on CPU) against one
model taking the same steps on all the cohort's images.

Usage: python benchmarks/bench_client_strategies.py [--clients 10] [--batch 32]
       [--repeats 5] [--rounds 10] [--local-steps 5] [--out benchmarks/results]
"""
from __future__ import annotations

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import fedjaxsparse as fjs


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--clients", type=int, default=10)
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--channels", type=int, nargs=2, default=(32, 64))
  parser.add_argument("--dense", type=int, default=512)
  parser.add_argument("--model", choices=("cnn", "resnet18"), default="cnn",
                      help="cnn: 28x28x1 images; resnet18: 32x32x3 (CIFAR-shaped, GroupNorm)")
  parser.add_argument("--conv", choices=("xla", "patches"), default="xla",
                      help="convolution formulation (fedjaxsparse.models.conv): XLA's "
                           "convolution or patches times a matrix")
  parser.add_argument("--no-loop-rows", dest="loop_rows", action="store_false")
  parser.add_argument("--strategies", nargs="+",
                      default=["vmap", "map", "unroll", "unroll:2", "unroll:5"])
  parser.add_argument("--loop", type=int, default=3,
                      help="cohort steps inside a lax.scan for the in-loop rows")
  parser.add_argument("--rounds", type=int, default=10,
                      help="rounds of the runner rows (0: none)")
  parser.add_argument("--local-steps", type=int, default=5, help="local steps (runner rows)")
  parser.add_argument("--runner-strategies", nargs="+", default=["vmap", "auto"])
  parser.add_argument("--out", default="benchmarks/results")
  args = parser.parse_args()
  c, b = args.clients, args.batch
  rng = np.random.default_rng(0)
  shape = (28, 28, 1) if args.model == "cnn" else (32, 32, 3)
  x = rng.random((c * b,) + shape).astype(np.float32)
  y = rng.integers(0, 10, c * b).astype(np.int32)
  data = fjs.data.pack_clients(x, y, np.split(np.arange(c * b), c))
  model = (fjs.models.cnn(shape, 10, channels=tuple(args.channels), dense=args.dense,
                          conv=args.conv)
           if args.model == "cnn" else fjs.models.resnet18(shape, 10, conv=args.conv))
  loss = fjs.models.make_loss(model)
  opt = optax.sgd(0.05)
  params = model.init(jax.random.key(0))

  def local_step(w, d):  # one client: one SGD step on its B images
    g = jax.grad(loss)(w, d.x, d.y, d.mask)
    return optax.apply_updates(w, opt.update(g, opt.init(w), w)[0])

  def cohort_step(w_clients, data):
    return fjs.runtime.clients.map_clients(local_step, data, w_clients)

  def single_step(w, x, y, m):  # one model on all C·B images
    g = jax.grad(loss)(w, x, y, m)
    return optax.apply_updates(w, opt.update(g, opt.init(w), w)[0])

  w_clients = jax.tree.map(lambda a: jnp.broadcast_to(a, (c,) + a.shape), params)
  flat = (jnp.asarray(x), jnp.asarray(y), jnp.ones(c * b, jnp.float32))
  programs = {}
  t = time.perf_counter()
  programs["single model"] = jax.jit(single_step).lower(params, *flat).compile()
  compile_s = {"single model": time.perf_counter() - t}
  inputs = {"single model": (params, *flat)}
  def in_loop(steps: int, unroll: bool):  # `steps` cohort steps in a lax.scan (the runner's)
    return lambda w, d: jax.lax.scan(lambda w, _: (cohort_step(w, d), None), w, None,
                                     length=steps, unroll=unroll)[0]

  variants = [(s, s, cohort_step, 1) for s in args.strategies]
  if args.loop_rows:
    variants += [(f"{s} in scan({args.loop})", s, in_loop(args.loop, False), args.loop)
                 for s in ("vmap", "unroll")]
    variants += [(f"unroll in scan({args.loop}, unroll=True)", "unroll",
                  in_loop(args.loop, True), args.loop)]
  steps_of = {"single model": 1}
  for name, s, fn, steps in variants:
    d = fjs.runtime.clients.with_strategy(data, s)
    t = time.perf_counter()
    programs[name] = jax.jit(fn).lower(w_clients, d).compile()
    compile_s[name] = time.perf_counter() - t
    inputs[name] = (w_clients, d)
    steps_of[name] = steps
  times = {k: [] for k in programs}
  outs = {}
  for _ in range(args.repeats + 1):  # the first pass warms up
    for k, fn in programs.items():
      t = time.perf_counter()
      outs[k] = jax.block_until_ready(fn(*inputs[k]))
      times[k].append(time.perf_counter() - t)
  single = np.median(times["single model"][1:]) * 1e3 / c
  rows = []
  for k in programs:
    ms = np.median(times[k][1:]) * 1e3 / c / steps_of[k]
    diff = 0.0 if k == "single model" or steps_of[k] > 1 else max(
        float(jnp.max(jnp.abs(u - v))) for u, v in
        zip(jax.tree.leaves(outs[k]), jax.tree.leaves(outs[args.strategies[0]])))
    rows.append({"strategy": k, "compile s": compile_s[k], "ms per client-step": ms,
                 "vs single model": ms / single, f"max |diff| vs {args.strategies[0]}": diff})
  cols = list(rows[0])
  print(" | ".join(cols))
  for r in rows:
    print(" | ".join(f"{r[col]:.3g}" if isinstance(r[col], float) else str(r[col])
                     for col in cols))
  run_rows = runner_rows(args, model, loss, params, data, flat) if args.rounds else []
  os.makedirs(args.out, exist_ok=True)
  path = os.path.join(args.out, f"bench_client_strategies_{args.model}_{args.conv}.json")
  with open(path, "w") as f:
    json.dump({"backend": jax.default_backend(), "device": str(jax.devices()[0]),
               "model": args.model, "conv": args.conv, "clients": c, "batch": b,
               "channels": list(args.channels),
               "dense": args.dense, "rows": rows, "runner_rows": run_rows}, f, indent=1)
  print(f"wrote {path}")


def runner_rows(args, model, loss, params, data, flat) -> list[dict]:
  """Whole FedAvg rounds (``--local-steps`` SGD steps of batch B per client) through
  ``runner.run`` with each client strategy, against one model taking the same steps on
  batches of all C·B images (loop-free). Steady ms per round from the difference of a long and
  a short run (each run compiles once); the final models of all strategies are compared."""
  c, e = args.clients, args.local_steps
  algo = fjs.fedavg(loss, optax.sgd(0.05), local_steps=e, batch_size=args.batch)
  opt = optax.sgd(0.05)

  def single_round(w, x, y, m):  # e steps of one model on all C·B images, written out
    for _ in range(e):
      w = optax.apply_updates(w, opt.update(jax.grad(loss)(w, x, y, m), opt.init(w), w)[0])
    return w

  single = jax.jit(single_round).lower(params, *flat).compile()
  jax.block_until_ready(single(params, *flat))
  t = time.perf_counter()
  for _ in range(args.rounds):
    jax.block_until_ready(single(params, *flat))
  single_ms = (time.perf_counter() - t) * 1e3 / args.rounds
  rows, finals = [{"strategy": "one model, all images", "ms per round": single_ms,
                   "vs single model": 1.0}], {}
  for strategy in args.runner_strategies:
    times = {}
    for rounds in (1, 1 + args.rounds):
      res = fjs.run(algo, jax.random.key(0), params, data, num_rounds=rounds,
                    eval_every=rounds, progress=False, clients=strategy)
      times[rounds] = res.train_time_s
    ms = (times[1 + args.rounds] - times[1]) * 1e3 / args.rounds
    finals[strategy] = res.state.params
    rows.append({"strategy": f"runner, clients={strategy!r} ({res.clients})",
                 "ms per round": ms, "vs single model": ms / single_ms,
                 "first round incl. compile s": times[1]})
  base = finals[args.runner_strategies[0]]
  for r, (strategy, p) in zip(rows[1:], finals.items()):
    r["max |diff| vs first"] = max(float(jnp.max(jnp.abs(u - v))) for u, v in
                                   zip(jax.tree.leaves(p), jax.tree.leaves(base)))
  print(f"\nFedAvg rounds through runner.run ({c} clients, {e} local steps of {args.batch}):")
  for r in rows:
    print(" | ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in r.items()))
  return rows


if __name__ == "__main__":
  main()
