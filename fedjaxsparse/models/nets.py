"""Neural networks (flax linen) behind the :class:`~fedjaxsparse.core.Model` interface.

``init(key)`` initialises from a dummy input of ``input_shape`` (no batch axis) and returns
the linen ``params`` collection, a plain nested dict, so ``jax.vmap`` over a client axis of
params works directly; ``apply(params, x[B, ...]) -> logits[B, C]``.

Normalisation in :func:`resnet18` carries no mutable state, so the model stays a pure function
of its params (there is no ``batch_stats`` collection to average, personalise or checkpoint):

* ``norm="group"`` (default): GroupNorm (Wu & He 2018), stateless. The usual choice in
  federated learning, where BatchNorm's statistics are skewed by non-IID clients (Hsieh et al.
  2020).
* ``norm="batch"``: BatchNorm that always normalises with the mean and (biased) variance of
  the current batch, in training *and* evaluation; there are no running averages. Outputs
  therefore depend on the whole batch: evaluate with full batches of a fixed size, and note
  that padding rows enter the statistics (the padding invariance of ``make_loss`` does not
  hold). Running averages would be per-client state that an algorithm must carry and
  aggregate explicitly, which the papers leave unspecified.

Parameter counts (10 classes, checked by the tests): ``mlp`` on 28×28 inputs 199,210 (the
"2NN" of McMahan et al. 2017); ``cnn`` on 28×28×1 1,663,370 (their "CNN"); ``resnet18`` on
32×32×3 11,173,962 with either norm.

Source for the team: seed 003 (bn_cnn); seed 000 spec §A.15.3; seed 001 ch. 3, ch. 4 Table
C.2, l. 3026-3041, spec §0.1.5, ch. 5 Table D.4, spec C5-9; seed 002 l. 838-840 (LeNet-5),
l. 838-844 (VGG-11), spec ``seed002.md`` §6.4 (their d).
"""
from __future__ import annotations

import math
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjaxsparse.models.base import from_flax
from fedjaxsparse.models.conv import Conv, max_pool, resolve_impl
from fedjaxsparse.core import Model
from fedjaxsparse.errors import check_int
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["image_shape", "mlp", "cnn", "cohort_squeeze_cnn", "norm_layer", "bn_cnn", "resnet18",
           "lenet5_caffe", "fedp3_cnn", "vgg11", "char_lstm"]
__dir__ = _public_dir(__all__)

NORMS = ("group", "batch")


def image_shape(input_shape: Sequence[int]) -> tuple[int, int, int]:
  """``(H, W, C)`` for an input of ``(H, W, C)``, ``(H, W)`` or a flat square ``(H·W,)``."""
  shape = tuple(int(s) for s in input_shape)
  if len(shape) == 3:
    return shape
  if len(shape) == 2:
    return shape + (1,)
  if len(shape) == 1 and math.isqrt(shape[0]) ** 2 == shape[0]:
    return (math.isqrt(shape[0]),) * 2 + (1,)
  raise ValueError(f"input_shape must be (H, W, C), (H, W) or a flat square (H*W,), got "
                   f"{tuple(input_shape)}.")


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
  """A ReLU MLP on flattened inputs; ``hidden=(200, 200)`` is McMahan et al. 2017's "2NN"."""
  return from_flax(_MLP(tuple(hidden), num_classes), input_shape)


class _CNN(nn.Module):
  num_classes: int
  channels: Sequence[int]
  dense: int
  conv: str
  padding: str = "SAME"
  pool_each: bool = True

  @nn.compact
  def __call__(self, x):
    for c in self.channels:
      x = nn.relu(Conv(c, (5, 5), padding=self.padding, impl=self.conv)(x))
      if self.pool_each:
        x = max_pool(x, (2, 2), (2, 2), "SAME")
    if not self.pool_each:
      x = max_pool(x, (2, 2), (2, 2), "SAME")
    x = x.reshape(x.shape[0], -1)
    x = nn.relu(nn.Dense(self.dense)(x))
    return nn.Dense(self.num_classes)(x)


def cnn(input_shape: Sequence[int], num_classes: int, channels: Sequence[int] = (32, 64),
        dense: int = 512, conv: str = "auto", padding: str = "SAME",
        pool_each: bool = True) -> Model:
  """The FedAvg CNN of McMahan et al. 2017: 5×5 "same" convolutions with 32 and 64 channels,
  each followed by ReLU and 2×2 max-pooling, a 512-unit ReLU dense layer and the output layer.

  ``channels`` and ``dense`` give size-scaled versions (e.g. ``(8, 16)`` and 64 as a CPU
  stand-in). Inputs ``[B, H, W, C]``, ``[B, H, W]`` or flat square images ``[B, H·W]``.
  ``conv``: how convolutions compute (:mod:`fedjaxsparse.models.conv`: ``"auto"`` — patches
  times a matrix on CPU, fast under a client ``vmap``; XLA's convolution elsewhere).
  ``padding="VALID"`` and ``pool_each=False`` (one 2×2 pool after the last convolution) with
  ``dense=128`` give the FEMNIST network of Table D.4 in Kai Yi's dissertation
  (:func:`cohort_squeeze_cnn`).
  """
  resolve_impl(conv)
  if padding not in ("SAME", "VALID"):
    raise ValueError(f"padding must be 'SAME' or 'VALID', got {padding!r}.")
  return from_flax(_CNN(num_classes, tuple(channels), dense, conv, padding, pool_each),
                   input_shape, image_shape(input_shape))


