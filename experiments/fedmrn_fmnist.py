"""FedMRN (Li et al., ACM MM 2024) Table 1/2, Fashion-MNIST columns: FedMRN and FedMRNS
against FedAvg and the 1-bpp post-training compressors, on the real Fashion-MNIST, IID,
Non-IID-1 (Dirichlet 0.3) and Non-IID-2 (3 labels per client).

Protocol (the paper's, ``--paper table1_fmnist``): 100 clients, 10 per round, 10 local epochs of
minibatches of 64 without replacement (plain SGD), 100 communication rounds, the learning rate
of every method tuned alike over {1.0, 0.3, 0.1, 0.03, 0.01} — here on a validation split of
each client's training data (the paper does not say on what), never the test set — 5 seeds,
mean ± s.e.; the 4-conv + FC CNN with BatchNorm (:func:`fedjaxsparse.models.bn_cnn`, widths
ours); noise uniform ±1e-2 (FedMRN) and ±5e-3 (FedMRNS). The CPU default is a reduced,
labelled protocol: fewer rounds, one local epoch, a narrow CNN, two learning rates, one seed.

Methods (one epoch-based local protocol): FedMRN and FedMRNS
(:func:`fedjaxsparse.algorithms.fedmrn.fedmrn`); FedAvg
(:func:`fedjaxsparse.algorithms.fedavg.fedavg` with ``epochs=``, dense updates) and FedAvg's
update compressed once by an ``uplink``: SignSGD (stochastic binarisation), TernGrad, DRIVE,
EDEN (Hadamard rotation) and Top-k at 97 % sparsity; FedSparsify (FedAvg whose local model is
pruned to its 3 % largest magnitudes after every step, ``local_prox``, and sent as a pruned
model, ``upload_prox``); FedPM (:mod:`fedjaxsparse.algorithms.fedpm`: masks over
the frozen random initial weights, its deployed model evaluated). Uplink bits per parameter are reported as the paper counts them (1 bpp; TernGrad
1.585; Top-k's values only) and as sent (scalars, seeds, padding, Top-k's indices); "train s"
is each final run's wall time, compilation included, for Fig. 6's cost of compressing
(DRIVE/EDEN's rotations against FedMRN's masks). ``FedSparsify-GMP`` (not a Table 1 row) is
the Sparse-ProxSkip paper's FedSparsify: server-side gradual magnitude pruning to 97 % on the cubic schedule
(:func:`fedjaxsparse.ops.sparsity.gmp_sparsity`, dense uploads, sparse downlink).

``--dataset svhn|cifar10|cifar100`` (tfds-prepared, ``--data-dir``; ``--paper table1_svhn``,
``table1_cifar10``, ``table1_cifar100``) runs the other columns with their paper numbers
(CIFAR-100: Dirichlet 0.2 and 20 labels per client); the 8-conv CIFAR CNN is
``--set channels=32,32,64,64,128,128,256,256``. Table 2's printed paper row is the dataset's
column. ``--dataset shakespeare --set study=table3`` (``--paper table3_shakespeare``) runs
appendix Table 3's next-character task: FedAvg, SignSGD, EDEN and FedMRN on the bundled plays'
speaking roles (or LEAF's JSON in ``--data-dir``) with LEAF's LSTM (``lstm_hidden`` units,
LEAF's 256; 64 by default on a CPU). ``--dataset voc --data-dir VOC --set study=table3``
(``--paper table3_voc``) runs its segmentation row: BiSeNetV2
(:func:`fedjaxsparse.models.segmentation.bisenetv2`, ``seg_width`` of the paper's widths) on
PASCAL VOC 2012 (:func:`fedjaxsparse.data.pascal_voc.voc_segmentation`: train images dealt
IID to the clients, ``seg_size`` × ``seg_size``; the val images are the test set), scored by
the mean IoU; ``--dataset voc_standin`` is its labelled stand-in (random rectangles).

Studies (``--set study=``): ``table1`` (above); ``ablation`` — Fig. 4's variants (FedMRN
w/o SM, w/o PM, w/o PSM, FedAvg w. SM) beside FedAvg, FedMRN and SignSGD, the paper runs them
on Non-IID-2 (``--set splits=niid2``) and gives no numbers, only orderings (printed);
``noise`` — Fig. 5: FedMRN and FedMRNS for every noise distribution × scale in
``noise_grid`` (FedMRNS at half the scale) beside FedAvg, plotted as accuracy against α (the
paper's figure is on CIFAR-10; here on FMNIST). Every method of every study is tuned alike
over ``lrs``.

Source for the team: seed 003 Tables 1/2; spec ``seed000_003.md`` B.9 (experiments), B.8 (Fig. 4's
ablation).
"""
from __future__ import annotations

