"""SymWanda (Yi and Richtárik 2025; chapter 6 of Kai Yi's dissertation): post-training pruning of
a language model, Tables 6.2-6.5 and E.1-E.4, perplexity beside the paper's numbers.

Model (``--set model=``):

* ``shakespeare`` (default, offline): a LLaMA-style byte-level decoder (RMSNorm, RoPE, SwiGLU,
  grouped-query attention; ``hidden``/``layers`` options) that this library trains on the
  bundled Shakespeare training plays (``train_steps``), saved as a Hugging Face checkpoint in
  ``<out>/symwanda_lm/model`` and reused while its configuration is unchanged. Calibration
  windows come from the training plays, perplexity from the test plays. **Its perplexities are
  not comparable with the paper's LLaMA/OPT numbers**, which are printed beside ours for the
  claims' *directions* only.
* a local Hugging Face checkpoint directory (LLaMA-2/3 or OPT, safetensors): the same commands,
  with ``tokenizer`` (default: the checkpoint's ``tokenizer.json``), ``wikitext`` (the raw
  WikiText-2 test file) and ``c4`` (the first C4 training shard) given locally — the paper's
  protocol: 128 C4 windows of 2048 tokens, seed 0, WikiText-2 raw test perplexity with stride
  2048 (``nsamples``, ``seq_len``).

Studies (``--set study=``): ``table62`` (magnitude, Wanda, RIA, stochRIA β = 0.1 over ``seeds``,
at 50 %, 2:4, 4:8; α = 1), ``table63`` (α ∈ {0, 0.5, 1, 2} for Wanda, Col-Sum = relative over
inputs, Row-Sum = relative over outputs, RIA), ``table64`` (50/60/70 %), ``table65`` (60 %,
α = 0.5, bases magnitude/Wanda/RIA × none/DSnoT/R²-DSnoT), ``tableE1`` (ℓp, p ∈ {1,2,3,4,0,∞}),
``tableE2`` (re-weightings S1-S4, α = 0.5), ``tableE3`` (stochRIA β sweep), ``tableE4``
(R²-DSnoT ablation, 60 %), ``table66`` (zero-shot accuracy of the dense and the 60 %-pruned
magnitude and RIA models, each alone, with DSnoT and with R²-DSnoT, on BoolQ, RTE, HellaSwag,
WinoGrande, ARC-e, ARC-c and OpenBookQA in the LM Evaluation Harness's protocol —
:mod:`fedjaxsparse.pruning.zeroshot` — from the tasks' public JSONL files in ``zeroshot_dir``;
the paper's Table 6.6 printed beside, its means recomputed). Every pruned model is calibrated block-sequentially; the table also
gives the mean relative reconstruction error ``‖X(W−W̃)‖²/‖XW‖²`` over the linear layers.

The comparison group of unstructured masks is not stated in the paper; by
default it is per layer, as in RIA's code (``--per_outneuron`` off), which the chapter builds
on — its Wanda (7.79 on LLaMA2-7B at 50 %) is not Wanda's own per-output 6.42. Per output,
Col-Sum (``|W_jk|/‖W_{:k}‖₁·‖X_j‖^α``) is a per-neuron constant times Wanda and ranks exactly
like it, and stochRIA's column term has no effect. The DSnoT studies rank per output neuron,
as DSnoT's code does (which is also why Table 6.5's Wanda differs from Table 6.4's).

Source for the team: seed 001 chapter 6; spec ``seed001_ch4_ch6.md`` §B.6-§B.7, §0.2.14 (comparison
group).
"""
from __future__ import annotations

import dataclasses
import json
import os

import jax
import numpy as np

from fedjaxsparse.errors import ConfigError
from fedjaxsparse.pruning import dsnot, lm, scores, zeroshot
from fedjaxsparse.models import hf
from fedjaxsparse.pruning import sequential as SQ
from fedjaxsparse.harness.options import Config, Option
from fedjaxsparse.harness.running import output_dir
from fedjaxsparse.harness.experiment import Context, Trial, TrialRun, declared
from fedjaxsparse.harness.protocol import PaperConfig
from fedjaxsparse.harness.report import Figure, Table
from fedjaxsparse.models.transformer import TransformerConfig

NAME = "symwanda_lm"
DESCRIPTION = "SymWanda (Yi and Richtárik 2025): post-training pruning of a language model"
DEFAULTS = dict(rounds=None, eval_every=None)
# --quick: the table's shape in well under two minutes on 2 CPU cores (QUICK_RUNTIME)
QUICK = dict(options=dict(hidden=32, layers=1, train_steps=20, nsamples=4, seq_len=32,
                          eval_tokens=2048))
QUICK_RUNTIME = "measured 19 s on 2 CPU cores (a fresh process, XLA's default flags)"
BUDGET = "none (one-shot pruning; the model's own training is measured in steps)"
RUNTIME = ("about 10 minutes on 2 CPU cores for the trained Shakespeare model (measured "
           "618 s: training it, then the default study)")
