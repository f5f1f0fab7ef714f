"""The fedjaxsparse command line: list, describe and run experiments.

Experiments are the modules of experiments/ (installed as fedjaxsparse.experiments). A run
writes OUT/EXPERIMENT/results.json and PNG plots; checkpoints go to
OUT/EXPERIMENT/checkpoints/METHOD. Every error a user can cause (an unknown or bad option,
missing or malformed data, a diverged run, a locked or mismatched output folder) prints one
line and exits non-zero: 2 for bad options, 1 for the rest; --debug shows the traceback.
"""
from __future__ import annotations

import argparse
import errno
import importlib
import os
import pkgutil
import sys
import textwrap

from fedjaxsparse.runtime import distributed
from fedjaxsparse.errors import ConfigError, UserError
from fedjaxsparse.harness.options import DIVERGENCE, TUNINGS, Config, with_paper, with_quick
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["experiments", "describe", "main"]
__dir__ = _public_dir(__all__)

ROUND_NOTE = """\
What --rounds counts is each experiment's budget unit (see `fedjaxsparse describe NAME`).
A communication round is one exchange between the server and the participating clients:
the server broadcasts a model, clients train locally and upload one message each, the
server aggregates. Iteration-level methods (the ProxSkip family) count local steps
instead, and communicate with probability p per step."""

COMMON = ("rounds", "clients", "dataset", "seed", "out", "eval_every", "data_dir",
          "progress", "on_divergence", "execution", "tuning", "checkpoint_interval_s")


def experiments() -> dict:
  """``{name: module}`` of every experiment module."""
  import fedjaxsparse.experiments as pkg  # above the harness: loaded only when listed
  found = {}
  for info in pkgutil.iter_modules(pkg.__path__):
    if info.name.startswith("_"):
      continue
    module = importlib.import_module(f"{pkg.__name__}.{info.name}")
    if hasattr(module, "NAME") and hasattr(module, "run"):
      found[module.NAME] = module
  return found


def describe(module) -> str:
  """An experiment's description: what it runs, its defaults, budget unit, measured runtime
  and every ``--set`` option with type, allowed values and default."""
  defaults = {**{f.name: f.default for f in Config.__dataclass_fields__.values()
                 if f.name in COMMON}, **getattr(module, "DEFAULTS", {})}
  lines = [f"{module.NAME}: {module.DESCRIPTION}", ""]
  lines += ["Defaults: " + " ".join(
      f"--{k.replace('_', '-')} {'(see below)' if v is None else v}"
      for k, v in defaults.items() if k in ("rounds", "clients", "dataset", "eval_every"))]
  lines += textwrap.wrap(f"--rounds counts: {module.BUDGET}", 92, subsequent_indent="  ")
  lines += textwrap.wrap(f"Expected runtime with the defaults on a 2-core CPU: "
                         f"{module.RUNTIME}", 92, subsequent_indent="  ")
  quick = getattr(module, "QUICK", None)
  if quick is not None:
    flags = " ".join([f"--{k.replace('_', '-')} {v}" for k, v in quick.items() if k != "options"]
                     + [f"--set {k}={_value(v)}" for k, v in quick.get("options", {}).items()])
    lines += textwrap.wrap(f"Quick setting (--quick: {flags or 'the defaults'}): the table's "
                           f"shape, not the paper's numbers; "
                           f"{getattr(module, 'QUICK_RUNTIME', 'not measured yet')}", 92,
                           subsequent_indent="  ")
  papers = getattr(module, "PAPERS", {})
  if papers:
    lines += ["", "Paper configurations (--paper NAME; real data with --data-dir, else a "
              "stand-in of the same shape):"]
    for pc in papers.values():
      lines += textwrap.wrap(
          f"{pc.name}: {pc.source}; {pc.dataset} ({pc.data_status}; stand-in: {pc.standin}), "
          f"{pc.clients} clients, --rounds {pc.rounds}, " + ", ".join(
              f"{k}={v}" for k, v in pc.options.items())
          + (f"; reduced: {pc.reduced}" if pc.reduced else "; the paper's protocol"),
          92, initial_indent="  ", subsequent_indent="      ")
  lines += ["", "Options (--set KEY=VALUE):"]
  for o in module.OPTIONS:
    lines.append(f"  {o.name} = {o.default!r}   ({o.allowed()})")
    lines += textwrap.wrap(o.help, 88, initial_indent="      ", subsequent_indent="      ")
  return "\n".join(lines)


def _value(v) -> str:
  """An option value as ``--set`` takes it (lists comma-separated)."""
  if isinstance(v, (list, tuple)):
    return ",".join(f"{x:g}" if isinstance(x, float) else str(x) for x in v)
  return str(v)


