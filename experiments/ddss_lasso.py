"""DDSS (Bao et al. 2022; chapter 3 of Xidong Wu's dissertation), Figures 1-3 at CPU scale:
distributed dynamic safe screening (Sha-DDSS, Dis-DDSS and their Naive variants) against
ProxASVRG, ProxASAGA (in shared memory and, as Dis-ProxASAGA, over the workers' sample shards
like Dis-DDSS, its messages charged), PSE-Safe and PSE-Strong on a sparse Lasso (or
ℓ1-logistic regression, ``--set loss=logistic``).

Data: the embedded default is a synthetic sparse design with a planted support (``n``, ``p``,
``density``, ``support``: n = 2,000, p = 20,000, density 2·10⁻³, 20 non-zeros, λ = 0.3·λ_max
— a minute on 2 CPU cores, where screening already removes ~98 % of the coordinates; a
larger scale is ``--set n=10000 --set p=100000 --set density=1e-3 --set support=100
--set lam_ratio=0.1``, about 15 minutes); ``--data-dir FILE`` reads a LIBSVM
file kept sparse (rcv1, real-sim, KDD2010, Avazu; the paper's λ/λ_max are 4e-6 for KDD 2010,
2e-3 / 1e-3 for Avazu-app / -site). λ = ``lam_ratio``·λ_max. float64 throughout.

Protocol: every method runs ``rounds`` outer iterations of ``inner`` updates (default n: one
epoch of samples; for PSE, coordinate updates), ``workers`` emulated workers, and its step size
is chosen alike for every stochastic method from ``step_grid``·1/L (L = max_i ‖a_i‖²·L_f) by
the duality gap after half the budget on another seed (the quantity the figures plot; there is
no held-out data in an optimisation benchmark); a step whose gap ends above twice its best
(diverging) loses. The baselines report the full problem's gap. Plotted: the duality gap against epochs (data
passes), against touched coordinates, against communicated floats (distributed variants), and
the active-set size per outer iteration. **Asynchrony is emulated** (``workers`` updates per
tick from the same read): the worker sweep reports the gap reached for the same number of
updates, not wall-clock speed-ups (which an emulation cannot measure). The paper prints no
numbers (its figures are images); the qualitative claims checked: the VR variants are fastest,
the Naive variants fast early then sublinear, and screening shrinks the active set to the
support.

Source for the team: seed 004 Task 1, Figures 1-3; spec ``seed004.md`` §1.11 (experiments; its
reproducibility note suggests the larger synthetic scale), §1.9.
"""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np

from fedjaxsparse.convex import screening as SC
from fedjaxsparse.algorithms import ddss as DD
from fedjaxsparse.algorithms import ddss_baselines as DB
from fedjaxsparse.data import sparse_rows as SR
from fedjaxsparse.errors import ConfigError
from fedjaxsparse.harness.options import Config, Option
from fedjaxsparse.harness.experiment import Context, Trial, TrialRun, declared
from fedjaxsparse.harness.report import Figure, Table

NAME = "ddss_lasso"
DESCRIPTION = ("DDSS (Bao et al. 2022): dynamic safe screening in async prox-SVRG "
               "(CPU scale)")
DEFAULTS = dict(rounds=20, eval_every=1, dataset="synthetic")
# --quick: the table's shape in well under two minutes on 2 CPU cores (QUICK_RUNTIME)
QUICK = dict(rounds=3, options=dict(n=200, p=600, density=0.01, support=5, lam_ratio=0.3,
                                     workers=2, worker_sweep=[1, 2], step_grid=[0.3, 1]))
QUICK_RUNTIME = "measured 23 s on 2 CPU cores (a fresh process, XLA's default flags)"
BUDGET = "outer iterations (each: one full-gradient pass + `inner` updates)"
RUNTIME = ("about a minute on 2 CPU cores (measured 65 s: n = 2,000, p = 20,000, 20 outer "
           "iterations; Sha-DDSS screens 98 % of the coordinates away and touches ~400x fewer "
           "than ProxASVRG)")
METHODS = ("Sha-DDSS-Naive", "Sha-DDSS", "Dis-DDSS-Naive", "Dis-DDSS", "ProxASVRG", "ProxASAGA",
           "Dis-ProxASAGA", "PSE-Safe", "PSE-Strong")
OPTIONS = (
    Option("loss", "squared", "Lasso or l1-logistic", choices=("squared", "logistic")),
    Option("lam_ratio", 0.3, "λ / λ_max", low=0.0, high=1.0, low_open=True),
    Option("n", 2000, "samples of the synthetic default (the paper's scale: 10,000+)", low=10),
    Option("p", 20_000, "features of the synthetic default (the paper's scale: 100,000+)",
           low=10),
    Option("density", 2e-3, "density of the synthetic default", low=0.0, high=1.0,
           low_open=True),
    Option("support", 20, "planted non-zeros", low=1),
    Option("inner", None, "updates per outer iteration (default n)", kind="int", low=1),
    Option("workers", 8, "emulated workers / threads", low=1),
    Option("step_grid", [0.25, 1.0, 4.0], "step sizes in units of 1/L", kind="floats",
           low=0.0, low_open=True),
    Option("worker_sweep", [1, 2, 4, 8], "workers for the emulated-speed-up table",
           kind="floats", low=1, identity=False),
)


