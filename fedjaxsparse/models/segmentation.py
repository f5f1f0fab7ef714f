"""Semantic segmentation: BiSeNetV2 (the segmentation network of the FedMRN paper, Li et al.
2024) behind the :class:`~fedjaxsparse.core.Model` interface, its per-pixel loss with an ignore
label, and the mean intersection-over-union.

References:
  Changqian Yu, Changxin Gao, Jingbo Wang, Gang Yu, Chunhua Shen, Nong Sang (2021). BiSeNet
    V2: Bilateral Network with Guided Aggregation for Real-time Semantic Segmentation. IJCV
    129:3051-3068. arXiv:2004.02147.

BiSeNetV2 (images ``[B, H, W, 3]``, H and W multiples of 32 → logits ``[B, H, W, C]``):

* **detail branch** — wide and shallow, 1/8 resolution: stages of 3×3 conv-norm-ReLU
  (64 s2, 64; 64 s2, 64, 64; 128 s2, 128, 128);
* **semantic branch** — narrow and deep, 1/32: the stem block (3×3 s2 to 16; a 1×1 + 3×3 s2
  path beside a 3×3 max-pool, concatenated, fused by a 3×3 conv), gather-and-expansion layers
  (3×3 conv, depth-wise 3×3 at expansion 6 — two of them, the first strided, in a stride-2
  layer whose shortcut is a strided depth-wise 3×3 + 1×1 —, 1×1 projection, residual sum,
  ReLU) to 32 (1/8), 64 (1/16) and 128 (1/32) channels, then the context embedding (global
  average pool, norm, 1×1 conv, broadcast-add, 3×3 conv);
* **bilateral guided aggregation** — each branch gates the other: detail (depth-wise 3×3 +
  1×1) × sigmoid(upsampled semantic 3×3), and (detail 3×3 s2 + 3×3 average pool s2) ×
  sigmoid(semantic depth-wise 3×3 + 1×1), upsampled and summed, fused by a 3×3 conv;
* **segmentation head** — 3×3 conv to ``head_width`` (1024 in the paper), 1×1 conv to the
  classes, bilinear upsampling ×8 to the input size.

The booster (auxiliary) heads of the paper's training are not built: FedMRN's appendix trains
the network as a plain segmenter. ``width`` scales every channel count (1.0: the paper's).
Normalisation: ``norm="batch"`` (the current batch's statistics, no running averages — the
library's stateless convention, :mod:`fedjaxsparse.models.nets`; an image's output then
depends on its batch, padding included) or ``"group"`` (GroupNorm of gcd(8, channels)
groups).

Source for the team: seed 003 (its segmentation network).
"""
from __future__ import annotations

import math
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fedjaxsparse.core import CLASSIFICATION, Model
from fedjaxsparse.models.nets import norm_layer
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["bisenetv2", "pixel_cross_entropy", "confusion_matrix", "mean_iou",
           "make_segmentation_eval_fn", "IGNORE", "NORMS"]
__dir__ = _public_dir(__all__)

IGNORE = 255
"""The label of pixels that carry no loss and no score (VOC's void border)."""
NORMS = ("batch", "group")
"""The normalisations :func:`bisenetv2` takes."""


