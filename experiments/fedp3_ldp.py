"""LDP-FedP3 (FedP3, Yi et al., ICLR 2024; chapter 4 of Kai Yi's dissertation: Algorithm 11,
Thm 4.3.4): utility against the privacy budget ε on a small model.

Protocol: the embedded real digits (or any ``--dataset`` of :mod:`fedjaxsparse.data`), split
over ``clients`` clients (IID by default), softmax regression (d = 650, divisible by the
client count so the permutation sketch gives every client d/n coordinates). Every iteration
each client draws a minibatch of b examples, clips every per-example gradient to norm C, takes
one step of size γ, adds Gaussian noise (on the model, Alg. 11 line 8, or on the update as the
proof has it: ``--set noise=update``) and sends its d/n coordinates; the server takes each
coordinate from its one owner. σ for each (ε, δ) comes from ``dp_accounting``'s RDP accountant
(minibatches of b of a client's m examples without replacement, replace-one neighbours,
over the K iterations; the smallest client's m, so every client is covered; the paper's σ has
unknown constants). γ is tuned alike for every ε on a validation split; test accuracy is the
mean over ``seeds``. Also printed: Table C.3's point that LDP-FedP3's uplink (d floats per
iteration in total) does not grow with n — measured as floats per iteration.

Source for the team: seed 001 chapter 4; spec ``seed001_ch4_ch6.md`` §A.7.
"""
from __future__ import annotations

import jax
import numpy as np

from fedjaxsparse.algorithms import fedp3_theory as T
from fedjaxsparse.data.embedded import digits
from fedjaxsparse.evaluation import make_eval_fn
from fedjaxsparse.harness.options import Config, Option
from fedjaxsparse.harness.tuning import tuning_config
from fedjaxsparse.harness.experiment import Context, Method, Tuning, declared
from fedjaxsparse.harness.report import Figure, Table
from fedjaxsparse.models import make_loss, softmax_regression
from fedjaxsparse.harness.protocol import validation_split
from fedjaxsparse.ops.sparsity import num_params

NAME = "fedp3_ldp"
DESCRIPTION = "LDP-FedP3 (Yi et al., ICLR 2024): test accuracy against the privacy budget epsilon"
DEFAULTS = dict(rounds=200, clients=10, dataset="digits", eval_every=50)
# --quick: the table's shape in well under two minutes on 2 CPU cores (QUICK_RUNTIME)
QUICK = dict(rounds=4, eval_every=2, options=dict(seeds=1, epsilons=[1, 8], gammas=[0.5]))
QUICK_RUNTIME = "measured 14 s on 2 CPU cores (a fresh process, XLA's default flags)"
BUDGET = "iterations (each one communication round)"
RUNTIME = ("about 1.5 min on 2 CPU cores (measured 83 s: no noise and 5 values of ε, "
           "γ tuned over 2 values for each)")
OPTIONS = (
    Option("epsilons", [0.5, 1.0, 2.0, 4.0, 8.0], "privacy budgets ε (a no-noise run is added)",
           kind="floats", low=0.0, low_open=True),
    Option("delta", 1e-5, "δ", low=0.0, high=1.0, low_open=True, high_open=True),
    Option("noise", "model", "where the Gaussian noise goes", choices=("model", "update")),
    Option("clip", 1.0, "per-example gradient norm bound C", low=0.0, low_open=True),
    Option("batch", 16, "minibatch size b", low=1),
    Option("gammas", [0.5, 0.1], "step-size grid γ (tuned per ε on validation)", kind="floats",
           low=0.0, low_open=True),
    Option("validation", 0.2, "fraction of each client's training data for tuning", low=0.0,
           high=1.0, low_open=True, high_open=True),
    Option("seeds", 3, "seeds of the final runs", low=1),
)


