"""Zero-shot multiple-choice evaluation (seed 001 Table 6.6's protocol): each task's loader on a
fixture in its public JSONL format gives the LM Evaluation Harness's prompts and answers, and the
log-likelihood scorer equals an independent float64 computation on a bigram model, truncation
included; acc and acc_norm follow from those scores."""
import json

import jax.numpy as jnp
import numpy as np
import pytest

import fedjaxsparse as fjs

zs = fjs.pruning.zeroshot
tok = fjs.pruning.lm.ByteTokenizer()
W = np.random.default_rng(0).normal(size=(256, 256)) * 2.0   # next-byte logits given a byte


def bigram(ids):
  return jnp.asarray(W, jnp.float32)[ids]                    # [B, L, 256]


def oracle(ctx: str, cont: str, max_length: int) -> float:
  ids = np.concatenate([tok.encode(ctx), tok.encode(cont)])[-max_length:]
  n = len(tok.encode(cont))
  logp = W - np.log(np.exp(W - W.max(1, keepdims=True)).sum(1, keepdims=True)) \
      - W.max(1, keepdims=True)
  return float(sum(logp[ids[t - 1], ids[t]] for t in range(len(ids) - n, len(ids))))


def _write(path, rows):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return str(path)


@pytest.fixture
def files(tmp_path):
  return {
      "boolq": _write(tmp_path / "boolq.jsonl", [
          {"question": "is the sky blue", "passage": "The sky is blue.", "label": True},
          {"question": "do fish fly", "passage": "Fish swim.", "label": False}]),
      "rte": _write(tmp_path / "rte.jsonl", [
          {"premise": "A dog runs.", "hypothesis": "An animal moves.", "label": "entailment"},
          {"premise": "A dog runs.", "hypothesis": "A cat sleeps.",
           "label": "not_entailment"}]),
      "hellaswag": _write(tmp_path / "hs.jsonl", [
          {"activity_label": "Baking", "ctx_a": "A man mixes flour.", "ctx_b": "he",
           "endings": ["puts it in the oven.", "eats [title] the bowl.", "sings.",
                       "runs  away."], "label": 0}]),
      "winogrande": _write(tmp_path / "wg.jsonl", [
          {"sentence": "The cup fell off the table because _ was unstable.",
           "option1": "the cup", "option2": "the table", "answer": "2"}]),
      "arc_easy": _write(tmp_path / "arc.jsonl", [
          {"question": {"stem": "Which is a metal?", "choices": [
              {"text": "wood", "label": "A"}, {"text": "iron", "label": "B"}]},
           "answerKey": "B"}]),
      "openbookqa": _write(tmp_path / "obqa.jsonl", [
          {"question_stem": "The sun is a", "choices": {"text": ["star", "moon"],
                                                         "label": ["A", "B"]},
           "answerKey": "A"},
          {"question": {"stem": "Ice is", "choices": [{"text": "cold", "label": "A"},
                                                      {"text": "hot", "label": "B"}]},
           "answerKey": "A"}]),
  }


def test_loaders_give_the_harness_prompts(files):
  b = zs.boolq(files["boolq"])
  assert b[0].requests == (("The sky is blue.\nQuestion: is the sky blue?\nAnswer:", " no"),
                           ("The sky is blue.\nQuestion: is the sky blue?\nAnswer:", " yes"))
  assert [e.gold for e in b] == [1, 0]
  r = zs.rte(files["rte"])
  assert r[0].requests[0] == ("A dog runs.\nQuestion: An animal moves. True or False?\nAnswer:",
                              " True") and [e.gold for e in r] == [0, 1]
  (h,) = zs.hellaswag(files["hellaswag"])
  assert h.requests[0][0] == "Baking: A man mixes flour. He"
  assert [c for _, c in h.requests] == [" puts it in the oven.", " eats. the bowl.", " sings.",
                                        " runs away."]   # " [title]" → ". ", spaces collapsed
  (w,) = zs.winogrande(files["winogrande"])
  assert w.requests == (("The cup fell off the table because the cup", " was unstable."),
                        ("The cup fell off the table because the table", " was unstable."))
  assert w.gold == 1
  (a,) = zs.arc(files["arc_easy"])
  assert a.requests == (("Question: Which is a metal?\nAnswer:", " wood"),
                        ("Question: Which is a metal?\nAnswer:", " iron")) and a.gold == 1
  o = zs.openbookqa(files["openbookqa"])
  assert o[0].requests == (("The sun is a", " star"), ("The sun is a", " moon"))
  assert o[1].requests[1] == ("Ice is", " hot") and [e.gold for e in o] == [0, 0]
  assert set(zs.LOADERS) == set(zs.TASKS)


def test_scores_equal_a_float64_bigram_oracle_and_decide_acc(files):
  for task in ("boolq", "hellaswag", "winogrande", "arc_easy", "openbookqa"):
    examples = zs.LOADERS[task](files[task])
    flat = [r for e in examples for r in e.requests]
    for max_length in (512, 24):              # 24: the longer contexts truncated on the left
      got = zs.loglikelihoods(bigram, tok, flat, max_length=max_length, batch_size=3)
      want = [oracle(c, x, max_length) for c, x in flat]
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    res = zs.evaluate(bigram, tok, examples, max_length=512)
    acc = norm = 0
    for e in examples:
      s = np.array([oracle(c, x, 512) for c, x in e.requests])
      n = np.array([len(x.encode()) for _, x in e.requests])
      acc += np.argmax(s) == e.gold
      norm += np.argmax(s / n) == e.gold
    assert res == {"acc": acc / len(examples), "acc_norm": norm / len(examples),
                   "n": len(examples)}, task


def test_bad_files_and_requests_are_named(tmp_path, files):
  bad = _write(tmp_path / "bad.jsonl", [{"question": "q", "passage": "p"}])
  with pytest.raises(fjs.errors.DataError, match="no field 'answer'"):
    zs.boolq(bad)
  (tmp_path / "broken.jsonl").write_text("{not json\n")
  with pytest.raises(fjs.errors.DataError, match="broken.jsonl:1"):
    zs.rte(str(tmp_path / "broken.jsonl"))
  with pytest.raises(FileNotFoundError, match="download"):
    zs.arc(str(tmp_path / "absent.jsonl"))
  with pytest.raises(ValueError, match="max_length"):
    zs.loglikelihoods(bigram, tok, [("a", " b")], max_length=1)
  with pytest.raises(ValueError, match="non-empty context"):
    zs.loglikelihoods(bigram, tok, [("", " b")], max_length=8)