import functools
import math

import jax
import optax
import numpy as np

from fedjaxsparse.ops import compressors as C
from fedjaxsparse.ops import noise_masks as M
from fedjaxsparse.algorithms.fedavg import fedavg
from fedjaxsparse.algorithms.fedmrn import fedmrn
from fedjaxsparse.algorithms.fedpm import fedpm
from fedjaxsparse.data.fashion_mnist import STANDIN, default_dir, fashion_mnist
from fedjaxsparse.data.federated import federate
from fedjaxsparse.data.partitions import partition
from fedjaxsparse.data.registry import load_arrays
from fedjaxsparse.evaluation import make_eval_fn
from fedjaxsparse.harness.options import Config, Option, name_list
from fedjaxsparse.harness.experiment import Context, Method, Tuning, declared
from fedjaxsparse.harness.report import Figure, Table
from fedjaxsparse.data import load_dataset
from fedjaxsparse.errors import ConfigError
from fedjaxsparse.models import bn_cnn, char_lstm, make_loss, mlp
from fedjaxsparse.models.segmentation import bisenetv2, make_segmentation_eval_fn
from fedjaxsparse.harness.protocol import PaperConfig
from fedjaxsparse.ops.sparsity import gmp_sparsity, num_params, top_k

NAME = "fedmrn_fmnist"
DESCRIPTION = ("FedMRN (Li et al., MM 2024) Table 1: FedMRN/FedMRNS vs FedAvg and 1-bpp "
               "compressors (FMNIST; SVHN/CIFAR with tfds data)")
DEFAULTS = dict(rounds=10, clients=100, dataset="fashion_mnist", eval_every=5,
                data_dir=None)
# --quick: the table's shape in well under two minutes on 2 CPU cores (QUICK_RUNTIME)
QUICK = dict(dataset="fashion_mnist_standin", clients=10, rounds=2, eval_every=1,
             options=dict(splits="niid2", cohort=3, lrs=[0.1], model="mlp"))
QUICK_RUNTIME = "measured 41 s on 2 CPU cores (a fresh process, XLA's default flags)"
BUDGET = "communication rounds per method"
RUNTIME = ("about 75 minutes on 2 CPU cores at the reduced default: 8 methods x 3 splits, each "
           "2 tuning runs of 5 rounds and a 10-round run, at about 9 s per round of 10 clients "
           "(measured: FedMRN, 4 rounds in 39 s on the real Fashion-MNIST)")
TFDS = {"svhn": 10, "cifar10": 10, "cifar100": 100}  # tfds-prepared sets -> classes
SPLITS = {"iid": dict(partition="iid"), "niid1": dict(partition="dirichlet", alpha=0.3),
          "niid2": dict(partition="labels", labels_per_client=3)}
METHODS = ("FedAvg", "FedPM", "FedSparsify", "SignSGD", "Top-k", "TernGrad", "DRIVE", "EDEN",
           "FedMRN", "FedMRNS")  # Table 1's rows
EXTRA = ("FedSparsify-GMP",)  # the Sparse-ProxSkip paper's server-side FedSparsify, not in Table 1
ABLATION = {  # Fig. 4 (B.8): the fedmrn options of each variant (None: Table 1's method);
    # the paper gives no numbers
    "FedAvg": None, "FedMRN": {},
    "FedMRN w/o SM": dict(stochastic=False), "FedMRN w/o PM": dict(progressive=False),
    "FedMRN w/o PSM": dict(stochastic=False, progressive=False),
    "FedAvg w. SM": dict(masking="post"), "SignSGD": None}
ABLATION_CLAIMS = ("both SM and PM are needed, SM slightly more; FedMRN w/o PM > FedAvg w. SM "
                   "(masking during training beats masking after); even FedMRN w/o PSM > "
                   "SignSGD")
NOISE_CLAIMS = ("CIFAR-10 NIID-2: the distribution barely matters, the magnitude does; FedMRN "
                "≈ FedAvg for α ∈ {2.5e-3, 5e-3, 1e-2}, FedMRNS for α ∈ {1.25e-3, 2.5e-3, 5e-3}")
