"""Every entry of ``fjs.METHODS`` runs through ``fjs.run``: one round of each top-level
constructor on the tiniest problem it accepts finishes, leaves a finite global model, and
records finite, non-negative info / bit ledgers. ``BUILDERS`` must name exactly
``fjs.METHODS``, so a method added without a builder here fails."""
import functools

import jax
import numpy as np
import optax
import pytest

import fedjaxsparse as fjs

N, M, DIM, K = 4, 8, 6, 3   # clients, examples per client, features, classes


# --- tiny problems, built once per process -------------------------------------------------

@functools.lru_cache(maxsize=None)
def _ridge():
  """Heterogeneous least squares (the convex methods), ``N`` equal clients (so no size
  buckets): data, model, loss, initial params."""
  rng = np.random.default_rng(0)
  x = (rng.normal(size=(N * M, DIM)) + np.repeat(rng.normal(size=(N, DIM)), M, 0))
  y = x @ rng.normal(size=DIM) + 0.1 * rng.normal(size=N * M)
  data = fjs.data.pack_clients(x.astype(np.float32), y.astype(np.float32),
                               np.split(np.arange(N * M), N))
  model = fjs.models.linear_regression(DIM, l2=0.1)
  return data, model, fjs.models.make_loss(model), model.init(jax.random.key(0))


@functools.lru_cache(maxsize=None)
def _classification():
  """``N`` equal clients of ``M`` Gaussian examples in ``K`` classes and one dense layer."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=(N * M, DIM)).astype(np.float32)
  y = rng.integers(0, K, N * M).astype(np.int32)
  data = fjs.data.pack_clients(x, y, np.split(np.arange(N * M), N))
  model = fjs.models.mlp((DIM,), K, hidden=())
  return data, model, fjs.models.make_loss(model), model.init(jax.random.key(0))


@functools.lru_cache(maxsize=None)
def _split_model(gaussian: bool = True):
  """The representation network of FedCR / FedSR (body, Gaussian projection, head), or
  FedPAC's deterministic one (``gaussian=False``)."""
  from fedjaxsparse.models.split import fedcr_net
  return fedcr_net((DIM,), K, 2, gaussian=gaussian, conv=(), dense=(5,))


@functools.lru_cache(maxsize=None)
def _sparse_lasso():
  """A tiny sparse Lasso (the DDSS family): problem, data, initial x."""
  rng = np.random.default_rng(1)
  p = 8
  a = rng.standard_normal((24, p)) * (rng.uniform(size=(24, p)) < 0.4)
  a[np.arange(24), rng.integers(0, p, 24)] += 1.0   # every row touches something
  data = fjs.data.sparse_rows.from_dense(a, a @ rng.standard_normal(p))
  screening = fjs.convex.screening
  prob = screening.make_problem(data, 0.3 * screening.lambda_max(data))
  return prob, data, np.zeros(p)


def _dim(params) -> int:
  return sum(int(np.size(a)) for a in jax.tree.leaves(params))


def _stacked(params):
  """``params`` repeated for every client (``[N, ...]``): the FLIX local optima x_i*."""
  return jax.tree.map(lambda a: np.stack([np.asarray(a)] * N), params)


# --- one builder per method: () -> (algorithm, initial params, train data) -----------------

def _ridge_case(make):
  def build():
    data, _, loss, w0 = _ridge()
    return make(loss, w0), w0, data
  return build


def _cls_case(make):
  def build():
    data, model, loss, w0 = _classification()
    return make(loss, model, w0), w0, data
  return build


def _split_case(make, gaussian=True):
  def build():
    data = _classification()[0]
    model = _split_model(gaussian)
    return make(model), model.init(jax.random.key(0)), data
  return build


def _ddss_case(make):
  def build():
    prob, data, x0 = _sparse_lasso()
    return make(prob, data), x0, data
  return build


def _fedlpfm():
  data, model, _, w0 = _classification()
  logits = np.random.default_rng(2).normal(size=data.y.shape + (2, K)).astype(np.float32)
  data = fjs.algorithms.fedlpfm.pack_targets(data, logits)   # targets with two teachers' logits
  algo = fjs.fedlpfm(model, K, optax.sgd(0.1), local_steps=1, batch_size=None)
  return algo, w0, data


_SOLVER = lambda: fjs.convex.prox_solvers.gd(0.1, 2)
_DDSS = dict(step_size=0.01, inner_steps=4)

