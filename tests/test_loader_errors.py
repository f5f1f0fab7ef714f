"""Malformed data files fail with a DataError naming the file and the line or record;
fixtures are small files written in the real formats (as in test_loaders.py)."""
import gzip
import json
import os
import re

import numpy as np
import pytest

import fedjaxsparse as fjs


def _where(path, *parts):
  """A regex matching ``path`` followed by each of ``parts`` (escaped) in order."""
  return re.escape(str(path)) + "".join(".*" + re.escape(p) for p in parts)


# LIBSVM / svmlight


@pytest.mark.parametrize("text, line, reason", [
    ("+1 1:0.5\n-1 2:1\n1 3:abc\n-1 1:2\n", 3, "'3:abc'"),
    ("x 1:0.5\n", 1, "label 'x'"),
    ("1 1:0.5\n-1 2:1\n1 3:", 3, "'3:'"),  # truncated last line
    ("1 1:0.5\n-1 2\n", 2, "'2' is not INDEX:VALUE"),
    ("1 2:1 1:0.5\n", 1, "not larger than the previous index 2"),
    ("1 -3:1\n", 1, "negative"),
    ("# header\n\n1 1:0.5\n-1 1:nan\n", 4, "not finite"),
    ("1 1:0.5\ninf 2:1\n", 2, "label 'inf' is not finite"),
], ids=["bad-value", "bad-label", "truncated", "no-colon", "unsorted", "negative-index",
        "nan-value", "inf-label"])
def test_libsvm_malformed_line(tmp_path, text, line, reason):
  path = tmp_path / "bad.svm"
  path.write_text(text)
  with pytest.raises(fjs.errors.DataError, match=_where(path, f"line {line}:", "expected", reason)):
    fjs.data.libsvm.load_arrays(str(path))


def test_libsvm_malformed_gzip_line(tmp_path):
  path = tmp_path / "bad.svm.gz"
  with gzip.open(path, "wb") as f:
    f.write(b"1 1:0.5\n1 2:0.5 3:1e\n")
  with pytest.raises(fjs.errors.DataError, match=_where(path, "line 2:", "'1 2:0.5 3:1e'")):
    fjs.data.libsvm.load_arrays(str(path))


@pytest.mark.parametrize("text, why", [("", "the file is empty"),
                                       ("# only a comment\n\n", "all comments")])
def test_libsvm_no_examples(tmp_path, text, why):
  path = tmp_path / "empty.svm"
  path.write_text(text)
  with pytest.raises(fjs.errors.DataError, match=_where(path, "no examples", why)):
    fjs.data.libsvm.libsvm(str(path), num_clients=2)


def test_libsvm_comments_qid_multiclass_gzip_and_test_file(tmp_path):
  train = tmp_path / "train.svm.gz"
  with gzip.open(train, "wt") as f:
    f.write("# a comment line\n3 qid:1 1:0.5 4:2 # trailing comment\n\n7 2:-1.5\n"
            "5 1:2.5e-1 3:4\n")
  x, y = fjs.data.libsvm.load_arrays(str(train))
  np.testing.assert_array_equal(x, [[0.5, 0, 0, 2], [0, -1.5, 0, 0], [0.25, 0, 4, 0]])
  assert x.dtype == np.float32 and y.dtype == np.int32
  np.testing.assert_array_equal(y, [0, 2, 1])  # labels 3, 7, 5 -> ranks 0, 2, 1
  test = tmp_path / "test.svm"
  test.write_text("5 2:1\n3 1:1\n")
  xt, yt = fjs.data.libsvm.load_arrays(str(test), num_features=x.shape[1])
  np.testing.assert_array_equal(xt, [[0, 1, 0, 0], [1, 0, 0, 0]])
  ds = fjs.data.libsvm.libsvm(str(train), num_clients=1, test_path=str(test))
  assert ds.num_classes == 3 and ds.train.x.shape[-1] == 4