def cohort_squeeze_cnn(input_shape: Sequence[int] = (28, 28, 1), num_classes: int = 62,
                       channels: Sequence[int] = (32, 64), dense: int = 128, **kw) -> Model:
  """The FEMNIST CNN of Cohort-Squeeze (Yi et al., 2024; Table D.4 of Kai Yi's dissertation,
  with its shapes corrected): 5×5 VALID convolutions of 32 and 64 channels with ReLU
  (24×24×32, 20×20×64), one 2×2 max-pool (10×10×64), a 128-unit ReLU dense layer and 62
  outputs: 879,422 parameters at 28×28×1 (``channels``, ``dense``: a scaled-down version for a
  CPU)."""
  return cnn(input_shape, num_classes, channels, dense, padding="VALID", pool_each=False, **kw)


class _BatchStatNorm(nn.Module):
  """BatchNorm with the current batch's statistics only: ``scale·(x − μ)/√(σ² + ε) + bias``,
  ``μ, σ²`` over the batch and spatial axes of ``x[B, H, W, C]``; params ``scale, bias [C]``."""
  epsilon: float = 1e-5

  @nn.compact
  def __call__(self, x):
    c = x.shape[-1]
    mean = jnp.mean(x, axis=(0, 1, 2))
    var = jnp.mean(jnp.square(x - mean), axis=(0, 1, 2))
    y = (x - mean) * jax.lax.rsqrt(var + self.epsilon)
    return y * self.param("scale", nn.initializers.ones, (c,)) + self.param(
        "bias", nn.initializers.zeros, (c,))


def norm_layer(kind: str, num_groups: int, name: str) -> nn.Module:
  """The normalisation of ``kind``: ``"group"`` (GroupNorm of ``num_groups``) or ``"batch"``
  (the current batch's statistics, :class:`_BatchStatNorm`), named ``name``."""
  if kind == "group":
    return nn.GroupNorm(num_groups=num_groups, name=name)
  return _BatchStatNorm(name=name)


class _BNCNN(nn.Module):
  num_classes: int
  channels: Sequence[int]
  norm: str
  pool_every: int
  conv: str

  @nn.compact
  def __call__(self, x):
    for i, c in enumerate(self.channels):
      x = Conv(c, (3, 3), padding="SAME", use_bias=False, impl=self.conv)(x)
      x = nn.relu(norm_layer(self.norm, min(8, c), f"norm{i}")(x))
      if (i + 1) % self.pool_every == 0:
        x = max_pool(x, (2, 2), (2, 2), "SAME")
    return nn.Dense(self.num_classes)(x.reshape(x.shape[0], -1))


def bn_cnn(input_shape: Sequence[int], num_classes: int,
           channels: Sequence[int] = (32, 32, 64, 64), norm: str = "batch",
           pool_every: int = 2, conv: str = "auto") -> Model:
  """The CNNs of the FedMRN paper (Li et al., 2024), "4 conv layers + 1 FC" (FMNIST, SVHN; the
  default) and "8 conv + 1 FC" (CIFAR; ``channels=(32, 32, 64, 64, 128, 128, 256, 256)``), with
  ReLU and BatchNorm throughout — widths, kernels and pooling are not in the paper: 3×3 "same"
  convolutions without bias, each followed by a norm and ReLU, a 2×2 max-pool after every
  ``pool_every`` convolutions, one dense output layer.

  BatchNorm under a 1-bit uplink (the paper is silent): ``norm="batch"`` normalises with the
  current batch's statistics in training and evaluation alike — there are no running
  statistics, so no non-parameter state to aggregate — and its scale/bias are parameters like
  any other (masked or compressed with them); ``norm="group"`` is the per-example
  alternative."""
  resolve_impl(conv)
  if norm not in ("batch", "group"):
    raise ValueError(f"norm must be 'batch' or 'group', got {norm!r}.")
  return from_flax(_BNCNN(num_classes, tuple(channels), norm, pool_every, conv), input_shape,
                   image_shape(input_shape))


