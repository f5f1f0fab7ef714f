"""Decoders (LLaMA-style, OPT-style), Hugging Face checkpoint round trips, the LM data protocol,
and block-sequential pruning (fedjaxsparse.models.transformer, hf, lm, sequential)."""
import functools
import gzip
import json

import jax
import numpy as np
import pytest

import fedjaxsparse as fjs

transformer = fjs.models.transformer

LLAMA = transformer.TransformerConfig(arch="llama", vocab_size=64, hidden_size=32,
                                      intermediate_size=48, num_layers=2, num_heads=4,
                                      num_kv_heads=2, max_positions=32)
OPT = transformer.TransformerConfig(arch="opt", vocab_size=64, hidden_size=32, intermediate_size=48,
                                    num_layers=2, num_heads=4, num_kv_heads=4, max_positions=32,
                                    tie_embeddings=True, bias=True)
IDS = np.random.default_rng(0).integers(0, 64, (6, 16)).astype(np.int32)


@functools.lru_cache(maxsize=None)
def _host_params(cfg, seed):
  """``transformer.init``'s distributions drawn in NumPy on its (traced) structure: N(0, 0.02²)
  kernels and embeddings, unit norm scales, zero biases (``init`` itself runs flax's
  initialisers op by op, a program per leaf shape; ``test_training_lowers_the_loss`` runs it)."""
  shapes = jax.eval_shape(lambda: transformer.init(cfg, jax.random.key(seed)))
  rng = np.random.default_rng(seed)
  p = jax.tree_util.tree_map_with_path(
      lambda path, s: np.full(s.shape, float(str(path[-1]) == "['scale']"), np.float32)
      if str(path[-1]) in ("['scale']", "['bias']")
      else (0.02 * rng.normal(size=s.shape)).astype(np.float32), shapes)
  # non-trivial norms and biases, so a mis-mapped tensor changes the output (numpy noise,
  # seeded by the path: no program per leaf shape)
  return jax.tree_util.tree_map_with_path(
      lambda path, x: (np.asarray(x) + 0.1 * np.random.default_rng(len(str(path))).normal(
          size=x.shape)).astype(np.float32) if str(path[-1]) in ("['scale']", "['bias']")
      else np.asarray(x), p)


def _params(cfg, seed=0):
  """Random parameters (host numpy; a fresh copy of the module's cached ones)."""
  return jax.tree.map(np.copy, _host_params(cfg, seed))


# the model's parts, jitted (cfg static): one program each instead of an eager op each
@functools.partial(jax.jit, static_argnums=0)
def _logits(cfg, params, ids):
  return transformer.Decoder(cfg).apply({"params": params}, ids)


@functools.partial(jax.jit, static_argnums=0)
def _embed(cfg, params, ids):
  return transformer.Decoder(cfg).apply({"params": params}, ids, method="embed")


@functools.partial(jax.jit, static_argnums=0)
def _block(cfg, params, h):
  return transformer.Block(cfg).apply({"params": params}, h)


@functools.partial(jax.jit, static_argnums=0)
def _block_calib(cfg, params, h):
  """``(block output, its "calib" collection: every linear layer's inputs)``."""
  return transformer.Block(cfg).apply({"params": params}, h, mutable=["calib"])


@pytest.mark.parametrize("cfg", [LLAMA, OPT], ids=["llama", "opt"])
def test_checkpoint_round_trip_gives_the_same_model(cfg, tmp_path):
  params = _params(cfg)
  fjs.models.hf.save(str(tmp_path), cfg, params)
  ck = fjs.models.hf.Checkpoint(str(tmp_path))
  assert ck.config == cfg
  loaded = ck.params()
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
               params, loaded)
  direct = fjs.pruning.sequential.ParamsSource(cfg, params)
  win = IDS   # the calibration windows' length: the same embed and block programs as prune's
  ppl_direct = fjs.pruning.lm.perplexity(fjs.pruning.sequential.logits_fn(direct), win)
  assert fjs.pruning.sequential.perplexity(ck, win) == pytest.approx(ppl_direct, rel=1e-6)
  assert fjs.pruning.sequential.perplexity(direct, win) == pytest.approx(ppl_direct, rel=1e-6)
  # pruning the loaded checkpoint gives the same masks as pruning the directly built weights
  fn = fjs.pruning.scores.by_name("wanda")
  pa, _ = fjs.pruning.sequential.prune(ck, IDS, fn, sparsity=0.5)
  pb, rep = fjs.pruning.sequential.prune(direct, IDS, fn, sparsity=0.5)
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(a == 0, b == 0), pa.params, pb.params)
  assert all(r.sparsity == pytest.approx(0.5) for r in rep.values())
  assert len(rep) == cfg.num_layers * (7 if cfg.arch == "llama" else 6)


