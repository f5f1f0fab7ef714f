"""Run checkpoints with orbax: the algorithm state plus JSON metadata (history, run
fingerprint, a digest of the saved state, training time).

Orbax gotchas handled here (environment.md §5): paths are made absolute, saves are awaited
before returning, restoring uses an abstract target so NamedTuple states and typed PRNG keys
come back with their structure, and strings live in the JSON part.

Integrity: every save stores ``tree_digest(state)`` in the metadata; :meth:`restore_latest`
recomputes it on the restored state, so a truncated *or* silently bit-flipped step is
detected. It then falls back to the newest older step that reads back intact (with a warning)
and deletes the unreadable newer steps, so the resumed run writes them afresh.
"""
from __future__ import annotations

import os
import shutil
import warnings
from typing import Any, Callable, NamedTuple

import jax
import numpy as np

from jax.experimental import multihost_utils

from fedjaxsparse.errors import (CheckpointCorruptError, CheckpointExistsError, ConfigError,
                                 RunMismatchError, check_int)
from fedjaxsparse.runtime.fingerprint import diff as fingerprint_diff
from fedjaxsparse.runtime.fingerprint import tree_digest
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["Checkpointing", "check_checkpointing", "Checkpointer", "open_checkpoint",
           "check_resumable"]
__dir__ = _public_dir(__all__)


class Checkpointing(NamedTuple):
  """Where and how a run keeps checkpoints: the one ``checkpoint`` argument of
  :func:`fedjaxsparse.run` and :func:`fedjaxsparse.runtime.epochs.train_epochs` (and of what
  passes it on, e.g. :func:`fedjaxsparse.algorithms.ato.train`); ``checkpoint=None`` (their
  default) keeps none. For example
  ``fjs.run(..., checkpoint=fjs.Checkpointing("ckpt/fedavg", resume=True))`` continues the
  run saved in ``ckpt/fedavg``, or starts it there.

  Attributes:
    directory: where to write orbax checkpoints. :func:`~fedjaxsparse.run` locks the folder
      while the run is active (:class:`~fedjaxsparse.runtime.locking.FolderLock`).
    every: for :func:`~fedjaxsparse.run`, checkpoint after every this many chunks (and after
      the last), ``>= 1``; a chunk counts ``eval_every`` rounds here when ``chunk_size`` is not
      given. For :func:`~fedjaxsparse.runtime.epochs.train_epochs`, after every this many
      epochs (and after the last), ``>= 0``; ``0``: after the last epoch only.
    interval_s: besides ``every``, wait at least this many seconds of wall time since the
      previous checkpoint (or the run's start) before writing one; the last chunk is always
      checkpointed. ``0`` (default): by chunk count only. A short run then writes one
      checkpoint instead of one per chunk (an orbax save costs ~0.1 s, more than a small
      model's chunk); a long run loses at most this many seconds to a crash. With several
      processes, process 0's clock decides for all. :func:`~fedjaxsparse.run` only:
      :func:`~fedjaxsparse.runtime.epochs.train_epochs` counts epochs and needs ``0``.
    resume: continue from the newest intact checkpoint in ``directory``. The checkpoint must
      come from the same run — same algorithm and hyper-parameters, model, data, initial model,
      key and evaluation (see :mod:`fedjaxsparse.runtime.fingerprint`), and ``fingerprint`` —
      and hold at most the rounds (epochs) the run asks for; otherwise
      :class:`~fedjaxsparse.errors.RunMismatchError` names what differs. A longer run extends
      the saved one. Without checkpoints in ``directory`` the run starts afresh.
    overwrite: with ``resume=False``, delete checkpoints already in ``directory`` (without it,
      a fresh run refuses to start there: :class:`~fedjaxsparse.errors.CheckpointExistsError`).
    fingerprint: extra named components of the run's identity (e.g. an experiment's options),
      stored with every checkpoint, so a refused resume names the option that changed.
  """
  directory: str
  every: int = 1
  interval_s: float = 0.0
  resume: bool = False
  overwrite: bool = False
  fingerprint: dict | None = None


