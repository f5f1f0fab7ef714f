"""The padded federated pytree, embedded datasets, and the closed-form optima."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjaxsparse as fjs


def test_pack_clients_pads_and_masks():
  x = np.arange(12, dtype=np.float32).reshape(6, 2)
  y = np.arange(6)
  fd = fjs.data.pack_clients(x, y, [np.array([0, 3]), np.array([1, 2, 5]), np.array([4])])
  assert fd.x.shape == (3, 3, 2)
  np.testing.assert_array_equal(fd.num_examples, [2, 3, 1])
  np.testing.assert_array_equal(fd.mask, [[1, 1, 0], [1, 1, 1], [1, 0, 0]])
  np.testing.assert_array_equal(fd.x[0, 1], x[3])
  np.testing.assert_array_equal(fd.x[2, 1:], 0)  # padding is zero
  np.testing.assert_array_equal(fd.mask.sum(1), fd.num_examples)
  sel = fd.select(jnp.array([2, 0]))
  np.testing.assert_array_equal(sel.num_examples, [1, 2])


def test_pack_clients_rejects_bad_input():
  x = np.ones((4, 2), np.float32)
  with pytest.raises(ValueError, match="no example"):
    fjs.data.pack_clients(x, np.zeros(4), [np.array([0, 1]), np.array([], int)])
  bad = x.copy()
  bad[1, 0] = np.nan
  with pytest.raises(ValueError, match="NaN"):
    fjs.data.pack_clients(bad, np.zeros(4), [np.arange(4)])
  with pytest.raises(ValueError, match="same number"):
    fjs.data.pack_clients(x, np.zeros(3), [np.arange(3)])


def test_split_clients_keeps_a_training_example():
  tr, te = fjs.data.split_clients([np.arange(10), np.array([7])], 0.5, seed=0)
  assert len(tr[0]) == 5 and len(te[0]) == 5 and len(tr[1]) == 1 and len(te[1]) == 0
  assert set(tr[0]) | set(te[0]) == set(range(10)) and not set(tr[0]) & set(te[0])


def test_digits_is_real_and_covers_all_examples():
  ds = fjs.data.digits(num_clients=10, partition="dirichlet", alpha=0.5, seed=0)
  total = int(ds.train.num_examples.sum() + ds.test.num_examples.sum())
  assert total == 1797 and ds.num_classes == 10
  assert float(ds.train.x.max()) == 1.0 and float(ds.train.x.min()) == 0.0
  assert ds.name == "digits/dirichlet(0.5)"
  assert fjs.data.load_dataset("digits", num_clients=10, seed=0).train.x.shape == ds.train.x.shape


def test_diabetes_is_standardised_regression():
  ds = fjs.data.diabetes(num_clients=5)
  assert ds.num_classes == 0
  y = np.concatenate([np.asarray(s.y)[np.asarray(s.mask) > 0] for s in (ds.train, ds.test)])
  assert len(y) == 442 and abs(y.mean()) < 1e-5 and abs(y.std() - 1) < 1e-5


def test_synthetic_alpha_beta_drive_heterogeneity():
  iid = fjs.data.synthetic(num_clients=20, iid=True, seed=0)
  het = fjs.data.synthetic(alpha=5.0, beta=5.0, num_clients=20, seed=0)
  assert iid.train.x.shape[-1] == 60 and iid.num_classes == 10

  def mean_tv_to_global(ds):
    y = np.asarray(ds.train.y)
    m = np.asarray(ds.train.mask)
    glob = np.bincount(y[m > 0], minlength=10) / m.sum()
    tv = [0.5 * np.abs(np.bincount(y[i][m[i] > 0], minlength=10) / m[i].sum() - glob).sum()
          for i in range(len(y))]
    return np.mean(tv)

  # Client label distributions drift away from the global one as alpha, beta grow.
  assert mean_tv_to_global(het) > mean_tv_to_global(iid) + 0.2
  assert mean_tv_to_global(iid) < 0.15  # one shared model and input law: near-identical


@functools.partial(jax.jit, static_argnums=0)
def _objective(loss, params, data, c):
  per_client = jax.vmap(loss, in_axes=(None, 0, 0, 0))(params, data.x, data.y, data.mask)
  return jnp.dot(jnp.asarray(c), per_client)


_objective_grad = jax.jit(jax.grad(_objective, argnums=1), static_argnums=0)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("weights", [fjs.data.example_weights, fjs.data.uniform_weights])
def test_ridge_optimum_zeroes_the_gradient(reduction, weights):
  ds = fjs.data.ridge_regression_problem(num_clients=6, dim=4, seed=1)
  c = weights(ds.train)
  opt = fjs.data.ridge_regression_optimum(ds.train, 0.3, c, reduction=reduction)
  with jax.enable_x64(True):
    data = jax.tree.map(lambda a: jnp.asarray(np.asarray(a), jnp.float64)
                        if np.asarray(a).dtype.kind == "f" else jnp.asarray(a), ds.train)
    loss = fjs.models.make_loss(fjs.models.linear_regression(4, l2=0.3), reduction)
    params = jax.tree.map(jnp.asarray, opt)
    g = _objective_grad(loss, params, data, c)
    assert max(float(jnp.abs(v).max()) for v in jax.tree.leaves(g)) < 1e-9
    f0 = _objective(loss, params, data, c)
    bumped = jax.tree.map(lambda a: a + 1e-3, params)
    assert _objective(loss, bumped, data, c) > f0


def test_softmax_optimum_zeroes_the_gradient():
  from threadpoolctl import threadpool_limits  # scikit-learn's dependency
  ds = fjs.data.digits(num_clients=5, partition="iid", seed=0)
  c = fjs.data.uniform_weights(ds.train)
  # L-BFGS on a [1797, 64] problem: OpenBLAS's threads only spin on products this small
  # (3.7 s of CPU with 2 threads, 0.2 s with one)
  with threadpool_limits(1, user_api="blas"):
    opt = fjs.data.softmax_regression_optimum(ds.train, 10, 0.05, c)
  assert abs(opt["b"].sum()) < 1e-12  # the pinned gauge
  with jax.enable_x64(True):
    data = jax.tree.map(lambda a: jnp.asarray(np.asarray(a), jnp.float64)
                        if np.asarray(a).dtype.kind == "f" else jnp.asarray(a), ds.train)
    loss = fjs.models.make_loss(fjs.models.softmax_regression(64, 10, l2=0.05))
    g = _objective_grad(loss, jax.tree.map(jnp.asarray, opt), data, c)
    assert max(float(jnp.abs(v).max()) for v in jax.tree.leaves(g)) < 1e-7
  with pytest.raises(ValueError, match="l2"):
    fjs.data.softmax_regression_optimum(ds.train, 10, 0.0, c)


def test_unknown_dataset():
  with pytest.raises(ValueError, match="unknown dataset"):
    fjs.data.load_dataset("imagenet")


def test_load_arrays_splits_partition_the_pooled_set():
  """The registry's centralised arrays: digits' train and test splits are disjoint and together
  hold every example of the natural-order "all" (as multisets of rows), with the documented
  sizes; the stand-in's "all" is its train then its test split; bad names are refused."""
  xa, ya = fjs.data.load_arrays("digits", "all")
  (x, y), (xt, yt) = (fjs.data.load_arrays("digits", s) for s in ("train", "test"))
  assert len(y) == fjs.data.registry.DIGITS_TRAIN and len(y) + len(yt) == len(ya) == 1797
  rows = lambda a, b: sorted(map(tuple, np.c_[a, b].tolist()))
  assert rows(np.r_[x, xt], np.r_[y, yt]) == rows(xa, ya)
  assert xa.dtype == np.float32 and ya.dtype == np.int32 and 0 <= xa.min() and xa.max() <= 1
  s_all = fjs.data.load_arrays("fashion_mnist_standin", "all")
  s_tr, s_te = (fjs.data.load_arrays("fashion_mnist_standin", s) for s in ("train", "test"))
  np.testing.assert_array_equal(s_all[1], np.r_[s_tr[1], s_te[1]])
  with pytest.raises(ValueError, match="name must be one of"):
    fjs.data.load_arrays("mnist")
  with pytest.raises(ValueError, match="split must be"):
    fjs.data.load_arrays("digits", "validation")


