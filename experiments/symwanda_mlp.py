"""SymWanda (Yi and Richtárik 2025; chapter 6 of Kai Yi's dissertation) at a scale a CPU reaches:
one-shot post-training pruning of an MLP on the embedded real digits with **planted outlier
input channels** — the "outlier feature" phenomenon of LLMs to which the chapter attributes the
activation term (Wanda, RIA) and the α = 0.5 optimum (Table 6.3).

Protocol: scikit-learn's digits (1,797 real 8×8 images), 75/25 train/test split (seeded); the
MLP 64-256-256-10 (ReLU) trained full-batch with Adam (``steps``). Outlier model: ``outliers``
input channels (drawn with the seed) are multiplied by ``scale`` in training and test alike, so
the network learns small weights on large inputs; the control model sees the plain inputs.
Each model is then pruned in one call (:func:`fedjaxsparse.pruning.posttrain.prune_model`, every dense
layer, layer-sequential calibration on ``calib`` training images) at 50/60/70 % unstructured
(per-output groups) and 2:4 / 4:8, with magnitude, Wanda (α = 1), RIA (α = 0.5), stochRIA
(β = 0.1, α = 1; mean over ``seeds``) and Wanda's α sweep {0, 0.5, 1, 2}; the table gives test
accuracy (mean over ``seeds`` model seeds for everything). The chapter's claims, as directions:
activation-aware scores beat magnitude when inputs have outliers; RIA ≥ Wanda; α = 0.5 is best.

Source for the team: seed 001 chapter 6.
"""
from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjaxsparse.pruning import posttrain, scores
from fedjaxsparse.harness.options import Config, Option
from fedjaxsparse.harness.experiment import Context, Trial, TrialRun, declared
from fedjaxsparse.harness.report import Figure, Table
from fedjaxsparse.models import mlp
from fedjaxsparse.harness.protocol import check_claim

NAME = "symwanda_mlp"
DESCRIPTION = ("SymWanda (Yi and Richtárik 2025): one-shot pruning of a digits MLP with "
               "planted outlier channels")
DEFAULTS = dict(rounds=None, eval_every=None)
# --quick: the table's shape in well under two minutes on 2 CPU cores (QUICK_RUNTIME)
QUICK = dict(options=dict(seeds=1, steps=60, hidden=16, calib=32))
QUICK_RUNTIME = "measured 13 s on 2 CPU cores (a fresh process, XLA's default flags)"
BUDGET = "none (one-shot pruning of a centrally trained model)"
RUNTIME = "about 30 s on 2 CPU cores (measured 28 s)"
SETTINGS = (0.5, 0.6, 0.7, (2, 4), (4, 8))
OPTIONS = (
    Option("outliers", 4, "number of planted outlier input channels", low=0, high=64),
    Option("scale", 20.0, "their scale factor", low=1.0),
    Option("steps", 400, "Adam steps (full batch) to train each model", low=1),
    Option("calib", 128, "calibration images", low=1),
    Option("seeds", 3, "model seeds (and stochRIA draws)", low=1),
    Option("hidden", 256, "hidden width", low=4),
)


def _label(x) -> str:
  return f"{x:.0%}" if isinstance(x, float) else f"{x[0]}:{x[1]}"


def _methods() -> dict[str, object]:
  sb = scores.by_name
  out = {"Magnitude": sb("magnitude"), "Wanda": sb("wanda", alpha=1.0),
         "RIA": sb("ria", alpha=0.5), "stochRIA": sb("stochria", alpha=1.0, beta=0.1)}
  out.update({f"Wanda α={a:g}": sb("wanda", alpha=a) for a in (0.0, 0.5, 2.0)})
  return out


def _train(model, x, y, steps: int, seed: int):
  params = model.init(jax.random.key(seed))
  opt = optax.adam(3e-3)

  @jax.jit
  def step(p, s):
    loss = lambda q: jnp.mean(model.per_example_loss(model.apply(q, x), y))  # noqa: E731
    g = jax.grad(loss)(p)
    u, s = opt.update(g, s, p)
    return optax.apply_updates(p, u), s

  state = opt.init(params)
  for _ in range(steps):
    params, state = step(params, state)
  return params


def _accuracy(model, params, x, y) -> float:
  return float(jnp.mean(jnp.argmax(model.apply(params, x), -1) == y))


def setup(cfg: Config, opts: dict) -> Context:
  """The digits split, the planted outlier channels and the MLP (printed once)."""
  from sklearn.datasets import load_digits
  from sklearn.model_selection import train_test_split
  d = load_digits()
  x = (d.data / 16.0).astype(np.float32)
  xtr, xte, ytr, yte = train_test_split(x, d.target.astype(np.int32), test_size=0.25,
                                        random_state=cfg.seed, stratify=d.target)
  rng = np.random.default_rng(cfg.seed)
  chans = np.sort(rng.choice(64, opts["outliers"], replace=False))
  gain = np.ones(64, np.float32)
  gain[chans] = opts["scale"]
  model = mlp((64,), 10, hidden=(opts["hidden"],) * 2)
  print(f"{NAME}: digits {len(xtr)}/{len(xte)}, MLP 64-{opts['hidden']}-{opts['hidden']}-10, "
        f"outlier channels {chans.tolist()} ×{opts['scale']:g}, {opts['calib']} calibration "
        f"images, layer-sequential, {opts['seeds']} seeds")
  return Context(None, None, None, dict(xtr=xtr, xte=xte, ytr=ytr, yte=yte, chans=chans,
                                        gains={"outliers": gain,
                                               "plain": np.ones(64, np.float32)},
                                        model=model))


