"""Segmentation (seed 003 appendix Table 3): the PASCAL VOC loader on a fixture in VOC's own
layout (JPEGs, palette PNG masks, split lists), its stand-in, the ignore-aware pixel loss,
confusion matrix and mIoU in closed form, and BiSeNetV2's shapes and learning."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from fedjaxsparse.data import pascal_voc as V
from fedjaxsparse.models import segmentation as S


@functools.lru_cache(maxsize=None)
def _param_shapes():
  """The parameter structure of the tests' BiSeNetV2 (traced once a module): the same under
  both norms (every norm layer has a scale and a bias per channel)."""
  model = S.bisenetv2((32, 32, 3), 21, width=0.125, head_width=16)
  return jax.eval_shape(lambda: model.init(jax.random.key(0)))


def _voc(root, ids=("2007_000032", "2007_000039", "2008_000002"), size=(40, 30)):
  """A VOC2012 folder: RGB JPEGs, palette PNGs (class ids, 255 on a border), train.txt."""
  base = root / "VOCdevkit" / "VOC2012"
  for d in ("ImageSets/Segmentation", "JPEGImages", "SegmentationClass"):
    (base / d).mkdir(parents=True)
  rng = np.random.default_rng(0)
  masks = {}
  for k, name in enumerate(ids):
    Image.fromarray(rng.integers(0, 255, size[::-1] + (3,), dtype=np.uint8)).save(
        base / "JPEGImages" / f"{name}.jpg")
    m = np.zeros(size[::-1], np.uint8)
    m[:, size[0] // 2:] = 1 + k          # right half: class 1 + k
    m[:, size[0] // 2 - 1] = 255         # the void border
    png = Image.fromarray(m, mode="P")
    png.putpalette([v for c in range(256) for v in (c, 255 - c, (7 * c) % 256)])
    png.save(base / "SegmentationClass" / f"{name}.png")
    masks[name] = m
  (base / "ImageSets" / "Segmentation" / "train.txt").write_text("\n".join(ids) + "\n")
  return base, masks


def test_voc_loader_reads_the_standard_layout(tmp_path):
  base, _ = _voc(tmp_path)
  x, y = V.voc_segmentation(str(tmp_path), "train", image_size=16)
  assert x.shape == (3, 16, 16, 3) and y.shape == (3, 16, 16)
  assert x.dtype == np.float32 and 0 <= x.min() and x.max() <= 1
  for k in range(3):   # nearest resizing keeps the ids: background, the class, the border
    assert set(np.unique(y[k]).tolist()) <= {0, 1 + k, 255} and (y[k] == 1 + k).any()
  assert (y[:, :, 15] == np.arange(1, 4)[:, None]).all() and (y[:, :, 0] == 0).all()
  assert V.voc_segmentation(str(base), "train", image_size=16, limit=1)[0].shape[0] == 1


def test_voc_loader_errors_say_what_to_supply(tmp_path):
  with pytest.raises(FileNotFoundError, match="VOCtrainval_11-May-2012"):
    V.voc_segmentation(str(tmp_path))
  base, _ = _voc(tmp_path)
  with pytest.raises(FileNotFoundError, match="val"):
    V.voc_segmentation(str(tmp_path), "val")
  Image.new("RGB", (40, 30)).save(base / "SegmentationClass" / "2007_000032.png")
  with pytest.raises(ValueError, match="palette"):
    V.voc_segmentation(str(tmp_path), "train", image_size=16)


def test_standin_has_vocs_shape_labels_and_void_borders():
  x, y = V.voc_standin(6, 32, seed=1)
  assert x.shape == (6, 32, 32, 3) and y.shape == (6, 32, 32)
  assert set(np.unique(y).tolist()) <= set(range(21)) | {255} and (y == 255).any()


def test_pixel_loss_ignores_void_pixels():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 3, 3, 4)).astype(np.float32)
  y = np.array([[[0, 1, 255], [2, 3, 255], [0, 0, 1]], [[255] * 3] * 3], np.int32)
  got = jax.jit(S.pixel_cross_entropy)(logits, y)
  z = logits.astype(np.float64)
  lp = z - np.log(np.sum(np.exp(z), -1, keepdims=True))
  valid = y[0] != 255
  want = -np.mean(lp[0][valid, y[0][valid]])
  np.testing.assert_allclose(got, [want, 0.0], rtol=1e-5)


def test_confusion_matrix_and_mean_iou():
  y = np.array([[0, 0, 1, 1, 2, 255]])
  pred = np.array([[0, 1, 1, 1, 0, 2]])
  cm = np.asarray(jax.jit(S.confusion_matrix, static_argnums=2)(pred, y, 3))
  np.testing.assert_array_equal(cm, [[1, 1, 0], [0, 2, 0], [1, 0, 0]])
  miou, iou = S.mean_iou(cm)
  np.testing.assert_allclose(iou, [1 / 3, 2 / 3, 0.0])
  assert miou == pytest.approx(1 / 3)


@functools.lru_cache(maxsize=None)
def _loss_and_grad():
  """``(params, x, y) -> ((mean pixel loss, logits), gradient)`` of the tests' BiSeNetV2 (the
  default norm: the current batch's statistics), jitted once a module: the learning test's
  program, whose logits are also the evaluation test's reference predictions."""
  model = S.bisenetv2((32, 32, 3), 21, width=0.125, head_width=16)

  def mean_loss(q, x, y):
    logits = model.apply(q, x)
    return jnp.mean(model.per_example_loss(logits, y)), logits

  return jax.jit(jax.value_and_grad(mean_loss, has_aux=True))


