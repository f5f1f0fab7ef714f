"""Every cohort family is a client update on one round combinator, so every sampler, uplink
compressor, server optimizer and client optimizer composes with every family:

* the composition matrix — each family with a non-uniform sampler and its unbiased weights, an
  uplink compressor, an optax server optimizer (and, where the family trains with optax, a
  client optimizer with momentum) runs two jitted rounds to a finite state, charging exactly
  ``|S|·uplink.bits(d)``;
* reductions that hold bit for bit: the identity uplink is no uplink, ``optax.sgd(1.0)`` on the
  server is no server optimizer, the full-participation sampler is ``cohort_size=None``;
* a hypothesis test drawing (family, sampler, uplink, server optimizer) at random."""
import functools

import hypothesis
import hypothesis.strategies as st
import jax
import numpy as np
import optax
import pytest

import fedjaxsparse as fjs
from fedjaxsparse.algorithms import cohort_round as CR

N = 6
BLOCKS = [[0, 1], [2, 3, 4], [5]]       # stratified: one client per block, p_i = 1/|block|


@functools.lru_cache(maxsize=None)
def _setup():
  ds = fjs.data.digits(num_clients=N, partition="iid", seed=0)
  model = fjs.models.softmax_regression(64, 10)
  return ds.train, model, fjs.models.make_loss(model), model.init(jax.random.key(0))


def _family(name: str, client_optimizer=None, **kw):
  _, _, loss, _ = _setup()
  if name == "fedavg":
    return fjs.fedavg(loss, client_optimizer or optax.sgd(0.1), local_steps=2, batch_size=16,
                      **kw)
  if client_optimizer is not None and name not in ("fedavg", "fml", "fedp3"):   # optional
    kw["client_optimizer"] = client_optimizer
  if name == "ditto":
    return fjs.ditto(loss, 0.1, global_epochs=1, personal_epochs=1, batch_size=64, **kw)
  if name == "fedspa":
    return fjs.fedspa(loss, 0.1, num_rounds=4, sparsity=0.5, search="rsm", epochs=1,
                      batch_size=64, **kw)
  if name == "fml":
    _, model, _, _ = _setup()
    return fjs.fml(model, model, client_optimizer or optax.sgd(0.1), local_steps=2,
                   batch_size=16, **kw)
  if name == "subfedavg":
    _, model, _, _ = _setup()
    return fjs.subfedavg(loss, 0.1, accuracy_fn=fjs.evaluation.client_accuracy(model),
                         epochs=2, batch_size=128, acc_threshold=0.0, **kw)
  if name == "fedp3":   # every client trains both layers (b, w); layer-wise rand-k uplinks
    cfg = fjs.algorithms.fedp3.make_config(jax.random.key(1), np.ones((N, 2), bool), 0.9)
    if isinstance(kw.get("uplink"), fjs.compressors.Compressor):
      kw["uplink"] = _layerwise(kw["uplink"])
    return fjs.fedp3(loss, client_optimizer or optax.sgd(0.1), cfg, local_steps=2,
                     batch_size=16, **kw)
  if name == "fedsr":
    return fjs.fedsr(_split_model(), 0.1, epochs=1, batch_size=64, **kw)
  if name == "fedpac":   # a server part (the centroids) and its reply (combined heads)
    return fjs.fedpac(_split_model(False), 0.1, epochs=1, batch_size=64, qp_iterations=50,
                      **kw)
  if name == "fedcr":    # a server part: the global class distributions
    return fjs.fedcr(_split_model(), 0.1, samples=1, epochs=1, batch_size=64, **kw)
  if name == "fedpm":    # mask probabilities over the frozen weights (the global model)
    return fjs.fedpm(loss, _lr(name), epochs=1, batch_size=64, **kw)
  if name == "fedmrn":   # learned masks over ±0.1 noise
    return fjs.fedmrn(loss, 0.1, epochs=1, batch_size=64, noise_scale=0.1, **kw)
  raise KeyError(name)


def _lr(family: str) -> float:
  """The family's local step size: 0.1, but FedPM's score steps are large (a sampled mask
  changes only where a score moves far)."""
  return 10.0 if family == "fedpm" else 0.1


