"""Scafflix (Yi, Condat and Richtárik 2023; chapter 3 of Kai Yi's dissertation), §3.3.2 (Fig.
3.2): Scafflix vs FLIX (SGD on the FLIX objective) vs FedAvg on neural networks — FEMNIST with
a CNN, Shakespeare with LEAF's character LSTM — personalised validation accuracy against
communication rounds.

Protocol (the paper's numbers are figures only):

1. Each client's training examples are split into a fitting part and a validation part
   (``protocol.validation_split``); the test examples are never used for any choice.
2. Every client pre-trains its local optimum x_i* alone: minibatch SGD, batch 100
   (``pre_steps`` steps, learning rate ``pre_lr``).
3. Every method's learning rate is chosen alike from the paper's grid C_s = {1e-5, …, 1}
   (``lrs``): a run of ``search_rounds`` communication rounds on the fitting part per value,
   the value with the best validation accuracy wins.
4. The chosen value is run for ``--rounds`` communication rounds on all the training data
   with ``seeds`` seeds; test accuracy (mean ± s.e. over seeds) is reported.

Ablations (Fig. 3.3, ``ablate=alpha|cohort|p``): Scafflix alone at each of ``values`` (default
the paper's: α ∈ {0.1, 0.3, 0.5, 0.7, 0.9}, τ ∈ {1, 5, 10, 20}, p ∈ {0.1, 0.2, 0.5}), each
value tuned like a method; the paper's stated finding is printed beside the best value here.

Evaluation: every client's model on its own test examples (personalised x̃_i; FedAvg's global
model on every client): example-weighted accuracy (the table's "test accuracy"), the plain mean
over clients, the per-client values, and the global model x beside them (history keys of
``evaluation.make_personal_eval_fn``; the plot shows all three).

Methods: **Scafflix** (round form: L ~ Geometric(p) local SGD steps, p = 0.2, one step size
for all clients — the networks have no L_i — 10 clients per round under this library's
partial-participation rule, see ``algorithms/scafflix.py``; the paper gives none),
**FLIX** (SGD on f̃, 10 clients per round, one step per round), **FedAvg** (on the plain
objective, 10 clients per round, ⌈1/p⌉ = 5 local steps — the paper leaves its settings
unspecified). Batch 20 everywhere. Scafflix and FLIX are evaluated with each client's
personal model x̃_i = α x + (1 − α) x_i* on its own examples; FedAvg with the global model.
α = 0.5 for FEMNIST and 0.3 for Shakespeare (Fig. 3.2's caption).

At FEMNIST's scale (3,400 writers, each holding h_i and x_i* of the model's size)
``--set population=host`` runs Scafflix on the population path
(:func:`fedjaxsparse.algorithms.scafflix.scafflix_cohort`): the client state lives in host
memory and only a cohort's rows reach the device each round; x_i* is then computed when a
client's state is made (the same ``pre_steps`` SGD steps), and evaluation uses the global model
(``population=device`` keeps the population on the device and evaluates the personal models).

Table B.1 (``--paper tableB1_fmnist``, ``tableB1_cifar100``; ``--dataset fashion_mnist``,
``fashion_mnist_standin`` or ``cifar100``): FedCR's non-IID deal (``b1_rule``: ``dirichlet``,
each client's Dirichlet class proportions — FedCR's README rule, α = 0.5 / 0.3 — or
``noniid``, its code's default rule: ``class_main`` consecutive classes per client,
:func:`fedjaxsparse.data.partitions.class_cycle_partition`; the paper says only "the 'non-iid'
setting"; equal sizes, each client's own 70/30 train/test split), p = 0.3, α = 0.3, 500 rounds,
and all of the table's methods beside Scafflix, FLIX and FedAvg — Ditto, FedSR-FT, FedPAC and
FedCR (:mod:`fedjaxsparse.algorithms.representation`, on FedCR's networks
:func:`fedjaxsparse.models.split.fedcr_net`: its code is what the paper ran) — with the paper's
column printed beside ours. Every method's learning rate is tuned over the same grid; the other
hyper-parameters are FedCR's README values (FedCR: β = 1e-3, 1e-4 for CIFAR-100, S = 15 / 18
draws, d = 256 / 512; FedSR: L2R = CMI = 1e-3; FedPAC: λ = 1; 10 local epochs of batch 48,
``--paper``) or CPU-sized ones (``fedcr_*`` options). FedSR-FT, FedPAC and FedCR are evaluated
as FedCR's code evaluates its last round: every client first fine-tunes its head (FedSR-FT: its
projection and head) on its own training data for ``finetune_epochs`` epochs
(:func:`fedjaxsparse.algorithms.representation.make_fine_tuned_eval_fn`); ``methods`` picks a
subset.

Data: ``--dataset shakespeare`` — the real plays bundled with the library (one client per
speaking role; ``--clients`` roles drawn at random; LEAF's JSON with ``--data-dir``) with
LEAF's character LSTM (``hidden`` units; 256 is LEAF's, 64 the CPU default);
``--dataset femnist --data-dir DIR`` (LEAF files); the default is ``femnist_standin`` (a
labelled synthetic stand-in of FEMNIST's shape) with a small CNN, sized for a CPU.

Source for the team: seed 001 chapter 3; spec ``seed001_ch3_ch5.md`` §5.2 (protocol), C3-6 (α), C3-8
(participation), C3-9 (FedAvg), C3-13 (figures only).
"""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import optax