def test_hf_names_shapes_and_sharded_index(tmp_path):
  """The written files follow Hugging Face's layout ([out, in] weights, model.* names); a
  sharded checkpoint (index json) reads the same."""
  from safetensors.numpy import load_file, save_file
  params = _params(LLAMA)
  fjs.models.hf.save(str(tmp_path / "one"), LLAMA, params)
  t = load_file(str(tmp_path / "one" / "model.safetensors"))
  d = LLAMA.head_dim
  assert t["model.layers.1.self_attn.k_proj.weight"].shape == (2 * d, 32)
  assert t["model.layers.0.mlp.down_proj.weight"].shape == (32, 48)
  assert t["lm_head.weight"].shape == (64, 32) and "model.norm.weight" in t
  np.testing.assert_array_equal(t["model.layers.0.mlp.gate_proj.weight"],
                                np.asarray(params["layers_0"]["mlp"]["gate_proj"]["kernel"]).T)
  cfg = json.load(open(tmp_path / "one" / "config.json"))
  assert cfg["model_type"] == "llama" and cfg["num_key_value_heads"] == 2
  shard = tmp_path / "sharded"
  shard.mkdir()
  names = sorted(t)
  half = {n: t[n] for n in names[::2]}, {n: t[n] for n in names[1::2]}
  for j, part in enumerate(half):
    save_file(part, str(shard / f"model-0000{j + 1}-of-00002.safetensors"))
  json.dump({"weight_map": {n: f"model-0000{1 + (i % 2)}-of-00002.safetensors"
                            for i, n in enumerate(names)}},
            open(shard / "model.safetensors.index.json", "w"))
  json.dump(cfg, open(shard / "config.json", "w"))
  jax.tree.map(np.testing.assert_array_equal, fjs.models.hf.Checkpoint(str(shard)).block(1),
               fjs.models.hf.Checkpoint(str(tmp_path / "one")).block(1))


def test_checkpoint_errors_are_named(tmp_path):
  with pytest.raises(FileNotFoundError, match="config.json"):
    fjs.models.hf.Checkpoint(str(tmp_path))
  with pytest.raises(ValueError, match="model_type"):
    fjs.models.hf.config_from_hf({"model_type": "gpt2"})
  with pytest.raises(ValueError, match="rope_scaling"):
    fjs.models.hf.config_from_hf({**fjs.models.hf.config_to_hf(LLAMA),
                                  "rope_scaling": {"type": "llama3"}})
  with pytest.raises(ValueError, match="num_kv_heads"):
    transformer.TransformerConfig(num_heads=4, num_kv_heads=3)


