"""Distributed dynamic safe screening inside variance-reduced proximal SGD.

References:
  Runxue Bao, Xidong Wu, Wenhan Xian, Heng Huang (2022). Doubly Sparse Asynchronous Learning
    for Stochastic Composite Optimization. IJCAI 2022 (the venue Xidong Wu's thesis cites for
    DDSS); the method's preprint: Distributed Dynamic Safe Screening Algorithms for Sparse
    Regularization, arXiv:2204.10981.
  Eugene Ndiaye, Olivier Fercoq, Alexandre Gramfort, Joseph Salmon (2017). Gap Safe Screening
    Rules for Sparsity Enforcing Penalties. JMLR 18(128). arXiv:1611.05780.
  Qi Meng, Wei Chen, Jingcheng Yu, Taifeng Wang, Zhi-Ming Ma, Tie-Yan Liu (2017). Asynchronous
    Stochastic Proximal Optimization Algorithms with Variance Reduction. AAAI 2017.
    arXiv:1609.08435.

One ``step`` is one **outer iteration** s: a full pass computes ``∇F(x⁰)`` and ``ρ⁰`` at the
snapshot, the gap-safe test (:mod:`fedjaxsparse.convex.screening`) shrinks the active blocks, then
``inner_steps`` stochastic proximal updates run, ``workers`` at a time in one ``vmap``:

* ``estimator="sgd"`` (the Naive variants, Sha-/Dis-DDSS-Naive): ``v = a_i f_i'(a_iᵀx̂)``;
* ``"svrg"``: ``v = a_i(f_i'(a_iᵀx̂) − ρ⁰_i) + ∇F(x⁰)`` (dense);
* ``"sparse_svrg"`` (the DDSS estimator): ``v = a_i(f_i'(a_iᵀx̂) − ρ⁰_i) + D_i ∇F(x⁰)``,
  ``[D_i]_jj = n/n_j`` on supp(a_i) (``n_j`` = samples touching column j), supported on supp(a_i);
* ``prox="dense"``: the server applies ``x ← prox_{ηλΩ}(x − ηv)`` on every active coordinate,
  one worker's v after another (the Naive variants); ``prox="sparse"``: each worker sends
  ``δ = prox_{ηλφ_i}(x̂ − ηv) − x̂`` with ``φ_i = Σ_{j∈supp(a_i)} d_j|x_j|`` and the server only
  adds (the paper's decoupled prox, used by Sha-DDSS and Dis-DDSS).

**Asynchrony is emulated, not timed** (it does not reproduce lock-free hardware timing): in each
tick the ``workers`` updates are computed from reads of x, then applied (scatter-add for
``δ``s, in order for dense proxes). With ``staleness=0`` every worker reads the current x (a
delay of up to ``workers − 1`` updates; ``workers=1`` is the synchronous limit that the paper's
convergence theorem treats); with ``staleness=τ`` each worker reads the iterate of a tick drawn
uniformly among the last τ + 1 (a ring buffer of τ + 1 iterates, (τ + 1)·p memory), i.e. a
delay of up to ``(τ + 1)·workers − 1`` updates — the paper's bounded-overlap assumption. Its
theorem needs ``τ ≤ 1/(10√Δ)``; on dense data (Δ = 1) that allows no delay at all, and
same-read workers with the sparse prox can stall short of the optimum where one worker
converges — use ``workers=1`` or sparse data there.
The anchor ``ρ⁰`` is cached at the *pre-elimination* snapshot (our anchor-consistency fix), so
the estimators stay exactly unbiased after coordinates are eliminated.

**Distributed variants** (``shards=``, Dis-DDSS-Naive and Dis-DDSS): the samples are split over
the workers and worker k draws from its own shard; ``per_shard_weights=True`` uses
``d^k_j = n_k/n^k_j`` instead of the paper's global ``d_j`` (with global weights one worker's v
is biased unless all shards report equally often). Communication is counted in floats per
direction: snapshot ``p_s`` down and up per worker, the screening result and ``∇F(x⁰)`` down
(the mask as ``p_s/32`` floats), then per inner update the worker's read of x (``p_{s+1}``
floats, dense) down and its message (``|supp(a_i) ∩ B|`` values + as many indices) up.

Named configurations: :func:`sha_ddss_naive`, :func:`sha_ddss`, :func:`dis_ddss_naive`,
:func:`dis_ddss`, and the baseline :func:`prox_asvrg` (Meng et al., 2017: SVRG with a dense prox,
no screening). Every configuration works for singleton blocks (Lasso, ℓ1-logistic) and for the
(weighted) group Lasso: there ``D_i`` and the sparse prox act on whole blocks of Ψ_i, laid out
once on the host by :func:`block_rows` (memory n·max|Ψ_i|·max|G|).

Source for the team: seed 004, Task 1, Algorithms 1-6, l. 326-473; spec ``seed004.md``
§1.3-§1.5, §1.7 (communication), §1.9; equations (3-5), (3-6), (3-9)/(3-10); Theorem 1,
Assumption 3.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from fedjaxsparse.convex import screening as SC
from fedjaxsparse.core import Algorithm, shared_doc
from fedjaxsparse.data.sparse_rows import SparseRows
from fedjaxsparse.runtime.sharding import CLIENT_AXIS
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["DDSSState", "DDSSInfo", "BlockRows", "block_rows", "column_weights", "sample_update",
           "partition", "worker_shards", "ddss", "sha_ddss_naive", "sha_ddss", "dis_ddss_naive",
           "dis_ddss", "prox_asvrg"]
__dir__ = _public_dir(__all__)

ESTIMATORS = ("sgd", "svrg", "sparse_svrg")
PROXES = ("dense", "sparse")


class DDSSState(NamedTuple):
  """``x [p]`` (eliminated coordinates 0), ``active bool[q]``, counters: ``s`` (outer
  iterations), ``epochs`` (data passes), ``touched`` (matrix entries / coordinates read or
  written: nnz(A) per full-gradient pass plus each inner update's coordinates), ``floats_up`` /
  ``floats_down`` (communication, counted as in the module docstring; 0 in shared memory),
  ``floats_down_lazy``: the downlink if each worker pulls only the ``|supp(a_i) ∩ B|``
  coordinates it reads (the paper does not say which its code did)."""
  x: jax.Array
  active: jax.Array
  s: jax.Array
  epochs: jax.Array
  touched: jax.Array
  floats_up: jax.Array
  floats_down: jax.Array
  floats_down_lazy: jax.Array

  @property
  def params(self) -> jax.Array:
    return self.x


class DDSSInfo(NamedTuple):
  """The library's info convention (:mod:`fedjaxsparse.core`): ``loss`` (the objective P at
  the snapshot), ``bits_up`` / ``bits_down`` (this step's communication, 32 bits a float; 0
  in shared memory); and at the snapshot: ``gap``, ``p_active`` (active coordinates after
  the test), ``radius``."""
  loss: jax.Array
  bits_up: jax.Array
  bits_down: jax.Array
  gap: jax.Array
  p_active: jax.Array
  radius: jax.Array


class BlockRows(NamedTuple):
  """Each sample's blocks Ψ_i (the blocks meeting supp(a_i)) laid out for the sparse updates:
  ``idx int32[n, m, w]`` the coordinates of its m blocks (w = the widest block; padded),
  ``val [n, m, w]`` a_i there (0 off supp(a_i)), ``valid bool[n, m, w]``, ``b [n]``. For
  singleton blocks (w = 1) it is the padded CSR itself (:func:`block_rows` with no blocks)."""
  idx: jax.Array
  val: jax.Array
  valid: jax.Array
  b: jax.Array


def block_rows(data: SparseRows, block: np.ndarray | None = None) -> BlockRows:
  """The :class:`BlockRows` of ``data`` for the partition ``block int[p]`` (None: singletons,
  jittable; otherwise built on the host — per-sample block lists and block→coordinate tables,
  flattened into one gather)."""
  if block is None:
    return BlockRows(data.idx[..., None], data.val[..., None], (data.val != 0)[..., None], data.b)
  block = np.asarray(block)
  idx, val = np.asarray(data.idx), np.asarray(data.val)
  q, n = int(block.max()) + 1, idx.shape[0]
  members = [np.flatnonzero(block == g) for g in range(q)]
  w = max(len(c) for c in members)
  table = np.zeros((q, w), np.int64)
  table_ok = np.zeros((q, w), bool)
  for g, c in enumerate(members):
    table[g, :len(c)], table_ok[g, :len(c)] = c, True
  psi = [np.unique(block[idx[i][val[i] != 0]]) for i in range(n)]
  m = max(1, max(len(b) for b in psi))
  blocks = np.zeros((n, m), np.int64)
  blocks_ok = np.zeros((n, m), bool)
  for i, b in enumerate(psi):
    blocks[i, :len(b)], blocks_ok[i, :len(b)] = b, True
  coords = table[blocks]                                   # [n, m, w]
  valid = table_ok[blocks] & blocks_ok[..., None]
  dense_row = np.zeros(data.p, val.dtype)
  out_val = np.zeros(coords.shape, val.dtype)
  for i in range(n):
    nz = val[i] != 0
    dense_row[idx[i][nz]] = val[i][nz]
    out_val[i] = np.where(valid[i], dense_row[coords[i]], 0.0)
    dense_row[idx[i][nz]] = 0.0
  # device_put of host arrays: no program compiled per shape (as jnp.asarray would)
  return BlockRows(*jax.device_put((coords.astype(np.int32), out_val, valid)), data.b)


def column_weights(data: SparseRows, rows: np.ndarray | None = None,
                   block: np.ndarray | None = None) -> np.ndarray:
  """Per coordinate, ``d_G = m / m_G`` of its block G over the samples ``rows`` (default all; m =
  their count, m_G = how many of them touch G; ``block=None``: singletons), 0 for untouched
  blocks. ``E_i D_i = I`` on touched blocks."""
  idx, val = np.asarray(data.idx), np.asarray(data.val)
  if rows is not None:
    idx, val = idx[rows], val[rows]
  block = np.arange(data.p) if block is None else np.asarray(block)
  q = int(block.max()) + 1
  which = np.repeat(np.arange(len(idx)), idx.shape[1])[val.ravel() != 0]
  pairs = np.unique(np.stack([which, block[idx.ravel()[val.ravel() != 0]]]), axis=1)
  counts = np.bincount(pairs[1], minlength=q).astype(float)
  return np.where(counts > 0, len(idx) / np.maximum(counts, 1), 0.0)[block]


def sample_update(prob: SC.Problem, rows: BlockRows, x: jax.Array, i: jax.Array,
                  active_c: jax.Array, rho0: jax.Array, g0: jax.Array, d: jax.Array,
                  eta: jax.Array, estimator: str, prox: str):
  """Sample i's message from the read ``x``: ``(coords int[m·w], δ [m·w], support)`` for the
  sparse prox, or ``(coords, v [p], support)`` (the dense direction) for the dense prox;
  ``rows`` from :func:`block_rows`, ``active_c`` the active coordinates, ``rho0``/``g0`` the
  snapshot's ``ρ⁰ [n]`` and ``∇F(x⁰)`` (0 off the active set), ``d [p]`` the block weights.
  ``D_i∇F(x⁰)`` and the sparse prox fill every coordinate of each block in Ψ_i;
  ``support`` counts those coordinates."""
  p = x.shape[0]
  idx, val = rows.idx[i], rows.val[i]
  on = rows.valid[i] & active_c[idx]
  z = jnp.sum(jnp.where(on, val * x[idx], 0.0))
  rho = SC.deriv(prob.loss, z, rows.b[i])
  coef = rho if estimator == "sgd" else rho - rho0[i]
  support = jnp.sum(on)
  if prox == "sparse":
    v = jnp.where(on, val * coef, 0.0)
    if estimator == "sparse_svrg":
      v = v + jnp.where(on, d[idx] * g0[idx], 0.0)
    u = x[idx] - eta * v
    thr = eta * prob.lam * d[idx] * prob.weights[prob.block[idx]]
    if idx.shape[-1] == 1:   # singletons: soft-thresholding
      new = jnp.sign(u) * jnp.maximum(jnp.abs(u) - thr, 0.0)
    else:                    # block soft-thresholding of each G ∈ Ψ_i
      nrm = jnp.sqrt(jnp.sum(jnp.where(on, u * u, 0.0), axis=-1, keepdims=True))
      new = u * jnp.maximum(0.0, 1.0 - thr / jnp.where(nrm > 0, nrm, 1.0))
    return idx.ravel(), jnp.where(on, new - x[idx], 0.0).ravel(), support
  idx, on = idx.ravel(), on.ravel()
  v = jnp.zeros(p, x.dtype).at[idx].add(jnp.where(on, val.ravel() * coef, 0.0))
  if estimator == "svrg":
    v = v + g0
  elif estimator == "sparse_svrg":
    v = v + jnp.zeros(p, x.dtype).at[idx].add(jnp.where(on, d[idx] * g0[idx], 0.0))
  return idx, v, support


def partition(prob: SC.Problem) -> np.ndarray | None:
  """``prob.block`` as a host array, or None for singleton blocks."""
  block = np.asarray(prob.block)
  return None if np.array_equal(block, np.arange(block.shape[0])) else block


def worker_shards(data: SparseRows, workers: int, shards: int | None,
                  block: np.ndarray | None = None, per_shard_weights: bool = False):
  """``(rows int32 [W, m], sizes int32 [W], d [W, p])``: the samples each of ``workers``
  draws from — all n (``shards=None``, shared memory) or its own of ``shards`` contiguous
  disjoint shards, padded to the largest — and its sparse-prox weights D (the whole data's
  column counts, or with ``per_shard_weights`` its shard's)."""
  n = data.n
  if shards is None:
    rows = np.tile(np.arange(n), (workers, 1))
    sizes = np.full(workers, n)
    d = np.tile(column_weights(data, block=block), (workers, 1))
  else:
    parts = np.array_split(np.arange(n), shards)
    m = max(len(r) for r in parts)
    rows = np.stack([np.pad(r, (0, m - len(r))) for r in parts])
    sizes = np.array([len(r) for r in parts])
    d = np.stack([column_weights(data, r if per_shard_weights else None, block)
                  for r in parts])
  return jax.device_put((rows.astype(np.int32), sizes.astype(np.int32),
                         d.astype(data.val.dtype)))


def ddss(prob: SC.Problem, *, step_size: float, inner_steps: int, workers: int = 1,
         estimator: str = "sparse_svrg", prox: str = "sparse", screening: bool = True,
         radius: str = "safe", shards: int | None = None, per_shard_weights: bool = False,
         staleness: int = 0, mesh=None, data: SparseRows | None = None) -> Algorithm:
  """The general configuration (see the module docstring). ``data`` is needed up front for the
  sparse weights ``d`` (host-side counts); ``shards`` = number of workers holding disjoint
  sample shards (None: shared memory, every worker samples all n). ``mesh``: a
  :func:`fedjaxsparse.runtime.sharding.client_mesh` — the workers axis is then split over its
  devices (like the client axis; ``workers`` must be divisible by the device count), the data and x
  replicated; the scatter-add of the messages becomes a collective. Layout only: the results match a
  one-device run to float tolerance."""
  if estimator not in ESTIMATORS:
    raise ValueError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}.")
  if prox not in PROXES:
    raise ValueError(f"prox must be one of {PROXES}, got {prox!r}.")
  if not step_size > 0 or inner_steps < 1 or workers < 1:
    raise ValueError("step_size must be > 0, inner_steps >= 1 and workers >= 1, got "
                     f"{step_size!r}, {inner_steps!r}, {workers!r}.")
  if inner_steps % workers:
    raise ValueError(f"inner_steps ({inner_steps}) must be a multiple of workers ({workers}).")
  if staleness < 0:
    raise ValueError(f"staleness must be >= 0, got {staleness}.")
  if shards is not None and shards != workers:
    raise ValueError(f"shards must equal workers (one shard per worker), got {shards}.")
  if prox == "sparse" and estimator == "svrg":
    raise ValueError("prox='sparse' needs estimator 'sparse_svrg' or 'sgd' (a dense anchor "
                     "gradient would touch every coordinate).")
  if data is None:
    raise ValueError("data is needed to build the algorithm (column weights, shards).")
  n, p = data.n, data.p
  if prob.block.shape != (p,):
    raise ValueError(f"prob was built for {prob.block.shape[0]} features but data has p = {p}: "
                     "build both from the same data (screening.make_problem(data, lam)).")
  dtype = data.val.dtype
  block = partition(prob)
  grouped = None if block is None else block_rows(data, block)  # host-built, closed over
  shard_rows, shard_n, d = worker_shards(data, workers, shards, block, per_shard_weights)
  eta = jax.device_put(np.asarray(step_size, dtype))
  ticks = inner_steps // workers
  distributed = shards is not None
  if mesh is not None:
    if workers % mesh.shape[CLIENT_AXIS]:
      raise ValueError(f"workers ({workers}) must be divisible by the mesh's "
                       f"{mesh.shape[CLIENT_AXIS]} devices.")
    over_workers = NamedSharding(mesh, PartitionSpec(CLIENT_AXIS))

    def split(a):
      return jax.lax.with_sharding_constraint(a, over_workers)

  def init(key, x_init, data_):
    del key
    if jnp.shape(x_init) != (p,):
      raise ValueError(f"x_init must have shape ({p},) (one coefficient per feature of data), "
                       f"got {tuple(jnp.shape(x_init))}.")
    if (data_.n, data_.p) != (n, p):
      raise ValueError(f"data has shape ({data_.n}, {data_.p}) but the algorithm was built for "
                       f"({n}, {p}): run it on the data it was built with.")
    # host arrays put on the device as they are (jnp.asarray would compile a conversion)
    x = (jax.device_put(np.asarray(x_init, dtype)) if isinstance(x_init, np.ndarray)
         else jnp.asarray(x_init, dtype))
    z = jax.device_put(np.zeros((), dtype))
    return DDSSState(x, *jax.device_put((np.ones(prob.num_blocks, bool), np.zeros((), np.int32))),
                     z, z, z, z, z)

  def worker_update(x, key, k, active_c, rho0, g0, data):
    i = shard_rows[k, jax.random.randint(key, (), 0, shard_n[k])]
    rows = block_rows(data) if grouped is None else grouped
    return sample_update(prob, rows, x, i, active_c, rho0, g0, d[k], eta, estimator, prox)

  def step(key, state, data):
    act = state.active
    if screening:
      res = SC.screen(prob, data, state.x, act, radius)
      act = res.active
    else:
      res = SC.screen(prob, data, state.x, act, radius)._replace(active=act)
    mask = SC.coordinate_mask(prob, act)
    x0 = state.x * mask
    rho0, g0 = res.rho, res.grad * mask
    p_s = jnp.sum(SC.coordinate_mask(prob, state.active)).astype(dtype)
    p_next = jnp.sum(mask).astype(dtype)

    def tick(t, carry):
      x, hist, touched, up, down, lazy = carry
      kt = jax.random.fold_in(key, t)
      keys = jax.random.split(kt, workers)     # worker k's sample draw
      if staleness:  # each worker reads the iterate of a uniformly drawn tick ≤ staleness ago
        lag_key = jax.random.fold_in(kt, workers)
        lag = jnp.minimum(jax.random.randint(lag_key, (workers,), 0, staleness + 1), t)
        reads = hist[(t - lag) % (staleness + 1)]
      else:
        reads = jnp.broadcast_to(x, (workers,) + x.shape)
      if mesh is not None:
        reads, keys = split(reads), split(keys)
      idx, msg, support = jax.vmap(
          lambda xr, kk, k: worker_update(xr, kk, k, mask, rho0, g0, data))(
              reads, keys, jnp.arange(workers))
      if prox == "sparse":
        x = x.at[idx.ravel()].add(msg.ravel())
        touched = touched + jnp.sum(support)
      else:
        def apply(xc, v):
          return SC.prox(prob, xc - eta * v, eta) * mask, None
        x, _ = jax.lax.scan(apply, x, msg)
        touched = touched + workers * p_next
      if distributed:
        up = up + 2.0 * jnp.sum(support)        # values + indices of δ (or of v)
        down = down + workers * p_next          # each worker reads the active x
        lazy = lazy + jnp.sum(support)          # ... or only the coordinates it needs
      if staleness:
        hist = hist.at[(t + 1) % (staleness + 1)].set(x)
      return x, hist, touched, up, down, lazy

    hist0 = jnp.broadcast_to(x0, (staleness + 1,) + x0.shape) if staleness else jnp.zeros(())
    full_pass = jnp.sum(data.nnz_rows).astype(dtype)  # the snapshot's gradient reads A once
    x, _, touched, up, down, lazy = jax.lax.fori_loop(
        0, ticks, tick, (x0, hist0, state.touched + full_pass, state.floats_up,
                         state.floats_down, state.floats_down_lazy))
    if distributed:  # snapshot x⁰ down and ∇F^k up per worker; B_{s+1} and ∇F(x⁰) down
      up = up + workers * p_s
      snapshot = workers * (p_s + p_s / 32.0 + p_next)
      down, lazy = down + snapshot, lazy + snapshot
    new = DDSSState(x, act, state.s + 1, state.epochs + 1.0 + inner_steps / n,
                    touched, up, down, lazy)
    return new, DDSSInfo(res.primal, 32.0 * (up - state.floats_up),
                         32.0 * (down - state.floats_down), res.gap, p_next, res.radius)

  return Algorithm(init, step)


