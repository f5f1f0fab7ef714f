"""The Sparse-ProxSkip family (seed 000): the zero-sum invariant and its violations, exact
reductions, convergence to the closed-form optimum, sparsity and bit counts, and the
equivalence of the iteration and round forms."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjaxsparse as fjs

L2 = 0.1
DIM = 8


@pytest.fixture(scope="module")
def problem():
  ds = fjs.data.ridge_regression_problem(num_clients=6, dim=DIM, examples_per_client=20,
                                         heterogeneity=2.0, seed=0)
  model = fjs.models.linear_regression(DIM, l2=L2)
  return ds, model, fjs.models.make_loss(model)


def _x64(tree):
  return jax.tree.map(lambda a: jax.device_put(np.asarray(a, np.float64)
                                               if np.asarray(a).dtype.kind == "f"
                                               else np.asarray(a)), tree)


def _zeros64(model):
  """The model's parameters, all zero, in float64."""
  return jax.tree.map(lambda a: jax.device_put(np.zeros(a.shape, np.float64)),
                      jax.eval_shape(lambda: model.init(jax.random.key(0))))


def _shifted(model, c):
  """The model's initial parameters plus ``c``, on the host (float32, no program compiled)."""
  return jax.tree.map(lambda a: np.asarray(a) + np.float32(c), model.init(jax.random.key(0)))


def _sum_h(state):
  return jax.tree.map(lambda a: np.sum(np.asarray(a), 0), state.h)


def _flat(tree):
  return np.concatenate([np.ravel(np.asarray(v)) for v in jax.tree.leaves(tree)])


def _iterate(algo, state, data, n, seed=0):
  step = jax.jit(algo.step)
  out = []
  for t in range(n):
    prev = state
    state, info = step(jax.random.key(seed * 100000 + t), state, data)
    out.append((prev, state, info))
  return state, out


ZERO_SUM = {
    "proxskip": lambda loss: fjs.proxskip(loss, 0.02, 0.3),
    "sparse_proxskip": lambda loss: fjs.sparse_proxskip(loss, 0.02, 0.3, 0.5),
    "sparse_proxskip_local": lambda loss: fjs.sparse_proxskip_local(loss, 0.02, 0.3, 0.5),
    "asp_modified": lambda loss: fjs.accelerated_server_pruning_modified(loss, 0.02, 0.3, 0.5),
}


@pytest.mark.parametrize("name", sorted(ZERO_SUM))
def test_control_variates_keep_summing_to_zero(problem, name):
  ds, model, loss = problem
  algo = ZERO_SUM[name](loss)
  state = algo.init(jax.random.key(0), model.init(jax.random.key(0)), ds.train)
  state, trace = _iterate(algo, state, ds.train, 150)
  comms = sum(float(i.communicated) for _, _, i in trace)
  assert 20 < comms < 80  # p = 0.3
  for _, s, info in trace:
    scale = 1e-5 * max(1.0, float(info.mean_h_norm) * 6)
    assert float(info.sum_h_norm) <= scale
  assert float(trace[-1][2].mean_h_norm) > 1e-2  # the h_i themselves are far from zero


