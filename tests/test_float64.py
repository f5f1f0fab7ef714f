"""float64 means float64: under ``jax_enable_x64`` every family's tiny configuration (one
builder per code path: FedProx and FedIHT are FedAvg's round, DIANA is EF-BV's), started
from float64 parameters on float64 data, keeps every floating array of its state and of its
info (weights, step sizes, ledgers of bits and counts) in float64 — no float32 leaks in — and
sampling weights are the exact ``1/(n p_i)``; and a float32 model in the same float64 program
stays float32."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fedjaxsparse as fjs

N, M, D, K = 6, 12, 8, 3


@pytest.fixture(autouse=True)
def x64():
  with jax.enable_x64(True):
    yield


@pytest.fixture(scope="module")
def problem():
  with jax.enable_x64(True):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(N * M, D)), rng.integers(0, K, N * M).astype(np.int32)
    data = fjs.data.pack_clients(x, y, np.split(np.arange(N * M), N))
    data = data._replace(x=_f64(data.x), mask=_f64(data.mask))
    # one dense layer (kernel and bias): the dtype of every array is what is checked, and each
    # further layer only adds its copy of the same operations to every compiled round
    model = fjs.models.mlp((D,), K, hidden=())
    w0 = jax.tree.map(_f64, model.init(jax.random.key(0)))
    return data, model, w0


def _f64(a):
  """``a`` as a float64 array on the device (under ``jax_enable_x64``)."""
  return jax.device_put(np.asarray(a, np.float64))


def _d(w0):
  return sum(a.size for a in jax.tree.leaves(w0))


BUILDERS = {
    "FedAvg": lambda loss, model, w0: fjs.fedavg(
        loss, optax.sgd(0.1), local_steps=2, batch_size=4, cohort_size=3,
        uplink=fjs.compressors.top_k(_d(w0), 4), server_optimizer=optax.adam(0.1)),
    "FedAvg-sampling": lambda loss, model, w0: fjs.fedavg(
        loss, optax.sgd(0.1), local_steps=2, batch_size=4, sampler=fjs.sampling.nice(N, 3),
        weighting="sampling"),
    "Fed-LPFM": lambda loss, model, w0: fjs.fedlpfm(
        model, K, optax.sgd(0.1), lam=0.5, temperature=2.0, local_steps=2, batch_size=4,
        cohort_size=3),
    "FML": lambda loss, model, w0: fjs.fml(model, model, optax.sgd(0.1), local_steps=2,
                                           batch_size=4, cohort_size=3),
    "FedSpa": lambda loss, model, w0: fjs.fedspa(
        loss, 0.1, num_rounds=3, sparsity=0.5, epochs=1, batch_size=4, cohort_size=3,
        uplink=fjs.compressors.scaled_rand_k(_d(w0), _d(w0) // 2, seeded=True)),
    "FedMRN": lambda loss, model, w0: fjs.fedmrn(loss, 0.1, epochs=1, batch_size=4,
                                                 cohort_size=3),
    "FedPM": lambda loss, model, w0: fjs.fedpm(loss, 0.1, epochs=1, batch_size=4,
                                               cohort_size=3),
    "Ditto": lambda loss, model, w0: fjs.ditto(loss, 0.1, batch_size=4, cohort_size=3,
                                               global_epochs=1, personal_epochs=1),
    "Sub-FedAvg": lambda loss, model, w0: fjs.subfedavg(
        loss, 0.1, accuracy_fn=lambda p, x, y, m: jnp.asarray(0.9), epochs=1, batch_size=4,
        cohort_size=3),
    "FedP3": lambda loss, model, w0: fjs.fedp3(
        loss, optax.sgd(0.1),
        fjs.algorithms.fedp3.make_config(jax.random.key(1), np.ones((N, 1), bool), 0.9),  # 1 layer
        local_steps=2, batch_size=4, cohort_size=3, aggregation="weighted",
        local_rule="uniform"),
    "FedP3-theory": lambda loss, model, w0: fjs.fedp3_theory(
        loss, 0.1, local_steps=2, prune=0.5, sketch="identity"),
    "Scafflix": lambda loss, model, w0: fjs.scafflix(
        loss, np.full(N, 0.1), 0.5, np.full(N, 0.5),
        x_star=jax.tree.map(lambda a: _f64(np.stack([a] * N)), w0)),
    "Sparse-ProxSkip": lambda loss, model, w0: fjs.sparse_proxskip(loss, 0.1, 0.5, 0.5),
    "EF21": lambda loss, model, w0: fjs.ef21(loss, fjs.compressors.top_k(_d(w0), 4), 0.1),
    "SPPM-AS": lambda loss, model, w0: fjs.sppm_as(loss, fjs.sampling.nice(N, 3), 0.5,
                                                   fjs.convex.prox_solvers.gd(0.1, 3)),
}


def _float32_leaves(tree):
  return [(jax.tree_util.keystr(p), str(a.dtype)) for p, a in
          jax.tree_util.tree_leaves_with_path(tree)
          if hasattr(a, "dtype") and jnp.issubdtype(a.dtype, jnp.floating)
          and a.dtype != jnp.float64]


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_state_and_info_stay_float64(problem, name):
  data, model, w0 = problem
  algo = BUILDERS[name](fjs.models.make_loss(model), model, w0)
  if name == "Fed-LPFM":   # targets packed with two teachers' logits
    logits = np.random.default_rng(1).normal(size=data.y.shape + (2, K))
    data = fjs.algorithms.fedlpfm.pack_targets(data, logits)
    assert data.y.dtype == jnp.float64
  st = jax.jit(algo.init)(jax.random.key(1), w0, data)
  step = jax.jit(algo.step)
  for t in range(2):
    st, info = step(jax.random.key(t), st, data)
  assert _float32_leaves(st) == [] and _float32_leaves(info) == []
  assert np.isfinite(float(info.loss))


# the cohort averages of SPPM-AS (a sampler's float64 weights averaged into a float32 loop)
FLOAT32_EXTRA = {
    "FedProx-SPPM-AS": lambda loss, model, w0: fjs.fedprox_sppm_as(
        loss, fjs.sampling.nice(N, 3), 0.5, fjs.convex.prox_solvers.gd(0.1, 2)),
    "FedAvg-SPPM-AS": lambda loss, model, w0: fjs.fedavg_sppm_as(
        loss, fjs.sampling.nice(N, 3), 0.5, 0.1, fjs.convex.prox_solvers.gd(0.1, 2)),
    "LocalGD": lambda loss, model, w0: fjs.local_gd(loss, fjs.sampling.nice(N, 3), 0.1, 2),
    # a round schedule: a float64 step size of a float32 model
    "FedSpa-schedule": lambda loss, model, w0: fjs.fedspa(
        loss, optax.exponential_decay(0.1, 1, 0.998), num_rounds=3, sparsity=0.5, epochs=1,
        batch_size=4, cohort_size=3),
    "Ditto-schedule": lambda loss, model, w0: fjs.ditto(
        loss, optax.exponential_decay(0.1, 1, 0.998), batch_size=4, cohort_size=3,
        global_epochs=1, personal_epochs=1),
}


@pytest.mark.parametrize("name", sorted(BUILDERS) + sorted(FLOAT32_EXTRA))
def test_float32_models_stay_float32_in_a_float64_program(problem, name):
  """A float64 program (``jax_enable_x64``) runs a float32 model and keeps it float32: its
  global model after a round (one program: init and step) has the initial model's dtypes and
  finite values."""
  data, model, w0 = problem
  w32 = jax.tree.map(lambda a: a.astype(jnp.float32), w0)
  builder = BUILDERS.get(name) or FLOAT32_EXTRA[name]
  algo = builder(fjs.models.make_loss(model), model, w32)
  if name == "Fed-LPFM":
    data = fjs.algorithms.fedlpfm.pack_targets(
        data, np.random.default_rng(1).normal(size=data.y.shape + (2, K)))
  if name == "Scafflix":   # its local optima in the model's dtype
    algo = fjs.scafflix(fjs.models.make_loss(model), np.full(N, 0.1), 0.5, np.full(N, 0.5),
                        x_star=jax.tree.map(lambda a: jnp.stack([a] * N), w32))
  st, info = jax.jit(lambda w: algo.step(jax.random.key(0), algo.init(jax.random.key(1), w, data),
                                         data))(w32)
  got = fjs.global_params(st)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(w32), strict=True):
    assert a.dtype == b.dtype == jnp.float32, (name, a.dtype)
    assert np.all(np.isfinite(np.asarray(a))), name
  assert np.isfinite(float(info.loss))


def test_ddss_stays_float64():
  rng = np.random.default_rng(1)
  a = rng.standard_normal((30, 10)) * (rng.uniform(size=(30, 10)) < 0.4)
  data = fjs.data.sparse_rows.from_dense(a, a @ rng.standard_normal(10))
  prob = fjs.convex.screening.make_problem(data, 0.3 * fjs.convex.screening.lambda_max(data))
  algo = fjs.sha_ddss(prob, data, step_size=0.01, inner_steps=5)
  st = jax.jit(algo.init)(None, np.zeros(10), data)
  st, info = jax.jit(algo.step)(jax.random.key(0), st, data)
  assert _float32_leaves(st) == [] and _float32_leaves(info) == []


def test_ato_initialises_and_steps_in_float64():
  """The controller (GRU, LayerNorm, heads), its input and the mask follow the default float
  dtype; float32 parameters are accepted in a float64 program."""
  module, model = fjs.models.prunable.mlp((D,), K, hidden=(6,))
  zigs = fjs.pruning.zig.trace(module, (D,))
  algo = fjs.ato(model, zigs, optax.sgd(0.1), lambda t: 0.1,
                 fjs.algorithms.ato.ATOConfig(T_w=0, T_start=0))
  x = _f64(np.random.default_rng(0).normal(size=(8, D)))
  y = jax.device_put(np.arange(8, dtype=np.int32) % K)
  params32 = model.init(jax.random.key(0))
  params = jax.tree.map(_f64, params32)
  st = jax.jit(algo.init)(jax.random.key(0), params)
  st, info = jax.jit(algo.target_step)(st, x, y)
  st, cinfo = jax.jit(algo.ctrl_step)(st, x, y)
  st = jax.jit(algo.end_epoch)(st)
  assert _float32_leaves(st) == [] and _float32_leaves((info, cinfo)) == []
  st32 = jax.eval_shape(algo.init, jax.random.key(0), params32)   # float32 params
  assert st32.ctrl_input.dtype == jnp.float64


def test_sampling_weights_are_exact_in_float64():
  """``1/(n p_i)`` of a non-uniform sampler, to the last float64 bit."""
  p = np.array([0.1, 0.2, 0.3, 0.15, 0.25])
  s = fjs.sampling.nonuniform(p)
  sample = jax.jit(s.sample)
  for k in range(5):
    c = sample(jax.random.key(k))
    i = int(np.asarray(c.ids)[0])
    assert c.weights.dtype == jnp.float64 and float(np.asarray(c.weights)[0]) == 1.0 / (5 * p[i])
