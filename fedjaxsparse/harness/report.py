"""What an experiment reports, declared: :class:`Table` (rows printed as plain text, one row per
method, a dash for a missing value explained in a footnote — the experiments' tables and the
paper's numbers beside ours) and :class:`Figure` (a plot of :mod:`fedjaxsparse.harness.plotting`
by name). An experiment returns them in its results; the harness prints, saves and draws them
(:func:`fedjaxsparse.harness.running.finish`), so no experiment formats or plots by hand."""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Sequence
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["print_table", "Table", "Figure"]
__dir__ = _public_dir(__all__)

MISSING = "—"
MISSING_NOTE = (f"{MISSING}: no value — not applicable to the method, a single seed (no "
                "standard error), a threshold never reached, a diverged run, or a number the "
                "paper does not give")


def print_table(rows: list[dict], columns: list[str]) -> str:
  """A plain-text table of ``rows`` (dicts) with the given ``columns``; returns and prints it.
  A missing value (``None``) prints as ``MISSING`` ("—"), explained in a footnote."""
  def fmt(v):
    if v is None:
      return MISSING
    if isinstance(v, float):
      return f"{v:.4g}"
    return str(v)

  cells = [[fmt(r.get(c)) for c in columns] for r in rows]
  widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
  lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)),
           "  ".join("-" * w for w in widths)]
  lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
  if any(MISSING in row for row in cells):
    lines.append(MISSING_NOTE)
  text = "\n".join(lines)
  print(text)
  return text



@dataclasses.dataclass(frozen=True)
class Table:
  """A result table an experiment declares under a key of its results: the harness prints it
  (``title`` above, ``note`` below — the paper's claims, say) and saves ``rows`` under that key
  of ``results.json`` and the printed text under ``<key>_text``.

  Attributes:
    rows: one dict per row (``None``: a missing value).
    columns: the columns in order (default: the first row's keys).
    title: a line printed above the table.
    note: a line printed below it.
  """
  rows: list
  columns: Sequence[str] | None = None
  title: str | None = None
  note: str | None = None

  def render(self) -> str:
    """Print the table (with its title and note) and return the table's text."""
    if self.title:
      print(self.title)
    columns = list(self.columns) if self.columns is not None else list(self.rows[0])
    text = print_table(self.rows, columns)
    if self.note:
      print(self.note)
    return text


@dataclasses.dataclass(frozen=True)
class Figure:
  """A plot an experiment declares (in its results' ``"figures"`` list): ``kind`` names a
  ``plot_<kind>`` function of :mod:`fedjaxsparse.harness.plotting` (``methods``, ``series``,
  ``evals``, ``personal``, ``curves``, ``panels``, ``bars``), ``args`` are its arguments but the
  path; the harness saves it as ``<experiment><suffix>.png`` in the output folder."""
  kind: str
  args: dict
  suffix: str = ""

  def draw(self, folder: str, experiment: str) -> str:
    """Save the figure under ``folder``; returns the PNG's path."""
    from fedjaxsparse.harness import plotting  # matplotlib: loaded when a figure is drawn
    fn: Any = getattr(plotting, f"plot_{self.kind}", None)
    if fn is None:
      raise ValueError(f"Figure kind must name a plot_<kind> of harness.plotting, got "
                       f"{self.kind!r}.")
    return fn(path=os.path.join(folder, f"{experiment}{self.suffix}.png"), **self.args)