def test_asp_and_sps_modified_drift_by_the_exact_formula(problem):
  ds, model, loss = problem
  gamma, p, s = 0.02, 0.5, 0.5
  n = ds.num_clients
  for name, algo in (("asp", fjs.accelerated_server_pruning(loss, gamma, p, s)),
                     ("sps_mod", fjs.sparse_proxskip_modified(loss, gamma, p, s))):
    kernel = fjs.algorithms.proxskip.proxskip_kernel(
        loss, gamma, p, upload_prox=fjs.proxes.top_k(sparsity=s) if name == "sps_mod" else None,
        write_back=name != "sps_mod", server_prox=fjs.proxes.top_k(sparsity=s) if name == "asp" else None)
    state = algo.init(jax.random.key(0), model.init(jax.random.key(0)), ds.train)

    @jax.jit
    def communicated(key, state, data):
      """One communicating iteration, with the top-K of the average (ASP) or of every
      client's ŵ_i (SPS-modified) that the formula needs."""
      w_hat, _ = kernel.local_step(key, state, data)
      new, _ = kernel.communicate(state, w_hat)
      if name == "asp":
        w_bar = jax.tree.map(lambda a: jnp.mean(a, 0), w_hat)
        return new, w_hat, (w_bar, fjs.sparsity.top_k(w_bar, sparsity=s))
      return new, w_hat, jax.vmap(lambda w: fjs.sparsity.top_k(w, sparsity=s))(w_hat)

    drift = []
    for t in range(5):
      new, w_hat, pruned = communicated(jax.random.key(t), state, ds.train)
      delta = _flat(_sum_h(new)) - _flat(_sum_h(state))
      if name == "asp":
        w_bar, top = pruned
        expected = (p * n / gamma) * (_flat(top) - _flat(w_bar))
      else:
        pruned, w_hat = jax.tree.map(np.asarray, (pruned, w_hat))
        expected = (p / gamma) * np.sum(
            np.stack([_flat(jax.tree.map(lambda a, b: a[i] - b[i], pruned, w_hat))
                      for i in range(n)]), 0)
      np.testing.assert_allclose(delta, expected, rtol=1e-4, atol=1e-3)
      drift.append(np.linalg.norm(_flat(_sum_h(new))))
      state = new
    assert drift[-1] > 1.0  # Σh really leaves zero


def test_p_equal_one_is_gradient_descent_on_the_average(problem):
  ds, model, loss = problem
  gamma = 0.02
  algo = fjs.proxskip(loss, gamma, 1.0)
  w0 = model.init(jax.random.key(0))
  state = algo.init(jax.random.key(0), w0, ds.train)
  grad_i = jax.jit(jax.vmap(jax.grad(loss), in_axes=(None, 0, 0, 0)))
  step = jax.jit(algo.step)
  w = jax.tree.map(np.asarray, w0)
  for t in range(5):
    state, info = step(jax.random.key(t), state, ds.train)
    g = jax.tree.map(np.asarray, grad_i(w, ds.train.x, ds.train.y, ds.train.mask))
    g_bar = jax.tree.map(lambda a: np.mean(a, 0), g)
    w = jax.tree.map(lambda a, b: a - gamma * b, w, g_bar)
    chex.assert_trees_all_close(state.server, w, rtol=1e-5, atol=1e-6)
    # After the step h_i = ∇f_i(w_prev) − ∇f(w_prev) (pure algebra of L6, L10, L12).
    w_prev = jax.tree.map(lambda a, b: a + gamma * b, w, g_bar)
    g_prev = jax.tree.map(np.asarray, grad_i(w_prev, ds.train.x, ds.train.y, ds.train.mask))
    g_prev_bar = jax.tree.map(lambda a: np.mean(a, 0, keepdims=True), g_prev)
    chex.assert_trees_all_close(state.h, jax.tree.map(np.subtract, g_prev, g_prev_bar),
                                rtol=1e-4, atol=1e-4)
    assert float(info.communicated) == 1.0


def _smoothness_and_mu(train, l2):
  x = np.asarray(train.x, np.float64)
  m = np.asarray(train.mask, np.float64)
  n = np.asarray(train.num_examples, np.float64)
  xb = np.concatenate([x, np.ones(x.shape[:2] + (1,))], -1) * m[..., None]
  hs = [xb[i].T @ xb[i] / n[i] + l2 * np.diag([1.0] * DIM + [0]) for i in range(len(n))]
  l_max = max(np.linalg.eigvalsh(h).max() for h in hs)
  mu = np.linalg.eigvalsh(sum(hs) / len(hs)).min()
  return l_max, mu