def test_grouped_query_attention_equals_repeated_heads():
  """GQA with 2 kv heads = multi-head attention whose k/v projections repeat each kv head over
  its group of query heads."""
  mha = transformer.TransformerConfig(**{**LLAMA.__dict__, "num_kv_heads": 4})
  p = _params(LLAMA)
  q = jax.tree.map(np.asarray, p)
  d = LLAMA.head_dim
  for i in range(LLAMA.num_layers):
    att = q[f"layers_{i}"]["self_attn"]
    for n in ("k_proj", "v_proj"):
      k = att[n]["kernel"].reshape(32, 2, d)
      att[n] = {"kernel": np.repeat(k, 2, axis=1).reshape(32, 4 * d)}
  a = _logits(LLAMA, p, IDS)
  b = _logits(mha, q, IDS)
  np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_rotary_is_relative_and_attention_causal():
  rng = np.random.default_rng(1)
  q = rng.normal(size=(1, 12, 1, 8)).astype(np.float32)
  k = rng.normal(size=(1, 12, 1, 8)).astype(np.float32)
  # the same vectors at every position: <R_m q, R_n k> depends on m − n only
  qs = np.broadcast_to(q[:, :1], q.shape)
  ks = np.broadcast_to(k[:, :1], k.shape)
  rotary = jax.jit(transformer.rotary, static_argnums=1)
  rq, rk = (np.asarray(rotary(v, 10000.0))[0, :, 0] for v in (qs, ks))
  dots = rq @ rk.T
  np.testing.assert_allclose(dots[5, 2], dots[9, 6], rtol=1e-5)
  np.testing.assert_allclose(dots[3, 3], float(qs[0, 0, 0] @ ks[0, 0, 0]), rtol=1e-5)
  np.testing.assert_allclose(np.linalg.norm(rq, axis=1), np.linalg.norm(qs[0, :, 0], axis=1),
                             rtol=1e-5)
  for cfg in (LLAMA, OPT):
    p = _params(cfg)
    ids2 = IDS.copy()
    ids2[:, 10:] = (ids2[:, 10:] + 1) % 64
    a, b = (np.asarray(_logits(cfg, p, i)) for i in (IDS, ids2))
    np.testing.assert_allclose(a[:, :10], b[:, :10], rtol=1e-5, atol=1e-6)
    assert not np.allclose(a[:, 10:], b[:, 10:])


def test_block_sequential_calibration_uses_the_pruned_outputs():
  """Block 1's masks are those computed from statistics of block-0 outputs of the *pruned*
  block 0 (Wanda's and RIA's pipeline), not of the dense one — the statistics accumulated over
  two calibration batches (of one shape: one program each)."""
  cfg, params = LLAMA, _params(LLAMA)
  fn = fjs.pruning.scores.by_name("wanda")
  key = jax.random.key(3)
  pruned, _ = fjs.pruning.sequential.prune(fjs.pruning.sequential.ParamsSource(cfg, params), IDS,
                                           fn, sparsity=0.5, key=key, batch_size=3)
  @jax.jit
  def down_proj_mask(w, x):
    """Wanda's 50 % mask of ``w`` from the statistics of its inputs ``x``."""
    st = fjs.pruning.calibration.update_stats(fjs.pruning.calibration.init_stats(x.shape[-1]), x)
    return fjs.pruning.posttrain.unstructured_mask(fn(w, st.x_norm, None), 0.5)

  h = _embed(cfg, params, IDS)
  h1 = _block(cfg, pruned.params["layers_0"], h)
  _, col = _block_calib(cfg, params["layers_1"], h1)
  x = col["calib"]["mlp"]["down_proj"]["inputs"][0]
  w = params["layers_1"]["mlp"]["down_proj"]["kernel"]
  m = down_proj_mask(w, x)
  np.testing.assert_array_equal(np.asarray(pruned.params["layers_1"]["mlp"]["down_proj"]
                                           ["kernel"]) != 0, np.asarray(m))
  dense_h1 = _block(cfg, params["layers_0"], h)
  _, col_d = _block_calib(cfg, params["layers_1"], dense_h1)
  xd = col_d["calib"]["mlp"]["down_proj"]["inputs"][0]
  md = down_proj_mask(w, xd)
  assert not np.array_equal(np.asarray(m), np.asarray(md))  # the choice matters here


def test_reconstruction_error_matches_the_definition():
  cfg, params = OPT, _params(OPT)
  pruned, rep = fjs.pruning.sequential.prune(fjs.pruning.sequential.ParamsSource(cfg, params),
                                             IDS, fjs.pruning.scores.by_name("magnitude"),
                                             sparsity=0.6)
  h = _embed(cfg, params, IDS)
  _, col = _block_calib(cfg, params["layers_0"], h)
  x = np.asarray(col["calib"]["fc1"]["inputs"][0]).reshape(-1, 32)
  w = np.asarray(params["layers_0"]["fc1"]["kernel"])
  wt = np.asarray(pruned.params["layers_0"]["fc1"]["kernel"])
  want = np.linalg.norm(x @ (w - wt)) ** 2 / np.linalg.norm(x @ w) ** 2
  assert rep["layers_0/fc1"].recon_error == pytest.approx(want, rel=1e-4)
  assert rep["layers_0/fc1"].sparsity == pytest.approx(0.6, abs=1 / 32)


