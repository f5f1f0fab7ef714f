"""Convolutional networks whose layers declare their channel sets, for structured pruning.

Every parameterised layer names the **channel set** of its input and output channels
(``in_set`` / ``out_set``): channels that must be kept or removed together share a set — a
convolution's output channels with the norm that follows it, a depthwise convolution's channels
with the 1×1 convolutions around it, and, across a residual addition, the channels of every
branch that is summed (the residual stream of a stage is one set, produced by the stem or
shortcut and by each block's last convolution). :mod:`fedjaxsparse.pruning.zig` reads these
declarations off a traced call (``flax.linen.intercept_methods``) and builds the zero-invariant
groups (one per channel of a prunable set; sets named with a leading ``_`` are fixed), the
group operators and the physical removal. The
couplings are **declared** by the architectures below, not inferred from the graph (OTOv2's
automatic construction is not given in Xidong Wu's dissertation); the tests verify each declaration
numerically (zeroing a group zeroes its channels for any input, and the physically pruned
network computes the masked one's function).

Architectures (each takes ``widths``: ``{set name: channels}`` overrides, as produced by
:func:`fedjaxsparse.pruning.zig.compress`):

* :func:`cifar_resnet` — He et al.'s CIFAR ResNet-(6n+2) (ResNet-20/56/110; option-A
  shortcuts: subsample and zero-pad, no parameters), widths 16/32/64; the inner channel of each
  BasicBlock is prunable, the residual streams are not (option A ties stage k's stream to
  stage k−1's by a channel shift);
* :func:`resnet` — ResNet-18/34 with a 3×3 stem (CIFAR style) and 1×1 projection shortcuts;
  the inner channels *and* each stage's residual stream are prunable (the stream is one coupled
  set per stage);
* :func:`mlp` — a ReLU MLP with prunable hidden units;
* :func:`mobilenet_v2` — MobileNetV2 for 32×32 inputs (first convolution and second stage with
  stride 1, as in the CIFAR versions ATO and DMC prune); the hidden (expanded) channels of each
  inverted residual are prunable.

Normalisation: ``norm="batch"`` is the library's current-batch BatchNorm (no running state, see
:mod:`fedjaxsparse.models.nets`) — per channel, so a removed channel changes nothing else; for
evaluation with running statistics, :func:`batch_norm_stats` computes them over training data
and :func:`apply_with_stats` evaluates with them (each example independent of its batch);
``norm="group"`` is GroupNorm (Fed-LPFM's students use 8 groups) — zero-invariant, but removing
channels changes the other channels' group statistics, so physical removal is exact only with
``"batch"``.

Source for the team: seed 004 Task 2, ATO, Table 5 (resnet50, mobilenet_v2); spec ``seed004.md``
§2.1.
"""
from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjaxsparse.models.base import from_flax
from fedjaxsparse.core import Model
from fedjaxsparse.errors import check_int
from fedjaxsparse.models.conv import max_pool
from fedjaxsparse.models.nets import VGG11_CHANNELS
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["PConv", "PDense", "PNorm", "batch_norm_stats", "apply_with_stats", "cifar_resnet", "vgg11",
           "resnet", "resnet50", "mlp", "lenet5", "mobilenet_v2"]
__dir__ = _public_dir(__all__)

NORMS = ("batch", "group")