def test_proxskip_converges_linearly_to_the_ridge_optimum_with_fewer_communications(problem):
  ds, _, _ = problem
  l2 = 1.0
  model = fjs.models.linear_regression(DIM, l2=l2)
  loss = fjs.models.make_loss(model)
  lmax, mu = _smoothness_and_mu(ds.train, l2)
  opt = fjs.data.ridge_regression_optimum(ds.train, l2, fjs.data.uniform_weights(ds.train))
  gamma = 1.0 / lmax
  p = float(np.sqrt(mu / lmax))  # ProxSkip's optimal p = 1/sqrt(κ)

  def comms_to_reach(algo, iterations, on_chunk=None):
    with jax.enable_x64(True):
      data = _x64(ds.train)
      w0 = _zeros64(model)
      res = fjs.run(algo, jax.random.key(1), w0, data, num_rounds=iterations, chunk_size=500,
                    progress=False, on_chunk=on_chunk)
      err = np.linalg.norm(_flat(res.state.server) - _flat(opt)) / np.linalg.norm(_flat(opt))
      return err, int(res.state.comms), res

  servers = {}   # the server model after every 500-iteration chunk of the ProxSkip run
  err_ps, comms_ps, res = comms_to_reach(
      fjs.proxskip(loss, gamma, p), 5000,
      on_chunk=lambda r, state, _: servers.update({r: _flat(state.server)}))
  assert err_ps < 1e-6
  err_gd, comms_gd, _ = comms_to_reach(fjs.proxskip(loss, gamma, 1.0), 5000)
  # GD (p = 1) communicates every iteration; ProxSkip needs far fewer communications.
  assert lmax / mu > 50  # the ill-conditioned regime where acceleration matters
  assert comms_ps < 0.3 * comms_gd
  # Linear convergence: the error at the end of the run is below the error halfway.
  err_half = np.linalg.norm(servers[2500] - _flat(opt)) / np.linalg.norm(_flat(opt))
  assert err_ps < 1e-2 * err_half


def test_fixed_point_and_the_zero_sum_argument(problem):
  ds, model, loss = problem
  gamma = 0.02
  opt = jax.tree.map(lambda a: np.asarray(a, np.float32),
                     fjs.data.ridge_regression_optimum(ds.train, L2,
                                                       fjs.data.uniform_weights(ds.train)))
  grads = jax.tree.map(np.asarray, jax.jit(jax.vmap(jax.grad(loss), in_axes=(None, 0, 0, 0)))(
      opt, ds.train.x, ds.train.y, ds.train.mask))
  n = ds.num_clients
  # (w_i = w*, h_i = ∇f_i(w*)) is a fixed point of dense ProxSkip for any coin.
  algo = fjs.proxskip(loss, gamma, 0.5)
  state = algo.init(jax.random.key(0), opt, ds.train)._replace(h=grads)
  for t in range(6):
    state, _ = jax.jit(algo.step)(jax.random.key(t), state, ds.train)
  chex.assert_trees_all_close(state.server, opt, atol=1e-4)
  # With Σh ≠ 0 and p = 1, one step moves the server model to w* + (γ/N) Σ_i h_i
  # (seed 000 §3.4 with the spec's corrected sign and γ).
  shift = jax.tree.map(lambda a: np.ones_like(a[:1]) * np.arange(n, dtype=a.dtype).reshape(
      (n,) + (1,) * (a.ndim - 1)) * np.float32(0.1), grads)
  h = jax.tree.map(np.add, grads, shift)
  gd = fjs.proxskip(loss, gamma, 1.0)
  s0 = gd.init(jax.random.key(0), opt, ds.train)._replace(h=h)
  s1, _ = jax.jit(gd.step)(jax.random.key(0), s0, ds.train)
  expected = jax.tree.map(lambda w, sh: w + gamma / n * np.sum(sh, 0), opt, shift)
  chex.assert_trees_all_close(s1.server, expected, atol=1e-4)
  assert np.abs(_flat(s1.server) - _flat(opt)).max() > 1e-3