from fedjaxsparse.algorithms.ditto import ditto
from fedjaxsparse.algorithms.fedavg import fedavg
from fedjaxsparse.algorithms.fedcr import fedcr
from fedjaxsparse.algorithms.fedpac import fedpac
from fedjaxsparse.algorithms.fedsr import fedsr
from fedjaxsparse.algorithms.representation import make_fine_tuned_eval_fn
from fedjaxsparse.algorithms.scafflix import (flix_models, flix_sgd, local_optima,
                                             personalize, scafflix, scafflix_cohort)
from fedjaxsparse.core import global_params
from fedjaxsparse.runtime.population import PopulationState
from fedjaxsparse import evaluation
from fedjaxsparse.data import load_dataset
from fedjaxsparse.data.federated import federate
from fedjaxsparse.data.partitions import class_cycle_partition, hsu_dirichlet_partition
from fedjaxsparse.data.registry import load_arrays
from fedjaxsparse.errors import ConfigError
from fedjaxsparse.harness.options import Config, Option, name_list
from fedjaxsparse.harness.running import last
from fedjaxsparse.harness.experiment import Context, Method, Tuning, declared
from fedjaxsparse.harness.report import Figure, Table
from fedjaxsparse.models import char_lstm, cnn, make_loss
from fedjaxsparse.models.split import FEDCR_CONV, fedcr_net
from fedjaxsparse.harness.protocol import PaperConfig, load_or_standin, validation_split

NAME = "scafflix_nn"
DESCRIPTION = "Scafflix (Yi et al. 2023): Scafflix vs FLIX vs FedAvg, CNN / char-LSTM"
DEFAULTS = dict(rounds=40, clients=20, dataset="femnist_standin", eval_every=10)
# --quick: the table's shape in well under two minutes on 2 CPU cores (QUICK_RUNTIME)
QUICK = dict(rounds=2, clients=3, eval_every=1, options=dict(
    cohort=2, pre_steps=3, lrs=[0.05, 0.1], channels=[2, 4], dense=8))
