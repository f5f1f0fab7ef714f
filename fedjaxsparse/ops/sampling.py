"""Cohort samplings: full, nonuniform, uniform, importance, τ-NICE, block, stratified and the
two-stage cluster sampling of Cohort-Squeeze's FL form; and the plain uniform cohort of a round
(:func:`sample_cohort`) with per-client keys (:func:`client_keys`).

References:
  Kai Yi, Timur Kharisov, Igor Sokolov, Peter Richtárik (2024). Cohort Squeeze: Beyond a
    Single Communication Round per Cohort in Cross-Device Federated Learning. FL@FM-NeurIPS'24
    workshop (oral). arXiv:2406.01115.
  Robert M. Gower, Nicolas Loizou, Xun Qian, Alibek Sailanbayev, Egor Shulgin, Peter Richtárik
    (2019). SGD: General Analysis and Improved Rates. ICML 2019. arXiv:1901.09401.

A :class:`Sampler` draws a **static-shape** cohort inside ``jit`` (:meth:`Sampler.sample`:
ids ``int32[m]``, a 0/1 ``mask[m]`` for samplings whose cohort size varies, and the weights
``1/(n p_i)`` that make the cohort objective ``f_S = Σ_{i∈S} f_i/(n p_i)`` unbiased, ``E f_S = f``)
and knows its exact first- and second-order inclusion probabilities ``p_i = P(i ∈ S)`` and
``P_ij = P(i, j ∈ S)``. From them:

* ``σ²_⋆,AS = E‖∇f_S(x⋆)‖² = (1/n²) Σ_ij P_ij ⟨a_i, a_j⟩/(p_i p_j)`` with ``a_i = ∇f_i(x⋆)``
  (:func:`sigma2_star`) — exact for every sampling (it is the second moment written out);
* ``μ_AS = min_{C: p_C > 0} Σ_{i∈C} μ_i/(n p_i)`` (:func:`mu_as`), each sampling minimising a sum
  over its cohorts in closed form (the τ smallest values for NICE, the
  smallest per block for SS, the smallest block for BS, …);
* the expected-smoothness constant ``𝓛`` of minibatch SGD on ``f_S`` (Gower et al., 2019,
  :func:`expected_smoothness`), whose step ``1/(2𝓛)`` is the Cohort-Squeeze paper's
  "optimal" step of LocalGD and the MB baselines.

:meth:`Sampler.support` enumerates the exact cohort distribution (small n; tests check the
closed forms against it and it against the draws). Clustering for block/stratified sampling:
:func:`kmeans_blocks` (scikit-learn's KMeans) and :func:`contiguous_blocks`.

Source for the team: "arbitrary sampling", seed 001 ch. 5 §5.3 and D.2; spec ``seed001_ch3_ch5.md``
§3.1, §3.3, §3.4, C5-2, C5-6. Dissertation numbering: Theorem 5.3.2, Algorithm 14, §5.3.3, §5.4.4.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Callable, Iterator, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjaxsparse.core import float_dtype
from fedjaxsparse.errors import check_number
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["Cohort", "Sampler", "full", "nonuniform", "uniform", "importance", "nice", "block",
           "stratified", "clusters", "sigma2_star", "mu_as", "neighbourhood", "theorem_bound",
           "expected_smoothness", "contiguous_blocks", "kmeans_blocks", "check_cohort_size",
           "sample_cohort", "client_keys"]
__dir__ = _public_dir(__all__)


class Cohort(NamedTuple):
  """One draw: ``ids`` ``int32[m]`` (padding entries repeat a member), ``mask`` ``[m]``
  (1 for members), ``weights`` ``[m]`` (``1/(n p_i)`` for members, 0 for padding); mask and
  weights in the default float dtype (float64 under ``jax_enable_x64``)."""
  ids: jax.Array
  mask: jax.Array
  weights: jax.Array


@dataclasses.dataclass(frozen=True, eq=False)
class Sampler:
  """A cohort sampling over ``num_clients`` clients (build one with the functions below).

  Attributes:
    name: the sampling's name ("nice(3)", "stratified(4 blocks)", ...).
    num_clients: n.
    size: the static cohort length m (the largest cohort).
    marginals: ``p_i`` ``float64[n]``.
    pairs: ``() -> P_ij`` ``float64[n, n]`` (diagonal = ``p_i``), built on demand
      (:attr:`pair_marginals`; n² entries, so not for a population of 10⁵).
    draw: ``key -> (ids int32[m], mask [m])``.
    min_cohort_sum: ``v [n] -> min over cohorts C of Σ_{i∈C} v_i`` (closed form).
    support: ``() -> iterator of (cohort tuple, probability)``, the exact distribution.
  """
  name: str
  num_clients: int
  size: int
  marginals: np.ndarray
  pairs: Callable[[], np.ndarray]
  draw: Callable[[jax.Array], tuple[jax.Array, jax.Array]]
  min_cohort_sum: Callable[[np.ndarray], float]
  support: Callable[[], Iterator[tuple[tuple[int, ...], float]]]

  @property
  def pair_marginals(self) -> np.ndarray:
    """``P_ij = P(i, j ∈ S)`` ``[n, n]``."""
    return self.pairs()

  @property
  def weights(self) -> np.ndarray:
    """``1/(n p_i)`` ``[n]``."""
    return 1.0 / (self.num_clients * self.marginals)

  @property
  def expected_size(self) -> float:
    """``E|S| = Σ p_i``."""
    return float(self.marginals.sum())

  def sample(self, key: jax.Array) -> Cohort:
    """A cohort of static length ``size``, inside or outside ``jit``."""
    ids, mask = self.draw(key)
    w = jnp.asarray(self.weights, float_dtype())[ids] * mask
    return Cohort(ids.astype(jnp.int32), mask.astype(float_dtype()), w)


def _check_n(n) -> int:
  if not isinstance(n, (int, np.integer)) or n < 1:
    raise ValueError(f"num_clients must be an int >= 1, got {n!r}.")
  return int(n)


def _ones(m: int) -> jax.Array:
  return jnp.ones((m,), float_dtype())


def full(n: int) -> Sampler:
  """Every client every round (FS; SPPM-AS is then PPM): ``p_i = 1``, ``σ²_⋆ = 0``."""
  n = _check_n(n)
  ids = jax.device_put(np.arange(n, dtype=np.int32))
  return Sampler("full", n, n, np.ones(n), lambda: np.ones((n, n)), lambda key: (ids, _ones(n)),
                 lambda v: float(np.sum(v)), lambda: iter([(tuple(range(n)), 1.0)]))


def nonuniform(probs: Sequence[float]) -> Sampler:
  """One client, client ``i`` with probability ``probs[i]`` (NS; ``len(S) = 1``; SPPM's
  sampling)."""
  p = np.asarray(probs, np.float64)
  if p.ndim != 1 or np.any(p <= 0) or abs(p.sum() - 1) > 1e-9:
    raise ValueError("probs must be a 1-d array of positive probabilities summing to 1 (a "
                     "proper sampling needs p_i > 0).")
  n = len(p)
  logits = jnp.log(jax.device_put(p.astype(float_dtype())))
  return Sampler("nonuniform", n, 1, p, lambda: np.diag(p),
                 lambda key: (jax.random.categorical(key, logits)[None].astype(jnp.int32),
                              _ones(1)),
                 lambda v: float(np.min(v)), lambda: ((((i,), float(p[i])) for i in range(n))))


def uniform(n: int) -> Sampler:
  """One client uniformly at random (US = NS with ``p_i = 1/n``)."""
  s = nonuniform(np.full(_check_n(n), 1.0 / n))
  return dataclasses.replace(s, name="uniform")


def importance(mu: Sequence[float]) -> Sampler:
  """One client with ``p_i = μ_i/Σ_j μ_j`` (IS: maximises μ_AS over NS, = mean μ_i)."""
  mu = np.asarray(mu, np.float64)
  if mu.ndim != 1 or np.any(mu <= 0):
    raise ValueError("mu (strong-convexity constants) must be a 1-d array of positive values.")
  return dataclasses.replace(nonuniform(mu / mu.sum()), name="importance")


def nice(n: int, tau: int) -> Sampler:
  """τ-NICE: a uniformly random subset of exactly τ clients (sorted ids); ``p_i = τ/n``,
  ``P_ij = τ(τ−1)/(n(n−1))``.

  >>> import jax
  >>> s = nice(10, 3)
  >>> float(s.marginals[0]), s.size
  (0.3, 3)
  >>> ids, _ = s.draw(jax.random.key(0))
  >>> len(set(ids.tolist()))    # three distinct clients
  3
