"""Post-training pruning scores of one linear layer. Prune the entries with the *smallest* score.

References:
  Mingjie Sun, Zhuang Liu, Anna Bair, J. Zico Kolter (2024). A Simple and Effective Pruning
    Approach for Large Language Models. ICLR 2024. arXiv:2306.11695.
  Yingtao Zhang, Haoli Bai, Haokun Lin, Jialin Zhao, Lu Hou, Carlo Vittorio Cannistraci
    (2024). Plug-and-Play: An Efficient Post-training Pruning Method for Large Language
    Models. ICLR 2024. (no arXiv version found).
  Kai Yi, Peter Richtárik (2025). Symmetric Pruning of Large Language Models. ICLR 2025
    Workshop on Sparsity in LLMs. arXiv:2501.18980.

Numbers such as Lemma 6.3.1, (6.3) or E.2 refer to chapter 6 and appendix E of Kai Yi's
dissertation, where SymWanda appears.

Layout: the layer computes ``X W`` with calibration inputs ``X ∈ R^{a×b}`` (a tokens,
b = C_in) and ``W ∈ R^{b×c}`` (c = C_out) — flax's ``Dense`` kernel ``(in, out)``. Row
``W_{j:}`` is input channel j (length c), column ``W_{:k}`` output neuron k (length b).
``x_norm[b]`` is ``‖X_{:j}‖₂`` (:mod:`fedjaxsparse.pruning.calibration`), ``y_norm[c]`` is
``‖Y_{k:}‖₂`` of an output-side calibration Y.

Every score is a pure function ``W[b, c] (, stats, key) -> float[b, c]``:

* ``general`` — Lemma 6.3.1's ``|W_jk|(‖X_{:j}‖ + ‖Y_{k:}‖)``: exactly the (Sym) objective
  ``‖X(W̃−W)‖_F + ‖(W̃−W)Y‖_F`` when only ``W_jk`` is zeroed; ``squared=True`` is E.2's
  ``|W_jk|√(‖X_{:j}‖² + ‖Y_{k:}‖²)`` (the squared objective's square root);
* ``magnitude`` (X = I, Y = 0), ``wanda`` (Y = 0, activations to the power α: the chapter's
  experiments generalise Wanda's α = 1), ``owanda`` (X = 0);
* ``symmetric`` (X = Y = Wᵀ, Cor. 6.3.4; Table 6.1 prints the squared form, ``squared=True``);
* ``ri`` (Thm 6.3.5) ``|W_jk|(1/‖W_{j:}‖₁ + 1/‖W_{:k}‖₁)``, ``ria`` (6.2) times ``‖X_{:j}‖^α``
  (α = 0.5, RIA's default), ``general_diagonal`` (Lemma 6.3.7);
* ``lp`` (6.3) with E.3.3's re-weightings S1-S4 and p ∈ {0, 1, 2, 3, 4, ∞} (p = 0: the count
  of non-zeros, so ℓ0-RI ranks like magnitude — like Wanda with activations);
* ``stoch_ria`` (6.4): RI's row and column ℓ1 sums over τ = max(1, round(β·min(b, c))) entries
  drawn per row (and per column) independently, without replacement, from the key, not
  rescaled (for non-square layers this reweights the two terms by c : b relative to RIA, as the
  paper's formula does); ``β = 1`` on a square layer is RIA;
* ``relative_importance`` with ``over="inputs"`` (``|W_jk|/‖W_{:k}‖₁``: normalised over the
  inputs of output k) or ``over="outputs"`` (``|W_jk|/‖W_{j:}‖₁``) — Table 6.3's Col-Sum /
  Row-Sum, named by meaning because the paper's "column" is ambiguous between layouts.

A zero row or column norm is guarded (``where(norm == 0, …)``): its entries are all zero and
score 0.

Source for the team: seed 001, ch. 6, Table 6.1 and §6.3, l. 1652-1794; appendix E.2-E.3; spec
``seed001_ch4_ch6.md`` §B.1-§B.4, §0.2.1 (layout).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["general", "magnitude", "wanda", "owanda", "symmetric", "ri", "ria", "general_diagonal",
           "lp", "stoch_ria", "relative_importance", "by_name"]
__dir__ = _public_dir(__all__)

LP_VARIANTS = ("S1", "S2", "S3", "S4")


@jax.jit
def _safe_inv(v: jax.Array) -> jax.Array:
  return jnp.where(v == 0, 0.0, 1.0 / jnp.where(v == 0, 1.0, v))


def _act(x_norm: jax.Array | None, alpha: float) -> jax.Array:
  return 1.0 if x_norm is None else (x_norm ** alpha)[:, None]


def _norms(w: jax.Array, p: float) -> tuple[jax.Array, jax.Array]:
  """(row norms ``‖W_{j:}‖_p`` [b], column norms ``‖W_{:k}‖_p`` [c]); p = 0 counts non-zeros."""
  a = jnp.abs(w)
  if p == 0:
    nz = (a > 0).astype(w.dtype)
    return nz.sum(1), nz.sum(0)
  if p == jnp.inf:
    return a.max(1), a.max(0)
  return (a ** p).sum(1) ** (1.0 / p), (a ** p).sum(0) ** (1.0 / p)


def general(w: jax.Array, x_norm: jax.Array, y_norm: jax.Array,
            squared: bool = False) -> jax.Array:
  """Lemma 6.3.1: ``|W_jk|(‖X_{:j}‖₂ + ‖Y_{k:}‖₂)``; E.2: ``|W_jk|√(‖X_{:j}‖² + ‖Y_{k:}‖²)``."""
  x, y = x_norm[:, None], y_norm[None, :]
  return jnp.abs(w) * (jnp.sqrt(x ** 2 + y ** 2) if squared else x + y)


def magnitude(w: jax.Array) -> jax.Array:
  return jnp.abs(w)


def wanda(w: jax.Array, x_norm: jax.Array, alpha: float = 1.0) -> jax.Array:
  """Cor. 6.3.2 (Y = 0): ``|W_jk|·‖X_{:j}‖₂^α`` (Wanda: α = 1)."""
  return jnp.abs(w) * _act(x_norm, alpha)


def owanda(w: jax.Array, y_norm: jax.Array) -> jax.Array:
  """Cor. 6.3.3 (X = 0): ``|W_jk|·‖Y_{k:}‖₂``."""
  return jnp.abs(w) * y_norm[None, :]


def symmetric(w: jax.Array, squared: bool = False) -> jax.Array:
  """Cor. 6.3.4 (X = Y = Wᵀ): ``|W_jk|(‖W_{j:}‖₂ + ‖W_{:k}‖₂)`` (``squared``: E.2's form)."""
  rows, cols = _norms(w, 2)
  return general(w, rows, cols, squared)


def ri(w: jax.Array) -> jax.Array:
  """Thm 6.3.5: ``|W_jk|(1/‖W_{j:}‖₁ + 1/‖W_{:k}‖₁)``."""
  return lp(w, 1.0)


def ria(w: jax.Array, x_norm: jax.Array, alpha: float = 0.5) -> jax.Array:
  """(6.2): ``RI_jk·‖X_{:j}‖₂^α`` (RIA: α = 0.5)."""
  return ri(w) * _act(x_norm, alpha)


def general_diagonal(w: jax.Array, a_norm: jax.Array, b_norm: jax.Array) -> jax.Array:
  """Lemma 6.3.7: ``|W_jk|(‖A_{:j}‖₂/‖W_{j:}‖₁ + ‖B_{k:}‖₂/‖W_{:k}‖₁)``."""
  rows, cols = _norms(w, 1.0)
  return general(w, a_norm * _safe_inv(rows), b_norm * _safe_inv(cols))


def lp(w: jax.Array, p: float = 1.0, variant: str = "S1", x_norm: jax.Array | None = None,
       alpha: float = 0.0) -> jax.Array:
  """(6.3) and E.3.3 with ``r_j = ‖W_{j:}‖_p``, ``c_k = ‖W_{:k}‖_p``: S1 ``|W|(1/r + 1/c)``,
  S2 ``|W|/(r + c)``, S3 ``|W|(r + c)``, S4 ``|W|/(1/r + 1/c)``; times ``‖X_{:j}‖^α`` with
  ``x_norm`` (the RI → RIA step)."""
  if variant not in LP_VARIANTS:
    raise ValueError(f"variant must be one of {LP_VARIANTS}, got {variant!r}.")
  if not (p == jnp.inf or p >= 0):
    raise ValueError(f"p must be >= 0 or inf, got {p!r}.")
  rows, cols = _norms(w, p)
  r, c = rows[:, None], cols[None, :]
  ir, ic = _safe_inv(r), _safe_inv(c)
  factor = {"S1": ir + ic, "S2": _safe_inv(r + c), "S3": r + c,
            "S4": _safe_inv(ir + ic)}[variant]
  return jnp.abs(w) * factor * _act(x_norm, alpha)


def stoch_ria(w: jax.Array, key: jax.Array, beta: float = 0.1,
              x_norm: jax.Array | None = None, alpha: float = 0.5) -> jax.Array:
  """(6.4): ``|W_jk|(1/‖W_{j,S_j}‖₁ + 1/‖W_{S_k,k}‖₁)·‖X_{:j}‖^α``, ``S_j`` (``S_k``) τ
  positions of row j (column k) drawn without replacement, independently per row (column)."""
  if not 0.0 < beta <= 1.0:
    raise ValueError(f"beta must lie in (0, 1], got {beta!r}.")
  b, c = w.shape
  tau = max(1, round(beta * min(b, c)))
  a = jnp.abs(w)
  k_rows, k_cols = jax.random.split(key)

  def partial_sums(mat, k):  # per row of mat: the ℓ1 sum over tau random entries
    picks = jax.lax.top_k(jax.random.uniform(k, mat.shape), tau)[1]
    return jnp.take_along_axis(mat, picks, axis=1).sum(1)

  rows = partial_sums(a, k_rows)[:, None]
  cols = partial_sums(a.T, k_cols)[None, :]
  return a * (_safe_inv(rows) + _safe_inv(cols)) * _act(x_norm, alpha)


def relative_importance(w: jax.Array, over: str = "inputs", x_norm: jax.Array | None = None,
                        alpha: float = 0.5) -> jax.Array:
  """One of RIA's two terms (Table 6.3's Col-Sum / Row-Sum): ``over="inputs"`` →
  ``|W_jk|/‖W_{:k}‖₁``, ``over="outputs"`` → ``|W_jk|/‖W_{j:}‖₁``; times ``‖X_{:j}‖^α``."""
  rows, cols = _norms(w, 1.0)
  if over == "inputs":
    factor = _safe_inv(cols)[None, :]
  elif over == "outputs":
    factor = _safe_inv(rows)[:, None]
  else:
    raise ValueError(f"over must be 'inputs' or 'outputs', got {over!r}.")
  return jnp.abs(w) * factor * _act(x_norm, alpha)


SCORES = ("magnitude", "wanda", "ria", "stochria", "ri", "symmetric", "lp", "relative_inputs",
          "relative_outputs")


@functools.lru_cache(maxsize=None)
def by_name(name: str, *, alpha: float | None = None, beta: float = 0.1, p: float = 1.0,
            variant: str = "S1"):
  """A score ``(W, x_norm | None, key) -> S`` by name, for :func:`posttrain.prune_params` and
  the experiments. ``alpha`` defaults to each method's own (Wanda 1, RIA 0.5, stochRIA 1 as in
  Table 6.2, ℓp and the relative terms 0.5; RI and symmetric 0, as defined). Cached: the
  same arguments give the same function, so jitted callers taking it as a static argument
  compile once."""
  if name not in SCORES:
    raise ValueError(f"score must be one of {SCORES}, got {name!r}.")
  a = {"wanda": 1.0, "stochria": 1.0, "ri": 0.0, "symmetric": 0.0}.get(name, 0.5) \
      if alpha is None else alpha

  def need(x):
    if x is None:
      raise ValueError(f"score {name!r} needs calibration statistics (x_norm).")
    return x

  fns = {
      "magnitude": lambda w, x, k: magnitude(w),
      "wanda": lambda w, x, k: wanda(w, need(x), a),
      "ria": lambda w, x, k: ria(w, need(x), a),
      "stochria": lambda w, x, k: stoch_ria(w, k, beta, need(x), a),
      "ri": lambda w, x, k: ri(w) * _act(x, a),
      "symmetric": lambda w, x, k: symmetric(w) * _act(x, a),
      "lp": lambda w, x, k: lp(w, p, variant, x, a),
      "relative_inputs": lambda w, x, k: relative_importance(w, "inputs", need(x), a),
      "relative_outputs": lambda w, x, k: relative_importance(w, "outputs", need(x), a),
  }
  return fns[name]
