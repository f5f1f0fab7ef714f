"""Cohort-Squeeze (Yi et al. 2024; chapter 5 of Kai Yi's dissertation), Figs. 5.1–5.4 and D.2–D.5:
SPPM-AS on l2-logistic regression — the total communication cost T·K to reach
‖x_T − x⋆‖² < ε against the number K of local communication rounds, against LocalGD, and the
sampling, baseline and γ studies.

Setting (as the chapter): f_i(x) = mean_j log(1 + exp(−b_ij x·a_ij)) + (μ/2)‖x‖², μ = 0.1, no
bias, x₀ = 0, x⋆ by L-BFGS in float64; the feature-wise non-IID split of D.3.1 — k-means on the
examples into ``clusters`` clusters (scikit-learn), each cut at random into
``clients_per_cluster`` clients (10 × 10 = 100 clients; ``--set tsne=N`` draws Fig. D.1, a
t-SNE map of N examples coloured by cluster); the clusters are the strata of
**SPPM-SS** (one client from each cluster: a cohort of 10) and the blocks of **SPPM-BS** (one
whole cluster); cohort objective weights 1/(n p_i) from the sampler's marginals. Prox solvers:
BFGS (the chapter's base) and CG, one iteration = one local communication round.
Every number is a mean over ``seeds`` seeds (cohort draws); a configuration "reaches" the
target only if every seed does within ``max_rounds`` global rounds.

Studies (``studies``):

* ``cost`` (Figs. 5.1/5.2): T·K to ε = ``eps`` for K in ``ks`` and γ in ``gammas`` for each
  solver, the optimal K per γ, and **LocalGD** (MB-LocalGD on the same SS cohorts, one
  communication per round) over its step sizes ``local_lrs`` and local iterations
  ``local_steps``: its best cost T; **LocalGD, 1/(2ℒ)** (``local_theory``, on by default): the
  same local iterations at the step from theory, 1/(2ℒ) with ℒ the SS cohort's expected
  smoothness (Gower et al. 2019, Theorem 3.1, which the chapter cites for its baselines). It
  stands beside, not for, the paper's "LocalGD, optim", whose step is Khaled and Richtárik
  (2020)'s and is not written out in the paper, so no number of ours is printed
  under that name:
  :func:`fedjaxsparse.ops.sampling.expected_smoothness` from the exact L_i and L); then the
  hierarchical cost (c₁·K + c₂)·T with
  ``c1``, ``c2`` (LocalGD: (c₁ + c₂)·T) and the savings. The paper's numbers (a6a and
  mushrooms; figures with numbers in the text) are printed beside ours.
* ``sampling`` (Fig. 5.3): SPPM-SS vs SPPM-BS (and τ-NICE) at γ = 0.1: the error each
  settles at, next to Theorem 5.3.2's neighbourhood γσ²/(γμ_AS² + 2μ_AS) from the library's
  exact μ_AS, σ²_⋆,AS.
* ``baselines`` (Fig. 5.4): SPPM-SS (γ = 1) vs MB-GD and MB-LocalGD (5 local steps) on
  the same cohorts, at ``baseline_lr``: ``theory`` (default; the "optimal learning rate as
  suggested by Gower et al. (2019b)", 1/(2ℒ) as above) or ``1/L_max``.
* ``gamma`` (Figs. D.4/D.5): γ ∈ {0.1, 1, 100} × K ∈ {4, 16}: faster but coarser with γ.

Data: LIBSVM files with ``--dataset libsvm --data-dir FILE`` (mushrooms, a6a, w6a, ijcnn1,
a9a); offline the labelled stand-in of mushrooms' shape (default) or scikit-learn's
breast-cancer set (few examples: use fewer clusters/clients).

Source for the team: seed 001 chapter 5, E5.1–E5.4 (cost, sampling, baselines, gamma); spec
``seed001_ch3_ch5.md`` §5.5–5.8, §3.5 (prox solvers), C5-14 (LocalGD's step).
"""
from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np

from fedjaxsparse.ops import accounting, sampling
from fedjaxsparse.convex import prox_solvers as P
from fedjaxsparse.algorithms import sppm
from fedjaxsparse.convex.constants import client_curvatures, linear_model_constants, \
    logistic_optimum