QUICK_RUNTIME = "measured 54 s on 2 CPU cores (a fresh process, XLA's default flags)"
BUDGET = "communication rounds per method"
RUNTIME = "about 2.5 min (3 methods x 2 learning rates tuned on 20 rounds, then 40 rounds; small CNN; measured 148 s)"
OPTIONS = (
    Option("alpha", None, "personalization factor (default: 0.5 FEMNIST, 0.3 Shakespeare)",
           kind="float", low=0.0, high=1.0, low_open=True),
    Option("p", 0.2, "Scafflix's communication probability", low=0.0, high=1.0,
           low_open=True),
    Option("cohort", 10, "clients per round", low=1),
    Option("batch", 20, "minibatch size of local steps", low=1),
    Option("lrs", [0.01, 0.05], "learning-rate grid every method is tuned over (paper: "
           "1e-5 ... 1)", kind="floats", low=0.0, low_open=True),
    Option("search_rounds", None, "rounds of each tuning run (default rounds / 2)",
           kind="int", low=1),
    Option("validation", 0.2, "fraction of each client's training examples for validation",
           low=0.0, high=1.0, low_open=True, high_open=True),
    Option("pre_steps", 100, "local SGD steps (batch 100) of the local optima", low=0),
    Option("pre_lr", 0.05, "learning rate of the local optima", low=0.0, low_open=True),
    Option("seeds", 1, "seeds of the final runs", low=1),
    Option("channels", [8, 16], "CNN channels (paper-sized: 32,64)", kind="floats", low=1),
    Option("dense", 64, "CNN dense units (paper-sized: 512)", low=1),
    Option("hidden", 64, "LSTM units per layer, Shakespeare (paper-sized, LEAF's: 256)", low=1),
    Option("population", "off", "Scafflix on the population path (the client state h_i, x_i* "
           "touched per cohort): off (Scafflix's algorithm, every client's state on the device), "
           "device, host (in host memory: FEMNIST's 3,400 writers; evaluated with the global "
           "model) or auto (host when the state exceeds half the device's memory)",
           choices=("off", "device", "host", "auto")),
    Option("ditto_lam", 0.5, "Ditto's λ (Table B.1's data sets, where Ditto runs beside)",
           low=0.0),
    Option("methods", "", "comma list of the methods to run (default all: Scafflix, FLIX, "
           "FedAvg and, on Table B.1's data sets, Ditto, FedSR-FT, FedPAC, FedCR)", kind="str"),
    Option("b1_rule", "dirichlet", "Table B.1's client deal: dirichlet (FedCR's README, "
           "Dirichlet(0.5) / (0.3) class proportions) or noniid (FedCR's code default: "
           "class_main consecutive classes per client)", choices=("dirichlet", "noniid")),
    Option("class_main", 5, "classes per client of b1_rule=noniid (FedCR's default 5)", low=1),
    Option("fedcr_dim", 16, "FedCR / FedSR representation dimension d (FedCR's README: 256, "
           "512 for CIFAR-100)", low=1),
    Option("fedcr_dense", 64, "units of the two dense layers of FedCR's networks (its code: "
           "1024)", low=1),
    Option("fedcr_epochs", 1, "local epochs of FedSR-FT, FedPAC and FedCR (FedCR's README: 10)",
           low=1),
    Option("fedcr_samples", 2, "FedCR's draws of z per example (README: 15; 18 for "
           "CIFAR-100)", low=1),
    Option("fedcr_beta", 1e-3, "FedCR's β (README: 1e-3; 1e-4 for CIFAR-100)", low=0.0),
    Option("finetune_epochs", 2, "epochs of the fine-tuning before evaluation of FedSR-FT, "
           "FedPAC and FedCR (FedCR's code: 10)", low=1),
    Option("ablate", "none", "Fig. 3.3's ablations: run Scafflix alone over `values` of alpha, "
           "cohort (clients per round, tau) or p", choices=("none", "alpha", "cohort", "p")),
    Option("values", None, "values of the ablated parameter (default: the paper's)",
           kind="floats", low=0.0, low_open=True),
)
ABLATIONS = {  # the paper's values and stated findings (§3.3.4, Fig. 3.3; spec §5.3)
    "alpha": ([0.1, 0.3, 0.5, 0.7, 0.9], "best α = 0.3 (FEMNIST)"),
    "cohort": ([1, 5, 10, 20], "τ = 10 and 20 slightly better than 1 and 5"),
    "p": ([0.1, 0.2, 0.5], "smaller p converges faster and generalises better"),
}
SYMBOL = {"alpha": "α", "cohort": "τ", "p": "p"}
_B1 = {"alpha": 0.3, "p": 0.3, "cohort": 10, "batch": 20,
       "lrs": [1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0], "channels": [32, 64], "dense": 512,
       "fedcr_dense": 1024, "fedcr_epochs": 10, "finetune_epochs": 10}
