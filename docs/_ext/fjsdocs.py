"""Pages generated from the code at every build (into ``docs/_generated/``, not committed).

* ``api/``: one page per public module — its docstring, then an entry for every public name
  (:func:`public_names`: ``__all__``; a module without one: the functions and classes it
  defines whose names do not start with ``_``) — and ``api/fedjaxsparse``, the public face
  ``import fedjaxsparse as fjs`` (every name of ``fjs.__all__``).
* ``reproduction.md``: the ledger of every table and figure of the seed papers, from
  ``docs/reproduction.toml`` joined with the experiments' paper configurations (``PAPERS``);
  :func:`ledger_problems` lists configurations the ledger lacks (the build and a test fail).
* ``papers/<family>.md``: a page per paper family (:data:`FAMILIES`): the algorithm modules'
  docstrings (citation, mathematics, the library's choices), the constructors, the
  experiments with their commands, and each paper configuration's printed numbers beside ours
  where a measured result is committed under ``docs/measured/<experiment>__<paper>.json``
  (never typed; the file says the command and the data it ran on).
* ``notebooks/``: copies of ``notebooks/*.ipynb`` (rendered, not executed, unless
  ``FEDJAXSPARSE_DOCS_EXECUTE=1``).
"""
from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import os
import shutil
import tomllib
import types

DOCS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(DOCS)
GENERATED = os.path.join(DOCS, "_generated")

# The public namespaces, in reading order: (module, title). Every module listed here gets an
# API page; so does every submodule a namespace's ``__all__`` names.
NAMESPACES = (
    ("fedjaxsparse.core", "Algorithm, models, state readers"),
    ("fedjaxsparse.runtime", "Running: rounds, seeds and grids, devices, checkpoints"),
    ("fedjaxsparse.algorithms", "The paper families"),
    ("fedjaxsparse.ops", "Pieces: sparsity, compressors, samplings, proxes, ledgers"),
    ("fedjaxsparse.data", "Federated data"),
    ("fedjaxsparse.models", "Models"),
    ("fedjaxsparse.pruning", "Post-training and structured pruning"),
    ("fedjaxsparse.convex", "Convex solvers and safe screening"),
    ("fedjaxsparse.evaluation", "Evaluation"),
    ("fedjaxsparse.errors", "Errors"),
    ("fedjaxsparse.harness", "Experiments, tables, plots, command line"),
)

# A page per paper family: (slug, title, the paper, algorithm modules, experiments, notebooks).
FAMILIES = (
    ("proxskip", "Sparse-ProxSkip, RandProx and sparse FedAvg baselines",
     "Meinhardt, Yi, Condat and Richtárik (2024), arXiv:2405.20623",
     ("proxskip", "fedht", "fedavg", "fedprox"), ("sparse_proxskip", "sparse_proxskip_cifar",
                                                  "fedavg_digits"), ("quickstart",)),
    ("efbv", "EF-BV, EF21 and DIANA: compressed gradients with error feedback",
     "Condat, Yi and Richtárik (2022), NeurIPS 2022, arXiv:2205.04180",
     ("efbv",), ("efbv_logreg",), ("compressors",)),
    ("scafflix", "Scafflix: explicit personalization with local training",
     "Yi, Condat and Richtárik (2023), arXiv:2305.13170",
     ("scafflix",), ("scafflix_logreg", "scafflix_inexact", "scafflix_nn"), ("scafflix",)),
    ("fedp3", "FedP3: personalized privacy-friendly network pruning",
     "Yi, Gazagnadou, Richtárik and Lyu (2024), ICLR 2024, arXiv:2404.09816",
     ("fedp3", "fedp3_theory"), ("fedp3_fmnist", "fedp3_ldp"), ("fedp3",)),
    ("cohort_squeeze", "Cohort-Squeeze: SPPM with arbitrary sampling",
     "Yi, Kharisov, Sokolov and Richtárik (2024), arXiv:2406.01115",
     ("sppm",), ("cohort_squeeze_logreg", "cohort_squeeze_nn"), ("cohort_squeeze",)),
    ("posttrain", "SymWanda, Wanda, RIA and DSnoT: post-training pruning",
     "Yi and Richtárik (2025), arXiv:2501.18980",
     (), ("symwanda_mlp", "symwanda_lm"), ("posttrain",)),
    ("fedspa", "FedSpa, Ditto and Sub-FedAvg: personalized sparse masks",
     "Huang, Liu, Shen, He, Lin and Tao (2022), arXiv:2201.11380",
     ("fedspa", "ditto", "subfedavg"), ("fedspa_table1",), ("fedspa",)),
    ("fedmrn", "FedMRN and FedPM: masks as messages for communication-efficient FL",
     "Li, Cheng, Wang et al. (2024), ACM Multimedia 2024, arXiv:2408.03220",
     ("fedmrn", "fedpm"), ("fedmrn_fmnist",), ("fedmrn",)),
    ("ddss", "Safe screening for distributed sparse learning (DDSS)",
     "Bao, Wu, Xian and Huang (2022), arXiv:2204.10981",
     ("ddss", "ddss_baselines"), ("ddss_lasso",), ("ddss",)),
    ("ato", "Auto-Train-Once: structured pruning with a controller network",
     "Wu, Gao, Zhang et al. (2024), CVPR 2024, arXiv:2403.14729",
     ("ato",), ("ato_prune",), ("ato",)),
    ("fedlpfm", "Fed-LPFM and FML: federated learning with a pre-trained foundation model",
     "Wu, Lin, Willmott et al. (2023), arXiv:2311.08479", ("fedlpfm", "fml"), ("fedlpfm_fmnist",), ("fedlpfm",)),
)
POSTTRAIN_MODULES = ("fedjaxsparse.pruning.posttrain", "fedjaxsparse.pruning.scores",
                     "fedjaxsparse.pruning.dsnot")