from fedjaxsparse.data.federated import FederatedDataset, pack_clients
from fedjaxsparse.data.libsvm import binary_arrays
from fedjaxsparse.data.partitions import kmeans_partition
from fedjaxsparse.errors import ConfigError
from fedjaxsparse.harness.options import Config, Option, name_list
from fedjaxsparse.harness.experiment import Context, declared
from fedjaxsparse.harness.report import Figure, Table
from fedjaxsparse.models import logistic_regression, make_loss
from fedjaxsparse.harness.protocol import PaperConfig, check_claim, load_or_standin

NAME = "cohort_squeeze_logreg"
DESCRIPTION = ("Cohort-Squeeze (Yi et al. 2024): SPPM-AS total cost T*K vs K, LocalGD, "
               "sampling/baselines/gamma")
THEORY_LABEL = "LocalGD, 1/(2ℒ)"
"""LocalGD at Gower et al. (2019)'s step 1/(2ℒ) (ℒ: the SS cohort's expected smoothness); not
the paper's "LocalGD, optim", whose step (Khaled and Richtárik, 2020) the paper does not give."""

DEFAULTS = dict(rounds=60, clients=100, dataset="mushrooms_standin", eval_every=1)
# --quick: the table's shape in well under two minutes on 2 CPU cores (QUICK_RUNTIME)
QUICK = dict(dataset="breast_cancer", clients=12, rounds=15, options=dict(
    clusters=3, clients_per_cluster=4, ks=[1, 3], gammas=[10], local_steps=2, local_lrs=[0.5],
    seeds=2, study_rounds=12, eps=0.05, study_solver="cg", trade_gammas=[1], trade_ks=[2]))
QUICK_RUNTIME = "measured 19 s on 2 CPU cores (a fresh process, XLA's default flags)"
BUDGET = "global rounds per run (max T); costs count local communication rounds"
RUNTIME = ("about 3 min on 2 CPU cores (measured 166 s: cost study of 32 SPPM and 18 LocalGD "
           "configurations x 3 seeds, three 300-round studies)")
STUDIES = ("cost", "sampling", "baselines", "gamma")
SOLVERS = {"bfgs": P.bfgs, "cg": P.cg}
OPTIONS = (
    Option("studies", "cost,sampling,baselines,gamma", "which studies to run (comma list of "
           + ", ".join(STUDIES) + ")", kind="str"),
    Option("clusters", 10, "k-means clusters (= strata / blocks)", low=1),
    Option("tsne", 0, "Fig. D.1: a t-SNE map of this many examples (0: none) coloured by their "
           "k-means cluster", low=0),
    Option("clients_per_cluster", 10, "clients each cluster is cut into", low=1),
    Option("mu", 0.1, "l2 regularisation (strong convexity)", low=0.0, low_open=True),
    Option("eps", 5e-3, "target ||x_T - x*||^2 < eps", low=0.0, low_open=True),
    Option("gammas", [100.0, 1000.0], "prox parameters gamma of the cost study",
           kind="floats", low=0.0, low_open=True),
    Option("ks", [1, 2, 3, 4, 5, 7, 10, 12], "local communication rounds K of the cost study",
           kind="floats", low=1),
    Option("solvers", "bfgs,cg", "prox solvers of the cost study (bfgs, cg)", kind="str"),
    Option("local_lrs", [0.1, 0.01], "LocalGD step sizes", kind="floats", low=0.0,
           low_open=True),
    Option("local_steps", [1, 2, 4, 8, 12, 16], "LocalGD local iterations", kind="floats",
           low=1),
    Option("local_theory", True, "also run 'LocalGD, 1/(2L)': the local iterations at the step "
           "from theory 1/(2 L_SS) (L_SS: the SS cohort's expected smoothness, Gower et al. "
           "2019)", kind="bool"),
    Option("baseline_lr", "theory", "step of MB-GD and MB-LocalGD in the baselines study: "
           "theory (1/(2 L_SS), Gower et al. 2019, as the chapter) or 1/L_max",
           choices=("theory", "1/L_max")),
    Option("c1", 0.1, "hierarchical cost of a client-hub round", low=0.0),
    Option("c2", 1.0, "hierarchical cost of a hub-server round", low=0.0),
    Option("seeds", 3, "seeds (cohort draws) averaged", low=1),
    Option("study_solver", "bfgs", "prox solver (K = 10) of the sampling and baselines studies "
           "and of the gamma study", choices=tuple(SOLVERS)),
    Option("trade_gammas", [0.1, 1.0, 100.0], "gammas of the gamma study", kind="floats",
           low=0.0, low_open=True),
    Option("trade_ks", [4, 16], "K of the gamma study", kind="floats", low=1),
    Option("study_rounds", 300, "global rounds of the sampling, baselines and gamma studies "
           "(the cost study runs at most --rounds)", low=1),
    Option("round_unit", "iteration", "what a local communication round of the cohort's prox "
           "solver is: iteration (one solver iteration, the chapter's K, spec §3.5) or oracle "
           "(every gradient or Hessian-vector product the solver evaluates: CG's iterations "
           "cost 2; the chapter leaves the mapping open, C5-13)",
           choices=("iteration", "oracle")),
)