def check_checkpointing(checkpoint: Any, *, min_every: int = 1,
                        interval: bool = True) -> Checkpointing | None:
  """``checkpoint`` (a trainer's ``checkpoint`` argument) validated, its ``directory`` a
  ``str``: ``None`` stays ``None``; anything but a :class:`Checkpointing` is a ``TypeError``;
  a bad field a :class:`~fedjaxsparse.errors.ConfigError` naming it (``checkpoint.every``
  below ``min_every``, ``checkpoint.interval_s`` negative — or not ``0`` when the trainer has
  no ``interval``)."""
  if checkpoint is None:
    return None
  if not isinstance(checkpoint, Checkpointing):
    shown = repr(checkpoint)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    raise TypeError(
        f"checkpoint must be a fedjaxsparse.Checkpointing or None, got {type(checkpoint).__name__}"
        f" {shown}; pass fjs.Checkpointing(directory, ...), e.g. "
        "checkpoint=fjs.Checkpointing(\"ckpt/run\", resume=True).")
  directory = checkpoint.directory
  if isinstance(directory, os.PathLike):
    directory = os.fspath(directory)
  if not isinstance(directory, str) or not directory:
    raise ConfigError(f"checkpoint.directory must be a folder path (a non-empty str), got "
                      f"{checkpoint.directory!r}.")
  every = check_int("checkpoint.every", checkpoint.every, min_every)
  try:
    interval_ok = checkpoint.interval_s >= 0
  except TypeError:
    interval_ok = False
  if not interval_ok:
    raise ConfigError(f"checkpoint.interval_s must be >= 0 seconds, got "
                      f"{checkpoint.interval_s!r}.")
  if not interval and checkpoint.interval_s != 0:
    raise ConfigError(f"checkpoint.interval_s must be 0 here (checkpoints by epoch count, "
                      f"checkpoint.every), got {checkpoint.interval_s!r}.")
  return checkpoint._replace(directory=directory, every=every)


def _ocp() -> Any:
  """``orbax.checkpoint``, imported on the first checkpoint: only checkpointed runs pay its import
  (about a third of the package's own import time)."""
  import orbax.checkpoint as ocp   # pylint: disable=import-outside-toplevel
  return ocp


def _uncommitted(a: Any) -> Any:
  """The same values, placed as a fresh run's arrays are (uncommitted): orbax returns arrays
  committed to a device, and a compiled chunk keyed on committed inputs compiles again."""
  if (not isinstance(a, jax.Array) or not a.is_fully_addressable
      or len(a.sharding.device_set) != 1):
    return a
  if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
    return jax.random.wrap_key_data(jax.device_put(np.asarray(jax.random.key_data(a))),
                                    impl=jax.random.key_impl(a))
  return jax.device_put(np.asarray(a))


