"""The pieces shared by the personalised methods that share a representation and keep a
personal head — FedCR (:mod:`fedjaxsparse.algorithms.fedcr`), FedSR(-FT)
(:mod:`fedjaxsparse.algorithms.fedsr`) and FedPAC (:mod:`fedjaxsparse.algorithms.fedpac`),
baselines of the Scafflix paper (Yi, Condat & Richtárik, arXiv:2305.13170, its
additional-baselines table) and of the FedP3 paper (Yi et al., arXiv:2404.09816, its FedCR
comparison), as those papers ran them (FedCR's code, github.com/haozzh/FedCR). Those papers do
not describe the three methods, so they follow the methods' own papers and that code.

All three train a :class:`fedjaxsparse.models.split.SplitModel` (``{"body", "head"}``) with
any sampler, weighting and server optimiser and epoch-based local training
(:func:`fedjaxsparse.ops.local.epoch_optimize`). Each is a client update on
:func:`fedjaxsparse.algorithms.cohort_round.cohort_round`; FedCR's and FedPAC's servers also
keep class statistics beside the model (a
:class:`~fedjaxsparse.algorithms.cohort_round.ServerPart`). Here: the state of the methods
with personal heads (:class:`HeadsState`), their round's info (:class:`RoundInfo`), FedCR's
local optimiser, the sampled cross-entropy of a Gaussian representation, and the evaluation.

:func:`fine_tune` is the final round of FedCR's code (every client trains its head, or its
projection and head, on its own data); :func:`make_fine_tuned_eval_fn` evaluates that way.

References:
  Hao Zhang, Chenglin Li, Wenrui Dai, Junni Zou, Hongkai Xiong (2023). FedCR: Personalized
    Federated Learning Based on Across-Client Common Representation with Conditional Mutual
    Information Regularization. ICML 2023, PMLR 202:41314-41330.
  Nguyen, A. Tuan; Torr, Philip H. S.; Lim, Ser-Nam (2022). FedSR: A Simple and Effective
    Domain Generalization Method for Federated Learning. NeurIPS 2022.
  Jian Xu, Xinyi Tong, Shao-Lun Huang (2023). Personalized Federated Learning with Feature
    Alignment and Classifier Collaboration. ICLR 2023. arXiv:2306.11867.

Source for the team: seed 001 l. 2919-25, 1285; ``seed001_ch3_ch5.md`` §B.1; ``seed001_ch4_ch6.md``
(FedCR row); dissertation Table B.1 (ch. 3) and Fig. 4.2 (ch. 4).
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjaxsparse import evaluation
from fedjaxsparse.algorithms.cohort_round import CohortState
from fedjaxsparse.data.federated import FederatedData
from fedjaxsparse.errors import check_int, check_number
from fedjaxsparse.models.base import softmax_cross_entropy
from fedjaxsparse.models.split import SplitModel
from fedjaxsparse.ops.local import check_lr, epoch_optimize, max_local_steps
from fedjaxsparse.ops.sampling import client_keys
from fedjaxsparse.runtime.clients import map_clients
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["HeadsState", "RoundInfo", "local_optimizer", "sampled_cross_entropy",
           "check_options", "fine_tune", "make_fine_tuned_eval_fn", "personal_models",
           "features_in_batches"]
__dir__ = _public_dir(__all__)


class HeadsState(CohortState):
  """A cohort state whose client states hold personal heads (``clients["head"]``), or — for a
  method whose head is shared (``clients["shared_head"]``, ``bool[N]``) — none: every client's
  head is then the global one."""
  __slots__ = ()

  @property
  def heads(self) -> Any:
    """Personal heads, leaves ``[N, ...]`` (a shared head broadcast to every client)."""
    if "shared_head" in self.clients:
      n = self.clients["shared_head"].shape[0]
      return jax.tree.map(lambda a: jnp.broadcast_to(a, (n,) + a.shape), self.params["head"])
    return self.clients["head"]

  @property
  def personal(self) -> Any:
    """Every client's model ``{"body": φ, "head": h_i}``, leaves ``[N, ...]``."""
    return personal_models(self.params, self.heads)


