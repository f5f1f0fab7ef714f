"""Auto-Train-Once (ATO; Wu et al., CVPR 2024), Table 4 of Xidong Wu's dissertation — train a CNN
from scratch and remove whole zero-invariant channel groups in the same run, no fine-tuning.

Methods (one base recipe: SGD with momentum 0.9, weight decay 1e-4, cosine step size from
``lr``; every method trains for ``--rounds`` epochs from the same random initialisation per
seed — Uniform from its smaller network's):

* **Dense** — plain training (ATO with λ = 0 and a controller window that never opens: bit for
  bit the base optimiser), the baseline of the Δ column;
* **ATO** — Algorithms 7-8 (:mod:`fedjaxsparse.algorithms.ato`) with the group prox (4-4), one
  run per remaining-FLOPs target ``p`` (``targets``): λ = 10, γ = 4, b = 3, τ = 0.4, penalty from
  epoch ``t_w``·E, controller trained in epochs [``t_start``·E, ``t_end``·E] on a fixed subset
  ``D_CN`` (``ctrl_fraction`` of the training set), then frozen;
* **ATO-HSP** — the same with the half-space projector (4-3) (the paper's ablation: "HSP and
  prox perform about the same"); ε = ``hsp_eps`` (not in the paper);
* **Uniform** — Table 4's baseline (:func:`fedjaxsparse.pruning.zig.uniform_ratio`): every
  prunable channel set kept at one fraction r, found by bisection so that the uniform mask's FLOPs ``P(w)`` match ATO's final model at the same
  target; that smaller network (rebuilt with ``widths``) is trained from scratch with the same
  recipe;
* **OTO (HSPG)** — OTO's static choice: every group penalised (w ≡ 0 from the start), the
  half-space projector from epoch ``t_w``·E, no controller; it prunes whatever groups it zeroes.
  OTO's λ is not in the paper: ``oto_lam`` (default: 1e-3 — OTO's usual CIFAR value, an
  assumption — times the paper-scale step count 300·⌊45000/128⌋ over this run's, i.e. the
  same total shrinkage Σ_t η_t λ as a 300-epoch CIFAR run);
* **OTOv2 (DHSPG)** — Table 4-5's OTOv2 rows run, not only printed
  (:func:`fedjaxsparse.algorithms.oto.dhspg`): at epoch ``t_w``·E the groups are partitioned
  by score and ``otov2_sparsity`` + 5 % of them penalised, with OTOv2's adaptive λ
  (``otov2_lam``) and its capped half-space projection until the target group sparsity.

Each final model is pruned physically: groups with w = 0 (OTO: groups that are exactly zero)
are zeroed (:func:`fedjaxsparse.pruning.zig.scale_groups`), removed (:func:`fedjaxsparse.pruning.zig.compress`)
and the *smaller* network is rebuilt and evaluated; its logits are compared with the masked
(virtual-gate) model's on ``check_size`` test images (the ``max |Δlogit|`` column, zero up to
float error by zero-invariance). Reported: validation and test top-1 %, Δ test vs Dense,
pruned FLOPs % = 1 − MACs(small)/MACs(dense) (the DMC-style count of
:func:`fedjaxsparse.pruning.zig.flops`, an assumption: the paper gives no formula), parameters;
means over ``seeds``.
BatchNorm is the library's current-batch BatchNorm: evaluation runs in batches of
``eval_batch`` with each batch's statistics, or with ``--set bn_eval=running`` by running
statistics averaged over ``bn_samples`` training images (BatchNorm's evaluation mode).

Data: the real **Fashion-MNIST** by default (28×28×1 in [0, 1]; the last ``val_size`` training
images are the validation split, ``train_size`` of the rest — drawn with ``--seed`` — are
trained on) with ResNet-20 (``cifar_resnet(20)``) and a CPU-sized budget (6 epochs of 5,000
images, batch 128). The controller then gets a larger ``D_CN`` (50 %) in batches of 32, so
that it takes ~230 steps (the paper's scale: ~2,000), and Adam 3e-4 instead of 1e-3 (why, with
the FLOPs each controller setting reached: ``benchmarks/README.md``, "Measurements that used to
sit in docstrings"). With the paper's one-sided FLOPs penalty the controller's decisions are
irreversible — once a group is masked, the prox zeroes it within a step (ηλ = 1) and a zeroed
BatchNorm channel gets no gradient back, while (4-6) is 0 under the budget — so the kept FLOPs
can end below the target p.
``--set flops_penalty=two_sided`` (``|log(P/(pP_total))|``, not the paper's) ends nearer the
targets. The run prints how its controller differs from the paper's,
and the table prints the FLOPs each network keeps beside its target p.

Ablations (Figs. 6, 7 and 9): ``--set sweep=gamma=1,2,4,8`` (or ``lam=...``, ``t_w=...`` as
fractions of the epochs) runs ATO once more per value at the first target, each a row of the
table, its validation accuracy per epoch drawn beside ATO's and ATO-HSP's, and the FLOPs
regulariser R_FLOPs (4-6) of every epoch's mask drawn for every ATO run (``_rflops.png``).

``--dataset cifar10|cifar100 --data-dir DIR`` (tfds-prepared) runs Table 4's setting: 32×32×3
normalised with the CIFAR-10 mean/std, random crop + flip, 300 epochs, all 45,000 training
images, ``D_CN`` 5 %, controller Adam 1e-3; ``--paper table4_resnet56`` (and
``table4_resnet18``, ``table4_mobilenetv2``, ``table4_c100_resnet18``, ``table4_c100_resnet34``)
fixes the architecture and Table 6's targets p and prints the paper's Table 4 rows beside ours.
The CPU run prints the CIFAR-10 ResNet-56 rows, labelled not comparable.

Execution: :func:`fedjaxsparse.algorithms.ato.train` with ``loop="host"`` on CPU (every step
one jitted call: XLA:CPU runs a convolution inside a loop body ~20× slower, jax-ml/jax#12868)
and ``loop="scan"`` on accelerators (an epoch is one ``lax.scan``). Both draw the same
permutations, augmentation and controller batches from the same keys and write the same
checkpoints, under
``OUT/ato_prune/checkpoints/<method> seed <seed>`` (every epoch on CIFAR; on Fashion-MNIST after
the last epoch only, the ``checkpoint_every`` option): ``--resume`` continues every run from its
newest checkpoint (finished runs are only evaluated again), ``--overwrite`` starts afresh.

Declaration: every method is a :class:`~fedjaxsparse.harness.experiment.Trial` (train from the
seed's initialisation, remove groups, evaluate the smaller network), run by the harness seed by
seed in the order above — Uniform after the ATO run whose FLOPs it matches — and
``results.json`` keeps each seed's record under ``methods`` (``"ATO p=0.5"``, ...).

Source for the team: seed 004 Task 2, Table 4; spec ``seed004.md`` §2.
"""
from __future__ import annotations