class _BasicBlock(nn.Module):
  channels: int
  stride: int
  norm: str
  num_groups: int
  conv: str

  @nn.compact
  def __call__(self, x):
    s = (self.stride, self.stride)
    y = Conv(self.channels, (3, 3), s, use_bias=False, impl=self.conv, name="conv1")(x)
    y = nn.relu(norm_layer(self.norm, self.num_groups, "norm1")(y))
    y = Conv(self.channels, (3, 3), use_bias=False, impl=self.conv, name="conv2")(y)
    y = norm_layer(self.norm, self.num_groups, "norm2")(y)
    if self.stride != 1 or x.shape[-1] != self.channels:
      x = Conv(self.channels, (1, 1), s, use_bias=False, impl=self.conv,
               name="shortcut_conv")(x)
      x = norm_layer(self.norm, self.num_groups, "shortcut_norm")(x)
    return nn.relu(x + y)


class _ResNet18(nn.Module):
  num_classes: int
  norm: str
  num_groups: int
  conv: str
  width: int = 64

  @nn.compact
  def __call__(self, x):
    x = Conv(self.width, (3, 3), use_bias=False, impl=self.conv, name="stem_conv")(x)
    x = nn.relu(norm_layer(self.norm, self.num_groups, "stem_norm")(x))
    for i, channels in enumerate(self.width * m for m in (1, 2, 4, 8)):
      for j in range(2):
        stride = 2 if i > 0 and j == 0 else 1
        x = _BasicBlock(channels, stride, self.norm, self.num_groups, self.conv,
                        name=f"stage{i + 1}_block{j + 1}")(x)
    x = jnp.mean(x, axis=(1, 2))
    return nn.Dense(self.num_classes, name="head")(x)


def resnet18(input_shape: Sequence[int], num_classes: int, norm: str = "group",
             num_groups: int = 32, conv: str = "auto", width: int = 64) -> Model:
  """CIFAR-style ResNet-18 (He et al. 2016): a 3×3 stem convolution (no max-pool), four
  stages of two BasicBlocks with 64/128/256/512 channels (stride 2 at the start of stages
  2-4, 1×1 projection shortcuts), global average pooling and a linear head.

  Args:
    input_shape: ``(H, W, C)``, ``(H, W)`` or a flat square; CIFAR-10 is ``(32, 32, 3)``.
    num_classes: output classes.
    norm: ``"group"`` or ``"batch"`` (current-batch statistics; see the module docstring).
    num_groups: GroupNorm groups (Wu & He 2018's default 32); must divide ``width``.
    conv: how convolutions compute (as in :func:`cnn`; the patches of a 3×3 convolution hold
      9 copies of its input, kept for the backward pass).
    width: channels of the stem and the first stage (the stages have ``width·(1, 2, 4, 8)``);
      64 is ResNet-18, a smaller width the same network narrowed (quick CPU runs).

  Params are named by layer (``stem_conv``, ``stage2_block1/norm1/scale``, ``head``, ...)
  and have the same tree under both norms (``scale, bias [C]`` for each norm layer).
  """
  if norm not in NORMS:
    raise ValueError(f"norm must be one of {NORMS}, got {norm!r}.")
  width = check_int("width", width, 1)
  if norm == "group" and (num_groups < 1 or width % num_groups):
    raise ValueError(f"num_groups must divide width={width} (the narrowest layer), got "
                     f"{num_groups}.")
  resolve_impl(conv)
  return from_flax(_ResNet18(num_classes, norm, num_groups, conv, width), input_shape,
                   image_shape(input_shape))


class _LeNet5Caffe(nn.Module):
  num_classes: int
  conv: str

  @nn.compact
  def __call__(self, x):
    for i, c in enumerate((20, 50)):
      x = Conv(c, (5, 5), padding="VALID", impl=self.conv, name=f"conv{i + 1}")(x)
      x = max_pool(nn.relu(x), (2, 2), (2, 2))
    x = nn.relu(nn.Dense(500, name="fc1")(x.reshape(x.shape[0], -1)))
    return nn.Dense(self.num_classes, name="fc2")(x)


def lenet5_caffe(input_shape: Sequence[int] = (28, 28, 1), num_classes: int = 26,
                 conv: str = "auto") -> Model:
  """LeNet-5, Caffe version (the SNIP repository's ``lenet5_caffe``; the EMNIST-L model of the
  FedSpa paper, Huang et al. 2022): conv 5×5 → 20, max-pool 2, conv 5×5 → 50, max-pool 2
  (valid padding, ReLU), dense 800 → 500 (ReLU), dense 500 → classes. 28×28 inputs, 26
  classes: 439,096 parameters (the d that reproduces the FedSpa paper's communication
  costs)."""
  resolve_impl(conv)
  return from_flax(_LeNet5Caffe(num_classes, conv), input_shape, image_shape(input_shape))


