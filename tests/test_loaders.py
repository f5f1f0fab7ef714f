"""Real-file loaders, tested offline on small fixtures written in the real formats, and the
fail-fast errors when the files are missing."""
import gzip
import json
import os
import time

import numpy as np
import pytest

import fedjaxsparse as fjs
from fedjaxsparse.data.tfds_sources import load_split


def _write_idx(path, array):
  header = bytes([0, 0, 8, array.ndim]) + b"".join(
      int(s).to_bytes(4, "big") for s in array.shape)
  with gzip.open(path, "wb") as f:
    f.write(header + array.astype(np.uint8).tobytes())


def test_write_idx_is_the_format_read_idx_reads(tmp_path):
  """The library's writer and this file's independent one produce the same bytes."""
  a = np.random.default_rng(1).integers(0, 256, (7, 28, 28))
  ours, theirs = str(tmp_path / "ours.gz"), str(tmp_path / "theirs.gz")
  fjs.data.fashion_mnist.write_idx(ours, a)
  _write_idx(theirs, a)
  assert gzip.open(ours).read() == gzip.open(theirs).read()
  np.testing.assert_array_equal(fjs.data.fashion_mnist.read_idx(ours), a)
  with pytest.raises(ValueError, match=r"\[0, 255\]"):
    fjs.data.fashion_mnist.write_idx(str(tmp_path / "bad"), np.array([256]))


def test_loader_default_folder_follows_the_environment_variable(tmp_path, monkeypatch):
  """No folder given: ``$FEDJAXSPARSE_FASHION_MNIST``, else Debian's folder; the stand-in
  written there loads as Fashion-MNIST (10 balanced classes)."""
  monkeypatch.delenv(fjs.data.fashion_mnist.ENV_VAR, raising=False)
  assert fjs.data.fashion_mnist.default_dir() == fjs.data.fashion_mnist.DEBIAN_DIR
  (x, y), (xt, yt) = fjs.data.standins.fashion_mnist_standin(200, 50, seed=3)
  fjs.data.fashion_mnist.write_split(str(tmp_path), "train", x, y)
  fjs.data.fashion_mnist.write_split(str(tmp_path), "test", xt, yt)
  monkeypatch.setenv(fjs.data.fashion_mnist.ENV_VAR, str(tmp_path))
  got_x, got_y = fjs.data.fashion_mnist.load_arrays(split="train")
  np.testing.assert_array_equal(np.round(got_x[..., 0] * 255).astype(np.uint8), x)
  np.testing.assert_array_equal(np.bincount(got_y), np.full(10, 20))


def test_fashion_mnist_idx_fixture(tmp_path):
  rng = np.random.default_rng(0)
  train_x = rng.integers(0, 256, (60, 28, 28))
  train_y = np.repeat(np.arange(10), 6)
  _write_idx(tmp_path / "train-images-idx3-ubyte.gz", train_x)
  _write_idx(tmp_path / "train-labels-idx1-ubyte.gz", train_y)
  _write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", train_x[:20])
  _write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", train_y[:20])
  np.testing.assert_array_equal(
      fjs.data.fashion_mnist.read_idx(str(tmp_path / "train-images-idx3-ubyte.gz")), train_x)
  ds = fjs.data.fashion_mnist.fashion_mnist(str(tmp_path), num_clients=5, partition="shards",
                                            seed=0)
  assert ds.train.x.shape[2:] == (28, 28, 1) and ds.test.num_clients == 1
  assert int(ds.train.num_examples.sum()) == 60 and int(ds.test.num_examples[0]) == 20
  # Pixel values survive the round trip (scaled to [0, 1]).
  x = np.asarray(ds.train.x)[np.asarray(ds.train.mask) > 0].reshape(-1, 784) * 255
  assert {tuple(r) for r in np.round(x).astype(int)} == {tuple(r) for r in
                                                          train_x.reshape(60, 784)}


def _blog_rows(rng, sites, per_site):
  rows = []
  for s in sites:
    site = np.full(50, float(s))
    for _ in range(per_site):
      rows.append(np.concatenate([site, rng.uniform(0, 10, 230), [rng.integers(0, 50)]]))
  return np.array(rows)


