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
  rng = np.random.default_rng(0)
  w = {"k": rng.normal(size=(20, 10)).astype(np.float32), "b": np.ones(10, np.float32)}
  m = {"k": rng.uniform(size=(20, 10)) < 0.6, "b": np.ones(10, bool)}
  new = jax.tree.map(np.asarray,
                     jax.jit(lambda m, w: _prune_layers(m, w, jnp.float32(0.05)))(m, w))
  old_k, new_k = m["k"], new["k"]
  n = old_k.sum()
  assert new_k.sum() == n - int(np.floor(0.05 * n)) and not np.any(new_k & ~old_k)
  a = np.abs(w["k"])
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
  cohort = jax.jit(lambda key: fjs.sampling.sample_cohort(jax.random.split(key)[0], 6, 1))
  k = int(np.asarray(cohort(jax.random.key(3)))[0])
  masks = jax.tree.map(np.asarray, new.masks)
  for a, b, m in zip(*(jax.tree.leaves(x) for x in (new.params, w0, masks))):
    m_k = m[k]
    np.testing.assert_array_equal(np.asarray(a)[~m_k], np.asarray(b)[~m_k])
  assert float(np.mean(masks["Dense_0"]["kernel"][k])) == pytest.approx(0.5, abs=0.01)


@pytest.mark.integration   # training rounds of Sub-FedAvg (Hy) on LeNet-5 with BatchNorm
def test_hybrid_prunes_convolution_channels_whole_by_norm_scale():
  """Sub-FedAvg (Hy) on LeNet-5 with BatchNorm: one pruning step drops exactly ⌊rate·n⌋ of
  each convolution's n channels — those of smallest |BN scale| — with every producer slice
  (kernel output channel, bias, norm scale and shift) of a dropped channel masked, nothing
  else; in training rounds the masks stay whole-channel on the convolutions while the dense
  kernels are pruned weight by weight, and the density reaches the target (to a channel)."""
  from fedjaxsparse.algorithms.subfedavg import _prune_channels
  module, model = fjs.models.prunable.lenet5((8, 8, 1), 10)
  zigs = fjs.pruning.zig.trace(module, (8, 8, 1))
  w = model.init(jax.random.key(0))
  scale2 = np.arange(16.0, dtype=np.float32)[::-1] + 1.0   # channel 15 smallest, then 14, ...
  w = {**w, "norm2": {**w["norm2"], "scale": scale2}}
  mask = jax.tree.map(lambda a: np.ones(a.shape, bool), w)
  conv = fjs.pruning.zig.conv_groups(zigs)
  new = jax.tree.map(np.asarray, jax.jit(
      lambda m, w: _prune_channels(m, w, jnp.float32(0.25), zigs, conv))(mask, w))
  kept2 = new["norm2"]["scale"]
  np.testing.assert_array_equal(kept2, np.arange(16) < 12)        # ⌊0.25·16⌋ = 4 dropped
  for leaf in (new["conv2"]["kernel"], new["conv2"]["bias"], new["norm2"]["bias"]):
    np.testing.assert_array_equal(np.asarray(leaf).reshape(-1, 16).all(0), kept2)
  assert np.asarray(new["norm1"]["scale"]).sum() == 6 - 1          # ⌊0.25·6⌋ = 1 of conv1
  # again on the pruned mask: ⌊0.25·12⌋ = 3 of conv2's 12 active channels go, the 4 already
  # pruned stay pruned (they are not counted among the channels kept)
  again = jax.tree.map(np.asarray, jax.jit(
      lambda m, w: _prune_channels(m, w, jnp.float32(0.25), zigs, conv))(new, w))
  np.testing.assert_array_equal(again["norm2"]["scale"], np.arange(16) < 9)
  assert np.asarray(again["norm1"]["scale"]).sum() == 5 - 1
  for name in ("dense1", "dense2", "head"):                        # dense layers untouched
    assert all(bool(np.asarray(x).all()) for x in jax.tree.leaves(new[name]))
  # three clients of 32 digits (one minibatch an epoch: LeNet's convolutions are slow to run
  # at the tests' optimisation level; the pruning is what is checked)
  ds = fjs.data.pack_clients(*_digits8(96), np.array_split(np.arange(96), 3))
  algo = fjs.subfedavg(fjs.models.make_loss(model), 0.05, epochs=2, batch_size=32,
                       accuracy_fn=fjs.evaluation.client_accuracy(model), cohort_size=3,
                       prune_rate=0.3, target_sparsity=0.5, acc_threshold=0.0,
                       dist_threshold=0.0, structure="hybrid", zigs=zigs)
  # model.init: the program compiled above (the initial weights are an argument of init's)
  state = jax.jit(algo.init)(None, model.init(jax.random.key(1)), ds)
  step = jax.jit(algo.step)
  for t in range(2):   # density 1 → 0.7 → 0.5 (the last step lands on the target)
    state, info = step(jax.random.key(t), state, ds)
  m = state.masks
  for c, n in (("1", 6), ("2", 16)):
    k = np.asarray(m[f"conv{c}"]["kernel"]).reshape(3, -1, n)       # [clients, ..., channel]
    assert np.all(k.all(1) == k.any(1))                             # whole channels only
    np.testing.assert_array_equal(k.all(1), np.asarray(m[f"norm{c}"]["scale"]))
    assert k.all(1).sum(1).min() < n                                # and some were pruned
  d1 = np.asarray(m["dense1"]["kernel"])
  assert 0 < d1.mean() < 1 and not np.all(d1.all(1) == d1.any(1))  # unstructured
  # at the target from above: every layer drops ⌊r·n_l⌋ of its n_l active units, so the
  # density stays above 0.5 by less than one unit a layer (a channel of each convolution, a
  # weight of each dense layer)
  shapes = [np.shape(a["kernel"]) for a in w.values() if isinstance(a, dict) and "kernel" in a]
  slack = (25 + 150 + 3) / sum(int(np.prod(s)) for s in shapes)   # conv1's 5·5·1, conv2's 5·5·6
  assert 0.5 - 1e-6 <= float(info.density) < 0.5 + slack
  with pytest.raises(ValueError, match="needs zigs"):
    fjs.subfedavg(fjs.models.make_loss(model), 0.05, accuracy_fn=lambda *a: 1.0,
                  structure="hybrid")


