"""The GPU suite: one command for the short windows in which an accelerator is at hand.

    PYTHONPATH=. python benchmarks/gpu_suite.py --out benchmarks/results/gpu [--budget-s 500]
    PYTHONPATH=. python benchmarks/gpu_suite.py --tiny --out /tmp/gpu_tiny    # CPU, < 1 min

Rows run most valuable first and each writes ``suite.json`` as it completes (device, JAX
version, every finished row), so a window that closes early still leaves numbers; a row whose
estimated cost would overrun ``--budget-s`` is skipped, saying so. Needs only JAX, flax, optax,
numpy and scikit-learn (no tensorflow-datasets, no dp-accounting): the data are synthetic
arrays of the papers' shapes (timings do not depend on the values).

Rows (ms per round are medians over ``--repeats`` steady-state rounds, each ending with
``block_until_ready``; compile seconds apart; peak device memory where the backend reports it):

1. ``fedavg_cnn``: a FedAvg CNN round (FedAvg's CNN, 28×28×1, ``--cohort`` clients × 10 local
   steps × batch 64) three ways: the library's round (clients vmapped, one program); the same
   work as a Python loop over clients with one jitted local-training call per client (the
   fedjax / Flower / papers' way: the same steps and batch sizes, minibatches taken in order
   where the library draws them with keys); one model doing the same total work (10 steps on
   the cohort's pooled batches: the single-model throughput).
2. ``fedavg_cnn_scaling``: the library's round at 10, 100 and 1,000 clients per round.
3. one row per family round through the public face at its paper's shape: Sparse-ProxSkip
   (BlogFeedback shape), EF21 (mushrooms shape), Scafflix (FEMNIST shape), FedSpa (LeNet5),
   FedMRN (its CNN), Ditto, FedPM.

Not yet here (issue 32): per-client loops for the families other than FedAvg, FedP3 / SPPM-AS /
ATO / post-training / DDSS rows, FedMRN Table 1 at the paper's protocol.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import fedjaxsparse as fjs


def block(tree):
  return jax.tree.map(lambda a: a.block_until_ready() if hasattr(a, "block_until_ready")
                      else a, tree)


def peak_bytes() -> int | None:
  stats = jax.local_devices()[0].memory_stats() or {}
  return stats.get("peak_bytes_in_use")


def timed(fn, repeats: int) -> tuple[float, float]:
  """``(first call s, median steady-state s)`` of ``fn()`` (the first call compiles)."""
  t = time.perf_counter()
  block(fn())
  first = time.perf_counter() - t
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    block(fn())
    times.append(time.perf_counter() - t)
  return first, statistics.median(times)


def images(num_clients: int, per_client: int, shape=(28, 28, 1), classes: int = 10, seed=0):
  rng = np.random.default_rng(seed)
  n = num_clients * per_client
  x = rng.normal(size=(n,) + shape).astype(np.float32)
  y = rng.integers(0, classes, n)
  return fjs.data.pack_clients(x, y, np.split(np.arange(n), num_clients))


def vectors(num_clients: int, per_client: int, dim: int, classes: int = 2, seed=0):
  rng = np.random.default_rng(seed)
  n = num_clients * per_client
  x = rng.normal(size=(n, dim)).astype(np.float32)
  y = rng.integers(0, classes, n)
  return fjs.data.pack_clients(x, y, np.split(np.arange(n), num_clients))


def flops_of(compiled) -> float | None:
  """XLA's own count of the floating-point operations of one call (``None`` if unknown)."""
  try:
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float(cost.get("flops")) if cost and cost.get("flops") is not None else None
  except Exception:  # noqa: BLE001 — a backend without cost analysis
    return None


def round_row(name: str, algo, params, data, repeats: int) -> dict:
  """The library's round: ``jit(step)`` on the whole population, compiled ahead of time (its
  compile seconds measured apart), with XLA's FLOP count of one round and the achieved
  GFLOP/s."""
  key = jax.random.key(0)
  state = algo.init(key, params, data)
  t = time.perf_counter()
  step = jax.jit(algo.step).lower(jax.random.key(1), state, data).compile()
  compile_s = time.perf_counter() - t
  flops = flops_of(step)
  holder = {"state": state}

  def one():
    holder["state"], _ = step(jax.random.key(1), holder["state"], data)
    return holder["state"]

  _, steady = timed(one, repeats)
  return {"row": name, "variant": "library", "ms_per_round": 1e3 * steady,
          "compile_s": compile_s, "gflop_per_round": None if flops is None else flops / 1e9,
          "gflop_per_s": None if flops is None else flops / 1e9 / steady,
          "peak_bytes": peak_bytes()}


