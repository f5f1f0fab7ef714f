"""Centralised training by epochs: the one loop behind ATO's Algorithm 7, Fed-LPFM's
library-trained teacher and any model a user trains on pooled data before (or beside) a
federated run.

``train_epochs(step, state, x, y, ...)`` runs ``epochs`` passes over ``x [N, ...]``,
``y [N]``. Epoch ``t`` has its own key ``k_t = fold_in(key, t)``; its minibatches are the
first ``S·B`` entries of ``permutation(k_t, N)`` as ``[S, B]`` (``S = N // B``; the remainder
``N − S·B`` is left out that epoch), and step ``i`` calls ``step(state, x[idx_i], y[idx_i],
fold_in(k_t, i)) -> (state, info)`` (``info``: a pytree of scalars, averaged over the epoch).
After the steps, ``after_epoch(state, t, k_t) -> state`` (a second phase — ATO's controller
steps and mask update — or nothing), then ``evaluate(state) -> float``.

``loop="scan"``: one jitted ``lax.scan`` per epoch (accelerators; one dispatch per epoch);
``"host"``: every step its own jitted call from Python — on XLA:CPU a convolution inside a
loop body runs 10-40× slower (jax-ml/jax#12868). Both draw the same batches and keys and give
the same result up to float reassociation.

Checkpoints (``checkpoint=fjs.Checkpointing(directory, ...)``,
:class:`~fedjaxsparse.runtime.checkpoint.Checkpointing`) follow the runner's rules
(:func:`fedjaxsparse.runtime.checkpoint.open_checkpoint`): saved every ``checkpoint.every``
epochs (0: after the last only) with the history and the caller's ``checkpoint.fingerprint``;
``checkpoint.resume`` continues from the newest intact checkpoint of the same run, whose
history then covers every epoch.
"""
from __future__ import annotations

import functools
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from tqdm.auto import tqdm

from fedjaxsparse.runtime.checkpoint import (Checkpointing, check_checkpointing,
                                             check_resumable, open_checkpoint)
from fedjaxsparse.runtime.fingerprint import config_components
from fedjaxsparse.errors import check_int
from fedjaxsparse.core import public_dir as _public_dir

LOOPS = ("scan", "host")
"""How an epoch's steps execute: one jitted ``lax.scan`` or one jitted call per step."""

StepFn = Callable[[Any, jax.Array, jax.Array, jax.Array], tuple[Any, Any]]
"""``step(state, xb [B, ...], yb [B], key) -> (state, info)``: one minibatch update."""


@functools.partial(jax.jit, static_argnums=(1, 2))
def epoch_order(key: jax.Array, n: int, batch_size: int) -> jax.Array:
  """One epoch's minibatch indices ``int32 [n // batch_size, batch_size]``: a permutation of
  ``range(n)`` under ``key``, its last ``n mod batch_size`` entries left out."""
  steps = n // batch_size
  return jax.random.permutation(key, n)[:steps * batch_size].reshape(steps, batch_size)


_fold_in = jax.jit(jax.random.fold_in)  # an epoch's key: one program, not eager ops


def _record(info: Any) -> dict:
  items = info._asdict() if hasattr(info, "_asdict") else info
  if not isinstance(items, dict):
    items = {"loss": items}
  return {k: float(v) for k, v in items.items()}


