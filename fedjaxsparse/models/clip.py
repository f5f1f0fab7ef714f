"""CLIP (Hugging Face ``CLIPModel``) in flax, as the frozen zero-shot teacher of Fed-LPFM: the
teacher's class logits are scaled cosine similarities between an image embedding and the embeddings
of one text prompt per class, ``logits = exp(logit_scale) * normalize(img_emb) @
normalize(text_emb).T`` (``[B, K]``).

Parameter names mirror the Hugging Face checkpoint one to one (``layers.{i}`` is ``layers_{i}``;
a linear ``weight [out, in]`` is a flax ``kernel [in, out]``; the patch conv ``weight
[out, in, kh, kw]`` is a flax ``kernel [kh, kw, in, out]``; LayerNorm ``weight`` is ``scale``;
an Embedding ``weight`` is ``embedding``), so :func:`load_params` reads ``config.json`` +
``model.safetensors`` (or a sharded ``model.safetensors.index.json``) and :func:`save_params`
writes the same layout. Only safetensors are read; convert a ``pytorch_model.bin`` checkpoint once
with ``CLIPModel.from_pretrained(DIR).save_pretrained(OUT, safe_serialization=True)``.

Shapes: images ``float[B, S, S, 3]`` (NHWC, ``S = image_size``, already normalised with CLIP's
mean/std, see :func:`preprocess`); token ids ``int[K, L]`` with ``L <= max_position_embeddings``.

Tokenization is out of scope: class prompts come as token-id arrays, e.g. from Hugging Face
``CLIPTokenizer.from_pretrained(DIR)([f"a photo of a {c}." for c in classes],
padding="max_length", return_tensors="np").input_ids`` (each row must hold the EOS token; padding
after it does not matter, the text tower is causal and pools at the EOS position).

Typical use (the teacher's logits for a whole data set, computed once and reused every round)::

  t = zero_shot_teacher(DIR, None, class_token_ids)
  size = t.cfg.vision_config.image_size
  logits = cached_logits(lambda p, x: teacher_logits(t, p, preprocess(x, size)), images,
                         params=t.params)

Source for the team: seed 004 Task 3, Table 11 (:func:`prompt_tuning`).
"""
from __future__ import annotations

import functools
import json
import math
import os
from typing import Any, Callable, NamedTuple

import flax.linen as nn
from flax.core import unfreeze
import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjaxsparse.models.hf import flatten_paths, nest_paths
from fedjaxsparse.errors import check_int
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["VisionConfig", "TextConfig", "CLIPConfig", "config_from_hf", "config_to_hf",
           "load_config", "Attention", "MLP", "EncoderLayer", "Encoder", "VisionEmbeddings",
           "VisionTransformer", "pool_positions", "TextEmbeddings", "TextTransformer", "CLIP",
           "init", "param_shapes", "image_features", "text_features", "hf_name", "load_params",
           "save_params", "preprocess", "ZeroShotTeacher", "check_token_ids", "zero_shot_teacher",
           "teacher_logits", "cached_logits", "PromptTuned", "prompt_tuning"]
__dir__ = _public_dir(__all__)

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
ACTIVATIONS = ("quick_gelu", "gelu")
LEGACY_EOS_TOKEN_ID = 2   # old openai configs: pool at argmax(input_ids) (EOS is the largest id)


# ---------------------------------------------------------------------------------------------
# configuration


class VisionConfig(NamedTuple):
  """``vision_config`` of a Hugging Face CLIP ``config.json`` (defaults: ViT-B/32)."""
  hidden_size: int = 768
  intermediate_size: int = 3072
  num_hidden_layers: int = 12
  num_attention_heads: int = 12
  image_size: int = 224
  patch_size: int = 32
  hidden_act: str = "quick_gelu"
  layer_norm_eps: float = 1e-5

  @property
  def grid(self) -> int:
    """Patches per side."""
    return self.image_size // self.patch_size

  @property
  def num_positions(self) -> int:
    """Class token + patches."""
    return self.grid ** 2 + 1


class TextConfig(NamedTuple):
  """``text_config`` of a Hugging Face CLIP ``config.json`` (defaults: ViT-B/32's text tower)."""
  vocab_size: int = 49408
  hidden_size: int = 512
  intermediate_size: int = 2048
  num_hidden_layers: int = 12
  num_attention_heads: int = 8
  max_position_embeddings: int = 77
  hidden_act: str = "quick_gelu"
  layer_norm_eps: float = 1e-5
  eos_token_id: int = 49407


class CLIPConfig(NamedTuple):
  """A Hugging Face ``CLIPModel`` configuration (defaults: ``openai/clip-vit-base-patch32``)."""
  vision_config: VisionConfig = VisionConfig()
  text_config: TextConfig = TextConfig()
  projection_dim: int = 512
  logit_scale_init_value: float = 2.6592


