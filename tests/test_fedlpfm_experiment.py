"""The Fed-LPFM experiment (seed 004 Table 8 end to end through the CLI in a tiny configuration
on Fashion-MNIST-format files, the stand-in fixture; Table 11's linear probe as a unit): every method runs and the
results carry the paper's numbers and the teacher's label. One-value grids keep it short
(tuning is the shared code every experiment uses). Table 12's mixed teachers reduce to
per-client teacher masks, tested in test_fedlpfm."""

import json

import numpy as np
import pytest

pytestmark = pytest.mark.integration  # the integration tier (README: the test commands)


def test_table8_tiny(tmp_path, quick):
  """The quick setting: the labelled Fashion-MNIST stand-in, 4 clients, Class Split."""
  res = quick("fedlpfm_fmnist")
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


def test_linear_probes_of_all_clients_at_once_equal_each_clients_own():
  """Table 11's heads for every client in one vmapped program (clients padded to one length,
  the padding rows masked out) equal each client's head fitted alone on its real rows, and
  what the padding holds changes nothing."""
  from fedjaxsparse.experiments.fedlpfm_fmnist import _linear_probe, _probe_fits
  rng = np.random.default_rng(1)
  sizes = [12, 7, 3]
  phi = rng.standard_normal((3, 12, 5)).astype(np.float32)
  y = rng.integers(0, 4, (3, 12))
  mask = (np.arange(12)[None] < np.asarray(sizes)[:, None]).astype(np.float32)
  w, b = _probe_fits(phi, y, mask, 4, 40, 1e-3)
  junk = np.where(mask[..., None] > 0, phi, 1e3).astype(np.float32)
  w2, b2 = _probe_fits(junk, np.where(mask > 0, y, 3), mask, 4, 40, 1e-3)
  np.testing.assert_array_equal(w, w2)
  np.testing.assert_array_equal(b, b2)
  for i, k in enumerate(sizes):
    wi, bi = _linear_probe(phi[i, :k], y[i, :k], 4, steps=40)
    np.testing.assert_allclose(w[i], wi, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(b[i], bi, rtol=1e-4, atol=1e-6)


def test_table12_claim_states_the_papers_numbers():
  """Seed 004 Table 12 (l. 1630-1639) beside the table12 study's teachers, and the printed
  claim's numbers recomputed from the table: the two CLIP teachers within 0.5 points from
  Dir(0.05) to IID, ViT-B/32 ahead by 1.8 (Class Split) and 6.7 (Dir(0.01)), random selection
  7-20 points below the better teacher."""
  from fedjaxsparse.experiments import fedlpfm_fmnist as F
  table = F.PAPERS["table12_cifar10"].paper
  rn, vit, rand = (np.array([table[s][c] for s in table]) for c in F.TEACHER_COLUMNS["table12"])
  mild = [list(table).index(s) for s in ("Dir(0.05)", "Dir(0.1)", "Dir(0.5)", "Dir(1.0)", "IID")]
  assert np.abs(rn - vit)[mild].max() <= 0.5
  assert round(table["Class Split"]["CLIP ViT-B/32"] - table["Class Split"]["CLIP RN50"], 1) == 1.8
  assert round(table["Dir(0.01)"]["CLIP ViT-B/32"] - table["Dir(0.01)"]["CLIP RN50"], 1) == 6.7
  gap = np.maximum(rn, vit) - rand
  assert 7 <= gap.min() and gap.max() <= 20
  claim = F.CLAIMS["table12"]
  assert "+1.8" in claim and "+6.7" in claim and "7-20" in claim and "0.5" in claim


def test_preliminary_experiment_fine_tunes_the_teacher_beside_fedavg(tmp_path, capsys):
  """The preliminary experiment (--set study=prelim): per split, FedAvg on the student and the
  pre-trained teacher itself fine-tuned with FedAvg (the labelled stand-in for CLIP offline),
  the text's numbers beside them from the prelim_cifar10 configuration, its claim stated with
  them."""
  from fedjaxsparse.experiments import fedlpfm_fmnist as F
  from fedjaxsparse.harness.cli import main
  assert main(["run", "fedlpfm_fmnist", "--quick", "--out", str(tmp_path), "--no-progress",
               "--set", "study=prelim", "--set", "splits=dir0.01", "--rounds", "1",
               "--set", "teacher_channels=4,8"]) == 0
  text = capsys.readouterr().out
  res = json.load(open(tmp_path / "fedlpfm_fmnist" / "results.json"))
  paper = F.PAPERS["prelim_cifar10"].paper
  rows = {(r["split"], r["method"]): r for r in res["table"]}
  teacher = "pre-trained CNN + FedAvg (stand-in for CLIP)"
  assert set(rows) == {(s, m) for s in ("Dir(0.01)",) for m in ("FedAvg", teacher)}
  for s in ("Dir(0.01)",):
    assert rows[(s, "FedAvg")]["paper % (CIFAR-10)"] == paper[s]["FedAvg"]
    assert rows[(s, teacher)]["paper % (CIFAR-10)"] == paper[s]["CLIP + FedAvg"] == "> 90"
    assert 0 <= rows[(s, teacher)]["ours %"] <= 100
  assert f"from {paper['IID']['FedAvg']} % (IID) to {paper['Dir(0.01)']['FedAvg']} %" in text
  assert res["claim"] == F.claim({"study": "prelim"})