PAPERS = {"figure5_1": PaperConfig(
    "figure5_1", "K. Yi's dissertation (Cohort-Squeeze) §5.4.2 and §5.4.5, the text of Figs. "
    "5.1/5.2 (logistic regression, LIBSVM)", dataset="libsvm", standin="mushrooms_standin",
    clients=100, rounds=60, eval_every=1, options={"studies": "cost"},
    unit="local communication rounds (optimal K, total cost T*K) and % saved",
    paper={"optimal K": {"SPPM-SS γ=1000 (BFGS)": 10, "SPPM-SS γ=100 (BFGS)": 3,
                         "SPPM-SS γ=1000 (CG)": 7, "LocalGD": 12},
           "cost": {"SPPM-SS γ=1000 (BFGS)": 10, "SPPM-SS γ=100 (BFGS)": 12, "LocalGD": 39},
           "saving over LocalGD %": {"base (c1=1, c2=0)": 74.36,
                                     "hierarchical (c1=0.1, c2=1)": 94.87}},
    deviations="the paper's 'LocalGD, optim' (Khaled and Richtárik's step, not written out) "
               "is replaced by LocalGD with a tuned step and 'LocalGD, 1/(2ℒ)'")}


def feature_split(x: np.ndarray, clusters: int, per_cluster: int, seed: int):
  """:func:`fedjaxsparse.data.partitions.kmeans_partition` with the experiment's option names
  in its error (``clusters``, ``clients_per_cluster``)."""
  try:
    return kmeans_partition(x, clusters, per_cluster, seed)
  except ValueError as e:
    raise ConfigError(str(e).replace("per_cluster=", "clients_per_cluster=")) from None


def _problem(cfg: Config, opts: dict) -> dict:
  """The study's problem: the k-means split of the data, the loss, x⋆ and f⋆, the samplers and
  the constants every study and the table use (printed once)."""
  nc, per = opts["clusters"], opts["clients_per_cluster"]
  if nc * per != cfg.clients:
    raise ConfigError(f"--clients must be clusters x clients_per_cluster = {nc * per}, got "
                      f"{cfg.clients}.")
  (x, y, label), standin = load_or_standin(
      PAPERS.get(cfg.paper), cfg.dataset, cfg.data_dir,
      lambda name: binary_arrays(name, cfg.data_dir, NAME))
  parts, blocks = feature_split(x, nc, per, cfg.seed)
  data = pack_clients(x, y, parts)
  data = data._replace(x=data.x.astype(jnp.float64), mask=data.mask.astype(jnp.float64))
  mu = opts["mu"]
  loss = make_loss(logistic_regression(x.shape[1], l2=mu, use_bias=False))
  f_opt, x_opt = logistic_optimum(x, y, parts, mu, return_x=True)
  x_opt = jnp.asarray(x_opt)
  grads = np.asarray(jax.vmap(jax.grad(loss), in_axes=(None, 0, 0, 0))(
      {"w": x_opt}, data.x, data.y, data.mask)["w"])  # a_i = ∇f_i(x⋆)
  ss, bs = sampling.stratified(blocks), sampling.block(blocks)
  # the step from theory (Gower et al. 2019, Thm 3.1): 1/(2ℒ) for the SS cohort, from the
  # exact per-client L_i (λ_max of the logistic Hessian bound) and L of the average; L_max
  # of baseline_lr=1/L_max is Yi (2025) A.3's trace bound
  l_i, _ = client_curvatures(data, mu, "logistic", "mean", use_bias=False)
  l_max = float(client_curvatures(data, mu, "logistic", "mean", use_bias=False,
                                  bound="trace")[0].max())
  l_avg = linear_model_constants(data, mu, "logistic", "mean", use_bias=False).L
  theory_lr = 1 / (2 * sampling.expected_smoothness(ss, l_avg, l_i))
  print(f"{NAME}: {label}, {cfg.clients} clients ({nc} k-means clusters x {per}), cohort "
        f"{ss.size}, mu={mu}, eps={opts['eps']}, f*={f_opt:.6g}, "
        f"||x*||^2={float(x_opt @ x_opt):.4g}, sigma^2_SS={sampling.sigma2_star(ss, grads):.3g}, "
        f"mu_SS={sampling.mu_as(ss, mu):.3g}, L={l_avg:.4g}, max L_i={l_i.max():.4g}, step "
        f"from theory 1/(2 L_SS)={theory_lr:.4g}")
  return dict(x=x, parts=parts, blocks=blocks, data=data, label=label, standin=standin,
              loss=loss, x_opt=x_opt, grads=grads, ss=ss, bs=bs, l_max=l_max,
              theory_lr=theory_lr, w0={"w": jnp.zeros(x.shape[1], jnp.float64)})


