"""CLIP zero-shot teacher (fedjaxsparse.models.clip): Hugging Face checkpoint round trips and layouts,
the teacher's logits as scaled cosine similarities, EOS pooling, causal masking, one encoder layer
against a numpy re-implementation, cached logits and image preprocessing."""
from __future__ import annotations

import copy
import functools
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from fedjaxsparse.models import clip as C
from fedjaxsparse.models import clip_teacher as T
from fedjaxsparse.models.hf import flatten_paths, nest_paths

CFG_DICT = {
    "model_type": "clip", "projection_dim": 16, "logit_scale_init_value": 2.6592,
    "vision_config": {"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
                      "num_attention_heads": 2, "image_size": 32, "patch_size": 8,
                      "hidden_act": "quick_gelu", "layer_norm_eps": 1e-5},
    "text_config": {"vocab_size": 50, "hidden_size": 32, "intermediate_size": 40,
                    "num_hidden_layers": 2, "num_attention_heads": 4,
                    "max_position_embeddings": 16, "hidden_act": "gelu", "layer_norm_eps": 1e-5,
                    "eos_token_id": 40},
}
CFG = C.config_from_hf(CFG_DICT)
EOS = 40                              # not the largest id (as with tokens added after EOS)
K, L = 5, 12
RNG = np.random.default_rng(0)
IDS = RNG.integers(1, 50, (K, L)).astype(np.int32)
IDS[IDS == EOS] = 41
EOS_AT = np.array([3, 11, 6, 1, 8])
IDS[np.arange(K), EOS_AT] = EOS
IDS[0, 7] = EOS                       # a second EOS (padding with EOS, like openai's tokenizer)
IDS[1, 2] = 49                        # a larger id before the EOS: pooling is not argmax(ids)
IMAGES = RNG.normal(size=(10, 32, 32, 3)).astype(np.float32)


def _random_params(cfg, seed=0):
  """Random parameters of the flax module's ``init`` structure (numpy: jax's RNG compiles
  slowly on CPU), with non-trivial norms, biases and logit scale, so that a mis-mapped tensor
  changes the outputs."""
  rng = np.random.default_rng(seed)
  out = {}
  for p, s in sorted(flatten_paths(C.param_shapes(cfg)).items()):
    if p[-1] == "logit_scale":
      x = np.asarray(1.7)
    elif p[-1] == "scale":
      x = 1 + 0.2 * rng.normal(size=s.shape)
    elif p[-1] == "kernel":
      x = rng.normal(size=s.shape) / math.sqrt(math.prod(s.shape[:-1]))
    else:                          # biases, embeddings, class embedding
      x = 0.2 * rng.normal(size=s.shape)
    out[p] = x.astype(np.float32)
  return nest_paths(out)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
  """(directory, params) of a tiny random CLIPModel checkpoint written in the HF format."""
  path = str(tmp_path_factory.mktemp("clip"))
  params = _random_params(CFG)
  C.save_params(path, CFG_DICT, params)
  return path, params


@pytest.fixture(scope="module")
def teacher(ckpt):
  return T.zero_shot_teacher(ckpt[0], None, IDS)


@pytest.fixture(scope="module")
def teacher_fn(teacher):
  """``(params, images) -> logits`` of the teacher: one function, so that every jit of it
  (here and in :func:`T.cached_logits`) shares its programs."""
  return lambda p, x: T.teacher_logits(teacher, p, x)


# --- checkpoints -------------------------------------------------------------------------------


def test_round_trip_is_exact_and_follows_the_hf_layout(ckpt):
  path, params = ckpt
  assert C.load_config(path) == CFG
  loaded = C.load_params(path)
  shapes = jax.tree.map(lambda s: s.shape, C.param_shapes(CFG))
  assert jax.tree.map(np.shape, loaded) == shapes
  jax.tree.map(np.testing.assert_array_equal, params, loaded)
  assert all(x.dtype == np.float32 for x in jax.tree.leaves(loaded))
  t = load_file(f"{path}/model.safetensors")
  assert len(t) == len(jax.tree.leaves(params))
  v, x = "vision_model.", "text_model."
  want = {
      "logit_scale": (), "visual_projection.weight": (16, 32), "text_projection.weight": (16, 32),
      v + "embeddings.class_embedding": (32,), v + "embeddings.patch_embedding.weight":
      (32, 3, 8, 8), v + "embeddings.position_embedding.weight": (17, 32),
      v + "pre_layrnorm.weight": (32,), v + "post_layernorm.bias": (32,),
      v + "encoder.layers.1.mlp.fc1.weight": (48, 32), v + "encoder.layers.1.mlp.fc2.weight":
      (32, 48), v + "encoder.layers.0.self_attn.out_proj.bias": (32,),
      v + "encoder.layers.0.layer_norm2.weight": (32,),
      x + "embeddings.token_embedding.weight": (50, 32),
      x + "embeddings.position_embedding.weight": (16, 32),
      x + "encoder.layers.1.self_attn.q_proj.weight": (32, 32),
      x + "encoder.layers.0.mlp.fc1.weight": (40, 32), x + "final_layer_norm.weight": (32,)}
  for name, shape in want.items():
    assert t[name].shape == shape, name
  np.testing.assert_array_equal(t[v + "encoder.layers.1.mlp.fc1.weight"],
                                params["vision_model"]["encoder"]["layers_1"]["mlp"]["fc1"]
                                ["kernel"].T)
  cfg = json.load(open(f"{path}/config.json"))
  assert cfg["model_type"] == "clip" and cfg["text_config"]["eos_token_id"] == EOS


