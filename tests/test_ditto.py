"""Ditto and Local (seed 002 §4.2-4.3): the global part is FedAvg (FedSpa at s = 0) bit for
bit, λ = 0 makes the personal part local training independent of the global model, a large λ
pins the personal models to the received global model, Local sends nothing, and only the
cohort's personal models change."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fedjaxsparse as fjs


@pytest.fixture(scope="module")
def setup():
  ds = fjs.data.digits(num_clients=8, partition="dirichlet", alpha=0.3, seed=0)
  model = fjs.models.mlp((64,), 10, hidden=(16,))
  return ds, model, fjs.models.make_loss(model), model.init(jax.random.key(0))


def _dist(a, b):
  """‖a − b‖ over the leaves (numpy, float64: no program per leaf shape)."""
  return float(np.sqrt(sum(np.sum((np.asarray(x, np.float64) - np.asarray(y)) ** 2)
                           for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))))


@pytest.mark.integration   # multi-round runs of Ditto, FedSpa and local training compared
def test_global_part_is_fedavg_and_lambda_zero_is_local_training(setup):
  ds, _, loss, w0 = setup
  key = jax.random.key(4)
  lr = optax.exponential_decay(0.1, 1, 0.99)   # η_t = 0.1·0.99^t of the round
  kw = dict(batch_size=16, cohort_size=3, weight_decay=5e-4)
  d0 = fjs.ditto(loss, lr, lam=0.0, global_epochs=2, personal_epochs=3, **kw)
  s0 = d0.init(None, w0, ds.train)
  s0 = s0._replace(round=jnp.int32(3))  # η_t = 0.1·0.99³ in both
  new, info = jax.jit(d0.step)(key, s0, ds.train)
  fa = fjs.fedspa(loss, lr, num_rounds=10, sparsity=0.0, search="rsm", epochs=2, **kw)
  fs = fa.init(None, w0, ds.train)._replace(round=jnp.int32(3))
  want = jax.jit(fa.step)(key, fs, ds.train)[0].params
  for x, y in zip(jax.tree.leaves(new.params), jax.tree.leaves(want)):
    np.testing.assert_array_equal(x, y)
  # the schedule's η_3, given as a number: the same round bit for bit
  fixed = fjs.ditto(loss, float(lr(3)), lam=0.0, global_epochs=2, personal_epochs=3, **kw)
  for x, y in zip(jax.tree.leaves(jax.jit(fixed.step)(key, s0, ds.train)[0]),
                  jax.tree.leaves(new)):
    np.testing.assert_array_equal(x, y)
  lo = fjs.algorithms.ditto.local(loss, lr, epochs=3, **kw)
  ls = lo.init(None, w0, ds.train)._replace(round=jnp.int32(3))
  lnew, linfo = jax.jit(lo.step)(key, ls, ds.train)
  for x, y in zip(jax.tree.leaves(new.personal), jax.tree.leaves(lnew.personal)):
    np.testing.assert_array_equal(x, y)
  assert float(linfo.bits_up) == float(linfo.bits_down) == 0.0
  for x, y in zip(jax.tree.leaves(lnew.params), jax.tree.leaves(w0)):
    np.testing.assert_array_equal(x, y)
  d = sum(a.size for a in jax.tree.leaves(w0))
  assert float(info.bits_up) == float(info.bits_down) == 3 * 32 * d
  ids = set(np.asarray(fjs.sampling.sample_cohort(jax.random.split(key)[0], 8, 3)).tolist())
  for leaf_new, leaf_old in zip(jax.tree.leaves(new.personal), jax.tree.leaves(s0.personal)):
    leaf_new, leaf_old = np.asarray(leaf_new), np.asarray(leaf_old)
    for k in range(8):
      same = np.array_equal(leaf_new[k], leaf_old[k])
      assert same == (k not in ids)


def test_large_lambda_pins_personal_models_to_the_global_one(setup):
  """With ηλ = 1 each personal step is v ← w_t − η∇L(v): the personal models stay within
  η·‖∇L‖ of w_t, far closer than with λ = 0."""
  ds, _, loss, w0 = setup
  key = jax.random.key(1)
  dists = {}
  for lam in (0.0, 10.0):
    algo = fjs.ditto(loss, 0.1, lam=lam, global_epochs=1, personal_epochs=3, batch_size=16,
                     cohort_size=8)
    new, _ = jax.jit(algo.step)(key, algo.init(None, w0, ds.train), ds.train)
    personal = jax.tree.map(np.asarray, new.personal)
    dists[lam] = max(_dist(jax.tree.map(lambda a: a[k], personal), w0) for k in range(8))
  assert dists[10.0] < 0.25 * dists[0.0], dists


def test_bad_arguments(setup):
  _, _, loss, _ = setup
  with pytest.raises(ValueError, match="prox_centre"):
    fjs.ditto(loss, 0.1, prox_centre="middle")
  with pytest.raises(ValueError, match="personal_epochs"):
    fjs.ditto(loss, 0.1, personal_epochs=0)
  with pytest.raises(ValueError, match="lam"):
    fjs.ditto(loss, 0.1, lam=-1.0)
