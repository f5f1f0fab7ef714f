"""Hugging Face checkpoint directories (``config.json`` + ``model.safetensors``, or sharded with
``model.safetensors.index.json``) ↔ :mod:`fedjaxsparse.models.transformer` parameters.

Reading is lazy and per tensor (``safetensors.safe_open``), so :func:`block` loads one decoder
block at a time into host memory — a model larger than the accelerator can be pruned block by
block (:mod:`fedjaxsparse.pruning.sequential`). Linear weights are stored ``[out, in]`` (PyTorch) and
become flax kernels ``[in, out]``. :func:`save` writes the same format (the test checkpoints,
the Shakespeare model this library trains, and pruned models).

Supported ``model_type``: ``"llama"`` (also Mistral-like configs without sliding windows or rope
scaling) and ``"opt"`` (without ``project_in``/``project_out``, i.e. not OPT-350m). Only the
safetensors format is read: a checkpoint shipped as ``pytorch_model.bin`` (e.g.
``facebook/opt-1.3b``) is converted once with ``transformers``:
``AutoModelForCausalLM.from_pretrained(DIR).save_pretrained(OUT, safe_serialization=True)``.
"""
from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from fedjaxsparse.errors import DataError
from fedjaxsparse.models.transformer import TransformerConfig
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["config_from_hf", "config_to_hf", "nest_paths", "flatten_paths", "Checkpoint", "save"]
__dir__ = _public_dir(__all__)

_LLAMA_LINEAR = {"self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"),
                 "mlp": ("gate_proj", "up_proj", "down_proj")}
_OPT_LINEAR = {"self_attn": ("q_proj", "k_proj", "v_proj", "out_proj"), "": ("fc1", "fc2")}


def _json(file: str, what: str) -> dict:
  """A JSON object from ``file``, or a one-line DataError naming the file."""
  try:
    with open(file) as f:
      out = json.load(f)
  except json.JSONDecodeError as e:
    raise DataError(f"{file}: not valid JSON ({e}); expected {what}.") from None
  if not isinstance(out, dict):
    raise DataError(f"{file}: expected {what} (a JSON object), got {type(out).__name__}.")
  return out


def config_from_hf(d: dict[str, Any]) -> TransformerConfig:
  """A :class:`TransformerConfig` from a ``config.json`` dict (clear errors for what is not
  supported)."""
  kind = d.get("model_type")
  if kind == "llama" or kind == "mistral":
    if d.get("rope_scaling"):
      raise ValueError(f"rope_scaling={d['rope_scaling']!r} is not supported (LLaMA-2 and "
                       "LLaMA-3 8B have none).")
    if d.get("hidden_act", "silu") != "silu":
      raise ValueError(f"hidden_act must be 'silu', got {d['hidden_act']!r}.")
    if d.get("sliding_window") is not None:
      raise ValueError(f"sliding_window={d['sliding_window']!r} is not supported.")
    if d.get("mlp_bias", False) != d.get("attention_bias", False):
      raise ValueError("mlp_bias != attention_bias is not supported (one bias switch).")
    if "head_dim" in d and d["head_dim"] != d["hidden_size"] // d["num_attention_heads"]:
      raise ValueError("head_dim != hidden_size / num_attention_heads is not supported.")
    return TransformerConfig(
        arch="llama", vocab_size=d["vocab_size"], hidden_size=d["hidden_size"],
        intermediate_size=d["intermediate_size"], num_layers=d["num_hidden_layers"],
        num_heads=d["num_attention_heads"],
        num_kv_heads=d.get("num_key_value_heads") or d["num_attention_heads"],
        max_positions=d.get("max_position_embeddings", 2048),
        norm_eps=d.get("rms_norm_eps", 1e-6), rope_theta=d.get("rope_theta", 10000.0),
        tie_embeddings=d.get("tie_word_embeddings", False),
        bias=d.get("attention_bias", False))
  if kind == "opt":
    if d.get("word_embed_proj_dim", d["hidden_size"]) != d["hidden_size"]:
      raise ValueError("OPT with word_embed_proj_dim != hidden_size (OPT-350m) is not supported.")
    if not d.get("do_layer_norm_before", True):
      raise ValueError("post-LayerNorm OPT (do_layer_norm_before=False) is not supported.")
    if d.get("activation_function", "relu") != "relu":
      raise ValueError(f"activation_function must be 'relu', got {d['activation_function']!r}.")
    return TransformerConfig(
        arch="opt", vocab_size=d["vocab_size"], hidden_size=d["hidden_size"],
        intermediate_size=d["ffn_dim"], num_layers=d["num_hidden_layers"],
        num_heads=d["num_attention_heads"], num_kv_heads=d["num_attention_heads"],
        max_positions=d.get("max_position_embeddings", 2048), norm_eps=1e-5,
        tie_embeddings=d.get("tie_word_embeddings", True), bias=d.get("enable_bias", True))
  raise ValueError(f"model_type must be 'llama' or 'opt', got {kind!r}.")


