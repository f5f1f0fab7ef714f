"""Size buckets: the same algorithm on bucketed data equals the padded run, in the original client
order; the automatic plan is the optimal cut and meets its waste bound."""
import functools
import itertools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import optax

import fedjaxsparse as fjs


@pytest.fixture(scope="module")
def data():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(600, 5)).astype(np.float32)
  y = (x @ rng.normal(size=5) + 0.1 * rng.normal(size=600)).astype(np.float32)
  return fjs.data.pack_clients(x, y, fjs.data.lognormal_partition(600, 12, 1.2, seed=0))


def test_bucketize_sorts_and_trims(data):
  b = fjs.runtime.clients.bucketize(data, 3)
  assert b.num_clients == 12
  sizes = np.asarray(data.num_examples)
  np.testing.assert_array_equal(np.asarray(b.num_examples), sizes)  # original order
  assert [bk.max_examples for bk in b.buckets] == [int(np.asarray(bk.num_examples).max())
                                                   for bk in b.buckets]
  assert sum(bk.max_examples * bk.num_clients for bk in b.buckets) < data.x.shape[0] * \
      data.max_examples  # less padding
  out = fjs.runtime.clients.map_clients(lambda w, d: jnp.sum(d.mask) * w, b, jnp.arange(12.0))
  np.testing.assert_array_equal(out, sizes * np.arange(12.0))  # each client its own argument


