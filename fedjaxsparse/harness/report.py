"""Result tables as plain text: one row per method, a dash for a missing value, explained in a
footnote (the experiments' tables and the paper's numbers beside ours)."""
from __future__ import annotations

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

