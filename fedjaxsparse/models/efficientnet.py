"""EfficientNet-B0 (Tan & Le 2019) as in torchvision's ``efficientnet_b0``, with GroupNorm.

Fed-LPFM's students (Wu et al., 2023) are MobileNetV2, EfficientNet-B0 and ResNet-18 "with BN
replaced by GroupNorm (8 groups), random init" on CIFAR-10; the other two are in
:mod:`fedjaxsparse.models.prunable`. This one follows torchvision layer for layer:

* stem: 3×3 convolution, stride 2, 32 channels + norm + SiLU;
* 16 MBConv blocks in seven stages, rows ``(expand ratio, kernel, stride, C_in, C_out, layers)``
  of :data:`B0_STAGES`; a block is [1×1 expand conv + norm + SiLU, if the ratio is not 1],
  depthwise k×k conv (the stage's stride on its first block) + norm + SiLU, squeeze-and-excitation
  (global mean, 1×1 conv to ``max(1, C_in // 4)`` channels with bias, SiLU, 1×1 conv back with
  bias, sigmoid gate), 1×1 project conv + norm (no activation), and the residual addition when the
  stride is 1 and ``C_in == C_out`` (9 of the 16 blocks);
* head: 1×1 convolution 320 → 1280 + norm + SiLU, global average pool, dropout, linear.

Convolutions have no bias except in squeeze-and-excitation, and pad ``(k - 1) // 2`` on every
side (torchvision's padding; not ``"SAME"``, which pads stride-2 convolutions asymmetrically).
Initialisation is torchvision's: convolutions He-normal with fan-out, norms ones/zeros, the
linear layer ``U(±1/sqrt(num_classes))`` with zero bias.

Normalisation: ``norm="group"`` (default) is GroupNorm with ``num_groups`` groups (8 divides
every normalised width: 16, 24, 32, 40, 80, 96, 112, 144, 192, 240, 320, 480, 672, 1152, 1280);
``norm="batch"`` is the library's current-batch BatchNorm (:class:`~fedjaxsparse.models.prunable.
PNorm`, no running statistics). Both have the same parameters (scale and bias per channel), so
the 10-class model has torchvision's 4,020,358 parameters either way.

Regularisation: stochastic depth (``drop_rate``, torchvision's ``stochastic_depth_prob``: block
``i`` of 16, counted from 0, drops its residual branch per example with probability
``drop_rate * i / 16`` and rescales the kept ones by ``1 / (1 - p)``) and head dropout
(``dropout_rate``) act only when the module is called with ``train=True`` and a ``"dropout"``
rng. :class:`~fedjaxsparse.core.Model`'s ``apply`` takes no rng, so it is always the
deterministic (evaluation) network; both rates default to 0 (torchvision: 0.2 and 0.2).

Source for the team: seed 004 Task 3; spec ``seed004.md`` §3.4.
"""
from __future__ import annotations

import math
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjaxsparse.models.base import from_flax
from fedjaxsparse.models.prunable import NORMS, PNorm
from fedjaxsparse.core import Model
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["MBConv", "EfficientNet", "efficientnet_b0"]
__dir__ = _public_dir(__all__)

# (expand ratio, kernel, stride, C_in, C_out, layers): torchvision's efficientnet_b0 (width and
# depth multipliers 1), Table 1 of Tan & Le (2019).
B0_STAGES = ((1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2),
             (6, 3, 2, 40, 80, 3), (6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4),
             (6, 3, 1, 192, 320, 1))
STEM_CHANNELS = 32
HEAD_CHANNELS = 1280

_CONV_INIT = nn.initializers.variance_scaling(2.0, "fan_out", "normal")   # kaiming_normal_
_DENSE_INIT = nn.initializers.variance_scaling(1.0 / 3.0, "fan_out", "uniform")  # U(±1/sqrt(out))


def _conv(features: int, k: int, name: str, strides: int = 1, groups: int = 1,
          use_bias: bool = False) -> nn.Conv:
  """``[B, H, W, C_in] -> [B, H', W', features]``, torchvision padding ``(k - 1) // 2``."""
  p = (k - 1) // 2
  return nn.Conv(features, (k, k), (strides, strides), padding=((p, p), (p, p)),
                 feature_group_count=groups, use_bias=use_bias, kernel_init=_CONV_INIT,
                 bias_init=nn.initializers.zeros, name=name)


