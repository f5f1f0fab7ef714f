"""The documentation site (``docs/``): it builds offline with warnings as errors, every public
name has a rendered entry (API coverage), and the reproduction ledger lists every table and
figure of the seeds with every experiment's paper configurations."""
import os
import posixpath
import re
import subprocess
import sys

import pytest

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs")
sys.path.insert(0, os.path.join(DOCS, "_ext"))

import fjsdocs  # noqa: E402

STATUSES = {"reproduced", "partial", "not reproduced", "no results"}


def test_the_ledger_names_every_paper_configuration_and_only_real_ones():
  assert fjsdocs.ledger_problems() == []
  items = fjsdocs.ledger_items()
  assert {it["seed"] for it in items} == {"000", "001", "002", "003", "004"}
  for it in items:
    where = f"seed {it['seed']} {it['label']}"
    status = fjsdocs.ledger_status(it)
    assert status in STATUSES, where
    assert it["label"].split()[0] in ("Table", "Figure", "Fig.", "Text"), where
    if status in ("reproduced", "partial"):
      assert it["experiment"] and it["command"].startswith("fedjaxsparse run "), where
      assert it["command"].split()[2] == it["experiment"], where
      assert all(fjsdocs.ledger_words(it)), where
  labels = [(it["seed"], it["label"]) for it in items]
  assert len(labels) == len(set(labels)), "an item is listed twice"


def test_a_missing_paper_configuration_is_reported(monkeypatch):
  items = fjsdocs.ledger_items()
  dropped = next(it for it in items if it["papers"])
  monkeypatch.setattr(fjsdocs, "ledger_items",
                      lambda: [it for it in items if it is not dropped])
  problems = fjsdocs.ledger_problems()
  assert len(problems) == len(dropped["papers"])
  assert all("missing from docs/reproduction.toml" in p for p in problems)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
  """The site built as it is published, ``sphinx-build -W --keep-going`` (no network), but
  with Sphinx's own ``basic`` theme: the pages, warnings and inventory are the same, and furo's
  full navigation tree on every page (a third of the build's time) only restyles them."""
  out = tmp_path_factory.mktemp("site")
  proc = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b",
                         "html", "-D", "html_theme=basic", DOCS, str(out)],
                        capture_output=True, text=True,
                        env={**os.environ, "FEDJAXSPARSE_DOCS_EXECUTE": "0"})
  assert proc.returncode == 0, proc.stderr[-4000:]
  return out


@pytest.mark.integration
def test_the_site_builds_and_every_public_name_has_an_entry(site):
  from sphinx.util.inventory import InventoryFile
  import fedjaxsparse as fjs
  with open(site / "objects.inv", "rb") as f:
    inventory = InventoryFile.load(f, "", posixpath.join)
  rendered = {name for kind, entries in inventory.items() if kind.startswith("py:")
              for name in entries}
  expected = {f"fedjaxsparse.{n}" for n in fjs.__all__}
  for module in fjsdocs.public_modules():
    expected.add(module)
    namespace = __import__(module, fromlist=["_"])
    expected |= {f"{module}.{n}" for n in fjsdocs.public_names(namespace)}
  missing = sorted(expected - rendered)
  assert not missing, f"{len(missing)} public names without an entry: {missing[:20]}"
  assert len(expected) > 500   # the whole public face, not a sample
  # the pages a reader navigates: landing, tour, concepts, a page per family, the ledger
  for page in ("index", "getting_started", "concepts", "composing", "command_line", "benchmarks",
               "_generated/reproduction", "_generated/api/fedjaxsparse",
               *(f"_generated/papers/{fam[0]}" for fam in fjsdocs.FAMILIES),
               *(f"_generated/notebooks/{n[:-6]}" for n in os.listdir(
                   os.path.join(os.path.dirname(DOCS), "notebooks")) if n.endswith(".ipynb"))):
    assert (site / f"{page}.html").exists(), page
  ledger = re.sub(r"<[^>]+>", "", (site / "_generated" / "reproduction.html").read_text())
  assert "fedjaxsparse run sparse_proxskip --paper table4" in ledger