def _layerwise(compressor):
  """FedP3's uplink is a factory of the layer size: the same kind of compressor per layer."""
  kind = compressor.name.split("-")[0]
  return {"rand": lambda d_l: fjs.compressors.rand_k(d_l, max(1, d_l // 4)),
          "identity": fjs.compressors.identity,
          "terngrad": fjs.compressors.terngrad}[kind]


def _uplink_bits(family, compressor, d):
  """Bits of one member's upload through ``compressor`` (FedP3: per layer, both layers)."""
  if family != "fedp3":
    return compressor.bits(d)
  up = _layerwise(compressor)
  return sum(up(n).bits(n) for n in (10, 640))


@functools.lru_cache(maxsize=None)
def _split_model(gaussian: bool = True):
  from fedjaxsparse.models.split import fedcr_net
  return fedcr_net((64,), 10, 2, gaussian=gaussian, conv=(), dense=(5,))


def _params(family: str | None):
  """The initial global model of ``family`` (FedSR's and FedCR's representation network or
  the softmax regression of the others)."""
  if family in ("fedsr", "fedcr", "fedpac"):
    return _split_model(family != "fedpac").init(jax.random.key(0))
  if family == "fedpm":   # FedPM masks frozen *random* weights (the regression starts at 0)
    return _random_weights()
  return _setup()[3]


@functools.lru_cache(maxsize=None)
def _random_weights():
  w = _setup()[3]
  keys = jax.random.split(jax.random.key(2), len(jax.tree.leaves(w)))
  return jax.tree.unflatten(jax.tree.structure(w), [
      0.1 * jax.random.normal(k, a.shape, a.dtype) for k, a in zip(keys, jax.tree.leaves(w))])


def _dim(family: str | None) -> int:
  return sum(int(np.size(a)) for a in jax.tree.leaves(_params(family)))


FAMILIES = ("fedavg", "ditto", "fedspa", "subfedavg", "fml", "fedsr", "fedp3", "fedmrn", "fedcr",
            "fedpac", "fedpm")
NO_WEIGHTING = ("subfedavg", "fedp3")   # per-coordinate / per-layer means over the keepers
SGD_CLIENTS = ("ditto", "fedspa", "subfedavg", "fedmrn", "fedpm")   # the papers' plain SGD by default
# Sub-FedAvg uploads its mask beside its model (the masked mean reads it); FedMRN's mask is
# already one bit per entry (the paper's compressor baselines are FedAvg with an uplink), and so
# is FedPM's sampled mask
# FedCR and FedPAC upload class statistics beside their bodies
NO_UPLINK = ("subfedavg", "fedmrn", "fedcr", "fedpac", "fedpm")
D = 64 * 10 + 10


def _rounds(algo, rounds: int = 1, family: str | None = None):
  data, params = _setup()[0], _params(family)
  state = algo.init(jax.random.key(1), params, data)
  step = jax.jit(algo.step)
  infos = []
  for t in range(rounds):
    state, info = step(jax.random.key(10 + t), state, data)
    infos.append(info)
  return state, infos


def _host(leaf):
  """A state leaf as a NumPy array (a PRNG key as its key data)."""
  if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
    return np.asarray(jax.random.key_data(leaf))
  return np.asarray(leaf)


def _assert_same(a, b, what):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(_host(x), _host(y), err_msg=what)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_composes_with_a_sampler_an_uplink_and_optax_servers(family):
  d = _dim(family)
  uplink = None if family in NO_UPLINK else fjs.compressors.rand_k(d, d // 4)
  extra = {"client_optimizer": optax.sgd(0.1, momentum=0.9)}
  if family not in NO_UPLINK:
    extra.update(uplink=uplink)
  if family not in NO_WEIGHTING:
    extra.update(weighting="sampling")
  algo = _family(family, sampler=fjs.sampling.stratified(BLOCKS),
                 server_optimizer=optax.adam(0.01), cohort_size=None, **extra)
  state, infos = _rounds(algo, 2, family)
  for leaf in jax.tree.leaves(state):
    if np.issubdtype(_host(leaf).dtype, np.floating):
      assert np.all(np.isfinite(_host(leaf))), family
  for info in infos:
    assert int(info.num_clients) == len(BLOCKS)
    if uplink is not None:
      assert float(info.bits_up) == len(BLOCKS) * _uplink_bits(family, uplink, d), family
    assert np.isfinite(float(info.loss))
  assert int(state.round) == 2
  moved = [not np.allclose(np.asarray(a), np.asarray(b))
           for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(_params(family)))]
  assert any(moved), family


def _one_round_each(algos, family):
  """One round of every algorithm of ``algos`` from its own initial state, all of them one
  compiled program (its copies of the same computation compile once)."""
  data, params = _setup()[0], _params(family)

  def rounds(params, data):
    return [a.step(jax.random.key(10), a.init(jax.random.key(1), params, data), data)
            for a in algos]

  return jax.jit(rounds)(params, data)


# The uplink, the server step and the draw are cohort_round's own code, the same for every
# family: their reductions are checked on a stateless family, one with boolean client state
# scattered back (FedSpa) and one with key-typed client state and its own aggregation (FedP3);
# the client optimizer is each family's own code: checked on every family that has the papers'
# plain SGD as default.
ROUND_FAMILIES = ("fedavg", "fedspa", "fedp3")


@pytest.mark.parametrize("family", sorted(set(ROUND_FAMILIES) | set(SGD_CLIENTS)))
def test_identity_uplink_unit_server_sgd_and_full_sampler_reduce_to_the_plain_round(family):
  """Bit for bit, each on its own: the identity uplink is no uplink, ``optax.sgd(1.0)`` on the
  server is no server optimizer, the full sampler is ``cohort_size=None``, and (for the
  families whose papers train with plain SGD of step ``lr``) ``client_optimizer=optax.sgd(lr)``
  is the paper's step, which momentum changes."""
  variants = {"plain": _family(family, cohort_size=None)}
  if family in ROUND_FAMILIES:
    variants["server sgd(1.0)"] = _family(family, cohort_size=None,
                                          server_optimizer=optax.sgd(1.0))
    variants["full sampler"] = _family(family, sampler=fjs.sampling.full(N), cohort_size=None)
  if family in ROUND_FAMILIES and family not in NO_UPLINK:
    variants["identity uplink"] = _family(family, cohort_size=None,
                                          uplink=fjs.compressors.identity(_dim(family)))
  if family in SGD_CLIENTS:
    variants["client sgd(lr)"] = _family(family, client_optimizer=optax.sgd(_lr(family)),
                                         cohort_size=None)
    variants["client momentum"] = _family(
        family, client_optimizer=optax.sgd(_lr(family), momentum=0.9), cohort_size=None)
  out = dict(zip(variants, _one_round_each(list(variants.values()), family)))
  plain_state, plain = out["plain"]
  if "identity uplink" in out:
    ident = out["identity uplink"][0]
    _assert_same(ident.params, plain_state.params, f"{family}: identity uplink")
    _assert_same(ident.clients, plain_state.clients, f"{family}: identity uplink")
  if family in ROUND_FAMILIES:
    _assert_same(out["server sgd(1.0)"][0].params, plain_state.params,
                 f"{family}: server sgd(1.0)")
    _assert_same(out["full sampler"][0], plain_state, f"{family}: full sampler")
    _assert_same(out["full sampler"][1], plain, f"{family}: full sampler's info")
  if family in SGD_CLIENTS:
    _assert_same(out["client sgd(lr)"][0], plain_state,
                 f"{family}: client_optimizer=optax.sgd(lr)")
    # the model field (FedPM's θ; its deployed ``params`` is θ thresholded)
    assert not np.array_equal(np.asarray(out["client momentum"][0][0]["w"]),
                              np.asarray(plain_state[0]["w"])), family


def test_fedavgs_client_optimizer_sgd_is_the_papers_plain_sgd():
  """FedAvg with ``optax.sgd(lr)`` on its clients is the paper's local SGD: ``x ← x − η∇f``
  written out in NumPy for one full-batch step of one client."""
  data, model, loss, params = _setup()
  algo = fjs.fedavg(loss, optax.sgd(0.5), local_steps=1, batch_size=None, cohort_size=None)
  state, _ = _rounds(algo)
  grads = [jax.grad(loss)(params, data.x[i], data.y[i], data.mask[i]) for i in range(N)]
  n = np.asarray(data.num_examples, np.float64)
  want = {k: np.asarray(params[k]) - 0.5 * sum(n[i] / n.sum() * np.asarray(grads[i][k])
                                               for i in range(N)) for k in params}
  for k in params:
    np.testing.assert_allclose(np.asarray(state.params[k]), want[k], rtol=1e-5, atol=1e-6)


def test_a_new_method_is_a_client_update_on_the_round():
  """A client update no paper defines — sign of the local gradient, uploaded as a delta —
  runs under any aggregation and counts its own bits: here one bit per entry."""
  data, _, loss, params = _setup()

  def update(key, w, state, d, t):
    del key, t
    g = jax.grad(loss)(w, d.x, d.y, d.mask)
    return jax.tree.map(lambda gi: -0.01 * jax.numpy.sign(gi), g), state, {
        "loss": loss(w, d.x, d.y, d.mask)}

  client = CR.ClientUpdate(lambda key, p, n: (), update,
                           upload_bits=lambda m, p: float(D))
  algo = CR.cohort_round(client, cohort_size=3, weighting="uniform")
  state, (info,) = _rounds(algo)
  assert float(info.bits_up) == 3 * D and int(info.num_clients) == 3
  moved = np.abs(np.asarray(state.params["w"]) - np.asarray(params["w"]))
  assert np.all(moved <= 0.01 + 1e-7) and moved.max() > 0


def test_options_are_checked_by_name():
  client = CR.ClientUpdate(lambda key, p, n: (), lambda *a: None)
  with pytest.raises(ValueError, match="weighting"):
    CR.cohort_round(client, weighting="mean")
  with pytest.raises(ValueError, match="cohort_size.*sampler|sampler"):
    CR.cohort_round(client, cohort_size=2, sampler=fjs.sampling.full(4))
  with pytest.raises(ValueError, match="encoding"):
    CR.cohort_round(client, encoding="zip")
  with pytest.raises(TypeError, match="ClientUpdate"):
    CR.cohort_round(lambda *a: None)


UPLINKS = (None, "rand_k", "terngrad")
SERVERS = (None, "adam", "momentum")
SAMPLERS = ("uniform", "stratified", "full")


@hypothesis.settings(max_examples=3, deadline=None, derandomize=True,
                     suppress_health_check=list(hypothesis.HealthCheck))
@hypothesis.given(st.sampled_from(FAMILIES), st.sampled_from(SAMPLERS), st.sampled_from(UPLINKS),
                  st.sampled_from(SERVERS))
def test_random_compositions_run_finite_with_exact_uplink_bits(family, sampler, uplink, server):
  kw = {"cohort_size": None}
  if sampler == "uniform":
    kw["cohort_size"] = 3
  elif sampler == "stratified":
    kw.update(sampler=fjs.sampling.stratified(BLOCKS), weighting="sampling")
  else:
    kw.update(sampler=fjs.sampling.full(N))
  d = _dim(family)
  comp = {None: None, "rand_k": fjs.compressors.rand_k(d, 50),
          "terngrad": fjs.compressors.terngrad(d)}[uplink]
  kw["uplink"] = comp
  kw["server_optimizer"] = {None: None, "adam": optax.adam(0.01),
                            "momentum": optax.sgd(1.0, momentum=0.5)}[server]
  if family in NO_UPLINK:
    kw.pop("uplink")
    comp = None
  if family in NO_WEIGHTING:   # its mean counts every keeper once: no weighting option
    kw.pop("weighting", None)
  state, (info,) = _rounds(_family(family, **kw), 1, family)
  for leaf in jax.tree.leaves(state.params):
    assert np.all(np.isfinite(np.asarray(leaf)))
  members = int(info.num_clients)
  assert members == {"uniform": 3, "stratified": len(BLOCKS), "full": N}[sampler]
  if comp is not None:   # TernGrad's bits are not an integer: the float32 ledger rounds them
    assert float(info.bits_up) == pytest.approx(members * _uplink_bits(family, comp, d),
                                                rel=2 ** -23)
