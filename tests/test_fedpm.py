"""FedPM (seed 003's baseline, spec B.5): the server's θ is the clipped mean of the uploaded
binary masks (so c·θ is an integer inside the clip), d bits per upload, the deployed model
is W₀ masked by 1[θ ≥ ½], and the probabilistic mask learns on frozen random weights."""
import functools

import jax
import numpy as np
import pytest

import fedjaxsparse as fjs

C, CLIP = 6, 0.2   # all clients take part


@functools.lru_cache(maxsize=None)
def _problem():
  """Digits on C clients, an MLP's frozen random weights W₀, and FedPM with minibatches of
  128 and large score steps (test accuracy +0.22 to +0.42 after 30 rounds over the seeds 1-6
  of W₀)."""
  ds = fjs.data.digits(num_clients=C, seed=0)
  model = fjs.models.mlp((64,), 10, hidden=(128,))
  loss = fjs.models.make_loss(model)
  w0 = model.init(jax.random.key(1))  # frozen random weights
  algo = fjs.fedpm(loss, 200.0, epochs=3, batch_size=128, clip=CLIP)
  return ds, model, loss, w0, algo


def test_fedpm_round_invariants():
  """After one round: θ¹ = clip(mean of the c uploaded masks, ε, 1 − ε), d bits per upload,
  32·d per download, and the deployed model W₀ ⊙ 1[θ ≥ ½]."""
  ds, _, loss, w0, algo = _problem()
  d = sum(a.size for a in jax.tree.leaves(w0))
  state, info = jax.jit(lambda w: algo.step(jax.random.key(0), algo.init(None, w, ds.train),
                                            ds.train))(w0)
  for t in jax.tree.leaves(state.theta):
    t = np.asarray(t, np.float64)
    assert np.all((t >= CLIP - 1e-6) & (t <= 1 - CLIP + 1e-6))  # (float32)
    inside = (t > CLIP + 1e-6) & (t < 1 - CLIP - 1e-6)
    assert inside.any()
    np.testing.assert_allclose(C * t[inside], np.round(C * t[inside]), atol=1e-5)
  assert float(info.bits_up) == C * d and float(info.bits_down) == C * 32 * d
  for p, w, t in zip(jax.tree.leaves(state.params), jax.tree.leaves(w0),
                     jax.tree.leaves(state.theta)):
    np.testing.assert_array_equal(p, np.asarray(w) * (np.asarray(t) >= 0.5))
  with pytest.raises(ValueError, match="clip"):
    fjs.fedpm(loss, 0.1, clip=0.5)


@pytest.mark.integration   # a 30-round learning run
def test_fedpm_learns_on_frozen_random_weights():
  ds, model, _, w0, algo = _problem()
  params = jax.jit(lambda s: s.params)
  accuracy = jax.jit(lambda p, test: fjs.evaluation.evaluate(model, p, test)["accuracy"])
  # compiled at XLA's backend optimisation level 1, not the tests' 0: the 30 rounds then run
  # about 4× faster, for about 2 s more of compilation
  state = jax.jit(lambda w: algo.init(None, w, ds.train))(w0)
  step = jax.jit(algo.step, compiler_options={"xla_backend_optimization_level": 1})
  acc0 = float(accuracy(params(state), ds.test))
  losses = []
  for r in range(30):
    state, info = step(jax.random.key(r), state, ds.train)
    losses.append(float(info.loss))
  acc = float(accuracy(params(state), ds.test))
  assert acc > acc0 + 0.1 and np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.05, (acc0, acc)