@pytest.mark.parametrize("module", ["fedjaxsparse.ops.sparsity", "fedjaxsparse.ops.compressors",
                                    "fedjaxsparse.ops.sampling", "fedjaxsparse.ops.proxes",
                                    "fedjaxsparse.ops.accounting", "fedjaxsparse.core",
                                    "fedjaxsparse.algorithms.cohort_round"])
def test_docstring_examples_run(module):
  """The examples in the public face's docstrings are doctests: each runs and prints what
  it says."""
  import doctest
  import importlib
  result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
  assert result.failed == 0
  assert result.attempted >= 2, f"{module} has no docstring example"


def test_committed_results_name_a_real_configuration_and_the_papers_own_numbers():
  """A measured result shown on a family page (``docs/measured/<experiment>__<paper>.json``)
  belongs to an existing paper configuration, says how it was run, and its "paper" columns
  are that configuration's numbers (nothing typed by hand)."""
  folder = os.path.join(DOCS, "measured")
  configs = fjsdocs.paper_configurations()
  files = [f for f in os.listdir(folder) if f.endswith(".json")]
  assert files
  for name in files:
    experiment, paper = name[:-5].split("__")
    pc = configs[(experiment, paper)]
    res = fjsdocs._committed_result(experiment, paper)
    assert res["command"].startswith(f"fedjaxsparse run {experiment} --paper {paper}")
    assert res["config"]["paper"] == paper and "standin" in res
    for row in res["paper_comparison"]:
      for column, by_method in pc.paper.items():
        if row["method"] in by_method:
          assert row[f"paper {column}"] == by_method[row["method"]], (name, column)


_INWARD = re.compile(r"seed 0\d\d|spec [A-Z]\.| l\. \d", re.IGNORECASE)
_ROOT = os.path.dirname(DOCS)


def _docstrings(path: str):
  import ast
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read())
  for node in ast.walk(tree):
    if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      doc = ast.get_docstring(node, clean=False)
      if doc:
        yield getattr(node, "name", "<module>"), doc


def test_no_page_or_docstring_points_into_the_teams_specs():
  """Readers meet papers, not the team's source files: ``seed 0NN``, ``spec X.`` and text line
  numbers appear only after a docstring's closing "Source for the team" line, in code comments,
  and in the reproduction ledger (the team's map of the sources)."""
  found = []
  for folder in ("fedjaxsparse", "experiments", "benchmarks"):
    for dirpath, _, files in os.walk(os.path.join(_ROOT, folder)):
      for name in sorted(f for f in files if f.endswith(".py")):
        path = os.path.join(dirpath, name)
        for where, doc in _docstrings(path):
          for hit in _INWARD.findall(doc.split("Source for the team")[0]):
            found.append(f"{os.path.relpath(path, _ROOT)}:{where}: {hit!r}")
  pages = [os.path.join(_ROOT, "README.md"), os.path.join(_ROOT, "benchmarks", "README.md")]
  pages += [os.path.join(DOCS, n) for n in sorted(os.listdir(DOCS)) if n.endswith(".md")]
  pages += [os.path.join(DOCS, "rules", n) for n in sorted(os.listdir(os.path.join(DOCS, "rules")))
            if n.endswith(".md")]
  pages += [os.path.join(_ROOT, "notebooks", n)
            for n in sorted(os.listdir(os.path.join(_ROOT, "notebooks"))) if n.endswith(".ipynb")]
  for path in pages:
    with open(path, encoding="utf-8") as f:
      for hit in _INWARD.findall(f.read()):
        found.append(f"{os.path.relpath(path, _ROOT)}: {hit!r}")
  assert len(pages) > 10
  assert not found, "\n".join(found)


