"""Every paper number an experiment prints beside ours is the one in that table's paper
configuration (``PaperConfig.paper``): the printing code reads the configuration, and no
experiment keeps a second copy of a table's numbers in a loose module-level dict."""
from __future__ import annotations

import dataclasses
import re
import types

import pytest

from fedjaxsparse.harness.cli import experiments

LOOSE = re.compile(r"^_?(PAPER|TABLE)\w*$")


def _holds_numbers(value) -> bool:
  if isinstance(value, bool):
    return False
  if isinstance(value, (int, float)):
    return True
  if isinstance(value, dict):
    return any(_holds_numbers(v) for v in value.values())
  if isinstance(value, (list, tuple)):
    return any(_holds_numbers(v) for v in value)
  return False


def test_no_experiment_keeps_paper_numbers_outside_its_configurations():
  """Every experiment that prints a paper's numbers has paper configurations holding them,
  and none keeps a second copy in a module-level ``PAPER*``/``TABLE*`` name."""
  found = experiments()
  loose = {name: sorted(k for k, v in vars(m).items()
                        if LOOSE.match(k) and k != "PAPERS" and _holds_numbers(v))
           for name, m in found.items()}
  assert not any(loose.values()), {n: k for n, k in loose.items() if k}
  for name, m in found.items():
    for pc in getattr(m, "PAPERS", {}).values():
      for column, values in pc.paper.items():   # {column: {row: value}}, as documented
        assert isinstance(values, dict) and values, (name, pc.name, column)
  with_numbers = {name for name, m in found.items()
                  if any(pc.paper for pc in getattr(m, "PAPERS", {}).values())}
  assert with_numbers >= {"ato_prune", "cohort_squeeze_logreg", "efbv_logreg",
                          "fedlpfm_fmnist", "fedmrn_fmnist", "fedp3_fmnist", "fedp3_params",
                          "fedspa_table1", "scafflix_inexact", "scafflix_nn",
                          "sparse_proxskip", "symwanda_lm"}


def _fedlpfm_printed(F, opts, split, label, variants, table12):
  ctx = types.SimpleNamespace(setting=split, extra={"variants": variants, "table12": table12})
  tuned = types.SimpleNamespace(best="x", stats={"se": 0.0}, finals=[1.0])
  return F.columns(label, tuned, ctx, None, opts)["paper % (CIFAR-10)"]


@pytest.mark.parametrize("study,student", [("table8", "cnn"), ("table8", "mobilenet_v2"),
                                           ("table8", "efficientnet_b0"),
                                           ("table8", "resnet18"), ("table11", "cnn"),
                                           ("table12", "cnn")])
def test_fedlpfm_prints_its_tables_configuration(monkeypatch, study, student):
  """Tables 8-12: each printed cell is the configuration's, and a changed configuration
  changes what is printed (Tables 9 and 10 once printed Table 8's column)."""
  F = experiments()["fedlpfm_fmnist"]
  opts = {"study": study, "student": student}
  pc = F.paper_of(opts)
  assert pc.name == (F.STUDENT_PAPER[student] if study == "table8" else f"{study}_cifar10")
  variants = {"CNN": None, "Linear Probing": None, "Prompt Tuning": None}
  table12 = dict(zip(("ViT", "RN50", "mix"), ("CLIP ViT-B/32", "CLIP RN50", "random selection")))
  if study == "table12":
    variants = dict.fromkeys(table12)
  moved = {pc.name: dataclasses.replace(pc, paper={
      split: {c: f"{v}+moved" for c, v in row.items()} for split, row in pc.paper.items()})}
  for split, row in F.ROW.items():
    for label, (method, variant) in F._plan(opts, variants).items():
      column = (method if study == "table8" else table12[variant] if study == "table12"
                else variant if variant in ("Linear Probing", "Prompt Tuning") else "0-shot")
      got = _fedlpfm_printed(F, opts, split, label, variants, table12)
      assert got == pc.paper[row].get(column), (split, label)
      with monkeypatch.context() as m:
        m.setattr(F, "PAPERS", {**F.PAPERS, **moved})
        again = _fedlpfm_printed(F, opts, split, label, variants, table12)
      assert again == (None if got is None else f"{got}+moved"), (split, label)
  # every configuration's table has the seven splits; Tables 9 and 10 have no FML column
  assert set(pc.paper) == set(F.ROW.values())
  if pc.name in ("table9_cifar10", "table10_cifar10"):
    assert all("FML" not in row for row in pc.paper.values())


