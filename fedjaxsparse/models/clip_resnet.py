"""CLIP's ResNet image towers (RN50, RN101, RN50x4, …): OpenAI's modified ResNet with
attention pooling, in flax, read from the OpenAI / open_clip checkpoint layout — the teacher
"CLIP RN50" of Fed-LPFM's backbone comparison (Table 12 of Xidong Wu's dissertation).

References:
  Alec Radford, Jong Wook Kim, Chris Hallacy, et al. (2021). Learning Transferable Visual
    Models From Natural Language Supervision. ICML 2021. arXiv:2103.00020. (Code:
    github.com/openai/CLIP, ``clip/model.py``: ``ModifiedResNet``, ``AttentionPool2d``.)

The modified ResNet (images ``[B, S, S, 3]`` NHWC, normalised by
:func:`~fedjaxsparse.models.clip.preprocess`):

* a stem of three 3×3 convolutions (``width/2`` stride 2, ``width/2``, ``width``), each with
  BatchNorm and ReLU, then a 2×2 average pool;
* four stages of bottleneck blocks (``layers``, e.g. ``(3, 4, 6, 3)`` for RN50; ``width·2^i``
  inner channels, 4× out) whose stride-2 blocks downsample by a 2×2 **average pool** after the
  3×3 convolution (anti-aliased), and whose shortcut is average pool → 1×1 conv → BatchNorm;
* **attention pooling**: the ``[HW, C]`` feature map with its mean prepended, plus learned
  positions ``[HW + 1, C]``, attends with the mean as the only query (``heads`` heads,
  ``q/k/v_proj``), and ``c_proj`` maps the result to ``output_dim`` — the image embedding.

BatchNorm uses the checkpoint's running statistics (``mean``, ``var`` stored as parameters:
the tower is a frozen teacher). The text tower is the transformer of
:class:`fedjaxsparse.models.clip.TextTransformer` (the same architecture; OpenAI's packed
``in_proj`` weights are split into ``q/k/v_proj`` on loading), pooled at the first EOS token
(OpenAI's ``argmax`` of the ids, EOS being the largest id), then ``text_projection``.

Checkpoints: a ``.safetensors`` file (or a folder holding ``open_clip_model.safetensors``)
with OpenAI's names — ``visual.conv1.weight``, ``visual.layer1.0.bn2.running_var``,
``visual.attnpool.positional_embedding``, ``transformer.resblocks.0.attn.in_proj_weight``,
``token_embedding.weight``, ``text_projection``, ``logit_scale`` … — as open_clip publishes
them (e.g. ``timm/resnet50_clip.openai``). :func:`load_checkpoint` infers the configuration
from the tensor shapes (the head counts by OpenAI's rule: ``32·width/64`` for the attention
pool, text width / 64 — checkpoints do not store them); :func:`save_checkpoint` writes the same
layout.

Source for the team: seed 004 Task 3, Table 12.
"""
from __future__ import annotations

import functools
import os
import re
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fedjaxsparse.models import clip as C
from fedjaxsparse.models import clip_teacher as T
from fedjaxsparse.models.hf import flatten_paths, nest_paths
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["RNConfig", "ModifiedResNet", "AttentionPool", "image_features", "text_features",
           "init", "param_shapes", "load_checkpoint", "save_checkpoint", "zero_shot_teacher",
           "as_clip_config", "RN50", "Bottleneck"]
__dir__ = _public_dir(__all__)


class RNConfig(NamedTuple):
  """A CLIP ResNet: ``layers`` blocks per stage, stem ``width``, attention-pool ``heads``,
  embedding ``output_dim``, input ``image_size``, and the text tower ``text`` (defaults: RN50)."""
  layers: tuple = (3, 4, 6, 3)
  width: int = 64
  heads: int = 32
  output_dim: int = 1024
  image_size: int = 224
  text: C.TextConfig = C.TextConfig()

  @property
  def embed_width(self) -> int:
    """Channels of the last stage (``32·width``)."""
    return self.width * 32


RN50 = RNConfig()
"""OpenAI's RN50: (3, 4, 6, 3) bottlenecks, width 64, 32 heads, 1024-d embeddings, 224×224."""


class _FrozenBN(nn.Module):
  """BatchNorm in evaluation mode with stored statistics: ``(x − mean)/√(var + 1e-5)·scale +
  bias`` over the last axis."""
  @nn.compact
  def __call__(self, x):
    c = x.shape[-1]
    scale = self.param("scale", nn.initializers.ones, (c,))
    bias = self.param("bias", nn.initializers.zeros, (c,))
    mean = self.param("mean", nn.initializers.zeros, (c,))
    var = self.param("var", nn.initializers.ones, (c,))
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * scale + bias


