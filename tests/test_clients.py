"""Size buckets: the same algorithm on bucketed data equals the padded run, in the original client
order; the automatic plan is the optimal cut and meets its waste bound."""
import itertools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjaxsparse.algorithms import proxskip as ps
from fedjaxsparse.runtime.clients import (BucketedData, auto_layout, bucketize, map_clients,
                                          padded_work, plan_buckets)
from fedjaxsparse.data import lognormal_partition, lognormal_sizes, pack_clients
from fedjaxsparse.models import linear_regression, make_loss


@pytest.fixture(scope="module")
def data():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(600, 5)).astype(np.float32)
  y = (x @ rng.normal(size=5) + 0.1 * rng.normal(size=600)).astype(np.float32)
  return pack_clients(x, y, lognormal_partition(600, 12, 1.2, seed=0))


def test_bucketize_sorts_and_trims(data):
  b = bucketize(data, 3)
  assert b.num_clients == 12
  sizes = np.asarray(data.num_examples)
  np.testing.assert_array_equal(np.asarray(b.num_examples), sizes)  # original order
  assert [bk.max_examples for bk in b.buckets] == [int(np.asarray(bk.num_examples).max())
                                                   for bk in b.buckets]
  assert sum(bk.max_examples * bk.num_clients for bk in b.buckets) < data.x.shape[0] * \
      data.max_examples  # less padding
  out = map_clients(lambda w, d: jnp.sum(d.mask) * w, b, jnp.arange(12.0))
  np.testing.assert_array_equal(out, sizes * np.arange(12.0))  # each client its own argument


@pytest.mark.parametrize("uplink", [False, True])
def test_bucketed_proxskip_equals_padded(data, uplink):
  """With an uplink compressor too: its per-client keys fold in the client's original id."""
  from fedjaxsparse.ops import compressors as C
  model = linear_regression(5, l2=0.1)
  algo = ps.sparse_proxskip(make_loss(model), 0.05, 0.5, 0.5,
                            **({"uplink": C.rand_k(6, 2)} if uplink else {}))
  w0 = model.init(jax.random.key(0))
  b = bucketize(data, 4)
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
    bucketize(data, 0)


def test_bucketed_ef_bv_equals_padded(data):
  from fedjaxsparse.ops import compressors as C
  from fedjaxsparse.algorithms.efbv import ef_bv
  model = linear_regression(5, l2=0.1)
  algo = ef_bv(make_loss(model), C.rand_k(6, 2), 0.02, 0.3, 0.8)
  w0 = model.init(jax.random.key(0))
  b = bucketize(data, 3)
  s_pad, s_bkt = algo.init(None, w0, data), algo.init(None, w0, b)
  for t in range(5):
    s_pad, _ = algo.step(jax.random.key(t), s_pad, data)
    s_bkt, _ = algo.step(jax.random.key(t), s_bkt, b)
  chex.assert_trees_all_close(s_pad.x, s_bkt.x, rtol=1e-5, atol=1e-6)


def test_plan_is_the_optimal_cut_and_meets_the_waste_bound():
  rng = np.random.default_rng(1)
  sizes = rng.integers(1, 60, 9)
  order = np.argsort(sizes, kind="stable")
  for b in (2, 3):  # forced to b buckets (max_waste 0): equal to the brute-force optimum
    groups = plan_buckets(sizes, max_waste=0.0, max_buckets=b)
    brute = min(padded_work(sizes, np.split(order, list(c)))
                for c in itertools.combinations(range(1, 9), b - 1))
    assert len(groups) == b and padded_work(sizes, groups) == brute
    assert sorted(np.concatenate(groups).tolist()) == list(range(9))
  sizes = lognormal_sizes(20000, 500, 1.0, seed=0)
  groups = plan_buckets(sizes, max_waste=0.25, max_buckets=32)
  waste = padded_work(sizes, groups) / sizes.sum() - 1
  assert waste <= 0.25 and len(groups) < 32
  capped = plan_buckets(sizes, max_waste=0.25, max_buckets=4)  # the bound is out of reach
  assert len(capped) == 4 and padded_work(sizes, capped) < padded_work(sizes, [sizes.argsort()])
  fewer = plan_buckets(sizes, max_waste=0.0, max_buckets=len(groups) - 1)
  assert padded_work(sizes, fewer) / sizes.sum() - 1 > 0.25  # the fewest buckets that do