def fedavg_cnn(args) -> list[dict]:
  cohort, steps, batch = args.cohort, args.local_steps, args.batch
  model = fjs.models.cnn((28, 28, 1), 10, channels=args.channels, dense=args.dense)
  loss = fjs.models.make_loss(model)
  params = model.init(jax.random.key(0))
  data = images(cohort, steps * batch)
  rows = [round_row("fedavg_cnn", fjs.fedavg(loss, optax.sgd(0.05), local_steps=steps,
                                             batch_size=batch), params, data, args.repeats)]
  grad = jax.grad(loss)

  @jax.jit
  def local(w, x, y, m):   # one client's local training: steps minibatch SGD steps
    def body(w, b):
      g = grad(w, x[b], y[b], m[b])
      return jax.tree.map(lambda a, gi: a - 0.05 * gi, w, g), None
    idx = jnp.arange(steps * batch).reshape(steps, batch)
    return jax.lax.scan(body, w, idx)[0]

  def loop():   # the papers' way: one call per client, the server averages on the host
    outs = [local(params, data.x[i], data.y[i], data.mask[i]) for i in range(cohort)]
    return jax.tree.map(lambda *v: sum(v) / cohort, *outs)

  first, steady = timed(loop, args.repeats)
  rows.append({"row": "fedavg_cnn", "variant": "per-client jit loop",
               "ms_per_round": 1e3 * steady, "compile_s": max(first - steady, 0.0),
               "peak_bytes": peak_bytes()})
  pooled_x = data.x.reshape((-1,) + data.x.shape[2:])
  pooled_y, pooled_m = data.y.reshape(-1), data.mask.reshape(-1)

  @jax.jit
  def single(w):   # one model, the same examples and steps: batches of cohort × batch
    def body(w, b):
      g = grad(w, pooled_x[b], pooled_y[b], pooled_m[b])
      return jax.tree.map(lambda a, gi: a - 0.05 * gi, w, g), None
    idx = jnp.arange(cohort * steps * batch).reshape(steps, cohort * batch)
    return jax.lax.scan(body, w, idx)[0]

  first, steady = timed(lambda: single(params), args.repeats)
  rows.append({"row": "fedavg_cnn", "variant": "one model, same work",
               "ms_per_round": 1e3 * steady, "compile_s": max(first - steady, 0.0),
               "peak_bytes": peak_bytes()})
  lib = rows[0]["ms_per_round"]
  for r in rows:
    r["vs_library"] = r["ms_per_round"] / lib
  return rows


def fedavg_cnn_scaling(args) -> list[dict]:
  model = fjs.models.cnn((28, 28, 1), 10, channels=args.channels, dense=args.dense)
  loss = fjs.models.make_loss(model)
  params = model.init(jax.random.key(0))
  rows = []
  for n in args.scaling:
    data = images(n, args.local_steps * args.batch)
    r = round_row("fedavg_cnn_scaling", fjs.fedavg(loss, optax.sgd(0.05),
                                                   local_steps=args.local_steps,
                                                   batch_size=args.batch), params, data,
                  args.repeats)
    r["clients_per_round"] = n
    rows.append(r)
  return rows