BUILDERS = {
    "fedavg": _cls_case(lambda loss, model, w0: fjs.fedavg(
        loss, optax.sgd(0.1), local_steps=1)),
    "fedprox": _cls_case(lambda loss, model, w0: fjs.fedprox(
        loss, optax.sgd(0.1), 0.1, local_steps=1)),
    "proxskip": _ridge_case(lambda loss, w0: fjs.proxskip(loss, 0.02, 0.5)),
    "sparse_proxskip": _ridge_case(lambda loss, w0: fjs.sparse_proxskip(loss, 0.02, 0.5, 0.5)),
    "sparse_proxskip_local": _ridge_case(
        lambda loss, w0: fjs.sparse_proxskip_local(loss, 0.02, 0.5, 0.5)),
    "sparse_proxskip_modified": _ridge_case(
        lambda loss, w0: fjs.sparse_proxskip_modified(loss, 0.02, 0.5, 0.5)),
    "accelerated_server_pruning": _ridge_case(
        lambda loss, w0: fjs.accelerated_server_pruning(loss, 0.02, 0.5, 0.5)),
    "accelerated_server_pruning_modified": _ridge_case(
        lambda loss, w0: fjs.accelerated_server_pruning_modified(loss, 0.02, 0.5, 0.5)),
    "meta_sparse_proxskip": _ridge_case(
        lambda loss, w0: fjs.meta_sparse_proxskip(loss, 0.02, 0.5)),
    "randprox_l1": _ridge_case(lambda loss, w0: fjs.randprox_l1(loss, 0.02, 0.5, 0.01)),
    "fedht": _ridge_case(lambda loss, w0: fjs.fedht(loss, 0.02, 1, 0.5)),
    "fediht": _ridge_case(lambda loss, w0: fjs.fediht(loss, 0.02, 1, 0.5)),
    "ef_bv": _ridge_case(lambda loss, w0: fjs.ef_bv(
        loss, fjs.compressors.top_k(_dim(w0), 2), 0.02, 0.5, 0.5)),
    "ef_bv_pp": _ridge_case(lambda loss, w0: fjs.ef_bv_pp(
        loss, fjs.compressors.top_k(_dim(w0), 2), 0.02, 0.5, 0.5, cohort_size=None)),
    "ef21": _ridge_case(lambda loss, w0: fjs.ef21(
        loss, fjs.compressors.top_k(_dim(w0), 2), 0.02)),
    "diana": _ridge_case(lambda loss, w0: fjs.diana(
        loss, fjs.compressors.rand_k(_dim(w0), 2), 0.02)),
    "prox_gd": _ridge_case(lambda loss, w0: fjs.prox_gd(loss, 0.02, _dim(w0))),
    "scafflix": _ridge_case(lambda loss, w0: fjs.scafflix(
        loss, np.full(N, 0.02), 0.5, np.full(N, 0.5), x_star=_stacked(w0))),
    "i_scaffnew": _ridge_case(lambda loss, w0: fjs.i_scaffnew(loss, 0.02, 0.5)),
    "flix_sgd": _ridge_case(lambda loss, w0: fjs.flix_sgd(
        loss, 0.02, np.full(N, 0.5), _stacked(w0))),
    "sppm_as": _ridge_case(lambda loss, w0: fjs.sppm_as(
        loss, fjs.sampling.nice(N, 2), 0.5, _SOLVER())),
    "fedprox_sppm_as": _ridge_case(lambda loss, w0: fjs.fedprox_sppm_as(
        loss, fjs.sampling.nice(N, 2), 0.5, _SOLVER())),
    "fedavg_sppm_as": _ridge_case(lambda loss, w0: fjs.fedavg_sppm_as(
        loss, fjs.sampling.nice(N, 2), 0.5, 0.5, _SOLVER())),
    "local_gd": _ridge_case(lambda loss, w0: fjs.local_gd(
        loss, fjs.sampling.nice(N, 2), 0.02, 1)),
    "fedspa": _cls_case(lambda loss, model, w0: fjs.fedspa(
        loss, 0.1, num_rounds=1, sparsity=0.5, search="rsm", epochs=1, batch_size=M,
        cohort_size=None)),
    "ditto": _cls_case(lambda loss, model, w0: fjs.ditto(
        loss, 0.1, global_epochs=1, personal_epochs=1, batch_size=M, cohort_size=None)),
    "subfedavg": _cls_case(lambda loss, model, w0: fjs.subfedavg(
        loss, 0.1, accuracy_fn=fjs.evaluation.client_accuracy(model), epochs=1, batch_size=M,
        cohort_size=None)),
    "fedpm": _cls_case(lambda loss, model, w0: fjs.fedpm(
        loss, 0.1, epochs=1, batch_size=M, cohort_size=None)),
    "fedmrn": _cls_case(lambda loss, model, w0: fjs.fedmrn(
        loss, 0.1, epochs=1, batch_size=M, cohort_size=None)),
    "fedp3": _cls_case(lambda loss, model, w0: fjs.fedp3(
        loss, optax.sgd(0.1),
        fjs.algorithms.fedp3.make_config(jax.random.key(1), np.ones((N, 1), bool), 0.9),
        local_steps=1, batch_size=None, cohort_size=None)),
    "fedp3_theory": _cls_case(lambda loss, model, w0: fjs.fedp3_theory(
        loss, 0.1, local_steps=1, prune=0.5, sketch="identity")),
    "fedlpfm": _fedlpfm,
    "fml": _cls_case(lambda loss, model, w0: fjs.fml(
        model, model, optax.sgd(0.1), local_steps=1, batch_size=None, cohort_size=None)),
    "sha_ddss_naive": _ddss_case(lambda prob, data: fjs.sha_ddss_naive(prob, data, **_DDSS)),
    "sha_ddss": _ddss_case(lambda prob, data: fjs.sha_ddss(prob, data, **_DDSS)),
    "dis_ddss_naive": _ddss_case(
        lambda prob, data: fjs.dis_ddss_naive(prob, data, workers=2, **_DDSS)),
    "dis_ddss": _ddss_case(lambda prob, data: fjs.dis_ddss(prob, data, workers=2, **_DDSS)),
    "prox_asvrg": _ddss_case(lambda prob, data: fjs.prox_asvrg(prob, data, **_DDSS)),
    "prox_asaga": _ddss_case(lambda prob, data: fjs.prox_asaga(prob, data, **_DDSS)),
    "pse": _ddss_case(lambda prob, data: fjs.pse(prob, data, inner_steps=4)),
    "fedcr": _split_case(lambda model: fjs.fedcr(
        model, 0.1, samples=1, epochs=1, batch_size=M, cohort_size=None)),
    "fedsr": _split_case(lambda model: fjs.fedsr(
        model, 0.1, epochs=1, batch_size=M, cohort_size=None)),
    "fedpac": _split_case(lambda model: fjs.fedpac(
        model, 0.1, epochs=1, head_epochs=0, batch_size=M, cohort_size=None, qp_iterations=5),
        gaussian=False),
}


