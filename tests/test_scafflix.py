"""Scafflix / i-Scaffnew / FLIX (seed 001 ch. 3) on strongly convex quadratics with closed-form
optima: convergence to the FLIX optimum x* = (Σ α_i² A_i)^{-1} Σ α_i² A_i x_i*, h_i → ∇f_i(x̃_i*),
Σ α_i h_i preserved, and the reductions (α = 1 and equal γ: ProxSkip; p = 1: GD on FLIX)."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjaxsparse.algorithms import proxskip as ps
from fedjaxsparse.algorithms.scafflix import (flix_sgd, i_scaffnew, local_optima,
                                              personalize, scafflix)
from fedjaxsparse.data import pack_clients
from fedjaxsparse.errors import ConfigError

L2 = 0.1
ALPHA = np.array([0.2, 0.5, 0.9, 1.0, 0.7], np.float32)


def loss(params, x, y, mask):
  r = x @ params["w"] - y
  return 0.5 * jnp.sum(mask * r ** 2) / jnp.sum(mask) + 0.5 * L2 * jnp.sum(params["w"] ** 2)


@pytest.fixture(scope="module")
def quad():
  rng = np.random.default_rng(0)
  n, m, d = 5, 12, 3
  x = rng.normal(size=(n * m, d)).astype(np.float32) * np.repeat(
      rng.uniform(0.5, 2.0, n), m)[:, None].astype(np.float32)  # different L_i
  y = (x @ rng.normal(size=d) + rng.normal(size=n * m)).astype(np.float32)
  data = pack_clients(x, y, np.split(np.arange(n * m), n))
  xs = np.asarray(data.x, np.float64)
  A = np.einsum("nmi,nmj->nij", xs, xs) / m + L2 * np.eye(d)
  c = np.linalg.solve(A, (np.einsum("nmi,nm->ni", xs, np.asarray(data.y, np.float64)) / m)[..., None])[..., 0]
  L = np.linalg.eigvalsh(A)[:, -1]
  a2A = (ALPHA.astype(np.float64) ** 2)[:, None, None] * A
  x_opt = np.linalg.solve(a2A.sum(0), np.einsum("nij,nj->i", a2A, c))
  x_tilde = ALPHA[:, None] * x_opt + (1 - ALPHA[:, None]) * c
  h_opt = np.einsum("nij,nj->ni", A, x_tilde - c)  # ∇f_i(x̃_i*)
  return dict(data=data, A=A, c=c, L=L, x_opt=x_opt, h_opt=h_opt,
              w0={"w": jnp.zeros(d, jnp.float32)})


def _run(algo, q, steps, key=0):
  state = algo.init(None, q["w0"], q["data"])
  step = jax.jit(algo.step)
  infos = []
  for t in range(steps):
    state, info = step(jax.random.key(key * 100_000 + t), state, q["data"])
    infos.append(info)
  return state, jax.tree.map(lambda *v: np.stack(v), *infos)


def test_local_optima_reach_the_closed_form(quad):
  opt = local_optima(loss, quad["w0"], quad["data"], lr=float(1 / quad["L"].max()),
                     tol=1e-5, max_steps=5000)
  np.testing.assert_allclose(opt.x_star["w"], quad["c"], atol=1e-4)
  assert np.all(np.asarray(opt.grad_norm) < 1e-5) and np.all(np.asarray(opt.steps) > 0)


def test_local_optima_by_sgd_approach_the_closed_form(quad):
  """Minibatch SGD (the chapter's pre-training of networks) with a fixed budget gets near
  x_i*; tol = 0 runs exactly max_steps steps."""
  opt = local_optima(loss, quad["w0"], quad["data"], lr=float(0.3 / quad["L"].max()), tol=0.0,
                     max_steps=3000, batch_size=12, key=jax.random.key(5))
  np.testing.assert_array_equal(opt.steps, 3000)
  err = np.linalg.norm(np.asarray(opt.x_star["w"]) - quad["c"], axis=1)
  assert np.all(err < 0.1 * np.linalg.norm(quad["c"], axis=1)), err


def test_scafflix_converges_to_the_flix_optimum(quad):
  x_star = {"w": jnp.asarray(quad["c"], jnp.float32)}
  algo = scafflix(loss, 1 / quad["L"], 0.3, ALPHA, x_star)
  state, info = _run(algo, quad, 3000)
  np.testing.assert_allclose(state.server["w"], quad["x_opt"], atol=2e-4)
  np.testing.assert_allclose(state.h["w"], quad["h_opt"], atol=2e-4)
  # Σ α_i h_i stays 0 (float32 round-off) while Σ h_i does not
  assert float(np.max(info.alpha_h_sum_norm)) < 1e-4
  assert float(np.linalg.norm(np.sum(quad["h_opt"], 0))) > 0.1
  # the personalised models are x̃_i* = α_i x* + (1 − α_i) x_i*
  tilde = personalize(state.server, x_star, jnp.asarray(ALPHA))
  np.testing.assert_allclose(tilde["w"], ALPHA[:, None] * quad["x_opt"]
                             + (1 - ALPHA[:, None]) * quad["c"], atol=2e-4)


def test_round_form_with_partial_participation_keeps_the_invariant(quad):
  x_star = {"w": jnp.asarray(quad["c"], jnp.float32)}
  algo = scafflix(loss, 1 / quad["L"], 0.3, ALPHA, x_star, form="round", cohort_size=2)
  state, info = _run(algo, quad, 400)
  assert float(np.max(info.alpha_h_sum_norm)) < 1e-4
  assert set(np.unique(info.bits_up)) == {2 * 32 * 3}  # two dense uploads of d = 3 per round
  start = np.linalg.norm(quad["x_opt"])
  assert np.linalg.norm(np.asarray(state.server["w"]) - quad["x_opt"]) < 0.05 * start


def test_equal_steps_and_no_personalization_is_proxskip(quad):
  gamma = float(1 / quad["L"].max())
  a, _ = _run(i_scaffnew(loss, gamma, 0.3), quad, 200)
  b, _ = _run(ps.proxskip(loss, gamma, 0.3), quad, 200)
  chex.assert_trees_all_close(a.server, b.server, rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_close(a.h, b.h, rtol=1e-5, atol=1e-5)
  assert int(a.comms) == int(b.comms) > 0


def test_p_one_is_gradient_descent_on_flix(quad):
  x_star = {"w": jnp.asarray(quad["c"], jnp.float32)}
  gammas = 1 / quad["L"]
  lr = float(1 / np.mean(ALPHA ** 2 / gammas))
  a, _ = _run(scafflix(loss, gammas, 1.0, ALPHA, x_star), quad, 50)
  b, _ = _run(flix_sgd(loss, lr, ALPHA, x_star), quad, 50)
  chex.assert_trees_all_close(a.server, b.params, rtol=1e-4, atol=1e-5)


def test_bad_arguments(quad):
  x_star = {"w": jnp.asarray(quad["c"], jnp.float32)}
  with pytest.raises(ConfigError, match="alpha_i"):
    scafflix(loss, 0.1, 0.3, np.array([0.0, 1, 1, 1, 1]), x_star).init(None, quad["w0"],
                                                                        quad["data"])
  with pytest.raises(ValueError, match="x_star"):
    scafflix(loss, 0.1, 0.3, 0.5).init(None, quad["w0"], quad["data"])
  with pytest.raises(ValueError, match="form='round'"):
    scafflix(loss, 0.1, 0.3, 0.5, x_star, cohort_size=2)
  with pytest.raises(ConfigError, match="p"):
    scafflix(loss, 0.1, 0.0, 0.5, x_star)


def test_personal_evaluation_uses_each_clients_own_model():
  """α = 1: every client uses the global model (= pooled evaluation); α → 0: client i uses
  its own x_i*, so the metric is the mean of the clients' own-model metrics."""
  from fedjaxsparse.algorithms.scafflix import make_personal_eval_fn
  from fedjaxsparse.evaluation import evaluate, evaluate_per_client
  from fedjaxsparse.models import softmax_regression
  rng = np.random.default_rng(0)
  x = rng.normal(size=(60, 4)).astype(np.float32)
  y = rng.integers(0, 3, 60).astype(np.int32)
  data = pack_clients(x, y, np.split(np.arange(60), 4))
  model = softmax_regression(4, 3)
  g = model.init(jax.random.key(0))
  own = jax.tree.map(lambda a: jnp.asarray(rng.normal(size=(4,) + a.shape), jnp.float32), g)
  glob = make_personal_eval_fn(model, own, 1.0)(g, data)
  chex.assert_trees_all_close(glob, evaluate(model, g, data), rtol=1e-6)
  personal = make_personal_eval_fn(model, own, 1e-7)(g, data)
  per = evaluate_per_client(model, own, data)
  np.testing.assert_allclose(personal["accuracy"], np.mean(per["accuracy"]), rtol=1e-5)
