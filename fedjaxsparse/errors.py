"""The errors a user can cause, one class each, so callers (and the command line) can tell a
bad input or a diverged run from a bug in the library.

Every class also derives from the built-in exception a Python user would expect
(``ValueError``, ``FileExistsError``, ``FloatingPointError``, ...), so ``except ValueError``
keeps working. The command line prints any :class:`UserError` as one line and exits
non-zero; ``--debug`` shows the traceback.
"""
from __future__ import annotations


class UserError(Exception):
  """Base class: the input, files or settings are wrong, not the library."""


class ConfigError(UserError, ValueError):
  """An option or hyper-parameter is unknown or outside its allowed range."""


class DataError(UserError, ValueError):
  """A data file or array is malformed; the message names the file and, where it can, the
  line or record."""


class RunMismatchError(UserError, ValueError):
  """``resume`` found a checkpoint written by a different run (another algorithm,
  hyper-parameter, data set, model, seed or a longer budget)."""


class CheckpointExistsError(UserError, FileExistsError):
  """A fresh run would overwrite the checkpoints of an earlier run."""


class CheckpointCorruptError(UserError, OSError):
  """No checkpoint step in a directory can be read back intact."""


class LockedError(UserError, BlockingIOError):
  """Another process holds the output folder."""


class NonFiniteError(UserError, FloatingPointError):
  """A run produced a NaN or an infinity.

  Attributes:
    round: the first round (1-based) at which a non-finite value was seen (0: the initial
      evaluation).
    quantity: the name of the first non-finite quantity (``"loss"``, ``"accuracy"``,
      ``"state.h"``, ...).
    method: the run's label (the progress-bar description).
  """

  def __init__(self, message: str, round_: int, quantity: str, method: str = ""):
    super().__init__(message)
    self.round = round_
    self.quantity = quantity
    self.method = method
