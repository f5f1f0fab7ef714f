"""Fed-LPFM's frozen zero-shot teacher from a CLIP checkpoint — a Hugging Face ViT
(:mod:`fedjaxsparse.models.clip`) or OpenAI's ResNet towers
(:mod:`fedjaxsparse.models.clip_resnet`): the class embeddings of tokenised prompts (prompt
ensembles averaged), the teacher's logits ``exp(logit_scale) * normalize(img_emb) @
class_emb.T`` (``[B, K]``), a data set's logits computed once (:func:`cached_logits`), and
CoOp's prompt tuning (:func:`prompt_tuning`, the prompt-tuned teacher of Fed-LPFM's ablation).

Typical use (the teacher's logits for a whole data set, computed once and reused every round)::

  t = zero_shot_teacher(DIR, None, class_token_ids)
  size = t.cfg.vision_config.image_size
  logits = cached_logits(lambda p, x: teacher_logits(t, p, preprocess(x, size)), images,
                         params=t.params)

Source for the team: seed 004 Task 3, Table 11 (:func:`prompt_tuning`).
"""
from __future__ import annotations

import functools
import os
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjaxsparse.errors import check_int
from fedjaxsparse.models.base import softmax_cross_entropy
from fedjaxsparse.models.clip import (LEGACY_EOS_TOKEN_ID, CLIPConfig, TextConfig,
                                      config_from_hf, image_features, load_config, load_params,
                                      normalize, preprocess, text_features)
from fedjaxsparse.core import CLASSIFICATION, Model
from fedjaxsparse.core import public_dir as _public_dir

__all__ = ["ZeroShotTeacher", "check_token_ids", "class_embeddings", "zero_shot_teacher",
           "teacher_logits", "cached_logits", "fine_tunable", "PromptTuned", "prompt_tuning"]
__dir__ = _public_dir(__all__)

# ---------------------------------------------------------------------------------------------
# the zero-shot teacher


class ZeroShotTeacher(NamedTuple):
  """A frozen CLIP zero-shot classifier over ``K`` classes.

  ``image_fn(params, images [B, S, S, 3]) -> [B, D]`` image embeddings (jitted, unnormalised);
  ``class_emb [K, D]`` unit-norm class-prompt embeddings; ``logit_scale`` the scalar *log* scale
  (the logits use ``exp(logit_scale)``, 100 for the released openai models); ``params`` what
  ``image_fn`` needs (``vision_model``, ``visual_projection``, on device); ``cfg`` the model's
  :class:`CLIPConfig`."""
  image_fn: Callable[[Any, jax.Array], jax.Array]
  class_emb: jax.Array
  logit_scale: jax.Array
  params: dict[str, Any]
  cfg: CLIPConfig


def check_token_ids(ids: Any, c: TextConfig) -> np.ndarray:
  """``ids`` as ``int32[K, L]`` or ``[K, M, L]`` after checking the shape, the vocabulary range
  and (for configs with a real EOS id) that every prompt holds its EOS token; ValueError
  otherwise."""
  ids = np.asarray(ids)
  if not np.issubdtype(ids.dtype, np.integer):
    raise ValueError(f"class_token_ids must be integer token ids, got dtype {ids.dtype}.")
  if ids.ndim not in (2, 3) or min(ids.shape) < 1 or ids.shape[-1] > c.max_position_embeddings:
    raise ValueError(f"class_token_ids must have shape [K, L] or [K, M, L] (M prompts per class) "
                     f"with L <= max_position_embeddings={c.max_position_embeddings}, got "
                     f"{ids.shape}.")
  if ids.min() < 0 or ids.max() >= c.vocab_size:
    raise ValueError(f"class_token_ids must lie in [0, vocab_size={c.vocab_size}), got "
                     f"[{ids.min()}, {ids.max()}].")
  if c.eos_token_id != LEGACY_EOS_TOKEN_ID:
    flat = ids.reshape(-1, ids.shape[-1])
    bad = np.flatnonzero(~(flat == c.eos_token_id).any(-1))
    if bad.size:
      raise ValueError(f"class_token_ids: {bad.size} prompt(s) (e.g. flat row {bad[0]}) hold no "
                       f"eos_token_id={c.eos_token_id}; tokenize with the model's tokenizer "
                       "(it appends EOS) and do not truncate it away.")
  return ids.astype(np.int32)


