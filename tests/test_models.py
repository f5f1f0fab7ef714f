"""Models: closed-form losses and gradients, output shapes, descent, padding invariance, vmap
over clients, the reference parameter counts, and the two normalisations of ResNet-18."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjaxsparse as fjs
from fedjaxsparse.models.nets import _BatchStatNorm


def _data(seed, shape, num_classes=3, b=7):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(b,) + tuple(shape)).astype(np.float32)
  return x, rng.integers(0, num_classes, b), np.ones(b, np.float32)


def _draw(model, seed=0):
  """The initial distributions of ``model``'s parameters drawn in NumPy on its ``init``
  structure (LeCun-normal kernels, unit scales, zero biases): compiling flax's initialisers (a
  threefry per leaf) costs more than what the tests using these parameters run."""
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_map_with_path(
      lambda path, s: (rng.normal(size=s.shape) / np.sqrt(np.prod(s.shape[:-1]))
                       if path[-1].key == "kernel" else
                       np.full(s.shape, float(path[-1].key == "scale"))).astype(np.float32),
      jax.eval_shape(model.init, jax.random.key(0)))


def test_linear_regression_loss_and_gradient_match_closed_form():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(7, 2, 2)).astype(np.float32)  # flattened to d = 4
  y = rng.normal(size=7).astype(np.float32)
  model = fjs.models.linear_regression(4, l2=0.5)
  assert model.task == fjs.core.REGRESSION
  p = {"w": np.array([0.1, -0.2, 0.3, 0.4], np.float32), "b": np.float32(0.7)}
  assert jax.tree.map(jnp.shape, jax.eval_shape(model.init, jax.random.key(0))) == \
      {"w": (4,), "b": ()}
  ones = np.ones(7, np.float32)
  no_bias = fjs.models.linear_regression(4, use_bias=False, init="lecun")

  @jax.jit   # one program: both reductions, the gradient, the bias-free model's init and output
  def run(p, x, y, mask, key):
    q = no_bias.init(key)
    return (fjs.models.make_loss(model)(p, x, y, mask),
            fjs.models.make_loss(model, "sum")(p, x, y, mask),
            jax.grad(fjs.models.make_loss(model))(p, x, y, mask), q, no_bias.apply(q, x))

  mean, total, g, q, out = run(p, x, y, ones, jax.random.key(0))
  X, w = x.reshape(7, 4).astype(np.float64), np.asarray(p["w"], np.float64)
  r = X @ w + 0.7 - y
  np.testing.assert_allclose(mean, 0.5 * np.mean(r ** 2) + 0.25 * w @ w, rtol=1e-6)
  np.testing.assert_allclose(total, 0.5 * np.sum(r ** 2) + 0.25 * w @ w, rtol=1e-6)
  # X^T (Xw + b − y)/n + l2·w; b not regularised
  np.testing.assert_allclose(g["w"], X.T @ r / 7 + 0.5 * w, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(g["b"], r.mean(), rtol=1e-5, atol=1e-6)

  assert set(q) == {"w"} and float(np.linalg.norm(np.asarray(q["w"]))) > 0
  np.testing.assert_allclose(out, X @ np.asarray(q["w"]), rtol=1e-5)


def test_softmax_regression_loss_and_gradient_match_closed_form():
  x, y, ones = _data(1, (3,), b=5)
  model = fjs.models.softmax_regression(3, 4, l2=0.1, init="lecun")
  assert model.task == fjs.core.CLASSIFICATION
  p = jax.jit(model.init)(jax.random.key(0))   # one program
  W, b = np.asarray(p["w"], np.float64), np.asarray(p["b"], np.float64)
  assert W.shape == (3, 4) and b.shape == (4,)
  z = x @ W + b
  prob = np.exp(z - z.max(1, keepdims=True))
  prob /= prob.sum(1, keepdims=True)
  onehot = np.eye(4)[y]
  expected = -np.log(prob[np.arange(5), y]).mean() + 0.05 * np.sum(W ** 2)
  loss = fjs.models.make_loss(model)
  value, g = jax.jit(jax.value_and_grad(loss))(p, x, y, ones)   # one program
  np.testing.assert_allclose(value, expected, rtol=1e-5)
  # the gradient: X^T (softmax − onehot)/n + l2·W
  np.testing.assert_allclose(g["w"], x.T @ (prob - onehot) / 5 + 0.1 * W, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(g["b"], (prob - onehot).mean(0), rtol=1e-4, atol=1e-6)


_SMALL = {
    "linear": lambda: fjs.models.linear_regression(16, l2=0.01),
    "softmax": lambda: fjs.models.softmax_regression(16, 3, l2=0.01),
    "mlp": lambda: fjs.models.mlp((4, 4, 1), 3, hidden=(8, 8)),
    "cnn": lambda: fjs.models.cnn((4, 4, 1), 3, channels=(4, 8), dense=16),
}


@pytest.mark.parametrize("name", list(_SMALL))
def test_shapes_descent_and_padding_invariance(name):
  model = _SMALL[name]()
  x, y, ones = _data(2, (4, 4, 1), b=6)
  if model.task == fjs.core.REGRESSION:
    y = x.reshape(6, -1) @ np.linspace(-1, 1, 16).astype(np.float32)
  p = jax.tree.map(np.asarray, model.init(jax.random.key(0)))
  out = jax.eval_shape(model.apply, p, x)
  assert out.shape == ((6,) if model.task == fjs.core.REGRESSION else (6, 3))
  # the batch with masked-out padding rows (whatever they hold)
  rng = np.random.default_rng(3)
  xp = np.concatenate([x, 100 * rng.normal(size=(3, 4, 4, 1)).astype(np.float32)])
  yp = np.concatenate([y, y[:3]])
  mp = np.array([1] * 6 + [0] * 3, np.float32)

  @jax.jit   # one program: the loss and its gradient on the batch and on the padded batch
  def loss_and_grad(p):
    value_and_grad = jax.value_and_grad(fjs.models.make_loss(model))
    return value_and_grad(p, x, y, ones), value_and_grad(p, xp, yp, mp)

  (first, _), _ = loss_and_grad(p)
  for _ in range(10):
    (_, g), _ = loss_and_grad(p)
    p = jax.tree.map(lambda a, g: a - 0.1 * np.asarray(g), p, g)
  (value, g), (padded_value, padded_g) = loss_and_grad(p)
  assert float(value) < 0.9 * float(first)

  # Masked-out padding rows, whatever they hold, do not change the loss or its gradient.
  np.testing.assert_allclose(padded_value, value, rtol=1e-6)
  for a, b in zip(jax.tree.leaves(padded_g), jax.tree.leaves(g)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_cnn_accepts_images_grayscale_and_flat_squares():
  x = np.random.default_rng(4).normal(size=(2, 8, 8)).astype(np.float32)
  p = _draw(fjs.models.cnn((8, 8, 1), 10, channels=(4, 8), dense=16))
  cases = (((8, 8, 1), x[..., None]), ((8, 8), x), ((64,), x.reshape(2, 64)))
  ref, *outs = jax.jit(lambda p: [   # one program
      fjs.models.cnn(shape, 10, channels=(4, 8), dense=16).apply(p, xs) for shape, xs in cases])(p)
  assert ref.shape == (2, 10)
  for out in outs:
    np.testing.assert_allclose(out, ref, rtol=1e-6)
  with pytest.raises(ValueError, match="input_shape"):
    fjs.models.cnn((10,), 3)


def test_vmap_over_client_params_equals_a_loop():
  for model in (fjs.models.mlp((6,), 4, hidden=(5,)),
                fjs.models.softmax_regression(6, 4, init="lecun")):
    loss = fjs.models.make_loss(model)
    keys = jax.random.split(jax.random.key(0), 3)
    rng = np.random.default_rng(3)
    x = rng.normal(size=(3, 8, 6)).astype(np.float32)
    y = rng.integers(0, 4, (3, 8))
    m = (rng.random((3, 8)) < 0.7).astype(np.float32)

    @jax.jit   # one program: vmapped over the clients, and a Python loop over them
    def batched_and_looped(keys, x, y, m):
      return (jax.vmap(loss)(jax.vmap(model.init)(keys), x, y, m),
              [loss(model.init(keys[i]), x[i], y[i], m[i]) for i in range(3)])

    batched, looped = batched_and_looped(keys, x, y, m)
    np.testing.assert_allclose(batched, looped, rtol=1e-6)


def _resnet18_count(num_classes, width=64):
  """Weights of the CIFAR ResNet-18, layer by layer (3×3 convs without bias; every norm layer
  has a scale and a bias per channel)."""
  total = 3 * 3 * 3 * width + 2 * width  # stem
  c_in = width
  for c in (width, 2 * width, 4 * width, 8 * width):
    for _ in range(2):
      total += 9 * c_in * c + 2 * c + 9 * c * c + 2 * c
      if c_in != c:
        total += c_in * c + 2 * c  # 1×1 projection shortcut
      c_in = c
  return total + 8 * width * num_classes + num_classes


def test_reference_parameter_counts():
  count = lambda model: fjs.models.num_params(jax.eval_shape(model.init, jax.random.key(0)))
  assert count(fjs.models.mlp((28, 28), 10)) == 784 * 200 + 200 + 200 * 200 + 200 + 2010 == 199_210
  assert count(fjs.models.cnn((28, 28, 1), 10)) == 1_663_370  # McMahan et al. 2017
  # seed 001 Table D.4, shapes corrected (C5-9): 832 + 51,264 + 819,328 + 7,998
  d4 = fjs.models.cohort_squeeze_cnn()
  assert count(d4) == 832 + 51_264 + 819_328 + 7_998 == 879_422
  assert jax.eval_shape(d4.apply, jax.eval_shape(d4.init, jax.random.key(0)),
                        jax.ShapeDtypeStruct((2, 28, 28, 1), jnp.float32)).shape == (2, 62)
  assert _resnet18_count(10) == 11_173_962
  for norm in ("group", "batch"):
    assert count(fjs.models.resnet18((32, 32, 3), 10, norm=norm)) == 11_173_962
  assert count(fjs.models.resnet18((32, 32, 3), 100)) == _resnet18_count(100)
  assert (count(fjs.models.resnet18((32, 32, 3), 10, num_groups=4, width=8))
          == _resnet18_count(10, 8))


def test_resnet18_group_and_batch_norm_under_jit():
  """Same params for both norms; GroupNorm is per example, batch statistics are not."""
  # narrowed: the same graph; XLA's convolution (tests/test_conv.py shows that the patch
  # convolution computes the same ResNet-18)
  group, batch = (fjs.models.resnet18((8, 8, 3), 10, num_groups=4, conv="xla", width=8),
                  fjs.models.resnet18((8, 8, 3), 10, norm="batch", conv="xla", width=8))
  p = _draw(group)
  assert jax.tree.map(jnp.shape, jax.eval_shape(batch.init, jax.random.key(0))) == \
      jax.tree.map(np.shape, p)
  x, y, ones = _data(5, (8, 8, 3), num_classes=10, b=6)
  other = x.copy()   # the same first half in another batch

  @jax.jit   # one program: the loss at p on a batch, the logits it computes, a gradient step
  def step(p, x):
    outputs = []
    recorded = batch._replace(
        apply=lambda p, x: outputs.append(batch.apply(p, x)) or outputs[-1])
    loss = lambda p: (fjs.models.make_loss(recorded)(p, x, y, ones), outputs[0])  # noqa: E731
    (value, logits), g = jax.value_and_grad(loss, has_aux=True)(p)
    return value, logits, jax.tree.map(lambda a, g: a - 0.02 * g, p, g)

  other[3:] = np.random.default_rng(6).normal(size=(3, 8, 8, 3))
  for apply, per_example in ((jax.jit(group.apply), True),
                             (lambda p, x: step(p, x)[1], False)):
    out = np.asarray(apply(p, x))
    assert out.shape == (6, 10) and np.all(np.isfinite(out))
    same = np.allclose(np.asarray(apply(p, other))[:3], out[:3], rtol=1e-4, atol=1e-5)
    assert same == per_example

  first, _, p = step(p, x)
  for _ in range(2):
    p = step(p, x)[2]
  assert float(step(p, x)[0]) < float(first)


def test_batch_statistics_norm_standardises_each_channel():
  x = np.random.default_rng(6).normal(3.0, 2.0, size=(4, 5, 5, 3)).astype(np.float32)
  norm = _BatchStatNorm()

  @jax.jit   # one program
  def init_apply(key, x):
    variables = norm.init(key, x)
    return variables, norm.apply(variables, x)

  variables, y = init_apply(jax.random.key(0), x)
  assert jax.tree.map(jnp.shape, variables) == {"params": {"scale": (3,), "bias": (3,)}}
  y = np.asarray(y)
  np.testing.assert_allclose(y.mean((0, 1, 2)), 0, atol=1e-5)
  np.testing.assert_allclose(y.var((0, 1, 2)), 1, rtol=1e-4)


def test_get_model_and_errors():
  assert jax.eval_shape(fjs.models.get_model("softmax", (8, 8), 10).init,
                        jax.random.key(0))["w"].shape == (64, 10)
  assert fjs.models.get_model("linear", (5,), 0, l2=1.0).regularizer is not None
  mlp = fjs.models.get_model("mlp", (8, 8), 10, hidden=(3,))
  assert jax.eval_shape(mlp.apply, jax.eval_shape(mlp.init, jax.random.key(0)),
                        jax.ShapeDtypeStruct((2, 8, 8), jnp.float32)).shape == (2, 10)
  with pytest.raises(ValueError, match="unknown model 'vit'"):
    fjs.models.get_model("vit", (8,), 2)
  with pytest.raises(ValueError, match="l2"):
    fjs.models.linear_regression(3, l2=-1.0)
  with pytest.raises(ValueError, match="init"):
    fjs.models.softmax_regression(3, 2, init="glorot")
  with pytest.raises(ValueError, match="num_classes"):
    fjs.models.softmax_regression(3, 1)
  with pytest.raises(ValueError, match="norm"):
    fjs.models.resnet18((32, 32, 3), 10, norm="layer")
  with pytest.raises(ValueError, match="num_groups"):
    fjs.models.resnet18((32, 32, 3), 10, num_groups=3)
  with pytest.raises(ValueError, match="reduction"):
    fjs.models.make_loss(fjs.models.linear_regression(3), "max")


def test_pytorch_default_linear_init():
  """torch.nn.Linear's default: weight and bias i.i.d. U(-1/sqrt(d), 1/sqrt(d)); checked by
  its bounds, mean 0 and variance 1/(3d) within 5 standard errors over 784 x 62 draws."""
  d, c = 784, 62
  p = jax.jit(fjs.models.softmax_regression(d, c, init="pytorch").init)(jax.random.key(0))
  w, b = np.asarray(p["w"], np.float64), np.asarray(p["b"], np.float64)
  bound = 1 / np.sqrt(d)
  assert np.abs(w).max() <= bound and np.abs(b).max() <= bound and np.abs(b).min() > 0
  n = w.size
  var = bound ** 2 / 3
  assert abs(w.mean()) < 5 * np.sqrt(var / n)
  # Var of the sample variance of U(-a, a): (E x^4 - var^2)/n with E x^4 = a^4/5
  assert abs(w.var() - var) < 5 * np.sqrt((bound ** 4 / 5 - var ** 2) / n)
  assert jax.eval_shape(fjs.models.linear_regression(d, init="pytorch").init,
                        jax.random.key(1))["b"].shape == ()