_DOC = shared_doc(
    arg_prob="""\
    prob: the :class:`~fedjaxsparse.convex.screening.Problem` to solve (loss, λ, the blocks
      G_j and their weights w_j), from ``fjs.convex.screening.make_problem(data, lam, loss)``
      on this same ``data``.""",
    arg_data_counts="""\
    data: the design matrix and targets as :class:`~fedjaxsparse.data.sparse_rows.SparseRows`
      (padded-CSR rows ``a_i [p]``, ``b [n]``; e.g. ``fjs.data.sparse_rows.from_dense(a, b)``);
      needed up front (column counts, shards), and the data to give ``init`` and ``step``.""",
    returns="""\
    An :class:`~fedjaxsparse.core.Algorithm`. ``init(key, x_init, data)`` (``x_init [p]``; key
    unused) gives a :class:`~fedjaxsparse.algorithms.ddss.DDSSState`: ``state.params`` (=
    ``state.x [p]``, eliminated coordinates 0), ``active bool[q]`` (the blocks still active),
    ``s`` (outer iterations), ``epochs`` (data passes: 1 + inner_steps/n a step), ``touched``
    (matrix entries and coordinates read or written), ``floats_up`` / ``floats_down`` /
    ``floats_down_lazy`` (cumulative communication in floats; 0 in shared memory).
    ``step(key, state, data)`` returns ``(state, info)``, a
    :class:`~fedjaxsparse.algorithms.ddss.DDSSInfo` measured at the snapshot (the iterate the
    step starts from): ``loss`` (the objective P), ``gap`` (the duality gap), ``radius`` (the
    screening radius), ``p_active`` (active coordinates after this step's test) and
    ``bits_up`` / ``bits_down`` (this step's communication; 0 in shared memory).""",
    ref_ddss="""\
    Runxue Bao, Xidong Wu, Wenhan Xian, Heng Huang (2022). Doubly Sparse Asynchronous Learning
      for Stochastic Composite Optimization. IJCAI 2022. Preprint: Distributed Dynamic Safe
      Screening Algorithms for Sparse Regularization, arXiv:2204.10981.""",
    arg_data_weights="""\
    data: the design matrix and targets as :class:`~fedjaxsparse.data.sparse_rows.SparseRows`
      (padded-CSR rows ``a_i [p]``, ``b [n]``; e.g. ``fjs.data.sparse_rows.from_dense(a, b)``);
      needed up front (the weights d_j, shards), and the data to give ``init`` and ``step``.""",
)
"""Docstring text the constructors below share (:func:`~fedjaxsparse.core.shared_doc`)."""