def config_to_hf(cfg: TransformerConfig) -> dict[str, Any]:
  if cfg.arch == "llama":
    return {"model_type": "llama", "architectures": ["LlamaForCausalLM"],
            "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
            "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_layers,
            "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
            "max_position_embeddings": cfg.max_positions, "rms_norm_eps": cfg.norm_eps,
            "rope_theta": cfg.rope_theta, "tie_word_embeddings": cfg.tie_embeddings,
            "attention_bias": cfg.bias, "mlp_bias": cfg.bias, "hidden_act": "silu",
            "torch_dtype": "float32"}
  return {"model_type": "opt", "architectures": ["OPTForCausalLM"],
          "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size, "ffn_dim":
          cfg.intermediate_size, "num_hidden_layers": cfg.num_layers,
          "num_attention_heads": cfg.num_heads, "max_position_embeddings": cfg.max_positions,
          "word_embed_proj_dim": cfg.hidden_size, "do_layer_norm_before": True,
          "activation_function": "relu", "enable_bias": cfg.bias,
          "tie_word_embeddings": cfg.tie_embeddings, "torch_dtype": "float32"}


def _prefix(cfg: TransformerConfig) -> str:
  return "model." if cfg.arch == "llama" else "model.decoder."


def _block_names(cfg: TransformerConfig, i: int) -> dict[tuple[str, ...], str]:
  """flax path → Hugging Face tensor name, for block ``i``."""
  pre = f"{_prefix(cfg)}layers.{i}."
  out = {}
  linear = _LLAMA_LINEAR if cfg.arch == "llama" else _OPT_LINEAR
  for group, names in linear.items():
    for n in names:
      base = (group, n) if group else (n,)
      hf = pre + (f"{group}.{n}" if group else n)
      out[base + ("kernel",)] = hf + ".weight"
      if cfg.bias:
        out[base + ("bias",)] = hf + ".bias"
  norms = (("input_layernorm", "post_attention_layernorm") if cfg.arch == "llama"
           else ("self_attn_layer_norm", "final_layer_norm"))
  for n in norms:
    out[(n, "scale")] = pre + n + ".weight"
    if cfg.arch == "opt":
      out[(n, "bias")] = pre + n + ".bias"
  return out


def _outer_names(cfg: TransformerConfig) -> dict[tuple[str, ...], str]:
  pre = _prefix(cfg)
  out = {("embed_tokens", "embedding"): pre + "embed_tokens.weight"}
  if cfg.arch == "llama":
    out[("norm", "scale")] = pre + "norm.weight"
  else:
    out[("embed_positions", "embedding")] = pre + "embed_positions.weight"
    out[("norm", "scale")] = pre + "final_layer_norm.weight"
    out[("norm", "bias")] = pre + "final_layer_norm.bias"
  if not cfg.tie_embeddings:
    out[("lm_head", "kernel")] = "lm_head.weight"
  return out


def nest_paths(flat: dict[tuple[str, ...], np.ndarray]) -> dict[str, Any]:
  """``{("a", "b"): v}`` -> ``{"a": {"b": v}}``: a nested params dict from path keys (the
  inverse of :func:`flatten_paths`)."""
  tree: dict[str, Any] = {}
  for path, v in flat.items():
    node = tree
    for k in path[:-1]:
      node = node.setdefault(k, {})
    node[path[-1]] = v
  return tree


def flatten_paths(tree: dict[str, Any], prefix=()) -> dict[tuple[str, ...], Any]:
  """``{"a": {"b": v}}`` -> ``{("a", "b"): v}``: a nested params dict as path keys."""
  out = {}
  for k, v in tree.items():
    out.update(flatten_paths(v, prefix + (k,)) if isinstance(v, dict) else {prefix + (k,): v})
  return out