# Fashion-MNIST IDX


def _idx_bytes(array, shape=None):
  shape = array.shape if shape is None else shape
  return (bytes([0, 0, 8, len(shape)]) + b"".join(int(s).to_bytes(4, "big") for s in shape)
          + np.asarray(array, np.uint8).tobytes())


def _write(path, data):
  if str(path).endswith(".gz"):
    with gzip.open(path, "wb") as f:
      f.write(data)
  else:
    with open(path, "wb") as f:
      f.write(data)


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_idx_truncated(tmp_path, suffix):
  path = tmp_path / ("train-images-idx3-ubyte" + suffix)
  _write(path, _idx_bytes(np.zeros((5, 28, 28)))[:-100])  # 5 * 784 - 100 = 3820 bytes
  with pytest.raises(fjs.errors.DataError, match=_where(
      path, "truncated IDX file: header declares shape (5, 28, 28) = 3920 bytes, "
      "found 3820 bytes (4 complete records)")):
    fjs.data.fashion_mnist.read_idx(str(path))


def test_idx_trailing_bytes_bad_magic_and_short_header(tmp_path):
  path = tmp_path / "labels-idx1-ubyte"
  _write(path, _idx_bytes(np.arange(6)) + b"\x00\x01")
  with pytest.raises(fjs.errors.DataError, match=_where(path, "(6) = 6 bytes, found 8", "2 extra")):
    fjs.data.fashion_mnist.read_idx(str(path))
  _write(path, b"\x00\x00\x0d\x01" + _idx_bytes(np.arange(6))[4:])  # float IDX
  with pytest.raises(fjs.errors.DataError, match=_where(path, "not an unsigned-byte IDX file")):
    fjs.data.fashion_mnist.read_idx(str(path))
  _write(path, bytes([0, 0, 8, 3, 0, 0, 0, 5]))  # 3 dimensions, one size given
  with pytest.raises(fjs.errors.DataError, match=_where(path, "truncated IDX file", "16 bytes")):
    fjs.data.fashion_mnist.read_idx(str(path))
  _write(path, b"\x00\x00")
  with pytest.raises(fjs.errors.DataError, match=_where(path, "not an unsigned-byte IDX file")):
    fjs.data.fashion_mnist.read_idx(str(path))


def _write_split(tmp_path, images, labels, suffix=""):
  stems = fjs.data.fashion_mnist.FILES["train"]
  _write(tmp_path / (stems[0] + suffix), _idx_bytes(images))
  _write(tmp_path / (stems[1] + suffix), _idx_bytes(labels))
  return [str(tmp_path / (s + suffix)) for s in stems]


def test_fashion_mnist_label_out_of_range(tmp_path):
  labels = np.array([0, 9, 3, 200, 1])
  _, label_path = _write_split(tmp_path, np.zeros((5, 28, 28)), labels, ".gz")
  with pytest.raises(fjs.errors.DataError,
                     match=_where(label_path, "record 3: label 200 outside [0, 10)")):
    fjs.data.fashion_mnist.load_arrays(str(tmp_path), "train")


def test_fashion_mnist_count_mismatch(tmp_path):
  image_path, label_path = _write_split(tmp_path, np.zeros((5, 28, 28)), np.arange(4))
  with pytest.raises(fjs.errors.DataError,
                     match=_where(image_path, "5 images", label_path, "4 labels")):
    fjs.data.fashion_mnist.load_arrays(str(tmp_path), "train")


def test_fashion_mnist_uncompressed_files(tmp_path):
  rng = np.random.default_rng(1)
  images, labels = rng.integers(0, 256, (7, 28, 28)), np.array([9, 0, 1, 2, 3, 4, 5])
  _write_split(tmp_path, images, labels)
  x, y = fjs.data.fashion_mnist.load_arrays(str(tmp_path), "train")
  assert x.shape == (7, 28, 28, 1) and x.dtype == np.float32 and y.dtype == np.int32
  np.testing.assert_allclose(x[..., 0] * 255, images, atol=1e-4)
  np.testing.assert_array_equal(y, labels)


