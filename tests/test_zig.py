"""Zero-invariant groups (fedjaxsparse.pruning.zig, models.prunable; seed 004 Task 2, spec §2.10):
zeroing a group zeroes exactly its channels for any input (conv + BN, dense, residual-coupled
and depthwise sets), physical removal computes the masked model's function with fewer
parameters, the group prox is the prox of t‖·‖₂ (numerical argmin) and leaves t = 0 groups
untouched bit for bit, HSP zeroes exactly the groups failing its test, and the FLOPs counter
matches hand counts of ResNet-56 and MobileNetV2."""
import functools

import flax.linen as nn
import jax
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


@functools.lru_cache(maxsize=None)
def _net(arch):
  """``(module, model, zigs)`` of ``ARCHS[arch]`` at full width, traced once per process (the
  ZIGs hold only names, shapes and MAC counts: the same under ``jax.enable_x64``)."""
  module, model = ARCHS[arch]()
  return module, model, zig.trace(module, SHAPES[arch])


@functools.lru_cache(maxsize=None)
def _small_mlp():
  """``(module, zigs)`` of the regulariser tests' MLP, traced once per process."""
  module, _ = prunable.mlp((4,), 3, hidden=(8, 8))
  return module, zig.trace(module, (4,))


def _outputs(module, params, x):
  """``({path: output} of every declared layer, the model's output)`` (traceable: jit the
  caller)."""
  seen = {}

  def interceptor(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    if context.method_name == "__call__" and isinstance(
        context.module, (prunable.PConv, prunable.PDense, prunable.PNorm)):
      seen[tuple(context.module.path)] = out
    return out

  with nn.intercept_methods(interceptor):
    y = module.apply({"params": params}, x)
  return seen, y


def _random_params(model, seed):
  """Random float32 params of the model's structure, drawn in NumPy: the initial distributions
  (LeCun-normal kernels, unit norm scales, zero biases) plus 0.3·N(0, 1) on every entry (so no
  identity-like layer hides a bug)."""
  rng = np.random.default_rng(seed)

  def draw(path, v):
    leaf = path[-1].key
    mean = (rng.normal(size=v.shape) / np.sqrt(np.prod(v.shape[:-1])) if leaf == "kernel"
            else np.full(v.shape, 1.0 if leaf == "scale" else 0.0))
    return (mean + 0.3 * rng.normal(size=v.shape)).astype(np.float32)
  return jax.tree_util.tree_map_with_path(draw, jax.eval_shape(model.init, jax.random.key(0)))


def _flops(zigs, w):
  """``zig.flops`` as one compiled program."""
  return float(jax.jit(lambda w: zig.flops(zigs, w))(w))


@pytest.mark.parametrize("arch", list(ARCHS))
def test_zero_invariance_and_physical_removal(arch):
  """Zeroing random groups (a whole set among them) zeroes exactly their channels at every
  layer writing them, for random inputs; the compressed model has the rebuilt model's shapes,
  fewer parameters, the predicted FLOPs, and the masked model's outputs. In float64: equal to
  1e-12 (in float32, BatchNorm's 1/√(σ² + ε) on near-constant channels of these tiny inputs
  amplifies summation-order rounding to ~1e-3). Only the programs run in float64: the ZIGs,
  the parameter shapes and the rebuilt model's ZIGs (names, shapes, MAC counts) are traced
  once, in float32, like every other test's."""
  module, model, zigs = _net(arch)
  params = _random_params(model, 2)
  rng = np.random.default_rng(3)
  keep = rng.uniform(size=zigs.num_groups) > 0.5
  s0 = zigs.prunable[-1]
  keep[s0.offset:s0.offset + s0.size] = False        # a whole set removed: one zero kept
  w = keep.astype(np.float64)
  x = rng.normal(size=(6,) + SHAPES[arch]) * 2.0
  kept = w.copy()
  kept[s0.offset] = 1.0                              # the compressed model's kept zero channel

  with jax.enable_x64(True):
    params = jax.tree_util.tree_map(lambda a: a.astype(np.float64), params)

    @jax.jit
    def masked_outputs(params, w, x, kept):   # the masked params, every layer's output, the
      masked = zig.scale_groups(zigs, params, w)   # model's, and the FLOPs predicted for `kept`
      return (masked,) + _outputs(module, masked, x) + (zig.flops(zigs, kept),)

    masked, outs, y, predicted = masked_outputs(params, w, x, kept)
    assert np.asarray(y).dtype == np.float64
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
  with jax.enable_x64(True):
    y_small = np.asarray(jax.jit(model2.apply)(small, x))
  assert y_small.dtype == np.float64
  np.testing.assert_allclose(y_small, np.asarray(y), atol=1e-12, rtol=1e-12)
  p_small = zig.total_flops(zig.trace(module2, SHAPES[arch]))
  assert p_small == pytest.approx(float(predicted))


def test_residual_streams_are_coupled_sets():
  zigs = _net("resnet_2stages")[2]
  writers = [l.path for l in zigs.layers if l.out_set == "stage1"]
  # stem conv + norm and both blocks' second conv + norm write the stage-1 stream
  assert len(writers) == 6 and zigs.get("stage1").offset >= 0
  shortcut = [l for l in zigs.layers if l.path[-1] == "s2b1_shortcut_conv"][0]
  assert (shortcut.in_set, shortcut.out_set) == ("stage1", "stage2")
  zigs = _net("cifar_resnet8")[2]                     # option-A streams are fixed
  assert all(s.offset < 0 for s in zigs.sets if s.name.startswith("_stream"))


def test_group_prox_is_the_prox_of_the_group_norm():
  from scipy.optimize import minimize
  module, model = prunable.mlp((2,), 3, hidden=(5,))
  zigs = zig.trace(module, (2,))
  params = _random_params(model, 5)
  t = np.asarray([0.0, 0.3, 1.0, 2.5, 10.0], np.float32)
  out = jax.jit(lambda p, t: zig.group_prox(zigs, p, t))(params, t)
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
  module, model, zigs = _net("cifar_resnet8")
  m = _random_params(model, 6)
  rng = np.random.default_rng(99)
  z = jax.tree_util.tree_map(
      lambda a: (0.3 * a + rng.normal(size=a.shape)).astype(np.float32), m)
  active = np.random.default_rng(8).uniform(size=zigs.num_groups) > 0.3

  @jax.jit
  def norms(z, m, active):   # the group norms of HSP's output and of z
    return zig.group_norms(zigs, zig.hsp(zigs, z, m, 0.1, active)), zig.group_norms(zigs, z)

  nrm, nrm_z = (np.asarray(v) for v in norms(z, m, active))
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
  expect_zero = active & (dot < 0.1 * msq)
  assert 0 < expect_zero.sum() < active.sum()
  np.testing.assert_array_equal(nrm == 0, expect_zero)
  np.testing.assert_array_equal(nrm[~expect_zero], nrm_z[~expect_zero])


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
  assert _flops(zigs, w) == pytest.approx(hand - (expand + dw + proj) / 2)


def test_flops_regularizer_is_zero_under_budget_and_pushes_w_down():
  module, zigs = _small_mlp()
  full = zig.total_flops(zigs)
  ones = np.ones(zigs.num_groups, np.float32)

  @jax.jit
  def run(w):   # R at budgets 1, 2 and 0.5 × P_total, and the gradient at 0.5
    reg = lambda w, ratio: zig.flops_regularizer(zig.flops(zigs, w), ratio * full)  # noqa
    return [reg(w, r) for r in (1.0, 2.0, 0.5)], jax.grad(reg)(w, 0.5)

  (r1, r2, r), g = run(ones)
  assert float(r1) == 0.0
  assert float(r2) == 0.0
  assert float(r) == pytest.approx(np.log(2.0))
  assert np.all(np.asarray(g) > 0)                                 # descent lowers w


def test_two_sided_flops_regularizer_is_abs_log_ratio():
  """|log(P/B)|: zero only at the budget, equal to (4-6) above it, pushes w up below it."""
  module, zigs = _small_mlp()
  full = zig.total_flops(zigs)
  ones = np.ones(zigs.num_groups, np.float32)
  ratios = (0.25, 0.5, 1.0, 2.0, 4.0)

  @jax.jit
  def run(w):
    reg = lambda w, ratio, two: zig.flops_regularizer(zig.flops(zigs, w), ratio * full,  # noqa
                                                      two)
    return ([reg(w, r, True) for r in ratios], reg(w, 0.5, False), reg(w, 0.5, True),
            jax.grad(reg)(w, 2.0, True), reg(0 * w, 0.5, True))

  two_sided, one, same, g, zero = run(ones)
  for ratio, r in zip(ratios, two_sided):
    assert float(r) == pytest.approx(abs(np.log(1.0 / ratio)), abs=1e-6)
  assert float(same) == float(one)
  assert np.all(np.asarray(g) < 0)                                 # under budget: w grows
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
  params = _random_params(model, 0)   # NumPy: jax's initialisers compile a threefry per leaf
  x = np.random.default_rng(1).normal(size=(16, 8, 8, 3)).astype(np.float32)

  @jax.jit   # one program
  def run(params, x):
    stats = prunable.batch_norm_stats(module, params, x, batch_size=16)
    with_stats = lambda x: prunable.apply_with_stats(module, params, stats, x)  # noqa: E731
    halves = [prunable.batch_norm_stats(module, params, x[i:i + 8], batch_size=8)
              for i in (0, 8)]
    return dict(stats=stats, eval=with_stats(x), train=model.apply(params, x),
                batch=with_stats(x[:4]), one=with_stats(x[:1]),
                train_one=model.apply(params, x[:1]), train_batch=model.apply(params, x[:4]),
                two=prunable.batch_norm_stats(module, params, x, batch_size=8), halves=halves)

  r = jax.tree_util.tree_map(np.asarray, run(params, x))
  stats = r["stats"]
  assert len(stats) == 3 and all(m.shape == v.shape and (v >= 0).all() for m, v in
                                 stats.values())
  np.testing.assert_allclose(r["eval"], r["train"], rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(r["one"][0], r["batch"][0], rtol=1e-5, atol=1e-6)
  assert not np.allclose(r["train_one"][0], r["train_batch"][0])
  halves = r["halves"]                                               # two batches, averaged
  for k, (m, v) in r["two"].items():
    np.testing.assert_allclose(m, (halves[0][k][0] + halves[1][k][0]) / 2, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(v, (halves[0][k][1] + halves[1][k][1]) / 2, rtol=1e-5, atol=1e-6)


def test_running_statistics_keep_physical_removal_exact():
  """With BatchNorm in evaluation mode (running statistics over training images), the network
  with zeroed groups and the physically smaller one compute the same function, each with its
  own statistics: a zeroed channel's statistics are zero and its norm outputs zero."""
  module, model = prunable.resnet((1, 1), (8, 8, 3), 5)
  params = _random_params(model, 0)   # NumPy: jax's initialisers compile a threefry per leaf
  zigs = fjs.pruning.zig.trace(module, (8, 8, 3))
  rng = np.random.default_rng(2)
  keep = rng.uniform(size=zigs.num_groups) > 0.4
  x = rng.normal(size=(32, 8, 8, 3)).astype(np.float32)
  xe = rng.normal(size=(5, 8, 8, 3)).astype(np.float32)

  def evaluate(m, p, x, xe):   # the statistics over x, then the evaluation on xe
    return prunable.apply_with_stats(m, p, prunable.batch_norm_stats(m, p, x, 16), xe)

  @jax.jit   # one program: the zeroed groups and their network's evaluation
  def masked_evaluation(p, w, x, xe):
    masked = fjs.pruning.zig.scale_groups(zigs, p, w)
    return masked, evaluate(module, masked, x, xe)

  masked, out = masked_evaluation(params, keep.astype(np.float32), x, xe)
  small, widths = fjs.pruning.zig.compress(zigs, masked, keep)
  small_module, _ = prunable.resnet((1, 1), (8, 8, 3), 5, widths=widths)
  np.testing.assert_allclose(out, jax.jit(functools.partial(evaluate, small_module))(
      small, x, xe), rtol=1e-4, atol=1e-5)