"""
  n = _check_n(n)
  if not isinstance(tau, (int, np.integer)) or not 1 <= tau <= n:
    raise ValueError(f"tau (cohort size) must be an int in [1, n={n}], got {tau!r}.")
  def pairs():
    pair = np.full((n, n), tau * (tau - 1) / (n * (n - 1)) if n > 1 else 1.0)
    np.fill_diagonal(pair, tau / n)
    return pair

  def draw(key):
    if tau == n:
      return jnp.arange(n, dtype=jnp.int32), _ones(n)
    return jnp.sort(jax.random.choice(key, n, (tau,), replace=False)).astype(jnp.int32), _ones(tau)

  return Sampler(f"nice({tau})", n, int(tau), np.full(n, tau / n), pairs, draw,
                 lambda v: float(np.sum(np.sort(v)[:tau])),
                 lambda: ((c, 1.0 / math.comb(n, tau))
                          for c in itertools.combinations(range(n), tau)))


def _blocks(blocks: Sequence[Sequence[int]], n: int | None) -> tuple[list[np.ndarray], int]:
  bl = [np.asarray(b, np.int64).ravel() for b in blocks]
  if not bl or any(len(b) == 0 for b in bl):
    raise ValueError("blocks must be a non-empty list of non-empty client index lists.")
  allids = np.concatenate(bl)
  n = int(allids.max()) + 1 if n is None else _check_n(n)
  if len(allids) != n or not np.array_equal(np.sort(allids), np.arange(n)):
    raise ValueError(f"blocks must partition the clients 0..{n - 1} (each client in exactly "
                     "one block).")
  return bl, n


def _table(bl: list[np.ndarray]) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Blocks as a padded ``[b, max]`` id table (padding repeats the block's first client),
  its 0/1 mask and the block sizes."""
  m = max(len(b) for b in bl)
  table = np.stack([np.concatenate([b, np.full(m - len(b), b[0])]) for b in bl])
  mask = np.stack([np.arange(m) < len(b) for b in bl]).astype(np.float32)
  return (jax.device_put(table.astype(np.int32)), jax.device_put(mask),
          jax.device_put(np.array([len(b) for b in bl], np.int32)))