@_DOC
def sha_ddss_naive(prob, data, **kw) -> Algorithm:
  """Sha-DDSS-Naive (Bao, Wu, Xian & Huang, 2022): shared-memory asynchronous proximal SGD with
  dynamic gap-safe screening and a dense prox — the naive variant of DDSS.

  The problem is ``min_x P(x) = (1/n) Σ_i f_i(a_iᵀx) + λ Σ_j w_j ‖x_{G_j}‖₂`` over ``x [p]``
  (the Lasso, ℓ1-logistic regression or the weighted group Lasso, as ``prob`` says). One
  ``step`` is one outer iteration: a full pass computes the gradient ``∇F(x⁰)`` and the
  duality gap at the snapshot ``x⁰`` (the current x); the gap-safe test (Ndiaye et al., 2017)
  eliminates the blocks it proves 0 at the optimum (their coordinates are set to 0 and never
  updated again: active sets only shrink); then ``inner_steps`` stochastic updates run,
  ``workers`` at a time from the same read ``x̂`` of x: each draws a sample i uniformly and
  computes ``v = a_i f_i'(a_iᵀx̂)``, and the server applies the dense prox
  ``x ← prox_{ηλΩ}(x − ηv)`` on every active coordinate, one worker's v after another.

  Asynchrony is emulated, not timed (``staleness=τ``: each worker reads the iterate of a tick
  up to τ ago). The module docstring (:mod:`fedjaxsparse.algorithms.ddss`) has the full story.

  Args:
    {{arg_prob}}
    {{arg_data_counts}}
    **kwargs: forwarded to :func:`fedjaxsparse.algorithms.ddss.ddss` (``estimator="sgd"`` and
      ``prox="dense"`` are fixed here): ``step_size`` (η > 0, required), ``inner_steps``
      (stochastic updates per ``step``, required, a multiple of ``workers``), ``workers``
      (updates per tick from the same read, default 1), ``staleness`` (τ, default 0),
      ``screening`` (default True), ``radius`` (``"safe"``, or the printed and unsafe
      ``"paper_literal"``), ``shards`` / ``per_shard_weights`` (the distributed form: see
      :func:`dis_ddss_naive`), ``mesh`` (split the workers over devices; layout only).

  Returns:
    {{returns}}

  References:
    {{ref_ddss}}
    Eugene Ndiaye, Olivier Fercoq, Alexandre Gramfort, Joseph Salmon (2017). Gap Safe Screening
      Rules for Sparsity Enforcing Penalties. JMLR 18(128). arXiv:1611.05780.

  Source for the team: seed 004, Task 1, Algorithm 1; spec ``seed004.md`` §1.3-§1.5.
  """
  return ddss(prob, data=data, estimator="sgd", prox="dense", **kw)


