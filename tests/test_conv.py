"""Patch convolution (im2col) is the same function as XLA's convolution: same parameters and
initial values as flax's Conv, same outputs and gradients for every stride and padding the
models use, also under a client vmap; the library's models compute the same either way."""
import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjaxsparse as fjs


@pytest.mark.parametrize("kernel,strides,padding", [
    ((3, 3), (1, 1), "SAME"), ((5, 5), (1, 1), "SAME"), ((3, 3), (2, 2), "SAME"),
    ((1, 1), (2, 2), "SAME"), ((3, 3), (2, 2), "VALID"), ((2, 3), (1, 2), "SAME")])
def test_patch_conv_is_xla_conv(kernel, strides, padding):
  xla = lambda x, w: jax.lax.conv_general_dilated(x, w, strides, padding,
                                                  dimension_numbers=("NHWC", "HWIO", "NHWC"))
  ours = lambda x, w: fjs.models.conv.patch_conv(x, w, strides, padding)
  loss = lambda f: lambda x, w: jnp.sum(jnp.sin(f(x, w)))

  @jax.jit   # one program: both outputs, and both gradients per client under vmap
  def run(x, w):
    # gradients w.r.t. input and kernel, per client under vmap (per-client kernels)
    xs, ws = jnp.stack([x, 2 * x]), jnp.stack([w, -w])
    return ((ours(x, w), xla(x, w)),
            tuple(jax.vmap(jax.grad(loss(f), argnums=(0, 1)))(xs, ws) for f in (ours, xla)))

  # standard-normal inputs drawn in NumPy (threefry inside the program tripled its compile)
  rng = np.random.default_rng(0)
  x = rng.normal(size=(2, 9, 8, 3)).astype(np.float32)
  w = rng.normal(size=kernel + (3, 4)).astype(np.float32)
  (y_ours, y_xla), (g_ours, g_xla) = run(x, w)
  np.testing.assert_allclose(y_ours, y_xla, rtol=1e-5, atol=1e-5)
  chex.assert_trees_all_close(g_ours, g_xla, rtol=1e-4, atol=1e-4)


def test_conv_module_is_a_drop_in_for_flax_conv():
  ref = nn.Conv(5, (3, 3), (2, 2), padding="SAME")
  mine = {impl: fjs.models.conv.Conv(5, (3, 3), (2, 2), padding="SAME", impl=impl)
          for impl in ("patches", "xla")}

  @jax.jit   # one program: flax's params and output, and each implementation's
  def run(x, init_key):
    p = ref.init(init_key, x)
    return p, ref.apply(p, x), {impl: (m.init(init_key, x), m.apply(p, x))
                                for impl, m in mine.items()}

  p, want, got = run(np.random.default_rng(0).normal(size=(2, 7, 7, 3)).astype(np.float32),
                    jax.random.key(3))
  for impl in mine:
    chex.assert_trees_all_equal(got[impl][0], p)  # names, shapes, values
    np.testing.assert_allclose(got[impl][1], want, rtol=1e-5, atol=1e-5)
  assert fjs.models.conv.resolve_impl("auto") == ("patches" if jax.default_backend() == "cpu"
                                                  else "xla")
  with pytest.raises(ValueError, match="conv impl"):
    fjs.models.conv.resolve_impl("fft")
  with pytest.raises(ValueError, match="conv impl"):
    fjs.models.cnn((8, 8, 1), 3, conv="fft")


@pytest.mark.parametrize("name", ["cnn", pytest.param("resnet18", marks=pytest.mark.integration)])
def test_models_compute_the_same_with_either_convolution(name):  # ResNet-18: compile-heavy
  # ResNet-18 as tests/test_models.py's GroupNorm one (narrowed to width 8, 8×8 inputs, a batch
  # of 6)
  shape = (8, 8, 3)
  build = ((lambda conv: fjs.models.cnn(shape, 4, channels=(3, 5), dense=8, conv=conv))
           if name == "cnn"
           else (lambda conv: fjs.models.resnet18(shape, 10, num_groups=4, conv=conv, width=8)))
  a, b = build("patches"), build("xla")
  # ``init`` is jitted; both lower to the same program (the forward pass is dead code), so they
  # give the same parameters for every key (test_conv_module_is_a_drop_in_for_flax_conv runs
  # the layer's initialisers); the parameters below are drawn in NumPy on that structure
  key = jax.random.key(0)
  assert a.init.lower(key).as_text() == b.init.lower(key).as_text()
  draw = np.random.default_rng(0)
  params = jax.tree_util.tree_map_with_path(
      lambda path, s: (draw.normal(size=s.shape) / np.sqrt(np.prod(s.shape[:-1]))
                       if path[-1].key == "kernel" else
                       (path[-1].key == "scale") + 0.1 * draw.normal(size=s.shape)
                       ).astype(np.float32), jax.eval_shape(a.init, key))
  rng = np.random.default_rng(1)
  x = rng.normal(size=(6,) + shape).astype(np.float32)
  y, m = rng.integers(0, 4, 6), np.ones(6, np.float32)
  # jitted: one program each (op-by-op dispatch of ResNet-18's backward pass takes minutes)
  (out_a, ga), (out_b, gb) = (jax.jit(_outputs_and_grad(model))(params, x, y, m)
                              for model in (a, b))
  np.testing.assert_allclose(out_a, out_b, rtol=1e-4, atol=1e-5)
  chex.assert_trees_all_close(ga, gb, rtol=1e-3, atol=1e-5)