def _is_int(v: Any) -> bool:
  return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _tower(d: dict[str, Any], key: str, cls: type) -> Any:
  sub = d.get(key)
  legacy = d.get(key + "_dict")
  if legacy is not None:   # HF: `*_config_dict` (old configs) wins over `*_config`, defaults fill
    sub = legacy
  sub = {} if sub is None else sub
  if not isinstance(sub, dict):
    raise ValueError(f"{key} must be a dict, got {type(sub).__name__}.")
  vals = {f: sub.get(f, default) for f, default in cls._field_defaults.items()}
  for f, v in vals.items():
    name = f"{key}.{f}"
    if f == "hidden_act":
      if v not in ACTIVATIONS:
        raise ValueError(f"{name} must be one of {ACTIVATIONS}, got {v!r}.")
    elif f == "layer_norm_eps":
      if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 1:
        raise ValueError(f"{name} must be a number in (0, 1), got {v!r}.")
    elif f == "eos_token_id":
      if not _is_int(v) or not 0 <= v < vals["vocab_size"]:
        raise ValueError(f"{name} must be an integer in [0, vocab_size={vals['vocab_size']}), "
                         f"got {v!r}.")
    elif not _is_int(v) or v < 1:
      raise ValueError(f"{name} must be a positive integer, got {v!r}.")
  vals = {f: int(v) if _is_int(v) else v for f, v in vals.items()}
  if vals["hidden_size"] % vals["num_attention_heads"]:
    raise ValueError(f"{key}.num_attention_heads={vals['num_attention_heads']} must divide "
                     f"{key}.hidden_size={vals['hidden_size']}.")
  if key == "vision_config":
    if vals["patch_size"] > vals["image_size"]:
      raise ValueError(f"vision_config.patch_size={vals['patch_size']} must not exceed "
                       f"vision_config.image_size={vals['image_size']}.")
    if sub.get("num_channels", 3) != 3:
      raise ValueError(f"vision_config.num_channels must be 3 (RGB), got "
                       f"{sub['num_channels']!r}.")
  return cls(**vals)


def config_from_hf(d: dict[str, Any]) -> CLIPConfig:
  """A :class:`CLIPConfig` from a ``CLIPModel`` ``config.json`` dict (missing keys take Hugging
  Face's defaults; ValueError naming the key for what is not supported)."""
  if not isinstance(d, dict):
    raise ValueError(f"the config must be a dict, got {type(d).__name__}.")
  kind = d.get("model_type", "clip")
  if kind != "clip":
    raise ValueError(f"model_type must be 'clip' (a CLIPModel checkpoint), got {kind!r}.")
  proj = d.get("projection_dim", 512)
  if not _is_int(proj) or proj < 1:
    raise ValueError(f"projection_dim must be a positive integer, got {proj!r}.")
  scale = d.get("logit_scale_init_value", 2.6592)
  if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
    raise ValueError(f"logit_scale_init_value must be a finite number, got {scale!r}.")
  return CLIPConfig(_tower(d, "vision_config", VisionConfig), _tower(d, "text_config", TextConfig),
                    int(proj), float(scale))


def config_to_hf(cfg: CLIPConfig) -> dict[str, Any]:
  """The ``config.json`` dict of ``cfg`` (inverse of :func:`config_from_hf`)."""
  return {"model_type": "clip", "architectures": ["CLIPModel"],
          "projection_dim": cfg.projection_dim,
          "logit_scale_init_value": cfg.logit_scale_init_value,
          "vision_config": {**cfg.vision_config._asdict(), "num_channels": 3,
                            "projection_dim": cfg.projection_dim},
          "text_config": {**cfg.text_config._asdict(), "projection_dim": cfg.projection_dim},
          "torch_dtype": "float32"}


def load_config(path: str) -> CLIPConfig:
  """The :class:`CLIPConfig` of a local checkpoint directory."""
  f = os.path.join(path, "config.json")
  if not os.path.isfile(f):
    raise FileNotFoundError(
        f"{path!r} is not a Hugging Face checkpoint directory: config.json is missing. Download "
        "one (e.g. `huggingface-cli download openai/clip-vit-base-patch32 --local-dir DIR`).")
  with open(f) as fh:
    return config_from_hf(json.load(fh))


# ---------------------------------------------------------------------------------------------
# modules


def _act(name: str) -> Callable[[jax.Array], jax.Array]:
  if name == "quick_gelu":
    return lambda x: x * jax.nn.sigmoid(1.702 * x)
  return lambda x: jax.nn.gelu(x, approximate=False)   # HF "gelu" is the exact (erf) one


def _layer_norm(eps: float, name: str) -> nn.LayerNorm:
  return nn.LayerNorm(epsilon=eps, use_fast_variance=False, name=name)


class Attention(nn.Module):
  """Multi-head self-attention ``[B, T, H] -> [B, T, H]`` (q/k/v/out_proj with biases, scores
  scaled by ``head_dim**-0.5``, softmax in float32); ``mask [T, T]`` bool, True = may attend."""
  hidden_size: int
  num_heads: int

  @nn.compact
  def __call__(self, x: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    b, t, h = x.shape
    d = h // self.num_heads
    q, k, v = (nn.Dense(h, name=n)(x).reshape(b, t, self.num_heads, d)
               for n in ("q_proj", "k_proj", "v_proj"))
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) * d ** -0.5
    if mask is not None:
      s = jnp.where(mask, s, jnp.finfo(s.dtype).min)
    w = jax.nn.softmax(s.astype(jnp.float32), axis=-1).astype(q.dtype)
    o = jnp.einsum("bhqk,bkhd->bqhd", w, v).reshape(b, t, h)
    return nn.Dense(h, name="out_proj")(o)


