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
  params = jax.jit(lambda s: s.params)
  accuracy = jax.jit(lambda p, test: fjs.evaluation.evaluate(model, p, test)["accuracy"])
  d = sum(a.size for a in jax.tree.leaves(w0))
  # learning (slowly, as in the paper's table): all clients (c = 6), minibatches of 128 with
  # large score steps (test accuracy +0.22 to +0.42 after 30 rounds over the seeds 1-6 of W₀);
  # the round invariants are checked on its first round
  c, clip = 6, 0.2
  algo = fjs.fedpm(loss, 200.0, epochs=3, batch_size=128, clip=clip)
  # compiled at XLA's backend optimisation level 1, not the tests' 0: the 30 rounds then run
  # about 4× faster, for about 2 s more of compilation
  state = jax.jit(lambda w: algo.init(None, w, ds.train))(w0)
  step = jax.jit(algo.step, compiler_options={"xla_backend_optimization_level": 1})
  acc0 = float(accuracy(params(state), ds.test))
  losses = []
  for r in range(30):
    state, info = step(jax.random.key(r), state, ds.train)
    losses.append(float(info.loss))
    if r == 0:   # θ¹ = clip(mean of the c uploaded masks, ε, 1 − ε)
      for t in jax.tree.leaves(state.theta):
        t = np.asarray(t, np.float64)
        assert np.all((t >= clip - 1e-6) & (t <= 1 - clip + 1e-6))  # (float32)
        inside = (t > clip + 1e-6) & (t < 1 - clip - 1e-6)
        assert inside.any()
        np.testing.assert_allclose(c * t[inside], np.round(c * t[inside]), atol=1e-5)
      assert float(info.bits_up) == c * d and float(info.bits_down) == c * 32 * d
      for p, w, t in zip(jax.tree.leaves(params(state)), jax.tree.leaves(w0),
                         jax.tree.leaves(state.theta)):
        np.testing.assert_array_equal(p, np.asarray(w) * (np.asarray(t) >= 0.5))
  acc = float(accuracy(params(state), ds.test))
  assert acc > acc0 + 0.1 and np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.05, (acc0, acc)
  with pytest.raises(ValueError, match="clip"):
    fjs.fedpm(loss, 0.1, clip=0.5)