STUDIES = ("table1", "ablation", "noise", "table3")
TABLE3 = ("FedAvg", "SignSGD", "EDEN", "FedMRN")  # appendix Table 3's rows
SEGMENTATION = ("voc", "voc_standin")
"""Data sets of the segmentation row of appendix Table 3 (scored by the mean IoU)."""
OPTIONS = (
    Option("study", "table1", "table1 (Table 1/2), ablation (Fig. 4: the B.8 variants), noise "
           "(Fig. 5: distributions x scales) or table3 (appendix Table 3: FedAvg, SignSGD, EDEN "
           "and FedMRN on --dataset shakespeare, LEAF's LSTM)", choices=STUDIES),
    Option("lstm_hidden", 64, "LSTM units per layer of the Shakespeare model (LEAF's: 256)",
           low=1),
    Option("seg_size", 64, "--dataset voc(_standin): images resized to this square side "
           "(a multiple of 32)", low=32),
    Option("seg_width", 0.25, "BiSeNetV2's channel widths relative to the paper's (1.0)",
           low=0.0, low_open=True),
    Option("seg_norm", "group", "BiSeNetV2's normalisation: group (an image's output does not "
           "depend on its batch) or batch (the current batch's statistics)",
           choices=("group", "batch")),
    Option("seg_images", 0, "--dataset voc: training images read (0: all 1,464 of train; the "
           "stand-in draws 32 per client)", low=0),
    Option("splits", "iid,niid1,niid2", "comma list of iid, niid1 (Dirichlet 0.3), niid2 "
           "(3 labels per client)", kind="str"),
    Option("methods", ",".join(METHODS), "comma list of the methods (table1 study; also "
           "FedSparsify-GMP)", kind="str"),
    Option("noise_grid", [2.5e-3, 5e-3, 1e-2, 2e-2], "noise study: FedMRN's scales α "
           "(FedMRNS: α/2)", kind="floats", low=0.0, low_open=True),
    Option("distributions", "uniform,gaussian,bernoulli", "noise study: comma list",
           kind="str"),
    Option("gmp_end", 0.5, "FedSparsify-GMP: fraction of the rounds at which the cubic ramp "
           "reaches 97 %", low=0.0, high=1.0, low_open=True),
    Option("cohort", 10, "clients per round", low=1),
    Option("epochs", 1, "local epochs (paper: 10)", low=1),
    Option("batch", 64, "minibatch size", low=1),
    Option("lrs", [0.1, 0.03], "learning-rate grid (paper: 1.0, 0.3, 0.1, 0.03, 0.01)",
           kind="floats", low=0.0, low_open=True),
    Option("noise", 1e-2, "FedMRN's uniform noise scale (FedMRNS: half)", low=0.0,
           low_open=True),
    Option("model", "cnn", "bn_cnn (4 conv + FC with BatchNorm) or mlp",
           choices=("cnn", "mlp")),
    Option("channels", [8, 8, 16, 16], "CNN widths (paper-sized: ours 32,32,64,64)",
           kind="floats", low=1),
    Option("validation", 0.1, "fraction of each client's training data for tuning", low=0.0,
           high=1.0, low_open=True, high_open=True),
    Option("seeds", 1, "seeds of the final runs", low=1),
)
_GRID = {"epochs": 10, "lrs": [1.0, 0.3, 0.1, 0.03, 0.01], "seeds": 5}
_CONV8 = [32, 32, 64, 64, 128, 128, 256, 256]
_DEV = ("CNN widths ours (the paper gives none); tuning on a validation split; FedPM's lr grid "
        "is the shared one (its score lr is unspecified)")

def _table1(accuracy: dict, summed: dict) -> dict:
  """A data set's columns of Tables 1 and 2 as ``PaperConfig.paper``: the mean test accuracy
  per split (``iid``, ``niid1``, ``niid2``), Table 2's accuracy change against FedAvg summed
  over the three, and the bits per parameter of each method's upload as the paper counts them
  (FedAvg and the dense FedSparsify-GMP 32, TernGrad log2 3, every other method 1: FedSparsify
  sends 3 % of the values, the paper ignoring their indices)."""
  out = {split: {m: v[i] for m, v in accuracy.items()} for i, split in enumerate(SPLITS)}
  out["Table 2 summed change"] = dict(summed)
  out["bpp"] = _bpp((*METHODS, *EXTRA))
  return out


