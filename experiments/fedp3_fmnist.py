"""The experiments of FedP3 (Yi et al., ICLR 2024; chapter 4 of Kai Yi's dissertation): its layer
policies against FedAvg (Figs. 4.2-4.3), the local pruning rules (Table 4.2), the global
pruning ratio (Fig. 4.4) and the aggregation rules (Fig. 4.5), on the real Fashion-MNIST (the
Debian package), the embedded digits, or EMNIST-L / CIFAR-10 / CIFAR-100 when prepared with tfds.
EMNIST-L is the chapter's (Table C.1: 10 classes, 48K + 8K examples, 392 / 168 per client):
``--dataset emnist_l10``, EMNIST Letters' first ten letters (its ``--paper *_emnist_l10``
configurations); ``--dataset emnist_l`` runs all 26 letters.

Protocol (the chapter's): train and test pooled and dealt to 100 clients,
each client's share split 70 % / 30 % into its own train and test data; S1 — class-wise,
5 classes per client (15 for CIFAR-100; NIID-Bench's "#C = k" deal); S2 — FedCR's Dirichlet
(every client draws its class proportions from Dirichlet(0.5), 0.3 for CIFAR-100, and is filled
without replacement to an equal size: :func:`~fedjaxsparse.data.partitions.hsu_dirichlet_partition`);
K = 10 local SGD steps on minibatches of 48; the chapter's CNN (Table C.2,
:func:`~fedjaxsparse.models.fedp3_cnn`; the MLP 784-1024-1024-1024-10 for EMNIST-L); global
pruning ratio r = 0.9 on the layers a client does not train; the learning rate of every method
tuned alike over ``lrs`` (the paper's ×5 grid 1e-5…3.125e-2; its choices are not reported) on a
validation split of each client's training data; the metric is the mean over clients of each
client's deployed model (its ``L_i`` layers dense, the others P_i-pruned) on its own test
split (FedAvg: the global model). Participation is not stated; the authors' code trains every
client every round (``cohort=0``, the default). The CPU default is reduced and labelled:
fewer rounds (the paper: 500), a narrow CNN (``channels``, ``hidden``), one seed.

Studies (``--set study=``):
  ``policies`` — FedAvg, OPU3, OPU2, LowerB (Fig. 4.2 left, 4.3): "OPU3 comparable to FedAvg
  with 20 % less communication";
  ``rules`` — Table 4.2: Fixed, Uniform and Ordered Dropout at p = 0.9 and 0.7 under
  ``policy`` (the row labels' p read as the lower end of q ~ U[p, 1], ``q_law=lower``, or a
  fixed ratio, ``q_law=fixed``: the paper is ambiguous);
  ``ratio`` — Fig. 4.4: r = 1.0 / 0.9 / 0.7 / 0.5 under ``policy``;
  ``aggregation`` — Fig. 4.5: OPU1-2-3 and OPU2-3, simple (S) and weighted (W);
  ``resnet`` — Table 4.1 (CIFAR-10/100, ResNet-18-GN, layers at depth 2): every client drops
  block B2 or B3 whole ("-B2-B3 (full)"), or the first or last two convolutions of B2 / B3
  ("part": one BasicBlock's conv1/conv2 and norms; projection shortcuts are kept, so the
  network stays valid), neither training nor receiving them;
  ``fedcr`` — Fig. 4.2 (right): FedCR and FedCR-OPU3
  (:func:`fedjaxsparse.algorithms.fedcr.fedcr`, its ``train_layers`` drawn by the
  OPU3 policy over the shared body's layers — the last, the Gaussian projection, always sent),
  on FedCR's networks (:func:`fedjaxsparse.models.split.fedcr_net`: its Fashion-MNIST or CIFAR
  CNN, an MLP of ``hidden`` for EMNIST-L) with FedCR's README values (β₂ = 1, batch 48,
  gradients clipped at 10, ``fedcr_epochs`` local epochs, ``fedcr_samples`` draws of z) and
  its β tuned with the learning rate over ``betas`` (the chapter: {1e-4, 5e-4, 1e-3, 5e-3,
  1e-2}); every client's head is fine-tuned on its own training data before evaluation (FedCR's
  last round, ``finetune_epochs``).

Comm is reported as the paper counts it (the fraction of layers uploaded) and honestly (floats
uploaded per round relative to FedAvg's), plus the deployed model size.

Source for the team: seed 001 chapter 4; spec ``seed001_ch4_ch6.md`` §A.10 (experiments),
§A.10.1-§A.10.2 (protocol).
"""
from __future__ import annotations