@_DOC
def sha_ddss(prob, data, **kw) -> Algorithm:
  """Sha-DDSS (Bao, Wu, Xian & Huang, 2022): shared-memory doubly sparse asynchronous proximal
  SVRG — dynamic gap-safe screening shrinks the model and sparse variance-reduced updates
  touch only each sample's support.

  The problem is ``min_x P(x) = (1/n) Σ_i f_i(a_iᵀx) + λ Σ_j w_j ‖x_{G_j}‖₂`` over ``x [p]``
  (the Lasso, ℓ1-logistic regression or the weighted group Lasso, as ``prob`` says). One
  ``step`` is one outer iteration: a full pass computes ``∇F(x⁰)`` and
  ``ρ⁰_i = f_i'(a_iᵀx⁰)`` at the snapshot ``x⁰`` (the current x) and the duality gap; the
  gap-safe test (Ndiaye et al., 2017) eliminates the blocks it proves 0 at the optimum (their
  coordinates are set to 0 and never updated again: active sets only shrink); then
  ``inner_steps`` stochastic updates run, ``workers`` at a time from the same read ``x̂`` of x.
  Each draws a sample i uniformly, forms the sparse variance-reduced estimator
  ``v = a_i(f_i'(a_iᵀx̂) − ρ⁰_i) + D_i ∇F(x⁰)`` (``[D_i]_jj = n/n_j`` on supp(a_i), ``n_j`` the
  samples touching column j; whole blocks for the group Lasso) and sends the decoupled sparse
  prox step ``δ = prox_{ηλφ_i}(x̂ − ηv) − x̂`` with ``φ_i = Σ_{j∈supp(a_i)} d_j|x_j|``; δ is
  non-zero only on supp(a_i) and the server just adds the δ's. ``E_i D_i = I`` and
  ``E_i φ_i = Ω``, so an update costs ``O(|supp(a_i)|)``, not O(p).

  Asynchrony is emulated, not timed (``staleness=τ``: each worker reads the iterate of a tick
  up to τ ago). The module docstring (:mod:`fedjaxsparse.algorithms.ddss`) has the full story.

  Args:
    {{arg_prob}}
    {{arg_data_weights}}
    **kwargs: forwarded to :func:`fedjaxsparse.algorithms.ddss.ddss`
      (``estimator="sparse_svrg"`` and ``prox="sparse"`` are fixed here): ``step_size``
      (η > 0, required), ``inner_steps`` (stochastic updates per ``step``, required, a multiple
      of ``workers``), ``workers`` (updates per tick from the same read, default 1),
      ``staleness`` (τ, default 0), ``screening`` (default True), ``radius`` (``"safe"``, or
      the printed and unsafe ``"paper_literal"``), ``shards`` / ``per_shard_weights`` (the
      distributed form: see :func:`dis_ddss`), ``mesh`` (split the workers over devices;
      layout only).

  Returns:
    {{returns}}

  References:
    {{ref_ddss}}
    Eugene Ndiaye, Olivier Fercoq, Alexandre Gramfort, Joseph Salmon (2017). Gap Safe Screening
      Rules for Sparsity Enforcing Penalties. JMLR 18(128). arXiv:1611.05780.

  Source for the team: seed 004, Task 1, Algorithm 4; spec ``seed004.md`` §1.3-§1.5.
  """
  return ddss(prob, data=data, estimator="sparse_svrg", prox="sparse", **kw)