class Checkpointer:
  """Saves ``(state, meta)`` at round numbers under ``directory``, keeping the latest few."""

  def __init__(self, directory: str, max_to_keep: int = 2):
    self.directory = os.path.abspath(directory)
    self._max_to_keep = max_to_keep
    self._manager = _ocp().CheckpointManager(
        self.directory,
        options=_ocp().CheckpointManagerOptions(max_to_keep=max_to_keep, create=True))

  def steps(self) -> list[int]:
    """Rounds of the complete checkpoints on disk, oldest first."""
    self._manager.reload()
    return sorted(self._manager.all_steps())

  def latest_round(self) -> int | None:
    """The round of the newest complete checkpoint, or ``None``."""
    steps = self.steps()
    return steps[-1] if steps else None

  def save(self, round_: int, state: Any, meta: dict) -> None:
    """Write a checkpoint for ``round_`` (with the state's digest) and wait until it is on
    disk."""
    meta = {**meta, "state_digest": tree_digest(state)}
    self._manager.save(round_, args=_ocp().args.Composite(
        state=_ocp().args.StandardSave(state), meta=_ocp().args.JsonSave(meta)))
    self._manager.wait_until_finished()

  def read_meta(self, round_: int) -> dict:
    """The JSON metadata of one step (cheap: no array is read)."""
    return self._manager.restore(round_, args=_ocp().args.Composite(
        meta=_ocp().args.JsonRestore())).meta

  def restore(self, abstract_state: Any, round_: int) -> tuple[Any, dict]:
    """Restore ``(state, meta)`` of step ``round_`` and verify the state's digest;
    ``abstract_state`` gives the structure (``jax.eval_shape``). Raises on any damage."""
    abstract = jax.tree.map(_ocp().utils.to_shape_dtype_struct, abstract_state)
    out = self._manager.restore(round_, args=_ocp().args.Composite(
        state=_ocp().args.StandardRestore(abstract), meta=_ocp().args.JsonRestore()))
    expected = out.meta.get("state_digest")
    if expected is not None and tree_digest(out.state) != expected:
      raise CheckpointCorruptError(
          f"step {round_} in {self.directory}: the restored state does not match the digest "
          "saved with it (the files were modified or damaged).")
    return jax.tree.map(_uncommitted, out.state), out.meta

  def restore_latest(self, abstract_state: Any,
                     check: Callable[[dict], None] | None = None) -> tuple[Any, dict]:
    """Restore the newest step that reads back intact; warn about and delete damaged newer
    steps. ``check(meta)`` runs on a step's metadata before its state is read (a run
    fingerprint check: what it raises propagates). Raises :class:`CheckpointCorruptError` when
    no step is readable."""
    steps = self.steps()
    if not steps:
      raise FileNotFoundError(f"no checkpoint in {self.directory}")
    problems = []
    for step in reversed(steps):
      try:
        meta = self.read_meta(step)
      except Exception as e:  # noqa: BLE001  (damaged or missing JSON)
        problems.append(f"step {step}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
        continue
      if check is not None:
        check(meta)
      try:
        state, meta = self.restore(abstract_state, step)
      except Exception as e:  # noqa: BLE001  (any damage: orbax, tensorstore, digest)
        problems.append(f"step {step}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
        continue
      if problems:
        warnings.warn(f"checkpoint {self.directory}: newer step(s) unreadable, resuming from "
                      f"step {step} instead ({'; '.join(problems)}).", stacklevel=2)
        for bad in steps[steps.index(step) + 1:]:
          self._manager.delete(bad)
      return state, meta
    raise CheckpointCorruptError(
        f"no readable checkpoint in {self.directory}: " + "; ".join(problems) +
        ". Start afresh with overwrite=True (CLI: --overwrite).")

  def clear(self) -> None:
    """Delete every checkpoint step in the directory (finished or left half-written: the
    folders named by a round number); other files are left alone."""
    self._manager.close()
    for name in os.listdir(self.directory):
      path = os.path.join(self.directory, name)
      if os.path.isdir(path) and name.split(".", 1)[0].isdigit():
        shutil.rmtree(path)
    self.__init__(self.directory, self._max_to_keep)

  def close(self) -> None:
    self._manager.close()

  def __enter__(self) -> "Checkpointer":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def open_checkpoint(directory: str, *, resume: bool, overwrite: bool) -> Checkpointer:
  """A run's checkpointer under the rules every trainer follows (the runner, ATO's epoch
  loop): a fresh run (``resume=False``) refuses a folder that holds another run's checkpoints
  (:class:`~fedjaxsparse.errors.CheckpointExistsError`, naming ``resume`` and ``overwrite``)
  unless ``overwrite``, which empties it; ``resume=True`` keeps them for
  :func:`check_resumable`. With several processes, process 0 deletes and all wait for it."""
  ckpt = Checkpointer(directory)
  if ckpt.latest_round() is not None and not resume:
    if not overwrite:
      ckpt.close()
      raise CheckpointExistsError(
          f"{ckpt.directory} holds checkpoints of an earlier run (up to round "
          f"{ckpt.latest_round()}); pass resume=True to continue it (CLI: --resume) or "
          "overwrite=True to delete it and start afresh (CLI: --overwrite).")
    if jax.process_index() == 0:
      ckpt.clear()
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices("fedjaxsparse checkpoint folder ready")
  return ckpt


def check_resumable(ckpt: Checkpointer, meta: dict, fingerprint: dict | None, done: int,
                    total: int, option: str = "num_rounds", unit: str = "rounds",
                    cli: str | None = "--rounds") -> None:
  """Raises :class:`~fedjaxsparse.errors.RunMismatchError` unless the checkpoint whose
  metadata is ``meta`` was written by the run ``fingerprint`` describes (its ``"fingerprint"``
  entry; the differences are named) and its ``done`` units (rounds, epochs) are at most the
  ``total`` the run asks for (``option``, CLI flag ``cli``)."""
  differences = fingerprint_diff(meta.get("fingerprint") or {}, fingerprint or {})
  if differences:
    raise RunMismatchError(
        f"cannot resume from {ckpt.directory}: its checkpoint was written by a different "
        "run — " + "; ".join(differences) + ". Use another checkpoint folder, restore the "
        "settings, or start afresh with overwrite=True (CLI: --overwrite).")
  if done > total:
    raise RunMismatchError(
        f"cannot resume from {ckpt.directory}: it already holds {done} {unit} but "
        f"{option}={total}; ask for at least {done} {unit}" + (f" (CLI: {cli})" if cli else "")
        + " or start afresh with overwrite=True (CLI: --overwrite).")
