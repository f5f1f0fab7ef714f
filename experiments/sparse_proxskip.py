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

Options: see ``OPTIONS`` (``fedjaxsparse describe sparse_proxskip``).
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
from fedjaxsparse.experiment import (Config, Option, bits_to_reach, entry, output_dir,
                                     last, print_table, run_method, save_results,
                                     status)
from fedjaxsparse.models import linear_regression, make_loss, softmax_regression
from fedjaxsparse.plotting import method_colors, plot_methods, plot_series
from fedjaxsparse.sparsity import k_from_sparsity, top_k
from fedjaxsparse.sweep import run_batched

NAME = "sparse_proxskip"
DESCRIPTION = "Seed 000: Sparse-ProxSkip vs Final-TopK, FedHT, FedIHT, ASP, RandProx-l1, SPS-Local"
DEFAULTS = dict(rounds=3000, clients=20, dataset="digits", eval_every=100)
BUDGET = ("iterations (local gradient steps) per method; ProxSkip-family methods communicate "
          "with probability p per iteration, FedHT/FedIHT run rounds/round(1/p) communication "
          "rounds of round(1/p) local steps, so every method takes the same local steps")
RUNTIME = "about 40 s (9 methods x 3000 iterations on digits; measured 36 s)"
OPTIONS = (
    Option("sparsity", 0.9, "target sparsity of the evaluated (Top-K'd) model", low=0.0,
           high=1.0, high_open=True),
    Option("sparsities", [], "extra sparsities for the Table 1/4 layout (final metric per "
           "method and sparsity), e.g. [0.8,0.9,0.95]", kind="floats", low=0.0, high=1.0,
           high_open=True, identity=False),
    Option("alpha", 0.5, "Dirichlet concentration of the label split (embedded data)",
           low=0.0, low_open=True),
    Option("l2", None, "l2 regularisation (default: 500 for BlogFeedback, 0.01 otherwise)",
           kind="float", low=0.0),
    Option("reduction", None, "loss over a client's examples: mean or sum (default: sum for "
           "BlogFeedback, mean otherwise)", kind="str", choices=("mean", "sum")),
    Option("gamma", None, "step size (default 1/L_max from the data)", kind="float", low=0.0,
           low_open=True),
    Option("p", None, "communication probability (default 1/sqrt(kappa) from the data)",
           kind="float", low=0.0, high=1.0, low_open=True),
    Option("lam", None, "RandProx-l1 weight (default seed 000's literal 1/(2N))", kind="float",
           low=0.0),
    Option("thresholds", None, "metric thresholds of the bits-to-reach columns (default "
           "[0.75,0.8,0.85] accuracy, R2 [0.3,0.4,0.45] or BlogFeedback [0.2,0.225,0.25])",
           kind="floats", identity=False),
    Option("diagnostics", True, "also run ASP-modified and SPS-modified and plot the zero-sum "
           "diagnostics (Figs 6-8)", identity=False),
    Option("search", 0, "random (gamma, p) samples per ProxSkip-family method (0: theory "
           "values)", low=0),
    Option("repetitions", 5, "seeds per random-search sample", low=1),
)
PAPER_DATASETS = {"blogfeedback": "seed 000 §4.1 (BlogFeedback)",
                  "femnist": "seed 000 §4.2 (FEMNIST)"}


def _load(cfg: Config, alpha: float):
  kw = {}
  if cfg.dataset in ("digits", "fashion_mnist", "libsvm", "cifar10", "emnist"):
    kw = {"num_clients": cfg.clients, "seed": cfg.seed, "partition": "dirichlet",
          "alpha": alpha}
  elif cfg.dataset in ("diabetes", "synthetic"):
    kw = {"num_clients": cfg.clients, "seed": cfg.seed}
  elif cfg.dataset == "femnist":
    kw = {"num_writers": cfg.clients}
  if cfg.data_dir is not None:
    kw["data_dir"] = cfg.data_dir
  return load_dataset(cfg.dataset, **kw)


