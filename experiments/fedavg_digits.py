"""FedAvg on a federated classification dataset (default: scikit-learn's digits, Dirichlet
α = 0.5 over 20 clients, shipped inside scikit-learn, so it runs offline).

Methods: FedSGD (one full-batch local step), FedAvg (several local minibatch steps, McMahan
et al. 2017), FedAvg with partial participation, and FedAdam (FedAvg with an Adam server
optimizer, Reddi et al. 2021). Prints a table of final accuracy and uplink bits to reach an
accuracy threshold, and writes ``results.json`` plus ``fedavg_digits.png``.

A declared experiment (:func:`fedjaxsparse.harness.experiment.declared`): ``setup`` (data,
model, evaluation), ``methods`` (paper name → Algorithm) and ``report`` (the optional
post-training pruning table); the harness runs, tabulates, saves and plots.

Options: see ``OPTIONS`` (``fedjaxsparse describe fedavg_digits``).
"""
from __future__ import annotations

import jax
import optax

from fedjaxsparse.pruning import posttrain
from fedjaxsparse.algorithms.fedavg import fedavg
from fedjaxsparse.core import global_params
from fedjaxsparse.data import load_dataset
from fedjaxsparse.errors import ConfigError
from fedjaxsparse.evaluation import make_eval_fn
from fedjaxsparse.harness.options import Config, Option, name_list
from fedjaxsparse.harness.experiment import Context, declared
from fedjaxsparse.harness.report import Table
from fedjaxsparse.models import get_model, make_loss

NAME = "fedavg_digits"
DESCRIPTION = "FedSGD / FedAvg / partial participation / FedAdam on federated digits (offline)"
DEFAULTS = dict(rounds=150, clients=20, dataset="digits", eval_every=5)
# --quick: the table's shape in well under two minutes on 2 CPU cores (QUICK_RUNTIME)
QUICK = dict(rounds=20, clients=6, eval_every=2)
QUICK_RUNTIME = "measured 14 s on 2 CPU cores (a fresh process, XLA's default flags)"
BUDGET = "communication rounds per method"
RUNTIME = "about 20 s (4 methods x 150 rounds, softmax regression on digits; measured 19 s)"
METHODS = ("FedSGD", "FedAvg", "FedAvg-partial", "FedAdam")
"""The ``methods`` option's names, in the order the methods run."""
OPTIONS = (
    Option("model", "softmax", "client model; cnn is the FedAvg CNN (1.7 M parameters): on "
           "Fashion-MNIST-sized clients its full-batch FedSGD step needs a GPU",
           choices=("softmax", "mlp", "cnn")),
    Option("partition", "dirichlet", "how examples are split over clients",
           choices=("iid", "dirichlet", "shards", "lognormal")),
    Option("alpha", 0.5, "Dirichlet concentration (partition=dirichlet)", low=0.0,
           low_open=True),
    Option("local_steps", 10, "local SGD steps per round (FedAvg methods)", low=1),
    Option("batch_size", 16, "examples per local step", low=1),
    Option("client_lr", 0.3, "client SGD learning rate", low=0.0, low_open=True),
    Option("cohort", None, "clients per round of the partial-participation method (default "
           "clients/4)", kind="int", low=1),
    Option("threshold", 0.93, "accuracy of the bits-to-reach column", low=0.0, high=1.0,
           identity=False),
    Option("eval_batch_size", None, "evaluation batch size (default: all examples at once)",
           kind="int", low=1),
    Option("methods", ",".join(METHODS), "comma list of the methods to run: " + ", ".join(
        METHODS) + " (FedAvg-partial: FedAvg with a cohort of --set cohort clients per round)",
           kind="str"),
    Option("posttrain", [], "sparsities at which to prune FedAvg's final global model one-shot "
           "(magnitude, Wanda, RIA; calibrated on 32 examples per client) and report accuracy",
           kind="floats", low=0.0, high=1.0, high_open=True, identity=False),
)


