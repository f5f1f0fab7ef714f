"""The DDSS workers axis sharded over 4 fake CPU devices gives the one-device result (layout
only). Runs in a subprocess: the device count must be set before jax starts."""
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration  # the integration tier (README: the test commands)

SCRIPT = r"""
import jax, numpy as np
jax.config.update("jax_enable_x64", True)
from fedjaxsparse.convex import screening as SC
from fedjaxsparse.algorithms import ddss as DD
from fedjaxsparse.data import sparse_rows as SR
from fedjaxsparse.runtime.sharding import client_mesh
assert len(jax.devices()) == 4
data, _ = SR.planted(n=300, p=800, density=0.01, support=5, seed=0)
prob = SC.make_problem(data, 0.3 * SC.lambda_max(data))
L = float(np.max(np.sum(np.asarray(data.val) ** 2, 1)))
out = []
for mesh in (None, client_mesh(4)):
  algo = DD.dis_ddss(prob, data, workers=8, step_size=0.5 / L, inner_steps=400, mesh=mesh)
  st = algo.init(None, np.zeros(800), data)
  step = jax.jit(algo.step)
  for s in range(3):
    st, info = step(jax.random.key(s), st, data)
  out.append((np.asarray(st.x), float(info.gap), float(st.floats_up)))
np.testing.assert_allclose(out[0][0], out[1][0], rtol=1e-10, atol=1e-12)
assert abs(out[0][1] - out[1][1]) <= 1e-10 * max(1.0, out[0][1]) and out[0][2] == out[1][2]
print("DDSS-SHARDING-OK")
"""


def test_workers_sharded_over_four_devices_match_one_device():
  flags = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
  env = dict(os.environ, XLA_FLAGS=flags,
             JAX_PLATFORMS="cpu")
  proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                        text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert "DDSS-SHARDING-OK" in proc.stdout