import collections
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjaxsparse.pruning import zig as Z
from fedjaxsparse.algorithms import ato as A
from fedjaxsparse.algorithms.oto import DHSPGConfig, dhspg
from fedjaxsparse.ops.augment import CIFAR10_MEAN, CIFAR10_STD, crop_flip
from fedjaxsparse.errors import ConfigError
from fedjaxsparse.runtime.checkpoint import Checkpointing
from fedjaxsparse.runtime.epochs import LOOPS
from fedjaxsparse.harness.options import Config, Option, name_list
from fedjaxsparse.harness.experiment import Context, Trial, TrialRun, declared
from fedjaxsparse.harness.report import Figure, Table
from fedjaxsparse.models import prunable as P
from fedjaxsparse.harness.protocol import PaperConfig, mean_se

NAME = "ato_prune"
DESCRIPTION = ("ATO (Wu et al., CVPR 2024): ATO and ATO-HSP vs Dense, Uniform and OTO (HSPG); "
               "ResNet-20 on Fashion-MNIST, CIFAR with tfds data")
DEFAULTS = dict(rounds=None, eval_every=None, clients=1, dataset="fashion_mnist")
CPU_EPOCHS, PROTOCOL_EPOCHS = 6, 300
# --quick: the table's shape in well under two minutes on 2 CPU cores (QUICK_RUNTIME)
QUICK = dict(dataset="fashion_mnist_standin", rounds=4, options=dict(
    arch="mlp", train_size=512, val_size=500, targets=[0.5], batch=64, curve_size=200,
    check_size=500, ctrl_lr=1e-2))
QUICK_RUNTIME = "measured 26 s on 2 CPU cores (a fresh process, XLA's default flags)"
BUDGET = (f"training epochs of every method (default: {CPU_EPOCHS} on Fashion-MNIST, "
          f"{PROTOCOL_EPOCHS} on CIFAR as in the paper)")
RUNTIME = ("11-18 minutes (8 trainings of ResNet-20 on 5,000 images; measured 10 min 54 s and "
           "18 min 8 s in two sessions)")
