"""Methods no paper in the library defines, composed through the public face from the pieces of
the cohort round (any sampler, any uplink compressor, any server optimizer): each is a few lines
of user code, run, and checked for an invariant or a reduction."""
import functools

import jax
import numpy as np
import optax
import pytest

import fedjaxsparse as fjs


class _Digits:
  """scikit-learn's digits on 6 clients, loaded when a test first needs them (not while every
  xdist worker collects this module)."""
  @functools.cached_property
  def train(self):
    return fjs.data.digits(num_clients=6, partition="iid", seed=0).train


DS = _Digits()
MODEL = fjs.models.softmax_regression(64, 10)
LOSS = fjs.models.make_loss(MODEL)
PARAMS = MODEL.init(jax.random.key(0))
D = fjs.accounting.num_params(PARAMS)
DRAWS = 256


def _rounds(algos, keys):
  """For each of ``algos``, one round from the same start under each key: the new global
  models ``[K, ...]`` and the rounds' infos (one program for all of them)."""
  def draws(keys, data):
    out = []
    for algo in algos:
      state = algo.init(jax.random.key(1), PARAMS, data)
      new, info = jax.vmap(lambda k: algo.step(k, state, data))(keys)
      out.append((new.params, info))
    return out

  return jax.jit(draws)(keys, DS.train)


def _round(algo, keys):
  """:func:`_rounds` of one algorithm."""
  return _rounds([algo], keys)[0]


def _fixed_reference(algo, keys):
  """The round of ``algo`` without a random piece (full participation, one full batch per
  epoch: a key only reorders the sum over a client's examples) as the reference ``[K, ...]``
  under every key: computed under the first 4 keys, which agree up to rounding."""
  few = _round(algo, keys[:4])[0]
  for a in jax.tree.leaves(few):
    a = np.asarray(a)
    np.testing.assert_allclose(a, np.broadcast_to(a[:1], a.shape), rtol=0,
                               atol=1e-5 * np.abs(a).max())
  return jax.tree.map(lambda a: np.broadcast_to(np.asarray(a)[:1], (len(keys),) + a.shape[1:]),
                      few)


def _assert_mc_equal(samples, reference, directions=16):
  """The Monte Carlo mean of ``samples [K, ...]`` equals that of ``reference [K, ...]`` (the
  same round without the random piece, under the same keys: :func:`_round`, or
  :func:`_fixed_reference` where nothing random is left) along ``directions`` random
  Gaussian directions, within 5 standard errors of the projected difference: a projection sums
  all d coordinates, so its mean over K draws is close to normal (one coordinate of a sparse
  compressor is not: a rare keep makes its sample variance unreliable). Returns the errors."""
  a = np.concatenate([np.ravel(x).reshape(len(x), -1) for x in jax.tree.leaves(samples)], 1)
  b = np.concatenate([np.ravel(x).reshape(len(x), -1) for x in jax.tree.leaves(reference)], 1)
  r = np.random.default_rng(0).standard_normal((a.shape[1], directions))
  diff = (a.astype(np.float64) - b) @ r
  se = diff.std(0, ddof=1) / np.sqrt(len(diff))
  assert np.all(np.abs(diff.mean(0)) <= 5 * se), (diff.mean(0), se)
  return se


@pytest.mark.integration   # Monte Carlo over rounds of FedSpa with and without TernGrad
def test_fedspa_with_a_terngrad_uplink_is_unbiased():
  # FedSpa (personalised sparse masks) whose clients upload through TernGrad
  algo = fjs.fedspa(LOSS, 0.1, num_rounds=10, sparsity=0.5, epochs=1, batch_size=512,
                    cohort_size=None, uplink=fjs.compressors.terngrad(D))
  plain = fjs.fedspa(LOSS, 0.1, num_rounds=10, sparsity=0.5, epochs=1, batch_size=512,
                     cohort_size=None)
  keys = jax.random.split(jax.random.key(2), DRAWS)
  samples, info = _round(algo, keys)
  se = _assert_mc_equal(samples, _fixed_reference(plain, keys))
  assert np.max(se) > 0   # the compressor is random: the check has teeth
  changed = np.asarray(info.bits_up) - 6 * fjs.compressors.terngrad(D).bits(D)  # 6 clients upload
  assert np.all(changed >= 0)   # plus the DST mask changes, nothing else