def setup(cfg: Config, opts: dict):
  """One setting per study (``studies``), each a convergence study of ‖x_t − x⋆‖² over
  ``seeds`` cohort draws: the cost study over ``--rounds`` global rounds, the others over
  ``study_rounds``."""
  studies = name_list(opts["studies"], "studies", STUDIES)
  name_list(opts["solvers"], "solvers", tuple(SOLVERS))
  prob = _problem(cfg, opts)
  ds = FederatedDataset(prob["data"], prob["data"], 2, prob["label"])
  gap = lambda state, x_opt=prob["x_opt"]: jnp.sum(jnp.square(state.params["w"] - x_opt))
  for study in studies:   # each study's runs planned once: methods and table read them
    yield Context(ds, prob["w0"], None, {**prob, "runs": plan(study, prob, opts)},
                  setting=study, curve=gap,
                  rounds=cfg.rounds if study == "cost" else opts["study_rounds"])


def plan(study: str, prob: dict, opts: dict) -> list[tuple[str, dict, object]]:
  """A study's runs ``(name, what it varies, algorithm)`` in table order."""
  loss, ss, study_solver = prob["loss"], prob["ss"], SOLVERS[opts["study_solver"]]
  runs = []
  if study == "cost":
    for solver in name_list(opts["solvers"], "solvers", tuple(SOLVERS)):
      # local rounds per solver iteration: 1 (the chapter's reading), or every oracle call
      # (gradient or Hessian-vector product: CG's 2) a round of its own
      per = SOLVERS[solver](1).oracle_calls if opts["round_unit"] == "oracle" else 1
      for gamma in opts["gammas"]:
        line = f"SPPM-SS γ={gamma:g} ({solver.upper()})"
        for k in sorted({int(k) for k in opts["ks"]}):
          runs.append((f"{line} K={k}", {"line": line, "k": k, "rounds per k": per},
                       sppm.sppm_as(loss, ss, gamma, SOLVERS[solver](k))))
    lrs = [(f"LocalGD lr={lr:g}", lr) for lr in opts["local_lrs"]]
    if opts["local_theory"]:
      lrs.append((THEORY_LABEL, prob["theory_lr"]))
    for line, lr in lrs:
      for steps in sorted({int(v) for v in opts["local_steps"]}):
        runs.append((f"{line} steps={steps}", {"line": line, "lr": lr, "k": steps},
                     sppm.local_gd(loss, ss, lr, steps)))
  elif study == "sampling":
    for name, s in (("SPPM-SS", ss), ("SPPM-BS", prob["bs"]),
                    (f"SPPM-NICE({ss.size})", sampling.nice(len(prob["parts"]), ss.size))):
      runs.append((name, {"sampler": s}, sppm.sppm_as(loss, s, 0.1, study_solver(10))))
  elif study == "baselines":
    theory = opts["baseline_lr"] == "theory"
    lr, lr_name = (prob["theory_lr"], "1/(2 L_SS)") if theory else (1 / prob["l_max"],
                                                                     "1/L_max")
    solver = opts["study_solver"].upper()
    runs += [(f"SPPM-SS (γ=1, {solver} K=10)", {}, sppm.sppm_as(loss, ss, 1.0, study_solver(10))),
             (f"MB-GD (lr={lr_name}={lr:.3g})", {}, sppm.sppm_as(loss, ss, 1.0, P.gd(lr, 1))),
             (f"MB-LocalGD (5 local steps, lr={lr_name})", {}, sppm.local_gd(loss, ss, lr, 5))]
  else:   # gamma
    for gamma in opts["trade_gammas"]:
      for k in sorted({int(k) for k in opts["trade_ks"]}):
        runs.append((f"SPPM-SS γ={gamma:g}, K={k}", {"gamma": gamma, "K": k},
                     sppm.sppm_as(loss, ss, gamma, study_solver(k))))
  return runs