def train_epochs(step: StepFn, state: Any, x: Any, y: Any, *, key: jax.Array, epochs: int,
                 batch_size: int, loop: str = "scan",
                 after_epoch: Callable[[Any, int, jax.Array], Any] | None = None,
                 evaluate: Callable[[Any], float] | None = None,
                 checkpoint: Checkpointing | None = None, progress: bool = True,
                 desc: str = "train", postfix: Callable[[dict], dict] | None = None
                 ) -> tuple[Any, list[dict]]:
  """Trains ``state`` for ``epochs`` epochs (see the module docstring).

  Args:
    step: ``(state, xb [B, ...], yb [B], key) -> (state, info)``; traced once.
    state: the initial state (any pytree; what is checkpointed).
    x, y: the training examples ``[N, ...]`` and targets ``[N]`` (host or device arrays).
    key: the run's key; epoch ``t`` uses ``fold_in(key, t)``.
    epochs: passes over the data (including those done before a resume).
    batch_size: examples per step, ``1 ≤ batch_size ≤ N``.
    loop: ``"scan"`` or ``"host"`` (the same result; see above).
    after_epoch: ``(state, t, k_t) -> state`` after each epoch's steps, before evaluation.
    evaluate: ``state -> float`` after each epoch (the record's ``metric``).
    checkpoint: the run's checkpoints, a
      :class:`~fedjaxsparse.runtime.checkpoint.Checkpointing` (above): ``every`` counts epochs
      (``0``: after the last only) and ``interval_s`` must be ``0``; ``None`` (default): none.
    progress, desc: a progress bar by epoch, labelled ``desc``; ``postfix(record)`` gives its
      fields (default: the loss and the metric).

  Returns:
    ``(state, history)``: one record per epoch — ``epoch`` (1-based), the epoch means of
    ``info``'s fields (a bare scalar ``info`` is ``loss``), ``seconds`` of training (steps and
    ``after_epoch``, not ``evaluate``) and ``metric`` when ``evaluate`` is given.
  """
  n = len(x)
  epochs = check_int("epochs", epochs, 1)
  if not isinstance(batch_size, int) or not 1 <= batch_size <= n:
    raise ValueError(f"batch_size must be an int in [1, {n}] (the number of examples), got "
                     f"{batch_size!r}.")
  if loop not in LOOPS:
    raise ValueError(f"loop must be one of {LOOPS}, got {loop!r}.")
  checkpoint = check_checkpointing(checkpoint, min_every=0, interval=False)
  xd, yd = jnp.asarray(x), jnp.asarray(y)

  def one(state, xd, yd, idx, key, i):
    return step(state, xd[idx], yd[idx], jax.random.fold_in(key, i))

  if loop == "scan":
    @jax.jit
    def run_epoch(state, xd, yd, order, key):
      state, info = jax.lax.scan(lambda st, i: one(st, xd, yd, order[i], key, i), state,
                                 jnp.arange(order.shape[0]))
      return state, jax.tree_util.tree_map(jnp.mean, info)
  else:
    # the step's minibatch taken from ``order`` inside the compiled step, not by an eager slice
    one_j = jax.jit(lambda state, xd, yd, order, key, i: one(state, xd, yd, order[i], key, i))

    def run_epoch(state, xd, yd, order, key):
      infos = []
      for i in range(order.shape[0]):
        state, info = one_j(state, xd, yd, order, key, i)
        infos.append(info)
      return state, jax.tree_util.tree_map(lambda *v: jnp.mean(jnp.stack(v)), *infos)

  fingerprint = config_components(   # a refused resume names what changed
      None if checkpoint is None else checkpoint.fingerprint)
  history, start, ckpt = [], 0, None
  if checkpoint is not None:
    ckpt = open_checkpoint(checkpoint.directory, resume=checkpoint.resume,
                           overwrite=checkpoint.overwrite)
  try:
    if ckpt is not None and ckpt.latest_round() is not None:
      check = functools.partial(check_resumable, ckpt, fingerprint=fingerprint, total=epochs,
                                option="epochs", unit="epochs", cli=None)
      state, meta = ckpt.restore_latest(jax.eval_shape(lambda: state),
                                        lambda m: check(meta=m, done=0))
      history, start = meta["history"], int(meta["epoch"])
      check(meta=meta, done=start)
    bar = tqdm(range(start, epochs), initial=start, total=epochs, desc=desc, unit="epoch",
               disable=not progress)
    for t in bar:
      t0 = time.perf_counter()
      k = _fold_in(key, t)
      state, info = run_epoch(state, xd, yd, epoch_order(k, n, batch_size), k)
      if after_epoch is not None:
        state = after_epoch(state, t, k)
      rec = {"epoch": t + 1, **_record(info)}
      rec["seconds"] = time.perf_counter() - t0
      if evaluate is not None:
        rec["metric"] = float(evaluate(state))
      history.append(rec)
      bar.set_postfix(**(postfix(rec) if postfix is not None else {
          k: f"{rec[k]:.3f}" for k in ("loss", "metric") if k in rec}))
      if ckpt is not None and (t + 1 == epochs or (checkpoint.every and
                                                   (t + 1) % checkpoint.every == 0)):
        ckpt.save(t + 1, state, {"epoch": t + 1, "history": history,
                                 "fingerprint": fingerprint})
  finally:
    if ckpt is not None:
      ckpt.close()
  return state, history


def mean_loss_step(loss: Callable[[Any, Any, Any], jax.Array], optimizer: Any) -> StepFn:
  """The plain supervised step for :func:`train_epochs`: ``state = (params, opt_state)``,
  one ``optimizer`` (optax) update on ``loss(params, xb, yb)`` (a scalar, e.g. the batch's
  mean cross-entropy); ``info`` is the loss before the update."""
  def step(state, xb, yb, key):
    del key
    params, opt_state = state
    value, g = jax.value_and_grad(loss)(params, xb, yb)
    updates, opt_state = optimizer.update(g, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), {"loss": value}

  return step


__all__ = ["LOOPS", "epoch_order", "train_epochs", "mean_loss_step"]
__dir__ = _public_dir(__all__)
