"""Figure 4 of the Sparse-ProxSkip paper (Meinhardt et al. 2024): its family on CIFAR-10 with
ResNet-18 (non-convex).

Setting (the Sparse-ProxSkip paper's appendix E): 10 clients, full participation, FedLab's
unbalanced Dirichlet split (label proportions Dirichlet(0.3), client sizes log-normal with
σ = 0.3), 90 % sparsity, minibatch local steps, gradient clipping, weight decay 1e-4,
flip/crop/normalise augmentation (inside ``jit``), p = 1/#local steps, 500 communication
rounds. Methods: Final-TopK (dense ProxSkip), FedHT, FedIHT, Accelerated-Server-Pruning,
RandProx-l1 (λ = ``lam``, default 1/(2N)), Sparse-ProxSkip-Local, Sparse-ProxSkip and FedAvg,
every model Top-K'd at evaluation; FedHT, FedIHT and FedAvg run rounds of ``local_steps``
local steps, the ProxSkip family rounds of Geometric(p) local steps. With ``--set search=N`` every
method is tuned by the paper's random search — learning rate, local steps ∈ {8, 16, …, 256},
batch size ∈ {32, 64}, clipping threshold log-uniform in [10, 200] — in two stages of N
candidates on a validation split of the clients' training data (candidates with the same
static local-step count and batch size run as one vmapped program); ``--set seeds=S`` runs
the chosen setting S times for the mean ± s.e. column. A declaration: the harness tunes, runs,
tabulates and plots every method alike.

``--paper figure4`` is that protocol (search=16). Without CIFAR-10 prepared for ``tfds``
(``--data-dir``), and in CI, a CPU-sized stand-in runs instead — digits (8×8 images, the same
unbalanced Dirichlet split) with a small CNN (5×5 convolutions of 8 and 16 channels, one 2×2
pool, 64 dense units: 20,522 parameters, every layer keeping weights under 90 % global Top-K),
20 rounds, crop-only augmentation (no flips on digits) — labelled as such. The paper shows a
figure only, so there are no numbers to print beside ours.

Options: see ``OPTIONS`` (``fedjaxsparse describe sparse_proxskip_cifar``).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fedjaxsparse.algorithms import proxskip as ps
from fedjaxsparse.algorithms.fedavg import clipped_sgd, fedavg
from fedjaxsparse.algorithms.fedht import fedht, fediht
from fedjaxsparse.ops.augment import CIFAR10_MEAN, CIFAR10_STD, crop_flip
from fedjaxsparse.data import load_dataset
from fedjaxsparse.evaluation import make_eval_fn
from fedjaxsparse.harness.options import Config, Option, name_list
from fedjaxsparse.harness.running import last, status
from fedjaxsparse.harness.experiment import Context, Method, Tuning, declared
from fedjaxsparse.harness.report import Figure, Table
from fedjaxsparse.models import get_model, make_loss
from fedjaxsparse.harness.protocol import Dimension, PaperConfig, load_or_standin
from fedjaxsparse.ops.sparsity import top_k
from fedjaxsparse.harness.tuning import Search, tuning_config

NAME = "sparse_proxskip_cifar"
DESCRIPTION = ("Sparse-ProxSkip (Meinhardt et al. 2024) Fig. 4: its family, ResNet-18 on "
               "CIFAR-10 (CPU stand-in: CNN on digits)")
DEFAULTS = dict(rounds=None, clients=10, dataset="cifar10", eval_every=None)
# --quick: the table's shape in well under two minutes on 2 CPU cores (QUICK_RUNTIME)
QUICK = dict(rounds=2, eval_every=2, clients=4, options=dict(local_steps=3))
QUICK_RUNTIME = "measured 45 s on 2 CPU cores (a fresh process, XLA's default flags; 8 methods)"
BUDGET = ("communication rounds for every method: ProxSkip-family rounds of Geometric(p) "
          "local steps (p = 1/local_steps), FedAvg rounds of local_steps steps; default 500 on "
          "CIFAR-10 (the paper), 20 on the CPU stand-in")
RUNTIME = ("CPU stand-in (no CIFAR-10 prepared): about 2-3 minutes (8 methods; measured "
           "3 min 5 s on 2 busy CPU cores); ResNet-18 on CIFAR-10 needs a GPU (the paper: up "
           "to 20 h per run on an A100)")
OPTIONS = (
    Option("model", None, "resnet18 or cnn (default: resnet18 on CIFAR-10, a small CNN on the "
           "stand-in)", kind="str", choices=("resnet18", "cnn")),
    Option("alpha", 0.3, "Dirichlet concentration of the label split", low=0.0, low_open=True),
    Option("sigma", 0.3, "sigma of the log-normal client sizes (FedLab's unbalance_sgm)",
           low=0.0),
    Option("sparsity", 0.9, "target sparsity", low=0.0, high=1.0, high_open=True),
    Option("lr", 0.05, "local step size (without a search)", low=0.0, low_open=True),
    Option("local_steps", 16, "(expected) local steps per round, 1/p (without a search)",
           low=1),
    Option("batch_size", 32, "minibatch size of local steps (without a search)", low=1),
    Option("clip", 10.0, "gradient clipping threshold (without a search)", low=0.0,
           low_open=True),
    Option("clip_mode", "norm", "gradient clipping: global norm or per value",
           choices=("norm", "value")),
    Option("lam", None, "RandProx-l1 weight (default: the Sparse-ProxSkip paper's literal 1/(2N))", kind="float",
           low=0.0),
    Option("weight_decay", 1e-4, "l2 weight decay", low=0.0),
    Option("augment", True, "random crop (and, on CIFAR, flip) of every local minibatch"),
    Option("methods", "", "comma list of the methods to run (default: all, the figure's "
           "order)", kind="str", identity=False),
    Option("search", 0, "candidates per stage of the two-stage random search run for every "
           "method (0: the fixed values above)", low=0),
    Option("search_lr", [1e-3, 0.5], "learning-rate range of the search (log-uniform; the "
           "paper does not state it)", kind="floats", low=0.0, low_open=True),
    Option("search_steps", [8, 256], "local-step range of the search: the powers of two in it, "
           "uniformly (the paper's set {8, 16, ..., 256})",
           kind="floats", low=1.0),
    Option("repetitions", 1, "seeds per search candidate", low=1),
    Option("validation", 0.2, "fraction of each client's training examples held out for "
           "tuning", low=0.0, high=1.0, low_open=True, high_open=True),
    Option("seeds", 1, "final runs per method for the mean ± s.e. column", low=1,
           identity=False),
    Option("eval_batch_size", 500, "evaluation batch size", low=1, identity=False),
)
STAND_IN_ROUNDS, STAND_IN_EVAL_EVERY = 20, 5
ASP, SPS_LOCAL, SPS = "Accelerated-Server-Pruning", "Sparse-ProxSkip-Local", "Sparse-ProxSkip"
METHODS = ("Final-TopK", "FedHT", "FedIHT", ASP, "RandProx-l1", SPS_LOCAL, SPS, "FedAvg")
FEDAVG_STYLE = ("FedHT", "FedIHT", "FedAvg")  # rounds of a static number of local steps
PAPERS = {"figure4": PaperConfig(
    "figure4",
        "the Sparse-ProxSkip paper's appendix E, Figure 4 (CIFAR-10, ResNet-18)", dataset="cifar10",
    standin="digits", clients=10, rounds=500, eval_every=25,
    options={"search": 16, "alpha": 0.3, "sigma": 0.3, "sparsity": 0.9, "augment": True},
    paper={}, unit="test accuracy (the paper shows Figure 4 only, no table)",
    deviations="the learning-rate range and the number of search candidates are not stated "
               "(log-uniform [1e-3, 0.5] and 16 per stage here); GroupNorm ResNet-18 (batch "
               "statistics do not average across clients)")}


def _rising(record: dict) -> str | None:
  """A status for a run whose training loss ended above twice its first value (diverging
  without a NaN, e.g. at a step size too large for the model), else ``None``."""
  losses = [v for v in record["history"]["rounds"].get("loss", []) if v is not None
            and np.isfinite(v)]
  if len(losses) >= 2 and losses[-1] > 2 * losses[0]:
    return f"diverging: train loss {losses[0]:.3g} -> {losses[-1]:.3g}"
  return None


def empty_layers(params, sparsity: float) -> list[str]:
  """The weight matrices and kernels (leaves of rank ≥ 2) of which the global Top-K at
  ``sparsity`` keeps no entry — layers a magnitude-pruned ReLU network loses entirely."""
  kept = top_k(params, sparsity=sparsity)
  return [jax.tree_util.keystr(path) for (path, a), b in
          zip(jax.tree_util.tree_leaves_with_path(params), jax.tree.leaves(kept))
          if np.ndim(a) >= 2 and not np.any(np.asarray(b) != 0)]


def _load(cfg: Config, name: str, opts: dict):
  kw = dict(num_clients=cfg.clients, partition="dirichlet_lognormal", alpha=opts["alpha"],
            sigma=opts["sigma"], seed=cfg.seed)
  if name == "digits":  # the stand-in: 8×8×1 images
    ds = load_dataset("digits", **kw)
    as_images = lambda d: d._replace(x=d.x.reshape(d.x.shape[:2] + (8, 8, 1)))
    return ds._replace(train=as_images(ds.train), test=as_images(ds.test))
  ds = load_dataset(name, **kw, **({"data_dir": cfg.data_dir} if cfg.data_dir else {}))
  if name == "cifar10":  # the deterministic part of the augmentation, on train and test
    m, s = jnp.asarray(CIFAR10_MEAN), jnp.asarray(CIFAR10_STD)
    norm = lambda d: d._replace(x=(d.x - m) / s * d.mask[..., None, None, None])
    ds = ds._replace(train=norm(ds.train), test=norm(ds.test))
  return ds


def setup(cfg: Config, opts: dict) -> Context:
  """The data (CIFAR-10 or its stand-in), the model, its regularised loss, the augmentation and
  the Top-K'd evaluation; the stand-in's shorter budget when it runs."""
  paper = PAPERS["figure4"] if cfg.dataset == "cifar10" else None
  ds, standin = load_or_standin(paper, cfg.dataset, cfg.data_dir,
                                lambda name: _load(cfg, name, opts))
  if standin:
    label, default_model = f"{ds.name} (CPU stand-in for CIFAR-10)", "cnn"
    rounds, eval_every = cfg.rounds or STAND_IN_ROUNDS, cfg.eval_every or STAND_IN_EVAL_EVERY
  else:
    label, default_model = ds.name, "resnet18"
    rounds, eval_every = cfg.rounds or 500, cfg.eval_every or 25
  model_name = opts["model"] or default_model
  # the stand-in's CNN pools once, after its second convolution: pooled after each, its dense
  # layer's fan-in (2·2·16) made those weights large enough that 90 % global Top-K of the
  # initial model kept none of the second convolution, and the sparse-trained methods stayed
  # at chance (measured: 8.9 % / 10.1 %); pooled once, every layer keeps weights
  small = ({"channels": (8, 16), "dense": 64, "pool_each": False}
           if standin and model_name == "cnn" else {})
  model = get_model(model_name, ds.train.x.shape[2:], ds.num_classes, **small)
  wd = opts["weight_decay"]
  base_loss = make_loss(model)
  loss = lambda p, x, y, m: base_loss(p, x, y, m) + 0.5 * wd * sum(  # noqa: E731
      jnp.sum(jnp.square(a)) for a in jax.tree.leaves(p))
  augment = None
  if opts["augment"]:
    augment = crop_flip(pad=1, flip=False) if standin else crop_flip(pad=4, flip=True)
  print(f"{NAME}: {label}, model={model_name}, {ds.num_clients} clients, "
        f"sparsity={opts['sparsity']:.0%}, augmentation={'on' if augment else 'off'}, "
        f"{rounds} communication rounds")
  return Context(ds, model.init(jax.random.key(cfg.seed)),
                 make_eval_fn(model, batch_size=opts["eval_batch_size"]),
                 extra=dict(loss=loss, augment=augment, label=label, model=model_name,
                            standin=standin, paper=paper),
                 rounds=rounds, eval_every=eval_every)


def methods(ctx: Context, cfg: Config, opts: dict) -> dict:
  """Every chosen method (the figure's order), evaluated Top-K'd; with ``search`` > 0 each is
  tuned over the paper's space (learning rate, clipping threshold, local steps, batch size;
  the last two static), else run at the options' values."""
  loss, augment, sparsity = ctx.extra["loss"], ctx.extra["augment"], opts["sparsity"]
  mode = opts["clip_mode"]
  lam = opts["lam"] if opts["lam"] is not None else 1.0 / (2 * ctx.data.num_clients)

  def build(name, c):
    """Method ``name`` at candidate ``c``: ``lr`` and ``clip`` may be traced (a search),
    ``local steps`` and ``batch`` are static."""
    lr, clip, steps, batch = c["lr"], c["clip"], c["local steps"], c["batch"]
    if name in FEDAVG_STYLE:   # rounds of `steps` local steps
      kw = dict(batch_size=batch, weighting="uniform", augment=augment)
      return {"FedAvg": lambda: fedavg(loss, clipped_sgd(lr, clip, mode), local_steps=steps,
                                       **kw),
              "FedHT": lambda: fedht(loss, lr, steps, sparsity, clip=clip, clip_mode=mode, **kw),
              "FedIHT": lambda: fediht(loss, lr, steps, sparsity, clip=clip, clip_mode=mode,
                                       **kw)}[name]()
    kw = dict(batch_size=batch, clip=clip, clip_mode=mode, augment=augment, form="round")
    p = 1.0 / steps
    return {"Final-TopK": lambda: ps.proxskip(loss, lr, p, **kw),
            "RandProx-l1": lambda: ps.randprox_l1(loss, lr, p, lam, **kw),
            ASP: lambda: ps.accelerated_server_pruning(loss, lr, p, sparsity, **kw),
            SPS_LOCAL: lambda: ps.sparse_proxskip_local(loss, lr, p, sparsity, **kw),
            SPS: lambda: ps.sparse_proxskip(loss, lr, p, sparsity, **kw)}[name]()

  search = None
  if opts["search"] > 0:
    (lo_lr, hi_lr), (lo_s, hi_s) = opts["search_lr"], opts["search_steps"]
    search = Search({"lr": Dimension(lo_lr, hi_lr), "clip": Dimension(10.0, 200.0),
                     "local steps": Dimension(lo_s, hi_s, integer=True,
                                              choices=_powers_of_two(lo_s, hi_s)),
                     "batch": Dimension(32, 64, choices=(32, 64))},
                    static=("local steps", "batch"), samples=(opts["search"],) * 2,
                    repetitions=opts["repetitions"])
  fixed = {"lr": opts["lr"], "clip": opts["clip"], "local steps": opts["local_steps"],
           "batch": opts["batch_size"]}
  chosen = name_list(opts["methods"], "methods", METHODS, default=list(METHODS))
  top_k_params = lambda s: top_k(s.params, sparsity=sparsity)  # noqa: E731
  return {m: Method(lambda c, run, m=m: build(m, c), grid=(fixed,), params_fn=top_k_params,
                    search=search) for m in METHODS if m in chosen}