def _bpp(methods) -> dict:
  """The bits per parameter of each method's upload as the paper's tables count them."""
  return {m: {"FedAvg": 32, "TernGrad": math.log2(3), "FedSparsify-GMP": 32}.get(m, 1)
          for m in methods}


def _table1_config(name: str, what: str, dataset: str, wide: bool, accuracy: dict,
                   summed: dict) -> PaperConfig:
  """A data set's Table 1 configuration: 100 clients, the shared grid, 100 rounds with the
  4-conv CNN, or (``wide``: CIFAR) 200 rounds with the 8-conv one; ``accuracy`` and
  ``summed`` as :func:`_table1` takes them."""
  return PaperConfig(
      name, f"the FedMRN paper's Table 1 ({what})", dataset=dataset, standin=None,
      clients=100, rounds=200 if wide else 100, eval_every=20 if wide else 10,
      options={**_GRID, "channels": _CONV8 if wide else [32, 32, 64, 64]},
      unit="test accuracy %", paper=_table1(accuracy, summed),
      deviations=_DEV + ("; 200 rounds (the paper: 100 or 200)" if wide else ""))


PAPERS = {
    "table1_fmnist": _table1_config("table1_fmnist", "FMNIST", "fashion_mnist", False, {
            'FedAvg': (92.0, 90.5, 88.8),
            'FedPM': (81.7, 78.6, 74.6),
            'FedSparsify': (85.6, 80.9, 78.8),
            'SignSGD': (91.1, 88.4, 87.1),
            'Top-k': (90.1, 88.6, 86.7),
            'TernGrad': (91.4, 89.9, 87.9),
            'DRIVE': (91.6, 89.9, 88.1),
            'EDEN': (91.4, 89.8, 88.3),
            'FedMRN': (91.8, 90.2, 88.6),
            'FedMRNS': (92.0, 90.5, 88.9),
        },  # Table 1: IID, Non-IID-1, Non-IID-2
                     {'FedPM': -36.4, 'FedSparsify': -26.0, 'SignSGD': -4.7, 'Top-k': -5.9,
                      'TernGrad': -2.3, 'DRIVE': -1.8, 'EDEN': -1.8, 'FedMRN': -0.7,
                      'FedMRNS': 0.1}),  # Table 2: summed change vs FedAvg
    "table1_svhn": _table1_config("table1_svhn", "SVHN, tfds svhn_cropped", "svhn", False, {
            'FedAvg': (92.2, 90.3, 88.9),
            'FedPM': (66.3, 52.4, 48.3),
            'FedSparsify': (81.3, 77.2, 72.8),
            'SignSGD': (90.8, 87.3, 86.5),
            'Top-k': (90.0, 87.7, 86.4),
            'TernGrad': (91.7, 89.6, 87.7),
            'DRIVE': (91.6, 89.6, 87.8),
            'EDEN': (91.7, 89.7, 87.8),
            'FedMRN': (92.2, 90.0, 88.5),
            'FedMRNS': (92.4, 90.5, 88.7),
        },  # Table 1: IID, Non-IID-1, Non-IID-2
                     {'FedPM': -104.4, 'FedSparsify': -40.1, 'SignSGD': -6.8, 'Top-k': -7.3,
                      'TernGrad': -2.5, 'DRIVE': -2.4, 'EDEN': -2.3, 'FedMRN': -0.7,
                      'FedMRNS': 0.2}),  # Table 2: summed change vs FedAvg
    "table1_cifar10": _table1_config("table1_cifar10", "CIFAR-10, 8-conv CNN", "cifar10", True,
                                     {
            'FedAvg': (88.2, 84.1, 80.8),
            'FedPM': (50.2, 46.3, 44.3),
            'FedSparsify': (72.0, 66.8, 62.5),
            'SignSGD': (85.3, 75.1, 76.2),
            'Top-k': (84.1, 77.9, 75.1),
            'TernGrad': (86.9, 81.9, 79.2),
            'DRIVE': (87.2, 82.4, 79.4),
            'EDEN': (87.5, 82.6, 79.8),
            'FedMRN': (88.3, 84.6, 81.4),
            'FedMRNS': (88.0, 84.5, 81.0),
        },  # Table 1: IID, Non-IID-1, Non-IID-2
                     {'FedPM': -112.3, 'FedSparsify': -51.8, 'SignSGD': -16.5, 'Top-k': -16.0,
                      'TernGrad': -5.2, 'DRIVE': -4.1, 'EDEN': -3.2, 'FedMRN': 1.2,
                      'FedMRNS': 0.4}),  # Table 2: summed change vs FedAvg
    "table1_cifar100": _table1_config("table1_cifar100", "CIFAR-100, 8-conv CNN", "cifar100",
                                      True, {
            'FedAvg': (56.1, 54.8, 54.4),
            'FedPM': (22.9, 16.6, 13.4),
            'FedSparsify': (32.9, 29.8, 28.8),
            'SignSGD': (48.0, 39.2, 44.0),
            'Top-k': (50.2, 47.6, 43.0),
            'TernGrad': (53.5, 52.1, 52.3),
            'DRIVE': (53.5, 52.5, 52.8),
            'EDEN': (53.9, 53.1, 52.9),
            'FedMRN': (55.4, 54.1, 53.9),
            'FedMRNS': (56.1, 54.7, 54.2),
        },  # Table 1: IID, Non-IID-1, Non-IID-2
                     {'FedPM': -112.4, 'FedSparsify': -73.8, 'SignSGD': -34.1, 'Top-k': -24.5,
                      'TernGrad': -7.5, 'DRIVE': -6.6, 'EDEN': -5.5, 'FedMRN': -1.9,
                      'FedMRNS': -0.3}),  # Table 2: summed change vs FedAvg
    "table3_shakespeare": PaperConfig(
        "table3_shakespeare", "the FedMRN paper's appendix Table 3 (Shakespeare, LEAF's LSTM)",
        dataset="shakespeare", standin=None, clients=1108, rounds=100, eval_every=10,
        options={**_GRID, "study": "table3", "lstm_hidden": 256}, unit="test accuracy %",
        paper={"natural": {'FedAvg': 51.2, 'SignSGD': 38.0, 'EDEN': 49.6, 'FedMRN': 51.1},
               "bpp": _bpp(TABLE3)},
        deviations="the appendix gives no protocol for Shakespeare beyond LEAF's "
        "code: Table 1's (100 rounds, 10 local epochs, lr grid, 5 seeds) is used; the 1,108 "
        "roles of the bundled plays (LEAF: 1,129)"),
    "table3_voc": PaperConfig(
        "table3_voc", "the FedMRN paper's appendix Table 3 (PascalVOC, BiSeNetV2)", dataset="voc",
        standin="voc_standin", clients=10, rounds=100, eval_every=10,
        options={**_GRID, "study": "table3", "seg_size": 512, "seg_width": 1.0},
        unit="test mIoU %",
        paper={"natural": {'FedAvg': 53.8, 'SignSGD': 44.3, 'EDEN': 52.0, 'FedMRN': 54.2},
               "bpp": _bpp(TABLE3)},
        deviations="the appendix follows FedSeg's protocol without restating it: 10 clients "
        "with IID shares of VOC train, Table 1's rounds, epochs, lr grid and seeds; images "
        "resized to 512x512 (FedSeg crops); no auxiliary (booster) heads")}