def test_ditto_with_importance_sampling_has_an_unbiased_global_step():
  # Ditto whose one-client cohorts are drawn with p_i ∝ n_i + 10, aggregated with 1/(n p_i)
  sizes = np.asarray(DS.train.num_examples, np.float64)
  sampler = fjs.sampling.importance(sizes + 10.0)
  algo = fjs.ditto(LOSS, 0.05, global_epochs=1, personal_epochs=1, batch_size=512,
                   cohort_size=None, sampler=sampler, weighting="sampling")
  full = fjs.ditto(LOSS, 0.05, global_epochs=1, personal_epochs=1, batch_size=512,
                   cohort_size=None, weighting="uniform")
  keys = jax.random.split(jax.random.key(3), DRAWS * 4)
  _assert_mc_equal(_round(algo, keys)[0], _fixed_reference(full, keys))


@pytest.mark.integration   # multi-round runs of FedProx and FedAvg compared
def test_fedprox_with_eden_and_fedadam_at_mu_zero_is_fedavg_bit_for_bit():
  common = dict(local_steps=3, batch_size=16, cohort_size=4, uplink=fjs.compressors.eden(D),
                server_optimizer=optax.adam(0.01))
  prox = fjs.fedprox(LOSS, optax.sgd(0.1), 0.0, **common)
  avg = fjs.fedavg(LOSS, optax.sgd(0.1), **common)
  results = [fjs.run(a, jax.random.key(4), PARAMS, DS.train, num_rounds=5, progress=False)
             for a in (prox, avg)]
  for x, y in zip(jax.tree.leaves(results[0].state.params), jax.tree.leaves(results[1].state.params)):
    np.testing.assert_array_equal(x, y)
  assert not np.allclose(jax.tree.leaves(results[0].state.params)[0],
                         jax.tree.leaves(PARAMS)[0])   # it trained
  moved = fjs.run(fjs.fedprox(LOSS, optax.sgd(0.1), 1.0, **common), jax.random.key(4), PARAMS,
                  DS.train, num_rounds=5, progress=False)
  assert not np.array_equal(jax.tree.leaves(moved.state.params)[0],
                            jax.tree.leaves(results[1].state.params)[0])   # μ > 0 differs


