"""Bit accounting: exact counts for each encoding on hand-worked examples, the crossovers
between encodings, pytree sizes, and traced counts inside jit equal to the Python ints."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjaxsparse as fjs


def test_dense_bits_of_a_pytree_and_of_an_int():
  tree = {"w": jnp.zeros((281,)), "b": jnp.zeros((3, 4)), "s": jnp.zeros(())}
  assert fjs.accounting.num_params(tree) == 294
  assert fjs.accounting.dense_bits(tree) == 294 * 32
  assert fjs.accounting.dense_bits(100, value_bits=16) == 1600
  assert fjs.accounting.dense_bits(np.int64(10)) == 320
  assert fjs.accounting.FLOAT_BITS == fjs.accounting.SEED_BITS == 32


def test_index_bits_is_ceil_log2():
  assert [fjs.accounting.index_bits(d) for d in (1, 2, 3, 4, 5, 1000, 1024, 1025)] == [
      0, 1, 2, 2, 3, 10, 10, 11]
  for d in range(2, 3000):
    assert fjs.accounting.index_bits(d) == int(np.ceil(np.log2(d)))
  with pytest.raises(ValueError, match="d must be"):
    fjs.accounting.index_bits(0)


def test_sparse_encodings_hand_worked():
  # d = 1000, 10 non-zeros: indices 10·(32 + 10) = 420, bitmask 1000 + 320 = 1320.
  assert fjs.accounting.sparse_bits(10, 1000, encoding="indices") == 420
  assert fjs.accounting.sparse_bits(10, 1000, encoding="bitmask") == 1320
  assert fjs.accounting.sparse_bits(10, 1000, encoding="values") == 320
  assert fjs.accounting.sparse_bits(10, 1000, encoding="dense") == 32000
  assert fjs.accounting.sparse_bits(10, 1000) == 420
  # fp16 values: indices 10·(16 + 10) = 260.
  assert fjs.accounting.sparse_bits(10, 1000, value_bits=16, encoding="indices") == 260
  # d = 1: an index costs nothing.
  assert fjs.accounting.sparse_bits(1, 1, encoding="indices") == 32
  assert isinstance(fjs.accounting.sparse_bits(10, 1000), int)


def test_auto_crossovers():
  # indices 42n vs bitmask 1000 + 32n: equal at n = d / ceil(log2 d) = 100.
  assert fjs.accounting.sparse_bits(99, 1000) == 99 * 42
  assert fjs.accounting.sparse_bits(100, 1000) == 4200 == 1000 + 3200
  assert fjs.accounting.sparse_bits(101, 1000) == 1000 + 101 * 32
  # bitmask 1000 + 32n vs dense 32 000: equal at n = d(1 − 1/32) = 968.75.
  assert fjs.accounting.sparse_bits(968, 1000) == 1000 + 968 * 32 < 32000
  assert fjs.accounting.sparse_bits(969, 1000) == 32000
  assert fjs.accounting.sparse_bits(1000, 1000) == 32000
  # auto is the minimum of the three, for every n.
  for n in range(0, 1001):
    assert fjs.accounting.sparse_bits(n, 1000) == min(
        fjs.accounting.sparse_bits(n, 1000, encoding=e) for e in ("indices", "bitmask", "dense"))


@pytest.mark.parametrize("d", [1000, 11_173_962, 50_000_000])
def test_traced_nnz_matches_python_ints(d):
  """int32 (exact) while the largest count fits, float32 beyond (d = 50M: 2.9e9 bits)."""
  ns = jnp.array([0, 1, 10, d // 100, d // 30, d // 2, d - 1, d], jnp.int32)
  for encoding in fjs.accounting.ENCODINGS:
    got = jax.jit(jax.vmap(lambda n: fjs.accounting.sparse_bits(n, d, encoding=encoding)))(ns)
    want = [fjs.accounting.sparse_bits(int(n), d, encoding=encoding) for n in ns]
    if d < 37_025_580:
      assert got.dtype == jnp.int32
      np.testing.assert_array_equal(got, want)
    else:
      assert got.dtype == jnp.float32
      np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=2 ** -23)


def test_message_bits_counts_actual_non_zeros():
  x = {"a": jnp.array([0.0, 1.0, 0.0, 2.0]), "b": jnp.zeros(4)}
  assert int(jax.jit(fjs.accounting.nnz)(x)) == 2
  # 2 non-zeros of d = 8: indices 2·(32 + 3) = 70, bitmask 8 + 64 = 72 -> 70.
  bits = jax.jit(fjs.accounting.message_bits)(x)
  assert bits.dtype == jnp.float32 and float(bits) == 70.0
  assert float(jax.jit(lambda t: fjs.accounting.message_bits(t, encoding="dense"))(x)) == 256.0
  assert float(fjs.accounting.message_bits({"a": jnp.ones(8)})) == 256.0  # dense is cheapest


def test_mask_and_quantized_bits_and_errors():
  assert fjs.accounting.mask_bits(1000) == 1032
  assert fjs.accounting.mask_bits(1000, with_seed=False) == 1000
  assert fjs.accounting.quantized_bits(1000, 2, overhead_floats=1) == 2032
  assert fjs.accounting.quantized_bits(1000, 1, overhead_floats=0) == 1000
  with pytest.raises(ValueError, match="encoding"):
    fjs.accounting.sparse_bits(1, 10, encoding="huffman")
