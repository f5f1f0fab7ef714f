"""Compressors: unbiasedness and variance bounds by Monte Carlo (tolerances from the sample
size), the closed-form means of mix and comp (seed 001 A.4-A.5), the (η, ω) class bounds,
exact non-zero counts and bits, scaling."""
import math

import jax
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import fedjaxsparse as fjs

D = 20
TRIALS = 20000


def _x(seed=0, d=D):
  return jax.device_put(np.random.default_rng(seed).normal(size=d).astype(np.float32))


def _sq_norm(x):
  return float(np.sum(np.asarray(x, np.float64) ** 2))


def _samples(comp, x, trials=TRIALS):
  """``trials`` draws of ``comp(x)``, the keys ``split(key(1), trials)`` drawn in the program."""
  draw = jax.jit(lambda key, x: jax.vmap(comp.compress, in_axes=(0, None))(
      jax.random.split(key, trials), x))
  return np.asarray(draw(jax.random.key(1), x), np.float64)


@pytest.mark.parametrize("make, trials", [(lambda: fjs.compressors.rand_k(D, 5), TRIALS),
                                          (lambda: fjs.compressors.natural(D), TRIALS),
                                          (lambda: fjs.compressors.qsgd(D, 4), TRIALS),
                                          (lambda: fjs.compressors.identity(D), TRIALS),
                                          (lambda: fjs.compressors.stochastic_sign(D), TRIALS),
                                          (lambda: fjs.compressors.terngrad(D), TRIALS),
                                          (lambda: fjs.compressors.eden(D, "uniform"), TRIALS)],
                         ids=["rand_k", "natural", "qsgd", "identity", "stochastic_sign",
                              "terngrad", "eden_uniform"])
def test_unbiased_compressors(make, trials):
  comp = make()
  x = _x()
  s = _samples(comp, x, trials)
  mean, sd = s.mean(0), s.std(0)
  # Per coordinate: |mean - x| < 5 standard errors (+ fp32 slack).
  np.testing.assert_array_less(np.abs(mean - np.asarray(x)), 5 * sd / math.sqrt(trials) + 1e-5)
  err = ((s - np.asarray(x)) ** 2).sum(1)
  bound = comp.omega * _sq_norm(x)
  se = err.std() / math.sqrt(trials)
  assert err.mean() <= bound + 5 * se + 1e-6
  assert comp.eta == 0.0


def test_rand_k_variance_is_exact():
  comp = fjs.compressors.rand_k(D, 5)
  x = _x(3)
  err = ((_samples(comp, x) - np.asarray(x)) ** 2).sum(1)
  expected = comp.omega * _sq_norm(x)  # E‖C(x) − x‖² = (d/k − 1)‖x‖² exactly
  assert abs(err.mean() - expected) < 5 * err.std() / math.sqrt(TRIALS)


def _topk_np(x, k):
  out = np.zeros_like(x)
  idx = np.argsort(-np.abs(x), kind="stable")[:k]
  out[idx] = x[idx]
  return out


@pytest.mark.parametrize("k, k2", [(3, 5), (1, 9), (5, 10)])
def test_mix_mean_and_class_bounds(k, k2):
  comp = fjs.compressors.mix_k(D, k, k2)
  for x in (_x(1), np.ones(D, np.float32)):  # random, and equal magnitudes (bounds tight)
    xn = np.asarray(x, np.float64)
    s = _samples(comp, x)
    tk = _topk_np(xn, k)
    expected = tk + k2 / (D - k) * (xn - tk)
    sd = s.std(0) / math.sqrt(TRIALS)
    np.testing.assert_array_less(np.abs(s.mean(0) - expected), 5 * sd + 1e-6)
    norm2 = (xn ** 2).sum()
    assert np.linalg.norm(expected - xn) <= comp.eta * math.sqrt(norm2) + 1e-9
    var = ((s - s.mean(0)) ** 2).sum(1).mean()
    assert var <= comp.omega * norm2 * (1 + 5 / math.sqrt(TRIALS)) + 1e-9
    assert (np.count_nonzero(s, axis=1) <= k + k2).all()


@pytest.mark.parametrize("k, k2", [(2, 8), (1, 10)])
def test_comp_mean_is_top_k2_and_class_bounds(k, k2):
  comp = fjs.compressors.comp_k(D, k, k2)
  x = _x(2)
  xn = np.asarray(x, np.float64)
  s = _samples(comp, x)
  expected = _topk_np(xn, k2)  # E[comp(x)] = top_{k'}(x)
  np.testing.assert_array_less(np.abs(s.mean(0) - expected), 5 * s.std(0) / math.sqrt(TRIALS)
                               + 1e-6)
  norm2 = (xn ** 2).sum()
  assert np.linalg.norm(expected - xn) <= comp.eta * math.sqrt(norm2) + 1e-9
  var = ((s - s.mean(0)) ** 2).sum(1).mean()
  assert var <= comp.omega * norm2 * (1 + 5 / math.sqrt(TRIALS))
  np.testing.assert_array_equal(np.count_nonzero(s, axis=1), k)