# BlogFeedback CSV


def _blog_file(path, rows):
  np.savetxt(path, np.asarray(rows, np.float64), delimiter=",", fmt="%g")


def _blog_rows(n):
  rows = np.ones((n, 281))
  rows[:, 50:] = np.arange(n)[:, None]
  return rows


def _replace_field(path, line, column, text):
  """Put ``text`` in 1-based ``column`` of 1-based ``line`` of a CSV file."""
  lines = path.read_text().splitlines()
  fields = lines[line - 1].split(",")
  fields[column - 1] = text
  lines[line - 1] = ",".join(fields)
  path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("column, text, why", [
    (7, "abc", "column 7 (attribute) is 'abc', not a number"),
    (281, "", "column 281 (target) is '', not a number"),
    (281, "nan", "non-finite value in column 281 (target)"),
    (12, "-inf", "non-finite value in column 12 (attribute)"),
])
def test_blogfeedback_bad_value(tmp_path, column, text, why):
  path = tmp_path / "blogData_train.csv"
  _blog_file(path, _blog_rows(4))
  _replace_field(path, 3, column, text)
  with pytest.raises(fjs.errors.DataError, match=_where(path, "line 3: " + why)):
    fjs.data.blogfeedback._read(str(path))


def test_blogfeedback_wrong_width(tmp_path):
  path = tmp_path / "blogData_test-2012.02.01.00_00.csv"
  _blog_file(path, _blog_rows(3))
  lines = path.read_text().splitlines()
  lines[1] = lines[1].rsplit(",", 1)[0]  # a row of 280 values
  path.write_text("\n".join(lines) + "\n")
  with pytest.raises(fjs.errors.DataError, match=_where(path, "line 2: expected 281", "got 280")):
    fjs.data.blogfeedback._read(str(path))
  _blog_file(path, np.ones((2, 5)))  # every row too short: still names the first line
  with pytest.raises(fjs.errors.DataError, match=_where(path, "line 1: expected 281", "got 5")):
    fjs.data.blogfeedback._read(str(path))
  path.write_text("")
  with pytest.raises(fjs.errors.DataError, match=_where(path, "the file is empty")):
    fjs.data.blogfeedback._read(str(path))


def test_blogfeedback_bad_test_file_is_named(tmp_path):
  _blog_file(tmp_path / "blogData_train.csv", _blog_rows(3))
  _blog_file(tmp_path / "blogData_test-2012.02.01.00_00.csv", _blog_rows(2))
  bad = tmp_path / "blogData_test-2012.02.02.00_00.csv"
  _blog_file(bad, _blog_rows(2))
  _replace_field(bad, 2, 281, "inf")
  with pytest.raises(fjs.errors.DataError, match=_where(bad, "line 2: non-finite", "(target)")):
    fjs.data.blogfeedback.blogfeedback(str(tmp_path))


def test_blogfeedback_rows_and_negative_target(tmp_path):
  path = tmp_path / "blogData_train.csv"
  rows = _blog_rows(3)
  rows[1, -1] = -2.0  # accepted: only non-finite values are errors
  _blog_file(path, rows)
  data = fjs.data.blogfeedback._read(str(path))
  assert data.shape == (3, 281) and data.dtype == np.float64
  np.testing.assert_array_equal(data, rows)


# LEAF FEMNIST JSON