def test_one_registry_names_every_data_set_an_experiment_accepts():
  """data.registry.REGISTRY is the one home of data-set names: every experiment's default, quick
  and paper-configuration data sets (and their stand-ins) are in it, each entry's loaders
  exist, DATASETS/ARRAYS/OFFLINE are its views, and a stand-in's real set is in it too."""
  import importlib.util
  from fedjaxsparse.data import registry as R
  from fedjaxsparse.harness.cli import experiments
  used = set()
  for m in experiments().values():
    used |= {m.DEFAULTS.get("dataset"), getattr(m, "QUICK", {}).get("dataset")}
    for pc in getattr(m, "PAPERS", {}).values():
      used |= {pc.dataset, pc.standin}
  used.discard(None)
  assert used <= set(R.REGISTRY), sorted(used - set(R.REGISTRY))
  for name, s in R.REGISTRY.items():
    assert s.federated or s.arrays or s.loader or name == "none", name
    for module, fn, *_ in filter(None, (s.federated, s.arrays)):
      assert importlib.util.find_spec(module) is not None, (name, module)
      if module.startswith("fedjaxsparse"):
        assert callable(getattr(importlib.import_module(module), fn)), (name, fn)
    if s.loader:
      assert importlib.util.find_spec(s.loader) is not None, (name, s.loader)
    assert s.standin_of is None or s.standin_of in R.REGISTRY, name
    assert R.data_status(name) == ("stand-in" if s.standin_of else
                                   "real offline" if s.offline else "real with files"), name
  assert R.DATASETS == {n: s.federated for n, s in R.REGISTRY.items() if s.federated}
  assert set(R.ARRAYS) == {n for n, s in R.REGISTRY.items() if s.arrays}
