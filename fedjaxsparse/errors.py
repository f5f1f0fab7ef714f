"""The errors a user can cause, one class each, so callers (and the command line) can tell a
bad input or a diverged run from a bug in the library.

Every class also derives from the built-in exception a Python user would expect
(``ValueError``, ``FileExistsError``, ``FloatingPointError``, ...), so ``except ValueError``
keeps working. The command line prints any :class:`UserError` as one line and exits
non-zero; ``--debug`` shows the traceback.

The value checks at an algorithm's or experiment's boundary (:func:`check_number`,
:func:`check_positive`) live here too: finite numbers in a stated range, with a
:class:`ConfigError` naming the parameter and the allowed range. Traced values (inside a
vmapped sweep) pass through unchecked.
"""
from __future__ import annotations

import math
import operator
from typing import Any

import jax

__all__ = ["UserError", "ConfigError", "DataError", "RunMismatchError", "CheckpointExistsError",
           "CheckpointCorruptError", "LockedError", "NonFiniteError", "check_number",
           "check_int", "check_positive"]


def __dir__() -> list[str]:
  # the lowest layer imports nothing of the package: core.public_dir written out
  return sorted(__all__)


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

  @classmethod
  def diverged(cls, method: str, round_: int, quantity: str, value: float | None = None,
               hint: str = "") -> "NonFiniteError":
    """The error of a run whose ``quantity`` is not finite at ``round_`` (0: the initial
    evaluation), saying what to do about it — the one message of every run that stops at a
    divergence (:func:`fedjaxsparse.run`, an experiment's seeds run as one program).
    ``value``: the value seen (``None``: not reported); ``hint``: a sentence appended."""
    where = "in the initial evaluation" if round_ == 0 else f"at round {round_}"
    what = "is not finite" if value is None else f"is {value}"
    return cls(f"{method or 'run'}: {quantity} {what} {where}; the run diverged (or the data "
               "holds NaN/inf). Lower the step size / learning rate or check the data; pass "
               "on_nonfinite='stop' (CLI: --on-divergence skip) to record the divergence and "
               "go on." + hint, round_, quantity, method)


def check_number(name: str, value: Any, low: float | None = None, high: float | None = None,
                 *, low_open: bool = False, high_open: bool = False) -> Any:
  """``value`` if it is a finite number in the interval; otherwise raise ``ConfigError``.

  ``low``/``high`` bound the interval (``None``: unbounded); ``low_open``/``high_open``
  exclude the end points. Returns ``value`` unchanged (tracers included).
  """
  if isinstance(value, jax.core.Tracer):
    return value
  lo = "(-inf" if low is None else ("(" if low_open else "[") + f"{low:g}"
  hi = "inf)" if high is None else f"{high:g}" + (")" if high_open else "]")
  try:
    v = float(value)
  except (TypeError, ValueError):
    raise ConfigError(f"{name} must be a number in {lo}, {hi}, got {value!r}.") from None
  ok = math.isfinite(v)
  if ok and low is not None:
    ok = v > low if low_open else v >= low
  if ok and high is not None:
    ok = v < high if high_open else v <= high
  if not ok:
    raise ConfigError(f"{name} must be a finite number in {lo}, {hi}, got {value!r}.")
  return value


def check_int(name: str, value: Any, low: int | None = None, high: int | None = None) -> int:
  """``value`` as a Python ``int`` if it is an integer (``int`` or a NumPy integer, not a
  ``bool``) in ``[low, high]`` (``None``: unbounded); otherwise raise ``ConfigError`` naming
  ``name`` and the allowed range."""
  lo = "-inf" if low is None else str(low)
  hi = "inf" if high is None else str(high)
  what = (f"an int >= {low}" if high is None and low is not None else
          f"an int in [{lo}, {hi}]")
  if isinstance(value, bool):
    raise ConfigError(f"{name} must be {what}, got {value!r}.")
  try:
    v = operator.index(value)
  except TypeError:
    raise ConfigError(f"{name} must be {what}, got {value!r}.") from None
  if (low is not None and v < low) or (high is not None and v > high):
    raise ConfigError(f"{name} must be {what}, got {value!r}.")
  return v


def check_positive(name: str, value: Any) -> Any:
  """A finite number > 0 (step sizes, learning rates)."""
  return check_number(name, value, 0.0, low_open=True)
