"""The client axis sharded over 4 fake CPU devices gives the same run as one device.

XLA_FLAGS must be set before jax starts, so the comparison runs in a fresh subprocess."""
import os
import subprocess
import sys
import textwrap
import pytest

pytestmark = pytest.mark.integration  # the integration tier (README: the test commands)

SCRIPT = textwrap.dedent("""
    import jax, numpy as np, optax
    assert jax.device_count() == 4, jax.devices()
    from fedjaxsparse.algorithms.fedavg import fedavg
    from fedjaxsparse.data.embedded import digits
    from fedjaxsparse.evaluation import make_eval_fn
    from fedjaxsparse.models import make_loss, softmax_regression
    from fedjaxsparse.runtime.runner import run
    from fedjaxsparse.runtime.sharding import CLIENT_AXIS, client_mesh, shard_clients

    ds = digits(num_clients=8, partition="dirichlet", alpha=0.5, seed=0)
    model = softmax_regression(64, 10)
    params = model.init(jax.random.key(0))
    results = {}
    for cohort in (None, 4):
      algo = fedavg(make_loss(model), optax.sgd(0.3), local_steps=3, batch_size=8,
                    cohort_size=cohort)
      out = []
      for mesh in (None, client_mesh(4)):
        res = run(algo, jax.random.key(1), params, ds.train, ds.test, num_rounds=10,
                  eval_fn=make_eval_fn(model), eval_every=5, mesh=mesh, progress=False)
        out.append(res)
      a, b = out
      for k in ("w", "b"):
        np.testing.assert_allclose(a.state.params[k], b.state.params[k], rtol=1e-5, atol=1e-6)
      np.testing.assert_allclose(a.history.rounds["loss"], b.history.rounds["loss"], rtol=1e-5)
      np.testing.assert_allclose(a.history.evals["accuracy"], b.history.evals["accuracy"],
                                 atol=1e-6)
    # Every client execution strategy on the sharded client axis computes the vmap run.
    algo = fedavg(make_loss(model), optax.sgd(0.3), local_steps=2, batch_size=8)
    ref = run(algo, jax.random.key(2), params, ds.train, num_rounds=3, progress=False,
              clients="vmap")
    for strategy in ("map", "unroll", "unroll:3"):
      res = run(algo, jax.random.key(2), params, ds.train, num_rounds=3, progress=False,
                clients=strategy, mesh=client_mesh(4))
      assert res.clients == strategy
      for k in ("w", "b"):
        np.testing.assert_allclose(ref.state.params[k], res.state.params[k], rtol=1e-5,
                                   atol=1e-6)
    mesh = client_mesh(4)
    sharded = shard_clients(ds.train, mesh, 8)
    assert sharded.x.sharding.spec[0] == CLIENT_AXIS
    assert len(sharded.x.addressable_shards) == 4
    assert sharded.x.addressable_shards[0].data.shape[0] == 2
    try:
      shard_clients(digits(num_clients=6, seed=0).train, mesh, 6)
      raise SystemExit("expected a divisibility error")
    except ValueError as e:
      assert "divisible" in str(e)
    print("SHARDING-OK")
""")


def test_four_fake_devices_match_one_device():
  flags = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
  env = dict(os.environ, XLA_FLAGS=flags,
             JAX_PLATFORMS="cpu")
  proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                        text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert "SHARDING-OK" in proc.stdout
