"""Every family's round against the papers' way: a PyTorch loop over clients.

The papers' code (FedAvg, Ditto, FedMRN, FedSpa, FedP3, Cohort-Squeeze's SPPM-AS) trains one
client after another in a Python loop, each with its own ``torch.nn.Module`` forward/backward per
minibatch.
This script times one round of the library (``jax.jit(algo.step)``, the runner's default client
strategy, :func:`fedjaxsparse.runtime.clients.choose_strategy`) against such a loop written in
PyTorch for the same mathematics — the same architecture, clients, local steps, batch sizes
and the same per-round work the library's round does (its reported loss included) — on the same
CPU threads, repeats interleaved (library, loop, library, loop, …) and medians compared in one
process. The random draws (minibatches, masks, noise) are the loop's own, so the two compute
the same kind of round, not the same numbers; each family's correctness against a loop of the
same draws is tested elsewhere (``tests/``, ``bench_fedmrn.py``, ``bench_scafflix.py``).

Families (CPU-sized; ``--clients`` participate in every round):

* ``fedavg_cnn``: FedAvg's CNN (1.66 M parameters), 5 local SGD steps of 32 images drawn with
  replacement, data-size weighted average;
* ``ditto_cnn``: Ditto on that CNN, 1 global and 1 personal epoch of shuffled batches of 32
  (the personal step adds λ(v − w)), each client's loss at its personal model reported;
* ``fedmrn_cnn``: FedMRN on the FedMRN paper's 4-conv BatchNorm CNN (32, 32, 64, 64), 1 epoch of 64:
  progressive stochastic masking of the seeded noise at every step (straight-through), the
  final stochastic mask uploaded, the server's Σ p_k n_k⊙m_k;
* ``sppm_as_a9a``: SPPM-AS on logistic regression of the a9a shape (d = 123, 100 clients of
  326 rows), τ-nice cohorts of 10, the cohort's prox by 10 GD steps — in the loop every GD step
  asks each cohort member for its gradient;
* ``scafflix_logreg``: one Scafflix iteration (Yi (2025) Algorithm 4) on ℓ2-regularised
  logistic regression, 100 clients of 50 rows, d = 100, unequal γ_i, α = 0.5, p = 0.2: every
  client's full gradient at its personalised point x̃_i, one shared coin, the weighted average
  and control-variate update when it lands.

* ``fedspa_lenet5``: FedSpa (DST) on the Caffe LeNet-5 (431 k parameters with 10 classes), 50 %
  sparse at the library's ERK layer counts, 1 epoch of shuffled batches: the sparse downlink and
  its reported loss, masked SGD, the dense gradient on a fresh batch, per-layer prune (smallest
  |w|) and regrow (largest |g|) of ⌈α·n_l⌉ entries, the uniform average of the updates;
* ``fedp3_cnn``: FedP3 on FedAvg's CNN, the OPU-2 policy (two of the three first layers plus the
  last trained and uploaded, the library's own draw), global pruning keeping 90 % of every other
  kernel, local SGD steps of B drawn with replacement, the mask re-applied after every step,
  the per-layer average over the clients that returned the layer.

PyTorch is not a dependency: without it the script says so and exits.

Usage: python benchmarks/bench_vs_loop.py [--families ...] [--repeats 3] [--clients 10]
       [--tiny] [--out benchmarks/results]
"""
from __future__ import annotations

import argparse
from typing import NamedTuple
import math
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import fedjaxsparse as fjs

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_io  # noqa: E402  (the benchmarks' shared result writer)


def _images(num_clients, per_client, seed=0):
  rng = np.random.default_rng(seed)
  n = num_clients * per_client
  x = rng.normal(size=(n, 28, 28, 1)).astype(np.float32)
  y = rng.integers(0, 10, n).astype(np.int32)
  return x, y, fjs.data.pack_clients(x, y, np.split(np.arange(n), num_clients))


class Work(NamedTuple):
  """A round's training work: ``flops`` (6 × MACs per trained example) and ``products``,
  ``{(M, K, N): count}`` — the matrix products it does (each layer's forward product and the
  two of its backward pass, at the round's batch size), which the roofline times with
  ``jnp.dot``."""
  flops: float
  products: dict