def _conv(c: int, k: int, stride: int = 1, name: str | None = None) -> nn.Conv:
  pad = ((k // 2, k // 2),) * 2
  return nn.Conv(c, (k, k), strides=(stride, stride), padding=pad, use_bias=False, name=name)


def _avg(x, s: int):
  return nn.avg_pool(x, (s, s), strides=(s, s)) if s > 1 else x


class Bottleneck(nn.Module):
  """OpenAI's bottleneck: 1×1, 3×3, (average pool), 1×1 ×4; the shortcut pools, then 1×1 conv
  and BatchNorm (``downsample``) when the stride or width changes."""
  planes: int
  stride: int = 1

  @nn.compact
  def __call__(self, x):
    out = nn.relu(_FrozenBN(name="bn1")(_conv(self.planes, 1, name="conv1")(x)))
    out = nn.relu(_FrozenBN(name="bn2")(_conv(self.planes, 3, name="conv2")(out)))
    out = _avg(out, self.stride)
    out = _FrozenBN(name="bn3")(_conv(4 * self.planes, 1, name="conv3")(out))
    if self.stride > 1 or x.shape[-1] != 4 * self.planes:
      x = _FrozenBN(name="downsample_bn")(
          _conv(4 * self.planes, 1, name="downsample_conv")(_avg(x, self.stride)))
    return nn.relu(out + x)


class AttentionPool(nn.Module):
  """``[B, H, W, C] -> [B, output_dim]``: the mean token attends over itself and the map."""
  heads: int
  output_dim: int

  @nn.compact
  def __call__(self, x):
    b, h, w, c = x.shape
    x = x.reshape(b, h * w, c)
    x = jnp.concatenate([jnp.mean(x, axis=1, keepdims=True), x], axis=1)
    pos = self.param("positional_embedding", nn.initializers.normal(c ** -0.5), (h * w + 1, c))
    x = x + pos.astype(x.dtype)
    d = c // self.heads
    q = nn.Dense(c, name="q_proj")(x[:, :1]).reshape(b, 1, self.heads, d) * d ** -0.5
    k = nn.Dense(c, name="k_proj")(x).reshape(b, -1, self.heads, d)
    v = nn.Dense(c, name="v_proj")(x).reshape(b, -1, self.heads, d)
    att = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32), axis=-1)
    o = jnp.einsum("bhqk,bkhd->bqhd", att.astype(v.dtype), v).reshape(b, c)
    return nn.Dense(self.output_dim, name="c_proj")(o)