def public_names(module: types.ModuleType) -> list[str]:
  """The public names of ``module``: its ``__all__``; without one, the functions and classes
  defined in it whose names do not start with ``_``."""
  names = getattr(module, "__all__", None)
  if names is not None:
    return list(names)
  return [n for n, v in vars(module).items()
          if not n.startswith("_") and (inspect.isfunction(v) or inspect.isclass(v))
          and getattr(v, "__module__", None) == module.__name__]


def public_modules() -> list[str]:
  """Every module with an API page: the namespaces and the submodules their ``__all__`` name,
  recursively."""
  out, todo = [], [m for m, _ in NAMESPACES]
  while todo:
    name = todo.pop(0)
    if name in out:
      continue
    out.append(name)
    module = importlib.import_module(name)
    for n in public_names(module):
      value = getattr(module, n)
      if isinstance(value, types.ModuleType) and value.__name__.startswith(name + "."):
        todo.append(value.__name__)
  return out


def _entry(module: types.ModuleType, name: str, qualified: str, index: bool = True) -> str:
  """The autodoc directive documenting ``module.name`` under ``qualified`` (``index=False``:
  a second rendering, e.g. on a family page, that is not a cross-reference target)."""
  value = getattr(module, name)
  if isinstance(value, types.ModuleType):
    return ""
  if inspect.isclass(value):
    home = f"{value.__module__}.{value.__qualname__}"
    if (qualified not in (home, f"fedjaxsparse.{name}")
        and getattr(importlib.import_module("fedjaxsparse"), name, None) is value):
      # a top-level class re-exported by a namespace as well (``fjs.runtime.Checkpointing``):
      # a short entry naming its home, since a third autodoc rendering would register the
      # home's name twice as an alias (a duplicate-description warning)
      owner, short = qualified.rsplit(".", 1)
      return (f".. py:class:: {short}\n   :module: {owner}\n\n   The class :class:`{home}` "
              f"(also ``fjs.{name}``), documented there.\n\n")
    record = dataclasses.is_dataclass(value) or (issubclass(value, tuple)
                                                and hasattr(value, "_fields"))
    # a record's fields are its docstring's Attributes; other classes list their methods
    return f".. autoclass:: {qualified}\n" + ("" if record else "   :members:\n") + "\n"
  if callable(value):
    return f".. autofunction:: {qualified}\n" + ("" if index else "   :no-index:\n") + "\n"
  doc = _attribute_doc(module, name)
  owner, short = qualified.rsplit(".", 1)
  return (f".. py:data:: {short}\n   :module: {owner}\n   :type: {type(value).__name__}\n\n"
          + "".join(f"   {line}\n" for line in doc) + "\n")