def test_checkpoint_errors(ckpt, tmp_path):
  path, params = ckpt
  t = load_file(f"{path}/model.safetensors")
  cfg = open(f"{path}/config.json").read()
  with pytest.raises(FileNotFoundError, match="config.json"):
    C.load_params(str(tmp_path))
  # old checkpoints carry position_ids buffers: ignored; a scalar stored as [1] is accepted
  extra = tmp_path / "extra"
  extra.mkdir()
  save_file({**t, "text_model.embeddings.position_ids": np.arange(16)[None],
             "logit_scale": t["logit_scale"].reshape(1)}, str(extra / "model.safetensors"))
  (extra / "config.json").write_text(cfg)
  jax.tree.map(np.testing.assert_array_equal, C.load_params(str(extra)), params)
  missing = tmp_path / "missing"
  missing.mkdir()
  save_file({k: v for k, v in t.items() if not k.startswith("text_model.")},
            str(missing / "model.safetensors"))
  (missing / "config.json").write_text(cfg)
  with pytest.raises(KeyError, match="text_model.embeddings"):
    C.load_params(str(missing))
  bad = tmp_path / "bad"
  bad.mkdir()
  save_file({**t, "visual_projection.weight": t["visual_projection.weight"].T.copy()},
            str(bad / "model.safetensors"))
  (bad / "config.json").write_text(cfg)
  with pytest.raises(ValueError, match="visual_projection.weight"):
    C.load_params(str(bad))
  with pytest.raises(ValueError, match="missing"):
    C.save_params(str(tmp_path / "out"), CFG_DICT, {k: v for k, v in params.items()
                                                     if k != "logit_scale"})


def _with(path, value):
  d = copy.deepcopy(CFG_DICT)
  node = d
  for k in path[:-1]:
    node = node[k]
  node[path[-1]] = value
  return d


@pytest.mark.parametrize("path,value", [
    (("model_type",), "siglip"),
    (("projection_dim",), 0),
    (("logit_scale_init_value",), float("nan")),
    (("vision_config", "hidden_act"), "relu"),
    (("text_config", "hidden_act"), "gelu_new"),
    (("vision_config", "patch_size"), 0),
    (("vision_config", "patch_size"), 64),
    (("vision_config", "num_channels"), 1),
    (("vision_config", "layer_norm_eps"), 0.0),
    (("text_config", "num_attention_heads"), 5),
    (("text_config", "max_position_embeddings"), 7.5),
    (("text_config", "eos_token_id"), 50),
    (("text_config", "vocab_size"), True),
    (("text_config",), [1, 2]),
])
def test_bad_config_values_raise_naming_the_key(path, value):
  with pytest.raises(ValueError, match=path[-1]):
    C.config_from_hf(_with(path, value))


def test_config_defaults_legacy_dicts_and_round_trip():
  assert C.config_from_hf({}) == C.CLIPConfig()           # openai/clip-vit-base-patch32
  assert C.config_from_hf(C.config_to_hf(CFG)) == CFG
  # old configs: `text_config_dict` wins over `text_config` (HF's rule), defaults fill the rest
  legacy = {**CFG_DICT, "text_config_dict": {"hidden_size": 64, "eos_token_id": 2}}
  got = C.config_from_hf(legacy).text_config
  assert got == C.TextConfig(hidden_size=64, eos_token_id=2)


# --- the model ---------------------------------------------------------------------------------


def _unit(x):
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _sub(params, *keys):
  return {k: params[k] for k in keys}


_VISION = ("vision_model", "visual_projection")
_TEXT = ("text_model", "text_projection")


@pytest.fixture(scope="module")
def hf_tensors(ckpt):
  """The checkpoint's tensors by Hugging Face name, float64 (for the numpy references)."""
  return {k: v.astype(np.float64) for k, v in load_file(f"{ckpt[0]}/model.safetensors").items()}


