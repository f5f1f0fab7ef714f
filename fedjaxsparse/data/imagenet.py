"""ImageNet (ILSVRC-2012) as centralised arrays, from the standard folder layout or from
tensorflow-datasets' prepared ``imagenet2012`` — the data of ATO's ImageNet results (Table 5
and Fig. 8 of Xidong Wu's dissertation).

References:
  Olga Russakovsky, Jia Deng, Hao Su, et al. (2015). ImageNet Large Scale Visual Recognition
    Challenge. IJCV 115(3). arXiv:1409.0575.

* :func:`imagenet_folder` reads ``ROOT/<split>/<wnid>/<image>`` (``.JPEG``, ``.jpg``,
  ``.jpeg``, ``.png``), the layout of the ILSVRC-2012 train archive and of its validation set
  after the usual ``valprep.sh`` sort: classes are the sorted folder names (the order torchvision's
  ``ImageFolder`` uses, so wnid ``n01440764`` is class 0).
* :func:`imagenet_tfds` reads tfds' ``imagenet2012`` data source (prepared by hand from the
  archives: ``tfds build imagenet2012 --manual_dir ...``).

Both give the evaluation transform of the ResNet papers: the shorter side resized to
``image_size / 0.875`` (256 for 224), the centre ``image_size²`` crop, RGB in [0, 1] as
``float32 [n, H, W, 3]``; training augmentation (random-resized crops) belongs to the training
loop. ``per_class`` keeps the first images of every class (a subset that fits in memory; the
full training set is 1.28 M images, ~190 GB as float32 at 224²).

Source for the team: seed 004 Task 2, Table 5 / Fig. 8.
"""
from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from fedjaxsparse.errors import DataError
from fedjaxsparse.core import public_dir as _public_dir

EXTENSIONS = (".jpeg", ".jpg", ".png")
CROP_FRACTION = 0.875
"""The centre crop's share of the resized shorter side (224 of 256)."""


def preprocess(image, image_size: int = 224) -> np.ndarray:
  """``float32 [image_size, image_size, 3]`` in [0, 1]: an image (PIL or ``uint8 [H, W, C]``)
  with its shorter side resized to ``round(image_size / 0.875)`` (bilinear), centre-cropped;
  grey-scale and RGBA images become RGB."""
  from PIL import Image  # deferred: Pillow is needed only by the ImageNet loaders
  if not isinstance(image, Image.Image):
    arr = np.asarray(image)
    image = Image.fromarray(arr[..., 0] if arr.ndim == 3 and arr.shape[-1] == 1 else arr)
  image = image.convert("RGB")
  short = round(image_size / CROP_FRACTION)
  w, h = image.size
  scale = short / min(w, h)
  image = image.resize((max(short, round(w * scale)), max(short, round(h * scale))),
                       Image.BILINEAR)
  w, h = image.size
  left, top = (w - image_size) // 2, (h - image_size) // 2
  image = image.crop((left, top, left + image_size, top + image_size))
  return np.asarray(image, np.float32) / 255.0


def imagenet_folder(root: str, split: str = "val", *, image_size: int = 224,
                    per_class: int | None = None,
                    classes: Sequence[str] | None = None) -> tuple[np.ndarray, np.ndarray,
                                                                   list[str]]:
  """``(x float32 [n, S, S, 3], y int32 [n], class names)`` of ``ROOT/<split>/<class>/*``.
  ``classes``: the class folders in label order (default: every folder of the split, sorted —
  pass the training split's list when a validation folder lacks some class)."""
  folder = os.path.join(root, split)
  if not os.path.isdir(folder):
    raise FileNotFoundError(
        f"{folder!r} is not a folder: ImageNet is read from ROOT/{split}/<wnid>/<image>, the "
        "layout of the ILSVRC-2012 archives (validation images sorted into class folders, e.g. "
        "by valprep.sh); download it from image-net.org and pass ROOT.")
  names = sorted(d for d in os.listdir(folder) if os.path.isdir(os.path.join(folder, d))) \
      if classes is None else list(classes)
  if not names:
    raise DataError(f"{folder} holds no class folders.")
  if per_class is not None and per_class < 1:
    raise ValueError(f"per_class must be >= 1, got {per_class}.")
  xs, ys = [], []
  for label, name in enumerate(names):
    sub = os.path.join(folder, name)
    if not os.path.isdir(sub):
      continue   # a class without images in this split
    files = sorted(f for f in os.listdir(sub) if f.lower().endswith(EXTENSIONS))
    for f in files[:per_class]:
      try:
        from PIL import Image  # deferred: Pillow is needed only by the ImageNet loaders
        with Image.open(os.path.join(sub, f)) as im:
          xs.append(preprocess(im, image_size))
      except OSError as e:
        raise DataError(f"{os.path.join(sub, f)}: not a readable image ({e}).") from None
      ys.append(label)
  if not xs:
    raise DataError(f"{folder} holds no images ({', '.join(EXTENSIONS)}).")
  return np.stack(xs), np.asarray(ys, np.int32), names


def imagenet_tfds(split: str = "validation", data_dir: str | None = None, *,
                  image_size: int = 224, limit: int | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
  """``(x float32 [n, S, S, 3], y int32 [n])`` from tfds' prepared ``imagenet2012`` data
  source (its ``train`` or ``validation`` split; the first ``limit`` records)."""
  from fedjaxsparse.data.tfds_sources import data_source  # deferred: tensorflow-datasets
  source = data_source("imagenet2012", split, data_dir)
  n = len(source) if limit is None else min(limit, len(source))
  xs, ys = [], []
  for i in range(n):
    record = source[i]
    xs.append(preprocess(np.asarray(record["image"]), image_size))
    ys.append(int(record["label"]))
  return np.stack(xs), np.asarray(ys, np.int32)


__all__ = ["CROP_FRACTION", "preprocess", "imagenet_folder", "imagenet_tfds"]
__dir__ = _public_dir(__all__)
