"""Zero-invariant groups (ZIGs) of a network, their group operators, FLOPs and physical removal.

References:
  Xidong Wu, Shangqian Gao, Zeyu Zhang, Zhenzhen Li, Runxue Bao, Yanfu Zhang, et al. (2024).
    Auto-Train-Once: Controller Network Guided Automatic Network Pruning from Scratch. CVPR
    2024. arXiv:2403.14729.

A ZIG (Definition 2, from OTO) is a set of parameters whose zeroing makes an output channel
zero for every input: here one channel ``c`` of a prunable **channel set** (declared by the
layers of :mod:`fedjaxsparse.models.prunable`), i.e. the slice ``[..., c]`` of every
*producer* of that set — the kernels (and biases) of the convolutions / dense layers writing
it, the ``scale``/``bias`` of its norms, the depthwise kernels acting on it. Residual-coupled
channels are one set, so one group spans several layers. The *consumers* (kernels reading the
set, sliced on their input axis −2) are not in the group; they are cut by :func:`compress`.

Groups are numbered set by set (``ChannelSet.offset``); ``w``, norms and thresholds are
vectors ``[G]`` over all groups. Equation numbers such as (4-4) are those of the ATO chapter of
Xidong Wu's dissertation.

* :func:`trace` — the groups of a flax module (``flax.linen.intercept_methods`` on one
  abstract call), with each layer's MACs per example at full width;
* :func:`group_norms`, :func:`scale_groups`, :func:`group_prox` (4-4), :func:`hsp` (4-3);
  :func:`conv_groups` and :func:`norm_scales` (channel saliency by normalisation scale, for
  Sub-FedAvg's structured pruning);
* :func:`flops` — ``Σ_l MACs_l · f_in(w) · f_out(w)`` with ``f(w)`` the kept fraction of a
  set (``f_out`` only for depthwise layers): DMC-style, bilinear in ``w``, differentiable
  (labelled an assumption: the ATO chapter of Xidong Wu's dissertation gives no formula);
* :func:`flops_regularizer` — ``R(P, pP_tot) = log(max(P, pP_tot)/(pP_tot))`` (4-6);
* :func:`gate` — the "virtual gate" ``F̂ = w ⊙ F`` on every prunable layer output;
* :func:`compress` — physical removal: a smaller params tree and the ``widths`` to rebuild the
  model with, computing the masked model's function.

Source for the team: seed 004 Task 2, §4.1-4.2, l. 881-939 (gate: l. 904); spec ``seed004.md``
§2.1-§2.4, §2.11, §2.4 (P(w) is the spec's recommendation), §0 (α = η in (4-4)).
"""
from __future__ import annotations

import contextlib
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fedjaxsparse.models.prunable import (PConv, PDense, PNorm, apply_with_stats,
                                         batch_norm_stats)
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["Layer", "ChannelSet", "ZIGs", "trace", "group_sq_norms", "group_dots", "group_norms",
           "scale_groups", "group_prox", "hsp", "conv_groups", "norm_scales", "kept_fraction",
           "flops", "total_flops", "flops_regularizer", "gate", "compress", "uniform_keep",
           "uniform_ratio", "GatedEvaluator"]
__dir__ = _public_dir(__all__)

Params = Any
_PRODUCER_LEAVES = ("kernel", "bias", "scale")


class Layer(NamedTuple):
  """A declared layer: its params ``path``, ``kind`` ("conv", "dense", "norm"), channel sets,
  ``depthwise``, ``macs`` per example at full width."""
  path: tuple
  kind: str
  in_set: str | None
  out_set: str | None
  depthwise: bool
  macs: int


class ChannelSet(NamedTuple):
  """``size`` channels; ``offset`` = index of its first group (−1: fixed, not prunable)."""
  name: str
  size: int
  offset: int


class ZIGs(NamedTuple):
  sets: tuple
  layers: tuple
  num_groups: int

  def get(self, name: str) -> ChannelSet:
    return next(s for s in self.sets if s.name == name)

  @property
  def prunable(self) -> tuple:
    """The prunable sets in group order (the controller's blocks)."""
    return tuple(s for s in self.sets if s.offset >= 0)


