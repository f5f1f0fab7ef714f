"""Run checkpoints with orbax: the algorithm state plus JSON metadata (history, run identity).

Orbax gotchas handled here (environment.md §5): paths are made absolute, saves are awaited
before returning, restoring uses an abstract target so NamedTuple states and typed PRNG keys
come back with their structure, and strings live in the JSON part.
"""
from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp


class Checkpointer:
  """Saves ``(state, meta)`` at round numbers under ``directory``, keeping the latest few."""

  def __init__(self, directory: str, max_to_keep: int = 2):
    self.directory = os.path.abspath(directory)
    self._manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True))

  def latest_round(self) -> int | None:
    """The round of the newest complete checkpoint, or ``None``."""
    return self._manager.latest_step()

  def save(self, round_: int, state: Any, meta: dict) -> None:
    """Write a checkpoint for ``round_`` and wait until it is on disk."""
    self._manager.save(round_, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)))
    self._manager.wait_until_finished()

  def restore(self, abstract_state: Any, round_: int | None = None) -> tuple[Any, dict]:
    """Restore ``(state, meta)``; ``abstract_state`` gives the structure (``jax.eval_shape``)."""
    step = self.latest_round() if round_ is None else round_
    if step is None:
      raise FileNotFoundError(f"no checkpoint in {self.directory}")
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract_state)
    out = self._manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
    return out.state, out.meta

  def close(self) -> None:
    self._manager.close()

  def __enter__(self) -> "Checkpointer":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
