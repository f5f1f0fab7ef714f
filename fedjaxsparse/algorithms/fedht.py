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
  """FedHT (Tong et al., 2020): FedAvg (McMahan et al., 2017) whose server hard-thresholds the
  averaged model to its K largest entries — ``w ← TopK(mean_i LocalSGD_i(w))`` — the
  server-side Top-K baseline of Meinhardt et al. (2024), with no acceleration and no control
  variates.

  Round ``t``, global model ``w_t`` (a pytree with ``d`` entries), cohort ``S``::

      w_i     = LocalSGD_i(w_t)                  # local_steps steps of SGD with step lr
                                                 # (gradient clipping given clip)
      Δ_i     = w_i − w_t                        # uploaded: dense
      w_{t+1} = TopK(w_t + Σ_{i∈S} p_i Δ_i)      # = TopK(Σ_i p_i w_i); p_i = 1/|S| by default

  ``TopK`` keeps the ``K = max(1, round((1 − sparsity)·d))`` entries of largest magnitude over
  the whole model (``scope="global"``), or in every leaf (``"per_leaf"``, ``d`` the leaf's
  size), so the broadcast model (downlink) is K-sparse while the uploads are dense. Local SGD is
  :func:`~fedjaxsparse.algorithms.fedavg.clipped_sgd` (plain ``optax.sgd(lr)`` without
  ``clip``); the round is :func:`~fedjaxsparse.algorithms.fedavg.fedavg` with
  ``server_prox=proxes.top_k(sparsity=sparsity, scope=scope)``. Messages are charged by their
  non-zeros (``encoding="auto"``). The module docstring (:mod:`fedjaxsparse.algorithms.fedht`)
  compares FedHT with :func:`fediht`.

  Args:
    loss_fn: ``(params, x, y, mask) -> scalar`` for one client
      (:func:`fedjaxsparse.models.make_loss`).
    lr: the local SGD step size, a number > 0.
    local_steps: local SGD steps per round (≥ 1), each on ``batch_size`` examples (a
      ``fedavg`` keyword; ``None``, the default, is full batch).
    sparsity: the target fraction of zeros of the global model, in [0, 1) (checked when
      built).
    scope: ``"global"`` (Top-K over the whole model, as in FedHT) or ``"per_leaf"`` (the same
      sparsity in every leaf).
    weighting: the aggregation weights ``p_i``: ``"uniform"`` (``1/|S|``, the default, as in
      Algorithm 1 of Meinhardt et al. (2024)), ``"num_examples"`` (``n_i/Σ_S n_j``) or
      ``"sampling"`` (with a ``sampler``).
    clip: clip every local gradient (``None``: no clipping), as Meinhardt et al. (2024),
      Appendix E, train every method on CIFAR-10.
    clip_mode: ``"norm"`` (rescale the gradient to global norm ≤ ``clip``) or ``"value"``
      (clip every entry to [−clip, clip]).
    **kw: forwarded to :func:`fedjaxsparse.algorithms.fedavg.fedavg`: ``batch_size``
      (examples per local step; ``None``: full batch), ``epochs`` (epoch protocol instead of
      ``local_steps``), ``cohort_size`` (clients per round; ``None``: all) or ``sampler``,
      ``server_optimizer`` (optax transformation of the pseudo-gradient, applied before
      Top-K), ``uplink`` (a compressor of the uploads), ``encoding`` (bit accounting;
      ``"auto"`` here unless given), ``augment``, ``local_prox``, ``upload_prox``,
      ``server_sparsity``.

  Returns:
    FedAvg's :class:`fedjaxsparse.core.Algorithm`: its state is a
    :class:`fedjaxsparse.algorithms.cohort_round.CohortState` — ``state.params`` (the global
    model ``w_t``, K-sparse after the first round), ``state.clients`` (``()``, stateless
    clients), ``state.server_opt_state``, ``state.round`` (``int32[]``), ``state.server``
    (``()``) — and ``step`` reports a :class:`fedjaxsparse.algorithms.fedavg.FedAvgInfo`:
    ``info.loss`` (``Σ_i p_i loss_i`` at the broadcast model, each on the client's first
    local batch), ``info.bits_up`` (the dense deltas, charged by their non-zeros, summed over
    the cohort), ``info.bits_down`` (the broadcast model, charged by its non-zeros, summed
    over the cohort) and ``info.num_clients`` (``int32[]`` cohort size).

  References:
    Qianqian Tong, Guannan Liang, Tan Zhu, Jinbo Bi (2020). Federated Nonconvex Sparse
      Learning. arXiv preprint. arXiv:2101.00052.
    Georg Meinhardt, Kai Yi, Laurent Condat, Peter Richtárik (2024). Prune at the Clients, Not
      the Server: Accelerated Sparse Training in Federated Learning. arXiv preprint.
      arXiv:2405.20623.
    McMahan, H. Brendan; Eider Moore, Daniel Ramage, Seth Hampson, Blaise Agüera y Arcas
      (2017). Communication-Efficient Learning of Deep Networks from Decentralized Data.
      AISTATS 2017. arXiv:1602.05629.
  """
  kw.setdefault("encoding", "auto")
  return fedavg(loss_fn, clipped_sgd(check_positive("lr", lr), clip, clip_mode),
                local_steps=local_steps, weighting=weighting,
                server_prox=proxes.top_k(sparsity=sparsity, scope=scope), **kw)


