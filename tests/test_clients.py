"""Size buckets: the same algorithm on bucketed data equals the padded run (clients permuted)."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjaxsparse.algorithms import proxskip as ps
from fedjaxsparse.clients import bucketize, map_clients
from fedjaxsparse.data import lognormal_partition, pack_clients
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
  np.testing.assert_array_equal(np.asarray(b.num_examples), sizes[b.order])
  assert [bk.max_examples for bk in b.buckets] == [int(np.asarray(bk.num_examples).max())
                                                   for bk in b.buckets]
  assert sum(bk.max_examples * bk.num_clients for bk in b.buckets) < data.x.shape[0] * \
      data.max_examples  # less padding
  out = map_clients(lambda w, d: jnp.sum(d.mask) * w, b, jnp.ones(12))
  np.testing.assert_array_equal(out, sizes[b.order])


@pytest.mark.parametrize("uplink", [False, True])
def test_bucketed_proxskip_equals_padded(data, uplink):
  """With an uplink compressor too: its per-client keys fold in the client's original id."""
  from fedjaxsparse import compressors as C
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
  chex.assert_trees_all_close(jax.tree.map(lambda a: a[b.order], s_pad.w), s_bkt.w,
                              rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_close(s_pad.server, s_bkt.server, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(i_pad.bits_up, i_bkt.bits_up)
  with pytest.raises(ValueError, match="num_buckets"):
    bucketize(data, 0)


def test_bucketed_ef_bv_equals_padded(data):
  from fedjaxsparse import compressors as C
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