class MBConv(nn.Module):
  """One MBConv block ``[B, H, W, C_in] -> [B, H/stride, W/stride, C_out]``."""
  expand_ratio: int
  kernel_size: int
  strides: int
  in_channels: int
  out_channels: int
  norm: str
  num_groups: int
  drop_prob: float = 0.0   # stochastic depth of the residual branch (train=True only)

  @property
  def residual(self) -> bool:
    return self.strides == 1 and self.in_channels == self.out_channels

  def _norm(self, x, name):
    return PNorm(None, self.norm, self.num_groups, name=name)(x)

  @nn.compact
  def __call__(self, x, train: bool = False):
    hidden = self.in_channels * self.expand_ratio
    h = x
    if hidden != self.in_channels:
      h = nn.silu(self._norm(_conv(hidden, 1, "expand_conv")(h), "expand_norm"))
    h = _conv(hidden, self.kernel_size, "dw_conv", self.strides, groups=hidden)(h)
    h = nn.silu(self._norm(h, "dw_norm"))
    s = jnp.mean(h, axis=(1, 2), keepdims=True)                       # [B, 1, 1, hidden]
    s = nn.silu(_conv(max(1, self.in_channels // 4), 1, "se_reduce", use_bias=True)(s))
    h = h * nn.sigmoid(_conv(hidden, 1, "se_expand", use_bias=True)(s))
    h = self._norm(_conv(self.out_channels, 1, "project_conv")(h), "project_norm")
    if not self.residual:
      return h
    if train and self.drop_prob > 0.0:   # torchvision StochasticDepth(p, "row")
      keep = 1.0 - self.drop_prob
      mask = jax.random.bernoulli(self.make_rng("dropout"), keep, (h.shape[0], 1, 1, 1))
      h = h * mask.astype(h.dtype) / keep
    return x + h


class EfficientNet(nn.Module):
  """EfficientNet ``[B, H, W, C] -> logits [B, num_classes]``; ``stages`` as :data:`B0_STAGES`."""
  num_classes: int
  norm: str = "group"
  num_groups: int = 8
  cifar_stem: bool = False
  drop_rate: float = 0.0
  dropout_rate: float = 0.0
  stages: tuple = B0_STAGES

  @nn.compact
  def __call__(self, x, train: bool = False):
    stride = 1 if self.cifar_stem else 2
    x = _conv(self.stages[0][3], 3, "stem_conv", stride)(x)
    x = nn.silu(PNorm(None, self.norm, self.num_groups, name="stem_norm")(x))
    total, k = sum(row[5] for row in self.stages), 0
    for t, ks, s, c_in, c_out, n in self.stages:
      for j in range(n):
        x = MBConv(t, ks, s if j == 0 else 1, c_in if j == 0 else c_out, c_out, self.norm,
                   self.num_groups, self.drop_rate * k / total, name=f"block{k + 1}")(x, train)
        k += 1
    x = _conv(4 * self.stages[-1][4], 1, "head_conv")(x)
    x = nn.silu(PNorm(None, self.norm, self.num_groups, name="head_norm")(x))
    x = jnp.mean(x, axis=(1, 2))                                       # [B, 1280]
    x = nn.Dropout(self.dropout_rate, deterministic=not train or self.dropout_rate == 0.0)(x)
    return nn.Dense(self.num_classes, kernel_init=_DENSE_INIT, bias_init=nn.initializers.zeros,
                    name="classifier")(x)


def _norm_widths(stages) -> list[int]:
  """Every channel count that a norm layer sees."""
  widths = [stages[0][3], 4 * stages[-1][4]]
  for t, _, _, c_in, c_out, n in stages:
    widths += [c_in * t, c_out] + [c_out * t] * (n - 1)
  return widths


def efficientnet_b0(input_shape: Sequence[int] = (32, 32, 3), num_classes: int = 10,
                    norm: str = "group", num_groups: int = 8, cifar_stem: bool = False,
                    drop_rate: float = 0.0, dropout_rate: float = 0.0
                    ) -> tuple[nn.Module, Model]:
  """EfficientNet-B0 for inputs ``[B, *input_shape]`` (``H, W, C``); returns ``(module, Model)``.

  Args:
    input_shape: ``(H, W, C)``; ``Model.apply`` reshapes ``x`` to ``[B, H, W, C]``.
    num_classes: logits per example, ``>= 1``.
    norm: ``"group"`` (GroupNorm, Fed-LPFM's students) or ``"batch"`` (current-batch BN).
    num_groups: GroupNorm groups; must divide every normalised width (1, 2, 4 or 8).
    cifar_stem: stride 1 instead of 2 in the stem, for 32×32 inputs (final map 2×2 instead of
      1×1). Fed-LPFM does not say which its CIFAR-10 students used; the default follows
      torchvision (stride 2).
    drop_rate: stochastic-depth rate in ``[0, 1)`` (torchvision's 0.2); active only in
      ``module.apply(..., train=True, rngs={"dropout": key})``, never in ``Model.apply``.
    dropout_rate: head dropout in ``[0, 1)`` (torchvision's 0.2); same condition.
  """
  shape = tuple(int(s) for s in input_shape)
  if len(shape) != 3 or min(shape) < 1:
    raise ValueError(f"input_shape must be (H, W, C) of positive ints, got {tuple(input_shape)}.")
  if num_classes < 1:
    raise ValueError(f"num_classes must be >= 1, got {num_classes}.")
  if norm not in NORMS:
    raise ValueError(f"norm must be one of {NORMS}, got {norm!r}.")
  if num_groups < 1:
    raise ValueError(f"num_groups must be >= 1, got {num_groups}.")
  if norm == "group":
    g = math.gcd(*_norm_widths(B0_STAGES))
    if g % num_groups:
      allowed = tuple(d for d in range(1, g + 1) if g % d == 0)
      raise ValueError(f"num_groups must divide every normalised width (gcd {g}), i.e. be one "
                       f"of {allowed}, got {num_groups}.")
  for name, rate in (("drop_rate", drop_rate), ("dropout_rate", dropout_rate)):
    if not 0.0 <= rate < 1.0:
      raise ValueError(f"{name} must be in [0, 1), got {rate}.")
  module = EfficientNet(num_classes, norm, num_groups, bool(cifar_stem), float(drop_rate),
                        float(dropout_rate))
  return module, from_flax(module, shape)