def fediht(loss_fn: LossFn, lr: float, local_steps: int, sparsity: float, *,
           scope: str = "global", weighting: str = "uniform", prune_every_step: bool = False,
           clip: float | None = None, clip_mode: str = "norm", **kw) -> Algorithm:
  """FedIHT (Tong et al., 2020): FedAvg (McMahan et al., 2017) whose clients hard-threshold
  their models before uploading — ``w ← mean_i TopK(LocalSGD_i(w))`` — the client-side Top-K
  baseline of Meinhardt et al. (2024), with no acceleration and no control variates.

  Round ``t``, global model ``w_t`` (a pytree with ``d`` entries), cohort ``S``::

      w_i     = LocalSGD_i(w_t)                  # local_steps steps of SGD with step lr
                                                 # (+ TopK after every step if prune_every_step)
      u_i     = TopK(w_i)                        # uploaded as a model: K-sparse
      w_{t+1} = Σ_{i∈S} p_i u_i                  # p_i = 1/|S| by default; no re-pruning

  ``TopK`` keeps the ``K = max(1, round((1 − sparsity)·d))`` entries of largest magnitude over
  the whole model (``scope="global"``), or in every leaf (``"per_leaf"``, ``d`` the leaf's
  size). The uplink is K-sparse; the server does
  not prune the average, so the broadcast model has up to ``|S|·K`` non-zeros (Meinhardt et
  al. (2024) note that FedIHT "usually yields a model of 70-90% sparsity when given a target
  of 90%"). Whether the paper applies Top-K after every local step or only before upload is
  not stated: ``prune_every_step`` chooses (default: before upload only). Gradient clipping as
  in :func:`fedht`. The round is :func:`~fedjaxsparse.algorithms.fedavg.fedavg` with
  ``upload_prox=proxes.top_k(sparsity=sparsity, scope=scope)`` (aggregated as models);
  messages are charged by their non-zeros (``encoding="auto"``). See the module docstring
  (:mod:`fedjaxsparse.algorithms.fedht`).

  Args:
    loss_fn: ``(params, x, y, mask) -> scalar`` for one client
      (:func:`fedjaxsparse.models.make_loss`).
    lr: the local SGD step size, a number > 0.
    local_steps: local SGD steps per round (≥ 1), each on ``batch_size`` examples (a
      ``fedavg`` keyword; ``None``, the default, is full batch).
    sparsity: the target fraction of zeros of every upload, in [0, 1) (checked when built).
    scope: ``"global"`` (Top-K over the whole model) or ``"per_leaf"`` (the same sparsity in
      every leaf).
    weighting: the aggregation weights ``p_i``: ``"uniform"`` (``1/|S|``, the default, as in
      Algorithm 1 of Meinhardt et al. (2024)), ``"num_examples"`` (``n_i/Σ_S n_j``) or
      ``"sampling"`` (with a ``sampler``).
    prune_every_step: also apply Top-K to the client model after every local step (default
      ``False``: only before upload).
    clip: clip every local gradient (``None``: no clipping), as Meinhardt et al. (2024),
      Appendix E, train every method on CIFAR-10.
    clip_mode: ``"norm"`` (rescale the gradient to global norm ≤ ``clip``) or ``"value"``
      (clip every entry to [−clip, clip]).
    **kw: forwarded to :func:`fedjaxsparse.algorithms.fedavg.fedavg`: ``batch_size``
      (examples per local step; ``None``: full batch), ``epochs`` (epoch protocol instead of
      ``local_steps``), ``cohort_size`` (clients per round; ``None``: all) or ``sampler``,
      ``server_optimizer`` (optax transformation of the pseudo-gradient
      ``w_t − Σ_i p_i u_i``), ``uplink`` (a compressor of the uploads), ``encoding`` (bit
      accounting; ``"auto"`` here unless given), ``augment``, ``server_prox``,
      ``server_sparsity``.

  Returns:
    FedAvg's :class:`fedjaxsparse.core.Algorithm`: its state is a
    :class:`fedjaxsparse.algorithms.cohort_round.CohortState` — ``state.params`` (the global
    model ``w_t``, up to ``|S|·K`` non-zeros), ``state.clients`` (``()``, stateless clients),
    ``state.server_opt_state``, ``state.round`` (``int32[]``), ``state.server`` (``()``) —
    and ``step`` reports a :class:`fedjaxsparse.algorithms.fedavg.FedAvgInfo`: ``info.loss``
    (``Σ_i p_i loss_i`` at the broadcast model, each on the client's first local batch),
    ``info.bits_up`` (the K-sparse uploads, charged by their non-zeros, summed over the
    cohort), ``info.bits_down`` (the broadcast model, charged by its non-zeros, summed over
    the cohort) and ``info.num_clients`` (``int32[]`` cohort size).

  References:
    Qianqian Tong, Guannan Liang, Tan Zhu, Jinbo Bi (2020). Federated Nonconvex Sparse
      Learning. arXiv preprint. arXiv:2101.00052.
    Georg Meinhardt, Kai Yi, Laurent Condat, Peter Richtárik (2024). Prune at the Clients, Not
      the Server: Accelerated Sparse Training in Federated Learning. arXiv preprint.
      arXiv:2405.20623.
    McMahan, H. Brendan; Eider Moore, Daniel Ramage, Seth Hampson, Blaise Agüera y Arcas
      (2017). Communication-Efficient Learning of Deep Networks from Decentralized Data.
      AISTATS 2017. arXiv:1602.05629.
  """
  prox = proxes.top_k(sparsity=sparsity, scope=scope)
  kw.setdefault("encoding", "auto")
  return fedavg(loss_fn, clipped_sgd(check_positive("lr", lr), clip, clip_mode),
                local_steps=local_steps, weighting=weighting,
                upload_prox=prox, local_prox=prox if prune_every_step else None, **kw)