def families(args) -> list[dict]:
  s = args.scale
  rows = []
  # Sparse-ProxSkip on the BlogFeedback shape (ridge, d = 281, 554 clients) — one iteration
  data = vectors(max(2, int(554 * s)), 85, 281)
  ridge = fjs.models.linear_regression(281)
  rows.append(round_row("sparse_proxskip_blogfeedback", fjs.sparse_proxskip(
      fjs.models.make_loss(ridge), 1e-3, 0.2, 0.9), ridge.init(jax.random.key(0)), data,
      args.repeats))
  # EF21 with top-k on the mushrooms shape (logistic, d = 112, n = 1000 clients)
  data = vectors(max(2, int(1000 * s)), 8, 112)
  logit = fjs.models.logistic_regression(112)
  params = logit.init(jax.random.key(0))
  d = fjs.accounting.num_params(params)
  rows.append(round_row("ef21_mushrooms", fjs.ef21(fjs.models.make_loss(logit),
                                                   fjs.compressors.top_k(d, 2), 0.1),
                        params, data, args.repeats))
  # Scafflix on the FEMNIST shape (100 writers, 28×28, 62 classes; softmax regression)
  data = images(max(2, int(100 * s)), 32, classes=62)
  soft = fjs.models.softmax_regression(784, 62)
  params = soft.init(jax.random.key(0))
  x_star = jax.tree.map(lambda a: jnp.broadcast_to(a, (data.num_clients,) + a.shape), params)
  rows.append(round_row("scafflix_femnist", fjs.scafflix(
      fjs.models.make_loss(soft), 0.1, 0.2, 0.5, x_star, form="round", cohort_size=min(
          10, data.num_clients)), params, data, args.repeats))
  # FedSpa (DST) on LeNet5-Caffe, 10 of 100 clients per round
  n = max(2, int(100 * s))
  data = images(n, args.batch, classes=26)
  lenet = fjs.models.lenet5_caffe(conv=args.conv)
  cohort = min(10, n)
  rows.append(round_row("fedspa_lenet5", fjs.fedspa(
      fjs.models.make_loss(lenet), 0.05, num_rounds=100, epochs=1, batch_size=args.batch,
      cohort_size=cohort), lenet.init(jax.random.key(0)), data, args.repeats))
  # FedMRN, its CNN (bn_cnn), 10 of 100 clients, 1 epoch of 64
  bn = fjs.models.bn_cnn((28, 28, 1), 10, channels=args.bn_channels, conv=args.conv)
  data = images(n, args.batch)
  rows.append(round_row("fedmrn_cnn", fjs.fedmrn(
      fjs.models.make_loss(bn), 0.05, epochs=1, batch_size=args.batch, cohort_size=cohort),
      bn.init(jax.random.key(0)), data, args.repeats))
  # Ditto and FedPM on FedAvg's CNN
  model = fjs.models.cnn((28, 28, 1), 10, channels=args.channels, dense=args.dense)
  loss = fjs.models.make_loss(model)
  rows.append(round_row("ditto_cnn", fjs.ditto(loss, 0.05, global_epochs=1, personal_epochs=1,
                                               batch_size=args.batch, cohort_size=cohort),
                        model.init(jax.random.key(0)), data, args.repeats))
  rows.append(round_row("fedpm_cnn", fjs.fedpm(loss, 0.1, epochs=1, batch_size=args.batch,
                                               cohort_size=cohort),
                        model.init(jax.random.key(0)), data, args.repeats))
  return rows


SECTIONS = (("fedavg_cnn", fedavg_cnn), ("fedavg_cnn_scaling", fedavg_cnn_scaling),
            ("families", families))


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--out", default="benchmarks/results/gpu")
  p.add_argument("--tiny", action="store_true", help="toy sizes on any backend (< 1 min)")
  p.add_argument("--budget-s", type=float, default=500.0,
                 help="skip a section that starts after this many seconds")
  p.add_argument("--repeats", type=int, default=10)
  p.add_argument("--only", nargs="*", help="sections to run (default: all)")
  args = p.parse_args(argv)
  big = dict(cohort=10, local_steps=10, batch=64, channels=(32, 64), dense=512,
             bn_channels=(32, 32, 64, 64), scaling=(10, 100, 1000), scale=1.0,
             conv="auto")
  tiny = dict(cohort=2, local_steps=2, batch=4, channels=(2, 2), dense=4,
              bn_channels=(2, 2, 2, 2), scaling=(2, 4), scale=0.02, conv="auto", repeats=1)
  for k, v in (tiny if args.tiny else big).items():
    if k == "repeats" and not args.tiny:
      continue
    setattr(args, k, v)
  if args.repeats < 1:
    p.error("--repeats must be >= 1")
  return args


def main(argv=None) -> dict:
  args = parse_args(argv)
  os.makedirs(args.out, exist_ok=True)
  path = os.path.join(args.out, "suite.json")
  dev = jax.devices()[0]
  result = {"device": f"{dev.platform}: {dev.device_kind}", "jax": jax.__version__,
            "python": platform.python_version(), "tiny": args.tiny, "rows": [],
            "skipped": []}
  start = time.perf_counter()
  for name, section in SECTIONS:
    if args.only and name not in args.only:
      continue
    elapsed = time.perf_counter() - start
    if elapsed > args.budget_s:
      result["skipped"].append(f"{name}: started after {elapsed:.0f} s > --budget-s")
      continue
    t = time.perf_counter()
    rows = section(args)
    for r in rows:
      r["section_s"] = time.perf_counter() - t
      print(f"{r['row']:32s} {r['variant']:22s} {r['ms_per_round']:10.2f} ms/round  "
            f"compile {r['compile_s']:6.2f} s"
            + (f"  {r['gflop_per_round']:.3g} GFLOP ({r['gflop_per_s']:.3g} GFLOP/s)"
               if r.get("gflop_per_round") else "")
            + (f"  ×{r['vs_library']:.2f} of the library" if "vs_library" in r else ""),
            flush=True)
    result["rows"].extend(rows)
    with open(path, "w") as f:   # after every section: a closed window keeps its numbers
      json.dump(result, f, indent=1)
  with open(path, "w") as f:
    json.dump(result, f, indent=1)
  print(f"wrote {path} ({time.perf_counter() - start:.0f} s)")
  return result


if __name__ == "__main__":
  sys.exit(0 if main() else 1)