_B1_FMNIST = {**_B1, "fedcr_dim": 256, "fedcr_samples": 15, "fedcr_beta": 1e-3}
_B1_CIFAR100 = {**_B1, "fedcr_dim": 512, "fedcr_samples": 18, "fedcr_beta": 1e-4}
_B1_DEV = ("FedCR's non-IID setting read as chapter 4's (Dirichlet 0.5, 0.3 for CIFAR-100, equal "
           "client sizes, 70/30 local train/test; 100 clients): the appendix gives only 'non-iid'; "
           "Scafflix's batch, cohort and CNN are Fig. 3.2's; Ditto's λ = 0.5, one global and one "
           "personal epoch a round (FedCR's hyper-parameters are not stated); FedSR-FT, FedPAC "
           "and FedCR with FedCR's README values except the learning rate, tuned like "
           "every method's")
PAPERS = {pc.name: pc for pc in (
    PaperConfig("tableB1_fmnist",
                "K. Yi's dissertation (Scafflix) Table B.1 (FMNIST)", dataset="fashion_mnist",
                standin="fashion_mnist_standin", clients=100, rounds=500, eval_every=25,
                options=_B1_FMNIST, unit="final test accuracy %",
                paper={"final test accuracy %": {"Ditto": 85.97, "FedSR-FT": 87.08,
                                                 "FedPAC": 89.49, "FedCR": 93.77,
                                                 "Scafflix": 89.62}},
                deviations=_B1_DEV),
    PaperConfig("tableB1_cifar100",
                "K. Yi's dissertation (Scafflix) Table B.1 (CIFAR-100, tfds)", dataset="cifar100",
                standin=None, clients=100, rounds=500, eval_every=25,
                options=_B1_CIFAR100, unit="final test accuracy %",
                paper={"final test accuracy %": {"Ditto": 58.87, "FedSR-FT": 69.95,
                                                 "FedPAC": 69.31, "FedCR": 78.49,
                                                 "Scafflix": 72.37}},
                deviations=_B1_DEV),
    PaperConfig("figure2_femnist",
                "K. Yi's dissertation (Scafflix) Fig. 3.2 (FEMNIST)", dataset="femnist",
                standin="femnist_standin", clients=3400, rounds=1000, eval_every=10,
                options={"alpha": 0.5, "p": 0.2, "cohort": 10, "batch": 20,
                         "lrs": [1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0], "channels": [32, 64],
                         "dense": 512},
                unit="validation accuracy (figure only)", paper={},
                deviations="the paper's numbers are curves only (C3-13); its CNN is '2 conv + 1 "
                           "FC' without sizes (the FedAvg CNN here); FedAvg's settings are "
                           "unspecified (C3-9)"),
    PaperConfig("figure2_shakespeare",
                "K. Yi's dissertation (Scafflix) Fig. 3.2 (Shakespeare)", dataset="shakespeare",
                standin=None, clients=1129, rounds=1000, eval_every=10,
                options={"alpha": 0.3, "p": 0.2, "cohort": 10, "batch": 20,
                         "lrs": [1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0], "hidden": 256},
                unit="validation accuracy (figure only)", paper={},
                deviations="1,108 roles of the bundled plays (LEAF: 1,129; LEAF's JSON with "
                           "--data-dir); the paper's curves only (C3-13)"),
)}
B1_OF = {"fashion_mnist": "tableB1_fmnist", "fashion_mnist_standin": "tableB1_fmnist",
         "cifar100": "tableB1_cifar100"}