def test_sparsity_of_messages_and_models_and_bits(problem):
  ds, model, loss = problem
  d = DIM + 1
  s = 0.6
  k = fjs.sparsity.k_from_sparsity(d, s)
  n = ds.num_clients
  algo = fjs.sparse_proxskip(loss, 0.02, 1.0, s, encoding="indices")
  state = algo.init(jax.random.key(0), _shifted(model, 0.3), ds.train)
  nnz, nnz_each = jax.jit(fjs.accounting.nnz), jax.jit(jax.vmap(fjs.accounting.nnz))
  for t in range(4):
    state, info = jax.jit(algo.step)(jax.random.key(t), state, ds.train)
    assert float(info.upload_nnz) == k  # exactly K non-zeros in every upload
    assert int(nnz(state.server)) <= min(d, n * k)
    assert float(info.bits_up) == n * k * (32 + fjs.accounting.index_bits(d))
    w_local = np.asarray(nnz_each(state.w))
    assert int(w_local.max()) <= min(d, n * k)
  # Sparse-ProxSkip-Local: every local iterate has at most K non-zeros.
  local = fjs.sparse_proxskip_local(loss, 0.02, 0.2, s)
  st = local.init(jax.random.key(0), model.init(jax.random.key(0)), ds.train)
  for t in range(10):
    st, info = jax.jit(local.step)(jax.random.key(t), st, ds.train)
    if float(info.communicated) == 0:
      assert int(np.asarray(nnz_each(st.w)).max()) <= k
def test_zero_sparsity_variants_equal_proxskip(problem):
  ds, model, loss = problem
  w0 = _shifted(model, 0.1)
  ref, _ = _iterate(fjs.proxskip(loss, 0.02, 0.3),
                    fjs.proxskip(loss, 0.02, 0.3).init(None, w0, ds.train), ds.train, 20)
  for make in (fjs.sparse_proxskip, fjs.sparse_proxskip_local, fjs.accelerated_server_pruning):
    algo = make(loss, 0.02, 0.3, 0.0)  # K = d
    st, _ = _iterate(algo, algo.init(None, w0, ds.train), ds.train, 20)
    chex.assert_trees_all_equal(st.w, ref.w)
    chex.assert_trees_all_equal(st.h, ref.h)


def test_round_form_equals_iteration_form_on_a_fixed_coin_sequence(problem):
  ds, model, loss = problem
  gamma, p = 0.02, 0.3
  kernel = fjs.algorithms.proxskip.proxskip_kernel(loss, gamma, p,
                                                   upload_prox=fjs.proxes.top_k(sparsity=0.5))
  w0 = model.init(jax.random.key(0))
  state = kernel.init(None, w0, ds.train)
  local_step, communicate = jax.jit(kernel.local_step), jax.jit(kernel.communicate)
  # Iteration form driven by the coins 0, 0, 1, 0, 1 ...
  it = state
  for theta in (0, 0, 1, 0, 1):
    w_hat, _ = local_step(jax.random.key(0), it, ds.train)
    it = communicate(it, w_hat)[0] if theta else kernel.skip(it, w_hat)
  # ... equals rounds of L = 3 and L = 2 local steps each followed by a communication.
  rd = state
  for length in (3, 2):
    for j in range(length):
      w_hat, _ = local_step(jax.random.key(0), rd, ds.train)
      if j < length - 1:
        rd = kernel.skip(rd, w_hat)
    rd = communicate(rd, w_hat)[0]
  chex.assert_trees_all_close(it.w, rd.w)
  chex.assert_trees_all_close(it.h, rd.h)
  # The round-form algorithm runs and communicates every step, with Geometric(p) lengths.
  algo = fjs.meta_sparse_proxskip(loss, gamma, p, form="round")
  st = algo.init(None, w0, ds.train)
  st, info = jax.jit(algo.step)(jax.random.key(3), st, ds.train)
  assert float(info.communicated) == 1.0 and int(st.t) == int(info.local_steps) >= 1


def test_geometric_local_steps_and_coin_frequency():
  p, trials = 0.2, 20000
  lengths = jax.jit(lambda key: jax.vmap(
      lambda k: fjs.algorithms.proxskip.geometric_local_steps(k, p))(
          jax.random.split(key, trials)))(jax.random.key(0))
  lengths = np.asarray(lengths)
  assert lengths.min() >= 1
  se = np.sqrt((1 - p) / p ** 2 / trials)  # std of Geometric(p) is sqrt(1-p)/p
  assert abs(lengths.mean() - 1 / p) < 5 * se
  # P(L = 1) = p
  assert abs((lengths == 1).mean() - p) < 5 * np.sqrt(p * (1 - p) / trials)


