"""Language-model data and evaluation for post-training pruning: tokenizers, texts, calibration
windows, perplexity, and the small Shakespeare model this library trains itself as the offline
default.

Pinned protocol choices (the peers' issue trackers show each one breaking reproductions), all
printed by :mod:`experiments.symwanda_lm`:

* **Perplexity** — WikiText-2 as the peers evaluate it: the *raw* test split
  (``wikitext-2-raw-v1``; the tokenised ``wikitext-2-v1`` gives other numbers), its rows joined
  with ``"\\n\\n"``, tokenised once, cut into ``⌊N/T⌋`` non-overlapping windows of the context
  length T (stride = T, the tail dropped); perplexity = ``exp`` of the mean next-token
  cross-entropy. :func:`wikitext2_test` reads ``wiki.test.raw`` (from ``wikitext-2-raw-v1.zip``)
  or a datasets parquet file; without it the embedded Shakespeare test plays are used.
* **Calibration** — 128 windows of 2048 tokens drawn with Python's ``random.seed(0)`` exactly as
  Wanda's ``get_c4`` draws them from the first C4 training shard
  (``en/c4-train.00000-of-01024.json.gz``; :func:`c4_documents`): a random document with more
  than T tokens, then a random start. The embedded fallback draws windows from the Shakespeare
  training plays the same way.
* **Tokenizers** — bytes (UTF-8, vocabulary 256) for the embedded model; a ``tokenizer.json``
  (the ``tokenizers`` library, with the checkpoint's special-token template, e.g. LLaMA's BOS)
  for real checkpoints.

Source for the team: seed 001, ch. 6; spec ``seed001_ch4_ch6.md`` §B.3, §B.6.
"""
from __future__ import annotations

import gzip
import json
import os
import random
import zlib
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm.auto import tqdm

from fedjaxsparse.data import shakespeare
from fedjaxsparse.errors import DataError
from fedjaxsparse.models.transformer import next_token_loss
from fedjaxsparse.models import transformer as T
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["ByteTokenizer", "FileTokenizer", "tokenizer", "shakespeare_splits", "wikitext2_test",
           "c4_documents", "calibration_windows", "eval_windows", "perplexity", "train"]
__dir__ = _public_dir(__all__)

WIKITEXT_HOW_TO = ("download wikitext-2-raw-v1.zip (e.g. from the Hugging Face dataset "
                   "'Salesforce/wikitext', config wikitext-2-raw-v1) and pass the path of its "
                   "wiki.test.raw or test-*.parquet file")
C4_HOW_TO = ("download en/c4-train.00000-of-01024.json.gz from the Hugging Face dataset "
             "'allenai/c4' and pass its path")


class ByteTokenizer:
  """UTF-8 bytes, vocabulary 256, no special tokens."""
  vocab_size = 256

  def encode(self, text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32)

  def decode(self, ids: Sequence[int]) -> str:
    return bytes(np.asarray(ids, np.uint8)).decode("utf-8", "replace")


class FileTokenizer:
  """A ``tokenizer.json`` (Hugging Face ``tokenizers``); ``encode`` adds the special tokens of
  the file's post-processor (LLaMA: one BOS at the start), as ``AutoTokenizer`` does. A
  directory with GPT-2-style ``vocab.json`` + ``merges.txt`` and no ``tokenizer.json`` (OPT's
  checkpoints) is read as byte-level BPE with the ``config.json``'s ``bos_token_id`` prepended,
  as OPT's ``GPT2Tokenizer`` does."""

  def __init__(self, path: str):
    from tokenizers import Tokenizer  # deferred: tokenizers is slow to import
    self._bos = None
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    if os.path.isfile(file):
      self._tok = Tokenizer.from_file(file)
    elif all(os.path.isfile(os.path.join(folder, f)) for f in ("vocab.json", "merges.txt")):
      from tokenizers import ByteLevelBPETokenizer  # deferred: tokenizers is slow to import
      self._tok = ByteLevelBPETokenizer(os.path.join(folder, "vocab.json"),
                                        os.path.join(folder, "merges.txt"))
      cfg = os.path.join(folder, "config.json")
      self._bos = json.load(open(cfg)).get("bos_token_id") if os.path.isfile(cfg) else None
    else:
      raise FileNotFoundError(f"no tokenizer.json (nor vocab.json + merges.txt) at {path!r}: "
                              "pass a checkpoint directory with a tokenizer, or the file.")
    self.vocab_size = self._tok.get_vocab_size()

  def encode(self, text: str) -> np.ndarray:
    ids = self._tok.encode(text).ids
    return np.asarray(ids if self._bos is None else [self._bos] + ids, np.int32)

  def decode(self, ids: Sequence[int]) -> str:
    return self._tok.decode([int(i) for i in ids])