"""The Table B.1 configuration whose numbers a run on each data set prints beside its own."""


def _table_b1(dataset: str) -> dict | None:
  """Table B.1's final test accuracies (%) for ``dataset`` (``None``: not in the table)."""
  return PAPERS[B1_OF[dataset]].paper["final test accuracy %"] if dataset in B1_OF else None


def _model(ds, opts):
  if ds.train.x.ndim == 3:  # character windows [N, M, 80]
    return char_lstm(ds.train.x.shape[2], ds.num_classes, hidden=opts["hidden"])
  return cnn(ds.train.x.shape[2:], ds.num_classes,
             channels=tuple(int(c) for c in opts["channels"]), dense=opts["dense"])


B1_METHODS = ("Ditto", "FedSR-FT", "FedPAC", "FedCR")
"""Table B.1's methods that run beside Scafflix, FLIX and FedAvg on its data sets."""
B1_ALPHA = {"fashion_mnist": 0.5, "fashion_mnist_standin": 0.5, "cifar100": 0.3}
"""The Dirichlet concentration of FedCR's non-IID deal per data set (the chapter 4 protocol,
which also uses FedCR's code: every client draws class proportions from Dirichlet(α) and is
filled to an equal size; each client's share split 70/30 into its own train and test data)."""


def _load(cfg: Config, name: str, opts: dict | None = None):
  opts = opts or {}
  if name in B1_ALPHA:   # Table B.1's data sets, dealt as FedCR's non-IID setting
    x, y = load_arrays(name, "all", cfg.data_dir)
    classes = int(y.max()) + 1
    if opts.get("b1_rule", "dirichlet") == "noniid":
      if opts["class_main"] > classes:
        raise ConfigError(f"option 'class_main' must be in [1, {classes}] (the classes of "
                          f"{name}), got {opts['class_main']}.")
      parts = class_cycle_partition(y, cfg.clients, opts["class_main"], seed=cfg.seed)
      rule = f"fedcr_noniid{opts['class_main']}"
    else:
      parts = hsu_dirichlet_partition(y, cfg.clients, B1_ALPHA[name], seed=cfg.seed,
                                      per_class=True)
      rule = "fedcr_dirichlet"
    return federate(x, y, parts, num_classes=classes, name=f"{name}/{rule}",
                    test_fraction=0.3, seed=cfg.seed)
  if name == "femnist":
    kw = {"data_dir": cfg.data_dir, "num_clients": cfg.clients, "test": "writers"}
  elif name == "shakespeare":
    kw = {"data_dir": cfg.data_dir, "num_clients": cfg.clients, "seed": cfg.seed}
  elif name == "femnist_standin":
    kw = {"num_clients": cfg.clients, "seed": cfg.seed, "test": "writers"}
  else:
    raise ConfigError(f"{NAME} runs on femnist (with --data-dir), shakespeare (bundled, or "
                      f"--data-dir), femnist_standin, fashion_mnist(_standin) or cifar100 (tfds, "
                      f"--data-dir), got {name!r}.")
  return load_dataset(name, **kw)


def _variants(opts: dict, alpha: float, cohort: int, dataset: str = "") -> dict[str, dict]:
  """The compared methods, each ``{"alpha", "p", "cohort"}``: Scafflix, FLIX and FedAvg (and
  Ditto on Table B.1's data sets), or, with ``ablate``, Scafflix at each value of the ablated
  parameter."""
  base = {"alpha": alpha, "p": opts["p"], "cohort": cohort}
  if opts["ablate"] == "none":
    names = ("Scafflix", "FLIX", "FedAvg") + (B1_METHODS if dataset in B1_ALPHA else ())
    chosen = name_list(opts.get("methods", ""), "methods", names, default=names)
    return {name: base for name in names if name in chosen}
  what = opts["ablate"]
  values = opts["values"] or ABLATIONS[what][0]
  if what == "cohort":
    values = [int(v) for v in values]
  elif what in ("alpha", "p") and max(values) > 1:
    raise ConfigError(f"option 'values' of ablate={what} must be in (0, 1], got {values}.")
  return {f"Scafflix ({SYMBOL[what]}={v:g})": {**base, what: v} for v in values}


