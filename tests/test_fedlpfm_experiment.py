"""The Fed-LPFM experiment (seed 004 Table 8 end to end through the CLI in a tiny configuration
on Fashion-MNIST-format files, the stand-in fixture; Table 11's linear probe as a unit): every method runs and the
results carry the paper's numbers and the teacher's label. One-value grids keep it short
(tuning is the shared code every experiment uses). Table 12's mixed teachers reduce to
per-client teacher masks, tested in test_fedlpfm."""
import json

import numpy as np
import pytest

from fedjaxsparse.cli import main

TINY = ["--no-progress", "--rounds", "2", "--clients", "4", "--set", "train_size=600", "--set",
        "teacher_epochs=1", "--set", "local_steps=2", "--set", "batch=16"]


def test_table8_tiny(tmp_path, fashion_mnist_dir):
  assert main(["run", "fedlpfm_fmnist", "--out", str(tmp_path), "--data-dir", fashion_mnist_dir,
               *TINY,
               "--set", "splits=class", "--set", "lams=0.5", "--set", "mus=0.1"]) == 0
  res = json.load(open(tmp_path / "fedlpfm_fmnist" / "results.json"))
  assert [r["method"] for r in res["table"]] == ["FedAvg", "FedProx", "FML", "Fed-LPFM"]
  assert [r["paper % (CIFAR-10)"] for r in res["table"]] == [67.67, 65.97, 19.29, 82.29]
  assert res["table"][1]["chosen"] == "μ=0.1" and res["table"][3]["chosen"] == "λ=0.5"
  assert all(np.isfinite(r["ours %"]) and 0 <= r["ours %"] <= 100 for r in res["table"])
  assert "library-trained CNN teacher" in res["teachers"]["CNN"]
  assert (tmp_path / "fedlpfm_fmnist" / "fedlpfm_fmnist.png").read_bytes()[:4] == b"\x89PNG"


def test_linear_probe_fits_local_labels():
  """Table 11's teacher: a logistic head on fixed features fitted to one client's labels."""
  from fedjaxsparse.experiments.fedlpfm_fmnist import _linear_probe
  rng = np.random.default_rng(0)
  centres = rng.standard_normal((3, 8)) * 3
  y = rng.integers(0, 3, 120)
  feats = centres[y] + rng.standard_normal((120, 8))
  w, b = _linear_probe(feats.astype(np.float32), y, 10)
  pred = np.argmax(feats @ w + b, -1)
  assert np.mean(pred == y) > 0.95 and set(np.unique(pred)) <= {0, 1, 2}