def _leaf_dir(tmp_path, train_blob, n_test=1):
  rng = np.random.default_rng(0)
  for split in ("train", "test"):
    os.makedirs(tmp_path / split)
  with open(tmp_path / "train" / "all_data_0.json", "w") as f:
    f.write(train_blob if isinstance(train_blob, str) else json.dumps(train_blob))
  test = {"users": ["w1"], "num_samples": [n_test],
          "user_data": {"w1": {"x": rng.uniform(0, 1, (n_test, 784)).tolist(),
                               "y": [5] * n_test}}}
  with open(tmp_path / "test" / "all_data_0.json", "w") as f:
    json.dump(test, f)
  return str(tmp_path / "train" / "all_data_0.json")


def _leaf_blob(n=3):
  users = ["w1", "w2"]
  return {"users": users, "num_samples": [n] * 2,
          "user_data": {u: {"x": [[k / 784 for k in range(784)]] * n,
                            "y": list(range(n))} for u in users}}


def test_femnist_invalid_json(tmp_path):
  path = _leaf_dir(tmp_path, '{"users": ["w1"],\n "user_data": {"w1": {"x": [[0.5,]]}}}')
  with pytest.raises(fjs.errors.DataError, match=_where(path, "invalid JSON at line 2, column")):
    fjs.data.leaf.femnist(str(tmp_path))


@pytest.mark.parametrize("edit, where", [
    (lambda b: b.pop("users"), ["missing key 'users'"]),
    (lambda b: b.pop("user_data"), ["missing key 'user_data'"]),
    (lambda b: b["users"].append("w9"), ["user 'w9'", "missing from 'user_data'"]),
    (lambda b: b["user_data"]["w2"].pop("x"), ["user 'w2'", "missing key 'x'"]),
    (lambda b: b["user_data"]["w2"].pop("y"), ["user 'w2'", "missing key 'y'"]),
    (lambda b: b["user_data"]["w2"]["x"].__setitem__(2, [0.5] * 783),
     ["user 'w2', example 2: expected 784 pixel values, got 783"]),
    (lambda b: b["user_data"]["w1"]["y"].__setitem__(1, 62),
     ["user 'w1', example 1: label 62 outside [0, 62)"]),
    (lambda b: b["user_data"]["w1"]["y"].__setitem__(2, -1),
     ["user 'w1', example 2: label -1 outside [0, 62)"]),
    (lambda b: b["user_data"]["w2"]["x"].__setitem__(1, [0.5] * 100 + [float("nan")] * 684),
     ["user 'w2', example 1: pixel value at position 100 is not finite"]),
], ids=["no-users", "no-user-data", "user-not-in-data", "no-x", "no-y", "783-pixels",
        "label-62", "label-negative", "nan-pixel"])
def test_femnist_malformed_content(tmp_path, edit, where):
  blob = _leaf_blob()
  edit(blob)
  path = _leaf_dir(tmp_path, blob)
  with pytest.raises(fjs.errors.DataError, match=_where(path, *where)):
    fjs.data.leaf.femnist(str(tmp_path))


def test_femnist_values_and_writer_without_test_data(tmp_path):
  _leaf_dir(tmp_path, _leaf_blob(n=3), n_test=2)
  ds = fjs.data.leaf.femnist(str(tmp_path))
  assert ds.num_clients == 2 and ds.train.x.shape[2:] == (28, 28, 1)
  np.testing.assert_array_equal(ds.test.num_examples, [2, 0])  # w2 has no test examples
  mask = np.asarray(ds.train.mask) > 0
  np.testing.assert_allclose(np.asarray(ds.train.x)[mask][0].ravel(),
                             np.arange(784) / 784, rtol=1e-6)
  np.testing.assert_array_equal(np.sort(np.asarray(ds.train.y)[mask]), [0, 0, 1, 1, 2, 2])


# Loaders called without data_dir


@pytest.mark.parametrize("name, hint", [("blogfeedback", "UCI"), ("femnist", "LEAF"),
                                        ("libsvm", "LIBSVM")])
def test_missing_data_dir_says_where_to_put_the_files(name, hint):
  with pytest.raises(FileNotFoundError, match=hint):
    fjs.data.load_dataset(name)