def _np_ln(t, pre, x, eps):
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + eps) * t[pre + ".weight"] + t[pre + ".bias"]


def _np_layer(t, pre, x, heads, act, eps, causal):
  """One pre-LN CLIP encoder layer in float64 numpy from the HF tensors (PyTorch layouts)."""
  def dense(n, h):
    return h @ t[f"{pre}{n}.weight"].T + t[f"{pre}{n}.bias"]

  bsz, n_tok, hid = x.shape
  d = hid // heads
  h = _np_ln(t, pre + "layer_norm1", x, eps)
  q, k, v = (dense(f"self_attn.{n}", h).reshape(bsz, n_tok, heads, d).transpose(0, 2, 1, 3)
             for n in ("q_proj", "k_proj", "v_proj"))
  s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d)
  if causal:
    s = np.where(np.tril(np.ones((n_tok, n_tok), bool)), s, -np.inf)
  w = np.exp(s - s.max(-1, keepdims=True))
  w /= w.sum(-1, keepdims=True)
  x = x + dense("self_attn.out_proj", (w @ v).transpose(0, 2, 1, 3).reshape(bsz, n_tok, hid))
  h = dense("mlp.fc1", _np_ln(t, pre + "layer_norm2", x, eps))
  h = h / (1 + np.exp(-1.702 * h)) if act == "quick_gelu" else \
      0.5 * h * (1 + np.vectorize(math.erf)(h / math.sqrt(2)))
  return x + dense("mlp.fc2", h)


def _np_encoder(t, tower, c, x, causal):
  for i in range(c.num_hidden_layers):
    x = _np_layer(t, f"{tower}.encoder.layers.{i}.", x, c.num_attention_heads, c.hidden_act,
                  c.layer_norm_eps, causal)
  return x


def _np_patches(t, images):
  """Vision embeddings by hand: class token, then row-major patches of the [out, in, kh, kw]
  conv, plus positions."""
  pre = "vision_model.embeddings."
  w, pos = t[pre + "patch_embedding.weight"], t[pre + "position_embedding.weight"]
  img = np.asarray(images, np.float64)
  out = np.zeros((len(img), 17, 32))
  out[:, 0] = t[pre + "class_embedding"] + pos[0]
  for r in range(4):
    for c in range(4):
      patch = img[:, 8 * r:8 * r + 8, 8 * c:8 * c + 8, :]              # [B, kh, kw, in]
      out[:, 1 + 4 * r + c] = np.einsum("oikl,bkli->bo", w, patch) + pos[1 + 4 * r + c]
  return out


def _np_image_features(t, images):
  c = CFG.vision_config
  x = _np_ln(t, "vision_model.pre_layrnorm", _np_patches(t, images), c.layer_norm_eps)
  x = _np_encoder(t, "vision_model", c, x, causal=False)
  pooled = _np_ln(t, "vision_model.post_layernorm", x[:, 0], c.layer_norm_eps)
  return pooled @ t["visual_projection.weight"].T


def _np_text_features(t, ids):
  c = CFG.text_config
  x = t["text_model.embeddings.token_embedding.weight"][ids]
  x = x + t["text_model.embeddings.position_embedding.weight"][:ids.shape[1]]
  x = _np_encoder(t, "text_model", c, x, causal=True)
  x = _np_ln(t, "text_model.final_layer_norm", x, c.layer_norm_eps)
  first_eos = np.array([list(row).index(EOS) for row in ids])
  return x[np.arange(len(ids)), first_eos] @ t["text_projection.weight"].T


