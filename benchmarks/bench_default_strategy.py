"""Is the runner's default client strategy the fastest? Every family's round (the GPU suite's
cases, ``gpu_suite.FAMILIES`` and FedAvg's CNN, at ``--scale`` of their papers' populations)
compiled with each client strategy the library offers — ``vmap``, ``map`` and, where its
compile stays reasonable, ``unroll`` — and the one :func:`fedjaxsparse.runtime.clients.choose_strategy`
picks on this backend; ms per round (median of ``--repeats`` after a warm-up), compile seconds,
and the default's time over the best strategy's (goal: ≤ 1.1 for every family).

``unroll`` writes every client out (compile time grows with the clients and their loops), so
it is timed only for the families named by ``--unroll`` (none by default). It pays only for
XLA's own convolutions on CPU, which the library's models do not use there (their patch
convolutions run unrolled at 1.5× ``map``'s time, ``bench_client_strategies.py``); the
epoch-based families keep a ``while`` loop per client, which unrolling cannot remove
(FedMRN, measured once: 5.14 s per round vs 5.17 s under ``map``, at 199 s of compile).

Usage: python benchmarks/bench_default_strategy.py [--scale 0.1] [--repeats 3]
       [--families ...] [--tiny] [--out benchmarks/results]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import jax

import fedjaxsparse as fjs

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_io  # noqa: E402
import gpu_suite as G  # noqa: E402  (the families' cases)

clients = fjs.runtime.clients


def time_strategy(case, strategy: str, repeats: int) -> tuple[float, float]:
  algo = case.make(case.data.num_clients, case.cohort)
  data = clients.with_strategy(case.data, strategy)
  state = algo.init(jax.random.key(0), case.params, data)
  t = time.perf_counter()
  step = jax.jit(algo.step).lower(jax.random.key(1), state, data).compile()
  compile_s = time.perf_counter() - t
  jax.block_until_ready(step(jax.random.key(1), state, data))
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(step(jax.random.key(1), state, data))
    times.append(time.perf_counter() - t)
  return 1e3 * statistics.median(times), compile_s


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--scale", type=float, default=0.1,
                 help="fraction of each paper's population (clients per round stay 10)")
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--families", nargs="*", help="default: FedAvg's CNN and every family")
  p.add_argument("--unroll", nargs="*", default=[], help="families also timed with 'unroll'")
  p.add_argument("--tiny", action="store_true", help="toy sizes (the test suite)")
  p.add_argument("--out", default="benchmarks/results")
  args = p.parse_args(argv)
  suite = G.parse_args(["--tiny"] if args.tiny else [])
  suite.scale = 0.02 if args.tiny else args.scale
  builders = {"fedavg_cnn": G._cnn_case, **G.FAMILIES}
  names = args.families or list(builders)
  rows = []
  for name in names:
    case = builders[name](suite)
    default, why = clients.choose_strategy(case.make(case.data.num_clients, case.cohort),
                                           case.params, case.data)
    row = {"family": name, "clients": case.data.num_clients, "cohort": case.cohort,
           "default": default, "why": why}
    for strategy in ("vmap", "map") + (("unroll",) if name in args.unroll else ()):
      row[f"{strategy} ms"], row[f"{strategy} compile s"] = time_strategy(
          case, strategy, args.repeats)
    timed = {s: row[f"{s} ms"] for s in ("vmap", "map", "unroll") if f"{s} ms" in row}
    row["best"] = min(timed, key=timed.get)
    row["default / best"] = timed[default] / timed[row["best"]]
    rows.append(row)
    print(f"{name:30s} default {default:7s} " + "  ".join(
        f"{s} {v:9.2f} ms" for s, v in timed.items())
          + f"   default/best {row['default / best']:.2f}   ({why})", flush=True)
  result = {"config": vars(args), **bench_io.environment(), "rows": rows}
  bench_io.write_result(result, args.out, "bench_default_strategy")
  return result


if __name__ == "__main__":
  main()