def block(blocks: Sequence[Sequence[int]], q: Sequence[float] | None = None,
          n: int | None = None) -> Sampler:
  """Block sampling (BS): one whole block ``C_j`` with probability ``q_j`` (default uniform);
  ``p_i = q_{B(i)}``, ``P_ij = q_j`` for i, j in block j and 0 across blocks. Cohorts are
  padded to the largest block (mask 0)."""
  bl, n = _blocks(blocks, n)
  b = len(bl)
  q = np.full(b, 1.0 / b) if q is None else np.asarray(q, np.float64)
  if q.shape != (b,) or np.any(q <= 0) or abs(q.sum() - 1) > 1e-9:
    raise ValueError(f"q must hold {b} positive block probabilities summing to 1.")
  p = np.zeros(n)
  for qj, bj in zip(q, bl):
    p[bj] = qj

  def pairs():
    pair = np.zeros((n, n))
    for qj, bj in zip(q, bl):
      pair[np.ix_(bj, bj)] = qj
    return pair

  table, mask, _ = _table(bl)
  logits = jnp.log(jax.device_put(q.astype(float_dtype())))

  def draw(key):
    j = jax.random.categorical(key, logits)
    return table[j], mask[j]

  return Sampler(f"block({b} blocks)", n, table.shape[1], p, pairs, draw,
                 lambda v: float(min(np.sum(v[bj]) for bj in bl)),
                 lambda: ((tuple(sorted(bj.tolist())), float(qj)) for qj, bj in zip(q, bl)))


