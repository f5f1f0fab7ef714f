"""Bit accounting: exact counts for each encoding, the crossover between them, traced nnz."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjaxsparse import accounting


def test_dense_bits_of_a_pytree():
  tree = {"w": jnp.zeros((281,)), "b": jnp.zeros((3, 4))}
  assert accounting.num_params(tree) == 293
  assert accounting.dense_bits(tree) == 293 * 32
  assert accounting.dense_bits(100, value_bits=16) == 1600


def test_index_bits():
  assert [accounting.index_bits(d) for d in (1, 2, 3, 4, 1000, 1024, 1025)] == [
      0, 1, 2, 2, 10, 10, 11]


def test_sparse_encodings_hand_worked():
  # d = 1000, 10 non-zeros: indices 10·(32+10) = 420, bitmask 1000 + 320 = 1320.
  assert accounting.sparse_bits(10, 1000, encoding="indices") == 420
  assert accounting.sparse_bits(10, 1000, encoding="bitmask") == 1320
  assert accounting.sparse_bits(10, 1000, encoding="values") == 320
  assert accounting.sparse_bits(10, 1000) == 420
  # Dense (32 000) wins once nnz·42 and 1000 + 32·nnz both exceed it.
  assert accounting.sparse_bits(1000, 1000) == 32000


def test_bitmask_takes_over_at_the_crossover():
  # indices: 42 n, bitmask: 1000 + 32 n -> equal at n = 100.
  assert accounting.sparse_bits(99, 1000) == 99 * 42
  assert accounting.sparse_bits(100, 1000) == 4200 == 1000 + 3200
  assert accounting.sparse_bits(101, 1000) == 1000 + 101 * 32


def test_traced_nnz_matches_python_ints():
  f = jax.jit(lambda n: accounting.sparse_bits(n, 1000))
  for n in (0, 10, 99, 100, 101, 500, 1000):
    assert float(f(jnp.int32(n))) == accounting.sparse_bits(n, 1000)
  x = {"a": jnp.array([0.0, 1.0, 0.0, 2.0]), "b": jnp.zeros(4)}
  assert int(jax.jit(accounting.nnz)(x)) == 2
  # 2 non-zeros of d = 8: indices 2·(32+3) = 70, bitmask 8 + 64 = 72 -> 70.
  assert float(jax.jit(accounting.message_bits)(x)) == 70.0


def test_mask_and_quantized_bits_and_errors():
  assert accounting.mask_bits(1000) == 1032
  assert accounting.mask_bits(1000, with_seed=False) == 1000
  assert accounting.quantized_bits(1000, 2, overhead_floats=1) == 2032
  with pytest.raises(ValueError, match="encoding"):
    accounting.sparse_bits(1, 10, encoding="huffman")


def test_dense_encoding_ignores_zeros():
  assert accounting.sparse_bits(3, 1000, encoding="dense") == 32000
  x = {"a": jnp.zeros(10)}
  assert float(jax.jit(lambda t: accounting.message_bits(t, encoding="dense"))(x)) == 320.0