def _keep_largest(d: int):
  """FedSparsify's local pruning as the FedMRN paper uses it: the model keeps its
  ``⌈0.03·d⌉`` largest magnitudes (global Top-K, 97 % sparsity), a prox of FedAvg's client."""
  k = math.ceil(0.03 * d)
  return lambda tree, step: top_k(tree, k)


def _specs(opts: dict, rounds: int) -> dict:
  """The study's methods: name -> (constructor, keyword arguments). The dense baselines are
  FedAvg (``fedavg`` with the same epoch protocol); a keyword value under "uplink",
  "local_prox" or "upload_prox" is a factory ``d -> value`` (a Compressor, a prox)."""
  top = lambda d: C.top_k(d, math.ceil(0.03 * d))
  table = {"FedAvg": ("fedavg", {}), "FedPM": ("fedpm", {}),
           # pruned after every local step; the pruned *model* is uploaded, charged by its
           # non-zeros under the cheapest encoding (the paper counts the values only)
           "FedSparsify": ("fedavg", dict(local_prox=_keep_largest, upload_prox=_keep_largest,
                                          encoding="auto")),
           "FedSparsify-GMP": ("fedavg", dict(server_sparsity=functools.partial(
               gmp_sparsity, final=0.97, begin=0,
               end=max(1, round(opts["gmp_end"] * rounds))))),
           "SignSGD": ("fedavg", dict(uplink=C.stochastic_sign)),
           "Top-k": ("fedavg", dict(uplink=top)),
           "TernGrad": ("fedavg", dict(uplink=C.terngrad)),
           "DRIVE": ("fedavg", dict(uplink=C.drive)),
           "EDEN": ("fedavg", dict(uplink=C.eden)),
           "FedMRN": ("fedmrn", dict(noise_scale=opts["noise"])),
           "FedMRNS": ("fedmrn", dict(noise_scale=opts["noise"] / 2, signed=True))}
  if opts["study"] == "table1":
    names = name_list(opts["methods"], "methods", METHODS + EXTRA)
    return {m: table[m] for m in names}
  if opts["study"] == "table3":   # its rows, restricted by ``methods``
    names = name_list(opts["methods"], "methods", METHODS + EXTRA)
    return {m: table[m] for m in TABLE3 if m in names}
  if opts["study"] == "ablation":
    return {m: table[m] if kw is None else ("fedmrn", {"noise_scale": opts["noise"], **kw})
            for m, kw in ABLATION.items()}
  specs = {"FedAvg": table["FedAvg"]}
  for dist in name_list(opts["distributions"], "distributions", M.DISTRIBUTIONS):
    for a in opts["noise_grid"]:
      specs[f"FedMRN {dist} α={a:g}"] = ("fedmrn", dict(noise_scale=a, distribution=dist))
      specs[f"FedMRNS {dist} α={a / 2:g}"] = ("fedmrn", dict(
          noise_scale=a / 2, distribution=dist, signed=True))
  return specs


