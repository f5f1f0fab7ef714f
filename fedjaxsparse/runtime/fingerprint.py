"""Run identity: digests of everything that determines a run, so a checkpoint is only ever
resumed by the run that wrote it.

A run is determined by its algorithm (the step and init functions *with* every closed-over
hyper-parameter and the model inside the loss), its evaluation, the initial model, the
training and test data (values, partition and padding), the key and the evaluation schedule.
Functions are identified by the text of their jaxpr plus the bytes of its constants: any
changed learning rate, sparsity, model width or loss changes a literal or a constant, so it
changes the digest, with no need for the algorithm to declare its hyper-parameters. Arrays are
identified by a BLAKE2b digest of their shapes, dtypes and bytes.

``diff(old, new)`` names the components that differ, for the error message of a refused
resume.
"""
from __future__ import annotations

import collections
import hashlib
import json
from typing import Any, Callable

import jax
import numpy as np

from fedjaxsparse.runtime.clients import arg_signature, traced_step
from fedjaxsparse.runtime.distributed import to_host
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["tree_digest", "function_digest", "jaxpr_digest", "run_fingerprint", "config_components",
           "diff"]
__dir__ = _public_dir(__all__)

DIGEST_SIZE = 16  # bytes; 128-bit BLAKE2b


def _host(leaf: Any) -> np.ndarray:
  if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
    leaf = jax.random.key_data(leaf)
  if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:  # several processes
    return to_host(leaf)
  return np.asarray(jax.device_get(leaf))


def tree_digest(tree: Any) -> str:
  """Hex digest of a pytree's structure, leaf shapes, dtypes and bytes."""
  h = hashlib.blake2b(digest_size=DIGEST_SIZE)
  leaves, treedef = jax.tree.flatten(tree)
  h.update(str(treedef).encode())
  for leaf in leaves:
    a = np.ascontiguousarray(_host(leaf))
    h.update(f"{a.shape}{a.dtype}".encode())
    h.update(a.view(np.uint8).reshape(-1).data if a.size else b"")
  return h.hexdigest()


def function_digest(fn: Callable, *args: Any) -> str:
  """Hex digest of ``fn`` traced at ``args``: its jaxpr text (literals included) and consts."""
  return jaxpr_digest(jax.make_jaxpr(fn)(*args))


def jaxpr_digest(closed: Any) -> str:
  """Hex digest of a closed jaxpr: its text (literals included) and consts."""
  h = hashlib.blake2b(str(closed.jaxpr).encode(), digest_size=DIGEST_SIZE)
  h.update(tree_digest(list(closed.consts)).encode())
  return h.hexdigest()


def _canonical(value: Any) -> Any:
  """JSON-stable form of a user-supplied fingerprint value."""
  return json.loads(json.dumps(value, sort_keys=True, default=repr))


# Traces of the functions of recent runs: ``{(what, functions, argument types, tracing
# configuration): result}``. A function traced at the same argument types gives the same jaxpr,
# so runs of one algorithm (seeds, resumed and repeated runs) trace it once — as the runner
# compiles their chunk once (its ``_CHUNKS``, keyed alike).
_TRACES: collections.OrderedDict = collections.OrderedDict()
_TRACES_KEPT = 32


def _trace_context() -> Any:
  try:
    from jax._src import config as jax_config   # what jit's own caches are keyed on
    return jax_config.trace_context()
  except (ImportError, AttributeError):
    return bool(jax.config.jax_enable_x64)


def _traced(what: str, functions: tuple, args: tuple, compute: Callable[[], Any]) -> Any:
  """``compute()``, kept for the same ``functions`` (by identity) at the same types of
  ``args`` under the same tracing configuration."""
  try:
    key = (what, functions, arg_signature(args),
           tuple(str(getattr(a, "sharding", None)) for a in jax.tree.leaves(args)),
           _trace_context())
    hash(key)
  except TypeError:   # a function that cannot be a dictionary key
    return compute()
  if key in _TRACES:
    _TRACES.move_to_end(key)
    return _TRACES[key]
  value = _TRACES[key] = compute()
  while len(_TRACES) > _TRACES_KEPT:
    _TRACES.popitem(last=False)
  return value


def run_fingerprint(algo: Any, init_key: jax.Array, params: Any, train: Any, test: Any, *,
                    run_id: list, eval_fn: Callable | None, params_fn: Callable,
                    eval_every: int, config: dict | None = None) -> dict:
  """The fingerprint of a run: ``{component: digest or value}`` (JSON-serialisable).

  ``config`` adds caller-named components (e.g. an experiment's method name and options), so a
  refused resume can say *which* option changed rather than only that the algorithm did.
  """
  init_args = (init_key, params, train)
  state = _traced("state", (algo.init,), init_args,
                  lambda: jax.eval_shape(algo.init, *init_args))
  fp = {
      "seed (run key)": run_id,
      "algorithm (init)": _traced("init", (algo.init,), init_args,
                                  lambda: function_digest(algo.init, *init_args)),
      "algorithm (step, with its hyper-parameters and model)": _traced(
          "step", (algo.step,), (init_key, state, train), lambda: jaxpr_digest(
              traced_step(algo.step, init_key, state, train)[0])),  # shared with choose_strategy
      "initial model": tree_digest(params),
      "training data": tree_digest(train),
      "test data": tree_digest(test),
      "eval_every": int(eval_every),
      "evaluation": (None if eval_fn is None else _traced(
          "evaluation", (eval_fn, params_fn), (state, test), lambda: function_digest(
              lambda s, t: eval_fn(params_fn(s), t), state, test))),
  }
  fp.update(config_components(config))
  return fp


def config_components(config: dict | None) -> dict:
  """Caller-named fingerprint components (an experiment's options, say), JSON-stable and
  keyed ``"config: NAME"``, so that :func:`diff` names a changed option with both values."""
  return {f"config: {k}": _canonical(v) for k, v in sorted((config or {}).items())}


def diff(old: dict, new: dict) -> list[str]:
  """Human-readable differences between two fingerprints (empty when they agree)."""
  lines = []
  for k in sorted(set(old) | set(new), key=lambda k: (not k.startswith("config"), k)):
    a, b = old.get(k, "<absent>"), new.get(k, "<absent>")
    if a == b:
      continue
    if k.startswith("config") or k in ("eval_every", "seed (run key)"):
      lines.append(f"{k}: checkpoint has {a!r}, this run has {b!r}")
    else:
      lines.append(f"{k} differs")
  return lines