def setup(cfg: Config, opts: dict) -> Context:
  """The clients' data (each evaluated on its own test examples), the model, every client's
  local optimum x_i* (on the fitting split for tuning runs, on all training data for the final
  ones) and the compared variants."""
  ds, standin = load_or_standin(PAPERS.get(cfg.paper), cfg.dataset, cfg.data_dir,
                                lambda name: _load(cfg, name, opts))
  if ds.test.num_clients != ds.train.num_clients:
    raise ConfigError(f"{NAME} evaluates every client on its own test examples; "
                      f"{ds.name} has a shared test set.")
  alpha = opts["alpha"] or (0.3 if cfg.dataset == "shakespeare" else 0.5)
  variants = _variants(opts, alpha, opts["cohort"], cfg.dataset)
  for v in variants.values():
    if v["cohort"] > ds.num_clients:
      raise ConfigError(f"clients per round (option 'cohort' or an ablation value) must be "
                        f"in [1, clients={ds.num_clients}], got {v['cohort']}.")
  model = _model(ds, opts)
  loss = make_loss(model)
  params = model.init(jax.random.key(cfg.seed))
  fit, val = validation_split(ds.train, opts["validation"], cfg.seed)
  pre = dict(lr=opts["pre_lr"], tol=0.0, max_steps=opts["pre_steps"], batch_size=100,
             key=jax.random.key(cfg.seed + 1))
  flix = any(n.startswith(("Scafflix", "FLIX")) for n in variants)   # they need x_i*
  fit_star = (local_optima(loss, params, fit, **pre).x_star  # tuning never sees more
              if flix and len(opts["lrs"]) > 1 else None)
  x_star = local_optima(loss, params, ds.train, **pre).x_star if flix else None
  print(f"{NAME}: {ds.name}{' (' + standin + ')' if standin else ''}, {ds.num_clients} "
        f"clients, {opts['cohort']} per round, alpha={alpha}, p={opts['p']}, batch "
        f"{opts['batch']}; local optima: {opts['pre_steps']} SGD steps per client")
  return Context(ds, params, None, {"model": model, "loss": loss, "variants": variants,
                                    "alpha": alpha, "standin": standin,
                                    "stars": (fit_star, x_star)}, fit=fit, val=val)


