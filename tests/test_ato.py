"""Auto-Train-Once (fedjaxsparse.algorithms.ato; seed 004 Task 2, spec §2.10): the
straight-through Gumbel-sigmoid, the initial all-keep mask, plain training bit for bit when
λ = 0 or w ≡ 1, no prox before T_w, masked groups zeroed by the prox afterwards while kept
groups follow the base optimiser, w frozen outside [T_start, T_end], the controller driving
P(w) under the budget, the end-of-epoch "median" mask as the noisy masks' majority vote, the
host and scanned training loops agreeing, and resuming from a checkpoint."""
import functools
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fedjaxsparse as fjs

ato = fjs.algorithms.ato


@functools.lru_cache(maxsize=None)
def _net():
  """The digits MLP and its groups, built once (its ``init`` compiles once per process)."""
  module, model = fjs.models.prunable.mlp((64,), 10, hidden=(32, 16))
  return model, fjs.pruning.zig.trace(module, (64,))


def _setup(cfg, lr=0.05):
  """``(model, zigs, opt, algo)``: one algorithm per configuration and one optimiser per
  learning rate in the module, so tests of the same configuration share its compiled steps."""
  return _setup_cached(cfg, lr)


@functools.lru_cache(maxsize=None)
def _setup_cached(cfg, lr):
  model, zigs = _net()
  opt = _opt(lr)
  return model, zigs, opt, fjs.ato(model, zigs, opt, lambda t: lr, cfg)


@functools.lru_cache(maxsize=None)
def _opt(lr):
  return optax.sgd(lr, momentum=0.9)


_STATE: list = []
# the host-loop test's configuration: its ``ato.train`` compiles this algorithm's ``init``,
# the program ``_initial_state`` runs
_TRAIN_CFG = ato.ATOConfig(target=0.5, T_w=1, T_start=0, T_end=2, ctrl_lr=1e-2)


def _initial_state(algo, model):
  """``algo.init(key(0), model.init(key(1)))`` on the digits MLP, computed once per process
  (one program, ``_TRAIN_CFG``'s): ``init`` reads only the network, the optimisers' state
  layout and ``ctrl_input``, which every config of ``_setup`` shares (the layout is checked
  against this algorithm's own ``init``). The optimiser's initial state does not depend on
  the parameters' values (SGD's momentum starts at zero), so ``_replace(params=p)`` is
  ``algo.init(key, p)`` up to the controller's parameters and key, which the target step does
  not read."""
  key, params = jax.random.key(0), model.init(jax.random.key(1))
  if not _STATE:
    _STATE.append(jax.jit(_setup(_TRAIN_CFG)[3].init)(key, params))
  st, want = _STATE[0], jax.eval_shape(algo.init, key, params)
  assert jax.tree.structure(st) == jax.tree.structure(want)
  assert all(a.shape == b.shape and a.dtype == b.dtype
             for a, b in zip(jax.tree.leaves(st), jax.tree.leaves(want)))
  return st


def test_gumbel_sigmoid_straight_through_and_initial_mask():
  @jax.jit   # one program: the mask, its gradient and the sigmoid's derivative by hand
  def straight_through(o, key):
    w = ato.gumbel_sigmoid(o, key, 3.0, 0.4)
    s = jax.random.gumbel(key, o.shape)
    sig = jax.nn.sigmoid((o + s + 3.0) / 0.4)
    g = jax.grad(lambda o: jnp.sum(ato.gumbel_sigmoid(o, key, 3.0, 0.4) * jnp.arange(9.0)))(o)
    return w, g, sig * (1 - sig) / 0.4 * jnp.arange(9.0)

  w, g, want = straight_through(np.linspace(-6.0, 2.0, 9, dtype=np.float32), jax.random.key(0))
  assert set(np.unique(np.asarray(w))) <= {0.0, 1.0}
  np.testing.assert_allclose(np.asarray(g), np.asarray(want), rtol=1e-5, atol=1e-7)
  module, model = fjs.models.prunable.cifar_resnet(56)
  zigs = fjs.pruning.zig.trace(module, (32, 32, 3))
  algo = fjs.ato(model, zigs, optax.sgd(0.1), lambda t: 0.1, ato.ATOConfig())
  st = jax.eval_shape(lambda: algo.init(jax.random.key(1), {}))
  assert st.w.shape == (zigs.num_groups,)
  # op by op: the 27 heads share three shapes, so their operations compile once each (one
  # program would hold every head's initialisation apart and compile slower); the output of
  # the initialising pass itself (what ``apply`` with the new parameters computes)
  ctrl = ato.Controller(tuple(s.size for s in zigs.prunable))
  z = np.random.default_rng(2).normal(size=(len(zigs.prunable), 64)).astype(np.float32)
  o, _ = ctrl.init_with_output(jax.random.key(3), z)
  fracs = np.asarray(jax.jit(lambda o: jnp.stack([   # one program: five noisy masks' means
      jnp.mean(ato.gumbel_sigmoid(o, jax.random.key(k), 3.0, 0.4)) for k in range(5)]))(o))
  assert min(fracs) >= 0.99                                   # b = 3, τ = 0.4: nearly all keep