def test_fedp3_with_rand_k_on_the_uploaded_layers_charges_bits_exactly():
  # FedP3 (OPU2 layer assignments) whose uploaded layers go through rand-k, layer by layer
  model = fjs.models.mlp((64,), 10, hidden=(16, 16))
  params = model.init(jax.random.key(0))
  train = fjs.algorithms.fedp3.layer_policy(jax.random.key(2), 6, 3, "opu2")
  cfg = fjs.algorithms.fedp3.make_config(jax.random.key(1), train, 0.9)
  rand_k = lambda d: fjs.compressors.rand_k(d, max(1, d // 4))
  algo = fjs.fedp3(fjs.models.make_loss(model), optax.sgd(0.1), cfg, local_steps=2,
                   batch_size=16, uplink=rand_k)
  # the identity compressor per layer is FedP3 itself, bit for bit: the three rounds (rand-k,
  # plain, identity) in one program
  plain = fjs.fedp3(fjs.models.make_loss(model), optax.sgd(0.1), cfg, local_steps=2,
                    batch_size=16)
  same = fjs.fedp3(fjs.models.make_loss(model), optax.sgd(0.1), cfg, local_steps=2,
                   batch_size=16, uplink=fjs.compressors.identity)
  state = algo.init(None, params, DS.train)
  (new, info), a, b = jax.jit(lambda k, s, d: (
      algo.step(k, s, d), plain.step(k, s, d)[0].params, same.step(k, s, d)[0].params))(
          jax.random.key(5), state, DS.train)
  sizes = fjs.ops.layer_groups.layer_sizes(params)
  expected = sum(rand_k(int(d)).bits(int(d)) for row in np.asarray(train)
                 for d, sent in zip(sizes, row) if sent)
  assert float(info.bits_up) == float(expected)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(x, y)
  assert not all(np.array_equal(x, y) for x, y in
                 zip(jax.tree.leaves(new.params), jax.tree.leaves(a)))   # rand-k changed it


@pytest.mark.integration   # multi-round runs compared (the integration tier's kind), for the unit tier's margin
def test_fedspa_with_a_nice_sampler_and_its_weights_is_fedspas_uniform_cohort():
  # tau-NICE draws the same cohort as cohort_size=tau; its weights 1/(n p_i) = 1/tau
  kw = dict(num_rounds=10, sparsity=0.5, epochs=1, batch_size=64)
  nice = fjs.fedspa(LOSS, 0.1, cohort_size=None, sampler=fjs.sampling.nice(6, 3),
                    weighting="sampling", **kw)
  uniform = fjs.fedspa(LOSS, 0.1, cohort_size=3, **kw)
  runs = [fjs.run(a, jax.random.key(6), PARAMS, DS.train, num_rounds=3, progress=False)
          for a in (nice, uniform)]
  for x, y in zip(jax.tree.leaves(runs[0].state), jax.tree.leaves(runs[1].state)):
    np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)
  np.testing.assert_array_equal(runs[0].history.rounds["uplink_bits"],
                                runs[1].history.rounds["uplink_bits"])


@pytest.mark.integration   # multi-round runs compared (the integration tier's kind), for the unit tier's margin
def test_fedavg_with_fedmrn_noise_masks_as_its_uplink():
  # FedAvg whose clients upload FedMRN's stochastic masks over seeded ±α noise, one client a
  # round: FedMRN's "FedAvg w. SM" ablation. E[n·M(u, n)] = u (signed masks) and u/2 (binary
  # masks) per entry when |u| ≤ α, so the new model's mean is plain FedAvg's (signed) or the
  # halfway point (binary).
  common = dict(local_steps=3, batch_size=16, cohort_size=1)
  plain = fjs.fedavg(LOSS, optax.sgd(0.1), **common)
  keys = jax.random.split(jax.random.key(7), DRAWS * 4)
  reference = jax.tree.map(np.asarray, _round(plain, keys)[0])
  w = jax.tree.map(lambda a: np.asarray(a)[None], PARAMS)
  moved = jax.tree.map(np.subtract, reference, w)             # one client's update u per key
  alpha = 2.0 * max(float(np.max(np.abs(a))) for a in jax.tree.leaves(moved))
  cases = ((True, reference), (False, jax.tree.map(lambda a, u: a + 0.5 * u, w, moved)))
  rounds = _rounds([fjs.fedavg(LOSS, optax.sgd(0.1), **common, uplink=fjs.compressors.noise_mask(
      D, alpha, "bernoulli", signed=signed)) for signed, _ in cases], keys)   # one program
  for (signed, expected), (samples, info) in zip(cases, rounds):
    se = _assert_mc_equal(samples, expected)
    assert np.max(se) > 0   # the masks are random: the check has teeth
    # every received entry is ±α or 0: a mask over the regenerated noise
    values = np.unique(np.abs(np.concatenate([np.ravel(np.asarray(a) - np.asarray(b))
                                              for a, b in zip(jax.tree.leaves(samples),
                                                              jax.tree.leaves(w))])))
    assert np.allclose(values, [alpha] if signed else [0.0, alpha], rtol=1e-5), values[:5]
    # 1 bit per entry + the seed
    assert np.all(np.asarray(info.bits_up) == D + fjs.accounting.SEED_BITS)
