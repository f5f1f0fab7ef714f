"""FedPM (seed 003's baseline, spec B.5): the server's θ is the clipped mean of the uploaded
binary masks (so c·θ is an integer inside the clip), d bits per upload, the deployed model
is W₀ masked by 1[θ ≥ ½], and the probabilistic mask learns on frozen random weights."""
import jax
import numpy as np
import pytest

import fedjaxsparse as fjs


def test_fedpm_round_invariants_and_learning():
  ds = fjs.data.digits(num_clients=6, seed=0)
  model = fjs.models.mlp((64,), 10, hidden=(128,))
  loss = fjs.models.make_loss(model)
  w0 = model.init(jax.random.key(1))  # frozen random weights
  algo = fjs.fedpm(loss, 0.5, epochs=1, batch_size=32, cohort_size=4, clip=1e-3)
  state, step = algo.init(None, w0, ds.train), jax.jit(algo.step)
  params = jax.jit(lambda s: s.params)
  accuracy = jax.jit(lambda p, test: fjs.evaluation.evaluate(model, p, test)["accuracy"])
  d = sum(a.size for a in jax.tree.leaves(w0))
  state1, info = step(jax.random.key(0), state, ds.train)
  for t in jax.tree.leaves(state1.theta):
    t = np.asarray(t, np.float64)
    assert np.all((t >= 1e-3 - 1e-6) & (t <= 1 - 1e-3 + 1e-6))  # (float32)
    inside = (t > 1e-3 + 1e-6) & (t < 1 - 1e-3 - 1e-6)
    np.testing.assert_allclose(4 * t[inside], np.round(4 * t[inside]), atol=1e-5)
  assert float(info.bits_up) == 4 * d and float(info.bits_down) == 4 * 32 * d
  for p, w, t in zip(jax.tree.leaves(params(state1)), jax.tree.leaves(w0),
                     jax.tree.leaves(state1.theta)):
    np.testing.assert_array_equal(p, np.asarray(w) * (np.asarray(t) >= 0.5))
  # learning (slowly, as in the paper's table): all clients, large score steps
  algo = fjs.fedpm(loss, 50.0, epochs=3, batch_size=32, clip=0.2)
  # compiled at XLA's backend optimisation level 1, not the tests' 0: the 30 rounds then run
  # about 4× faster, for about 2 s more of compilation
  state = algo.init(None, w0, ds.train)
  step = jax.jit(algo.step, compiler_options={"xla_backend_optimization_level": 1})
  acc0 = float(accuracy(params(state), ds.test))
  losses = []
  for r in range(30):
    state, info = step(jax.random.key(r), state, ds.train)
    losses.append(float(info.loss))
  acc = float(accuracy(params(state), ds.test))
  assert acc > acc0 + 0.1 and np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.05, (acc0, acc)
  with pytest.raises(ValueError, match="clip"):
    fjs.fedpm(loss, 0.1, clip=0.5)