def _attribute_doc(module: types.ModuleType, name: str) -> list[str]:
  """The docstring written under ``name = ...`` in the module that defines it (``module`` or
  one of its submodules holding the same object)."""
  import sys
  from sphinx.pycode import ModuleAnalyzer
  value = getattr(module, name)
  for m in [module] + [m for n, m in sorted(sys.modules.items())
                       if n.startswith(module.__name__ + ".") and m is not None]:
    if getattr(m, name, None) is not value:
      continue
    try:
      docs = ModuleAnalyzer.for_module(m.__name__).find_attr_docs()
    except Exception:  # noqa: BLE001 — a module without source
      continue
    if ("", name) in docs:
      return [line for line in docs[("", name)] if line.strip()] or [""]
  raise ValueError(f"{module.__name__}.{name} is public but has no docstring: write one "
                   f"under its assignment.")


def _title(text: str, char: str = "=") -> str:
  return f"{text}\n{char * len(text)}\n\n"


def _api_page(name: str) -> str:
  module = importlib.import_module(name)
  names = public_names(module)
  subs = [getattr(module, n).__name__ for n in names
          if isinstance(getattr(module, n), types.ModuleType)]
  text = _title(f"``{name.replace('fedjaxsparse', 'fjs', 1)}``")
  text += f".. automodule:: {name}\n   :no-members:\n\n"
  if subs:
    text += ".. toctree::\n   :maxdepth: 1\n\n" + "".join(f"   {s}\n" for s in subs) + "\n"
  for n in names:
    text += _entry(module, n, f"{name}.{n}")
  return text


def _top_page() -> str:
  import fedjaxsparse as fjs
  text = _title("``import fedjaxsparse as fjs``")
  text += (".. automodule:: fedjaxsparse\n   :no-members:\n\n"
           + _title("The paper methods", "-")
           + "Every paper method by its paper's name (``fjs.METHODS``); each returns an "
           ":class:`~fedjaxsparse.core.Algorithm`. The families' pages "
           "(:doc:`/_generated/papers/index`) say which paper each comes from.\n\n")
  for n in fjs.METHODS:
    text += _entry(fjs, n, f"fedjaxsparse.{n}")
  text += _title("The structured-pruning trainers", "-")
  text += ("Auto-Train-Once and DHSPG (``fjs.PRUNING_TRAINERS``) return a trainer that "
           ":func:`fedjaxsparse.algorithms.ato.train` runs.\n\n")
  for n in fjs.PRUNING_TRAINERS:
    text += _entry(fjs, n, f"fedjaxsparse.{n}")
  text += _entry(fjs, "PRUNING_TRAINERS", "fedjaxsparse.PRUNING_TRAINERS")
  text += _title("A new cohort method", "-")
  text += ("A client update on the one cohort round (:doc:`/composing`).\n\n")
  for n in ("cohort_round", "ClientUpdate", "ServerPart"):
    text += _entry(fjs, n, f"fedjaxsparse.{n}")
  text += _title("Running and reading", "-")
  for n in ("Algorithm", "LossFn", "Model", "run", "Checkpointing", "run_batched",
            "global_params", "personal_params"):
    text += _entry(fjs, n, f"fedjaxsparse.{n}")
  text += _entry(fjs, "METHODS", "fedjaxsparse.METHODS")
  text += _entry(fjs, "__version__", "fedjaxsparse.__version__")
  text += _title("Namespaces", "-")
  for n in fjs.__all__:
    value = getattr(fjs, n)
    if isinstance(value, types.ModuleType) and value.__name__ == f"fedjaxsparse.{n}":
      text += f"* :doc:`fjs.{n} <{value.__name__}>`\n"
  text += "\nShort names for the namespaces of the pieces:\n\n"
  for n in fjs.__all__:
    value = getattr(fjs, n)
    if isinstance(value, types.ModuleType) and value.__name__ != f"fedjaxsparse.{n}":
      text += (f".. py:data:: {n}\n   :module: fedjaxsparse\n\n   The module "
               f":mod:`{value.__name__}` (:doc:`{value.__name__}`).\n\n")
  return text


def write_api(folder: str) -> list[str]:
  os.makedirs(folder, exist_ok=True)
  modules = public_modules()
  _write(os.path.join(folder, "fedjaxsparse.rst"), _top_page())
  for name in modules:
    _write(os.path.join(folder, name + ".rst"), _api_page(name))
  index = _title("API reference") + (
      "Everything a user types starts from ``import fedjaxsparse as fjs``. The first page is "
      "that public face; the others are its namespaces, by concept.\n\n"
      ".. toctree::\n   :maxdepth: 1\n\n   fedjaxsparse\n")
  index += "".join(f"   {m}\n" for m, _ in NAMESPACES)
  _write(os.path.join(folder, "index.rst"), index)
  return modules


