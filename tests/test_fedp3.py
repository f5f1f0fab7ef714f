"""FedP3 (seed 001 ch. 4, Algorithms 5-7; spec §A.11): the FedAvg reduction bit for bit, the
privacy structure (uplink sizes, unsent layers never read), the aggregation weights, layers
nobody trained, exact global-pruning counts, nested ordered-dropout masks, the layer policies,
and Fig. C.1's parameter accounting from Table C.2."""
import jax
import numpy as np
import optax
import pytest

import fedjaxsparse as fjs

fedp3 = fjs.algorithms.fedp3


@pytest.fixture(scope="module")
def setup():
  ds = fjs.data.digits(num_clients=6, partition="dirichlet", alpha=0.5, seed=0)
  model = fjs.models.mlp((64,), 10, hidden=(16, 12))  # 3 layers: Dense_0, Dense_1, Dense_2 (FFC)
  return ds, model, fjs.models.make_loss(model), jax.jit(lambda: model.init(jax.random.key(0)))()


def _run(algo, w0, data, rounds, seed=3):
  state = algo.init(None, w0, data)
  step = jax.jit(algo.step)
  infos = []
  for t in range(rounds):
    state, info = step(jax.random.fold_in(jax.random.key(seed), t), state, data)
    infos.append(info)
  return state, infos


def test_all_layers_unpruned_fixed_simple_is_uniform_fedavg_bitwise(setup):
  ds, _, loss, w0 = setup
  n = ds.train.num_clients
  cfg = fedp3.make_config(jax.random.key(1), np.ones((n, 3), bool), 1.0)
  mine, _ = _run(fjs.fedp3(loss, optax.sgd(0.1), cfg, local_steps=4, batch_size=8,
                           cohort_size=4), w0, ds.train, 3)
  ref, _ = _run(fjs.fedavg(loss, optax.sgd(0.1), local_steps=4, batch_size=8, cohort_size=4,
                           weighting="uniform"), w0, ds.train, 3)
  for a, b in zip(jax.tree.leaves(mine.params), jax.tree.leaves(ref.params)):
    np.testing.assert_array_equal(a, b)
  assert not all(np.array_equal(a, b) for a, b in
                 zip(jax.tree.leaves(mine.params), jax.tree.leaves(w0)))


def test_uplink_holds_exactly_the_trained_layers(setup):
  _, _, _, w0 = setup
  sizes = fjs.ops.layer_groups.layer_sizes(w0)
  train = fedp3.layer_policy(jax.random.key(0), 20, 3, "lowerb")
  for row in train:
    msg = fedp3.uplink(w0, row)
    assert sorted(msg) == [n for n, r in zip(fjs.ops.layer_groups.layer_names(w0), row) if r]
    assert fedp3.num_floats(msg) == int(sizes[row].sum())


def test_unsent_layers_are_never_read_and_untrained_layers_stay(setup):
  _, _, _, w0 = setup
  m = 4
  train = np.array([[False, True, True], [False, False, True], [False, True, True],
                    [False, False, True]])
  rng = np.random.default_rng(5)
  w0 = jax.tree.map(np.asarray, w0)
  trained = jax.tree.map(
      lambda a: (a[None] + rng.normal(size=(m,) + a.shape)).astype(np.float32), w0)
  poisoned = jax.tree.map(
      lambda t, l: np.where(train[:, l].reshape((-1,) + (1,) * (t.ndim - 1)), t, np.nan),
      trained, fjs.ops.layer_groups.layer_index(w0))

  def aggregate(*args):
    return jax.tree.map(np.asarray, jax.jit(fedp3.aggregate)(*args))

  for weights in (np.ones(m, np.float32), np.sum(train, 1).astype(np.float32)):
    a = aggregate(w0, trained, train, weights)
    b = aggregate(w0, poisoned, train, weights)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
      np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(a["Dense_0"]["kernel"], w0["Dense_0"]["kernel"])
  # FFC (everyone) under simple averaging: the plain mean of the returned layers
  simple = aggregate(w0, trained, train, np.ones(m, np.float32))
  np.testing.assert_allclose(simple["Dense_2"]["kernel"],
                             np.mean(trained["Dense_2"]["kernel"], 0), rtol=1e-5, atol=1e-6)
  # Dense_1 from clients 0 and 2; weighted: N_i = 2, 2 -> normalised 1/2 each
  weighted = aggregate(w0, trained, train, np.sum(train, 1).astype(np.float32))
  np.testing.assert_allclose(weighted["Dense_1"]["kernel"],
                             (trained["Dense_1"]["kernel"][0] + trained["Dense_1"]["kernel"][2])
                             / 2, rtol=1e-5, atol=1e-6)
  # FFC under weighted: N = (2, 1, 2, 1) / 6 — sums to one over the layer's holders
  want = np.tensordot(np.array([2, 1, 2, 1]) / 6.0, trained["Dense_2"]["kernel"], 1)
  np.testing.assert_allclose(weighted["Dense_2"]["kernel"], want, rtol=1e-5, atol=1e-6)