def _run(cfg: Config, opts: dict) -> dict:
  ds = _load(cfg, opts["alpha"])
  sparsity = opts["sparsity"]
  regression = ds.num_classes == 0
  d_in = int(np.prod(ds.train.x.shape[2:]))
  blog = cfg.dataset == "blogfeedback"
  l2 = opts["l2"] if opts["l2"] is not None else (500.0 if blog else 0.01)
  reduction = opts["reduction"] or ("sum" if blog else "mean")
  if regression:
    model = linear_regression(d_in, l2=l2, use_bias=not blog)
    metric, thresholds = "r2", opts["thresholds"] or ([0.2, 0.225, 0.25] if blog else
                                                      [0.3, 0.4, 0.45])
  else:
    model = softmax_regression(d_in, ds.num_classes, l2=l2)
    metric, thresholds = "accuracy", opts["thresholds"] or [0.75, 0.8, 0.85]
  consts = linear_model_constants(ds.train, l2, "squared" if regression else "softmax",
                                  reduction, use_bias=not blog)
  gamma = opts["gamma"] or 1.0 / consts.L_max
  p = opts["p"] or min(1.0, max(0.02, 1.0 / math.sqrt(consts.kappa)))
  loss = make_loss(model, reduction)
  params = model.init(jax.random.key(cfg.seed))
  d = sum(x.size for x in jax.tree.leaves(params))
  k = k_from_sparsity(d, sparsity)
  lam = opts["lam"] if opts["lam"] is not None else 1.0 / (2 * ds.num_clients)  # (1/2N)·φ
  steps = max(1, round(1 / p))
  label = ds.name if cfg.dataset in PAPER_DATASETS else f"{ds.name} (embedded stand-in)"
  print(f"{NAME}: {label}, {ds.num_clients} clients, d={d}, sparsity={sparsity:.0%} (K={k}), "
        f"L_max={consts.L_max:.4g}, mu={consts.mu:.4g}, gamma={gamma:.4g}, p={p:.4g}")

  def build(name, sp, g, pp):
    """The method ``name`` at sparsity ``sp`` with step size ``g`` and probability ``pp``."""
    st = max(1, round(1 / float(pp))) if not isinstance(pp, jax.core.Tracer) else steps
    return {"Final-TopK": lambda: ps.proxskip(loss, g, pp),
            "FedHT": lambda: fedht(loss, g, st, sp),
            "FedIHT": lambda: fediht(loss, g, st, sp),
            "ASP": lambda: ps.accelerated_server_pruning(loss, g, pp, sp),
            "RandProx-l1": lambda: ps.randprox_l1(loss, g, pp, lam),
            "SPS-Local": lambda: ps.sparse_proxskip_local(loss, g, pp, sp),
            "SPS": lambda: ps.sparse_proxskip(loss, g, pp, sp),
            "ASP-modified": lambda: ps.accelerated_server_pruning_modified(loss, g, pp, sp),
            "SPS-modified": lambda: ps.sparse_proxskip_modified(loss, g, pp, sp)}[name]()

  names = ["Final-TopK", "FedHT", "FedIHT", "ASP", "RandProx-l1", "SPS-Local", "SPS"]
  if opts["diagnostics"]:
    names += ["ASP-modified", "SPS-modified"]
  colors = method_colors(names)
  eval_fn = make_eval_fn(model)
  tuned = {}
  if opts["search"] > 0:
    tuned = _random_search(cfg, names, build, params, ds, eval_fn, sparsity, k, gamma, p,
                           metric, opts["search"], opts["repetitions"])

  def run_all(sp, names_here, tag=""):
    k_sp = k_from_sparsity(d, sp)
    sparse_params = lambda state: top_k(state.params, k_sp)
    out = {}
    for name in names_here:
      g, pp = tuned.get(name, (gamma, p))
      fed = name in ("FedHT", "FedIHT")
      st = max(1, round(1 / pp))
      sub = Config(**{**cfg.__dict__, "rounds": max(1, round(cfg.rounds / st)) if fed else
                      cfg.rounds, "eval_every": max(1, cfg.eval_every // st) if fed else
                      cfg.eval_every})
      rec = run_method(sub, NAME, name + tag, build(name, sp, g, pp), params, ds.train,
                       ds.test, eval_fn, params_fn=sparse_params)
      per_step = st if fed else 1
      for table in ("rounds", "evals"):
        h = rec["history"][table]
        h["local_steps"] = [r * per_step for r in h["round"]]
        h["uplink_bits_per_client"] = [b / ds.num_clients for b in h["uplink_bits"]]
      out[name] = rec
    return out

  records = run_all(sparsity, names)
  by_sparsity = {sparsity: {m: r["final"].get(metric) for m, r in records.items()}}
  for sp in opts["sparsities"]:
    if sp != sparsity:
      extra = run_all(sp, names[:7], tag=f"@{sp}")
      by_sparsity[sp] = {m: r["final"].get(metric) for m, r in extra.items()}
  if len(by_sparsity) > 1:  # Table 1 / Table 4 layout: final metric per method and sparsity
    cols = sorted(by_sparsity)
    grid_rows = [{"method": m, **{f"{metric} @ {sp:.0%}": by_sparsity[sp].get(m)
                                  for sp in cols}} for m in names[:7]]
    print_table(grid_rows, list(grid_rows[0]))
  else:
    grid_rows = []

  rows = []
  for name, rec in records.items():
    ev, rd = rec["history"]["evals"], rec["history"]["rounds"]
    values = ev.get(metric, [])
    row = {"method": name, f"final {metric}": last(values),
           f"best {metric}": max(values, default=None), "train loss": last(rd.get("loss", []))}
    for t in thresholds:
      row[f"bits/client to {t}"] = bits_to_reach(ev, metric, t, "uplink_bits_per_client")
    rows.append(row)
  ref = next((r for r in rows if r["method"] == ("Final-TopK" if regression else "FedIHT")))
  for row in rows:
    b, b_ref = row[f"bits/client to {thresholds[0]}"], ref[f"bits/client to {thresholds[0]}"]
    row[f"speedup at {thresholds[0]} vs {ref['method']}"] = (
        b_ref / b if b and b_ref else None)
  if any(r["diverged"] for r in records.values()):
    for row in rows:
      row["status"] = status(records[row["method"]])
  table = print_table(rows, list(rows[0]))
  out = output_dir(cfg, NAME)
  results = {"experiment": NAME, "dataset": label, "metric": metric, "sparsity": sparsity,
             "k": k, "gamma": gamma, "p": p, "tuned": tuned, "constants": consts._asdict(),
             "table": rows, "table_text": table, "sparsity_table": grid_rows,
             "methods": records}
  path = save_results(cfg, NAME, results)
  png = plot_methods(records, metric, os.path.join(out, f"{NAME}.png"),
                     title=f"{label}, {sparsity:.0%} sparsity (models Top-K'd at evaluation)",
                     x="local_steps", bits="uplink_bits_per_client", colors=colors)
  print(f"results: {path}\nplot: {png}")
  if opts["diagnostics"]:
    diag = plot_series({m: r for m, r in records.items() if m not in ("FedHT", "FedIHT")},
                       ["sum_h_norm", "mean_h_norm", "server_norm", "loss"],
                       os.path.join(out, f"{NAME}_zero_sum.png"),
                       title="zero-sum diagnostics (seed 000 appendix D)", x="local_steps",
                       colors=colors)
    print(f"diagnostics: {diag}")
  return results


def _random_search(cfg, names, build, params, ds, eval_fn, sparsity, k, gamma, p, metric,
                   samples, repetitions):
  """Seed 000's tuning: random (γ, p) around the theory values (log-uniform in [γ/4, 4γ] and
  [p/4, min(1, 4p)]), ``repetitions`` seeds each; every (sample, seed) pair of a method runs
  in ONE compiled program (``run_batched``); the best mean final metric wins."""
  rng = np.random.default_rng(cfg.seed)
  gammas = gamma * np.exp(rng.uniform(np.log(0.25), np.log(4.0), samples))
  ps_ = np.minimum(1.0, p * np.exp(rng.uniform(np.log(0.25), np.log(4.0), samples)))
  hp = {"gamma": np.repeat(gammas, repetitions).astype(np.float32),
        "p": np.repeat(ps_, repetitions).astype(np.float32)}
  seeds = np.tile(np.arange(repetitions), samples) + 1000 * cfg.seed
  keys = jax.vmap(jax.random.key)(seeds.astype(np.uint32))
  best = {}
  for name in names:
    if name in ("FedHT", "FedIHT"):  # local step counts are static: not vmappable here
      continue
    _, hist = run_batched(lambda h: build(name, sparsity, h["gamma"], h["p"]), keys, params,
                          ds.train, ds.test, num_rounds=cfg.rounds, hparams=hp,
                          eval_fn=eval_fn, eval_every=cfg.rounds,
                          params_fn=lambda s: top_k(s.params, k))
    final = np.array([h.evals[metric][-1] for h in hist]).reshape(samples, repetitions)
    # a diverged sample (NaN/inf metric) scores -inf: np.argmax would pick NaN as the best
    i = int(np.argmax(np.where(np.isfinite(final), final, -np.inf).mean(1)))
    best[name] = (float(gammas[i]), float(ps_[i]))
    print(f"search {name}: best gamma={gammas[i]:.4g} p={ps_[i]:.4g} "
          f"{metric}={final[i].mean():.4f} ± {final[i].std():.4f} over {repetitions} seeds")
  return best


run = entry(NAME, OPTIONS, _run)
