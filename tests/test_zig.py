"""Zero-invariant groups (fedjaxsparse.pruning.zig, models.prunable; seed 004 Task 2, spec §2.10):
zeroing a group zeroes exactly its channels for any input (conv + BN, dense, residual-coupled
and depthwise sets), physical removal computes the masked model's function with fewer
parameters, the group prox is the prox of t‖·‖₂ (numerical argmin) and leaves t = 0 groups
untouched bit for bit, HSP zeroes exactly the groups failing its test, and the FLOPs counter
matches hand counts of ResNet-56 and MobileNetV2."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjaxsparse as fjs

zig = fjs.pruning.zig
prunable = fjs.models.prunable

ARCHS = {
    "mlp": lambda **kw: prunable.mlp((6, 6, 1), 5, hidden=(12, 8), **kw),
    "cifar_resnet8": lambda **kw: prunable.cifar_resnet(8, (8, 8, 3), 5, **kw),
    "resnet_2stages": lambda **kw: prunable.resnet((2, 1), (8, 8, 3), 5, **kw),
    "mobilenet_v2": lambda **kw: prunable.mobilenet_v2(
        (8, 8, 3), 5, config=((1, 8, 1, 1), (6, 12, 2, 2), (6, 16, 2, 1)), **kw),
    "resnet_bottleneck": lambda widths=None: prunable.resnet(
        (1, 1), (16, 16, 3), 5, bottleneck=True, stem="imagenet",
        widths={"stem": 8, "s1b1a": 4, "s1b1b": 4, "stage1": 16, "s2b1a": 8, "s2b1b": 8,
                "stage2": 32, **(widths or {})}),
}
SHAPES = {"mlp": (6, 6, 1), "cifar_resnet8": (8, 8, 3), "resnet_2stages": (8, 8, 3),
          "mobilenet_v2": (8, 8, 3), "resnet_bottleneck": (16, 16, 3)}


def _outputs(module, params, x):
  """``{path: output}`` of every declared layer (one jitted call)."""
  def run(params, x):
    seen = {}

    def interceptor(next_fun, args, kwargs, context):
      out = next_fun(*args, **kwargs)
      if context.method_name == "__call__" and isinstance(
          context.module, (prunable.PConv, prunable.PDense, prunable.PNorm)):
        seen[tuple(context.module.path)] = out
      return out

    with nn.intercept_methods(interceptor):
      module.apply({"params": params}, x)
    return seen
  return jax.jit(run)(params, x)


def _random_params(model, seed):
  """Initial params with random norm scales/biases (so no identity-like layer hides a bug)."""
  @jax.jit
  def draw(key):
    params = model.init(key)
    leaves, tree = jax.tree_util.tree_flatten(params)
    keys = jax.random.split(jax.random.fold_in(key, 1), len(leaves))
    return jax.tree_util.tree_unflatten(
        tree, [v + 0.3 * jax.random.normal(k, v.shape) for v, k in zip(leaves, keys)])
  return draw(jax.random.key(seed))


@pytest.mark.parametrize("arch", list(ARCHS))
def test_zero_invariance_and_physical_removal(arch):
  """Zeroing random groups (a whole set among them) zeroes exactly their channels at every
  layer writing them, for random inputs; the compressed model has the rebuilt model's shapes,
  fewer parameters, the predicted FLOPs, and the masked model's outputs. In float64: equal to
  1e-12 (in float32, BatchNorm's 1/√(σ² + ε) on near-constant channels of these tiny inputs
  amplifies summation-order rounding to ~1e-3)."""
  with jax.enable_x64(True):
    module, model = ARCHS[arch]()
    zigs = zig.trace(module, SHAPES[arch])
    params = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float64),
                                    _random_params(model, 2))
    rng = np.random.default_rng(3)
    keep = rng.uniform(size=zigs.num_groups) > 0.5
    s0 = zigs.prunable[-1]
    keep[s0.offset:s0.offset + s0.size] = False        # a whole set removed: one zero kept
    w = keep.astype(np.float64)
    masked = jax.jit(lambda p: zig.scale_groups(zigs, p, jnp.asarray(w)))(params)
    x = jax.random.normal(jax.random.key(4), (6,) + SHAPES[arch], jnp.float64) * 2.0
    outs = _outputs(module, masked, x)
    for layer in zigs.layers:
      s = zigs.get(layer.out_set) if layer.out_set else None
      if s is None or s.offset < 0:
        continue
      out = np.asarray(outs[layer.path]).reshape(-1, s.size)
      dead = w[s.offset:s.offset + s.size] == 0
      assert np.all(out[:, dead] == 0), layer.path       # zeroed groups: exactly zero
      if not dead.all():
        assert np.any(np.abs(out[:, ~dead]) > 0), layer.path  # kept ones: alive
    small, widths = zig.compress(zigs, masked, keep)
    assert widths[s0.name] == 1
    module2, model2 = ARCHS[arch](widths=widths)
    shapes = jax.tree_util.tree_map(lambda a: a.shape, jax.eval_shape(
        model2.init, jax.random.key(0)))
    assert shapes == jax.tree_util.tree_map(lambda a: a.shape, small)
    count = lambda p: sum(a.size for a in jax.tree_util.tree_leaves(p))  # noqa: E731
    assert count(small) < count(params)
    np.testing.assert_allclose(np.asarray(jax.jit(model2.apply)(small, x)),
                               np.asarray(jax.jit(model.apply)(masked, x)),
                               atol=1e-12, rtol=1e-12)
    keep[s0.offset] = True                             # the kept zero channel
    p_small = zig.total_flops(zig.trace(module2, SHAPES[arch]))
    assert p_small == pytest.approx(float(zig.flops(zigs, jnp.asarray(keep, jnp.float64))))


def test_residual_streams_are_coupled_sets():
  module, _ = ARCHS["resnet_2stages"]()
  zigs = zig.trace(module, SHAPES["resnet_2stages"])
  writers = [l.path for l in zigs.layers if l.out_set == "stage1"]
  # stem conv + norm and both blocks' second conv + norm write the stage-1 stream
  assert len(writers) == 6 and zigs.get("stage1").offset >= 0
  shortcut = [l for l in zigs.layers if l.path[-1] == "s2b1_shortcut_conv"][0]
  assert (shortcut.in_set, shortcut.out_set) == ("stage1", "stage2")
  module, _ = ARCHS["cifar_resnet8"]()
  zigs = zig.trace(module, SHAPES["cifar_resnet8"])   # option-A streams are fixed
  assert all(s.offset < 0 for s in zigs.sets if s.name.startswith("_stream"))


def test_group_prox_is_the_prox_of_the_group_norm():
  from scipy.optimize import minimize
  module, model = prunable.mlp((2,), 3, hidden=(5,))
  zigs = zig.trace(module, (2,))
  params = _random_params(model, 5)
  t = jnp.asarray([0.0, 0.3, 1.0, 2.5, 10.0])
  out = zig.group_prox(zigs, params, t)
  z = np.concatenate([np.asarray(params["dense1"]["kernel"]),
                      np.asarray(params["dense1"]["bias"])[None]])      # [3, 5] group columns
  got = np.concatenate([np.asarray(out["dense1"]["kernel"]),
                        np.asarray(out["dense1"]["bias"])[None]])
  for g in range(5):
    f = lambda v: 0.5 * np.sum((v - z[:, g]) ** 2) + float(t[g]) * np.linalg.norm(v)  # noqa
    best = minimize(f, z[:, g] * 0.5, method="Powell", options={"xtol": 1e-10,
                                                                 "ftol": 1e-14}).x
    assert f(got[:, g].astype(np.float64)) <= f(best) + 1e-6   # float32 prox vs float64
    np.testing.assert_allclose(got[:, g], best, atol=1e-4)
  np.testing.assert_array_equal(got[:, 0], z[:, 0])                     # t = 0: identity
  np.testing.assert_array_equal(np.asarray(out["head"]["kernel"]),
                                np.asarray(params["head"]["kernel"]))   # consumers untouched


def test_hsp_zeroes_exactly_the_groups_failing_its_test():
  module, model = ARCHS["cifar_resnet8"]()
  zigs = zig.trace(module, SHAPES["cifar_resnet8"])
  m = _random_params(model, 6)
  leaves, tree = jax.tree_util.tree_flatten(m)
  keys = jax.random.split(jax.random.key(99), len(leaves))
  z = jax.tree_util.tree_unflatten(
      tree, [0.3 * a + jax.random.normal(k, a.shape) for a, k in zip(leaves, keys)])
  active = jnp.asarray(np.random.default_rng(8).uniform(size=zigs.num_groups) > 0.3)
  out = jax.jit(lambda z, m: zig.hsp(zigs, z, m, 0.1, active))(z, m)
  # the test by hand over the flattened producer slices of each group
  dot, msq = np.zeros(zigs.num_groups), np.zeros(zigs.num_groups)
  for layer in zigs.layers:
    s = zigs.get(layer.out_set) if layer.out_set else None
    if s is None or s.offset < 0:
      continue
    node_z, node_m = z, m
    for p in layer.path:
      node_z, node_m = node_z[p], node_m[p]
    for leaf in ("kernel", "bias", "scale"):
      if leaf in node_z:
        a, b = (np.asarray(v).reshape(-1, s.size) for v in (node_z[leaf], node_m[leaf]))
        dot[s.offset:s.offset + s.size] += (a * b).sum(0)
        msq[s.offset:s.offset + s.size] += (b * b).sum(0)
  expect_zero = np.asarray(active) & (dot < 0.1 * msq)
  assert 0 < expect_zero.sum() < np.asarray(active).sum()
  norms = jax.jit(lambda p: zig.group_norms(zigs, p))
  nrm = np.asarray(norms(out))
  np.testing.assert_array_equal(nrm == 0, expect_zero)
  np.testing.assert_array_equal(nrm[~expect_zero], np.asarray(norms(z))[~expect_zero])


def test_flops_match_hand_counts():
  # ResNet-56 (CIFAR, option A): 3×3 convolutions, stride-2 at stages 2-3, and the head
  hand = 9 * 3 * 16 * 32 * 32
  for i, (c, hw) in enumerate(((16, 32), (32, 16), (64, 8))):
    c_in = 16 if i == 0 else c // 2
    hand += 9 * c_in * c * hw * hw + 9 * c * c * hw * hw          # the first block
    hand += 8 * 2 * 9 * c * c * hw * hw                             # 8 more blocks
  hand += 64 * 10
  module, _ = prunable.cifar_resnet(56)
  zigs = zig.trace(module, (32, 32, 3))
  assert zig.total_flops(zigs) == hand == 125_485_696   # the literature's 125.49M
  # MobileNetV2 (32×32): stem, inverted residuals, last 1×1, head
  hw, c_in = 32, 32
  hand = 9 * 3 * 32 * hw * hw
  for t, c, n, s in prunable._MBV2:
    for j in range(n):
      hid = t * c_in
      if t != 1:
        hand += c_in * hid * hw * hw
      hw = hw // (s if j == 0 else 1)
      hand += 9 * hid * hw * hw + hid * c * hw * hw
      c_in = c
  hand += 320 * 1280 * hw * hw + 1280 * 10
  module, _ = prunable.mobilenet_v2()
  zigs = zig.trace(module, (32, 32, 3))
  assert zig.total_flops(zigs) == hand
  # under a mask: halving one block's hidden set scales its expand, depthwise and project
  w = np.ones(zigs.num_groups, np.float32)
  s = zigs.get("block2")
  w[s.offset:s.offset + s.size // 2] = 0
  expand = 16 * 96 * 32 * 32
  dw, proj = 9 * 96 * 32 * 32, 96 * 24 * 32 * 32
  assert float(zig.flops(zigs, jnp.asarray(w))) == pytest.approx(hand - (expand + dw + proj) / 2)


def test_flops_regularizer_is_zero_under_budget_and_pushes_w_down():
  module, _ = prunable.mlp((4,), 3, hidden=(8, 8))
  zigs = zig.trace(module, (4,))
  full = zig.total_flops(zigs)
  ones = jnp.ones(zigs.num_groups)
  assert float(zig.flops_regularizer(zig.flops(zigs, ones), 1.0 * full)) == 0.0
  assert float(zig.flops_regularizer(zig.flops(zigs, ones), 2.0 * full)) == 0.0
  r = zig.flops_regularizer(zig.flops(zigs, ones), 0.5 * full)
  assert float(r) == pytest.approx(np.log(2.0))
  g = jax.grad(lambda w: zig.flops_regularizer(zig.flops(zigs, w), 0.5 * full))(ones)
  assert np.all(np.asarray(g) > 0)                                 # descent lowers w


def test_two_sided_flops_regularizer_is_abs_log_ratio():
  """|log(P/B)|: zero only at the budget, equal to (4-6) above it, pushes w up below it."""
  module, _ = prunable.mlp((4,), 3, hidden=(8, 8))
  zigs = zig.trace(module, (4,))
  full = zig.total_flops(zigs)
  ones = jnp.ones(zigs.num_groups)
  for ratio in (0.25, 0.5, 1.0, 2.0, 4.0):
    r = zig.flops_regularizer(zig.flops(zigs, ones), ratio * full, two_sided=True)
    assert float(r) == pytest.approx(abs(np.log(1.0 / ratio)), abs=1e-6)
  one = zig.flops_regularizer(zig.flops(zigs, ones), 0.5 * full)
  assert float(zig.flops_regularizer(zig.flops(zigs, ones), 0.5 * full, True)) == float(one)
  g = jax.grad(lambda w: zig.flops_regularizer(zig.flops(zigs, w), 2.0 * full, True))(ones)
  assert np.all(np.asarray(g) < 0)                                 # under budget: w grows
  zero = zig.flops_regularizer(zig.flops(zigs, 0 * ones), 0.5 * full, True)
  assert np.isfinite(float(zero)) and float(zero) > 0              # no log(0)


def test_resnet50_is_torchvisions():
  """The bottleneck ResNet-50 with the ImageNet stem has torchvision's 25,557,032 parameters
  and its 4.09 GMACs per 224×224 image, and declares a group per prunable channel."""
  module, model = prunable.resnet50()
  shapes = jax.eval_shape(model.init, jax.random.key(0))
  assert sum(int(np.prod(a.shape)) for a in jax.tree.leaves(shapes)) == 25_557_032
  zigs = fjs.pruning.zig.trace(module, (224, 224, 3))
  assert round(fjs.pruning.zig.total_flops(zigs) / 1e9, 2) == 4.09
  assert zigs.get("stage4").size == 2048 and zigs.get("s1b1a").size == 64


def test_mobilenet_v2_imagenet_is_torchvisions():
  """MobileNetV2 with the ImageNet stem (stride 2 in the stem and the second stage) has
  torchvision's 3,504,872 parameters at 1000 classes and its 0.30 GMACs per 224×224 image
  (torchvision lists 0.30), and keeps the last stage's 7×7 map."""
  module, model = prunable.mobilenet_v2((224, 224, 3), 1000, stem="imagenet")
  shapes = jax.eval_shape(model.init, jax.random.key(0))
  assert sum(int(np.prod(a.shape)) for a in jax.tree.leaves(shapes)) == 3_504_872
  zigs = fjs.pruning.zig.trace(module, (224, 224, 3))
  assert round(fjs.pruning.zig.total_flops(zigs) / 1e9, 2) == 0.30
  with pytest.raises(ValueError, match="stem"):
    prunable.mobilenet_v2(stem="tiny")


