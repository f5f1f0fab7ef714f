"""Why XLA's convolution is slow inside a loop body on XLA:CPU — a minimal reproduction.

One training step of one convolution layer (64 images of 14 × 14 × 32, a 5 × 5 × 32 × 64
kernel, "SAME", stride 1): the loss ``Σ conv(x, w)²`` and its gradients with respect to the
kernel and the input, ``T`` steps in ``lax.scan`` written out (``unroll=True``) or as a loop
(the default), for three formulations of the same convolution:

* ``xla``: ``lax.conv_general_dilated`` and JAX's own transpose rules;
* ``canonical``: the same forward convolution with a custom VJP whose two backward
  convolutions are written in the canonical NHWC / HWIO form (explicit transposes around
  them) — the rewrite XLA:CPU's ``ConvCanonicalization`` pass applies, by hand;
* ``patches``: ``fedjaxsparse.models.conv.patch_conv`` (patches times a matrix).

It prints steady milliseconds per program (minimum of ``--repeats`` after a warm-up),
GFLOP/s, the largest relative difference of the gradients from ``xla``'s, and — the
evidence — the convolutions XLA:CPU left non-canonical (``dim_labels`` other than
``b01f_01io->b01f``) in the compiled program; writes the table to JSON.

The finding (jax 0.10.2's XLA on x86-64): the backward pass of a convolution holds two
non-canonical convolutions (the kernel gradient ``f01b_i01o->01bf``, the input gradient
``b01f_01oi->b01f``). ``ConvCanonicalization`` rewrites such convolutions into the canonical
form Eigen's multithreaded convolution runs, but it walks only the entry computation
(``module->entry_computation()->MakeInstructionPostOrder()``), so inside a ``while`` body
(``lax.scan``, ``fori_loop``, ``lax.map``, ``vmap`` of a loop) the non-canonical
convolutions stay and are emitted as XLA's naive loop-nest convolution. Unrolling moves them
into the entry computation, which is why ``unroll=True`` is fast.

Usage: python benchmarks/repro_conv_in_loop.py [--steps 4] [--repeats 3]
       [--out benchmarks/results/cpu]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import time

import jax
import jax.numpy as jnp
from jax import lax

from fedjaxsparse.models.conv import patch_conv

DN = ("NHWC", "HWIO", "NHWC")
B, H, C, F, K = 64, 14, 32, 64, 5


def _xla(x, w, padding="SAME"):
  return lax.conv_general_dilated(x, w, (1, 1), padding, dimension_numbers=DN)


@jax.custom_vjp
def _canonical(x, w):
  return _xla(x, w)


def _canonical_fwd(x, w):
  return _xla(x, w), (x, w)


def _canonical_bwd(res, g):
  """Both gradients as canonical convolutions ("SAME", stride 1, odd kernels)."""
  x, w = res
  kh, kw = w.shape[:2]
  ph, pw = (kh - 1) // 2, (kw - 1) // 2
  # dx: g correlated with the flipped kernel, input and output features swapped (HWIO)
  dx = _xla(g, jnp.flip(w, (0, 1)).transpose(0, 1, 3, 2),
            [(kh - 1 - ph, ph), (kw - 1 - pw, pw)])
  # dw[a, b, c, f] = Σ_{n,i,j} x_pad[n, i + a, j + b, c] g[n, i, j, f]: channels as the batch,
  # images as the features, g as an HWIO kernel
  dw = _xla(x.transpose(3, 1, 2, 0), g.transpose(1, 2, 0, 3),
            [(ph, kh - 1 - ph), (pw, kw - 1 - pw)])
  return dx, dw.transpose(1, 2, 0, 3)


_canonical.defvjp(_canonical_fwd, _canonical_bwd)

IMPLS = {"xla": _xla, "canonical": _canonical, "patches": patch_conv}


def _program(conv, unroll: bool):
  def loss(w, x):
    return jnp.sum(conv(x, w) ** 2)

  def step(w, x):
    gw, gx = jax.grad(loss, argnums=(0, 1))(w, x)
    return w - 1e-6 * gw - 1e-9 * jnp.sum(gx), None

  return jax.jit(lambda w, xs: lax.scan(step, w, xs, unroll=unroll)[0])


def _noncanonical(compiled_text: str) -> list[str]:
  return sorted(set(m for m in re.findall(r"dim_labels=(\S+?),", compiled_text)
                    if m != "b01f_01io->b01f"))


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=4)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--out", default="benchmarks/results/cpu")
  args = parser.parse_args()
  key = jax.random.key(0)
  w = jax.random.normal(key, (K, K, C, F)) * 0.05
  xs = jax.random.normal(jax.random.fold_in(key, 1), (args.steps, B, H, H, C))
  reference = jax.grad(lambda w, x: jnp.sum(_xla(x, w) ** 2), argnums=(0, 1))(w, xs[0])
  flops = args.steps * 3 * 2 * B * H * H * K * K * C * F   # forward + two backward products
  rows = []
  print(f"{'convolution':10s} {'loop':8s} {'ms':>9s} {'GFLOP/s':>8s} {'grad diff':>9s}  "
        "non-canonical convolutions left")
  for name, conv in IMPLS.items():
    grads = jax.grad(lambda w, x: jnp.sum(conv(x, w) ** 2), argnums=(0, 1))(w, xs[0])
    diff = max(float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))
               for a, b in zip(grads, reference))
    for unroll in (True, False):
      fn = _program(conv, unroll)
      left = _noncanonical(fn.lower(w, xs).compile().as_text())
      fn(w, xs).block_until_ready()
      times = []
      for _ in range(args.repeats):
        t = time.perf_counter()
        fn(w, xs).block_until_ready()
        times.append(time.perf_counter() - t)
      row = {"convolution": name, "loop": "unrolled" if unroll else "lax.scan",
             "ms": 1e3 * min(times), "gflops": flops / min(times) / 1e9,
             "grad_rel_diff": diff, "noncanonical": left}
      rows.append(row)
      print(f"{name:10s} {row['loop']:8s} {row['ms']:9.1f} {row['gflops']:8.1f} {diff:9.1e}  "
            f"{', '.join(left) or '-'}")
  os.makedirs(args.out, exist_ok=True)
  path = os.path.join(args.out, "repro_conv_in_loop.json")
  with open(path, "w") as f:
    json.dump({"jax": jax.__version__, "backend": jax.default_backend(), "steps": args.steps,
               "shapes": {"x": [B, H, H, C], "kernel": [K, K, C, F]}, "rows": rows}, f,
              indent=1)
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