@_DOC
def dis_ddss_naive(prob, data, workers: int = 8, **kw) -> Algorithm:
  """Dis-DDSS-Naive (Bao, Wu, Xian & Huang, 2022): distributed (parameter-server) asynchronous
  proximal SGD with dynamic gap-safe screening and a dense prox at the server.

  The problem is ``min_x P(x) = (1/n) Σ_i f_i(a_iᵀx) + λ Σ_j w_j ‖x_{G_j}‖₂`` over ``x [p]``
  (the Lasso, ℓ1-logistic regression or the weighted group Lasso, as ``prob`` says). The n
  samples are split into ``workers`` contiguous disjoint shards; worker k draws only from its
  own. One ``step`` is one outer iteration: a full pass computes the gradient ``∇F(x⁰)`` and
  the duality gap at the snapshot ``x⁰`` (the current x); the gap-safe test (Ndiaye et al.,
  2017) eliminates the blocks it proves 0 at the optimum (their coordinates are set to 0 and
  never updated again); then ``inner_steps`` updates run, ``workers`` at a time from the same
  read ``x̂`` of x: each worker draws a sample i of its shard and sends
  ``v = a_i f_i'(a_iᵀx̂)``, and the server applies the dense prox ``x ← prox_{ηλΩ}(x − ηv)``
  on every active coordinate, one worker's v after another.

  Communication is counted in floats: per step the snapshot down and each worker's gradient
  ``∇F^k`` up (``p_s`` floats each, the active coordinates), the screening mask and
  ``∇F(x⁰)`` down; per update the worker's read of x down (the active coordinates) and its
  message up (values and indices). Asynchrony is emulated, not timed (``staleness=τ``: each
  worker reads the iterate of a tick up to τ ago). The module docstring
  (:mod:`fedjaxsparse.algorithms.ddss`) has the full story.

  Args:
    {{arg_prob}}
    {{arg_data_counts}}
    workers: the number of workers, each holding one shard (``shards = workers``); also the
      number of updates per tick.
    **kwargs: forwarded to :func:`fedjaxsparse.algorithms.ddss.ddss` (``estimator="sgd"``,
      ``prox="dense"`` and ``shards=workers`` are fixed here): ``step_size`` (η > 0,
      required), ``inner_steps`` (updates per ``step``, required, a multiple of ``workers``),
      ``staleness`` (τ, default 0), ``screening`` (default True), ``radius`` (``"safe"``, or
      the printed and unsafe ``"paper_literal"``), ``per_shard_weights`` (unused by the dense
      prox), ``mesh`` (split the workers over devices; layout only).

  Returns:
    An :class:`~fedjaxsparse.core.Algorithm`. ``init(key, x_init, data)`` (``x_init [p]``; key
    unused) gives a :class:`~fedjaxsparse.algorithms.ddss.DDSSState`: ``state.params`` (=
    ``state.x [p]``, eliminated coordinates 0), ``active bool[q]`` (the blocks still active),
    ``s`` (outer iterations), ``epochs`` (data passes: 1 + inner_steps/n a step), ``touched``
    (matrix entries and coordinates read or written), ``floats_up`` / ``floats_down`` (the
    cumulative communication in floats) and ``floats_down_lazy`` (the downlink had each
    worker pulled only the coordinates it reads). ``step(key, state, data)`` returns
    ``(state, info)``, a :class:`~fedjaxsparse.algorithms.ddss.DDSSInfo` measured at the
    snapshot (the iterate the step starts from): ``loss`` (the objective P), ``gap`` (the
    duality gap), ``radius`` (the screening radius), ``p_active`` (active coordinates after
    this step's test) and ``bits_up`` / ``bits_down`` (this step's communication, 32 bits a
    float).

  References:
    {{ref_ddss}}
    Eugene Ndiaye, Olivier Fercoq, Alexandre Gramfort, Joseph Salmon (2017). Gap Safe Screening
      Rules for Sparsity Enforcing Penalties. JMLR 18(128). arXiv:1611.05780.

  Source for the team: seed 004, Task 1, Algorithms 2-3; spec ``seed004.md`` §1.3-§1.7.
  """
  return ddss(prob, data=data, estimator="sgd", prox="dense", workers=workers, shards=workers,
              **kw)


