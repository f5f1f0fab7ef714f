"""Zero-shot multiple-choice evaluation of language models by log-likelihood, in the convention
of EleutherAI's LM Evaluation Harness (the protocol behind Table 6.6 of Kai Yi's dissertation,
its SymWanda chapter: BoolQ, RTE, HellaSwag, WinoGrande, ARC-easy, ARC-challenge, OpenBookQA).

References:
  Leo Gao, Jonathan Tow, Baber Abbasi, Stella Biderman, Sid Black, et al. (2023). A framework
    for few-shot language model evaluation (lm-evaluation-harness). Zenodo,
    doi:10.5281/zenodo.10256836. (no arXiv version)
  Christopher Clark, Kenton Lee, Ming-Wei Chang, et al. (2019). BoolQ: Exploring the Surprising
    Difficulty of Natural Yes/No Questions. NAACL 2019. arXiv:1905.10044.
  Alex Wang, Yada Pruksachatkun, Nikita Nangia, et al. (2019). SuperGLUE: A Stickier Benchmark
    for General-Purpose Language Understanding Systems (RTE). NeurIPS 2019. arXiv:1905.00537.
  Rowan Zellers, Ari Holtzman, Yonatan Bisk, Ali Farhadi, Yejin Choi (2019). HellaSwag: Can a
    Machine Really Finish Your Sentence? ACL 2019. arXiv:1905.07830.
  Keisuke Sakaguchi, Ronan Le Bras, Chandra Bhagavatula, Yejin Choi (2020). WinoGrande: An
    Adversarial Winograd Schema Challenge at Scale. AAAI 2020. arXiv:1907.10641.
  Peter Clark, Isaac Cowhey, Oren Etzioni, et al. (2018). Think you have Solved Question
    Answering? Try ARC, the AI2 Reasoning Challenge. arXiv:1803.05457.
  Todor Mihaylov, Peter Clark, Tushar Khot, Ashish Sabharwal (2018). Can a Suit of Armor Conduct
    Electricity? A New Dataset for Open Book Question Answering. EMNLP 2018. arXiv:1809.02789.

Every example is a list of *requests* ``(context, continuation)``, one per answer choice, and
the gold index. A request is scored by the model's log-likelihood of the continuation's tokens
given the context's: ``Σ_t log p(c_t | context, c_<t)`` — the context and continuation are
tokenised separately and concatenated, the sequence truncated on the left to the model's
window. ``acc``: the choice of largest log-likelihood is the gold one; ``acc_norm``: the same
after dividing each log-likelihood by its continuation's length in UTF-8 bytes (the harness's
``acc_norm``, which reports HellaSwag, ARC and OpenBookQA that way).

The prompts and answer formats are the harness's (v0.4 task configurations):

* **BoolQ** — ``"{passage}\\nQuestion: {question}?\\nAnswer:"``, choices ``" no"``,
  ``" yes"``;
* **RTE** — ``"{premise}\\nQuestion: {hypothesis} True or False?\\nAnswer:"``, choices
  ``" True"`` (entailment), ``" False"``;
* **HellaSwag** — ``"{activity_label}: {ctx_a} {Ctx_b}"`` (``ctx_b`` capitalised) and each
  ending with a leading space, after the harness's clean-up (" [title]" → ". ", bracketed tags
  dropped, double spaces collapsed);
* **WinoGrande** — partial evaluation: for each option the context is the sentence up to the
  blank with the option in it, the continuation the rest after the blank (" " + rest), so
  both options are scored on the same tokens;
* **ARC** (easy, challenge) — ``"Question: {question}\\nAnswer:"``, choices ``" {text}"``;
* **OpenBookQA** — the question stem as context, choices ``" {text}"``.

Loaders read each task's public file format: the JSONL files of SuperGLUE (BoolQ, RTE), of
HellaSwag (``hellaswag_val.jsonl``), WinoGrande (``dev.jsonl``, labels in ``dev-labels.lst``
when the answers are not in the file), ARC (``ARC-Easy-Dev.jsonl``, ...) and OpenBookQA
(``dev.jsonl``).

Source for the team: seed 001 ch. 6, Table 6.6.
"""
from __future__ import annotations

import json
import os
import re
from typing import Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjaxsparse.errors import DataError, check_int
from fedjaxsparse.core import public_dir as _public_dir

TASKS = ("boolq", "rte", "hellaswag", "winogrande", "arc_easy", "arc_challenge", "openbookqa")
"""The zero-shot tasks of Table 6.6 in Kai Yi's dissertation, by the harness's names."""
NORMALISED = ("hellaswag", "arc_easy", "arc_challenge", "openbookqa")
"""The tasks the harness (and Table 6.6) report by ``acc_norm``; the others by ``acc``."""


class Example(NamedTuple):
  """One multiple-choice question: ``requests`` ``[(context, continuation)]``, one per choice,
  and the index of the gold one."""
  requests: tuple
  gold: int


