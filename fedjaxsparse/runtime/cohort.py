"""The cohort round that cohort algorithms share: draw a cohort (uniform, or any
:class:`fedjaxsparse.ops.sampling.Sampler`), weigh its clients (``"num_examples"``,
``"uniform"`` or the sampler's unbiased ``"sampling"`` weights), compress what they upload (any
:class:`fedjaxsparse.ops.compressors.Compressor`), and update the server model with any optax
transformation of the pseudo-gradient. An algorithm's own part is its client update; the pieces
here are the rest of the round, so that every cohort method takes ``sampler=``, ``uplink=`` and
``server_optimizer=`` with one meaning.

Shapes: a cohort of static length ``m`` (``cohort_size``, the sampler's ``size``, or ``N`` for
full participation); ``member [m]`` is 1 for a real member and 0 for a padding entry (samplers
whose cohort size varies repeat a member there); messages are pytrees with a leading ``[m]``.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjaxsparse.core import as_float, float_dtype
from fedjaxsparse.data.federated import FederatedData
from fedjaxsparse.ops.aggregation import WEIGHTINGS, client_weights
from fedjaxsparse.ops.sampling import client_keys, sample_cohort

COHORT_WEIGHTINGS = WEIGHTINGS + ("sampling",)


class Cohort(NamedTuple):
  """One round's cohort: ``ids int32[m]``, ``member [m]`` (default float dtype; all ones for
  uniform cohorts), ``sampling_weights [m]`` (``1/(n p_i)`` of a sampler, 0 for padding; ones
  for uniform cohorts) and ``data``, the cohort's rows of the federated data."""
  ids: jax.Array
  member: jax.Array
  sampling_weights: jax.Array
  data: FederatedData

  @property
  def size(self) -> jax.Array:
    """The number of real members (a float scalar: samplers' cohorts vary in size)."""
    return jnp.sum(self.member)


def check_options(cohort_size: int | None, sampler: Any, weighting: str,
                  weightings: tuple[str, ...] = COHORT_WEIGHTINGS) -> None:
  """Rejects contradicting cohort options with a message naming them."""
  if sampler is not None and cohort_size is not None:
    raise ValueError("give either cohort_size (uniform cohorts) or sampler, not both.")
  if weighting not in weightings:
    raise ValueError(f"weighting must be one of {weightings}, got {weighting!r}.")
  if weighting == "sampling" and sampler is None:
    raise ValueError("weighting='sampling' needs a sampler (its marginals give 1/(n p_i)).")


def draw(key: jax.Array, data: FederatedData, cohort_size: int | None = None,
         sampler: Any = None) -> Cohort:
  """This round's cohort: a uniform sample of ``cohort_size`` distinct clients (all clients for
  ``None``), or ``sampler.sample(key)``."""
  if sampler is None:
    ids = sample_cohort(key, data.num_clients, cohort_size)
    ones = jnp.ones(ids.shape, float_dtype())
    cdata = data if ids.shape[0] == data.num_clients else data.select(ids)
    return Cohort(ids, ones, ones, cdata)
  drawn = sampler.sample(key)
  return Cohort(drawn.ids, drawn.mask.astype(float_dtype()),
                drawn.weights.astype(float_dtype()), data.select(drawn.ids))


def weights(cohort: Cohort, weighting: str) -> jax.Array:
  """Aggregation weights ``[m]``: ``"num_examples"`` (n_i / Σ n_j over members),
  ``"uniform"`` (1/|S|) or ``"sampling"`` (``1/(n p_i)``: the cohort mean is an unbiased
  estimate of the mean over all n clients). Padding entries get 0."""
  if weighting == "sampling":
    return cohort.sampling_weights
  return client_weights(cohort.data.num_examples, weighting, cohort.member)


def upload(key: jax.Array, cohort: Cohort, messages: Any, uplink: Any = None) -> Any:
  """The messages ``[m, ...]`` as the server receives them: compressed by ``uplink`` with each
  client's own key (``fold_in(key, client_id)``), or unchanged for ``None``."""
  if uplink is None:
    return messages
  return jax.vmap(uplink.compress)(client_keys(key, cohort.ids), messages)


def uplink_bits(cohort: Cohort, uplink: Any, d: int) -> jax.Array:
  """Bits the members upload with ``uplink`` for a ``d``-entry message: ``|S|·uplink.bits(d)``."""
  return cohort.size * as_float(uplink.bits(d))


def server_update(params: Any, opt_state: Any, delta: Any,
                  server_optimizer: optax.GradientTransformation | None) -> tuple[Any, Any]:
  """``params + delta`` (no server optimizer), else the optax step on the pseudo-gradient
  ``−delta`` (FedOpt: FedAdam, FedYogi, server momentum, ...)."""
  if server_optimizer is None:
    return jax.tree.map(jnp.add, params, delta), opt_state
  updates, opt_state = server_optimizer.update(jax.tree.map(jnp.negative, delta), opt_state,
                                               params)
  return optax.apply_updates(params, updates), opt_state


def server_init(params: Any, server_optimizer: optax.GradientTransformation | None) -> Any:
  """The server optimizer's state (``optax.identity``'s empty state for ``None``)."""
  return (server_optimizer or optax.identity()).init(params)