import dataclasses
import jax
import numpy as np
import optax

from fedjaxsparse.ops import layer_groups as LY
from fedjaxsparse.algorithms import fedp3 as F
from fedjaxsparse.algorithms.fedcr import fedcr
from fedjaxsparse.algorithms.representation import make_fine_tuned_eval_fn
from fedjaxsparse.data.federated import federate
from fedjaxsparse.data.registry import load_arrays
from fedjaxsparse.data.partitions import hsu_dirichlet_partition, label_count_partition
from fedjaxsparse.evaluation import make_personal_eval_fn
from fedjaxsparse.harness.options import Config, Option, name_list
from fedjaxsparse.harness.experiment import Context, Method, Tuning, declared
from fedjaxsparse.harness.report import Figure, Table
from fedjaxsparse.models import fedp3_cnn, make_loss, mlp, resnet18
from fedjaxsparse.models.split import FEDCR_CONV, fedcr_net
from fedjaxsparse.harness.protocol import PaperConfig

NAME = "fedp3_fmnist"
DESCRIPTION = ("FedP3 (Yi et al., ICLR 2024): layer policies, local pruning rules, global "
               "ratios and aggregations vs FedAvg")
DEFAULTS = dict(rounds=30, clients=100, dataset="fashion_mnist", eval_every=10,
                data_dir=None)
# --quick: the table's shape in well under two minutes on 2 CPU cores (QUICK_RUNTIME)
QUICK = dict(dataset="digits", clients=10, rounds=2, eval_every=1, options=dict(
    splits="S2", steps=2, batch=16, lrs=[0.1]))
QUICK_RUNTIME = "measured 23 s on 2 CPU cores (a fresh process, XLA's default flags)"
BUDGET = "communication rounds per method"
RUNTIME = ("about 2.5-3 hours on 2 CPU cores for the default study (4 methods x 2 splits, "
           "each 2 tuning runs of 15 rounds and a 30-round run, at about 20 s per round of 100 "
           "clients; measured: FedAvg, 4 rounds in 80 s on the real Fashion-MNIST); the --quick "
           "setting shows the table's shape")
DATA = {  # name -> (classes, S1 classes per client, S2 Dirichlet α, model)
    "fashion_mnist": (10, 5, 0.5, "cnn"), "fashion_mnist_standin": (10, 5, 0.5, "cnn"),
    "digits": (10, 5, 0.5, "mlp_small"),
    "emnist_l10": (10, 5, 0.5, "mlp"), "emnist_l": (26, 5, 0.5, "mlp"), "cifar10": (10, 5, 0.5, "cnn"),
    "cifar100": (100, 15, 0.3, "cnn")}