def test_auto_layout_keeps_equal_clients_padded(data):
  equal = jax.tree.map(lambda a: a, data._replace(
      mask=jnp.ones_like(data.mask), num_examples=jnp.full(12, data.max_examples, jnp.int32)))
  assert auto_layout(equal) is equal
  assert isinstance(auto_layout(data), BucketedData)


def test_runner_buckets_by_itself_with_the_same_result(data):
  """run(layout="auto") buckets the unequal clients (compressor included) and computes what
  the padded run computes."""
  from fedjaxsparse.ops import compressors as C
  from fedjaxsparse.runtime.runner import run
  model = linear_regression(5, l2=0.1)
  algo = ps.sparse_proxskip(make_loss(model), 0.05, 0.3, 0.5, uplink=C.rand_k(6, 2))
  w0 = model.init(jax.random.key(0))
  kw = dict(num_rounds=30, progress=False)
  auto = run(algo, jax.random.key(3), w0, data, **kw)
  padded = run(algo, jax.random.key(3), w0, data, layout="padded", **kw)
  chex.assert_trees_all_close(auto.state.h, padded.state.h, rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_close(auto.state.server, padded.state.server, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(auto.history.rounds["uplink_bits"],
                             padded.history.rounds["uplink_bits"])


@pytest.mark.parametrize("strategy", ["map", "unroll", "unroll:5"])
def test_every_strategy_computes_what_vmap_computes(data, strategy):
  """Linear models: bitwise equal to vmap on CPU, padded and bucketed, for the ProxSkip kernel
  and FedAvg (partial participation: a gathered cohort; full: bucketed clients)."""
  import optax
  from fedjaxsparse.algorithms.fedavg import fedavg
  from fedjaxsparse.runtime.clients import with_strategy
  model = linear_regression(5, l2=0.1)
  loss = make_loss(model)
  w0 = model.init(jax.random.key(0))
  algos = [ps.sparse_proxskip(loss, 0.05, 0.5, 0.5),
           fedavg(loss, optax.sgd(0.05), local_steps=3, batch_size=4, cohort_size=5),
           fedavg(loss, optax.sgd(0.05), local_steps=2)]
  for algo in algos:
    layouts = [data] + ([bucketize(data, 3)] if algo.bucketable else [])
    for layout in layouts:
      states = []
      for d in (layout, with_strategy(layout, strategy)):
        s = algo.init(None, w0, d)
        for t in range(4):
          s, _ = jax.jit(algo.step)(jax.random.key(t), s, d)
        states.append(s.params)
      chex.assert_trees_all_equal(states[0], states[1])
  with pytest.raises(ValueError, match="strategy"):
    with_strategy(data, "unroll:0")
@pytest.mark.xla_default_emitters
def test_runner_client_strategy_changes_nothing_but_speed(data):
  from fedjaxsparse.runtime.runner import run
  model = linear_regression(5, l2=0.1)
  algo = ps.sparse_proxskip(make_loss(model), 0.05, 0.3, 0.5, form="round")
  w0 = model.init(jax.random.key(0))
  a = run(algo, jax.random.key(1), w0, data, num_rounds=6, progress=False)
  b = run(algo, jax.random.key(1), w0, data, num_rounds=6, progress=False, clients="unroll:4")
  chex.assert_trees_all_equal(a.state.server, b.state.server)


def _cnn_fedavg(num_clients, local_steps, batch=4):
  import optax
  from fedjaxsparse.algorithms.fedavg import fedavg
  from fedjaxsparse.models import cnn
  rng = np.random.default_rng(0)
  n = num_clients * 6
  x = rng.random((n, 12, 12, 1)).astype(np.float32)
  y = rng.integers(0, 3, n).astype(np.int32)
  data = pack_clients(x, y, np.split(np.arange(n), num_clients))
  model = cnn((12, 12, 1), 3, channels=(2, 3), dense=8, conv="xla")
  algo = fedavg(make_loss(model), optax.sgd(0.1), local_steps=local_steps, batch_size=batch)
  return algo, model, data


def test_count_primitive_counts_a_scan_body_length_times():
  from fedjaxsparse.runtime.clients import count_primitive
  w = jnp.ones((1, 1, 3, 3))  # OIHW
  conv = lambda x: jax.lax.conv_general_dilated(x, w, (1, 1), "SAME")
  x = jnp.ones((1, 1, 5, 5))
  loop = lambda x: jax.lax.scan(lambda c, _: (conv(c), None), x, None, length=4)[0]
  nested = lambda x: jax.lax.cond(True, lambda x: loop(conv(x)), lambda x: x, x)
  assert count_primitive(jax.make_jaxpr(conv)(x), "conv_general_dilated") == 1
  assert count_primitive(jax.make_jaxpr(loop)(x), "conv_general_dilated") == 4
  assert count_primitive(jax.make_jaxpr(jax.jit(nested))(x), "conv_general_dilated") == 5


def test_automatic_strategy_rule(data, monkeypatch):
  """Linear clients: vmap. Convolutional clients on CPU: unroll, counting clients × local
  steps × convolutions per step; past the compile-time bound: vmap."""
  from fedjaxsparse.runtime import clients as cl
  model = linear_regression(5, l2=0.1)
  algo = ps.sparse_proxskip(make_loss(model), 0.05, 0.5, 0.5)
  assert cl.choose_strategy(algo, model.init(jax.random.key(0)), data) == ("vmap",
                                                                          "no convolutions")
  counts = {}
  for clients, steps in ((2, 1), (4, 1), (2, 3)):
    algo, model, d = _cnn_fedavg(clients, steps)
    strategy, reason = cl.choose_strategy(algo, model.init(jax.random.key(0)), d)
    assert strategy == "unroll"
    counts[clients, steps] = int(reason.split("(")[1].split()[0])
  assert counts[4, 1] == 2 * counts[2, 1] and counts[2, 3] == 3 * counts[2, 1]
  monkeypatch.setattr(cl, "MAX_UNROLLED_CONVS", counts[4, 1] - 1)
  algo, model, d = _cnn_fedavg(4, 1)
  assert cl.choose_strategy(algo, model.init(jax.random.key(0)), d)[0] == "vmap"


def test_unrolled_cnn_round_is_loop_free_and_computes_the_vmap_round():
  """Under "unroll" a FedAvg CNN round (clients and local steps written out) compiles to a
  program without any while loop or conditional, and equals the vmap round."""
  from fedjaxsparse.runtime.clients import with_strategy
  from fedjaxsparse.runtime.runner import build_chunk, split_run_key
  algo, model, data = _cnn_fedavg(3, 2)
  init_key, rounds_key = split_run_key(jax.random.key(0))
  state = algo.init(init_key, model.init(jax.random.key(1)), data)
  chunk = build_chunk(algo, 1)
  outs, looped = [], []
  for d in (data, with_strategy(data, "unroll")):
    args = (rounds_key, state, jnp.int32(0), jnp.int32(1), d, None)
    looped.append(_convolutions_in_loops(jax.make_jaxpr(chunk)(*args)))
    outs.append(jax.jit(chunk)(*args)[0])
  assert looped[0] > 0  # vmap: the local steps are a loop around the convolutions
  assert looped[1] == 0
  chex.assert_trees_all_close(outs[0].params, outs[1].params, rtol=1e-5, atol=1e-6)


def _convolutions_in_loops(jaxpr) -> int:
  """Convolutions inside a while loop, a rolled scan or a cond of ``jaxpr``."""
  from fedjaxsparse.runtime.clients import count_primitive
  total = 0
  for eqn in getattr(jaxpr, "jaxpr", jaxpr).eqns:
    name, params = eqn.primitive.name, eqn.params
    rolled = name == "scan" and params["unroll"] is not True and params["unroll"] < params[
        "length"]
    subs = [v for value in params.values()
            for v in (value if isinstance(value, (tuple, list)) else (value,))
            if hasattr(v, "eqns") or hasattr(getattr(v, "jaxpr", None), "eqns")]
    for sub in subs:
      total += (count_primitive(sub, "conv_general_dilated")
                if rolled or name in ("while", "cond") else _convolutions_in_loops(sub))
  return total
