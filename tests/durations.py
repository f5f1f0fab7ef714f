"""Refreshes ``tests/durations.json``, the measured seconds of the suite's slower tests, from
the output of a full run with ``--durations=0``:

    .venv/bin/python -m pytest -q -n 2 --dist worksteal --durations=0 > /tmp/durations.txt
    .venv/bin/python tests/durations.py /tmp/durations.txt

``tests/conftest.py`` orders the collection by these numbers (slowest modules first, each
module's slowest tests first), so that xdist's work stealing ends the run on short tests.
A test missing from the file counts as fast; a stale number only changes the order."""
import json
import os
import re
import sys

MIN_SECONDS = 0.5   # faster tests are left out (they count as fast)
PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "durations.json")


def parse(text: str) -> dict[str, float]:
  """``{node id: setup + call + teardown seconds}`` from pytest's ``--durations`` lines."""
  out: dict[str, float] = {}
  for seconds, nodeid in re.findall(r"^([0-9.]+)s (?:setup|call|teardown)\s+(\S+)$", text, re.M):
    out[nodeid] = out.get(nodeid, 0.0) + float(seconds)
  return out


def main(argv: list[str]) -> int:
  if len(argv) != 1:
    print(__doc__)
    return 2
  with open(argv[0]) as f:
    durations = parse(f.read())
  if not durations:
    print(f"no --durations lines in {argv[0]}", file=sys.stderr)
    return 1
  kept = {k: round(v, 1) for k, v in sorted(durations.items()) if v >= MIN_SECONDS}
  with open(PATH, "w") as f:
    json.dump(kept, f, indent=0, ensure_ascii=False)
    f.write("\n")
  print(f"wrote {len(kept)} of {len(durations)} tests to {PATH}")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
