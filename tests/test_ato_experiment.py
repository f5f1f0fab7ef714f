"""The ``ato_prune`` experiment (seed 004 Task 2, Table 4) in a tiny configuration: every method
runs through the CLI on Fashion-MNIST-format files (the stand-in fixture; the real files in
``test_real_data``), reaches a finite accuracy, the pruned networks are
smaller than the dense one and compute their masked model's function; the uniform baseline's
bisection matches a FLOPs budget."""
from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest

from fedjaxsparse.pruning import zig as Z
from fedjaxsparse.harness.cli import experiments, main
from fedjaxsparse.models import prunable as P

pytestmark = pytest.mark.integration  # the integration tier (README: the test commands)

def test_ato_prune_tiny_through_the_cli(tmp_path, capsys, quick):
  """The quick setting (an MLP on the labelled Fashion-MNIST stand-in, 4 epochs)."""
  res = quick("ato_prune", "--set", "sweep=gamma=8")   # Figs. 6, 7, 9: a run per γ (here one)
  text = capsys.readouterr().out
  assert "not comparable" in text and "NOT the paper's 5 %" in text
  folder = tmp_path / "ato_prune"
  rows = {(r["method"], r["p"]): r for r in res["table"]}
  assert set(rows) == {("Dense", "-"), ("ATO", "0.5"), ("ATO-HSP", "0.5"), ("Uniform", "0.5"),
                       ("OTO (HSPG)", "-"), ("OTOv2 (DHSPG)", "-"), ("ATO γ=8", "0.5")}
  for g in ("8",):   # the sweep's run: ATO at the first target, its mask and curves kept
    run = res["methods"][f"ATO γ={g} p=0.5"]["seeds"][0]
    assert len(run["history"]) == 4 and len(run["flops_curve"]) == 5
    assert rows[(f"ATO γ={g}", "0.5")]["max |Δlogit|"] < 1e-4
  for r in rows.values():
    assert math.isfinite(r["test top-1 %"]) and math.isfinite(r["val top-1 %"])
    assert 0 <= r["test top-1 %"] <= 100
  assert rows[("Dense", "-")]["pruned FLOPs %"] == 0
  for r in rows.values():   # the fraction kept, printed beside the target p
    assert r["kept FLOPs"] == pytest.approx(1 - r["pruned FLOPs %"] / 100)
  under = [k for k in (("ATO", "0.5"), ("ATO-HSP", "0.5")) if rows[k]["kept FLOPs"] < 0.45]
  assert ("kept FLOPs below the target p" in text) == bool(under)
  assert "one-sided FLOPs penalty" in text
  assert rows[("Dense", "-")]["test top-1 %"] > 60              # it learned something
  for key in (("ATO", "0.5"), ("ATO-HSP", "0.5"), ("Uniform", "0.5"), ("OTO (HSPG)", "-"),
              ("OTOv2 (DHSPG)", "-")):
    assert rows[key]["pruned FLOPs %"] > 0, key                 # smaller than the dense model
  for key in (("ATO", "0.5"), ("ATO-HSP", "0.5"), ("OTO (HSPG)", "-"), ("OTOv2 (DHSPG)", "-")):
    assert rows[key]["max |Δlogit|"] < 1e-4, key                # compressed = masked model
  ato = res["methods"]["ATO p=0.5"]["seeds"][0]
  uni = res["methods"]["Uniform p=0.5"]["seeds"][0]
  assert abs(uni["flops"] - ato["masked_flops"]) <= 0.02 * res["dense_flops"]
  assert len(ato["history"]) == 4 and len(ato["flops_curve"]) == 5
  for png in ("ato_prune.png", "ato_prune_accuracy.png", "ato_prune_flops.png",
              "ato_prune_rflops.png"):
    assert (folder / png).read_bytes()[:4] == b"\x89PNG"
  # A fresh run into the same folder refuses the earlier run's checkpoints.
  assert main(["run", "ato_prune", "--quick", "--out", str(tmp_path), "--no-progress"]) == 1
  assert "--resume" in capsys.readouterr().err