def methods(ctx: Context, cfg: Config, opts: dict) -> dict:
  return {name: algo for name, _, algo in ctx.extra["runs"]}


def _cost(errs: np.ndarray, k: int, eps: float, c1: float = 1.0, c2: float = 0.0):
  """Mean over seeds of the cost to reach ``eps`` (``None`` if a seed never does)."""
  costs = [accounting.cost_to_target(e, k, eps, c1, c2) for e in errs]
  return None if any(c is None for c in costs) else float(np.mean(costs))


def table(records: dict, contexts: list, cfg: Config, opts: dict) -> dict:
  """Every study's table from its runs' curves (mean over seeds; a configuration reaches the
  target only if every seed does), the paper's claims checked on them."""
  prob, eps, mu = contexts[0].extra, opts["eps"], opts["mu"]
  ss, grads = prob["ss"], prob["grads"]
  out = {"dataset": prob["label"], "clients": cfg.clients, "eps": eps,
         **({"standin": prob["standin"]} if prob["standin"] else {}),
         "seeds": opts["seeds"], "theory lr": prob["theory_lr"]}
  claims, solver = [], opts["study_solver"].upper()
  for ctx in contexts:
    runs = [(name, meta, np.asarray(records[name]["curves"]))
            for name, meta, _ in ctx.extra["runs"]]
    if ctx.setting == "cost":
      out["cost"] = _cost_study(opts, runs, prob["theory_lr"])
    elif ctx.setting == "sampling":
      rows = [{"sampling": name, "final error": float(e[:, -10:].mean()),
               "theory neighbourhood": sampling.neighbourhood(m["sampler"], mu, grads, 0.1),
               "theory bound at T": float(sampling.theorem_bound(
                   m["sampler"], mu, grads, 0.1, float(e[0, 0]), opts["study_rounds"])),
               "sigma2_*": sampling.sigma2_star(m["sampler"], grads),
               "mu_AS": sampling.mu_as(m["sampler"], mu), "curve": e.mean(0).tolist()}
              for name, m, e in runs]
      claim = check_claim("SS settles in a significantly smaller neighbourhood than BS "
                          "(final error)", rows[0]["final error"] < rows[1]["final error"])
      claims.append(claim)
      out["sampling"] = Table(
          rows, ["sampling", "final error", "theory bound at T", "theory neighbourhood",
                 "sigma2_*", "mu_AS"], note=claim["text"],
          title=f"E5.2 (Fig. 5.3), gamma = 0.1, {solver} K = 10")
    elif ctx.setting == "baselines":
      rows = [{"method": name, "final error": float(e[:, -10:].mean()),
               "curve": e.mean(0).tolist()} for name, _, e in runs]
      claim = check_claim(
          "SPPM-SS reaches a significantly smaller neighbourhood than MB-GD and MB-LocalGD "
          "(final error)", all(rows[0]["final error"] < r["final error"] for r in rows[1:]))
      claims.append(claim)
      out["baselines"] = Table(rows, ["method", "final error"], title="E5.3 (Fig. 5.4)",
                               note=claim["text"])
    else:
      rows = [{"gamma": m["gamma"], "K": m["K"], "final error": float(e[:, -10:].mean()),
               "rounds to eps": accounting.rounds_below(e.mean(0), eps),
               "neighbourhood (theory)": sampling.neighbourhood(ss, mu, grads, m["gamma"]),
               "curve": e.mean(0).tolist()} for _, m, e in runs]
      claim = check_claim("larger gamma converges faster to a larger neighbourhood",
                          _faster_to_larger(rows))
      claims.append(claim)
      out["gamma"] = Table(
          rows, ["gamma", "K", "final error", "rounds to eps", "neighbourhood (theory)"],
          title="E5.4 (Figs. D.4/D.5); rounds to eps: the first round from which the mean "
                "error stays below eps", note=claim["text"])
  out["claims"] = claims
  return out


