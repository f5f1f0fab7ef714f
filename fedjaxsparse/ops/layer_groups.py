"""Layers of a model as units of work.

A *layer* is a group of parameter leaves that share a path prefix of ``depth`` keys:
``depth=1`` makes ``{"conv1": {"kernel", "bias"}, "fc1": ...}`` five layers of the chapter's
CNN; ``depth=2`` splits a ResNet's ``{"layer2": {"block0": ..., "block1": ...}}`` into blocks.
Layers are numbered in the pytree's flattening order (sorted keys), the order every helper and
every ``bool[n, num_layers]`` layer assignment uses.

Source for the team: seed 001, ch. 4: FedP3 trains, uploads and prunes whole layers; Fig. C.1 counts
parameters per layer.
"""
from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np

from fedjaxsparse.errors import check_int
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["path_prefix", "layer_names", "layer_index", "layer_sizes", "per_leaf"]
__dir__ = _public_dir(__all__)


def _key_name(k: Any) -> str:
  for attr in ("key", "name", "idx"):
    if hasattr(k, attr):
      return str(getattr(k, attr))
  return str(k)


def path_prefix(path: tuple, depth: int) -> str:
  """The layer name of a leaf's key path: its first ``depth`` keys joined by ``"/"``."""
  return "/".join(_key_name(k) for k in path[:depth])


def _prefixes(params: Any, depth: int) -> list[str]:
  depth = check_int("depth", depth, 1)
  paths = jax.tree_util.tree_flatten_with_path(params)[0]
  return [path_prefix(path, depth) for path, _ in paths]


def layer_names(params: Any, depth: int = 1) -> list[str]:
  """The layers' names (``"/"``-joined path prefixes) in order."""
  return list(dict.fromkeys(_prefixes(params, depth)))


def layer_index(params: Any, depth: int = 1) -> Any:
  """A pytree like ``params`` of Python ints: every leaf's layer number."""
  names = layer_names(params, depth)
  ids = [names.index(p) for p in _prefixes(params, depth)]
  return jax.tree.unflatten(jax.tree.structure(params), ids)


def layer_sizes(params: Any, depth: int = 1, kernels_only: bool = False) -> np.ndarray:
  """``int64[num_layers]``: parameters per layer (``kernels_only``: leaves with ndim ≥ 2, the
  chapter's Table C.2 convention for fully-connected layers)."""
  names = layer_names(params, depth)
  sizes = np.zeros(len(names), np.int64)
  for i, leaf in zip(jax.tree.leaves(layer_index(params, depth)), jax.tree.leaves(params)):
    shape = tuple(np.shape(leaf))
    if not kernels_only or len(shape) >= 2:
      sizes[i] += math.prod(shape)
  return sizes


def per_leaf(values: Any, params: Any, depth: int = 1) -> Any:
  """Broadcast a per-layer array ``[..., num_layers]`` to a pytree like ``params`` whose leaves
  are ``values[..., layer]`` (e.g. ``bool[n, L]`` → one ``bool[n]`` per leaf)."""
  return jax.tree.map(lambda i: values[..., i], layer_index(params, depth))