class MLP(nn.Module):
  """``fc2(act(fc1(x)))``, ``[..., H] -> [..., H]``."""
  hidden_size: int
  intermediate_size: int
  hidden_act: str

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    y = _act(self.hidden_act)(nn.Dense(self.intermediate_size, name="fc1")(x))
    return nn.Dense(self.hidden_size, name="fc2")(y)


class EncoderLayer(nn.Module):
  """Pre-LN block: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``; ``[B, T, H] -> [B, T, H]``."""
  cfg: VisionConfig | TextConfig

  @nn.compact
  def __call__(self, x: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    c = self.cfg
    att = Attention(c.hidden_size, c.num_attention_heads, name="self_attn")
    x = x + att(_layer_norm(c.layer_norm_eps, "layer_norm1")(x), mask)
    mlp = MLP(c.hidden_size, c.intermediate_size, c.hidden_act, name="mlp")
    return x + mlp(_layer_norm(c.layer_norm_eps, "layer_norm2")(x))


class Encoder(nn.Module):
  """``num_hidden_layers`` :class:`EncoderLayer` s named ``layers_{i}``."""
  cfg: VisionConfig | TextConfig

  @nn.compact
  def __call__(self, x: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    for i in range(self.cfg.num_hidden_layers):
      x = EncoderLayer(self.cfg, name=f"layers_{i}")(x, mask)
    return x


class VisionEmbeddings(nn.Module):
  """``[B, S, S, 3] -> [B, 1 + grid**2, H]``: class embedding then the patches (bias-free conv,
  row-major), plus learned position embeddings."""
  cfg: VisionConfig

  @nn.compact
  def __call__(self, images: jax.Array) -> jax.Array:
    c, b = self.cfg, images.shape[0]
    cls = self.param("class_embedding", nn.initializers.normal(c.hidden_size ** -0.5),
                     (c.hidden_size,))
    p = c.patch_size
    patches = nn.Conv(c.hidden_size, (p, p), strides=(p, p), padding="VALID", use_bias=False,
                      name="patch_embedding")(images).reshape(b, -1, c.hidden_size)
    cls = jnp.broadcast_to(cls.astype(patches.dtype), (b, 1, c.hidden_size))
    pos = nn.Embed(c.num_positions, c.hidden_size, name="position_embedding")(
        jnp.arange(c.num_positions))
    return jnp.concatenate([cls, patches], axis=1) + pos


class VisionTransformer(nn.Module):
  """HF ``CLIPVisionTransformer``: ``images [B, S, S, 3] -> (last_hidden [B, 1 + P, H],
  pooled [B, H])`` (``post_layernorm`` of the class token)."""
  cfg: VisionConfig

  @nn.compact
  def __call__(self, images: jax.Array) -> tuple[jax.Array, jax.Array]:
    c = self.cfg
    want = (c.image_size, c.image_size, 3)
    if images.ndim != 4 or tuple(images.shape[1:]) != want:
      raise ValueError(f"images must have shape [B, {want[0]}, {want[1]}, 3] (NHWC, "
                       f"image_size={c.image_size}; see preprocess), got {tuple(images.shape)}.")
    x = VisionEmbeddings(c, name="embeddings")(images)
    x = _layer_norm(c.layer_norm_eps, "pre_layrnorm")(x)   # sic: HF's name
    x = Encoder(c, name="encoder")(x)
    return x, _layer_norm(c.layer_norm_eps, "post_layernorm")(x[:, 0])


def pool_positions(token_ids: jax.Array, eos_token_id: int) -> jax.Array:
  """``[K, L] -> [K]`` int: where HF pools the text tower — ``argmax(token_ids)`` when
  ``eos_token_id == 2`` (legacy openai configs, whose EOS is the largest id), else the first
  position equal to ``eos_token_id`` (0 if there is none)."""
  if eos_token_id == LEGACY_EOS_TOKEN_ID:
    return jnp.argmax(token_ids, axis=-1)
  return jnp.argmax(token_ids == eos_token_id, axis=-1)


class TextEmbeddings(nn.Module):
  """``[K, L] -> [K, L, H]``: token + learned position embeddings (positions ``0..L-1``);
  ``context`` (``[M, H]``, shared by the K prompts, or ``[K, M, H]``) replaces the token
  embeddings of positions ``1..M`` — CoOp's learned context words after the start token."""
  cfg: TextConfig

  @nn.compact
  def __call__(self, token_ids: jax.Array, context: jax.Array | None = None) -> jax.Array:
    c = self.cfg
    tok = nn.Embed(c.vocab_size, c.hidden_size, name="token_embedding")(token_ids)
    if context is not None:
      ctx = jnp.broadcast_to(context, (tok.shape[0],) + context.shape[-2:]).astype(tok.dtype)
      tok = jax.lax.dynamic_update_slice(tok, ctx, (0, 1, 0))
    pos = nn.Embed(c.max_position_embeddings, c.hidden_size, name="position_embedding")(
        jnp.arange(token_ids.shape[-1]))
    return tok + pos


class TextTransformer(nn.Module):
  """HF ``CLIPTextTransformer``: ``token_ids [K, L] -> (last_hidden [K, L, H] after
  final_layer_norm, pooled [K, H] at the EOS position)``; attention is causal."""
  cfg: TextConfig

  @nn.compact
  def __call__(self, token_ids: jax.Array, context: jax.Array | None = None
               ) -> tuple[jax.Array, jax.Array]:
    c = self.cfg
    if token_ids.ndim != 2 or not 1 <= token_ids.shape[1] <= c.max_position_embeddings:
      raise ValueError(f"token_ids must have shape [K, L] with 1 <= L <= "
                       f"max_position_embeddings={c.max_position_embeddings}, got "
                       f"{tuple(token_ids.shape)}.")
    if context is not None and (context.ndim not in (2, 3) or context.shape[-1] != c.hidden_size
                                or context.shape[-2] > token_ids.shape[1] - 2):
      raise ValueError(f"context must be [M, {c.hidden_size}] or [K, M, {c.hidden_size}] with "
                       f"M <= L - 2 = {token_ids.shape[1] - 2}, got {tuple(context.shape)}.")
    x = TextEmbeddings(c, name="embeddings")(token_ids, context)
    t = token_ids.shape[1]
    x = Encoder(c, name="encoder")(x, jnp.tril(jnp.ones((t, t), bool)))
    x = _layer_norm(c.layer_norm_eps, "final_layer_norm")(x)
    pooled = x[jnp.arange(x.shape[0]), pool_positions(token_ids, c.eos_token_id)]
    return x, pooled


def _unit(x: jax.Array) -> jax.Array:
  return x / jnp.sqrt(jnp.sum(x * x, axis=-1, keepdims=True))


class CLIP(nn.Module):
  """HF ``CLIPModel``: ``(images [B, S, S, 3], token_ids [K, L]) -> logits_per_image [B, K]``;
  :meth:`image_features` / :meth:`text_features` are the (unnormalised) projected embeddings
  ``[B, D]`` / ``[K, D]``."""
  cfg: CLIPConfig

  def setup(self):
    c = self.cfg
    self.vision_model = VisionTransformer(c.vision_config)
    self.text_model = TextTransformer(c.text_config)
    self.visual_projection = nn.Dense(c.projection_dim, use_bias=False)
    self.text_projection = nn.Dense(c.projection_dim, use_bias=False)
    self.logit_scale = self.param("logit_scale",
                                  nn.initializers.constant(c.logit_scale_init_value), ())

  def image_features(self, images: jax.Array) -> jax.Array:
    return self.visual_projection(self.vision_model(images)[1])

  def text_features(self, token_ids: jax.Array) -> jax.Array:
    return self.text_projection(self.text_model(token_ids)[1])

  def __call__(self, images: jax.Array, token_ids: jax.Array) -> jax.Array:
    img, txt = _unit(self.image_features(images)), _unit(self.text_features(token_ids))
    return jnp.exp(self.logit_scale) * img @ txt.T


def init(cfg: CLIPConfig, key: jax.Array) -> dict[str, Any]:
  """Random parameters of :class:`CLIP` (flax initialisers, not HF's)."""
  s = cfg.vision_config.image_size

  def fn(k: jax.Array) -> dict[str, Any]:
    return CLIP(cfg).init(k, jnp.zeros((1, s, s, 3)), jnp.zeros((1, 1), jnp.int32))["params"]

  return jax.jit(fn)(key)


def param_shapes(cfg: CLIPConfig) -> dict[str, Any]:
  """The parameter tree of :class:`CLIP` as ``jax.ShapeDtypeStruct`` s (nothing allocated)."""
  return _init_from_seed_0.eval_shape(cfg)   # traced once per config (jit's cache)


@functools.partial(jax.jit, static_argnums=0)
def _init_from_seed_0(cfg: CLIPConfig) -> dict[str, Any]:
  return init(cfg, jax.random.key(0))   # only ever traced (param_shapes), never run


@functools.partial(jax.jit, static_argnums=0)
def image_features(cfg: CLIPConfig, params: dict[str, Any], images: jax.Array) -> jax.Array:
  """``[B, S, S, 3] -> [B, D]`` projected, unnormalised (jitted, ``cfg`` static); ``params``
  needs only ``vision_model`` and ``visual_projection``."""
  _, pooled = VisionTransformer(cfg.vision_config).apply(
      {"params": params["vision_model"]}, images)
  return nn.Dense(cfg.projection_dim, use_bias=False).apply(
      {"params": params["visual_projection"]}, pooled)


@functools.partial(jax.jit, static_argnums=0)
def text_features(cfg: CLIPConfig, params: dict[str, Any], token_ids: jax.Array,
                  context: jax.Array | None = None) -> jax.Array:
  """``[K, L] -> [K, D]`` projected, unnormalised (jitted, ``cfg`` static); ``params`` needs
  only ``text_model`` and ``text_projection``; ``context`` (``[M, H]`` or ``[K, M, H]``)
  replaces the token embeddings at positions ``1..M`` (:func:`prompt_tuning`)."""
  _, pooled = TextTransformer(cfg.text_config).apply({"params": params["text_model"]}, token_ids,
                                                     context)
  return nn.Dense(cfg.projection_dim, use_bias=False).apply(
      {"params": params["text_projection"]}, pooled)


# ---------------------------------------------------------------------------------------------
# checkpoints

_LEAF_TO_HF = {"kernel": "weight", "scale": "weight", "embedding": "weight"}


def hf_name(path: tuple[str, ...]) -> str:
  """The Hugging Face tensor name of a flax parameter path, e.g. ``("vision_model", "encoder",
  "layers_0", "self_attn", "q_proj", "kernel")`` -> ``vision_model.encoder.layers.0.self_attn.
  q_proj.weight``."""
  parts = [("layers." + p[len("layers_"):]) if p.startswith("layers_") else p for p in path[:-1]]
  return ".".join(parts + [_LEAF_TO_HF.get(path[-1], path[-1])])


def _from_hf(path: tuple[str, ...], x: np.ndarray) -> np.ndarray:
  if path[-1] == "kernel":
    return x.transpose(2, 3, 1, 0) if x.ndim == 4 else x.T   # [o,i,kh,kw] -> [kh,kw,i,o]
  return x


def _to_hf(path: tuple[str, ...], x: np.ndarray) -> np.ndarray:
  if path[-1] == "kernel":
    return x.transpose(3, 2, 0, 1) if x.ndim == 4 else x.T   # [kh,kw,i,o] -> [o,i,kh,kw]
  return x


def _read(path: str, names: list[str]) -> dict[str, np.ndarray]:
  from safetensors import safe_open  # deferred: safetensors is slow to import
  index = os.path.join(path, "model.safetensors.index.json")
  if os.path.isfile(index):
    with open(index) as f:
      where = json.load(f)["weight_map"]
  elif os.path.isfile(os.path.join(path, "model.safetensors")):
    where = None
  else:
    raise FileNotFoundError(f"{path!r} has no model.safetensors(.index.json); only the "
                            "safetensors format is read (convert pytorch_model.bin first).")
  by_file: dict[str, list[str]] = {}
  missing = []
  for n in names:
    fname = "model.safetensors" if where is None else where.get(n)
    (missing.append(n) if fname is None else by_file.setdefault(fname, []).append(n))
  out = {}
  for fname, group in by_file.items():
    with safe_open(os.path.join(path, fname), framework="numpy") as f:
      keys = set(f.keys())
      for n in group:
        if n in keys:
          out[n] = f.get_tensor(n)
        else:
          missing.append(n)
  if missing:
    raise KeyError(f"{len(missing)} CLIPModel tensors are missing from the checkpoint at "
                   f"{path!r}, e.g. {sorted(missing)[:4]} (is it a full CLIPModel, not a "
                   "CLIPVisionModel/CLIPTextModel?).")
  return out


def load_params(path: str, dtype: Any = np.float32) -> dict[str, Any]:
  """The :class:`CLIP` parameters (host numpy, ``dtype``; None keeps the stored one) of a local
  Hugging Face ``CLIPModel`` checkpoint directory. Extra tensors (e.g. old ``position_ids``
  buffers) are ignored; a shape that disagrees with ``config.json`` raises ValueError."""
  shapes = flatten_paths(param_shapes(load_config(path)))
  names = {p: hf_name(p) for p in shapes}
  raw = _read(path, list(names.values()))
  flat = {}
  for p, n in names.items():
    x = _from_hf(p, np.asarray(raw[n]))
    if shapes[p].shape == () and x.shape == (1,):   # a scalar stored as [1]
      x = x.reshape(())
    if x.shape != shapes[p].shape:
      raise ValueError(f"tensor {n!r} has shape {tuple(raw[n].shape)}, which does not fit "
                       f"config.json (flax {p} wants {tuple(shapes[p].shape)}).")
    flat[p] = x if dtype is None else x.astype(dtype)
  return nest_paths(flat)


def save_params(path: str, cfg_dict: dict[str, Any] | CLIPConfig, params: dict[str, Any]) -> None:
  """Writes ``config.json`` (``cfg_dict``) and ``model.safetensors`` (float32, Hugging Face
  names and layouts) — the format :func:`load_params` reads."""
  from safetensors.numpy import save_file  # deferred: safetensors is slow to import
  if isinstance(cfg_dict, CLIPConfig):
    cfg_dict = config_to_hf(cfg_dict)
  shapes = flatten_paths(param_shapes(config_from_hf(cfg_dict)))
  flat = flatten_paths(jax.tree.map(np.asarray, unfreeze(params)))
  if set(flat) != set(shapes):
    raise ValueError(f"params do not match the config: missing {sorted(set(shapes) - set(flat))}"
                     f", unexpected {sorted(set(flat) - set(shapes))}.")
  tensors = {}
  for p, x in flat.items():
    if x.shape != shapes[p].shape:
      raise ValueError(f"params {p} has shape {x.shape}, the config wants {shapes[p].shape}.")
    tensors[hf_name(p)] = np.array(_to_hf(p, x), np.float32, order="C")   # keeps 0-d
  os.makedirs(path, exist_ok=True)
  save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump({"model_type": "clip", "architectures": ["CLIPModel"], **cfg_dict}, f, indent=2)


# ---------------------------------------------------------------------------------------------
# images


def preprocess(images: Any, image_size: int) -> jax.Array:
  """``[B, H, W, C] -> float32[B, image_size, image_size, 3]`` as CLIP's image processor does:
  the shorter side is resized to ``image_size`` (``jax.image.resize``, bicubic, antialiased; PIL's
  bicubic on uint8 in HF is close, not bit-equal), the centre is cropped, then values are scaled
  to [0, 1] (integer inputs are divided by 255; float inputs must already lie in [0, 1]) and
  normalised with :data:`CLIP_MEAN` / :data:`CLIP_STD`. Grayscale (``C == 1``) is repeated to 3
  channels."""
  x = jnp.asarray(images)
  if x.ndim != 4 or x.shape[-1] not in (1, 3):
    raise ValueError(f"images must have shape [B, H, W, C] with C in (1, 3), got "
                     f"{tuple(x.shape)}.")
  if not _is_int(image_size) or image_size < 1:
    raise ValueError(f"image_size must be a positive integer, got {image_size!r}.")
  scale = 1 / 255 if jnp.issubdtype(x.dtype, jnp.integer) else 1.0
  x = x.astype(jnp.float32) * scale
  b, h, w, c = x.shape
  short = min(h, w)
  nh, nw = (image_size, int(image_size * w / h)) if h == short else \
      (int(image_size * h / w), image_size)
  if (nh, nw) != (h, w):
    x = jnp.clip(jax.image.resize(x, (b, nh, nw, c), "bicubic"), 0.0, 1.0)
  top, left = (nh - image_size) // 2, (nw - image_size) // 2
  x = x[:, top:top + image_size, left:left + image_size]
  if c == 1:
    x = jnp.repeat(x, 3, axis=-1)
  return (x - jnp.asarray(CLIP_MEAN)) / jnp.asarray(CLIP_STD)


# ---------------------------------------------------------------------------------------------
# the zero-shot teacher


class ZeroShotTeacher(NamedTuple):
  """A frozen CLIP zero-shot classifier over ``K`` classes.

  ``image_fn(params, images [B, S, S, 3]) -> [B, D]`` image embeddings (jitted, unnormalised);
  ``class_emb [K, D]`` unit-norm class-prompt embeddings; ``logit_scale`` the scalar *log* scale
  (the logits use ``exp(logit_scale)``, 100 for the released openai models); ``params`` what
  ``image_fn`` needs (``vision_model``, ``visual_projection``, on device); ``cfg`` the model's
  :class:`CLIPConfig`."""
  image_fn: Callable[[Any, jax.Array], jax.Array]
  class_emb: jax.Array
  logit_scale: jax.Array
  params: dict[str, Any]
  cfg: CLIPConfig


def check_token_ids(ids: Any, c: TextConfig) -> np.ndarray:
  """``ids`` as ``int32[K, L]`` or ``[K, M, L]`` after checking the shape, the vocabulary range
  and (for configs with a real EOS id) that every prompt holds its EOS token; ValueError
  otherwise."""
  ids = np.asarray(ids)
  if not np.issubdtype(ids.dtype, np.integer):
    raise ValueError(f"class_token_ids must be integer token ids, got dtype {ids.dtype}.")
  if ids.ndim not in (2, 3) or min(ids.shape) < 1 or ids.shape[-1] > c.max_position_embeddings:
    raise ValueError(f"class_token_ids must have shape [K, L] or [K, M, L] (M prompts per class) "
                     f"with L <= max_position_embeddings={c.max_position_embeddings}, got "
                     f"{ids.shape}.")
  if ids.min() < 0 or ids.max() >= c.vocab_size:
    raise ValueError(f"class_token_ids must lie in [0, vocab_size={c.vocab_size}), got "
                     f"[{ids.min()}, {ids.max()}].")
  if c.eos_token_id != LEGACY_EOS_TOKEN_ID:
    flat = ids.reshape(-1, ids.shape[-1])
    bad = np.flatnonzero(~(flat == c.eos_token_id).any(-1))
    if bad.size:
      raise ValueError(f"class_token_ids: {bad.size} prompt(s) (e.g. flat row {bad[0]}) hold no "
                       f"eos_token_id={c.eos_token_id}; tokenize with the model's tokenizer "
                       "(it appends EOS) and do not truncate it away.")
  return ids.astype(np.int32)


def zero_shot_teacher(path_or_params: str | os.PathLike | dict[str, Any],
                      cfg: CLIPConfig | dict[str, Any] | None,
                      class_token_ids: Any, batch_size: int = 256) -> ZeroShotTeacher:
  """The teacher of a checkpoint directory (``cfg`` None: its ``config.json``) or of a parameter
  tree (``cfg`` required: a :class:`CLIPConfig` or a ``config.json`` dict).

  ``class_token_ids int[K, L]``: one tokenized prompt per class (e.g. "a photo of a {class}."
  through HF ``CLIPTokenizer``); or ``int[K, M, L]``: M prompts per class, whose unit embeddings
  are averaged and renormalised (CLIP's prompt ensembling). Embedded ``batch_size`` at a time."""
  if isinstance(path_or_params, (str, os.PathLike)):
    path = os.fspath(path_or_params)
    cfg = load_config(path) if cfg is None else cfg
    params = load_params(path)
  else:
    if cfg is None:
      raise ValueError("cfg is required when path_or_params is a parameter tree.")
    params = path_or_params
  cfg = cfg if isinstance(cfg, CLIPConfig) else config_from_hf(cfg)
  ids = check_token_ids(class_token_ids, cfg.text_config)
  text = {k: params[k] for k in ("text_model", "text_projection")}
  emb = _batched(functools.partial(text_features, cfg), ids.reshape(-1, ids.shape[-1]),
                 batch_size, text)
  # host arrays go to the device with device_put (jnp.asarray compiles a program per shape)
  emb = np.asarray(_unit(jax.device_put(np.asarray(emb, np.float32))))
  if ids.ndim == 3:
    emb = np.asarray(_unit(jax.device_put(emb.reshape(ids.shape[0], ids.shape[1], -1).mean(1))))
  vision = jax.tree.map(jax.device_put, {k: params[k] for k in ("vision_model",
                                                               "visual_projection")})
  return ZeroShotTeacher(image_fn=functools.partial(image_features, cfg),
                         class_emb=jax.device_put(emb), logit_scale=jax.device_put(
                             np.asarray(params["logit_scale"], np.float32)), params=vision,
                         cfg=cfg)


def teacher_logits(teacher: ZeroShotTeacher, params: dict[str, Any] | None,
                   images: jax.Array) -> jax.Array:
  """``[B, S, S, 3] -> float32[B, K]``: ``exp(logit_scale) * cos(image_emb, class_emb)``
  (``params`` None: ``teacher.params``)."""
  img = teacher.image_fn(teacher.params if params is None else params, images)
  img = _unit(img.astype(jnp.float32))
  return jnp.exp(teacher.logit_scale) * img @ teacher.class_emb.T


def cached_logits(logits_fn: Callable[..., jax.Array], images: Any, batch_size: int = 256, *,
                  params: Any = None) -> np.ndarray:
  """``logits_fn`` over a whole data set, ``batch_size`` examples per jitted call: ``[N, ...] ->
  np.ndarray [N, K]``. Computed once, the teacher's logits are reused every round.

  ``logits_fn(batch)``, or ``logits_fn(params, batch)`` when ``params`` is given (pass weights
  that way rather than closing over them, so they are not baked into the program as constants).
  The last, short batch is padded (repeating its last example) so that one program serves all."""
  return _batched(jax.jit(logits_fn), images, batch_size, params)


def _batched(fn: Callable[..., jax.Array], images: Any, batch_size: int,
             params: Any) -> np.ndarray:
  x = np.asarray(images)
  if x.ndim < 1 or len(x) == 0:
    raise ValueError(f"images must hold at least one example, got shape {x.shape}.")
  if not _is_int(batch_size) or batch_size < 1:
    raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}.")
  n, bs = len(x), min(int(batch_size), len(x))
  outs = []
  for s in range(0, n, bs):
    batch = x[s:s + bs]
    k = len(batch)
    if k < bs:
      batch = np.concatenate([batch, np.repeat(batch[-1:], bs - k, axis=0)])
    out = fn(batch) if params is None else fn(params, batch)
    outs.append(out if k == bs else np.asarray(out)[:k])   # host slice: no program
  return np.concatenate([np.asarray(o) for o in outs])


# ---------------------------------------------------------------------------------------------
# prompt tuning (CoOp)


class PromptTuned(NamedTuple):
  """A CoOp result: ``context [M, H]`` (or ``[K, M, H]``) learned word vectors,
  ``class_emb [K, D]`` the unit class embeddings they give, ``losses [steps]``."""
  context: jax.Array
  class_emb: jax.Array
  losses: jax.Array


def prompt_tuning(cfg: CLIPConfig, params: dict[str, Any], prompt_ids: Any,
                  image_emb: Any, labels: Any, *, n_ctx: int = 4, class_specific: bool = False,
                  steps: int = 200, lr: float = 2e-3, weight_decay: float = 5e-4,
                  warmup_steps: int = 0, batch_size: int | None = 32, init_std: float = 0.02,
                  key: jax.Array | None = None) -> PromptTuned:
  """CoOp (Zhou et al. 2022): learn the ``n_ctx`` context word vectors of the class prompts
  ``[SOS] v_1 … v_M [CLASS] . [EOS]`` with CLIP frozen, by minimising the cross-entropy of
  ``exp(logit_scale)·cos(image_emb_b, text(prompt_k; v))`` over labelled image embeddings —
  the "prompt-tuned teacher" of Fed-LPFM's ablation (Table 11 of Xidong Wu's dissertation),
  fitted to one client's local data.

  References:
    Kaiyang Zhou, Jingkang Yang, Chen Change Loy, Ziwei Liu (2022). Learning to Prompt for
      Vision-Language Models. International Journal of Computer Vision 130:2337-2348.
      arXiv:2109.01134.

  ``prompt_ids int[K, L]``: each class's tokenised prompt whose positions ``1..n_ctx`` are
  placeholders (e.g. "X X X X {class}." through the tokenizer) — their embeddings are replaced
  by the context. ``image_emb [n, D]`` (CLIP's image embeddings; normalised here) and
  ``labels int[n]``. The context is shared by the classes (CoOp's unified context) or one per
  class (``class_specific``), initialised ``N(0, init_std²)`` (CoOp's random initialisation).
  SGD with that ablation's settings (lr 2e-3, weight decay 5e-4, cosine schedule after
  ``warmup_steps`` of linear warm-up), minibatches of ``batch_size`` drawn with replacement
  (``None``: all ``n``). Only the context moves: CLIP's parameters are constants."""
  ids = jax.device_put(check_token_ids(prompt_ids, cfg.text_config))
  if ids.ndim != 2:
    raise ValueError(f"prompt_ids must be [K, L] (one prompt per class), got {ids.shape}.")
  k_classes, length = ids.shape
  h = cfg.text_config.hidden_size
  if not isinstance(n_ctx, int) or not 1 <= n_ctx <= length - 2:
    raise ValueError(f"n_ctx must be an int in [1, L - 2 = {length - 2}], got {n_ctx!r}.")
  steps = check_int("steps", steps, 1)
  # host-side checks and conversions (numpy: no program per shape for what is only checked)
  emb = np.asarray(image_emb, np.float32)
  y = np.asarray(labels).astype(np.int32)
  if emb.ndim != 2 or y.shape != (emb.shape[0],) or emb.shape[0] < 1:
    raise ValueError(f"image_emb must be [n, D] with labels int[n], n >= 1; got "
                     f"{emb.shape} and {y.shape}.")
  if int(y.min()) < 0 or int(y.max()) >= k_classes:
    raise ValueError(f"labels must lie in [0, K = {k_classes}), got [{int(y.min())}, "
                     f"{int(y.max())}].")
  emb = _unit(jax.device_put(emb))
  key = jax.random.key(0) if key is None else key
  k_init, k_batch = jax.random.split(key)
  shape = (k_classes, n_ctx, h) if class_specific else (n_ctx, h)
  ctx0 = init_std * jax.random.normal(k_init, shape, jnp.float32)
  text = {k: params[k] for k in ("text_model", "text_projection")}
  scale = jnp.exp(jnp.asarray(params["logit_scale"], jnp.float32))
  settings = dict(batch_size=batch_size, steps=steps, lr=lr, weight_decay=weight_decay,
                  warmup_steps=warmup_steps)
  y = jax.device_put(y)
  if batch_size is None:   # full batches: the data are constants of the program too (folded)
    loop = _coop_loop(cfg, text, **settings)
    ctx, losses = jax.jit(lambda c: loop(c, k_batch, ids, emb, y, scale))(ctx0)
  else:                    # minibatches: one program per weights and settings, data as inputs
    ctx, losses = _coop_program(cfg, text, **settings)(ctx0, k_batch, ids, emb, y, scale)
  classes = _unit(text_features(cfg, text, ids, ctx).astype(jnp.float32))
  return PromptTuned(ctx, classes, losses)


_COOP_PROGRAM: list = []   # the last [(settings, CLIP text weights it was traced with, fit)]


def _same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
  return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(
      np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8))


