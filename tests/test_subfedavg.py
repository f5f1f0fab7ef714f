"""Sub-FedAvg (Un): per-coordinate averaging over the participants that keep a coordinate
(untouched where none does), masks shrink by the prune rate per pruning round down to the
target and never below, pruning removes the smallest magnitudes, and the accuracy threshold
gates it."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjaxsparse as fjs

from fedjaxsparse.algorithms.subfedavg import _prune_layers


@pytest.fixture(scope="module")
def setup():
  ds = fjs.data.digits(num_clients=6, partition="dirichlet", alpha=0.3, seed=0)
  model = fjs.models.mlp((64,), 10, hidden=(16,))
  return ds, model, fjs.models.make_loss(model), model.init(jax.random.key(0))


def test_prune_layers_drops_the_smallest_active_magnitudes():
  w = {"k": jax.random.normal(jax.random.key(0), (20, 10)), "b": jnp.ones(10)}
  m = {"k": jax.random.uniform(jax.random.key(1), (20, 10)) < 0.6, "b": jnp.ones(10, bool)}
  new = jax.jit(lambda m, w: _prune_layers(m, w, jnp.float32(0.05)))(m, w)
  old_k, new_k = np.asarray(m["k"]), np.asarray(new["k"])
  n = old_k.sum()
  assert new_k.sum() == n - int(np.floor(0.05 * n)) and not np.any(new_k & ~old_k)
  a = np.abs(np.asarray(w["k"]))
  assert a[old_k & ~new_k].max() <= a[new_k].min()
  assert bool(new["b"].all())


def test_masks_shrink_to_the_target_and_aggregation_is_per_coordinate(setup):
  ds, model, loss, w0 = setup
  algo = fjs.subfedavg(loss, 0.1, accuracy_fn=fjs.evaluation.client_accuracy(model), epochs=2,
                       batch_size=16, cohort_size=6, prune_rate=0.2, target_sparsity=0.5,
                       acc_threshold=0.0)
  state, step = algo.init(None, w0, ds.train), jax.jit(algo.step)
  dens = []
  for t in range(6):
    prev = state
    state, info = step(jax.random.key(t), state, ds.train)
    dens.append(float(info.density))
    # coordinates no participant keeps stay as they were (all clients participate here)
    for w_old, w_new, m in zip(*(jax.tree.leaves(x) for x in (prev.params, state.params,
                                                             state.masks))):
      off = ~np.asarray(m).any(0)
      np.testing.assert_array_equal(np.asarray(w_new)[off], np.asarray(w_old)[off])
  # 1 → 0.8 → 0.64 → 0.512 → the last step lands on the target 0.5, then no more pruning
  assert dens == pytest.approx([0.8, 0.64, 0.512, 0.5, 0.5, 0.5], abs=0.005)
  assert float(info.pruned) == 0.0


def test_the_accuracy_and_distance_thresholds_gate_pruning(setup):
  ds, model, loss, w0 = setup
  algo = fjs.subfedavg(loss, 0.1, accuracy_fn=fjs.evaluation.client_accuracy(model), epochs=2,
                       batch_size=16, cohort_size=3,
                       acc_threshold=1.0)  # no model is more than 100 % accurate
  _, info = jax.jit(algo.step)(jax.random.key(0), algo.init(None, w0, ds.train), ds.train)
  assert float(info.pruned) == 0.0 and float(info.density) == 1.0
  one_epoch = fjs.subfedavg(loss, 0.1, accuracy_fn=fjs.evaluation.client_accuracy(model), epochs=1,
                            batch_size=16, cohort_size=3, acc_threshold=0.0)
  _, info = jax.jit(one_epoch.step)(jax.random.key(0), one_epoch.init(None, w0, ds.train),
                                    ds.train)
  assert float(info.pruned) == 0.0  # one epoch: m¹ = m², the masks do not move


def test_single_participant_average_is_its_model(setup):
  """One client per round: the new global model is that client's trained model on its mask
  and the old global model elsewhere."""
  ds, model, loss, w0 = setup
  algo = fjs.subfedavg(loss, 0.1, accuracy_fn=fjs.evaluation.client_accuracy(model), epochs=2,
                       batch_size=16, cohort_size=1, acc_threshold=0.0, prune_rate=0.5,
                       dist_threshold=0.0)
  state = algo.init(None, w0, ds.train)
  new, _ = jax.jit(algo.step)(jax.random.key(3), state, ds.train)
  k = int(fjs.sampling.sample_cohort(jax.random.split(jax.random.key(3))[0], 6, 1)[0])
  for a, b, m in zip(*(jax.tree.leaves(x) for x in (new.params, w0, new.masks))):
    m_k = np.asarray(m[k])
    np.testing.assert_array_equal(np.asarray(a)[~m_k], np.asarray(b)[~m_k])
  assert float(np.mean(np.asarray(new.masks["Dense_0"]["kernel"][k]))) == pytest.approx(0.5, abs=0.01)