def stratified(blocks: Sequence[Sequence[int]], n: int | None = None) -> Sampler:
  """Stratified sampling (SS): one client uniformly from *every* block (b = number of
  blocks, a static cohort of b); ``p_i = 1/|C_{B(i)}|``, ``P_ij = p_i p_j`` across blocks, 0
  within one."""
  return clusters(blocks, len(blocks), n, name=f"stratified({len(blocks)} blocks)")


def clusters(blocks: Sequence[Sequence[int]], num_clusters: int, n: int | None = None,
             name: str | None = None) -> Sampler:
  """The two-stage cluster sampling of Cohort-Squeeze's FL form: ``C = num_clusters`` of the q
  blocks uniformly without replacement, then one client uniformly from each;
  ``p_i = (C/q)/|C_{B(i)}|``. With C = q it is stratified sampling; with C < q it is **not** SS (SS
  takes one client from every block), and its weights must use these marginals."""
  bl, n = _blocks(blocks, n)
  q_ = len(bl)
  if not isinstance(num_clusters, (int, np.integer)) or not 1 <= num_clusters <= q_:
    raise ValueError(f"num_clusters must be an int in [1, {q_}] (the number of blocks), got "
                     f"{num_clusters!r}.")
  c = int(num_clusters)
  pj = c / q_  # P(block j chosen)
  pjk = c * (c - 1) / (q_ * (q_ - 1)) if q_ > 1 else 1.0
  p, block_of = np.zeros(n), np.zeros(n, int)
  for j, bj in enumerate(bl):
    p[bj] = pj / len(bj)
    block_of[bj] = j
  sizes_of = np.array([len(bl[j]) for j in block_of], np.float64)

  def pairs():  # across blocks: both blocks chosen, then each member; within: impossible
    pair = pjk / np.outer(sizes_of, sizes_of)
    pair[block_of[:, None] == block_of[None, :]] = 0.0
    np.fill_diagonal(pair, p)
    return pair

  table, _, sizes = _table(bl)

  def draw(key):
    k_blocks, k_members = jax.random.split(key)
    chosen = (jnp.arange(q_) if c == q_ else
              jnp.sort(jax.random.choice(k_blocks, q_, (c,), replace=False)))
    u = jax.random.uniform(k_members, (c,))
    member = jnp.minimum((u * sizes[chosen]).astype(jnp.int32), sizes[chosen] - 1)
    return table[chosen, member], _ones(c)

  def min_sum(v):
    per_block = np.sort([np.min(v[bj]) for bj in bl])
    return float(np.sum(per_block[:c]))

  def support():
    n_sets = len(list(itertools.combinations(range(q_), c)))
    for js in itertools.combinations(range(q_), c):
      for members in itertools.product(*(bl[j].tolist() for j in js)):
        prob = 1.0 / n_sets / float(np.prod([len(bl[j]) for j in js]))
        yield tuple(sorted(members)), prob

  return Sampler(name or f"clusters({c} of {q_} blocks)", n, c, p, pairs, draw, min_sum,
                 support)


def sigma2_star(sampler: Sampler, grads_at_opt: np.ndarray) -> float:
  """``σ²_⋆,AS = E‖Σ_{i∈S} a_i/(n p_i)‖²`` for ``a_i = ∇f_i(x⋆)`` (``[n, d]``; Σ a_i = 0 at the
  optimum of f), exactly, from the pair inclusion probabilities."""
  a = np.asarray(grads_at_opt, np.float64).reshape(sampler.num_clients, -1)
  w = 1.0 / (sampler.num_clients * sampler.marginals)
  gram = (a * w[:, None]) @ (a * w[:, None]).T
  return float(np.sum(sampler.pair_marginals * gram))


def mu_as(sampler: Sampler, mu: Sequence[float]) -> float:
  """``μ_AS = min over cohorts C (p_C > 0) of Σ_{i∈C} μ_i/(n p_i)`` (the Cohort-Squeeze paper's
  SPPM-AS convergence theorem; per-client μ_i as in its proof)."""
  mu = np.broadcast_to(np.asarray(mu, np.float64), (sampler.num_clients,))
  return sampler.min_cohort_sum(mu * sampler.weights)


