"""Data augmentation inside ``jit``: ``augment(key, x [B, H, W, C]) -> x``, applied by the
local steps to every drawn minibatch (``augment=`` of the ProxSkip family and FedAvg).

:func:`crop_flip` is the random part of the standard CIFAR recipe that the Sparse-ProxSkip
paper (Meinhardt et al., 2024, its appendix E) uses for ResNet-18 ("flip, crop and
normalize"): pad 4 pixels (reflect), crop back to H×W at a random offset, flip left-right with
probability ½ — per image, with its own randomness. The normalisation is deterministic, so it
is applied to the stored data once (train and test alike) with ``CIFAR10_MEAN`` and
``CIFAR10_STD``.

Source for the team: seed 000 §E.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["crop_flip"]
__dir__ = _public_dir(__all__)

Augment = Callable[[jax.Array, jax.Array], jax.Array]
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)


def crop_flip(pad: int = 4, flip: bool = True) -> Augment:
  """Random ``pad``-pixel reflect-padded crop and (if ``flip``) horizontal flip per image."""
  if not (isinstance(pad, int) and pad >= 0):
    raise ValueError(f"pad must be an int >= 0, got {pad!r}.")

  def one(key, img):  # [H, W, C]
    k_crop, k_flip = jax.random.split(key)
    h, w = img.shape[:2]
    padded = jnp.pad(img, ((pad, pad), (pad, pad), (0, 0)), mode="reflect")
    dy, dx = jax.random.randint(k_crop, (2,), 0, 2 * pad + 1)
    out = jax.lax.dynamic_slice(padded, (dy, dx, 0), (h, w, img.shape[2]))
    if flip:
      out = jnp.where(jax.random.bernoulli(k_flip), out[:, ::-1], out)
    return out

  return lambda key, x: jax.vmap(one)(jax.random.split(key, x.shape[0]), x)