class Checkpoint:
  """A local checkpoint directory: ``config`` and lazy, per-tensor reads (``dtype``: the host
  dtype of what is read, ``float32`` by default; None keeps the stored one)."""

  def __init__(self, path: str, dtype: Any = np.float32):
    cfg_file = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_file):
      raise FileNotFoundError(
          f"{path!r} is not a Hugging Face checkpoint directory: config.json is missing. "
          "Download one (e.g. `huggingface-cli download meta-llama/Llama-2-7b-hf --local-dir "
          "DIR`) and pass that directory.")
    self.hf_config = _json(cfg_file, "a Hugging Face config")
    try:
      self.config = config_from_hf(self.hf_config)
    except (KeyError, TypeError, ValueError) as e:
      raise DataError(f"{cfg_file}: not a usable model config ({e}).") from None
    self.path, self.dtype = path, dtype
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
      where = _json(index, "a safetensors index").get("weight_map")
      if not isinstance(where, dict):
        raise DataError(f"{index}: no 'weight_map' object (tensor name -> shard file).")
      self._where = where
    elif os.path.isfile(os.path.join(path, "model.safetensors")):
      self._where = {k: "model.safetensors"
                     for k in self._keys(os.path.join(path, "model.safetensors"))}
    else:
      raise FileNotFoundError(f"{path!r} has no model.safetensors(.index.json); only the "
                              "safetensors format is read (convert .bin files first).")

  @staticmethod
  def _keys(file: str) -> list[str]:
    from safetensors import SafetensorError, safe_open  # deferred: safetensors is slow to import
    try:
      with safe_open(file, framework="numpy") as f:
        return list(f.keys())
    except (SafetensorError, OSError, ValueError) as e:
      raise DataError(f"{file}: not a readable safetensors file ({e}); the file is damaged "
                      "or truncated — download it again.") from None

  def tensor(self, name: str) -> np.ndarray:
    from safetensors import SafetensorError, safe_open  # deferred: safetensors is slow to import
    for cand in (name, name.removeprefix("model."), "model." + name):
      if cand in self._where:
        file = os.path.join(self.path, self._where[cand])
        if not os.path.isfile(file):
          raise DataError(f"{file} (holding tensor {cand!r}) is missing from the checkpoint.")
        try:
          with safe_open(file, framework="numpy") as f:
            x = f.get_tensor(cand)
        except (SafetensorError, OSError, ValueError) as e:
          raise DataError(f"{file}: tensor {cand!r} cannot be read ({e}); the file is "
                          "damaged or truncated — download it again.") from None
        return x if self.dtype is None else x.astype(self.dtype)
    raise DataError(f"tensor {name!r} is not in the checkpoint at {self.path!r}: its "
                    f"config.json ({self.config.num_layers} layers) asks for more than the "
                    f"weights hold ({len(self._where)} tensors).")

  def _read(self, names: dict[tuple[str, ...], str]) -> dict[str, Any]:
    flat = {}
    for path, hf in names.items():
      x = self.tensor(hf)
      flat[path] = x.T if path[-1] == "kernel" else x
    return nest_paths(flat)

  def block(self, i: int) -> dict[str, Any]:
    """Block ``i``'s flax parameters (host numpy)."""
    if not 0 <= i < self.config.num_layers:
      raise ValueError(f"block must lie in [0, {self.config.num_layers}), got {i}.")
    return self._read(_block_names(self.config, i))

  def outer(self) -> dict[str, Any]:
    """Embeddings, final norm and (untied) head."""
    return self._read(_outer_names(self.config))

  def params(self) -> dict[str, Any]:
    """All parameters (host numpy) — for models that fit in memory."""
    out = self.outer()
    for i in range(self.config.num_layers):
      out[f"layers_{i}"] = self.block(i)
    return out


def save(path: str, cfg: TransformerConfig, params: dict[str, Any]) -> None:
  """Writes ``config.json`` and ``model.safetensors`` (float32, Hugging Face names)."""
  from safetensors.numpy import save_file  # deferred: safetensors is slow to import
  os.makedirs(path, exist_ok=True)
  names = dict(_outer_names(cfg))
  for i in range(cfg.num_layers):
    names.update({(f"layers_{i}",) + k: v for k, v in _block_names(cfg, i).items()})
  flat = flatten_paths(params)
  tensors = {}
  for p, hf in names.items():
    x = np.asarray(flat[p], np.float32)
    tensors[hf] = np.ascontiguousarray(x.T if p[-1] == "kernel" else x)
  save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(config_to_hf(cfg), f, indent=2)