def test_weighted_equals_simple_when_every_client_trains_as_many_layers(setup):
  ds, _, loss, w0 = setup
  n = ds.train.num_clients
  train = fedp3.layer_policy(jax.random.key(2), n, 3, "lowerb")
  assert (train.sum(1) == 2).all() and train[:, 2].all()
  cfg = fedp3.make_config(jax.random.key(1), train, 0.7)
  runs = [_run(fjs.fedp3(loss, optax.sgd(0.1), cfg, local_steps=3, batch_size=8, cohort_size=3,
                         aggregation=a), w0, ds.train, 2)[0] for a in ("simple", "weighted")]
  for a, b in zip(jax.tree.leaves(runs[0].params), jax.tree.leaves(runs[1].params)):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("rule", ["fixed", "uniform", "ordered_dropout"])
def test_a_layer_nobody_trains_is_unchanged_and_the_ledger_counts_floats(setup, rule):
  ds, _, loss, w0 = setup
  n = ds.train.num_clients
  train = np.zeros((n, 3), bool)
  train[:, 2] = True
  train[::2, 1] = True  # Dense_0 is nobody's
  cfg = fedp3.make_config(jax.random.key(1), train, 0.5)
  state, infos = _run(fjs.fedp3(loss, optax.sgd(0.1), cfg, local_steps=3, batch_size=8,
                                local_rule=rule, q_range=(0.5, 0.9)), w0, ds.train, 2)
  np.testing.assert_array_equal(state.params["Dense_0"]["kernel"], w0["Dense_0"]["kernel"])
  assert not np.array_equal(state.params["Dense_1"]["kernel"], w0["Dense_1"]["kernel"])
  sizes = fjs.ops.layer_groups.layer_sizes(w0)
  assert float(infos[0].floats_up) == float((train * sizes).sum())
  # downlink: dense trained layers + round(0.5 numel) of every other kernel + its bias
  k0 = w0["Dense_0"]["kernel"].size
  k1 = w0["Dense_1"]["kernel"].size
  b = {l: w0[l]["bias"].size for l in ("Dense_0", "Dense_1")}
  per = [sizes[2] + sizes[1] + round(0.5 * k0) + b["Dense_0"] if row[1] else
         sizes[2] + round(0.5 * k0) + b["Dense_0"] + round(0.5 * k1) + b["Dense_1"]
         for row in train]
  assert float(infos[0].floats_down) == float(sum(per))
  assert np.isclose(float(infos[0].layers_up), train.mean())


def test_global_mask_keeps_exact_counts_and_selected_layers_whole(setup):
  _, _, _, w0 = setup
  sel = fjs.ops.layer_groups.per_leaf(np.array([False, True, False]), w0)
  mask = jax.jit(fedp3.global_mask)
  for r in (0.0, 0.3, 0.9, 1.0):
    keep = fjs.ops.layer_groups.per_leaf(np.full(3, r, np.float32), w0)
    m = jax.tree.map(np.asarray, mask(jax.random.key(4), w0, sel, keep))
    assert int(m["Dense_0"]["kernel"].sum()) == round(r * w0["Dense_0"]["kernel"].size)
    assert int(m["Dense_2"]["kernel"].sum()) == round(r * w0["Dense_2"]["kernel"].size)
    assert bool(m["Dense_1"]["kernel"].all()) and bool(m["Dense_1"]["bias"].all())
    assert bool(m["Dense_0"]["bias"].all()) == (r > 0)  # keep 0: the layer is dropped whole
  personal = jax.tree.map(np.asarray, jax.jit(fedp3.deployed_models)(
      w0, fedp3.make_config(jax.random.key(0), np.array([[False, True, True],
                                                          [True, True, True]]), 0.5)))
  assert int((personal["Dense_0"]["kernel"][0] != 0).sum()) == round(
      0.5 * w0["Dense_0"]["kernel"].size)
  np.testing.assert_array_equal(personal["Dense_0"]["kernel"][1], w0["Dense_0"]["kernel"])


def test_ordered_dropout_masks_are_nested_with_ceil_rounding():
  shape = (5, 5, 7, 10)
  qs = np.linspace(0.05, 1.0, 20).astype(np.float32)

  @jax.jit
  def masks(qs, q_flat, q_out, q_bias):
    return (jax.vmap(lambda q: fedp3.ordered_dropout_mask(shape, q))(qs),
            fedp3.ordered_dropout_mask((24, 5), q_flat, in_period=4),
            fedp3.ordered_dropout_mask((7, 10), q_out, prune_out=False),
            fedp3.ordered_dropout_mask((10,), q_bias))

  nested, flat, kept_out, bias = (np.asarray(m) for m in masks(
      qs, np.float32(0.5), np.float32(0.3), np.float32(0.3)))
  prev = None
  for q, m in zip(qs, nested):
    assert m.sum() == 25 * np.ceil(np.float32(q) * 7) * np.ceil(np.float32(q) * 10)
    assert m[..., : int(np.ceil(np.float32(q) * 7)), : int(np.ceil(np.float32(q) * 10))].all()
    if prev is not None:
      assert not (prev & ~m).any()  # mask(q1) ⊆ mask(q2)
    prev = m
  # a dense layer after a flatten of C = 4 channels keeps the inputs of channels < ⌈q·C⌉
  np.testing.assert_array_equal(flat.any(1), np.arange(24) % 4 < 2)
  assert kept_out.sum() == 3 * 10
  assert bias.sum() == 3


