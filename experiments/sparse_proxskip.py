"""Seed 000's comparison: Sparse-ProxSkip and its baselines at a target sparsity.

Methods (seed 000 Tables 1-4): Final-TopK (dense ProxSkip, Top-K at evaluation), FedHT,
FedIHT, Accelerated-Server-Pruning (ASP), RandProx-l1 (λ = ``lam``, default seed 000's
literal 1/(2N)), Sparse-ProxSkip-Local (SPS-Local) and
Sparse-ProxSkip (SPS); and (unless ``--set diagnostics=False``) the appendix-D variants
ASP-modified and SPS-modified with a plot of ‖Σh_i‖, mean‖h_i‖, ‖w‖ and the loss (Figs 6-8).

Data: classification (softmax regression, test accuracy; seed 000 §4.2 uses FEMNIST with 100
writers, ``--dataset femnist --data-dir ...``) or regression (ridge regression, test R²;
§4.1 uses BlogFeedback's 554 natural clients, ``--dataset blogfeedback --data-dir ...``).
The default is the embedded digits set (offline), a stand-in labelled as such in the output.

Every model is Top-K'd to the target sparsity before every evaluation (seed 000 §B). The
ProxSkip family runs ``--rounds`` *iterations* (one local step each, communication with
probability p); FedHT/FedIHT run ``p · rounds`` rounds of ``1/p`` local steps, so every method
takes the same number of local gradient steps. γ = 1/L_max and p = 1/√κ (ProxSkip's theory)
are computed from the data unless given (``--set gamma=... --set p=...``); the paper tuned
both by random search and does not report them.

Options: ``sparsity`` (0.9), ``l2``, ``gamma``, ``p``, ``lam``, ``thresholds`` (list),
``diagnostics``, ``reduction`` ("mean"/"sum").
"""
from __future__ import annotations

import math
import os

import jax
import numpy as np

from fedjaxsparse.algorithms import proxskip as ps
from fedjaxsparse.algorithms.fedht import fedht, fediht
from fedjaxsparse.constants import linear_model_constants
from fedjaxsparse.data import load_dataset
from fedjaxsparse.evaluation import make_eval_fn
from fedjaxsparse.experiment import (Config, bits_to_reach, output_dir, print_table,
                                     run_method, save_results)
from fedjaxsparse.models import linear_regression, make_loss, softmax_regression
from fedjaxsparse.plotting import plot_methods, plot_series
from fedjaxsparse.sparsity import k_from_sparsity, top_k

NAME = "sparse_proxskip"
DESCRIPTION = "Seed 000: Sparse-ProxSkip vs Final-TopK, FedHT, FedIHT, ASP, RandProx-l1, SPS-Local"
DEFAULTS = dict(rounds=3000, clients=20, dataset="digits", eval_every=100)
PAPER_DATASETS = {"blogfeedback": "seed 000 §4.1 (BlogFeedback)",
                  "femnist": "seed 000 §4.2 (FEMNIST)"}


def _load(cfg: Config):
  kw = {}
  if cfg.dataset in ("digits", "fashion_mnist", "libsvm", "cifar10", "emnist"):
    kw = {"num_clients": cfg.clients, "seed": cfg.seed, "partition": "dirichlet",
          "alpha": float(cfg.options.get("alpha", 0.5))}
  elif cfg.dataset in ("diabetes", "synthetic"):
    kw = {"num_clients": cfg.clients, "seed": cfg.seed}
  elif cfg.dataset == "femnist":
    kw = {"num_writers": cfg.clients}
  if cfg.data_dir is not None:
    kw["data_dir"] = cfg.data_dir
  return load_dataset(cfg.dataset, **kw)