@pytest.mark.parametrize("uplink", [False, True])
def test_bucketed_proxskip_equals_padded(data, uplink):
  """With an uplink compressor too: its per-client keys fold in the client's original id."""
  model = fjs.models.linear_regression(5, l2=0.1)
  algo = fjs.sparse_proxskip(fjs.models.make_loss(model), 0.05, 0.5, 0.5,
                             **({"uplink": fjs.compressors.rand_k(6, 2)} if uplink else {}))
  w0 = model.init(jax.random.key(0))
  b = fjs.runtime.clients.bucketize(data, 4)
  s_pad = algo.init(None, w0, data)
  s_bkt = algo.init(None, w0, b)
  step = jax.jit(algo.step)
  for t in range(10):
    s_pad, i_pad = step(jax.random.key(t), s_pad, data)
    s_bkt, i_bkt = step(jax.random.key(t), s_bkt, b)
  chex.assert_trees_all_close(s_pad.w, s_bkt.w, rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_close(s_pad.server, s_bkt.server, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(i_pad.bits_up, i_bkt.bits_up)
  with pytest.raises(ValueError, match="num_buckets"):
    fjs.runtime.clients.bucketize(data, 0)


def test_bucketed_ef_bv_equals_padded(data):
  model = fjs.models.linear_regression(5, l2=0.1)
  algo = fjs.ef_bv(fjs.models.make_loss(model), fjs.compressors.rand_k(6, 2), 0.02, 0.3, 0.8)
  w0 = model.init(jax.random.key(0))
  b = fjs.runtime.clients.bucketize(data, 3)
  init, step = jax.jit(algo.init), jax.jit(algo.step)
  s_pad, s_bkt = init(None, w0, data), init(None, w0, b)
  for t in range(5):
    s_pad, _ = step(jax.random.key(t), s_pad, data)
    s_bkt, _ = step(jax.random.key(t), s_bkt, b)
  chex.assert_trees_all_close(s_pad.x, s_bkt.x, rtol=1e-5, atol=1e-6)


def test_plan_is_the_optimal_cut_and_meets_the_waste_bound():
  rng = np.random.default_rng(1)
  sizes = rng.integers(1, 60, 9)
  order = np.argsort(sizes, kind="stable")
  for b in (2, 3):  # forced to b buckets (max_waste 0): equal to the brute-force optimum
    groups = fjs.runtime.clients.plan_buckets(sizes, max_waste=0.0, max_buckets=b)
    brute = min(fjs.runtime.clients.padded_work(sizes, np.split(order, list(c)))
                for c in itertools.combinations(range(1, 9), b - 1))
    assert len(groups) == b and fjs.runtime.clients.padded_work(sizes, groups) == brute
    assert sorted(np.concatenate(groups).tolist()) == list(range(9))
  sizes = fjs.data.lognormal_sizes(20000, 500, 1.0, seed=0)
  groups = fjs.runtime.clients.plan_buckets(sizes, max_waste=0.25, max_buckets=32)
  waste = fjs.runtime.clients.padded_work(sizes, groups) / sizes.sum() - 1
  assert waste <= 0.25 and len(groups) < 32
  # the bound is out of reach
  capped = fjs.runtime.clients.plan_buckets(sizes, max_waste=0.25, max_buckets=4)
  assert len(capped) == 4 and (fjs.runtime.clients.padded_work(sizes, capped)
                               < fjs.runtime.clients.padded_work(sizes, [sizes.argsort()]))
  fewer = fjs.runtime.clients.plan_buckets(sizes, max_waste=0.0, max_buckets=len(groups) - 1)
  # the fewest buckets that do
  assert fjs.runtime.clients.padded_work(sizes, fewer) / sizes.sum() - 1 > 0.25


def test_auto_layout_keeps_equal_clients_padded(data):
  equal = jax.tree.map(lambda a: a, data._replace(
      mask=jnp.ones_like(data.mask), num_examples=jnp.full(12, data.max_examples, jnp.int32)))
  assert fjs.runtime.clients.auto_layout(equal) is equal
  assert isinstance(fjs.runtime.clients.auto_layout(data), fjs.runtime.clients.BucketedData)


def test_runner_buckets_by_itself_with_the_same_result(data):
  """run(layout="auto") buckets the unequal clients (compressor included) and computes what
  the padded run computes."""
  model = fjs.models.linear_regression(5, l2=0.1)
  algo = fjs.sparse_proxskip(fjs.models.make_loss(model), 0.05, 0.3, 0.5,
                             uplink=fjs.compressors.rand_k(6, 2))
  w0 = model.init(jax.random.key(0))
  kw = dict(num_rounds=30, progress=False)
  auto = fjs.run(algo, jax.random.key(3), w0, data, **kw)
  padded = fjs.run(algo, jax.random.key(3), w0, data, layout="padded", **kw)
  chex.assert_trees_all_close(auto.state.h, padded.state.h, rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_close(auto.state.server, padded.state.server, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(auto.history.rounds["uplink_bits"],
                             padded.history.rounds["uplink_bits"])


def _four_rounds(algos, w0, layouts):
  """Each algorithm's params after four rounds on its layout: each round of every algorithm
  in one program (the same steps as one jitted step per algorithm, compiled as one)."""
  states = [algo.init(None, w0, d) for algo, d in zip(algos, layouts)]
  step = jax.jit(lambda key, states, layouts: [
      algo.step(key, s, d)[0] for algo, s, d in zip(algos, states, layouts)])
  for t in range(4):
    states = step(jax.random.key(t), states, layouts)
  return [s.params for s in states]


@pytest.fixture(scope="module")
def small_data():
  """5 unequal clients (the strategies' tests: an unrolled program grows with the clients, and
  bitwise equality does not depend on their number). Under "unroll:3" the padded clients are
  one group of 3 plus a tail of 2, the cohort of 3 one group, each of the 3 buckets (2, 2
  and 1 clients) a tail alone; the runner's automatic buckets (4 and 1 clients) under
  "unroll:4": one group and a tail."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=(150, 5)).astype(np.float32)
  y = (x @ rng.normal(size=5) + 0.1 * rng.normal(size=150)).astype(np.float32)
  return fjs.data.pack_clients(x, y, fjs.data.lognormal_partition(150, 5, 1.2, seed=0))


@pytest.fixture(scope="module")
def vmap_rounds(small_data):
  """The ProxSkip kernel and FedAvg (partial participation: a gathered cohort; full: bucketed
  clients) on linear models, each with its layouts (padded, and bucketed where it can be) and
  the params after four rounds of each under vmap, shared by the strategies' tests."""
  data = small_data
  model = fjs.models.linear_regression(5, l2=0.1)
  loss = fjs.models.make_loss(model)
  w0 = model.init(jax.random.key(0))
  algos = [fjs.sparse_proxskip(loss, 0.05, 0.5, 0.5),
           fjs.fedavg(loss, optax.sgd(0.05), local_steps=2, batch_size=4, cohort_size=3),
           fjs.fedavg(loss, optax.sgd(0.05), local_steps=2)]
  cases = [(algo, layout) for algo in algos
           for layout in [data] + ([fjs.runtime.clients.bucketize(data, 3)]
                                   if algo.bucketable else [])]
  algos, layouts = zip(*cases)
  return w0, cases, _four_rounds(algos, w0, layouts)


@pytest.mark.parametrize("strategy", ["map", *(pytest.param(s, marks=pytest.mark.integration)
                                         for s in ("unroll", "unroll:3"))])   # margin: rounds
def test_every_strategy_computes_what_vmap_computes(vmap_rounds, small_data, strategy):
  """Linear models: bitwise equal to vmap on CPU, padded and bucketed, for the ProxSkip kernel
  and FedAvg (partial participation: a gathered cohort; full: bucketed clients)."""
  w0, cases, references = vmap_rounds
  assert len(cases) == 5
  algos, layouts = zip(*cases)
  results = _four_rounds(algos, w0, [fjs.runtime.clients.with_strategy(layout, strategy)
                                     for layout in layouts])
  for reference, params in zip(references, results):
    chex.assert_trees_all_equal(reference, params)
  with pytest.raises(ValueError, match="strategy"):
    fjs.runtime.clients.with_strategy(small_data, "unroll:0")


@pytest.mark.integration   # multi-round runs compared (the integration tier's kind), for the unit tier's margin
def test_runner_client_strategy_changes_nothing_but_speed(small_data):
  data = small_data
  model = fjs.models.linear_regression(5, l2=0.1)
  algo = fjs.sparse_proxskip(fjs.models.make_loss(model), 0.05, 0.3, 0.5, form="round")
  w0 = model.init(jax.random.key(0))
  a = fjs.run(algo, jax.random.key(1), w0, data, num_rounds=6, progress=False)
  b = fjs.run(algo, jax.random.key(1), w0, data, num_rounds=6, progress=False, clients="unroll:4")
  chex.assert_trees_all_equal(a.state.server, b.state.server)


@functools.lru_cache(maxsize=None)
def _cnn():
  """The convolutional clients' model, built once (its ``init`` compiles once per process)."""
  return fjs.models.cnn((12, 12, 1), 3, channels=(2, 3), dense=8, conv="xla")


def _cnn_fedavg(num_clients, local_steps, batch=4):
  rng = np.random.default_rng(0)
  n = num_clients * 6
  x = rng.random((n, 12, 12, 1)).astype(np.float32)
  y = rng.integers(0, 3, n).astype(np.int32)
  data = fjs.data.pack_clients(x, y, np.split(np.arange(n), num_clients))
  model = _cnn()
  algo = fjs.fedavg(fjs.models.make_loss(model), optax.sgd(0.1), local_steps=local_steps,
                    batch_size=batch)
  return algo, model, data


def test_count_primitive_counts_a_scan_body_length_times():
  w = jnp.ones((1, 1, 3, 3))  # OIHW
  conv = lambda x: jax.lax.conv_general_dilated(x, w, (1, 1), "SAME")
  x = jnp.ones((1, 1, 5, 5))
  loop = lambda x: jax.lax.scan(lambda c, _: (conv(c), None), x, None, length=4)[0]
  nested = lambda x: jax.lax.cond(True, lambda x: loop(conv(x)), lambda x: x, x)
  assert fjs.runtime.clients.count_primitive(jax.make_jaxpr(conv)(x), "conv_general_dilated") == 1
  assert fjs.runtime.clients.count_primitive(jax.make_jaxpr(loop)(x), "conv_general_dilated") == 4
  assert fjs.runtime.clients.count_primitive(jax.make_jaxpr(jax.jit(nested))(x),
                                             "conv_general_dilated") == 5


def test_automatic_strategy_rule(data, monkeypatch):
  """Linear clients: vmap. Convolutional clients on CPU: unroll, counting clients × local
  steps × convolutions per step; past the compile-time bound: vmap."""
  model = fjs.models.linear_regression(5, l2=0.1)
  algo = fjs.sparse_proxskip(fjs.models.make_loss(model), 0.05, 0.5, 0.5)
  assert fjs.runtime.clients.choose_strategy(algo, model.init(jax.random.key(0)), data) == (
      "vmap", "no convolutions")
  counts, runs = {}, {}
  for clients, steps in ((2, 1), (2, 3), (4, 1)):   # (4, 1) last: its trace is kept
    algo, model, d = runs[clients, steps] = _cnn_fedavg(clients, steps)
    strategy, reason = fjs.runtime.clients.choose_strategy(algo, model.init(jax.random.key(0)), d)
    assert strategy == "unroll"
    counts[clients, steps] = int(reason.split("(")[1].split()[0])
  assert counts[4, 1] == 2 * counts[2, 1] and counts[2, 3] == 3 * counts[2, 1]
  monkeypatch.setattr(fjs.runtime.clients, "MAX_UNROLLED_CONVS", counts[4, 1] - 1)
  algo, model, d = runs[4, 1]
  assert fjs.runtime.clients.choose_strategy(algo, model.init(jax.random.key(0)), d)[0] == "vmap"


def test_dot_flops_counts_a_loop_body_once():
  a, b = jnp.ones((3, 4)), jnp.ones((4, 5))
  mm = lambda a, b: a @ b
  loop = lambda a, b: jax.lax.fori_loop(0, 7, lambda i, c: c + mm(a, b), jnp.zeros((3, 5)))
  batched = jax.vmap(mm, in_axes=(0, None))
  assert fjs.runtime.clients.dot_flops(jax.make_jaxpr(mm)(a, b)) == 2 * 3 * 4 * 5
  assert fjs.runtime.clients.dot_flops(jax.make_jaxpr(loop)(a, b)) == 2 * 3 * 4 * 5
  assert fjs.runtime.clients.dot_flops(jax.make_jaxpr(batched)(jnp.ones((6, 3, 4)), b)) == (
      6 * 2 * 3 * 4 * 5)


def test_heavy_matrix_clients_run_map_on_cpu(monkeypatch):
  """The rule's second branch: a client step of at least MAP_MIN_FLOPS of matrix products runs
  "map" on CPU. FedAvg softmax regression (d inputs, k classes, batch B): a step's products are
  the forward x·W and the gradient xᵀ·g, 4·B·d·k per client (plus the server's average)."""
  num_clients, batch, d, k = 3, 8, 20, 4
  rng = np.random.default_rng(0)
  data = fjs.data.pack_clients(rng.random((num_clients * batch, d)).astype(np.float32),
                               rng.integers(0, k, num_clients * batch),
                               np.split(np.arange(num_clients * batch), num_clients))
  model = fjs.models.softmax_regression(d, k)
  algo = fjs.fedavg(fjs.models.make_loss(model), optax.sgd(0.1), local_steps=2,
                    batch_size=batch)
  params = model.init(jax.random.key(0))
  assert fjs.runtime.clients.choose_strategy(algo, params, data) == ("vmap", "no convolutions")
  closed, mapped = fjs.runtime.clients.traced_step(
      algo.step, jax.random.key(0), jax.eval_shape(algo.init, jax.random.key(0), params, data),
      data)
  per_client = fjs.runtime.clients.dot_flops(closed) / sum(mapped)
  assert 4 * batch * d * k <= per_client <= 1.5 * 4 * batch * d * k
  monkeypatch.setattr(fjs.runtime.clients, "MAP_MIN_FLOPS", per_client)
  assert fjs.runtime.clients.choose_strategy(algo, params, data)[0] == "map"
  monkeypatch.setattr(fjs.runtime.clients, "MAP_MIN_FLOPS", 1.01 * per_client)
  assert fjs.runtime.clients.choose_strategy(algo, params, data)[0] == "vmap"


def test_small_model_clients_whose_data_outgrows_the_cache_run_map_on_cpu(monkeypatch):
  """The rule's third branch: a small model (no heavy products) runs "map" on CPU when each
  client holds >= MAP_MIN_CLIENT_BYTES and one map_clients call maps >= MAP_MIN_MAPPED_BYTES
  (thresholds moved to the test's sizes; the byte count is the client's padded arrays)."""
  clients = fjs.runtime.clients
  n, rows, d = 3, 40, 281
  rng = np.random.default_rng(0)
  data = fjs.data.pack_clients(rng.random((n * rows, d)).astype(np.float32),
                               rng.random(n * rows).astype(np.float32),
                               np.split(np.arange(n * rows), n))
  each = (rows * d * 4 + rows * 4 + rows * 4 + 4)          # x, y, mask, num_examples
  assert clients.client_bytes(data) == each
  assert clients.client_bytes(clients.with_strategy(data, "map")) == each
  model = fjs.models.linear_regression(d)
  algo = fjs.sparse_proxskip(fjs.models.make_loss(model), 1e-3, 0.2, 0.9)
  params = model.init(jax.random.key(0))
  assert clients.choose_strategy(algo, params, data) == ("vmap", "no convolutions")
  monkeypatch.setattr(clients, "MAP_MIN_MAPPED_BYTES", n * each)
  strategy, why = clients.choose_strategy(algo, params, data)
  assert strategy == "map" and "KiB a client" in why
  monkeypatch.setattr(clients, "MAP_MIN_CLIENT_BYTES", each + 1)
  assert clients.choose_strategy(algo, params, data)[0] == "vmap"
  monkeypatch.setattr(clients, "MAP_MIN_CLIENT_BYTES", each)
  monkeypatch.setattr(clients, "MAP_MIN_MAPPED_BYTES", n * each + 1)
  assert clients.choose_strategy(algo, params, data)[0] == "vmap"


def test_unrolled_cnn_round_is_loop_free_and_computes_the_vmap_round():
  """Under "unroll" a FedAvg CNN round (clients and local steps written out) compiles to a
  program without any while loop or conditional, and equals the vmap round."""
  algo, model, data = _cnn_fedavg(2, 2)   # 2 clients × 2 local steps written out
  init_key, rounds_key = fjs.runtime.runner.split_run_key(jax.random.key(0))
  state = algo.init(init_key, model.init(jax.random.key(1)), data)
  chunk = fjs.runtime.runner.build_chunk(algo, 1)
  outs, looped = [], []
  for d in (data, fjs.runtime.clients.with_strategy(data, "unroll")):
    args = (rounds_key, state, jnp.int32(0), jnp.int32(1), d, None)
    traced = jax.jit(chunk).trace(*args)   # one trace: counted, then compiled and run
    looped.append(_convolutions_in_loops(traced.jaxpr))
    outs.append(traced.lower().compile()(*args)[0])
  assert looped[0] > 0  # vmap: the local steps are a loop around the convolutions
  assert looped[1] == 0
  chex.assert_trees_all_close(outs[0].params, outs[1].params, rtol=1e-5, atol=1e-6)


def _convolutions_in_loops(jaxpr) -> int:
  """Convolutions inside a while loop, a rolled scan or a cond of ``jaxpr``."""
  total = 0
  for eqn in getattr(jaxpr, "jaxpr", jaxpr).eqns:
    name, params = eqn.primitive.name, eqn.params
    rolled = name == "scan" and params["unroll"] is not True and params["unroll"] < params[
        "length"]
    subs = [v for value in params.values()
            for v in (value if isinstance(value, (tuple, list)) else (value,))
            if hasattr(v, "eqns") or hasattr(getattr(v, "jaxpr", None), "eqns")]
    for sub in subs:
      total += (fjs.runtime.clients.count_primitive(sub, "conv_general_dilated")
                if rolled or name in ("while", "cond") else _convolutions_in_loops(sub))
  return total