STUDIES = ("table62", "table63", "table64", "table65", "tableE1", "tableE2", "tableE3", "tableE4",
           "table66")
ZERO_SHOT = ("BoolQ", "RTE", "HellaSwag", "WinoGrande", "ARC-e", "ARC-c", "OBQA")
"""Table 6.6's columns, in the order of :data:`fedjaxsparse.pruning.zeroshot.TASKS`."""
PAPER_MODELS = ("llama2-7b", "llama2-13b", "llama3-8b", "opt-1.3b")

OPTIONS = (
    Option("study", "table62", "which table", choices=STUDIES),
    Option("model", "shakespeare", "'shakespeare' (trained here) or a local HF checkpoint dir",
           kind="str"),
    Option("tokenizer", "", "tokenizer.json path (default: the checkpoint's; byte-level for "
           "shakespeare)", kind="str"),
    Option("wikitext", "", "WikiText-2 raw test file (wiki.test.raw) for a real checkpoint",
           kind="str"),
    Option("c4", "", "C4 shard (c4-train.00000-of-01024.json.gz) for calibration", kind="str"),
    Option("nsamples", None, "calibration windows (default: 64 for shakespeare, the paper's 128 "
           "for a checkpoint)", kind="int", low=1),
    Option("seq_len", None, "calibration / evaluation context length (default: 128 for "
           "shakespeare, the paper's 2048 for a checkpoint)", kind="int", low=2),
    Option("eval_tokens", None, "at most this many test tokens (0: all; default: 131072 for "
           "shakespeare, all for a checkpoint)", kind="int", low=0),
    Option("dsnot_cycles", None, "DSnoT's max cycles (default: the paper's 50 for a checkpoint; "
           "for shakespeare ⌈50·hidden/4096⌉, the same fraction of a row that 50 swaps are in "
           "LLaMA-7B's 4096-wide layers — 50 swaps would replace every kept weight of a "
           "128-wide row)", kind="int", low=0),
    Option("group", "auto", "comparison group of unstructured masks ('auto': per_layer as RIA's "
           "code, on which the paper builds; per_output for the DSnoT studies, as DSnoT's code)",
           choices=("auto", "per_layer", "per_output", "per_input")),
    Option("seeds", 5, "stochRIA trials (Table 6.2: 5; Table 6.4: 3)", low=1),
    Option("hidden", 128, "shakespeare model width", low=8),
    Option("layers", 4, "shakespeare model depth", low=1),
    Option("train_steps", 1500, "shakespeare model training steps (batch 32)", low=1),
    Option("zeroshot_dir", "", "table66: a folder with the tasks' public JSONL files, named "
           "boolq.jsonl, rte.jsonl, hellaswag.jsonl, winogrande.jsonl, arc_easy.jsonl, "
           "arc_challenge.jsonl, openbookqa.jsonl (the tasks present are evaluated)", kind="str"),
    Option("zeroshot_limit", 0, "table66: at most this many examples per task (0: all)", low=0,
           identity=False),
    Option("paper_model", "auto", "which paper column to print beside ours ('auto': llama3-8b "
           "for tableE4, which has no other, else llama2-7b)", choices=("auto",) + PAPER_MODELS,
           identity=False),
)


def _perplexity_tables(dense: tuple, tables: dict) -> dict:
  """The paper's WikiText-2 perplexity tables as paper configurations, one per study:
  ``paper = {model: {"method / setting": perplexity}}`` over :data:`PAPER_MODELS` (``dense``:
  the dense models' row; a ``None`` cell, not printed, is left out)."""
  out = {}
  for study, rows in tables.items():
    paper = {m: {"Dense / -": d} for m, d in zip(PAPER_MODELS, dense)}
    for (method, setting), values in rows.items():
      for m, v in zip(PAPER_MODELS, values):
        if v is not None:
          paper[m][f"{method} / {setting}"] = v
    out[study] = PaperConfig(
        study, f"K. Yi's dissertation (SymWanda) {TITLES[study]}", dataset="wikitext2",
        standin="shakespeare", clients=1, rounds=1, eval_every=1, options={"study": study},
        unit="WikiText-2 perplexity", paper=paper,
        deviations="needs the checkpoint (--set model=DIR), WikiText-2's wiki.test.raw and a C4 "
                   "shard; without them a byte-level Shakespeare model trained here stands in "
                   "(its perplexities compare in direction only)")
  return out


def _zero_shot_table(tables: dict) -> PaperConfig:
  """Table 6.6 as a paper configuration: ``paper = {"model task": {"method / setting": %}}``."""
  paper = {f"{model} {task}": {f"{m} / {s}": v[i] for (m, s), v in rows.items()}
           for model, rows in tables.items() for i, task in enumerate(ZERO_SHOT)}
  return PaperConfig(
      "table66", f"K. Yi's dissertation (SymWanda) {TITLES['table66']}", dataset="wikitext2",
      standin="shakespeare", clients=1, rounds=1, eval_every=1, options={"study": "table66"},
      unit="zero-shot accuracy %", paper=paper,
      deviations="needs the checkpoint, a C4 shard and the tasks' JSONL files "
                 "(--set zeroshot_dir=DIR); the paper's printed means for some LLaMA2-7b rows "
                 "are not the task means (recomputed here)")