def _dataset_kwargs(cfg: Config, opts: dict) -> dict:
  kw = {"num_clients": cfg.clients, "seed": cfg.seed}
  if cfg.dataset in ("digits", "fashion_mnist", "cifar10", "cifar100", "emnist", "libsvm"):
    kw["partition"] = opts["partition"]
    if kw["partition"] == "dirichlet":
      kw["alpha"] = opts["alpha"]
  if cfg.data_dir is not None:
    kw["data_dir"] = cfg.data_dir
  return kw


def setup(cfg: Config, opts: dict) -> Context:
  """The federated dataset, the client model's initial parameters and its evaluation."""
  if opts["posttrain"] and "FedAvg" not in name_list(opts["methods"], "methods", METHODS):
    raise ConfigError("option 'posttrain' prunes FedAvg's final model: keep FedAvg in "
                      f"'methods' (got {opts['methods']!r}).")
  ds = load_dataset(cfg.dataset, **_dataset_kwargs(cfg, opts))
  if ds.num_classes == 0:
    raise ConfigError(f"{NAME} needs a classification dataset; {cfg.dataset!r} is regression.")
  model = get_model(opts["model"], ds.train.x.shape[2:], ds.num_classes)
  cohort = opts["cohort"] or max(1, cfg.clients // 4)
  if cohort > ds.num_clients:
    raise ConfigError(f"option 'cohort' must be in [1, clients={ds.num_clients}], got "
                      f"{cohort}.")
  print(f"{NAME}: {ds.name}, {ds.num_clients} clients, "
        f"{int(ds.train.num_examples.sum())} train examples, model={opts['model']}")
  return Context(ds, model.init(jax.random.key(cfg.seed)),
                 make_eval_fn(model, batch_size=opts["eval_batch_size"]),
                 {"model": model, "loss": make_loss(model), "cohort": cohort})


def _fedavg_name(opts: dict) -> str:
  return f"FedAvg (E={opts['local_steps']}, B={opts['batch_size']})"


def methods(ctx: Context, cfg: Config, opts: dict) -> dict:
  """FedSGD, FedAvg, FedAvg with partial participation and FedAdam, by their papers' names
  (those the ``methods`` option picks, in this order)."""
  loss, cohort = ctx.extra["loss"], ctx.extra["cohort"]
  lr, steps, batch = opts["client_lr"], opts["local_steps"], opts["batch_size"]
  picked = name_list(opts["methods"], "methods", METHODS)
  every = {
      "FedSGD": ("FedSGD", lambda: fedavg(loss, optax.sgd(lr), local_steps=1)),
      "FedAvg": (_fedavg_name(opts), lambda: fedavg(loss, optax.sgd(lr), local_steps=steps,
                                                    batch_size=batch)),
      "FedAvg-partial": (f"FedAvg, {cohort}/{cfg.clients} clients per round", lambda: fedavg(
          loss, optax.sgd(lr), local_steps=steps, batch_size=batch, cohort_size=cohort)),
      "FedAdam": ("FedAdam (server Adam 0.01)", lambda: fedavg(
          loss, optax.sgd(lr), local_steps=steps, batch_size=batch,
          server_optimizer=optax.adam(0.01))),
  }
  return {every[m][0]: every[m][1]() for m in METHODS if m in picked}


def report(results: dict, ctx: Context, cfg: Config, opts: dict) -> dict:
  """With ``--set posttrain=...``: FedAvg's final global model pruned one-shot."""
  if not opts["posttrain"]:
    return {}
  name = _fedavg_name(opts)
  rows = posttrain.one_shot(
      ctx.extra["model"].apply, global_params(results["methods"][name]["state"]),
      posttrain.client_batches(ctx.data.train, 32), lambda p: ctx.eval_fn(p, ctx.data.test),
      opts["posttrain"])
  rows = [{**r, "sparsity %": 100 * r["sparsity"], "accuracy %": 100 * r["accuracy"]}
          for r in rows]
  return {"posttrain": Table(rows, ["score", "sparsity %", "accuracy %"], title=(
      f"{name}'s global model pruned one-shot (Yi (2025) ch. 6 scores, layer-sequential "
      "calibration on 32 examples per client):"))}


run = declared(NAME, OPTIONS, setup=setup, methods=methods, report=report)