def _coop_program(cfg: CLIPConfig, text: dict[str, Any], **settings: Any) -> Callable:
  """The jitted CoOp loop ``fit(ctx0, k_batch, ids, emb, y, scale) -> (context, losses)`` of
  :func:`prompt_tuning` (minibatches) for CLIP's text weights ``text`` and ``settings``. The
  weights are constants of the program (closed over: XLA folds them into the code, which fixes
  the numbers), so a program serves only the same weights: the last one is kept and reused
  while the weights are bit for bit the same (e.g. one CoOp per client of a federated data
  set) rather than traced and compiled again for every call."""
  leaves, treedef = jax.tree.flatten(text)
  host = [np.asarray(x) for x in leaves]
  key = (cfg, treedef, tuple(sorted(settings.items())),
         tuple((h.shape, h.dtype, isinstance(x, jax.Array)) for h, x in zip(host, leaves)))
  try:
    hash(key)
  except TypeError:          # unhashable settings (e.g. an array lr): no reuse
    return jax.jit(_coop_loop(cfg, text, **settings))
  if _COOP_PROGRAM:
    k, kept, fit = _COOP_PROGRAM[0]
    if k == key and all(_same_bytes(np.asarray(a), b) for a, b in zip(kept, host)):
      return fit
  # a copy of host arrays (the caller may change them in place; device arrays cannot change)
  kept = [x if isinstance(x, jax.Array) else np.array(h, copy=True) for x, h in zip(leaves, host)]
  fit = jax.jit(_coop_loop(cfg, jax.tree.unflatten(treedef, kept), **settings))
  _COOP_PROGRAM[:] = [(key, kept, fit)]
  return fit