def test_builders_cover_methods_exactly():
  missing = sorted(set(fjs.METHODS) - set(BUILDERS))
  extra = sorted(set(BUILDERS) - set(fjs.METHODS))
  assert not missing and not extra, (
      f"tests/test_methods.py BUILDERS out of step with fjs.METHODS: no builder for "
      f"{missing}; builders for names not in fjs.METHODS: {extra}")
  assert len(fjs.METHODS) == len(set(fjs.METHODS)), "fjs.METHODS lists a name twice"


# ``info`` fields that may legitimately be negative (none yet): every other recorded round
# field (loss, bits, floats, counts, norms, gaps, ...) must be finite and >= 0.
SIGNED_FIELDS = frozenset()


@pytest.mark.parametrize("name", fjs.METHODS)
def test_one_round_of_every_method_through_run(name):
  assert name in BUILDERS, f"no builder for fjs.{name} in tests/test_methods.py"
  algo, params, data = BUILDERS[name]()
  runnable = (fjs.Algorithm, fjs.runtime.population.CohortAlgorithm)
  assert isinstance(algo, runnable), (
      f"fjs.{name}(...) returned a {type(algo).__module__}.{type(algo).__qualname__}, not an "
      "fjs.Algorithm (or a CohortAlgorithm, which fjs.run runs on the device), so fjs.run "
      "cannot run it; fjs.METHODS promises a runnable algorithm")
  result = fjs.run(algo, jax.random.key(0), params, data, num_rounds=1, progress=False)
  assert result.diverged is None, f"{name}: diverged {result.diverged}"

  leaves = jax.tree_util.tree_leaves_with_path(fjs.global_params(result.state))
  assert leaves, f"{name}: the final global model has no leaves"
  for path, leaf in leaves:
    leaf = np.asarray(leaf)
    if np.issubdtype(leaf.dtype, np.floating):
      assert np.all(np.isfinite(leaf)), (
          f"{name}: global param {jax.tree_util.keystr(path)} is not finite")

  rounds = result.history.rounds
  assert rounds["round"] == [1], f"{name}: rounds recorded {rounds['round']}, want [1]"
  assert "loss" in rounds, f"{name}: info has no loss field (fields: {sorted(rounds)})"
  for field, values in rounds.items():
    assert len(values) == 1, f"{name}: {field!r} has {len(values)} entries after one round"
    arr = np.asarray(values)
    if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
      continue
    arr = arr.astype(np.float64)
    assert np.all(np.isfinite(arr)), f"{name}: {field!r} is not finite: {values}"
    if field not in SIGNED_FIELDS:
      assert np.all(arr >= 0), f"{name}: {field!r} is negative: {values}"