def _digits8(n):
  """The first ``n`` digits as 8×8×1 images."""
  from sklearn.datasets import load_digits
  x, y = load_digits(return_X_y=True)
  return (x[:n] / 16.0).reshape(-1, 8, 8, 1).astype(np.float32), y[:n].astype(np.int32)


def test_hybrid_runs_on_table_1s_vgg11():
  """The FedSpa paper's CIFAR-10 network with its channel sets declared (prunable.vgg11): the
  parameters of the paper's VGG-11 (9,231,114 at 32×32×3, 10 classes), its eight convolutions'
  channels as the prunable sets, and one Sub-FedAvg (Hy) pruning step drops whole channels of
  each — ⌊rate·n⌋ by |BatchNorm scale| — with the dense layer untouched."""
  from fedjaxsparse.algorithms.subfedavg import _prune_channels
  module, model = fjs.models.prunable.vgg11((32, 32, 3), 10)
  w = jax.eval_shape(model.init, jax.random.key(0))
  paper = jax.eval_shape(fjs.models.vgg11((32, 32, 3), 10).init, jax.random.key(0))
  count = lambda t: sum(int(np.prod(a.shape)) for a in jax.tree.leaves(t))  # noqa: E731
  assert count(w) == count(paper) == 9_231_114
  zigs = fjs.pruning.zig.trace(module, (32, 32, 3))
  sizes = (64, 128, 256, 256, 512, 512, 512, 512)
  assert [(s.name, s.size) for s in zigs.prunable] == [(f"c{i + 1}", n)
                                                       for i, n in enumerate(sizes)]
  rng = np.random.default_rng(0)
  w = jax.tree.map(lambda a: rng.standard_normal(a.shape).astype(np.float32), w)
  mask = jax.tree.map(lambda a: np.ones(a.shape, bool), w)
  conv = fjs.pruning.zig.conv_groups(zigs)
  new = jax.tree.map(np.asarray, jax.jit(
      lambda m, w: _prune_channels(m, w, jnp.float32(0.25), zigs, conv))(mask, w))
  for i, n in enumerate(sizes):
    kept = new[f"norm{i + 1}"]["scale"]
    order = np.argsort(np.abs(w[f"norm{i + 1}"]["scale"]), kind="stable")
    np.testing.assert_array_equal(~kept, np.isin(np.arange(n), order[:n // 4]))
    k = new[f"conv{i + 1}"]["kernel"].reshape(-1, n)
    np.testing.assert_array_equal(k.all(0), kept)
    np.testing.assert_array_equal(k.any(0), kept)
  assert new["fc"]["kernel"].all() and new["fc"]["bias"].all()
  # fedspa_table1 --set network=prunable builds it for CIFAR-10 (Table 1's Sub-FedAvg (Hy) row)
  from fedjaxsparse.harness.cli import experiments
  built, traced = experiments()["fedspa_table1"]._model("vgg11", (32, 32, 3), 10, "prunable")
  assert count(jax.eval_shape(built.init, jax.random.key(0))) == 9_231_114
  assert [s.size for s in traced.prunable] == list(sizes)
