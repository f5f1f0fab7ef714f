"""Decoder-only transformer language models in flax, in the two families that SymWanda (Yi and
Richtárik 2025; chapter 6 of Kai Yi's dissertation) prunes: **LLaMA-style** (RMSNorm, rotary
embeddings, SwiGLU, grouped-query attention; LLaMA-2/3) and **OPT-style** (learned positions
offset by 2, pre-LayerNorm, ReLU MLP, biases).

Parameter names follow the Hugging Face checkpoints, so :mod:`fedjaxsparse.models.hf` maps them one to
one: block ``i`` is ``layers_{i}`` with ``self_attn/{q,k,v,o|out}_proj``, ``mlp/{gate,up,down}_proj``
(LLaMA) or ``fc1``/``fc2`` (OPT); every linear layer's ``kernel`` is flax's ``(in, out)`` layout.
Each :class:`Linear` sows its input into the ``"calib"`` collection when that collection is
mutable — this is how :mod:`fedjaxsparse.pruning.sequential` collects per-layer calibration statistics
one block at a time (``Block(cfg).apply({"params": p}, h, mutable=["calib"])``).

Shapes: token ids ``int32[B, T]`` → logits ``float32[B, T, V]``; hidden states ``[B, T, H]``.
Attention is causal with no padding (calibration and perplexity windows are full).

Source for the team: seed 001 ch. 6, l. 1830.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.extend.core as jex_core
import jax.numpy as jnp
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["TransformerConfig", "Linear", "rotary", "Attention", "Block", "Decoder", "init",
           "block_params", "next_token_loss"]
__dir__ = _public_dir(__all__)

ARCHS = ("llama", "opt")


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
  """The fields both families need (names as in Hugging Face ``config.json``)."""
  arch: str = "llama"
  vocab_size: int = 256
  hidden_size: int = 128
  intermediate_size: int = 352
  num_layers: int = 4
  num_heads: int = 4
  num_kv_heads: int = 2
  max_positions: int = 256
  norm_eps: float = 1e-5
  rope_theta: float = 10000.0
  tie_embeddings: bool = False
  bias: bool = False            # LLaMA: attention/MLP biases (False); OPT: True

  def __post_init__(self):
    if self.arch not in ARCHS:
      raise ValueError(f"arch must be one of {ARCHS}, got {self.arch!r}.")
    if self.hidden_size % self.num_heads:
      raise ValueError(f"hidden_size {self.hidden_size} must be divisible by num_heads "
                       f"{self.num_heads}.")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads {self.num_heads} must be a multiple of num_kv_heads "
                       f"{self.num_kv_heads} (grouped-query attention).")

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads


class Linear(nn.Module):
  """``y = x @ kernel (+ bias)``, ``kernel [in, out]``; sows ``x`` into ``"calib"``."""
  features: int
  use_bias: bool = False

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    self.sow("calib", "inputs", x)
    kernel = self.param("kernel", nn.initializers.normal(0.02), (x.shape[-1], self.features))
    y = x @ kernel.astype(x.dtype)
    if self.use_bias:
      y = y + self.param("bias", nn.initializers.zeros, (self.features,)).astype(x.dtype)
    return y


def rotary(x: jax.Array, theta: float) -> jax.Array:
  """Rotary embedding of ``x [B, T, heads, d]`` at positions ``0..T-1``, in Hugging Face's
  half-split convention (``rotate_half``), which its LLaMA checkpoints' q/k weights assume."""
  t, d = x.shape[1], x.shape[-1]
  inv_freq = 1.0 / theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d)
  ang = jnp.arange(t, dtype=jnp.float32)[:, None] * inv_freq[None, :]
  cos = jnp.cos(jnp.concatenate([ang, ang], -1))[None, :, None, :]
  sin = jnp.sin(jnp.concatenate([ang, ang], -1))[None, :, None, :]
  x1, x2 = jnp.split(x, 2, axis=-1)
  return (x * cos + jnp.concatenate([-x2, x1], -1) * sin).astype(x.dtype)