class _FedP3CNN(nn.Module):
  num_classes: int
  channels: int
  hidden: Sequence[int]
  pad_to: int
  conv: str

  @nn.compact
  def __call__(self, x):
    dh, dw = self.pad_to - x.shape[1], self.pad_to - x.shape[2]
    if dh > 0 or dw > 0:
      x = jnp.pad(x, ((0, 0), (dh // 2, dh - dh // 2), (dw // 2, dw - dw // 2), (0, 0)))
    for i in range(2):
      x = Conv(self.channels, (5, 5), padding="VALID", impl=self.conv, name=f"conv{i + 1}")(x)
      x = max_pool(nn.relu(x), (2, 2), (2, 2))
    x = x.reshape(x.shape[0], -1)
    for i, h in enumerate(self.hidden):
      x = nn.relu(nn.Dense(h, name=f"fc{i + 1}")(x))
    return nn.Dense(self.num_classes, name=f"fc{len(self.hidden) + 1}")(x)


def fedp3_cnn(input_shape: Sequence[int] = (32, 32, 3), num_classes: int = 10,
              channels: int = 64, hidden: Sequence[int] = (1024, 1024), pad_to: int = 32,
              conv: str = "auto") -> Model:
  """The FedP3 CNN (Yi et al., 2024; Table C.2 of Kai Yi's dissertation): conv 5×5 → 64,
  max-pool 2, conv 5×5 → 64, max-pool 2 (valid, ReLU), FC 1600 → 1024 → 1024 → classes; layers
  ``conv1, conv2, fc1, fc2, fc3`` (fc3 is the paper's FFC). Smaller images are zero-padded to
  ``pad_to`` (the paper's FMNIST counts use the 1600-wide FC layer that 32×32 inputs give;
  28×28 ones would give 1024). ``channels``/``hidden`` give CPU-sized versions."""
  resolve_impl(conv)
  shape = image_shape(input_shape)
  if shape[0] > pad_to or shape[1] > pad_to:
    raise ValueError(f"pad_to must be >= the image size {shape[:2]}, got {pad_to}.")
  return from_flax(_FedP3CNN(num_classes, channels, tuple(hidden), pad_to, conv), input_shape,
                   shape)


VGG11_CHANNELS = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")


class _VGG11(nn.Module):
  num_classes: int
  num_groups: int
  conv: str

  @nn.compact
  def __call__(self, x):
    i = 0
    for c in VGG11_CHANNELS:
      if c == "M":
        x = max_pool(x, (2, 2), (2, 2))
        continue
      i += 1
      x = Conv(c, (3, 3), padding="SAME", impl=self.conv, name=f"conv{i}")(x)
      x = nn.relu(nn.GroupNorm(num_groups=self.num_groups, name=f"norm{i}")(x))
    return nn.Dense(self.num_classes, name="fc")(x.reshape(x.shape[0], -1))


def vgg11(input_shape: Sequence[int] = (32, 32, 3), num_classes: int = 10,
          num_groups: int = 32, conv: str = "auto") -> Model:
  """VGG-11 for CIFAR with GroupNorm instead of BatchNorm (the CIFAR-10 model of the FedSpa
  paper, Huang et al. 2022): eight 3×3 convolutions with bias (64, M, 128, M, 256, 256, M, 512,
  512, M, 512, 512, M), each followed by GroupNorm and ReLU, one dense layer 512 → classes.
  CIFAR-10: 9,231,114 parameters (the d that reproduces the FedSpa paper's communication
  costs)."""
  resolve_impl(conv)
  if num_groups < 1 or 64 % num_groups:
    raise ValueError(f"num_groups must divide 64 (the narrowest layer), got {num_groups}.")
  return from_flax(_VGG11(num_classes, num_groups, conv), input_shape,
                   image_shape(input_shape))


class _CharLSTM(nn.Module):
  vocab: int
  embed: int
  hidden: int
  layers: int

  @nn.compact
  def __call__(self, x):
    h = nn.Embed(self.vocab, self.embed)(x.astype(jnp.int32))
    for i in range(self.layers):
      h = nn.RNN(nn.OptimizedLSTMCell(self.hidden), name=f"lstm{i + 1}")(h)
    return nn.Dense(self.vocab, name="head")(h[:, -1])


def char_lstm(seq_len: int, vocab: int, embed: int = 8, hidden: int = 256,
              layers: int = 2) -> Model:
  """LEAF's Shakespeare model (the "2 LSTM + 1 FC" of Scafflix, Yi, Condat and Richtárik 2023):
  an ``embed``-dimensional character embedding, ``layers`` LSTM layers of ``hidden`` units and a
  dense layer on the last step's output. Inputs ``int32 [B, seq_len]`` character indices;
  logits ``[B, vocab]`` for the next character."""
  return from_flax(_CharLSTM(vocab, embed, hidden, layers), (seq_len,))
