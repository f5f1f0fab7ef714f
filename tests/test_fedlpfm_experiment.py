"""The Fed-LPFM experiment (seed 004 Tables 8/11/12) end to end through the CLI in a tiny
configuration on the real Fashion-MNIST: every method and teacher variant runs, tuning picks
a setting from the grid on the validation split, and the results carry the paper's numbers
and the teacher's label."""
import json

import numpy as np
import pytest

from fedjaxsparse.cli import main
from fedjaxsparse.data.fashion_mnist import DEFAULT_DIR

pytestmark = pytest.mark.skipif(
    not __import__("os").path.isdir(DEFAULT_DIR), reason="Fashion-MNIST files not installed")

TINY = ["--no-progress", "--rounds", "2", "--set", "train_size=1500", "--set",
        "teacher_epochs=1", "--set", "local_steps=2", "--set", "batch=16"]


def test_table8_tiny(tmp_path):
  assert main(["run", "fedlpfm_fmnist", "--out", str(tmp_path), *TINY,
               "--set", "splits=class"]) == 0
  res = json.load(open(tmp_path / "fedlpfm_fmnist" / "results.json"))
  assert [r["method"] for r in res["table"]] == ["FedAvg", "FedProx", "FML", "Fed-LPFM"]
  assert [r["paper % (CIFAR-10)"] for r in res["table"]] == [67.67, 65.97, 19.29, 82.29]
  assert res["table"][1]["chosen"] in ("μ=0.01", "μ=0.1")
  assert res["table"][3]["chosen"] in ("λ=0.25", "λ=0.5")
  assert all(np.isfinite(r["ours %"]) and 0 <= r["ours %"] <= 100 for r in res["table"])
  assert "library-trained CNN teacher" in res["teachers"]["CNN"]
  assert (tmp_path / "fedlpfm_fmnist" / "fedlpfm_fmnist.png").read_bytes()[:4] == b"\x89PNG"


def test_teacher_ablations_tiny(tmp_path):
  for study, variants in (("table11", ["CNN", "Linear Probing"]),
                          ("table12", ["CNN (all clients)", "MLP (all clients)",
                                       "mixed (uniform per client)"])):
    assert main(["run", "fedlpfm_fmnist", "--out", str(tmp_path / study), *TINY,
                 "--set", "splits=dir0.5", "--set", f"study={study}", "--set",
                 "lams=0.5"]) == 0
    res = json.load(open(tmp_path / study / "fedlpfm_fmnist" / "results.json"))
    assert [r["method"] for r in res["table"]] == [f"Fed-LPFM [{v}]" for v in variants]