def test_r_flops_is_the_papers_regulariser_and_the_sweep_option_is_checked():
  A = experiments()["ato_prune"]
  assert A.r_flops(0.4, 0.5) == 0.0 and A.r_flops(0.5, 0.5) == 0.0     # one-sided (4-6)
  assert A.r_flops(0.6, 0.5) == pytest.approx(math.log(1.2), rel=1e-6)
  assert A.r_flops(0.25, 0.5, two_sided=True) == pytest.approx(math.log(2), rel=1e-6)
  assert A.parse_sweep("") is None
  assert A.parse_sweep("gamma=1,2.5") == ("gamma", [1.0, 2.5])
  assert A.parse_sweep("t_w=0,0.5") == ("t_w", [0.0, 0.5])
  from fedjaxsparse.errors import ConfigError
  for bad in ("beta=1", "gamma=", "gamma=a", "t_w=2", "lam=-1"):
    with pytest.raises(ConfigError, match="option 'sweep'"):
      A.parse_sweep(bad)


def test_uniform_ratio_matches_a_flops_budget():
  uniform_ratio = Z.uniform_ratio
  module, _ = P.cifar_resnet(20, (28, 28, 1), 10)
  zigs = Z.trace(module, (28, 28, 1))
  total = Z.total_flops(zigs)
  for p in (0.35, 0.5, 0.8):
    r, keep = uniform_ratio(zigs, p * total)
    got = float(Z.flops(zigs, jnp.asarray(keep, jnp.float32)))
    assert abs(got - p * total) < 0.02 * total
    for s in zigs.prunable:                                    # the same fraction everywhere
      assert abs(keep[s.offset:s.offset + s.size].sum() - r * s.size) <= 0.5 + 1e-9
      assert keep[s.offset:s.offset + s.size].sum() >= 1


def test_imagenet_data_and_table5(tmp_path):
  """--dataset imagenet reads the ILSVRC folder layout (classes from train, applied to val),
  normalised with ImageNet's channel statistics, ``per_class`` images per class; Table 5's
  rows beside ours map each ATO target p to its printed row."""
  from PIL import Image
  from fedjaxsparse.experiments import ato_prune as A
  from fedjaxsparse.harness.options import Config
  rng = np.random.default_rng(0)
  for split, n in (("train", 3), ("val", 1)):
    for c in ("n01", "n02"):
      (tmp_path / split / c).mkdir(parents=True)
      for i in range(n):
        Image.fromarray((rng.random((20, 24, 3)) * 255).astype(np.uint8)).save(
            tmp_path / split / c / f"{i}.JPEG")
  opts = {"image_size": 8, "per_class": 2, "val_size": 1}
  d = A._load(Config(dataset="imagenet", data_dir=str(tmp_path)), opts, None, 0)
  assert d["classes"] == 2 and d["shape"] == (8, 8, 3)
  assert len(d["y"]) + len(d["yv"]) == 4 and len(d["yt"]) == 2 and sorted(d["yt"]) == [0, 1]
  assert abs(float(np.mean(d["xt"]))) < 3 and float(np.min(d["xt"])) < 0  # standardised
  for (ds, arch), name in A.PAPER_OF.items():
    pc = A.PAPERS[name]
    assert pc.dataset == ds
    ato = A.ato_rows(pc.paper)
    assert sorted(ato) == sorted(pc.options["targets"]), name   # an ATO row per target run
    for p, row in ato.items():
      note = pc.paper.get("note", {}).get(row, "")
      if "p = " in note:   # the row names its p: the one mapped to it
        assert f"p = {p:g}" in note or f"p = {p:.4f}" in note, (ds, arch, p, note)
  rows = A.table_rows(A.PAPERS["table5_resnet50"].paper)
  assert rows[8][:5] == ("ATO (p = 0.37)", 76.13, 76.59, 0.46, 55.2) and len(rows) == 16