def _work(model, params, data, examples: float, batch: int | None = None) -> Work:
  """The round's :class:`Work` (the papers' FLOPs rule,
  :func:`fedjaxsparse.ops.flops.training_flops`; evaluation passes not counted). With
  ``batch``: its products, from :func:`fedjaxsparse.ops.flops.layer_products` at that batch,
  ``examples / batch`` times each, forward ``[M, K]·[K, N]``, input gradient ``[M, N]·[N, K]``
  and weight gradient ``[K, M]·[M, N]``."""
  shape = data.x.shape[2:]
  macs = fjs.ops.flops.layer_macs(model, params, shape)
  products: dict = {}
  if batch:
    for m, k, n in fjs.ops.flops.layer_products(model, params, shape, batch):
      for key in ((m, k, n), (m, n, k), (k, m, n)):
        products[key] = products.get(key, 0.0) + examples / batch
  return Work(fjs.ops.flops.training_flops(macs, examples=examples), products)


def _dot_rate(m: int, k: int, n: int, repeats: int = 3) -> float:
  """FLOP/s of ``jnp.dot`` on float32 ``[m, k] × [k, n]`` in this process (jitted, warmed up,
  the median of ``repeats`` timings, each long enough to time)."""
  a = jax.device_put(np.random.default_rng(0).standard_normal((m, k), np.float32))
  b = jax.device_put(np.random.default_rng(1).standard_normal((k, n), np.float32))
  dot = jax.jit(jnp.dot)
  jax.block_until_ready(dot(a, b))
  reps = max(1, int(2e8 // max(2 * m * k * n, 1)))   # ~0.2 GFLOP a timing at least
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    for _ in range(reps):
      out = dot(a, b)
    jax.block_until_ready(out)
    times.append((time.perf_counter() - t) / reps)
  return 2.0 * m * k * n / statistics.median(times)


def roofline_seconds(products: dict, rates: dict) -> float:
  """The time the round's products take at ``jnp.dot``'s measured rate on each shape: what a
  round would cost if everything around its products were free."""
  return sum(count * 2.0 * m * k * n / rates[(m, k, n)] for (m, k, n), count in products.items())


def _library_round(algo, params, data):
  """``(one_round() -> blocks, strategy)`` of the library's compiled round."""
  strategy, _ = fjs.runtime.clients.choose_strategy(algo, params, data)
  ex = fjs.runtime.clients.with_strategy(data, strategy)
  state = algo.init(jax.random.key(0), params, ex)
  step = jax.jit(algo.step).lower(jax.random.key(1), state, ex).compile()
  holder = {"s": state, "t": 0}

  def one():
    holder["t"] += 1
    holder["s"], info = step(jax.random.key(holder["t"]), holder["s"], ex)
    jax.block_until_ready(holder["s"])

  return one, strategy


# --- the PyTorch side ---------------------------------------------------------------------

def _torch_cnn(torch, channels=(32, 64), dense=512):
  nn = torch.nn
  return nn.Sequential(
      nn.Conv2d(1, channels[0], 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
      nn.Conv2d(channels[0], channels[1], 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
      nn.Flatten(), nn.Linear(7 * 7 * channels[1], dense), nn.ReLU(), nn.Linear(dense, 10))


def _average_into(torch, target, states, weights):
  with torch.no_grad():
    for name, p in target.state_dict().items():
      p.copy_(sum(w * s[name] for w, s in zip(weights, states)))


def fedavg_cnn(torch, args):
  k, steps, b = args.clients, args.steps, args.batch
  x, y, data = _images(k, steps * b)
  model = fjs.models.cnn((28, 28, 1), 10)
  algo = fjs.fedavg(fjs.models.make_loss(model), optax.sgd(0.05), local_steps=steps,
                    batch_size=b)
  params = model.init(jax.random.key(0))
  lib, strategy = _library_round(algo, params, data)
  work = _work(model, params, data, k * steps * b, b)
  tx = torch.from_numpy(x).permute(0, 3, 1, 2).contiguous().reshape(k, steps * b, 1, 28, 28)
  ty = torch.from_numpy(y).long().reshape(k, steps * b)
  server, local = _torch_cnn(torch), _torch_cnn(torch)
  loss_fn = torch.nn.CrossEntropyLoss()

  def loop():
    states = []
    for i in range(k):                       # one client after another
      local.load_state_dict(server.state_dict())
      opt = torch.optim.SGD(local.parameters(), lr=0.05)
      for _ in range(steps):
        idx = torch.randint(0, steps * b, (b,))   # with replacement, as the library draws
        opt.zero_grad()
        loss_fn(local(tx[i, idx]), ty[i, idx]).backward()
        opt.step()
      states.append({n: p.detach().clone() for n, p in local.state_dict().items()})
    _average_into(torch, server, states, [1.0 / k] * k)

  return lib, loop, strategy, work


def ditto_cnn(torch, args):
  k, b, n = args.clients, args.batch, args.steps * args.batch
  lam, lr = 0.5, 0.05
  x, y, data = _images(k, n)
  model = fjs.models.cnn((28, 28, 1), 10)
  algo = fjs.ditto(fjs.models.make_loss(model), lr, lam=lam, global_epochs=1,
                   personal_epochs=1, batch_size=b, cohort_size=None)
  params = model.init(jax.random.key(0))
  lib, strategy = _library_round(algo, params, data)
  work = _work(model, params, data, k * 2 * n, b)   # a global and a personal epoch
  tx = torch.from_numpy(x).permute(0, 3, 1, 2).contiguous().reshape(k, n, 1, 28, 28)
  ty = torch.from_numpy(y).long().reshape(k, n)
  server, local, personal = _torch_cnn(torch), _torch_cnn(torch), _torch_cnn(torch)
  personal_states = [{m: p.detach().clone() for m, p in server.state_dict().items()}
                     for _ in range(k)]
  loss_fn = torch.nn.CrossEntropyLoss()

  def loop():
    states = []
    for i in range(k):
      personal.load_state_dict(personal_states[i])
      with torch.no_grad():                   # the reported loss at v_k on its data
        loss_fn(personal(tx[i]), ty[i])
      local.load_state_dict(server.state_dict())
      opt = torch.optim.SGD(local.parameters(), lr=lr)
      for idx in torch.randperm(n).split(b):   # one global epoch
        opt.zero_grad()
        loss_fn(local(tx[i, idx]), ty[i, idx]).backward()
        opt.step()
      centre = [p.detach() for p in server.parameters()]
      for idx in torch.randperm(n).split(b):   # one personal epoch with the prox pull
        personal.zero_grad()
        loss_fn(personal(tx[i, idx]), ty[i, idx]).backward()
        with torch.no_grad():
          for p, c in zip(personal.parameters(), centre):
            p -= lr * (p.grad + lam * (p - c))
      personal_states[i] = {m: p.detach().clone() for m, p in personal.state_dict().items()}
      states.append({m: p.detach().clone() for m, p in local.state_dict().items()})
    _average_into(torch, server, states, [1.0 / k] * k)

  return lib, loop, strategy, work


def fedmrn_cnn(torch, args):
  k, b, n = args.clients, 64, args.fedmrn_examples
  channels, alpha, lr = args.bn_channels, 1e-2, 0.05
  x, y, data = _images(k, n)
  model = fjs.models.bn_cnn((28, 28, 1), 10, channels=channels)
  algo = fjs.fedmrn(fjs.models.make_loss(model), lr, epochs=1, batch_size=b,
                    noise_scale=alpha, cohort_size=None)
  params = model.init(jax.random.key(0))
  lib, strategy = _library_round(algo, params, data)
  work = _work(model, params, data, k * n, b)
  tx = torch.from_numpy(x).permute(0, 3, 1, 2).contiguous().reshape(k, n, 1, 28, 28)
  ty = torch.from_numpy(y).long().reshape(k, n)
  F = torch.nn.functional
  shapes, cin = [], 1
  for c in channels:
    shapes += [(c, cin, 3, 3), (c,), (c,)]   # conv kernel (no bias), BatchNorm scale, bias
    cin = c
  hw = 28 // 2 ** (len(channels) // 2)
  shapes += [(hw * hw * cin, 10), (10,)]
  w = [torch.randn(s) * 0.05 for s in shapes]

  def forward(params, xb):
    h = xb
    for j in range(len(channels)):
      kern, scale, bias = params[3 * j:3 * j + 3]
      h = F.conv2d(h, kern, padding=1)
      h = F.relu(F.batch_norm(h, None, None, scale, bias, training=True))   # batch statistics
      if j % 2 == 1:
        h = F.max_pool2d(h, 2)
    return h.flatten(1) @ params[-2] + params[-1]

  steps = -(-n // b)

  def loop():
    delta = [torch.zeros_like(a) for a in w]
    for i in range(k):
      g = torch.Generator().manual_seed(i)       # the client's seed: its noise n_k
      noise = [(torch.rand(a.shape, generator=g) * 2 - 1) * alpha for a in w]
      with torch.no_grad():
        F.cross_entropy(forward(w, tx[i]), ty[i])   # the reported loss at w^t
      u = [torch.zeros_like(a, requires_grad=True) for a in w]
      for t, idx in enumerate(torch.randperm(n).split(b)):
        p = (t + 1) / steps
        fwd = []
        for ui, ni in zip(u, noise):             # PSM (eq. 10) with the straight-through
          with torch.no_grad():
            prob = torch.clamp(ui / ni, 0, 1)
            masked = ni * torch.bernoulli(prob)
            clipped = torch.minimum(torch.maximum(ui, torch.clamp(ni, max=0)),
                                    torch.clamp(ni, min=0))
            hat = torch.where(torch.rand(ui.shape) < p, masked, clipped)
          fwd.append(ui + (hat - ui).detach())
        loss = F.cross_entropy(forward([a + v for a, v in zip(w, fwd)], tx[i, idx]), ty[i, idx])
        grads = torch.autograd.grad(loss, u)
        with torch.no_grad():
          for ui, gi in zip(u, grads):
            ui -= lr * gi
      with torch.no_grad():                        # upload M(u, n); the server adds p_k n⊙m
        for dj, ui, ni in zip(delta, u, noise):
          dj += (1.0 / k) * ni * torch.bernoulli(torch.clamp(ui / ni, 0, 1))
    for a, dj in zip(w, delta):
      a += dj

  return lib, loop, strategy, work


def _torch_lenet5(torch, classes=10):
  nn = torch.nn
  return nn.Sequential(
      nn.Conv2d(1, 20, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(20, 50, 5), nn.ReLU(),
      nn.MaxPool2d(2), nn.Flatten(), nn.Linear(800, 500), nn.ReLU(), nn.Linear(500, classes))


def fedspa_lenet5(torch, args):
  k, b, n = args.clients, args.batch, args.steps * args.batch
  sparsity, lr, alpha = 0.5, 0.05, 0.5       # round 0 of the cosine drop schedule: α_0
  x, y, data = _images(k, n)
  model = fjs.models.lenet5_caffe((28, 28, 1), 10)
  algo = fjs.fedspa(fjs.models.make_loss(model), lr, num_rounds=100, sparsity=sparsity,
                    epochs=1, batch_size=b, cohort_size=None)
  params = model.init(jax.random.key(0))
  lib, strategy = _library_round(algo, params, data)
  work = _work(model, params, data, k * n, b)
  tx = torch.from_numpy(x).permute(0, 3, 1, 2).contiguous().reshape(k, n, 1, 28, 28)
  ty = torch.from_numpy(y).long().reshape(k, n)
  server, local = _torch_lenet5(torch), _torch_lenet5(torch)
  kernels = [m.weight for m in local if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
  # the library's exact ERK counts per kernel, one shared initial mask (FedSpa's default)
  counts = [c["kernel"] for c in fjs.ops.masks.layer_counts(
      params, fjs.ops.masks.layer_densities(params, sparsity, "erk")).values()]
  first = []
  for wk, c in zip(kernels, counts):
    m = torch.zeros(wk.numel(), dtype=torch.bool)
    m[torch.randperm(wk.numel())[:c]] = True
    first.append(m.reshape(wk.shape))
  masks = [list(first) for _ in range(k)]
  loss_fn = torch.nn.CrossEntropyLoss()

  def loop():
    total = [torch.zeros_like(p) for p in server.parameters()]
    for i in range(k):
      local.load_state_dict(server.state_dict())
      with torch.no_grad():                    # the sparse downlink m_k⊙w
        for wk, m in zip(kernels, masks[i]):
          wk.mul_(m)
        loss_fn(local(tx[i]), ty[i])           # the reported loss at it
      start = [p.detach().clone() for p in local.parameters()]
      for idx in torch.randperm(n).split(b):   # one epoch of masked SGD
        local.zero_grad()
        loss_fn(local(tx[i, idx]), ty[i, idx]).backward()
        with torch.no_grad():
          for wk, m in zip(kernels, masks[i]):
            wk.grad.mul_(m)
          for p in local.parameters():
            p -= lr * p.grad
      local.zero_grad()                        # DST: the dense gradient on a fresh batch
      idx = torch.randperm(n)[:b]
      loss_fn(local(tx[i, idx]), ty[i, idx]).backward()
      with torch.no_grad():
        new = []
        for wk, m in zip(kernels, masks[i]):   # prune the ⌈α n_l⌉ smallest |w|, regrow by |g|
          active = int(m.sum())
          c = math.ceil(alpha * active)
          keep_score = torch.where(m, wk.abs(), torch.tensor(-1.0)).flatten()
          kept = torch.zeros(m.numel(), dtype=torch.bool)
          kept[torch.topk(keep_score, active - c).indices] = True
          grow_score = torch.where(kept, torch.tensor(-1.0), wk.grad.abs().flatten())
          kept[torch.topk(grow_score, c).indices] = True
          new.append(kept.reshape(m.shape))
        masks[i] = new
        for acc, s0, p in zip(total, start, local.parameters()):
          acc += (s0 - p) / k                   # U_k, uniform weights 1/S
    with torch.no_grad():
      for p, acc in zip(server.parameters(), total):
        p -= acc

  return lib, loop, strategy, work


def fedp3_cnn(torch, args):
  k, steps, b, keep, lr = args.clients, args.steps, args.batch, 0.9, 0.05
  x, y, data = _images(k, steps * b)
  model = fjs.models.cnn((28, 28, 1), 10)
  params = model.init(jax.random.key(0))
  names = fjs.ops.layer_groups.layer_names(params, 1)
  train = fjs.algorithms.fedp3.layer_policy(jax.random.key(1), k, len(names), "opu2")
  cfg = fjs.algorithms.fedp3.make_config(jax.random.key(2), train, keep)
  algo = fjs.fedp3(fjs.models.make_loss(model), optax.sgd(lr), cfg, local_steps=steps,
                   batch_size=b)
  lib, strategy = _library_round(algo, params, data)
  work = _work(model, params, data, k * steps * b, b)
  tx = torch.from_numpy(x).permute(0, 3, 1, 2).contiguous().reshape(k, steps * b, 1, 28, 28)
  ty = torch.from_numpy(y).long().reshape(k, steps * b)
  server, local = _torch_cnn(torch), _torch_cnn(torch)
  layers = [m for m in local if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
  server_layers = [m for m in server if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
  selected = np.asarray(train)                 # L_i: the same policy draw as the library's
  pmask = []                                   # P_i: round(r·numel) kernel entries kept
  for i in range(k):
    row = []
    for l, m in enumerate(layers):
      mk = torch.ones(m.weight.numel(), dtype=torch.bool)
      if not selected[i, l]:
        mk[:] = False
        mk[torch.randperm(mk.numel())[:round(keep * mk.numel())]] = True
      row.append(mk.reshape(m.weight.shape))
    pmask.append(row)
  loss_fn = torch.nn.CrossEntropyLoss()

  def loop():
    sums = [[torch.zeros_like(m.weight), torch.zeros_like(m.bias), 0] for m in layers]
    for i in range(k):
      local.load_state_dict(server.state_dict())
      with torch.no_grad():
        for m, mk in zip(layers, pmask[i]):
          m.weight.mul_(mk)
      opt = torch.optim.SGD(local.parameters(), lr=lr)
      for _ in range(steps):                    # K steps of B drawn with replacement
        idx = torch.randint(0, steps * b, (b,))
        opt.zero_grad()
        loss_fn(local(tx[i, idx]), ty[i, idx]).backward()
        opt.step()
        with torch.no_grad():                   # pruned entries stay zero
          for m, mk in zip(layers, pmask[i]):
            m.weight.mul_(mk)
      for l, m in enumerate(layers):            # upload L_i only
        if selected[i, l]:
          sums[l][0] += m.weight.detach()
          sums[l][1] += m.bias.detach()
          sums[l][2] += 1
    with torch.no_grad():                       # per-layer average over who returned it
      for m, (sw, sb, c) in zip(server_layers, sums):
        if c:
          m.weight.copy_(sw / c)
          m.bias.copy_(sb / c)

  return lib, loop, strategy, work


def sppm_as_a9a(torch, args):
  n_clients, rows, d, tau, iters, lr, gamma = 100, 326, 123, 10, 10, 0.1, 1.0
  if args.tiny:
    n_clients, rows = 10, 20
  rng = np.random.default_rng(0)
  x = rng.normal(size=(n_clients * rows, d)).astype(np.float32)
  y = rng.integers(0, 2, n_clients * rows).astype(np.int32)
  data = fjs.data.pack_clients(x, y, np.split(np.arange(n_clients * rows), n_clients))
  model = fjs.models.logistic_regression(d)
  algo = fjs.sppm_as(fjs.models.make_loss(model), fjs.sampling.nice(n_clients, tau), gamma,
                     fjs.convex.prox_solvers.gd(lr, iters))
  params = model.init(jax.random.key(0))
  lib, strategy = _library_round(algo, params, data)
  work = _work(model, params, data, tau * iters * rows)
  tx = torch.from_numpy(x).reshape(n_clients, rows, d)
  sign = torch.from_numpy(2.0 * y - 1).float().reshape(n_clients, rows)
  xt = torch.zeros(d)

  def loop():
    cohort = torch.randperm(n_clients)[:tau]
    v = xt.clone()
    for _ in range(iters):                 # each GD step of the prox asks every member
      g = (v - xt) / gamma
      for i in cohort.tolist():
        vi = v.clone().requires_grad_(True)
        fi = torch.nn.functional.softplus(-sign[i] * (tx[i] @ vi)).mean()
        g = g + torch.autograd.grad(fi, vi)[0] / tau
      v = v - lr * g
    xt.copy_(v)

  return lib, loop, strategy, work


def scafflix_logreg(torch, args):
  n_clients, rows, d, mu, p, alpha = 100, 50, 100, 0.1, 0.2, 0.5
  if args.tiny:
    n_clients, rows = 4, 10
  rng = np.random.default_rng(0)
  x = rng.normal(size=(n_clients * rows, d)).astype(np.float32)
  x *= rng.uniform(0.5, 2.0, (n_clients * rows, 1)).astype(np.float32)   # unequal L_i
  y = rng.integers(0, 2, n_clients * rows).astype(np.int32)
  data = fjs.data.pack_clients(x, y, np.split(np.arange(n_clients * rows), n_clients))
  model = fjs.models.logistic_regression(d, l2=mu)
  params = model.init(jax.random.key(0))
  gammas = rng.uniform(0.05, 0.2, n_clients).astype(np.float32)
  x_star = jax.tree.map(lambda a: jnp.asarray(rng.normal(size=(n_clients,) + a.shape) * 0.1,
                                              a.dtype), params)
  algo = fjs.scafflix(fjs.models.make_loss(model), jnp.asarray(gammas), p, alpha, x_star)
  lib, strategy = _library_round(algo, params, data)
  work = _work(model, params, data, n_clients * rows)
  tx = torch.from_numpy(x).reshape(n_clients, rows, d)
  sign = torch.from_numpy(2.0 * y - 1).float().reshape(n_clients, rows)
  star = torch.from_numpy(np.array(jax.tree.leaves(x_star)[0]).reshape(n_clients, d))
  g = torch.from_numpy(gammas)
  w = alpha ** 2 / g
  w = w / w.sum()
  xs, hs = torch.zeros(n_clients, d), torch.zeros(n_clients, d)

  def loop():   # one iteration: every client's gradient at its personalised point, one coin
    hat = torch.empty_like(xs)
    for i in range(n_clients):
      xt = (alpha * xs[i] + (1 - alpha) * star[i]).requires_grad_(True)
      fi = (torch.nn.functional.softplus(-sign[i] * (tx[i] @ xt)).mean()
            + 0.5 * mu * xt.square().sum())
      gi = torch.autograd.grad(fi, xt)[0]
      hat[i] = xs[i] - (g[i] / alpha) * (gi - hs[i])
    if torch.rand(()) < p:
      bar = (w[:, None] * hat).sum(0)
      hs.add_((p * alpha / g)[:, None] * (bar - hat))
      xs.copy_(bar.expand_as(xs))
    else:
      xs.copy_(hat)

  return lib, loop, strategy, work


FAMILIES = {"fedavg_cnn": fedavg_cnn, "ditto_cnn": ditto_cnn, "fedmrn_cnn": fedmrn_cnn,
            "fedspa_lenet5": fedspa_lenet5, "fedp3_cnn": fedp3_cnn,
            "sppm_as_a9a": sppm_as_a9a, "scafflix_logreg": scafflix_logreg}


def main(argv=None) -> dict | None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--families", nargs="*", choices=tuple(FAMILIES), default=list(FAMILIES))
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--clients", type=int, default=10)
  p.add_argument("--steps", type=int, default=5, help="local steps (FedAvg; Ditto's epochs)")
  p.add_argument("--batch", type=int, default=32)
  p.add_argument("--fedmrn-examples", type=int, default=128, dest="fedmrn_examples")
  p.add_argument("--bn-channels", type=int, nargs=4, default=[32, 32, 64, 64],
                 dest="bn_channels")
  p.add_argument("--tiny", action="store_true", help="toy sizes (the test suite)")
  p.add_argument("--out", default="benchmarks/results")
  args = p.parse_args(argv)
  try:
    import torch
  except ImportError:
    print("PyTorch is not installed: the loop rows need it (pip install torch; it is not a "
          "dependency of fedjaxsparse).")
    return None
  if args.tiny:
    args.clients, args.steps, args.batch, args.repeats = 2, 1, 4, 1
    args.fedmrn_examples, args.bn_channels = 8, [2, 2, 2, 2]
  torch.set_num_threads(os.cpu_count())
  torch.manual_seed(0)
  rows = []
  for name in args.families:
    lib, loop, strategy, work = FAMILIES[name](torch, args)
    lib(), loop()                      # warm-up (the library's round is compiled ahead)
    lib_t, loop_t = [], []
    for _ in range(args.repeats):      # interleaved
      for fn, acc in ((lib, lib_t), (loop, loop_t)):
        t = time.perf_counter()
        fn()
        acc.append(time.perf_counter() - t)
    row = {"family": name, "strategy": strategy, "library ms": 1e3 * statistics.median(lib_t),
           "torch loop ms": 1e3 * statistics.median(loop_t)}
    row["speed-up"] = row["torch loop ms"] / row["library ms"]
    # the round's training work; both sides do it, so the rates compare them
    row["gflop per round"] = work.flops / 1e9
    row["library GFLOP/s"] = row["gflop per round"] / (row["library ms"] / 1e3)
    row["loop GFLOP/s"] = row["gflop per round"] / (row["torch loop ms"] / 1e3)
    roof = ""
    if work.products:   # the roofline: jnp.dot on the round's own product shapes, same process
      rates = {shape: _dot_rate(*shape) for shape in work.products}
      row["dot roofline ms"] = 1e3 * roofline_seconds(work.products, rates)
      row["dot GFLOP/s"] = (sum(c * 2.0 * m * k * n for (m, k, n), c in work.products.items())
                            / (row["dot roofline ms"] / 1e3) / 1e9)
      row["library % of roofline"] = 100 * row["dot roofline ms"] / row["library ms"]
      row["loop % of roofline"] = 100 * row["dot roofline ms"] / row["torch loop ms"]
      roof = (f"; jnp.dot on its products {row['dot roofline ms']:.1f} ms = "
              f"{row['library % of roofline']:.0f} % of the library's round")
    rows.append(row)
    print(f"{name:14s} library ({strategy}) {row['library ms']:10.1f} ms   PyTorch loop "
          f"{row['torch loop ms']:10.1f} ms   {row['speed-up']:.2f}x   "
          f"({row['gflop per round']:.3g} GFLOP: {row['library GFLOP/s']:.3g} vs "
          f"{row['loop GFLOP/s']:.3g} GFLOP/s{roof})", flush=True)
  result = {"config": vars(args), **bench_io.environment(), "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "rows": rows}
  bench_io.write_result(result, args.out, "bench_vs_loop")
  return result


if __name__ == "__main__":
  main()
