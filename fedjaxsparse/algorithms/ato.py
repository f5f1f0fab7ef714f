"""Auto-Train-Once: train a network and prune whole zero-invariant groups in one run.

References:
  Xidong Wu, Shangqian Gao, Zeyu Zhang, Zhenzhen Li, Runxue Bao, Yanfu Zhang, et al. (2024).
    Auto-Train-Once: Controller Network Guided Automatic Network Pruning from Scratch. CVPR
    2024. arXiv:2403.14729.

``min_M L(M) + Σ_g λ_g‖[M]_g‖₂`` with ``λ_g = λ(1 − w_g)``: a controller network emits the
binary group mask ``w`` (1 = keep); the target step is an optimiser step on ``L`` (SGD with
momentum in the paper) followed, from epoch ``T_w`` on, by the group prox (4-4) with threshold
``η_t λ_g`` (the Euclidean prox after the optimiser step, the paper's practice (4-14)) or by the
half-space projector (4-3) (``projector="hsp"``: the step then includes the subgradient
``λ_g [M]_g/‖[M]_g‖`` of the penalty — OTO's HSPG — and groups of ``w_g = 0`` failing
``[z]_gᵀ[M]_g ≥ ε‖[M]_g‖²`` are zeroed; ε is not in the seed). In epochs
``T_start ≤ t ≤ T_end`` the controller is trained on a fixed 5 % subset ``D_CN`` with
``L(f(x; M, w)) + γ R_FLOPs(P(w), p P_total)`` (4-5)/(4-6), M frozen, Adam 1e-3, and ``w`` is
regenerated at the end of the epoch; afterwards ``w`` stays frozen. No fine-tuning: the result
is physically compressed (:func:`fedjaxsparse.pruning.zig.compress`).

Controller (Table 7): an input ``[|B|, 64]`` (``ctrl_input="learned"`` or ``"fixed"`` random —
not specified), a bidirectional GRU 64 → 2×128, LayerNorm + ReLU, one linear head per block
(here a block is one prunable channel set: a block's inner channels, a stage's stream, an
inverted residual's hidden channels), concatenated to ``o [G]``;
``w = round(sigmoid((o + s + b)/τ))`` with a straight-through round, b = 3, τ = 0.4 and
``s`` one Gumbel(0, 1) sample per group as the text says (``noise="logistic"``: the usual
difference of two Gumbels). ``w`` starts at all ones (sigmoid(7.5) ≈ 0.9994).

Choices where the seed is silent, each an option: ``mask_in_target_forward`` (default False:
the literal (4-2) — the target's forward pass is unmasked and ``w`` acts through ``λ_g`` only);
``end_mask``, how the end-of-epoch mask is regenerated — ``"median"`` (default): keep group g
iff the noisy mask keeps it with probability > 1/2, i.e. ``round(sigmoid((o + b + m)/τ))``
with ``m`` the noise's median (−ln ln 2 ≈ 0.367 for Gumbel, 0 for logistic); ``"noise_free"``:
``round(sigmoid((o + b)/τ))``, which with Gumbel noise keeps fewer groups than the noisy
masks the controller was trained with (the Gumbel's median is positive; tested);
``"sample"``: one fresh noisy draw; ``flops_penalty`` — ``"one_sided"`` (4-6) as printed,
which is 0 anywhere under the budget, or ``"two_sided"`` ``|log(P/(pP_total))|``, which also
penalises falling below it; the FLOPs ``P(w)`` of :func:`fedjaxsparse.pruning.zig.flops`
(DMC-style, an assumption).
With ``λ = 0`` or ``w ≡ 1`` the target step is plain training with the base optimiser, bit for
bit (tested).

Source for the team: seed 004 Task 2, Algorithms 7-8, l. 900-968; spec ``seed004.md`` §2.2-§2.5,
§2.7, §2.11.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjaxsparse.pruning import zig as Z
from fedjaxsparse.core import Model, float_dtype
from fedjaxsparse.runtime.checkpoint import Checkpointing
from fedjaxsparse.runtime.epochs import epoch_order, train_epochs
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["ATOConfig", "Controller", "gumbel_sigmoid", "ATOState", "ATOInfo", "ATO", "ato",
           "controller_subset", "train"]
__dir__ = _public_dir(__all__)

PROJECTORS = ("prox", "hsp")
NOISES = ("gumbel", "logistic")
END_MASKS = ("median", "noise_free", "sample")
PENALTIES = ("one_sided", "two_sided")
NOISE_MEDIAN = {"gumbel": -float(np.log(np.log(2.0))), "logistic": 0.0}


class ATOConfig(NamedTuple):
  """Table 6/§2.7 defaults; epochs are counted from 0 (``T_w``, ``T_start``, ``T_end``)."""
  target: float = 0.5          # p: the remaining FLOPs fraction
  lam: float = 10.0
  gamma: float = 4.0
  b: float = 3.0
  tau: float = 0.4
  T_w: int = 1
  T_start: int = 0
  T_end: int = 1
  projector: str = "prox"
  hsp_eps: float = 0.0
  mask_in_target_forward: bool = False
  noise: str = "gumbel"
  end_mask: str = "median"
  flops_penalty: str = "one_sided"
  ctrl_lr: float = 1e-3
  ctrl_input: str = "learned"

  def validate(self) -> "ATOConfig":
    if not 0 < self.target <= 1:
      raise ValueError(f"target must be in (0, 1], got {self.target!r}.")
    if self.lam < 0 or self.gamma < 0 or not self.tau > 0:
      raise ValueError(f"lam and gamma must be >= 0 and tau > 0, got {self.lam!r}, "
                       f"{self.gamma!r}, {self.tau!r}.")
    if not 0 <= self.T_start <= self.T_end or self.T_w < 0:
      raise ValueError(f"need 0 <= T_start <= T_end and T_w >= 0, got T_start={self.T_start}, "
                       f"T_end={self.T_end}, T_w={self.T_w}.")
    if self.projector not in PROJECTORS:
      raise ValueError(f"projector must be one of {PROJECTORS}, got {self.projector!r}.")
    if self.noise not in NOISES:
      raise ValueError(f"noise must be one of {NOISES}, got {self.noise!r}.")
    if self.end_mask not in END_MASKS:
      raise ValueError(f"end_mask must be one of {END_MASKS}, got {self.end_mask!r}.")
    if self.flops_penalty not in PENALTIES:
      raise ValueError(f"flops_penalty must be one of {PENALTIES}, got {self.flops_penalty!r}.")
    if self.ctrl_input not in ("learned", "fixed"):
      raise ValueError(f"ctrl_input must be 'learned' or 'fixed', got {self.ctrl_input!r}.")
    return self


class Controller(nn.Module):
  """Table 7: ``[|B|, 64] → o [G]`` (``block_sizes`` = ``len(B_i)``); parameters, the GRU state and
  the computation in ``param_dtype`` (:func:`ato` passes the default float dtype)."""
  block_sizes: tuple
  hidden: int = 128
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, z):
    dt = dict(dtype=self.param_dtype, param_dtype=self.param_dtype)
    h = nn.Bidirectional(nn.RNN(nn.GRUCell(self.hidden, **dt)),
                         nn.RNN(nn.GRUCell(self.hidden, **dt)))(z[None])[0]
    h = nn.relu(nn.LayerNorm(**dt)(h))
    return jnp.concatenate([nn.Dense(size, name=f"head{i}", **dt)(h[i])
                            for i, size in enumerate(self.block_sizes)])


def gumbel_sigmoid(o: jax.Array, key: jax.Array | None, b: float, tau: float,
                   noise: str = "gumbel", shift: float = 0.0) -> jax.Array:
  """``round(sigmoid((o + s + b)/τ))`` with a straight-through round (forward values in
  {0, 1}, gradient of the sigmoid); ``key=None``: ``s = shift`` instead of a noise draw."""
  s = shift
  if key is not None:
    s = (jax.random.gumbel(key, o.shape) if noise == "gumbel"
         else jax.random.logistic(key, o.shape))
  soft = jax.nn.sigmoid((o + s + b) / tau)
  return soft + jax.lax.stop_gradient(jnp.round(soft) - soft)


class ATOState(NamedTuple):
  params: Any
  opt_state: Any
  ctrl_params: Any
  ctrl_opt_state: Any
  ctrl_input: jax.Array     # [|B|, 64]
  w: jax.Array              # [G] in {0, 1}
  epoch: jax.Array          # int32
  step: jax.Array           # int32, target steps taken
  key: jax.Array            # uint32 key data (checkpointable)


class ATOInfo(NamedTuple):
  loss: jax.Array
  flops: jax.Array           # P(w) / P_total
  kept: jax.Array            # fraction of groups with w = 1
  zero_groups: jax.Array     # fraction of groups that are exactly 0


class ATO(NamedTuple):
  init: Callable
  target_step: Callable      # (state, x, y) -> (state, ATOInfo)
  ctrl_step: Callable        # (state, x, y) -> (state, loss)
  end_epoch: Callable        # state -> state
  mask_logits: Callable      # (ctrl_params, ctrl_input, key|None) -> w


def ato(model: Model, zigs: Z.ZIGs, optimizer: optax.GradientTransformation,
        learning_rate: Callable[[jax.Array], jax.Array], config: ATOConfig = ATOConfig()
        ) -> ATO:
  """Auto-Train-Once (Wu et al., 2024): train a network from scratch while a controller network
  chooses which zero-invariant groups to prune; the penalised groups are driven to exactly 0
  during training, so the result is compressed without fine-tuning.

  The target network's weights M are split into the G zero-invariant groups of ``zigs`` (the
  weights producing one channel: zeroing ``[M]_g`` removes the channel). ATO solves
  ``min_M L(M) + Σ_g λ_g ‖[M]_g‖₂`` with ``λ_g = λ(1 − w_g)``, where the controller emits the
  binary group mask ``w [G]`` (1 = keep):

  * **Target step** (every batch): a step of the base ``optimizer`` on L, then, from epoch
    ``T_w`` on, the group prox ``[M]_g ← max(0, 1 − η_t λ_g/‖[M]_g‖)·[M]_g``
    (``projector="prox"``; ``η_t = learning_rate(step)``), or OTO's half-space projection
    (``projector="hsp"``: the step includes the subgradient ``λ_g [M]_g/‖[M]_g‖`` and a
    penalised group whose trial point z fails ``[z]_gᵀ[M]_g ≥ ε‖[M]_g‖²`` is zeroed).
    Groups with ``w_g = 1`` are not penalised.
  * **Controller**: ``o [G]`` from a bidirectional GRU (64 → 2×128, LayerNorm, ReLU, one
    linear head per block of groups) on an input ``[|B|, 64]``;
    ``w = round(sigmoid((o + s + b)/τ))`` with Gumbel noise s and a straight-through round.
    In epochs ``T_start ≤ t ≤ T_end`` it is trained with Adam on a fixed small subset of the
    data (``D_CN``) to minimise ``L(f(x; M, w)) + γ R_FLOPs(P(w), p·P_total)`` with M frozen
    (w gating the channels), and ``w`` is regenerated at the end of each such epoch; outside
    that window ``w`` stays frozen. ``w`` starts at all ones.

  Epochs count from 0. Options where the paper is silent (the end-of-epoch mask, the FLOPs
  penalty's shape, noise, the controller's input) are fields of ``config``; the module
  docstring (:mod:`fedjaxsparse.algorithms.ato`) has the details. After training,
  :func:`fedjaxsparse.pruning.zig.compress` removes the zero groups physically. Typical use::

    module, model = fjs.models.prunable.mlp((64,), 10, hidden=(32, 16))
    zigs = fjs.pruning.zig.trace(module, (64,))
    cfg = fjs.algorithms.ato.ATOConfig(target=0.5)
    algo = fjs.ato(model, zigs, optax.sgd(0.05, momentum=0.9), lambda t: 0.05, cfg)
    state, history = fjs.algorithms.ato.train(
        algo, cfg, key, model.init(key), x, y, epochs=3, batch_size=64,
        ctrl_index=fjs.algorithms.ato.controller_subset(len(x)))

  Args:
    model: the network, a :class:`~fedjaxsparse.core.Model` built from
      :mod:`fedjaxsparse.models.prunable` (its ``apply`` and ``per_example_loss`` give L).
    zigs: its zero-invariant groups (:class:`fedjaxsparse.pruning.zig.ZIGs`, from
      ``fjs.pruning.zig.trace(module, input_shape)``); the controller has one head per
      prunable channel set.
    optimizer: the base optax optimiser of the target network (SGD with momentum in the
      paper).
    learning_rate: ``step -> η_t``, the base optimiser's step size at target step t (the prox
      threshold is ``η_t λ_g``).
    config: an :class:`~fedjaxsparse.algorithms.ato.ATOConfig` (validated): ``target`` (p, the
      FLOPs fraction to keep, default 0.5), ``lam`` (λ, 10), ``gamma`` (γ, 4), ``b`` (3) and
      ``tau`` (τ, 0.4) of the mask, the epochs ``T_w`` (1), ``T_start`` (0), ``T_end`` (1),
      ``projector`` (``"prox"`` or ``"hsp"``) and ``hsp_eps`` (ε, 0), ``ctrl_lr`` (Adam's,
      1e-3), and the unspecified choices ``mask_in_target_forward`` (False: w acts only
      through λ_g), ``noise`` (``"gumbel"`` or ``"logistic"``), ``end_mask`` (``"median"``,
      ``"noise_free"`` or ``"sample"``), ``flops_penalty`` (``"one_sided"`` as printed, or
      ``"two_sided"``) and ``ctrl_input`` (``"learned"`` or ``"fixed"``).

  Returns:
    An :class:`~fedjaxsparse.algorithms.ato.ATO` trainer — a named tuple of pure functions,
    not an :class:`~fedjaxsparse.core.Algorithm`; :func:`fedjaxsparse.algorithms.ato.train`
    runs it (target steps over shuffled batches, the controller pass in its window, then
    ``end_epoch``) and returns ``(state, history)``, ``history`` one record per epoch
    (``epoch``, the epoch means of ``loss``, ``flops``, ``kept``, ``zero_groups``,
    ``seconds``, and ``metric`` when ``evaluate`` is given). Its fields:
    ``init(key, params)`` gives an :class:`~fedjaxsparse.algorithms.ato.ATOState`:
    ``state.params`` (the target network), ``opt_state``, ``ctrl_params`` and
    ``ctrl_opt_state`` (the controller's), ``ctrl_input [|B|, 64]``, ``w [G]`` (the mask, in
    {0, 1}), ``epoch`` and ``step`` (int32: epochs ended, target steps taken) and ``key``
    (uint32 key data, checkpointable). ``target_step(state, x, y)`` returns
    ``(state, info)``, an :class:`~fedjaxsparse.algorithms.ato.ATOInfo`: ``loss`` (the
    batch's unpenalised loss L before the step), ``flops`` (``P(w)/P_total`` of the current
    mask), ``kept`` (the fraction of groups with ``w_g = 1``) and ``zero_groups`` (the
    fraction of groups exactly 0 after the step). ``ctrl_step(state, x, y)`` returns
    ``(state, loss)`` (one Adam step of the controller; ``loss`` its objective);
    ``end_epoch(state)`` regenerates ``w`` (inside the window) and advances ``epoch``;
    ``mask_logits(ctrl_params, ctrl_input, key, shift=0.0)`` returns the straight-through
    mask ``w`` (noisy for a key, ``s = shift`` for ``key=None``).

  References:
    Xidong Wu, Shangqian Gao, Zeyu Zhang, Zhenzhen Li, Runxue Bao, Yanfu Zhang, et al. (2024).
      Auto-Train-Once: Controller Network Guided Automatic Network Pruning from Scratch. CVPR
      2024. arXiv:2403.14729.

  Source for the team: seed 004 Task 2, Algorithms 7-8; spec ``seed004.md`` §2.2-§2.5.
  """
  cfg = config.validate()
  sizes = tuple(s.size for s in zigs.prunable)
  dtype = float_dtype()                  # the controller's, fixed when the algorithm is built
  controller = Controller(sizes, param_dtype=dtype)
  ctrl_opt = optax.adam(cfg.ctrl_lr)
  budget = cfg.target * Z.total_flops(zigs)
  total = float(Z.total_flops(zigs))

  def loss_fn(params, x, y):
    return jnp.mean(model.per_example_loss(model.apply(params, x), y))

  def init(key, params):
    k_in, k_ctrl, key = jax.random.split(key, 3)
    z = jax.random.normal(k_in, (len(sizes), 64), dtype)
    ctrl_params = controller.init(k_ctrl, z)
    if cfg.ctrl_input == "learned":
      ctrl_params = {"params": ctrl_params["params"], "input": z}
    return ATOState(params, optimizer.init(params), ctrl_params, ctrl_opt.init(ctrl_params), z,
                    jnp.ones(zigs.num_groups), jnp.zeros((), jnp.int32),
                    jnp.zeros((), jnp.int32), jax.random.key_data(key))

  def mask_logits(ctrl_params, ctrl_input, key, shift=0.0):
    z = ctrl_params.get("input", ctrl_input)
    o = controller.apply({"params": ctrl_params["params"]}, z)
    return gumbel_sigmoid(o, key, cfg.b, cfg.tau, cfg.noise, shift)

  def target_step(state, x, y):
    penalised = state.epoch >= cfg.T_w
    lam_g = cfg.lam * (1.0 - state.w) * penalised

    def objective(params):
      if cfg.mask_in_target_forward:
        with Z.gate(zigs, state.w):
          loss = loss_fn(params, x, y)
      else:
        loss = loss_fn(params, x, y)
      if cfg.projector == "hsp":   # HSPG: the penalty's subgradient enters the step
        return loss + jnp.sum(lam_g * Z.group_norms(zigs, params)), loss
      return loss, loss

    grads, loss = jax.grad(objective, has_aux=True)(state.params)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    if cfg.projector == "prox":
      params = Z.group_prox(zigs, params, learning_rate(state.step) * lam_g)
    else:
      params = Z.hsp(zigs, params, state.params, cfg.hsp_eps, lam_g > 0)
    nrm = Z.group_norms(zigs, params)
    info = ATOInfo(loss, Z.flops(zigs, state.w) / total, jnp.mean(state.w),
                   jnp.mean((nrm == 0).astype(dtype)))
    return state._replace(params=params, opt_state=opt_state, step=state.step + 1), info

  def ctrl_step(state, x, y):
    key, sub = jax.random.split(jax.random.wrap_key_data(state.key))
    frozen = jax.lax.stop_gradient(state.params)

    def objective(ctrl_params):
      w = mask_logits(ctrl_params, state.ctrl_input, sub)
      with Z.gate(zigs, w):
        loss = loss_fn(frozen, x, y)
      return loss + cfg.gamma * Z.flops_regularizer(Z.flops(zigs, w), budget,
                                                    cfg.flops_penalty == "two_sided")

    loss, grads = jax.value_and_grad(objective)(state.ctrl_params)
    updates, opt_state = ctrl_opt.update(grads, state.ctrl_opt_state, state.ctrl_params)
    return state._replace(ctrl_params=optax.apply_updates(state.ctrl_params, updates),
                          ctrl_opt_state=opt_state, key=jax.random.key_data(key)), loss

  def end_epoch(state):
    key, sub = jax.random.split(jax.random.wrap_key_data(state.key))
    fresh = mask_logits(state.ctrl_params, state.ctrl_input,
                        sub if cfg.end_mask == "sample" else None,
                        NOISE_MEDIAN[cfg.noise] if cfg.end_mask == "median" else 0.0)
    window = (state.epoch >= cfg.T_start) & (state.epoch <= cfg.T_end)
    return state._replace(w=jnp.where(window, jax.lax.stop_gradient(fresh), state.w),
                          epoch=state.epoch + 1, key=jax.random.key_data(key))

  return ATO(init, target_step, ctrl_step, end_epoch, mask_logits)


_fold_in = jax.jit(jax.random.fold_in)   # one program (epochs' too), not eager operations


def controller_subset(n: int, fraction: float = 0.05, seed: int = 0) -> np.ndarray:
  """``D_CN``: a fixed random ``fraction`` of the n training indices (at least one)."""
  if not 0 < fraction <= 1:
    raise ValueError(f"fraction must be in (0, 1], got {fraction!r}.")
  rng = np.random.default_rng(seed)
  return np.sort(rng.choice(n, max(1, int(round(fraction * n))), replace=False))


def train(algo: ATO, config: ATOConfig, key: jax.Array, params: Any, x: np.ndarray,
          y: np.ndarray, *, epochs: int, batch_size: int, ctrl_index: np.ndarray,
          ctrl_batch: int | None = None,
          evaluate: Callable[[Any, jax.Array], float] | None = None, augment=None,
          checkpoint: Checkpointing | None = None, loop: str = "scan",
          progress: bool = True, desc: str = "ATO") -> tuple[ATOState, list[dict]]:
  """Algorithm 7 for ``epochs`` epochs over ``x [N, ...]``, ``y [N]``: each epoch
  ``N // batch_size`` target steps over a fresh permutation (``augment(key, x)`` per batch),
  then — if ``T_start ≤ epoch ≤ T_end`` — controller steps over ``D_CN = x[ctrl_index]`` in
  batches of ``ctrl_batch`` (default ``batch_size``), then :func:`ATO.end_epoch`.
  ``evaluate(params, w)`` (e.g. accuracy under the mask) runs after every epoch.

  ``loop="scan"``: each epoch's steps are one jitted ``lax.scan`` (accelerators);
  ``"host"``: every step is its own jitted call driven from Python — on XLA:CPU a convolution
  inside a loop body runs significantly slower (jax-ml/jax#12868). Both draw the same batches and
  keys and give the same result up to float reassociation. With
  ``checkpoint=fjs.Checkpointing(directory, every=1, resume=False, overwrite=False,
  fingerprint=None)`` (:class:`~fedjaxsparse.runtime.checkpoint.Checkpointing`) the state is
  saved in ``directory`` every ``every`` epochs (0: after the last only), under the runner's
  rules (:func:`fedjaxsparse.runtime.checkpoint.open_checkpoint`): ``resume=True`` continues
  from the newest intact checkpoint if it was written with the same ``fingerprint`` (a dict of
  the caller's settings, stored with every checkpoint: a refused resume names what changed)
  and holds at most ``epochs``; a fresh run refuses a folder holding checkpoints unless
  ``overwrite``. Returns the final state and one record per epoch (``loss``,
  ``flops`` = P(w)/P_total, ``kept``, ``zero_groups``, ``seconds`` of training, ``metric``;
  kept in the checkpoints, so a resumed run's history covers every epoch)."""
  # on the device once (``device_put``: no program compiled per shape); D_CN gathered on the host
  x, y, ctrl_index = np.asarray(x), np.asarray(y), np.asarray(ctrl_index)
  xd, yd = jax.device_put(x), jax.device_put(y)
  xc, yc = jax.device_put(x[ctrl_index]), jax.device_put(y[ctrl_index])
  n_ctrl = len(ctrl_index)
  cb = min(ctrl_batch or batch_size, n_ctrl)

  def target(state, xb, yb, key):   # key: fold_in(epoch key, step)
    if augment is not None:
      xb = augment(key, xb)
    return algo.target_step(state, xb, yb)

  def ctrl(state, xc, yc, idx):
    return algo.ctrl_step(state, xc[idx], yc[idx])[0]

  if loop == "scan":
    ctrl_epoch = jax.jit(lambda st, xc, yc, corder: jax.lax.scan(
        lambda s, idx: (ctrl(s, xc, yc, idx), None), st, corder)[0])
  else:
    ctrl_j = jax.jit(ctrl)

    def ctrl_epoch(state, xc, yc, corder):
      corder = np.asarray(corder)   # the rows sliced on the host: no program per slice
      for j in range(corder.shape[0]):
        state = ctrl_j(state, xc, yc, corder[j])
      return state

  end_epoch = jax.jit(algo.end_epoch)

  def after(state, t, k):   # the controller pass over D_CN (in its window), then the mask
    if config.T_start <= t <= config.T_end:
      state = ctrl_epoch(state, xc, yc, epoch_order(_fold_in(k, 1), n_ctrl, cb))
    return end_epoch(state)

  state = jax.jit(algo.init)(key, params)   # one program (op by op: ~50 small ones to compile)
  return train_epochs(   # xd, yd: the data on the device once
      target, state, xd, yd, key=_fold_in(key, 7), epochs=epochs,
      batch_size=batch_size, loop=loop, after_epoch=after,
      evaluate=None if evaluate is None else (lambda st: evaluate(st.params, st.w)),
      checkpoint=checkpoint, progress=progress, desc=desc,
      postfix=lambda r: {"loss": f"{r['loss']:.3f}", "flops": f"{r['flops']:.2f}",
                         **({"acc": f"{r['metric']:.3f}"} if "metric" in r else {})})