def test_fedht_and_fediht_sparsity(problem):
  ds, model, loss = problem
  d, s = DIM + 1, 0.6
  k = fjs.sparsity.k_from_sparsity(d, s)
  w0 = _shifted(model, 0.2)
  ht = fjs.fedht(loss, 0.02, 3, s)
  st = ht.init(None, w0, ds.train)
  for t in range(3):
    st, info = jax.jit(ht.step)(jax.random.key(t), st, ds.train)
    assert int(fjs.accounting.nnz(st.params)) <= k  # the server prunes the average
  iht = fjs.fediht(loss, 0.02, 3, s)
  st = iht.init(None, w0, ds.train)
  st, info = jax.jit(iht.step)(jax.random.key(0), st, ds.train)
  n = ds.num_clients
  assert float(info.bits_up) <= n * fjs.accounting.sparse_bits(k, d)  # K-sparse uploads
  assert k < int(fjs.accounting.nnz(st.params)) <= min(d, n * k)  # the average is denser


@pytest.mark.parametrize("kw, match", [
    (dict(gamma=0.0, p=0.5), "gamma"),
    (dict(gamma=0.1, p=0.0), "p \\(communication"),
    (dict(gamma=0.1, p=1.5), "p \\(communication"),
])
def test_bad_arguments(problem, kw, match):
  _, _, loss = problem
  with pytest.raises(ValueError, match=match):
    fjs.proxskip(loss, **kw)
  with pytest.raises(ValueError, match="sparsity"):
    fjs.sparse_proxskip(loss, 0.1, 0.5, 1.0)


def test_randprox_l1_equals_the_primal_dual_randprox_iteration(problem):
  """RandProx (Condat & Richtárik) written with dual variables u_i for the consensus
  constraint, g = λ‖·‖₁ and R = Bernoulli(p)/p, against our ProxSkip-with-soft-threshold."""
  ds, model, loss = problem
  gamma, p, lam = 0.02, 0.4, 0.5
  algo = fjs.randprox_l1(loss, gamma, p, lam)
  w0 = _shifted(model, 0.3)
  state = algo.init(None, w0, ds.train)
  grad_i = jax.vmap(jax.grad(loss))
  n = ds.num_clients
  x = jax.tree.map(lambda a: np.broadcast_to(np.asarray(a), (n,) + a.shape), w0)
  u = jax.tree.map(np.zeros_like, x)
  tau, omega = p / gamma, 1 / p - 1
  st = lambda v, t: jnp.sign(v) * jnp.maximum(jnp.abs(v) - t, 0)

  @jax.jit
  def primal_dual(x, u, theta, data):
    g = grad_i(x, data.x, data.y, data.mask)
    x_hat = jax.tree.map(lambda a, gi, ui: st(a - gamma * gi - gamma * ui, gamma * lam), x, g, u)
    v = jax.tree.map(lambda ui, xh: ui + tau * xh, u, x_hat)
    prox_conj = jax.tree.map(lambda a: a - jnp.mean(a, 0, keepdims=True), v)  # prox_{τψ*}
    u_new = jax.tree.map(lambda ui, pc: ui + theta / p * (pc - ui) / (1 + omega), u, prox_conj)
    x = jax.tree.map(lambda xh, un, ui: xh - gamma * (1 + omega) * (un - ui), x_hat, u_new, u)
    return x, u_new

  step = jax.jit(algo.step)
  for t in range(12):
    key = jax.random.key(t)
    state, info = step(key, state, ds.train)
    theta = float(info.communicated)
    x, u = primal_dual(x, u, np.float32(theta), ds.train)
    chex.assert_trees_all_close(state.w, x, rtol=1e-4, atol=1e-5)
    chex.assert_trees_all_close(state.h, jax.tree.map(np.negative, jax.tree.map(np.asarray, u)),
                                rtol=1e-4, atol=1e-4)