def class_embeddings(text_fn: Callable[[Any, jax.Array], jax.Array], params: Any, token_ids: Any,
                     batch_size: int = 256) -> np.ndarray:
  """``float32[K, D]`` unit class embeddings of checked token ids (:func:`check_token_ids`):
  ``text_fn(params, ids [B, L]) -> [B, D]`` over the prompts ``batch_size`` at a time (one
  program: the last batch padded), each embedding normalised; for ``[K, M, L]`` the M prompts'
  unit embeddings are averaged and renormalised (CLIP's prompt ensembling). The ViT and ResNet
  teachers both build theirs here."""
  ids = np.asarray(token_ids)
  emb = _batched(text_fn, ids.reshape(-1, ids.shape[-1]), batch_size, params)
  # host arrays go to the device with device_put (jnp.asarray compiles a program per shape)
  emb = np.asarray(normalize(jax.device_put(np.asarray(emb, np.float32))))
  if ids.ndim == 3:
    emb = np.asarray(normalize(jax.device_put(emb.reshape(ids.shape[0], ids.shape[1], -1).mean(1))))
  return emb


def zero_shot_teacher(path_or_params: str | os.PathLike | dict[str, Any],
                      cfg: CLIPConfig | dict[str, Any] | None,
                      class_token_ids: Any, batch_size: int = 256) -> ZeroShotTeacher:
  """The teacher of a checkpoint directory (``cfg`` None: its ``config.json``) or of a parameter
  tree (``cfg`` required: a :class:`CLIPConfig` or a ``config.json`` dict).

  ``class_token_ids int[K, L]``: one tokenized prompt per class (e.g. "a photo of a {class}."
  through HF ``CLIPTokenizer``); or ``int[K, M, L]``: M prompts per class, whose unit embeddings
  are averaged and renormalised (CLIP's prompt ensembling). Embedded ``batch_size`` at a time."""
  if isinstance(path_or_params, (str, os.PathLike)):
    path = os.fspath(path_or_params)
    cfg = load_config(path) if cfg is None else cfg
    params = load_params(path)
  else:
    if cfg is None:
      raise ValueError("cfg is required when path_or_params is a parameter tree.")
    params = path_or_params
  cfg = cfg if isinstance(cfg, CLIPConfig) else config_from_hf(cfg)
  ids = check_token_ids(class_token_ids, cfg.text_config)
  text = {k: params[k] for k in ("text_model", "text_projection")}
  emb = class_embeddings(functools.partial(text_features, cfg), text, ids, batch_size)
  vision = jax.tree.map(jax.device_put, {k: params[k] for k in ("vision_model",
                                                               "visual_projection")})
  return ZeroShotTeacher(image_fn=functools.partial(image_features, cfg),
                         class_emb=jax.device_put(emb), logit_scale=jax.device_put(
                             np.asarray(params["logit_scale"], np.float32)), params=vision,
                         cfg=cfg)


def teacher_logits(teacher: ZeroShotTeacher, params: dict[str, Any] | None,
                   images: jax.Array) -> jax.Array:
  """``[B, S, S, 3] -> float32[B, K]``: ``exp(logit_scale) * cos(image_emb, class_emb)``
  (``params`` None: ``teacher.params``)."""
  img = teacher.image_fn(teacher.params if params is None else params, images)
  img = normalize(img.astype(jnp.float32))
  return jnp.exp(teacher.logit_scale) * img @ teacher.class_emb.T


def fine_tunable(teacher: ZeroShotTeacher, image_size: int | None = None
                 ) -> tuple[Model, dict[str, Any]]:
  """A zero-shot CLIP classifier as a :class:`~fedjaxsparse.core.Model` to fine-tune — the
  "CLIP with FedAvg" of Fed-LPFM's preliminary experiment (Wu, 2024), where CLIP itself is
  trained by the clients: ``(model, params)`` with ``params = {"image": the image tower and
  projection, "head": [K, D] the class embeddings}``, initialised at the teacher (its logits at
  ``params`` are :func:`teacher_logits`'s), and

  ``apply(params, x [B, H, W, C]) = exp(logit_scale) · normalize(image(preprocess(x))) ·
  normalize(head)ᵀ``

  (softmax cross entropy). The images are preprocessed inside ``apply`` (resized to
  ``image_size``, default the model's, and normalised as CLIP's processor does), so a client
  keeps its images at their own size; the temperature stays the checkpoint's. The paper gives
  no more than "CLIP with FedAvg": which weights train is our choice — every weight of the image
  tower and the zero-shot head (text tower unused once the class embeddings are computed)."""
  size = teacher.cfg.vision_config.image_size if image_size is None else image_size
  check_int("image_size", size, 1)
  params = {"image": teacher.params, "head": teacher.class_emb}
  scale = jnp.exp(jnp.asarray(teacher.logit_scale, jnp.float32))

  def apply(p, x):
    img = teacher.image_fn(p["image"], preprocess(x, size))
    return scale * normalize(img.astype(jnp.float32)) @ normalize(p["head"]).T

  return Model(lambda key: params, apply, softmax_cross_entropy, None, CLASSIFICATION), params


