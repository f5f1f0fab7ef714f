"""Several processes, one run: ``jax.distributed`` as the engine.

Every process runs the same program (SPMD). :func:`initialize` joins the processes through a
coordinator (on CPU, cross-process collectives go through gloo,
``jax_cpu_collectives_implementation``); afterwards ``jax.devices()`` lists every process's
devices, and :func:`fedjaxsparse.runtime.sharding.client_mesh` spans them all, so
``run(..., mesh=client_mesh())`` shards the client axis over every process's devices, the
server aggregate becomes a cross-process reduction, and every process holds the same
replicated global model, history and diagnostics (the host reads only replicated values and
its own shards). Randomness does not depend on the process count (client keys are
``fold_in(key, client_id)``), so N processes compute the single-process run (to float
rounding of the reductions): ``tests/test_distributed.py``.

:func:`launch` starts N local processes running one Python module or script with the
coordinator on localhost (the way to test and to use several CPU processes on one machine);
on a cluster the scheduler starts one process per host and each calls :func:`initialize`
with its own id (see the README's "Several processes and hosts").
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time

import jax
import numpy as np

from fedjaxsparse.errors import check_int
from jax.experimental import multihost_utils
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["initialize", "initialize_from_env", "is_primary", "to_host", "free_port", "launch"]
__dir__ = _public_dir(__all__)

ENV_ID, ENV_COUNT, ENV_COORDINATOR = ("FEDJAXSPARSE_PROCESS_ID", "FEDJAXSPARSE_NUM_PROCESSES",
                                      "FEDJAXSPARSE_COORDINATOR")


def initialize(num_processes: int, process_id: int, coordinator: str,
               timeout_s: int = 60) -> None:
  """Join ``num_processes`` processes (this one is ``process_id``) through the coordinator
  ``host:port`` (process 0 serves it). Call before any other JAX work."""
  num_processes = check_int("num_processes", num_processes, 1)
  if not isinstance(process_id, int) or not 0 <= process_id < num_processes:
    raise ValueError(f"process_id must be an int in [0, {num_processes - 1}], got "
                     f"{process_id!r}.")
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                             process_id=process_id, initialization_timeout=timeout_s)


def initialize_from_env() -> bool:
  """:func:`initialize` from the variables :func:`launch` sets; ``False`` when they are
  absent (a single-process run)."""
  if ENV_COUNT not in os.environ:
    return False
  initialize(int(os.environ[ENV_COUNT]), int(os.environ[ENV_ID]), os.environ[ENV_COORDINATOR])
  return True


def is_primary() -> bool:
  """Whether this is process 0 (the one that prints and writes results)."""
  return jax.process_index() == 0


def to_host(tree):
  """``tree`` as numpy arrays on every process (gathers arrays spread over processes)."""

  def get(a):
    if not isinstance(a, jax.Array) or a.is_fully_addressable:
      return np.asarray(a)
    if a.is_fully_replicated:
      return np.asarray(a.addressable_shards[0].data)
    return np.asarray(multihost_utils.process_allgather(a, tiled=True))

  return jax.tree.map(get, tree)


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def launch(args: list[str], num_processes: int, *, timeout_s: float | None = None,
           env: dict | None = None, stream_primary: bool = False
           ) -> list[subprocess.CompletedProcess]:
  """Run ``python *args`` as ``num_processes`` local processes joined by a coordinator on a
  free localhost port (each calls :func:`initialize_from_env`). Waits for all; if one fails
  or ``timeout_s`` passes, the others are killed. Returns each process's completed run
  (stdout and stderr captured; with ``stream_primary`` process 0 prints to this terminal
  instead, e.g. its progress bars)."""
  num_processes = check_int("num_processes", num_processes, 1)
  coordinator = f"localhost:{free_port()}"
  procs, files = [], []
  for i in range(num_processes):
    e = dict(os.environ if env is None else env, **{
        ENV_ID: str(i), ENV_COUNT: str(num_processes), ENV_COORDINATOR: coordinator})
    out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")  # no pipe to fill
    files.append((out, err))
    if stream_primary and i == 0:
      out = err = None
    procs.append(subprocess.Popen([sys.executable, *args], env=e, stdout=out, stderr=err,
                                  text=True))
  deadline = None if timeout_s is None else time.monotonic() + timeout_s
  try:
    while any(p.poll() is None for p in procs):
      if any(p.poll() not in (None, 0) for p in procs):
        break
      if deadline is not None and time.monotonic() > deadline:
        break
      time.sleep(0.1)
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  done = []
  for p, (out, err) in zip(procs, files):
    code = p.wait()
    texts = []
    for f in (out, err):
      f.seek(0)
      texts.append(f.read())
      f.close()
    done.append(subprocess.CompletedProcess(p.args, code, *texts))
  return done