def test_randprox_l1_reaches_the_federated_lasso_solution(problem):
  ds, _, _ = problem
  l2, lam = 1.0, 0.3
  model = fjs.models.linear_regression(DIM, l2=l2)
  loss = fjs.models.make_loss(model)
  lmax, mu = _smoothness_and_mu(ds.train, l2)
  gamma = 1.0 / lmax
  with jax.enable_x64(True):
    data = _x64(ds.train)
    w0 = _zeros64(model)
    # Reference: proximal gradient (ISTA) on (1/N) Σ f_i + λ‖θ‖₁ over all parameters (the
    # bias too, as for Top-K), to convergence.
    grad = jax.grad(lambda w, data: jnp.mean(jax.vmap(loss, in_axes=(None, 0, 0, 0))(
        w, data.x, data.y, data.mask)))
    soft = lambda v: jnp.sign(v) * jnp.maximum(jnp.abs(v) - gamma * lam, 0)

    @jax.jit
    def ista(w, data):
      step = lambda _, r: jax.tree.map(lambda a, g: soft(a - gamma * g), r, grad(r, data))
      return jax.lax.fori_loop(0, 5000, step, w)

    ref = ista(w0, data)
    res = fjs.run(fjs.randprox_l1(loss, gamma, float(np.sqrt(mu / lmax)), lam), jax.random.key(0),
                  w0, data, num_rounds=6000, chunk_size=1000, progress=False)
  # The lasso solution has exact zeros, and RandProx-l1 finds it.
  assert int(np.sum(np.asarray(ref["w"]) == 0)) >= 1
  np.testing.assert_allclose(_flat(res.state.server), _flat(ref), atol=1e-6)


def test_gradient_clipping(problem):
  ds, model, loss = problem
  w0 = _shifted(model, 5.0)  # large gradients
  for mode in ("norm", "value"):
    kernel = fjs.algorithms.proxskip.proxskip_kernel(loss, 1.0, 0.5, clip=0.1, clip_mode=mode)
    state = kernel.init(None, w0, ds.train)

    @jax.jit
    def clipped(key, state, data):
      w_hat, _ = kernel.local_step(key, state, data)
      step = jax.tree.map(jnp.subtract, state.w, w_hat)  # = γ·clipped gradient (h = 0)
      return step, jax.vmap(fjs.algorithms.proxskip._tree_norm)(step)

    step, norms = clipped(jax.random.key(0), state, ds.train)
    if mode == "norm":
      np.testing.assert_allclose(norms, 0.1, rtol=1e-5)
    else:
      assert max(float(np.abs(np.asarray(a)).max()) for a in jax.tree.leaves(step)) <= 0.1 + 1e-7
  with pytest.raises(ValueError, match="clip_mode"):
    fjs.algorithms.proxskip.proxskip_kernel(loss, 1.0, 0.5, clip=1.0, clip_mode="l1")


def test_uplink_compressor_plug_in(problem):
  """SPS is ProxSkip with a top-k uplink compressor; an unbiased rand-k uplink keeps Σh = 0
  (the compressed message is written back) and is charged rand-k's bits."""
  ds, model, loss = problem
  d = DIM + 1
  w0 = _shifted(model, 0.2)
  k = fjs.sparsity.k_from_sparsity(d, 0.6)
  a = fjs.sparse_proxskip(loss, 0.02, 0.5, 0.6)
  b = fjs.proxskip(loss, 0.02, 0.5, uplink=fjs.compressors.top_k(d, k))
  sa, sb = a.init(None, w0, ds.train), b.init(None, w0, ds.train)
  for t in range(10):
    sa, _ = jax.jit(a.step)(jax.random.key(t), sa, ds.train)
    sb, ib = jax.jit(b.step)(jax.random.key(t), sb, ds.train)
  chex.assert_trees_all_close(sa.w, sb.w, rtol=1e-6, atol=1e-7)
  c = fjs.proxskip(loss, 0.02, 0.5, uplink=fjs.compressors.rand_k(d, 3))
  sc = c.init(None, w0, ds.train)
  for t in range(10):
    sc, ic = jax.jit(c.step)(jax.random.key(t), sc, ds.train)
    if float(ic.communicated):
      assert float(ic.bits_up) == ds.num_clients * fjs.accounting.sparse_bits(3, d)
    assert float(ic.sum_h_norm) < 1e-4 * max(1.0, float(ic.mean_h_norm) * 6)