def test_ledger_words_come_from_the_configurations_that_run(monkeypatch):
  """An item with paper configurations has no typed data/scale words: they are generated from
  the configurations (the data set's availability, ``PaperConfig.reduced``)."""
  configs = fjsdocs.paper_configurations()
  items = {(it["seed"], it["label"]): it for it in fjsdocs.ledger_items()}
  for it in items.values():
    if it["papers"]:
      assert not {"data", "scale", "status"} & set(it), (it["seed"], it["label"])
      assert fjsdocs.ledger_status(it, configs) in ("reproduced", "partial")
      data, scale = fjsdocs.ledger_words(it, configs)
      assert data in fjsdocs.DATA_ORDER and scale in ("paper protocol", "reduced")
  # appendix Table 3 of the FedMRN paper: Shakespeare ships, PascalVOC needs the user's files
  voc = items[("003", "Table 3")]
  assert {configs[("fedmrn_fmnist", p)].data_status for p in voc["papers"]} == {
      "real offline", "real with files"}
  assert fjsdocs.ledger_words(voc, configs)[0] == "real with files"
  # ATO's ImageNet tables hold a subset of the training set in memory
  for label in ("Table 5", "Figure 8"):
    assert fjsdocs.ledger_words(items[("004", label)], configs)[1] == "reduced"
  assert "per_class" in fjsdocs.configuration_text(items[("004", "Table 5")], configs)
  # Fig. D.10 names its learning-rate grid and the first 100 writers
  d10 = fjsdocs.configuration_text(items[("001", "Figure D.10")], configs)
  assert "lrs=[0.0001, 0.0005" in d10 and "100 first writers" in d10
  # a configuration that declares a reduction turns its item's word
  table1 = items[("000", "Table 1")]
  assert fjsdocs.ledger_words(table1, configs) == ("real with files", "paper protocol")
  import dataclasses
  key = ("sparse_proxskip", "table1")
  shrunk = {**configs, key: dataclasses.replace(configs[key], reduced="fewer seeds")}
  assert fjsdocs.ledger_words(table1, shrunk) == ("real with files", "reduced")
  standin = {**configs, key: dataclasses.replace(configs[key], dataset="blogfeedback_standin")}
  assert fjsdocs.ledger_words(table1, standin)[0] == "stand-in"
  # the status too: partial exactly when a configuration names what it leaves out
  assert fjsdocs.ledger_status(table1, configs) == "reproduced"
  part = {**configs, key: dataclasses.replace(configs[key], missing="the right panel")}
  assert fjsdocs.ledger_status(table1, part) == "partial"
  assert "not produced: the right panel" in fjsdocs.configuration_text(table1, part)
  assert fjsdocs.ledger_status(items[("001", "Figure 4.4")], configs) == "partial"  # right panel
  assert fjsdocs.ledger_status(items[("004", "Table 5")], configs) == "partial"    # baselines
  assert fjsdocs.ledger_status(items[("004", "Table 12")], configs) == "reproduced"


def test_every_family_page_states_its_update_rules_in_latex():
  """Each paper's page carries its methods' update rules as display mathematics (MyST's
  ``$$ ... $$``, rendered by MathJax in the browser; the build needs no network), written in
  ``docs/rules/<family>.md`` and placed on the generated page."""
  for slug, *_ in fjsdocs.FAMILIES:
    path = os.path.join(DOCS, "rules", f"{slug}.md")
    assert os.path.exists(path), f"docs/rules/{slug}.md is missing"
    text = open(path, encoding="utf-8").read()
    blocks = re.findall(r"^\$\$\n(.+?)\n\$\$$", text, flags=re.S | re.M)
    assert len(blocks) >= 2 and text.count("$$") % 2 == 0, slug
    assert not re.search(r"^# ", text, flags=re.M), f"{slug}: the page has its own title"
    page = fjsdocs.family_page(*next(f for f in fjsdocs.FAMILIES if f[0] == slug))
    assert "## Update rules" in page and blocks[0] in page, slug