STUDIES = {  # name -> {method: (policy, keep, local rule, p, aggregation)} (None: option)
    "policies": {"FedAvg": ("fedavg", 1.0, "fixed", None, "simple"),
                 "OPU3": (None, None, "fixed", None, "simple"),
                 "OPU2": ("opu2", None, "fixed", None, "simple"),
                 "LowerB": ("lowerb", None, "fixed", None, "simple")},
    "rules": {"Fixed": (None, None, "fixed", None, "simple"),
              "Uniform (p=0.9)": (None, None, "uniform", 0.9, "simple"),
              "Ordered Dropout (p=0.9)": (None, None, "ordered_dropout", 0.9, "simple"),
              "Uniform (p=0.7)": (None, None, "uniform", 0.7, "simple"),
              "Ordered Dropout (p=0.7)": (None, None, "ordered_dropout", 0.7, "simple")},
    "ratio": {f"r={r}": (None, r, "fixed", None, "simple") for r in (1.0, 0.9, 0.7, 0.5)},
    "aggregation": {"S123": ("opu1-2-3", None, "fixed", None, "simple"),
                    "W123": ("opu1-2-3", None, "fixed", None, "weighted"),
                    "S23": ("opu2-3", None, "fixed", None, "simple"),
                    "W23": ("opu2-3", None, "fixed", None, "weighted")},
    "resnet": {"Full": ("fedavg", 1.0, "fixed", None, "simple"),
               "-B2-B3 (full)": ("drop:B2|B3", 1.0, "fixed", None, "simple"),
               "-B2 (part)": ("drop:B2.1|B2.2", 1.0, "fixed", None, "simple"),
               "-B3 (part)": ("drop:B3.1|B3.2", 1.0, "fixed", None, "simple")},
    "fedcr": {"FedCR": ("fedavg", 1.0, "fixed", None, "simple"),     # every body layer sent
              "FedCR-OPU3": ("opu3", 1.0, "fixed", None, "simple")}}
RESNET_BLOCKS = {  # Table 4.1's block names -> the main-path layers they drop (shortcuts kept)
    "B2": ("stage2_block1", "stage2_block2"), "B3": ("stage3_block1", "stage3_block2"),
    "B2.1": ("stage2_block1",), "B2.2": ("stage2_block2",), "B3.1": ("stage3_block1",),
    "B3.2": ("stage3_block2",)}
CLAIMS = {
    "policies": "OPU3 comparable to FedAvg with 80 % of the layers sent (l. 1268); S1 vs S2 "
                "gap 3.55 % averaged over LowerB/OPU2/OPU3 (l. 1285)",
    "rules": "Fixed best in every visible cell; Ordered Dropout no better than Uniform; the "
             "Uniform−OD gap shrinks from p = 0.9 to 0.7 (l. 1312)",
    "ratio": "vs r = 1.0, averaged over 4 datasets × 2 splits: −5.32 % at 0.9, −12.86 % at "
             "0.7, −27.76 % at 0.5 (l. 1298)",
    "aggregation": "weighted beats simple by 1.01 % (CIFAR-10), 1.05 % (CIFAR-100); OPU2-3 "
                   "beats OPU1-2-3 by 1.89 % (l. 1329)",
    "resnet": "part variants lose 1.03 % on average, the full variant 6.32 %; -B3 (part) beats "
              "Full on CIFAR-10; saving 6.25 % / 12.5 % of the layers (l. 1275-1287)",
    "fedcr": "FedCR-OPU3 loses 2.56 % (S1) / 3.20 % (S2) against FedCR, averaged over the 4 "
             "data sets, with 20 % less communication (l. 1285)"}