def figure(results: dict, ctx: Context, cfg: Config, opts: dict) -> list[Figure]:
  """A panel per study (:func:`_panels`) and, with ``tsne``, Fig. D.1."""
  prob = ctx.extra
  figures = [Figure("panels", dict(
      panels=_panels(results), title=f"{prob['label']}: Cohort-Squeeze (Yi (2025) ch. 5)"))]
  if opts["tsne"]:
    figures.append(tsne_figure(prob["x"], prob["parts"], prob["blocks"], opts["tsne"],
                               cfg.seed, prob["label"]))
  return figures


def tsne_figure(x: np.ndarray, parts, blocks, points: int, seed: int, label: str) -> Figure:
  """Fig. D.1: scikit-learn's t-SNE of ``points`` examples drawn at random, coloured by the
  k-means cluster their client belongs to (the clusters of :func:`feature_split`)."""
  from sklearn.manifold import TSNE
  cluster = np.empty(len(x), np.int64)
  for c, block in enumerate(blocks):
    for client in block:
      cluster[parts[client]] = c
  rng = np.random.default_rng(seed)
  pick = rng.choice(len(x), min(points, len(x)), replace=False)
  emb = TSNE(n_components=2, init="pca", random_state=seed,
             perplexity=min(30.0, max(2.0, (len(pick) - 1) / 3))).fit_transform(
                 np.asarray(x[pick], np.float64))
  return Figure("scatter", dict(points=emb.tolist(), labels=cluster[pick].tolist(),
                                title=f"Fig. D.1 ({label}): t-SNE of {len(pick)} examples, "
                                      f"coloured by their k-means cluster",
                                xlabel="t-SNE 1", ylabel="t-SNE 2"), suffix="_tsne")


def _faster_to_larger(rows: list[dict]) -> bool | None:
  """Whether, at each K, a larger γ reaches eps in no more rounds and ends at a larger error
  (``None`` with one γ per K: nothing to compare)."""
  verdicts = []
  for k in {r["K"] for r in rows}:
    at = sorted((r for r in rows if r["K"] == k), key=lambda r: r["gamma"])
    for a, b in zip(at, at[1:]):
      faster = (b["rounds to eps"] is not None and
                (a["rounds to eps"] is None or b["rounds to eps"] <= a["rounds to eps"]))
      verdicts.append(faster and b["final error"] >= a["final error"])
  return all(verdicts) if verdicts else None


