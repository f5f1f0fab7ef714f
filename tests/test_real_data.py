"""Opt-in runs on the real Fashion-MNIST (``pytest -m real_data`` with
``FEDJAXSPARSE_FASHION_MNIST=/usr/share/datasets/fashion-mnist``, say): the files are the
official 60,000 + 10,000 balanced images, and the ``ato_prune`` tiny configuration learns on
them. Without the variable these tests are skipped, saying how to supply the files."""
import json

import numpy as np
import pytest

from fedjaxsparse.harness.cli import main
from fedjaxsparse.data.fashion_mnist import load_arrays

pytestmark = pytest.mark.real_data


def test_real_files_are_the_official_balanced_splits(real_fashion_mnist_dir):
  for split, n in (("train", 60000), ("test", 10000)):
    x, y = load_arrays(real_fashion_mnist_dir, split)
    assert x.shape == (n, 28, 28, 1) and 0.0 <= x.min() and x.max() <= 1.0
    np.testing.assert_array_equal(np.bincount(y, minlength=10), np.full(10, n // 10))


def test_ato_prune_tiny_learns_on_the_real_images(real_fashion_mnist_dir, tmp_path):
  from test_ato_experiment import TINY
  assert main(["run", "ato_prune", "--out", str(tmp_path), "--data-dir",
               real_fashion_mnist_dir] + TINY) == 0
  rows = {(r["method"], r["p"]): r for r in
          json.load(open(tmp_path / "ato_prune" / "results.json"))["table"]}
  assert rows[("Dense", "-")]["test top-1 %"] > 60