def test_batch_norm_running_statistics_for_evaluation():
  """BatchNorm's evaluation mode: the statistics averaged over training batches, then every
  example normalised by them — on the batch the statistics came from it equals training-mode
  BatchNorm (one batch: its own statistics), and an example's output no longer depends on its
  batch (a single example equals its row of a batch evaluation)."""
  module, model = prunable.resnet((1,), (8, 8, 3), 5)
  params = model.init(jax.random.key(0))
  x = jax.random.normal(jax.random.key(1), (16, 8, 8, 3))
  stats = prunable.batch_norm_stats(module, params, x, batch_size=16)
  assert len(stats) == 3 and all(m.shape == v.shape and (v >= 0).all() for m, v in
                                 stats.values())
  np.testing.assert_allclose(prunable.apply_with_stats(module, params, stats, x),
                             model.apply(params, x), rtol=1e-4, atol=1e-5)
  batch = prunable.apply_with_stats(module, params, stats, x[:4])
  one = prunable.apply_with_stats(module, params, stats, x[:1])
  np.testing.assert_allclose(one[0], batch[0], rtol=1e-5, atol=1e-6)
  assert not np.allclose(model.apply(params, x[:1])[0], model.apply(params, x[:4])[0])
  two = prunable.batch_norm_stats(module, params, x, batch_size=8)   # two batches, averaged
  halves = [prunable.batch_norm_stats(module, params, x[i:i + 8], batch_size=8)
            for i in (0, 8)]
  for k, (m, v) in two.items():
    np.testing.assert_allclose(m, (halves[0][k][0] + halves[1][k][0]) / 2, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(v, (halves[0][k][1] + halves[1][k][1]) / 2, rtol=1e-5, atol=1e-6)


def test_running_statistics_keep_physical_removal_exact():
  """With BatchNorm in evaluation mode (running statistics over training images), the network
  with zeroed groups and the physically smaller one compute the same function, each with its
  own statistics: a zeroed channel's statistics are zero and its norm outputs zero."""
  module, model = prunable.resnet((1, 1), (8, 8, 3), 5)
  params = model.init(jax.random.key(0))
  zigs = fjs.pruning.zig.trace(module, (8, 8, 3))
  keep = np.asarray(jax.random.uniform(jax.random.key(2), (zigs.num_groups,)) > 0.4)
  masked = fjs.pruning.zig.scale_groups(zigs, params, jnp.asarray(keep, jnp.float32))
  small, widths = fjs.pruning.zig.compress(zigs, masked, keep)
  small_module, _ = prunable.resnet((1, 1), (8, 8, 3), 5, widths=widths)
  x = jax.random.normal(jax.random.key(3), (32, 8, 8, 3))
  xe = jax.random.normal(jax.random.key(4), (5, 8, 8, 3))
  out = [prunable.apply_with_stats(m, p, prunable.batch_norm_stats(m, p, x, 16), xe)
         for m, p in ((module, masked), (small_module, small))]
  np.testing.assert_allclose(out[0], out[1], rtol=1e-4, atol=1e-5)
