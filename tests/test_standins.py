"""Pieces of the paper protocols: stand-ins have their data set's shape, the unbalanced
Dirichlet split has exactly the log-normal sizes, the global-mean loss is the sample mean,
crop/flip augmentation moves pixels without changing them, searches over choices."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjaxsparse as fjs
from fedjaxsparse.data.partitions import dirichlet_lognormal_partition


def test_mushrooms_standin_has_the_shape_of_mushrooms():
  """8,124 × 112 one-hot rows (exactly one 1 per attribute: 22 per row), binary labels near
  mushrooms' 52/48 balance, and informative attributes (a logistic fit beats the prior)."""
  from sklearn.linear_model import LogisticRegression
  from threadpoolctl import threadpool_limits  # scikit-learn's dependency
  x, y = fjs.data.standins.mushrooms_arrays()
  assert x.shape == (8124, 112) and sum(fjs.data.standins.MUSHROOM_CARDINALITIES) == 112
  assert set(np.unique(x)) == {0.0, 1.0} and np.all(x.sum(1) == 22)
  assert abs(y.mean() - 0.518) < 3 * np.sqrt(0.25 / 8124)  # 3 standard errors
  # one BLAS thread: OpenBLAS's second thread only spins on products this small (the fit:
  # 0.4 s of CPU with 2 threads, 0.02 s with one)
  with threadpool_limits(1, user_api="blas"):
    acc = LogisticRegression(max_iter=500).fit(x[:6000], y[:6000]).score(x[6000:], y[6000:])
  assert acc > max(y.mean(), 1 - y.mean()) + 0.1
  np.testing.assert_array_equal(fjs.data.standins.mushrooms_arrays()[0], x)  # deterministic


def test_femnist_standin_has_femnists_shape():
  ds = fjs.data.standins.femnist_standin(num_clients=30, seed=0)
  assert ds.num_clients == 30 and ds.num_classes == 62
  assert ds.train.x.shape[2:] == (28, 28, 1) and ds.test.num_clients == 1  # unrestricted test
  x = np.asarray(ds.train.x)
  assert x.min() >= 0 and x.max() <= 1
  n = np.asarray(ds.train.num_examples)
  # writer sizes: log-normal around 0.9 × LEAF's 226.8 (10 % go to the test split); the
  # mean of 30 draws with s.d. 89 lies within 4 standard errors
  assert abs(n.mean() - 0.9 * 226.83) < 4 * 0.9 * 88.94 / np.sqrt(30)
  # the test split also holds writers outside the training population: more test examples
  # than 10 % of the training writers' own
  assert int(ds.test.num_examples[0]) > 0.15 * n.sum()
  y = np.asarray(ds.train.y)[np.asarray(ds.train.mask) > 0]
  assert 0.35 < (y < 10).mean() < 0.65  # digits about half, as in FEMNIST


def test_blogfeedback_standin_has_blogfeedbacks_shape():
  ds = fjs.data.standins.blogfeedback_standin()
  assert ds.num_clients == 554 and ds.num_classes == 0 and ds.train.x.shape[2] == 281
  n = np.asarray(ds.train.num_examples)
  assert abs(n.mean() - 94.6) < 0.1 and n.max() > 10 * n.mean()  # very unequal sites
  assert int(ds.test.num_examples[0]) == 7624
  x = np.asarray(ds.train.x)[np.asarray(ds.train.mask) > 0]
  assert x[:, :280].min() >= 0 and x[:, :280].max() <= 1 and np.all(x[:, 280] == 1)
  assert np.asarray(ds.train.y).min() >= 0


def test_dirichlet_lognormal_split_has_the_lognormal_sizes_and_label_skew():
  rng = np.random.default_rng(0)
  labels = rng.integers(0, 10, 5000)
  parts = dirichlet_lognormal_partition(labels, 10, alpha=0.3, sigma=0.3, seed=4)
  np.testing.assert_array_equal([len(p) for p in parts], fjs.data.lognormal_sizes(5000, 10, 0.3, 4))
  all_ids = np.concatenate(parts)
  assert len(np.unique(all_ids)) == 5000  # a partition
  # label skew: with alpha = 0.3 a client's largest class is far above the uniform 10 %
  top = [np.bincount(labels[p], minlength=10).max() / len(p) for p in parts]
  assert np.mean(top) > 0.3


def test_global_mean_loss_is_the_sample_mean():
  model = fjs.models.softmax_regression(4, 3, l2=0.0)
  rng = np.random.default_rng(0)
  sizes = np.array([2, 5, 9])
  x = np.zeros((3, 9, 4), np.float32)
  y = np.zeros((3, 9), np.int32)
  mask = np.zeros((3, 9), np.float32)
  for i, n in enumerate(sizes):
    x[i, :n], y[i, :n], mask[i, :n] = rng.normal(size=(n, 4)), rng.integers(0, 3, n), 1
  params = model.init(jax.random.key(1))
  params = jax.tree.map(lambda a: np.asarray(a) + np.float32(0.3), params)
  loss = fjs.models.make_loss(model, "sum", fjs.models.global_mean_scale(sizes))
  labels = np.concatenate([y[i, :n] for i, n in enumerate(sizes)])

  @jax.jit
  def means(params):   # the clients' global-mean losses' mean, and the pooled sample mean
    per_client = jax.vmap(loss, in_axes=(None, 0, 0, 0))(params, x, y, mask)
    logits = jnp.concatenate([model.apply(params, x[i, :n]) for i, n in enumerate(sizes)])
    sample_mean = -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(16), labels])
    return jnp.mean(per_client), sample_mean

  client_mean, sample_mean = means(params)
  np.testing.assert_allclose(client_mean, sample_mean, rtol=1e-6)
  with pytest.raises(ValueError, match="scale"):
    fjs.models.make_loss(model, "sum", 0.0)


def test_crop_flip_moves_pixels_without_changing_them():
  x = np.arange(2 * 6 * 6 * 1, dtype=np.float32).reshape(2, 6, 6, 1) + np.float32(1.0)
  aug = jax.jit(fjs.ops.augment.crop_flip(pad=2))
  out = np.asarray(aug(jax.random.key(0), x))
  assert out.shape == x.shape
  padded = np.pad(np.asarray(x), ((0, 0), (2, 2), (2, 2), (0, 0)), mode="reflect")
  for i in range(2):  # every output is one of the 25 crops of the padded image, maybe flipped
    crops = [padded[i, a:a + 6, b:b + 6] for a in range(5) for b in range(5)]
    assert any(np.array_equal(out[i], c) or np.array_equal(out[i], c[:, ::-1]) for c in crops)
  outs = np.stack([np.asarray(aug(jax.random.key(k), x))[0] for k in range(40)])
  assert len({o.tobytes() for o in outs}) > 10  # random offsets and flips
  np.testing.assert_array_equal(
      jax.jit(fjs.ops.augment.crop_flip(pad=0, flip=False))(jax.random.key(0), x), x)


def test_search_over_choices_keeps_the_best_choice():
  def score(c):  # batch 64 is better, and lr near 0.1
    return -np.log(c["lr"] / 0.1) ** 2 + (c["batch"] == 64)

  res = fjs.harness.protocol.two_stage_search(
      score, {"lr": fjs.harness.protocol.Dimension(1e-3, 1.0),
              "batch": fjs.harness.protocol.Dimension(32, 64, choices=(32, 64))},
      (30, 30), seed=0)
  assert res.best["batch"] == 64
  assert set(res.stages[1]["candidates"]["batch"]) <= {32.0, 64.0}
