"""FedSpa (seed 002 Alg. 1-3; spec §2.6 invariants): s = 0 is uniform-weight FedAvg against a
per-client loop, the aggregation divides by S (not per-coordinate counts) and leaves
coordinates no participant activates untouched, DST keeps per-layer counts and the other
clients' masks bit for bit, RSM with a shared mask is FedAvg on a fixed sub-network, the
ledgers, and independence from how clients are batched."""
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fedjaxsparse as fjs


@pytest.fixture(scope="module")
def setup():
  ds = fjs.data.digits(num_clients=8, partition="dirichlet", alpha=0.3, seed=0)
  model = fjs.models.mlp((64,), 10, hidden=(16,))
  return ds, model, fjs.models.make_loss(model), jax.jit(lambda: model.init(jax.random.key(0)))()


# One DST configuration (s = 0.5, T = 4, E = 1, B = 16, S = 3) for the tests of its mask
# search, its batching and its packed masks: its round compiles once per module.
DST = dict(num_rounds=4, sparsity=0.5, epochs=1, batch_size=16, cohort_size=3)


@pytest.fixture(scope="module")
def dst_step(setup):
  """``(shared_init, pack_masks) -> (algorithm, jitted step)`` of the :data:`DST`
  configuration; the step does not depend on ``shared_init`` (only ``init`` does), so every
  unpacked variant shares one compiled round."""
  _, _, loss, _ = setup
  steps = {}

  def get(shared_init=True, pack_masks=False):
    algo = fjs.fedspa(loss, 0.1, shared_init=shared_init, pack_masks=pack_masks, **DST)
    if pack_masks not in steps:
      steps[pack_masks] = jax.jit(algo.step)
    return algo, steps[pack_masks]
  return get


_personal = jax.jit(lambda state: state.personal)   # [N, ...] personalised models


