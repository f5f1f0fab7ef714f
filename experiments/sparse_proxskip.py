"""The Sparse-ProxSkip paper's comparison (Meinhardt et al. 2024): Sparse-ProxSkip and its
baselines at a target sparsity.

Methods (the Sparse-ProxSkip paper's Tables 1-4): Final-TopK (dense ProxSkip, Top-K at evaluation), FedHT,
FedIHT, Accelerated-Server-Pruning (ASP), RandProx-l1 (λ = ``lam``, default: the Sparse-ProxSkip paper's
literal 1/(2N)), Sparse-ProxSkip-Local (SPS-Local) and
Sparse-ProxSkip (SPS); and (unless ``--set diagnostics=False``) the appendix-D variants
ASP-modified and SPS-modified with a plot of ‖Σh_i‖, mean‖h_i‖, ‖w‖ and the loss (Figs 6-8).

Data: classification (softmax regression, test accuracy; Sparse-ProxSkip paper §4.2 uses FEMNIST with 100
writers, ``--dataset femnist --data-dir ...``) or regression (ridge regression, test R²;
§4.1 uses BlogFeedback's 554 natural clients, ``--dataset blogfeedback --data-dir ...``).
The default is the embedded digits set (offline), a stand-in labelled as such in the output.

Every model is Top-K'd to the target sparsity before every evaluation (the Sparse-ProxSkip paper's §B), and the
table's "train loss" is the training objective f(w) of that evaluated model. ``--rounds``
counts *communication rounds*, the paper's unit: the ProxSkip family runs rounds of
Geometric(p) local steps, FedHT/FedIHT rounds of L local steps. With ``--set
budget=iterations`` it counts local gradient steps instead (the ProxSkip family communicating
with probability p per step, FedHT/FedIHT running rounds/L rounds of L steps), so every method
takes the same number of local steps. Without a search, γ = 1/L_max and p = 1/√κ (ProxSkip's theory) and
L = round(1/p) come from the data (or ``--set gamma=... --set p=...``). With ``--set search=N``
every method — FedHT/FedIHT included, over γ and L — is tuned by the Sparse-ProxSkip paper's two-stage random
search (N candidates per stage, ``repetitions`` seeds each, all of a stage in one vmapped
program) on a validation split of each client's training data, at every sparsity of the run;
the test split is only used for the reported numbers, from runs on the full training data.
``--set seeds=5`` adds the final metric's mean ± standard error over 5 seeds (keys
``--seed`` + 100·s, the method's seeds one vmapped program; the first is the run tabulated and
plotted). Methods carry the paper's names.

Declaration: every sparsity is a setting (the target's method names plain, the others'
``"<method> (<s>%)"``; ``search`` and ``settings`` in ``results.json`` are keyed alike), every method a :class:`~fedjaxsparse.harness.experiment.Method` — its
theory values as a grid of one, or the search — whose evaluated model is Top-K'd to the
setting's sparsity and whose round spends its L local steps of a ``budget=iterations`` run
(``per_round``); the harness tunes and runs them, ``report`` builds the paper's tables.

Options: see ``OPTIONS`` (``fedjaxsparse describe sparse_proxskip``).

Source for the team: seed 000.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from fedjaxsparse.algorithms import proxskip as ps
from fedjaxsparse.algorithms.fedht import fedht, fediht
from fedjaxsparse.runtime.clients import auto_layout, map_clients
from fedjaxsparse.convex.constants import linear_model_constants
from fedjaxsparse.data import load_dataset
from fedjaxsparse.evaluation import make_eval_fn
from fedjaxsparse.harness.options import Config, Option, name_list
from fedjaxsparse.harness.running import bits_to_reach, last, status
from fedjaxsparse.harness.experiment import Context, Method, Tuning, declared
from fedjaxsparse.harness.report import Figure, Table
from fedjaxsparse.models import global_mean_scale, linear_regression, make_loss, softmax_regression
from fedjaxsparse.harness.protocol import (Dimension, PaperConfig, load_or_standin, mean_se,
                                           paper_table, validation_split)
from fedjaxsparse.ops.sparsity import k_from_sparsity, num_params, top_k
from fedjaxsparse.harness.tuning import Search, tuning_config

NAME = "sparse_proxskip"
DESCRIPTION = ("Sparse-ProxSkip (Meinhardt et al. 2024) vs Final-TopK, FedHT, FedIHT, ASP, "
               "RandProx-l1, SPS-Local")
DEFAULTS = dict(rounds=120, clients=20, dataset="digits", eval_every=1)  # every communication
# --quick: the table's shape in well under two minutes on 2 CPU cores (QUICK_RUNTIME)
QUICK = dict(rounds=12, clients=8, eval_every=2)
QUICK_RUNTIME = "measured 27 s on 2 CPU cores (a fresh process, XLA's default flags)"
BUDGET = ("communication rounds per method (the paper's unit): ProxSkip-family rounds of "
          "Geometric(p) local steps, FedHT/FedIHT rounds of L local steps; --set "
          "budget=iterations counts local gradient steps instead")
RUNTIME = ("about 40 s (9 methods x 120 communication rounds, about 3000 local steps, on "
           "digits, evaluated at every communication; measured 36 s); with --set search=8 "
           "--set seeds=5 several minutes")
OPTIONS = (
    Option("sparsity", 0.9, "target sparsity of the evaluated (Top-K'd) model", low=0.0,
           high=1.0, high_open=True),
    Option("sparsities", [], "extra sparsities for the Table 1/4 layout (final metric per "
           "method and sparsity), e.g. [0.8,0.9,0.95]", kind="floats", low=0.0, high=1.0,
           high_open=True, identity=False),
    Option("alpha", 0.5, "Dirichlet concentration of the label split (embedded data)",
           low=0.0, low_open=True),
    Option("femnist_test", "all", "FEMNIST test set: all (the standard unrestricted set, as in "
           "the Sparse-ProxSkip paper's §4.2) or writers (the kept writers' own test files)",
           choices=("all", "writers")),
    Option("init", None, "initial model: zeros (BlogFeedback, w_0 = 0) or pytorch "
           "(torch.nn.Linear's default, FEMNIST); default per dataset as in the paper",
           kind="str", choices=("zeros", "lecun", "pytorch")),
    Option("l2", None, "l2 regularisation (default: 500 for BlogFeedback, 0.01 otherwise)",
           kind="float", low=0.0),
    Option("reduction", None, "loss over a client's examples: mean, sum, or global_mean (a sum "
           "scaled by N/n, so (1/N) sum_i f_i is the global sample mean: the Sparse-ProxSkip paper's FEMNIST "
           "objective); default: sum for BlogFeedback, global_mean for FEMNIST, mean otherwise",
           kind="str", choices=("mean", "sum", "global_mean")),
    Option("gamma", None, "step size (default 1/L_max from the data)", kind="float", low=0.0,
           low_open=True),
    Option("p", None, "communication probability (default 1/sqrt(kappa) from the data)",
           kind="float", low=0.0, high=1.0, low_open=True),
    Option("lam", None, "RandProx-l1 weight (default: the Sparse-ProxSkip paper's literal 1/(2N))", kind="float",
           low=0.0),
    Option("thresholds", None, "metric thresholds of the bits-to-reach columns (default "
           "[0.75,0.8,0.85] accuracy, R2 [0.3,0.4,0.45] or BlogFeedback [0.2,0.225,0.25])",
           kind="floats", identity=False),
    Option("diagnostics", True, "also run ASP-modified and SPS-modified and plot the zero-sum "
           "diagnostics (Figs 6-8)", identity=False),
    Option("search", 0, "candidates per stage of the two-stage random search run for EVERY "
           "method on a validation split (0: theory values, gamma = 1/L_max, p = 1/sqrt(kappa))",
           low=0),
    Option("repetitions", 5, "seeds per random-search candidate", low=1),
    Option("validation", 0.2, "fraction of each client's training examples held out for "
           "tuning", low=0.0, high=1.0, low_open=True, high_open=True),
    Option("seeds", 1, "final runs per method for the mean ± s.e. column (the paper: 5)",
           low=1, identity=False),
    Option("budget", "communications", "what --rounds counts: communications (the paper's "
           "unit: ProxSkip methods run rounds of Geometric(p) local steps, FedHT/FedIHT rounds "
           "of L local steps) or iterations (local steps; ProxSkip methods communicate with "
           "probability p per step, FedHT/FedIHT run rounds/L rounds of L steps)",
           choices=("iterations", "communications")),
    Option("methods", "", "comma list of the paper's methods to run (default: all)",
           kind="str", identity=False),
)
ASP, SPS_LOCAL, SPS = "Accelerated-Server-Pruning", "Sparse-ProxSkip-Local", "Sparse-ProxSkip"
ASP_MOD, SPS_MOD = f"{ASP}-modified", f"{SPS}-modified"
METHODS = ("Final-TopK", "FedHT", "FedIHT", ASP, "RandProx-l1", SPS_LOCAL, SPS)  # the paper's
FEDAVG_STYLE = ("FedHT", "FedIHT")  # rounds of a static number of local steps

PROTOCOL_OPTIONS = dict(budget="communications", seeds=5, search=16, repetitions=5,
                  diagnostics=False)
BLOG = dict(dataset="blogfeedback", standin="blogfeedback_standin", clients=554, rounds=10_000,
            eval_every=1)
FEMNIST = dict(dataset="femnist", standin="femnist_standin", clients=100, rounds=10_000,
               eval_every=1)
BLOG_DEVIATIONS = ("the number of candidates per search stage is not stated (16 here)")
FEMNIST_DEVIATIONS = ("the ridge weight alpha and the number of rounds are not stated "
                      "(l2 = 1e-3 and 10^4 communication rounds here, as for BlogFeedback); "
                      "candidates per search stage not stated (16 here)")
# The paper's numbers (spec seed000_003.md A.15): R² and accuracy in %, train loss of the
# Top-K'd model, bits in Mbit uplink per client until the threshold is first reached.
PAPERS = {pc.name: pc for pc in (
    PaperConfig(
        "table1",
        "the Sparse-ProxSkip paper's §4.1, Table 1 (BlogFeedback, test R² and train loss)", **BLOG,
        options={**PROTOCOL_OPTIONS, "sparsity": 0.9, "sparsities": [0.8, 0.95]},
        unit="test R² in % and final train loss", deviations=BLOG_DEVIATIONS, paper={
            "R² @ 80%": {"Final-TopK": 26.4, "FedHT": 18.0, "FedIHT": 16.5, ASP: 25.9,
                         "RandProx-l1": 26.3, SPS_LOCAL: 27.0, SPS: 26.7},
            "R² @ 90%": {"Final-TopK": 23.8, "FedHT": 21.9, "FedIHT": 22.4, ASP: 20.4,
                         "RandProx-l1": 24.1, SPS_LOCAL: 26.8, SPS: 27.1},
            "R² @ 95%": {"Final-TopK": 16.4, "FedHT": 12.8, "FedIHT": 12.3, ASP: 16.3,
                         "RandProx-l1": 18.8, SPS_LOCAL: 23.9, SPS: 26.7},
            "loss @ 90%": {"Final-TopK": 2.877e7, "FedHT": 2.951e7, "FedIHT": 2.937e7,
                           ASP: 2.991e7, "RandProx-l1": 2.894e7, SPS_LOCAL: 2.856e7,
                           SPS: 2.831e7}}),
    PaperConfig(
        "table2", "the Sparse-ProxSkip paper's §4.1, Table 2 (BlogFeedback, uplink bits to test R² "
        "at 90 %)",
        **BLOG, options={**PROTOCOL_OPTIONS, "sparsity": 0.9, "thresholds": [0.2, 0.225, 0.25]},
        unit="Mbit uplink per client to reach the test R²", deviations=BLOG_DEVIATIONS, paper={
            "to 0.2": {"Final-TopK": 1.16, "FedHT": 14.8, "FedIHT": 2.49, ASP: 0.73,
                       "RandProx-l1": 0.18, SPS_LOCAL: 0.13, SPS: 0.10},
            "to 0.225": {"Final-TopK": 1.44, "FedHT": None, "FedIHT": None, ASP: None,
                         "RandProx-l1": 0.25, SPS_LOCAL: 0.21, SPS: 0.14},
            "to 0.25": {"Final-TopK": None, "FedHT": None, "FedIHT": None, ASP: None,
                        "RandProx-l1": None, SPS_LOCAL: 0.76, SPS: 0.19}}),
    PaperConfig(
        "table3", "the Sparse-ProxSkip paper's §4.2, Table 3 (FEMNIST, uplink bits to test "
        "accuracy at 90 %)",
        **FEMNIST, options={**PROTOCOL_OPTIONS, "sparsity": 0.9, "thresholds": [0.8, 0.825, 0.85],
                            "l2": 1e-3},
        unit="Mbit uplink per client to reach the test accuracy",
        deviations=FEMNIST_DEVIATIONS, paper={
            "to 0.8": {"Final-TopK": 6.0, "FedHT": 4.0, "FedIHT": 0.8, ASP: 2.0,
                       SPS_LOCAL: 0.5, SPS: 0.2},
            "to 0.825": {"Final-TopK": 16.6, "FedHT": 8.54, "FedIHT": 1.61, ASP: 3.57,
                         SPS_LOCAL: 0.55, SPS: 0.35},
            "to 0.85": {"Final-TopK": 92.4, "FedHT": 45.7, "FedIHT": 13.0, ASP: None,
                        SPS_LOCAL: 2.52, SPS: 0.65}}),
    PaperConfig(
        "table4",
        "the Sparse-ProxSkip paper's §4.2, Table 4 (FEMNIST, test accuracy vs sparsity)", **FEMNIST,
        options={**PROTOCOL_OPTIONS, "sparsity": 0.9, "sparsities": [0.8, 0.95, 0.98, 0.99],
                 "l2": 1e-3},
        unit="test accuracy in %", deviations=FEMNIST_DEVIATIONS, paper={
            f"accuracy @ {sp:.0%}": dict(zip(("Final-TopK", "FedHT", "FedIHT", ASP,
                                              SPS_LOCAL, SPS), v))
            for sp, v in ((0.8, (84.7, 86.6, 86.8, 77.9, 86.7, 87.0)),
                          (0.9, (79.9, 85.7, 85.6, 77.5, 86.1, 86.4)),
                          (0.95, (69.6, 84.7, 82.7, 76.8, 84.7, 85.3)),
                          (0.98, (40.1, 76.6, 74.6, 72.2, 78.9, 80.5)),
                          (0.99, (25.5, 66.4, 65.4, 64.7, 72.9, 72.8)))}),
)}


def _load(cfg: Config, name: str, alpha: float, femnist_test: str = "all"):
  kw = {}
  if name in ("digits", "fashion_mnist", "libsvm", "cifar10", "emnist"):
    kw = {"num_clients": cfg.clients, "seed": cfg.seed, "partition": "dirichlet",
          "alpha": alpha}
  elif name in ("diabetes", "synthetic", "blogfeedback_standin"):
    kw = {"num_clients": cfg.clients, "seed": cfg.seed}
  elif name == "femnist":
    kw = {"num_clients": cfg.clients, "test": femnist_test}
  elif name == "femnist_standin":
    kw = {"num_clients": cfg.clients, "seed": cfg.seed}
  if cfg.data_dir is not None and name not in ("femnist_standin", "blogfeedback_standin"):
    kw["data_dir"] = cfg.data_dir
  return load_dataset(name, **kw)


def _problem(cfg: Config, opts: dict) -> dict:
  """The data, the model and its loss, the constants and the theory's step size and
  probability (printed once)."""
  paper = PAPERS.get(cfg.paper)
  ds, standin = load_or_standin(paper, cfg.dataset, cfg.data_dir,
                                lambda name: _load(cfg, name, opts["alpha"],
                                                   opts["femnist_test"]))
  sparsity = opts["sparsity"]
  regression = ds.num_classes == 0
  d_in = int(np.prod(ds.train.x.shape[2:]))
  blog = cfg.dataset in ("blogfeedback", "blogfeedback_standin")
  femnist = cfg.dataset in ("femnist", "femnist_standin")
  l2 = opts["l2"] if opts["l2"] is not None else (500.0 if blog else 0.01)
  reduction = opts["reduction"] or ("sum" if blog else "global_mean" if femnist else "mean")
  init = opts["init"] or ("pytorch" if femnist else "zeros")  # Sparse-ProxSkip paper §B/§C
  scale = global_mean_scale(ds.train.num_examples) if reduction == "global_mean" else 1.0
  base_reduction = "sum" if reduction == "global_mean" else reduction
  if regression:
    model = linear_regression(d_in, l2=l2, use_bias=not blog, init=init)
    metric, thresholds = "r2", opts["thresholds"] or ([0.2, 0.225, 0.25] if blog else
                                                      [0.3, 0.4, 0.45])
  else:
    model = softmax_regression(d_in, ds.num_classes, l2=l2, init=init)
    metric, thresholds = "accuracy", opts["thresholds"] or (
        [0.8, 0.825, 0.85] if femnist else [0.75, 0.8, 0.85])  # Table 3
  consts = linear_model_constants(ds.train, l2, "squared" if regression else "softmax",
                                  base_reduction, use_bias=not blog, scale=scale)
  gamma = opts["gamma"] or 1.0 / consts.L_max
  p = opts["p"] or min(1.0, max(0.02, 1.0 / math.sqrt(consts.kappa)))
  loss = make_loss(model, base_reduction, scale)
  params = model.init(jax.random.key(cfg.seed))
  d = num_params(params)
  k = k_from_sparsity(d, sparsity)
  lam = opts["lam"] if opts["lam"] is not None else 1.0 / (2 * ds.num_clients)  # (1/2N)·φ
  label = (f"{ds.name} ({standin})" if standin else ds.name if blog or femnist else
           f"{ds.name} (embedded stand-in)")
  print(f"{NAME}: {label}, {ds.num_clients} clients, d={d}, sparsity={sparsity:.0%} (K={k}), "
        f"L_max={consts.L_max:.4g}, mu={consts.mu:.4g}, gamma={gamma:.4g}, p={p:.4g}, "
        f"init={init}, loss reduction={reduction}")
  base_eval = make_eval_fn(model)

  def eval_fn(params, data):
    """Test metrics plus the training objective f(w) = (1/N)Σ_i f_i(w) of the evaluated
    (Top-K'd) model — the paper's "final train loss"."""
    test, train = data
    per_client = map_clients(lambda d: loss(params, d.x, d.y, d.mask), train)
    return {**base_eval(params, test), "train_objective": jnp.mean(per_client)}

  return dict(ds=ds, standin=standin, label=label, paper=paper, regression=regression,
              metric=metric, thresholds=thresholds, consts=consts, gamma=gamma, p=p,
              loss=loss, params=params, d=d, k=k, lam=lam, steps=max(1, round(1 / p)),
              eval_fn=eval_fn, by_comms=opts["budget"] == "communications")


def setup(cfg: Config, opts: dict):
  """One setting per sparsity: the target ``sparsity`` (its methods' names plain), then every
  other of ``sparsities`` (``"<method> (<s>%)"``); evaluations read (test split, training
  split); tuning reads (validation split, fitting split)."""
  P_ = _problem(cfg, opts)
  ds = P_["ds"]
  train = auto_layout(ds.train)  # size buckets for unequal clients (the same results)
  fit, val = validation_split(ds.train, opts["validation"], cfg.seed)
  data = ds._replace(test=(ds.test, train))
  sparsities = [opts["sparsity"]] + [sp for sp in opts["sparsities"] if sp != opts["sparsity"]]
  for i, sp in enumerate(dict.fromkeys(sparsities)):
    yield Context(data, P_["params"], P_["eval_fn"], {**P_, "sparsity": sp},
                  setting=None if i == 0 else f"{100 * sp:g}%", fit=fit,
                  val=(val, auto_layout(fit)), metric=P_["metric"])


def _build(P_: dict, name: str, sp: float, g, x):
  """The method ``name`` at sparsity ``sp`` with step size ``g``; ``x`` is the probability
  p for the ProxSkip family and the (static) local-step count for FedHT/FedIHT."""
  loss, lam = P_["loss"], P_["lam"]
  f = {"form": "round" if P_["by_comms"] else "iteration"}
  return {"Final-TopK": lambda: ps.proxskip(loss, g, x, **f),
          "FedHT": lambda: fedht(loss, g, x, sp),
          "FedIHT": lambda: fediht(loss, g, x, sp),
          ASP: lambda: ps.accelerated_server_pruning(loss, g, x, sp, **f),
          "RandProx-l1": lambda: ps.randprox_l1(loss, g, x, lam, **f),
          SPS_LOCAL: lambda: ps.sparse_proxskip_local(loss, g, x, sp, **f),
          SPS: lambda: ps.sparse_proxskip(loss, g, x, sp, **f),
          ASP_MOD: lambda: ps.accelerated_server_pruning_modified(loss, g, x, sp, **f),
          SPS_MOD: lambda: ps.sparse_proxskip_modified(loss, g, x, sp, **f)}[name]()


def methods(ctx: Context, cfg: Config, opts: dict) -> dict[str, Method]:
  """Every chosen method of the paper (and, at the target sparsity, the appendix-D variants):
  the theory's γ = 1/L_max and p = 1/√κ (FedHT/FedIHT: L = round(1/p) local steps) or, with
  ``search``, the paper's two-stage random search over γ ∈ [γ₀/10, 10γ₀] and 1/p ∈ [1, 100]
  (FedHT/FedIHT: L ∈ [1, 100], static); the evaluated model is Top-K'd to the setting's
  sparsity; with ``budget=iterations`` a FedHT/FedIHT round spends its L local steps."""
  P_ = ctx.extra
  sp, gamma = P_["sparsity"], P_["gamma"]
  chosen = name_list(opts["methods"], "methods", METHODS, default=())
  names = [m for m in METHODS if not chosen or m in chosen]
  if opts["diagnostics"] and ctx.setting is None:
    names += [ASP_MOD, SPS_MOD]
  k_sp = k_from_sparsity(P_["d"], sp)
  out = {}
  for name in names:
    fed = name in FEDAVG_STYLE
    # a candidate: {"gamma", "L"} (FedHT/FedIHT) or {"gamma", "1/p"} while searching, {"gamma",
    # "p"} at the theory's values
    if fed:
      build = lambda c, run, name=name: _build(P_, name, sp, c["gamma"], c["L"])
    else:
      build = lambda c, run, name=name: _build(P_, name, sp, c["gamma"],
                                               c["p"] if "p" in c else 1.0 / c["1/p"])
    search = None
    if opts["search"] > 0:
      search = Search({"gamma": Dimension(gamma / 10, gamma * 10),
                       **({"L": Dimension(1, 100, integer=True)} if fed
                          else {"1/p": Dimension(1.0, 100.0)})},
                      static=("L",) if fed else (), samples=(opts["search"], opts["search"]),
                      repetitions=opts["repetitions"])
    default = {"gamma": gamma, **({"L": P_["steps"]} if fed else {"p": P_["p"]})}
    out[name] = Method(build, grid=(default,), label=_label, search=search,
                       params_fn=lambda state, k=k_sp: top_k(state.params, k),
                       per_round=(lambda c: c["L"]) if fed and not P_["by_comms"] else None,
                       chunk_size=100,   # evaluated every communication: few long chunks
                       vmap_seeds=True)
  return out


def _label(c: dict) -> str:
  return ", ".join(f"{k}={v:.4g}" for k, v in c.items())


def _choice(c: dict) -> tuple[float, float]:
  """``(γ, p or local steps)`` of a candidate."""
  x = c["L"] if "L" in c else c["p"] if "p" in c else 1.0 / c["1/p"]
  return c["gamma"], x


def report(results: dict, ctx: Context, cfg: Config, opts: dict) -> dict:
  """The paper's tables from the runs: per method at the target sparsity the final and best
  metric of the evaluated (Top-K'd) model, its train loss, the uplink bits per client to each
  threshold and the speed-up against the paper's reference; with ``seeds`` the mean ± s.e.
  over seeds; the final metric per method and sparsity (Tables 1/4); the paper's numbers
  beside ours; the figures."""
  contexts, tuned = results["contexts"], results["tuned"]
  P_ = contexts[0].extra
  ds, metric, thresholds, paper, label = (P_["ds"], P_["metric"], P_["thresholds"],
                                          P_["paper"], P_["label"])
  sparsity, seeds = opts["sparsity"], opts["seeds"]
  by_sparsity, seed_stats, setting = {}, {}, {}
  for c in contexts:
    sp = c.extra["sparsity"]
    by_sparsity[sp] = {}
    for key, t in tuned.items():
      m, _, where = key.partition(" (")
      if (where[:-1] or None) != c.setting:
        continue
      g, x = _choice(t.best)
      for rec in t.records:
        rd, ev = rec["history"]["rounds"], rec["history"]["evals"]
        _count_steps_and_communications(rd, ev, x)
        for h in (rd, ev):
          h["uplink_bits_per_client"] = [b / ds.num_clients for b in h["uplink_bits"]]
      by_sparsity[sp][m] = t.records[0]
      setting[key] = (g, x)
      if seeds > 1:
        seed_stats.setdefault(sp, {})[m] = _seed_statistics(t.records, metric, thresholds,
                                                            opts)
  records = by_sparsity[sparsity]

  def final(sp, method, quantity):
    """The reported value: the mean over the seeds (a single run when seeds = 1)."""
    if seed_stats:
      return seed_stats[sp][method][quantity]["mean"]
    return by_sparsity[sp][method]["final"].get(quantity)

  paper_names = [m for m in records if m in METHODS]
  grid_rows = ([{"method": m, **{f"{metric} @ {sp:.0%}": final(sp, m, metric)
                                 for sp in sorted(by_sparsity)}} for m in paper_names]
               if len(by_sparsity) > 1 else [])   # Table 1 / Table 4 layout
  rows = []
  for name, rec in records.items():
    ev = rec["history"]["evals"]
    values = ev.get(metric, [])
    row = {"method": name, f"final {metric}": last(values),
           f"best {metric}": max(values, default=None),
           "train loss": last(ev.get("train_objective", []))}
    for t in thresholds:
      row[f"bits/client to {t}"] = bits_to_reach(ev, metric, t, "uplink_bits_per_client")
    rows.append(row)
  ref = next((r for r in rows if r["method"] == ("Final-TopK" if P_["regression"] else
                                                   "FedIHT")), rows[0])
  if seed_stats:
    for row in rows:
      st = seed_stats[sparsity][row["method"]][metric]
      row[f"{metric} mean ± s.e. ({seeds} seeds)"] = f"{st['mean']:.4f} ± {st['se']:.4f}"
  for row in rows:
    b, b_ref = row[f"bits/client to {thresholds[0]}"], ref[f"bits/client to {thresholds[0]}"]
    row[f"speedup at {thresholds[0]} vs {ref['method']}"] = (
        b_ref / b if b and b_ref else None)
  if any(r["diverged"] for r in records.values()):
    for row in rows:
      row["status"] = status(records[row["method"]])
  paper_rows = []
  if paper is not None:
    ours, shown = {}, {"r2": "R²", "accuracy": "accuracy"}[metric]
    for sp, recs in by_sparsity.items():
      for m in recs:
        v, loss_v = final(sp, m, metric), final(sp, m, "train_objective")
        ours.setdefault(f"{shown} @ {sp:.0%}", {})[m] = None if v is None else 100 * v
        ours.setdefault(f"loss @ {sp:.0%}", {})[m] = loss_v
    for t in thresholds:
      ours[f"to {t:g}"] = {
          m: (seed_stats[sparsity][m]["bits_to"][str(t)] if seed_stats else
              next(r for r in rows if r["method"] == m)[f"bits/client to {t}"])
          for m in records}
      ours[f"to {t:g}"] = {m: None if v is None else v / 1e6 for m, v in ours[f"to {t:g}"].items()}
    paper_rows = paper_table(paper, ours, label, convert=lambda v: float(f"{v:.3g}"),
                             note=f"protocol deviations: {paper.deviations}"
                             if paper.deviations else None)
  over = f" (mean over {seeds} seeds)" if seed_stats else ""
  searched = {m: _choice(t.best) for m, t in tuned.items() if t.search is not None}
  for m, (g, x) in searched.items():
    fed = m.partition(" (")[0] in FEDAVG_STYLE
    print(f"search {m}: gamma={g:.4g} {'local steps' if fed else 'p'}={x:.4g}, "
          f"validation {metric}={tuned[m].search.best_score:.4f} (mean of "
          f"{opts['repetitions']} seeds)")
  return {"dataset": label, "standin": P_["standin"], "sparsity": sparsity,
          "paper_config": None if paper is None else {
              "name": paper.name, "source": paper.source, "deviations": paper.deviations,
              "budget": opts["budget"], "rounds": cfg.rounds},
          "k": P_["k"], "gamma": P_["gamma"], "p": P_["p"], "search": searched,
          "settings": {n: {"gamma": g, ("local_steps" if n.partition(" (")[0] in FEDAVG_STYLE
                                        else "p"): x} for n, (g, x) in setting.items()},
          "constants": P_["consts"]._asdict(),
          "table": Table(rows),
          "sparsity_table": (Table(grid_rows, title=f"final {metric} per method and sparsity"
                                   f"{over}") if grid_rows else []),
          "seed_statistics": {str(sp): v for sp, v in seed_stats.items()},
          "paper_comparison": paper_rows,
          "methods": records, "figures": _figures(records, seed_stats, ds, label, metric, opts,
                                                  over)}


def _figures(records, seed_stats, ds, label, metric, opts, over) -> list[Figure]:
  sparsity = opts["sparsity"]
  x_axis = "communications" if opts["budget"] == "communications" else "local_steps"
  figures = [Figure("methods", dict(
      methods=records, metric=metric,
      title=f"{label}, {sparsity:.0%} sparsity (models Top-K'd at evaluation){over}", x=x_axis,
      bits="uplink_bits_per_client",
      loss_key="train_objective",  # the table's "train loss": Top-K'd model
      labels={"train_objective": ("training objective of the evaluated (Top-K'd) model",
                                  "train loss")},
      bands={m: st["curves"] for m, st in seed_stats.get(sparsity, {}).items()} or None))]
  if ds.name.startswith("blogfeedback"):   # Fig. 5: the natural clients' sizes
    figures.append(Figure("client_sizes", dict(
        sizes=np.asarray(ds.train.num_examples).tolist(),
        title=f"{label}: examples per client (the Sparse-ProxSkip paper's Fig. 5)"),
        suffix="_client_sizes"))
  if opts["diagnostics"]:
    figures.append(Figure("series", dict(
        methods={m: r for m, r in records.items() if m not in FEDAVG_STYLE},
        names=["sum_h_norm", "mean_h_norm", "server_norm", "loss"],
        title="zero-sum diagnostics (Sparse-ProxSkip paper appendix D)", x=x_axis,
        colors=list(records)), suffix="_zero_sum"))
  return figures


def _count_steps_and_communications(rd: dict, ev: dict, x) -> None:
  """Adds cumulative ``local_steps`` and ``communications`` to a history's rounds ``rd`` and
  evaluations ``ev`` (FedHT/FedIHT: ``x`` local steps per round, one communication each)."""
  steps_done = np.cumsum(rd["local_steps"] if "local_steps" in rd else
                         np.full(len(rd["round"]), x))
  comms = np.cumsum(rd["communicated"] if "communicated" in rd else np.ones(len(rd["round"])))
  rd["local_steps"], rd["communications"] = steps_done.tolist(), comms.tolist()
  at = lambda col: [0 if r == 0 else col[r - 1] for r in ev["round"]]  # noqa: E731
  ev["local_steps"], ev["communications"] = at(rd["local_steps"]), at(rd["communications"])


def _seed_statistics(records: list, metric: str, thresholds, opts: dict) -> dict:
  """Over the seeds' runs of one method: ``{metric: mean_se, "train_objective": mean_se,
  "bits_to": {threshold: uplink bits per client at the first evaluation where the seeds' mean
  metric reaches it, or None}, "curves": the seeds' mean ± s.e. per evaluation (Fig. 2's
  bands)}``; per-seed values are kept in the ``mean_se`` records."""
  evs = [r["history"]["evals"] for r in records]
  curve = np.mean([e[metric] for e in evs], 0)
  bits = np.mean([e["uplink_bits_per_client"] for e in evs], 0)
  reach = lambda t: next((float(b) for v, b in zip(curve, bits) if v >= t), None)
  x_axis = "communications" if opts["budget"] == "communications" else "local_steps"
  curves = {}
  for col in (metric, "train_objective"):
    st = mean_se([e[col] for e in evs])
    curves[col] = {"x": list(evs[0][x_axis]), "mean": st["mean"], "se": st["se"]}
  return {metric: mean_se([e[metric][-1] for e in evs]),
          "train_objective": mean_se([e["train_objective"][-1] for e in evs]),
          "bits_to": {str(t): reach(t) for t in thresholds}, "curves": curves}


run = declared(NAME, OPTIONS, setup=setup, methods=methods, report=report, papers=PAPERS,
               tuning=Tuning(candidate="setting", column="final metric (mean over seeds)",
                             scale=1.0, config=lambda cfg, opts: tuning_config(cfg, 1.0)),
               figure=lambda results, ctx, cfg, opts: [])