def methods(ctx: Context, cfg: Config, opts: dict) -> dict[str, Trial]:
  """One trial per model — trained on inputs with the planted outliers, and on the plain
  inputs — each pruned by every score at every setting."""
  return {kind: Trial(lambda run, kind=kind: _prune_all(ctx.extra, kind, opts, run))
          for kind in ("outliers", "plain")}


def _prune_all(P_: dict, kind: str, opts: dict, run: TrialRun) -> dict:
  """Train the ``kind`` model with the run's seed, prune it in one call with every score at
  every setting (stochRIA's draws keyed by the seed's index): the test accuracies."""
  model, g = P_["model"], P_["gains"][kind]
  a_tr, a_te = jnp.asarray(P_["xtr"] * g), jnp.asarray(P_["xte"] * g)
  params = _train(model, a_tr, jnp.asarray(P_["ytr"]), opts["steps"], run.seed)
  calib, acc = [a_tr[:opts["calib"]]], {}
  for name, fn in _methods().items():
    for x_ in SETTINGS:
      if name.startswith("Wanda α") and not isinstance(x_, float):
        continue
      kw = {"sparsity": x_} if isinstance(x_, float) else {"nm": x_}
      pruned, _ = posttrain.prune_model(model.apply, params, calib, fn,
                                        key=jax.random.key(100 + run.index), **kw)
      acc[f"{name} @ {_label(x_)}"] = _accuracy(model, pruned, a_te, P_["yte"])
  return {"dense": _accuracy(model, params, a_te, P_["yte"]), "pruned": acc}


def table(records: dict, contexts: list, cfg: Config, opts: dict) -> dict:
  """Test accuracy (mean over seeds) of every score and setting on both models, and the
  chapter's directions checked on them."""
  frac_of = lambda kind, key: np.mean([r["pruned"][key] if key != "dense" else r["dense"]
                                       for r in records[kind]["seeds"]])
  mean_of = lambda kind, key: 100 * frac_of(kind, key)
  rows = [{"method": "Dense", "setting": "-",
           "test acc % (outliers)": mean_of("outliers", "dense"),
           "test acc % (plain)": mean_of("plain", "dense")}]
  for name in _methods():
    for x_ in SETTINGS:
      key = f"{name} @ {_label(x_)}"
      if key in records["plain"]["seeds"][0]["pruned"]:
        rows.append({"method": name, "setting": _label(x_),
                     "test acc % (outliers)": mean_of("outliers", key),
                     "test acc % (plain)": mean_of("plain", key)})
  mean = lambda m, k="outliers": np.mean([frac_of(k, f"{m} @ {_label(x_)}")
                                          for x_ in SETTINGS[:3]])  # over 50/60/70 %
  claims = [
      check_claim("with outlier channels, Wanda and RIA beat magnitude pruning (mean over "
                  "50/60/70 %)", min(mean("Wanda"), mean("RIA")) > mean("Magnitude")),
      check_claim("alpha = 0.5 is Wanda's best exponent (Table 6.3; mean over 50/60/70 %)",
                  mean("Wanda α=0.5") >= max(mean("Wanda α=0"), mean("Wanda α=2"))),
      check_claim("RIA >= Wanda (Tables 6.2/6.4; mean over 50/60/70 %, outliers)",
                  mean("RIA") >= mean("Wanda"))]
  return {"table": Table(rows, note="\n".join(c["text"] for c in claims)), "claims": claims,
          "outlier_channels": contexts[-1].extra["chans"].tolist(), "scale": opts["scale"]}


def figure(results: dict, ctx: Context, cfg: Config, opts: dict) -> Figure:
  """Test accuracy against unstructured sparsity, both models, beside the dense model's."""
  rows = {(r["method"], r["setting"]): r for r in results["table"].rows}
  curves = {f"{m} ({k})": ([0.5, 0.6, 0.7], [rows[(m, _label(x_))][f"test acc % ({k})"]
                                             for x_ in SETTINGS[:3]])
            for m in ("Magnitude", "Wanda", "RIA") for k in ("outliers", "plain")}
  return Figure("curves", dict(
      curves=curves, xlabel="unstructured sparsity", ylabel="test accuracy %",
      title="One-shot pruning of a digits MLP: planted outlier channels vs plain",
      baseline=("dense (outliers)", rows[("Dense", "-")]["test acc % (outliers)"]),
      logx=False))


run = declared(NAME, OPTIONS, setup=setup, methods=methods, table=table, figure=figure)