def neighbourhood(sampler: Sampler, mu: Sequence[float], grads_at_opt: np.ndarray,
                  gamma: float) -> float:
  """The limit ``γ σ²_⋆,AS/(γ μ_AS² + 2 μ_AS)`` of ``E‖x_t − x⋆‖²`` in the Cohort-Squeeze
  paper's SPPM-AS convergence theorem."""
  m = mu_as(sampler, mu)
  return gamma * sigma2_star(sampler, grads_at_opt) / (gamma * m ** 2 + 2 * m)


def theorem_bound(sampler: Sampler, mu, grads_at_opt, gamma: float, dist0_sq: float,
                  t: np.ndarray) -> np.ndarray:
  """The bound of the Cohort-Squeeze paper's SPPM-AS convergence theorem:
  ``(1 + γμ_AS)^{-2t} ‖x_0 − x⋆‖² + neighbourhood`` at rounds ``t``."""
  m = mu_as(sampler, mu)
  return ((1 + gamma * m) ** (-2.0 * np.asarray(t)) * dist0_sq
          + neighbourhood(sampler, mu, grads_at_opt, gamma))


def expected_smoothness(sampler: Sampler, smoothness: float,
                        client_smoothness: float | Sequence[float]) -> float:
  """An expected-smoothness constant ``𝓛`` of ``sampler`` (Gower et al., 2019, Assumption 2.1):
  ``E‖∇f_S(x) − ∇f_S(x⋆)‖² ≤ 2𝓛 (f(x) − f(x⋆))`` for all x, where ``f = (1/n) Σ f_i`` is
  ``smoothness``-smooth (L) with minimiser x⋆, each ``f_i`` is convex and L_i-smooth
  (``client_smoothness``: a scalar such as L_max, or ``[n]``), and ``f_S = Σ_{i∈S} f_i/(n p_i)``.

  References:
    Robert M. Gower, Nicolas Loizou, Xun Qian, Alibek Sailanbayev, Egor Shulgin, Peter
      Richtárik (2019). SGD: General Analysis and Improved Rates. ICML 2019.
      arXiv:1901.09401.

  The bound, for every sampling (our derivation in the paper's framework; it reproduces the
  paper's closed forms): with ``g_i = ∇f_i(x) − ∇f_i(x⋆)``, ``v_i = 1/(n p_i)`` and
  ``M_ij = P_ij v_i v_j`` ``[n, n]``,

      E‖Σ_{i∈S} v_i g_i‖² = Σ_ij M_ij ⟨g_i, g_j⟩
                          ≤ a n² ‖∇f(x) − ∇f(x⋆)‖² + λ(a) Σ_i ‖g_i‖²/L_i        (any a ≥ 0)

  with ``λ(a) = max(0, λ_max(Λ^½ (M − a 11ᵀ) Λ^½))``, ``Λ = diag(L_i)``; then
  ``‖∇f(x) − ∇f(x⋆)‖² ≤ 2L (f(x) − f⋆)`` and ``‖g_i‖² ≤ 2L_i D_{f_i}(x, x⋆)`` with
  ``Σ_i D_{f_i}(x, x⋆) = n (f(x) − f⋆)`` give ``𝓛 = min_{a≥0} a n² L + n λ(a)``, minimised
  here over a (a convex function of a: Brent's method plus the pair values of M). For τ-NICE
  with one L_max this is the paper's Proposition 3.8,
  ``𝓛 = n(τ−1)/(τ(n−1)) L + (n−τ)/(τ(n−1)) L_max`` (τ = n: L; τ = 1: L_max); for stratified
  sampling whose largest block B has at least two clients it is
  ``L + (|B|/n)(L_max − L)`` (one block: L_max, SPPM's single uniform client).

  SGD ``x_{t+1} = x_t − γ ∇f_S(x_t)`` with ``γ ≤ 1/(2𝓛)`` on a μ-strongly convex f then has
  ``E‖x_t − x⋆‖² ≤ (1 − γμ)^t ‖x_0 − x⋆‖² + 2γσ²/μ``, ``σ² = E‖∇f_S(x⋆)‖²``
  (:func:`sigma2_star`; the paper's Theorem 3.1): ``γ = 1/(2𝓛)`` is the largest step the
  theorem allows, the step the Cohort-Squeeze paper calls the "optimal" one of its
  MB-GD and MB-LocalGD baselines.
  """
  from scipy.optimize import minimize_scalar  # deferred: scipy is slow to import
  n = sampler.num_clients
  check_number("smoothness", smoothness, 0.0, None, low_open=True)
  ls = np.broadcast_to(np.asarray(client_smoothness, np.float64), (n,))
  if not np.all(np.isfinite(ls)) or np.any(ls <= 0):
    raise ValueError(f"client_smoothness must be positive and finite (a scalar or [n={n}]), "
                     f"got {client_smoothness!r}.")
  v = 1.0 / (n * sampler.marginals)
  m = sampler.pair_marginals * np.outer(v, v)
  root = np.sqrt(ls)

  def bound(a: float) -> float:
    lam = np.linalg.eigvalsh(root[:, None] * (m - a) * root[None, :])[-1]
    return a * n * n * float(smoothness) + n * max(float(lam), 0.0)

  off = m[~np.eye(n, dtype=bool)]
  candidates = [0.0, float(m.max())] + ([float(off.min()), float(off.max())] if n > 1 else [])
  best = minimize_scalar(bound, bounds=(0.0, float(m.max())), method="bounded",
                         options={"xatol": 1e-12 * float(m.max())})
  return float(min([bound(a) for a in candidates] + [float(best.fun)]))