def _jsonl(path: str) -> list[dict]:
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{path!r} does not exist: download the task's public file (see "
                            "fedjaxsparse.pruning.zeroshot) and pass its path.")
  rows = []
  with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f, 1):
      if line.strip():
        try:
          rows.append(json.loads(line))
        except json.JSONDecodeError as e:
          raise DataError(f"{path}:{number}: not a JSON line ({e.msg}).") from None
  return rows


def _field(row: dict, key: str, path: str, number: int):
  if key not in row:
    raise DataError(f"{path}: example {number} has no field {key!r} (fields: "
                    f"{sorted(row)}): not this task's file format.")
  return row[key]


def boolq(path: str) -> list[Example]:
  """SuperGLUE BoolQ JSONL: ``question``, ``passage``, ``label`` (bool; or ``answer``)."""
  out = []
  for i, r in enumerate(_jsonl(path), 1):
    label = r["label"] if "label" in r else _field(r, "answer", path, i)
    ctx = f"{_field(r, 'passage', path, i)}\nQuestion: {_field(r, 'question', path, i)}?\nAnswer:"
    out.append(Example(((ctx, " no"), (ctx, " yes")), int(bool(label))))
  return out


def rte(path: str) -> list[Example]:
  """SuperGLUE RTE JSONL: ``premise``, ``hypothesis``, ``label`` ("entailment" or
  "not_entailment"; or 0/1 as in GLUE's copy, 0 = entailment)."""
  out = []
  for i, r in enumerate(_jsonl(path), 1):
    label = _field(r, "label", path, i)
    gold = (0 if label == "entailment" else 1) if isinstance(label, str) else int(label)
    ctx = (f"{_field(r, 'premise', path, i)}\nQuestion: {_field(r, 'hypothesis', path, i)} "
           "True or False?\nAnswer:")
    out.append(Example(((ctx, " True"), (ctx, " False")), gold))
  return out


def _hellaswag_clean(text: str) -> str:
  text = text.strip().replace(" [title]", ". ")
  text = re.sub(r"\[.*?\]", "", text)
  return text.replace("  ", " ")


def hellaswag(path: str) -> list[Example]:
  """HellaSwag JSONL (``hellaswag_val.jsonl``): ``activity_label``, ``ctx_a``, ``ctx_b``,
  ``endings`` (four), ``label``."""
  out = []
  for i, r in enumerate(_jsonl(path), 1):
    ctx_b = _field(r, "ctx_b", path, i)
    ctx = _hellaswag_clean(f"{_field(r, 'activity_label', path, i)}: "
                           f"{_field(r, 'ctx_a', path, i)} {ctx_b[:1].upper() + ctx_b[1:]}")
    endings = _field(r, "endings", path, i)
    out.append(Example(tuple((ctx, " " + _hellaswag_clean(e)) for e in endings),
                       int(_field(r, "label", path, i))))
  return out


def winogrande(path: str, labels: str | None = None) -> list[Example]:
  """WinoGrande JSONL: ``sentence`` (one ``_`` blank), ``option1``, ``option2``, ``answer``
  ("1"/"2"; or, for files without it, one line per example in ``labels``, the release's
  ``dev-labels.lst``). Partial evaluation: each option fills the blank in the context and the
  rest of the sentence is the continuation scored."""
  rows = _jsonl(path)
  answers = None
  if labels is not None:
    with open(labels) as f:
      answers = [line.strip() for line in f if line.strip()]
    if len(answers) != len(rows):
      raise DataError(f"{labels} holds {len(answers)} labels for the {len(rows)} examples of "
                      f"{path}.")
  out = []
  for i, r in enumerate(rows, 1):
    sentence = _field(r, "sentence", path, i)
    if sentence.count("_") != 1:
      raise DataError(f"{path}: example {i}'s sentence must hold one '_' blank, got "
                      f"{sentence!r}.")
    cut = sentence.index("_")
    rest = " " + sentence[cut + 1:].strip()
    options = (_field(r, "option1", path, i), _field(r, "option2", path, i))
    answer = answers[i - 1] if answers is not None else _field(r, "answer", path, i)
    out.append(Example(tuple((sentence[:cut] + o, rest) for o in options), int(answer) - 1))
  return out


def arc(path: str) -> list[Example]:
  """ARC JSONL (``ARC-Easy-Dev.jsonl``, ``ARC-Challenge-Test.jsonl``, ...): ``question``
  ``{stem, choices: [{text, label}]}``, ``answerKey`` (a letter or digit label)."""
  out = []
  for i, r in enumerate(_jsonl(path), 1):
    q = _field(r, "question", path, i)
    ctx = f"Question: {q['stem']}\nAnswer:"
    labels = [c["label"] for c in q["choices"]]
    key = _field(r, "answerKey", path, i)
    if key not in labels:
      raise DataError(f"{path}: example {i}'s answerKey {key!r} is not one of {labels}.")
    out.append(Example(tuple((ctx, " " + c["text"]) for c in q["choices"]), labels.index(key)))
  return out