def test_layer_policies():
  key = jax.random.key(0)
  for name, counts in (("opu3", {4}), ("opu2", {3}), ("lowerb", {2}), ("opu1-2-3", {2, 3, 4}),
                       ("opu2-3", {3, 4}), ("fedavg", {5})):
    t = fedp3.layer_policy(key, 300, 5, name)
    assert t[:, -1].all() and set(t.sum(1)) == counts
  # every non-FFC layer is drawn about equally often under OPU2 (2 of 4: p = 1/2 each)
  t = fedp3.layer_policy(key, 4000, 5, "opu2")
  se = np.sqrt(0.25 / 4000)
  assert np.all(np.abs(t[:, :4].mean(0) - 0.5) < 5 * se)
  with pytest.raises(ValueError, match="policy"):
    fedp3.layer_policy(key, 3, 5, "opu9")
  train, keep = fedp3.exclude_one_group(key, 50, ["a", "b", "c", "d"], [["b"], ["c", "d"]])
  assert set(map(tuple, train)) <= {(True, False, True, True), (True, True, False, False)}
  np.testing.assert_array_equal(keep, train.astype(np.float32))


def test_bad_arguments(setup):
  ds, _, loss, w0 = setup
  cfg = fedp3.make_config(jax.random.key(1), np.ones((3, 3), bool))
  with pytest.raises(ValueError, match="local_rule"):
    fjs.fedp3(loss, optax.sgd(0.1), cfg, local_rule="random")
  with pytest.raises(ValueError, match="q_range"):
    fjs.fedp3(loss, optax.sgd(0.1), cfg, q_range=(0.0, 1.0))
  with pytest.raises(ValueError, match="keep_ratio"):
    fedp3.make_config(jax.random.key(1), np.ones((3, 3), bool), 1.5)
  with pytest.raises(ValueError, match=r"train_layers must be bool\[6, 3\]"):
    fjs.fedp3(loss, optax.sgd(0.1), cfg).init(None, w0, ds.train)


def _table_c2_sizes(params):
  """Table C.2's per-layer counts: convolutions with their biases, FC kernels only."""
  return [params[n]["kernel"].size + (params[n]["bias"].size if n.startswith("conv") else 0)
          for n in fjs.ops.layer_groups.layer_names(params)]


@pytest.mark.parametrize("dataset,want_ratio,want_gap05", [
    ("cifar10", 10815.25, 57.93), ("cifar100", 1522.91, 54.38), ("fmnist", 13749.46, 58.18),
    ("emnist", 30.23, 6.60)])
def test_fig_c1_parameter_accounting(dataset, want_ratio, want_gap05):
  """LowerB-like clients (one layer + FFC): (max − min)/min uplink, and the deployed-size gap
  at r = 0.5 — the paper's 10815 % / 1522.91 % / 13749.46 % / 30.23 % and 57.93 % exactly."""
  shape, classes = {"cifar10": ((32, 32, 3), 10), "cifar100": ((32, 32, 3), 100),
                    "fmnist": ((28, 28, 1), 10), "emnist": ((784,), 10)}[dataset]
  model = (fjs.models.mlp(shape, classes, hidden=(1024, 1024, 1024)) if dataset == "emnist"
           else fjs.models.fedp3_cnn(shape, classes))
  params = jax.eval_shape(model.init, jax.random.key(0))
  sizes = np.array(_table_c2_sizes(params), np.float64)
  L = len(sizes)
  rows = [np.eye(L, dtype=bool)[l] | np.eye(L, dtype=bool)[L - 1] for l in range(L - 1)]
  up = np.array([sizes[r].sum() for r in rows])
  assert round(100 * (up.max() - up.min()) / up.min(), 2) == want_ratio
  dep = np.array([fedp3.deployed_size(sizes, r, 0.5) for r in rows])
  assert round(100 * (dep.max() - dep.min()) / dep.min(), 2) == want_gap05


def test_attention_averaging_is_refused_with_the_papers_gap(setup):
  ds, _, loss, _ = setup
  cfg = fedp3.make_config(jax.random.key(1), fedp3.layer_policy(
      jax.random.key(2), ds.train.num_clients, 3, "lowerb"), 0.7)
  with pytest.raises(ValueError, match="aggregation='attention'.*defines neither"):
    fjs.fedp3(loss, optax.sgd(0.1), cfg, aggregation="attention")
  with pytest.raises(ValueError, match="aggregation must be one of"):
    fjs.fedp3(loss, optax.sgd(0.1), cfg, aggregation="mean")