OPTIONS = (
    Option("study", "policies", "which figure/table", choices=tuple(STUDIES)),
    Option("splits", "S1,S2", "comma list of S1 (class-wise) and S2 (Dirichlet)", kind="str"),
    Option("methods", "", "comma list restricting the study's methods (empty: all)",
           kind="str"),
    Option("policy", "opu3", "layer policy of the rules/ratio studies",
           choices=tuple(F.POLICIES)),
    Option("keep", 0.9, "global pruning ratio r (kept fraction of the non-trained layers)",
           low=0.0, high=1.0),
    Option("q_law", "lower", "a rule's p: q ~ U[p, 1] (lower) or q = p (fixed)",
           choices=("lower", "fixed")),
    Option("train_non_selected", True, "train the pruned layers locally (prose) or freeze "
           "them (Alg. 6)"),
    Option("cohort", 0, "clients per round (0: all, the authors' code)", low=0),
    Option("steps", 10, "local steps K", low=1),
    Option("batch", 48, "minibatch size", low=1),
    Option("lrs", [0.03125, 0.00625], "learning-rate grid (the paper's ×5 grid's top)",
           kind="floats", low=0.0, low_open=True),
    Option("channels", 16, "CNN channels (paper: 64)", low=1),
    Option("hidden", "128,128", "hidden widths: CNN FC layers (paper: 1024,1024) or MLP "
           "(paper: 1024,1024,1024)", kind="str"),
    Option("validation", 0.1, "fraction of each client's training data for tuning", low=0.0,
           high=1.0, low_open=True, high_open=True),
    Option("seeds", 1, "seeds of the final runs", low=1),
    Option("betas", [1e-3], "FedCR's β grid, tuned with the learning rate (study fedcr; the "
           "chapter: 1e-4,5e-4,1e-3,5e-3,1e-2)", kind="floats", low=0.0),
    Option("fedcr_dim", 16, "FedCR's representation dimension d (its code: 256)", low=1),
    Option("fedcr_epochs", 1, "FedCR's local epochs (its code: 2)", low=1),
    Option("fedcr_samples", 2, "FedCR's draws of z per example (its code: 15)", low=1),
    Option("finetune_epochs", 2, "epochs of FedCR's final head fine-tuning (its code: 10)",
           low=1),
)
_FEDCR_PROTOCOL = {"betas": [1e-4, 5e-4, 1e-3, 5e-3, 1e-2], "fedcr_dim": 256, "fedcr_epochs": 2,
                "fedcr_samples": 15, "finetune_epochs": 10}
_PROTOCOL = {"channels": 64, "lrs": [3.125e-2, 6.25e-3, 1.25e-3], "seeds": 3}
PAPERS = {
    f"{study}_{ds}": PaperConfig(
        f"{study}_{ds}",
            f"K. Yi's dissertation (FedP3) ch. 4, {study} ({ds})", dataset=ds, standin=None,
        clients=100, rounds=500, eval_every=25,
        options={**_PROTOCOL, "study": study,
                 "hidden": "1024,1024,1024" if ds == "emnist_l10" else "1024,1024",
                 **(_FEDCR_PROTOCOL if study == "fedcr" else {})},
        unit="accuracy %", paper={}, deviations="lr tuned on validation; full participation",
        missing="Fig. 4.4's right panel (the Acc + α/r trade-off) is not drawn; the deployed "
                "model sizes it needs are printed" if study == "ratio" else "")
    for study in STUDIES for ds in ("fashion_mnist", "emnist_l10", "cifar10", "cifar100")}


def _printed(name: str, cells: dict) -> None:
  """Put a table's printed numbers into configuration ``name``: ``{method: (S1, S2)}`` becomes
  ``paper = {"S1": {method: value}, "S2": {...}}`` (a ``None`` cell, lost in the source's
  text or not printed, is left out; so is a split the table does not print)."""
  paper = {split: {m: v[i] for m, v in cells.items() if v[i] is not None}
           for i, split in enumerate(("S1", "S2"))}
  PAPERS[name] = dataclasses.replace(PAPERS[name], paper={k: v for k, v in paper.items() if v})


# Table 4.2 (S1 / S2, %)
_printed("rules_fashion_mnist", {
    'Fixed': (81.75, 84.27),
    'Uniform (p=0.9)': (78.81, 77.24),
    'Ordered Dropout (p=0.9)': (75.45, 73.27),
    'Uniform (p=0.7)': (72.66, 70.37),
    'Ordered Dropout (p=0.7)': (70.21, 67.58)})
_printed("rules_cifar100", {
    'Fixed': (65.41, 57.38),
    'Uniform (p=0.9)': (64.33, 58.2),
    'Ordered Dropout (p=0.9)': (61.11, 53.28),
    'Uniform (p=0.7)': (60.35, 54.88),
    'Ordered Dropout (p=0.7)': (59.72, 50.03)})
