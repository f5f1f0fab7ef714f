"""PASCAL VOC 2012 semantic segmentation (21 classes: background + 20 objects) from its
standard folder layout, and a labelled stand-in of the same shape — the segmentation task of
the FedMRN paper's appendix Table 3 (Li et al., 2024).

References:
  Mark Everingham, Luc Van Gool, Christopher K. I. Williams, John Winn, Andrew Zisserman
    (2010). The PASCAL Visual Object Classes (VOC) Challenge. IJCV 88:303-338.

Layout (``VOCdevkit/VOC2012`` as the tarball unpacks; ``root`` may be either folder)::

  ROOT/ImageSets/Segmentation/{train,val,trainval}.txt   one image id per line
  ROOT/JPEGImages/<id>.jpg                               RGB images
  ROOT/SegmentationClass/<id>.png                        palette PNGs: pixel = class id,
                                                         255 = the "void" border (ignored)

:func:`voc_segmentation` returns ``x float32 [n, S, S, 3]`` in [0, 1] (bilinear resize) and
``y int32 [n, S, S]`` (nearest resize; :data:`IGNORE` = 255 kept). Resizing to one square side
is this loader's choice (the papers crop; a square resize keeps every pixel's class and lets
all clients share one shape).

Source for the team: seed 003 appendix Table 3.
"""
from __future__ import annotations

import os

import numpy as np

from fedjaxsparse.errors import check_int
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["voc_segmentation", "voc_standin"]
__dir__ = _public_dir(__all__)

CLASSES = ("background", "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat",
           "chair", "cow", "diningtable", "dog", "horse", "motorbike", "person", "pottedplant",
           "sheep", "sofa", "train", "tvmonitor")
"""VOC's 21 classes, in label order."""
IGNORE = 255
"""The label of VOC's void pixels (object borders, difficult regions): no loss, no score."""
SPLITS = ("train", "val", "trainval")


def _root(root: str) -> str:
  for cand in (root, os.path.join(root, "VOC2012"), os.path.join(root, "VOCdevkit", "VOC2012")):
    if os.path.isdir(os.path.join(cand, "ImageSets", "Segmentation")):
      return cand
  raise FileNotFoundError(
      f"no PASCAL VOC 2012 at {root!r}: expected ImageSets/Segmentation/, JPEGImages/ and "
      "SegmentationClass/ under it (or under VOC2012/ or VOCdevkit/VOC2012/). Download "
      "VOCtrainval_11-May-2012.tar from the PASCAL VOC site, unpack it and pass the folder "
      "(--data-dir).")


def voc_segmentation(root: str, split: str = "train", image_size: int = 128,
                     limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
  """``(x float32 [n, S, S, 3], y int32 [n, S, S])`` of ``split``'s images (the first
  ``limit`` ids when given), resized to ``image_size`` (see the module docstring)."""
  from PIL import Image
  if split not in SPLITS:
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}.")
  image_size = check_int("image_size", image_size, 8)
  base = _root(root)
  listing = os.path.join(base, "ImageSets", "Segmentation", f"{split}.txt")
  if not os.path.isfile(listing):
    raise FileNotFoundError(f"{listing!r} is missing: the VOC folder has no {split!r} split.")
  with open(listing) as f:
    ids = [line.strip() for line in f if line.strip()]
  if limit is not None:
    ids = ids[:limit]
  if not ids:
    raise ValueError(f"{listing!r} lists no image.")
  x = np.empty((len(ids), image_size, image_size, 3), np.float32)
  y = np.empty((len(ids), image_size, image_size), np.int32)
  for i, name in enumerate(ids):
    img_path = os.path.join(base, "JPEGImages", f"{name}.jpg")
    seg_path = os.path.join(base, "SegmentationClass", f"{name}.png")
    for p in (img_path, seg_path):
      if not os.path.isfile(p):
        raise FileNotFoundError(f"{p!r} is missing ({split}.txt lists {name!r}).")
    with Image.open(img_path) as im:
      x[i] = np.asarray(im.convert("RGB").resize((image_size, image_size), Image.BILINEAR),
                        np.float32) / 255.0
    with Image.open(seg_path) as im:
      if im.mode not in ("P", "L"):
        raise ValueError(f"{seg_path!r} is a {im.mode!r} image; VOC's masks are palette PNGs "
                         "whose pixel values are class ids.")
      label = np.asarray(im.resize((image_size, image_size), Image.NEAREST), np.int32)
    bad = (label >= len(CLASSES)) & (label != IGNORE)
    if bad.any():
      raise ValueError(f"{seg_path!r} holds class ids outside 0..20 and 255: "
                       f"{sorted(set(label[bad].tolist()))[:5]}.")
    y[i] = label
  return x, y


def voc_standin(n: int = 64, image_size: int = 128, seed: int = 0
                ) -> tuple[np.ndarray, np.ndarray]:
  """A labelled stand-in of VOC's shape: ``n`` images of random rectangles of 1-3 object
  classes on a background, the class painted into the mask (with a 1-pixel void border, as
  VOC's), and each rectangle's colour a noisy function of its class — so a network can learn
  something. Not real data: experiments label it."""
  rng = np.random.default_rng(seed)
  palette = rng.uniform(0.1, 0.9, (len(CLASSES), 3)).astype(np.float32)
  x = np.repeat(palette[0][None, None, None], n, 0) * np.ones((n, image_size, image_size, 1),
                                                              np.float32)
  y = np.zeros((n, image_size, image_size), np.int32)
  for i in range(n):
    for _ in range(rng.integers(1, 4)):
      c = int(rng.integers(1, len(CLASSES)))
      h, w = rng.integers(image_size // 6, image_size // 2, 2)
      r, q = rng.integers(0, image_size - h), rng.integers(0, image_size - w)
      x[i, r:r + h, q:q + w] = palette[c]
      y[i, r:r + h, q:q + w] = c
      y[i, r, q:q + w] = y[i, r + h - 1, q:q + w] = IGNORE
      y[i, r:r + h, q] = y[i, r:r + h, q + w - 1] = IGNORE
  x = np.clip(x + 0.05 * rng.normal(size=x.shape), 0.0, 1.0).astype(np.float32)
  return x, y
