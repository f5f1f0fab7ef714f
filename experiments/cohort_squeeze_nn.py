"""Cohort-Squeeze (Yi et al. 2024; chapter 5 of Kai Yi's dissertation), §5.4.6 and D.5 (Figs.
5.6/5.7, D.8/D.9): SPPM-AS on a CNN — the hierarchical cost of reaching a target training
accuracy, against LocalGD.

Protocol:

* Data: FEMNIST with one writer per client, each writer's own train/test split (LEAF's
  ≈ 9:1; ``--dataset femnist --data-dir DIR``; the first ``--clients`` writers in file order,
  where the paper draws 100 uniformly), or offline the labelled FEMNIST stand-in.
* Model: Table D.4's CNN with its shapes corrected (879,422 parameters,
  :func:`fedjaxsparse.models.cohort_squeeze_cnn`); ``channels``/``dense`` shrink it for a CPU.
* **SPPM-NICE**: τ-NICE cohorts of ``cohort`` clients; the cohort's prox
  ``prox_{γ f_S}(x_t)`` by the FedAvg-style solver of the NN experiments — K local
  communication rounds, in each every member runs ``worker_steps`` Adam steps on
  ``f_i + ‖· − x_t‖²/(2γ)`` (minibatches of ``batch``) and the cohort averages
  (:func:`fedjaxsparse.algorithms.sppm.fedavg_sppm_as` with no local prox term), for K in
  ``ks``. **LocalGD**: FedAvg on the same cohorts, ``worker_steps`` local SGD steps, one
  communication per round.
* Every method's learning rate is chosen alike from ``lrs`` (the paper's Adam grid is
  [1e-4 … 0.5]): the value whose run on each client's fitting part first reaches the target
  *validation* accuracy at the lowest cost (ties and misses: the best final validation
  accuracy) — the test split is never used for a choice.
* Cost: each global round costs c₁·K + c₂ (LocalGD: c₁ + c₂), c₁ = 0.05, c₂ = 1 (the
  chapter's hubs); training accuracy (the paper's target metric, 70 %) is evaluated every
  ``--eval-every`` rounds on the training data; the cost to the target is read at the first
  evaluation reaching it. Test accuracy at the end is reported beside it.

Source for the team: seed 001 chapter 5, E5.5; spec ``seed001_ch3_ch5.md`` §5.9 (protocol).
"""
from __future__ import annotations

import jax
import numpy as np
import optax

from fedjaxsparse.ops import sampling
from fedjaxsparse.convex import prox_solvers as P
from fedjaxsparse.algorithms import sppm
from fedjaxsparse.data import load_dataset
from fedjaxsparse.errors import ConfigError
from fedjaxsparse.evaluation import evaluate, make_eval_fn
from fedjaxsparse.harness.options import Config, Option
from fedjaxsparse.harness.running import last
from fedjaxsparse.harness.tuning import tuning_config
from fedjaxsparse.harness.experiment import Context, Method, Tuning, declared
from fedjaxsparse.harness.report import Figure, Table
from fedjaxsparse.models import cohort_squeeze_cnn, make_loss
from fedjaxsparse.harness.protocol import PaperConfig, load_or_standin

NAME = "cohort_squeeze_nn"
DESCRIPTION = ("Cohort-Squeeze (Yi et al. 2024), CNN: SPPM-NICE (Adam prox solver) vs "
               "LocalGD, cost to accuracy")
DEFAULTS = dict(rounds=30, clients=20, dataset="femnist_standin", eval_every=5)
# --quick: the table's shape in well under two minutes on 2 CPU cores (QUICK_RUNTIME)
QUICK = dict(rounds=3, clients=4, eval_every=1, options=dict(
    cohort=2, ks=[2], lrs=[0.01], local_lrs=[0.1], channels=[2, 2], dense=4))
