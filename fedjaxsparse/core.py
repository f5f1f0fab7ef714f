"""The one abstraction every algorithm implements: ``Algorithm(init, step)``.

Conventions (DESIGN.md, "The shape"):

* ``state = algo.init(key, params, data)`` and ``state, info = algo.step(key, state, data)``.
  The PRNG key is always the first argument; there is no hidden randomness.
* ``data`` is the training split of a :class:`fedjaxsparse.data.FederatedData` (leaves
  ``[N, M, ...]``), so the population size ``N`` is read from the data's leading axis.
* ``state`` is a NamedTuple. It exposes the current *global* model as ``state.params`` (a
  field or a property), which is what the runner evaluates. Per-client state has leaves of
  shape ``[N, ...]``.
* ``info`` is a NamedTuple with at least the scalar fields ``loss`` (training loss of the
  participating clients), ``bits_up`` and ``bits_down`` (bits that crossed the network
  in this step in each direction, summed over clients; see :mod:`fedjaxsparse.ops.accounting`).
* Dtypes: every weight, step size and ledger (bits, counts, fractions) of a state or an info
  is in the default float dtype, :func:`float_dtype` — float32, or float64 under
  ``jax_enable_x64`` — so that a float64 run stays float64 throughout.

Both functions are pure and jittable; hyper-parameters are closed over by the builder that
returns the ``Algorithm`` (the optax / blackjax convention).
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Protocol

import jax
import jax.numpy as jnp

__all__ = ["PRNGKey", "Params", "LossFn", "float_dtype", "as_float", "InitFn", "StepFn",
           "Algorithm", "global_params", "ParamsFn", "personal_params", "lazy_submodules",
           "public_dir", "shared_doc",
           "CLASSIFICATION", "REGRESSION", "Model"]

PRNGKey = jax.Array
Params = Any
# One client's loss: ``(params, x [B, ...], y [B], mask [B]) -> scalar`` (``mask`` is 1 for a
# real example and 0 for padding; :func:`fedjaxsparse.models.make_loss` builds one from a model).
LossFn = Callable[[Any, jax.Array, jax.Array, jax.Array], jax.Array]


def float_dtype():
  """The default float dtype: ``float64`` under ``jax_enable_x64``, else ``float32``."""
  return jax.dtypes.canonicalize_dtype(jnp.float64)


def as_float(x: Any) -> jax.Array:
  """``x`` as an array of the default float dtype (:func:`float_dtype`)."""
  return jnp.asarray(x, float_dtype())


class InitFn(Protocol):
  def __call__(self, key: PRNGKey, params: Params, data: Any) -> Any:
    ...


class StepFn(Protocol):
  def __call__(self, key: PRNGKey, state: Any, data: Any) -> tuple[Any, Any]:
    ...


class Algorithm(NamedTuple):
  """A federated algorithm as two pure functions.

  Attributes:
    init: ``(key, params, data) -> state``; ``params`` is the initial global model.
    step: ``(key, state, data) -> (state, info)``; one communication round (or one iteration
      for iteration-level methods such as ProxSkip).
    bucketable: whether ``init`` and ``step`` also accept size-bucketed clients
      (:class:`fedjaxsparse.runtime.clients.BucketedData`, run through
      :func:`fedjaxsparse.runtime.clients.map_clients`) with the same result; the runner then
      buckets unequal clients by itself (:func:`fedjaxsparse.runtime.clients.auto_layout`).

  >>> import jax, optax
  >>> import fedjaxsparse as fjs
  >>> ds = fjs.data.digits(num_clients=4)
  >>> model = fjs.models.softmax_regression(64, 10)
  >>> algo = fjs.fedavg(fjs.models.make_loss(model), optax.sgd(0.1), local_steps=2)
  >>> state = algo.init(jax.random.key(0), model.init(jax.random.key(0)), ds.train)
  >>> state, info = algo.step(jax.random.key(1), state, ds.train)
  >>> info.bits_up.item() == 4 * 32 * (64 * 10 + 10)     # four dense fp32 uploads
  True
  >>> jax.tree.map(lambda x: x.shape, fjs.global_params(state))
  {'b': (10,), 'w': (64, 10)}
  """
  init: InitFn
  step: StepFn
  bucketable: bool = False


def global_params(state: Any) -> Params:
  """The global model held by ``state`` (its ``params`` field or property)."""
  try:
    return state.params
  except AttributeError as e:
    raise TypeError(
        f"{type(state).__name__} has no `params` field or property; algorithm states must "
        "expose the global model as `state.params` (or pass `params_fn` to the runner)."
    ) from e


ParamsFn = Callable[[Any], Params]


def personal_params(state: Any) -> Params:
  """The personalised models ``[N, ...]`` (one per client, stacked on the leading axis) held
  by a personalised algorithm's ``state`` (its ``personal`` field or property: FedSpa, Ditto,
  Sub-FedAvg, FML, Scafflix and FLIX — whose models are ``α_i x + (1 − α_i) x_i*`` — ...).
  FedP3's clients keep no state: their deployed models are a function of the global model and
  the configuration (:func:`fedjaxsparse.algorithms.fedp3.deployed_models`)."""
  try:
    return state.personal
  except AttributeError as e:
    raise TypeError(
        f"{type(state).__name__} has no `personal` field or property: it is not the state of a "
        "personalised algorithm (personalised states expose their per-client models as "
        "`state.personal`)."
    ) from e


def lazy_submodules(package: str, names: tuple[str, ...]) -> Callable[[str], Any]:
  """A module ``__getattr__`` (PEP 562) for ``package`` that imports the submodules ``names``
  on first use: heavy optional modules stay out of ``import fedjaxsparse``."""
  def __getattr__(name: str) -> Any:
    if name in names:
      import importlib   # only when a lazy submodule is first used
      return importlib.import_module(f"{package}.{name}")
    raise AttributeError(f"module {package!r} has no attribute {name!r}")
  return __getattr__


def public_dir(names: list[str]) -> Callable[[], list[str]]:
  """A module ``__dir__`` (PEP 562) listing only ``names`` (the module's ``__all__``): what
  ``dir(module)`` and tab completion show is the public surface, not the module's imports."""
  listed = sorted(names)
  def __dir__() -> list[str]:
    return list(listed)
  return __dir__


def shared_doc(**parts: str) -> Callable[[Any], Any]:
  """A decorator filling ``{{name}}`` markers of a docstring with ``parts[name]``: one copy of
  the text several constructors' docstrings share (their common Args entries, the state they
  return), written out in every ``help()`` and on the documentation site. Each part is given
  with the indentation it has in the docstrings it fills; a marker without a part raises."""
  def fill(fn: Any) -> Any:
    doc = fn.__doc__ or ""
    for name, text in parts.items():
      doc = doc.replace("{{" + name + "}}", text.strip())
    if "{{" in doc:
      raise ValueError(f"{fn.__name__}'s docstring has an unfilled marker: "
                       f"{doc[doc.index('{{'):][:40]!r}.")
    fn.__doc__ = doc
    return fn
  return fill


# --- The model contract: what every network of ``fedjaxsparse.models`` returns -------------

CLASSIFICATION = "classification"
"""A :class:`Model`'s ``task`` when it outputs class logits (accuracy is its metric)."""
REGRESSION = "regression"
"""A :class:`Model`'s ``task`` when it outputs real values (its metric is the loss)."""


class Model(NamedTuple):
  """A model as pure functions.

  Attributes:
    init: ``key -> params``, the initial parameters of one client (a pytree).
    apply: ``(params, x[B, ...]) -> outputs``; logits ``[B, C]`` for classification,
      predictions ``[B]`` for regression.
    per_example_loss: ``(outputs, y[B]) -> [B]`` loss of every example.
    regularizer: ``params -> scalar`` added once to the loss (e.g. a ridge term), or ``None``.
    task: ``"classification"`` or ``"regression"``.
  """
  init: Callable[[jax.Array], Params]
  apply: Callable[[Params, jax.Array], jax.Array]
  per_example_loss: Callable[[jax.Array, jax.Array], jax.Array]
  regularizer: Callable[[Params], jax.Array] | None
  task: str

__dir__ = public_dir(__all__)