_printed("rules_cifar10", {
    'Fixed': (67.65, 61.17)})
_printed("rules_emnist_l10", {
    'Fixed': (88.75, 86.33)})
# Table 4.1 (S1 only)
_printed("resnet_cifar10", {
    'Full': (73.25, None),
    '-B2-B3 (full)': (65.68, None),
    '-B2 (part)': (72.09, None),
    '-B3 (part)': (73.47, None)})
_printed("resnet_cifar100", {
    'Full': (63.33, None),
    '-B2-B3 (full)': (58.26, None),
    '-B2 (part)': (61.11, None),
    '-B3 (part)': (62.39, None)})


def _paper(study: str, dataset: str) -> dict:
  """The paper's numbers of ``study`` on ``dataset`` (``{split: {method: value}}``; ``{}``
  where the chapter prints none)."""
  pc = PAPERS.get(f"{study}_{dataset}")
  return pc.paper if pc is not None else {}


def _model(kind: str, shape, classes: int, opts: dict):
  if kind == "resnet18":
    return resnet18(shape, classes)
  hidden = tuple(int(h) for h in opts["hidden"].split(",") if h.strip())
  if kind == "cnn":
    return fedp3_cnn(shape, classes, channels=opts["channels"], hidden=hidden)
  if kind == "mlp":
    return mlp(shape, classes, hidden=hidden + (hidden[-1],) * (3 - len(hidden)))
  return mlp(shape, classes, hidden=(32, 32, 32, 32))  # digits: 5 layers, as the CNN


def _partition(split: str, y: np.ndarray, cfg: Config):
  classes, per_client, alpha, _ = DATA[cfg.dataset]
  if split == "S1":
    return label_count_partition(y, cfg.clients, per_client, seed=cfg.seed)
  return hsu_dirichlet_partition(y, cfg.clients, alpha, seed=cfg.seed, per_class=True)


def _fedcr_model(kind: str, shape, classes: int, opts: dict):
  """FedCR's network for the data set: its CIFAR CNN (three channels) or Fashion-MNIST CNN
  with ``hidden``'s first two widths, and for the MLP data sets an MLP body of ``hidden``
  (EMNIST-L: the chapter's three layers, with the projection four body layers)."""
  hidden = tuple(int(h) for h in opts["hidden"].split(",") if h.strip())
  if kind == "mlp_small":     # the digits: five layers, as _model's
    return fedcr_net(shape, classes, opts["fedcr_dim"], conv=(), dense=(32,) * 4)
  if kind == "mlp":
    return fedcr_net(shape, classes, opts["fedcr_dim"], conv=(),
                     dense=hidden + (hidden[-1],) * (3 - len(hidden)))
  conv = FEDCR_CONV["cifar" if len(shape) == 3 and shape[-1] == 3 else "fashion_mnist"]
  return fedcr_net(shape, classes, opts["fedcr_dim"], conv=conv, dense=hidden[:2])


def _fedcr(spec, model, candidate, opts: dict, n: int, names: list[str], seed: int):
  """FedCR (every body layer sent) or FedCR-OPU3 (``spec``'s layer policy) at ``(lr, β)``."""
  lr, beta = candidate
  rows = F.layer_policy(jax.random.key(seed + 1), n, len(names), spec[0])
  algo = fedcr(model, lr, beta=beta, samples=opts["fedcr_samples"], epochs=opts["fedcr_epochs"],
               batch_size=opts["batch"], cohort_size=opts["cohort"] or None,
               train_layers=None if rows.all() else rows)
  return algo, rows


def _drop_groups(policy: str, names: list[str]) -> list[list[str]]:
  """``"drop:B2|B3"`` -> per alternative, the depth-2 layers of its blocks' main paths."""
  groups = []
  for alt in policy.split(":")[1].split("|"):
    prefixes = RESNET_BLOCKS[alt]
    groups.append([n for n in names if n.split("/")[0] in prefixes
                   and n.split("/")[1] in ("conv1", "conv2", "norm1", "norm2")])
  return groups