class RoundInfo(NamedTuple):
  """Per round: ``loss`` (the cohort's first-step loss, weighted as the aggregation),
  ``bits_up`` (bodies — only the ``L_i`` layers with ``train_layers`` — plus the class
  experts sent, 2d floats each), ``bits_down`` (body and r(z|y), fp32), ``num_clients``."""
  loss: jax.Array
  bits_up: jax.Array
  bits_down: jax.Array
  num_clients: jax.Array


def personal_models(params: Any, heads: Any) -> Any:
  """``{"body": φ broadcast to [N, ...], "head": heads}`` for heads with leaves ``[N, ...]``."""
  n = jax.tree.leaves(heads)[0].shape[0]
  return {"body": jax.tree.map(lambda a: jnp.broadcast_to(a, (n,) + a.shape), params["body"]),
          "head": heads}


def local_optimizer(lr: Any, momentum: float = 0.0, weight_decay: float = 0.0,
                    clip: float | None = 10.0) -> optax.GradientTransformation:
  """FedCR's local optimiser (PyTorch's SGD after ``clip_grad_norm_``): the gradient's global
  norm clipped at ``clip`` (``None``: no clipping), plus ``weight_decay·w``, then SGD with
  heavy-ball ``momentum`` (``buf ← m·buf + g``, ``w ← w − lr·buf``)."""
  parts = [] if clip is None else [optax.clip_by_global_norm(clip)]
  if weight_decay:
    parts.append(optax.add_decayed_weights(weight_decay))
  parts.append(optax.sgd(lr, momentum=momentum or None))
  return optax.chain(*parts)


def sampled_cross_entropy(model: SplitModel, head: Any, mu: jax.Array,
                           sigma: jax.Array | None, key: jax.Array, samples: int,
                           y: jax.Array) -> tuple[jax.Array, jax.Array]:
  """``(z [S, B, d], ce [B])``: ``S = samples`` draws ``z = μ + σ ⊙ ε`` (``z = μ``, one draw,
  for ``sigma`` None) and every example's cross-entropy of ``head(z)`` averaged over them."""
  z = mu[None] if sigma is None else (
      mu[None] + sigma[None] * jax.random.normal(key, (samples,) + mu.shape, mu.dtype))
  logits = jax.vmap(model.head, in_axes=(None, 0))(head, z)            # [S, B, C]
  return z, jnp.mean(jax.vmap(softmax_cross_entropy, in_axes=(0, None))(logits, y), axis=0)


def check_options(lr, epochs, batch_size, samples, momentum, weight_decay, clip):
  """The options the representation families share, checked with errors naming them."""
  check_lr(lr)
  check_number("momentum", momentum, 0.0, 1.0, high_open=True)
  check_number("weight_decay", weight_decay, 0.0, None)
  if clip is not None:
    check_number("clip", clip, 0.0, None, low_open=True)
  for name, v in (("epochs", epochs), ("batch_size", batch_size), ("samples", samples)):
    check_int(name, v, 1)