def test_text_protocol_files(tmp_path):
  raw = tmp_path / "wiki.test.raw"
  raw.write_text(" \n = Title = \n \n Some text .\n")
  text = fjs.pruning.lm.wikitext2_test(str(raw))
  # the hub's rows: "" for whitespace-only lines, each line with its newline; joined by "\n\n"
  assert text == "\n\n = Title = \n\n\n\n\n Some text .\n"
  with pytest.raises(FileNotFoundError, match="wikitext-2-raw-v1"):
    fjs.pruning.lm.wikitext2_test(str(tmp_path / "missing.raw"))
  docs = ["short", "x" * 300, "y" * 50 + "z" * 250]
  with gzip.open(tmp_path / "c4.json.gz", "wt") as f:
    for d in docs:
      f.write(json.dumps({"text": d, "url": "u"}) + "\n")
  assert fjs.pruning.lm.c4_documents(str(tmp_path / "c4.json.gz")) == docs
  tok = fjs.pruning.lm.ByteTokenizer()
  w = fjs.pruning.lm.calibration_windows(docs, tok, nsamples=5, seq_len=100, seed=0)
  assert w.shape == (5, 100)
  joined = [tok.encode(d).tolist() for d in docs]
  for row in w.tolist():  # each window is a contiguous slice of one long-enough document
    assert any(any(doc[s:s + 100] == row for s in range(len(doc) - 99)) for doc in joined[1:])
  np.testing.assert_array_equal(w, fjs.pruning.lm.calibration_windows(docs, tok, 5, 100, seed=0))
  assert fjs.pruning.lm.eval_windows(np.arange(250), 100).shape == (2, 100)


def test_file_tokenizer_round_trip(tmp_path):
  from tokenizers import Tokenizer, models, pre_tokenizers, trainers
  tk = Tokenizer(models.BPE(unk_token="[UNK]"))
  tk.pre_tokenizer = pre_tokenizers.Whitespace()
  tk.train_from_iterator(["to be or not to be"] * 20, trainers.BpeTrainer(
      vocab_size=40, special_tokens=["[UNK]"]))
  tk.save(str(tmp_path / "tokenizer.json"))
  ft = fjs.pruning.lm.tokenizer(str(tmp_path))
  ids = ft.encode("to be or not")
  assert ids.dtype == np.int32 and len(ids) >= 4 and ft.decode(ids).replace(" ", "") == "tobeornot"
  # OPT's layout: GPT-2 vocab.json + merges.txt, the config's BOS prepended
  from tokenizers import ByteLevelBPETokenizer
  bl = ByteLevelBPETokenizer()
  bl.train_from_iterator(["to be or not to be"] * 20, vocab_size=300)
  opt = tmp_path / "opt"
  opt.mkdir()
  bl.save_model(str(opt))
  json.dump({"bos_token_id": 2}, open(opt / "config.json", "w"))
  ot = fjs.pruning.lm.tokenizer(str(opt))
  ids = ot.encode("to be")
  assert ids[0] == 2 and ot.decode(ids[1:]) == "to be"
  b = fjs.pruning.lm.tokenizer("byte")
  assert b.decode(b.encode("Now is the winter")) == "Now is the winter"


def test_shakespeare_splits_are_disjoint_plays():
  sp = fjs.pruning.lm.shakespeare_splits()
  assert len(sp["train"]) > 5 * len(sp["test"]) > 0 and len(sp["validation"]) > 0
  assert sp["test"][:2000] not in sp["train"] and sp["validation"][:2000] not in sp["train"]


def test_training_lowers_the_loss():
  cfg = transformer.TransformerConfig(hidden_size=32, intermediate_size=48, num_layers=1,
                                      num_heads=2, num_kv_heads=1)
  ids = fjs.pruning.lm.ByteTokenizer().encode(
      fjs.pruning.lm.shakespeare_splits()["validation"][:50_000])
  _, losses = fjs.pruning.lm.train(cfg, ids, steps=60, batch_size=8, seq_len=32, log_every=59,
                                   progress=False)
  assert losses[0] > np.log(256) - 0.5 and losses[-1] < losses[0] - 1.0