def _outputs_and_grad(model):
  """``(params, x, y, mask) -> (model.apply(params, x), ∇ make_loss(model))``: the outputs are
  the loss's own forward pass (one program instead of a forward and a backward one)."""
  def run(params, x, y, mask):
    def loss(p):
      outputs = []
      recorded = model._replace(
          apply=lambda p, x: outputs.append(model.apply(p, x)) or outputs[-1])
      return fjs.models.make_loss(recorded)(p, x, y, mask), outputs[0]

    grads, outputs = jax.grad(loss, has_aux=True)(params)
    return outputs, grads
  return run


def test_canonical_backward_convolutions_equal_jax_grad_and_stay_canonical_in_a_loop():
  """``benchmarks/repro_conv_in_loop.py``'s workaround for XLA:CPU's slow convolution in a
  loop body: writing both backward convolutions in the canonical NHWC/HWIO form gives JAX's
  gradients (3×3 and 5×5 kernels, rectangular images) and leaves no non-canonical convolution
  for XLA to emit naively inside ``lax.scan``."""
  import os
  import runpy
  path = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "repro_conv_in_loop.py")
  repro = runpy.run_path(path)
  canonical, xla = repro["_canonical"], repro["_xla"]
  key = jax.random.key(3)
  for kh, kw in ((3, 3), (5, 3)):
    x = jax.random.normal(key, (2, 7, 6, 3))
    w = jax.random.normal(jax.random.fold_in(key, kh + kw), (kh, kw, 3, 4))
    got = jax.grad(lambda w, x: jnp.sum(jnp.sin(canonical(x, w))), argnums=(0, 1))(w, x)
    want = jax.grad(lambda w, x: jnp.sum(jnp.sin(xla(x, w))), argnums=(0, 1))(w, x)
    for a, b in zip(got, want):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  w = jnp.ones((3, 3, 3, 4)) * 0.1
  xs = jnp.ones((2, 2, 7, 6, 3))
  text = repro["_program"](canonical, False).lower(w, xs).compile().as_text()
  assert "while" in text and repro["_noncanonical"](text) == []


def test_tiled_max_pool_is_flax_max_pool_values_and_gradients_ties_included():
  """``models.conv.max_pool``'s 2 × 2 reshape path gives ``nn.max_pool``'s values and its
  select-and-scatter gradient bit for bit — on integer-valued inputs full of ties (the
  gradient goes to each window's first maximum in row-major order) and on continuous ones;
  odd sizes fall back to ``nn.max_pool``."""
  rng = np.random.default_rng(0)
  for x in (rng.integers(0, 3, (2, 6, 8, 3)).astype(np.float32),
            rng.normal(size=(3, 4, 4, 5)).astype(np.float32)):
    x = jnp.asarray(x)
    g = jnp.asarray(rng.normal(size=(x.shape[0], x.shape[1] // 2, x.shape[2] // 2,
                                     x.shape[3])).astype(np.float32))
    for padding in ("SAME", "VALID"):
      ref = lambda a: nn.max_pool(a, (2, 2), strides=(2, 2), padding=padding)  # noqa: E731
      ours = lambda a: fjs.models.conv.max_pool(a, (2, 2), (2, 2), padding)  # noqa: E731
      y, vjp = jax.vjp(ours, x)
      y_ref, vjp_ref = jax.vjp(ref, x)
      np.testing.assert_array_equal(y, y_ref)
      np.testing.assert_array_equal(vjp(g)[0], vjp_ref(g)[0])
  odd = jnp.asarray(rng.normal(size=(1, 5, 5, 2)).astype(np.float32))
  np.testing.assert_array_equal(fjs.models.conv.max_pool(odd, padding="SAME"),
                                nn.max_pool(odd, (2, 2), strides=(2, 2), padding="SAME"))