def cached_logits(logits_fn: Callable[..., jax.Array], images: Any, batch_size: int = 256, *,
                  params: Any = None) -> np.ndarray:
  """``logits_fn`` over a whole data set, ``batch_size`` examples per jitted call: ``[N, ...] ->
  np.ndarray [N, K]``. Computed once, the teacher's logits are reused every round.

  ``logits_fn(batch)``, or ``logits_fn(params, batch)`` when ``params`` is given (pass weights
  that way rather than closing over them, so they are not baked into the program as constants).
  The last, short batch is padded (repeating its last example) so that one program serves all."""
  return _batched(jax.jit(logits_fn), images, batch_size, params)


def _batched(fn: Callable[..., jax.Array], images: Any, batch_size: int,
             params: Any) -> np.ndarray:
  x = np.asarray(images)
  if x.ndim < 1 or len(x) == 0:
    raise ValueError(f"images must hold at least one example, got shape {x.shape}.")
  if (not isinstance(batch_size, (int, np.integer)) or isinstance(batch_size, bool)
      or batch_size < 1):
    raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}.")
  n, bs = len(x), min(int(batch_size), len(x))
  outs = []
  for s in range(0, n, bs):
    batch = x[s:s + bs]
    k = len(batch)
    if k < bs:
      batch = np.concatenate([batch, np.repeat(batch[-1:], bs - k, axis=0)])
    out = fn(batch) if params is None else fn(params, batch)
    outs.append(out if k == bs else np.asarray(out)[:k])   # host slice: no program
  return np.concatenate([np.asarray(o) for o in outs])


# ---------------------------------------------------------------------------------------------
# prompt tuning (CoOp)


class PromptTuned(NamedTuple):
  """A CoOp result: ``context [M, H]`` (or ``[K, M, H]``) learned word vectors,
  ``class_emb [K, D]`` the unit class embeddings they give, ``losses [steps]``."""
  context: jax.Array
  class_emb: jax.Array
  losses: jax.Array


def prompt_tuning(cfg: CLIPConfig, params: dict[str, Any], prompt_ids: Any,
                  image_emb: Any, labels: Any, *, n_ctx: int = 4, class_specific: bool = False,
                  steps: int = 200, lr: float = 2e-3, weight_decay: float = 5e-4,
                  warmup_steps: int = 0, batch_size: int | None = 32, init_std: float = 0.02,
                  key: jax.Array | None = None) -> PromptTuned:
  """CoOp (Zhou et al. 2022): learn the ``n_ctx`` context word vectors of the class prompts
  ``[SOS] v_1 … v_M [CLASS] . [EOS]`` with CLIP frozen, by minimising the cross-entropy of
  ``exp(logit_scale)·cos(image_emb_b, text(prompt_k; v))`` over labelled image embeddings —
  the "prompt-tuned teacher" of Fed-LPFM's ablation (Table 11 of Xidong Wu's dissertation),
  fitted to one client's local data.

  References:
    Kaiyang Zhou, Jingkang Yang, Chen Change Loy, Ziwei Liu (2022). Learning to Prompt for
      Vision-Language Models. International Journal of Computer Vision 130:2337-2348.
      arXiv:2109.01134.

  ``prompt_ids int[K, L]``: each class's tokenised prompt whose positions ``1..n_ctx`` are
  placeholders (e.g. "X X X X {class}." through the tokenizer) — their embeddings are replaced
  by the context. ``image_emb [n, D]`` (CLIP's image embeddings; normalised here) and
  ``labels int[n]``. The context is shared by the classes (CoOp's unified context) or one per
  class (``class_specific``), initialised ``N(0, init_std²)`` (CoOp's random initialisation).
  SGD with that ablation's settings (lr 2e-3, weight decay 5e-4, cosine schedule after
  ``warmup_steps`` of linear warm-up), minibatches of ``batch_size`` drawn with replacement
  (``None``: all ``n``). Only the context moves: CLIP's parameters are constants."""
  ids = jax.device_put(check_token_ids(prompt_ids, cfg.text_config))
  if ids.ndim != 2:
    raise ValueError(f"prompt_ids must be [K, L] (one prompt per class), got {ids.shape}.")
  k_classes, length = ids.shape
  h = cfg.text_config.hidden_size
  if not isinstance(n_ctx, int) or not 1 <= n_ctx <= length - 2:
    raise ValueError(f"n_ctx must be an int in [1, L - 2 = {length - 2}], got {n_ctx!r}.")
  steps = check_int("steps", steps, 1)
  # host-side checks and conversions (numpy: no program per shape for what is only checked)
  emb = np.asarray(image_emb, np.float32)
  y = np.asarray(labels).astype(np.int32)
  if emb.ndim != 2 or y.shape != (emb.shape[0],) or emb.shape[0] < 1:
    raise ValueError(f"image_emb must be [n, D] with labels int[n], n >= 1; got "
                     f"{emb.shape} and {y.shape}.")
  if int(y.min()) < 0 or int(y.max()) >= k_classes:
    raise ValueError(f"labels must lie in [0, K = {k_classes}), got [{int(y.min())}, "
                     f"{int(y.max())}].")
  emb = normalize(jax.device_put(emb))
  key = jax.random.key(0) if key is None else key
  k_init, k_batch = jax.random.split(key)
  shape = (k_classes, n_ctx, h) if class_specific else (n_ctx, h)
  ctx0 = init_std * jax.random.normal(k_init, shape, jnp.float32)
  text = {k: params[k] for k in ("text_model", "text_projection")}
  scale = jnp.exp(jnp.asarray(params["logit_scale"], jnp.float32))
  settings = dict(batch_size=batch_size, steps=steps, lr=lr, weight_decay=weight_decay,
                  warmup_steps=warmup_steps)
  y = jax.device_put(y)
  if batch_size is None:   # full batches: the data are constants of the program too (folded)
    loop = _coop_loop(cfg, text, **settings)
    ctx, losses = jax.jit(lambda c: loop(c, k_batch, ids, emb, y, scale))(ctx0)
  else:                    # minibatches: one program per weights and settings, data as inputs
    ctx, losses = _coop_program(cfg, text, **settings)(ctx0, k_batch, ids, emb, y, scale)
  classes = normalize(text_features(cfg, text, ids, ctx).astype(jnp.float32))
  return PromptTuned(ctx, classes, losses)