_PLAIN: dict = {}


def _plain(model, opt, params, batches):
  """The base optimiser alone, jitted like ATO's step (one program per model and optimiser
  in the module: ``_setup`` shares them)."""
  if (id(model), id(opt)) not in _PLAIN:
    @jax.jit
    def step(params, state, xb, yb):
      g = jax.grad(lambda p: jnp.mean(model.per_example_loss(model.apply(p, xb), yb)))(params)
      u, state = opt.update(g, state, params)
      return optax.apply_updates(params, u), state

    _PLAIN[id(model), id(opt)] = (step, jax.jit(opt.init), model, opt)   # (kept alive)
  step, init = _PLAIN[id(model), id(opt)][:2]
  state = init(params)
  for xb, yb in batches:
    params, state = step(params, state, xb, yb)
  return params


def test_reduces_to_plain_training_bit_for_bit(digits):
  """With λ = 0 (every group masked) and with the mask all ones, ATO's target step is plain
  training, bit for bit (both cases in one subprocess: they share the plain reference)."""
  x, y = digits
  batches = [(jax.device_put(x[i:i + 64]), jax.device_put(y[i:i + 64]))
             for i in range(0, 256, 64)]
  want = None
  for case in ("lam0", "w_ones"):
    # w_ones: λ = 20 in the prox phase (epoch 1 >= T_w), the configuration of the prox test
    # below (its target step is the same compiled program)
    cfg = (ato.ATOConfig(lam=0.0, T_w=0) if case == "lam0"
           else ato.ATOConfig(lam=20.0, T_w=1))
    model, zigs, opt, algo = _setup(cfg)
    params = model.init(jax.random.key(0))
    st = _initial_state(algo, model)._replace(params=params)   # = algo.init(key, params)
    if case == "lam0":
      st = st._replace(w=np.zeros(st.w.shape, st.w.dtype))     # every group masked, λ = 0
    else:
      st = st._replace(epoch=jax.device_put(np.int32(1)))       # w ≡ 1: λ_g = λ(1 − w) = 0
    step = jax.jit(algo.target_step)
    for xb, yb in batches:
      st, _ = step(st, xb, yb)
    want = _plain(model, opt, params, batches) if want is None else want
    for a, b in zip(jax.tree_util.tree_leaves(st.params), jax.tree_util.tree_leaves(want)):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=case)


