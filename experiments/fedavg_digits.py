"""FedAvg on a federated classification dataset (default: scikit-learn's digits, Dirichlet
α = 0.5 over 20 clients, shipped inside scikit-learn, so it runs offline).

Methods: FedSGD (one full-batch local step), FedAvg (several local minibatch steps, McMahan
et al. 2017), FedAvg with partial participation, and FedAdam (FedAvg with an Adam server
optimizer, Reddi et al. 2021). Prints a table of final accuracy and uplink bits to reach an
accuracy threshold, and writes ``results.json`` plus ``fedavg_digits.png``.

Options (``--set key=value``): ``model`` (softmax | mlp | cnn), ``alpha`` (Dirichlet
concentration), ``partition``, ``local_steps``, ``batch_size``, ``client_lr``, ``cohort``
(clients per round for the partial-participation method), ``threshold`` (accuracy for the
bits table).
"""
from __future__ import annotations

import os

import jax
import optax

from fedjaxsparse.algorithms.fedavg import fedavg
from fedjaxsparse.data import load_dataset
from fedjaxsparse.evaluation import make_eval_fn
from fedjaxsparse.experiment import (Config, bits_to_reach, output_dir, print_table,
                                     run_method, save_results)
from fedjaxsparse.models import get_model, make_loss
from fedjaxsparse.plotting import plot_methods

NAME = "fedavg_digits"
DESCRIPTION = "FedSGD / FedAvg / partial participation / FedAdam on federated digits (offline)"
DEFAULTS = dict(rounds=150, clients=20, dataset="digits", eval_every=5)


def _dataset_kwargs(cfg: Config) -> dict:
  kw = {"num_clients": cfg.clients, "seed": cfg.seed}
  if cfg.dataset in ("digits", "fashion_mnist", "cifar10", "cifar100", "emnist", "libsvm"):
    kw["partition"] = cfg.options.get("partition", "dirichlet")
    if kw["partition"] == "dirichlet":
      kw["alpha"] = float(cfg.options.get("alpha", 0.5))
  if cfg.data_dir is not None:
    kw["data_dir"] = cfg.data_dir
  return kw


def run(cfg: Config) -> dict:
  opts = cfg.options
  ds = load_dataset(cfg.dataset, **_dataset_kwargs(cfg))
  if ds.num_classes == 0:
    raise ValueError(f"{NAME} needs a classification dataset; {cfg.dataset!r} is regression.")
  model = get_model(opts.get("model", "softmax"), ds.train.x.shape[2:], ds.num_classes)
  loss = make_loss(model)
  params = model.init(jax.random.key(cfg.seed))
  eval_fn = make_eval_fn(model, batch_size=opts.get("eval_batch_size"))
  lr = float(opts.get("client_lr", 0.3))
  steps = int(opts.get("local_steps", 10))
  batch = int(opts.get("batch_size", 16))
  cohort = min(int(opts.get("cohort", max(1, cfg.clients // 4))), cfg.clients)
  methods = {
      "FedSGD": fedavg(loss, optax.sgd(lr), local_steps=1),
      f"FedAvg (E={steps}, B={batch})": fedavg(loss, optax.sgd(lr), local_steps=steps,
                                              batch_size=batch),
      f"FedAvg, {cohort}/{cfg.clients} clients per round": fedavg(
          loss, optax.sgd(lr), local_steps=steps, batch_size=batch, cohort_size=cohort),
      "FedAdam (server Adam 0.01)": fedavg(loss, optax.sgd(lr), local_steps=steps,
                                           batch_size=batch,
                                           server_optimizer=optax.adam(0.01)),
  }
  print(f"{NAME}: {ds.name}, {ds.num_clients} clients, "
        f"{int(ds.train.num_examples.sum())} train examples, model={opts.get('model', 'softmax')}")
  records = {m: run_method(cfg, NAME, m, algo, params, ds.train, ds.test, eval_fn)
             for m, algo in methods.items()}

  threshold = float(opts.get("threshold", 0.93))
  rows = []
  for m, r in records.items():
    ev = r["history"]["evals"]
    b = bits_to_reach(ev, "accuracy", threshold)
    rows.append({"method": m, "final acc": ev["accuracy"][-1],
                 "best acc": max(ev["accuracy"]),
                 f"uplink bits to {threshold:.0%}": b,
                 "total uplink bits": ev["uplink_bits"][-1],
                 "time (s)": r["wall_time_s"]})
  table = print_table(rows, list(rows[0]))
  results = {"experiment": NAME, "dataset": ds.name, "metric": "accuracy", "table": rows,
             "table_text": table, "methods": records}
  path = save_results(cfg, NAME, results)
  png = plot_methods(records, "accuracy", os.path.join(output_dir(cfg, NAME), f"{NAME}.png"),
                     title=f"{NAME}: {ds.name}")
  print(f"results: {path}\nplot: {png}")
  return results