class ModifiedResNet(nn.Module):
  """CLIP's image tower ``[B, S, S, 3] -> [B, output_dim]`` (see the module docstring)."""
  cfg: RNConfig

  @nn.compact
  def __call__(self, images):
    c = self.cfg
    want = (c.image_size, c.image_size, 3)
    if images.ndim != 4 or tuple(images.shape[1:]) != want:
      raise ValueError(f"images must have shape [B, {want[0]}, {want[1]}, 3] (NHWC, "
                       f"image_size={c.image_size}; see clip.preprocess), got "
                       f"{tuple(images.shape)}.")
    x = images
    for i, (ch, s) in enumerate(((c.width // 2, 2), (c.width // 2, 1), (c.width, 1)), 1):
      x = nn.relu(_FrozenBN(name=f"bn{i}")(_conv(ch, 3, s, name=f"conv{i}")(x)))
    x = _avg(x, 2)
    for stage, n in enumerate(c.layers):
      for j in range(n):
        x = Bottleneck(c.width * 2 ** stage, 2 if (stage > 0 and j == 0) else 1,
                       name=f"layer{stage + 1}_{j}")(x)
    return AttentionPool(c.heads, c.output_dim, name="attnpool")(x)


class _TextTower(nn.Module):
  cfg: RNConfig

  @nn.compact
  def __call__(self, token_ids, context=None):
    _, pooled = C.TextTransformer(self.cfg.text, name="text_model")(token_ids, context)
    return nn.Dense(self.cfg.output_dim, use_bias=False, name="text_projection")(pooled)


def init(cfg: RNConfig, key: jax.Array) -> dict[str, Any]:
  """Random parameters ``{"visual", "text_model", "text_projection", "logit_scale"}``."""
  s = cfg.image_size

  def fn(k):
    k1, k2 = jax.random.split(k)
    visual = ModifiedResNet(cfg).init(k1, jnp.zeros((1, s, s, 3)))["params"]
    text = _TextTower(cfg).init(k2, jnp.zeros((1, 2), jnp.int32))["params"]
    return {"visual": visual, **text, "logit_scale": jnp.asarray(np.log(1 / 0.07), jnp.float32)}

  return jax.jit(fn)(key)


def param_shapes(cfg: RNConfig) -> dict[str, Any]:
  """The parameter tree of :func:`init` as ``jax.ShapeDtypeStruct`` s."""
  return _init_from_seed_0.eval_shape(cfg)   # traced once per config (jit's cache)


@functools.partial(jax.jit, static_argnums=0)
def _init_from_seed_0(cfg: RNConfig) -> dict[str, Any]:
  return init(cfg, jax.random.key(0))   # only ever traced (param_shapes), never run


@functools.partial(jax.jit, static_argnums=0)
def image_features(cfg: RNConfig, params: dict[str, Any], images: jax.Array) -> jax.Array:
  """``[B, S, S, 3] -> [B, output_dim]`` (jitted, ``cfg`` static); ``params`` needs
  ``visual``."""
  return ModifiedResNet(cfg).apply({"params": params["visual"]}, images)


@functools.partial(jax.jit, static_argnums=0)
def text_features(cfg: RNConfig, params: dict[str, Any], token_ids: jax.Array,
                  context: jax.Array | None = None) -> jax.Array:
  """``[K, L] -> [K, output_dim]`` (jitted); ``context`` as :func:`clip.text_features`."""
  return _TextTower(cfg).apply({"params": {k: params[k] for k in ("text_model",
                                                                 "text_projection")}},
                               token_ids, context)


# ---------------------------------------------------------------------------------------------
# checkpoints (OpenAI / open_clip names)

_BN_LEAVES = {"weight": "scale", "bias": "bias", "running_mean": "mean", "running_var": "var"}


def _visual_name(name: str) -> tuple[tuple[str, ...], str] | None:
  """``visual.*`` name -> (our path, kind) with kind in conv / bn / dense / pos, or None."""
  m = re.fullmatch(r"visual\.(conv[123])\.weight", name)
  if m:
    return ("visual", m[1], "kernel"), "conv"
  m = re.fullmatch(r"visual\.(bn[123])\.(weight|bias|running_mean|running_var)", name)
  if m:
    return ("visual", m[1], _BN_LEAVES[m[2]]), "bn"
  m = re.fullmatch(r"visual\.layer(\d)\.(\d+)\.(conv[123]|bn[123]|downsample\.[01])\."
                   r"(weight|bias|running_mean|running_var)", name)
  if m:
    blk = f"layer{m[1]}_{m[2]}"
    part = {"downsample.0": "downsample_conv", "downsample.1": "downsample_bn"}.get(m[3], m[3])
    if "conv" in part:
      return ("visual", blk, part, "kernel"), "conv"
    return ("visual", blk, part, _BN_LEAVES[m[4]]), "bn"
  if name == "visual.attnpool.positional_embedding":
    return ("visual", "attnpool", "positional_embedding"), "pos"
  m = re.fullmatch(r"visual\.attnpool\.([qkvc]_proj)\.(weight|bias)", name)
  if m:
    return ("visual", "attnpool", m[1], "kernel" if m[2] == "weight" else "bias"), "dense"
  return None


def _text_names(layers: int) -> dict[str, tuple]:
  """OpenAI text-tower name -> (our path(s), kind)."""
  out = {"token_embedding.weight": (("text_model", "embeddings", "token_embedding",
                                     "embedding"), "raw"),
         "positional_embedding": (("text_model", "embeddings", "position_embedding",
                                   "embedding"), "raw"),
         "ln_final.weight": (("text_model", "final_layer_norm", "scale"), "raw"),
         "ln_final.bias": (("text_model", "final_layer_norm", "bias"), "raw"),
         "text_projection": (("text_projection", "kernel"), "raw"),   # stored [in, out]
         "logit_scale": (("logit_scale",), "raw")}
  for i in range(layers):
    pre, to = f"transformer.resblocks.{i}.", ("text_model", "encoder", f"layers_{i}")
    out[pre + "attn.in_proj_weight"] = (to + ("self_attn",), "qkv_w")
    out[pre + "attn.in_proj_bias"] = (to + ("self_attn",), "qkv_b")
    for src, dst in (("attn.out_proj", ("self_attn", "out_proj")), ("mlp.c_fc", ("mlp", "fc1")),
                     ("mlp.c_proj", ("mlp", "fc2"))):
      out[f"{pre}{src}.weight"] = (to + dst + ("kernel",), "dense")
      out[f"{pre}{src}.bias"] = (to + dst + ("bias",), "raw")
    for src, dst in (("ln_1", "layer_norm1"), ("ln_2", "layer_norm2")):
      out[f"{pre}{src}.weight"] = (to + (dst, "scale"), "raw")
      out[f"{pre}{src}.bias"] = (to + (dst, "bias"), "raw")
  return out


def _file(path: str) -> str:
  if os.path.isdir(path):
    for name in ("open_clip_model.safetensors", "model.safetensors"):
      if os.path.isfile(os.path.join(path, name)):
        return os.path.join(path, name)
    raise FileNotFoundError(f"{path!r} holds no open_clip_model.safetensors (the open_clip / "
                            "OpenAI CLIP layout; convert a .pt state dict with "
                            "safetensors.torch.save_file).")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"no CLIP ResNet checkpoint at {path!r}.")
  return path


def _infer_config(t: dict[str, np.ndarray]) -> RNConfig:
  layers = tuple(1 + max(int(m[2]) for m in (re.match(r"visual\.layer(\d)\.(\d+)\.", k)
                                             for k in t) if m and m[1] == str(s))
                 for s in range(1, 5))
  width = t["visual.conv3.weight"].shape[0]
  pos = t["visual.attnpool.positional_embedding"]
  side = int(round((pos.shape[0] - 1) ** 0.5)) * 32
  text_layers = 1 + max(int(m[1]) for m in (re.match(r"transformer\.resblocks\.(\d+)\.", k)
                                            for k in t) if m)
  hidden = t["token_embedding.weight"].shape[1]
  text = C.TextConfig(vocab_size=t["token_embedding.weight"].shape[0], hidden_size=hidden,
                      intermediate_size=t["transformer.resblocks.0.mlp.c_fc.weight"].shape[0],
                      num_hidden_layers=text_layers, num_attention_heads=max(1, hidden // 64),
                      max_position_embeddings=t["positional_embedding"].shape[0],
                      eos_token_id=t["token_embedding.weight"].shape[0] - 1)
  return RNConfig(layers, width, max(1, width * 32 // 64),
                  t["visual.attnpool.c_proj.weight"].shape[0], side, text)


def load_checkpoint(path: str, dtype: Any = np.float32) -> tuple[RNConfig, dict[str, Any]]:
  """``(config, params)`` of a CLIP ResNet checkpoint in the OpenAI / open_clip layout (see the
  module docstring). The configuration is read off the tensors' shapes (text heads: width /
  64, OpenAI's rule); missing tensors raise KeyError naming some."""
  from safetensors import safe_open  # deferred: slow to import
  with safe_open(_file(path), framework="numpy") as f:
    t = {k: f.get_tensor(k) for k in f.keys()}
  cfg = _infer_config(t)
  names = _text_names(cfg.text.num_hidden_layers)
  flat: dict[tuple, np.ndarray] = {}
  for name, x in t.items():
    if name in names:
      to, kind = names[name]
      if kind == "dense":
        flat[to] = x.T
      elif kind in ("qkv_w", "qkv_b"):
        for part, piece in zip(("q_proj", "k_proj", "v_proj"), np.split(x, 3, axis=0)):
          flat[to + (part, "kernel" if kind == "qkv_w" else "bias")] = (
              piece.T if kind == "qkv_w" else piece)
      else:
        flat[to] = x
      continue
    hit = _visual_name(name)
    if hit is None:
      continue        # attn masks, num_batches_tracked, other buffers
    to, kind = hit
    flat[to] = x.transpose(2, 3, 1, 0) if kind == "conv" else (x.T if to[-1] == "kernel"
                                                               else x)
  want = flatten_paths(param_shapes(cfg))
  missing = sorted("/".join(p) for p in want if p not in flat)
  if missing:
    raise KeyError(f"{len(missing)} CLIP ResNet tensors are missing from {path!r}, e.g. "
                   f"{missing[:4]}.")
  bad = [("/".join(p), flat[p].shape, want[p].shape) for p in want
         if tuple(flat[p].shape) != tuple(want[p].shape)]
  if bad:
    raise ValueError(f"shape mismatch in {path!r}: {bad[:3]}.")
  return cfg, nest_paths({p: np.asarray(flat[p], dtype or flat[p].dtype) for p in want})


def save_checkpoint(path: str, params: dict[str, Any]) -> None:
  """Writes ``params`` (of :func:`init`'s tree) as a safetensors file in the OpenAI / open_clip
  layout (:func:`load_checkpoint` reads it back exactly)."""
  from safetensors.numpy import save_file
  flat = {p: np.asarray(v) for p, v in flatten_paths(params).items()}
  layers = 1 + max(int(p[2].split("_")[1]) for p in flat if p[:2] == ("text_model", "encoder"))
  inverse = {}
  for name, (to, kind) in _text_names(layers).items():
    if kind in ("qkv_w", "qkv_b"):
      leaf = "kernel" if kind == "qkv_w" else "bias"
      parts = [flat[to + (q, leaf)] for q in ("q_proj", "k_proj", "v_proj")]
      inverse[name] = np.concatenate([x.T for x in parts] if leaf == "kernel" else parts, 0)
    else:
      inverse[name] = flat[to].T if kind == "dense" else flat[to]
  back = {v: k for k, v in _BN_LEAVES.items()}
  for p, x in flat.items():
    if p[0] != "visual":
      continue
    if p[1] == "attnpool":
      inverse["visual.attnpool." + (p[2] if p[2] == "positional_embedding" else
                                    f"{p[2]}.{'weight' if p[3] == 'kernel' else 'bias'}")] = (
          x.T if p[-1] == "kernel" else x)
      continue
    if p[1].startswith("layer"):
      stage, j = p[1][len("layer"):].split("_")
      part = {"downsample_conv": "downsample.0", "downsample_bn": "downsample.1"}.get(p[2], p[2])
      prefix = f"visual.layer{stage}.{j}.{part}"
    else:
      prefix = f"visual.{p[1]}"
    if p[-1] == "kernel":
      inverse[prefix + ".weight"] = x.transpose(3, 2, 0, 1)
    else:
      inverse[prefix + "." + back[p[-1]]] = x
  save_file({k: np.array(v, order="C") for k, v in inverse.items()}, path)


def as_clip_config(cfg: RNConfig) -> C.CLIPConfig:
  """A :class:`~fedjaxsparse.models.clip.CLIPConfig` carrying the ResNet's image size, text
  tower and embedding width: the text tower's parameters (``text_model``,
  ``text_projection``) have the same tree as the ViT models', so
  :func:`~fedjaxsparse.models.clip.text_features` and
  :func:`~fedjaxsparse.models.clip_teacher.prompt_tuning` (CoOp) take this config with a ResNet
  checkpoint's parameters."""
  return C.CLIPConfig(vision_config=C.VisionConfig(image_size=cfg.image_size),
                      text_config=cfg.text, projection_dim=cfg.output_dim)


def zero_shot_teacher(path_or_params: str | os.PathLike | dict[str, Any],
                      cfg: RNConfig | None, class_token_ids: Any,
                      batch_size: int = 256) -> T.ZeroShotTeacher:
  """:func:`fedjaxsparse.models.clip_teacher.zero_shot_teacher` for a CLIP ResNet: a checkpoint path
  (``cfg`` None: inferred) or a parameter tree with its ``cfg``; ``class_token_ids int[K, L]``
  or ``[K, M, L]`` (prompt ensembles). The teacher's ``cfg`` is a
  :class:`~fedjaxsparse.models.clip.CLIPConfig` carrying the image size and embedding width."""
  if isinstance(path_or_params, (str, os.PathLike)):
    loaded_cfg, params = load_checkpoint(os.fspath(path_or_params))
    cfg = cfg or loaded_cfg
  else:
    if cfg is None:
      raise ValueError("cfg is required when path_or_params is a parameter tree.")
    params = path_or_params
  ids = T.check_token_ids(class_token_ids, cfg.text)
  emb = T.class_embeddings(functools.partial(text_features, cfg), params, ids, batch_size)
  clip_cfg = as_clip_config(cfg)
  return T.ZeroShotTeacher(image_fn=functools.partial(image_features, cfg),
                           class_emb=jax.device_put(np.asarray(emb, np.float32)),
                           logit_scale=jax.device_put(np.asarray(params["logit_scale"],
                                                                 np.float32)),
                           params={"visual": jax.tree.map(jax.device_put, params["visual"])},
                           cfg=clip_cfg)