def setup(cfg: Config, opts: dict) -> Context:
  """Digits over IID clients, softmax regression, the smallest clients' example counts (the
  accountant's m: on the fitting split for tuning runs, on all training data for the final)."""
  if cfg.dataset != "digits":
    raise ValueError(f"--dataset must be digits, got {cfg.dataset!r}.")
  ds = digits(num_clients=cfg.clients, partition="iid", seed=cfg.seed)
  model = softmax_regression(64, 10)
  params = model.init(jax.random.key(cfg.seed))
  d = num_params(params)
  if d % cfg.clients:
    raise ValueError(f"--clients must divide d = {d} (the permutation sketch), got "
                     f"{cfg.clients}.")
  fit, val = validation_split(ds.train, opts["validation"], cfg.seed)
  m_fit = int(np.min(np.asarray(fit.num_examples)))
  m = int(np.min(np.asarray(ds.train.num_examples)))
  if opts["batch"] > m_fit:
    raise ValueError(f"option 'batch' must be <= the smallest client's {m_fit} fitting "
                     f"examples, got {opts['batch']}.")
  ev = make_eval_fn(model)
  print(f"{NAME}: digits, {cfg.clients} clients (m ≥ {m} examples), d={d}, K={cfg.rounds}, "
        f"b={opts['batch']}, C={opts['clip']}, δ={opts['delta']:g}, noise on the "
        f"{opts['noise']}")
  return Context(ds, params, lambda st, test: ev(st.params, test),
                 {"loss": make_loss(model), "d": d, "m": (m_fit, m)}, fit=fit, val=val)


def _epsilons(opts: dict) -> dict:
  return {"no noise" if e is None else f"ε={e:g}": e for e in [None] + list(opts["epsilons"])}


def _algorithm(ctx: Context, cfg: Config, opts: dict, eps, gamma: float, m_client: int):
  """LDP-FedP3 at privacy budget ``eps`` (``None``: no noise) and its noise level σ."""
  sigma = 0.0 if eps is None else T.ldp_sigma(eps, opts["delta"], cfg.rounds, m_client,
                                              opts["clip"], opts["batch"], gamma, opts["noise"])
  return T.fedp3_theory(ctx.extra["loss"], gamma, batch_size=opts["batch"], clip=opts["clip"],
                        noise=None if eps is None else opts["noise"], sigma=sigma), sigma


def methods(ctx: Context, cfg: Config, opts: dict) -> dict:
  """One run per privacy budget (and one without noise), γ tuned over ``gammas``."""
  m_fit, m = ctx.extra["m"]
  return {label: Method(lambda gamma, run, eps=eps: _algorithm(
      ctx, cfg, opts, eps, gamma, m_fit if run.tuning else m)[0], opts["gammas"],
      label=lambda gamma: f"γ={gamma:g}", params_fn=lambda st: st)
      for label, eps in _epsilons(opts).items()}


def columns(label: str, tuned, ctx: Context, cfg: Config, opts: dict) -> dict:
  """ε, the σ it calibrates, and the uplink floats per iteration (d whatever the clients)."""
  eps = _epsilons(opts)[label]
  floats = tuned.records[0]["history"]["rounds"]["floats_up"][-1]
  return {"ε": eps, "σ": _algorithm(ctx, cfg, opts, eps, tuned.best, ctx.extra["m"][1])[1],
          "uplink floats / iteration": floats, "= d": floats == ctx.extra["d"]}


def report(results: dict, ctx: Context, cfg: Config, opts: dict) -> dict:
  """The paper's statements under the table, and utility against ε as a figure."""
  rows = results["table"].rows
  xs = [r["ε"] for r in rows if r["ε"] is not None]
  return {"table": Table(rows, ["ε", "γ", "σ", "test acc %", "s.e.",
                                "uplink floats / iteration", "= d"], note=(
      "the paper: utility O(C√(L d log(1/δ))/(mε)) — accuracy falls as ε shrinks; uplink d "
      "floats per iteration whatever n (Table C.3)")),
      "figures": [Figure("curves", dict(
          curves={f"LDP-FedP3 (noise on the {opts['noise']})":
                  (xs, [r["test acc %"] for r in rows if r["ε"] is not None])},
          xlabel=f"ε (δ = {opts['delta']:g})", ylabel="test accuracy %",
          title="LDP-FedP3: utility against privacy",
          baseline=("no noise", rows[0]["test acc %"])))]}


run = declared(NAME, OPTIONS, setup=setup, methods=methods, report=report,
               figure=lambda results, ctx, cfg, opts: [],
               tuning=Tuning(candidate="γ", column="test acc %",
                             config=lambda cfg, opts: tuning_config(cfg, fraction=1.0),
                             columns=columns))