def _algorithm(spec, loss, lr: float, d: int, opts: dict):
  kind, kw = spec
  kw = {k: v(d) if k in ("uplink", "local_prox", "upload_prox") else v for k, v in kw.items()}
  common = dict(epochs=opts["epochs"], batch_size=opts["batch"], cohort_size=opts["cohort"])
  if kind == "fedpm":
    return fedpm(loss, lr, **common)
  if kind == "fedavg":   # the paper's plain local SGD
    return fedavg(loss, optax.sgd(lr), **kw, **common)
  return fedmrn(loss, lr, **kw, **common)


def _dataset(cfg: Config, split: str):
  """Fashion-MNIST (the Debian package) or, prepared with tfds, SVHN / CIFAR-10 / CIFAR-100,
  split by ``split`` (CIFAR-100: Dirichlet 0.2 and 20 labels per client, as the paper)."""
  if cfg.dataset in ("fashion_mnist", STANDIN):
    return fashion_mnist(cfg.data_dir or default_dir(), num_clients=cfg.clients, seed=cfg.seed,
                         standin=cfg.dataset == STANDIN, **SPLITS[split])
  classes = TFDS[cfg.dataset]
  (x, y), (xt, yt) = (load_arrays(cfg.dataset, s, cfg.data_dir) for s in ("train", "test"))
  kw = dict(SPLITS[split])
  if cfg.dataset == "cifar100":
    kw.update(alpha=0.2) if split == "niid1" else kw.update(labels_per_client=20)
  method = kw.pop("partition")
  parts = partition(y, cfg.clients, method, cfg.seed, **kw)
  return federate(x, y, parts, num_classes=classes, name=f"{cfg.dataset}/{split}",
                  x_test=xt, y_test=yt)


