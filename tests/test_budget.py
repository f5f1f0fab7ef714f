"""The unit tier keeps to its time budget: the README's test command must stay a few-minute
check a contributor runs before every commit, so the unit tier's recorded seconds
(``tests/durations.json``, refreshed from a full run by ``tests/durations.py``) may not exceed
``UNIT_BUDGET_S``. A change that adds a test pays for it in the same change: it shares a compiled
program, shrinks a tiny configuration, trims elsewhere, or — when it runs an experiment, a
notebook, a benchmark script, several processes or golden numbers — belongs to the integration
tier (``@pytest.mark.integration``)."""
import json
import os

# CPU-seconds of the unit tier on 2 cores with 2 workers: 600 s is 5 minutes of wall time.
# Recorded 529 s on 2026-11-29 (a fresh clone: 282 s of wall time, 548 CPU-s with pytest's own
# work), after one OpenBLAS thread per process and three learning/checkpoint runs moved to the
# integration tier.
UNIT_BUDGET_S = 600.0
DURATIONS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "durations.json")


def unit_tier_seconds(items, recorded: dict) -> dict:
  """``{node id: recorded seconds}`` of the collected ``items`` outside the integration tier
  (a test missing from the record counts 0: it ran in under ``durations.MIN_SECONDS``)."""
  return {item.nodeid: recorded.get(item.nodeid, 0.0) for item in items
          if item.get_closest_marker("integration") is None}


def test_the_unit_tier_fits_its_budget(request):
  with open(DURATIONS) as f:
    recorded = json.load(f)
  unit = unit_tier_seconds(request.session.items, recorded)
  total = sum(unit.values())
  slowest = sorted(unit.items(), key=lambda kv: -kv[1])[:5]
  assert total <= UNIT_BUDGET_S, (
      f"the unit tier's recorded seconds are {total:.0f} s, over its budget of "
      f"{UNIT_BUDGET_S:.0f} s (tests/durations.json). The five slowest: "
      + "; ".join(f"{nodeid} {s:.1f} s" for nodeid, s in slowest)
      + ". Share a compiled program, shrink a configuration, or mark an end-to-end run "
        "@pytest.mark.integration.")


def test_the_budget_check_names_the_slowest_tests(request):
  """The check above counts only the unit tier and reports what it counted."""
  class Item:
    def __init__(self, nodeid, integration):
      self.nodeid, self._integration = nodeid, integration

    def get_closest_marker(self, name):
      return object() if name == "integration" and self._integration else None

  items = [Item("a", False), Item("b", True), Item("c", False)]
  assert unit_tier_seconds(items, {"a": 2.0, "b": 500.0}) == {"a": 2.0, "c": 0.0}