def _config(spec, opts: dict, num_clients: int, names: list[str], seed: int):
  policy, keep, rule, p, agg = spec
  policy = policy or opts["policy"]
  keep = opts["keep"] if keep is None else keep
  if policy.startswith("drop:"):
    train, keep = F.exclude_one_group(jax.random.key(seed + 1), num_clients, names,
                                      _drop_groups(policy, names))
  else:
    train = F.layer_policy(jax.random.key(seed + 1), num_clients, len(names), policy)
  cfg = F.make_config(jax.random.key(seed + 2), train, keep)
  q = (1.0, 1.0) if p is None else ((p, 1.0) if opts["q_law"] == "lower" else (p, p))
  return cfg, rule, q, agg


def _algorithm(spec, loss, lr: float, opts: dict, n: int, names: list[str], seed: int):
  cfg, rule, q, agg = _config(spec, opts, n, names, seed)
  algo = F.fedp3(loss, optax.sgd(lr), cfg, local_steps=opts["steps"], batch_size=opts["batch"],
                 cohort_size=opts["cohort"] or None, local_rule=rule, q_range=q,
                 aggregation=agg, train_non_selected=opts["train_non_selected"],
                 depth=_depth(opts))
  return algo, cfg


def _depth(opts: dict) -> int:
  return 2 if opts["study"] == "resnet" else 1


def _eval_fn(model, cfg, depth: int):
  return make_personal_eval_fn(model, lambda st: F.deployed_models(st.params, cfg, depth),
                               lambda st: st.params, per_client=False)


def setup(cfg: Config, opts: dict):
  """One setting per split (S1, S2) of the pooled data, each client's share split 70/30 into
  its own train and test data; the study's network and its layers."""
  if cfg.dataset not in DATA:
    raise ValueError(f"--dataset must be one of {tuple(DATA)}, got {cfg.dataset!r}.")
  study = STUDIES[opts["study"]]
  name_list(opts["methods"], f"methods (study {opts['study']})", tuple(study),
            default=list(study))
  splits = name_list(opts["splits"], "splits", ("S1", "S2"))
  classes, _, _, kind = DATA[cfg.dataset]
  if opts["study"] == "resnet":
    if cfg.dataset not in ("cifar10", "cifar100"):
      raise ValueError(f"study 'resnet' runs on --dataset cifar10 or cifar100, got "
                       f"{cfg.dataset!r}.")
    kind = "resnet18"
  x, y = load_arrays(cfg.dataset, "all", cfg.data_dir)  # the chapter pools train and test
  if opts["study"] == "fedcr":
    model = _fedcr_model(kind, x.shape[1:], classes, opts)
    params = model.init(jax.random.key(cfg.seed))
    sizes, names = LY.layer_sizes(params["body"], 1), LY.layer_names(params["body"], 1)
  else:
    model = _model(kind, x.shape[1:], classes, opts)
    params = model.init(jax.random.key(cfg.seed))
  depth = _depth(opts)
  if opts["study"] != "fedcr":
    sizes = LY.layer_sizes(params, depth)
    names = LY.layer_names(params, depth)
  print(f"{NAME}: {cfg.dataset}, study {opts['study']}, {cfg.clients} clients "
        f"({opts['cohort'] or 'all'} per round), K={opts['steps']} steps of {opts['batch']}, "
        f"{len(names)} layers ({int(sizes.sum())} parameters)")
  extra = {"model": model, "depth": depth, "sizes": sizes,
           "loss": None if opts["study"] == "fedcr" else make_loss(model),
           "names": names, "paper": _paper(opts["study"], cfg.dataset)}
  for split in splits:
    parts = _partition(split, y, cfg)
    ds = federate(x, y, parts, num_classes=classes, name=f"{cfg.dataset}/{split}",
                  test_fraction=0.3, seed=cfg.seed)
    yield Context(ds, params, None, extra, setting=split)