def _leaves_equal(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(x, y)


def _linear_coefficients(w0, lo, hi):
  """``c``, leaves evenly spaced in ``[lo, hi]`` (float32), for the linear loss ``⟨c, w⟩``."""
  return jax.tree.map(
      lambda a: np.linspace(lo, hi, a.size).reshape(a.shape).astype(np.float32), w0)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _cohort(key, num_clients, cohort_size):
  """The ids of the cohort of the round ``key`` (drawn with the first key of its split)."""
  return fjs.sampling.sample_cohort(jax.random.split(key)[0], num_clients, cohort_size)


def test_zero_sparsity_is_uniform_fedavg(setup):
  """All-ones masks: w_{t+1} = w_t − (1/S) Σ_k (w_t − w_k), w_k E epochs of SGD — computed
  here one client at a time with the same keys."""
  ds, _, loss, w0 = setup
  algo = fjs.fedspa(loss, 0.1, num_rounds=5, sparsity=0.0, epochs=2, batch_size=16, cohort_size=3)
  state = algo.init(jax.random.key(0), w0, ds.train)
  assert all(bool(np.asarray(m).all()) for m in jax.tree.leaves(state.masks))
  key = jax.random.key(7)
  new, _ = jax.jit(algo.step)(key, state, ds.train)

  @jax.jit
  def participants(key):   # the cohort, each one's shuffling key and its number of steps S_k
    k_cohort, k_train = jax.random.split(key)
    ids = fjs.sampling.sample_cohort(k_cohort, ds.train.num_clients, 3)
    k_order = [jax.random.split(kc, 3)[0] for kc in fjs.sampling.client_keys(k_train, ids)]
    return ids, k_order, fjs.ops.local.epoch_steps(ds.train.num_examples[ids], 16, 2)

  @jax.jit
  def sgd_step(v, k_order, row, t):
    g = jax.grad(loss)(v, *fjs.ops.local.epoch_minibatch(k_order, row, 16, t))
    return jax.tree.map(lambda a, b: a - 0.1 * b, v, g)

  ids, k_orders, steps = participants(key)
  rows = jax.tree.map(np.asarray, ds.train)
  w = jax.tree.map(np.asarray, w0)
  total = jax.tree.map(lambda a: np.zeros(a.shape), w)
  for i, k_order, s_k in zip(np.asarray(ids), k_orders, np.asarray(steps)):
    row = jax.tree.map(lambda a: a[i], rows)
    v = w
    for t in range(int(s_k)):
      v = sgd_step(v, k_order, row, np.int32(t))
    total = jax.tree.map(lambda s, a, b: s + (a - np.asarray(b)), total, w, v)
  want = jax.tree.map(lambda a, s: a - s / 3, w, total)
  for x, y in zip(jax.tree.leaves(new.params), jax.tree.leaves(want)):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("weighting", ["uniform", "num_examples"])
def test_aggregation_divides_by_s_and_untouched_coordinates_stay(setup, weighting):
  """A linear loss ⟨c, w⟩ has the constant gradient c, so U_k = η N_k m_k⊙c and
  w_{t+1} − w_t = −η Σ_k p_k N_k m_k⊙c exactly, p_k = 1/S (or n_k/Σn_j): per-coordinate
  counts are not divided out, and a coordinate off every participant's mask does not move
  (bit for bit)."""
  ds, _, _, w0 = setup
  c = _linear_coefficients(w0, -1.0, 1.0)
  loss = lambda p, x, y, m: sum(jnp.sum(ci * pi) for ci, pi in
                                zip(jax.tree.leaves(c), jax.tree.leaves(p)))
  algo = fjs.fedspa(loss, 0.05, num_rounds=3, sparsity=0.8, search="rsm", shared_init=False,
                    epochs=1, batch_size=16, cohort_size=3, weighting=weighting)
  state = algo.init(jax.random.key(1), w0, ds.train)
  key = jax.random.key(2)
  new, _ = jax.jit(algo.step)(key, state, ds.train)
  ids = np.asarray(_cohort(key, ds.train.num_clients, 3))
  steps = np.asarray(jax.jit(fjs.ops.local.epoch_steps, static_argnums=(1, 2))(
      ds.train.num_examples, 16, 1))[ids]
  n = np.asarray(ds.train.num_examples)[ids]
  p = np.full(3, 1 / 3) if weighting == "uniform" else n / n.sum()
  for w, wn, ci, m in zip(*(jax.tree.leaves(t) for t in (w0, new.params, c, state.masks))):
    m = np.asarray(m)[ids]
    want = np.asarray(w) - 0.05 * np.einsum("k,k...->...", (p * steps).astype(np.float32),
                                            m * np.asarray(ci))
    np.testing.assert_allclose(wn, want, rtol=1e-5, atol=1e-6)
    off = ~m.any(0)
    np.testing.assert_array_equal(np.asarray(wn)[off], np.asarray(w)[off])


def test_dst_keeps_counts_and_the_other_clients_masks(setup, dst_step):
  ds, _, _, w0 = setup
  T = DST["num_rounds"]
  algo, step = dst_step()
  state = algo.init(jax.random.key(0), w0, ds.train)
  counts = fjs.masks.layer_counts(w0, fjs.masks.layer_densities(w0, 0.5))
  changed = 0.0
  for t in range(T):
    key = jax.random.key(10 + t)
    old = state
    state, info = step(key, state, ds.train)
    ids = set(np.asarray(_cohort(key, 8, 3)).tolist())
    # the cosine schedule α_t = ½α_0(1 + cos(πt/(T − 1))), α_0 = 0.5
    assert float(info.alpha) == pytest.approx(0.25 * (1 + math.cos(math.pi * t / (T - 1))),
                                              abs=1e-6)
    for mo, mn, n in zip(*(jax.tree.leaves(x) for x in (old.masks, state.masks, counts))):
      mo, mn = np.asarray(mo), np.asarray(mn)
      assert [int(r.sum()) for r in mn] == [n] * 8  # per-layer counts never change
      for k in range(8):
        if k not in ids:
          np.testing.assert_array_equal(mn[k], mo[k])
    bound = 2 * sum(math.ceil(float(info.alpha) * n - 1e-6) for n, a in
                    zip(jax.tree.leaves(counts), jax.tree.leaves(w0)) if a.ndim >= 2)
    assert float(info.mask_change) <= bound
    changed += float(info.mask_change)
  assert changed > 0 and float(info.mask_change) == 0.0  # α_{T−1} = 0: the last round keeps masks
  d = sum(a.size for a in jax.tree.leaves(w0))
  assert float(info.paper_bits_down) == 3 * 32 * round(0.5 * d)
  active = sum(jax.tree.leaves(counts))
  assert float(info.bits_down) == 3 * fjs.accounting.sparse_bits(active, d)


def test_rsm_with_a_shared_mask_is_fedavg_on_a_fixed_subnetwork(setup):
  ds, _, loss, w0 = setup
  algo = fjs.fedspa(loss, 0.1, num_rounds=4, sparsity=0.7, search="rsm", epochs=1, batch_size=16,
                    cohort_size=4)
  state = algo.init(jax.random.key(3), w0, ds.train)
  mask0 = jax.tree.map(lambda m: np.asarray(m)[0], state.masks)
  step = jax.jit(algo.step)
  for t in range(4):
    state, _ = step(jax.random.key(t), state, ds.train)
  _leaves_equal(state.masks, jax.tree.map(lambda m: np.broadcast_to(m, (8,) + m.shape), mask0))
  for w, wn, m in zip(*(jax.tree.leaves(x) for x in (w0, state.params, mask0))):
    np.testing.assert_array_equal(np.asarray(wn)[~m], np.asarray(w)[~m])
  personal = _personal(state)
  for p in jax.tree.leaves(personal):
    assert np.all(np.asarray(p) == np.asarray(p)[0])


def test_results_do_not_depend_on_how_clients_are_batched(setup, dst_step):
  ds, _, _, w0 = setup
  algo, step = dst_step()
  state = algo.init(jax.random.key(0), w0, ds.train)
  a = step(jax.random.key(5), state, ds.train)[0]
  b = jax.jit(algo.step)(jax.random.key(5), state,
                         fjs.runtime.clients.with_strategy(ds.train, "map"))[0]
  _leaves_equal(a.masks, b.masks)
  for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
    np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)


