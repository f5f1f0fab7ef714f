"""The automatic client layout: compile time and speed of padded, automatic and many buckets.

``fedjaxsparse.runtime.clients.auto_layout`` picks the fewest size buckets (≤ 8) whose padded work is
within 25 % of the real work. Every bucket is another copy of the kernel in the compiled
program, so more buckets trade compile time for less padding. Measured in one process, for
Sparse-ProxSkip (iteration form, full local gradients, 90 % sparsity), per layout: the
buckets, the padded work relative to the real work, compile seconds and steady ms/iteration
(chunks of 100 iterations, ``block_until_ready``), and both relative to the padded run.

Problems: the BlogFeedback-shaped stand-in (554 sites, log-normal sizes, d = 281, ridge with
a sum of squares) and 1,000 small clients (log-normal sizes, mean 18 examples, softmax
regression 60 features × 10 classes).

Every layout must compute the padded run's model (the last column). References, per problem:
the memory floor (one gradient of the pooled real examples: the two matrix products an
iteration needs) and, when PyTorch is installed, the papers' way — a Python loop over clients.

Usage: python benchmarks/bench_layout.py [--iterations 300] [--out benchmarks/results]
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


def small_clients(num_clients: int = 1000, mean: int = 18, seed: int = 0):
  rng = np.random.default_rng(seed)
  sizes = fjs.data.lognormal_sizes(num_clients * mean, num_clients, 1.0, seed)
  x = rng.normal(size=(sizes.sum(), 60)).astype(np.float32)
  y = np.argmax(x @ rng.normal(size=(60, 10)), 1).astype(np.int32)
  bounds = np.cumsum(np.r_[0, sizes])
  return fjs.data.pack_clients(x, y, [np.arange(a, b) for a, b in zip(bounds[:-1], bounds[1:])])


def measure(algo, data, w0, iterations: int, chunk: int) -> tuple[float, float, dict]:
  """(compile seconds, steady ms per iteration, final server model)."""
  init_key, rounds_key = fjs.runtime.runner.split_run_key(jax.random.key(0))
  state = algo.init(init_key, w0, data)
  fn = jax.jit(fjs.runtime.runner.build_chunk(algo, chunk, check_every_round=False))
  t = time.perf_counter()
  compiled = fn.lower(rounds_key, state, jnp.int32(0), jnp.int32(iterations), data,
                      None).compile()
  compile_s = time.perf_counter() - t
  state, _ = compiled(rounds_key, state, jnp.int32(0), jnp.int32(iterations), data, None)
  jax.block_until_ready(state)  # warm-up chunk
  t = time.perf_counter()
  for r0 in range(chunk, iterations + chunk, chunk):
    state, _ = compiled(rounds_key, state, jnp.int32(r0), jnp.int32(iterations + chunk), data,
                        None)
  jax.block_until_ready(state)
  return compile_s, 1e3 * (time.perf_counter() - t) / iterations, state.server


def pooled_floor(data, model, reduction, repeats: int = 20) -> float:
  """ms of one gradient of the pooled real examples (no padding): the two matrix products an
  iteration cannot avoid — the memory floor the layouts are compared with."""
  keep = np.asarray(data.mask).reshape(-1) > 0
  x = jnp.asarray(np.asarray(data.x).reshape((-1,) + data.x.shape[2:])[keep])
  y = jnp.asarray(np.asarray(data.y).reshape(-1)[keep])
  loss = fjs.models.make_loss(model, reduction)
  grad = jax.jit(jax.grad(loss))
  w = model.init(jax.random.key(0))
  m = jnp.ones(x.shape[0], jnp.float32)
  jax.block_until_ready(grad(w, x, y, m))
  t = time.perf_counter()
  for _ in range(repeats):
    jax.block_until_ready(grad(w, x, y, m))
  return 1e3 * (time.perf_counter() - t) / repeats


def torch_client_loop(data, kind: str, gamma: float, p: float, sparsity: float,
                      iterations: int) -> float | None:
  """ms/iteration of Sparse-ProxSkip written the way the papers' PyTorch code runs it: a
  Python loop over clients (autograd gradient of each client's loss), a coin per iteration,
  Top-K of each client's iterate, averaging and the control-variate update on communication.
  ``None`` when PyTorch is not installed."""
  try:
    import torch
  except ImportError:
    return None
  sizes = np.asarray(data.num_examples)
  x_host, y_host = np.asarray(data.x), np.asarray(data.y)   # sliced on the host: an eager
  # slice of the device array compiles one program per client size
  xs = [torch.from_numpy(x_host[i, :n].copy()) for i, n in enumerate(sizes)]
  ys = [torch.from_numpy(y_host[i, :n].copy()) for i, n in enumerate(sizes)]
  d = xs[0].shape[1]
  shape = (d,) if kind == "ridge" else (d, 10)
  w = [torch.zeros(shape) for _ in xs]
  h = [torch.zeros(shape) for _ in xs]
  k = max(1, int(round((1 - sparsity) * np.prod(shape))))
  gen = torch.Generator().manual_seed(0)
  t = time.perf_counter()
  for _ in range(iterations):
    w_hat = []
    for xi, yi, wi, hi in zip(xs, ys, w, h):
      wi = wi.detach().requires_grad_(True)
      if kind == "ridge":
        loss = 0.5 * torch.sum((xi @ wi - yi) ** 2) + 250.0 * torch.sum(wi ** 2)
      else:
        loss = torch.nn.functional.cross_entropy(xi @ wi, yi.long())
      (g,) = torch.autograd.grad(loss, wi)
      w_hat.append((wi - gamma * (g - hi)).detach())
    if torch.rand((), generator=gen) < p:
      pruned = []
      for v in w_hat:
        flat = v.reshape(-1)
        out = torch.zeros_like(flat)
        idx = torch.topk(flat.abs(), k).indices
        out[idx] = flat[idx]
        pruned.append(out.reshape(shape))
      avg = torch.stack(pruned).mean(0)
      h = [hi + p / gamma * (avg - v) for hi, v in zip(h, pruned)]
      w = [avg.clone() for _ in w_hat]
    else:
      w = w_hat
  return 1e3 * (time.perf_counter() - t) / iterations


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--iterations", type=int, default=300)
  parser.add_argument("--chunk", type=int, default=100)
  parser.add_argument("--sites", type=int, default=554)
  parser.add_argument("--small-clients", type=int, default=1000)
  parser.add_argument("--many-buckets", type=int, default=32,
                      help="buckets of the many-buckets row (compile time against padding)")
  parser.add_argument("--torch-iterations", type=int, default=30,
                      help="iterations of the PyTorch client-loop reference (0: none)")
  parser.add_argument("--out", default="benchmarks/results")
  args = parser.parse_args()
  blog = fjs.data.standins.blogfeedback_standin(args.sites).train
  small = small_clients(args.small_clients)
  problems = {
      "BlogFeedback-shaped (554 sites, d=281)": (
          blog, fjs.models.linear_regression(281, l2=500.0, use_bias=False), "sum", 2e-5),
      "1,000 small clients (softmax 60x10)": (
          small, fjs.models.softmax_regression(60, 10), "mean", 0.1),
  }
  rows, references = [], []
  for pname, (data, model, reduction, gamma) in problems.items():
    algo = fjs.sparse_proxskip(fjs.models.make_loss(model, reduction), gamma, 0.1, 0.9)
    w0 = model.init(jax.random.key(0))
    sizes = np.asarray(data.num_examples)
    layouts = {"padded": data, "auto": fjs.runtime.clients.auto_layout(data),
               f"{args.many_buckets} buckets": fjs.runtime.clients.bucketize(
                   data, min(args.many_buckets, data.num_clients))}
    base = ref = None
    for lname, layout in layouts.items():
      groups = ([np.arange(len(sizes))]
                if not isinstance(layout, fjs.runtime.clients.BucketedData) else
                np.split(np.asarray(layout.order),
                         np.cumsum([b.num_clients for b in layout.buckets])[:-1]))
      compile_s, ms, server = measure(algo, layout, w0, args.iterations, args.chunk)
      base, ref = base or (compile_s, ms), ref or server
      diff = max(float(jnp.max(jnp.abs(a - b))) for a, b in
                 zip(jax.tree.leaves(server), jax.tree.leaves(ref)))
      rows.append({"problem": pname, "layout": lname, "buckets": len(groups),
                   "padded work / real": (fjs.runtime.clients.padded_work(sizes, groups)
                                          / sizes.sum()),
                   "compile s": compile_s, "ms/iteration": ms,
                   "compile vs padded": compile_s / base[0], "speed-up vs padded": base[1] / ms,
                   "max |model - padded model|": diff})
    floor = pooled_floor(data, model, reduction)
    loop = (torch_client_loop(data, "ridge" if reduction == "sum" else "softmax", gamma, 0.1,
                              0.9, args.torch_iterations) if args.torch_iterations else None)
    auto_ms = rows[-2]["ms/iteration"]
    references.append({"problem": pname, "auto ms/iteration": auto_ms,
                       "memory floor ms (pooled gradient)": floor,
                       "auto / floor": auto_ms / floor,
                       "PyTorch client loop ms/iteration": loop,
                       "speed-up vs PyTorch loop": loop / auto_ms if loop else None})
  cols = list(rows[0])
  text = [" | ".join(cols)]
  for r in rows:
    text.append(" | ".join(f"{r[c]:.3g}" if isinstance(r[c], float) else str(r[c])
                           for c in cols))
  print("\n".join(text))
  for r in references:
    print(" | ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in r.items()))
  os.makedirs(args.out, exist_ok=True)
  path = os.path.join(args.out, "bench_layout.json")
  with open(path, "w") as f:
    json.dump({"backend": jax.default_backend(), "device": str(jax.devices()[0]),
               "iterations": args.iterations, "rows": rows, "references": references,
               "torch": _torch_version()}, f, indent=1)
  print(f"wrote {path}")


def _torch_version() -> str | None:
  try:
    import torch
    return f"{torch.__version__}, {torch.get_num_threads()} threads"
  except ImportError:
    return None


if __name__ == "__main__":
  main()
