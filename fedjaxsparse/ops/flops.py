"""Analytic training FLOPs of sparse models: the FLOPs are counted, not measured, since masked dense
kernels save nothing on accelerators.

* :func:`layer_macs` — multiply-accumulates per example of every parameter leaf, read off the
  model's jaxpr: each ``dot_general`` / ``conv_general_dilated`` whose operand is (a reshape,
  transpose or cast of) a parameter leaf adds ``output size × contraction length`` to that
  leaf. Works through ``jit``/``custom_jvp`` sub-programs and for the library's patch-matrix
  convolutions alike. Leaves that feed no product (biases, norm parameters) get 0.
* :func:`training_flops` — ``6·Σ_l density_l·MACs_l`` per trained example (2 FLOPs per MAC,
  × 3 for forward + backward), times the examples processed, plus ``6·Σ_l MACs_l`` per example
  of dense work (FedSpa-DST's regrowth gradient: one dense minibatch per participant and
  round). This is the paper's convention: it reproduces Tables 1, 3 and 4 to about 1 %.

Source for the team: seed 002 Tables 1/3/4; spec ``seed002.md`` §2.5, §6.4.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Literal
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["layer_macs", "layer_products", "training_flops"]
__dir__ = _public_dir(__all__)

_ALIASES = ("reshape", "transpose", "convert_element_type", "copy", "squeeze",
            "expand_dims", "broadcast_in_dim")


def _sub_jaxprs(eqn):
  for name in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
    sub = eqn.params.get(name)
    if sub is not None:
      yield sub.jaxpr if hasattr(sub, "jaxpr") else sub


def _walk(jaxpr, owner: dict, record) -> None:
  """Call ``record(leaf, M, K, N)`` for every matrix product of the program one of whose
  operands is (an alias of) parameter leaf ``leaf``: the product as the GEMM ``[M, K] × [K, N]``
  it is (``N`` the parameter's output features, ``K`` the contraction length)."""
  for eqn in jaxpr.eqns:
    ins = [None if isinstance(v, Literal) else owner.get(v) for v in eqn.invars]
    name = eqn.primitive.name
    if name in _ALIASES and ins and ins[0] is not None:
      owner[eqn.outvars[0]] = ins[0]
    elif name == "dot_general":
      (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
      contraction = int(np.prod([eqn.invars[0].aval.shape[i] for i in lc]))
      out = eqn.outvars[0].aval.size
      for side, leaf in enumerate(ins[:2]):
        if leaf is not None:
          shape = eqn.invars[side].aval.shape
          skip = set(lc if side == 0 else rc) | set(lb if side == 0 else rb)
          n = int(np.prod([d for i, d in enumerate(shape) if i not in skip]))
          record(leaf, out // max(n, 1), contraction, n)
    elif name == "conv_general_dilated":
      if ins[1] is not None:
        rhs = eqn.invars[1].aval
        n = rhs.shape[eqn.params["dimension_numbers"].rhs_spec[0]]
        record(ins[1], eqn.outvars[0].aval.size // n, rhs.size // n, n)
    for sub in _sub_jaxprs(eqn):
      inner = {iv: o for iv, o in zip(sub.invars, ins) if o is not None}
      _walk(sub, inner, record)


def _products(model, params: Any, input_shape, batch: int) -> tuple[Any, list]:
  leaves, treedef = jax.tree.flatten(params)
  x = jax.ShapeDtypeStruct((batch,) + tuple(input_shape), jnp.float32)
  closed = jax.make_jaxpr(lambda p, x: model.apply(p, x))(params, x)
  owner = {v: i for i, v in enumerate(closed.jaxpr.invars[:len(leaves)])}
  found = []
  _walk(closed.jaxpr, owner, lambda leaf, m, k, n: found.append((leaf, m, k, n)))
  return treedef, len(leaves), found


def layer_macs(model, params: Any, input_shape) -> Any:
  """A pytree (the structure of ``params``) of Python ints: MACs of one forward pass of one
  example attributable to each leaf. ``params`` may be ``jax.ShapeDtypeStruct`` leaves;
  ``input_shape`` excludes the batch axis."""
  treedef, count, found = _products(model, params, input_shape, 1)
  macs = np.zeros(count, np.int64)
  for leaf, m, k, n in found:
    macs[leaf] += m * k * n
  return jax.tree.unflatten(treedef, [int(v) for v in macs])


def layer_products(model, params: Any, input_shape, batch: int) -> list[tuple[int, int, int]]:
  """The parameter products of one forward pass of ``batch`` examples as the matrix products
  they are, ``[(M, K, N), ...]`` in program order: ``[M, K] × [K, N]`` with ``N`` the layer's
  output features, ``K`` its contraction length (a convolution: kernel area × input channels
  per group) and ``M`` the rows (a convolution: batch × output positions). Their
  ``Σ M·K·N`` is ``batch ×`` the sum of :func:`layer_macs`; training does each three times
  (forward, input gradient, weight gradient), which is what a roofline of the round compares
  its rate with."""
  return [(m, k, n) for _, m, k, n in _products(model, params, input_shape, int(batch))[2]]


def training_flops(macs: Any, densities: Any | None = None, examples: float = 1.0,
                   dense_examples: float = 0.0) -> float:
  """``6·Σ_l d_l·MACs_l·examples + 6·Σ_l MACs_l·dense_examples`` (``densities`` ``None``:
  dense training)."""
  m = np.asarray(jax.tree.leaves(macs), np.float64)
  dens = np.ones_like(m) if densities is None else np.asarray(jax.tree.leaves(densities),
                                                             np.float64)
  return float(6.0 * (np.sum(dens * m) * examples + np.sum(m) * dense_examples))
