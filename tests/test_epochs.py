"""The centralised epoch loop (runtime.epochs): every epoch a permutation in minibatches, the
scanned and host loops compute the same run, SGD on least squares reaches the closed-form
optimum, and a resumed run is the uninterrupted one (the runner's rules for checkpoints that
exist or disagree hold here too; ATO's loop: tests/test_ato.py)."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fedjaxsparse as fjs

epochs = fjs.runtime.epochs


def _problem(n=50, d=3, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, d)).astype(np.float32)
  y = (x @ np.array([1.0, -2.0, 0.5]) + 0.1 * rng.normal(size=n)).astype(np.float32)
  loss = lambda w, xb, yb: 0.5 * jnp.mean((xb @ w - yb) ** 2)  # noqa: E731
  return x, y, loss


def test_every_epoch_is_a_permutation_in_minibatches():
  order = np.asarray(epochs.epoch_order(jax.random.key(3), 50, 8))
  assert order.shape == (6, 8) and len(np.unique(order)) == 48 and order.max() < 50
  other = np.asarray(epochs.epoch_order(jax.random.fold_in(jax.random.key(3), 1), 50, 8))
  assert not np.array_equal(order, other)


def test_sgd_reaches_the_least_squares_optimum_and_both_loops_agree():
  x, y, loss = _problem()
  opt = optax.sgd(0.1)
  w0 = jnp.zeros(3)
  common = dict(key=jax.random.key(0), batch_size=10, progress=False)
  (w, _), hist = epochs.train_epochs(epochs.mean_loss_step(loss, opt), (w0, opt.init(w0)), x, y,
                                     epochs=300, **common)
  w_star = np.linalg.lstsq(x.astype(np.float64), y.astype(np.float64), rcond=None)[0]
  # constant-step SGD settles in a ball around w*: its radius shrinks with the step size
  assert np.linalg.norm(np.asarray(w) - w_star) < 0.05
  assert [h["epoch"] for h in hist] == list(range(1, 301)) and hist[-1]["loss"] < hist[0]["loss"]
  (ws, _), hs = epochs.train_epochs(epochs.mean_loss_step(loss, opt), (w0, opt.init(w0)), x, y,
                                    epochs=4, **common)
  (wh, _), hh = epochs.train_epochs(epochs.mean_loss_step(loss, opt), (w0, opt.init(w0)), x, y,
                                    epochs=4, loop="host", **common)
  np.testing.assert_allclose(np.asarray(ws), np.asarray(wh), rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose([h["loss"] for h in hs], [h["loss"] for h in hh], rtol=1e-6)


def test_a_resumed_run_is_the_uninterrupted_run(tmp_path):
  x, y, loss = _problem()
  opt = optax.sgd(0.05)
  w0 = jnp.zeros(3)
  seen = []

  def after(state, t, k):   # a second phase, given the epoch and its key
    seen.append(t)
    return (state[0] * 0.99, state[1])

  kw = dict(key=jax.random.key(1), batch_size=16, progress=False, after_epoch=after,
            evaluate=lambda s: float(loss(s[0], x, y)))
  want, hist = epochs.train_epochs(epochs.mean_loss_step(loss, opt), (w0, opt.init(w0)), x, y,
                                   epochs=5, **kw)
  ck = fjs.Checkpointing(str(tmp_path), every=2, fingerprint={"lr": 0.05})
  epochs.train_epochs(epochs.mean_loss_step(loss, opt), (w0, opt.init(w0)), x, y, epochs=3,
                      checkpoint=ck, **kw)
  with pytest.raises(fjs.errors.CheckpointExistsError, match="resume=True"):   # the runner's rules
    epochs.train_epochs(epochs.mean_loss_step(loss, opt), (w0, opt.init(w0)), x, y, epochs=5,
                        checkpoint=ck, **kw)
  with pytest.raises(fjs.errors.RunMismatchError,
                     match="config: lr: checkpoint has 0.05, this run has 0.1"):
    epochs.train_epochs(epochs.mean_loss_step(loss, opt), (w0, opt.init(w0)), x, y, epochs=5,
                        checkpoint=ck._replace(resume=True, fingerprint={"lr": 0.1}), **kw)
  seen.clear()
  got, hist2 = epochs.train_epochs(epochs.mean_loss_step(loss, opt), (w0, opt.init(w0)), x, y,
                                   epochs=5, checkpoint=ck._replace(resume=True), **kw)
  assert seen == [3, 4]                                    # epochs 1-3 came from the checkpoint
  with pytest.raises(fjs.errors.RunMismatchError, match="already holds 5 epochs but epochs=4"):
    epochs.train_epochs(epochs.mean_loss_step(loss, opt), (w0, opt.init(w0)), x, y, epochs=4,
                        checkpoint=ck._replace(resume=True), **kw)
  for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  untimed = lambda hs: [{k: v for k, v in h.items() if k != "seconds"} for h in hs]  # noqa: E731
  assert untimed(hist2) == untimed(hist) and hist2[-1]["metric"] < hist2[0]["metric"]


def test_bad_arguments_are_named():
  x, y, loss = _problem()
  step = epochs.mean_loss_step(loss, optax.sgd(0.1))
  state = (jnp.zeros(3), optax.sgd(0.1).init(jnp.zeros(3)))
  for kw, name in ((dict(epochs=0, batch_size=4), "epochs"),
                   (dict(epochs=1, batch_size=51), r"batch_size must be an int in \[1, 50\]"),
                   (dict(epochs=1, batch_size=4, loop="while"), "loop"),
                   (dict(epochs=1, batch_size=4, checkpoint=fjs.Checkpointing("d", every=-1)),
                    r"checkpoint\.every must be an int >= 0"),
                   (dict(epochs=1, batch_size=4, checkpoint=fjs.Checkpointing("d", interval_s=9)),
                    r"checkpoint\.interval_s must be 0")):
    with pytest.raises(ValueError, match=name):
      epochs.train_epochs(step, state, x, y, key=jax.random.key(0), progress=False, **kw)
  with pytest.raises(TypeError, match="fjs.Checkpointing"):
    epochs.train_epochs(step, state, x, y, key=jax.random.key(0), epochs=1, batch_size=4,
                        progress=False, checkpoint="d")