TITLES = {"table62": "Table 6.2 (50 % unstructured, N:M)", "table63": "Table 6.3 (α of Wanda, "
          "Col-Sum, Row-Sum, RIA)", "table64": "Table 6.4 (50/60/70 %)",
          "table65": "Table 6.5 (DSnoT and R²-DSnoT, 60 %)", "tableE1": "Table E.1 (ℓp RI(A))",
          "tableE2": "Table E.2 (ℓ1 RIA variants)", "tableE3": "Table E.3 (stochRIA's β)",
          "tableE4": "Table E.4 (R²-DSnoT ablations, LLaMA3-8b)",
          "table66": "Table 6.6 (zero-shot accuracy, 60 % unstructured)"}
PAPERS = {**_perplexity_tables(
    (5.47, 4.88, 6.14, 14.62),  # the dense models (L2-7b, L2-13b, L3-8b, OPT)
    # {study: {(method, setting): (LLaMA2-7b, LLaMA2-13b, LLaMA3-8b, OPT-1.3b)}}
    {
        "table62": {("Magnitude", "50%"): (16.03, 6.83, 205.44, 1712.39),
                    ("Wanda", "50%"): (7.79, 6.28, 10.81, 22.19),
                    ("RIA", "50%"): (6.88, 5.95, 9.44, 18.94),
                    ("stochRIA", "50%"): (6.91, 5.95, 9.46, 18.78),
                    ("RIA", "2:4"): (11.31, 8.40, 22.89, 27.43),
                    ("stochRIA", "2:4"): (11.41, 8.44, 23.74, 26.78),
                    ("RIA", "4:8"): (8.39, 6.74, 13.77, 21.59),
                    ("stochRIA", "4:8"): (8.44, 6.74, 13.93, 21.49)},
        "table63": {(m, f"α={a:g}"): tuple(v[i::4]) for m, v in {
            "Wanda": (16.03, 7.60, 7.79, 8.66, 6.83, 6.17, 6.28, 7.15, 205.44, 10.66, 10.81, 12.98,
                      1712.39, 22.14, 22.19, 24.74),
            "Col-Sum": (11.59, 6.83, 6.91, 7.46, 6.39, 5.87, 5.96, 6.55, 59.41, 9.53, 9.69, 12.01,
                        1062.66, 18.28, 18.41, 22.25),
            "Row-Sum": (14.93, 7.49, 7.51, 8.01, 6.74, 6.13, 6.24, 7.01, 17.80, 10.50, 10.55, 11.79,
                        141.92, 22.09, 22.47, 26.62),
            "RIA": (7.39, 6.81, 6.88, 7.37, 5.95, 5.93, 5.95, 6.56, 12.07, 9.34, 9.44, 10.67, 64.70,
                    18.08, 18.94, 23.39)}.items() for i, a in enumerate((0, 0.5, 1, 2))},
        "table64": {("Wanda", "50%"): (7.79, 6.28, 10.81, 22.19), ("RIA", "50%"): (6.88, 5.95, 9.44,
                    18.94), ("stochRIA", "50%"): (6.91, 5.95, 9.46, 18.78),
                    ("Wanda", "60%"): (15.30, 9.63, 27.55, 38.81), ("RIA", "60%"): (10.39, 7.84,
                    19.52, 26.22), ("stochRIA", "60%"): (10.62, 7.97, 19.04, 25.93),
                    ("Wanda", "70%"): (214.93, 104.97, 412.90, 231.15), ("RIA", "70%"): (68.75,
                    51.96, 169.51, 98.52), ("stochRIA", "70%"): (72.85, 62.15, 155.34, 93.29)},
        "table65": {("Magnitude", "-"): (6.9e3, 10.10, 4.05e5, None),
                    ("Magnitude", "DSnoT"): (4.1e3, 10.19, 4.18e4, None),
                    ("Magnitude", "R²-DSnoT"): (2.4e2, 10.09, 1.44e4, None),
                    ("Wanda", "-"): (9.72, 7.75, 21.36, None), ("Wanda", "DSnoT"): (10.23, 7.69,
                    20.70, None), ("Wanda", "R²-DSnoT"): (10.08, 7.69, 20.50, None),
                    ("RIA", "-"): (10.29, 7.85, 21.09, None), ("RIA", "DSnoT"): (9.97, 7.82, 19.51,
                    None), ("RIA", "R²-DSnoT"): (9.96, 7.78, 18.99, None)},
        "tableE1": {("ℓp RI(A)", f"p={p}"): v for p, v in {
            "1": (6.88, 5.95, 9.44, 18.95), "2": (6.90, 5.96, 9.48, 19.02),
            "3": (6.95, 6.01, 9.57, 19.66), "4": (7.12, 6.08, 9.92, 20.77),
            "0": (7.78, 6.28, 10.81, 22.17), "inf": (8.60, 6.80, 11.28, 24.92)}.items()},
        "tableE2": {("ℓ1 RIA", s): v for s, v in {
            "S1": (6.81, 5.83, 9.34, 18.08), "S2": (6.99, 5.91, 9.58, 19.01),
            "S3": (9.32, 6.87, 17.31, 31.66), "S4": (14.51, 20.78, 30.47, 53.17)}.items()},
        "tableE3": {("stochRIA", f"β={b:g}"): v for b, v in {
            1: (6.91, 5.95, 9.45, 18.88), 0.9: (6.91, 5.95, 9.43, 18.87),
            0.5: (6.90, 5.95, 9.42, 18.84), 0.1: (6.91, 5.95, 9.46, 18.78),
            0.05: (6.91, 5.96, 9.47, 18.91), 0.01: (6.98, 6.00, 9.69, 19.36)}.items()},
        # Table E.4 is LLaMA3-8b only. Its base labels are swapped (spec §0.2.9; see
        # dsnot.r2_dsnot): the rows it prints under "Wanda" are the RIA base's, and vice versa.
        "tableE4": {(b, st): (None, None, v, None) for (b, st), v in {
            ("RIA base", "best"): 18.99, ("RIA base", "p=1"): 19.04,
            ("RIA base", "p=inf"): 18.99, ("RIA base", "γ2=0"): 18.99,
            ("RIA base", "γ2=1e-3"): 18.99, ("RIA base", "no relative"): 19.49,
            ("RIA base", "prune relative only"): 19.25, ("RIA base", "both relative"): 19.63,
            ("Wanda base", "best"): 20.50, ("Wanda base", "p=1"): 25.61,
            ("Wanda base", "p=inf"): 20.51, ("Wanda base", "γ2=0"): 20.51,
            ("Wanda base", "γ2=1e-4"): 20.52, ("Wanda base", "no relative"): 21.33,
            ("Wanda base", "grow relative only"): 22.16,
            ("Wanda base", "both relative"): 22.60}.items()},
    }),
    "table66": _zero_shot_table(  # {model: {(method, setting): one value per ZERO_SHOT task}}
        {  # Table 6.6: zero-shot accuracy %, 60 % unstructured (seed 001 l. 1920-1936)
        "llama2-7b": {("Dense", "-"): (77.7, 62.8, 57.2, 69.2, 76.4, 43.4, 31.4),
                      ("Magnitude", "-"): (41.2, 51.3, 37.0, 55.7, 50.0, 27.0, 16.2),
                      ("Magnitude", "DSnoT"): (43.2, 54.2, 38.4, 56.4, 53.3, 27.7, 20.6),
                      ("Magnitude", "R²-DSnoT"): (50.9, 52.0, 39.8, 56.8, 56.6, 28.3, 23.4),
                      ("RIA", "-"): (66.1, 53.1, 43.5, 63.2, 64.6, 30.2, 26.0),
                      ("RIA", "DSnoT"): (65.5, 53.4, 44.7, 64.6, 65.3, 31.7, 26.4),
                      ("RIA", "R²-DSnoT"): (65.2, 53.8, 44.7, 65.1, 65.0, 31.6, 27.0)},
        "llama3-8b": {("Dense", "-"): (81.3, 69.7, 60.1, 73.0, 80.1, 50.4, 34.8),
                      ("Magnitude", "-"): (37.8, 52.7, 30.7, 51.0, 39.7, 23.4, 14.4),
                      ("Magnitude", "DSnoT"): (37.8, 52.7, 33.4, 49.9, 43.5, 23.0, 14.8),
                      ("Magnitude", "R²-DSnoT"): (37.8, 52.7, 33.1, 52.1, 43.9, 23.6, 14.8),
                      ("RIA", "-"): (70.2, 53.4, 39.7, 61.7, 61.1, 28.6, 20.4),
                      ("RIA", "DSnoT"): (70.7, 53.4, 40.3, 61.3, 61.7, 28.0, 20.0),
                      ("RIA", "R²-DSnoT"): (70.4, 53.4, 40.3, 61.9, 61.2, 28.3, 21.0)}})}


