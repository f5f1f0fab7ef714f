"""FedPAC: feature alignment of every client's representation to global class centroids, and
classifier collaboration — each client's head combined with the others' by a quadratic
programme on the simplex (:func:`simplex_qp`). A baseline of the Scafflix paper's
additional-baselines table, run as FedCR's and FedPAC's code run it.

References:
  Jian Xu, Xinyi Tong, Shao-Lun Huang (2023). Personalized Federated Learning with Feature
    Alignment and Classifier Collaboration. ICLR 2023. arXiv:2306.11867.

Source for the team: seed 001 l. 2919-25; ``seed001_ch3_ch5.md`` §B.1.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from fedjaxsparse.algorithms.cohort_round import ClientUpdate, ServerPart, cohort_round
from fedjaxsparse.algorithms.representation import (HeadsState, RoundInfo, check_options,
                                                    features_in_batches, local_optimizer)
from fedjaxsparse.core import Algorithm, as_float, float_dtype
from fedjaxsparse.errors import check_int, check_number
from fedjaxsparse.models.base import softmax_cross_entropy
from fedjaxsparse.models.split import SplitModel
from fedjaxsparse.ops import accounting
from fedjaxsparse.ops.aggregation import weighted_mean
from fedjaxsparse.ops.local import Schedule, at_round, epoch_optimize
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["FedPACState", "fedpac", "project_to_simplex", "simplex_qp"]
__dir__ = _public_dir(__all__)


class FedPACState(HeadsState):
  """:class:`~fedjaxsparse.algorithms.cohort_round.CohortState` of :func:`fedpac`: ``params``
  (the global ``{"body", "head"}``; its head is unused), ``clients`` (``{"head": personal
  heads}``, leaves ``[N, ...]``), ``server`` (``(centroids [C, F], has_centroid bool[C])``:
  the global feature centroids ``c_k`` and whether some client of the last cohort held class
  k), ``server_opt_state``, ``round``."""
  __slots__ = ()

  @property
  def centroids(self) -> jax.Array:
    return self.server[0]

  @property
  def has_centroid(self) -> jax.Array:
    return self.server[1]


def project_to_simplex(v: jax.Array, valid: jax.Array | None = None) -> jax.Array:
  """The Euclidean projection of ``v [m]`` onto the probability simplex
  ``{a ≥ 0, Σ a = 1}`` (Duchi et al., 2008, by sorting); coordinates with ``valid`` false are
  held at 0 (the projection onto the face of the valid ones)."""
  big = jnp.asarray(jnp.finfo(v.dtype).max / 4, v.dtype)
  w = v if valid is None else jnp.where(valid, v, -big)
  u = jnp.sort(w)[::-1]
  cssv = jnp.cumsum(jnp.where(u > -big, u, 0.0)) - 1.0
  k = jnp.arange(1, v.shape[0] + 1, dtype=v.dtype)
  cond = (u - cssv / k > 0) & (u > -big)
  rho = jnp.max(jnp.where(cond, jnp.arange(v.shape[0]), 0))
  theta = cssv[rho] / (rho + 1).astype(v.dtype)
  return jnp.maximum(w - theta, 0.0)


def simplex_qp(p: jax.Array, valid: jax.Array | None = None, iterations: int = 500
               ) -> jax.Array:
  """``argmin_{a ∈ Δ} aᵀ P a`` for a symmetric positive semi-definite ``P [m, m]`` over the
  probability simplex (restricted to the ``valid`` coordinates): accelerated projected
  gradient (FISTA) with step ``1/(2λ_max(P))`` from the uniform point, ``iterations`` steps
  (FedPAC's classifier-combination problem; its code calls CVXPY)."""
  m = p.shape[0]
  ok = jnp.ones((m,), bool) if valid is None else valid
  lam = 2.0 * jnp.max(jnp.linalg.eigvalsh(p))
  step = 1.0 / jnp.maximum(lam, jnp.finfo(p.dtype).tiny)
  a0 = ok.astype(p.dtype) / jnp.maximum(jnp.sum(ok), 1).astype(p.dtype)

  def body(_, carry):
    a, y, t = carry
    a_new = project_to_simplex(y - step * 2.0 * (p @ y), ok)
    t_new = 0.5 * (1.0 + jnp.sqrt(1.0 + 4.0 * t * t))
    y_new = a_new + ((t - 1.0) / t_new) * (a_new - a)
    return a_new, y_new, t_new

  a, _, _ = jax.lax.fori_loop(0, iterations, body, (a0, a0, jnp.ones((), p.dtype)))
  return a


def fedpac(model: SplitModel, lr: float | Schedule, *, lam: float = 1.0, epochs: int = 1,
           head_epochs: int = 1, head_lr: float = 0.1, batch_size: int = 50,
           cohort_size: int | None = 10, momentum: float = 0.5, weight_decay: float = 5e-4,
           clip: float | None = None, weighting: str = "num_examples",
           combine_heads: bool = True, min_weight: float = 1e-3, qp_iterations: int = 500,
           sampler: Any = None,
           server_optimizer: optax.GradientTransformation | None = None,
           client_optimizer: Any = None) -> Algorithm:
  """FedPAC (Xu, Tong and Huang 2023): feature alignment to global class centroids and
  personalised classifier combination.

  Round t, every client i of the cohort, starting from ``(φ_t, h_i)``:

  1. statistics of its training data under ``φ_t`` (features ``f ∈ R^F``): class shares
     ``p_ik = n_ik/n_i``, class centroids ``μ_ik``,
     ``V_i = (Σ_k p_ik tr(E[f fᵀ | k]) − Σ_k p_ik² ‖μ_ik‖²) / n_i`` and ``H_i[k] = p_ik μ_ik``;
  2. ``head_epochs`` epochs on the head alone (step ``head_lr``), then ``epochs`` epochs on the
     body alone with ``CE + λ·mean_{b,j} (f_j(x_b) − c_{y_b, j})²`` — ``c_k`` the global
     centroid, or the client's own ``μ_ik`` where no global one exists; no alignment term in the
     first round (SGD with ``momentum``, ``weight_decay``; FedPAC's code: 0.5 and 5e-4);
  3. uploads ``φ_i``, ``ĥ_i``, the trained model's class centroids ``μ'_ik`` with ``n_ik``,
     and ``(V_i, H_i)``.

  The server averages the bodies (data-size weights), sets ``c_k = Σ_i n_ik μ'_ik / Σ_i n_ik``
  over the cohort (classes nobody in it holds have none), and gives every cohort client the
  combined head ``h_i = Σ_j α_ij ĥ_j / Σ_j α_ij`` with

      α_i = argmin_{α ∈ Δ} Σ_j α_j² V_j + Σ_k ‖Σ_j α_j (H_i[k] − H_j[k])‖²
          = argmin αᵀ (diag V + D_i) α,   D_i[j, j'] = Σ_k (H_i[k] − H_j[k])·(H_i[k] − H_j'[k]),

  (:func:`simplex_qp`), weights below ``min_weight`` set to 0 (FedPAC's code). With
  ``combine_heads=False`` each client keeps its ``ĥ_i``.

  A client update on :func:`~fedjaxsparse.algorithms.cohort_round.cohort_round`: the global
  centroids are its server part, the combined heads the server's reply to the members.

  No ``uplink``: the upload holds class statistics beside the body.

  Choices from FedPAC's code where the paper is silent: the statistics use the model the
  client receives, before training; the alignment loss is the mean squared error over the
  batch and the F features; ``V_i`` is divided by ``n_i``. FedPAC's code projects ``P`` onto
  the positive semi-definite cone when CVXPY would refuse it; ``diag V + D_i`` is a Gram
  matrix plus a non-negative diagonal, so it never needs to.

  Args:
    model: a :class:`~fedjaxsparse.models.split.SplitModel` with a deterministic
      representation (:func:`fedjaxsparse.models.split.fedcr_net` with ``gaussian=False``).
    lr: the body's step size η > 0, or a schedule of the round ``t -> η_t``.
    lam: λ ≥ 0, the weight of the feature alignment term (the paper: 1).
    epochs: local epochs on the body per round (≥ 1).
    head_epochs: local epochs on the head alone, before the body's (≥ 0).
    head_lr: the head's step size (FedPAC's code: 0.1).
    batch_size: B examples per local step.
    cohort_size: clients per round, uniform without replacement (``None``: all).
    momentum: heavy-ball momentum of :func:`~fedjaxsparse.algorithms.representation.local_optimizer`, for both parts (FedPAC's code:
      0.5).
    weight_decay: weight decay of :func:`~fedjaxsparse.algorithms.representation.local_optimizer`, for both parts (FedPAC's code:
      5e-4).
    clip: the global norm the local gradient is clipped at (:func:`~fedjaxsparse.algorithms.representation.local_optimizer`, both
      parts; ``None``: no clipping).
    weighting: the bodies' aggregation weights: ``"num_examples"`` (the paper), ``"uniform"``
      or ``"sampling"`` (with ``sampler``).
    combine_heads: give every member the combination of the cohort's heads (else each keeps
      its own).
    min_weight: combination weights below it are set to 0 (FedPAC's code: 1e-3).
    qp_iterations: iterations of :func:`simplex_qp`.
    sampler: a :class:`fedjaxsparse.ops.sampling.Sampler` drawing each round's cohort instead
      of a uniform one of ``cohort_size``; forwarded to
      :func:`~fedjaxsparse.algorithms.cohort_round.cohort_round`.
    server_optimizer: an optax transformation of the bodies' pseudo-gradient ``−Δ``; ``None``
      applies the average as it is. Forwarded to
      :func:`~fedjaxsparse.algorithms.cohort_round.cohort_round`.
    client_optimizer: an optax transformation (or a function of the round returning one) for
      the body's epochs instead of :func:`~fedjaxsparse.algorithms.representation.local_optimizer` with ``lr`` (the head keeps its SGD
      with ``head_lr``).

  Returns:
    An :class:`~fedjaxsparse.core.Algorithm` whose state is a :class:`FedPACState`:
    ``state.params`` (the global ``{"body", "head"}``; its head is unused),
    ``state.clients`` (``{"head": personal heads}``, leaves ``[N, ...]``), ``state.heads``,
    ``state.personal`` (every client's ``{"body": φ, "head": h_i}``, leaves ``[N, ...]``),
    ``state.server`` = ``(state.centroids [C, F], state.has_centroid bool[C])`` (the global
    centroids ``c_k`` and whether some client of the last cohort held class k),
    ``state.server_opt_state`` and ``state.round``. ``step(key, state, data)`` returns
    ``(state, info)``, ``info`` a :class:`~fedjaxsparse.algorithms.representation.RoundInfo`: ``loss`` (the cohort's first-step loss
    — of the head's epochs, or of the body's with ``head_epochs=0`` — weighted as the
    aggregation), ``bits_up`` (per member: body, head and the statistics ``V_i``, ``H_i``,
    centroids and counts, ``1 + 2CF + C`` floats, 32 bits a float), ``bits_down`` (per
    member: the body and the C·F global centroids, fp32) and ``num_clients``.

  References:
    Jian Xu, Xinyi Tong, Shao-Lun Huang (2023). Personalized Federated Learning with Feature
      Alignment and Classifier Collaboration. ICLR 2023. arXiv:2306.11867. (Code:
      github.com/JianXu95/FedPAC.)
  """
  check_options(lr, epochs, batch_size, 1, momentum, weight_decay, clip)
  check_number("head_lr", head_lr, 0.0, None, low_open=True)
  check_number("lam", lam, 0.0, None)
  check_number("min_weight", min_weight, 0.0, 1.0, high_open=True)
  for name, v in (("head_epochs", head_epochs), ("qp_iterations", qp_iterations)):
    check_int(name, v, 0)
  if model.gaussian:
    raise ValueError("fedpac needs a SplitModel with a deterministic representation "
                     "(fedcr_net(..., gaussian=False)).")

  def ce_loss(p, key, x, y, mask, centroids, align):
    del key
    f = model.features(p["body"], x)
    per = softmax_cross_entropy(model.head(p["head"], f), y)
    count = jnp.maximum(jnp.sum(mask), 1.0)
    total = jnp.sum(per * mask) / count
    if lam:
      sq = jnp.mean(jnp.square(f - centroids[y]), axis=-1)
      total = total + align * lam * jnp.sum(sq * mask) / count
    return total, None

  def statistics(body, data, num_classes):
    """Class counts [C], centroids [C, F] and mean squared norms [C] of φ's features."""
    f = features_in_batches(model, body, data.x, batch_size)
    onehot = jax.nn.one_hot(data.y, num_classes, dtype=f.dtype) * data.mask[:, None]
    counts = jnp.sum(onehot, axis=0)
    safe = jnp.maximum(counts, 1.0)
    return counts, (onehot.T @ f) / safe[:, None], (onehot.T @ jnp.sum(f * f, -1)) / safe

  def client(w, head, key, data, body_opt, round_, centroids, has, steps_head, steps_body):
    num_classes = centroids.shape[0]
    counts, mu, sq = statistics(w["body"], data, num_classes)
    n = jnp.maximum(jnp.sum(counts), 1.0)
    share = counts / n
    v = (jnp.sum(share * sq) - jnp.sum(jnp.square(share) * jnp.sum(mu * mu, -1))) / n
    h_ref = share[:, None] * mu
    target = jnp.where(has[:, None], centroids, mu)
    align = (round_ > 0).astype(mu.dtype)
    loss = lambda p, k, x, y, m: ce_loss(p, k, x, y, m, target, align)
    start = {"body": w["body"], "head": head}
    only = lambda part: {"body": jax.tree.map(lambda _: part == "body", w["body"]),
                         "head": jax.tree.map(lambda _: part == "head", head)}
    k_head, k_body = jax.random.split(key)
    p, first = start, jnp.zeros((), mu.dtype)
    if head_epochs:
      p, _, first = epoch_optimize(
          loss, p, local_optimizer(head_lr, momentum, weight_decay, clip), k_head, data,
          epochs=head_epochs, batch_size=batch_size,
          max_steps=steps_head, trainable=only("head"))
    p, _, body_first = epoch_optimize(
        loss, p, body_opt, k_body, data,
        epochs=epochs, batch_size=batch_size,
        max_steps=steps_body, trainable=only("body"))
    new_counts, new_mu, _ = statistics(p["body"], data, num_classes)
    return p, new_counts, new_mu, v, h_ref, first if head_epochs else body_first

  def init(key, params, n):
    del key
    return {"head": jax.tree.map(lambda a: jnp.broadcast_to(a, (n,) + a.shape),
                                 params["head"])}

  def server_init(params, n):
    del n
    num_classes = jax.tree.leaves(params["head"])[-1].shape[-1]
    return (jnp.zeros((num_classes, model.dim), float_dtype()),
            jnp.zeros((num_classes,), bool))

  def update(key, broadcast, st, dd, t):
    w, (centroids, has) = broadcast
    per_epoch = -(-dd.mask.shape[0] // batch_size)       # the padded data's bound
    body_opt = at_round(client_optimizer, t) or local_optimizer(at_round(lr, t), momentum,
                                                                weight_decay, clip)
    p, counts, mu, v, h_ref, loss = client(
        w, st["head"], key, dd, body_opt, t, centroids, has,
        max(head_epochs, 1) * per_epoch, epochs * per_epoch)
    message = {"body": jax.tree.map(jnp.subtract, p["body"], w["body"]), "head": p["head"],
               "counts": counts, "mu": mu, "v": v, "h_ref": h_ref}
    return message, {"head": p["head"]}, {"loss": loss}

  def aggregate(messages, weights, w):
    return {"body": weighted_mean(messages["body"], weights),
            "head": jax.tree.map(jnp.zeros_like, w["head"])}

  def server_update(server, messages, weights, w, t):
    """The global centroids: every class's features averaged over the members holding it."""
    del server, w, t
    held = messages["counts"] * (weights > 0).astype(float_dtype())[:, None]   # [m, C]
    total = jnp.sum(held, axis=0)
    centroids = (jnp.einsum("mc,mcf->cf", held, messages["mu"])
                 / jnp.maximum(total, 1.0)[:, None])
    return centroids, total > 0

  def reply(states, messages, weights, w, server):
    """Each member's head: the combination of the cohort's heads (the simplex QP)."""
    del w, server
    if not combine_heads:
      return states
    valid = weights > 0
    h_ref, v, heads = messages["h_ref"], messages["v"], messages["head"]
    flat = h_ref.reshape(h_ref.shape[0], -1)                            # [m, C·F]

    def combine(i):
      diff = flat[i][None] - flat                                       # [m, C·F]
      alpha = simplex_qp(jnp.diag(v) + diff @ diff.T, valid, qp_iterations)
      alpha = jnp.where(alpha >= min_weight, alpha, 0.0)
      alpha = alpha / jnp.maximum(jnp.sum(alpha), jnp.finfo(alpha.dtype).tiny)
      return jax.tree.map(lambda hh: jnp.tensordot(alpha.astype(hh.dtype), hh, axes=1), heads)

    return {"head": jax.lax.map(combine, jnp.arange(flat.shape[0]))}

  def stats_floats(w):   # V_i, H_i, centroids, counts
    c = jax.tree.leaves(w["head"])[-1].shape[-1]
    return 1 + 2 * c * model.dim + c

  def upload_bits(message, w):
    del message
    return as_float(accounting.dense_bits(w["body"]) + accounting.dense_bits(w["head"])
                    + 32.0 * stats_floats(w))

  def download_bits(w):
    c = jax.tree.leaves(w["head"])[-1].shape[-1]
    return as_float(accounting.dense_bits(w["body"]) + 32.0 * c * model.dim)

  return cohort_round(
      ClientUpdate(init, update, upload_bits=upload_bits, download_bits=download_bits,
                   info_type=RoundInfo, state_type=FedPACState,
                   server=ServerPart(server_init, server_update, reply)),
      cohort_size=cohort_size, sampler=sampler, weighting=weighting, aggregate=aggregate,
      server_optimizer=server_optimizer)
