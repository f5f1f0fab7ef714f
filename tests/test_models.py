"""Models: closed-form losses and gradients, padding invariance, vmap over clients, and the
known parameter counts of the reference architectures."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjaxsparse.models import (cnn, get_model, linear_regression, make_loss, mlp, num_params,
                                 resnet18, softmax_regression)


def _batch(seed=0, b=7, d=4):
  rng = np.random.default_rng(seed)
  return (rng.normal(size=(b, d)).astype(np.float32), rng.normal(size=b).astype(np.float32))


def test_linear_regression_loss_and_gradient_match_closed_form():
  x, y = _batch()
  model = linear_regression(4, l2=0.5)
  p = {"w": jnp.array([0.1, -0.2, 0.3, 0.4]), "b": jnp.float32(0.7)}
  mask = np.ones(7, np.float32)
  w, b = np.asarray(p["w"], np.float64), 0.7
  r = x.astype(np.float64) @ w + b - y
  expected = 0.5 * np.mean(r ** 2) + 0.25 * np.sum(w ** 2)
  np.testing.assert_allclose(make_loss(model)(p, x, y, mask), expected, rtol=1e-6)
  np.testing.assert_allclose(make_loss(model, "sum")(p, x, y, mask),
                             0.5 * np.sum(r ** 2) + 0.25 * np.sum(w ** 2), rtol=1e-6)
  g = jax.grad(make_loss(model))(p, x, y, mask)
  np.testing.assert_allclose(g["w"], x.T @ r / 7 + 0.5 * w, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(g["b"], r.mean(), rtol=1e-5, atol=1e-6)


def test_softmax_regression_matches_numpy_cross_entropy():
  rng = np.random.default_rng(1)
  x = rng.normal(size=(5, 3)).astype(np.float32)
  y = np.array([0, 2, 1, 1, 0])
  model = softmax_regression(3, 3, l2=0.1, init="lecun")
  p = model.init(jax.random.key(0))
  z = x @ np.asarray(p["w"]) + np.asarray(p["b"])
  logp = z - np.log(np.exp(z).sum(1, keepdims=True))
  expected = -logp[np.arange(5), y].mean() + 0.05 * np.sum(np.asarray(p["w"]) ** 2)
  np.testing.assert_allclose(make_loss(model)(p, x, y, np.ones(5)), expected, rtol=1e-5)


@pytest.mark.parametrize("make", [
    lambda: softmax_regression(16, 3),
    lambda: mlp((4, 4, 1), 3, hidden=(8,)),
    lambda: cnn((4, 4, 1), 3, channels=(4, 8), dense=16),
])
def test_padding_does_not_change_the_loss(make):
  model = make()
  p = model.init(jax.random.key(0))
  if isinstance(p, dict) and "w" in p:
    p = jax.tree.map(lambda a: a + 0.1, p)
  rng = np.random.default_rng(2)
  x = rng.normal(size=(5, 4, 4, 1)).astype(np.float32)
  y = rng.integers(0, 3, 5)
  loss = make_loss(model)
  a = loss(p, x, y, np.ones(5, np.float32))
  xp = np.concatenate([x, rng.normal(size=(3, 4, 4, 1)).astype(np.float32)])
  yp = np.concatenate([y, [0, 1, 2]])
  b = loss(p, xp, yp, np.array([1] * 5 + [0] * 3, np.float32))
  np.testing.assert_allclose(a, b, rtol=1e-6)


def test_vmap_over_client_params_equals_a_loop():
  model = mlp((6,), 4, hidden=(5,))
  loss = make_loss(model)
  keys = jax.random.split(jax.random.key(0), 3)
  params = jax.vmap(model.init)(keys)
  rng = np.random.default_rng(3)
  x = rng.normal(size=(3, 8, 6)).astype(np.float32)
  y = rng.integers(0, 4, (3, 8))
  m = np.ones((3, 8), np.float32)
  batched = jax.vmap(loss)(params, x, y, m)
  looped = [loss(model.init(keys[i]), x[i], y[i], m[i]) for i in range(3)]
  np.testing.assert_allclose(batched, looped, rtol=1e-6)


def test_a_few_gradient_steps_reduce_the_loss():
  model = cnn((8, 8, 1), 10, channels=(4, 8), dense=16)
  loss = jax.jit(make_loss(model))
  rng = np.random.default_rng(4)
  x = rng.normal(size=(16, 64)).astype(np.float32)  # flat square images are accepted
  y = rng.integers(0, 10, 16)
  m = np.ones(16, np.float32)
  p = model.init(jax.random.key(0))
  first = loss(p, x, y, m)
  for _ in range(20):
    p = jax.tree.map(lambda a, g: a - 0.1 * g, p, jax.grad(loss)(p, x, y, m))
  assert loss(p, x, y, m) < 0.5 * first


def test_reference_parameter_counts():
  # FedAvg CNN on 28x28x1, 10 classes: 1,663,370 (McMahan et al. 2017's model).
  assert num_params(cnn((28, 28, 1), 10).init(jax.random.key(0))) == 1_663_370
  # CIFAR ResNet-18, 10 classes: 11,173,962 (the torchvision-style CIFAR variant).
  for norm in ("group", "batch"):
    model = resnet18((32, 32, 3), 10, norm=norm)
    p = model.init(jax.random.key(0))
    assert num_params(p) == 11_173_962
  out = jax.jit(model.apply)(p, jnp.ones((2, 32, 32, 3)))
  assert out.shape == (2, 10) and bool(jnp.all(jnp.isfinite(out)))


def test_get_model_and_errors():
  assert get_model("softmax", (8, 8), 10).init(jax.random.key(0))["w"].shape == (64, 10)
  with pytest.raises(ValueError, match="unknown model"):
    get_model("vit", (8,), 2)
  with pytest.raises(ValueError, match="l2"):
    linear_regression(3, l2=-1.0)
  with pytest.raises(ValueError, match="norm"):
    resnet18((32, 32, 3), 10, norm="layer")
  with pytest.raises(ValueError, match="reduction"):
    make_loss(linear_regression(3), "max")