def test_fedspa_prints_its_tables_configuration(monkeypatch):
  """Tables 1-4 of the FedSpa paper: Table 1's cells, Table 2's rounds, Tables 3-4's FedSpa
  (DST) accuracies are read from the data set's configuration, and follow a changed one."""
  F = experiments()["fedspa_table1"]

  def printed(dataset, split, method, opts):
    ctx = types.SimpleNamespace(setting=split, extra={"paper": F._paper(dataset)})
    row = [ctx.extra["paper"].get(f"{q} ({split})", {}).get(F._paper_row(method))
           for q in ("accuracy %", "Comm GB", "FLOPs e14")]
    return (row, F._paper_rounds(method, split, dataset, opts["targets"]),
            F._paper_ablations(method, split, dataset, opts))

  for dataset, name in F.PAPER_OF.items():
    pc = F.PAPERS[name]
    assert pc.dataset == dataset
    opts = {"targets": pc.options["targets"], "init": "erk", "sparsity": 0.5}
    moved = dataclasses.replace(pc, paper={c: {m: f"{v}+moved" for m, v in row.items()}
                                           for c, row in pc.paper.items()})
    for split in F.SPLITS:
      for method in F.METHODS:
        got = printed(dataset, split, method, opts)
        assert got[0] == [pc.paper.get(f"{q} ({split})", {}).get(method)
                          for q in ("accuracy %", "Comm GB", "FLOPs e14")]
        assert got[0][0] is not None            # every method has Table 1's accuracy
        with monkeypatch.context() as m:
          m.setattr(F, "PAPERS", {**F.PAPERS, name: moved})
          again = printed(dataset, split, method, opts)
        assert again[0] == [None if v is None else f"{v}+moved" for v in got[0]]
        for before, after in zip(got[1:], again[1:]):
          assert after == {k: f"{v}+moved" for k, v in before.items()}
        assert bool(got[1]) == (dataset != "emnist_l" and method != "Local")
        assert bool(got[2]) == (dataset == "cifar100" and method == "FedSpa (DST)")


def test_fedmrn_prints_its_tables_configuration(monkeypatch):
  """Tables 1-2 and appendix Table 3 of the FedMRN paper: each row's paper number and bits per
  parameter, and Table 2's / Table 3's changes in the note, come from the configuration of the
  data set run (the stand-ins: their real set's)."""
  F = experiments()["fedmrn_fmnist"]
  tuned = types.SimpleNamespace(records=[{"history": {"rounds": {"uplink_bits": [8.0]}},
                                          "wall_time_s": 1.0}])
  opts = {"cohort": 1}
  for dataset, name in F.PAPER_OF.items():
    pc = F.PAPERS[name]
    cfg = types.SimpleNamespace(dataset=dataset)
    splits = ["natural"] if name.startswith("table3") else list(F.SPLITS)
    methods = F.TABLE3 if name.startswith("table3") else F.METHODS
    moved = dataclasses.replace(pc, paper={c: {m: v + 1000 for m, v in row.items()}
                                           for c, row in pc.paper.items()})
    for split in splits:
      for m in methods:
        def printed():
          ctx = types.SimpleNamespace(setting=split, extra={"paper": F._paper(cfg), "d": 1})
          return F.columns(m, tuned, ctx, cfg, opts)
        got = printed()
        assert got["paper %"] == pc.paper[split][m] is not None
        assert got["bpp (paper's count)"] == pc.paper["bpp"][m]
        with monkeypatch.context() as mp:
          mp.setattr(F, "PAPERS", {**F.PAPERS, name: moved})
          again = printed()
        assert again["paper %"] == got["paper %"] + 1000
  # the notes' paper changes are computed from the configuration, never typed
  rows = [{"method": m, "ours %": 50.0, "split": "natural"} for m in F.TABLE3]
  ctx = types.SimpleNamespace(extra={"paper": F.PAPERS["table3_voc"].paper})
  res = F.report({"table": types.SimpleNamespace(rows=rows)}, ctx,
                 types.SimpleNamespace(dataset="voc"), {"study": "table3"})
  assert "SignSGD -9.5, EDEN -1.8, FedMRN +0.4" in res["table"].note
  ctx = types.SimpleNamespace(extra={"paper": F.PAPERS["table1_cifar10"].paper})
  res = F.report({"table": types.SimpleNamespace(rows=rows)}, ctx,
                 types.SimpleNamespace(dataset="cifar10"), {"study": "table1"})
  assert "FedPM -112.3" in res["table"].note and "FedMRN +1.2" in res["table"].note


def test_fedp3_prints_its_tables_configuration(monkeypatch):
  """Tables 4.1 and 4.2 of the FedP3 chapter sit in the resnet_*/rules_* configurations, per
  split; the rows read them (and follow a changed one); studies the chapter prints only as
  figures have none."""
  F = experiments()["fedp3_fmnist"]
  assert set(F._paper("rules", "fashion_mnist")["S1"]) == {
      "Fixed", "Uniform (p=0.9)", "Ordered Dropout (p=0.9)", "Uniform (p=0.7)",
      "Ordered Dropout (p=0.7)"}
  assert F._paper("rules", "cifar10") == {"S1": {"Fixed": 67.65}, "S2": {"Fixed": 61.17}}
  assert "S2" not in F._paper("resnet", "cifar100")           # Table 4.1 prints S1 only
  assert F._paper("policies", "cifar10") == {} and F._paper("rules", "digits") == {}
  name = "rules_cifar100"
  moved = dataclasses.replace(F.PAPERS[name], paper={"S1": {"Fixed": 1.0}})
  monkeypatch.setattr(F, "PAPERS", {**F.PAPERS, name: moved})
  assert F._paper("rules", "cifar100") == {"S1": {"Fixed": 1.0}}