def _columns(method: str, tuned, ctx: Context, cfg: Config, opts: dict) -> dict:
  """The first seed's final and best test accuracy (Top-K'd model), final training loss and
  uplink bits per client."""
  rec = tuned.records[0]
  ev = rec["history"]["evals"]
  ev["uplink_bits_per_client"] = [b / ctx.data.num_clients for b in ev["uplink_bits"]]
  return {"final accuracy": last(ev.get("accuracy", [])),
          "best accuracy": max(ev.get("accuracy", []), default=None),
          "final train loss": last(rec["history"]["rounds"].get("loss", [])),
          "uplink bits/client": last(ev["uplink_bits_per_client"])}


def report(results: dict, ctx: Context, cfg: Config, opts: dict) -> dict:
  """A status column when a run diverged or its training loss climbed, the note on layers the
  initial model's Top-K empties, and every method's setting."""
  records, sparsity = results["methods"], opts["sparsity"]
  rows = [dict(r) for r in results["table"].rows]
  rising = {m: _rising(r) for m, r in records.items()}
  if any(r["diverged"] for r in records.values()) or any(rising.values()):
    for row in rows:
      rec = records[row["method"]]
      row["status"] = status(rec) if rec["diverged"] else (rising[row["method"]] or "ok")
  empty = empty_layers(ctx.params, sparsity)
  notes = []
  if empty:
    notes.append(
        f"note: the global Top-K of the initial model at {sparsity:.0%} sparsity keeps no "
        f"weight of {', '.join(empty)}: a ReLU network with an empty layer has a constant "
        f"output and no gradient through it, so the methods that train the sparse model "
        f"({SPS_LOCAL}, {SPS}) cannot learn on this model (train loss ln 10); the paper's "
        f"ResNet-18 keeps weights in every layer — run it with --set model=resnet18, or "
        f"lower --set sparsity")
  paper = ctx.extra["paper"]
  if paper is not None and cfg.paper:
    notes.append(f"{paper.source}: the paper shows a figure only (no numbers to print beside "
                 f"ours); protocol deviations: {paper.deviations}")
  best = {row["method"]: results["tuned"][row["method"]].best for row in rows}
  return {"dataset": ctx.extra["label"], "standin": ctx.extra["standin"],
          "model": ctx.extra["model"], "budget": "communication rounds",
          "rounds": ctx.rounds, "table": Table(rows, note="\n".join(notes) or None),
          "tuned": {m: t.best for m, t in results["tuned"].items() if t.search is not None},
          "settings": {m: {"lr": c["lr"], "clip": c["clip"], "local_steps": c["local steps"],
                           "batch_size": c["batch"]} for m, c in best.items()},
          "empty_layers_at_init": empty}


