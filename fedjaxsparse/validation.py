"""Checks of hyper-parameters at an algorithm's or experiment's boundary: finite numbers in a
stated range, with a :class:`~fedjaxsparse.errors.ConfigError` naming the parameter and the
allowed range. Traced values (inside a vmapped sweep) pass through unchecked."""
from __future__ import annotations

import math
from typing import Any

import jax

from fedjaxsparse.errors import ConfigError


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


def check_positive(name: str, value: Any) -> Any:
  """A finite number > 0 (step sizes, learning rates)."""
  return check_number(name, value, 0.0, low_open=True)