def tokenizer(spec: str = "byte") -> ByteTokenizer | FileTokenizer:
  """``"byte"`` or the path of a ``tokenizer.json`` / checkpoint directory."""
  return ByteTokenizer() if spec == "byte" else FileTokenizer(spec)


def shakespeare_splits(data_dir: str | None = None) -> dict[str, str]:
  """``{"train", "validation", "test"}`` texts of the plays (bundled by default), split by play
  in name order: plays ``i ≡ 0 (mod 12)`` are test (4 plays), ``i ≡ 6`` validation (3), the rest
  train (30); each split's plays joined with ``"\\n\\n"``."""
  plays = list(shakespeare.read_plays(data_dir).values())
  split = lambda r: "\n\n".join(p for i, p in enumerate(plays) if r(i % 12))  # noqa: E731
  return {"train": split(lambda m: m not in (0, 6)), "validation": split(lambda m: m == 6),
          "test": split(lambda m: m == 0)}


def wikitext2_test(path: str) -> str:
  """The WikiText-2 raw test split as the peers join it: the datasets hub's rows (each line with
  its newline; ``""`` for a whitespace-only line) joined with ``"\\n\\n"``. ``path``: ``wiki.test.raw`` or a ``test-*.parquet`` of the datasets hub."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f"WikiText-2 test file {path!r} not found; {WIKITEXT_HOW_TO}.")
  if path.endswith(".parquet"):
    try:
      import pyarrow.parquet as pq  # deferred: pyarrow is slow to import
    except ImportError as e:
      raise ImportError("reading parquet needs pyarrow (pip install pyarrow), or pass "
                        "wiki.test.raw instead.") from e
    rows = pq.read_table(path).column("text").to_pylist()
  else:  # the datasets hub's script: one row per line, "" for a whitespace-only line
    with open(path, encoding="utf-8") as f:
      rows = [row if row.strip() else "" for row in f]
  return "\n\n".join(rows)


def c4_documents(path: str, limit: int | None = None) -> list[str]:
  """The ``text`` of each JSON line of a C4 shard (``.json`` or ``.json.gz``)."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f"C4 shard {path!r} not found; {C4_HOW_TO}.")
  opener = gzip.open if path.endswith(".gz") else open
  docs = []
  try:
    with opener(path, "rt", encoding="utf-8") as f:
      for number, line in enumerate(f, 1):
        if not line.strip():
          continue
        try:
          record = json.loads(line)
          docs.append(record["text"])
        except (json.JSONDecodeError, KeyError, TypeError) as e:
          what = "no 'text' field" if isinstance(e, (KeyError, TypeError)) else f"not JSON ({e})"
          raise DataError(f"C4 shard {path}, line {number}: {what}; expected one JSON object "
                          "with a 'text' field per line.") from None
        if limit is not None and len(docs) >= limit:
          break
  except (OSError, EOFError, UnicodeDecodeError, zlib.error) as e:
    raise DataError(f"C4 shard {path} cannot be read ({e}); the file is damaged or not a "
                    f"C4 shard — {C4_HOW_TO}.") from None
  return docs


