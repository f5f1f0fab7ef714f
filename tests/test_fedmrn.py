"""FedMRN / FedMRNS (seed 003 Algorithm 1): exact uplink bits, the global update inside the
convex hull of the participants' masked noise, the server's regenerated noise, and learning;
the paper's dense baselines (FedAvg with the same epoch protocol, an uplink, local pruning,
server-side pruning): the vmapped kernel against a per-client Python loop of the same
mathematics (unequal S_k)."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fedjaxsparse as fjs


@pytest.fixture(scope="module")
def setup():
  ds = fjs.data.digits(num_clients=6, seed=0)
  model = fjs.models.softmax_regression(64, 10)
  return ds, model, fjs.models.make_loss(model), jax.jit(lambda: model.init(jax.random.key(0)))()


# The learning test's configurations (lr 0.3, E = 2, B = 16, K = 3, noise ±0.1): the other
# tests check their invariants on the same algorithms, so each round compiles once per module.
VARIANTS = {"FedAvg": None, "FedMRN": {},   # None: FedAvg with the same epoch protocol
            "FedMRNS": dict(signed=True, noise_scale=0.05),
            "w/o PSM": dict(stochastic=False, progressive=False),
            "FedAvg w. SM": dict(masking="post")}
LR, EPOCHS, BATCH, COHORT = 0.3, 2, 16, 3


@pytest.fixture(scope="module")
def variants(setup):
  """``name -> (algorithm, jitted step)`` of :data:`VARIANTS`, each step compiled once."""
  _, _, loss, _ = setup
  out = {}
  for name, kw in VARIANTS.items():
    common = dict(epochs=EPOCHS, batch_size=BATCH, cohort_size=COHORT)
    algo = (fjs.fedavg(loss, optax.sgd(LR), **common) if kw is None else
            fjs.fedmrn(loss, LR, **common, **{"noise_scale": 0.1, **kw}))
    out[name] = (algo, jax.jit(algo.step))
  return out


@pytest.fixture(scope="module")
def regenerated_noise(setup):
  """``(key, alpha) -> [noise of each participant]``: the noise of a round's participants
  (cohort of 3), regenerated from their seeds as the server does."""
  ds, _, _, w0 = setup

  @jax.jit
  def regenerate(key, alpha):
    k_cohort, k_noise, _ = jax.random.split(key, 3)
    ids = fjs.sampling.sample_cohort(k_cohort, ds.train.num_clients, COHORT)
    return [fjs.ops.noise_masks.tree_noise(k, w0, alpha)
            for k in fjs.sampling.client_keys(k_noise, ids)]
  return regenerate


@pytest.mark.parametrize("signed", [False, True])
def test_bits_and_the_update_inside_the_hull_of_the_masked_noise(setup, variants,
                                                                 regenerated_noise, signed):
  """FedMRN (noise ±0.1) and FedMRNS (±0.05), the learning test's algorithms: K·(d + 32)
  bits up, K·32·d down, and w^{t+1} − w^t inside the hull of the masked noise (and 0)."""
  ds, _, _, w0 = setup
  alpha = 0.05 if signed else 0.1
  algo, step = variants["FedMRNS" if signed else "FedMRN"]
  state = algo.init(None, w0, ds.train)
  key = jax.random.key(11)
  new, info = step(key, state, ds.train)
  d = sum(a.size for a in jax.tree.leaves(w0))
  assert float(info.bits_up) == COHORT * (d + 32)
  assert float(info.bits_down) == COHORT * 32 * d
  delta = jax.tree.map(lambda a, b: np.asarray(a) - np.asarray(b), new.params, w0)
  # the participants' noise, regenerated from their seeds as the server does
  noises = regenerated_noise(key, np.float32(alpha))
  for leaf, *ns in zip(jax.tree.leaves(delta), *[jax.tree.leaves(n) for n in noises]):
    ns = np.stack([np.asarray(n) for n in ns])
    lo = ns.min(0) if not signed else -np.abs(ns).max(0)
    hi = ns.max(0) if not signed else np.abs(ns).max(0)
    if not signed:
      lo, hi = np.minimum(lo, 0), np.maximum(hi, 0)
    v = np.asarray(leaf)
    assert np.all(v >= lo - 1e-9) and np.all(v <= hi + 1e-9)
  assert max(float(np.max(np.abs(v))) for v in jax.tree.leaves(delta)) <= alpha
  assert 0 < float(info.ones) < 1


def _loop_round(loss, w, data, key, lr, epochs, batch, cohort):
  """The same FedAvg round (epoch protocol, plain SGD), one client at a time in Python."""
  @jax.jit
  def participants(key):   # the cohort, each one's shuffling key and its number of steps S_k
    k_cohort, k_clients, _ = jax.random.split(key, 3)
    ids = fjs.sampling.sample_cohort(k_cohort, data.num_clients, cohort)
    k_order = [jax.random.split(k)[0]   # the client's shuffling key
               for k in fjs.sampling.client_keys(k_clients, ids)]
    return ids, k_order, fjs.ops.local.epoch_steps(data.num_examples[ids], batch, epochs)

  @jax.jit
  def sgd_step(v, k_order, row, t):
    x, y, m = fjs.ops.local.epoch_minibatch(k_order, row, batch, t)
    g = jax.grad(loss)(v, x, y, m)
    return jax.tree.map(lambda a, g: a - lr * g, v, g)

  ids, k_orders, steps = participants(key)
  ids, steps = np.asarray(ids), np.asarray(steps)
  rows = jax.tree.map(np.asarray, data)
  sizes = rows.num_examples[ids]
  total = jax.tree.map(lambda a: np.zeros(a.shape), w)
  for i, k_order, s_k in zip(ids, k_orders, steps):
    row = jax.tree.map(lambda a: a[i], rows)
    v = w
    for t in range(int(s_k)):
      v = sgd_step(v, k_order, row, np.int32(t))
    total = jax.tree.map(lambda s, a, b: s + (np.asarray(a) - np.asarray(b))
                         * rows.num_examples[i] / sizes.sum(), total, v, w)
  return jax.tree.map(lambda a, b: np.asarray(a) + b, w, total)


def test_vmapped_round_equals_a_per_client_loop(setup, variants):
  """Unequal clients (S_k differ) in one vmapped kernel = a Python loop over clients (FedAvg
  with the epoch protocol, the learning test's dense baseline)."""
  ds, _, loss, w0 = setup
  data = ds.train
  algo, step = variants["FedAvg"]
  steps = EPOCHS * -(-np.asarray(data.num_examples) // BATCH)   # S_k = E⌈n_k/B⌉
  assert len(set(steps.tolist())) == data.num_clients, steps   # every S_k its own
  new, info = step(jax.random.key(2), algo.init(None, w0, data), data)
  want = _loop_round(loss, w0, data, jax.random.key(2), LR, EPOCHS, BATCH, COHORT)
  for a, b in zip(jax.tree.leaves(new.params), jax.tree.leaves(want)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
  assert float(info.bits_up) == COHORT * 32 * sum(a.size for a in jax.tree.leaves(w0))


@pytest.mark.integration   # 15-round learning runs of five variants
def test_fedmrn_and_its_ablations_learn(setup, variants):
  """Masked 1-bit uplinks still train: after 15 rounds every variant's test accuracy is well
  above chance (noise ±0.1: a linear model's weights must move by O(1), and a round moves
  each by at most the noise scale, so they trail dense FedAvg after 15 rounds)."""
  ds, model, _, w0 = setup
  accs = {}
  accuracy = jax.jit(lambda p: fjs.evaluation.evaluate(model, p, ds.test)["accuracy"])
  for name, (algo, step) in variants.items():
    state = algo.init(None, w0, ds.train)
    for t in range(15):
      state, _ = step(jax.random.key(t), state, ds.train)
    accs[name] = float(accuracy(state.params))
  assert accs["FedAvg"] > 0.8 and all(a > 0.5 for a in accs.values()), accs  # chance: 0.1


def test_bad_arguments(setup):
  _, _, loss, _ = setup
  with pytest.raises(ValueError, match="masking"):
    fjs.fedmrn(loss, 0.1, masking="sometimes")
  with pytest.raises(ValueError, match="noise_scale"):
    fjs.fedmrn(loss, 0.1, noise_scale=0.0)
  with pytest.raises(ValueError, match="epochs"):
    fjs.fedmrn(loss, 0.1, epochs=0)


def test_post_training_compressors_on_the_same_backbone(setup):
  """The paper's post-training compressors: FedAvg (epoch protocol) with an uplink, each
  update compressed once (here TernGrad) and charged by the compressor's bits; FedMRN's
  upload is already a 1-bit mask and takes no uplink."""
  ds, _, loss, w0 = setup
  d = sum(a.size for a in jax.tree.leaves(w0))
  algo = fjs.fedavg(loss, optax.sgd(0.1), epochs=1, batch_size=16, cohort_size=2,
                    uplink=fjs.compressors.terngrad(d))
  _, info = jax.jit(algo.step)(jax.random.key(0), algo.init(None, w0, ds.train), ds.train)
  assert float(info.bits_up) == pytest.approx(2 * fjs.compressors.terngrad(d).bits(d))
  with pytest.raises(TypeError, match="uplink"):
    fjs.fedmrn(loss, 0.1, uplink=fjs.compressors.terngrad(d))
  with pytest.raises(ValueError, match="epochs"):
    fjs.fedavg(loss, optax.sgd(0.1), epochs=2)   # the epoch protocol needs a batch size


def test_fedsparsify_uploads_pruned_models(setup):
  """FedSparsify (the FedMRN paper's meaning) as FedAvg: every participant's local model is
  pruned to k non-zeros after every step (``local_prox``) and uploaded as a model
  (``upload_prox``), so the new global model — their data-weighted average — has at most c·k
  non-zeros, and each upload is charged by its own non-zeros (≤ k)."""
  ds, _, loss, w0 = setup
  d = sum(a.size for a in jax.tree.leaves(w0))
  k = max(1, int(0.03 * d))
  keep = lambda tree, step: fjs.sparsity.top_k(tree, k)
  algo = fjs.fedavg(loss, optax.sgd(0.1), epochs=1, batch_size=16, cohort_size=3,
                    local_prox=keep, upload_prox=keep, encoding="auto")
  new, info = jax.jit(algo.step)(jax.random.key(0), algo.init(None, w0, ds.train), ds.train)
  nnz = sum(int(np.sum(np.asarray(a) != 0)) for a in jax.tree.leaves(new.params))
  assert 0 < nnz <= 3 * k
  assert float(info.bits_up) <= 3 * fjs.accounting.sparse_bits(k, d) + 1e-3


def _top_k(tree, k):
  """``tree`` with all but its ``k`` largest magnitudes (over all leaves, in order; ties: the
  lower index) set to zero, in NumPy."""
  leaves, treedef = jax.tree.flatten(jax.tree.map(np.asarray, tree))
  flat = np.concatenate([np.abs(a).ravel() for a in leaves])
  keep = np.zeros(flat.size, bool)
  keep[np.argsort(-flat, kind="stable")[:k]] = True
  ends = np.cumsum([a.size for a in leaves])
  return jax.tree.unflatten(treedef, [
      np.where(keep[e - a.size:e].reshape(a.shape), a, 0).astype(a.dtype)
      for e, a in zip(ends, leaves)])


def test_server_side_fedsparsify_follows_the_cubic_schedule(setup, variants):
  """FedSparsify (seed 000's meaning): after round t the global model is the dense round's
  aggregate pruned to its k_t = round((1 − s_t)·d) largest magnitudes, s_t the cubic GMP
  ramp; the next round's downlink is charged by its non-zeros; a schedule at 0 is FedAvg
  bitwise (the dense rounds: the learning test's FedAvg)."""
  ds, _, loss, w0 = setup
  d = sum(a.size for a in jax.tree.leaves(w0))
  sched = lambda t: fjs.sparsity.gmp_sparsity(t, 0.9, begin=1, end=4)
  kw = dict(epochs=EPOCHS, batch_size=BATCH, cohort_size=COHORT)
  dense, dense_step = variants["FedAvg"]
  algo = fjs.fedavg(loss, optax.sgd(LR), server_sparsity=sched, **kw)
  state, step = algo.init(None, w0, ds.train), jax.jit(algo.step)
  sparsity, message_bits = jax.jit(sched), jax.jit(fjs.accounting.message_bits)
  for t in range(6):
    prev = state
    state, info = step(jax.random.key(t), state, ds.train)
    unpruned = dense_step(jax.random.key(t), prev, ds.train)[0].params
    want = _top_k(unpruned, fjs.sparsity.k_from_sparsity(d, float(sparsity(t))))
    for x, y in zip(jax.tree.leaves(state.params), jax.tree.leaves(want)):
      np.testing.assert_array_equal(x, y)
    assert float(info.bits_down) == pytest.approx(3 * float(message_bits(prev.params)))
  nnz = sum(int(np.sum(np.asarray(a) != 0)) for a in jax.tree.leaves(state.params))
  assert nnz == fjs.sparsity.k_from_sparsity(d, 0.9)
  zero = fjs.fedavg(loss, optax.sgd(LR), server_sparsity=lambda t: 0.0, **kw)
  a = dense_step(jax.random.key(5), dense.init(None, w0, ds.train), ds.train)[0]
  b = jax.jit(zero.step)(jax.random.key(5), zero.init(None, w0, ds.train), ds.train)[0]
  for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
    np.testing.assert_array_equal(x, y)