_COOP_PROGRAM: list = []   # the last [(settings, CLIP text weights it was traced with, fit)]


def _same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
  return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(
      np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8))


def _coop_program(cfg: CLIPConfig, text: dict[str, Any], **settings: Any) -> Callable:
  """The jitted CoOp loop ``fit(ctx0, k_batch, ids, emb, y, scale) -> (context, losses)`` of
  :func:`prompt_tuning` (minibatches) for CLIP's text weights ``text`` and ``settings``. The
  weights are constants of the program (closed over: XLA folds them into the code, which fixes
  the numbers), so a program serves only the same weights: the last one is kept and reused
  while the weights are bit for bit the same (e.g. one CoOp per client of a federated data
  set) rather than traced and compiled again for every call."""
  leaves, treedef = jax.tree.flatten(text)
  host = [np.asarray(x) for x in leaves]
  key = (cfg, treedef, tuple(sorted(settings.items())),
         tuple((h.shape, h.dtype, isinstance(x, jax.Array)) for h, x in zip(host, leaves)))
  try:
    hash(key)
  except TypeError:          # unhashable settings (e.g. an array lr): no reuse
    return jax.jit(_coop_loop(cfg, text, **settings))
  if _COOP_PROGRAM:
    k, kept, fit = _COOP_PROGRAM[0]
    if k == key and all(_same_bytes(np.asarray(a), b) for a, b in zip(kept, host)):
      return fit
  # a copy of host arrays (the caller may change them in place; device arrays cannot change)
  kept = [x if isinstance(x, jax.Array) else np.array(h, copy=True) for x, h in zip(leaves, host)]
  fit = jax.jit(_coop_loop(cfg, jax.tree.unflatten(treedef, kept), **settings))
  _COOP_PROGRAM[:] = [(key, kept, fit)]
  return fit


def _coop_loop(cfg: CLIPConfig, text: dict[str, Any], *, batch_size: int | None, steps: int,
               lr: float, weight_decay: float, warmup_steps: int) -> Callable:
  """:func:`prompt_tuning`'s ``steps`` SGD steps from ``ctx0`` as a function of the context,
  the batch key, the prompts, the image embeddings, labels and logit scale."""
  schedule = optax.warmup_cosine_decay_schedule(0.0 if warmup_steps else lr, lr,
                                                warmup_steps, max(steps, warmup_steps + 1))
  opt = optax.chain(optax.add_decayed_weights(weight_decay), optax.sgd(schedule, momentum=0.9))

  def fit(ctx0, k_batch, ids, emb, y, scale):
    n = emb.shape[0]

    def loss(ctx, e, t):
      logits = scale * e @ normalize(text_features(cfg, text, ids, ctx).astype(jnp.float32)).T
      return jnp.mean(jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(
          logits, t[:, None], -1)[:, 0])

    def body(carry, k):
      c, s = carry
      if batch_size is None:
        e, t = emb, y
      else:
        idx = jax.random.randint(k, (batch_size,), 0, n)
        e, t = emb[idx], y[idx]
      value, g = jax.value_and_grad(loss)(c, e, t)
      u, s = opt.update(g, s, c)
      return (optax.apply_updates(c, u), s), value

    (c, _), losses = jax.lax.scan(body, (ctx0, opt.init(ctx0)),
                                  jax.random.split(k_batch, steps))
    return c, losses

  return fit
