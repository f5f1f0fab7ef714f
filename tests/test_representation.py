"""FedCR, FedSR(-FT) and FedPAC (fedjaxsparse.algorithms.fedcr, .fedsr, .fedpac; their shared
pieces in .representation): reductions to FedAvg,
the closed form of FedCR's class distributions, FedCR-OPU3's per-layer average, the exactness
of FedPAC's classifier-combination problem and the fine-tuning's frozen parts."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjaxsparse as fjs
from fedjaxsparse.algorithms import representation as R
from fedjaxsparse.data.federated import FederatedData
from fedjaxsparse.models.base import softmax_cross_entropy
from fedjaxsparse.models.split import fedcr_net, kl_normal, product_of_normals
from fedjaxsparse.ops.local import epoch_minibatch, epoch_steps

C, D_IN = 3, 6


def _data(n_clients=4, sizes=(7, 5, 9, 4), seed=0, same=False):
  rng = np.random.default_rng(seed)
  m = max(sizes)
  x = np.zeros((n_clients, m, D_IN), np.float32)
  y = np.zeros((n_clients, m), np.int32)
  mask = np.zeros((n_clients, m), np.float32)
  for i, s in enumerate(sizes):
    src = 0 if same else i
    r = np.random.default_rng(seed + src)
    x[i, :s] = r.normal(size=(s, D_IN))
    y[i, :s] = r.integers(0, C, size=s)
    mask[i, :s] = 1
  del rng
  return FederatedData(*jax.device_put((x, y, mask, np.asarray(sizes, np.int32))))


def _fedavg_reference(model, params, data, key_of_client, lr, epochs, batch):
  """FedAvg with epoch-based plain SGD, written out: every client runs its epoch minibatches
  (the library's epoch_minibatch order for its key) and the server takes the uniform mean."""
  net = model.as_model()

  def loss(p, x, y, m):
    ce = softmax_cross_entropy(net.apply(p, x), y)
    return jnp.sum(ce * m) / jnp.maximum(jnp.sum(m), 1.0)

  @jax.jit
  def schedule():   # every client's shuffling key and its number of steps
    return ([jax.random.split(key_of_client(i))[0] for i in range(data.num_clients)],
            epoch_steps(data.num_examples, batch, epochs))

  @jax.jit
  def sgd_step(p, k_order, di, t):
    g = jax.grad(loss)(p, *epoch_minibatch(k_order, di, batch, t))
    return jax.tree.map(lambda a, b: a - lr * b, p, g)

  k_orders, steps = schedule()
  steps = np.asarray(steps)
  rows = jax.tree.map(np.asarray, data)
  outs = []
  for i in range(data.num_clients):
    di = jax.tree.map(lambda a: a[i], rows)
    p = params
    for t in range(int(steps[i])):
      p = sgd_step(p, k_orders[i], di, np.int32(t))
    outs.append(jax.tree.map(np.asarray, p))
  return jax.tree.map(lambda *a: sum(a) / len(a), *outs)


def test_fedcr_and_fedsr_without_their_regularisers_are_fedavg():
  model = fedcr_net((D_IN,), C, 2, conv=(), dense=(5,))
  data = _data()
  params = model.init(jax.random.key(0))
  lr, epochs, batch = 0.3, 2, 3
  common = dict(samples=1, epochs=epochs, batch_size=batch, cohort_size=None, clip=None,
                deterministic=True)
  cr = fjs.algorithms.fedcr.fedcr(model, lr, beta=0.0, share_head=True, **common)
  sr = fjs.algorithms.fedsr.fedsr(model, lr, l2r=0.0, cmi=0.0, **common)
  key = jax.random.key(3)
  client_key = lambda i: fjs.sampling.client_keys(jax.random.split(key)[1], jnp.arange(4))[i]
  ref = _fedavg_reference(model, params, data, client_key, lr, epochs, batch)
  for algo in (cr, sr):
    state = algo.init(jax.random.key(1), params, data)
    state, info = jax.jit(algo.step)(key, state, data)
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(ref)):
      np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)
  # with the head shared, every client's model is the global one (no stale personal heads)
  state = cr.init(jax.random.key(1), params, data)
  state, _ = jax.jit(cr.step)(key, state, data)
  assert "head" not in state.clients
  for a, b in zip(jax.tree.leaves(state.personal["head"]), jax.tree.leaves(state.params["head"])):
    assert a.shape == (data.num_clients,) + b.shape
    np.testing.assert_array_equal(a, np.broadcast_to(b, a.shape))