@pytest.mark.integration   # BiSeNetV2 compiled for a learning step
def test_bisenetv2_maps_images_to_per_pixel_logits_and_learns():
  """Per-pixel logits at the input's size; one SGD step on the stand-in lowers the loss of the
  batch it was taken on (a small step along the gradient of a smooth loss)."""
  x, y = V.voc_standin(4, 32, seed=0)
  rng = np.random.default_rng(0)   # numpy parameters: jax's initialisers compile slowly
  params = jax.tree.map(lambda a: np.asarray(
      rng.normal(size=a.shape) / np.sqrt(max(1, np.prod(a.shape[:-1]))) if a.ndim > 1 else
      (np.ones(a.shape) if a.ndim == 1 else rng.normal(size=a.shape)), np.float32),
      _param_shapes())
  loss = _loss_and_grad()
  (before, logits), g = loss(params, x, y)
  step = jax.tree.map(lambda p, d: p - np.float32(0.05) * np.asarray(d), params, g)
  (after, _), _ = loss(step, x, y)
  assert float(after) < float(before)
  assert logits.shape == (4, 32, 32, 21)
  with pytest.raises(ValueError, match="multiples of 32"):
    S.bisenetv2((30, 32, 3))


@pytest.mark.integration   # the experiment's data and a BiSeNetV2 evaluation program (11 s)
def test_fedmrn_segmentation_data_and_miou_evaluation():
  """Appendix Table 3's segmentation row's pieces in the experiment: the stand-in dealt IID to
  the clients with the void label moved past the classes, and the runner's evaluation — the
  pooled confusion matrix's mIoU and pixel accuracy, padding rows left out — equal to
  :func:`mean_iou` on the model's own predictions."""
  from fedjaxsparse.experiments import fedmrn_fmnist as F
  from fedjaxsparse.harness.options import Config
  ds = F._segmentation_data(Config(clients=2, seed=0, dataset="voc_standin"),
                            {"seg_size": 32, "seg_images": 0})
  assert ds.train.x.shape[:2] == (2, 32) and ds.train.y.shape == (2, 32, 32, 32)
  assert int(np.asarray(ds.train.y).max()) == 21 and ds.num_classes == 22
  # current-batch BatchNorm: an image's logits depend on its batch, so the evaluation's first
  # batch of 4 is the four real images the reference predictions are computed on (the second
  # batch: the padding row and three rows of the evaluation's own padding)
  model = S.bisenetv2((32, 32, 3), 21, width=0.125, head_width=16)
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda a: (0.3 * rng.normal(size=a.shape)).astype(np.float32),
                        _param_shapes())
  from fedjaxsparse.data.federated import FederatedData
  mask = np.array([[1.0, 1.0, 1.0, 1.0, 0.0]], np.float32)   # the fifth row is padding
  test = FederatedData(np.asarray(ds.test.x)[:1, :5], np.asarray(ds.test.y)[:1, :5], mask,
                       np.array([4], np.int32))
  eval_fn = S.make_segmentation_eval_fn(model, 21, batch_size=4)
  (_, logits), _ = _loss_and_grad()(params, test.x[0, :4], test.y[0, :4])   # the model's own
  pred = np.argmax(np.asarray(logits), -1)                                    # predictions

  @jax.jit
  def evaluate(params, test, pred):   # the runner's evaluation and the confusion matrix of the
    return eval_fn(params, test), S.confusion_matrix(pred, test.y[0, :4], 21)   # predictions

  got, cm = evaluate(params, test, pred)
  cm = np.asarray(cm)
  assert float(got["miou"]) == pytest.approx(S.mean_iou(cm)[0], rel=1e-5)
  assert float(got["accuracy"]) == pytest.approx(np.trace(cm) / cm.sum(), rel=1e-5)
