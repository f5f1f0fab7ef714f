"""CLIP (Hugging Face ``CLIPModel``) in flax — its configuration, the vision and text towers,
their features, the checkpoint layout and the image preprocessing — the network behind
Fed-LPFM's frozen zero-shot teacher (:mod:`fedjaxsparse.models.clip_teacher`: class logits
``exp(logit_scale) * normalize(img_emb) @ normalize(text_emb).T``, ``[B, K]``, and CoOp's
prompt tuning).

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

Source for the team: seed 004 Task 3.
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

from fedjaxsparse.models.hf import flatten_paths, nest_paths
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["VisionConfig", "TextConfig", "CLIPConfig", "config_from_hf", "config_to_hf",
           "load_config", "Attention", "MLP", "EncoderLayer", "Encoder", "VisionEmbeddings",
           "VisionTransformer", "pool_positions", "TextEmbeddings", "TextTransformer", "CLIP",
           "init", "param_shapes", "image_features", "text_features", "hf_name", "load_params",
           "save_params", "preprocess", "normalize"]
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


def normalize(x: jax.Array) -> jax.Array:
  """``x / ‖x‖₂`` along the last axis: CLIP's unit embeddings."""
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
    img, txt = normalize(self.image_features(images)), normalize(self.text_features(token_ids))
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
