"""Models for one client: ``Model(init, apply, per_example_loss, regularizer, task)``."""
from __future__ import annotations

from typing import Sequence

from fedjaxsparse.models.base import (CLASSIFICATION, REGRESSION, Model, make_loss,
                                      softmax_cross_entropy, squared_error)
from fedjaxsparse.models.linear import (linear_regression, logistic_regression,
                                        softmax_regression)
from fedjaxsparse.models.nets import cnn, mlp, num_params, resnet18

MODELS = ("linear", "softmax", "mlp", "cnn", "resnet18")


def get_model(name: str, input_shape: Sequence[int], num_classes: int, **kwargs) -> Model:
  """A model by name for inputs of ``input_shape`` (no batch axis) and ``num_classes``
  (0 for regression, which only ``"linear"`` supports)."""
  d = 1
  for s in input_shape:
    d *= int(s)
  if name == "linear":
    return linear_regression(d, **kwargs)
  if name == "softmax":
    return softmax_regression(d, num_classes, **kwargs)
  if name == "mlp":
    return mlp(input_shape, num_classes, **kwargs)
  if name == "cnn":
    return cnn(input_shape, num_classes, **kwargs)
  if name == "resnet18":
    return resnet18(input_shape, num_classes, **kwargs)
  raise ValueError(f"unknown model {name!r}; choose from {MODELS}.")


__all__ = ["CLASSIFICATION", "REGRESSION", "Model", "make_loss", "softmax_cross_entropy",
           "squared_error", "linear_regression", "softmax_regression", "mlp", "cnn",
           "resnet18", "num_params", "get_model", "MODELS", "logistic_regression"]