class Attention(nn.Module):
  cfg: TransformerConfig

  @nn.compact
  def __call__(self, h: jax.Array) -> jax.Array:
    cfg = self.cfg
    b, t, _ = h.shape
    d, nh, nkv = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
    q = Linear(nh * d, cfg.bias, name="q_proj")(h).reshape(b, t, nh, d)
    k = Linear(nkv * d, cfg.bias, name="k_proj")(h).reshape(b, t, nkv, d)
    v = Linear(nkv * d, cfg.bias, name="v_proj")(h).reshape(b, t, nkv, d)
    if cfg.arch == "llama":
      q, k = rotary(q, cfg.rope_theta), rotary(k, cfg.rope_theta)
    k = jnp.repeat(k, nh // nkv, axis=2)
    v = jnp.repeat(v, nh // nkv, axis=2)
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / jnp.sqrt(d)
    causal = jnp.tril(jnp.ones((t, t), bool))
    probs = jax.nn.softmax(jnp.where(causal, logits, jnp.finfo(jnp.float32).min), axis=-1)
    out = jnp.einsum("bhqk,bkhd->bqhd", probs.astype(v.dtype), v).reshape(b, t, nh * d)
    return Linear(cfg.hidden_size, cfg.bias, name="o_proj" if cfg.arch == "llama"
                  else "out_proj")(out)


def _norm(cfg: TransformerConfig, name: str) -> nn.Module:
  if cfg.arch == "llama":
    return nn.RMSNorm(epsilon=cfg.norm_eps, name=name)
  return nn.LayerNorm(epsilon=cfg.norm_eps, name=name)


class Block(nn.Module):
  """One pre-norm decoder block ``[B, T, H] → [B, T, H]``."""
  cfg: TransformerConfig

  @nn.compact
  def __call__(self, h: jax.Array) -> jax.Array:
    cfg = self.cfg
    if cfg.arch == "llama":
      h = h + Attention(cfg, name="self_attn")(_norm(cfg, "input_layernorm")(h))
      x = _norm(cfg, "post_attention_layernorm")(h)
      return h + _SwiGLU(cfg, name="mlp")(x)
    h = h + Attention(cfg, name="self_attn")(_norm(cfg, "self_attn_layer_norm")(h))
    x = _norm(cfg, "final_layer_norm")(h)
    x = jax.nn.relu(Linear(cfg.intermediate_size, True, name="fc1")(x))
    return h + Linear(cfg.hidden_size, True, name="fc2")(x)


class _SwiGLU(nn.Module):
  cfg: TransformerConfig

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    cfg = self.cfg
    gate = Linear(cfg.intermediate_size, cfg.bias, name="gate_proj")(x)
    up = Linear(cfg.intermediate_size, cfg.bias, name="up_proj")(x)
    return Linear(cfg.hidden_size, cfg.bias, name="down_proj")(jax.nn.silu(gate) * up)


class Decoder(nn.Module):
  """The whole model: ``embed`` → ``layers_0..L-1`` → ``head``. ``embed`` and ``head`` are
  methods so a block-sequential pass can run them alone (``apply(..., method="embed")``)."""
  cfg: TransformerConfig

  def setup(self):
    cfg = self.cfg
    self.embed_tokens = nn.Embed(cfg.vocab_size, cfg.hidden_size,
                                 embedding_init=nn.initializers.normal(0.02))
    if cfg.arch == "opt":  # Hugging Face's OPT offsets learned positions by 2
      self.embed_positions = nn.Embed(cfg.max_positions + 2, cfg.hidden_size,
                                      embedding_init=nn.initializers.normal(0.02))
    self.layers = [Block(cfg) for _ in range(cfg.num_layers)]
    self.norm = _norm(cfg, None)
    if not cfg.tie_embeddings:
      self.lm_head = Linear(cfg.vocab_size, False)

  def embed(self, ids: jax.Array) -> jax.Array:
    if ids.shape[1] > self.cfg.max_positions:
      raise ValueError(f"sequence length {ids.shape[1]} exceeds max_positions "
                       f"{self.cfg.max_positions}.")
    h = self.embed_tokens(ids)
    if self.cfg.arch == "opt":
      h = h + self.embed_positions(jnp.arange(ids.shape[1]) + 2)[None]
    return h

  def head(self, h: jax.Array) -> jax.Array:
    h = self.norm(h)
    if self.cfg.tie_embeddings:
      return self.embed_tokens.attend(h).astype(jnp.float32)
    return self.lm_head(h).astype(jnp.float32)

  def __call__(self, ids: jax.Array) -> jax.Array:
    h = self.embed(ids)
    for layer in self.layers:
      h = layer(h)
    return self.head(h)


def init(cfg: TransformerConfig, key: jax.Array, seq_len: int = 8) -> dict[str, Any]:
  """Random parameters (``normal(0.02)`` kernels and embeddings): ``Decoder(cfg).init`` on a
  dummy ``[1, seq_len]`` input. Its forward pass only shapes the parameters, so it is traced
  once and its jaxpr pruned to the operations the parameters depend on, which then run one by
  one as flax's ``init`` runs them (the same programs: the same numbers) — without compiling
  and running every operation of the discarded forward pass on the way."""
  closed, shapes = jax.make_jaxpr(
      lambda k: Decoder(cfg).init(k, jnp.zeros((1, seq_len), jnp.int32))["params"],
      return_shape=True)(key)
  jaxpr = closed.jaxpr
  needed = {v for v in jaxpr.outvars if isinstance(v, jex_core.Var)}
  kept = []
  for eqn in reversed(jaxpr.eqns):
    if eqn.effects or any(v in needed for v in eqn.outvars):
      kept.append(eqn)
      needed.update(v for v in eqn.invars if isinstance(v, jex_core.Var))
  pruned = jex_core.ClosedJaxpr(jaxpr.replace(eqns=kept[::-1]), closed.consts)
  return jax.tree.unflatten(jax.tree.structure(shapes), jex_core.jaxpr_as_fun(pruned)(key))


def block_params(params: dict[str, Any], i: int) -> dict[str, Any]:
  return params[f"layers_{i}"]


def next_token_loss(logits: jax.Array, ids: jax.Array) -> jax.Array:
  """Mean cross-entropy of predicting ``ids[:, 1:]`` from ``logits[:, :-1]``."""
  lp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
  return -jnp.mean(jnp.take_along_axis(lp, ids[:, 1:, None], axis=-1))
