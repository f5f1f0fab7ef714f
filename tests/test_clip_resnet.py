"""CLIP's ResNet towers (fedjaxsparse.models.clip_resnet): the OpenAI / open_clip checkpoint
layout read and written exactly, the packed attention weights split as PyTorch packs them, the
attention pool against a NumPy reference, frozen BatchNorm, and RN50's published size."""
import math

import jax
import numpy as np
import pytest

from fedjaxsparse.models import clip as C
from fedjaxsparse.models import clip_teacher as T
from fedjaxsparse.models import clip_resnet as R
from fedjaxsparse.models.hf import flatten_paths, nest_paths

# OpenAI's head counts (checkpoints do not store them): width·32/64 and text width/64
TEXT = C.TextConfig(vocab_size=50, hidden_size=64, intermediate_size=80, num_hidden_layers=2,
                    num_attention_heads=1, max_position_embeddings=12, eos_token_id=49)
CFG = R.RNConfig(layers=(1, 2, 1, 1), width=8, heads=4, output_dim=16, image_size=64,
                 text=TEXT)


def _random(cfg, seed=0):
  rng = np.random.default_rng(seed)
  out = {}
  for p, s in flatten_paths(R.param_shapes(cfg)).items():
    if p[-1] == "var":
      x = rng.uniform(0.5, 2.0, s.shape)
    elif p[-1] == "logit_scale":
      x = np.asarray(1.3)
    elif p[-1] == "kernel":
      x = rng.normal(size=s.shape) / math.sqrt(math.prod(s.shape[:-1]))
    else:
      x = 0.2 * rng.normal(size=s.shape) + (1.0 if p[-1] == "scale" else 0.0)
    out[p] = x.astype(np.float32)
  return nest_paths(out)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("rn") / "open_clip_model.safetensors")
  params = _random(CFG)
  R.save_checkpoint(path, params)
  return path, params


def _ids():
  """Three prompts: a class token, then the EOS (49)."""
  ids = np.full((3, 12), 5, np.int32)
  ids[:, 1], ids[:, 2] = [7, 8, 9], 49
  return ids


@pytest.fixture(scope="module")
def teacher(ckpt):
  return R.zero_shot_teacher(ckpt[0], None, _ids())


def test_checkpoint_round_trip_infers_the_config_and_uses_openai_names(ckpt):
  from safetensors import safe_open
  path, params = ckpt
  cfg, loaded = R.load_checkpoint(path)
  assert cfg == CFG
  for p, x in flatten_paths(params).items():
    np.testing.assert_array_equal(flatten_paths(loaded)[p], x, err_msg="/".join(p))
  with safe_open(path, framework="numpy") as f:
    names = set(f.keys())
    w = f.get_tensor("transformer.resblocks.1.attn.in_proj_weight")
  assert {"visual.layer2.0.downsample.0.weight", "visual.layer2.0.downsample.1.running_var",
          "visual.attnpool.positional_embedding", "visual.attnpool.c_proj.bias",
          "token_embedding.weight", "text_projection", "logit_scale"} <= names
  # PyTorch packs q, k, v by rows: [3H, H] = [W_q; W_k; W_v], each [out, in]
  q = params["text_model"]["encoder"]["layers_1"]["self_attn"]["k_proj"]["kernel"]
  np.testing.assert_array_equal(w[64:128], q.T)


def test_attention_pool_matches_numpy(ckpt):
  _, params = ckpt
  ap = params["visual"]["attnpool"]
  rng = np.random.default_rng(1)
  x = rng.normal(size=(2, 2, 2, 256)).astype(np.float32)
  got = jax.jit(R.AttentionPool(2, 16).apply)({"params": ap}, x)
  t = x.reshape(2, 4, 256)
  t = np.concatenate([t.mean(1, keepdims=True), t], 1) + ap["positional_embedding"]
  lin = lambda n, z: z @ ap[n]["kernel"] + ap[n]["bias"]   # noqa: E731
  q, k, v = lin("q_proj", t[:, :1]), lin("k_proj", t), lin("v_proj", t)
  out = []
  for h in range(2):
    sl = slice(128 * h, 128 * (h + 1))
    s = (q[:, :, sl] / math.sqrt(128)) @ k[:, :, sl].transpose(0, 2, 1)
    a = np.exp(s - s.max(-1, keepdims=True))
    out.append((a / a.sum(-1, keepdims=True)) @ v[:, :, sl])
  want = lin("c_proj", np.concatenate(out, -1)[:, 0])
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_frozen_batch_norm_uses_the_stored_statistics():
  x = np.random.default_rng(2).normal(size=(3, 4)).astype(np.float32)
  p = {"scale": np.full(4, 2.0, np.float32), "bias": np.full(4, 0.5, np.float32),
       "mean": np.arange(4.0, dtype=np.float32), "var": np.full(4, 3.0, np.float32)}
  got = jax.jit(R._FrozenBN().apply)({"params": p}, x)
  np.testing.assert_allclose(got, (x - np.arange(4.0)) / np.sqrt(3.0 + 1e-5) * 2 + 0.5,
                             rtol=1e-6)


