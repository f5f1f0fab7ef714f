"""EfficientNet-B0 (:mod:`fedjaxsparse.models.efficientnet`): torchvision's parameter count, the
block structure, per-example GroupNorm, the residual connections and stochastic depth.

Parameters are drawn with numpy on the ``jax.eval_shape`` structure: ``Model.init`` under
``jax.jit`` costs ~30 s on 2 CPU cores (flax derives every parameter's key by ``fold_in``, and
XLA compiles each threefry slowly), which is flax's cost, not the network's.
"""
from __future__ import annotations

import functools

import flax.linen as nn
import jax
import numpy as np
import pytest

import fedjaxsparse as fjs

efficientnet = fjs.models.efficientnet

TORCHVISION_B0_PARAMS = 5_288_548   # torchvision EfficientNet_B0_Weights meta["num_params"]
RESIDUAL = ("block3", "block5", "block7", "block8", "block10", "block11", "block13", "block14",
            "block15")   # stride 1 and C_in == C_out: 9 of the 16 blocks
KEY = jax.random.PRNGKey(0)


@functools.cache
def _init_shapes(*args, **kwargs):
  """The parameter structure of ``efficientnet_b0(*args, **kwargs)`` (traced once a module)."""
  return jax.eval_shape(efficientnet.efficientnet_b0(*args, **kwargs)[1].init, KEY)


def _count(shapes) -> int:
  return sum(int(np.prod(leaf.shape)) for leaf in jax.tree_util.tree_leaves(shapes))


def _draw(shapes, seed: int = 0):
  """torchvision-like values for a tree of ``ShapeDtypeStruct`` (He-normal fan-out kernels,
  unit scales, zero biases)."""
  rng = np.random.default_rng(seed)

  def draw(path, leaf):
    if path[-1].key != "kernel":
      return np.full(leaf.shape, 1.0 if path[-1].key == "scale" else 0.0, leaf.dtype)
    fan_out = int(np.prod(leaf.shape)) // leaf.shape[-2]
    return rng.normal(0.0, np.sqrt(2.0 / fan_out), leaf.shape).astype(leaf.dtype)

  return jax.tree_util.tree_map_with_path(draw, shapes)