# ------------------------------------------------------------------------------ the ledger
def ledger_items() -> list[dict]:
  path = os.path.join(DOCS, "reproduction.toml")
  if not os.path.exists(path):
    return []
  with open(path, "rb") as f:
    return tomllib.load(f)["item"]


def paper_configurations() -> dict[tuple[str, str], object]:
  """``{(experiment, paper name): PaperConfig}`` over every experiment."""
  from fedjaxsparse.harness.cli import experiments
  return {(e, p): pc for e, m in sorted(experiments().items())
          for p, pc in getattr(m, "PAPERS", {}).items()}


def ledger_problems() -> list[str]:
  """What the ledger and the code disagree on: a paper configuration no item names, an item
  naming an experiment or configuration that does not exist."""
  from fedjaxsparse.harness.cli import experiments
  found = experiments()
  configs = paper_configurations()
  named = set()
  problems = []
  for it in ledger_items():
    where = f"seed {it['seed']} {it['label']}"
    if it.get("experiment") and it["experiment"] not in found:
      problems.append(f"{where}: no experiment {it['experiment']!r}")
    for p in it.get("papers", []):
      if (it["experiment"], p) not in configs:
        problems.append(f"{where}: {it['experiment']} has no paper configuration {p!r}")
      named.add((it["experiment"], p))
  for (e, p), pc in configs.items():
    if (e, p) not in named:
      problems.append(f"{e} --paper {p} ({pc.source}) is missing from docs/reproduction.toml")
  return problems


DATA_ORDER = ("real offline", "real with files", "stand-in")


def ledger_words(item: dict, configs: dict | None = None) -> tuple[str, str]:
  """``(data, scale)`` of a ledger item: typed in the TOML for an item without paper
  configurations; generated from its configurations otherwise — the data word of the least
  available data set among them (offline < with files < stand-in) and ``"reduced"`` when any
  of them runs less than the paper (``PaperConfig.reduced``)."""
  if not item.get("papers"):
    return item.get("data", ""), item.get("scale", "")
  configs = paper_configurations() if configs is None else configs
  pcs = [configs[(item["experiment"], p)] for p in item["papers"]]
  data = max((pc.data_status for pc in pcs), key=DATA_ORDER.index)
  scale = "reduced" if any(pc.reduced for pc in pcs) else "paper protocol"
  return data, scale


def ledger_status(item: dict, configs: dict | None = None) -> str:
  """An item's status: typed for an item without paper configurations; generated otherwise —
  ``"partial"`` when any of its configurations says what it leaves out
  (``PaperConfig.missing``), else ``"reproduced"``."""
  if not item.get("papers"):
    return item["status"]
  configs = paper_configurations() if configs is None else configs
  pcs = [configs[(item["experiment"], p)] for p in item["papers"]]
  return "partial" if any(pc.status == "partial" for pc in pcs) else "reproduced"


def configuration_text(item: dict, configs: dict | None = None) -> str:
  """What an item's paper configurations fix and where they differ from the paper: each
  distinct set of options, deviations and reductions once, with the configurations it is
  for."""
  configs = paper_configurations() if configs is None else configs
  groups: dict[str, list[str]] = {}
  for p in item.get("papers", []):
    pc = configs[(item["experiment"], p)]
    opts = ", ".join(f"{k}={_plain(v)}" for k, v in pc.options.items())
    text = (f"data `{pc.dataset}` ({pc.data_status}), {pc.clients} clients, {pc.rounds} rounds"
            + (f"; {opts}" if opts else "")
            + (f"; reduced: {pc.reduced}" if pc.reduced else "")
            + (f"; not produced: {pc.missing}" if pc.missing else "")
            + (f"; deviations: {pc.deviations}" if pc.deviations else ""))
    groups.setdefault(text, []).append(p)
  return " ".join(f"`--paper {' / '.join(ps)}`: {t}." for t, ps in groups.items())


def _plain(v) -> str:
  if isinstance(v, (list, tuple)):
    return "[" + ", ".join(_plain(x) for x in v) + "]"
  return f"{v:g}" if isinstance(v, float) else str(v)


def _cell(text) -> str:
  return str(text).replace("|", "\\|").replace("\n", " ")


def _family_of(experiment: str) -> str | None:
  for slug, _, _, _, exps, _ in FAMILIES:
    if experiment in exps:
      return slug
  return None


