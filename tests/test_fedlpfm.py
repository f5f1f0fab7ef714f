"""Fed-LPFM and its baselines (seed 004 Task 3, spec §3): λ = 1 is FedAvg bit for bit, FedProx
with μ = 0 is FedAvg bit for bit (μ > 0 pulls the local model to θ_t), the KL term is 0 when
student = teacher and matches its closed form otherwise, packed cached teacher logits give the
loss computed with the teacher on the fly, and FML's private models change only for the
round's participants (FML with α = 1 trains the meme model as FedAvg does)."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fedjaxsparse as fjs

fedlpfm = fjs.algorithms.fedlpfm


@pytest.fixture(scope="module")
def setup():
  from sklearn.datasets import load_digits
  d = load_digits()
  x, y = (d.data / 16.0).astype(np.float32)[:600], d.target.astype(np.int32)[:600]
  ds = fjs.data.federate(x, y, fjs.data.partition(y, 6, "dirichlet", alpha=0.5, seed=0),
                         num_classes=10, name="digits")
  model = fjs.models.mlp((64,), 10, hidden=(32,))
  teacher = fjs.models.mlp((64,), 10, hidden=(16,))
  tparams = teacher.init(jax.random.key(9))
  t_logits = jax.jit(jax.vmap(lambda xc: teacher.apply(tparams, xc)))(ds.train.x)   # [N, M, K]
  logits = np.stack([np.asarray(t_logits), 2.0 * np.asarray(t_logits)], 2)    # 2 teachers
  return ds, model, teacher, tparams, logits


def _rounds(algo, data, params, n=2):
  st = algo.init(jax.random.key(0), params, data)
  step = jax.jit(algo.step)
  for r in range(n):
    st, _ = step(jax.random.key(r + 1), st, data)
  return st.params


def _equal(a, b):
  for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
    np.testing.assert_array_equal(np.asarray(u), np.asarray(v))


@pytest.mark.integration   # multi-round runs compared (the integration tier's kind), for the unit tier's margin
def test_lambda_one_is_fedavg_and_fedprox_mu_zero_is_fedavg(setup):
  ds, model, _, _, logits = setup
  params = model.init(jax.random.key(1))
  kw = dict(local_steps=3, batch_size=16, cohort_size=4)
  base = _rounds(fjs.fedavg(fjs.models.make_loss(model), optax.sgd(0.1), **kw), ds.train, params)
  packed = fedlpfm.pack_targets(ds.train, logits)
  _equal(_rounds(fjs.fedlpfm(model, 10, optax.sgd(0.1), lam=1.0, **kw), packed, params), base)
  prox0 = fjs.fedavg(fjs.models.make_loss(model),
                     optax.chain(fjs.algorithms.fedprox.proximal(0.0), optax.sgd(0.1)), **kw)
  _equal(_rounds(prox0, ds.train, params), base)
  # μ large: the local models barely leave θ_t, so the round moves the global model less
  prox = fjs.fedavg(fjs.models.make_loss(model),
                    optax.chain(fjs.algorithms.fedprox.proximal(5.0), optax.sgd(0.1)), **kw)
  move = lambda p: sum(float(np.sum((np.asarray(a, np.float64) - np.asarray(b)) ** 2))  # noqa: E731
                       for a, b in zip(jax.tree_util.tree_leaves(p),
                                       jax.tree_util.tree_leaves(params)))
  assert move(_rounds(prox, ds.train, params)) < 0.5 * move(base)
  distilled = _rounds(fjs.fedlpfm(model, 10, optax.sgd(0.1), lam=0.5, **kw), packed, params)
  assert move(distilled) > 0 and not np.allclose(
      np.asarray(jax.tree_util.tree_leaves(distilled)[0]),
      np.asarray(jax.tree_util.tree_leaves(base)[0]))


# jitted (temperature and direction static): one program per shape instead of an eager op each
_kd_loss = jax.jit(fedlpfm.kd_loss, static_argnums=(2, 3))


@pytest.mark.parametrize("direction", fedlpfm.DIRECTIONS)
def test_kd_loss_zero_for_equal_logits_and_closed_form(direction):
  rng = np.random.default_rng(0)
  s = rng.standard_normal((5, 4)).astype(np.float32)
  t = rng.standard_normal((5, 3, 4)).astype(np.float32)
  for temp in (1.0, 3.0):
    same = _kd_loss(s, np.stack([s, s, s], 1), temp, direction)
    np.testing.assert_allclose(np.asarray(same), 0.0, atol=1e-6)
    got = np.asarray(_kd_loss(s, t, temp, direction))
    ps = np.exp(s / temp) / np.exp(s / temp).sum(-1, keepdims=True)
    pt = np.exp(t / temp) / np.exp(t / temp).sum(-1, keepdims=True)
    p, q = (pt, ps[:, None]) if direction == "forward" else (ps[:, None], pt)
    want = temp ** 2 * (p * np.log(p / q)).sum(-1).sum(-1)     # a sum over the 3 teachers
    np.testing.assert_allclose(got, want, rtol=1e-5)
  off = _kd_loss(s, t, 1.0, direction, np.asarray([1.0, 0.0, 1.0], np.float32))
  both = _kd_loss(s, t[:, [0, 2]], 1.0, direction)
  np.testing.assert_allclose(np.asarray(off), np.asarray(both), rtol=1e-6)
  with pytest.raises(ValueError, match="direction"):
    fedlpfm.kd_loss(s, t, 1.0, "sideways")


def test_packed_cached_logits_give_the_on_the_fly_loss(setup):
  ds, model, teacher, tparams, logits = setup
  packed = fedlpfm.pack_targets(ds.train, logits[:, :, :1])
  params = model.init(jax.random.key(2))
  loss = jax.jit(fedlpfm.fedlpfm_loss(model, 10, lam=0.3, temperature=2.0))
  unpack = jax.jit(fedlpfm.unpack_targets, static_argnums=1)
  c = 1
  x, mask, y = (np.asarray(a)[c] for a in (ds.train.x, ds.train.mask, ds.train.y))
  got = loss(params, x, np.asarray(packed.y)[c], mask)

  @jax.jit
  def on_the_fly_loss(params, x, y, mask):
    student = model.apply(params, x)
    on_the_fly = teacher.apply(tparams, x)[:, None]
    per = (0.3 * model.per_example_loss(student, y)
           + 0.7 * fedlpfm.kd_loss(student, on_the_fly, 2.0))
    return jnp.sum(per * mask) / jnp.sum(mask)

  want = on_the_fly_loss(params, x, y, mask)
  np.testing.assert_allclose(float(got), float(want), rtol=1e-6)
  labels, t, on = unpack(np.asarray(packed.y)[c], 10)
  np.testing.assert_array_equal(np.asarray(labels), np.asarray(y))
  assert np.all(np.asarray(on) == 1)
  with pytest.raises(ValueError, match="teacher_logits"):
    fedlpfm.pack_targets(ds.train, logits[0])
  # mixed teachers (Table 12): a per-client mask picks one of two teachers
  pick = np.eye(2, dtype=np.float32)[np.arange(ds.train.num_clients) % 2]
  mixed = fedlpfm.pack_targets(ds.train, logits, pick)
  mixed_y = np.asarray(mixed.y)
  for i in (0, 1):
    _, t, on = unpack(mixed_y[i], 10)
    np.testing.assert_array_equal(np.asarray(on), np.broadcast_to(pick[i], on.shape))
    np.testing.assert_allclose(np.asarray(t), logits[i], rtol=1e-6)
  only_second = fedlpfm.pack_targets(ds.train, logits[:, :, 1:])     # client c = 1 uses teacher 2
  np.testing.assert_allclose(float(loss(params, x, mixed_y[c], mask)),
                             float(loss(params, x, np.asarray(only_second.y)[c], mask)),
                             rtol=1e-6)


@pytest.mark.integration   # multi-round runs compared (the integration tier's kind), for the unit tier's margin
def test_fml_private_models_change_only_for_participants(setup):
  ds, model, _, _, _ = setup
  params = model.init(jax.random.key(3))
  algo = fjs.fml(model, model, optax.sgd(0.1), local_steps=2, batch_size=16, cohort_size=2)
  st = algo.init(jax.random.key(0), params, ds.train)
  new, info = jax.jit(algo.step)(jax.random.key(1), st, ds.train)
  before, after = ([np.asarray(a) for a in jax.tree_util.tree_leaves(fjs.personal_params(s))]
                   for s in (st, new))
  changed = np.array([any(not np.array_equal(a[i], b[i]) for a, b in zip(before, after))
                      for i in range(ds.train.num_clients)])
  assert changed.sum() == 2 and float(info.num_clients) == 2
  # α = 1: the meme model ignores the private one and trains as FedAvg's model
  kw = dict(local_steps=3, batch_size=16, cohort_size=4)
  base = _rounds(fjs.fedavg(fjs.models.make_loss(model), optax.sgd(0.1), **kw), ds.train, params)
  meme = _rounds(fjs.fml(model, model, optax.sgd(0.1), alpha=1.0, **kw), ds.train, params)
  for a, b in zip(jax.tree_util.tree_leaves(meme), jax.tree_util.tree_leaves(base)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