def trace(module: nn.Module, input_shape) -> ZIGs:
  """The ZIGs of ``module`` from one abstract ``init`` on ``[1, *input_shape]``. Sets named
  with a leading ``_`` are fixed."""
  layers, sizes = [], {}

  def interceptor(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    m = context.module
    if context.method_name == "__call__" and isinstance(m, (PConv, PDense, PNorm)):
      if isinstance(m, PConv):
        c_in = args[0].shape[-1]
        per_out = m.kernel_size ** 2 * (1 if m.depthwise else c_in)
        kind, macs = "conv", int(np.prod(out.shape[1:])) * per_out
      elif isinstance(m, PDense):
        kind, macs = "dense", int(args[0].shape[-1] * out.shape[-1])
      else:
        kind, macs = "norm", 0
      depthwise = isinstance(m, PConv) and m.depthwise
      layers.append(Layer(tuple(m.path), kind, m.in_set, m.out_set, depthwise, macs))
      if m.out_set is not None:
        if sizes.setdefault(m.out_set, out.shape[-1]) != out.shape[-1]:
          raise ValueError(f"channel set {m.out_set!r} is written with {sizes[m.out_set]} and "
                           f"{out.shape[-1]} channels by different layers.")
    return out

  with nn.intercept_methods(interceptor):   # the key and input abstract too: nothing compiles
    jax.eval_shape(lambda: module.init(jax.random.key(0), jnp.zeros((1,) + tuple(input_shape))))
  sets, offset = [], 0
  for name, size in sizes.items():
    fixed = name.startswith("_")
    sets.append(ChannelSet(name, size, -1 if fixed else offset))
    offset += 0 if fixed else size
  return ZIGs(tuple(sets), tuple(layers), offset)


def _node(params: Params, path: tuple) -> dict:
  for p in path:
    params = params[p]
  return params


def _replace(params: Params, path: tuple, leaf: str, value) -> Params:
  if not path:
    return {**params, leaf: value}
  return {**params, path[0]: _replace(params[path[0]], path[1:], leaf, value)}


def _producers(zigs: ZIGs, params: Params):
  """``(layer path, leaf name, set)`` of every producer leaf of a prunable set."""
  for layer in zigs.layers:
    s = None if layer.out_set is None else zigs.get(layer.out_set)
    if s is not None and s.offset >= 0:
      for leaf in _PRODUCER_LEAVES:
        if leaf in _node(params, layer.path):
          yield layer.path, leaf, s


def _per_group(zigs: ZIGs, params: Params, fn) -> jax.Array:
  """``Σ`` over producer leaves of ``fn(leaf)`` reduced to the last axis, as ``[G]``."""
  parts = {s.name: jnp.zeros(s.size) for s in zigs.prunable}
  for path, leaf, s in _producers(zigs, params):
    v = fn(path, leaf)
    parts[s.name] = parts[s.name] + jnp.sum(v.reshape(-1, s.size), axis=0)
  return jnp.concatenate([parts[s.name] for s in zigs.prunable]) if parts else jnp.zeros(0)


def group_sq_norms(zigs: ZIGs, params: Params) -> jax.Array:
  """``‖[M]_g‖₂²`` for every group ``[G]``."""
  return _per_group(zigs, params, lambda p, l: jnp.square(_node(params, p)[l]))


def group_dots(zigs: ZIGs, a: Params, b: Params) -> jax.Array:
  """``⟨[a]_g, [b]_g⟩`` for every group ``[G]`` (two trees of the same structure)."""
  return _per_group(zigs, a, lambda p, l: _node(a, p)[l] * _node(b, p)[l])


def group_norms(zigs: ZIGs, params: Params) -> jax.Array:
  """``‖[M]_g‖₂`` for every group ``[G]``; differentiable everywhere (gradient 0 at a zero
  group, the minimal-norm subgradient)."""
  sq = group_sq_norms(zigs, params)
  return jnp.where(sq > 0, jnp.sqrt(jnp.where(sq > 0, sq, 1.0)), 0.0)


def scale_groups(zigs: ZIGs, params: Params, factor: jax.Array) -> Params:
  """Every producer slice of group g times ``factor[g]`` (``factor [G]``)."""
  for path, leaf, s in _producers(zigs, params):
    value = _node(params, path)[leaf]
    params = _replace(params, path, leaf,
                      value * factor[s.offset:s.offset + s.size].astype(value.dtype))
  return params


def group_prox(zigs: ZIGs, params: Params, threshold: jax.Array) -> Params:
  """(4-4) with ``α = η`` (as printed it thresholds at ``αλ_g`` but shrinks by ``ηλ_g``; standard
  group soft-thresholding uses ``ηλ_g`` for both): ``[M]_g ← (1 − t_g/‖[M]_g‖)·[M]_g`` if
  ``‖[M]_g‖ ≥ t_g``, else 0 — the prox of ``t_g‖·‖₂``; ``threshold [G]`` = ``ηλ_g``;
  ``t_g = 0`` is the identity (bit for bit)."""
  nrm = group_norms(zigs, params)
  shrink = jnp.where(nrm > threshold, 1.0 - threshold / jnp.where(nrm > 0, nrm, 1.0), 0.0)
  return scale_groups(zigs, params, jnp.where(threshold > 0, shrink, 1.0))


def hsp(zigs: ZIGs, z: Params, m: Params, eps: float, active: jax.Array) -> Params:
  """The half-space projector (4-3): a group of ``active bool[G]`` is zeroed iff
  ``[z]_gᵀ[M]_g < ε‖[M]_g‖²`` (``z`` the trial point after the optimiser step, ``m`` the
  weights before it), or if it was already zero (OTO keeps its zero groups at zero; the test
  alone reads ``0 < 0`` there); other groups are kept as in ``z``."""
  dot = group_dots(zigs, z, m)
  msq = group_sq_norms(zigs, m)
  return scale_groups(zigs, z, jnp.where(active & ((dot < eps * msq) | (msq == 0)), 0.0, 1.0))


def conv_groups(zigs: ZIGs) -> np.ndarray:
  """``bool [G]``: the groups of sets written by a convolution (the channels structured pruning
  removes; sets written by dense layers are hidden units)."""
  conv = {layer.out_set for layer in zigs.layers if layer.kind == "conv"}
  out = np.zeros(zigs.num_groups, bool)
  for s in zigs.prunable:
    out[s.offset:s.offset + s.size] = s.name in conv
  return out


def norm_scales(zigs: ZIGs, params: Params) -> jax.Array:
  """``[G]``: ``Σ |scale|`` of the normalisation layers writing each group — network
  slimming's channel saliency (Liu et al. 2017); 0 for groups of sets without a norm."""
  norms = {layer.path for layer in zigs.layers if layer.kind == "norm"}
  return _per_group(zigs, params, lambda p, l: jnp.abs(_node(params, p)[l])
                    if p in norms and l == "scale" else jnp.zeros_like(_node(params, p)[l]))


def kept_fraction(zigs: ZIGs, w: jax.Array, name: str | None) -> jax.Array:
  """``Σ_{g∈set} w_g / C_set`` (1 for fixed sets and the input)."""
  s = None if name is None else zigs.get(name)
  if s is None or s.offset < 0:
    return jnp.ones(())
  return jnp.sum(w[s.offset:s.offset + s.size]) / s.size


def flops(zigs: ZIGs, w: jax.Array) -> jax.Array:
  """``P(w)``: MACs per example under the mask ``w [G]`` (``w = 1``: the full model)."""
  total = jnp.zeros(())
  for layer in zigs.layers:
    if layer.macs:
      f = kept_fraction(zigs, w, layer.out_set)
      if not layer.depthwise:
        f = f * kept_fraction(zigs, w, layer.in_set)
      total = total + layer.macs * f
  return total


def total_flops(zigs: ZIGs) -> int:
  """MACs per example of the full model."""
  return int(sum(layer.macs for layer in zigs.layers))


def flops_regularizer(p: jax.Array, budget: jax.Array, two_sided: bool = False) -> jax.Array:
  """(4-6) ``log(max(P, budget)/budget)``: 0 at or under the budget ``p·P_total``;
  ``two_sided``: ``|log(P/budget)|`` (P floored at 1e-9·budget), 0 only at the budget."""
  if two_sided:
    return jnp.abs(jnp.log(jnp.maximum(p, 1e-9 * budget) / budget))
  return jnp.log(jnp.maximum(p, budget) / budget)


@contextlib.contextmanager
def gate(zigs: ZIGs, w: jax.Array):
  """Within the block, every declared layer writing a prunable set multiplies its output by
  ``w`` of that set (ATO's virtual gate ``F̂_l = w_l ⊙ F_l``)."""
  def interceptor(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    m = context.module
    if context.method_name == "__call__" and isinstance(m, (PConv, PDense, PNorm)):
      s = None if m.out_set is None else zigs.get(m.out_set)
      if s is not None and s.offset >= 0:
        out = out * w[s.offset:s.offset + s.size].astype(out.dtype)
    return out

  with nn.intercept_methods(interceptor):
    yield


def compress(zigs: ZIGs, params: Params, keep) -> tuple[Params, dict]:
  """Physical removal (host-side, outside ``jit``): drops the groups with ``keep[g]`` False
  from their producers (last axis) and the consumers' input axis (−2). Returns
  ``(params, widths)``; rebuild the model with ``widths`` (e.g.
  ``cifar_resnet(..., widths=widths)``). The removed groups must be zero (e.g.
  ``scale_groups(zigs, params, keep)``) for the smaller model to compute the same function; a
  set keeps at least one (zero) channel."""
  keep = np.asarray(keep, bool)
  if keep.shape != (zigs.num_groups,):
    raise ValueError(f"keep must have shape ({zigs.num_groups},), got {keep.shape}.")
  index, widths = {}, {}
  for s in zigs.prunable:
    idx = np.flatnonzero(keep[s.offset:s.offset + s.size])
    index[s.name] = idx if idx.size else np.zeros(1, int)
    widths[s.name] = int(index[s.name].size)
  params = jax.tree_util.tree_map(np.asarray, params)
  for layer in zigs.layers:
    node = _node(params, layer.path)
    if layer.out_set in index:
      for leaf in _PRODUCER_LEAVES:
        if leaf in node:
          params = _replace(params, layer.path, leaf, node[leaf][..., index[layer.out_set]])
          node = _node(params, layer.path)
    if layer.in_set in index and not layer.depthwise and layer.kind != "norm":
      params = _replace(params, layer.path, "kernel",
                        np.take(node["kernel"], index[layer.in_set], axis=-2))
  return params, widths


def uniform_keep(zigs: ZIGs, r: float) -> np.ndarray:
  """``bool[num_groups]``: every prunable set keeps its first ``max(1, round(r·C))`` of its
  ``C`` channels — uniform structured pruning at keep fraction ``r``."""
  keep = np.zeros(zigs.num_groups, bool)
  for s in zigs.prunable:
    keep[s.offset:s.offset + max(1, int(np.floor(r * s.size + 0.5)))] = True
  return keep


def uniform_ratio(zigs: ZIGs, flops_target: float) -> tuple[float, np.ndarray]:
  """The Uniform baseline of structured-pruning tables (e.g. Table 4 of Auto-Train-Once's
  evaluation, Wu 2024): the keep fraction ``r`` whose :func:`uniform_keep` mask's
  :func:`flops` is closest to ``flops_target`` (MACs per example), found by bisection (40
  halvings; the count is monotone in ``r``). Returns ``(r, keep)``."""
  count = lambda r: float(flops(zigs, jnp.asarray(uniform_keep(zigs, r), jnp.float32)))  # noqa
  lo, hi = 0.0, 1.0
  for _ in range(40):
    mid = 0.5 * (lo + hi)
    lo, hi = (mid, hi) if count(mid) <= flops_target else (lo, mid)
  r = min((lo, hi), key=lambda r: abs(count(r) - flops_target))
  return r, uniform_keep(zigs, r)


class GatedEvaluator:
  """Batched, jitted logits and accuracy of one prunable network (a module of
  :mod:`fedjaxsparse.models.prunable` and its Model), plain or under a group mask ``w`` (the
  virtual gate, :func:`gate`). With ``running`` (training inputs), BatchNorm normalises by
  running statistics computed over them for the parameters (and mask) evaluated
  (:func:`fedjaxsparse.models.prunable.batch_norm_stats`, BatchNorm's evaluation mode) instead
  of each evaluation batch's own. ``zigs`` is the network's trace.

  Args:
    module: the flax module.
    model: its :class:`~fedjaxsparse.core.Model`.
    shape: one input's shape.
    batch: examples per jitted call.
    running: training inputs for running statistics, or ``None``.
  """

  def __init__(self, module, model, shape, batch: int, running=None):
    self.model, self.batch, self.running = model, batch, running
    self.zigs = trace(module, shape)

    def plain(params, stats, xb):
      if stats is None:
        return model.apply(params, xb)
      return apply_with_stats(module, params, stats, xb.reshape((len(xb),) + tuple(shape)))

    def gated(params, stats, w, xb):
      with gate(self.zigs, w):
        return plain(params, stats, xb)

    def stats(params, w, x):   # under the same gate as the evaluation it serves
      if w is None:
        return batch_norm_stats(module, params, x, batch)
      with gate(self.zigs, w):
        return batch_norm_stats(module, params, x, batch)

    self._plain, self._gated = jax.jit(plain), jax.jit(gated)
    self._stats = jax.jit(stats)

  def logits(self, params, x, w=None) -> np.ndarray:
    """``[n, ...] -> [n, K]`` logits, ``batch`` examples per call, under mask ``w`` if given."""
    stats = None
    if self.running is not None:
      stats = self._stats(params, w, jnp.asarray(self.running))
    out = []
    for i in range(0, len(x), self.batch):
      xb = jnp.asarray(x[i:i + self.batch])
      out.append(np.asarray(self._plain(params, stats, xb) if w is None else
                            self._gated(params, stats, w, xb)))
    return np.concatenate(out)

  def accuracy(self, params, x, y, w=None) -> float:
    """Top-1 accuracy (a fraction) of :meth:`logits` against labels ``y``."""
    return float(np.mean(np.argmax(self.logits(params, x, w), -1) == y))
