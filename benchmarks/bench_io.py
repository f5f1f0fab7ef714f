"""What every benchmark script records with its rows, and where it writes them."""
from __future__ import annotations

import json
import os
import platform

import jax
import numpy as np


def environment() -> dict:
  """The machine a result was measured on: backend, device kind, versions, CPU count."""
  return {"backend": jax.default_backend(), "device_kind": jax.devices()[0].device_kind,
          "jax": jax.__version__, "numpy": np.__version__, "machine": platform.machine(),
          "cpu_count": os.cpu_count()}


def write_result(result: dict, out: str, name: str) -> str:
  """Writes ``result`` as JSON to ``out`` (a ``.json`` path) or to ``out/NAME.json``, creating
  the folder; prints and returns the path."""
  path = out if out.endswith(".json") else os.path.join(out, f"{name}.json")
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  with open(path, "w") as f:
    json.dump(result, f, indent=1)
  print(f"wrote {path}")
  return path