def calibration_windows(docs: Sequence[str], tok, nsamples: int = 128, seq_len: int = 2048,
                        seed: int = 0) -> np.ndarray:
  """``int32[nsamples, seq_len]``: Wanda's ``get_c4`` draw — ``random.seed(seed)``; per sample, a
  random document with more than ``seq_len`` tokens, then a random start in it."""
  if nsamples < 1 or seq_len < 2:
    raise ValueError(f"nsamples must be >= 1 and seq_len >= 2, got {nsamples}, {seq_len}.")
  lengths_ok = [d for d in docs if len(d) > seq_len // 8]  # cheap pre-filter: cannot fit
  if not lengths_ok:
    raise ValueError(f"no document is long enough for seq_len={seq_len}.")
  random.seed(seed)
  out = []
  tokens_cache: dict[int, np.ndarray] = {}
  for _ in range(nsamples):
    for _attempt in range(100_000):
      i = random.randint(0, len(docs) - 1)
      ids = tokens_cache.get(i)
      if ids is None:
        ids = tokens_cache.setdefault(i, tok.encode(docs[i]))
      if len(ids) > seq_len:
        break
    else:
      raise ValueError(f"no document with more than {seq_len} tokens was found.")
    start = random.randint(0, len(ids) - seq_len - 1)
    out.append(ids[start:start + seq_len])
  return np.stack(out).astype(np.int32)


def eval_windows(ids: np.ndarray, seq_len: int) -> np.ndarray:
  """``int32[⌊N/T⌋, T]``: non-overlapping windows (stride = T, the tail dropped)."""
  n = len(ids) // seq_len
  if n < 1:
    raise ValueError(f"the evaluation text has {len(ids)} tokens, fewer than seq_len={seq_len}.")
  return np.asarray(ids[:n * seq_len], np.int32).reshape(n, seq_len)


def perplexity(logits_fn: Callable[[jax.Array], jax.Array], windows: np.ndarray,
               batch_size: int = 8) -> float:
  """``exp`` of the mean next-token cross-entropy over ``windows [n, T]`` (each window's
  ``T − 1`` predictions; every window weighs the same, as in the peers' ``eval_ppl``)."""
  total = 0.0
  for s in range(0, len(windows), batch_size):
    w = jnp.asarray(windows[s:s + batch_size])
    total += float(next_token_loss(logits_fn(w), w)) * len(w)
  return float(np.exp(total / len(windows)))


def train(cfg, text_ids: np.ndarray, *, steps: int, batch_size: int = 32, seq_len: int = 128,
          lr: float = 3e-3, seed: int = 0, log_every: int = 0, progress: bool = True
          ) -> tuple[dict[str, Any], list[float]]:
  """Trains a :class:`~fedjaxsparse.models.transformer.Decoder` on random windows of
  ``text_ids`` with AdamW (weight decay 0.1, warm-up then cosine decay, clipping at 1).
  Returns ``(params, losses)``."""
  if len(text_ids) <= seq_len + 1:
    raise ValueError(f"the training text has {len(text_ids)} tokens, not more than seq_len.")
  key = jax.random.key(seed)
  params = T.init(cfg, key, seq_len)
  sched = optax.warmup_cosine_decay_schedule(0.0, lr, max(1, steps // 20), steps, lr / 10)
  opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(sched, weight_decay=0.1))
  state = opt.init(params)
  data = jnp.asarray(text_ids, jnp.int32)
  model = T.Decoder(cfg)

  @jax.jit
  def step(params, state, k):
    starts = jax.random.randint(k, (batch_size,), 0, data.shape[0] - seq_len)
    batch = jax.vmap(lambda s: jax.lax.dynamic_slice(data, (s,), (seq_len,)))(starts)
    loss, g = jax.value_and_grad(
        lambda p: T.next_token_loss(model.apply({"params": p}, batch), batch))(params)
    upd, state = opt.update(g, state, params)
    return optax.apply_updates(params, upd), state, loss

  losses = []
  bar = tqdm(range(steps), disable=not progress, desc="train LM", unit="step")
  for t in bar:
    params, state, loss = step(params, state, jax.random.fold_in(key, t + 1))
    if log_every and (t % log_every == 0 or t == steps - 1):
      losses.append(float(loss))
      bar.set_postfix(loss=f"{losses[-1]:.3f}")
  return params, losses
