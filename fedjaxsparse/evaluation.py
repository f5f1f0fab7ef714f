"""Evaluation of a global model (or per-client models) on a federated split, inside ``jit``.

Metrics are pooled over all real examples of all clients (padding excluded): ``loss`` is the
mean per-example loss (no regulariser), ``accuracy`` for classification, ``r2`` (coefficient of
determination against the pooled test mean) and ``mse`` for regression.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import jax
import jax.numpy as jnp

from fedjaxsparse.core import CLASSIFICATION, Model
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["evaluate", "evaluate_per_client", "client_accuracy", "make_eval_fn",
           "evaluate_personal", "make_personal_eval_fn"]
__dir__ = _public_dir(__all__)

if TYPE_CHECKING:   # annotations only: evaluation sits below the data wing
  from fedjaxsparse.data.federated import FederatedData


def _client_sums(model: Model, params: Any, x: jax.Array, y: jax.Array, mask: jax.Array,
                 batch_size: int | None) -> dict[str, jax.Array]:
  """Sufficient sums of one client's metrics; ``x [M, ...]``, ``y [M]``, ``mask [M]``."""
  m = x.shape[0]
  if batch_size is None or batch_size >= m:
    batches = jax.tree.map(lambda a: a[None], (x, y, mask))
  else:
    pad = (-m) % batch_size
    padded = jax.tree.map(lambda a: jnp.pad(a, [(0, pad)] + [(0, 0)] * (a.ndim - 1)),
                          (x, y, mask))
    batches = jax.tree.map(lambda a: a.reshape((-1, batch_size) + a.shape[1:]), padded)

  def one_batch(batch):
    bx, by, bm = batch
    out = model.apply(params, bx)
    sums = {"count": jnp.sum(bm), "loss": jnp.sum(model.per_example_loss(out, by) * bm)}
    if model.task == CLASSIFICATION:
      sums["correct"] = jnp.sum((jnp.argmax(out, -1) == by) * bm)
    else:
      sums["sse"] = jnp.sum(jnp.square(out - by) * bm)
      sums["sum_y"] = jnp.sum(by * bm)
      sums["sum_y2"] = jnp.sum(jnp.square(by) * bm)
    return sums

  return jax.tree.map(lambda a: jnp.sum(a, 0), jax.lax.map(one_batch, batches))


def _metrics(model: Model, sums: dict[str, jax.Array]) -> dict[str, jax.Array]:
  count = jnp.maximum(sums["count"], 1.0)
  out = {"loss": sums["loss"] / count}
  if model.task == CLASSIFICATION:
    out["accuracy"] = sums["correct"] / count
  else:
    total = sums["sum_y2"] - jnp.square(sums["sum_y"]) / count
    out["mse"] = sums["sse"] / count
    out["r2"] = 1.0 - sums["sse"] / jnp.maximum(total, 1e-30)
  return out


def evaluate(model: Model, params: Any, data: FederatedData,
             batch_size: int | None = None) -> dict[str, jax.Array]:
  """Metrics of one model ``params`` pooled over every client of ``data``.

  Args:
    model: the model.
    params: one model (leaves without a client axis).
    data: the split, ``x [N, M, ...]``.
    batch_size: evaluate each client in batches of this many examples (bounds memory for big
      models); ``None`` evaluates a client in one batch.
  Returns:
    ``{"loss", "accuracy"}`` or ``{"loss", "mse", "r2"}``, float32 scalars.
  """
  sums = jax.vmap(lambda x, y, m: _client_sums(model, params, x, y, m, batch_size))(
      data.x, data.y, data.mask)
  return _metrics(model, jax.tree.map(lambda a: jnp.sum(a, 0), sums))


def evaluate_per_client(model: Model, client_params: Any, data: FederatedData,
                        batch_size: int | None = None) -> dict[str, jax.Array]:
  """Metrics of client ``i``'s own model ``client_params[i]`` on client ``i``'s data: ``[N]``."""
  sums = jax.vmap(lambda p, x, y, m: _client_sums(model, p, x, y, m, batch_size))(
      client_params, data.x, data.y, data.mask)
  return jax.vmap(lambda s: _metrics(model, s))(sums)


def client_accuracy(model: Model, batch_size: int | None = None) -> Callable:
  """``(params, x, y, mask) -> accuracy`` of one client's real examples (classification),
  jittable: the pruning test of Sub-FedAvg and similar per-client decisions."""
  return lambda params, x, y, mask: _metrics(
      model, _client_sums(model, params, x, y, mask, batch_size))["accuracy"]


def make_eval_fn(model: Model, batch_size: int | None = None
                 ) -> Callable[[Any, FederatedData], dict[str, jax.Array]]:
  """``(params, test_data) -> metrics``, the evaluation hook of the runner.

  The data is an argument (not a closed-over constant) so it is not baked into the program.
  """
  return lambda params, data: evaluate(model, params, data, batch_size)


def evaluate_personal(model: Model, client_params: Any, data: FederatedData,
                      batch_size: int | None = None, per_client: bool = True
                      ) -> dict[str, jax.Array]:
  """Personalised FL's metrics (FLIX's x̃_i, Ditto's v_i, a personalised mask): client ``i``
  evaluated with its *own* model ``client_params[i]`` (``[N, ...]``) on its own examples.

  Returns, for each metric ``m`` of :func:`evaluate` (``loss``, ``accuracy`` / ``mse``, ``r2``):
  ``m`` pooled over all examples (the example-weighted average over clients),
  ``m_client_mean`` (the plain average over the clients that have examples) and, with
  ``per_client``, ``m_per_client`` (``[N]``; NaN for a client without examples)."""
  sums = jax.vmap(lambda p, x, y, m: _client_sums(model, p, x, y, m, batch_size))(
      client_params, data.x, data.y, data.mask)
  out = _metrics(model, jax.tree.map(lambda a: jnp.sum(a, 0), sums))
  per = jax.vmap(lambda s: _metrics(model, s))(sums)
  has = sums["count"] > 0
  for name, values in per.items():
    out[f"{name}_client_mean"] = jnp.sum(jnp.where(has, values, 0)) / jnp.maximum(
        jnp.sum(has), 1)
    if per_client:
      out[f"{name}_per_client"] = jnp.where(has, values, jnp.nan)
  return out


def make_personal_eval_fn(model: Model, personal: Callable[[Any], Any],
                          global_model: Callable[[Any], Any] | None = lambda params: params,
                          batch_size: int | None = None, per_client: bool = True
                          ) -> Callable[[Any, FederatedData], dict[str, jax.Array]]:
  """``(params, test) -> metrics`` for a personalised method, the runner's evaluation hook.

  ``personal(params)`` gives the clients' own models ``[N, ...]`` (``test`` has the training
  clients on axis 0) and ``global_model(params)`` the shared model, evaluated pooled next to
  them as ``global_loss``, ``global_accuracy`` (``None``: no global model). ``params`` is what
  the runner's ``params_fn`` returns (``state.params``, or the whole state for methods that
  keep personal models in their state). Keys: :func:`evaluate_personal`'s plus ``global_*``.
  """
  def eval_fn(params, test):
    out = evaluate_personal(model, personal(params), test, batch_size, per_client)
    if global_model is not None:
      out.update({f"global_{k}": v for k, v in
                  evaluate(model, global_model(params), test, batch_size).items()})
    return out

  return eval_fn
