"""The GPU suite: one command for the short windows in which an accelerator is at hand.

    PYTHONPATH=. python benchmarks/gpu_suite.py --out benchmarks/results/gpu \
        [--fmnist DIR] [--budget-s 500]
    PYTHONPATH=. python benchmarks/gpu_suite.py --tiny --out /tmp/gpu_tiny    # CPU, < 1 min
    PYTHONPATH=. python benchmarks/gpu_suite.py --estimate                    # no timing

Sections run most valuable first; ``suite.json`` (device, JAX version, every finished row) is
rewritten after every row, so a window that closes early still leaves numbers; a section that
would start after ``--budget-s`` is skipped, saying so. Needs only JAX, flax, optax, numpy and
scikit-learn (no tensorflow-datasets, no dp-accounting): the data are synthetic arrays of the
papers' shapes (timings do not depend on the values), except FedMRN's table, which reads the
Fashion-MNIST IDX files from ``--fmnist``.

Every family's round is timed three ways (ms per round: median over ``--repeats``
steady-state rounds, each ending with ``block_until_ready``; compile seconds apart; peak device
memory where the backend reports it; the round's training FLOPs — 6 × a forward pass's MACs
per trained example, the papers' rule — and the achieved GFLOP/s):

* ``library``: ``jit(algo.step)`` on the whole population, the clients run by the strategy the
  runner's default picks on this backend (:func:`fedjaxsparse.runtime.clients.choose_strategy`);
* ``per-client jit loop``: the fedjax / Flower / papers' way — a Python loop over the round's
  clients, each ONE call of the same jitted round program on a one-client dataset (its local
  training and its share of the server's work; the same steps and batch sizes);
* ``one model, same work``: one model taking the round's local steps on the cohort's pooled
  batches (cohort × B examples a step: the single-model throughput) — for full-gradient
  methods, one gradient of the pooled data per local step (the floor).

Sections:

1. ``fedavg_cnn``: FedAvg's CNN (1.66 M parameters), 10 clients × 10 local steps × 64 images;
2. ``fedavg_cnn_scaling``: that round at 10, 100 and 1,000 clients per round, and at three
   model widths;
3. ``families``: FedOpt (FedAdam) on the CNN; Sparse-ProxSkip (BlogFeedback shape); EF21
   (mushrooms shape); Scafflix (FEMNIST shape); SPPM-AS (a9a shape, 10 GD steps a prox);
   FedSpa (LeNet5); FedMRN (its CNN); FedP3 (its CNN); FedPM; Ditto;
4. ``ato_epoch``: Auto-Train-Once on ResNet-20, one epoch of 50,000 CIFAR-shaped images in
   batches of 64 with its controller pass: the scanned epoch, a per-step jitted loop, and plain
   SGD of the same network;
5. ``posttrain``: Wanda / RIA / magnitude / Wanda+DSnoT on the small LLaMA-style LM against
   numpy (``bench_posttrain.py``);
6. ``ddss``: one Sha-DDSS outer iteration against a numpy/scipy loop (``bench_ddss.py``);
7. ``fedmrn_table1``: FedMRN Table 1's Fashion-MNIST column at the paper's protocol (100
   clients, 10 per round, 100 rounds, 10 local epochs of 64, learning rate from the paper's grid
   on a validation split — the grid's runs vmapped as one program, the harness's batched
   tuning — 1 seed), one (method, split) cell at a time — NIID-2, then NIID-1,
   then IID — each printed beside the paper's number, as many as the budget allows (needs
   ``--fmnist``; skipped without it).

``--estimate`` times nothing: it prints every family's full-size round's training FLOPs and
the time they would take at ``--assumed-tflops`` (a round's compute only; a small round is
bounded by kernel launches instead).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

import fedjaxsparse as fjs

HERE = os.path.dirname(os.path.abspath(__file__))


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


class Case(NamedTuple):
  """One family's round at its paper's shape.

  ``make(num_clients, cohort_size) -> Algorithm`` (``cohort_size=None``: every client);
  ``cohort`` clients take part in a round, each taking ``steps`` local steps of ``batch``
  examples (``batch=None``: full-gradient steps) of ``loss``."""
  make: Callable[[int, int | None], Any]
  params: Any
  data: Any
  cohort: int
  loss: Callable
  steps: int
  batch: int | None
  model: Any = None

  def train_flops(self) -> float:
    """The round's training FLOPs by the papers' rule, 6 × MACs of a forward pass per
    trained example (:func:`fedjaxsparse.ops.flops.training_flops`; evaluation passes not
    counted): cohort × steps × B examples (B = a client's examples for full-gradient steps).
    XLA's own count of a compiled round counts a loop's body once, not per iteration."""
    macs = fjs.ops.flops.layer_macs(self.model, self.params, self.data.x.shape[2:])
    per_step = self.batch if self.batch is not None else self.data.x.shape[1]
    return fjs.ops.flops.training_flops(macs, examples=self.cohort * self.steps * per_step)


def _library(name: str, case: Case, repeats: int) -> dict:
  """The library's round: ``jit(step)`` on the whole population, the runner's client strategy,
  compiled ahead of time (compile seconds apart), the round's training FLOPs."""
  algo = case.make(case.data.num_clients, case.cohort)
  strategy, _ = fjs.runtime.clients.choose_strategy(algo, case.params, case.data)
  data = fjs.runtime.clients.with_strategy(case.data, strategy)
  state = algo.init(jax.random.key(0), case.params, data)
  t = time.perf_counter()
  step = jax.jit(algo.step).lower(jax.random.key(1), state, data).compile()
  compile_s = time.perf_counter() - t
  flops = case.train_flops()
  holder = {"state": state}

  def one():
    holder["state"], _ = step(jax.random.key(1), holder["state"], data)
    return holder["state"]

  _, steady = timed(one, repeats)
  return {"row": name, "variant": "library", "strategy": strategy,
          "ms_per_round": 1e3 * steady, "compile_s": compile_s,
          "train_gflop_per_round": flops / 1e9, "gflop_per_s": flops / 1e9 / steady,
          "peak_bytes": peak_bytes()}


def _client_loop(name: str, case: Case, repeats: int) -> dict:
  """A Python loop over the round's clients, one call of the jitted round program on a
  one-client dataset each (the same local training; the server's work of one client)."""
  algo = case.make(1, None)
  rows = [case.data.select(jnp.array([i])) for i in range(case.cohort)]
  states = [algo.init(jax.random.key(0), case.params, r) for r in rows]
  t = time.perf_counter()
  step = jax.jit(algo.step).lower(jax.random.key(1), states[0], rows[0]).compile()
  compile_s = time.perf_counter() - t

  def loop():
    return [step(jax.random.key(i), s, r)[0] for i, (s, r) in enumerate(zip(states, rows))]

  _, steady = timed(loop, repeats)
  return {"row": name, "variant": "per-client jit loop", "ms_per_round": 1e3 * steady,
          "compile_s": compile_s, "peak_bytes": peak_bytes()}


def _single_model(name: str, case: Case, repeats: int) -> dict:
  """One model doing the round's work: ``steps`` SGD steps on the cohort's pooled batches of
  cohort × B examples (a full-gradient method: ``steps`` gradients of the pooled data)."""
  d = case.data
  x = d.x[:case.cohort].reshape((-1,) + d.x.shape[2:])
  y, m = d.y[:case.cohort].reshape(-1), d.mask[:case.cohort].reshape(-1).astype(jnp.float32)
  grad = jax.grad(case.loss)
  size = x.shape[0] if case.batch is None else case.cohort * case.batch

  def single(w):
    def body(w, i):
      idx = (i * size + jnp.arange(size)) % x.shape[0]
      g = grad(w, x[idx], y[idx], m[idx])
      return jax.tree.map(lambda a, gi: a - 0.01 * gi, w, g), None
    return jax.lax.scan(body, w, jnp.arange(case.steps))[0]

  t = time.perf_counter()
  fn = jax.jit(single).lower(case.params).compile()
  compile_s = time.perf_counter() - t
  _, steady = timed(lambda: fn(case.params), repeats)
  return {"row": name, "variant": "one model, same work", "ms_per_round": 1e3 * steady,
          "compile_s": compile_s, "peak_bytes": peak_bytes()}


def case_rows(name: str, case: Case, args) -> list[dict]:
  rows = [_library(name, case, args.repeats)]
  if not args.library_only:
    rows += [_client_loop(name, case, args.repeats), _single_model(name, case, args.repeats)]
  for r in rows:
    r["vs_library"] = r["ms_per_round"] / rows[0]["ms_per_round"]
  return rows


# --- the families at their papers' shapes ---------------------------------------------------

def _cnn_case(args, channels=None, dense=None, cohort=None, server=None) -> Case:
  cohort = cohort or args.cohort
  model = fjs.models.cnn((28, 28, 1), 10, channels=channels or args.channels,
                         dense=dense or args.dense)
  loss = fjs.models.make_loss(model)
  steps, batch = args.local_steps, args.batch
  make = lambda n, c: fjs.fedavg(loss, optax.sgd(0.05), local_steps=steps, batch_size=batch,
                                 cohort_size=c, server_optimizer=server)
  return Case(make, model.init(jax.random.key(0)), images(cohort, steps * batch), cohort,
              loss, steps, batch, model)


def fedopt_cnn(args) -> Case:
  return _cnn_case(args, server=optax.adam(1e-3))


def sparse_proxskip_blogfeedback(args) -> Case:
  """Ridge regression, d = 281, 554 sites (BlogFeedback), 85 examples each; every site each
  iteration, one local gradient step."""
  n = max(2, int(554 * args.scale))
  model = fjs.models.linear_regression(281)
  loss = fjs.models.make_loss(model)
  return Case(lambda n_, c: fjs.sparse_proxskip(loss, 1e-3, 0.2, 0.9),
              model.init(jax.random.key(0)), vectors(n, 85, 281), n, loss, 1, None, model)


def ef21_mushrooms(args) -> Case:
  """Logistic regression, d = 112, 1,000 clients of 8 examples (mushrooms' 8,124 rows), EF21
  with Top-2 uplinks."""
  n = max(2, int(1000 * args.scale))
  model = fjs.models.logistic_regression(112)
  loss = fjs.models.make_loss(model)
  params = model.init(jax.random.key(0))
  d = fjs.accounting.num_params(params)
  return Case(lambda n_, c: fjs.ef21(loss, fjs.compressors.top_k(d, 2), 0.1), params,
              vectors(n, 8, 112), n, loss, 1, None, model)


def scafflix_femnist(args) -> Case:
  """Softmax regression on the FEMNIST shape (100 writers of 32 images, 62 classes), the
  round form with 10 clients a round."""
  n = max(2, int(100 * args.scale))
  model = fjs.models.softmax_regression(784, 62)
  loss = fjs.models.make_loss(model)
  params = model.init(jax.random.key(0))
  cohort = min(10, n)

  def make(n_, c):
    x_star = jax.tree.map(lambda a: jnp.broadcast_to(a, (n_,) + a.shape), params)
    return fjs.scafflix(loss, 0.1, 0.2, 0.5, x_star, form="round",
                        cohort_size=min(c or n_, n_))
  return Case(make, params, images(n, 32, classes=62), cohort, loss, 1, None, model)


def sppm_as_a9a(args) -> Case:
  """Logistic regression on the a9a shape (d = 123, 100 clients of 326 rows), τ-nice cohorts
  of 10, the cohort's prox by 10 local GD steps."""
  n = max(2, int(100 * args.scale))
  model = fjs.models.logistic_regression(123)
  loss = fjs.models.make_loss(model)
  cohort = min(10, n)
  solver = fjs.convex.prox_solvers.gd(0.1, 10)
  return Case(lambda n_, c: fjs.sppm_as(loss, fjs.sampling.nice(n_, min(c or n_, n_)), 1.0,
                                        solver),
              model.init(jax.random.key(0)), vectors(n, 326, 123), cohort, loss, 10, None,
              model)


def _epoch_case(args, model, make_algo, classes=10, per_client=None) -> Case:
  """An epoch-based family (1 epoch of B on each client's examples) with 10 of 100 clients."""
  n = max(2, int(100 * args.scale))
  per = per_client or args.batch * args.local_steps
  loss = fjs.models.make_loss(model)
  cohort = min(args.cohort, n)
  return Case(lambda n_, c: make_algo(loss, n_, c), model.init(jax.random.key(0)),
              images(n, per, classes=classes), cohort, loss, -(-per // args.batch), args.batch,
              model)


def fedspa_lenet5(args) -> Case:
  b = args.batch
  return _epoch_case(args, fjs.models.lenet5_caffe(), lambda loss, n, c: fjs.fedspa(
      loss, 0.05, num_rounds=100, epochs=1, batch_size=b, cohort_size=c), classes=26)


def fedmrn_cnn(args) -> Case:
  b = args.batch
  return _epoch_case(args, fjs.models.bn_cnn((28, 28, 1), 10, channels=args.bn_channels),
                     lambda loss, n, c: fjs.fedmrn(loss, 0.05, epochs=1, batch_size=b,
                                                   cohort_size=c))


def fedp3_cnn(args) -> Case:
  model = fjs.models.cnn((28, 28, 1), 10, channels=args.channels, dense=args.dense)
  names = fjs.ops.layer_groups.layer_names(model.init(jax.random.key(0)), 1)
  steps, b = args.local_steps, args.batch

  def make(loss, n, c):
    train = fjs.algorithms.fedp3.layer_policy(jax.random.key(1), n, len(names), "opu2")
    cfg = fjs.algorithms.fedp3.make_config(jax.random.key(2), train, 0.9)
    return fjs.fedp3(loss, optax.sgd(0.05), cfg, local_steps=steps, batch_size=b,
                     cohort_size=c)
  case = _epoch_case(args, model, make)
  return case._replace(steps=steps)


def fedpm_cnn(args) -> Case:
  b = args.batch
  return _epoch_case(args, fjs.models.cnn((28, 28, 1), 10, channels=args.channels,
                                          dense=args.dense),
                     lambda loss, n, c: fjs.fedpm(loss, 0.1, epochs=1, batch_size=b,
                                                  cohort_size=c))


def ditto_cnn(args) -> Case:
  b = args.batch
  case = _epoch_case(args, fjs.models.cnn((28, 28, 1), 10, channels=args.channels,
                                          dense=args.dense),
                     lambda loss, n, c: fjs.ditto(loss, 0.05, global_epochs=1,
                                                  personal_epochs=1, batch_size=b,
                                                  cohort_size=c))
  return case._replace(steps=2 * case.steps)   # a global and a personal epoch


FAMILIES: dict[str, Callable[[Any], Case]] = {
    "fedopt_cnn": fedopt_cnn,
    "sparse_proxskip_blogfeedback": sparse_proxskip_blogfeedback,
    "ef21_mushrooms": ef21_mushrooms, "scafflix_femnist": scafflix_femnist,
    "sppm_as_a9a": sppm_as_a9a, "fedspa_lenet5": fedspa_lenet5, "fedmrn_cnn": fedmrn_cnn,
    "fedp3_cnn": fedp3_cnn, "fedpm_cnn": fedpm_cnn, "ditto_cnn": ditto_cnn}
"""Every family's round (besides FedAvg's, section 1): ``name -> builder(args) -> Case``."""


# --- sections -----------------------------------------------------------------------------

def fedavg_cnn(args, emit) -> None:
  emit(case_rows("fedavg_cnn", _cnn_case(args), args))


def fedavg_cnn_scaling(args, emit) -> None:
  for n in args.scaling:
    r = _library("fedavg_cnn_scaling", _cnn_case(args, cohort=n), args.repeats)
    emit([{**r, "clients_per_round": n}])
  for channels, dense in args.widths:
    case = _cnn_case(args, channels=channels, dense=dense)
    rows = case_rows("fedavg_cnn_width", case, args)
    emit([{**r, "channels": list(channels), "dense": dense,
           "params": fjs.accounting.num_params(case.params)} for r in rows])


def families(args, emit) -> None:
  for name, build in FAMILIES.items():
    if args.family and name not in args.family:
      continue
    if args.tiny and name in TINY_TRACE_ONLY:   # their compiles: most of a minute on CPU
      case = build(args)
      algo = case.make(case.data.num_clients, case.cohort)
      t = time.perf_counter()
      state = algo.init(jax.random.key(0), case.params, case.data)
      jax.eval_shape(algo.step, jax.random.key(1), state, case.data)
      emit([{"row": name, "variant": "traced only (--tiny)",
             "trace_s": time.perf_counter() - t}])
    elif args.tiny and name in TINY_LIBRARY_ONLY:   # the references' compiles
      emit([_library(name, build(args), args.repeats)])
    else:
      emit(case_rows(name, build(args), args))


ATO_IMAGES, ATO_BATCH = 50_000, 64
"""ATO's epoch at Wu (2024)'s CIFAR-10 setting: 50,000 images of 32 × 32 × 3, batches of 64."""


def _ato_setup(args):
  """(module, model, zigs, x, y, batch): ResNet-20 on CIFAR-shaped images; ``--tiny``: a small
  prunable MLP on the flattened images (the same code, a compile of seconds on a CPU)."""
  shape, n, batch = ((3072,), 32, 8) if args.tiny else ((32, 32, 3), ATO_IMAGES, ATO_BATCH)
  module, model = (fjs.models.prunable.mlp(shape, 10, hidden=(16,)) if args.tiny
                   else fjs.models.prunable.cifar_resnet(20))
  zigs = fjs.pruning.zig.trace(module, shape)
  rng = np.random.default_rng(0)
  x = rng.normal(size=(n,) + shape).astype(np.float32)
  y = rng.integers(0, 10, n).astype(np.int32)
  return module, model, zigs, x, y, batch


def ato_epoch(args, emit) -> None:
  """ATO (Algorithm 7) on ResNet-20, one epoch over CIFAR-shaped images in batches of 64 with
  the controller's pass over D_CN (5 %) and the end-of-epoch mask: the library's epoch (each
  epoch's steps one ``lax.scan``, what accelerators run), the same epoch driven step by step
  from Python (``loop="host"``: a jitted call per step, the papers' way), and plain SGD of the
  same network over the same batches in one scan (one model, the same target steps: ATO's own
  overhead). Steady time = the second epoch's (the first compiles)."""
  module, model, zigs, x, y, batch = _ato_setup(args)
  params = model.init(jax.random.key(0))
  opt = optax.sgd(0.1, momentum=0.9)
  cfg = fjs.algorithms.ato.ATOConfig(T_w=0, T_start=0, T_end=10)   # the controller runs
  algo = fjs.ato(model, zigs, opt, lambda t: 0.1, cfg)
  ctrl = fjs.algorithms.ato.controller_subset(len(x), 0.05)
  steps = len(x) // batch
  flops = fjs.ops.flops.training_flops(fjs.ops.flops.layer_macs(model, params, x.shape[1:]),
                                       examples=steps * batch)
  rows = []
  for loop in ("scan",) if args.tiny else ("scan", "host"):   # --tiny: test_ato runs "host"
    _, hist = fjs.algorithms.ato.train(algo, cfg, jax.random.key(1), params, x, y, epochs=2,
                                       batch_size=batch, ctrl_index=ctrl, loop=loop,
                                       progress=False)
    steady = hist[1]["seconds"]
    rows.append({"row": "ato_resnet20_epoch",
                 "variant": "library (scan)" if loop == "scan" else "per-step jit loop",
                 "ms_per_round": 1e3 * steady, "compile_s": hist[0]["seconds"] - steady,
                 "train_gflop_per_round": flops / 1e9, "gflop_per_s": flops / 1e9 / steady,
                 "steps": steps, "peak_bytes": peak_bytes()})
  loss = lambda w, xb, yb: jnp.mean(model.per_example_loss(model.apply(w, xb), yb))  # noqa: E731
  xd, yd = jnp.asarray(x), jnp.asarray(y)

  def plain(w, s):
    def body(c, i):
      w, s = c
      idx = i * batch + jnp.arange(batch)
      u, s = opt.update(jax.grad(loss)(w, xd[idx], yd[idx]), s, w)
      return (optax.apply_updates(w, u), s), None
    return jax.lax.scan(body, (w, s), jnp.arange(steps))[0]

  t = time.perf_counter()
  fn = jax.jit(plain).lower(params, opt.init(params)).compile()
  compile_s = time.perf_counter() - t
  _, steady = timed(lambda: fn(params, opt.init(params)), 1 if args.tiny else 2)
  rows.append({"row": "ato_resnet20_epoch", "variant": "plain SGD, same steps",
               "ms_per_round": 1e3 * steady, "compile_s": compile_s, "steps": steps,
               "peak_bytes": peak_bytes()})
  for r in rows:
    r["vs_library"] = r["ms_per_round"] / rows[0]["ms_per_round"]
  emit(rows)


def _script(name: str):
  sys.path.insert(0, HERE)
  try:
    return __import__(name)
  finally:
    sys.path.remove(HERE)


def posttrain(args, emit) -> None:
  res = _script("bench_posttrain").main(["--out", os.path.join(args.out, "posttrain.json")]
                                        + (["--tiny"] if args.tiny else []))
  emit([{"row": "posttrain_" + r["method"], "variant": "library",
         "ms_per_round": 1e3 * r["library s"], "compile_s": r["compile s"],
         "reference": "numpy", "reference_ms": 1e3 * r["numpy s"], "speedup": r["speed-up"],
         "differing": r["differing"], "peak_bytes": peak_bytes()} for r in res["rows"]])


def ddss(args, emit) -> None:
  res = _script("bench_ddss").main(["--out", os.path.join(args.out, "ddss.json")]
                                   + (["--tiny"] if args.tiny else []))
  emit([{"row": "ddss", "variant": r["comparison"], "ms_per_round": 1e3 * r["library s"],
         "compile_s": r["compile s"], "reference": r["reference"],
         "reference_ms": 1e3 * r["reference s"], "speedup": r["speed-up"],
         "peak_bytes": peak_bytes()} for r in res["rows"]])


SPLIT_ORDER = ("niid2", "niid1", "iid")
SPLIT_NAMES = {"niid2": "Non-IID-2", "niid1": "Non-IID-1", "iid": "IID"}


def fedmrn_table1(args, emit, deadline: float) -> None:
  """Table 1's Fashion-MNIST column, one (method, split) cell a run, while time is left (a
  cell is not started when the previous one's time would overrun the deadline)."""
  exp = fjs.harness.cli
  E = exp.experiments()["fedmrn_fmnist"]   # the experiment's module (its paper numbers)
  methods = args.table_methods or (["FedAvg"] if args.tiny else list(E.METHODS))
  last = 0.0
  for split in SPLIT_ORDER[:1] if args.tiny else SPLIT_ORDER:
    for method in methods:
      if time.perf_counter() + last > deadline:
        emit([], skipped=f"fedmrn_table1 {method} {split}: the budget would be exceeded")
        continue
      out = os.path.join(args.out, "fedmrn_table1", f"{split}_{method}")
      argv = ["run", "fedmrn_fmnist", "--out", out, "--no-progress", "--set",
              f"splits={split}", "--set", f"methods={method}", "--set", "seeds=1"]
      argv += (["--quick", "--set", "lrs=0.1"] if args.tiny else
               ["--paper", "table1_fmnist", "--data-dir", args.fmnist])
      t = time.perf_counter()
      if exp.main(argv) != 0:
        raise RuntimeError(f"fedmrn_fmnist failed: {' '.join(argv)}")
      last = time.perf_counter() - t
      res = json.load(open(os.path.join(out, "fedmrn_fmnist", "results.json")))
      row = next(r for r in res["table"] if r["method"] == method)
      emit([{"row": "fedmrn_table1", "variant": f"{method} {SPLIT_NAMES[split]}",
             "ms_per_round": 1e3 * last, "compile_s": 0.0, "method": method, "split": split,
             "ours %": row.get("ours %"),
             "paper %": E.PAPERS["table1_fmnist"].paper[split][method], "lr": row.get("lr"),
             "seconds": last, "tiny": args.tiny}])


TINY_LIBRARY_ONLY = ("fedopt_cnn", "ef21_mushrooms", "scafflix_femnist", "sppm_as_a9a",
                     "fedp3_cnn")
TINY_TRACE_ONLY = ("fedspa_lenet5", "fedmrn_cnn", "fedpm_cnn", "ditto_cnn")
"""Families whose --tiny run (the test suite's) times the library's round only, or only builds,
initialises and traces it: the loop and single-model code is the same for every family and
runs on the others, and these rounds' compiles would take most of a minute on a CPU."""

SECTIONS = ("fedavg_cnn", "fedavg_cnn_scaling", "families", "ato_epoch", "posttrain", "ddss",
            "fedmrn_table1")


# --- estimate -------------------------------------------------------------------------------

def estimate(args) -> list[dict]:
  """Every family's full-size round costed before a GPU is at hand: its training FLOPs
  (:meth:`Case.train_flops`) and the time they take at ``--assumed-tflops`` — a round's
  compute only (a small round is bounded by kernel launches instead); the 100- and 1,000-client
  FedAvg rounds scale the 10-client count (a round's work is linear in its clients)."""
  cases = {"fedavg_cnn": _cnn_case(args)}
  cases.update({name: build(args) for name, build in FAMILIES.items()})
  rows = [{"row": name, "train_gflop_per_round": case.train_flops() / 1e9}
          for name, case in cases.items()]
  base = rows[0]["train_gflop_per_round"]
  for n in (100, 1000):
    rows.append({"row": f"fedavg_cnn, {n} clients", "train_gflop_per_round": base * n / 10})
  _, model, _, x, _, batch = _ato_setup(args)
  macs = fjs.ops.flops.layer_macs(model, model.init(jax.random.key(0)), x.shape[1:])
  rows.append({"row": "ato_resnet20_epoch", "train_gflop_per_round": fjs.ops.flops.training_flops(
      macs, examples=len(x) // batch * batch) / 1e9})
  for r in rows:
    g = r["train_gflop_per_round"]
    r["est_ms_at_assumed"] = g / args.assumed_tflops   # GFLOP / (TFLOP/s) = ms
    print(f"{r['row']:32s} {g:12.3f} GFLOP/round  ≈ {r['est_ms_at_assumed']:9.3f} ms at "
          f"{args.assumed_tflops:g} TFLOP/s", flush=True)
  return rows


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--out", default="benchmarks/results/gpu")
  p.add_argument("--tiny", action="store_true", help="toy sizes on any backend (< 1 min)")
  p.add_argument("--estimate", action="store_true",
                 help="print every full-size round's FLOPs and estimated time; run nothing")
  p.add_argument("--assumed-tflops", type=float, default=50.0,
                 help="achieved TFLOP/s for --estimate (H100 SXM: 67 FP32, 495 TF32 dense)")
  p.add_argument("--budget-s", type=float, default=500.0,
                 help="skip a section that starts after this many seconds")
  p.add_argument("--repeats", type=int, default=10)
  p.add_argument("--only", nargs="*", choices=SECTIONS, help="sections to run (default: all)")
  p.add_argument("--family", nargs="*", choices=tuple(FAMILIES),
                 help="families of the families section (default: all)")
  p.add_argument("--library-only", action="store_true",
                 help="time the library's rounds only (no loop / single-model references)")
  p.add_argument("--fmnist", help="folder of the Fashion-MNIST IDX files (fedmrn_table1)")
  p.add_argument("--table-methods", nargs="*", help="fedmrn_table1's methods (default: all 10)")
  args = p.parse_args(argv)
  big = dict(cohort=10, local_steps=10, batch=64, channels=(32, 64), dense=512,
             bn_channels=(32, 32, 64, 64), scaling=(10, 100, 1000), scale=1.0,
             widths=(((16, 32), 256), ((32, 64), 512), ((64, 128), 1024)))
  tiny = dict(cohort=2, local_steps=2, batch=4, channels=(2, 2), dense=4,
              bn_channels=(2, 2, 2, 2), scaling=(2, 4), scale=0.02, repeats=1,
              widths=())
  for k, v in (tiny if args.tiny else big).items():
    if k == "repeats" and not args.tiny:
      continue
    setattr(args, k, v)
  if args.repeats < 1:
    p.error("--repeats must be >= 1")
  if args.fmnist is not None and not os.path.isdir(args.fmnist):
    p.error(f"--fmnist {args.fmnist!r} is not a folder (it holds train-images-idx3-ubyte.gz "
            "etc.; Debian: /usr/share/datasets/fashion-mnist)")
  return args


def main(argv=None) -> dict:
  args = parse_args(argv)
  if args.estimate:
    return {"rows": estimate(args)}
  os.makedirs(args.out, exist_ok=True)
  path = os.path.join(args.out, "suite.json")
  dev = jax.devices()[0]
  result = {"device": f"{dev.platform}: {dev.device_kind}", "jax": jax.__version__,
            "python": platform.python_version(), "tiny": args.tiny, "rows": [],
            "skipped": []}
  start = time.perf_counter()

  def emit(rows, skipped=None):
    for r in rows:
      r["t_s"] = time.perf_counter() - start
      if "ms_per_round" not in r:
        print(f"{r['row']:30s} {r['variant']:22s} {r['trace_s']:.2f} s", flush=True)
        continue
      extra = ""
      if r.get("train_gflop_per_round"):
        extra += f"  {r['train_gflop_per_round']:.3g} GFLOP ({r['gflop_per_s']:.3g} GFLOP/s)"
      if "vs_library" in r:
        extra += f"  ×{r['vs_library']:.2f} of the library"
      if "speedup" in r:
        extra += f"  {r['speedup']:.2f}× the {r['reference']} reference"
      if "paper %" in r:
        extra += f"  ours {r['ours %']}  paper {r['paper %']}"
      print(f"{r['row']:30s} {r['variant']:22s} {r['ms_per_round']:11.2f} ms  "
            f"compile {r['compile_s']:6.2f} s{extra}", flush=True)
    result["rows"].extend(rows)
    if skipped:
      print(f"skipped: {skipped}", flush=True)
      result["skipped"].append(skipped)
    with open(path, "w") as f:   # after every row: a closed window keeps its numbers
      json.dump(result, f, indent=1)

  for name in SECTIONS:
    if args.only and name not in args.only:
      continue
    elapsed = time.perf_counter() - start
    if elapsed > args.budget_s:
      emit([], skipped=f"{name}: started after {elapsed:.0f} s > --budget-s")
      continue
    if name == "fedmrn_table1":
      if args.fmnist is None and not args.tiny:
        emit([], skipped="fedmrn_table1: no --fmnist folder")
        continue
      fedmrn_table1(args, emit, start + args.budget_s)
    else:
      globals()[name](args, emit)
  emit([])
  print(f"wrote {path} ({time.perf_counter() - start:.0f} s)")
  return result


if __name__ == "__main__":
  sys.exit(0 if main() else 1)