@_DOC
def dis_ddss(prob, data, workers: int = 8, **kw) -> Algorithm:
  """Dis-DDSS (Bao, Wu, Xian & Huang, 2022): distributed (parameter-server) doubly sparse
  asynchronous proximal SVRG — workers send sparse δ's computed with the sparse
  variance-reduced estimator and the sparse prox; the server only adds them.

  The problem is ``min_x P(x) = (1/n) Σ_i f_i(a_iᵀx) + λ Σ_j w_j ‖x_{G_j}‖₂`` over ``x [p]``
  (the Lasso, ℓ1-logistic regression or the weighted group Lasso, as ``prob`` says). The n
  samples are split into ``workers`` contiguous disjoint shards; worker k draws only from its
  own. One ``step`` is one outer iteration: a full pass computes ``∇F(x⁰)`` and
  ``ρ⁰_i = f_i'(a_iᵀx⁰)`` at the snapshot ``x⁰`` (the current x) and the duality gap; the
  gap-safe test (Ndiaye et al., 2017) eliminates the blocks it proves 0 at the optimum (their
  coordinates are set to 0 and never updated again); then ``inner_steps`` updates run,
  ``workers`` at a time from the same read ``x̂`` of x. Each worker draws a sample i of its
  shard, forms ``v = a_i(f_i'(a_iᵀx̂) − ρ⁰_i) + D_i ∇F(x⁰)`` (``[D_i]_jj = d_j = n/n_j`` on
  supp(a_i), ``n_j`` the samples touching column j; whole blocks for the group Lasso) and
  sends ``δ = prox_{ηλφ_i}(x̂ − ηv) − x̂`` with ``φ_i = Σ_{j∈supp(a_i)} d_j|x_j|``, non-zero
  only on supp(a_i); the server adds the δ's.

  Communication is counted in floats: per step the snapshot down and each worker's gradient
  ``∇F^k`` up (``p_s`` floats each, the active coordinates), the screening mask and
  ``∇F(x⁰)`` down; per update the worker's read of x down (the active coordinates) and its δ
  up (values and indices). Asynchrony is emulated, not timed (``staleness=τ``: each worker
  reads the iterate of a tick up to τ ago). The module docstring
  (:mod:`fedjaxsparse.algorithms.ddss`) has the full story.

  Args:
    {{arg_prob}}
    {{arg_data_weights}}
    workers: the number of workers, each holding one shard (``shards = workers``); also the
      number of updates per tick.
    **kwargs: forwarded to :func:`fedjaxsparse.algorithms.ddss.ddss`
      (``estimator="sparse_svrg"``, ``prox="sparse"`` and ``shards=workers`` are fixed here):
      ``step_size`` (η > 0, required), ``inner_steps`` (updates per ``step``, required, a
      multiple of ``workers``), ``staleness`` (τ, default 0), ``screening`` (default True),
      ``radius`` (``"safe"``, or the printed and unsafe ``"paper_literal"``),
      ``per_shard_weights`` (default False: the paper's global ``d_j``; True: worker k uses
      ``d^k_j = n_k/n^k_j`` from its own shard, unbiased over its own draws), ``mesh`` (split
      the workers over devices; layout only).

  Returns:
    An :class:`~fedjaxsparse.core.Algorithm`. ``init(key, x_init, data)`` (``x_init [p]``; key
    unused) gives a :class:`~fedjaxsparse.algorithms.ddss.DDSSState`: ``state.params`` (=
    ``state.x [p]``, eliminated coordinates 0), ``active bool[q]`` (the blocks still active),
    ``s`` (outer iterations), ``epochs`` (data passes: 1 + inner_steps/n a step), ``touched``
    (matrix entries and coordinates read or written), ``floats_up`` / ``floats_down`` (the
    cumulative communication in floats) and ``floats_down_lazy`` (the downlink had each
    worker pulled only the ``|supp(a_i) ∩ B|`` coordinates it reads). ``step(key, state,
    data)`` returns ``(state, info)``, a :class:`~fedjaxsparse.algorithms.ddss.DDSSInfo`
    measured at the snapshot (the iterate the step starts from): ``loss`` (the objective P),
    ``gap`` (the duality gap), ``radius`` (the screening radius), ``p_active`` (active
    coordinates after this step's test) and ``bits_up`` / ``bits_down`` (this step's
    communication, 32 bits a float).

  References:
    {{ref_ddss}}
    Eugene Ndiaye, Olivier Fercoq, Alexandre Gramfort, Joseph Salmon (2017). Gap Safe Screening
      Rules for Sparsity Enforcing Penalties. JMLR 18(128). arXiv:1611.05780.

  Source for the team: seed 004, Task 1, Algorithms 5-6; spec ``seed004.md`` §1.3-§1.7.
  """
  return ddss(prob, data=data, estimator="sparse_svrg", prox="sparse", workers=workers,
              shards=workers, **kw)