# what a ledger status says: whether the protocol is implemented, not whether our numbers
# match the paper's (a family page shows measured paper-scale numbers where committed)
STATUS_TEXT = {"reproduced": "protocol implemented", "partial": "partly implemented",
               "not reproduced": "not implemented", "no results": "no results to reproduce"}


def reproduction_page() -> str:
  items = ledger_items()
  configs = paper_configurations()
  counts = {}
  for it in items:
    word = STATUS_TEXT[ledger_status(it, configs)]
    counts[word] = counts.get(word, 0) + 1
  text = "# Reproducing the papers\n\n"
  text += (f"Every table and figure of the seed papers: {len(items)} items — "
           + ", ".join(f"{n} {s}" for s, n in sorted(counts.items(), key=lambda x: -x[1]))
           + ". Generated from `docs/reproduction.toml` and the experiments' paper "
           "configurations (`fedjaxsparse run EXPERIMENT --paper NAME`); a test fails when "
           "an experiment's paper configuration is missing here. *data*: real offline "
           "(shipped), real with files (the loader needs your files; a labelled stand-in of "
           "the same shape runs without them), stand-in. *scale*: the paper's protocol or a "
           "reduced CPU version.\n\n")
  for seed in sorted({it["seed"] for it in items}):
    text += f"## Seed {seed}\n\n"
    for it in (i for i in items if i["seed"] == seed):
      fam = _family_of(it.get("experiment", ""))
      where = ", ".join(x for x in ledger_words(it, configs) if x)
      results = [r for r in (_committed_result(it["experiment"], p)
                             for p in it.get("papers", [])) if r]
      status = STATUS_TEXT[ledger_status(it, configs)] + "".join(
          f"; measured ({'on a stand-in' if r.get('standin') else 'real data'})"
          for r in results[:1])
      text += (f"- **{it['label']}** — {it['caption']}. *{status}*"
               + (f" · {where}" if where else "")
               + (f" · [family page](papers/{fam}.md)" if fam else ""))
      if it.get("command"):
        text += f"\\\n  `{it['command']}`"
      if it.get("note"):
        text += f"\\\n  {it['note']}"
      if it.get("papers"):
        text += f"\\\n  {configuration_text(it, configs)}"
      text += "\n\n"
  return text


# ------------------------------------------------------------------------- family pages
def _committed_result(experiment: str, paper: str) -> dict | None:
  path = os.path.join(DOCS, "measured", f"{experiment}__{paper}.json")
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def _paper_numbers(experiment: str, paper: str, pc) -> str:
  """The paper's printed numbers (``pc.paper``) beside ours from a committed result."""
  measured = _committed_result(experiment, paper)
  ours = {}
  if measured is not None:
    for row in measured.get("paper_comparison", []):
      name = row.get("method")
      for k, v in row.items():
        if k.startswith("ours "):
          ours[(name, k[5:])] = v
  columns = list(pc.paper)
  methods = []
  for col in columns:
    for m in pc.paper[col]:
      if m not in methods:
        methods.append(m)
  text = f"Paper's numbers ({_cell(pc.unit)})"
  text += (":" if measured is None else " beside ours (committed result "
           f"`docs/measured/{experiment}__{paper}.json`):") + "\n\n"
  if measured is not None:
    data = measured.get("standin") or "the real data"
    text += (f"Measured with `{measured['command']}` on {data} ({measured.get('jax_backend')})."
             f" {measured.get('note', '')}\n\n")
  head = ["method"] + [f"{c} (paper)" for c in columns]
  if measured is not None:
    head = ["method"] + [h for c in columns for h in (f"{c} (paper)", f"{c} (ours)")]
  text += "| " + " | ".join(_cell(h) for h in head) + " |\n" + "|---" * len(head) + "|\n"
  for m in methods:
    cells = [m]
    for c in columns:
      cells.append(pc.paper[c].get(m, ""))
      if measured is not None:
        cells.append(ours.get((m, c), ""))
    text += "| " + " | ".join(_cell(x) for x in cells) + " |\n"
  if measured is None:
    text += ("\nOurs: not measured at paper scale yet — run the command above; no "
             "result is shown that was not measured.\n")
  return text + "\n"