def test_prox_phase_zeroes_masked_groups_and_spares_kept_ones(digits):
  x, y = digits
  model, zigs, opt, algo = _setup(ato.ATOConfig(lam=20.0, T_w=1), lr=0.05)   # ηλ = 1
  params = model.init(jax.random.key(0))
  st = _initial_state(algo, model)._replace(params=params)     # = algo.init(key, params)
  w = (np.arange(zigs.num_groups) % 3 != 0).astype(np.float32)
  st = st._replace(w=jax.device_put(w))
  xb, yb = jax.device_put(x[:64]), jax.device_put(y[:64])
  step = jax.jit(algo.target_step)
  before, _ = step(st, xb, yb)                                # epoch 0 < T_w: no prox
  plain = _plain(model, opt, params, [(xb, yb)])
  for a, b in zip(jax.tree_util.tree_leaves(before.params), jax.tree_util.tree_leaves(plain)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  after, info = step(st._replace(epoch=jax.device_put(np.int32(1))), xb, yb)   # same program
  norms = jax.jit(lambda p: fjs.pruning.zig.group_norms(zigs, p))
  nrm_plain, nrm = np.asarray(norms(plain)), np.asarray(norms(after.params))
  dead = (w == 0) & (nrm_plain <= 1.0)
  assert 0 < dead.sum() < (w == 0).sum()                      # some zeroed, some shrunk
  np.testing.assert_allclose(nrm[w == 0], np.maximum(nrm_plain[w == 0] - 1.0, 0), atol=1e-6)
  assert np.all(nrm[dead] == 0) and np.all(nrm[w == 1] == nrm_plain[w == 1])
  assert float(info.zero_groups) == pytest.approx(np.mean(dead))


def test_mask_frozen_outside_the_controller_window():
  model, zigs, opt, algo = _setup(ato.ATOConfig(T_start=1, T_end=2))
  st = _initial_state(algo, model)
  st = st._replace(w=np.zeros(st.w.shape, st.w.dtype))
  shifted = jax.tree_util.tree_map(lambda a: np.asarray(a) - np.float32(5.0),
                                   st.ctrl_params)                    # drives w to 0
  end_epoch = jax.jit(algo.end_epoch)                          # one program, four epochs
  st0 = end_epoch(st._replace(w=np.ones(st.w.shape, st.w.dtype), ctrl_params=shifted))
  assert np.all(np.asarray(st0.w) == 1)                       # epoch 0 < T_start: kept
  st1 = end_epoch(st0)                                         # epoch 1: regenerated
  assert float(np.mean(np.asarray(st1.w))) < 0.5
  st2 = end_epoch(st1._replace(ctrl_params=st.ctrl_params))    # epoch 2 = T_end: regenerated
  st3 = end_epoch(st2._replace(ctrl_params=shifted))          # epoch 3 > T_end: frozen
  np.testing.assert_array_equal(np.asarray(st3.w), np.asarray(st2.w))


@functools.lru_cache(maxsize=None)
def _median_flops(cfg):
  """P(w) of the end-of-epoch ("median") mask of ``cfg``'s controller, jitted."""
  _, zigs, _, algo = _setup(cfg)
  return jax.jit(lambda cp, ci: fjs.pruning.zig.flops(
      zigs, algo.mask_logits(cp, ci, None, ato.NOISE_MEDIAN["gumbel"])))


@pytest.mark.integration   # controller training runs to the FLOPs budget, both penalties
@pytest.mark.parametrize("penalty", ato.PENALTIES)
def test_controller_drives_flops_to_the_budget(digits, penalty):
  """(4-6) one-sided: P(w) ends at or under p·P_total (measured: far under, ~3 %); two-sided:
  it ends within 10 % of the budget."""
  x, y = digits
  cfg = ato.ATOConfig(target=0.4, gamma=4.0, ctrl_lr=1e-2, flops_penalty=penalty)
  model, zigs, opt, algo = _setup(cfg)
  st = _initial_state(algo, model)
  step = jax.jit(algo.ctrl_step)
  full = fjs.pruning.zig.total_flops(zigs)
  xb, yb = jax.device_put(x[:128]), jax.device_put(y[:128])
  for _ in range(75):                                           # P(w) settles in ~40 steps
    st, _ = step(st, xb, yb)
  # one program for both penalties (the mask does not depend on the penalty: the one-sided
  # configuration's mask_logits for both)
  ratio = float(_median_flops(cfg._replace(flops_penalty=ato.PENALTIES[0]))(
      st.ctrl_params, st.ctrl_input)) / full
  if penalty == "one_sided":
    assert ratio <= 0.4
  else:
    assert abs(ratio / 0.4 - 1) < 0.1


@pytest.mark.parametrize("noise", ato.NOISES)
def test_median_end_mask_is_the_noisy_masks_majority_vote(noise):
  """end_mask="median" keeps g iff P_s(round(sigmoid((o + s + b)/τ)) = 1) > 1/2, checked by
  Monte Carlo on groups whose keep probability is 6 standard errors away from 1/2; with
  Gumbel noise the literal noise-free mask keeps strictly fewer of them."""
  o = np.linspace(-4.5, -1.5, 301, dtype=np.float32)   # o + b around 0: probabilities vary
  n = 4000

  @jax.jit   # one program: the noisy masks' keep frequencies, the median and literal masks
  def masks(o, key):
    noisy = jax.vmap(lambda k: ato.gumbel_sigmoid(o, k, 3.0, 0.4, noise))(
        jax.random.split(key, n))
    return (jnp.mean(noisy, 0),
            ato.gumbel_sigmoid(o, None, 3.0, 0.4, noise, ato.NOISE_MEDIAN[noise]),
            ato.gumbel_sigmoid(o, None, 3.0, 0.4, noise))

  p_hat, median, literal = (np.asarray(v) for v in masks(o, jax.random.key(0)))
  clear = np.abs(p_hat - 0.5) > 6 * np.sqrt(0.25 / n)
  np.testing.assert_array_equal(median[clear], (p_hat > 0.5)[clear])
  if noise == "gumbel":
    assert literal.sum() < median.sum() and np.all(literal <= median)
  else:
    np.testing.assert_array_equal(literal, median)


def test_end_epoch_uses_the_configured_mask():
  """end_epoch regenerates w from the controller with the median shift (default) or none."""
  for end_mask, shift in (("median", ato.NOISE_MEDIAN["gumbel"]), ("noise_free", 0.0)):
    model, zigs, opt, algo = _setup(ato.ATOConfig(T_start=0, T_end=0, end_mask=end_mask))
    st = _initial_state(algo, model)
    # shift the controller's heads so that o + b sits near 0, where the shift matters
    ctrl = jax.tree_util.tree_map_with_path(
        lambda path, v: np.asarray(v) - np.float32(3.2) if "bias" in jax.tree_util.keystr(path)
        else v, st.ctrl_params)

    @jax.jit   # one program: the end-of-epoch mask and the controller's mask with the shift
    def masks(st, ctrl):
      return (algo.end_epoch(st._replace(ctrl_params=ctrl)).w,
              algo.mask_logits(ctrl, st.ctrl_input, None, shift))

    w, want = (np.asarray(v) for v in masks(st, ctrl))
    np.testing.assert_array_equal(w, want, err_msg=end_mask)
    assert 0 < float(np.mean(w)) < 1, end_mask


@pytest.mark.integration   # two training runs with checkpoints written and read back
def test_host_loop_resumes_and_reproduces_the_scan_loop(tmp_path, digits):
  """The scanned loop writes checkpoints after epochs 2 and 3; the host loop resumes from
  epoch 2 and runs epoch 3 (target steps with augmentation, the controller pass, the mask
  update) to the state the scanned loop reached."""
  x, y = digits
  x, y = x[:384], y[:384]
  cfg = _TRAIN_CFG   # the digits MLP: its ``init`` and ATO's are this module's programs
  model, zigs, _, algo = _setup(cfg)   # SGD with momentum 0.9, η = 0.05
  kw = dict(epochs=3, batch_size=64, ctrl_index=ato.controller_subset(len(x), 0.25),
            ctrl_batch=16, progress=False,
            augment=lambda k, xb: xb + 0.01 * jax.random.normal(k, xb.shape),
            evaluate=lambda p, w: float(np.sum(np.asarray(w))))
  params = model.init(jax.random.key(0))
  want, hist = ato.train(algo, cfg, jax.random.key(3), params, x, y,
                         checkpoint=fjs.Checkpointing(str(tmp_path), every=2), **kw)
  shutil.rmtree(tmp_path / "3")                                # as if stopped after epoch 2
  got, hist2 = ato.train(algo, cfg, jax.random.key(3), params, x, y, loop="host",
                         checkpoint=fjs.Checkpointing(str(tmp_path), every=0, resume=True),
                         **kw)
  assert 0 < float(np.mean(np.asarray(got.w))) < 1             # the controller pruned
  np.testing.assert_array_equal(np.asarray(got.w), np.asarray(want.w))
  for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
    np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64),
                               rtol=1e-4, atol=1e-5)
  assert [h["epoch"] for h in hist2] == [1, 2, 3] and hist2[:2] == hist[:2]
  assert hist2[2]["kept"] == hist[2]["kept"] and hist2[2]["metric"] == hist[2]["metric"]
  assert hist2[2]["loss"] == pytest.approx(hist[2]["loss"], rel=1e-4)