def methods(ctx: Context, cfg: Config, opts: dict) -> dict:
  """Scafflix, FLIX and FedAvg (or Scafflix at each ablated value), each tuned over ``lrs``
  and evaluated client by client on the client's own test examples (FedAvg with the global
  model on every client)."""
  model, loss, batch = ctx.extra["model"], ctx.extra["loss"], opts["batch"]
  fit_star, x_star = ctx.extra["stars"]
  n = ctx.data.num_clients

  def build(name, lr, run):
    star = fit_star if run.tuning else x_star
    v = ctx.extra["variants"][name]
    a, p, c = v["alpha"], v["p"], v["cohort"]
    if name.startswith("Scafflix") and opts["population"] != "off":
      return scafflix_cohort(
          loss, lr, p, a, optimum_lr=opts["pre_lr"], optimum_steps=opts["pre_steps"],
          optimum_batch_size=100, cohort_size=c, batch_size=batch,
          key=jax.random.key(cfg.seed + 1)), _population_eval(model, a, n)
    if name.startswith("Scafflix"):
      algo = scafflix(loss, lr, p, a, star, form="round", cohort_size=c, batch_size=batch)
    elif name == "FLIX":
      algo = flix_sgd(loss, lr, a, star, cohort_size=c, batch_size=batch)
    elif name in models:
      return _representation_method(name, models[name], lr, run, ctx, cfg, opts)
    elif name == "Ditto":   # one global and one personal epoch a round, λ = ditto_lam
      algo = ditto(loss, lr, lam=opts["ditto_lam"], global_epochs=1, personal_epochs=1,
                   batch_size=batch, cohort_size=c)
      return algo, evaluation.make_personal_eval_fn(model, lambda st: st.personal,
                                                    lambda st: st.params)
    else:
      algo = fedavg(loss, optax.sgd(lr), local_steps=math.ceil(1 / p), batch_size=batch,
                    cohort_size=c)
      return algo, evaluation.make_personal_eval_fn(
          model, lambda x: jax.tree.map(lambda l: jnp.broadcast_to(l, (n,) + l.shape), x), None)
    return algo, evaluation.make_personal_eval_fn(model, flix_models(star, a))

  models = {name: _representation_model(name, ctx, opts) for name in ctx.extra["variants"]
            if name in ("FedSR-FT", "FedPAC", "FedCR")}
  pop = opts["population"] != "off"
  return {name: Method(lambda lr, run, name=name: build(name, lr, run), opts["lrs"],
                       label=lambda lr: f"lr={lr:g}",
                       params_fn=(lambda st: st) if (pop and name.startswith("Scafflix"))
                       or name in B1_METHODS else global_params,
                       residence=opts["population"] if pop else "auto",
                       params=(models[name].init(jax.random.key(cfg.seed))
                               if name in models else None))
          for name in ctx.extra["variants"]}


def _representation_model(name: str, ctx: Context, opts: dict):
  """FedCR's network for the data set: Fashion-MNIST's CNN, or CIFAR's (three channels or
  more than ten classes); a Gaussian representation except for FedPAC."""
  shape = ctx.data.train.x.shape[2:]
  rgb = ctx.data.num_classes > 10 or (len(shape) == 3 and shape[-1] == 3)
  return fedcr_net(shape, ctx.data.num_classes, opts["fedcr_dim"],
                   conv=FEDCR_CONV["cifar" if rgb else "fashion_mnist"],
                   dense=(opts["fedcr_dense"],) * 2, gaussian=name != "FedPAC")


def _representation_method(name: str, model, lr: float, run, ctx: Context, cfg: Config,
                           opts: dict):
  """FedSR-FT, FedPAC or FedCR with FedCR's README values (batch 48, no momentum, gradient
  norm clipped at 10), evaluated after fine-tuning every client on its training data (the
  fitting part in tuning runs)."""
  common = dict(epochs=opts["fedcr_epochs"], batch_size=48, cohort_size=opts["cohort"])
  if name == "FedCR":
    algo = fedcr(model, lr, beta=opts["fedcr_beta"], samples=opts["fedcr_samples"], **common)
  elif name == "FedSR-FT":
    algo = fedsr(model, lr, **common)
  else:
    algo = fedpac(model, lr, **common)
  train = ctx.fit if run.tuning else ctx.data.train
  eval_fn = make_fine_tuned_eval_fn(
      model, train, jax.random.key(cfg.seed + 7), lr=lr, epochs=opts["finetune_epochs"],
      batch_size=48, trainable="projection+head" if name == "FedSR-FT" else "head")
  return algo, eval_fn


def _population_eval(model, alpha: float, n: int):
  """Scafflix on the population path: with the population on the device, every client's FLIX
  model x̃_i = α x̄ + (1 − α) x_i* on its own test examples (its x_i* from the client state);
  with it in host memory, the global model x̄ on every client's test examples (the
  personal models would need every x_i* on the device)."""
  personal = evaluation.make_personal_eval_fn(
      model, lambda st: personalize(st.server.params, st.clients.x_star,
                                    jnp.full((n,), alpha, jnp.result_type(float))),
      lambda st: st.server.params)
  broadcast = evaluation.make_personal_eval_fn(
      model, lambda x: jax.tree.map(lambda l: jnp.broadcast_to(l, (n,) + l.shape), x), None)

  def eval_fn(state, test):
    if isinstance(state, PopulationState):
      return personal(state, test)
    return broadcast(state, test)   # the host path passes the global model

  return eval_fn