def _data(cfg: Config, opts: dict) -> tuple[SR.SparseRows, str]:
  task = "regression" if opts["loss"] == "squared" else "classification"
  if cfg.data_dir:
    return SR.from_libsvm(cfg.data_dir, task), os.path.basename(cfg.data_dir)
  data, _ = SR.planted(opts["n"], opts["p"], opts["density"], opts["support"], task=task,
                       seed=cfg.seed)
  return data, (f"synthetic sparse (n={opts['n']}, p={opts['p']}, density {opts['density']:g}, "
                f"{opts['support']} planted non-zeros)")


def _make(name: str, prob, data, eta: float, inner: int, workers: int):
  kw = dict(step_size=eta, inner_steps=inner)
  if name == "Sha-DDSS-Naive":
    return DD.sha_ddss_naive(prob, data, workers=workers, **kw)
  if name == "Sha-DDSS":
    return DD.sha_ddss(prob, data, workers=workers, **kw)
  if name == "Dis-DDSS-Naive":
    return DD.dis_ddss_naive(prob, data, workers=workers, **kw)
  if name == "Dis-DDSS":
    return DD.dis_ddss(prob, data, workers=workers, **kw)
  if name == "ProxASVRG":
    return DD.prox_asvrg(prob, data, workers=workers, **kw)
  if name == "ProxASAGA":
    return DB.prox_asaga(prob, data, workers=workers, **kw)
  if name == "Dis-ProxASAGA":   # over the workers' sample shards, like Dis-DDSS
    return DB.prox_asaga(prob, data, workers=workers, shards=workers, **kw)
  return DB.pse(prob, data, rule="safe" if name == "PSE-Safe" else "strong", inner_steps=inner,
                workers=workers)


def _run_method(algo, data, rounds: int, seed: int) -> dict:
  """Runs ``rounds`` outer iterations as one jitted scan; per-iteration history."""
  p = data.p

  def body(st, key):
    st2, info = algo.step(key, st, data)
    rec = {"gap": info.gap, "primal": info.loss, "p_active": info.p_active,
           "epochs": st.epochs, "touched": st.touched,
           "floats": getattr(st, "floats_up", jnp.zeros(())) + getattr(st, "floats_down",
                                                                       jnp.zeros(())),
           "floats_lazy": getattr(st, "floats_up", jnp.zeros(()))
           + getattr(st, "floats_down_lazy", jnp.zeros(()))}
    return st2, rec

  run = jax.jit(lambda st: jax.lax.scan(body, st, jax.random.split(jax.random.key(seed), rounds)))
  st, hist = run(algo.init(None, jnp.zeros(p, data.val.dtype), data))
  return {k: np.asarray(v).tolist() for k, v in hist.items()}


def _check_dataset(cfg: Config) -> None:
  if cfg.dataset not in ("synthetic", "libsvm") or (cfg.dataset == "libsvm") != bool(
      cfg.data_dir):
    raise ConfigError(f"{NAME} runs on --dataset synthetic (planted sparse data: options n, "
                      f"p, density, support) or --dataset libsvm --data-dir FILE; got "
                      f"--dataset {cfg.dataset!r}"
                      f"{' with --data-dir' if cfg.data_dir else ' without --data-dir'}.")


def setup(cfg: Config, opts: dict) -> Context:
  """The data, λ and the screening problem every solver shares (printed once)."""
  _check_dataset(cfg)
  data, what = _data(cfg, opts)
  lmax = SC.lambda_max(data, opts["loss"])
  lam = opts["lam_ratio"] * lmax
  prob = SC.make_problem(data, lam, opts["loss"])
  inner = opts["inner"] or data.n
  workers = opts["workers"]
  inner -= inner % workers
  big_l = SC.LOSSES[opts["loss"]] * float(prob.max_row_sq)
  print(f"{NAME}: {what}; loss {opts['loss']}, λ = {opts['lam_ratio']:g}·λ_max = {lam:.4g}; "
        f"{cfg.rounds} outer iterations × {inner} updates, {workers} emulated workers; "
        f"float64")
  return Context(None, None, None, dict(data=data, what=what, lam=lam, lmax=lmax, prob=prob,
                                        inner=inner, big_l=big_l))


def methods(ctx: Context, cfg: Config, opts: dict) -> dict[str, Trial]:
  """Every solver (PSE only for the Lasso) with its step chosen on the gap, then Sha-DDSS at
  its chosen step for every worker count of ``worker_sweep``."""
  P_ = ctx.extra
  out = {m: Trial(lambda run, m=m: _solve(P_, m, opts, run)) for m in METHODS
         if not (m.startswith("PSE") and opts["loss"] != "squared")}
  for w in opts["worker_sweep"]:
    out[_sweep_name(int(w))] = Trial(lambda run, w=int(w): _history(
        P_, "Sha-DDSS", run.earlier["Sha-DDSS"]["step_size"], P_["inner"] - P_["inner"] % w,
        w, run))
  return out


