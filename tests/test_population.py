"""Population state touched per cohort: host-resident equals device-resident bit for bit on
CPU; EF-BV with partial participation keeps h = mean h_i, leaves non-participants alone, and
with every client participating is EF-BV."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjaxsparse as fjs

population = fjs.runtime.population


@pytest.fixture(scope="module")
def problem():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(400, 6)).astype(np.float32)
  y = (x @ rng.normal(size=6) > 0).astype(np.float32)
  data = fjs.data.pack_clients(x, y, np.array_split(rng.permutation(400), 20))
  model = fjs.models.logistic_regression(6, l2=0.1)
  return data, model, fjs.models.make_loss(model), model.init(jax.random.key(0))


def test_host_resident_state_equals_device_resident_state_bitwise(problem):
  data, model, loss, w0 = problem
  algo = fjs.ef_bv_pp(loss, fjs.compressors.rand_k(6, 2), 0.5, 0.4, 0.4, cohort_size=5)
  key = jax.random.key(3)
  dev = fjs.run(population.on_device(algo), key, w0, data, data, num_rounds=15,
                eval_fn=fjs.evaluation.make_eval_fn(model), eval_every=5, progress=False)
  host = population.run_on_host(algo, key, w0, data, data, num_rounds=15,
                                eval_fn=fjs.evaluation.make_eval_fn(model), eval_every=5,
                                progress=False)
  chex.assert_trees_all_equal(jax.device_get(dev.state.server), jax.device_get(host.server))
  chex.assert_trees_all_equal(jax.device_get(dev.state.clients), host.clients)
  for table in ("rounds", "evals"):
    a, b = getattr(dev.history, table), getattr(host.history, table)
    for name in ("round", "loss", "uplink_bits") + (("accuracy",) if table == "evals" else ()):
      if name in a:
        np.testing.assert_array_equal(a[name], b[name])


def test_partial_participation_invariants(problem):
  """h = (1/n) Σ h_i after every round; one round changes exactly the cohort's h_i."""
  data, _, loss, w0 = problem
  algo = fjs.ef_bv_pp(loss, fjs.compressors.top_k(6, 3), 0.5, 1.0, 1.0, cohort_size=4)
  dev = population.on_device(algo)
  state = dev.init(jax.random.key(0), w0, data)
  step = jax.jit(dev.step)
  for t in range(6):
    before = state.clients
    state, info = step(jax.random.key(t), state, data)
    changed = np.flatnonzero(np.any(np.asarray(state.clients["w"] != before["w"]), axis=1))
    assert len(changed) <= 4
    if t == 0:
      assert len(changed) == 4  # every participant uploads a non-zero Top-3 gradient
    assert float(info.bits_up) == 4 * fjs.compressors.top_k(6, 3).bits(6)
    mean = jax.tree.map(lambda a: jnp.mean(a, 0), state.clients)
    chex.assert_trees_all_close(state.server.h, mean, atol=1e-6)


def test_full_participation_is_ef_bv(problem):
  data, _, loss, w0 = problem
  comp = fjs.compressors.top_k(6, 2)  # deterministic: the two runs' keys need not agree
  a = fjs.run(population.on_device(fjs.ef_bv_pp(loss, comp, 0.5, 0.3, 0.7, cohort_size=None)),
              jax.random.key(1), w0, data, num_rounds=20, progress=False)
  b = fjs.run(fjs.ef_bv(loss, comp, 0.5, 0.3, 0.7, h_init="zero"), jax.random.key(1), w0, data,
              num_rounds=20, progress=False, layout="padded")
  chex.assert_trees_all_close(a.state.server.x, b.state.x, rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_close(a.state.clients, b.state.h_clients, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(a.history.rounds["loss"], b.history.rounds["loss"], rtol=1e-5)


def test_residence_choice(problem, monkeypatch):
  data, _, loss, w0 = problem
  algo = fjs.ef_bv_pp(loss, fjs.compressors.top_k(6, 2), 0.5, 1.0, 1.0, cohort_size=4)
  assert population.state_bytes(algo, w0, data) == 20 * 6 * 4  # h_i: 6 float32 weights
  dev = jax.devices()[0]
  monkeypatch.setattr(type(dev), "memory_stats", lambda self: {"bytes_limit": 1000})
  assert population.choose_residence(algo, w0, data)[0] == "host"
  monkeypatch.setattr(type(dev), "memory_stats", lambda self: {"bytes_limit": 10**9})
  assert population.choose_residence(algo, w0, data)[0] == "device"
  with pytest.raises(ValueError, match="num_rounds"):
    population.run_on_host(algo, jax.random.key(0), w0, data, num_rounds=0)
  with pytest.raises(ValueError, match="residence"):
    population.run(algo, jax.random.key(0), w0, data, num_rounds=1, residence="disk")
  # "auto" under a small reported limit runs on the host: the same model as the device run
  monkeypatch.setattr(type(dev), "memory_stats", lambda self: {"bytes_limit": 1000})
  host = population.run(algo, jax.random.key(0), w0, data, num_rounds=3, progress=False)
  device = population.run(algo, jax.random.key(0), w0, data, num_rounds=3, progress=False,
                          residence="device")
  assert isinstance(host, population.HostRun)
  chex.assert_trees_all_equal(jax.device_get(host.server.x),
                              jax.device_get(device.state.server.x))