DATASETS = ("fashion_mnist", "fashion_mnist_standin", "cifar10", "cifar100", "imagenet")
ARCHS = ("cifar_resnet", "resnet18", "resnet34", "resnet50", "mobilenet_v2", "mlp")
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
METHODS = ("Dense", "ATO", "ATO-HSP", "Uniform", "OTO", "OTOv2")
OTO_LAM_REF, REF_STEPS = 1e-3, PROTOCOL_EPOCHS * (45000 // 128)
PROTOCOL_CTRL_STEPS = (150 - 30 + 1) * (45000 // 20 // 128)   # controller steps at CIFAR scale
CPU = dict(train_size=5000, batch=128, ctrl_fraction=0.5, ctrl_batch=32, ctrl_lr=3e-4,
           augment=False, checkpoint_every=0)
PROTOCOL_SETTING = dict(train_size=None, batch=128, ctrl_fraction=0.05, ctrl_batch=None,
                     ctrl_lr=1e-3, augment=True, checkpoint_every=1)
OPTIONS = (
    Option("methods", ",".join(METHODS), "comma list of " + ", ".join(METHODS), kind="str",
           identity=False),
    Option("targets", [0.5, 0.35], "remaining-FLOPs targets p of ATO / ATO-HSP (one run each; "
           "Uniform matches each ATO run's FLOPs)", kind="floats", low=0.0, high=1.0,
           low_open=True, identity=False),
    Option("arch", "cifar_resnet", "network (fedjaxsparse.models.prunable): cifar_resnet "
           "(depth), resnet18, resnet34, resnet50 (bottleneck, ImageNet stem), mobilenet_v2, "
           "mlp (LeNet-300-100)", choices=ARCHS),
    Option("image_size", 224, "--dataset imagenet: the centre crop's side", low=8),
    Option("per_class", 50, "--dataset imagenet: training images per class held in memory "
           "(the paper trains on all 1.28 M, which needs a streaming input pipeline; the "
           "validation split is read whole)", low=1),
    Option("depth", 20, "depth of cifar_resnet (6n + 2: 8, 20, 56, ...)", low=8),
    Option("train_size", None, "training images (none: all but the validation split; CPU "
           f"default {CPU['train_size']})", kind="int", low=1),
    Option("val_size", 5000, "validation images (the last of the training set)", low=1),
    Option("batch", None, f"minibatch size (default {CPU['batch']} on Fashion-MNIST, 128 on "
           "CIFAR; the paper gives none)", kind="int", low=1),
    Option("lr", 0.1, "SGD step size (cosine decay to 0)", low=0.0, low_open=True),
    Option("momentum", 0.9, "SGD momentum", low=0.0, high=1.0, high_open=True),
    Option("weight_decay", 1e-4, "decoupled weight decay added to the gradient", low=0.0),
    Option("lam", 10.0, "ATO's group penalty λ", low=0.0),
    Option("gamma", 4.0, "ATO's FLOPs regulariser γ", low=0.0),
    Option("t_w", 0.2, "penalty starts at this fraction of the epochs (T_w)", low=0.0, high=1.0),
    Option("sweep", "", "Figs. 6, 7 and 9: ATO once more per value of one of lam, gamma, t_w "
           "(e.g. gamma=1,2,4,8), at the first target p, its validation accuracy and the "
           "FLOPs regulariser R_FLOPs of every epoch's mask drawn beside ATO's (Fig. 6(d), "
           "prox vs HSP, is ATO vs ATO-HSP)", kind="str"),
    Option("t_start", 0.1, "controller training starts (T_start, fraction of the epochs)",
           low=0.0, high=1.0),
    Option("t_end", 0.5, "controller training ends, w frozen after (T_end)", low=0.0, high=1.0),
    Option("ctrl_fraction", None, "D_CN as a fraction of the training set (paper 0.05; CPU "
           f"default {CPU['ctrl_fraction']})", kind="float", low=0.0, high=1.0, low_open=True),
    Option("ctrl_batch", None, "controller minibatch (default: batch; CPU default "
           f"{CPU['ctrl_batch']})", kind="int", low=1),
    Option("ctrl_lr", None, f"controller Adam step size (paper 1e-3; CPU default "
           f"{CPU['ctrl_lr']:g})", kind="float", low=0.0, low_open=True),
    Option("hsp_eps", 0.0, "ε of the half-space projector (ATO-HSP, OTO; not in the seed)",
           low=0.0),
    Option("oto_lam", None, "OTO's λ on every group (default: 1e-3 scaled to the same total "
           "shrinkage as a 300-epoch CIFAR run)", kind="float", low=0.0),
    Option("otov2_sparsity", 0.5, "OTOv2 (DHSPG): the target group sparsity (its partition "
           "at epoch t_w penalises target + 5 % of the groups)", low=0.0, high=1.0,
           high_open=True, identity=False),
    Option("otov2_lam", None, "OTOv2 (DHSPG): λ, adaptive up to 10λ (default: its code's SGD "
           "default 1e-3 scaled like oto_lam to a 300-epoch CIFAR run's total shrinkage)",
           kind="float", low=0.0, identity=False),
    Option("mask_in_target_forward", False, "gate the target model's forward pass by w "
           "(default: the literal (4-2), unmasked)"),
    Option("end_mask", "median", "end-of-epoch mask: median (keep groups the noisy mask keeps "
           "with probability > 1/2), noise_free (round(sigmoid((o + b)/τ)): undershoots with "
           "Gumbel noise), sample (one noisy draw)", choices=A.END_MASKS),
    Option("flops_penalty", "one_sided", "controller FLOPs penalty: one_sided (4-6) or "
           "two_sided |log(P/pP_total)|", choices=A.PENALTIES),
    Option("augment", None, "random crop + flip (default: on for CIFAR, off for Fashion-MNIST)",
           kind="bool"),
    Option("checkpoint_every", None, "checkpoint every this many epochs, 0: after the last "
           "only (default 1 on CIFAR, 0 on Fashion-MNIST)", kind="int", low=0, identity=False),
    Option("seeds", 1, "model seeds --seed, --seed + 1, ... (results are means)", low=1,
           identity=False),
    Option("bn_eval", "batch", "BatchNorm at evaluation: batch (each evaluation batch's own "
           "statistics, the library's current-batch BatchNorm) or running (statistics averaged "
           "over bn_samples training images, BatchNorm's evaluation mode)",
           choices=("batch", "running")),
    Option("bn_samples", 2000, "bn_eval=running: training images the statistics average over",
           low=1),
    Option("eval_batch", 500, "evaluation batch (current-batch BatchNorm statistics)", low=1,
           identity=False),
    Option("curve_size", 1000, "validation images evaluated after every epoch (curves)",
           low=1, identity=False),
    Option("check_size", 1000, "test images on which the compressed and the masked model's "
           "logits are compared", low=1, identity=False),
    Option("loop", "auto", "host: one jitted call per step (fast on CPU); scan: an epoch per "
           "call; auto: host on CPU", choices=("auto", *LOOPS), identity=False),
)

COLUMNS = ("base top-1 %", "pruned top-1 %", "Δ", "pruned FLOPs %", "note")
"""The columns of the paper's Tables 4 and 5 (top-1 %; the note: the row's p, its top-5, the
table's misprints marked "sic")."""


def _rows(rows: list, ato: dict) -> dict:
  """A table's rows ``(method, base, pruned, Δ, pruned FLOPs %, note)`` as printed, as
  ``PaperConfig.paper`` ``{column: {row: value}}``: an ATO row is named by the target p it ran
  (``ato``: ``{p: row index}``; "ATO (p = 0.45)"), a method printed twice by its pruned FLOPs
  ("DTP (60.9 % pruned)"); empty cells are left out."""
  count = collections.Counter(r[0] for r in rows)
  p_of = {i: p for p, i in ato.items()}
  paper = {c: {} for c in COLUMNS}
  for i, (method, *cells) in enumerate(rows):
    label = (f"ATO (p = {p_of[i]:g})" if i in p_of else
             f"{method} ({cells[3]:g} % pruned)" if count[method] > 1 else method)
    for c, v in zip(COLUMNS, cells):
      if v is not None and v != "":
        paper[c][label] = v
  return {c: v for c, v in paper.items() if v}


def table_rows(paper: dict) -> list[tuple]:
  """The rows of a configuration's ``paper`` back in the table's order: ``(row, base, pruned,
  Δ, pruned FLOPs %, note)`` (``None``/``""`` for empty cells)."""
  return [(label, *(paper.get(c, {}).get(label) for c in COLUMNS[:4]),
           paper.get("note", {}).get(label, "")) for label in paper["pruned top-1 %"]]


def ato_rows(paper: dict) -> dict:
  """``{p: row}`` of the table's ATO rows."""
  return {float(r[len("ATO (p = "):-1]): r for r in paper["pruned top-1 %"]
          if r.startswith("ATO (p = ")}


_DEV = ("not in the seed, chosen here: batch 128, cosine step size, crop + flip, HSP ε = 0, "
        "OTO's λ; current-batch BatchNorm; DMC-style FLOPs count (the paper's differs)")


def _paper(name: str, source: str, dataset: str, options: dict, paper: dict,
           epochs: int = PROTOCOL_EPOCHS) -> PaperConfig:
  imagenet = dataset == "imagenet"
  deviations = _DEV if not imagenet else (
      _DEV + f"; ImageNet: {epochs} epochs (the paper's recipe), top-1 only (its top-5 in the "
      "notes)")
  reduced = ("ImageNet's training set is held in memory, per_class images a class (50 unless "
             "--set per_class=; the paper trains on all 1.28 M images)") if imagenet else ""
  cited = list(dict.fromkeys(r.split(" (")[0] for r in paper["pruned top-1 %"]
                             if not r.startswith(("ATO", "Uniform", "OTOv2"))))
  missing = "; ".join(
      ([f"the cited methods' rows ({', '.join(cited)}) are the paper's numbers, printed, not "
        "rerun"] if cited else []) + (["top-5 accuracy is not measured"] if imagenet else []))
  return PaperConfig(name, source, dataset=dataset, standin=None, clients=1,
                     rounds=epochs, eval_every=1, options=options, paper=paper,
                     unit="top-1 %", deviations=deviations, reduced=reduced, missing=missing)


PAPERS = {pc.name: pc for pc in (  # Tables 4 and 5 as printed (top-5 in the notes)
    _paper("table4_resnet56",
           "X. Wu's dissertation (ATO), Table 4 (CIFAR-10, ResNet-56)", "cifar10",
           dict(arch="cifar_resnet", depth=56, targets=[0.45, 0.35]),
           _rows([
               ('DCP-Adapt', 93.8, 93.81, 0.01, 47.0, ''),
               ('SCP', 93.69, 93.23, -0.46, 51.5, ''),
               ('FPGM', 93.59, 92.93, -0.66, 52.6, ''),
               ('SFP', 93.59, 92.26, -1.33, 52.6, ''),
               ('FPC', 93.59, 93.24, -0.25, 52.9, 'Δ sic'),
               ('HRank', 93.26, 92.17, -0.09, 50.0, 'Δ sic'),
               ('DMC', 93.62, 92.69, 0.07, 50.0, 'pruned sic'),
               ('GNN-RL', 93.49, 93.59, 0.1, 54.0, ''),
               ('ATO', 93.5, 93.74, 0.24, 55.0, 'p = 0.45'),
               ('ATO', 93.5, 93.48, -0.02, 65.3, 'p = 0.35'),
           ], {0.45: 8, 0.35: 9})),
    _paper("table4_resnet18",
           "X. Wu's dissertation (ATO), Table 4 (CIFAR-10, ResNet-18)", "cifar10",
           dict(arch="resnet18", targets=[0.1908]),
           _rows([
               ('OTOv2', 93.02, 92.86, -0.16, 79.7, ''),
               ('ATO', 94.41, 94.51, 0.1, 79.8, ''),
           ], {0.1908: 1})),
    _paper("table4_mobilenetv2",
           "X. Wu's dissertation (ATO), Table 4 (CIFAR-10, MobileNetV2)", "cifar10",
           dict(arch="mobilenet_v2", targets=[0.49]),
           _rows([
               ('Uniform', 94.47, 94.17, -0.3, 26.0, ''),
               ('DCP', 94.47, 94.69, 0.22, 26.0, ''),
               ('DMC', 94.23, 94.49, 0.26, 40.0, ''),
               ('SCOP', 94.48, 94.24, -0.24, 40.3, ''),
               ('ATO', 94.45, 94.78, 0.33, 45.8, 'p = 0.49'),
           ], {0.49: 4})),
    _paper("table4_c100_resnet18",
           "X. Wu's dissertation (ATO), Table 4 (CIFAR-100, ResNet-18)", "cifar100",
           dict(arch="resnet18", targets=[0.5952]),
           _rows([
               ('OTOv2', None, 74.96, None, 39.8, ''),
               ('ATO', 77.95, 76.79, -0.07, 40.1, 'p = 0.5952; Δ sic, really −1.16'),
           ], {0.5952: 1})),
    _paper("table4_c100_resnet34",
           "X. Wu's dissertation (ATO), Table 4 (CIFAR-100, ResNet-34)", "cifar100",
           dict(arch="resnet34", targets=[0.5020]),
           _rows([
               ('OTOv2', None, 76.31, None, 49.5, ''),
               ('ATO', 78.43, 78.54, 0.11, 49.5, 'p = 0.5020'),
           ], {0.502: 1})),
    _paper("table5_resnet50",
           "X. Wu's dissertation (ATO), Table 5 (ImageNet, ResNet-50)", "imagenet",
           dict(arch="resnet50", targets=[0.37, 0.296, 0.193]),
           _rows([
               ('DCP', 76.01, 74.95, -1.06, 55.6, 'top-5 92.93 → 92.32'),
               ('CCP', 76.15, 75.21, -0.94, 54.1, 'top-5 92.87 → 92.42'),
               ('FPGM', 76.15, 74.83, -1.32, 53.5, 'top-5 92.87 → 92.32'),
               ('ABCP', 76.01, 73.86, -2.15, 54.3, 'top-5 92.96 → 91.69'),
               ('DMC', 76.15, 75.35, -0.8, 55.0, 'top-5 92.87 → 92.49'),
               ('Random-Pruning', 76.15, 75.13, -1.02, 51.0, 'top-5 92.87 → 92.52'),
               ('DepGraph', 76.15, 75.83, -0.32, 51.7, ''),
               ('DTP', 76.13, 75.55, -0.58, 56.7, ''),
               ('ATO', 76.13, 76.59, 0.46, 55.2, 'p = 0.37; top-5 92.86 → 93.24'),
               ('DTP', 76.13, 75.24, -0.89, 60.9, ''),
               ('OTOv2', 76.13, 75.2, -0.93, 62.6, 'top-5 92.86 → 92.22 (Δ −0.66 sic)'),
               ('ATO', 76.13, 76.07, -0.06, 61.7, 'p = 0.296; top-5 92.86 → 92.92'),
               ('DTP', 76.13, 74.26, -1.87, 67.3, ''),
               ('OTOv1', 76.13, 74.7, -1.43, 64.5, 'top-5 92.86 → 92.10'),
               ('OTOv2', 76.13, 74.3, -1.83, 71.5, 'top-5 92.86 → 92.10'),
               ('ATO', 76.13, 74.77, -1.36, 71.0, 'p = 0.193; top-5 92.86 → 92.25'),
           ], {0.37: 8, 0.296: 11, 0.193: 15}), epochs=240),
    _paper("table5_resnet34",
           "X. Wu's dissertation (ATO), Table 5 (ImageNet, ResNet-34)", "imagenet",
           dict(arch="resnet34", targets=[0.54]),
           _rows([
               ('FPGM', 73.92, 72.63, -1.29, 41.1, 'top-5 91.62 → 91.08'),
               ('Taylor', 73.31, 72.83, -0.48, 24.2, ''),
               ('DMC', 73.3, 72.57, -0.73, 43.4, 'top-5 91.42 → 91.11'),
               ('SCOP', 73.31, 72.62, -0.69, 44.8, 'top-5 91.42 → 90.98'),
               ('ATO', 73.31, 72.92, -0.39, 44.1, 'p = 0.54; top-5 91.42 → 91.15'),
           ], {0.54: 4}), epochs=240),
    _paper("table5_mobilenetv2",
           "X. Wu's dissertation (ATO), Table 5 (ImageNet, MobileNetV2)", "imagenet",
           dict(arch="mobilenet_v2", targets=[0.6578], lr=0.05, weight_decay=4e-5),
           _rows([
               ('Uniform', 71.8, 69.8, -2.0, 30.0, 'top-5 91.00 → 89.60'),
               ('AMC', 71.8, 70.8, -1.0, 30.0, ''),
               ('CC', 71.88, 70.91, -0.97, 28.3, ''),
               ('MetaPruning', 72.0, 71.2, -0.8, 30.7, ''),
               ('Random-Pruning', 71.88, 70.87, -1.01, 29.1, ''),
               ('ATO', 71.88, 72.02, 0.14, 30.1, 'p = 0.6578; top-5 90.29 → 90.19'),
           ], {0.6578: 5}),
           epochs=300))}
PAPER_OF = {("cifar10", "ResNet-56"): "table4_resnet56",
            ("cifar10", "ResNet-18"): "table4_resnet18",
            ("cifar10", "MobileNetV2"): "table4_mobilenetv2",
            ("cifar100", "ResNet-18"): "table4_c100_resnet18",
            ("cifar100", "ResNet-34"): "table4_c100_resnet34",
            ("imagenet", "ResNet-50"): "table5_resnet50",
            ("imagenet", "ResNet-34"): "table5_resnet34",
            ("imagenet", "MobileNetV2"): "table5_mobilenetv2"}
"""The configuration whose table a run of ``(dataset, network)`` prints beside its own."""


# ---------------------------------------------------------------------------------- data


def _load(cfg: Config, opts: dict, train_size: int | None, seed: int) -> dict:
  """``{"x", "y", "xv", "yv", "xt", "yt", "shape", "classes"}`` (float32 images)."""
  if cfg.dataset in ("fashion_mnist", "fashion_mnist_standin"):
    from fedjaxsparse.data.fashion_mnist import STANDIN, default_dir, load_arrays
    try:
      x, y = load_arrays(cfg.data_dir or default_dir(), "train", cfg.dataset == STANDIN)
      xt, yt = load_arrays(cfg.data_dir or default_dir(), "test", cfg.dataset == STANDIN)
    except FileNotFoundError as e:
      hint = (" (for CIFAR, name it: --dataset cifar10|cifar100, or --paper table4_...)"
              if cfg.data_dir else "")
      raise FileNotFoundError(f"{e}{hint}") from None
    classes = 10
  elif cfg.dataset == "imagenet":   # the folder layout ROOT/{train,val}/<wnid>/<image>
    if not cfg.data_dir:
      raise ConfigError("--dataset imagenet reads ROOT/train/<wnid>/* and ROOT/val/<wnid>/* "
                        "(the ILSVRC-2012 layout): pass --data-dir ROOT.")
    from fedjaxsparse.data.imagenet import imagenet_folder
    size = opts["image_size"]
    x, y, names = imagenet_folder(cfg.data_dir, "train", image_size=size,
                                  per_class=opts["per_class"])
    xt, yt, _ = imagenet_folder(cfg.data_dir, "val", image_size=size, classes=names)
    mean, std = np.asarray(IMAGENET_MEAN, np.float32), np.asarray(IMAGENET_STD, np.float32)
    x, xt = (x - mean) / std, (xt - mean) / std
    classes = len(names)
    order = np.random.default_rng(seed).permutation(len(y))   # the validation split: random
    x, y = x[order], y[order]                                  # images, not the last classes
  else:
    from fedjaxsparse.data.tfds_sources import load_split
    x, y = load_split(cfg.dataset, "train", cfg.data_dir)
    xt, yt = load_split(cfg.dataset, "test", cfg.data_dir)
    mean, std = np.asarray(CIFAR10_MEAN, np.float32), np.asarray(CIFAR10_STD, np.float32)
    x, xt = (x - mean) / std, (xt - mean) / std
    classes = 10 if cfg.dataset == "cifar10" else 100
  if opts["val_size"] >= len(x):
    raise ConfigError(f"val_size={opts['val_size']} leaves no training image of {len(x)}.")
  n = len(x) - opts["val_size"]
  idx = np.arange(n)
  if train_size is not None and train_size < n:
    idx = np.sort(np.random.default_rng(seed).choice(n, train_size, replace=False))
  return dict(x=x[idx], y=y[idx], xv=x[n:], yv=y[n:], xt=xt, yt=yt, shape=x.shape[1:],
              classes=classes)


def _arch_label(opts: dict) -> str:
  return {"cifar_resnet": f"ResNet-{opts['depth']}", "resnet18": "ResNet-18",
          "resnet34": "ResNet-34", "resnet50": "ResNet-50", "mobilenet_v2": "MobileNetV2",
          "mlp": "MLP 300-100"}[opts["arch"]]


def _builder(opts: dict, shape, classes: int):
  """``widths -> (module, Model)`` of the chosen architecture."""
  arch = opts["arch"]
  if arch == "cifar_resnet":
    if (opts["depth"] - 2) % 6:
      raise ConfigError(f"depth must be 6n + 2 (8, 14, 20, 56, ...), got {opts['depth']}.")
    return lambda widths=None: P.cifar_resnet(opts["depth"], shape, classes, widths=widths)
  if arch in ("resnet18", "resnet34"):   # ImageNet-sized inputs get the ImageNet stem
    blocks = (2, 2, 2, 2) if arch == "resnet18" else (3, 4, 6, 3)
    stem = "imagenet" if min(shape[:2]) >= 64 else "cifar"
    return lambda widths=None: P.resnet(blocks, shape, classes, widths=widths, stem=stem)
  if arch == "resnet50":
    return lambda widths=None: P.resnet50(shape, classes, widths=widths)
  if arch == "mlp":
    return lambda widths=None: P.mlp(shape, classes, hidden=(300, 100), widths=widths)
  stem = "imagenet" if min(shape[:2]) >= 64 else "cifar"   # as the ResNets'
  return lambda widths=None: P.mobilenet_v2(shape, classes, widths=widths, stem=stem)


def _settings(cfg: Config, opts: dict) -> dict:
  """The options left ``None`` filled for the data set (CPU or the paper's setting)."""
  base = CPU if cfg.dataset.startswith("fashion_mnist") else PROTOCOL_SETTING
  s = {k: (base[k] if opts.get(k) is None else opts[k]) for k in base}
  s["ctrl_batch"] = s["ctrl_batch"] or s["batch"]
  s["epochs"] = cfg.rounds or (CPU_EPOCHS if cfg.dataset.startswith("fashion_mnist") else
                                   PROTOCOL_EPOCHS)
  return s


def _epoch(fraction: float, epochs: int) -> int:
  return int(math.floor(fraction * epochs + 0.5))


# ------------------------------------------------------------------------------ training


def _num_params(params) -> int:
  return int(sum(np.size(v) for v in jax.tree_util.tree_leaves(params)))


def _recipe(opts: dict, s: dict, steps: int):
  schedule = optax.cosine_decay_schedule(opts["lr"], max(1, steps))
  opt = optax.chain(optax.add_decayed_weights(opts["weight_decay"]),
                    optax.sgd(schedule, momentum=opts["momentum"]))
  return opt, schedule


def setup(cfg: Config, opts: dict) -> Context:
  """The data, the network and its groups, the evaluator and the recipe every method shares
  (printed once); ``extra`` holds them for :func:`methods` and :func:`table`."""
  if cfg.dataset not in DATASETS:
    raise ConfigError(f"{NAME} runs on {', '.join(DATASETS)}; got --dataset {cfg.dataset!r}.")
  name_list(opts["methods"], "methods", METHODS)   # checked before anything loads
  s = _settings(cfg, opts)
  E = s["epochs"]
  T_w, T_start, T_end = (_epoch(opts[k], E) for k in ("t_w", "t_start", "t_end"))
  if T_start > T_end:
    raise ConfigError(f"t_start={opts['t_start']} is after t_end={opts['t_end']}.")
  sweep = parse_sweep(opts["sweep"])
  data = _load(cfg, opts, s["train_size"], cfg.seed)
  x, y = data["x"], data["y"]
  if s["batch"] > len(x):
    raise ConfigError(f"batch={s['batch']} exceeds the {len(x)} training images.")
  steps = E * (len(x) // s["batch"])
  oto_lam = opts["oto_lam"] if opts["oto_lam"] is not None else OTO_LAM_REF * REF_STEPS / steps
  build = _builder(opts, data["shape"], data["classes"])
  module, model = build()
  running = (data["x"][:opts["bn_samples"]] if opts["bn_eval"] == "running" else None)
  ev = Z.GatedEvaluator(module, model, data["shape"], opts["eval_batch"], running)
  zigs, dense_flops = ev.zigs, Z.total_flops(ev.zigs)
  augment = crop_flip() if s["augment"] else None
  loop = opts["loop"] if opts["loop"] != "auto" else (
      "host" if jax.default_backend() == "cpu" else "scan")
  arch = _arch_label(opts)
  comparable = (cfg.dataset, arch) in PAPER_OF
  print(f"{NAME}: {arch} on {cfg.dataset} ({len(x)} train / {len(data['xv'])} validation / "
        f"{len(data['xt'])} test, {data['shape']}), {E} epochs × {len(x) // s['batch']} steps "
        f"of {s['batch']}, SGD lr {opts['lr']:g} (cosine) momentum {opts['momentum']:g} wd "
        f"{opts['weight_decay']:g}{', crop+flip' if augment else ''}; {zigs.num_groups} groups "
        f"in {len(zigs.prunable)} sets, {dense_flops / 1e6:.2f} M MACs/example; λ = "
        f"{opts['lam']:g}, γ = {opts['gamma']:g}, T_w = {T_w}, controller epochs "
        f"{T_start}..{T_end} (0-based); OTO λ = {oto_lam:.3g}; {opts['seeds']} seed(s); "
        f"{loop} loop")
  if (s["ctrl_fraction"], s["ctrl_lr"]) != (0.05, 1e-3):
    n_ctrl = max(1, int(round(s["ctrl_fraction"] * len(x))))
    ours = (T_end - T_start + 1) * (n_ctrl // min(s["ctrl_batch"], n_ctrl))
    print(f"NOTE: controller D_CN = {s['ctrl_fraction']:g} of the training set in batches of "
          f"{s['ctrl_batch']}, Adam {s['ctrl_lr']:g} — NOT the paper's 5 % / 1e-3: this run "
          f"takes {ours} controller steps, {PROTOCOL_CTRL_STEPS / max(ours, 1):.0f}× fewer than "
          f"the paper's scale ({PROTOCOL_CTRL_STEPS}: epochs 30..150 × ⌊5 % of 45,000 / 128⌋).")

  base = A.ATOConfig(lam=opts["lam"], gamma=opts["gamma"], T_w=T_w, T_start=T_start,
                     T_end=T_end, hsp_eps=opts["hsp_eps"],
                     mask_in_target_forward=opts["mask_in_target_forward"],
                     end_mask=opts["end_mask"], flops_penalty=opts["flops_penalty"],
                     ctrl_lr=s["ctrl_lr"])
  never = dict(T_start=E + 1, T_end=E + 1)
  curve_x, curve_y = data["xv"][:opts["curve_size"]], data["yv"][:opts["curve_size"]]
  check_x = data["xt"][:opts["check_size"]]

  return Context(None, None, None, dict(
      settings=s, E=E, T_w=T_w, T_start=T_start, T_end=T_end, sweep=sweep, data=data, x=x,
      y=y, steps=steps, oto_lam=oto_lam, build=build, model=model, running=running, ev=ev,
      zigs=zigs, dense_flops=dense_flops, augment=augment, loop=loop, arch=arch,
      comparable=comparable, base=base, never=never, curve_x=curve_x, curve_y=curve_y,
      check_x=check_x))


def methods(ctx: Context, cfg: Config, opts: dict) -> dict[str, Trial]:
  """Every method of the study as a :class:`~fedjaxsparse.harness.experiment.Trial`, named
  ``"<method>"`` or ``"<method> p=<target>"``, in the order they run for each seed (Uniform
  after the ATO run whose FLOPs it matches)."""
  chosen = name_list(opts["methods"], "methods", METHODS)
  P_ = ctx.extra
  base, never, E = P_["base"], P_["never"], P_["E"]
  out = {}
  if "Dense" in chosen:
    out["Dense"] = Trial(lambda run: _pruned(P_, opts, run, base._replace(lam=0.0, **never),
                                             "plain"))
  for p in opts["targets"]:
    for name, proj in (("ATO", "prox"), ("ATO-HSP", "hsp")):
      if name in chosen:
        out[f"{name} p={p:g}"] = Trial(
            lambda run, p=p, proj=proj: _pruned(P_, opts, run, base._replace(
                target=p, projector=proj), "mask"))
    if "Uniform" in chosen:
      out[f"Uniform p={p:g}"] = Trial(lambda run, p=p: _uniform(P_, opts, run, p))
  if "OTO" in chosen:
    out["OTO"] = Trial(lambda run: _pruned(
        P_, opts, run, base._replace(lam=P_["oto_lam"], projector="hsp", target=1.0, **never),
        "zeroed", zero_mask=True))
  if "OTOv2" in chosen:   # DHSPG: the partition at epoch T_w, then the dual half-space steps
    lam2 = (opts["otov2_lam"] if opts["otov2_lam"] is not None
            else OTO_LAM_REF * REF_STEPS / P_["steps"])
    dcfg = DHSPGConfig(target=opts["otov2_sparsity"], lam=lam2,
                       partition_step=P_["T_w"] * (len(P_["x"]) // P_["settings"]["batch"]))
    out["OTOv2"] = Trial(lambda run: _pruned(P_, opts, run, base._replace(**never), "zeroed",
                                             dhspg_cfg=dcfg,
                                             extra={"otov2": [dcfg.target, dcfg.lam]}))
  if P_["sweep"] is not None:   # Figs. 6, 7, 9: ATO at the first target, one run per value
    field, values = P_["sweep"]
    p = opts["targets"][0]
    for v in values:
      change = {"T_w": _epoch(v, E)} if field == "t_w" else {field: v}
      out[f"ATO {SWEEPS[field]}={v:g} p={p:g}"] = Trial(
          lambda run, change=change, field=field, v=v, p=p: _pruned(
              P_, opts, run, base._replace(target=p, **change), "mask",
              extra={"sweep": [field, v]}))
  return out


def _train(P_: dict, opts: dict, run: TrialRun, mdl, zg, acfg, params, key, evaluate,
           zero_mask: bool = False, extra: dict | None = None, dhspg_cfg=None):
  """One training of ``P_["E"]`` epochs (:func:`fedjaxsparse.algorithms.ato.train`) with the
  shared recipe, checkpointed in the run's folder; ``(state, history, training seconds)``."""
  s, cfg = P_["settings"], run.config
  opt, schedule = _recipe(opts, s, P_["steps"])
  algo = (A.ato(mdl, zg, opt, schedule, acfg) if dhspg_cfg is None
          else dhspg(mdl, zg, opt, schedule, dhspg_cfg))
  if zero_mask:   # OTO: every group penalised from the start, w never regenerated
    init = algo.init
    algo = algo._replace(init=lambda k, p: init(k, p)._replace(w=jnp.zeros(zg.num_groups)))
  state, hist = A.train(algo, acfg, key, params, P_["x"], P_["y"], epochs=P_["E"],
                        batch_size=s["batch"],
                        ctrl_index=A.controller_subset(len(P_["x"]), s["ctrl_fraction"],
                                                       cfg.seed),
                        ctrl_batch=s["ctrl_batch"], evaluate=evaluate, augment=P_["augment"],
                        checkpoint=Checkpointing(
                            run.checkpoints, every=s["checkpoint_every"], resume=cfg.resume,
                            overwrite=cfg.overwrite,
                            fingerprint={**run.fingerprint, "epochs": P_["E"],
                                         **(extra or {})}),
                        loop=P_["loop"], progress=cfg.progress,
                        desc=f"{run.fingerprint['method']} seed {run.seed}")
  # resumed epochs included; NaN for epochs checkpointed before times were recorded
  return state, hist, sum(h.get("seconds", math.nan) for h in hist)


def _pruned(P_: dict, opts: dict, run: TrialRun, acfg, groups: str, **train_kw) -> dict:
  """Train the dense network from the seed's initialisation, remove the groups — ``"plain"``:
  none (Dense), ``"mask"``: those ATO's mask w drops, ``"zeroed"``: those exactly zero (OTO,
  OTOv2) — and evaluate the smaller network (:func:`_compress`)."""
  ev, zigs, model = P_["ev"], P_["zigs"], P_["model"]
  key = jax.random.key(run.seed)
  params = model.init(jax.random.fold_in(key, 1))
  cx, cy = P_["curve_x"], P_["curve_y"]
  evaluate = ((lambda q, w: ev.accuracy(q, cx, cy, w)) if groups == "mask" else
              (lambda q, w: ev.accuracy(q, cx, cy)))
  st, hist, sec = _train(P_, opts, run, model, zigs, acfg, params, key, evaluate, **train_kw)
  if groups == "plain":
    return {**_compress(P_, opts, st.params, np.ones(zigs.num_groups, bool)),
            "history": hist, "time_s": sec}
  if groups == "zeroed":
    keep = np.asarray(Z.group_norms(zigs, st.params)) > 0
    return {**_compress(P_, opts, st.params, keep), "kept_groups": int(keep.sum()),
            "history": hist, "time_s": sec}
  keep = np.asarray(st.w) > 0.5
  nrm = np.asarray(Z.group_norms(zigs, st.params))
  res = _compress(P_, opts, st.params, keep)
  res.update(kept_groups=int(keep.sum()),
             final_flops_frac=res["masked_flops"] / P_["dense_flops"],
             unzeroed_masked_groups=int(np.sum((~keep) & (nrm > 0))))
  return {**res, "history": hist, "time_s": sec,
          "flops_curve": [h["flops"] for h in hist] + [res["masked_flops"] / P_["dense_flops"]]}


def _compress(P_: dict, opts: dict, params, keep) -> dict:
  """Zero the removed groups, compress, rebuild; evaluate the small model and compare its
  logits with the masked model's."""
  ev, zigs, data = P_["ev"], P_["zigs"], P_["data"]
  w = jnp.asarray(keep, jnp.float32)
  small, widths = Z.compress(zigs, Z.scale_groups(zigs, params, w), keep)
  sev = ev if keep.all() else Z.GatedEvaluator(*P_["build"](widths), data["shape"],
                                               opts["eval_batch"], P_["running"])
  diff = float(np.max(np.abs(sev.logits(small, P_["check_x"]) -
                             ev.logits(params, P_["check_x"], w))))
  return dict(val=sev.accuracy(small, data["xv"], data["yv"]),
              test=sev.accuracy(small, data["xt"], data["yt"]),
              flops=Z.total_flops(sev.zigs), params=_num_params(small), widths=widths,
              logit_diff=diff, masked_flops=float(Z.flops(zigs, w)))


def _uniform(P_: dict, opts: dict, run: TrialRun, p: float) -> dict:
  """Table 4's Uniform baseline: every prunable set kept at one fraction, matched to the FLOPs
  of this seed's ATO run at ``p`` (``p`` × the dense FLOPs without one), trained from scratch
  as the smaller network."""
  ato = run.earlier.get(f"ATO p={p:g}")
  goal = ato["masked_flops"] if ato is not None else p * P_["dense_flops"]
  r, keep = Z.uniform_ratio(P_["zigs"], goal)
  widths = {c.name: int(keep[c.offset:c.offset + c.size].sum()) for c in P_["zigs"].prunable}
  umod, umodel = P_["build"](widths)
  data = P_["data"]
  uev = Z.GatedEvaluator(umod, umodel, data["shape"], opts["eval_batch"], P_["running"])
  key = jax.random.key(run.seed)
  st, hist, sec = _train(P_, opts, run, umodel, uev.zigs,
                         P_["base"]._replace(lam=0.0, **P_["never"]),
                         umodel.init(jax.random.fold_in(key, 1)), key,
                         lambda q, w: uev.accuracy(q, P_["curve_x"], P_["curve_y"]),
                         extra={"widths": widths})
  return dict(val=uev.accuracy(st.params, data["xv"], data["yv"]),
              test=uev.accuracy(st.params, data["xt"], data["yt"]),
              flops=Z.total_flops(uev.zigs), params=_num_params(st.params), widths=widths,
              logit_diff=None, ratio=r, matched_flops=goal, history=hist, time_s=sec)


SWEEPS = {"lam": "λ", "gamma": "γ", "t_w": "T_w"}
"""The ATO settings ``--set sweep=`` varies (Figs. 6, 7 and 9) and their symbols in rows."""


def parse_sweep(text: str) -> tuple[str, list[float]] | None:
  """``"gamma=1,2,4"`` -> ``("gamma", [1.0, 2.0, 4.0])``; ``""`` -> ``None``. ConfigError names
  the option and what it takes otherwise."""
  if not text:
    return None
  field, _, values = text.partition("=")
  field = field.strip()
  try:
    vals = [float(v) for v in values.split(",") if v.strip()]
  except ValueError:
    vals = []
  if field not in SWEEPS or not vals or min(vals) < 0 or (field == "t_w" and max(vals) > 1):
    raise ConfigError(f"option 'sweep' must be NAME=V1,V2,... with NAME one of "
                      f"{', '.join(SWEEPS)} and values >= 0 (t_w: in [0, 1]), got {text!r}.")
  return field, vals


def r_flops(fraction: float, target: float, two_sided: bool = False) -> float:
  """ATO's FLOPs regulariser (4-6) at a mask keeping ``fraction`` of the FLOPs, for the target
  ``p`` (:func:`fedjaxsparse.pruning.zig.flops_regularizer` with ``P_total = 1``)."""
  return float(Z.flops_regularizer(jnp.float32(fraction), jnp.float32(target), two_sided))


LABELS = {"Dense": "Dense", "ATO": "ATO", "ATO-HSP": "ATO-HSP", "Uniform": "Uniform",
          "OTO": "OTO (HSPG)", "OTOv2": "OTOv2 (DHSPG)"}
"""The table's name of each method."""


def _by_target(records: dict) -> dict:
  """``{(method, p or None): [record per seed]}`` of the harness's ``{name: {"seeds": [...]}}``
  (names ``"<method>"`` or ``"<method> p=<target>"``, :func:`methods`)."""
  out = {}
  for name, r in records.items():
    m, _, p = name.partition(" p=")
    out[(m, float(p) if p else None)] = r["seeds"]
  return out


def table(records: dict, contexts: list, cfg: Config, opts: dict) -> dict:
  """The comparison (means over seeds) and the paper's table beside it (:func:`_report`)."""
  P_ = contexts[-1].extra
  return _report(cfg, opts, _by_target(records), P_["dense_flops"], P_["arch"],
                 P_["comparable"], P_["oto_lam"],
                 {"settings": P_["settings"], "T_w": P_["T_w"], "T_start": P_["T_start"],
                  "T_end": P_["T_end"], "loop": P_["loop"]})


def figure(results: dict, ctx: Context, cfg: Config, opts: dict) -> list[Figure]:
  """Accuracy against pruned FLOPs, and ATO's training curves, mask FLOPs and FLOPs
  regulariser per epoch (:func:`_figures`)."""
  records = _by_target(results["methods"])
  dense = records.get(("Dense", None))
  dense_test = np.mean([r["test"] for r in dense]) * 100 if dense else None
  return _figures(records, LABELS, ctx.extra["dense_flops"], dense_test,
                  f"{ctx.extra['arch']} on {cfg.dataset}", opts["flops_penalty"] == "two_sided")


def _report(cfg, opts, records, dense_flops, arch, comparable, oto_lam, setup) -> dict:
  label = LABELS
  dense_test = (np.mean([r["test"] for r in records[("Dense", None)]]) * 100
                if ("Dense", None) in records else None)
  paper = PAPERS[PAPER_OF.get((cfg.dataset, arch), "table4_resnet56")].paper
  paper_ato = ato_rows(paper) if comparable else {}
  rows = []
  for (m, p), recs in records.items():
    test = 100 * np.mean([r["test"] for r in recs])
    pruned = 100 * (1 - np.mean([r["flops"] for r in recs]) / dense_flops)
    diffs = [r["logit_diff"] for r in recs if r["logit_diff"] is not None]
    kept = np.mean([r["flops"] for r in recs]) / dense_flops
    row = {"method": label.get(m, m), "p": "-" if p is None else f"{p:g}", "kept FLOPs": kept,
           "val top-1 %": 100 * np.mean([r["val"] for r in recs]), "test top-1 %": test,
           "s.e.": (mean_se([100 * r["test"] for r in recs])["se"] if len(recs) > 1
                    else None),
           "Δ test": None if dense_test is None else test - dense_test,
           "pruned FLOPs %": pruned, "params (K)": np.mean([r["params"] for r in recs]) / 1e3,
           "max |Δlogit|": max(diffs) if diffs else "-",
           "train s": np.mean([r["time_s"] for r in recs])}
    if comparable:
      j = next((paper_ato[q] for q in paper_ato if p is not None and abs(q - p) < 1e-6), None)
      if m == "ATO" and j is not None:
        row["paper top-1 %"] = paper["pruned top-1 %"][j]
        row["paper pruned FLOPs %"] = paper["pruned FLOPs %"][j]
      elif m == "Dense" and paper_ato:
        row["paper top-1 %"] = paper["base top-1 %"][next(iter(paper_ato.values()))]
    rows.append(row)
  cols = ["method", "p", "kept FLOPs", "val top-1 %", "test top-1 %", "s.e.", "Δ test",
          "pruned FLOPs %",
          "params (K)", "max |Δlogit|", "train s"]
  if comparable:
    cols += ["paper top-1 %", "paper pruned FLOPs %"]
  title = (f"\n{arch} on {cfg.dataset}, {setup['settings']['epochs']} epochs, mean over "
           f"{opts['seeds']} seed(s); p = the target fraction of FLOPs kept, kept FLOPs = "
           f"what the compressed network keeps ({opts['flops_penalty'].replace('_', '-')} "
           f"FLOPs penalty); pruned FLOPs = 1 − MACs(compressed)/MACs(dense); max "
           f"|Δlogit| = compressed vs masked model on {opts['check_size']} test images")
  notes = []
  under = [(label.get(m, m), p, np.mean([r["flops"] for r in recs]) / dense_flops)
           for (m, p), recs in records.items() if m.startswith("ATO") and p is not None]
  under = [(m, p, k) for m, p, k in under if k < 0.9 * p]
  if under:
    notes.append(
        "  kept FLOPs below the target p: " + ", ".join(f"{m} {k:.3f} at p = {p:g}"
                                                        for m, p, k in under)
        + (" — the paper's one-sided penalty (4-6) is zero anywhere under the budget, so "
           "nothing stops the controller from pruning past it; --set flops_penalty=two_sided "
           "penalises both sides" if opts["flops_penalty"] == "one_sided" else ""))
  for (m, p), recs in records.items():
    if m.startswith("ATO"):
      r = recs[0]
      notes.append(f"  {label.get(m, m)} p={p:g} (seed {cfg.seed}): final P(w)/P_total = "
                   f"{r['final_flops_frac']:.3f} (target {p:g}), {r['kept_groups']} groups "
                   f"kept, {r['unzeroed_masked_groups']} masked groups not exactly zero before "
                   f"removal")
  if ("OTO", None) in records:
    notes.append(f"  OTO (HSPG): λ = {oto_lam:.3g} on every group, "
                 f"{records[('OTO', None)][0]['kept_groups']} groups non-zero at the end")
  if ("OTOv2", None) in records:
    notes.append(f"  OTOv2 (DHSPG): target group sparsity {opts['otov2_sparsity']:g}, λ = "
                 f"{opts['otov2_lam'] if opts['otov2_lam'] is not None else oto_lam:.3g} "
                 f"(adaptive), "
                 f"{records[('OTOv2', None)][0]['kept_groups']} groups non-zero at the end")
  src = (f"paper Table 4 ({'CIFAR-10' if cfg.dataset == 'cifar10' else 'CIFAR-100'} {arch})"
         if comparable else "paper Table 4 (CIFAR-10 ResNet-56, not comparable)")
  prows = [{"method": mth, "base top-1 %": b, "pruned top-1 %": pr, "Δ": d,
            "pruned FLOPs %": fl, "note": note}
           for mth, b, pr, d, fl, note in table_rows(paper)]
  return {"arch": arch, "dataset": cfg.dataset,
          "table": Table(rows, cols, title=title, note="\n".join(notes) or None),
          "paper_label": src, "paper_table": Table(prows, title=f"\n{src}:"),
          "dense_flops": dense_flops, "oto_lam": oto_lam, "setup": setup}


def _figures(records, label, dense_flops, dense_test, what,
             two_sided: bool = False) -> list[Figure]:
  curves = {}
  for (m, p), recs in sorted(records.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
    if m == "Dense":
      continue
    xs, ys = curves.setdefault(label.get(m, m), ([], []))
    xs.append(100 * (1 - np.mean([r["flops"] for r in recs]) / dense_flops))
    ys.append(100 * np.mean([r["test"] for r in recs]))
  for xs, ys in curves.values():
    order = np.argsort(xs)
    xs[:], ys[:] = [xs[i] for i in order], [ys[i] for i in order]
  figures = [Figure("curves", dict(
      curves=curves, xlabel="pruned FLOPs %", ylabel="test top-1 %",
      title=f"{what}: accuracy vs pruned FLOPs",
      baseline=None if dense_test is None else ("Dense", dense_test), logx=False))]
  acc, fl, reg = {}, {}, {}
  for (m, p), recs in records.items():
    if m.startswith("ATO"):
      h, name = recs[0]["history"], f"{label.get(m, m)} p={p:g}"
      acc[name] = ([r["epoch"] for r in h], [100 * r["metric"] for r in h])
      epochs = list(range(len(recs[0]["flops_curve"])))
      fl[name] = (epochs, recs[0]["flops_curve"])
      reg[name] = (epochs, [r_flops(f, p, two_sided) for f in recs[0]["flops_curve"]])
  if acc:
    dense = records.get(("Dense", None))
    base = None
    if dense:
      base = ("Dense (final)", 100 * dense[0]["history"][-1]["metric"])
    figures.append(Figure("curves", dict(
        curves=acc, xlabel="epoch", ylabel="validation top-1 % (under the mask w)",
        title=f"{what}: ATO training (seed 0)", baseline=base, logx=False),
        suffix="_accuracy"))
    figures.append(Figure("curves", dict(
        curves=fl, xlabel="epoch (mask after it)", ylabel="P(w) / P_total",
        title=f"{what}: ATO's mask FLOPs (seed 0)", logx=False), suffix="_flops"))
    figures.append(Figure("curves", dict(
        curves=reg, xlabel="epoch (mask after it)", ylabel="R_FLOPs of the mask",
        title=f"{what}: ATO's FLOPs regulariser (4-6) at each epoch's mask (seed 0)",
        logx=False), suffix="_rflops"))
  return figures


run = declared(NAME, OPTIONS, setup=setup, methods=methods, table=table, figure=figure,
               metric="top-1 accuracy", papers=PAPERS)