class _Parser(argparse.ArgumentParser):
  """argparse with one-line errors (exit 2), like every other error of the command."""

  def error(self, message: str):
    self.exit(2, f"fedjaxsparse: error: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
  parser = _Parser(
      prog="fedjaxsparse", formatter_class=argparse.RawDescriptionHelpFormatter,
      description="Federated sparse training, compression and local training in JAX: run "
                  "the papers' experiments.",
      epilog="commands:\n  fedjaxsparse list\n  fedjaxsparse describe EXPERIMENT\n"
             "  fedjaxsparse run EXPERIMENT [--rounds N] [--set KEY=VALUE ...]\n\n" + ROUND_NOTE)
  parser.add_argument("--debug", action="store_true", help="show tracebacks of errors")
  sub = parser.add_subparsers(dest="command", required=True)
  sub.add_parser("list", help="list the experiments")
  d = sub.add_parser("describe", help="an experiment's options, defaults and runtime")
  d.add_argument("experiment")
  d.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                 help="show tracebacks of errors")
  p = sub.add_parser("run", help="run an experiment (run EXPERIMENT --help: its options)",
                     add_help=False, formatter_class=argparse.RawDescriptionHelpFormatter,
                     usage="fedjaxsparse run EXPERIMENT [flags] [--set KEY=VALUE ...]",
                     epilog=ROUND_NOTE)
  p.add_argument("experiment", nargs="?")
  p.add_argument("-h", "--help", action="store_true", help="show the experiment's options")
  size = p.add_argument_group("what runs (each experiment has its defaults; see describe)")
  size.add_argument("--rounds", type=int,
                    help="budget in the experiment's unit (communication rounds or iterations)")
  size.add_argument("--clients", type=int, help="number of clients")
  size.add_argument("--dataset", help="dataset name (embedded: digits, breast_cancer, ...; "
                                      "stand-ins: *_standin; with --data-dir: fashion_mnist, "
                                      "femnist, blogfeedback, libsvm, cifar10, ...)")
  size.add_argument("--seed", type=int, help="run and partition seed")
  size.add_argument("--eval-every", type=int, dest="eval_every",
                    help="evaluate every this many rounds")
  size.add_argument("--data-dir", dest="data_dir", help="directory (or file) with real data")
  preset = size.add_mutually_exclusive_group()
  preset.add_argument("--paper", help="a paper configuration (its data, clients, budget, "
                                      "search, seeds; see describe EXPERIMENT); other flags "
                                      "override it")
  preset.add_argument("--quick", action="store_true",
                      help="the quick setting: the table's shape in under two minutes on a "
                           "2-core CPU (see describe EXPERIMENT); other flags override it")
  size.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="experiment option (repeatable; see describe EXPERIMENT)")
  output = p.add_argument_group("output, checkpoints and progress")
  output.add_argument("--out", help="output directory (default: results)")
  mode = output.add_mutually_exclusive_group()
  mode.add_argument("--resume", action="store_true",
                    help="continue from the newest checkpoints (same configuration only)")
  mode.add_argument("--overwrite", action="store_true",
                    help="delete checkpoints of an earlier run in --out and start afresh")
  output.add_argument("--checkpoint-every-s", type=float, dest="checkpoint_interval_s",
                      metavar="SECONDS",
                      help="checkpoint a method at an evaluation once this many seconds passed "
                           "since its last checkpoint, and after its last round (default 60; "
                           "0: at every evaluation)")
  output.add_argument("--no-progress", action="store_false", dest="progress", default=None,
                      help="no progress bars or time-left estimates")
  run_ = p.add_argument_group("execution")
  run_.add_argument("--on-divergence", dest="on_divergence", choices=DIVERGENCE,
                    help="on NaN/inf: stop with an error (default) or mark the method diverged "
                         "and go on")
  run_.add_argument("--execution", help="how clients execute: auto (default: on CPU map for "
                                        "clients of >= 3e7 FLOPs a step or >= 32 KiB of data "
                                        "(8 MiB in all), loop-free unrolled "
                                        "clients for XLA convolutions, else vmap; vmap on "
                                        "GPU/TPU), vmap, map, unroll, unroll:G — speed only, "
                                        "never results")
  run_.add_argument("--tuning", choices=TUNINGS,
                    help="how a learning-rate grid declared batched is tuned: batched (default: "
                         "every candidate in one vmapped program) or sequential (a run per "
                         "candidate) — the same runs either way")
  run_.add_argument("--processes", type=int, default=1,
                    help="run as this many local processes joined by jax.distributed (the "
                         "client axis spans every process's devices; gloo collectives on CPU)")
  run_.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                    help="show tracebacks of errors")
  parser.run_parser = p
  return parser