def figure(results: dict, ctx: Context, cfg: Config, opts: dict) -> list:
  """Figure 4's accuracy curves (against rounds and uplink bits per client) and the control
  variates of the ProxSkip family."""
  records, label = results["methods"], ctx.extra["label"]
  return [Figure("methods", dict(methods=records, metric="accuracy",
                                 title=f"{label}, {ctx.extra['model']}, "
                                       f"{opts['sparsity']:.0%} sparsity",
                                 x="round", bits="uplink_bits_per_client")),
          Figure("series", dict(methods={m: r for m, r in records.items()
                                         if m not in FEDAVG_STYLE},
                                names=["sum_h_norm", "mean_h_norm", "loss"],
                                title="control variates", x="round", colors=list(records)),
                 suffix="_h")]


def _powers_of_two(low: float, high: float) -> tuple[int, ...]:
  """The powers of two in ``[low, high]`` — the paper's local-step set {8, 16, …, 256} for the
  default range (at least ``low`` rounded up to one, when the range holds none)."""
  out = tuple(2 ** k for k in range(0, 31) if low <= 2 ** k <= high)
  return out or (int(np.ceil(low)),)


run = declared(NAME, OPTIONS, setup=setup, methods=methods, report=report, figure=figure,
               papers=PAPERS, tuning=Tuning(column="accuracy (mean over seeds)", scale=1.0,
                                            config=lambda cfg, opts: tuning_config(cfg, 1.0),
                                            columns=_columns))