def _cost_study(opts, runs: list, theory_lr: float) -> dict:
  """E5.1 from the cost study's ``runs`` ``(name, meta, curves)``: T·K to eps per (solver, γ,
  K), LocalGD's cost per (lr, local steps) and, with ``local_theory``, LocalGD's at the step
  from theory ``theory_lr`` ("LocalGD, 1/(2ℒ)")."""
  c1, c2, eps = opts["c1"], opts["c2"], opts["eps"]
  lines: dict[str, dict] = {}
  for _, m, e in runs:
    if m["line"].startswith("SPPM"):   # a local round per solver iteration (or oracle call)
      cost = (_cost(e, m["k"] * m["rounds per k"], eps),
              _cost(e, m["k"] * m["rounds per k"], eps, c1, c2))
    else:                               # LocalGD: one communication per round
      cost = (_cost(e, 1, eps), _cost(e, 1, eps, c1 + c2, 0.0))
    lines.setdefault(m["line"], {})[m["k"]] = cost
  curves = {line: {k: c[0] for k, c in costs.items()} for line, costs in lines.items()}
  rows = [_best(line, costs) for line, costs in lines.items() if line.startswith("SPPM")]
  lrs = {m["line"]: m["lr"] for _, m, _ in runs if m["line"].startswith("LocalGD lr=")}
  rows.append(_best("LocalGD", {(lr, k): c for line, lr in lrs.items()
                                for k, c in lines[line].items()}))
  if THEORY_LABEL in lines:
    rows.append({**_best(THEORY_LABEL, lines[THEORY_LABEL]), "lr": theory_lr})
  paper = PAPERS["figure5_1"].paper
  for r in rows:
    r["paper optimal K"] = paper["optimal K"].get(r["method"])
    r["paper cost"] = paper["cost"].get(r["method"])
  # savings against the cheapest LocalGD (the tuned grid or the step from theory)
  savings = {}
  sppm_rows = [r for r in rows if not r["method"].startswith("LocalGD")]
  local_costs = [r["cost"] for r in rows if r["method"].startswith("LocalGD") and r["cost"]]
  local_hier = [r["hierarchical cost"] for r in rows
                if r["method"].startswith("LocalGD") and r["hierarchical cost"]]
  if local_costs and any(r["cost"] for r in sppm_rows):
    base = min(r["cost"] for r in sppm_rows if r["cost"])
    hier = min(r["hierarchical cost"] for r in sppm_rows if r["hierarchical cost"])
    savings = {"base (c1=1, c2=0)": 100 * (1 - base / min(local_costs)),
               f"hierarchical (c1={c1:g}, c2={c2:g})": 100 * (1 - hier / min(local_costs)),
               "hierarchical vs LocalGD charged (c1+c2)T":
                   100 * (1 - hier / min(local_hier))}
  unit = ("one solver iteration = one local round" if opts["round_unit"] == "iteration" else
          "every oracle call (gradient or Hessian-vector product) = one local round")
  table = Table(
      rows, title=f"E5.1 (Figs. 5.1/5.2): total cost T*K to ||x_T - x*||^2 < {eps:g} (mean "
      f"over seeds; hierarchical: c1={c1:g}, c2={c2:g}; {unit}; LocalGD: K = its local "
      f"iterations, one communication per round; {THEORY_LABEL}: the step 1/(2 L_SS) from "
      "Gower et al.'s theory — the paper's 'LocalGD, optim' uses Khaled and Richtárik's step, "
      "which it does not write out, so that line is absent); the paper's numbers are "
      "a6a/mushrooms",
      note="\n".join(f"saving of SPPM-SS over LocalGD, {k}: {v:.2f} % (the paper: "
                     f"{paper['saving over LocalGD %'].get(k, 'n/a')})"
                     for k, v in savings.items()) or None)
  return {"table": table, "curves": {m: {str(k): v for k, v in c.items()}
                                    for m, c in curves.items()}, "savings": savings}


def _best(name: str, costs: dict) -> dict:
  """The row of the cheapest configuration (base cost) and the cheapest hierarchical one."""
  ok = {k: c for k, c in costs.items() if c[0] is not None}
  okh = {k: c for k, c in costs.items() if c[1] is not None}
  kb = min(ok, key=lambda k: ok[k][0]) if ok else None
  kh = min(okh, key=lambda k: okh[k][1]) if okh else None
  return {"method": name, "optimal K": kb if not isinstance(kb, tuple) else kb[1],
          "cost": ok[kb][0] if ok else None,
          **({"lr": kb[0]} if isinstance(kb, tuple) else {}),
          "hierarchical cost": okh[kh][1] if okh else None}


def _panels(results: dict) -> list[dict]:
  """A panel per study run: the cost to eps against K (Figs. 5.1/5.2), then the error curves of
  the sampling, baselines and gamma studies against the global round."""
  panels = []
  if "cost" in results:
    panels.append({"lines": {m: ([int(k) for k in c], list(c.values()))
                             for m, c in results["cost"]["curves"].items()},
                   "marker": "o", "xlabel": "K (local rounds; LocalGD: local iterations)",
                   "ylabel": "total cost T·K", "title": "cost to ε vs K (Figs. 5.1/5.2)"})
  titles = {"sampling": "SS vs BS vs NICE (Fig. 5.3)",
            "baselines": "SPPM-SS vs MB-GD / MB-LocalGD (Fig. 5.4)",
            "gamma": "γ trade-off (Figs. D.4/D.5)"}
  for p, title in titles.items():
    if p in results:
      key = {"sampling": "sampling", "baselines": "method"}.get(p)
      panels.append({"lines": {(r[key] if key else f"γ={r['gamma']:g}, K={r['K']}"):
                               (None, r["curve"]) for r in results[p].rows},
                     "logy": True, "xlabel": "global round t", "ylabel": "‖x_t − x⋆‖²",
                     "title": title})
  return panels


run = declared(NAME, OPTIONS, setup=setup, methods=methods, table=table, figure=figure,
               metric="‖x_t − x⋆‖²", higher_is_better=False, papers=PAPERS,
               float64=lambda opts: True)