class PConv(nn.Module):
  """A convolution ``kernel [kh, kw, C_in/groups, C_out]`` (LeCun normal), optional ``bias``;
  ``depthwise`` = one filter per channel (``C_out = C_in``, its channels stay in ``in_set``)."""
  features: int
  kernel_size: int
  in_set: str | None
  out_set: str | None
  strides: int = 1
  depthwise: bool = False
  use_bias: bool = False

  @nn.compact
  def __call__(self, x):
    k, c = self.kernel_size, x.shape[-1]
    groups = c if self.depthwise else 1
    kernel = self.param("kernel", nn.initializers.lecun_normal(),
                        (k, k, c // groups, self.features), x.dtype)
    y = jax.lax.conv_general_dilated(
        x, kernel, (self.strides, self.strides), "SAME",
        dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=groups)
    if self.use_bias:
      y = y + self.param("bias", nn.initializers.zeros, (self.features,), x.dtype)
    return y


class PDense(nn.Module):
  """``kernel [C_in, C_out]``, ``bias [C_out]``."""
  features: int
  in_set: str | None
  out_set: str | None

  @nn.compact
  def __call__(self, x):
    kernel = self.param("kernel", nn.initializers.lecun_normal(), (x.shape[-1], self.features),
                        x.dtype)
    return x @ kernel + self.param("bias", nn.initializers.zeros, (self.features,), x.dtype)


class PNorm(nn.Module):
  """Per-channel ``scale, bias [C]`` of channel set ``out_set`` (``in_set`` is the same set):
  current-batch BatchNorm or GroupNorm."""
  out_set: str | None
  kind: str = "batch"
  num_groups: int = 8
  epsilon: float = 1e-5

  @property
  def in_set(self):
    return self.out_set

  @nn.compact
  def __call__(self, x):
    c = x.shape[-1]
    if self.kind == "batch":
      mean = jnp.mean(x, axis=(0, 1, 2))
      var = jnp.mean(jnp.square(x - mean), axis=(0, 1, 2))
      y = (x - mean) * jax.lax.rsqrt(var + self.epsilon)
    else:
      g = jnp.reshape(x, x.shape[:-1] + (self.num_groups, c // self.num_groups))
      mean = jnp.mean(g, axis=(1, 2, 4), keepdims=True)
      var = jnp.mean(jnp.square(g - mean), axis=(1, 2, 4), keepdims=True)
      y = jnp.reshape((g - mean) * jax.lax.rsqrt(var + self.epsilon), x.shape)
    return y * self.param("scale", nn.initializers.ones, (c,), x.dtype) + self.param(
        "bias", nn.initializers.zeros, (c,), x.dtype)


def batch_norm_stats(module: nn.Module, params, x, batch_size: int = 256) -> dict:
  """``{norm path: (mean [C], var [C])}``: the running statistics each current-batch
  BatchNorm (``PNorm(kind="batch")``) of ``module`` would hold after seeing ``x`` — the mean
  over batches of ``batch_size`` of each batch's per-channel mean and variance, computed as the
  network runs in training mode (precise-BN: an exact average instead of a moving one).
  ``x [N, ...]``; the last partial batch is left out when there are several."""
  x = jnp.asarray(x)
  n = len(x)
  batch_size = check_int("batch_size", batch_size, 1)
  steps = max(1, n // batch_size)
  sums: dict = {}

  def record(next_fun, args, kwargs, context):
    m = context.module
    if context.method_name == "__call__" and isinstance(m, PNorm) and m.kind == "batch":
      h = args[0]
      mean = jnp.mean(h, axis=tuple(range(h.ndim - 1)))
      var = jnp.mean(jnp.square(h - mean), axis=tuple(range(h.ndim - 1)))
      sums.setdefault(tuple(m.path), []).append((mean, var))
    return next_fun(*args, **kwargs)

  for i in range(steps):
    xb = x[i * batch_size:(i + 1) * batch_size] if n > batch_size else x
    with nn.intercept_methods(record):
      module.apply({"params": params}, xb)
  return {k: (jnp.mean(jnp.stack([m for m, _ in v]), 0), jnp.mean(jnp.stack([u for _, u in v]), 0))
          for k, v in sums.items()}


def apply_with_stats(module: nn.Module, params, stats: dict, x) -> jax.Array:
  """``module``'s output on ``x`` with every current-batch BatchNorm normalising by the fixed
  ``stats`` of :func:`batch_norm_stats` (BatchNorm's evaluation mode: each example's output
  independent of the batch) instead of the batch's own statistics."""
  def fixed(next_fun, args, kwargs, context):
    m = context.module
    if context.method_name == "__call__" and isinstance(m, PNorm) and m.kind == "batch":
      key = tuple(m.path)
      if key not in stats:
        raise KeyError(f"no statistics for the norm at {'/'.join(key)}: compute them with "
                       "batch_norm_stats on this network.")
      mean, var = stats[key]
      p = m.variables["params"]
      return (args[0] - mean) * jax.lax.rsqrt(var + m.epsilon) * p["scale"] + p["bias"]
    return next_fun(*args, **kwargs)

  with nn.intercept_methods(fixed):
    return module.apply({"params": params}, jnp.asarray(x))


def _width(widths, name: str, default: int) -> int:
  return dict(widths).get(name, default)


class _CifarResNet(nn.Module):
  depth: int
  num_classes: int
  norm: str
  num_groups: int
  widths: tuple

  def _conv_norm(self, x, c, k, in_set, out_set, stride, name):
    x = PConv(c, k, in_set, out_set, stride, name=f"{name}_conv")(x)
    return PNorm(out_set, self.norm, self.num_groups, name=f"{name}_norm")(x)

  @nn.compact
  def __call__(self, x):
    n = (self.depth - 2) // 6
    x = nn.relu(self._conv_norm(x, 16, 3, None, "_stream1", 1, "stem"))
    for i, planes in enumerate((16, 32, 64)):
      stream = f"_stream{i + 1}"
      for j in range(n):
        stride = 2 if i > 0 and j == 0 else 1
        src = f"_stream{i}" if i > 0 and j == 0 else stream
        inner = f"s{i + 1}b{j + 1}"
        y = nn.relu(self._conv_norm(x, _width(self.widths, inner, planes), 3, src, inner,
                                    stride, f"{inner}_1"))
        y = self._conv_norm(y, planes, 3, inner, stream, 1, f"{inner}_2")
        if stride != 1:   # option A: subsample, zero-pad the new channels
          pad = (planes - x.shape[-1]) // 2
          x = jnp.pad(x[:, ::2, ::2, :], ((0, 0), (0, 0), (0, 0), (pad, pad)))
        x = nn.relu(x + y)
    return PDense(self.num_classes, "_stream3", None, name="head")(jnp.mean(x, axis=(1, 2)))


class _ResNet(nn.Module):
  blocks: tuple
  num_classes: int
  norm: str
  num_groups: int
  widths: tuple
  bottleneck: bool = False
  imagenet_stem: bool = False

  def _conv_norm(self, x, c, k, in_set, out_set, stride, name):
    x = PConv(c, k, in_set, out_set, stride, name=f"{name}_conv")(x)
    return PNorm(out_set, self.norm, self.num_groups, name=f"{name}_norm")(x)

  @nn.compact
  def __call__(self, x):
    w = lambda name, d: _width(self.widths, name, d)  # noqa: E731
    expand = 4 if self.bottleneck else 1
    if self.imagenet_stem:   # 7×7 stride-2 convolution and 3×3 stride-2 max-pool
      x = nn.relu(self._conv_norm(x, w("stem", 64), 7, None, "stem", 2, "stem"))
      x = nn.max_pool(x, (3, 3), (2, 2), "SAME")
      prev = "stem"
    else:
      prev = "stage0" if self.bottleneck else "stage1"
      x = nn.relu(self._conv_norm(x, w(prev, 64), 3, None, prev, 1, "stem"))
    for i, (planes, n) in enumerate(zip((64, 128, 256, 512), self.blocks)):
      stage = f"stage{i + 1}"
      for j in range(n):
        stride = 2 if i > 0 and j == 0 else 1
        src = prev if j == 0 else stage
        inner = f"s{i + 1}b{j + 1}"
        if self.bottleneck:   # 1×1 reduce, 3×3 (the stride), 1×1 expand ×4
          y = nn.relu(self._conv_norm(x, w(f"{inner}a", planes), 1, src, f"{inner}a", 1,
                                      f"{inner}_1"))
          y = nn.relu(self._conv_norm(y, w(f"{inner}b", planes), 3, f"{inner}a", f"{inner}b",
                                      stride, f"{inner}_2"))
          y = self._conv_norm(y, w(stage, planes * expand), 1, f"{inner}b", stage, 1,
                              f"{inner}_3")
        else:
          y = nn.relu(self._conv_norm(x, w(inner, planes), 3, src, inner, stride,
                                      f"{inner}_1"))
          y = self._conv_norm(y, w(stage, planes), 3, inner, stage, 1, f"{inner}_2")
        if src != stage:
          x = self._conv_norm(x, w(stage, planes * expand), 1, src, stage, stride,
                              f"{inner}_shortcut")
        x = nn.relu(x + y)
      prev = stage
    return PDense(self.num_classes, f"stage{len(self.blocks)}", None,
                  name="head")(jnp.mean(x, axis=(1, 2)))


_MBV2 = ((1, 16, 1, 1), (6, 24, 2, 1), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
         (6, 160, 3, 2), (6, 320, 1, 1))   # (expansion t, channels c, repeats n, stride s)
_MBV2_IMAGENET = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                  (6, 160, 3, 2), (6, 320, 1, 1))   # the paper's Table 2: stride 2 at stage 2


class _MobileNetV2(nn.Module):
  num_classes: int
  norm: str
  num_groups: int
  widths: tuple
  config: tuple
  stem_stride: int = 1

  def _conv_norm(self, x, c, k, in_set, out_set, stride, name, depthwise=False):
    x = PConv(c, k, in_set, out_set, stride, depthwise, name=f"{name}_conv")(x)
    return PNorm(out_set, self.norm, self.num_groups, name=f"{name}_norm")(x)

  @nn.compact
  def __call__(self, x):
    w = lambda name, d: _width(self.widths, name, d)  # noqa: E731
    x = nn.relu6(self._conv_norm(x, w("stem", 32), 3, None, "stem", self.stem_stride, "stem"))
    src, c_in, k = "stem", 32, 0       # c_in: the unpruned width of the input set
    for t, c, n, s in self.config:
      for j in range(n):
        k += 1
        name = f"block{k}"
        stride = s if j == 0 else 1
        residual = stride == 1 and j > 0
        out = src if residual else f"out{k}"
        if t == 1:   # no expansion: the depthwise conv works on the input's channels
          hidden, h = src, x
        else:
          hidden = name
          h = nn.relu6(self._conv_norm(x, w(hidden, t * c_in), 1, src, hidden, 1,
                                       f"{name}_expand"))
        h = nn.relu6(self._conv_norm(h, h.shape[-1], 3, hidden, hidden, stride,
                                     f"{name}_dw", depthwise=True))
        h = self._conv_norm(h, w(out, c), 1, hidden, out, 1, f"{name}_project")
        x = x + h if residual else h
        src, c_in = out, c
    x = nn.relu6(self._conv_norm(x, w("last", 1280), 1, src, "last", 1, "last"))
    return PDense(self.num_classes, "last", None, name="head")(jnp.mean(x, axis=(1, 2)))


def _conv_norm_relu(net, x, i: int, channels: int, kernel: int, src: str | None):
  """Convolution ``conv{i}`` (with bias) writing channel set ``c{i}`` (its width from
  ``net.widths``), its normalisation ``norm{i}`` (``net.norm``, at most ``net.num_groups``
  groups) and ReLU: the plain convolutional networks' block (LeNet-5, VGG-11)."""
  name = f"c{i}"
  width = _width(net.widths, name, channels)
  x = PConv(width, kernel, src, name, use_bias=True, name=f"conv{i}")(x)
  return nn.relu(PNorm(name, net.norm, min(net.num_groups, width), name=f"norm{i}")(x))


class _LeNet5(nn.Module):
  num_classes: int
  norm: str
  num_groups: int
  widths: tuple

  @nn.compact
  def __call__(self, x):
    src = None
    for i, c in enumerate((6, 16)):   # conv 5x5, norm, ReLU, 2x2 max-pool
      x = _conv_norm_relu(self, x, i + 1, c, 5, src)
      x = max_pool(x, (2, 2), (2, 2))
      src = f"c{i + 1}"
    x = x.reshape(x.shape[0], -1)
    for i, h in enumerate((120, 84)):
      name = f"h{i + 1}"
      x = nn.relu(PDense(_width(self.widths, name, h), None if i == 0 else f"h{i}", name,
                         name=f"dense{i + 1}")(x))
    return PDense(self.num_classes, "h2", None, name="head")(x)


class _VGG11(nn.Module):
  num_classes: int
  norm: str
  num_groups: int
  widths: tuple

  @nn.compact
  def __call__(self, x):
    src, i = None, 0
    for c in VGG11_CHANNELS:
      if c == "M":
        x = max_pool(x, (2, 2), (2, 2))
        continue
      i += 1
      x = _conv_norm_relu(self, x, i, c, 3, src)
      src = f"c{i}"
    return PDense(self.num_classes, None, None, name="fc")(x.reshape(x.shape[0], -1))


class _MLP(nn.Module):
  hidden: tuple
  num_classes: int
  widths: tuple

  @nn.compact
  def __call__(self, x):
    x, src = x.reshape(x.shape[0], -1), None
    for i, h in enumerate(self.hidden):
      x = nn.relu(PDense(_width(self.widths, f"h{i + 1}", h), src, f"h{i + 1}",
                         name=f"dense{i + 1}")(x))
      src = f"h{i + 1}"
    return PDense(self.num_classes, src, None, name="head")(x)


def _check(norm: str, num_groups: int) -> None:
  if norm not in NORMS:
    raise ValueError(f"norm must be one of {NORMS}, got {norm!r}.")
  if num_groups < 1:
    raise ValueError(f"num_groups must be >= 1, got {num_groups}.")


def cifar_resnet(depth: int = 56, input_shape: Sequence[int] = (32, 32, 3),
                 num_classes: int = 10, norm: str = "batch", num_groups: int = 8,
                 widths: dict | None = None) -> tuple[nn.Module, Model]:
  """ResNet-``depth`` (``depth = 6n + 2``: 20, 32, 44, 56, 110). Returns ``(module, Model)``;
  the module is what :func:`fedjaxsparse.pruning.zig.trace` reads."""
  if depth < 8 or (depth - 2) % 6:
    raise ValueError(f"depth must be 6n + 2 with n >= 1 (8, 14, 20, 56, ...), got {depth}.")
  _check(norm, num_groups)
  module = _CifarResNet(depth, num_classes, norm, num_groups, tuple(sorted((widths or {}).items())))
  return module, from_flax(module, input_shape)


def resnet(blocks: Sequence[int] = (2, 2, 2, 2), input_shape: Sequence[int] = (32, 32, 3),
           num_classes: int = 10, norm: str = "batch", num_groups: int = 8,
           widths: dict | None = None, bottleneck: bool = False,
           stem: str = "cifar") -> tuple[nn.Module, Model]:
  """ResNet-18 (``blocks=(2, 2, 2, 2)``) / ResNet-34 (``(3, 4, 6, 3)``) with basic blocks, or
  with ``bottleneck`` blocks (1×1 reduce, 3×3, 1×1 expanding ×4: ResNet-50 is ``(3, 4, 6, 3)``,
  :func:`resnet50`); ``stem`` ``"cifar"`` (3×3 convolution) or ``"imagenet"`` (7×7 stride-2
  convolution and 3×3 stride-2 max-pool). Prunable sets: each block's inner channels (``sIbJ``;
  bottlenecks ``sIbJa``, ``sIbJb``) and each stage's residual-coupled output (``stageI``; the
  stem's ``stem`` or ``stage0`` when a projection follows it)."""
  if len(blocks) < 1 or len(blocks) > 4 or min(blocks) < 1:
    raise ValueError(f"blocks must be 1-4 stage lengths >= 1, got {tuple(blocks)}.")
  if stem not in ("cifar", "imagenet"):
    raise ValueError(f"stem must be 'cifar' or 'imagenet', got {stem!r}.")
  _check(norm, num_groups)
  module = _ResNet(tuple(blocks), num_classes, norm, num_groups,
                   tuple(sorted((widths or {}).items())), bottleneck, stem == "imagenet")
  return module, from_flax(module, input_shape)


def resnet50(input_shape: Sequence[int] = (224, 224, 3), num_classes: int = 1000,
             norm: str = "batch", num_groups: int = 8,
             widths: dict | None = None) -> tuple[nn.Module, Model]:
  """ResNet-50 (He et al. 2016, arXiv:1512.03385): bottleneck blocks ``(3, 4, 6, 3)``, the
  ImageNet stem — the ImageNet network of ATO's experiments (Table 5 of Xidong Wu's
  dissertation) — with its zero-invariant groups declared (25.6 M parameters at 1000
  classes)."""
  return resnet((3, 4, 6, 3), input_shape, num_classes, norm, num_groups, widths,
                bottleneck=True, stem="imagenet")


def mlp(input_shape: Sequence[int], num_classes: int = 10, hidden: Sequence[int] = (256, 128),
        widths: dict | None = None) -> tuple[nn.Module, Model]:
  """A ReLU MLP; hidden units are prunable (sets ``h1, h2, ...``)."""
  if not hidden or min(hidden) < 1:
    raise ValueError(f"hidden must be positive widths, got {tuple(hidden)}.")
  module = _MLP(tuple(hidden), num_classes, tuple(sorted((widths or {}).items())))
  return module, from_flax(module, input_shape)


def lenet5(input_shape: Sequence[int] = (28, 28, 1), num_classes: int = 10,
           norm: str = "batch", num_groups: int = 2,
           widths: dict | None = None) -> tuple[nn.Module, Model]:
  """LeNet-5 with a normalisation after each convolution — the network Sub-FedAvg's
  structured pruning ranks channels on (the authors' ``LeNetBN5``): conv 6 (5×5, SAME) · norm ·
  ReLU · max-pool, conv 16 · norm · ReLU · max-pool, dense 120, 84, ``num_classes``.
  Prunable sets: the convolutions' channels ``c1``, ``c2`` and the hidden units ``h1``,
  ``h2``. Returns ``(module, Model)``."""
  _check(norm, num_groups)
  module = _LeNet5(num_classes, norm, num_groups, tuple(sorted((widths or {}).items())))
  return module, from_flax(module, input_shape)


def vgg11(input_shape: Sequence[int] = (32, 32, 3), num_classes: int = 10,
          norm: str = "batch", num_groups: int = 32,
          widths: dict | None = None) -> tuple[nn.Module, Model]:
  """VGG-11 for CIFAR declaring its channel sets: the FedSpa paper's VGG-11 (eight 3×3
  convolutions with bias, 64, M, 128, M, 256, 256, M, 512, 512, M, 512, 512, M; one dense layer
  from the flattened features to the classes) with a normalisation after every convolution —
  BatchNorm by default, the per-channel scale Sub-FedAvg (Hy) ranks channels on; ``"group"``
  is the paper's GroupNorm (the same parameters: 9,231,114 at 32×32×3 and 10 classes). Prunable
  sets: the convolutions' channels ``c1`` … ``c8`` (the dense layer reads the flattened map,
  so it declares no input set). Returns ``(module, Model)``."""
  _check(norm, num_groups)
  module = _VGG11(num_classes, norm, num_groups, tuple(sorted((widths or {}).items())))
  return module, from_flax(module, input_shape)


def mobilenet_v2(input_shape: Sequence[int] = (32, 32, 3), num_classes: int = 10,
                 norm: str = "batch", num_groups: int = 8, widths: dict | None = None,
                 config: Sequence[tuple] | None = None, stem: str = "cifar"
                 ) -> tuple[nn.Module, Model]:
  """MobileNetV2 (Sandler et al. 2018, arXiv:1801.04381); ``config`` = rows ``(expansion t,
  channels c, repeats n, stride s)``. ``stem="cifar"`` (32×32 inputs): strides 1 in the first
  convolution and the second stage; ``stem="imagenet"``: the paper's network for 224×224
  inputs — stride 2 in both (``_MBV2_IMAGENET``; 3,504,872 parameters at 1000 classes,
  torchvision's count), the MobileNetV2 row of Table 5 in Xidong Wu's dissertation (ATO on
  ImageNet). Default ``config``: the stem's seven rows."""
  _check(norm, num_groups)
  if stem not in ("cifar", "imagenet"):
    raise ValueError(f"stem must be 'cifar' or 'imagenet', got {stem!r}.")
  if config is None:
    config = _MBV2_IMAGENET if stem == "imagenet" else _MBV2
  if not config or any(len(r) != 4 or min(r) < 1 for r in config):
    raise ValueError(f"config must be rows (t, c, n, s) of positive ints, got {config!r}.")
  module = _MobileNetV2(num_classes, norm, num_groups, tuple(sorted((widths or {}).items())),
                        tuple(tuple(r) for r in config), 2 if stem == "imagenet" else 1)
  return module, from_flax(module, input_shape)
