"""Sha-DDSS on the synthetic Lasso (Wu (2024) ch. 3; spec ``seed004.md`` §1.9): one outer
iteration of the library's jitted ``step`` (full gradient + gap-safe screening + K inner
updates) against a sequential numpy/scipy implementation of the same mathematics, and S outer
iterations against scikit-learn's ``Lasso`` (coordinate descent) run to the same duality gap,
all in the same process and in float64.

Problem: ``sparse_rows.planted(--n, --p, --density, --support)`` (regression), the Lasso
``(1/(2n))‖b − Ax‖² + λ‖x‖₁`` at ``λ = --lam-ratio · λ_max``; ``ddss.sha_ddss`` (the sparse
variance-reduced estimator (3-6) and the decoupled sparse prox) with ``workers=1``,
``inner_steps = K = --inner`` (default n) and step ``η = --step / L``, ``L = max_i ‖a_i‖²``.

* ``library``: ``jax.jit(algo.step)`` compiled ahead with ``.lower(...).compile()``
  (``compile s``; one program serves every outer iteration). The S = ``--outer`` iterations
  from x = 0 run once (warm-up; they give the states), then the median of ``--repeats`` timed
  runs, each ending with ``jax.block_until_ready``. The single outer iteration timed is the
  one from the state after ``--start`` iterations, with the key the S-run gives it.
* ``numpy/scipy``: the same outer iteration, sequentially: ``z = A x``, ``ρ = z − b``,
  ``∇F = Aᵀρ/n`` with the scipy CSR matrix; the gap-safe test as ``screening.screen`` does it
  (dual point ``y = −ρ/max(1, ‖∇F_B‖_∞/λ)``, gap ``G``, radius ``√(2 n G)``, column j eliminated
  iff ``n|∇F_j|/scale + ‖A_j‖·r < nλ``); then a plain Python loop over the K updates, each on
  the row ``a_i`` (numpy on its ≈ p·density entries): ``v = a_i(a_iᵀx − b_i − ρ⁰_i) + D_i∇F``
  on supp(a_i) ∩ B, ``x_j ← soft(x_j − ηv_j, ηλd_j)``. The sample indices are the library's
  draws (``workers=1``: ``i_t = randint(split(fold_in(key, t), 1)[0], (), 0, n)``),
  precomputed with jax outside the timed region. ``max |dx|`` compares the two iterates
  (float64: summation order only, ≈ 1e-12 or less); ``speed-up`` is numpy seconds over library
  seconds.
* ``sklearn``: ``Lasso(alpha=λ, fit_intercept=False, tol, max_iter=--sk-max-iter)`` on the
  CSR matrix (sklearn's objective has the same 1/(2n) normalisation). The target is the
  duality gap of the library's iterate after S outer iterations; tol starts at
  ``target·n/‖b‖²`` (sklearn stops when its unnormalised gap < ``tol·‖b‖²``) and shrinks
  ×10 until the gap of ``coef_`` — computed here with the screening formula, all columns
  active — is at most the target (``fits`` tries; ``reference s`` is the successful fit's
  wall time, ``all fits s`` their sum, ``sklearn epochs`` its ``n_iter_``). ``speed-up`` is sklearn seconds over the library's seconds
  for the S iterations (compile excluded, reported apart).

Usage: python benchmarks/bench_ddss.py [--n 10000] [--p 100000] [--density 1e-3]
       [--support 100] [--lam-ratio 0.1] [--inner N] [--step 0.5] [--outer 5] [--start 1]
       [--repeats 3] [--ref-repeats 1] [--sk-max-iter 100000] [--seed 0] [--tiny]
       [--out benchmarks/results]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import scipy
import scipy.sparse as sp

import fedjaxsparse as fjs

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_io  # noqa: E402  (the benchmarks' shared result writer)


# --- inputs ---------------------------------------------------------------------------------

def to_csr(data: fjs.data.sparse_rows.SparseRows) -> sp.csr_matrix:
  """The padded rows as a scipy CSR matrix (padding dropped; no explicit zeros)."""
  idx, val = np.asarray(data.idx), np.asarray(data.val)
  rows = np.repeat(np.arange(data.n), idx.shape[1])
  a = sp.csr_matrix((val.ravel(), (rows, idx.ravel())), shape=(data.n, data.p))
  a.sum_duplicates()
  a.eliminate_zeros()
  return a


def library_draws(key, inner: int, n: int) -> np.ndarray:
  """The sample index of each of the K inner updates of ``ddss`` with ``workers=1`` (one
  worker, shard = all n rows): ``randint(split(fold_in(key, t), 1)[0], (), 0, n)``."""
  def draw(t):
    return jax.random.randint(jax.random.split(jax.random.fold_in(key, t), 1)[0], (), 0, n)
  return np.asarray(jax.jit(jax.vmap(draw))(jnp.arange(inner)))


# --- the numpy/scipy reference ----------------------------------------------------------------

def np_screen(a, b, lam, col_norm, x, active):
  """``screening.screen`` for the Lasso (singleton blocks, L_f = 1), sequentially:
  (new active, ρ, ∇F, gap)."""
  n = a.shape[0]
  z = a @ x
  rho = z - b
  grad = (a.T @ rho) / n
  dn = np.abs(grad)
  top = dn[active].max() if active.any() else -np.inf
  scale = max(1.0, top / lam)
  y = -rho / scale
  primal = np.mean(0.5 * (b - z) ** 2) + lam * np.sum(np.abs(x))
  dual = np.mean(b * y - 0.5 * y * y)
  gap = max(float(primal - dual), 0.0)
  r = np.sqrt(2.0 * n * gap)
  eliminate = n * dn / scale + col_norm * r < n * lam
  return active & ~eliminate, rho, grad, gap


def np_gap(a, b, lam, col_norm, x) -> float:
  """The duality gap at x (every column active)."""
  return np_screen(a, b, lam, col_norm, x, np.ones(a.shape[1], bool))[3]


def np_outer(a, b, lam, col_norm, d, eta, x, active, draws):
  """One Sha-DDSS outer iteration (``workers=1``): full gradient + screening at the snapshot,
  then the K sparse-VR / sparse-prox updates on the rows ``draws``, one after another.
  Returns (x, active)."""
  active, rho0, grad, _ = np_screen(a, b, lam, col_norm, x, active)
  x = x * active
  g0 = grad * active
  indptr, indices, vals = a.indptr, a.indices, a.data
  for i in draws.tolist():
    lo, hi = indptr[i], indptr[i + 1]
    cols, v = indices[lo:hi], vals[lo:hi]
    on = active[cols]
    cols, v = cols[on], v[on]
    xc = x[cols]
    coef = (v @ xc - b[i]) - rho0[i]
    dc = d[cols]
    u = xc - eta * (v * coef + dc * g0[cols])
    new = np.sign(u) * np.maximum(np.abs(u) - eta * lam * dc, 0.0)
    x[cols] = xc + (new - xc)
  return x, active


# --- the benchmark --------------------------------------------------------------------------

def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--n", type=int, default=10_000, help="samples")
  p.add_argument("--p", type=int, default=100_000, help="features")
  p.add_argument("--density", type=float, default=1e-3)
  p.add_argument("--support", type=int, default=100, help="planted non-zeros")
  p.add_argument("--lam-ratio", type=float, default=0.1, dest="lam_ratio", help="λ / λ_max")
  p.add_argument("--inner", type=int, default=None, help="K inner updates (default n)")
  p.add_argument("--step", type=float, default=0.5, help="η·L")
  p.add_argument("--outer", type=int, default=5, help="S outer iterations (sklearn row)")
  p.add_argument("--start", type=int, default=1,
                 help="the single timed outer iteration starts after this many")
  p.add_argument("--repeats", type=int, default=3, help="library runs timed")
  p.add_argument("--ref-repeats", type=int, default=1, dest="ref_repeats",
                 help="numpy/scipy runs timed")
  p.add_argument("--sk-max-iter", type=int, default=100_000, dest="sk_max_iter")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--tiny", action="store_true",
                 help="n 300, p 2000, density 5e-3, support 10, S 3 (tests)")
  p.add_argument("--out", default="benchmarks/results",
                 help="folder for bench_ddss.json, or a path ending in .json")
  args = p.parse_args(argv)
  if args.tiny:
    args.n, args.p, args.density, args.support, args.outer = 300, 2000, 5e-3, 10, 3
  if args.inner is None:
    args.inner = args.n
  if not 0 <= args.start < args.outer:
    raise SystemExit(f"--start must lie in [0, --outer), got {args.start}.")
  return args


def _table(rows: list[dict], cols: list[str]) -> str:
  def cell(v):
    if isinstance(v, float):
      return f"{v:.4g}"
    return "" if v is None else str(v)
  cells = [[cell(r.get(c)) for c in cols] for r in rows]
  width = [max(len(c), *(len(r[j]) for r in cells)) for j, c in enumerate(cols)]
  lines = ["  ".join(f"{c:>{w}s}" for c, w in zip(cols, width))]
  lines += ["  ".join(f"{v:>{w}s}" for v, w in zip(r, width)) for r in cells]
  return "\n".join(lines)


def run(args) -> dict:
  t = time.perf_counter()
  data, _ = fjs.data.sparse_rows.planted(args.n, args.p, args.density, args.support, seed=args.seed)
  data = jax.block_until_ready(data)
  lam_max = fjs.convex.screening.lambda_max(data)
  lam = args.lam_ratio * lam_max
  prob = fjs.convex.screening.make_problem(data, lam)
  big_l = fjs.convex.screening.LOSSES["squared"] * float(prob.max_row_sq)
  eta = args.step / big_l
  algo = fjs.sha_ddss(prob, data, step_size=eta, inner_steps=args.inner, workers=1)
  setup_s = time.perf_counter() - t

  # host copies for the references
  a = to_csr(data)
  b = np.asarray(data.b)
  col_norm = np.sqrt(np.asarray(a.multiply(a).sum(0)).ravel())
  counts = np.diff(a.tocsc().indptr)
  d = np.where(counts > 0, args.n / np.maximum(counts, 1), 0.0)

  # --- library: compile, S outer iterations (warm-up, then timed) ---------------------------
  base = jax.random.key(args.seed)
  keys = [jax.random.fold_in(base, s) for s in range(args.outer)]
  state0 = algo.init(None, jnp.zeros(args.p, data.val.dtype), data)
  t = time.perf_counter()
  step = jax.jit(algo.step).lower(keys[0], state0, data).compile()
  compile_s = time.perf_counter() - t

  def outer_run():
    st, states, infos = state0, [state0], []
    for k in keys:
      st, info = step(k, st, data)
      states.append(st)
      infos.append(info)
    return jax.block_until_ready((states, infos))

  states, infos = outer_run()  # warm-up; gives the states
  run_times = []
  for _ in range(args.repeats):
    t = time.perf_counter()
    outer_run()
    run_times.append(time.perf_counter() - t)
  lib_run_s = statistics.median(run_times)
  x_lib_final = np.asarray(states[-1].x)
  lib_gap = np_gap(a, b, lam, col_norm, x_lib_final)
  lib_gap_screen = float(jax.jit(
      lambda x: fjs.convex.screening.screen(prob, data, x, jnp.ones(args.p, bool)).gap)(
          states[-1].x))

  # --- one outer iteration: library vs numpy/scipy --------------------------------------------
  given, key = states[args.start], keys[args.start]
  one_times = []
  for _ in range(args.repeats):
    t = time.perf_counter()
    out, _ = jax.block_until_ready(step(key, given, data))
    one_times.append(time.perf_counter() - t)
  lib_one_s = statistics.median(one_times)
  x_lib = np.asarray(out.x)
  draws = library_draws(key, args.inner, args.n)  # outside the timed region
  x_given, act_given = np.asarray(given.x), np.asarray(given.active)
  ref_times = []
  for _ in range(args.ref_repeats):
    t = time.perf_counter()
    x_ref, act_ref = np_outer(a, b, lam, col_norm, d, eta, x_given.copy(), act_given, draws)
    ref_times.append(time.perf_counter() - t)
  ref_s = statistics.median(ref_times)
  diff = float(np.max(np.abs(x_lib - x_ref)))

  # --- S outer iterations vs scikit-learn's coordinate descent to the same gap ---------------
  from sklearn import __version__ as sk_version
  from sklearn.exceptions import ConvergenceWarning
  from sklearn.linear_model import Lasso
  tol = lib_gap * args.n / float(b @ b)
  fits, all_fits_s, sk_s, sk_gap, sk_iter = 0, 0.0, None, np.inf, None
  while fits < 8:
    fits += 1
    model = Lasso(alpha=lam, fit_intercept=False, tol=tol, max_iter=args.sk_max_iter)
    with warnings.catch_warnings():
      warnings.simplefilter("ignore", ConvergenceWarning)
      t = time.perf_counter()
      model.fit(a, b)
      sk_s = time.perf_counter() - t
    all_fits_s += sk_s
    sk_gap, sk_iter = np_gap(a, b, lam, col_norm, model.coef_), int(model.n_iter_)
    if sk_gap <= lib_gap:
      break
    tol /= 10.0

  rows = [
      {"comparison": "1 outer iteration", "library s": lib_one_s, "compile s": compile_s,
       "reference": "numpy/scipy loop", "reference s": ref_s, "speed-up": ref_s / lib_one_s,
       "max |dx|": diff, "active lib": int(np.sum(np.asarray(out.active))),
       "active ref": int(np.sum(act_ref)),
       "nnz lib": int(np.sum(x_lib != 0)), "nnz ref": int(np.sum(x_ref != 0))},
      {"comparison": f"{args.outer} outer iterations", "library s": lib_run_s,
       "compile s": compile_s, "reference": "sklearn Lasso CD", "reference s": sk_s,
       "speed-up": sk_s / lib_run_s, "gap lib": lib_gap, "gap ref": sk_gap,
       "tol": tol, "fits": fits, "all fits s": all_fits_s, "sklearn epochs": sk_iter,
       "active lib": int(np.sum(np.asarray(states[-1].active))),
       "nnz lib": int(np.sum(x_lib_final != 0)),
       "nnz ref": int(np.sum(model.coef_ != 0))},
  ]
  info = {"n": args.n, "p": args.p, "nnz": int(a.nnz), "row_nnz_max": int(data.idx.shape[1]),
          "lambda_max": lam_max, "lambda": lam, "L": big_l, "eta": eta, "K": args.inner,
          "setup_s": setup_s, "library_gap_screen": lib_gap_screen,
          "gap_history": [float(i.gap) for i in infos] + [lib_gap],
          "active_history": [int(i.p_active) for i in infos],
          "sklearn": sk_version, "scipy": scipy.__version__}
  return {"rows": rows, "problem": info}


def main(argv=None) -> dict:
  args = parse_args(argv)
  with jax.enable_x64(True):
    res = run(args)
  rows, info = res["rows"], res["problem"]
  print(f"Sha-DDSS (workers=1) on planted Lasso: n {info['n']:,}, p {info['p']:,}, nnz "
        f"{info['nnz']:,} (row max {info['row_nnz_max']}), λ = {args.lam_ratio:g}·λ_max = "
        f"{info['lambda']:.4g}, K = {info['K']:,}, η = {args.step:g}/L (L = {info['L']:.4g}); "
        f"float64; {jax.default_backend()} ({jax.devices()[0].device_kind}), "
        f"{os.cpu_count()} CPUs")
  cols = ["comparison", "library s", "compile s", "reference", "reference s", "speed-up",
          "max |dx|", "gap lib", "gap ref", "tol", "fits", "active lib", "active ref",
          "nnz lib", "nnz ref"]
  print(_table(rows, cols))
  print("gap at the snapshots: " + ", ".join(f"{g:.3g}" for g in info["gap_history"]))
  result = {"config": vars(args), "problem": info, **bench_io.environment(), "rows": rows}
  bench_io.write_result(result, args.out, "bench_ddss")
  return result


if __name__ == "__main__":
  main()
