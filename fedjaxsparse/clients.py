"""Running a one-client kernel over all clients: ``vmap``, optionally per size bucket.

Natural splits are very unequal (BlogFeedback: mean 82, max 1,106 examples per client), so
padding every client to the largest wastes most of the work (DESIGN.md, performance notes).
:func:`bucketize` sorts clients by size and cuts them into a few buckets, each padded only to
its own largest client; :func:`map_clients` then runs the kernel ``vmap``-ped per bucket (a
static Python loop over a handful of buckets, never over clients) and concatenates the results
in client order. Per-client state keeps one leading axis over all clients.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjaxsparse.data.federated import FederatedData


class BucketedData(NamedTuple):
  """Clients in size buckets.

  Attributes:
    buckets: one ``FederatedData`` per bucket; bucket ``b`` holds the clients
      ``starts[b] : starts[b] + buckets[b].num_clients`` of the (re-ordered) population, padded
      to its own largest client.
    order: ``int [N]`` the original client id of each position (clients sorted by size).
  """
  buckets: tuple
  order: Any

  @property
  def num_clients(self) -> int:
    return sum(b.num_clients for b in self.buckets)

  @property
  def num_examples(self) -> jax.Array:
    return jnp.concatenate([b.num_examples for b in self.buckets])


def bucketize(data: FederatedData, num_buckets: int) -> BucketedData:
  """Sort clients by size and split them into ``num_buckets`` buckets of (nearly) equal client
  count, each trimmed to its own largest client. Client ``j`` of the result is client
  ``order[j]`` of ``data``."""
  if not 1 <= num_buckets <= data.num_clients:
    raise ValueError(f"num_buckets must be in [1, {data.num_clients}], got {num_buckets}.")
  sizes = np.asarray(data.num_examples)
  order = np.argsort(sizes, kind="stable")
  buckets = []
  for ids in np.array_split(order, num_buckets):
    m = max(int(sizes[ids].max()), 1)
    buckets.append(jax.tree.map(lambda a: a[ids][:, :m] if a.ndim >= 2 else a[ids], data))
  return BucketedData(tuple(buckets), order)


def client_ids(data: FederatedData | BucketedData) -> jax.Array:
  """``int32 [N]``: the original id of the client at each position (for ``fold_in`` keys)."""
  if isinstance(data, FederatedData):
    return jnp.arange(data.num_clients, dtype=jnp.int32)
  return jnp.asarray(data.order, jnp.int32)


def map_clients(fn: Callable, data: FederatedData | BucketedData, *client_args: Any) -> Any:
  """``vmap(fn)(*client_args, data)`` for padded data, or per bucket for bucketed data.

  ``client_args`` are pytrees with leading client axis ``[N, ...]`` (in the data's client
  order); the result has leading axis ``[N, ...]``.
  """
  if isinstance(data, FederatedData):
    return jax.vmap(fn)(*client_args, data)
  outs, start = [], 0
  for bucket in data.buckets:
    n = bucket.num_clients
    args = jax.tree.map(lambda a: a[start:start + n], client_args)
    outs.append(jax.vmap(fn)(*args, bucket))
    start += n
  return jax.tree.map(lambda *xs: jnp.concatenate(xs), *outs)
