"""Device memory with a large population: client state on the device vs in host memory.

EF-BV with partial participation (EF21-PP, λ = ν = 1, Top-K uplinks) of softmax regression
(784 × 10 weights) over ``--clients`` clients (10⁵ by default) with ``--examples`` examples
each, ``--cohort`` clients per round. Each client's control variate h_i has the model's
7,850 entries, so the population's state is N × 31 KB (3.1 GB at 10⁵ clients), plus its data.
Reported per residence (``fedjaxsparse.runtime.population``): the device bytes the compiled round
program needs (arguments + outputs + temporaries, from XLA's memory analysis — the figure
that must fit on an accelerator), the live device bytes after the run, ms per round, and
whether the two residences end with the same model (bitwise).

Usage: python benchmarks/bench_population.py [--clients 100000] [--cohort 100] [--rounds 10]
       [--out benchmarks/results]
"""
from __future__ import annotations

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

import fedjaxsparse as fjs


def program_bytes(compiled) -> int:
  m = compiled.memory_analysis()
  return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
             - m.alias_size_in_bytes)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--clients", type=int, default=100_000)
  parser.add_argument("--examples", type=int, default=4)
  parser.add_argument("--cohort", type=int, default=100)
  parser.add_argument("--rounds", type=int, default=10)
  parser.add_argument("--out", default="benchmarks/results")
  args = parser.parse_args()
  n, m, d = args.clients, args.examples, 784
  rng = np.random.default_rng(0)
  data = fjs.data.FederatedData(x=rng.random((n, m, d), dtype=np.float32),
                                y=rng.integers(0, 10, (n, m)).astype(np.int32),
                                mask=np.ones((n, m), np.float32),
                                num_examples=np.full(n, m, np.int32))
  model = fjs.models.softmax_regression(d, 10)
  w0 = model.init(jax.random.key(0))
  dim = 7850
  algo = fjs.ef_bv_pp(fjs.models.make_loss(model), fjs.compressors.top_k(dim, dim // 100), 0.1,
                      1.0, 1.0, cohort_size=args.cohort)
  key = jax.random.key(1)
  rows, finals = [], {}
  state_gb = fjs.runtime.population.state_bytes(algo, w0, data) / 2**30

  # host: client state and data stay in numpy; the device sees one cohort per round
  t = time.perf_counter()
  host = fjs.runtime.population.run_on_host(algo, key, w0, data, num_rounds=args.rounds,
                                            progress=False)
  host_s = time.perf_counter() - t
  n_c = args.cohort
  cohort = jax.tree.map(lambda a: a[:n_c], data)
  server = jax.eval_shape(algo.init, key, w0)
  h_rows = jax.eval_shape(jax.vmap(algo.init_client, in_axes=(None, 0)), server, cohort)
  step = jax.jit(lambda k, s, r, i, dd: algo.step(k, s, r, i, dd, n))
  compiled = step.lower(key, server, h_rows, jnp.arange(n_c), cohort).compile()
  rows.append({"residence": "host", "round program device MB": program_bytes(compiled) / 2**20,
               "live device MB after run": fjs.runtime.population.live_device_bytes() / 2**20,
               "peak live device MB (round boundaries)": host.peak_device_bytes / 2**20,
               "ms/round (incl. host gather/scatter)": 1e3 * host_s / args.rounds})
  finals["host"] = jax.device_get(host.server.x)
  del host

  # device: the whole population's state and data on the device
  dev_algo = fjs.runtime.population.on_device(algo)
  init_key, rounds_key = fjs.runtime.runner.split_run_key(key)
  t = time.perf_counter()
  state = jax.jit(dev_algo.init)(init_key, w0, data)
  chunk = jax.jit(fjs.runtime.runner.build_chunk(dev_algo, 1))
  compiled = chunk.lower(rounds_key, state, jnp.int32(0), jnp.int32(args.rounds), data,
                         None).compile()
  dev_data = jax.device_put(data)
  for r in range(args.rounds):
    state, _ = compiled(rounds_key, state, jnp.int32(r), jnp.int32(args.rounds), dev_data,
                        None)
  jax.block_until_ready(state)
  dev_s = time.perf_counter() - t
  rows.append({"residence": "device", "round program device MB": program_bytes(compiled) / 2**20,
               "live device MB after run": fjs.runtime.population.live_device_bytes() / 2**20,
               "peak live device MB (round boundaries)": None,
               "ms/round (incl. host gather/scatter)": 1e3 * dev_s / args.rounds})
  finals["device"] = jax.device_get(state.server.x)
  same = all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(finals["host"]),
                                                  jax.tree.leaves(finals["device"])))
  print(f"{n} clients, cohort {args.cohort}, client state {state_gb:.2f} GiB, data "
        f"{data.x.nbytes / 2**30:.2f} GiB; same final model: {same}")
  cols = list(rows[0])
  print(" | ".join(cols))
  for r in rows:
    print(" | ".join("—" if r[c] is None else f"{r[c]:.4g}" if isinstance(r[c], float)
                     else str(r[c]) for c in cols))
  os.makedirs(args.out, exist_ok=True)
  path = os.path.join(args.out, "bench_population.json")
  with open(path, "w") as f:
    json.dump({"backend": jax.default_backend(), "device": str(jax.devices()[0]),
               "clients": n, "cohort": args.cohort, "client_state_gib": state_gb,
               "same_final_model": same, "rows": rows}, f, indent=1)
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