def test_fedcr_class_distributions_are_the_product_of_every_examples_expert():
  """With a vanishing step the model does not move, so (one epoch, full participation, β₂ = 1)
  the global r(z|y=c) is the product of N(0, I) and every example's p(z|x) of class c — the
  clients' experts multiply out by associativity; β₂ = ½ moves half way from N(0, I)."""
  model = fedcr_net((D_IN,), C, 3, conv=(), dense=(5,))
  data = _data()
  params = model.init(jax.random.key(0))

  @jax.jit
  def experts(params, data):
    mu, sigma = jax.vmap(lambda x: model.representation(params["body"], x))(data.x)
    onehot = jax.nn.one_hot(data.y, C) * data.mask[..., None]                # [N, M, C]
    prec = 1.0 / jnp.square(sigma)
    tau = jnp.einsum("nmc,nmd->cd", onehot, prec)
    num = jnp.einsum("nmc,nmd->cd", onehot, mu * prec)
    return product_of_normals(tau, num, 1.0)

  want_mean, want_std = (np.asarray(a) for a in experts(params, data))
  for beta2 in (1.0, 0.5):
    algo = fjs.algorithms.fedcr.fedcr(model, 1e-30, beta=1e-3, beta2=beta2, samples=2, epochs=1, batch_size=4,
                   cohort_size=None)
    state = algo.init(jax.random.key(1), params, data)
    state, _ = jax.jit(algo.step)(jax.random.key(2), state, data)
    np.testing.assert_allclose(state.prior_mean, beta2 * want_mean, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(state.prior_std, (1 - beta2) + beta2 * want_std, rtol=1e-4)


@pytest.mark.integration   # FedCR-OPU3 rounds against a per-layer reference
def test_fedcr_opu3_averages_each_body_layer_over_the_clients_that_sent_it():
  model = fedcr_net((D_IN,), C, 2, conv=(), dense=(5, 4))
  data = _data()
  params = model.init(jax.random.key(0))
  kw = dict(samples=1, epochs=1, batch_size=4, cohort_size=None)
  every = np.ones((4, 3), bool)                       # layers fc1, fc2, projection
  some = np.array([[1, 0, 1], [1, 0, 0], [1, 0, 1], [1, 0, 0]], bool)
  key = jax.random.key(5)
  runs = {}
  for name, rows in (("plain", None), ("every", every), ("some", some)):
    algo = fjs.algorithms.fedcr.fedcr(model, 0.2, train_layers=rows, **kw)
    st = algo.init(jax.random.key(1), params, data)
    runs[name] = jax.jit(algo.step)(key, st, data)
  for a, b in zip(jax.tree.leaves(runs["plain"][0].params), jax.tree.leaves(runs["every"][0].params)):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
  plain, some_state = runs["plain"][0].params["body"], runs["some"][0].params["body"]
  for a, b in zip(jax.tree.leaves(params["body"]["fc2"]), jax.tree.leaves(some_state["fc2"])):
    np.testing.assert_array_equal(a, b)                  # nobody sent fc2
  for a, b in zip(jax.tree.leaves(plain["fc1"]), jax.tree.leaves(some_state["fc1"])):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)   # everybody sent fc1
  sizes = {k: sum(v.size for v in jax.tree.leaves(params["body"][k])) for k in params["body"]}
  floats = 4 * sizes["fc1"] + 2 * sizes["projection"]
  y, n = np.asarray(data.y), np.asarray(data.num_examples)
  seen = sum(len(set(y[i, :n[i]])) for i in range(4))
  assert float(runs["some"][1].bits_up) == 32.0 * (floats + 2 * 2 * seen)


def _kkt_gap(p, a):
  g = 2 * p @ a
  lam = np.min(g)
  return np.max(np.abs(g[a > 1e-6] - lam)), lam


def test_simplex_qp_solves_fedpacs_combination_problem():
  rng = np.random.default_rng(0)
  simplex_qp = jax.jit(fjs.algorithms.fedpac.simplex_qp, static_argnames="iterations")
  for m in (1, 3, 7):
    a_mat = rng.normal(size=(m, 2 * m))
    p = a_mat @ a_mat.T + np.diag(rng.uniform(0, 0.5, m))
    a = np.asarray(simplex_qp(p.astype(np.float32), iterations=2000), np.float64)
    assert np.all(a >= 0) and abs(a.sum() - 1) < 1e-5
    gap, lam = _kkt_gap(p, a)
    g = 2 * p @ a
    assert gap < 1e-3 * max(1.0, abs(lam)) and np.all(g >= lam - 1e-3 * max(1.0, abs(lam)))
  valid = np.array([True, False, True, True])
  p = np.eye(4, dtype=np.float32)
  np.testing.assert_allclose(simplex_qp(p, valid), [1 / 3, 0, 1 / 3, 1 / 3], atol=1e-5)
  v = np.array([0.2, 0.5, 0.3], np.float32)
  np.testing.assert_allclose(jax.jit(fjs.algorithms.fedpac.project_to_simplex)(v), v, atol=1e-7)