def _coop_loop(cfg: CLIPConfig, text: dict[str, Any], *, batch_size: int | None, steps: int,
               lr: float, weight_decay: float, warmup_steps: int) -> Callable:
  """:func:`prompt_tuning`'s ``steps`` SGD steps from ``ctx0`` as a function of the context,
  the batch key, the prompts, the image embeddings, labels and logit scale."""
  schedule = optax.warmup_cosine_decay_schedule(0.0 if warmup_steps else lr, lr,
                                                warmup_steps, max(steps, warmup_steps + 1))
  opt = optax.chain(optax.add_decayed_weights(weight_decay), optax.sgd(schedule, momentum=0.9))

  def fit(ctx0, k_batch, ids, emb, y, scale):
    n = emb.shape[0]

    def loss(ctx, e, t):
      logits = scale * e @ _unit(text_features(cfg, text, ids, ctx).astype(jnp.float32)).T
      return jnp.mean(jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(
          logits, t[:, None], -1)[:, 0])

    def body(carry, k):
      c, s = carry
      if batch_size is None:
        e, t = emb, y
      else:
        idx = jax.random.randint(k, (batch_size,), 0, n)
        e, t = emb[idx], y[idx]
      value, g = jax.value_and_grad(loss)(c, e, t)
      u, s = opt.update(g, s, c)
      return (optax.apply_updates(c, u), s), value

    (c, _), losses = jax.lax.scan(body, (ctx0, opt.init(ctx0)),
                                  jax.random.split(k_batch, steps))
    return c, losses

  return fit
