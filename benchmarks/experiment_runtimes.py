"""Wall time of every experiment's quick setting (``--quick``) and, with ``--default``, of its
default configuration: each run in a fresh process, as a user runs it (XLA's default flags,
no compile cache), so the numbers can go into each module's ``QUICK_RUNTIME`` / ``RUNTIME``.

Usage: python benchmarks/experiment_runtimes.py [--default] [--only NAME ...]
                                                 [--out benchmarks/results]
Prints a table and writes ``experiment_runtimes.json`` (appending to earlier rows of other
experiments, so the long default runs can be measured a few at a time).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import fedjaxsparse as fjs


def measure(name: str, quick: bool, timeout_s: float) -> dict:
  with tempfile.TemporaryDirectory() as out:
    cmd = [sys.executable, "-m", "fedjaxsparse.harness.cli", "run", name, "--no-progress", "--out", out]
    if quick:
      cmd.append("--quick")
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS",
                                                            "JAX_COMPILATION_CACHE_DIR")}
    start = time.perf_counter()
    try:
      proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
      rc, err = proc.returncode, proc.stderr.strip().splitlines()[-1:] if proc.returncode else []
    except subprocess.TimeoutExpired:
      rc, err = None, [f"timed out after {timeout_s:.0f} s"]
    took = time.perf_counter() - start
  return {"experiment": name, "setting": "quick" if quick else "default", "seconds": took,
          "ok": rc == 0, "error": err[0] if err else None}


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--default", action="store_true", help="also time the defaults")
  parser.add_argument("--only", nargs="*", default=None)
  parser.add_argument("--timeout", type=float, default=7200)
  parser.add_argument("--out", default="benchmarks/results")
  args = parser.parse_args()
  names = sorted(fjs.harness.cli.experiments()) if not args.only else args.only
  os.makedirs(args.out, exist_ok=True)
  path = os.path.join(args.out, "experiment_runtimes.json")
  rows = []
  if os.path.exists(path):
    with open(path) as f:
      rows = json.load(f)["rows"]
  for name in names:
    for quick in (True, False) if args.default else (True,):
      row = measure(name, quick, args.timeout)
      rows = [r for r in rows if (r["experiment"], r["setting"]) !=
              (row["experiment"], row["setting"])] + [row]
      print(f"{name:24s} {row['setting']:8s} {row['seconds']:8.1f} s  "
            f"{'ok' if row['ok'] else 'FAILED: ' + str(row['error'])}", flush=True)
      with open(path, "w") as f:
        json.dump({"cpu_count": os.cpu_count(), "machine": platform.machine(),
                   "python": platform.python_version(), "rows": rows}, f, indent=1)
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
