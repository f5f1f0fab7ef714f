"""Time one FedMRN round (the FedMRN paper's Algorithm 1, ``fedjaxsparse.algorithms.fedmrn``): the
library's compiled round against a per-client Python loop doing the same mathematics (the
PyTorch-style reference), in the same process, from the same key, parameters and data.

Round: K of N clients (``--cohort`` of ``--clients``), each with n_k examples (unequal, about
``--examples`` ± 1/6, so the S_k differ), trains a mask over its seeded noise for
S_k = E·⌈n_k/B⌉ progressive-stochastic-masking (PSM) SGD steps (``--epochs`` E, ``--batch``
B, learning rate ``--lr``, noise uniform on ±1e-2), uploads M(u, n_k), and the server sets
w ← w + Σ_k p_k n_k⊙m_k (p_k = n_k/Σ_j n_j). Model: the 4-conv BatchNorm CNN
``bn_cnn((28, 28), 10, --channels)``; data: Fashion-MNIST-shaped synthetic images (28×28
grayscale in [0, 1], 10 classes, a faint class pattern plus noise).

Timed variants (each compiled ahead with ``jax.jit(...).lower(...).compile()``, compile
seconds reported apart; every timing ends with ``jax.block_until_ready``):

  * ``library``: ``jax.jit(algo.step)`` for ``fedmrn(loss, lr, epochs=E, batch_size=B,
    cohort_size=K, noise_scale=1e-2)`` — the cohort's clients vmapped (a batched ``while``
    loop: every client waits for the cohort's largest S_k, its own steps done); one
    warm-up, then the median of ``--repeats`` rounds.
  * ``library (<strategy>)``: the same step with the clients run by the strategy the runner
    picks on this backend (:func:`fedjaxsparse.runtime.clients.choose_strategy`: on CPU,
    ``"map"`` — one client after another, each its own S_k steps — for clients of at least
    ``MAP_MIN_FLOPS`` a step), when it is not ``vmap``.
  * ``loop``: a Python ``for`` over the K cohort clients and, inside it, a Python ``for``
    over that client's S_k steps, each ONE call of a jitted PSM step (regenerate the client's
    noise from its seed, draw its minibatch, form the progressively masked update û, the
    gradient at w + û, u ← u − η·grad); then one jitted call for the client's final stochastic
    mask and one adding p_k n_k⊙m_k (noise regenerated from the seed, as the server does) to
    the running update; finally w + Σ. The cohort and per-client keys come from one jitted
    call. Median of ``--loop-repeats`` rounds (no warm-up: its pieces are compiled ahead).
  * ``per-client jit``: the same loop over clients, but each client's whole local training
    (a ``lax.fori_loop`` over its own S_k steps, its mask, and its loss at w^t on its data,
    which the library's round reports) is one jitted call; one
    warm-up, median of ``--loop-repeats`` rounds (``--skip-per-client-jit`` leaves it out).

The references reproduce ``fedmrn``'s randomness key for key: ``split(key, 3)`` → cohort,
client (and uplink) keys; ``sample_cohort``; ``client_keys`` (each client's key is its noise
seed); ``tree_noise``; ``split(fold_in(k_client, 1), 3)`` → order, PSM, final-mask keys; ``epoch_minibatch`` and ``fold_in(k_psm, t)`` per step. So
their new parameters equal the library's up to float rounding (a different fusion and
summation order): ``max_abs_diff`` is the largest difference, and ``frac_diff_gt_1e-5`` the
fraction of parameter entries differing by more than 1e-5 — an entry's mask bit (or a PSM
routing bit during training) can flip when a Bernoulli draw ties its probability to within
the rounding, which moves that entry by p_k·|n_k| (up to p_k·1e-2).

``examples_per_s`` counts Σ_k S_k·B examples (the real work; the library's padded steps are
not counted) per second of a round; ``speedup`` is the loop's seconds over the variant's.

Usage: python benchmarks/bench_fedmrn.py [--clients 100] [--cohort 10] [--epochs 10]
       [--batch 64] [--examples 600] [--channels 32 32 64 64] [--out benchmarks/results]
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

import fedjaxsparse as fjs

NOISE_SCALE = 1e-2
CLASSES = 10


def make_data(num_clients: int, mean_examples: int, seed: int = 0):
  """Fashion-MNIST-shaped synthetic clients with n_k uniform in mean ± mean/6."""
  rng = np.random.default_rng(seed)
  spread = mean_examples // 6
  sizes = rng.integers(max(1, mean_examples - spread), mean_examples + spread + 1,
                       num_clients)
  n = int(sizes.sum())
  y = rng.integers(0, CLASSES, n).astype(np.int32)
  patterns = rng.uniform(0, 1, (CLASSES, 28, 28)).astype(np.float32)
  x = np.clip(0.3 * patterns[y] + rng.uniform(0, 0.7, (n, 28, 28)), 0, 1).astype(np.float32)
  bounds = np.concatenate([[0], np.cumsum(sizes)])
  return fjs.data.pack_clients(x, y, [np.arange(bounds[i], bounds[i + 1])
                                      for i in range(num_clients)])


def compile_ahead(fn, *args):
  """(compiled ``jax.jit(fn)`` for ``args``, seconds to lower and compile)."""
  t = time.perf_counter()
  compiled = jax.jit(fn).lower(*args).compile()
  return compiled, time.perf_counter() - t


def median_time(fn, repeats: int, warmup: bool) -> tuple[float, object]:
  """(median seconds over ``repeats`` calls, the last result)."""
  if warmup:
    jax.block_until_ready(fn())
  times, out = [], None
  for _ in range(repeats):
    t = time.perf_counter()
    out = jax.block_until_ready(fn())
    times.append(time.perf_counter() - t)
  return statistics.median(times), out


def bench(args) -> tuple[list[dict], dict]:
  E, B, K, lr = args.epochs, args.batch, args.cohort, args.lr
  data = make_data(args.clients, args.examples)
  model = fjs.models.bn_cnn((28, 28), CLASSES, tuple(args.channels))
  loss = fjs.models.make_loss(model)
  w0 = model.init(jax.random.key(0))
  key = jax.random.key(1)
  d = sum(int(a.size) for a in jax.tree.leaves(w0))

  # --- library: the compiled round ------------------------------------------------------
  algo = fjs.fedmrn(loss, lr, epochs=E, batch_size=B, cohort_size=K, noise_scale=NOISE_SCALE)
  state = algo.init(None, w0, data)
  lib_step, lib_compile = compile_ahead(algo.step, key, state, data)
  lib_s, (lib_state, _) = median_time(lambda: lib_step(key, state, data), args.repeats, True)
  lib_params = lib_state.params
  # the client strategy the runner would pick here (clients.choose_strategy), when not vmap
  strategy, why = fjs.runtime.clients.choose_strategy(algo, w0, data)
  auto = None
  if strategy != "vmap":
    ex = fjs.runtime.clients.with_strategy(data, strategy)
    auto_step, auto_compile = compile_ahead(algo.step, key, state, ex)
    auto_s, (auto_state, _) = median_time(lambda: auto_step(key, state, ex), args.repeats, True)
    auto = (f"library ({strategy})", auto_s, auto_compile, auto_state.params)

  # --- the pieces the references share ----------------------------------------------------
  noise_masks = fjs.ops.noise_masks  # FedMRN's masked noise

  def round_keys(key):
    k_cohort, k_clients, _ = jax.random.split(key, 3)
    ids = fjs.sampling.sample_cohort(k_cohort, data.num_clients, K)
    k_noise = fjs.sampling.client_keys(k_clients, ids)      # each client's seed
    return ids, k_noise, jax.vmap(lambda k: jax.random.fold_in(k, 1))(k_noise)

  grad = jax.grad(lambda v, w, x, y, m: loss(jax.tree.map(jnp.add, w, v), x, y, m))

  def psm_step(u, w, row, k_noise, k_train, t, s_k):
    """One local step of one client: noise from its seed, minibatch t, PSM, SGD on u."""
    noise = noise_masks.tree_noise(k_noise, w, NOISE_SCALE)
    k_order, k_psm, _ = jax.random.split(k_train, 3)
    x, y, bm = fjs.ops.local.epoch_minibatch(k_order, row, B, t)
    p = noise_masks.pm_probability(t, s_k)
    at = noise_masks.tree_map_keyed(
        lambda k, ui, ni: noise_masks.progressive(k, ui, ni, p, False),
        jax.random.fold_in(k_psm, t), u, noise)
    return jax.tree.map(lambda ui, gi: ui - lr * gi, u, grad(at, w, x, y, bm))

  def final_mask(u, w, k_noise, k_train):
    noise = noise_masks.tree_noise(k_noise, w, NOISE_SCALE)
    k_final = jax.random.split(k_train, 3)[2]
    return noise_masks.tree_map_keyed(
        lambda k, ui, ni: noise_masks.stochastic_mask(k, ui, ni, False).astype(jnp.int8),
        k_final, u, noise)

  def accumulate(delta, w, k_noise, mask, p_k):
    """The server: regenerate n_k from the seed, add p_k n_k⊙m_k."""
    noise = noise_masks.tree_noise(k_noise, w, NOISE_SCALE)
    return jax.tree.map(lambda a, n, m: a + p_k * (n * m.astype(n.dtype)), delta, noise, mask)

  def local_training(w, row, k_noise, k_train, s_k):
    u = jax.lax.fori_loop(0, s_k, lambda t, u: psm_step(u, w, row, k_noise, k_train, t, s_k),
                          jax.tree.map(jnp.zeros_like, w))
    # the round reports each participant's loss at w^t on its data, as the library's does
    return final_mask(u, w, k_noise, k_train), loss(w, row.x, row.y, row.mask)

  add = lambda w, delta: jax.tree.map(jnp.add, w, delta)
  # Clients' datasets as separate device arrays (a PyTorch-style loop's per-client datasets).
  rows = [jax.tree.map(lambda a: a[i], data) for i in range(data.num_clients)]
  sizes = np.asarray(data.num_examples)
  i32, f32 = np.int32, np.float32
  zeros = jax.tree.map(jnp.zeros_like, w0)
  k0 = jax.random.key(0)
  c_keys, t_keys = compile_ahead(round_keys, key)
  c_step, t_step = compile_ahead(psm_step, zeros, w0, rows[0], k0, k0, i32(0), i32(1))
  c_mask, t_mask = compile_ahead(final_mask, zeros, w0, k0, k0)
  mask0 = jax.tree.map(lambda a: a.astype(jnp.int8), zeros)
  c_acc, t_acc = compile_ahead(accumulate, zeros, w0, k0, mask0, f32(0))
  c_add, t_add = compile_ahead(add, w0, zeros)
  if not args.skip_per_client_jit:
    c_local, t_local = compile_ahead(local_training, w0, rows[0], k0, k0, i32(1))

  ids = np.asarray(c_keys(key)[0])
  s = {int(i): int(fjs.ops.local.epoch_steps(int(sizes[i]), B, E)) for i in ids}
  weights = np.asarray(fjs.aggregation.client_weights(jnp.asarray(sizes[ids]), "num_examples"), f32)
  examples = B * sum(s.values())

  def loop_round():
    ids, noise_keys, train_keys = c_keys(key)
    delta = zeros
    for j, i in enumerate(np.asarray(ids)):
      row, kn, kt, s_k = rows[i], noise_keys[j], train_keys[j], s[int(i)]
      u = zeros
      for t in range(s_k):
        u = c_step(u, w0, row, kn, kt, i32(t), i32(s_k))
      delta = c_acc(delta, w0, kn, c_mask(u, w0, kn, kt), weights[j])
    return c_add(w0, delta)

  def per_client_round():
    ids, noise_keys, train_keys = c_keys(key)
    delta = zeros
    for j, i in enumerate(np.asarray(ids)):
      kn = noise_keys[j]
      mask, _ = c_local(w0, rows[i], kn, train_keys[j], i32(s[int(i)]))
      delta = c_acc(delta, w0, kn, mask, weights[j])
    return c_add(w0, delta)

  loop_s, loop_params = median_time(loop_round, args.loop_repeats, False)
  variants = [("library", lib_s, lib_compile, lib_params),
              ("loop", loop_s, t_keys + t_step + t_mask + t_acc + t_add, loop_params)]
  if auto is not None:
    variants.insert(1, auto)
  if not args.skip_per_client_jit:
    pcj_s, pcj_params = median_time(per_client_round, args.loop_repeats, True)
    variants.append(("per-client jit", pcj_s, t_keys + t_local + t_acc + t_add, pcj_params))

  def compare(params):
    diffs = [np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))
             for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(lib_params))]
    return (float(max(x.max() for x in diffs)),
            float(sum(int((x > 1e-5).sum()) for x in diffs)) / d)

  rows_out = []
  for name, secs, comp, params in variants:
    diff, frac = compare(params)
    rows_out.append({"variant": name, "seconds_per_round": secs, "speedup": loop_s / secs,
                     "examples_per_s": examples / secs, "compile_s": comp,
                     "max_abs_diff": diff, "frac_diff_gt_1e-5": frac})
  info = {"params": d, "cohort_ids": [int(i) for i in ids],
          "local_steps": [s[int(i)] for i in ids],
          "max_local_steps": E * -(-int(sizes.max()) // B), "examples_per_round": examples}
  return rows_out, info


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--clients", type=int, default=100, help="population N")
  p.add_argument("--cohort", type=int, default=10, help="clients per round K")
  p.add_argument("--epochs", type=int, default=10, help="local epochs E")
  p.add_argument("--batch", type=int, default=64, help="local batch size B")
  p.add_argument("--examples", type=int, default=600, help="mean examples per client")
  p.add_argument("--channels", type=int, nargs=4, default=[32, 32, 64, 64])
  p.add_argument("--lr", type=float, default=0.1, help="local SGD step")
  p.add_argument("--repeats", type=int, default=3, help="library rounds timed")
  p.add_argument("--loop-repeats", type=int, default=1, dest="loop_repeats",
                 help="reference rounds timed (each variant)")
  p.add_argument("--skip-per-client-jit", action="store_true", dest="skip_per_client_jit",
                 help="leave out the per-client jit variant (saves its compile)")
  p.add_argument("--out", default="benchmarks/results")
  args = p.parse_args()
  if not 1 <= args.cohort <= args.clients:
    p.error("--cohort must be in [1, --clients].")
  if min(args.epochs, args.batch, args.examples, args.repeats, args.loop_repeats,
         *args.channels) < 1:
    p.error("--epochs, --batch, --examples, --channels and the repeats must be >= 1.")
  rows, info = bench(args)
  cols = ["variant", "seconds_per_round", "speedup", "examples_per_s", "compile_s",
          "max_abs_diff", "frac_diff_gt_1e-5"]
  print(f"FedMRN round, bn_cnn channels={tuple(args.channels)} (d={info['params']}), "
        f"{args.cohort} of {args.clients} clients, ~{args.examples} ex/client, "
        f"E={args.epochs}, B={args.batch}, S_k={info['local_steps']} "
        f"(library runs S_max={info['max_local_steps']}), backend={jax.default_backend()} "
        f"({jax.device_count()} device(s))")
  print("  ".join(f"{c:>17s}" for c in cols))
  for r in rows:
    print("  ".join(f"{r[c]:>17.4g}" if isinstance(r[c], float) else f"{r[c]:>17s}"
                    for c in cols))
  os.makedirs(args.out, exist_ok=True)
  path = os.path.join(args.out, "bench_fedmrn.json")
  dev = jax.devices()[0]
  with open(path, "w") as f:
    json.dump({"config": vars(args), **info, "backend": jax.default_backend(),
               "platform": dev.platform, "device_kind": dev.device_kind, "jax": jax.__version__,
               "devices": [str(x) for x in jax.devices()], "machine": platform.machine(),
               "python_platform": platform.platform(), "cpu_count": os.cpu_count(),
               "rows": rows}, f, indent=1)
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