def _tuning_config(cfg: Config, opts: dict) -> Config:
  """Tuning runs: ``search_rounds`` rounds (default half the budget), one evaluation at the
  end, a diverging learning rate recorded as the worst."""
  search_rounds = opts["search_rounds"] or max(1, cfg.rounds // 2)
  return dataclasses.replace(cfg, rounds=search_rounds, eval_every=search_rounds,
                             progress=False, on_divergence="skip")


def columns(m: str, tuned, ctx: Context, cfg: Config, opts: dict) -> dict:
  """The plain client mean, the global model's accuracy, the seeds that did not diverge."""
  ev = tuned.records[0]["history"]["evals"]
  ok = not tuned.records[0]["diverged"]
  diverged = opts["seeds"] - len(tuned.finals)
  b1 = _table_b1(cfg.dataset)
  extra = {} if b1 is None else {"paper % (Table B.1)": b1.get(m)}
  if "global_accuracy" in ev:
    glob = ev["global_accuracy"]
  elif "before_accuracy" in ev:   # fine-tuned methods: FedSR-FT's global model, none else
    glob = ev["before_accuracy"] if m == "FedSR-FT" else None
  else:                           # FedAvg, Scafflix on the host: the global model everywhere
    glob = ev["accuracy"]
  tuned_extra = ({"before fine-tuning": last(ev["before_accuracy"]) if ok else None}
                 if "before_accuracy" in ev else {})
  return {**extra, "client mean": last(ev["accuracy_client_mean"]) if ok else None,
          "global model": last(glob) if ok and glob is not None else None, **tuned_extra,
          "seeds": len(tuned.finals),
          "status": f"{diverged} of {opts['seeds']} diverged" if diverged else "ok"}


def report(results: dict, ctx: Context, cfg: Config, opts: dict) -> dict:
  """The setting, every learning rate's validation accuracy and, for an ablation, the best
  value here beside the paper's finding."""
  out = {"dataset": ctx.data.name, "standin": ctx.extra["standin"],
         "alpha": ctx.extra["alpha"], "p": opts["p"], "cohort": opts["cohort"],
         "ablate": opts["ablate"],
         "search": {m: {str(k): v for k, v in t.scores.items()}
                    for m, t in results["tuned"].items()}}
  b1 = _table_b1(cfg.dataset)
  if b1 is not None and opts["ablate"] == "none":
    out["table_b1"] = Table(
        [{"method": m, "paper %": v, "here": "beside" if m in results["tuned"] else
          "not run (option methods)"} for m, v in b1.items()],
        title=f"{PAPERS[B1_OF[cfg.dataset]].source} (FedCR's non-IID setting, 500 rounds, "
              "p = 0.3, α = 0.3):")
  if opts["ablate"] != "none":
    rows = results["table"].rows
    best = max(rows, key=lambda r: -1.0 if r["test accuracy"] is None
               else r["test accuracy"])["method"]
    out["ablation"] = {"best": best, "paper": ABLATIONS[opts["ablate"]][1]}
    out["table"] = Table(rows, note=f"ablation of {opts['ablate']}: best here {best}; the "
                                    f"paper: {ABLATIONS[opts['ablate']][1]}")
  return out


def figure(results: dict, ctx: Context, cfg: Config, opts: dict) -> Figure:
  return Figure("personal", dict(
      methods=results["methods"],
      title=f"{ctx.data.name}: test accuracy of each client's model on its own data"))


run = declared(NAME, OPTIONS, setup=setup, methods=methods, report=report, figure=figure,
               papers=PAPERS, tuning=Tuning(column="test accuracy", scale=1.0,
                                            config=_tuning_config, columns=columns))