def openbookqa(path: str) -> list[Example]:
  """OpenBookQA JSONL: ``question`` ``{stem, choices: [{text, label}]}`` (or a flat
  ``question_stem`` with ``choices {text: [...], label: [...]}`` as on the datasets hub),
  ``answerKey``."""
  out = []
  for i, r in enumerate(_jsonl(path), 1):
    if "question_stem" in r:
      stem, texts, labels = r["question_stem"], r["choices"]["text"], r["choices"]["label"]
    else:
      q = _field(r, "question", path, i)
      stem = q["stem"]
      texts, labels = [c["text"] for c in q["choices"]], [c["label"] for c in q["choices"]]
    key = _field(r, "answerKey", path, i)
    if key not in labels:
      raise DataError(f"{path}: example {i}'s answerKey {key!r} is not one of {labels}.")
    out.append(Example(tuple((stem, " " + t) for t in texts), labels.index(key)))
  return out


LOADERS: dict[str, Callable[..., list[Example]]] = {
    "boolq": boolq, "rte": rte, "hellaswag": hellaswag, "winogrande": winogrande,
    "arc_easy": arc, "arc_challenge": arc, "openbookqa": openbookqa}
"""``{task: loader(path) -> [Example]}``."""


def loglikelihoods(logits_fn: Callable, tok, requests: Sequence[tuple[str, str]], *,
                   max_length: int, batch_size: int = 8) -> np.ndarray:
  """``float64 [R]``: ``Σ_t log p(c_t | ...)`` of each request's continuation given its
  context. ``logits_fn(ids int32 [B, L]) -> [B, L, V]`` is a causal model (position ``t``'s
  logits predict token ``t + 1``); ``tok.encode`` tokenises (context and continuation
  separately, the harness's convention); each sequence keeps its last ``max_length`` tokens,
  at least one of the context's (an empty context is an error), and is right-padded within a
  batch (padding never reaches the scored positions of a causal model; batches are padded to a
  few shapes, so a jitted model compiles a few programs)."""
  max_length = check_int("max_length", max_length, 2)
  seqs, starts = [], []
  for ctx, cont in requests:
    c, x = np.asarray(tok.encode(ctx), np.int32), np.asarray(tok.encode(cont), np.int32)
    if len(c) == 0 or len(x) == 0:
      raise ValueError(f"a request needs a non-empty context and continuation, got "
                       f"{(ctx[:40], cont[:40])!r}.")
    if len(x) >= max_length:
      raise ValueError(f"a continuation of {len(x)} tokens does not fit max_length="
                       f"{max_length} with its context.")
    ids = np.concatenate([c, x])[-max_length:]
    seqs.append(ids)
    starts.append(len(ids) - len(x))   # index of the first continuation token
  out = np.zeros(len(seqs))
  for lo in range(0, len(seqs), batch_size):
    chunk = seqs[lo:lo + batch_size]
    # widths rounded up to a multiple of 64 (at most max_length) and every batch padded to
    # batch_size rows: a jitted model compiles a few shapes, not one per batch
    width = min(max_length, -(-max(len(s) for s in chunk) // 64) * 64)
    ids = np.zeros((batch_size, width), np.int32)
    for j, s in enumerate(chunk):
      ids[j, :len(s)] = s
    logits = jnp.asarray(logits_fn(jnp.asarray(ids)), jnp.float32)
    logp = np.asarray(jax.nn.log_softmax(logits, axis=-1), np.float64)
    for j, s in enumerate(chunk):
      t = np.arange(starts[lo + j], len(s))
      out[lo + j] = logp[j, t - 1, s[t]].sum()
  return out


def evaluate(logits_fn: Callable, tok, examples: Sequence[Example], *, max_length: int,
             batch_size: int = 8) -> dict:
  """``{"acc", "acc_norm", "n"}`` of ``examples``: the fraction whose gold choice has the
  largest log-likelihood, raw and divided by the continuation's UTF-8 length (ties: the first
  choice, as ``argmax``)."""
  if not examples:
    raise ValueError("no examples to evaluate.")
  flat = [r for e in examples for r in e.requests]
  ll = loglikelihoods(logits_fn, tok, flat, max_length=max_length, batch_size=batch_size)
  acc = norm = 0
  i = 0
  for e in examples:
    k = len(e.requests)
    scores = ll[i:i + k]
    lengths = np.array([len(cont.encode("utf-8")) for _, cont in e.requests], np.float64)
    acc += int(np.argmax(scores) == e.gold)
    norm += int(np.argmax(scores / lengths) == e.gold)
    i += k
  n = len(examples)
  return {"acc": acc / n, "acc_norm": norm / n, "n": n}


__all__ = ["TASKS", "NORMALISED", "Example", "LOADERS", "boolq", "rte", "hellaswag",
           "winogrande", "arc", "openbookqa", "loglikelihoods", "evaluate"]
__dir__ = _public_dir(__all__)