def test_blogfeedback_fixture(tmp_path):
  rng = np.random.default_rng(0)
  train = _blog_rows(rng, [1, 2, 3], 4)
  np.savetxt(tmp_path / "blogData_train.csv", train, delimiter=",")
  np.savetxt(tmp_path / "blogData_test-2012.02.01.00_00.csv", _blog_rows(rng, [2, 9], 2),
             delimiter=",")
  np.savetxt(tmp_path / "blogData_test-2012.02.02.00_00.csv", _blog_rows(rng, [1], 3),
             delimiter=",")
  ds = fjs.data.blogfeedback.blogfeedback(str(tmp_path))
  assert ds.num_clients == 3  # one client per distinct first-50-column combination
  np.testing.assert_array_equal(ds.train.num_examples, [4, 4, 4])
  assert ds.train.x.shape[-1] == 281 and ds.num_classes == 0
  x = np.asarray(ds.train.x)
  assert x.min() >= 0 and x.max() <= 1  # scaled to [0, 1]
  np.testing.assert_array_equal(x[..., -1], 1.0)  # bias column
  np.testing.assert_allclose(np.sort(np.asarray(ds.train.y).ravel()),
                             np.sort(train[:, -1]))  # raw target
  assert int(ds.test.num_examples[0]) == 7
  xt = np.asarray(ds.test.x)[0, :7]
  assert xt.min() >= 0 and xt.max() <= 1  # site 9 is outside the training range: clipped


def test_femnist_leaf_json_fixture(tmp_path):
  rng = np.random.default_rng(0)
  for split, n in (("train", 3), ("test", 1)):
    os.makedirs(tmp_path / split)
    users = ["f0001", "f0002", "f0003"]
    blob = {"users": users, "num_samples": [n] * 3,
            "user_data": {u: {"x": rng.uniform(0, 1, (n, 784)).tolist(),
                              "y": rng.integers(0, 62, n).tolist()} for u in users}}
    with open(tmp_path / split / "all_data_0.json", "w") as f:
      json.dump(blob, f)
  ds = fjs.data.leaf.femnist(str(tmp_path), num_clients=2)
  assert ds.num_clients == 2 and ds.num_classes == 62
  np.testing.assert_array_equal(ds.train.num_examples, [3, 3])
  np.testing.assert_array_equal(ds.test.num_examples, [1, 1])  # each writer's own test data
  assert ds.train.x.shape[2:] == (28, 28, 1)
  # seed 000's protocol: 2 training writers, the unrestricted test set of all 3 writers
  full = fjs.data.leaf.femnist(str(tmp_path), num_clients=2, test="all")
  np.testing.assert_array_equal(full.test.num_examples, [3])
  np.testing.assert_array_equal(full.train.x, ds.train.x)
  kept = {tuple(np.round(r, 6)) for r in np.asarray(ds.test.x).reshape(2, -1)}
  every = {tuple(np.round(r, 6)) for r in np.asarray(full.test.x)[0].reshape(3, -1)}
  assert kept < every  # the writers' own test examples plus the third writer's


def test_libsvm_fixture(tmp_path):
  path = tmp_path / "toy.svm"
  path.write_text("-1 1:0.5 3:1.0\n+1 2:2.0\n+1 1:1.5 2:0.25\n-1 3:3.0\n")
  ds = fjs.data.libsvm.libsvm(str(path), num_clients=2, partition="iid", test_fraction=0.0)
  x = np.asarray(ds.train.x)[np.asarray(ds.train.mask) > 0]
  assert x.shape == (4, 3)
  y = np.asarray(ds.train.y)[np.asarray(ds.train.mask) > 0]
  assert sorted(y.tolist()) == [0, 0, 1, 1]  # {-1, +1} -> {0, 1}
  assert {tuple(r) for r in x.tolist()} == {(0.5, 0, 1.0), (0, 2.0, 0), (1.5, 0.25, 0),
                                            (0, 0, 3.0)}


def test_tfds_data_source_path_with_mock_data():
  tfds = pytest.importorskip("tensorflow_datasets")
  with tfds.testing.mock_data(num_examples=12):
    x, y = load_split("mnist", "train", None)
  assert x.shape == (12, 28, 28, 1) and y.shape == (12,)
  assert 0.0 <= x.min() and x.max() <= 1.0 and 0 <= y.min() and y.max() < 10