QUICK_RUNTIME = "measured 17 s on 2 CPU cores (a fresh process, XLA's default flags)"
BUDGET = "global rounds per method (cost: c1 per local round + c2 per global round)"
RUNTIME = "about 5 min on 2 CPU cores (small CNN, 20 clients, 30 rounds; measured 317 s)"
OPTIONS = (
    Option("study", "cost", "cost (Figs. 5.6/5.7: SPPM-NICE for each K against LocalGD) or "
           "solvers (Fig. D.10: FedSGD, FedAdam, FedAdam-Adam, MimeLite-Adam as the cohort's "
           "prox solver at K = solver_k)", choices=("cost", "solvers")),
    Option("solver_k", 3, "local rounds K of the solver study (the paper: 3)", low=1),
    Option("cohort", 10, "tau of the NICE cohorts", low=1),
    Option("gamma", 1.0, "SPPM-AS prox parameter", low=0.0, low_open=True),
    Option("ks", [1, 3], "local communication rounds K of SPPM-NICE", kind="floats", low=1),
    Option("worker_steps", 3, "optimiser steps per member per local round (LocalGD: local "
           "steps)", low=1),
    Option("batch", 32, "minibatch size", low=1),
    Option("lrs", [1e-3, 5e-3], "learning-rate grid (Adam for SPPM, SGD for LocalGD: the "
           "paper's Adam grid is 1e-4 ... 0.5)", kind="floats", low=0.0, low_open=True),
    Option("local_lrs", [0.05, 0.1], "LocalGD's SGD learning-rate grid", kind="floats",
           low=0.0, low_open=True),
    Option("target", 0.7, "target training accuracy", low=0.0, high=1.0),
    Option("c1", 0.05, "cost of a client-hub (local) round", low=0.0),
    Option("c2", 1.0, "cost of a hub-server (global) round", low=0.0),
    Option("validation", 0.1, "fraction of each client's training examples for tuning",
           low=0.0, high=1.0, low_open=True, high_open=True),
    Option("channels", [8, 16], "CNN channels (paper: 32,64)", kind="floats", low=1),
    Option("dense", 32, "CNN dense units (paper: 128)", low=1),
)
PAPERS = {"femnist_d4": PaperConfig(
    "femnist_d4",
        "K. Yi's dissertation (Cohort-Squeeze) §5.4.6 / D.5 (FEMNIST CNN)", dataset="femnist",
    standin="femnist_standin", clients=100, rounds=300, eval_every=5,
    options={"cohort": 10, "gamma": 1.0, "ks": [1, 2, 3, 4, 5], "worker_steps": 3,
             "lrs": [1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.5], "channels": [32, 64],
             "dense": 128},
    unit="hierarchical cost to 70 % training accuracy (figures only)", paper={},
    deviations="the paper's results are figures (Figs. 5.6/5.7); 100 first writers instead of "
               "100 drawn uniformly; LocalGD's learning rate grid is ours")}


def cost_to_accuracy(record: dict, target: float, c1: float, c2: float) -> float | None:
  """``Σ_{t ≤ r} (c₁ K_t + c₂)`` at the first evaluation round r with accuracy ≥ ``target``."""
  ev, rd = record["history"]["evals"], record["history"]["rounds"]
  hit = next((r for r, a in zip(ev["round"], ev.get("accuracy", [])) if a >= target), None)
  if hit is None:
    return None
  k = np.asarray(rd["local_rounds"][:hit], np.float64)
  return float(np.sum(c1 * k + c2))


SOLVERS = ("FedSGD", "FedAdam", "FedAdam-Adam", "MimeLite-Adam")
"""Fig. D.10's cohort solvers: the worker's optimiser and the server's (see :func:`_method`)."""


def _method(name: str, lr: float, loss, nice, opts: dict):
  """The algorithm of a row: ``LocalGD``; ``SPPM-NICE (K=k)`` (E Adam worker steps per local
  round); or, in the solver study, SPPM-NICE with K = ``solver_k`` and Fig. D.10's solver —
  FedSGD (SGD worker), FedAdam (Adam worker), FedAdam-Adam (Adam worker and Adam server over
  the K local rounds, one learning rate for both) or MimeLite-Adam (the server's Adam state
  frozen in the worker steps)."""
  e, b, gamma = opts["worker_steps"], opts["batch"], opts["gamma"]
  if name == "LocalGD":
    return sppm.cohort_average(loss, nice, P.optax_steps(optax.sgd(lr), e, "sgd"),
                               batch_size=b)
  if name in SOLVERS:
    worker = {"FedSGD": P.optax_steps(optax.sgd(lr), e, "sgd"),
              "MimeLite-Adam": sppm.mime_lite(optax.adam(lr), e)}.get(
                  name, P.optax_steps(optax.adam(lr), e, "adam"))
    return sppm.cohort_average(
        loss, nice, worker, local_rounds=opts["solver_k"], gamma=gamma, batch_size=b,
        server_optimizer=optax.adam(lr) if name == "FedAdam-Adam" else None)
  k = int(name.split("K=")[1].rstrip(")"))
  return sppm.fedavg_sppm_as(loss, nice, gamma, None, P.optax_steps(optax.adam(lr), e, "adam"),
                             local_rounds=k, batch_size=b)