def _forward_io(model, params, x):
  """``Model.apply`` logits ``[B, C]`` and ``{block name: (input, output)}`` of every MBConv."""
  io = {}

  def record(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    if isinstance(context.module, efficientnet.MBConv) and context.method_name == "__call__":
      io[context.module.name] = (args[0], out)
    return out

  with nn.intercept_methods(record):
    logits = model.apply(params, x)
  return logits, io


@pytest.fixture(scope="module")
def net():
  """``(model, params, jitted _forward_io)`` of the default GroupNorm B0 for 32×32×3."""
  _, model = efficientnet.efficientnet_b0()
  return model, _draw(_init_shapes()), jax.jit(functools.partial(_forward_io, model))


def _x(b: int, seed: int = 1, shape=(32, 32, 3)):
  return np.random.default_rng(seed).normal(size=(b,) + shape).astype(np.float32)


def test_parameter_count_matches_torchvision():
  ten = TORCHVISION_B0_PARAMS - (1280 * 1000 + 1000) + (1280 * 10 + 10)
  assert ten == 4_020_358
  assert _count(_init_shapes()) == ten
  # same scale/bias per channel
  assert _count(_init_shapes(norm="batch")) == ten
  assert _count(_init_shapes(cifar_stem=True, num_groups=4)) == ten
  assert _count(_init_shapes((224, 224, 3), num_classes=1000)) == TORCHVISION_B0_PARAMS


def test_block_structure():
  p = _init_shapes()
  assert p["stem_conv"]["kernel"].shape == (3, 3, 3, 32)
  assert sorted(k for k in p if k.startswith("block")) == sorted(f"block{i}" for i in range(1, 17))
  assert "expand_conv" not in p["block1"]                     # expand ratio 1
  assert p["block1"]["dw_conv"]["kernel"].shape == (3, 3, 1, 32)
  assert p["block1"]["se_reduce"]["kernel"].shape == (1, 1, 32, 8)     # max(1, C_in // 4)
  assert p["block2"]["se_reduce"]["kernel"].shape == (1, 1, 96, 4)     # C_in = 16, not 96
  assert p["block3"]["se_reduce"]["kernel"].shape == (1, 1, 144, 6)
  assert p["block4"]["dw_conv"]["kernel"].shape == (5, 5, 1, 144)
  assert p["block16"]["project_conv"]["kernel"].shape == (1, 1, 1152, 320)
  assert p["head_conv"]["kernel"].shape == (1, 1, 320, 1280)
  assert p["classifier"]["kernel"].shape == (1280, 10)
  for name, _ in jax.tree_util.tree_flatten_with_path(p)[0]:
    keys = [k.key for k in name]
    if keys[-1] == "bias" and not keys[-2].endswith("_norm"):
      assert keys[-2] in ("se_reduce", "se_expand", "classifier"), keys   # no other conv bias


def test_forward_shape_finite_and_per_example(net):
  _, params, fwd = net
  x = _x(4)
  logits, io = fwd(params, x)
  logits = np.asarray(logits)
  assert logits.shape == (4, 10) and np.all(np.isfinite(logits))
  assert sorted(io) == sorted(f"block{i}" for i in range(1, 17))
  assert io["block1"][0].shape == (4, 16, 16, 32)     # stride-2 stem
  assert io["block16"][1].shape == (4, 1, 1, 320)
  perm = np.array([2, 0, 3, 1])                       # GroupNorm: no coupling across the batch
  np.testing.assert_allclose(fwd(params, x[perm])[0], logits[perm], rtol=1e-5, atol=1e-5)


def test_residual_blocks_become_identity(net):
  """Zeroing the project norm zeroes a block's branch: a residual block then returns its input
  (it would return 0 without the addition); a non-residual block returns 0."""
  _, params, fwd = net
  zeroed = dict(params)
  for name in RESIDUAL + ("block16",):
    block = dict(params[name])
    block["project_norm"] = jax.tree_util.tree_map(np.zeros_like, block["project_norm"])
    zeroed[name] = block
  logits, io = jax.tree_util.tree_map(np.asarray, fwd(zeroed, _x(4)))
  assert np.all(np.isfinite(logits))
  for name in RESIDUAL:
    inp, out = io[name]
    assert float(np.max(np.abs(inp))) > 0.1, name
    np.testing.assert_allclose(out, inp, rtol=0, atol=1e-5, err_msg=name)   # XLA rounding
  assert float(np.max(np.abs(io["block16"][0]))) > 0.1
  np.testing.assert_array_equal(io["block16"][1], 0.0)
  _, io = jax.tree_util.tree_map(np.asarray, fwd(params, _x(4)))   # intact branches do change
  for name in RESIDUAL:                                              # the stream
    assert float(np.max(np.abs(io[name][1] - io[name][0]))) > 1e-3, name


def test_cifar_stem_keeps_resolution():
  # (4 groups: the parameter count test's network, whose structure is traced once a module)
  _, model = efficientnet.efficientnet_b0(cifar_stem=True, num_groups=4)
  logits, io = jax.eval_shape(functools.partial(_forward_io, model),
                              _init_shapes(cifar_stem=True, num_groups=4), _x(2))
  assert logits.shape == (2, 10)
  assert io["block1"][0].shape == (2, 32, 32, 32)
  assert io["block16"][1].shape == (2, 2, 2, 320)


@pytest.mark.parametrize("norm", ["group", "batch"])
def test_block_batch_coupling(norm):
  """One residual block: GroupNorm keeps examples apart, current-batch BatchNorm does not
  (the first two examples' outputs, with the other six examples replaced)."""
  block = efficientnet.MBConv(6, 3, 1, 16, 16, norm, 8)
  x = _x(8, shape=(4, 4, 16))
  other = np.concatenate([x[:2], _x(6, seed=2, shape=(4, 4, 16))])
  variables = _draw(jax.eval_shape(block.init, KEY, x))
  apply = jax.jit(block.apply)
  full, first = np.asarray(apply(variables, x)), np.asarray(apply(variables, other))
  same = np.allclose(full[:2], first[:2], rtol=1e-5, atol=1e-5)
  assert same == (norm == "group")


def test_stochastic_depth():
  block = efficientnet.MBConv(6, 3, 1, 16, 16, "group", 8, drop_prob=0.5)
  x = _x(64, shape=(4, 4, 16))
  variables = _draw(jax.eval_shape(block.init, KEY, x))
  ev, out = (np.asarray(a) for a in jax.jit(lambda v, x: (   # eval (no drop), then train
      block.apply(v, x), block.apply(v, x, train=True, rngs={"dropout": jax.random.PRNGKey(3)})))(
          variables, x))
  branch = ev - x
  dropped = np.all(np.isclose(out, x, atol=1e-6), axis=(1, 2, 3))
  assert 10 <= dropped.sum() <= 54
  np.testing.assert_allclose(out[~dropped], (x + 2.0 * branch)[~dropped], rtol=1e-5, atol=1e-5)
  # the per-block rate grows linearly: drop_rate * k / 16 for block k + 1, and every block is
  # called in training mode (read off each block as the network builds it; the blocks' own
  # computation, tested above, is skipped: a block returns zeros of its output shape)
  module, _ = efficientnet.efficientnet_b0(drop_rate=0.2, dropout_rate=0.2)
  probs = {}

  def record(next_fun, args, kwargs, context):
    m = context.module
    if isinstance(m, efficientnet.MBConv) and context.method_name == "__call__":
      probs[m.name] = m.drop_prob
      assert (args[1] if len(args) > 1 else kwargs["train"]) is True, m.name
      b, h, w, _ = args[0].shape
      return jax.numpy.zeros((b, (h - 1) // m.strides + 1, (w - 1) // m.strides + 1,
                              m.out_channels), args[0].dtype)
    return next_fun(*args, **kwargs)

  shapes = _init_shapes()   # (dropout adds no parameter)
  with nn.intercept_methods(record):
    jax.eval_shape(lambda p, v: module.apply({"params": p}, v, train=True,
                                             rngs={"dropout": KEY}), shapes, _x(2))
  assert [probs[f"block{k + 1}"] for k in range(16)] == pytest.approx(
      [0.2 * k / 16 for k in range(16)])


@pytest.mark.parametrize("kwargs, match", [
    ({"norm": "layer"}, "norm"), ({"num_groups": 0}, "num_groups"),
    ({"num_groups": 16}, "num_groups"), ({"num_groups": 3}, "num_groups"),
    ({"drop_rate": 1.0}, "drop_rate"), ({"dropout_rate": -0.1}, "dropout_rate"),
    ({"num_classes": 0}, "num_classes"), ({"input_shape": (32, 32)}, "input_shape")])
def test_errors(kwargs, match):
  with pytest.raises(ValueError, match=match):
    efficientnet.efficientnet_b0(**kwargs)
  efficientnet.efficientnet_b0(norm="batch", num_groups=16)   # num_groups is GroupNorm's only