def _config(module, args) -> Config:
  cfg = Config(**getattr(module, "DEFAULTS", {}))
  if args.paper is not None:
    papers = getattr(module, "PAPERS", {})
    if args.paper not in papers:
      raise ConfigError(f"{module.NAME} has no paper configuration {args.paper!r}; choose "
                        f"from {', '.join(papers) or 'none'}.")
    cfg = with_paper(cfg, papers[args.paper])
  if args.quick:
    cfg = with_quick(cfg, getattr(module, "QUICK", {}))
  for field in COMMON:
    value = getattr(args, field)
    if value is not None:
      setattr(cfg, field, value)
  cfg.resume, cfg.overwrite = args.resume, args.overwrite
  options = {}
  for item in args.set:
    if "=" not in item:
      raise ConfigError(f"--set expects KEY=VALUE, got {item!r}.")
    k, v = item.split("=", 1)
    if k.strip() in options:
      raise ConfigError(f"option {k.strip()!r} is set twice.")
    options[k.strip()] = v
  cfg.options = {**cfg.options, **options}
  return cfg


def main(argv: list[str] | None = None) -> int:
  parser = _parser()
  args = parser.parse_args(argv)
  processes = getattr(args, "processes", 1)
  if processes != 1 and not distributed.initialize_from_env():
    return _launch(argv if argv is not None else sys.argv[1:], processes)
  try:
    return _main(parser, args)
  except BrokenPipeError:  # output piped into `head` and closed: not an error of the run
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 1
  except KeyboardInterrupt:
    print("fedjaxsparse: interrupted; checkpoints written so far are kept (rerun with "
          "--resume to continue).", file=sys.stderr)
    return 130
  except (UserError, ValueError, OSError) as e:
    if args.debug:
      raise
    hint = (" — free disk space or write elsewhere with --out (checkpoints written so far are "
            "kept; rerun with --resume)" if _disk_full(e) else "")
    print(f"fedjaxsparse: error: {e}{hint}", file=sys.stderr)
    return 2 if isinstance(e, ConfigError) else 1
  except Exception as e:  # noqa: BLE001  (device out of memory: a configuration too large)
    if not args.debug and _disk_full(e):   # orbax / tensorstore wrap the OS error
      print(f"fedjaxsparse: error: no space left on the disk while writing ("
            f"{str(e).splitlines()[0][:160]}) — free disk space or write elsewhere with --out "
            "(checkpoints written so far are kept; rerun with --resume)", file=sys.stderr)
      return 1
    if args.debug or "RESOURCE_EXHAUSTED" not in str(e):
      raise
    print("fedjaxsparse: error: out of device memory (" + str(e).splitlines()[0][:160] +
          "); use fewer clients, smaller batches or model, or a larger device.",
          file=sys.stderr)
    return 1


def _disk_full(e: BaseException) -> bool:
  """Whether ``e`` (or an error it wraps) is a full disk or an exhausted quota."""
  while e is not None:
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
      return True
    if "No space left on device" in str(e) or "Disk quota exceeded" in str(e):
      return True
    e = e.__cause__ or e.__context__
  return False


def _launch(argv: list[str], processes: int) -> int:
  """Run this command line as ``processes`` local processes (process 0 prints)."""
  if processes < 1:
    print(f"fedjaxsparse: error: --processes must be >= 1, got {processes}.", file=sys.stderr)
    return 2
  runs = distributed.launch(["-m", "fedjaxsparse.harness.cli", *argv], processes, stream_primary=True)
  for i, r in enumerate(runs[1:], 1):
    if r.returncode:
      print(f"fedjaxsparse: process {i} failed ({r.returncode}):\n{r.stderr[-3000:]}",
            file=sys.stderr)
  return max(abs(r.returncode) for r in runs)


def _main(parser: argparse.ArgumentParser, args) -> int:
  found = experiments()
  if args.command == "list":
    for name, module in sorted(found.items()):
      print(f"{name:24s} {module.DESCRIPTION}")
    print("\n" + ROUND_NOTE)
    return 0
  if args.experiment is None:
    if args.help:
      parser.print_help()
      print("\nexperiments: " + ", ".join(sorted(found)))
      return 0
    raise ConfigError("name an experiment: fedjaxsparse run EXPERIMENT (see fedjaxsparse "
                      "list).")
  if args.experiment not in found:
    raise ConfigError(f"unknown experiment {args.experiment!r}; choose from "
                      f"{', '.join(sorted(found))}.")
  module = found[args.experiment]
  if args.command == "describe" or args.help:
    print(describe(module))
    if args.command == "run":
      print("\n" + parser.run_parser.format_help().replace(
          "EXPERIMENT", args.experiment, 1))
    return 0
  module.run(_config(module, args))
  return 0


if __name__ == "__main__":
  sys.exit(main())