def _sweep_name(workers: int) -> str:
  return f"Sha-DDSS, workers={workers}"


def _history(P_: dict, name: str, eta: float, inner: int, workers: int, run: TrialRun,
             rounds: int | None = None, seed: int | None = None) -> dict:
  return _run_method(_make(name, P_["prob"], P_["data"], eta, inner, workers), P_["data"],
                     rounds or run.config.rounds, run.seed if seed is None else seed)


def _solve(P_: dict, name: str, opts: dict, run: TrialRun) -> dict:
  """One solver: its step from ``step_grid``·1/L by the gap after half the budget on the next
  seed (PSE: none), then the full run; ``{"history", "step_size", "diverged"}``."""
  big_l, rounds, inner = P_["big_l"], run.config.rounds, P_["inner"]
  eta = None
  if not name.startswith("PSE"):
    scores = {}
    for c in opts["step_grid"]:
      g = np.asarray(_history(P_, name, c / big_l, inner, opts["workers"], run,
                              max(1, rounds // 2), run.seed + 1)["gap"], float)
      # a step whose gap ends above twice its best is diverging: it loses
      ok = np.all(np.isfinite(g)) and g[-1] <= 2 * g.min()
      scores[c] = g[-1] if ok else np.inf
    eta = min(scores, key=scores.get) / big_l
  hist = _history(P_, name, eta or 1.0, inner, opts["workers"], run)
  g = np.asarray(hist["gap"], float)
  diverged = None
  if not np.all(np.isfinite(g)) or g[-1] > 2 * np.nanmin(g):  # the gap climbs back
    diverged = {"round": int(np.nanargmin(g)) + 1, "quantity": "duality gap rising"}
  return {"history": {"evals": {**hist, "round": list(range(rounds))}}, "step_size": eta,
          "diverged": diverged}


def table(records: dict, contexts: list, cfg: Config, opts: dict) -> dict:
  """The solvers' final gap, active set, work and communication; the worker sweep."""
  P_ = contexts[-1].extra
  sweeps = {_sweep_name(int(w)): int(w) for w in opts["worker_sweep"]}
  rows = []
  for name, rec in records.items():
    if name in sweeps:
      continue
    r = rec["seeds"][0]
    hist, eta = r["history"]["evals"], r["step_size"]
    g = np.asarray(hist["gap"], float)
    rows.append({"method": name, "step (·L)": None if eta is None else eta * P_["big_l"],
                 "final gap": hist["gap"][-1], "active coords": hist["p_active"][-1],
                 "epochs": hist["epochs"][-1], "touched": hist["touched"][-1],
                 "floats": hist["floats"][-1] or None,
                 "floats (lazy reads)": hist["floats_lazy"][-1] or None,
                 "status": "ok" if r["diverged"] is None else
                 f"diverging: gap {g[-1]:.3g} > 2 × its best {np.nanmin(g):.3g}"})
  sweep = [{"workers": w, "final gap": records[name]["seeds"][0]["gap"][-1],
            "updates per tick": w} for name, w in sweeps.items()]
  return {"dataset": P_["what"], "lambda": P_["lam"], "lambda_max": P_["lmax"],
          "table": Table(rows),
          "worker_sweep": Table(sweep, ["workers", "updates per tick", "final gap"], note=(
              "emulated asynchrony: w workers apply w updates per tick from one read; the same "
              "number of updates is run for every w — a work-unit comparison, not a timing"))}


def figure(results: dict, ctx: Context, cfg: Config, opts: dict) -> list[Figure]:
  """The duality gap against epochs, touched coordinates and communicated floats; the
  active-set size per outer iteration."""
  what = ctx.extra["what"]
  records = {m: r["seeds"][0] for m, r in results["methods"].items() if "history" in
             r["seeds"][0]}
  labels = {"gap": ("duality gap", "duality gap P(x) − D(θ)"),
            "epochs": ("epochs", "epochs (passes over the data)"),
            "touched": ("coordinates touched", "coordinates read or written"),
            "floats": ("communicated floats", "floats sent between workers and server")}
  figures = [Figure("evals", dict(methods=records, y="gap", x=x, labels=labels,
                                  title=f"{NAME}: duality gap vs {x} ({what})",
                                  logx=x != "epochs"), suffix=f"_gap_vs_{x}")
             for x in ("epochs", "touched")]
  dist = {m: r for m, r in records.items() if m.startswith("Dis-")}
  figures.append(Figure("evals", dict(methods=dist, y="gap", x="floats", logx=True, labels=labels,
                                      title=f"{NAME}: duality gap vs communicated floats"),
                        suffix="_gap_vs_floats"))
  figures.append(Figure("curves", dict(
      curves={m: (list(range(cfg.rounds)), r["history"]["evals"]["p_active"])
              for m, r in records.items()},
      xlabel="outer iteration", ylabel="active coordinates", title="active-set size",
      logx=False), suffix="_active"))
  return figures


run = declared(NAME, OPTIONS, setup=setup, methods=methods, table=table, figure=figure,
               metric="duality gap", higher_is_better=False, float64=lambda opts: True)
