"""Models for one client: ``Model(init, apply, per_example_loss, regularizer, task)``: linear
models, the papers' networks (``nets``, ``conv``), networks that declare their prunable
channel groups (``prunable``), networks split into a representation and a head (``split``), EfficientNet, a decoder-only transformer (``transformer``), and
— loaded on first use — Hugging Face checkpoints (``hf``) and CLIP (``clip``; its ResNet
towers, RN50 and kin, in ``clip_resnet``; the zero-shot teacher and CoOp in ``clip_teacher``)."""
from __future__ import annotations

import math
from typing import Sequence

from fedjaxsparse.models import (base, conv, efficientnet, linear, nets, prunable, split,
                                 transformer)
from fedjaxsparse.models.base import (from_flax, global_mean_scale, make_loss,
                                      softmax_cross_entropy, squared_error)
from fedjaxsparse.models.linear import (linear_regression, logistic_loss, logistic_regression,
                                        softmax_regression)
from fedjaxsparse.models.nets import (bn_cnn, char_lstm, cnn, cohort_squeeze_cnn, fedp3_cnn,
                                      lenet5_caffe, mlp, resnet18, vgg11)
from fedjaxsparse.models.split import SplitModel, fedcr_net
from fedjaxsparse.ops.sparsity import num_params
from fedjaxsparse.core import Model, lazy_submodules
from fedjaxsparse.core import public_dir as _public_dir

MODELS = ("linear", "softmax", "mlp", "cnn", "resnet18", "lstm")
"""The model names the experiments' ``model`` option accepts."""


def get_model(name: str, input_shape: Sequence[int], num_classes: int, **kwargs) -> Model:
  """The model ``name`` (one of ``MODELS``) for inputs of ``input_shape`` (no batch axis).

  ``num_classes`` is ignored by ``"linear"`` (regression); ``kwargs`` go to the constructor
  (e.g. ``l2`` for the linear models, ``norm`` for ``"resnet18"``).
  """
  if name not in MODELS:
    raise ValueError(f"unknown model {name!r}; choose from {MODELS}.")
  d = math.prod(int(s) for s in input_shape)
  if name == "linear":
    return linear_regression(d, **kwargs)
  if name == "softmax":
    return softmax_regression(d, num_classes, **kwargs)
  if name == "lstm":  # inputs: character indices [seq_len]
    return char_lstm(d, num_classes, **kwargs)
  return {"mlp": mlp, "cnn": cnn, "resnet18": resnet18}[name](input_shape, num_classes,
                                                               **kwargs)


__all__ = [
    "base", "conv", "efficientnet", "linear", "nets", "prunable", "split", "transformer", "hf",
    "clip", "clip_resnet", "clip_teacher", "SplitModel", "fedcr_net",
    "make_loss", "global_mean_scale", "from_flax",
    "softmax_cross_entropy", "squared_error", "logistic_loss", "linear_regression",
    "softmax_regression", "logistic_regression", "mlp", "cnn", "cohort_squeeze_cnn", "bn_cnn",
    "fedp3_cnn", "lenet5_caffe", "vgg11", "resnet18", "char_lstm", "num_params", "get_model",
    "MODELS",
]
__dir__ = _public_dir(__all__)


# Checkpoint formats with heavy optional dependencies (safetensors, tokenizers): imported on
# first use (``fedjaxsparse.models.hf``), never by ``import fedjaxsparse``.
__getattr__ = lazy_submodules(__name__, ("hf", "clip", "clip_resnet", "clip_teacher"))
