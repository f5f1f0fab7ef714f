"""Neural networks (flax linen) behind the :class:`~fedjaxsparse.models.base.Model` interface.

The params pytree is the linen ``{'params': ...}`` collection, so ``jax.vmap`` over a client
axis of params works directly. Normalisation has no mutable state:

* ``norm="group"`` (default): GroupNorm, stateless — the usual choice in federated learning,
  where BatchNorm's statistics are skewed by non-IID clients (Hsieh et al. 2020).
* ``norm="batch"``: BatchNorm that always normalises with the statistics of the current batch,
  in training *and* evaluation (no running averages). The model stays a pure function of its
  params; evaluation results then depend on the evaluation batch (use a fixed
  ``batch_size`` in :func:`fedjaxsparse.evaluation.evaluate`). Running statistics, if
  wanted, would be per-client state that an algorithm must carry explicitly.
"""
from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjaxsparse.models.base import CLASSIFICATION, Model, softmax_cross_entropy

NORMS = ("group", "batch")


def _norm(kind: str, channels: int) -> nn.Module:
  if kind == "group":
    return nn.GroupNorm(num_groups=min(32, channels))
  return nn.BatchNorm(use_running_average=False, momentum=0.9)


def _as_model(module: nn.Module, input_shape: Sequence[int], mutable_stats: bool) -> Model:
  def init(key):
    dummy = jnp.zeros((2,) + tuple(input_shape), jnp.float32)
    variables = module.init(key, dummy)
    return {"params": variables["params"]}

  def apply(params, x):
    if mutable_stats:  # batch statistics are recomputed from x and then discarded
      out, _ = module.apply(params, x, mutable=["batch_stats"])
      return out
    return module.apply(params, x)

  return Model(init, apply, softmax_cross_entropy, None, CLASSIFICATION)


class _MLP(nn.Module):
  hidden: Sequence[int]
  num_classes: int

  @nn.compact
  def __call__(self, x):
    x = x.reshape(x.shape[0], -1)
    for h in self.hidden:
      x = nn.relu(nn.Dense(h)(x))
    return nn.Dense(self.num_classes)(x)


def mlp(input_shape: Sequence[int], num_classes: int, hidden: Sequence[int] = (200, 200)
        ) -> Model:
  """A ReLU MLP (McMahan et al. 2017's "2NN" with the default ``hidden=(200, 200)``)."""
  return _as_model(_MLP(tuple(hidden), num_classes), input_shape, False)


class _CNN(nn.Module):
  num_classes: int
  channels: Sequence[int]
  dense: int

  @nn.compact
  def __call__(self, x):
    if x.ndim == 2:  # flat square images, e.g. digits' 64 features
      side = int(round(x.shape[1] ** 0.5))
      x = x.reshape(x.shape[0], side, side, 1)
    for c in self.channels:
      x = nn.relu(nn.Conv(c, (5, 5), padding="SAME")(x))
      x = nn.max_pool(x, (2, 2), strides=(2, 2), padding="SAME")
    x = x.reshape(x.shape[0], -1)
    x = nn.relu(nn.Dense(self.dense)(x))
    return nn.Dense(self.num_classes)(x)


def cnn(input_shape: Sequence[int], num_classes: int, channels: Sequence[int] = (32, 64),
        dense: int = 512) -> Model:
  """The FedAvg CNN of McMahan et al. 2017: two 5×5 conv layers (32, 64 channels), each
  followed by 2×2 max-pooling, a 512-unit dense layer and the output layer. Inputs
  ``[B, H, W, C]`` (or flat square images ``[B, H·W]``)."""
  return _as_model(_CNN(num_classes, tuple(channels), dense), input_shape, False)


class _BasicBlock(nn.Module):
  channels: int
  stride: int
  norm: str

  @nn.compact
  def __call__(self, x):
    y = nn.Conv(self.channels, (3, 3), (self.stride, self.stride), padding="SAME",
                use_bias=False)(x)
    y = nn.relu(_norm(self.norm, self.channels)(y))
    y = nn.Conv(self.channels, (3, 3), padding="SAME", use_bias=False)(y)
    y = _norm(self.norm, self.channels)(y)
    if self.stride != 1 or x.shape[-1] != self.channels:
      x = nn.Conv(self.channels, (1, 1), (self.stride, self.stride), use_bias=False)(x)
      x = _norm(self.norm, self.channels)(x)
    return nn.relu(x + y)


class _ResNet18(nn.Module):
  num_classes: int
  norm: str

  @nn.compact
  def __call__(self, x):
    x = nn.Conv(64, (3, 3), padding="SAME", use_bias=False)(x)
    x = nn.relu(_norm(self.norm, 64)(x))
    for i, channels in enumerate((64, 128, 256, 512)):
      for j in range(2):
        x = _BasicBlock(channels, 2 if (i > 0 and j == 0) else 1, self.norm)(x)
    x = jnp.mean(x, axis=(1, 2))
    return nn.Dense(self.num_classes)(x)


def resnet18(input_shape: Sequence[int], num_classes: int, norm: str = "group") -> Model:
  """CIFAR-style ResNet-18 (He et al. 2016): 3×3 stem, no max-pool, four stages of two
  BasicBlocks with 64/128/256/512 channels, global average pooling, linear head
  (11.17M parameters for 10 classes). ``norm``: see the module docstring."""
  if norm not in NORMS:
    raise ValueError(f"norm must be one of {NORMS}, got {norm!r}.")
  return _as_model(_ResNet18(num_classes, norm), input_shape, norm == "batch")


def num_params(params) -> int:
  """Number of scalar parameters in a params pytree."""
  return sum(int(leaf.size) for leaf in jax.tree.leaves(params))
