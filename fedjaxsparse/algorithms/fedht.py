"""FedHT and FedIHT (Tong et al., 2020, "Federated Nonconvex Sparse Learning"), the
FedAvg-with-Top-K baselines of Meinhardt et al. (2024), Section 4: no acceleration, no control
variates. Both are :func:`~fedjaxsparse.algorithms.fedavg.fedavg` with Top-K hooks.

References:
  Qianqian Tong, Guannan Liang, Tan Zhu, Jinbo Bi (2020). Federated Nonconvex Sparse Learning.
    arXiv preprint. arXiv:2101.00052.
  Georg Meinhardt, Kai Yi, Laurent Condat, Peter Richtárik (2024). Prune at the Clients, Not
    the Server: Accelerated Sparse Training in Federated Learning. arXiv preprint.
    arXiv:2405.20623.

* FedHT: clients train dense and upload dense models; the server hard-thresholds the average
  (downlink K-sparse).
* FedIHT: clients hard-threshold before uploading (uplink K-sparse); the server averages without
  re-pruning, so the broadcast model has up to N·K non-zeros (Meinhardt et al. (2024) note that
  FedIHT "usually yields a model of 70-90% sparsity when given a target of 90%"). Whether Top-K is
  applied after every local step or only before upload is not stated: ``prune_every_step`` (default
  False, pre-upload only).

Aggregation is uniform by default, as in Algorithm 1 of Meinhardt et al. (2024)
(``weighting=``). Messages are charged by their non-zeros (``encoding="auto"``).

Source for the team: seed 000 §4, Algorithm 1; spec ``specs/seed000_003.md`` A.12.
"""
from __future__ import annotations

from fedjaxsparse.algorithms.fedavg import LossFn, clipped_sgd, fedavg
from fedjaxsparse.ops import proxes
from fedjaxsparse.core import Algorithm
from fedjaxsparse.errors import check_positive
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["fedht", "fediht"]
__dir__ = _public_dir(__all__)


def fedht(loss_fn: LossFn, lr: float, local_steps: int, sparsity: float, *,
          scope: str = "global", weighting: str = "uniform", clip: float | None = None,
          clip_mode: str = "norm", **kw) -> Algorithm:
  """FedHT: ``w ← TopK(mean_i LocalSGD_i(w))`` (local SGD with gradient clipping given
  ``clip``: :func:`~fedjaxsparse.algorithms.fedavg.clipped_sgd`)."""
  kw.setdefault("encoding", "auto")
  return fedavg(loss_fn, clipped_sgd(check_positive("lr", lr), clip, clip_mode), local_steps=local_steps,
                weighting=weighting,
                server_prox=proxes.top_k(sparsity, scope), **kw)


def fediht(loss_fn: LossFn, lr: float, local_steps: int, sparsity: float, *,
           scope: str = "global", weighting: str = "uniform", prune_every_step: bool = False,
           clip: float | None = None, clip_mode: str = "norm", **kw) -> Algorithm:
  """FedIHT: ``w ← mean_i TopK(LocalSGD_i(w))`` (Top-K also after every local step if
  ``prune_every_step``; gradient clipping as in :func:`fedht`)."""
  prox = proxes.top_k(sparsity, scope)
  kw.setdefault("encoding", "auto")
  return fedavg(loss_fn, clipped_sgd(check_positive("lr", lr), clip, clip_mode), local_steps=local_steps,
                weighting=weighting,
                upload_prox=prox, local_prox=prox if prune_every_step else None, **kw)
