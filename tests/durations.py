"""Refreshes ``tests/durations.json``, the measured seconds of the suite's slower tests, from
the output of a full run with ``--durations=0``:

    .venv/bin/python -m pytest -q -n 2 --dist worksteal --durations=0 > /tmp/durations.txt
    (both tiers: the unit tier's total is checked against its budget, the order uses both)
    .venv/bin/python tests/durations.py /tmp/durations.txt

``tests/conftest.py`` orders the collection by these numbers (slowest modules first, each
module's slowest tests first), so that xdist's work stealing ends the run on short tests.
A test missing from the file counts as fast; a stale number only changes the order. The unit
tier's recorded total is held to its budget by ``tests/test_budget.py``.

Where the seconds go, per file (tracing, lowering, XLA compilation, the rest):

    FEDJAXSPARSE_TEST_PROFILE=/tmp/prof .venv/bin/python -m pytest -q -n 2 --dist worksteal
    .venv/bin/python tests/durations.py --profile /tmp/prof"""
import json
import os
import re
import sys

MIN_SECONDS = 0.05   # faster tests are left out (they count as 0 s)
PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "durations.json")


def parse(text: str) -> dict[str, float]:
  """``{node id: setup + call + teardown seconds}`` from pytest's ``--durations`` lines."""
  out: dict[str, float] = {}
  for seconds, nodeid in re.findall(r"^([0-9.]+)s (?:setup|call|teardown)\s+(\S+)$", text, re.M):
    out[nodeid] = out.get(nodeid, 0.0) + float(seconds)
  return out


def profile(folder: str) -> str:
  """The per-file table of the records ``tests/conftest.py`` writes under
  ``FEDJAXSPARSE_TEST_PROFILE`` (one JSON line per test), slowest file first, with each tier's
  totals."""
  rows: dict[str, dict] = {}
  tiers: dict[str, dict] = {}
  keys = ("wall_s", "trace_s", "lower_s", "compile_s", "programs", "cache_hits")
  for name in sorted(os.listdir(folder)):
    if not name.endswith(".jsonl"):
      continue
    with open(os.path.join(folder, name)) as f:
      for line in f:
        rec = json.loads(line)
        file = rec["nodeid"].split("::")[0]
        tier = "integration" if rec.get("integration") else "unit"
        for bucket in (rows.setdefault(file, {"tests": 0, "tier": tier}),
                       tiers.setdefault(tier, {"tests": 0, "tier": tier})):
          bucket["tests"] += 1
          for k in keys:
            bucket[k] = bucket.get(k, 0) + rec.get(k, 0)
  head = (f"{'file':44s} {'tier':11s} {'tests':>5s} {'wall s':>8s} {'trace':>7s} {'lower':>7s} "
          f"{'compile':>8s} {'rest':>8s} {'progs':>6s} {'hits':>6s}")
  lines = [head, "-" * len(head)]
  def fmt(name, r):
    rest = r["wall_s"] - r["trace_s"] - r["lower_s"] - r["compile_s"]
    return (f"{name:44s} {r['tier']:11s} {r['tests']:5d} {r['wall_s']:8.1f} {r['trace_s']:7.1f} "
            f"{r['lower_s']:7.1f} {r['compile_s']:8.1f} {rest:8.1f} {r['programs']:6d} "
            f"{r['cache_hits']:6d}")
  for file, r in sorted(rows.items(), key=lambda kv: -kv[1]["wall_s"]):
    lines.append(fmt(file, r))
  lines.append("-" * len(head))
  for tier, r in sorted(tiers.items()):
    lines.append(fmt(f"all {tier} tests", r))
  return "\n".join(lines)


def main(argv: list[str]) -> int:
  if len(argv) == 2 and argv[0] == "--profile":
    print(profile(argv[1]))
    return 0
  if len(argv) != 1:
    print(__doc__)
    return 2
  with open(argv[0]) as f:
    durations = parse(f.read())
  if not durations:
    print(f"no --durations lines in {argv[0]}", file=sys.stderr)
    return 1
  kept = {k: round(v, 2) for k, v in sorted(durations.items()) if v >= MIN_SECONDS}
  with open(PATH, "w") as f:
    json.dump(kept, f, indent=0, ensure_ascii=False)
    f.write("\n")
  print(f"wrote {len(kept)} of {len(durations)} tests to {PATH}")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
