"""Convolution as patches times a matrix (im2col), the formulation that stays fast when
clients are ``vmap``-ped or the convolution sits inside a loop.

On XLA:CPU a convolution whose kernel is batched over clients (``vmap`` over per-client
weights) becomes a grouped convolution, 3.5–5× slower than the same work unbatched, and the
backward pass of a convolution inside a loop body (``lax.scan``, ``fori_loop``, ``lax.map``)
runs an order of magnitude slower again: its two gradient convolutions are not in the
canonical NHWC/HWIO form, and XLA:CPU canonicalises convolutions only in the program's entry
computation, not in loop bodies (jax-ml/jax#12868; ``benchmarks/repro_conv_in_loop.py``).
Written as
shifted slices of the padded input concatenated into patches ``[B, H', W', kh·kw·C]`` and one
matrix product with the kernel reshaped to ``[kh·kw·C, F]``, the convolution becomes a
(batched) matrix product, which XLA:CPU runs at full speed under ``vmap`` and in loops. The
price is memory: the patches hold ``kh·kw`` copies of the input (kept for the backward pass).

:class:`Conv` is a drop-in for ``flax.linen.Conv`` (same parameter names, shapes and
initialisers, "SAME"/"VALID" padding, strides) whose ``impl`` picks the formulation:
``"patches"``, ``"xla"`` (``lax.conv_general_dilated``) or ``"auto"`` (patches on CPU, XLA's
convolution — cuDNN, the TPU's convolution units — elsewhere). Both compute the same function
(to float rounding).
"""
from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["patch_conv", "resolve_impl", "Conv", "max_pool"]
__dir__ = _public_dir(__all__)

IMPLS = ("auto", "patches", "xla")


def patch_conv(x: jax.Array, kernel: jax.Array, strides: Sequence[int] = (1, 1),
               padding: str = "SAME") -> jax.Array:
  """``conv(x, kernel)`` for ``x [B, H, W, C]`` and ``kernel [kh, kw, C, F]`` (NHWC / HWIO) as
  patches times a matrix; returns ``[B, H', W', F]`` (the shape of
  ``lax.conv_general_dilated`` with the same strides and padding)."""
  kh, kw, c, f = kernel.shape
  sh, sw = strides
  pads = jax.lax.padtype_to_pads(x.shape[1:3], (kh, kw), (sh, sw), padding)
  x = jnp.pad(x, ((0, 0), tuple(pads[0]), tuple(pads[1]), (0, 0)))
  oh = (x.shape[1] - kh) // sh + 1
  ow = (x.shape[2] - kw) // sw + 1
  cols = [x[:, i:i + (oh - 1) * sh + 1:sh, j:j + (ow - 1) * sw + 1:sw, :]
          for i in range(kh) for j in range(kw)]
  patches = cols[0] if len(cols) == 1 else jnp.concatenate(cols, axis=-1)
  return patches @ kernel.reshape(kh * kw * c, f)


def resolve_impl(impl: str) -> str:
  """``"patches"`` or ``"xla"`` for ``impl`` (``"auto"``: patches on the CPU backend)."""
  if impl not in IMPLS:
    raise ValueError(f"conv impl must be one of {IMPLS}, got {impl!r}.")
  if impl == "auto":
    return "patches" if jax.default_backend() == "cpu" else "xla"
  return impl


class Conv(nn.Module):
  """2-D convolution over ``[B, H, W, C]`` with ``flax.linen.Conv``'s parameters (``kernel
  [kh, kw, C, F]``, LeCun-normal; ``bias [F]``, zeros) computed by ``impl``."""
  features: int
  kernel_size: Sequence[int]
  strides: Sequence[int] = (1, 1)
  padding: str = "SAME"
  use_bias: bool = True
  impl: str = "auto"

  @nn.compact
  def __call__(self, x):
    kh, kw = self.kernel_size
    kernel = self.param("kernel", nn.initializers.lecun_normal(),
                        (kh, kw, x.shape[-1], self.features))
    if resolve_impl(self.impl) == "patches":
      y = patch_conv(x, kernel, tuple(self.strides), self.padding)
    else:
      y = jax.lax.conv_general_dilated(x, kernel, tuple(self.strides), self.padding,
                                       dimension_numbers=("NHWC", "HWIO", "NHWC"))
    if self.use_bias:
      y = y + self.param("bias", nn.initializers.zeros, (self.features,))
    return y


@jax.custom_vjp
def _tiled_max(x: jax.Array) -> jax.Array:
  b, h, w, c = x.shape
  return x.reshape(b, h // 2, 2, w // 2, 2, c).max(axis=(2, 4))


def _tiled_max_fwd(x):
  y = _tiled_max(x)
  return y, (x, y)


def _tiled_max_bwd(res, g):
  """The gradient goes to the first maximum of each window in row-major order, as XLA's
  select-and-scatter gives it (``nn.max_pool``'s gradient, ties included): an equality mask
  over the four window positions, not a scatter."""
  x, y = res
  b, h, w, c = x.shape
  t = x.reshape(b, h // 2, 2, w // 2, 2, c)
  taken = jnp.zeros(y.shape, bool)
  parts = []
  for i, j in ((0, 0), (0, 1), (1, 0), (1, 1)):
    first = (t[:, :, i, :, j] == y) & ~taken
    taken = taken | first
    parts.append(jnp.where(first, g, jnp.zeros_like(g)))
  top = jnp.stack(parts[:2], axis=3)       # [b, h/2, w/2, 2 (j), c] for i = 0
  bottom = jnp.stack(parts[2:], axis=3)
  return (jnp.stack([top, bottom], axis=2).reshape(b, h, w, c),)


_tiled_max.defvjp(_tiled_max_fwd, _tiled_max_bwd)


def max_pool(x: jax.Array, window: Sequence[int] = (2, 2), strides: Sequence[int] | None = None,
             padding: str = "VALID") -> jax.Array:
  """``flax.linen.max_pool`` over ``[B, H, W, C]``, the same values and gradients.

  A 2 × 2 window with stride 2 over even ``H`` and ``W`` (the CNNs' pooling; "SAME" and
  "VALID" coincide there) is computed on the CPU as a reshape and a max, with a backward pass
  that is an equality mask (the gradient to each window's first maximum, as XLA's
  select-and-scatter gives it) — about twice as fast as ``reduce_window``'s backward on
  XLA:CPU (``benchmarks/README.md``). Any other window, and other backends, use
  ``nn.max_pool``.
  """
  strides = tuple(window) if strides is None else tuple(strides)
  if (tuple(window) == (2, 2) and strides == (2, 2) and padding in ("SAME", "VALID")
      and x.ndim == 4 and x.shape[1] % 2 == 0 and x.shape[2] % 2 == 0
      and jax.default_backend() == "cpu"):
    return _tiled_max(x)
  return nn.max_pool(x, tuple(window), strides=strides, padding=padding)