def setup(cfg: Config, opts: dict):
  """One setting per split: its dataset, the model's initial parameters and evaluation
  (Shakespeare: one setting, the plays' natural split by speaking role)."""
  table3 = ("shakespeare",) + SEGMENTATION
  if (cfg.dataset in table3) != (opts["study"] == "table3"):
    raise ConfigError("study table3 (appendix Table 3) runs on --dataset shakespeare, voc or "
                      "voc_standin, and those only in study table3; got study "
                      f"{opts['study']!r} on {cfg.dataset!r}.")
  if cfg.dataset not in ("fashion_mnist", STANDIN) + table3 + tuple(TFDS):
    raise ValueError(f"--dataset must be fashion_mnist, {STANDIN}, svhn, cifar10, cifar100, "
                     f"shakespeare, voc or voc_standin, got {cfg.dataset!r}.")
  paper = _paper(cfg)
  splits = (["natural"] if cfg.dataset == "shakespeare" else ["iid"] if cfg.dataset in
            SEGMENTATION else name_list(opts["splits"], "splits", tuple(SPLITS)))
  for split in splits:
    if cfg.dataset in SEGMENTATION:
      ds = _segmentation_data(cfg, opts)
      model = bisenetv2(ds.train.x.shape[2:], 21, width=opts["seg_width"],
                        head_width=max(16, int(1024 * opts["seg_width"])),
                        norm=opts["seg_norm"])
      params = model.init(jax.random.key(cfg.seed))
      d = num_params(params)
      print(f"{NAME}: {ds.name}, {ds.num_clients} clients, {opts['cohort']} per round, "
            f"{opts['epochs']} local epoch(s) of {opts['batch']}, BiSeNetV2 d={d}")
      yield Context(ds, params, make_segmentation_eval_fn(model, 21),
                    {"loss": make_loss(model), "d": d, "paper": paper}, setting=split)
      continue
    if cfg.dataset == "shakespeare":   # the bundled plays, or LEAF's JSON in --data-dir
      ds = load_dataset("shakespeare", num_clients=cfg.clients, seed=cfg.seed,
                        data_dir=cfg.data_dir)
      model = char_lstm(ds.train.x.shape[2], ds.num_classes, hidden=opts["lstm_hidden"])
    else:
      ds = _dataset(cfg, split)
      shape = ds.train.x.shape[2:]
      model = (bn_cnn(shape, ds.num_classes, tuple(int(c) for c in opts["channels"]))
               if opts["model"] == "cnn" else mlp(shape, ds.num_classes))
    params = model.init(jax.random.key(cfg.seed))
    d = num_params(params)
    print(f"{NAME}: {ds.name}, {ds.num_clients} clients, {opts['cohort']} per round, "
          f"{opts['epochs']} local epoch(s) of {opts['batch']}, d={d}")
    yield Context(ds, params, make_eval_fn(model),
                  {"loss": make_loss(model), "d": d, "paper": paper}, setting=split)


def _segmentation_data(cfg: Config, opts: dict):
  """PASCAL VOC's train images dealt IID to the clients (its val images: the test set), or
  the stand-in; void pixels labelled 21 (one past the classes: no loss, no score)."""
  from fedjaxsparse.data.pascal_voc import IGNORE, voc_segmentation, voc_standin
  size = opts["seg_size"]
  if size % 32:
    raise ConfigError(f"option 'seg_size' must be a multiple of 32, got {size}.")
  if cfg.dataset == "voc":
    if not cfg.data_dir:
      raise ConfigError("--dataset voc reads PASCAL VOC 2012 from --data-dir (the unpacked "
                        "VOCtrainval_11-May-2012.tar).")
    x, y = voc_segmentation(cfg.data_dir, "train", size, opts["seg_images"] or None)
    xt, yt = voc_segmentation(cfg.data_dir, "val", size)
  else:
    x, y = voc_standin(32 * cfg.clients, size, cfg.seed)
    xt, yt = voc_standin(max(16, 4 * cfg.clients), size, cfg.seed + 1)
  y, yt = (np.where(a == IGNORE, 21, a).astype(np.int32) for a in (y, yt))
  parts = np.array_split(np.random.default_rng(cfg.seed).permutation(len(x)), cfg.clients)
  return federate(x, y, parts, num_classes=22, name=f"{cfg.dataset}/iid", x_test=xt,
                  y_test=yt)   # 22: the 21 classes and the void label (validation only)


PAPER_OF = {"fashion_mnist": "table1_fmnist", STANDIN: "table1_fmnist", "svhn": "table1_svhn",
            "cifar10": "table1_cifar10", "cifar100": "table1_cifar100",
            "shakespeare": "table3_shakespeare", "voc": "table3_voc",
            "voc_standin": "table3_voc"}
"""The paper configuration whose numbers a run on each data set prints beside its own (the
stand-ins: their real set's)."""


def _paper(cfg: Config) -> dict:
  """The paper's numbers for the data set run: ``{split: {method: value}}`` of Table 1 (with
  Table 2's summed changes and the paper's bits per parameter) or, for Shakespeare and PASCAL
  VOC, appendix Table 3 (split ``natural``); ``{}`` for other data."""
  return PAPERS[PAPER_OF[cfg.dataset]].paper if cfg.dataset in PAPER_OF else {}