def setup(cfg: Config, opts: dict) -> Context:
  """FEMNIST (or its stand-in), the CNN and the NICE sampler. Every method is evaluated on the
  training data (the paper's target is a training accuracy); the test split waits in
  ``extra`` for the rows' test accuracy."""
  def load(name):
    if name == "femnist":
      return load_dataset(name, data_dir=cfg.data_dir, num_clients=cfg.clients,
                          test="writers")
    if name == "femnist_standin":
      return load_dataset(name, num_clients=cfg.clients, seed=cfg.seed, test="writers")
    raise ConfigError(f"{NAME} runs on femnist (with --data-dir) or femnist_standin, got "
                      f"{name!r}.")

  ds, standin = load_or_standin(PAPERS.get(cfg.paper), cfg.dataset, cfg.data_dir, load)
  n, tau = ds.num_clients, opts["cohort"]
  if tau > n:
    raise ConfigError(f"option 'cohort' must be in [1, clients={n}], got {tau}.")
  model = cohort_squeeze_cnn(ds.train.x.shape[2:], ds.num_classes,
                             tuple(int(c) for c in opts["channels"]), opts["dense"])
  c1, c2, target = opts["c1"], opts["c2"], opts["target"]
  print(f"{NAME}: {ds.name}{' (' + standin + ')' if standin else ''}, {n} clients, NICE "
        f"cohorts of {tau}, gamma={opts['gamma']}, {opts['worker_steps']} worker steps, batch "
        f"{opts['batch']}, target {target:.0%} training accuracy, cost c1={c1:g} per local "
        f"round + c2={c2:g}")
  return Context(ds._replace(test=ds.train), model.init(jax.random.key(cfg.seed)),
                 make_eval_fn(model),
                 {"model": model, "loss": make_loss(model), "nice": sampling.nice(n, tau),
                  "test": ds.test, "name": ds.name, "standin": standin})


def methods(ctx: Context, cfg: Config, opts: dict) -> dict:
  """SPPM-NICE for each K and LocalGD (the cost study), or Fig. D.10's four solvers; each
  learning rate chosen alike by the cost to the target on validation."""
  if opts["study"] == "solvers":
    names = list(SOLVERS)
  else:
    names = [f"SPPM-NICE (K={k})" for k in sorted({int(k) for k in opts["ks"]})] + ["LocalGD"]
  loss, nice = ctx.extra["loss"], ctx.extra["nice"]
  return {name: Method(lambda lr, run, name=name: _method(name, lr, loss, nice, opts),
                       opts["local_lrs"] if name == "LocalGD" else opts["lrs"],
                       label=lambda lr: f"lr={lr:g}")
          for name in names}


def score(record: dict, cfg: Config, opts: dict):
  """The cheapest to the target; without one, the best validation accuracy."""
  cost = cost_to_accuracy(record, opts["target"], opts["c1"], opts["c2"])
  acc = last(record["history"]["evals"].get("accuracy", []))
  return (cost is not None, -(cost or 0.0), acc if acc is not None and np.isfinite(acc) else -1.0)


def columns(m: str, tuned, ctx: Context, cfg: Config, opts: dict) -> dict:
  """The final model's test accuracy and the costs to the target."""
  rec, target, c1, c2 = tuned.records[0], opts["target"], opts["c1"], opts["c2"]
  test = evaluate(ctx.extra["model"], rec["state"].params, ctx.extra["test"])
  return {"test accuracy": float(test["accuracy"]),
          f"cost to {target:.0%} (c1={c1:g}, c2={c2:g})": cost_to_accuracy(rec, target, c1, c2),
          f"cost to {target:.0%} (T*K)": cost_to_accuracy(rec, target, 1.0, 0.0)}


def report(results: dict, ctx: Context, cfg: Config, opts: dict) -> dict:
  """The table's reading of a local round and the paper's finding; the learning-rate search."""
  if opts["study"] == "solvers":
    note = ("the paper (Fig. D.10, figures only): all four solvers perform similarly; "
            "MimeLite-Adam and FedSGD are best on test")
  else:
    note = ("the paper (figures only): SPPM-AS with several local rounds reaches 70 % at a "
            "lower total cost than LocalGD, the optimal K growing with gamma (Figs. 5.6/5.7)")
  title = ("one local communication round = one iteration of the cohort solver: every member "
           f"runs {opts['worker_steps']} worker steps, then the cohort averages (T*K counts them)")
  rows = [{k: v for k, v in r.items() if k != "s.e."} for r in results["table"].rows]  # 1 seed
  return {"experiment": NAME, "dataset": ctx.extra["name"], "standin": ctx.extra["standin"],
          "target": opts["target"], "c1": opts["c1"], "c2": opts["c2"],
          "search": {m: {str(k): v for k, v in t.scores.items()}
                     for m, t in results["tuned"].items()},
          "table": Table(rows, title=title, note=note)}


def figure(results: dict, ctx: Context, cfg: Config, opts: dict) -> Figure:
  return Figure("methods", dict(
      methods=results["methods"], metric="accuracy",
      title=f"{ctx.extra['name']}: training accuracy vs global rounds and uplink bits"))


run = declared(NAME, OPTIONS, setup=setup, methods=methods, report=report, papers=PAPERS,
               figure=figure, tuning=Tuning(
                   candidate="lr", column="final train accuracy", scale=1.0, score=score,
                   columns=columns,
                   config=lambda cfg, opts: tuning_config(cfg, fraction=1.0,
                                                          evaluate_once=False)))