def test_patch_embedding_follows_pytorch_conv_layout(ckpt, hf_tensors):
  got = jax.jit(C.VisionEmbeddings(CFG.vision_config).apply)(
      {"params": ckpt[1]["vision_model"]["embeddings"]}, IMAGES[:2])
  np.testing.assert_allclose(got, _np_patches(hf_tensors, IMAGES[:2]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tower,causal", [("vision_model", False), ("text_model", True)])
def test_encoder_layer_matches_numpy(ckpt, hf_tensors, tower, causal):
  c = CFG.vision_config if tower == "vision_model" else CFG.text_config
  x = RNG.normal(size=(3, 9, 32)).astype(np.float32)
  mask = np.tril(np.ones((9, 9), bool)) if causal else None
  got = jax.jit(C.EncoderLayer(c).apply)({"params": ckpt[1][tower]["encoder"]["layers_1"]}, x,
                                         mask)
  want = _np_layer(hf_tensors, f"{tower}.encoder.layers.1.", x.astype(np.float64),
                   c.num_attention_heads, c.hidden_act, c.layer_norm_eps, causal)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_towers_match_numpy_references(ckpt, hf_tensors):
  """Both towers end to end (embeddings, pre_layrnorm, encoder, post_layernorm on the class token
  / final_layer_norm pooled at the first EOS, bias-free projections) against numpy from the HF
  tensors."""
  _, params = ckpt
  np.testing.assert_allclose(C.image_features(CFG, _sub(params, *_VISION), IMAGES),
                             _np_image_features(hf_tensors, IMAGES), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(C.text_features(CFG, _sub(params, *_TEXT), IDS),
                             _np_text_features(hf_tensors, IDS), rtol=1e-4, atol=1e-5)
  with pytest.raises(ValueError, match="images"):
    C.image_features(CFG, params, IMAGES[:2, :16])


def test_teacher_logits_are_scaled_cosine_similarities(ckpt, teacher, teacher_fn):
  _, params = ckpt
  img = np.asarray(C.image_features(CFG, _sub(params, *_VISION), IMAGES), np.float64)
  txt = np.asarray(C.text_features(CFG, _sub(params, *_TEXT), IDS), np.float64)
  assert img.shape == (10, 16) and txt.shape == (K, 16)
  want = math.exp(1.7) * _unit(img) @ _unit(txt).T
  np.testing.assert_allclose(jax.jit(teacher_fn)(teacher.params, IMAGES), want, rtol=1e-5,
                             atol=1e-5)
  np.testing.assert_allclose(np.linalg.norm(teacher.class_emb, axis=1), 1.0, rtol=1e-6)
  np.testing.assert_allclose(teacher.class_emb, _unit(txt), rtol=1e-5, atol=1e-6)
  assert float(teacher.logit_scale) == pytest.approx(1.7)
  # the flax CLIPModel's forward gives the same logits_per_image
  full = jax.jit(lambda p: C.CLIP(CFG).apply({"params": p}, IMAGES, IDS))(params)
  np.testing.assert_allclose(full, want, rtol=1e-5, atol=1e-5)
  # from a parameter tree (and a config dict) rather than a directory: the same teacher
  t2 = T.zero_shot_teacher(params, CFG_DICT, IDS)
  np.testing.assert_allclose(t2.class_emb, teacher.class_emb, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(T.teacher_logits(t2, _sub(params, *_VISION), IMAGES), want,
                             rtol=1e-5, atol=1e-5)


def test_prompt_ensembles_average_unit_embeddings(ckpt):
  _, params = ckpt
  ids2 = np.roll(IDS, 1, axis=0)
  t1 = T.zero_shot_teacher(params, CFG, IDS[:, None])
  np.testing.assert_allclose(t1.class_emb, T.zero_shot_teacher(params, CFG, IDS).class_emb,
                             rtol=1e-6, atol=1e-7)
  t = T.zero_shot_teacher(params, CFG, np.stack([IDS, ids2], axis=1), batch_size=K)
  e1, e2 = (np.asarray(C.text_features(CFG, _sub(params, *_TEXT), i), np.float64)
            for i in (IDS, ids2))
  np.testing.assert_allclose(t.class_emb, _unit(_unit(e1) + _unit(e2)), rtol=1e-5, atol=1e-6)


@functools.partial(jax.jit, static_argnums=2)
def _text(params, ids, cfg=CFG):
  return C.TextTransformer(cfg.text_config).apply({"params": params["text_model"]}, ids)


def test_text_pooling_picks_the_eos_position(ckpt):
  _, params = ckpt
  text = _sub(params, *_TEXT)
  hidden, pooled = _text(params, IDS)
  pool_positions = jax.jit(C.pool_positions, static_argnums=1)
  np.testing.assert_array_equal(pool_positions(IDS, EOS), EOS_AT)        # the first EOS
  np.testing.assert_array_equal(pooled, np.asarray(hidden)[np.arange(K), EOS_AT])
  emb = C.text_features(CFG, text, IDS)
  after, before = IDS.copy(), IDS.copy()
  for k, e in enumerate(EOS_AT):
    after[k, e + 1:] = (after[k, e + 1:] + 7) % EOS                      # tokens after EOS
    if e:
      before[k, e - 1] = (before[k, e - 1] + 7) % EOS                    # the token before it
  np.testing.assert_allclose(C.text_features(CFG, text, after), emb, rtol=1e-6, atol=1e-6)
  moved = np.abs(np.asarray(C.text_features(CFG, text, before)) - np.asarray(emb)).max(1)
  assert (moved[EOS_AT > 0] > 1e-3).all()
  # legacy configs (eos_token_id == 2): HF pools at argmax(ids), not at the token 2
  legacy = C.CLIPConfig(CFG.vision_config, CFG.text_config._replace(eos_token_id=2),
                        CFG.projection_dim)
  ids = np.minimum(IDS, 48)
  ids[np.arange(K), EOS_AT] = 49        # the legacy EOS: the largest id
  ids[:, 0] = 2
  idx = np.argmax(ids, axis=1)
  np.testing.assert_array_equal(pool_positions(ids, 2), idx)
  np.testing.assert_array_equal(idx, EOS_AT)
  hidden, pooled = _text(params, ids, legacy)
  np.testing.assert_array_equal(pooled, np.asarray(hidden)[np.arange(K), idx])


def test_text_attention_is_causal(ckpt):
  _, params = ckpt
  a = np.asarray(_text(params, IDS)[0])
  for j in (4, 9):
    ids = IDS.copy()
    ids[:, j] = (ids[:, j] + 5) % 50
    b = np.asarray(_text(params, ids)[0])
    np.testing.assert_allclose(a[:, :j], b[:, :j], rtol=1e-6, atol=1e-6)
    assert (np.abs(a[:, j:] - b[:, j:]).max(axis=(0, 2)) > 1e-4).all()


def test_zero_shot_teacher_input_errors(ckpt):
  _, params = ckpt
  no_eos = IDS.copy()
  no_eos[2] = 3
  for ids, match in [(IDS.astype(np.float32), "integer"), (IDS[0], "shape"),
                     (np.tile(IDS, (1, 2)), "max_position_embeddings"),
                     (np.where(IDS == 49, 50, IDS), "vocab_size"), (no_eos, "eos_token_id")]:
    with pytest.raises(ValueError, match="class_token_ids") as e:
      T.zero_shot_teacher(params, CFG, ids)
    assert match in str(e.value)
  with pytest.raises(ValueError, match="cfg"):
    T.zero_shot_teacher(params, None, IDS)


# --- cached logits and preprocessing -----------------------------------------------------------


@pytest.mark.parametrize("batch_size", [4, 3, 256])
def test_cached_logits_equal_on_the_fly_logits(teacher, teacher_fn, batch_size):
  on_the_fly = jax.jit(teacher_fn)
  want = np.asarray(on_the_fly(teacher.params, IMAGES))
  got = T.cached_logits(teacher_fn, IMAGES, batch_size, params=teacher.params)
  assert isinstance(got, np.ndarray) and got.shape == (10, K)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  for i in (0, 9):                                     # one example at a time
    np.testing.assert_allclose(got[i], np.asarray(on_the_fly(teacher.params, IMAGES[i:i + 1]))[0],
                               rtol=1e-5, atol=1e-5)


def test_cached_logits_closure_form_one_program_and_errors(teacher, teacher_fn):
  want = np.asarray(jax.jit(teacher_fn)(teacher.params, IMAGES))
  traced = []

  def fn(x):
    traced.append(x.shape)
    return T.teacher_logits(teacher, None, x)

  np.testing.assert_allclose(T.cached_logits(fn, IMAGES, 4), want, rtol=1e-5, atol=1e-5)
  assert traced == [(4, 32, 32, 3)]                   # the short last batch is padded
  with pytest.raises(ValueError, match="batch_size"):
    T.cached_logits(jnp.sum, IMAGES, 0)
  with pytest.raises(ValueError, match="images"):
    T.cached_logits(jnp.sum, IMAGES[:0])


def test_cached_logits_of_preprocessed_uint8_images(teacher, teacher_fn):
  raw = RNG.integers(0, 256, (10, 20, 20, 3), dtype=np.uint8)
  fn = lambda p, x: T.teacher_logits(teacher, p, C.preprocess(x, 32))   # noqa: E731
  got = T.cached_logits(fn, raw, 4, params=teacher.params)
  # all ten at once (the teacher's program on ten images, as the tests above run it)
  want = jax.jit(teacher_fn)(teacher.params,
                             jax.jit(C.preprocess, static_argnums=1)(raw, 32))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_preprocess_shapes_normalisation_and_grayscale():
  mean, std = np.asarray(C.CLIP_MEAN), np.asarray(C.CLIP_STD)
  preprocess = jax.jit(C.preprocess, static_argnums=1)
  raw = RNG.integers(0, 256, (2, 20, 20, 3), dtype=np.uint8)
  out = preprocess(raw, 32)
  assert out.shape == (2, 32, 32, 3) and out.dtype == jnp.float32
  np.testing.assert_allclose(out, preprocess(raw / 255.0, 32), rtol=1e-5, atol=1e-5)
  # at the native size nothing is resized: exactly (x / 255 - mean) / std
  np.testing.assert_allclose(preprocess(raw, 20), (raw / 255.0 - mean) / std, rtol=1e-5,
                             atol=1e-5)
  # a constant image stays constant (bicubic weights sum to one)
  const = np.full((1, 20, 20, 3), 51, np.uint8)
  np.testing.assert_allclose(preprocess(const, 32), np.broadcast_to((0.2 - mean) / std,
                                                                    (1, 32, 32, 3)),
                             rtol=1e-5, atol=1e-5)
  # grayscale is repeated to 3 channels (before the per-channel normalisation)
  gray = preprocess(raw[..., :1], 32)
  assert gray.shape == (2, 32, 32, 3)
  unnorm = np.asarray(gray) * std + mean
  np.testing.assert_allclose(unnorm[..., 1], unnorm[..., 0], atol=1e-5)
  np.testing.assert_allclose(unnorm[..., 2], unnorm[..., 0], atol=1e-5)
  # non-square: the shorter side goes to image_size, the centre is cropped
  wide = np.zeros((1, 10, 30, 3), np.uint8)
  wide[:, :, 10:20] = 255                             # a white middle third
  out = np.asarray(preprocess(wide, 10)) * std + mean
  assert out.shape == (1, 10, 10, 3)
  np.testing.assert_allclose(out, 1.0, atol=1e-5)     # only the white centre is left
  for bad in (raw[0], raw[..., :2]):
    with pytest.raises(ValueError, match="images"):
      preprocess(bad, 32)
  with pytest.raises(ValueError, match="image_size"):
    preprocess(raw, 0)


def test_fedlpfm_linear_probe_on_clip_features(ckpt, tmp_path):
  """Table 11's linear-probed teacher with ``--set clip=``: the CLIP teacher carries its unit
  image embeddings as features, and each client's probe head is fitted on them — the probe's
  logits are its own, the zero-shot ones the embeddings' scaled cosines with the prompts."""
  from fedjaxsparse.data.federated import pack_clients
  from fedjaxsparse.experiments import fedlpfm_fmnist as F
  from fedjaxsparse.harness.options import Config
  np.save(tmp_path / "ids.npy", IDS)
  x = RNG.random((40, 28, 28, 1)).astype(np.float32)
  y = RNG.integers(0, K, 40).astype(np.int32)
  opts = {"clip": ckpt[0], "clip_prompts": str(tmp_path / "ids.npy")}
  (name, teacher), = F._teachers(Config(out=str(tmp_path)), opts, x, y, x, y, K).items()
  fn, _, feats = teacher
  phi = feats(x)
  assert phi.shape == (40, CFG.projection_dim)
  np.testing.assert_allclose(np.linalg.norm(phi, axis=1), 1.0, rtol=1e-5)
  fit = pack_clients(x, y, np.array_split(np.arange(40), 2))
  zero = F._client_logits(fit, teacher, K, probe=False)
  probed = F._client_logits(fit, teacher, K, probe=True)
  assert zero.shape == probed.shape == (2, 20, K) and not np.allclose(zero, probed)
  t = T.zero_shot_teacher(ckpt[0], None, IDS)
  cls = np.asarray(t.class_emb)
  cls = cls / np.linalg.norm(cls, axis=-1, keepdims=True)
  np.testing.assert_allclose(zero.reshape(40, K), np.exp(float(t.logit_scale)) * phi @ cls.T,
                             rtol=1e-4, atol=1e-4)



def test_fedlpfm_table12_on_two_clip_backbones(ckpt, tmp_path):
  """Table 12 with ``--set clip=``: the second backbone (``clip_second``) is a second zero-shot
  teacher — not the stand-in MLP the CLIP path never builds — and the three variants (each
  teacher for every client, a uniform per-client choice) sit beside the paper's columns
  ViT-B/32, RN50 and random selection; without the second checkpoint the error names it."""
  from fedjaxsparse.data.federated import pack_clients
  from fedjaxsparse.experiments import fedlpfm_fmnist as F
  from fedjaxsparse.harness.options import Config
  np.save(tmp_path / "ids.npy", IDS)
  x = RNG.random((24, 28, 28, 1)).astype(np.float32)
  y = RNG.integers(0, K, 24).astype(np.int32)
  opts = {"clip": ckpt[0], "clip_prompts": str(tmp_path / "ids.npy"), "study": "table12",
          "clip_second": ckpt[0]}
  teachers = F._teachers(Config(out=str(tmp_path)), opts, x, y, x, y, K)
  assert len(teachers) == 2 and list(teachers)[0] == "CLIP 0-shot"
  fit = pack_clients(x, y, np.array_split(np.arange(24), 3))
  main = F._client_logits(fit, teachers["CLIP 0-shot"], K, False)[:, :, None]
  variants, columns = F._table12_variants(fit, teachers, main, K, seed=0)
  second = list(teachers)[1]
  assert columns == {"CLIP 0-shot (all clients)": "CLIP ViT-B/32",
                     f"{second} (all clients)": "CLIP RN50",
                     "mixed (uniform per client)": "random selection"}
  assert set(columns.values()) == set(F.TEACHER_COLUMNS["table12"])
  np.testing.assert_array_equal(variants["CLIP 0-shot (all clients)"], main)
  both, pick = variants["mixed (uniform per client)"]
  assert both.shape == (3, 8, 2, K) and pick.shape == (3, 2) and np.all(pick.sum(1) == 1)
  # the same checkpoint twice: the second teacher's logits are the first's
  np.testing.assert_allclose(variants[f"{second} (all clients)"], main, rtol=1e-6)
  with pytest.raises(ValueError, match="clip_second"):
    F._teachers(Config(out=str(tmp_path)), dict(opts, clip_second=""), x, y, x, y, K)

# --- prompt tuning (CoOp) ----------------------------------------------------------------------


def _prompts():
  """One prompt per class: [SOS, X, X, X, class token, EOS, pad...] (positions 1..3 the
  placeholders the context replaces)."""
  ids = np.full((K, L), 3, np.int32)
  ids[:, 0], ids[:, 1:4] = 1, 7
  ids[:, 4] = np.arange(10, 10 + K)
  ids[:, 5] = EOS
  return ids


def test_context_of_the_placeholders_own_embeddings_changes_nothing(ckpt):
  """The context path is exact: feeding the placeholder tokens' own embeddings as the context
  gives the plain prompts' text features; another context changes them."""
  params = _sub(ckpt[1], *_TEXT)      # what text_features reads (the programs others use)
  ids = _prompts()
  table = params["text_model"]["embeddings"]["token_embedding"]["embedding"]
  own = np.asarray(table)[ids[0, 1:4]]
  plain = np.asarray(C.text_features(CFG, params, ids))
  np.testing.assert_allclose(C.text_features(CFG, params, ids, own), plain, rtol=1e-5,
                             atol=1e-6)
  other = own + np.random.default_rng(0).normal(size=own.shape).astype(own.dtype)
  assert float(np.max(np.abs(np.asarray(C.text_features(CFG, params, ids, other)) - plain))) \
      > 1e-3
  with pytest.raises(ValueError, match="context"):
    C.text_features(CFG, params, ids, np.zeros((L, 32), np.float32))


def test_prompt_tuning_fits_the_context_to_labelled_embeddings(ckpt):
  """CoOp on separable image embeddings (each class near its own direction): the loss falls
  and the tuned prompts classify the embeddings better than the untuned ones; CLIP's parameters
  are not touched (they enter as constants)."""
  _, params = ckpt
  rng = np.random.default_rng(3)
  centres = rng.normal(size=(K, 16))
  y = rng.integers(0, K, 200)
  emb = centres[y] + 0.3 * rng.normal(size=(200, 16))
  tuned = T.prompt_tuning(CFG, params, _prompts(), emb, y, n_ctx=3, steps=150, lr=0.05,
                          batch_size=None, key=jax.random.key(1))
  losses = np.asarray(tuned.losses)
  assert tuned.context.shape == (3, 32) and losses[-1] < losses[0]
  unit = emb / np.linalg.norm(emb, axis=1, keepdims=True)
  # the untuned prompts: CoOp's starting context, N(0, 0.02²) from the first half of the key
  # (the programs of prompt_tuning's own start and class embeddings: nothing new compiles)
  first = jax.random.wrap_key_data(  # the first half, indexed on the host (no program)
      np.asarray(jax.random.key_data(jax.random.split(jax.random.key(1))))[0])
  ctx0 = 0.02 * jax.random.normal(first, (3, 32))
  before = np.asarray(C.text_features(CFG, _sub(params, *_TEXT), _prompts(), ctx0), np.float64)
  before = _unit(before)
  logits0 = math.exp(1.7) * unit @ before.T       # it is the start: its loss is losses[0]
  ce0 = np.mean(np.log(np.exp(logits0).sum(1)) - logits0[np.arange(len(y)), y])
  assert ce0 == pytest.approx(float(losses[0]), rel=1e-4)
  acc = lambda ce: np.mean(np.argmax(unit @ np.asarray(ce).T, 1) == y)   # noqa: E731
  assert acc(tuned.class_emb) > acc(before)
  with pytest.raises(ValueError, match="n_ctx"):
    T.prompt_tuning(CFG, params, _prompts(), emb, y, n_ctx=L)


def test_fedlpfm_prompt_tuned_teacher_is_each_clients_coop(ckpt, tmp_path):
  """Table 11's prompt-tuned teacher: each client's logits are CLIP's scaled cosines between
  its image embeddings and the class embeddings of a CoOp context tuned on its own data."""
  from fedjaxsparse.data.federated import pack_clients
  from fedjaxsparse.experiments import fedlpfm_fmnist as F
  from fedjaxsparse.harness.options import Config
  np.save(tmp_path / "ids.npy", IDS)
  np.save(tmp_path / "coop.npy", _prompts())
  x = RNG.random((24, 28, 28, 1)).astype(np.float32)
  y = RNG.integers(0, K, 24).astype(np.int32)
  opts = {"clip": ckpt[0], "clip_prompts": str(tmp_path / "ids.npy"),
          "coop_prompts": str(tmp_path / "coop.npy"), "coop_ctx": 3, "coop_steps": 5}
  (_, teacher), = F._teachers(Config(out=str(tmp_path)), opts, x, y, x, y, K).items()
  fit = pack_clients(x, y, np.array_split(np.arange(24), 2))
  logits = F._prompt_tuned_logits(fit, teacher, opts, 0)
  _, params = ckpt
  phi = teacher[2](x)[:12]         # client 0's embeddings (one program with the experiment's)
  tuned = T.prompt_tuning(CFG, params, _prompts(), phi, y[:12], n_ctx=3, steps=5,
                          key=jax.random.key(0))
  np.testing.assert_allclose(logits[0], np.exp(1.7) * phi @ np.asarray(tuned.class_emb).T,
                             rtol=1e-4, atol=1e-4)


@pytest.mark.integration   # FedAvg rounds of a ViT: a multi-round learning run (the tier's kind)
def test_fine_tunable_clip_starts_at_the_teacher_and_trains_with_fedavg(teacher):
  """Fed-LPFM's preliminary "CLIP with FedAvg": the fine-tunable classifier's logits at its
  initial parameters are the zero-shot teacher's on the preprocessed images; both the image
  tower and the zero-shot head receive gradients; FedAvg rounds lower the clients' loss."""
  import optax
  import fedjaxsparse as fjs
  model, params = T.fine_tunable(teacher)
  x = RNG.uniform(size=(12, 24, 24, 3)).astype(np.float32)     # clients' own image size
  y = RNG.integers(0, K, 12).astype(np.int32)
  want = T.teacher_logits(teacher, None, C.preprocess(x, 32))
  np.testing.assert_allclose(jax.jit(model.apply)(params, x), want, rtol=1e-5, atol=1e-5)
  assert model.init(jax.random.key(3)) is params                # the teacher, not a draw
  loss = fjs.models.make_loss(model)
  data = fjs.data.pack_clients(x, y, np.array_split(np.arange(12), 2))
  g = jax.grad(loss)(params, data.x[0], data.y[0], data.mask[0])
  assert all(float(jnp.abs(a).max()) > 0 for a in jax.tree.leaves(g))
  algo = fjs.fedavg(loss, optax.sgd(0.05), local_steps=3)
  state = algo.init(jax.random.key(0), params, data)
  mean_loss = jax.jit(lambda p: jnp.mean(jax.vmap(loss, (None, 0, 0, 0))(p, data.x, data.y,
                                                                           data.mask)))
  before = float(mean_loss(params))
  step = jax.jit(algo.step)
  for t in range(3):
    state, _ = step(jax.random.key(t), state, data)
  assert float(mean_loss(state.params)) < before
  with pytest.raises(ValueError, match="image_size"):
    T.fine_tunable(teacher, image_size=0)


def test_the_preliminary_experiment_fine_tunes_the_clip_checkpoint(ckpt, tmp_path):
  """fedlpfm_fmnist --set study=prelim --set clip=CKPT: the network FedAvg fine-tunes is the
  checkpoint's zero-shot classifier (its logits are the teacher's before any round)."""
  from fedjaxsparse.harness.cli import experiments
  from fedjaxsparse.harness.options import Config
  F = experiments()["fedlpfm_fmnist"]
  np.save(tmp_path / "ids.npy", IDS)
  opts = {"clip": ckpt[0], "clip_prompts": str(tmp_path / "ids.npy"), "teacher_channels": [4]}
  x = RNG.uniform(size=(6, 32, 32, 3)).astype(np.float32)
  model, params, label, _ = F._fine_tunable_teacher(Config(out=str(tmp_path)), opts, x,
                                                    np.zeros(6, np.int32), K)
  assert label == "CLIP + FedAvg"
  t = T.zero_shot_teacher(ckpt[0], None, IDS)
  np.testing.assert_allclose(jax.jit(model.apply)(params, x),
                             T.teacher_logits(t, None, C.preprocess(x, 32)),
                             rtol=1e-5, atol=1e-5)
