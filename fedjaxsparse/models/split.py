"""Networks read as a shared representation and a personal head — the split that FedCR, FedSR
and FedPAC personalise along.

A :class:`SplitModel`'s parameters are ``{"body": ..., "head": ...}``:
``features(body, x [B, ...]) -> [B, F]`` and ``head(head, z [B, d]) -> logits [B, C]``.

* Deterministic representation (FedPAC): ``F = d`` and ``z = features``.
* Gaussian representation (the variational information bottleneck of FedCR and FedSR):
  ``F = 2d``; the first ``d`` outputs are the mean ``μ`` and ``σ = softplus(raw − α)`` is the
  standard deviation of a diagonal Gaussian ``p(z|x) = N(μ, diag σ²)``
  (:func:`gaussian_representation`); training draws ``z = μ + σ ⊙ ε``. Evaluation
  (:meth:`SplitModel.as_model`) uses ``z = μ``: the head is linear, so the mean of the logits
  over draws of ``z`` — what FedCR's code averages over 30 draws — is ``head(μ)`` exactly in
  the limit, without Monte Carlo noise.

:func:`fedcr_net` builds the networks of FedCR's code (Zhang et al. 2023), which Kai Yi's
dissertation ran for its Table B.1 (Scafflix) and Fig. 4.2 (FedP3): an MLP for EMNIST and
two-convolution CNNs for Fashion-MNIST and CIFAR, each with two 1024-unit dense layers.

References:
  Hao Zhang, Chenglin Li, Wenrui Dai, Junni Zou, Hongkai Xiong (2023). FedCR: Personalized
    Federated Learning Based on Across-Client Common Representation with Conditional Mutual
    Information Regularization. ICML 2023. (Code: github.com/haozzh/FedCR.)
  Alexander A. Alemi, Ian Fischer, Joshua V. Dillon, Kevin Murphy (2017). Deep Variational
    Information Bottleneck. ICLR 2017. arXiv:1612.00410.

Source for the team: seed 001 Table B.1 (ch. 3) and Fig. 4.2 (ch. 4).
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjaxsparse.core import CLASSIFICATION, Model
from fedjaxsparse.models.base import softmax_cross_entropy
from fedjaxsparse.models.conv import Conv, max_pool, resolve_impl
from fedjaxsparse.models.nets import image_shape
from fedjaxsparse.errors import check_int
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["SplitModel", "fedcr_net", "gaussian_representation", "kl_normal",
           "product_of_normals"]
__dir__ = _public_dir(__all__)


class SplitModel(NamedTuple):
  """A classifier split into a representation and a head (see the module docstring).

  Attributes:
    init: ``key -> {"body": ..., "head": ...}``.
    features: ``(body, x [B, ...]) -> [B, F]``.
    head: ``(head, z [B, dim]) -> logits [B, C]``.
    dim: ``d``, the representation's dimension (the head's input).
    gaussian: whether ``features`` are a diagonal Gaussian's ``(μ, raw scale)``, ``F = 2d``.
    alpha: the shift ``α`` of ``σ = softplus(raw − α)`` (FedCR's ``--alpha``, default 0).
  """
  init: Callable[[jax.Array], Any]
  features: Callable[[Any, jax.Array], jax.Array]
  head: Callable[[Any, jax.Array], jax.Array]
  dim: int
  gaussian: bool
  alpha: float = 0.0

  def representation(self, body: Any, x: jax.Array) -> tuple[jax.Array, jax.Array | None]:
    """``(μ [B, d], σ [B, d])`` of a Gaussian representation, ``(z [B, d], None)`` of a
    deterministic one."""
    f = self.features(body, x)
    if not self.gaussian:
      return f, None
    return gaussian_representation(f, self.dim, self.alpha)

  def as_model(self) -> Model:
    """The whole network as a :class:`~fedjaxsparse.core.Model` on ``{"body", "head"}``
    params: logits ``head(μ)`` (the mean representation), softmax cross-entropy."""
    def apply(params, x):
      return self.head(params["head"], self.representation(params["body"], x)[0])

    return Model(self.init, apply, softmax_cross_entropy, None, CLASSIFICATION)


def gaussian_representation(raw: jax.Array, dim: int, alpha: float = 0.0
                            ) -> tuple[jax.Array, jax.Array]:
  """``raw [B, 2d] -> (μ, σ)``: ``μ = raw[:, :d]``, ``σ = softplus(raw[:, d:] − α)``."""
  return raw[:, :dim], jax.nn.softplus(raw[:, dim:] - alpha)


def kl_normal(mu_q: jax.Array, sigma_q: jax.Array, mu_p: jax.Array, sigma_p: jax.Array
              ) -> jax.Array:
  """``KL(N(μ_q, σ_q²) ‖ N(μ_p, σ_p²))`` of diagonal Gaussians, summed over the last axis:
  ``½ Σ [σ_q²/σ_p² + (μ_p − μ_q)²/σ_p² − 1 + log σ_p² − log σ_q²]`` (standard deviations
  clamped at 1e-8 inside the logarithms, as FedCR's code)."""
  var_p = jnp.square(sigma_p)
  log_ratio = (2.0 * jnp.log(jnp.maximum(sigma_p, 1e-8))
               - 2.0 * jnp.log(jnp.maximum(sigma_q, 1e-8)))
  return 0.5 * jnp.sum(jnp.square(sigma_q) / var_p + jnp.square(mu_p - mu_q) / var_p - 1.0
                       + log_ratio, axis=-1)


def product_of_normals(precision_sum: jax.Array, weighted_mean_sum: jax.Array,
                       prior_precision: float = 0.0) -> tuple[jax.Array, jax.Array]:
  """The product of Gaussian experts ``Π_j N(μ_j, σ_j²)`` (times a ``N(0, 1/prior_precision)``
  prior) from the sums ``Σ_j 1/σ_j²`` and ``Σ_j μ_j/σ_j²``: precision
  ``τ = prior_precision + Σ_j 1/σ_j²``, mean ``Σ_j (μ_j/σ_j²) / τ``, standard deviation
  ``τ^{-1/2}`` (any leading shape)."""
  tau = prior_precision + precision_sum
  safe = jnp.where(tau > 0, tau, 1.0)
  return weighted_mean_sum / safe, jax.lax.rsqrt(safe)


class _Body(nn.Module):
  conv: Sequence[int]
  dense: Sequence[int]
  out: int
  impl: str

  @nn.compact
  def __call__(self, x):
    for i, c in enumerate(self.conv):
      x = nn.relu(Conv(c, (5, 5), padding="VALID", impl=self.impl, name=f"conv{i + 1}")(x))
      x = max_pool(x, (2, 2), (2, 2))
    x = x.reshape(x.shape[0], -1)
    for i, h in enumerate(self.dense):
      x = nn.relu(nn.Dense(h, name=f"fc{i + 1}")(x))
    return nn.Dense(self.out, name="projection")(x) if self.out else x


FEDCR_CONV = {"emnist": (), "fashion_mnist": (4, 12), "cifar": (64, 64)}
"""The convolutions of FedCR's networks by data set (5×5, "valid", each followed by ReLU and a
2×2 max-pool): none for EMNIST's MLP."""


def fedcr_net(input_shape: Sequence[int], num_classes: int, dim: int = 256, *,
              gaussian: bool = True, conv: Sequence[int] = (64, 64),
              dense: Sequence[int] = (1024, 1024), alpha: float = 0.0,
              conv_impl: str = "auto") -> SplitModel:
  """FedCR's networks as a :class:`SplitModel` (``models/Nets_VIB.py``, ``Nets.py`` and
  ``Nets_PAC.py`` of its code): ``conv`` 5×5 "valid" convolutions (ReLU, 2×2 max-pool) —
  :data:`FEDCR_CONV`: ``()`` for EMNIST's MLP, ``(4, 12)`` for Fashion-MNIST, ``(64, 64)`` for
  CIFAR-10/100 —, ``dense`` ReLU layers (1024, 1024), then

  * ``gaussian=True`` (FedCR, FedSR): a linear ``projection`` to ``2·dim`` outputs, read as a
    diagonal Gaussian (:func:`gaussian_representation`; FedCR: ``dim`` 256 or 512);
  * ``gaussian=False`` (FedPAC, FedAvg): the last dense layer's ReLU output is the
    representation (``dim`` is then ``dense[-1]``; the ``dim`` argument is ignored);

  and a linear ``head`` to ``num_classes``. Layer names: ``conv1``, ``conv2``, ``fc1``,
  ``fc2``, ``projection`` (body), ``head``. ``conv_impl``: :mod:`fedjaxsparse.models.conv`.
  Inputs ``[B, H, W, C]``, ``[B, H, W]`` or flat square images (an MLP takes any shape)."""
  resolve_impl(conv_impl)
  conv, dense = tuple(int(c) for c in conv), tuple(int(h) for h in dense)
  if not dense and not gaussian:
    raise ValueError("a deterministic fedcr_net needs at least one dense layer (its output is "
                     "the representation); got dense=().")
  for name, v in (("dim", dim), ("num_classes", num_classes)):
    check_int(name, v, 1)
  shape = image_shape(input_shape) if conv else tuple(int(s) for s in input_shape)
  d = dim if gaussian else dense[-1]
  body = _Body(conv, dense, 2 * d if gaussian else 0, conv_impl)
  head = nn.Dense(num_classes, name="head")

  @jax.jit   # one program: initialising op by op compiles every eager operation apart
  def init(key):
    kb, kh = jax.random.split(key)
    return {"body": body.init(kb, jnp.zeros((1,) + shape, jnp.float32))["params"],
            "head": head.init(kh, jnp.zeros((1, d), jnp.float32))["params"]}

  def features(params, x):
    return body.apply({"params": params}, x.reshape((x.shape[0],) + shape))

  def apply_head(params, z):
    return head.apply({"params": params}, z)

  return SplitModel(init, features, apply_head, d, gaussian, float(alpha))
