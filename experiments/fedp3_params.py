"""FedP3 (Yi et al., ICLR 2024), Fig. C.1 of Kai Yi's dissertation: its parameter accounting —
how many parameters a "LowerB-like" client uploads and receives when it trains one layer plus
the final FC layer (FFC) and gets every other layer globally pruned to the keep ratio r —
computed from the chapter's networks (Table C.2). Pure arithmetic; no training, no data.

For each data set's network (:func:`~fedjaxsparse.models.fedp3_cnn`: conv 5×5 ×64 twice, FC
1600→1024, 1024→1024, the FFC 1024→classes — Fashion-MNIST read at 32×32 as the chapter's
numbers imply; EMNIST-L's MLP 784-1024-1024-1024-10), counted as Table C.2 counts (convolutions
with their biases, FC layers by their kernels):

* the **uplink** of a client training layer X: ``|X| + |FFC|``, and the spread
  ``(max − min)/min`` over X — the chapter's "10,815 times" (CIFAR-10), which is a
  percentage (10,815.25 %);
* the **deployed** model: ``|X| + |FFC| + r·(total − |X| − |FFC|)``
  (:func:`fedjaxsparse.algorithms.fedp3.deployed_size`) and its spread over X at each ``r``
  (the chapter's 57.93 % at r = 0.5 for CIFAR-10);
* Fig. C.1 itself: the parameters of every layer as each client deploys it, at each ``r``.

The chapter's printed numbers are shown beside ours; every one of them is
matched exactly (checked by a test).

Source for the team: seed 001 chapter 4, Fig. C.1, l. 3049-3079; the printed numbers at l. 1268,
3064; spec ``seed001_ch4_ch6.md`` §A.10.4.
"""
from __future__ import annotations

import jax
import numpy as np

from fedjaxsparse.algorithms.fedp3 import deployed_size
from fedjaxsparse.harness.options import Config, Option, name_list
from fedjaxsparse.harness.experiment import entry
from fedjaxsparse.harness.protocol import PaperConfig
from fedjaxsparse.harness.report import Figure, Table
from fedjaxsparse.models import fedp3_cnn, mlp
from fedjaxsparse.ops import layer_groups

NAME = "fedp3_params"
DESCRIPTION = "FedP3 (Yi et al., ICLR 2024): per-layer parameter accounting"
DEFAULTS = dict(rounds=1, clients=1, dataset="none", eval_every=1)
QUICK = dict(options=dict())
QUICK_RUNTIME = "measured 3 s on 2 CPU cores (arithmetic on the networks' shapes)"
BUDGET = "none (parameter counts; nothing is trained)"
RUNTIME = "seconds (parameter counts of four networks)"
NETWORKS = {  # name -> (input shape, classes, kind); FMNIST at 32x32 (its 1,638,400-weight FC)
    "cifar10": ((32, 32, 3), 10, "cnn"), "cifar100": ((32, 32, 3), 100, "cnn"),
    "fashion_mnist": ((32, 32, 1), 10, "cnn"), "emnist_l10": ((28, 28, 1), 10, "mlp")}
OPTIONS = (
    Option("networks", ",".join(NETWORKS), "comma list of " + ", ".join(NETWORKS), kind="str"),
    Option("ratios", [0.9, 0.7, 0.5], "global pruning keep ratios r", kind="floats", low=0.0,
           high=1.0),
)

PAPERS = {"figureC1": PaperConfig(
    "figureC1", "K. Yi's dissertation (FedP3) Fig. C.1 and its text (Table C.2's networks)",
    dataset="none", standin=None, clients=1, rounds=1, eval_every=1,
    options={"networks": ",".join(NETWORKS), "ratios": [0.9, 0.7, 0.5]},
    unit="spread (max - min)/min of the per-client counts, %",
    paper={"uplink spread %": {"cifar10": 10815.25, "cifar100": 1522.91,
                               "fashion_mnist": 13749.46, "emnist_l10": 30.23},
           "deployed spread % (r=0.5)": {"cifar10": 57.93}})}


def _printed(network: str) -> dict:
  """The chapter's printed numbers for ``network``: ``{quantity: value}``."""
  return {q: v[network] for q, v in PAPERS["figureC1"].paper.items() if network in v}


def layer_counts(name: str) -> tuple[list[str], np.ndarray]:
  """The network's layer names and Table C.2's parameter counts (convolutions with biases,
  FC layers without)."""
  shape, classes, kind = NETWORKS[name]
  model = (fedp3_cnn(shape, classes, channels=64, hidden=(1024, 1024)) if kind == "cnn"
           else mlp(shape, classes, hidden=(1024, 1024, 1024)))
  params = jax.eval_shape(model.init, jax.random.key(0))
  names = layer_groups.layer_names(params, 1)
  counts = [params[n]["kernel"].size + (params[n]["bias"].size if kind == "cnn" and
                                         params[n]["kernel"].ndim == 4 else 0)
            for n in names]
  return names, np.asarray(counts, np.float64)


def accounting(name: str, ratios) -> dict:
  """Uplinks and deployed sizes of the LowerB-like clients (one trained layer + the FFC)."""
  names, sizes = layer_counts(name)
  last = len(names) - 1
  rows = [np.eye(len(names), dtype=bool)[i] | np.eye(len(names), dtype=bool)[last]
          for i in range(last)]
  up = np.array([sizes[r].sum() for r in rows])
  spread = lambda v: float(100 * (v.max() - v.min()) / v.min())   # noqa: E731
  deployed = {r: np.array([deployed_size(sizes, row, r) for row in rows]) for r in ratios}
  return {"layers": names, "sizes": sizes, "uplink": up, "uplink spread %": spread(up),
          "deployed": deployed, "deployed spread %": {r: spread(v) for r, v in deployed.items()}}


def _run(cfg: Config, opts: dict) -> dict:
  ratios = [float(r) for r in opts["ratios"]]
  tables, figures, results = {}, [], {}
  for name in name_list(opts["networks"], "networks", tuple(NETWORKS)):
    a = accounting(name, ratios)
    paper = _printed(name)
    rows = [{"trained layer": a["layers"][i], "uplink": int(u),
             **{f"deployed (r={r:g})": int(round(a["deployed"][r][i])) for r in ratios}}
            for i, u in enumerate(a["uplink"])]
    rows.append({"trained layer": "spread (max-min)/min %",
                 "uplink": round(a["uplink spread %"], 2),
                 **{f"deployed (r={r:g})": round(a["deployed spread %"][r], 2) for r in ratios}})
    note = "; ".join(f"the paper's {k}: {v}" for k, v in paper.items())
    tables[name] = Table(rows, title=f"{name}: LowerB-like clients (one layer + FFC)",
                         note=note or None)
    results[name] = {"layers": a["layers"], "sizes": a["sizes"].astype(int).tolist(),
                     "uplink spread %": a["uplink spread %"],
                     "deployed spread %": {f"{r:g}": v for r, v in
                                           a["deployed spread %"].items()},
                     "paper": paper}
    bars = {f"r={r:g}": [float(s * (1.0 if i == len(a["layers"]) - 1 else r))
                         for i, s in enumerate(a["sizes"])] for r in [1.0] + ratios}
    figures.append(Figure("bars", dict(
        bars=bars, groups=a["layers"], ylabel="parameters (log)", logy=True,
        title=f"Fig. C.1 ({name}): parameters per layer under global pruning ratio r (the "
              f"FFC always trained)"), suffix=f"_{name}"))
  return {"experiment": NAME, "tables": tables, "networks": results, "figures": figures}


run = entry(NAME, OPTIONS, _run, PAPERS)