class _ConvNorm(nn.Module):
  """conv (no bias) → norm → optional ReLU; ``depthwise``: one group per input channel
  (``features`` a multiple of the input channels)."""
  features: int
  kernel: int = 3
  stride: int = 1
  relu: bool = True
  depthwise: bool = False
  norm: str = "batch"

  @nn.compact
  def __call__(self, x):
    k = self.kernel
    x = nn.Conv(self.features, (k, k), strides=(self.stride, self.stride),
                padding=((k // 2, k // 2),) * 2, use_bias=False,
                feature_group_count=x.shape[-1] if self.depthwise else 1, name="conv")(x)
    x = norm_layer(self.norm, math.gcd(8, self.features), "norm")(x)
    return nn.relu(x) if self.relu else x


class _GatherExpand(nn.Module):
  out: int
  stride: int = 1
  expansion: int = 6
  norm: str = "batch"

  @nn.compact
  def __call__(self, x):
    c = x.shape[-1]
    h = _ConvNorm(c, 3, norm=self.norm, name="conv1")(x)
    h = _ConvNorm(c * self.expansion, 3, self.stride, relu=False, depthwise=True,
                  norm=self.norm, name="dw1")(h)     # each channel to `expansion` channels
    if self.stride > 1:
      h = _ConvNorm(c * self.expansion, 3, relu=False, depthwise=True, norm=self.norm,
                    name="dw2")(h)
    h = _ConvNorm(self.out, 1, relu=False, norm=self.norm, name="project")(h)
    if self.stride > 1 or c != self.out:
      x = _ConvNorm(c, 3, self.stride, relu=False, depthwise=True, norm=self.norm,
                    name="short_dw")(x)
      x = _ConvNorm(self.out, 1, relu=False, norm=self.norm, name="short_project")(x)
    return nn.relu(h + x)


def _up(x, factor: int):
  b, h, w, c = x.shape
  return jax.image.resize(x, (b, h * factor, w * factor, c), "bilinear")


class _BiSeNetV2(nn.Module):
  num_classes: int
  width: float
  head_width: int
  norm: str

  def _c(self, n: int) -> int:
    return max(1, int(round(n * self.width)))

  @nn.compact
  def __call__(self, x):
    c, nrm = self._c, self.norm
    size = x.shape[1:3]
    # detail branch, 1/8
    d = x
    for stage, (ch, reps) in enumerate(((64, 2), (64, 3), (128, 3)), 1):
      for j in range(reps):
        d = _ConvNorm(c(ch), 3, 2 if j == 0 else 1, norm=nrm, name=f"detail{stage}_{j}")(d)
    # semantic branch: stem (1/4)
    s = _ConvNorm(c(16), 3, 2, norm=nrm, name="stem")(x)
    left = _ConvNorm(c(8), 1, norm=nrm, name="stem_left1")(s)
    left = _ConvNorm(c(16), 3, 2, norm=nrm, name="stem_left2")(left)
    right = nn.max_pool(s, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
    s = _ConvNorm(c(16), 3, norm=nrm, name="stem_fuse")(jnp.concatenate([left, right], -1))
    for stage, (ch, reps) in enumerate(((32, 2), (64, 2), (128, 4)), 3):
      for j in range(reps):
        s = _GatherExpand(c(ch), 2 if j == 0 else 1, norm=nrm, name=f"ge{stage}_{j}")(s)
    # context embedding
    g = norm_layer(nrm, math.gcd(8, s.shape[-1]), "ce_norm")(jnp.mean(s, axis=(1, 2),
                                                                     keepdims=True))
    g = _ConvNorm(c(128), 1, norm=nrm, name="ce_gap")(g)
    s = _ConvNorm(c(128), 3, norm=nrm, name="ce_last")(s + g)
    # bilateral guided aggregation
    dl1 = _ConvNorm(c(128), 3, relu=False, depthwise=True, norm=nrm, name="bga_d_dw")(d)
    dl1 = nn.Conv(c(128), (1, 1), use_bias=False, name="bga_d_1x1")(dl1)
    dl2 = _ConvNorm(c(128), 3, 2, relu=False, norm=nrm, name="bga_d_down")(d)
    dl2 = nn.avg_pool(dl2, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
    sr1 = _up(_ConvNorm(c(128), 3, relu=False, norm=nrm, name="bga_s_conv")(s), 4)
    sr2 = _ConvNorm(c(128), 3, relu=False, depthwise=True, norm=nrm, name="bga_s_dw")(s)
    sr2 = nn.Conv(c(128), (1, 1), use_bias=False, name="bga_s_1x1")(sr2)
    agg = dl1 * jax.nn.sigmoid(sr1) + _up(dl2 * jax.nn.sigmoid(sr2), 4)
    agg = _ConvNorm(c(128), 3, norm=nrm, name="bga_fuse")(agg)
    # segmentation head
    h = _ConvNorm(self.head_width, 3, norm=nrm, name="head_conv")(agg)
    h = nn.Conv(self.num_classes, (1, 1), name="head_cls")(h)
    return jax.image.resize(h, (h.shape[0],) + tuple(size) + (self.num_classes,), "bilinear")


def pixel_cross_entropy(logits: jax.Array, y: jax.Array) -> jax.Array:
  """``[B, H, W, C], [B, H, W] -> [B]``: every image's mean softmax cross-entropy over its
  pixels whose label is a class (``0 <= y < C``; :data:`IGNORE`, or any label ``>= C``, carries
  no loss; 0 for an image with none)."""
  valid = (y >= 0) & (y < logits.shape[-1])
  safe = jnp.where(valid, y, 0).astype(jnp.int32)
  logz = jax.nn.logsumexp(logits, axis=-1)
  picked = jnp.take_along_axis(logits, safe[..., None], axis=-1)[..., 0]
  per = jnp.where(valid, logz - picked, 0.0)
  count = jnp.sum(valid, axis=(1, 2))
  return jnp.sum(per, axis=(1, 2)) / jnp.maximum(count, 1)


def bisenetv2(input_shape: Sequence[int] = (512, 512, 3), num_classes: int = 21, *,
              width: float = 1.0, head_width: int = 1024, norm: str = "batch") -> Model:
  """BiSeNetV2 (see the module docstring) as a :class:`~fedjaxsparse.core.Model`:
  ``apply(params, x [B, H, W, 3]) -> logits [B, H, W, num_classes]``, the per-example loss
  :func:`pixel_cross_entropy`. ``input_shape`` ``(H, W, 3)`` with H and W multiples of 32."""
  shape = tuple(int(s) for s in input_shape)
  if len(shape) != 3 or shape[0] % 32 or shape[1] % 32:
    raise ValueError(f"input_shape must be (H, W, C) with H and W multiples of 32, got "
                     f"{tuple(input_shape)}.")
  if norm not in NORMS:
    raise ValueError(f"norm must be one of {NORMS}, got {norm!r}.")
  if not width > 0:
    raise ValueError(f"width must be > 0, got {width!r}.")
  module = _BiSeNetV2(num_classes, float(width), int(head_width), norm)

  @jax.jit
  def init(key):
    return module.init(key, jnp.zeros((1,) + shape, jnp.float32))["params"]

  def apply(params, x):
    return module.apply({"params": params}, x.reshape((x.shape[0],) + shape))

  return Model(init, apply, pixel_cross_entropy, None, CLASSIFICATION)


def confusion_matrix(pred: jax.Array, y: jax.Array, num_classes: int) -> jax.Array:
  """``[C, C]`` counts of (true class, predicted class) over the pixels whose label is a class
  (:data:`IGNORE` and labels ``>= C`` are left out)."""
  valid = ((y >= 0) & (y < num_classes)).reshape(-1)
  idx = jnp.where(valid, y.reshape(-1) * num_classes + pred.reshape(-1), 0)
  counts = jnp.bincount(idx, weights=valid.astype(jnp.float32), length=num_classes ** 2)
  return counts.reshape(num_classes, num_classes)


def mean_iou(confusion) -> tuple[float, np.ndarray]:
  """``(mIoU, IoU per class)`` from a confusion matrix: ``IoU_c = TP / (TP + FP + FN)``,
  averaged over the classes that occur (in the labels or the predictions)."""
  cm = np.asarray(confusion, np.float64)
  tp = np.diag(cm)
  union = cm.sum(0) + cm.sum(1) - tp
  iou = np.where(union > 0, tp / np.where(union > 0, union, 1.0), np.nan)
  return float(np.nanmean(iou)) if np.any(union > 0) else float("nan"), iou


def make_segmentation_eval_fn(model: Model, num_classes: int, batch_size: int = 16):
  """``(params, test) -> {"miou", "accuracy", "loss"}`` for the runner: the global model on
  every test image (``test``'s clients pooled, padding rows left out), ``batch_size`` images at
  a time: the mean IoU (:func:`mean_iou` of the pooled confusion matrix), pixel accuracy and
  the mean per-image loss. Jittable."""
  def eval_fn(params, test):
    x = test.x.reshape((-1,) + test.x.shape[2:])
    y = test.y.reshape((-1,) + test.y.shape[2:])
    keep = test.mask.reshape(-1)
    n = x.shape[0]
    pad = -n % batch_size
    if pad:
      x = jnp.concatenate([x, jnp.zeros((pad,) + x.shape[1:], x.dtype)])
      y = jnp.concatenate([y, jnp.full((pad,) + y.shape[1:], IGNORE, y.dtype)])
      keep = jnp.concatenate([keep, jnp.zeros((pad,), keep.dtype)])
    y = jnp.where(keep[:, None, None] > 0, y, IGNORE)

    def one(args):
      xb, yb, kb = args
      logits = model.apply(params, xb)
      return (confusion_matrix(jnp.argmax(logits, -1), yb, num_classes),
              jnp.sum(kb * model.per_example_loss(logits, yb)))

    shape = lambda a: a.reshape((-1, batch_size) + a.shape[1:])   # noqa: E731
    cms, losses = jax.lax.map(one, (shape(x), shape(y), shape(keep)))
    cm = jnp.sum(cms, 0)
    tp = jnp.diag(cm)
    union = cm.sum(0) + cm.sum(1) - tp
    iou = jnp.where(union > 0, tp / jnp.where(union > 0, union, 1.0), 0.0)
    miou = jnp.sum(iou) / jnp.maximum(jnp.sum(union > 0), 1)
    return {"miou": miou, "accuracy": jnp.sum(tp) / jnp.maximum(jnp.sum(cm), 1.0),
            "loss": jnp.sum(losses) / jnp.maximum(jnp.sum(keep), 1.0)}

  return eval_fn