def methods(ctx: Context, cfg: Config, opts: dict) -> dict:
  """The study's methods, each tuned over the ``lrs`` grid; every client's deployed model is
  evaluated on its own test split."""
  study = STUDIES[opts["study"]]
  x = ctx.extra
  n = ctx.data.train.num_clients

  def build(spec, lr, run):
    if opts["study"] == "fedcr":
      algo, _ = _fedcr(spec, x["model"], lr, opts, n, x["names"], cfg.seed + 1000 * run.seed)
      train = ctx.fit if run.tuning else ctx.data.train
      return algo, make_fine_tuned_eval_fn(x["model"], train, jax.random.key(cfg.seed + 7),
                                           lr=lr[0], epochs=opts["finetune_epochs"],
                                           batch_size=opts["batch"])
    algo, fcfg = _algorithm(spec, x["loss"], lr, opts, n, x["names"],
                            cfg.seed + 1000 * run.seed)
    return algo, _eval_fn(x["model"], fcfg, x["depth"])

  if opts["study"] == "fedcr":   # the learning rate and β, tuned together
    grid = [(lr, b) for lr in opts["lrs"] for b in opts["betas"]]
    label = lambda c: f"lr={c[0]:g}, beta={c[1]:g}"
  else:
    grid, label = opts["lrs"], lambda lr: f"lr={lr:g}"
  return {m: Method(lambda lr, run, spec=study[m]: build(spec, lr, run), grid,
                    label=label, params_fn=lambda st: st)
          for m in name_list(opts["methods"], f"methods (study {opts['study']})",
                             tuple(study), default=list(study))}


def columns(m: str, tuned, ctx: Context, cfg: Config, opts: dict) -> dict:
  """The paper's number, the layers sent (the paper's count), the floats sent and the
  deployed model's size relative to FedAvg's, the final run's time."""
  x = ctx.extra
  seed = cfg.seed + 1000 * (opts["seeds"] - 1)
  if opts["study"] == "fedcr":   # the body's layers; the head stays on the client
    train = F.layer_policy(jax.random.key(seed + 1), ctx.data.train.num_clients,
                           len(x["names"]), STUDIES["fedcr"][m][0])
    keep = np.ones(train.shape)
  else:
    fcfg = _algorithm(STUDIES[opts["study"]][m], x["loss"], tuned.best, opts,
                      ctx.data.train.num_clients, x["names"], seed)[1]
    train = np.asarray(fcfg.train_layers)
    keep = np.asarray(fcfg.keep_ratio)
  sizes = x["sizes"]
  deployed = np.mean([F.deployed_size(sizes, t, k[~t].mean() if (~t).any() else 1.0)
                      for t, k in zip(train, keep)])
  return {"paper %": x["paper"].get(ctx.setting, {}).get(m),
          "layers sent (paper's count)": float(train.mean()),
          "floats sent / FedAvg's": float((train @ sizes).mean() / sizes.sum()),
          "deployed / full": float(deployed / sizes.sum()),
          "train s": tuned.records[0]["wall_time_s"]}


def report(results: dict, ctx: Context, cfg: Config, opts: dict) -> dict:
  """The study's claims from the chapter, printed under the table."""
  claims = CLAIMS[opts["study"]]
  return {"study": opts["study"], "paper": ctx.extra["paper"], "claims": claims,
          "table": Table(results["table"].rows, note=f"the paper's claims: {claims}")}


def figure(results: dict, ctx: Context, cfg: Config, opts: dict) -> Figure:
  return Figure("methods", dict(
      methods=results["methods"], metric="accuracy",
      title=f"{cfg.dataset}: FedP3 {opts['study']} — personalised accuracy"),
      suffix=f"_{opts['study']}")


run = declared(NAME, OPTIONS, setup=setup, methods=methods, report=report, figure=figure,
               papers=PAPERS, tuning=Tuning(columns=columns))
