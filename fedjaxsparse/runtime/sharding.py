"""Sharding the client axis over local devices with ``jax.sharding``.

The mesh has one axis, ``"clients"``. Arrays whose leading axis is the client axis are split
over it; everything else is replicated. Under ``jit`` the vmapped local training then runs on
each device's clients and the server's reduction over clients becomes a collective (GSPMD).
Sharding only changes the layout, never the mathematics, so results match a one-device run to
float tolerance. Multi-host runs use the same code after ``jax.distributed.initialize()``.
"""
from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["client_mesh", "shard_clients"]
__dir__ = _public_dir(__all__)

CLIENT_AXIS = "clients"


def client_mesh(num_devices: int | None = None) -> Mesh:
  """A 1-D mesh named ``"clients"`` over the first ``num_devices`` devices (default: all).

  Built with ``jax.sharding.Mesh`` so the axis is of the *Auto* type (``jax.make_mesh`` now
  defaults to Explicit axes, which ``jit`` with plain arrays rejects; environment.md §4).
  """
  devices = jax.devices()
  n = len(devices) if num_devices is None else num_devices
  if not 1 <= n <= len(devices):
    raise ValueError(f"num_devices must be in [1, {len(devices)}], got {num_devices}.")
  return Mesh(np.array(devices[:n]), (CLIENT_AXIS,))


def shard_clients(tree: Any, mesh: Mesh, num_clients: int) -> Any:
  """Place ``tree`` on ``mesh``: leaves with leading axis ``num_clients`` are split over
  ``"clients"``, other leaves are replicated."""
  n_dev = mesh.shape[CLIENT_AXIS]
  if num_clients % n_dev:
    raise ValueError(f"the number of clients ({num_clients}) must be divisible by the number "
                     f"of devices on the '{CLIENT_AXIS}' mesh axis ({n_dev}).")
  split = NamedSharding(mesh, P(CLIENT_AXIS))
  replicated = NamedSharding(mesh, P())

  def place(a):
    if not hasattr(a, "shape"):
      return a
    on_clients = a.ndim >= 1 and a.shape[0] == num_clients
    return jax.device_put(a, split if on_clients else replicated)

  return jax.tree.map(place, tree)
