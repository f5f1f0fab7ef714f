"""The baselines of the DDSS experiments (Bao, Wu, Xian, Huang 2022) in Xidong Wu's
dissertation — not specified there beyond a name and a citation, so built from the cited works:

References:
  Fabian Pedregosa, Rémi Leblond, Simon Lacoste-Julien (2017). Breaking the Nonsmooth Barrier:
    A Scalable Parallel Method for Composite Optimization. NeurIPS 2017. arXiv:1707.06468.
  Rémi Leblond, Fabian Pedregosa, Simon Lacoste-Julien (2018). Improved Asynchronous Parallel
    Optimization Analysis for Stochastic Incremental Methods. JMLR 2018. arXiv:1801.03749.
  Qingyang Li, Shuang Qiu, Shuiwang Ji, et al. (2016). Parallel Lasso Screening for Big Data
    Optimization. ACM SIGKDD 2016. (no arXiv version found).

* **ProxASAGA** (Pedregosa, Leblond & Lacoste-Julien, NeurIPS 2017): asynchronous sparse
  proximal SAGA — a table ``α_i = f_i'(a_iᵀx)`` of the last derivative seen per sample and
  ``ᾱ = (1/n) Σ α_i a_i``; sample i sends ``δ = prox_{ηλφ_i}(x̂ − η v) − x̂`` with
  ``v = a_i(f_i'(a_iᵀx̂) − α_i) + D_i ᾱ`` — DDSS's sparse estimator with the table in place of
  the snapshot (it reuses :func:`fedjaxsparse.algorithms.ddss.sample_update`), no screening;
* **PSE-Safe / PSE-Strong** (Li et al., KDD 2016, the dissertation's ref. [62]): static
  screening once, before optimisation, with the SAFE rule (El Ghaoui et al.
  2012: drop j if ``|a_jᵀb| < nλ − ‖a_j‖‖b‖(λ_max − λ)/λ_max``, safe) or the basic strong rule
  (Tibshirani et al. 2012: drop j if ``|a_jᵀb| < n(2λ − λ_max)``, **not safe**), then
  asynchronous grouped coordinate descent on the kept features (assumed form:
  ``x_j ← soft(x_j − a_jᵀ(Ax − b)/‖a_j‖², nλ/‖a_j‖²)``; ``workers`` coordinates per tick from
  the same read). Lasso only.

Both follow the ``Algorithm`` interface of :mod:`fedjaxsparse.algorithms.ddss` (one ``step`` =
``inner_steps`` updates) and report the same counters and ``DDSSInfo``.

Source for the team: seed 004 Task 1, l. 257-265, 498-500; spec ``seed004.md`` §1.5 (also the
assumed PSE form).
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjaxsparse.convex import screening as SC
from fedjaxsparse.algorithms.ddss import (DDSSInfo, block_rows, partition, sample_update,
                                          worker_shards)
from fedjaxsparse.core import Algorithm
from fedjaxsparse.data.sparse_rows import SparseRows, columns, matvec, rmatvec
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["SAGAState", "prox_asaga", "PSEState", "static_keep", "pse"]
__dir__ = _public_dir(__all__)

PSE_RULES = ("safe", "strong")


class SAGAState(NamedTuple):
  """ProxASAGA's state: ``x``, the table ``alpha [n]`` (the last derivative seen per sample),
  ``alpha_bar [p]`` = ``(1/n) Σ α_i a_i``, ``epochs`` and ``touched`` (data passes and
  coordinates read), ``floats_up`` / ``floats_down`` (cumulative, distributed form)."""
  x: jax.Array
  alpha: jax.Array
  alpha_bar: jax.Array
  epochs: jax.Array
  touched: jax.Array
  floats_up: jax.Array
  floats_down: jax.Array

  @property
  def params(self) -> jax.Array:
    return self.x

  @property
  def floats_down_lazy(self) -> jax.Array:
    """What the workers read when they fetch only what they need: ProxASAGA's reads are that
    already (x and ᾱ on the sample's support)."""
    return self.floats_down


def _info(prob, data, x, active, up=None, down=None):
  """The *full* problem's gap (the dual scaled over every block): for PSE-Strong, which may
  discard a needed feature, the restricted problem's gap could reach 0 at a wrong point."""
  res = SC.screen(prob, data, x, jnp.ones(prob.num_blocks, bool))
  zero = jnp.zeros((), res.gap.dtype)
  return DDSSInfo(res.primal, zero if up is None else up, zero if down is None else down,
                  res.gap, jnp.sum(SC.coordinate_mask(prob, active)), res.radius)


@functools.partial(jax.jit, static_argnums=0)   # one program, not one per eager operation
def _saga_init(loss: str, x_init, data: SparseRows, n) -> SAGAState:
  """ProxASAGA's initial state at ``x_init``: the table's initial pass (``n`` a traced
  divisor, as in the operation-by-operation form)."""
  x = jnp.asarray(x_init, data.val.dtype)
  alpha = SC.deriv(loss, matvec(data, x), data.b)
  z = jnp.zeros((), data.val.dtype)
  return SAGAState(x, alpha, rmatvec(data, alpha) / n, z + 1.0,
                   jnp.sum(data.nnz_rows).astype(z.dtype), z, z)  # the table's initial pass


def prox_asaga(prob: SC.Problem, data: SparseRows, *, step_size: float, inner_steps: int,
               workers: int = 1, shards: int | None = None,
               per_shard_weights: bool = False) -> Algorithm:
  """ProxASAGA (Pedregosa, Leblond & Lacoste-Julien, 2017): asynchronous sparse proximal SAGA —
  a baseline of DDSS (Bao, Wu, Xian & Huang, 2022), which it is without screening and with a
  SAGA table in place of the SVRG snapshot.

  The problem is ``min_x P(x) = (1/n) Σ_i f_i(a_iᵀx) + λ Σ_j w_j ‖x_{G_j}‖₂`` over ``x [p]``
  (the Lasso, ℓ1-logistic regression or the weighted group Lasso, as ``prob`` says). The state
  holds a table ``α_i = f_i'(a_iᵀx)`` of the last derivative seen per sample and
  ``ᾱ = (1/n) Σ_i α_i a_i``. One ``step`` runs ``inner_steps`` updates, ``workers`` at a time
  from the same read ``x̂`` of x: each draws a sample i, forms
  ``v = a_i(f_i'(a_iᵀx̂) − α_i) + D_i ᾱ`` (``[D_i]_jj = n/n_j`` on supp(a_i), ``n_j`` the
  samples touching column j; whole blocks for the group Lasso) and sends
  ``δ = prox_{ηλφ_i}(x̂ − ηv) − x̂`` with ``φ_i = Σ_{j∈supp(a_i)} d_j|x_j|``, non-zero only on
  supp(a_i); the server adds the δ's, sets ``α_i ← f_i'(a_iᵀx̂)`` and updates ᾱ by
  ``(α_i^new − α_i^old) a_i / n``. The sample updates are DDSS's
  (:func:`fedjaxsparse.algorithms.ddss.sample_update`).

  ``shards`` (= ``workers``): the distributed form, like Dis-DDSS — worker k holds the k-th of
  ``workers`` disjoint sample shards and draws its samples there (so each table entry α_i lives
  with its sample's worker); the server holds x and ᾱ and adds the workers' messages. With
  ``per_shard_weights`` a worker's D_i are its shard's column counts (the prox's
  unbiasedness over its own draws), else the whole data's. Communication per update (floats,
  32 bits each): up, the sparse δ (values and indices) and the table's change (α_i's new value
  and the index i); down, x and ᾱ on the sample's support (values only: the worker knows
  a_i's pattern). Shared memory (``shards=None``) sends nothing.

  Args:
    prob: the :class:`~fedjaxsparse.convex.screening.Problem` to solve (loss, λ, the blocks
      G_j and their weights w_j), from ``fjs.convex.screening.make_problem(data, lam, loss)``
      on this same ``data``.
    data: the design matrix and targets as :class:`~fedjaxsparse.data.sparse_rows.SparseRows`
      (padded-CSR rows ``a_i [p]``, ``b [n]``); needed up front (the weights d_j, shards), and
      the data to give ``init`` and ``step``.
    step_size: the step size η > 0.
    inner_steps: the stochastic updates per ``step``, a multiple of ``workers``.
    workers: the updates per tick, all computed from the same read of x (default 1).
    shards: ``None`` (shared memory: every worker draws from all n samples) or ``workers``
      (the distributed form above).
    per_shard_weights: with ``shards``, take each worker's weights d_j from its own shard's
      column counts instead of the whole data's (default False).

  Returns:
    An :class:`~fedjaxsparse.core.Algorithm`. ``init(key, x_init, data)`` (``x_init [p]``; key
    unused; one pass fills the table) gives a
    :class:`~fedjaxsparse.algorithms.ddss_baselines.SAGAState`: ``state.params`` (=
    ``state.x [p]``), ``alpha [n]`` (the table), ``alpha_bar [p]`` (ᾱ), ``epochs`` (data
    passes, 1 after the table's initial pass, then inner_steps/n a step), ``touched``
    (matrix entries and coordinates read), ``floats_up`` / ``floats_down`` (cumulative
    communication in floats; 0 in shared memory) and ``floats_down_lazy`` (= ``floats_down``:
    the workers already read only what they need). ``step(key, state, data)`` returns
    ``(state, info)``, a :class:`~fedjaxsparse.algorithms.ddss.DDSSInfo` measured at the
    iterate the step starts from: ``loss`` (the objective P), ``gap`` (the duality gap),
    ``radius`` (the gap-safe radius, reported only), ``p_active`` (= p: no screening) and
    ``bits_up`` / ``bits_down`` (this step's communication; 0 in shared memory).

  References:
    Fabian Pedregosa, Rémi Leblond, Simon Lacoste-Julien (2017). Breaking the Nonsmooth Barrier:
      A Scalable Parallel Method for Composite Optimization. NeurIPS 2017. arXiv:1707.06468.
    Rémi Leblond, Fabian Pedregosa, Simon Lacoste-Julien (2018). Improved Asynchronous Parallel
      Optimization Analysis for Stochastic Incremental Methods. JMLR 2018. arXiv:1801.03749.
    Runxue Bao, Xidong Wu, Wenhan Xian, Heng Huang (2022). Doubly Sparse Asynchronous Learning
      for Stochastic Composite Optimization. IJCAI 2022. Preprint: Distributed Dynamic Safe
      Screening Algorithms for Sparse Regularization, arXiv:2204.10981.

  Source for the team: seed 004, Task 1 (its baselines); spec ``seed004.md`` §1.5.
  """
  if inner_steps % workers or not step_size > 0:
    raise ValueError("inner_steps must be a multiple of workers and step_size > 0.")
  if shards is not None and shards != workers:
    raise ValueError(f"shards must equal workers (one shard per worker), got {shards}.")
  block = partition(prob)
  grouped = None if block is None else block_rows(data, block)
  n = data.n
  rows, sizes, d = worker_shards(data, workers, shards, block, per_shard_weights)
  eta = jnp.asarray(step_size, data.val.dtype)
  every = jnp.ones(data.p, bool)

  def init(key, x_init, data):
    del key
    return _saga_init(prob.loss, x_init, data, n)

  def step(key, state, data):
    def tick(t, st):
      x, alpha, abar, touched, up, down = st
      ks, kt = jnp.arange(workers), jax.random.fold_in(key, t)
      if shards is None:   # every worker draws from all n samples
        ii = jax.random.randint(kt, (workers,), 0, n)
      else:                # worker k from its own shard
        ii = jax.vmap(lambda kk, k: rows[k, jax.random.randint(kk, (), 0, sizes[k])])(
            jax.random.split(kt, workers), ks)
      brows = block_rows(data) if grouped is None else grouped
      idx, delta, support = jax.vmap(lambda i, k: sample_update(
          prob, brows, x, i, every, alpha, abar, d[k], eta, "sparse_svrg", "sparse"))(ii, ks)
      new_alpha = jax.vmap(lambda i: SC.deriv(prob.loss, jnp.sum(data.val[i] * x[data.idx[i]]),
                                              data.b[i]))(ii)
      change = (new_alpha - alpha[ii])[:, None] * data.val[ii] / n
      abar = abar.at[data.idx[ii].ravel()].add(change.ravel())
      if shards is not None:
        up = up + 2.0 * jnp.sum(support) + 2.0 * workers     # δ (values, indices); α_i, i
        down = down + 2.0 * jnp.sum(data.nnz_rows[ii]).astype(up.dtype)  # x, ᾱ on a_i
      return (x.at[idx.ravel()].add(delta.ravel()), alpha.at[ii].set(new_alpha), abar,
              touched + jnp.sum(support), up, down)

    x, alpha, abar, touched, up, down = jax.lax.fori_loop(
        0, inner_steps // workers, tick,
        (state.x, state.alpha, state.alpha_bar, state.touched, state.floats_up,
         state.floats_down))
    info = _info(prob, data, state.x, jnp.ones(prob.num_blocks, bool),
                 32.0 * (up - state.floats_up), 32.0 * (down - state.floats_down))
    return SAGAState(x, alpha, abar, state.epochs + inner_steps / n, touched, up, down), info

  return Algorithm(init, step)


class PSEState(NamedTuple):
  x: jax.Array
  z: jax.Array       # A x [n]
  keep: jax.Array    # bool[p], fixed after the one-off screening
  epochs: jax.Array
  touched: jax.Array

  @property
  def params(self) -> jax.Array:
    return self.x


def static_keep(data: SparseRows, lam: float, rule: str) -> np.ndarray:
  """``bool[p]``: the features a static rule keeps for the Lasso at λ (1/n-normalised)."""
  if rule not in PSE_RULES:
    raise ValueError(f"rule must be one of {PSE_RULES}, got {rule!r}.")
  n = data.n
  corr = np.abs(np.asarray(rmatvec(data, data.b)))
  lmax = corr.max() / n
  if rule == "safe":
    bound = n * lam - np.sqrt(np.asarray(data.col_sq)) * np.linalg.norm(np.asarray(data.b)) * (
        lmax - lam) / lmax
  else:
    bound = n * (2 * lam - lmax)
  return corr >= bound


def pse(prob: SC.Problem, data: SparseRows, *, rule: str = "safe", inner_steps: int,
        workers: int = 1) -> Algorithm:
  """PSE-Safe / PSE-Strong (Li et al., 2016): static screening once, before optimisation, then
  asynchronous grouped coordinate descent on the kept features, for the Lasso — a baseline of
  DDSS (Bao, Wu, Xian & Huang, 2022).

  The problem is the Lasso ``min_x (1/n) Σ_i ½(b_i − a_iᵀx)² + λ‖x‖₁`` over ``x [p]``. Once,
  when the algorithm is built, a static rule keeps feature j (column ``a_j`` of A) unless, with
  ``λ_max = ‖Aᵀb‖_∞/n``:

  * ``rule="safe"`` (PSE-Safe, the SAFE rule of El Ghaoui et al., 2012):
    ``|a_jᵀb| < nλ − ‖a_j‖‖b‖(λ_max − λ)/λ_max`` — safe, it never drops a feature that is
    non-zero at the optimum;
  * ``rule="strong"`` (PSE-Strong, the basic strong rule of Tibshirani et al., 2012):
    ``|a_jᵀb| < n(2λ − λ_max)`` — **not safe**: it may drop a feature needed at the optimum.

  Dropped features stay 0. Each ``step`` then runs ``inner_steps`` coordinate updates,
  ``workers`` coordinates at a time drawn uniformly among the kept ones and computed from the
  same read of x: ``x_j ← soft(x_j − a_jᵀ(Ax − b)/‖a_j‖², nλ/‖a_j‖²)``, the exact coordinate
  minimiser (an assumed form: the papers do not state the update), with ``Ax`` kept up to
  date.

  Args:
    prob: the Lasso :class:`~fedjaxsparse.convex.screening.Problem` (``loss="squared"``,
      singleton blocks; its λ is screened for), from
      ``fjs.convex.screening.make_problem(data, lam)`` on this same ``data``; any other loss
      raises ``ValueError``.
    data: the design matrix and targets as :class:`~fedjaxsparse.data.sparse_rows.SparseRows`
      (padded-CSR rows ``a_i [p]``, ``b [n]``); screened up front, and the data to give
      ``init`` and ``step``.
    rule: the static screening rule, ``"safe"`` (PSE-Safe, default) or ``"strong"``
      (PSE-Strong).
    inner_steps: the coordinate updates per ``step``, a multiple of ``workers``.
    workers: the coordinates updated per tick, all from the same read of x (default 1).

  Returns:
    An :class:`~fedjaxsparse.core.Algorithm`. ``init(key, x_init, data)`` (``x_init [p]``; key
    unused; dropped features set to 0) gives a
    :class:`~fedjaxsparse.algorithms.ddss_baselines.PSEState`: ``state.params`` (=
    ``state.x [p]``), ``z [n]`` (= Ax), ``keep bool[p]`` (the kept features, fixed),
    ``epochs`` (data passes: 1 for the screening pass, then the updates' matrix entries read
    over nnz(A)) and ``touched`` (matrix entries read). ``step(key, state, data)`` returns
    ``(state, info)``, a :class:`~fedjaxsparse.algorithms.ddss.DDSSInfo` measured at the
    iterate the step starts from: ``loss`` (the objective P), ``gap`` (the duality gap of the
    *full* problem, so a feature wrongly dropped by the strong rule shows as a gap that stays
    positive), ``radius`` (the gap-safe radius, reported only), ``p_active`` (the kept
    features) and ``bits_up`` / ``bits_down`` (0: shared memory).

  References:
    Qingyang Li, Shuang Qiu, Shuiwang Ji, et al. (2016). Parallel Lasso Screening for Big Data
      Optimization. ACM SIGKDD 2016.
    Runxue Bao, Xidong Wu, Wenhan Xian, Heng Huang (2022). Doubly Sparse Asynchronous Learning
      for Stochastic Composite Optimization. IJCAI 2022. Preprint: Distributed Dynamic Safe
      Screening Algorithms for Sparse Regularization, arXiv:2204.10981.

  Source for the team: seed 004, Task 1 (its baselines); spec ``seed004.md`` §1.5 (the
  assumed coordinate-descent form).
  """
  if prob.loss != "squared":
    raise ValueError("PSE is defined for the Lasso (loss='squared') only.")
  if inner_steps % workers:
    raise ValueError("inner_steps must be a multiple of workers.")
  keep0 = static_keep(data, float(prob.lam), rule)
  cols = columns(data)
  n = data.n
  col_sq = data.col_sq
  kept = jnp.asarray(np.flatnonzero(keep0) if keep0.any() else np.zeros(1, int), jnp.int32)
  num_kept = int(keep0.sum())

  def init(key, x_init, data):
    del key
    x = jnp.asarray(x_init, data.val.dtype) * jnp.asarray(keep0)
    zero = jnp.zeros((), data.val.dtype)
    nnz = jnp.sum(data.nnz_rows).astype(zero.dtype)  # the screening pass (Aᵀb) reads A once
    return PSEState(x, matvec(data, x), jnp.asarray(keep0), zero + 1.0, nnz)

  def step(key, state, data):
    info = _info(prob, data, state.x, state.keep)
    if num_kept == 0:
      return state, info

    def tick(t, st):
      x, z, touched = st
      js = kept[jax.random.randint(jax.random.fold_in(key, t), (workers,), 0, num_kept)]

      def new_coord(j):
        r, v = cols.rows[j], cols.val[j]
        g = jnp.sum(v * (z[r] - data.b[r]))
        c = jnp.where(col_sq[j] > 0, col_sq[j], 1.0)
        u = x[j] - g / c
        return jnp.sign(u) * jnp.maximum(jnp.abs(u) - n * prob.lam / c, 0.0)

      new = jax.vmap(new_coord)(js)
      delta = new - x[js]
      z = z.at[cols.rows[js].ravel()].add((cols.val[js] * delta[:, None]).ravel())
      return x.at[js].add(delta), z, touched + jnp.sum(cols.val[js] != 0)

    x, z, touched = jax.lax.fori_loop(0, inner_steps // workers, tick,
                                      (state.x, state.z, state.touched))
    # a data pass = nnz(A) entries read: the CD updates' entries count in that unit
    return PSEState(x, z, state.keep, state.epochs + (touched - state.touched)
                    / jnp.sum(data.nnz_rows), touched), info

  return Algorithm(init, step)