def _shakespeare_model(cfg: Config, opts: dict) -> tuple[str, dict]:
  """Trains (or reuses) the byte-level LLaMA-style model; returns its checkpoint dir."""
  h = opts["hidden"]
  tcfg = TransformerConfig(arch="llama", vocab_size=256, hidden_size=h,
                           intermediate_size=int(round(h * 8 / 3 / 8)) * 8,
                           num_layers=opts["layers"], num_heads=max(1, h // 32),
                           num_kv_heads=max(1, h // 64), max_positions=max(256, opts["seq_len"]))
  recipe = {"config": dataclasses.asdict(tcfg), "steps": opts["train_steps"], "batch": 32,
            "seq_len": opts["seq_len"], "lr": 3e-3, "seed": cfg.seed, "data": "bundled plays"}
  path = os.path.join(output_dir(cfg, NAME), "model")
  meta = os.path.join(path, "fedjaxsparse_training.json")
  if os.path.isfile(meta) and json.load(open(meta))["recipe"] == recipe and not cfg.overwrite:
    return path, json.load(open(meta))
  ids = lm.ByteTokenizer().encode(lm.shakespeare_splits()["train"])
  params, losses = lm.train(tcfg, ids, steps=recipe["steps"], batch_size=32,
                            seq_len=recipe["seq_len"], lr=recipe["lr"], seed=cfg.seed,
                            log_every=max(1, recipe["steps"] // 20), progress=cfg.progress)
  hf.save(path, tcfg, jax.tree.map(np.asarray, params))
  info = {"recipe": recipe, "train_loss": losses}
  json.dump(info, open(meta, "w"), indent=1)
  return path, info


def _data(opts: dict) -> tuple[np.ndarray, np.ndarray, str]:
  """(calibration windows, evaluation windows, description of the text protocol)."""
  t = opts["seq_len"]
  if opts["model"] == "shakespeare":
    tok = lm.ByteTokenizer()
    sp = lm.shakespeare_splits()
    docs, test, what = [sp["train"]], sp["test"], "bundled Shakespeare (train plays → test plays)"
  else:
    tok = lm.tokenizer(opts["tokenizer"] or opts["model"])
    docs = lm.c4_documents(opts["c4"]) if opts["c4"] else None  # the whole shard, as Wanda
    if docs is None:
      raise ValueError("option 'c4' must name the C4 shard for a real checkpoint; "
                       f"{lm.C4_HOW_TO}.")
    test = lm.wikitext2_test(opts["wikitext"]) if opts["wikitext"] else None
    if test is None:
      raise ValueError(f"option 'wikitext' must name the WikiText-2 test file; "
                       f"{lm.WIKITEXT_HOW_TO}.")
    what = "C4 shard 0 → WikiText-2 raw test (joined with \\n\\n)"
  calib = lm.calibration_windows(docs, tok, opts["nsamples"], t, seed=0)
  ids = tok.encode(test)
  if opts["eval_tokens"]:
    ids = ids[:opts["eval_tokens"]]
  return calib, lm.eval_windows(ids, t), what


def _runs(study: str, opts: dict) -> list[tuple[str, str, dict, int]]:
  """``(method, setting, prune kwargs, trials)`` for a study."""
  t = opts["seq_len"]
  cyc = dict(error_scale=t, max_cycles=opts["dsnot_cycles"])
  sb = scores.by_name
  seeds = opts["seeds"]

  def sp(x):
    return {"sparsity": x} if isinstance(x, float) else {"nm": x}

  label = lambda x: f"{x:.0%}" if isinstance(x, float) else f"{x[0]}:{x[1]}"  # noqa: E731
  runs = []
  if study == "table62":
    for x in (0.5, (2, 4), (4, 8)):
      for name, fn, k in (("Magnitude", sb("magnitude"), 1), ("Wanda", sb("wanda", alpha=1.0), 1),
                          ("RIA", sb("ria", alpha=1.0), 1),
                          ("stochRIA", sb("stochria", alpha=1.0, beta=0.1), seeds)):
        runs.append((name, label(x), dict(score_fn=fn, **sp(x)), k))
  elif study == "table63":
    for a in (0.0, 0.5, 1.0, 2.0):
      for name, s in (("Wanda", "wanda"), ("Col-Sum", "relative_inputs"),
                      ("Row-Sum", "relative_outputs"), ("RIA", "ria")):
        runs.append((name, f"α={a:g}", dict(score_fn=sb(s, alpha=a), sparsity=0.5), 1))
  elif study == "table64":
    for x in (0.5, 0.6, 0.7):
      for name, fn, k in (("Wanda", sb("wanda", alpha=1.0), 1), ("RIA", sb("ria", alpha=1.0), 1),
                          ("stochRIA", sb("stochria", alpha=1.0, beta=0.1), min(seeds, 3))):
        runs.append((name, label(x), dict(score_fn=fn, sparsity=x), k))
  elif study == "table65":
    for name, s in (("Magnitude", "magnitude"), ("Wanda", "wanda"), ("RIA", "ria")):
      fn = sb(s, alpha=0.5)
      base = "ria" if s == "ria" else "wanda"
      for ft, ref in (("-", None), ("DSnoT", dsnot.dsnot(**cyc)),
                      ("R²-DSnoT", dsnot.r2_dsnot(base, **cyc))):
        runs.append((name, ft, dict(score_fn=fn, sparsity=0.6, refine=ref), 1))
  elif study == "tableE1":
    for p in ("1", "2", "3", "4", "0", "inf"):
      runs.append(("ℓp RI(A)", f"p={p}", dict(score_fn=sb("lp", p=float(p), alpha=1.0),
                                               sparsity=0.5), 1))
  elif study == "tableE2":
    for v in ("S1", "S2", "S3", "S4"):
      runs.append(("ℓ1 RIA", v, dict(score_fn=sb("lp", p=1.0, variant=v, alpha=0.5),
                                     sparsity=0.5), 1))
  elif study == "tableE3":
    for b in (1.0, 0.9, 0.5, 0.1, 0.05, 0.01):
      runs.append(("stochRIA", f"β={b:g}", dict(score_fn=sb("stochria", alpha=1.0, beta=b),
                                                sparsity=0.5), seeds))
  elif study == "table66":   # Table 6.5's magnitude and RIA rows, zero-shot
    for name, s in (("Magnitude", "magnitude"), ("RIA", "ria")):
      fn = sb(s, alpha=0.5)
      for ft, ref in (("-", None), ("DSnoT", dsnot.dsnot(**cyc)),
                      ("R²-DSnoT", dsnot.r2_dsnot("ria", **cyc))):
        runs.append((name, ft, dict(score_fn=fn, sparsity=0.6, refine=ref), 1))
  elif study == "tableE4":
    for base in ("Wanda base", "RIA base"):
      key = "wanda" if base.startswith("Wanda") else "ria"
      best = dsnot.r2_dsnot(key, **cyc)
      other_gamma = "1e-4" if key == "wanda" else "1e-3"
      one = "grow relative only" if key == "wanda" else "prune relative only"
      variants = {"best": best, "p=1": best._replace(p=1.0), "p=inf": best._replace(p=np.inf),
                  "γ2=0": best._replace(gamma_prune=0.0),
                  f"γ2={other_gamma}": best._replace(gamma_prune=float(other_gamma)),
                  "no relative": best._replace(grow_relative=False, prune_relative=False),
                  one: best._replace(grow_relative=not best.grow_relative,
                                     prune_relative=not best.prune_relative),
                  "both relative": best._replace(grow_relative=True, prune_relative=True)}
      for setting, ref in variants.items():
        runs.append((base, setting, dict(score_fn=sb(key, alpha=0.5), sparsity=0.6,
                                         refine=ref), 1))
  return runs


def _defaults(opts: dict) -> dict:
  toy = opts["model"] == "shakespeare"
  fill = {"nsamples": 64 if toy else 128, "seq_len": 128 if toy else 2048,
          "eval_tokens": 131072 if toy else 0,
          "dsnot_cycles": -(-50 * opts["hidden"] // 4096) if toy else 50}
  opts = {**opts, **{k: v for k, v in fill.items() if opts[k] is None}}
  refines = opts["study"] in ("table65", "tableE4", "table66")
  if opts["paper_model"] == "auto":
    opts["paper_model"] = "llama3-8b" if opts["study"] == "tableE4" else "llama2-7b"
  if opts["group"] == "auto":
    opts["group"] = "per_output" if refines else "per_layer"
  elif refines and opts["group"] != "per_output":
    raise ValueError(f"option 'group' must be per_output for {opts['study']} (DSnoT refines "
                     f"per output neuron), got {opts['group']!r}.")
  return opts


def setup(cfg: Config, opts: dict) -> Context:
  """The model (trained once on the bundled plays, or a local checkpoint), the calibration
  and evaluation windows (printed once); ``extra["opts"]``: the options with the defaults of
  the model filled in."""
  opts = _defaults(opts)
  study = opts["study"]
  if opts["model"] == "shakespeare":
    path, training = _shakespeare_model(cfg, opts)
  else:
    path, training = opts["model"], None
  source = hf.Checkpoint(path)
  calib, windows, text = _data(opts)
  print(f"{NAME} {study}: model {path} ({source.config.arch}, {source.config.num_layers} blocks, "
        f"hidden {source.config.hidden_size}); text: {text}; calibration {len(calib)}×"
        f"{opts['seq_len']} tokens, seed 0; evaluation {len(windows)} windows of "
        f"{opts['seq_len']} (stride = length); block-sequential calibration; unstructured "
        f"comparison group {opts['group']}; N:M along the inputs; DSnoT ≤ "
        f"{opts['dsnot_cycles']} cycles, error × {opts['seq_len']} vs threshold 0.1")
  extra = dict(opts=opts, path=path, training=training, source=source, calib=calib,
               windows=windows, text=text)
  if study == "table66":
    extra.update(_zero_shot_setup(opts, path, text))
  return Context(None, None, None, extra)


def methods(ctx: Context, cfg: Config, opts: dict) -> dict[str, Trial]:
  """The dense model and every pruning of the study (``"<method> / <setting>"``), each a
  :class:`~fedjaxsparse.harness.experiment.Trial`: the deterministic scores run once,
  stochRIA over its trials (keys ``--seed``, ``--seed`` + 1, ...)."""
  P_ = ctx.extra
  opts = P_["opts"]
  measure = _zero_shot_scores if opts["study"] == "table66" else _perplexity
  out = {"Dense / -": Trial(lambda run: measure(P_, P_["source"]), seeds=1)}
  for method, setting, kw, trials in _runs(opts["study"], opts):
    if "sparsity" in kw:
      kw = {**kw, "group": opts["group"]}
    out[f"{method} / {setting}"] = Trial(
        lambda run, kw=kw: _pruned(P_, kw, run, measure), seeds=trials)
  return out


def _perplexity(P_: dict, model) -> dict:
  return {"ppl": SQ.perplexity(model, P_["windows"])}


def _pruned(P_: dict, kw: dict, run: TrialRun, measure) -> dict:
  """Prune block-sequentially with the run's key; the measure of the pruned model and the mean
  relative reconstruction error of its linear layers."""
  pruned, rep = SQ.prune(P_["source"], P_["calib"], key=jax.random.key(run.seed), **kw)
  return {**measure(P_, pruned), "recon error": float(np.mean(
      [r.recon_error for r in rep.values() if r.recon_error is not None]))}


def table(records: dict, contexts: list, cfg: Config, opts: dict) -> dict:
  """Perplexity (mean ± s.e. over a randomised score's trials) and reconstruction error beside
  the paper's column (Table 6.6: :func:`_zero_shot_table`)."""
  P_ = contexts[-1].extra
  opts = P_["opts"]
  study, path, training = opts["study"], P_["path"], P_["training"]
  if study == "table66":
    return _zero_shot_table(P_, records)
  rows = []
  for name, rec in records.items():
    method, setting = name.split(" / ")
    ppls = [r["ppl"] for r in rec["seeds"]]
    rows.append({"method": method, "setting": setting, "ppl": float(np.mean(ppls)),
                 "s.e.": (float(np.std(ppls, ddof=1) / np.sqrt(len(ppls))) if len(ppls) > 1
                          else None),
                 "recon error": float(np.mean([r.get("recon error", 0.0) for r in rec["seeds"]])),
                 f"paper ({opts['paper_model']})": PAPERS[study].paper[opts["paper_model"]].get(
                     name)})
  scale = ("trained byte-level Shakespeare model — perplexities NOT comparable with the paper's "
           "LLaMA/OPT column, compare directions only" if opts["model"] == "shakespeare"
           else "real checkpoint")
  return {"study": study, "model": path, "scale": scale, "text": P_["text"],
          "table": Table(rows, note=f"scale: {scale}"), "training": training,
          "paper": PAPERS[study].paper,
          "protocol": {"nsamples": len(P_["calib"]), "seq_len": opts["seq_len"],
                       "eval_windows": len(P_["windows"]), "calibration_seed": 0,
                       "calibration": "block-sequential", "group": opts["group"],
                       "dsnot_cycles": opts["dsnot_cycles"]}}


def figure(results: dict, ctx: Context, cfg: Config, opts: dict) -> list[Figure]:
  """Perplexity (or zero-shot accuracy) after pruning per setting, and Fig. 6.1's weights."""
  P_ = ctx.extra
  rows, study = results["table"].rows, P_["opts"]["study"]
  weights = _weight_figure(P_["source"], cfg.seed)
  if study == "table66":
    groups = [c for c in ZERO_SHOT if c in rows[0]]
    return [Figure("bars", dict(
        bars={f"{r['method']} {r['setting']}".replace(" -", ""): [r[c] for c in groups]
              for r in rows}, groups=groups, ylabel="zero-shot accuracy %",
        title=f"table66: zero-shot accuracy after 60 % pruning ({P_['path']})"),
        suffix="_table66"), weights]
  settings = list(dict.fromkeys(r["setting"] for r in rows[1:]))
  bars = {m: [next((r["ppl"] for r in rows if r["method"] == m and r["setting"] == s), None)
              for s in settings] for m in dict.fromkeys(r["method"] for r in rows[1:])}
  return [Figure("bars", dict(
      bars=bars, groups=settings, ylabel="test perplexity (log)", logy=True,
      baseline=("dense", rows[0]["ppl"]),
      title=f"{study}: perplexity after pruning "
            f"({'Shakespeare LM' if P_['training'] else P_['path']})"), suffix=f"_{study}"),
      weights]


def _weight_figure(source, seed: int) -> Figure:
  """Fig. 6.1: the heatmap of one dense linear layer of the model before pruning, chosen at
  random with ``seed`` (a block, then one of its projections)."""
  rng = np.random.default_rng(seed)
  block = int(rng.integers(source.config.num_layers))
  params = source.block(block)
  kernels = {"/".join(str(getattr(k, "key", k)) for k in path[:-1]): np.asarray(v)
             for path, v in jax.tree_util.tree_leaves_with_path(params)
             if getattr(path[-1], "key", None) == "kernel" and np.ndim(v) == 2}
  name = sorted(kernels)[int(rng.integers(len(kernels)))]
  return Figure("matrix", dict(matrix=kernels[name],
                               title=f"a dense weight matrix of the model: block {block}, "
                                     f"{name} (Yi (2025) Fig. 6.1)"), suffix="_weights")


def _tasks(opts: dict) -> dict:
  """``{task: examples}`` of the task files in ``zeroshot_dir`` (at most ``zeroshot_limit``
  each)."""
  folder = opts["zeroshot_dir"]
  if not folder or not os.path.isdir(folder):
    raise ConfigError("study table66 needs --set zeroshot_dir=DIR, a folder with the tasks' "
                      "public JSONL files (boolq.jsonl from SuperGLUE, rte.jsonl, "
                      "hellaswag.jsonl (hellaswag_val.jsonl), winogrande.jsonl (dev.jsonl), "
                      "arc_easy.jsonl / arc_challenge.jsonl (ARC-*-Test.jsonl), "
                      f"openbookqa.jsonl); got {folder!r}.")
  out = {}
  for task in zeroshot.TASKS:
    path = os.path.join(folder, f"{task}.jsonl")
    if os.path.isfile(path):
      examples = zeroshot.LOADERS[task](path)
      out[task] = examples[:opts["zeroshot_limit"]] if opts["zeroshot_limit"] else examples
  if not out:
    raise ConfigError(f"zeroshot_dir {folder!r} holds none of "
                      f"{', '.join(t + '.jsonl' for t in zeroshot.TASKS)}.")
  return out


def _zero_shot_setup(opts: dict, path: str, text: str) -> dict:
  """Table 6.6's tasks, tokenizer and the paper's rows of the model compared with (printed
  once)."""
  tasks = _tasks(opts)
  tok = lm.tokenizer("byte" if opts["model"] == "shakespeare" else
                     (opts["tokenizer"] or opts["model"]))
  paper66 = PAPERS["table66"].paper
  models = list(dict.fromkeys(c.rsplit(" ", 1)[0] for c in paper66))
  model = opts["paper_model"] if opts["paper_model"] in models else "llama2-7b"
  printed = {key: [paper66[f"{model} {t}"][key] for t in ZERO_SHOT]
             for key in paper66[f"{model} {ZERO_SHOT[0]}"]}
  col = dict(zip(zeroshot.TASKS, ZERO_SHOT))
  print(f"{NAME} table66: model {path}; calibration: {text}; zero-shot tasks: "
        + ", ".join(f"{col[t]} ({len(e)})" for t, e in tasks.items()))
  return dict(tasks=tasks, tokenizer=tok, paper_model66=model, printed=printed, columns=col)


def _zero_shot_scores(P_: dict, src) -> dict:
  """Zero-shot accuracy % of ``src`` on every task (the LM Evaluation Harness's protocol,
  :mod:`fedjaxsparse.pruning.zeroshot`: acc_norm for HellaSwag, ARC and OpenBookQA, acc for
  the others)."""
  fn = SQ.logits_fn(src)
  out = {}
  for task, examples in P_["tasks"].items():
    res = zeroshot.evaluate(fn, P_["tokenizer"], examples, max_length=P_["opts"]["seq_len"])
    out[P_["columns"][task]] = 100 * res["acc_norm" if task in zeroshot.NORMALISED else "acc"]
  return out


def _zero_shot_table(P_: dict, records: dict) -> dict:
  """Table 6.6: zero-shot accuracy of the dense and the 60 %-pruned models (magnitude and RIA,
  each alone, with DSnoT and with R²-DSnoT), the paper's table beside ours."""
  opts, printed, model = P_["opts"], P_["printed"], P_["paper_model66"]
  rows = []
  for name, rec in records.items():
    method, setting = name.split(" / ")
    got = {c: v for c, v in rec["seeds"][0].items() if c != "recon error"}
    paper = printed.get(name)
    rows.append({"method": method, "setting": setting, **got,
                 "mean": float(np.mean(list(got.values()))),
                 f"paper mean ({model}, {len(got)} tasks)": None if paper is None else float(
                     np.mean([v for c, v in zip(ZERO_SHOT, paper) if c in got]))})
  paper_rows = [{"method": key.split(" / ")[0], "setting": key.split(" / ")[1],
                 **dict(zip(ZERO_SHOT, v)), "mean": float(np.mean(v))}
                for key, v in printed.items()]
  scale = ("trained byte-level Shakespeare model — accuracies NOT comparable with the paper's "
           "LLaMA columns, compare directions only" if opts["model"] == "shakespeare"
           else "real checkpoint")
  return {"study": "table66", "model": P_["path"], "scale": scale, "text": P_["text"],
          "table": Table(rows, note=f"scale: {scale}"), "training": P_["training"],
          "paper_table": Table(paper_rows, title=f"the paper's Table 6.6 ({model}; its printed "
                               "means for some LLaMA2-7b rows are not the task means — "
                               "recomputed here):"),
          "tasks": {P_["columns"][t]: len(e) for t, e in P_["tasks"].items()}}


run = declared(NAME, OPTIONS, setup=setup, methods=methods, table=table, figure=figure,
               metric=lambda cfg, opts: ("zero-shot accuracy" if opts["study"] == "table66"
                                         else "perplexity"),
               higher_is_better=False, papers=PAPERS)