def test_fedpac_clients_with_the_same_data_all_get_the_mean_head():
  """Identical clients have identical statistics, so D_i = 0 and P = V·I: the combination
  weights are uniform and every head becomes the mean of the trained heads."""
  model = fedcr_net((D_IN,), C, 1, gaussian=False, conv=(), dense=(5,))
  data = _data(sizes=(6, 6, 6, 6), same=True)
  params = model.init(jax.random.key(0))
  kw = dict(epochs=1, batch_size=3, cohort_size=None)
  key = jax.random.key(4)
  apart = fjs.algorithms.fedpac.fedpac(model, 0.1, combine_heads=False, **kw)
  st = apart.init(jax.random.key(1), params, data)
  st1, _ = jax.jit(apart.step)(key, st, data)
  together = fjs.algorithms.fedpac.fedpac(model, 0.1, **kw)
  st2, info = jax.jit(together.step)(key, together.init(jax.random.key(1), params, data), data)
  heads1, heads2 = (jax.tree.map(np.asarray, st.heads) for st in (st1, st2))
  mean_head = jax.tree.map(lambda a: np.mean(a, 0), heads1)
  for trained, combined, mean in zip(jax.tree.leaves(heads1), jax.tree.leaves(heads2),
                                     jax.tree.leaves(mean_head)):
    assert float(np.max(np.abs(trained - trained[:1]))) > 1e-6   # they trained apart
    np.testing.assert_allclose(combined, np.broadcast_to(mean, combined.shape), rtol=1e-4,
                               atol=1e-6)
  assert bool(np.all(np.asarray(st2.has_centroid))) and np.isfinite(float(info.loss))


def test_fine_tuning_moves_only_the_parts_it_trains():
  model = fedcr_net((D_IN,), C, 2, conv=(), dense=(5,))
  data = _data()
  params = model.init(jax.random.key(0))
  personal = jax.tree.map(lambda a: np.broadcast_to(a, (4,) + a.shape), params)
  for trainable, moving in (("head", {"head"}), ("projection+head", {"head", "projection"})):
    out = jax.tree.map(np.asarray, R.fine_tune(model, personal, data, jax.random.key(1), lr=0.5,
                                               epochs=2, batch_size=3, trainable=trainable))
    for part in ("fc1", "projection"):
      same = all(np.array_equal(a, b) for a, b in
                 zip(jax.tree.leaves(personal["body"][part]), jax.tree.leaves(out["body"][part])))
      assert same == (part not in moving), (trainable, part)
    assert not all(np.array_equal(a, b) for a, b in
                   zip(jax.tree.leaves(personal["head"]), jax.tree.leaves(out["head"])))


def test_kl_normal_matches_its_closed_form_and_vanishes_at_equality():
  mq, sq = np.array([[0.3, -1.0]], np.float32), np.array([[0.5, 2.0]], np.float32)
  mp, sp = np.array([[0.0, 1.0]], np.float32), np.array([[1.0, 1.5]], np.float32)
  kl = jax.jit(kl_normal)
  want = sum(np.log(b / a) + (a * a + (c - d) ** 2) / (2 * b * b) - 0.5
             for a, b, c, d in zip([0.5, 2.0], [1.0, 1.5], [0.3, -1.0], [0.0, 1.0]))
  np.testing.assert_allclose(kl(mq, sq, mp, sp), [want], rtol=1e-6)
  np.testing.assert_allclose(kl(mq, sq, mq, sq), [0.0], atol=1e-7)


def test_bad_options_are_refused_by_name():
  g = fedcr_net((D_IN,), C, 2, conv=(), dense=(5,))
  det = fedcr_net((D_IN,), C, 2, gaussian=False, conv=(), dense=(5,))
  with pytest.raises(ValueError, match="beta2"):
    fjs.algorithms.fedcr.fedcr(g, 0.1, beta2=1.5)
  with pytest.raises(ValueError, match="Gaussian"):
    fjs.algorithms.fedcr.fedcr(det, 0.1)
  with pytest.raises(ValueError, match="deterministic"):
    fjs.algorithms.fedpac.fedpac(g, 0.1)
  with pytest.raises(ValueError, match="l2r_form"):
    fjs.algorithms.fedsr.fedsr(g, 0.1, l2r_form="cube")
  with pytest.raises(ValueError, match="samples"):
    fjs.algorithms.fedcr.fedcr(g, 0.1, deterministic=True, samples=3)