def fine_tune(model: SplitModel, personal: Any, data: FederatedData, key: jax.Array, *,
              lr: float, epochs: int = 10, batch_size: int = 48, trainable: str = "head",
              samples: int = 1, momentum: float = 0.0, weight_decay: float = 0.0,
              clip: float | None = 10.0) -> Any:
  """Every client's model after ``epochs`` epochs of training the parts named by ``trainable``
  on its own data, the rest frozen — the final round of FedCR's code for FedCR, FedSR-FT and
  FedPAC, and FedAvg-FT's fine-tuning. ``personal``: ``{"body", "head"}`` with leaves
  ``[N, ...]`` (:func:`personal_models`). ``trainable``: ``"head"`` (FedCR, FedPAC),
  ``"projection+head"`` (FedSR-FT: the Gaussian projection layer and the head) or
  ``"all"``. The loss is the cross-entropy of ``samples`` draws of ``z`` (a Gaussian
  representation) or of the features. Returns the fine-tuned ``personal``."""
  check_options(lr, epochs, batch_size, samples, momentum, weight_decay, clip)
  choices = ("head", "projection+head", "all")
  if trainable not in choices:
    raise ValueError(f"trainable must be one of {choices}, got {trainable!r}.")
  one = jax.tree.map(lambda a: a[0], personal)
  mask = {"body": jax.tree_util.tree_map_with_path(
              lambda path, _: trainable == "all" or (
                  trainable == "projection+head" and
                  getattr(path[0], "key", None) == "projection"), one["body"]),
          "head": jax.tree.map(lambda _: True, one["head"])}
  if trainable == "projection+head" and not any(jax.tree.leaves(mask["body"])):
    raise ValueError("trainable='projection+head' needs a body with a 'projection' layer "
                     "(a Gaussian fedcr_net).")

  def loss_fn(p, k, x, y, m):
    mu, sigma = model.representation(p["body"], x)
    _, ce = sampled_cross_entropy(model, p["head"], mu, sigma, k, samples, y)
    return jnp.sum(ce * m) / jnp.maximum(jnp.sum(m), 1.0), None

  opt = local_optimizer(lr, momentum, weight_decay, clip)
  steps = max_local_steps(data, batch_size, epochs)
  n = data.num_clients

  def client(p, k, d):
    return epoch_optimize(loss_fn, p, opt, k, d, epochs=epochs, batch_size=batch_size,
                          max_steps=steps, trainable=mask)[0]

  # the client ids inside the program (an eager arange compiles a program of its own)
  return jax.jit(lambda p, k, dd: map_clients(client, dd, p, client_keys(k, jnp.arange(n))))(
      personal, key, data)


# --------------------------------------------------------------------------------------------
# FedSR


def features_in_batches(model: SplitModel, body: Any, x: jax.Array, batch_size: int
                        ) -> jax.Array:
  """``model.features(body, x)`` for one client's ``x [M, ...]``, computed ``batch_size`` rows
  at a time (``lax.map``; rows padded to a multiple), so a client's whole data set never sits
  in one activation tensor."""
  m = x.shape[0]
  b = min(batch_size, m)
  pad = -m % b
  xp = jnp.concatenate([x, jnp.zeros((pad,) + x.shape[1:], x.dtype)]) if pad else x
  out = jax.lax.map(lambda xb: model.features(body, xb), xp.reshape((-1, b) + x.shape[1:]))
  return out.reshape((-1,) + out.shape[2:])[:m]


def make_fine_tuned_eval_fn(model: SplitModel, train: FederatedData, key: jax.Array, *,
                            lr: float, epochs: int = 10, batch_size: int = 48,
                            trainable: str = "head", samples: int = 1,
                            batch_size_eval: int | None = None
                            ) -> Callable[[Any, FederatedData], dict[str, jax.Array]]:
  """``(state, test) -> metrics`` for the runner: every client's model ``state.personal``
  fine-tuned on its own training examples ``train`` by :func:`fine_tune` (on a copy — the
  state is not changed), then evaluated on its own test examples
  (:func:`fedjaxsparse.evaluation.evaluate_personal`'s keys), the models before fine-tuning
  beside as ``before_accuracy``. FedCR's code evaluates its last round this way."""
  net = model.as_model()

  def eval_fn(state, test):
    personal = state.personal
    tuned = fine_tune(model, personal, train, key, lr=lr, epochs=epochs,
                      batch_size=batch_size, trainable=trainable, samples=samples)
    out = evaluation.evaluate_personal(net, tuned, test, batch_size_eval)
    out["before_accuracy"] = evaluation.evaluate_personal(
        net, personal, test, batch_size_eval, per_client=False)["accuracy"]
    return out

  return eval_fn