def methods(ctx: Context, cfg: Config, opts: dict) -> dict:
  """The study's methods, each tuned over the ``lrs`` grid."""
  loss, d = ctx.extra["loss"], ctx.extra["d"]
  return {m: Method(lambda lr, run, spec=spec: _algorithm(spec, loss, lr, d, opts),
                    opts["lrs"], label=lambda lr: f"lr={lr:g}", batched=True)
          for m, spec in _specs(opts, cfg.rounds).items()}


def columns(m: str, tuned, ctx: Context, cfg: Config, opts: dict) -> dict:
  """The paper's number, the uplink's bits per parameter both ways, the final run's time."""
  up = tuned.records[0]["history"]["rounds"]["uplink_bits"]
  paper = ctx.extra["paper"]
  return {"paper %": paper.get(ctx.setting, {}).get(m),
          "bpp (paper's count)": paper.get("bpp", _bpp((m,))).get(m),
          "bpp sent": (up[-1] / len(up) / opts["cohort"] / ctx.extra["d"]) if up else None,
          "train s": tuned.records[0]["wall_time_s"]}


def report(results: dict, ctx: Context, cfg: Config, opts: dict) -> dict:
  """Table 2 (accuracy change against FedAvg summed over the splits) and, for the noise study,
  Fig. 5 (final accuracy against the noise scale)."""
  rows = results["table"].rows
  names = list(dict.fromkeys(r["method"] for r in rows))
  losses = {}
  for m in names:  # Table 2: summed accuracy change vs FedAvg over the splits run
    ours = [r["ours %"] for r in rows if r["method"] == m]
    base = [r["ours %"] for r in rows if r["method"] == "FedAvg"]
    if len(ours) == len(base) and None not in ours + base and "FedAvg" in names:
      losses[m] = float(np.sum(np.subtract(ours, base)))
  summed = ", ".join(f"{m} {v:+.1f}" for m, v in losses.items())
  paper = ctx.extra["paper"]
  if opts["study"] == "table1" and cfg.dataset in PAPER_OF:
    theirs = ", ".join(f"{m} {v:+.1f}" for m, v in paper["Table 2 summed change"].items())
    note = (f"Table 2 (accuracy change vs FedAvg summed over the splits run): {summed} — "
            f"{PAPERS[PAPER_OF[cfg.dataset]].source} (all three splits): {theirs}")
  elif opts["study"] == "table1":
    note = (f"Table 2 (accuracy change vs FedAvg summed over the splits run): {summed} — the "
            f"paper has no {cfg.dataset} column")
  elif opts["study"] == "table3" and "natural" in paper:
    row = paper["natural"]   # appendix Table 3's changes, from its printed values
    theirs = ", ".join(f"{m} {v - row['FedAvg']:+.1f}" for m, v in row.items() if m != "FedAvg")
    note = (f"{'mIoU' if cfg.dataset in SEGMENTATION else 'accuracy'} change vs FedAvg: "
            f"{summed} — {PAPERS[PAPER_OF[cfg.dataset]].source}: {theirs}")
  else:
    note = (f"accuracy change vs FedAvg summed over the splits run: {summed}\nthe paper's "
            f"claims: {ABLATION_CLAIMS if opts['study'] == 'ablation' else NOISE_CLAIMS}")
  out = {"study": opts["study"], "paper": ctx.extra["paper"], "accuracy_change": losses,
         "table": Table(rows, note=note)}
  if opts["study"] == "noise":  # Fig. 5: final accuracy against the noise scale
    curves = {}
    for r in rows:
      if r["method"] != "FedAvg":
        fam, dist, alpha = r["method"].split(" ")
        xs, ys = curves.setdefault(f"{fam} {dist} ({r['split']})", ([], []))
        xs.append(float(alpha[2:]))
        ys.append(r["ours %"])
    base = [r["ours %"] for r in rows if r["method"] == "FedAvg"]
    out["figures"] = [Figure("curves", dict(
        curves=curves, xlabel="noise scale α", ylabel="test accuracy %",
        title="Fashion-MNIST: accuracy vs noise",
        baseline=("FedAvg", base[0]) if base and base[0] is not None else None),
        suffix="_noise")]
  return out


run = declared(NAME, OPTIONS, setup=setup, methods=methods, report=report, papers=PAPERS,
               metric=lambda cfg, opts: "miou" if cfg.dataset in SEGMENTATION else "accuracy",
               tuning=Tuning(columns=columns))