def contiguous_blocks(n: int, b: int) -> list[np.ndarray]:
  """Clients 0..n−1 cut into ``b`` contiguous blocks of near-equal size."""
  if not isinstance(b, (int, np.integer)) or not 1 <= b <= _check_n(n):
    raise ValueError(f"b (number of blocks) must be an int in [1, n={n}], got {b!r}.")
  return [np.asarray(c) for c in np.array_split(np.arange(n), b)]


def kmeans_blocks(features: np.ndarray, b: int, seed: int = 0) -> list[np.ndarray]:
  """Clients grouped into ``b`` blocks by k-means on their feature vectors ``[n, f]`` (e.g.
  each client's mean example), with scikit-learn's ``KMeans``; empty clusters cannot occur
  (KMeans relocates them)."""
  from sklearn.cluster import KMeans  # deferred: scikit-learn is slow to import
  f = np.asarray(features, np.float64).reshape(len(features), -1)
  if not isinstance(b, (int, np.integer)) or not 1 <= b <= len(f):
    raise ValueError(f"b (number of blocks) must be an int in [1, n={len(f)}], got {b!r}.")
  labels = KMeans(n_clusters=b, n_init=10, random_state=seed).fit_predict(f)
  return [np.flatnonzero(labels == k) for k in range(b)]


# --- The cohort of a round and per-client randomness ------------------------------------
# Shared randomness (the cohort) is drawn once per round from the round key, outside any client
# ``vmap``. A client's own key is ``fold_in(key, client_id)``, so it depends on the client's
# identity only, not on its position in the cohort or on the device count.

def check_cohort_size(cohort_size: int | None, num_clients: int) -> int:
  """The static cohort size (``None`` means full participation), validated."""
  if cohort_size is None:
    return num_clients
  if not isinstance(cohort_size, int) or not 1 <= cohort_size <= num_clients:
    raise ValueError(f"cohort_size must be an int in [1, num_clients={num_clients}], got "
                     f"{cohort_size!r}.")
  return cohort_size


def sample_cohort(key: jax.Array, num_clients: int, cohort_size: int | None) -> jax.Array:
  """Client ids ``int32[C]`` of this round's cohort.

  Full participation (``cohort_size`` None or ``num_clients``) returns ``arange(N)``; otherwise
  a uniform sample of ``C`` distinct clients (every C-subset equally likely), sorted: τ-NICE
  (:func:`nice`).
  """
  return nice(num_clients, check_cohort_size(cohort_size, num_clients)).draw(key)[0]


def client_keys(key: jax.Array, client_ids: jax.Array) -> jax.Array:
  """Per-client keys ``[C]``: ``fold_in(key, client_id)`` for each id in ``client_ids[C]``."""
  return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, client_ids)