@pytest.mark.parametrize("name, kwargs, hint", [
    ("fashion_mnist", {}, "apt-get install dataset-fashion-mnist"),
    ("blogfeedback", {}, "UCI"),
    ("femnist", {}, "LEAF"),
    ("libsvm", {}, "LIBSVM"),
    ("cifar10", {}, "tfds build cifar10"),
])
def test_missing_files_fail_fast_with_instructions(tmp_path, name, kwargs, hint):
  empty = str(tmp_path / "nothing-here")
  start = time.perf_counter()
  with pytest.raises(FileNotFoundError, match=hint):
    fjs.data.load_dataset(name, data_dir=empty, **kwargs)
  assert time.perf_counter() - start < 10.0


def test_emnist_l10_keeps_the_first_ten_letters_of_the_tfds_source():
  """Seed 001 ch. 4's 10-class EMNIST-L from tfds' emnist/letters (labels 1..26 there; tfds'
  mock data also draws the unused label 0): exactly the examples with letters 1..10 are kept,
  as labels 0..9."""
  tfds = pytest.importorskip("tensorflow_datasets")
  with tfds.testing.mock_data(num_examples=60):
    x26, y26 = fjs.data.load_arrays("emnist_l", "train")
    x10, y10 = fjs.data.load_arrays("emnist_l10", "train")
  kept = (y26 >= 0) & (y26 < 10)
  assert 0 < kept.sum() < len(y26)
  np.testing.assert_array_equal(y10, y26[kept])
  np.testing.assert_array_equal(x10, x26[kept])
  assert x10.shape[1:] == (28, 28, 1) and y10.max() < 10


def test_imagenet_folder_layout_and_tfds_source(tmp_path):
  """ImageNet's folder layout (ROOT/<split>/<wnid>/<image>): classes are the sorted wnids, the
  evaluation transform resizes the shorter side to S/0.875 and centre-crops S×S (checked on an
  image whose centre is a known colour), grey images become RGB, per_class keeps the first
  images; tfds' imagenet2012 data source (mock data in its real schema) goes through the same
  transform; a missing folder says how to supply the files."""
  from PIL import Image
  imagenet = fjs.data.imagenet
  for wnid, colour in (("n02", (0, 0, 255)), ("n01", (255, 0, 0))):
    d = tmp_path / "val" / wnid
    d.mkdir(parents=True)
    for i, (w, h) in enumerate(((60, 40), (40, 90))):
      img = np.zeros((h, w, 3), np.uint8)
      img[h // 2 - 4:h // 2 + 4, w // 2 - 4:w // 2 + 4] = colour   # a coloured centre
      Image.fromarray(img).save(d / f"{wnid}_{i}.JPEG", quality=100)
  Image.fromarray(np.full((50, 50), 128, np.uint8)).save(tmp_path / "val" / "n01" / "g.png")
  x, y, names = imagenet.imagenet_folder(str(tmp_path), "val", image_size=16)
  assert names == ["n01", "n02"] and x.shape == (5, 16, 16, 3) and x.dtype == np.float32
  np.testing.assert_array_equal(y, [0, 0, 0, 1, 1])   # n01: g.png, n01_0, n01_1 (sorted)
  centre = x[:, 7:9, 7:9].mean((1, 2))                 # the crop keeps each image's centre
  assert centre[1, 0] > 0.8 and centre[1, 2] < 0.2     # n01: red
  assert centre[3, 2] > 0.8 and centre[3, 0] < 0.2     # n02: blue
  np.testing.assert_allclose(x[0], 128 / 255, atol=1e-6)  # grey → RGB, constant
  x1, y1, _ = imagenet.imagenet_folder(str(tmp_path), "val", image_size=16, per_class=1)
  assert len(y1) == 2 and list(y1) == [0, 1]
  with pytest.raises(FileNotFoundError, match="image-net.org"):
    imagenet.imagenet_folder(str(tmp_path), "train")
  tfds = pytest.importorskip("tensorflow_datasets")
  with tfds.testing.mock_data(num_examples=3):
    xt, yt = imagenet.imagenet_tfds("validation", image_size=16)
  assert xt.shape == (3, 16, 16, 3) and yt.dtype == np.int32
  assert 0 <= xt.min() and xt.max() <= 1