def family_page(slug, title, paper, modules, exps, notebooks) -> str:
  from fedjaxsparse.harness.cli import experiments
  found = experiments()
  configs = paper_configurations()
  text = f"# {title}\n\n"
  text += (f"The paper: {paper}. The full citations, the method in a few sentences, its update rules and "
           "the choices the library made where the paper is silent or wrong are in the "
           "module docstrings below; the constructors follow with every option. The update "
           "rules come first, as the library computes them.\n\n")
  rules = os.path.join(DOCS, "rules", f"{slug}.md")
  if os.path.exists(rules):
    with open(rules, encoding="utf-8") as f:
      text += "## Update rules\n\n" + f.read().strip() + "\n\n"
  mods = [f"fedjaxsparse.algorithms.{m}" for m in modules] or list(POSTTRAIN_MODULES)
  for name in mods:
    module = importlib.import_module(name)
    text += f"## `{name.replace('fedjaxsparse', 'fjs', 1)}`\n\n"
    text += f"```{{eval-rst}}\n.. automodule:: {name}\n   :no-members:\n   :no-index:\n```\n\n"
    entries = "".join(_entry(module, n, f"{name}.{n}", index=False)
                      for n in public_names(module) if inspect.isfunction(getattr(module, n)))
    if entries:
      text += "### Constructors\n\n```{eval-rst}\n" + entries + "```\n\n"
  text += "## Experiments\n\n"
  for e in exps:
    m = found[e]
    text += f"### `fedjaxsparse run {e}`\n\n{m.DESCRIPTION}\n\n"
    text += (f"- quick check: `fedjaxsparse run {e} --quick`\n"
             f"- default run: {getattr(m, 'RUNTIME', '')}\n"
             f"- budget: {getattr(m, 'BUDGET', '')}\n\n")
    text += f"```{{eval-rst}}\n.. automodule:: {m.__name__}\n   :no-members:\n   :no-index:\n```\n\n"
    for (ex, p), pc in configs.items():
      if ex != e:
        continue
      text += f"#### `--paper {p}`: {_cell(pc.source)}\n\n"
      text += (f"`fedjaxsparse run {e} --paper {p}` — data `{pc.dataset}`"
               + (f" (stand-in without the files: `{pc.standin}`)" if pc.standin else "")
               + f", {pc.clients} clients, {pc.rounds} rounds.")
      if pc.deviations:
        text += f" Deviations from the paper: {pc.deviations}"
      text += "\n\n" + _paper_numbers(e, p, pc)
  if notebooks:
    text += "## Notebooks\n\n" + "".join(f"- [{n}](../notebooks/{n}.ipynb)\n"
                                         for n in notebooks) + "\n"
  return text


def write_pages(app=None) -> None:
  if os.path.isdir(GENERATED):
    shutil.rmtree(GENERATED)
  write_api(os.path.join(GENERATED, "api"))
  _write(os.path.join(GENERATED, "reproduction.md"), reproduction_page())
  papers = os.path.join(GENERATED, "papers")
  index = "# The paper families\n\n```{toctree}\n:maxdepth: 1\n\n"
  for fam in FAMILIES:
    _write(os.path.join(papers, f"{fam[0]}.md"), family_page(*fam))
    index += f"{fam[0]}\n"
  _write(os.path.join(papers, "index.md"), index + "```\n")
  nb = os.path.join(GENERATED, "notebooks")
  os.makedirs(nb, exist_ok=True)
  for n in sorted(os.listdir(os.path.join(ROOT, "notebooks"))):
    if n.endswith(".ipynb"):
      shutil.copy(os.path.join(ROOT, "notebooks", n), nb)
  problems = ledger_problems()
  if problems and app is not None:
    from sphinx.util import logging
    for p in problems:
      logging.getLogger(__name__).warning(f"reproduction ledger: {p}")


def _write(path: str, text: str) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    f.write(text)


def literal_blocks(app, what, name, obj, options, lines) -> None:
  """Plain-text docstrings introduce pseudocode and formulas with a line ending in ``:``
  followed by an indented block; reStructuredText would render that block as a quotation
  with its alignment lost. Such a block becomes a literal block (``::``), as written."""
  def indent(line):
    return len(line) - len(line.lstrip())
  for i in range(len(lines) - 2):
    line = lines[i].rstrip()
    if (line.endswith(":") and not line.endswith("::") and line.strip()
        and not line.lstrip().startswith((":", "..")) and not lines[i + 1].strip()
        and lines[i + 2].strip() and indent(lines[i + 2]) > indent(line)
        and not lines[i + 2].lstrip().startswith(("* ", "- ", ":", ".."))):
      lines[i] = line + ":"


def setup(app):
  app.connect("builder-inited", write_pages)
  app.connect("autodoc-process-docstring", literal_blocks, priority=900)  # after napoleon
  return {"version": "1", "parallel_read_safe": True}