def run(cfg: Config) -> dict:
  opts = cfg.options
  ds = _load(cfg)
  sparsity = float(opts.get("sparsity", 0.9))
  regression = ds.num_classes == 0
  d_in = int(np.prod(ds.train.x.shape[2:]))
  blog = cfg.dataset == "blogfeedback"
  if regression:
    l2 = float(opts.get("l2", 500.0 if blog else 0.01))
    reduction = opts.get("reduction", "sum" if blog else "mean")
    model = linear_regression(d_in, l2=l2, use_bias=not blog)
    metric, thresholds = "r2", opts.get("thresholds", [0.2, 0.225, 0.25] if blog else
                                        [0.3, 0.4, 0.45])
  else:
    l2 = float(opts.get("l2", 0.01))
    reduction = opts.get("reduction", "mean")
    model = softmax_regression(d_in, ds.num_classes, l2=l2)
    metric, thresholds = "accuracy", opts.get("thresholds", [0.75, 0.8, 0.85])
  consts = linear_model_constants(ds.train, l2, "squared" if regression else "softmax",
                                  reduction, use_bias=not blog)
  gamma = float(opts.get("gamma", 1.0 / consts.L_max))
  p = float(opts.get("p", min(1.0, max(0.02, 1.0 / math.sqrt(consts.kappa)))))
  loss = make_loss(model, reduction)
  params = model.init(jax.random.key(cfg.seed))
  d = sum(x.size for x in jax.tree.leaves(params))
  k = k_from_sparsity(d, sparsity)
  lam = float(opts.get("lam", 1.0 / (2 * ds.num_clients)))  # seed 000's literal (1/2N)·φ
  steps = max(1, round(1 / p))
  fed_rounds = max(1, round(cfg.rounds / steps))
  label = ds.name if cfg.dataset in PAPER_DATASETS else f"{ds.name} (embedded stand-in)"
  print(f"{NAME}: {label}, {ds.num_clients} clients, d={d}, sparsity={sparsity:.0%} (K={k}), "
        f"L_max={consts.L_max:.4g}, mu={consts.mu:.4g}, gamma={gamma:.4g}, p={p:.4g}")

  methods = {
      "Final-TopK": ps.proxskip(loss, gamma, p),
      "FedHT": fedht(loss, gamma, steps, sparsity),
      "FedIHT": fediht(loss, gamma, steps, sparsity),
      "ASP": ps.accelerated_server_pruning(loss, gamma, p, sparsity),
      "RandProx-l1": ps.randprox_l1(loss, gamma, p, lam),
      "SPS-Local": ps.sparse_proxskip_local(loss, gamma, p, sparsity),
      "SPS": ps.sparse_proxskip(loss, gamma, p, sparsity),
  }
  if opts.get("diagnostics", True):
    methods["ASP-modified"] = ps.accelerated_server_pruning_modified(loss, gamma, p, sparsity)
    methods["SPS-modified"] = ps.sparse_proxskip_modified(loss, gamma, p, sparsity)
  eval_fn = make_eval_fn(model)
  sparse_params = lambda state: top_k(state.params, k)
  records = {}
  for name, algo in methods.items():
    fed = name in ("FedHT", "FedIHT")
    sub = Config(**{**cfg.__dict__, "rounds": fed_rounds if fed else cfg.rounds,
                    "eval_every": max(1, cfg.eval_every // steps) if fed else cfg.eval_every})
    rec = run_method(sub, NAME, name, algo, params, ds.train, ds.test, eval_fn,
                     params_fn=sparse_params)
    per_step = steps if fed else 1
    for table in ("rounds", "evals"):
      h = rec["history"][table]
      h["local_steps"] = [r * per_step for r in h["round"]]
      h["uplink_bits_per_client"] = [b / ds.num_clients for b in h["uplink_bits"]]
    records[name] = rec

  rows = []
  for name, rec in records.items():
    ev, rd = rec["history"]["evals"], rec["history"]["rounds"]
    row = {"method": name, f"final {metric}": ev[metric][-1], f"best {metric}": max(ev[metric]),
           "train loss": rd["loss"][-1]}
    for t in thresholds:
      row[f"bits/client to {t}"] = bits_to_reach(ev, metric, t, "uplink_bits_per_client")
    rows.append(row)
  ref = next((r for r in rows if r["method"] == ("Final-TopK" if regression else "FedIHT")))
  for row in rows:
    b, b_ref = row[f"bits/client to {thresholds[0]}"], ref[f"bits/client to {thresholds[0]}"]
    row[f"speedup at {thresholds[0]} vs {ref['method']}"] = (
        b_ref / b if b and b_ref else None)
  table = print_table(rows, list(rows[0]))
  out = output_dir(cfg, NAME)
  results = {"experiment": NAME, "dataset": label, "metric": metric, "sparsity": sparsity,
             "k": k, "gamma": gamma, "p": p, "constants": consts._asdict(), "table": rows,
             "table_text": table, "methods": records}
  path = save_results(cfg, NAME, results)
  png = plot_methods(records, metric, os.path.join(out, f"{NAME}.png"),
                     title=f"{label}, {sparsity:.0%} sparsity (models Top-K'd at evaluation)",
                     x="local_steps")
  print(f"results: {path}\nplot: {png}")
  if opts.get("diagnostics", True):
    diag = plot_series({m: r for m, r in records.items() if m not in ("FedHT", "FedIHT")},
                       ["sum_h_norm", "mean_h_norm", "server_norm", "loss"],
                       os.path.join(out, f"{NAME}_zero_sum.png"),
                       title="zero-sum diagnostics (seed 000 appendix D)", x="local_steps")
    print(f"diagnostics: {diag}")
  return results
