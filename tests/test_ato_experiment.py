"""The ``ato_prune`` experiment (seed 004 Task 2, Table 4) in a tiny configuration: every method
runs through the CLI on real Fashion-MNIST, reaches a finite accuracy, the pruned networks are
smaller than the dense one and compute their masked model's function; the host-driven training
loop (fast on XLA:CPU) reproduces :func:`fedjaxsparse.algorithms.ato.train`; the uniform
baseline's bisection matches a FLOPs budget."""
from __future__ import annotations

import json
import math
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjaxsparse import zig as Z
from fedjaxsparse.algorithms import ato as A
from fedjaxsparse.cli import experiments, main
from fedjaxsparse.models import prunable as P

TINY = ["--no-progress", "--rounds", "4", "--set", "arch=mlp", "--set", "train_size=512",
        "--set", "val_size=500", "--set", "targets=0.5", "--set", "batch=64", "--set",
        "curve_size=200", "--set", "check_size=500", "--set", "ctrl_lr=1e-2"]


def test_ato_prune_tiny_through_the_cli(tmp_path, capsys):
  out = ["--out", str(tmp_path)]
  assert main(["run", "ato_prune"] + out + TINY) == 0
  text = capsys.readouterr().out
  assert "not comparable" in text and "NOT the paper's 5 %" in text
  folder = tmp_path / "ato_prune"
  res = json.load(open(folder / "results.json"))
  rows = {(r["method"], r["p"]): r for r in res["table"]}
  assert set(rows) == {("Dense", "-"), ("ATO", "0.5"), ("ATO-HSP", "0.5"), ("Uniform", "0.5"),
                       ("OTO (HSPG)", "-")}
  for r in rows.values():
    assert math.isfinite(r["test top-1 %"]) and math.isfinite(r["val top-1 %"])
    assert 0 <= r["test top-1 %"] <= 100
  assert rows[("Dense", "-")]["pruned FLOPs %"] == 0
  assert rows[("Dense", "-")]["test top-1 %"] > 60              # it learned something
  for key in (("ATO", "0.5"), ("ATO-HSP", "0.5"), ("Uniform", "0.5"), ("OTO (HSPG)", "-")):
    assert rows[key]["pruned FLOPs %"] > 0, key                 # smaller than the dense model
  for key in (("ATO", "0.5"), ("ATO-HSP", "0.5"), ("OTO (HSPG)", "-")):
    assert rows[key]["max |Δlogit|"] < 1e-4, key                # compressed = masked model
  ato = res["runs"]["ATO p=0.5"][0]
  uni = res["runs"]["Uniform p=0.5"][0]
  assert abs(uni["flops"] - ato["masked_flops"]) <= 0.02 * res["dense_flops"]
  assert len(ato["history"]) == 4 and len(ato["flops_curve"]) == 5
  for png in ("ato_prune.png", "ato_prune_accuracy.png", "ato_prune_flops.png"):
    assert (folder / png).read_bytes()[:4] == b"\x89PNG"
  # A fresh run into the same folder refuses the earlier run's checkpoints.
  assert main(["run", "ato_prune"] + out + TINY) == 1
  assert "--resume" in capsys.readouterr().err


def test_host_loop_resumes_and_reproduces_ato_train(tmp_path):
  """ato.train writes checkpoints after epochs 2 and 3; the host loop resumes from epoch 2 and
  runs epoch 3 (target steps with augmentation, the controller pass, the mask update) to the
  state ato.train reached."""
  from fedjaxsparse.data.fashion_mnist import load_arrays
  x, y = load_arrays(split="test")
  x, y = x[:384], y[:384]
  module, model = P.mlp((28, 28, 1), 10, hidden=(300, 100))   # the CLI test's network
  zigs = Z.trace(module, (28, 28, 1))
  cfg = A.ATOConfig(target=0.5, T_w=1, T_start=0, T_end=2, ctrl_lr=1e-2)
  algo = A.ato(model, zigs, optax.sgd(0.05, momentum=0.9), lambda t: 0.05, cfg)
  kw = dict(epochs=3, batch_size=64, ctrl_index=A.controller_subset(len(x), 0.25),
            ctrl_batch=16, progress=False, checkpoint_dir=str(tmp_path),
            augment=lambda k, xb: xb + 0.01 * jax.random.normal(k, xb.shape),
            evaluate=lambda p, w: float(jnp.sum(w)))
  params = model.init(jax.random.key(0))
  want, hist = A.train(algo, cfg, jax.random.key(3), params, x, y, **kw)
  shutil.rmtree(tmp_path / "3")                                # as if stopped after epoch 2
  got, hist2 = experiments()["ato_prune"]._fit(algo, cfg, jax.random.key(3), params, x, y,
                                               checkpoint_every=0, **kw)
  assert 0 < float(jnp.mean(got.w)) < 1                         # the controller pruned
  np.testing.assert_array_equal(np.asarray(got.w), np.asarray(want.w))
  for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
    np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64),
                               rtol=1e-4, atol=1e-5)
  assert [h["epoch"] for h in hist2] == [1, 2, 3] and hist2[:2] == hist[:2]
  assert hist2[2]["kept"] == hist[2]["kept"] and hist2[2]["metric"] == hist[2]["metric"]
  assert hist2[2]["loss"] == pytest.approx(hist[2]["loss"], rel=1e-4)


def test_uniform_ratio_matches_a_flops_budget():
  uniform_ratio = experiments()["ato_prune"].uniform_ratio
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