def test_zero_shot_teacher_is_scaled_cosines_of_the_towers(ckpt, teacher):
  _, params = ckpt
  t = teacher
  images = np.random.default_rng(3).normal(size=(2, 64, 64, 3)).astype(np.float32)
  img, logits = (np.asarray(a) for a in jax.jit(
      lambda p, x: (t.image_fn(p, x), T.teacher_logits(t, p, x)))(t.params, images))
  txt = np.asarray(R.text_features(CFG, params, _ids()))
  unit = lambda a: a / np.linalg.norm(a, axis=-1, keepdims=True)   # noqa: E731
  np.testing.assert_allclose(logits, np.exp(1.3) * unit(img) @ unit(txt).T, rtol=1e-4,
                             atol=1e-4)
  with pytest.raises(ValueError, match="images must have shape"):
    t.image_fn(t.params, np.zeros((1, 32, 32, 3), np.float32))


def test_rn50_has_openais_published_size():
  """RN50's image tower as OpenAI's (3, 4, 6, 3) bottlenecks, 2048 channels at 7×7 pooled by
  32 heads into 1024 dimensions: 38,316,896 parameters counted without BatchNorm statistics
  (open_clip's RN50 profile), 102,007,137 with the text tower and the logit scale."""
  shapes = flatten_paths(R.param_shapes(R.RN50))
  visual = sum(math.prod(s.shape) for p, s in shapes.items()
               if p[0] == "visual" and p[-1] not in ("mean", "var"))
  total = sum(math.prod(s.shape) for p, s in shapes.items() if p[-1] not in ("mean", "var"))
  assert shapes[("visual", "attnpool", "positional_embedding")].shape == (50, 2048)
  assert visual == 38_316_896 and total == 102_007_137


def test_fedlpfm_reads_an_rn_checkpoint_as_its_zero_shot_teacher(ckpt, teacher, tmp_path):
  """``--set clip=`` on OpenAI's layout gives the ResNet teacher: its logits are the towers'
  scaled cosines, and its unit image embeddings are the linear probe's features."""
  from fedjaxsparse.experiments import fedlpfm_fmnist as F
  from fedjaxsparse.harness.options import Config
  path, _ = ckpt
  np.save(tmp_path / "ids.npy", _ids())
  x = np.random.default_rng(4).random((4, 28, 28, 1)).astype(np.float32)
  opts = {"clip": path, "clip_prompts": str(tmp_path / "ids.npy")}
  (_, (fn, note, feats)), = F._teachers(Config(out=str(tmp_path)), opts, x, None, x, None,
                                         3).items()
  logits, phi = np.asarray(fn(x)), np.asarray(feats(x))
  assert logits.shape == (4, 3) and phi.shape == (4, 16)
  np.testing.assert_allclose(logits, np.exp(1.3) * phi @ np.asarray(teacher.class_emb).T,
                             rtol=1e-4, atol=1e-4)


def test_prompt_tuning_runs_on_the_resnet_checkpoints_text_tower(ckpt):
  """CoOp on CLIP RN's text tower: the config view makes ``clip.text_features`` compute the
  ResNet model's own text embeddings, and ``prompt_tuning`` learns a context with them."""
  _, params = ckpt
  cfg = R.as_clip_config(CFG)
  ids = np.full((3, 12), 5, np.int32)
  ids[:, 0], ids[:, 1:3], ids[:, 3], ids[:, 4] = 1, 7, [10, 11, 12], 49
  np.testing.assert_allclose(C.text_features(cfg, params, ids),
                             R.text_features(CFG, params, ids), rtol=1e-5, atol=1e-6)
  rng = np.random.default_rng(5)
  y = rng.integers(0, 3, 30)
  emb = rng.normal(size=(3, 16))[y] + 0.2 * rng.normal(size=(30, 16))
  tuned = T.prompt_tuning(cfg, params, ids, emb, y, n_ctx=2, steps=20, lr=0.05,
                          batch_size=None)
  losses = np.asarray(tuned.losses)
  assert tuned.class_emb.shape == (3, 16) and losses[-1] < losses[0]