@_DOC
def prox_asvrg(prob, data, **kw) -> Algorithm:
  """ProxASVRG (Meng et al., 2017): asynchronous proximal SVRG with a dense prox and no
  screening — a baseline of DDSS (Bao, Wu, Xian & Huang, 2022).

  The problem is ``min_x P(x) = (1/n) Σ_i f_i(a_iᵀx) + λ Σ_j w_j ‖x_{G_j}‖₂`` over ``x [p]``
  (the Lasso, ℓ1-logistic regression or the weighted group Lasso, as ``prob`` says). One
  ``step`` is one outer iteration: a full pass computes ``∇F(x⁰)`` and
  ``ρ⁰_i = f_i'(a_iᵀx⁰)`` at the snapshot ``x⁰`` (the current x), then ``inner_steps``
  stochastic updates run, ``workers`` at a time from the same read ``x̂`` of x: each draws a
  sample i uniformly and computes the (dense) variance-reduced estimator
  ``v = a_i(f_i'(a_iᵀx̂) − ρ⁰_i) + ∇F(x⁰)``, and ``x ← prox_{ηλΩ}(x − ηv)`` is applied on every
  coordinate, one worker's v after another. It is DDSS without screening and without the
  sparse updates; asynchrony is emulated, not timed (``staleness=τ``: each worker reads the
  iterate of a tick up to τ ago). See :mod:`fedjaxsparse.algorithms.ddss`.

  Args:
    {{arg_prob}}
    data: the design matrix and targets as :class:`~fedjaxsparse.data.sparse_rows.SparseRows`
      (padded-CSR rows ``a_i [p]``, ``b [n]``; e.g. ``fjs.data.sparse_rows.from_dense(a, b)``);
      needed up front (shards), and the data to give ``init`` and ``step``.
    **kwargs: forwarded to :func:`fedjaxsparse.algorithms.ddss.ddss` (``estimator="svrg"``,
      ``prox="dense"`` and ``screening=False`` are fixed here): ``step_size`` (η > 0,
      required), ``inner_steps`` (stochastic updates per ``step``, required, a multiple of
      ``workers``), ``workers`` (updates per tick from the same read, default 1),
      ``staleness`` (τ, default 0), ``shards`` (``= workers``: the distributed form, worker k
      drawing from the k-th of ``workers`` disjoint sample shards, with communication
      counted), ``per_shard_weights`` (unused by the dense prox), ``radius`` (only the
      reported radius: nothing is screened), ``mesh`` (split the workers over devices; layout
      only).

  Returns:
    An :class:`~fedjaxsparse.core.Algorithm`. ``init(key, x_init, data)`` (``x_init [p]``; key
    unused) gives a :class:`~fedjaxsparse.algorithms.ddss.DDSSState`: ``state.params`` (=
    ``state.x [p]``), ``active bool[q]`` (all True: nothing is screened), ``s`` (outer
    iterations), ``epochs`` (data passes: 1 + inner_steps/n a step), ``touched`` (matrix
    entries and coordinates read or written), ``floats_up`` / ``floats_down`` /
    ``floats_down_lazy`` (cumulative communication in floats; 0 in shared memory).
    ``step(key, state, data)`` returns ``(state, info)``, a
    :class:`~fedjaxsparse.algorithms.ddss.DDSSInfo` measured at the snapshot (the iterate the
    step starts from): ``loss`` (the objective P), ``gap`` (the duality gap), ``radius`` (the
    gap-safe radius, reported only), ``p_active`` (= p) and ``bits_up`` / ``bits_down``
    (this step's communication; 0 in shared memory).

  References:
    Qi Meng, Wei Chen, Jingcheng Yu, Taifeng Wang, Zhi-Ming Ma, Tie-Yan Liu (2017). Asynchronous
      Stochastic Proximal Optimization Algorithms with Variance Reduction. AAAI 2017.
      arXiv:1609.08435.
    {{ref_ddss}}

  Source for the team: seed 004, Task 1 (its baselines); spec ``seed004.md`` §1.5.
  """
  return ddss(prob, data=data, estimator="svrg", prox="dense", screening=False, **kw)
