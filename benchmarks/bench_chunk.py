"""What a round costs beyond its clients: the runner's chunk against the scan it replaced.

A cohort algorithm keeps per-client state (N × d floats: Scafflix's control variates h_i, local
optima x_i*, iterates x_i) but a round touches only its cohort's rows. The runner's chunk used to
be a ``lax.scan`` over its rounds with each step behind a ``lax.cond`` (rounds past the run's end
masked) and a finiteness check of the whole state after every round: the ``cond`` keeps the old
state alive for its other branch, so XLA copies every updated per-client array twice a round,
and the check reads the whole state — O(N·d) a round for O(cohort·d) of work. The chunk now
loops over exactly its rounds (a traced trip count, no ``cond``: updates in place), re-checks
only the leaves a round changed when asked to, and the runner checks the state once a chunk
(``build_chunk(check_every_round=False)``; a chunk whose state ends non-finite is re-run with
the per-round check for the exact round).

This script times both chunks — the old one rebuilt here, :func:`scan_chunk`, and
:func:`fedjaxsparse.runtime.runner.build_chunk` as the runner calls it — in one process, on
Scafflix's round form (softmax regression on the FEMNIST shape, 32 images a writer, 10 clients a
round) at growing populations, and checks that both end in the same state.

Usage: python benchmarks/bench_chunk.py [--clients 10 100 1000] [--rounds 10] [--repeats 5]
       [--tiny] [--out benchmarks/results]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp

import fedjaxsparse as fjs

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_io  # noqa: E402
import gpu_suite as G  # noqa: E402  (the Scafflix FEMNIST case)

runner = fjs.runtime.runner


def scan_chunk(algo, chunk_size: int):
  """The runner's chunk before issue 32 (no evaluation): ``lax.scan`` over ``chunk_size``
  rounds, each step behind ``lax.cond(r < num_rounds)``, the whole state checked after every
  round. Same signature and state as :func:`fedjaxsparse.runtime.runner.build_chunk`."""
  def chunk(rounds_key, state, start_round, num_rounds, train, test):
    del test

    def step(s, r):
      return algo.step(jax.random.fold_in(rounds_key, r), s, train)

    info_shape = jax.eval_shape(step, state, start_round)[1]

    def body(s, r):
      s, info = jax.lax.cond(
          r < num_rounds, step,
          lambda s, r: (s, jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), info_shape)),
          s, r)
      return s, (info, jnp.all(runner.state_finite(s)))

    rounds = start_round + jnp.arange(chunk_size, dtype=jnp.int32)
    return jax.lax.scan(body, state, rounds)

  return chunk


def time_chunk(fn, state, data, rounds: int, repeats: int) -> tuple[float, object]:
  """(median ms per round over ``repeats`` chunks after a warm-up, the state after one chunk
  from ``state``)."""
  key = jax.random.key(1)
  args = lambda s: (key, s, jnp.int32(0), jnp.int32(rounds), data, None)  # noqa: E731
  first, _ = fn(*args(state))
  jax.block_until_ready(first)
  s, times = first, []
  for _ in range(repeats):
    t = time.perf_counter()
    s, _ = fn(*args(s))
    jax.block_until_ready(s)
    times.append(time.perf_counter() - t)
  return 1e3 * statistics.median(times) / rounds, first


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--clients", type=int, nargs="*", default=[10, 100, 1000])
  p.add_argument("--rounds", type=int, default=10, help="rounds a chunk")
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--tiny", action="store_true", help="toy sizes (the test suite)")
  p.add_argument("--out", default="benchmarks/results")
  args = p.parse_args(argv)
  suite = G.parse_args(["--tiny"] if args.tiny else [])
  if args.tiny:
    args.clients, args.rounds, args.repeats = [4, 8], 3, 1
  rows = []
  for n in args.clients:
    suite.scale = n / 100
    case = G.FAMILIES["scafflix_femnist"](suite)
    algo = case.make(case.data.num_clients, case.cohort)
    strategy = fjs.runtime.clients.choose_strategy(algo, case.params, case.data)[0]
    data = fjs.runtime.clients.with_strategy(case.data, strategy)
    state = algo.init(jax.random.key(0), case.params, data)
    old_ms, old = time_chunk(jax.jit(scan_chunk(algo, args.rounds)), state, data,
                             args.rounds, args.repeats)
    new_ms, new = time_chunk(jax.jit(runner.build_chunk(algo, args.rounds,
                                                        check_every_round=False)),
                             state, data, args.rounds, args.repeats)
    diff = max(float(jnp.max(jnp.abs(a - b))) for a, b in
               zip(jax.tree.leaves(old), jax.tree.leaves(new)))
    row = {"family": "scafflix_femnist (round form)", "clients": case.data.num_clients,
           "cohort": case.cohort, "strategy": strategy,
           "state MiB": sum(a.nbytes for a in jax.tree.leaves(state)) / 2**20,
           "scan+cond ms/round": old_ms, "runner chunk ms/round": new_ms,
           "speed-up": old_ms / new_ms, "max |state difference|": diff}
    rows.append(row)
    print(f"{n:6d} clients ({row['state MiB']:7.1f} MiB of state): scan+cond "
          f"{old_ms:8.2f} ms/round, runner chunk {new_ms:8.2f} ms/round, "
          f"{row['speed-up']:.2f}x (states differ by {diff:.1e})", flush=True)
  result = {"config": vars(args), **bench_io.environment(), "rows": rows}
  bench_io.write_result(result, args.out, "bench_chunk")
  return result


if __name__ == "__main__":
  main()
