"""The ``fedjaxsparse`` command: ``fedjaxsparse list`` and ``fedjaxsparse run EXPERIMENT``.

Experiments are the modules of ``experiments/`` (installed as ``fedjaxsparse.experiments``).
Results go to ``OUT/EXPERIMENT/results.json`` plus a PNG plot; checkpoints go to
``OUT/EXPERIMENT/checkpoints/METHOD`` and ``--resume`` continues from them.
"""
from __future__ import annotations

import argparse
import ast
import importlib
import pkgutil
import sys

from fedjaxsparse.experiment import Config


def experiments() -> dict:
  """``{name: module}`` of every experiment module."""
  import fedjaxsparse.experiments as pkg
  found = {}
  for info in pkgutil.iter_modules(pkg.__path__):
    if info.name.startswith("_"):
      continue
    module = importlib.import_module(f"{pkg.__name__}.{info.name}")
    if hasattr(module, "NAME") and hasattr(module, "run"):
      found[module.NAME] = module
  return found


def _parse_value(text: str):
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="fedjaxsparse", description=__doc__.splitlines()[0])
  sub = parser.add_subparsers(dest="command", required=True)
  sub.add_parser("list", help="list the experiments")
  p = sub.add_parser("run", help="run an experiment")
  p.add_argument("experiment")
  p.add_argument("--rounds", type=int, help="communication rounds per method")
  p.add_argument("--clients", type=int, help="number of clients")
  p.add_argument("--dataset", help="dataset name (embedded: digits, diabetes, synthetic)")
  p.add_argument("--seed", type=int)
  p.add_argument("--out", help="output directory (default: results)")
  p.add_argument("--eval-every", type=int, dest="eval_every")
  p.add_argument("--data-dir", dest="data_dir", help="directory with real dataset files")
  p.add_argument("--resume", action="store_true", help="continue from the newest checkpoints")
  p.add_argument("--no-progress", action="store_false", dest="progress", default=None)
  p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                 help="experiment-specific option (repeatable)")
  args = parser.parse_args(argv)

  found = experiments()
  if args.command == "list":
    for name, module in sorted(found.items()):
      print(f"{name:28s} {module.DESCRIPTION}")
    return 0
  if args.experiment not in found:
    parser.error(f"unknown experiment {args.experiment!r}; choose from {sorted(found)}")
  module = found[args.experiment]
  cfg = Config(**getattr(module, "DEFAULTS", {}))
  for field in ("rounds", "clients", "dataset", "seed", "out", "eval_every", "data_dir",
                "progress"):
    value = getattr(args, field)
    if value is not None:
      setattr(cfg, field, value)
  cfg.resume = args.resume
  cfg.options = dict(cfg.options)
  for item in args.set:
    if "=" not in item:
      parser.error(f"--set expects KEY=VALUE, got {item!r}")
    k, v = item.split("=", 1)
    cfg.options[k] = _parse_value(v)
  module.run(cfg)
  return 0


if __name__ == "__main__":
  sys.exit(main())