@pytest.mark.integration   # multi-round runs compared (the integration tier's kind), for the unit tier's margin
def test_dst_personalises_under_label_skew(setup):
  """Learning check on strongly non-IID digits: after 30 rounds DST's personalised models
  beat chance by far and its masks have diverged across clients (coverage above 1 − s)."""
  _, model, loss, w0 = setup
  ds = fjs.data.digits(num_clients=12, partition="dirichlet", alpha=0.1, seed=1)
  algo = fjs.fedspa(loss, 0.1, num_rounds=30, sparsity=0.5, epochs=2, batch_size=16,
                    cohort_size=4)
  state, step = algo.init(jax.random.key(0), w0, ds.train), jax.jit(algo.step)
  for t in range(30):
    state, _ = step(jax.random.key(t), state, ds.train)

  @jax.jit
  def measures(state):
    kernel = {"k": state.masks["Dense_0"]["kernel"]}
    acc = fjs.evaluation.evaluate_personal(model, state.personal, ds.test, per_client=False)
    return acc["accuracy"], fjs.masks.coverage(kernel), fjs.masks.density_per_layer(kernel)["k"]

  acc, coverage, density = (float(v) for v in measures(state))
  assert acc > 0.6, acc
  assert coverage > density + 0.05


def test_subsampling_uplink_and_its_ledgers(setup):
  """Subsampling (the paper's baseline: FedAvg whose every update keeps a fresh random half,
  its positions regenerated from a seed): S·(32·⌊d/2⌋ + 32) bits up, S·32·d down — 0.75× of
  FedAvg's comm up to the seeds; exactly ⌊d/2⌋ non-zeros reach the server from each client
  (a linear loss moves every coordinate), and with positions sent instead the honest ledger
  adds them."""
  ds, _, _, w0 = setup
  d = sum(a.size for a in jax.tree.leaves(w0))
  assert d % 2 == 0
  c = _linear_coefficients(w0, 0.5, 1.5)
  loss = lambda p, x, y, m: sum(jnp.sum(ci * pi) for ci, pi in
                                zip(jax.tree.leaves(c), jax.tree.leaves(p)))
  kw = dict(epochs=1, batch_size=16, cohort_size=1)
  sub = fjs.fedavg(loss, optax.sgd(0.1), uplink=fjs.compressors.scaled_rand_k(
      d, d // 2, seeded=True), **kw)
  state = sub.init(None, w0, ds.train)
  new, info = jax.jit(sub.step)(jax.random.key(0), state, ds.train)
  moved = sum(int(np.sum(np.asarray(a) != np.asarray(b)))
              for a, b in zip(jax.tree.leaves(new.params), jax.tree.leaves(w0)))
  assert moved == d // 2
  assert float(info.bits_up) == 32 * (d // 2) + fjs.accounting.SEED_BITS
  assert float(info.bits_down) == 32 * d
  assert (float(info.bits_up) + float(info.bits_down)) / (2 * 32 * d) \
      == pytest.approx(0.75, abs=1 / d)
  positions = fjs.compressors.scaled_rand_k(d, d // 2)
  assert positions.bits(d) == fjs.accounting.sparse_bits(d // 2, d) > 32 * (d // 2) + 32


def test_bad_arguments(setup):
  _, _, loss, _ = setup
  with pytest.raises(ValueError, match="search"):
    fjs.fedspa(loss, 0.1, num_rounds=3, search="lottery")
  with pytest.raises(ValueError, match="alpha0"):
    fjs.fedspa(loss, 0.1, num_rounds=3, alpha0=2.0)
  with pytest.raises(ValueError, match="weighting"):
    fjs.fedspa(loss, 0.1, num_rounds=3, weighting="size")
  with pytest.raises(ValueError, match="num_rounds"):
    fjs.fedspa(loss, 0.1, num_rounds=0)


def test_rescaled_subsampling_is_unbiased(setup):
  """With a linear loss every U_k is deterministic (η N_k c, whatever the minibatches) and
  with full participation so is the cohort: the round's update averaged over R draws of the
  uplink masks equals the uncompressed one: every coordinate within 5.5 standard errors (a
  family-wise bound over ~1,200 coordinates) and the mean squared z-score ≈ 1."""
  ds, _, _, w0 = setup
  c = _linear_coefficients(w0, 0.5, 1.5)
  loss = lambda p, x, y, m: sum(jnp.sum(ci * pi) for ci, pi in
                                zip(jax.tree.leaves(c), jax.tree.leaves(p)))
  kw = dict(num_rounds=3, sparsity=0.0, search="rsm", epochs=1, batch_size=16,
            cohort_size=None)
  exact = fjs.fedspa(loss, 0.05, **kw)
  d = sum(a.size for a in jax.tree.leaves(w0))
  sub = fjs.fedspa(loss, 0.05, uplink=fjs.compressors.rand_k(d, round(0.3 * d), seeded=True),
                   **kw)
  state = exact.init(None, w0, ds.train)
  r = 400

  @jax.jit
  def rounds(key, keys):   # the uncompressed round, and r draws of the subsampled one
    return (exact.step(key, state, ds.train)[0].params,
            jax.vmap(lambda k: sub.step(k, state, ds.train)[0].params)(jax.random.split(keys, r)))

  want, draws = rounds(jax.random.key(0), jax.random.key(1))
  z = []
  for w, d_ in zip(jax.tree.leaves(want), jax.tree.leaves(draws)):
    d_ = np.asarray(d_, np.float64)
    se = d_.std(0) / np.sqrt(r)
    assert np.all(se > 0)
    z.append(((d_.mean(0) - np.asarray(w)) / se).ravel())
  z = np.concatenate(z)
  assert np.all(np.abs(z) < 5.5) and 0.8 < np.mean(z ** 2) < 1.25, np.mean(z ** 2)


@pytest.mark.integration   # two multi-round FedSpa runs compared
def test_packed_masks_give_the_same_run(setup, dst_step):
  ds, _, _, w0 = setup
  runs = []
  for pack in (False, True):
    algo, step = dst_step(shared_init=False, pack_masks=pack)
    state = jax.jit(lambda k: algo.init(k, w0, ds.train))(jax.random.key(0))
    for t in range(3):
      state, _ = step(jax.random.key(t), state, ds.train)
    runs.append(state)
  assert runs[1].masks["Dense_0"]["kernel"].dtype == jnp.uint8
  assert runs[1].masks["Dense_0"]["kernel"].shape == (8, (64 * 16 + 7) // 8)  # 1 bit an entry
  _leaves_equal(runs[0].params, runs[1].params)
  masks, personal = jax.jit(lambda s: (fjs.masks.as_bool(s.masks, w0), s.personal))(runs[1])
  _leaves_equal(runs[0].masks, masks)
  _leaves_equal(_personal(runs[0]), personal)