def test_top_k_scaled_rand_k_and_sign_contract():
  x = _x(4)
  xn = np.asarray(x, np.float64)
  norm2 = (xn ** 2).sum()
  for comp in (fjs.compressors.top_k(D, 4), fjs.compressors.scaled_sign(D)):
    y = np.asarray(jax.jit(comp.compress)(jax.random.key(0), x))
    assert ((y - xn) ** 2).sum() <= (comp.eta ** 2 + comp.omega) * norm2 + 1e-6
  s = _samples(fjs.compressors.scaled_rand_k(D, 5), x)
  np.testing.assert_allclose(s.mean(0), 0.25 * xn, atol=5 * s.std(0).max() / math.sqrt(TRIALS))


@settings(max_examples=8, deadline=None)
@given(d=st.integers(2, 60), data=st.data())
def test_exact_nnz_and_bits(d, data):
  k = data.draw(st.integers(1, d))
  x = jax.device_put((np.random.default_rng(d).normal(size=d) + 3.0).astype(np.float32))  # no 0
  comps = {"rand_k": fjs.compressors.rand_k(d, k), "top_k": fjs.compressors.top_k(d, k),
           "scaled_rand_k": fjs.compressors.scaled_rand_k(d, k)}
  # the three compressors' non-zero counts in one program
  nnz = jax.jit(lambda key, x: {name: fjs.accounting.nnz(comp.compress(key, x))
                                for name, comp in comps.items()})(jax.random.key(k), x)
  for name, comp in comps.items():
    assert int(nnz[name]) == k, (name, d, k)
    assert comp.bits(d) == fjs.accounting.sparse_bits(k, d), (name, d, k)


def test_pytree_input_and_scaling():
  tree = {"a": np.arange(1.0, 7.0, dtype=np.float32).reshape(2, 3),
          "b": np.array([10.0, -20.0], np.float32)}
  y = jax.jit(fjs.compressors.top_k(8, 2).compress)(jax.random.key(0), tree)
  np.testing.assert_array_equal(y["b"], [10.0, -20.0])
  np.testing.assert_array_equal(y["a"], 0.0)
  c = fjs.compressors.scale(fjs.compressors.comp_k(D, 2, 8), 0.5)
  base = fjs.compressors.comp_k(D, 2, 8)
  assert c.omega == pytest.approx(0.25 * base.omega)
  assert c.eta == pytest.approx(0.5 * base.eta + 0.5)
  y1 = jax.jit(c.compress)(jax.random.key(3), _x())
  y2 = jax.jit(base.compress)(jax.random.key(3), _x())
  np.testing.assert_allclose(y1, 0.5 * np.asarray(y2), rtol=1e-6)


def test_omega_ran_and_errors():
  assert fjs.compressors.omega_ran(4.0, 8) == 0.5
  assert fjs.compressors.omega_ran(0.0, 10, "m-nice", m=3) == pytest.approx(7 / 27)
  with pytest.raises(ValueError, match="k must be"):
    fjs.compressors.rand_k(10, 11)
  with pytest.raises(ValueError, match="k2"):
    fjs.compressors.mix_k(10, 5, 6)
  with pytest.raises(ValueError, match="lam"):
    fjs.compressors.scale(fjs.compressors.identity(3), 1.5)
  assert fjs.compressors.top_k(100, 10).alpha == pytest.approx(0.1)


def test_one_bit_rotation_compressors():
  """Hadamard: orthonormal, an involution, log2 n butterfly stages (O(n log n)); EDEN:
  ⟨x̂, x⟩ = ‖x‖² exactly for either rotation; DRIVE: ‖x − x̂‖² = ‖x‖² − ‖Rx‖₁²/d′ ≤
  (1 − 1/d′)‖x‖² on every draw; bits as counted: d′ signs + one fp32 scale (TernGrad:
  log2 3 per entry)."""
  h = np.asarray(jax.jit(jax.vmap(fjs.compressors.hadamard))(np.eye(16, dtype=np.float32)))
  np.testing.assert_allclose(h @ h.T, np.eye(16), atol=1e-6)
  np.testing.assert_allclose(h @ h, np.eye(16), atol=1e-6)
  jaxpr = jax.make_jaxpr(fjs.compressors.hadamard)(np.zeros(1024, np.float32))
  assert sum(e.primitive.name == "add" for e in jaxpr.eqns) == 10  # log2(1024) stages
  x = _x(5)
  for rotation in fjs.compressors.ROTATIONS:
    s = _samples(fjs.compressors.eden(D, rotation), x, 200)
    np.testing.assert_allclose(s @ np.asarray(x, np.float64), _sq_norm(x), rtol=1e-4)
    s = _samples(fjs.compressors.drive(D, rotation), x, 200)
    err = ((s - np.asarray(x)) ** 2).sum(1)
    dp = 32 if rotation == "hadamard" else D
    assert np.all(err <= (1 - 1 / dp) * _sq_norm(x) + 1e-5)
  assert (fjs.compressors.drive(D).bits(D) == 32 + 32
          and fjs.compressors.eden(D, "uniform").bits(D) == D + 32)
  assert fjs.compressors.stochastic_sign(D).bits(D) == D + 32
  assert fjs.compressors.terngrad(D).bits(D) == pytest.approx(D * math.log2(3) + 32)
  assert round(fjs.compressors.terngrad(D).bits(D) / D - 32 / D, 3) == 1.585
  with pytest.raises(ValueError, match="rotation"):
    fjs.compressors.drive(D, "givens")
