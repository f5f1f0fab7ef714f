"""Partitioners: coverage (every example exactly once), sizes, determinism, label skew."""
import numpy as np
import pytest

import fedjaxsparse as fjs
from fedjaxsparse.data.partitions import hsu_dirichlet_partition

LABELS = np.repeat(np.arange(10), 100)  # 1000 examples, 10 balanced classes


def _assert_exact_cover(parts, n):
  allidx = np.concatenate(parts)
  assert len(allidx) == n
  np.testing.assert_array_equal(np.sort(allidx), np.arange(n))


def _label_entropy(parts, labels):
  ent = []
  for p in parts:
    q = np.bincount(labels[p], minlength=10) / len(p)
    q = q[q > 0]
    ent.append(-(q * np.log(q)).sum())
  return np.mean(ent)


@pytest.mark.parametrize("make", [
    lambda s: fjs.data.iid_partition(1000, 7, s),
    lambda s: fjs.data.dirichlet_partition(LABELS, 7, 0.5, s),
    lambda s: fjs.data.shard_partition(LABELS, 10, 2, s),
    lambda s: fjs.data.lognormal_partition(1000, 7, 1.0, s),
])
def test_every_example_exactly_once_and_deterministic(make):
  parts = make(0)
  _assert_exact_cover(parts, 1000)
  assert all(len(p) >= 1 for p in parts)
  assert all(np.all(np.diff(p) > 0) for p in parts)  # sorted, no duplicates
  again = make(0)
  assert all(np.array_equal(a, b) for a, b in zip(parts, again))
  other = make(1)
  assert not all(np.array_equal(a, b) for a, b in zip(parts, other))


def test_iid_sizes_differ_by_at_most_one():
  sizes = [len(p) for p in fjs.data.iid_partition(1000, 7, 0)]
  assert max(sizes) - min(sizes) <= 1


def test_dirichlet_skew_grows_as_alpha_shrinks():
  skewed = fjs.data.dirichlet_partition(LABELS, 10, 0.05, 0)
  uniform = fjs.data.dirichlet_partition(LABELS, 10, 100.0, 0)
  # Full entropy is log 10 = 2.30; tiny alpha leaves clients with few classes.
  assert _label_entropy(skewed, LABELS) < 1.0 < 2.0 < _label_entropy(uniform, LABELS)


def test_dirichlet_min_size_and_errors():
  parts = fjs.data.dirichlet_partition(LABELS, 20, 0.1, 3, min_size=5)
  assert min(len(p) for p in parts) >= 5
  with pytest.raises(ValueError, match="alpha"):
    fjs.data.dirichlet_partition(LABELS, 5, 0.0)
  with pytest.raises(ValueError, match="num_clients"):
    fjs.data.dirichlet_partition(LABELS[:3], 5, 1.0)


def test_shards_give_few_classes_per_client():
  parts = fjs.data.shard_partition(LABELS, 10, 2, 0)
  # 20 shards of 50 examples never straddle a class boundary of 100-example classes.
  assert all(len(np.unique(LABELS[p])) <= 2 for p in parts)
  assert all(len(p) == 100 for p in parts)
  with pytest.raises(ValueError, match="shards_per_client"):
    fjs.data.shard_partition(LABELS, 10, 0)


def test_natural_partition_groups_exactly_by_key():
  keys = np.array([[1, 2], [3, 4], [1, 2], [5, 6], [3, 4], [1, 2]])
  parts = fjs.data.natural_partition(keys)
  assert [p.tolist() for p in parts] == [[0, 2, 5], [1, 4], [3]]  # order of first appearance
  parts1d = fjs.data.natural_partition(np.array(["b", "a", "b"]))
  assert [p.tolist() for p in parts1d] == [[0, 2], [1]]


def test_lognormal_sizes():
  sizes = fjs.data.lognormal_sizes(1000, 30, 1.5, 0)
  assert sizes.sum() == 1000 and sizes.min() >= 1
  assert sizes.max() > 3 * np.median(sizes)  # heavy tail at sigma = 1.5
  flat = fjs.data.lognormal_sizes(1000, 10, 0.0, 0)
  assert flat.max() - flat.min() <= 1  # sigma = 0 is balanced
  with pytest.raises(ValueError, match="sigma"):
    fjs.data.lognormal_sizes(100, 5, -1.0)


def test_label_count_split_gives_each_client_exactly_k_labels():
  """Seed 003's Non-IID-2 (NIID-Bench #C = 3): every client holds exactly 3 labels, every
  example is used once (100 clients ≥ 10 labels), each label's examples are shared equally
  (±1) among its holders; deterministic under the seed."""
  from fedjaxsparse.data.partitions import label_count_partition
  parts = label_count_partition(LABELS, 100 // 10 * 2, 3, seed=0)
  _assert_exact_cover(parts, 1000)
  assert all(len(np.unique(LABELS[p])) == 3 for p in parts)
  for c in range(10):
    counts = [int(np.sum(LABELS[p] == c)) for p in parts if np.any(LABELS[p] == c)]
    assert max(counts) - min(counts) <= 1
  again = fjs.data.partition(LABELS, 20, "labels", 0, labels_per_client=3)
  assert all(np.array_equal(a, b) for a, b in zip(parts, again))
  with pytest.raises(ValueError, match="labels_per_client"):
    label_count_partition(LABELS, 20, 11)


def test_hsu_dirichlet_has_equal_sizes_covers_everything_and_skews_labels():
  from fedjaxsparse.data.partitions import hsu_dirichlet_partition
  y = np.random.default_rng(0).integers(0, 10, 2003)
  parts = hsu_dirichlet_partition(y, 20, 0.1, seed=3)
  assert sorted(len(p) for p in parts) == [100] * 17 + [101] * 3
  assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(2003))
  top = [np.bincount(y[p], minlength=10).max() / len(p) for p in parts]
  assert np.median(top) > 0.5  # α = 0.1: most of a client's data from one class
  iid = hsu_dirichlet_partition(y, 20, 1000.0, seed=3)
  assert max(np.bincount(y[p], minlength=10).max() / len(p) for p in iid) < 0.3


def test_matching_test_sets_follow_the_training_label_proportions():
  """Client k's 100 test labels: ⌊100 q_kc⌋ per class plus the largest remainders, sampled
  from that class's test examples without repeats."""
  from fedjaxsparse.data.partitions import matching_test_sets
  rng = np.random.default_rng(1)
  train = [np.array([0] * 7 + [1] * 2 + [2] * 1), np.array([3] * 3 + [4] * 3 + [5] * 3)]
  test = rng.integers(0, 10, 2000)
  sets = matching_test_sets(train, test, 100, seed=0)
  assert np.bincount(test[sets[0]], minlength=10).tolist()[:3] == [70, 20, 10]
  assert np.bincount(test[sets[1]], minlength=10).tolist()[3:6] == [34, 33, 33]
  assert all(len(np.unique(s)) == 100 for s in sets)
  with pytest.raises(ValueError, match="replace=True"):
    matching_test_sets([np.zeros(5, int)], np.array([0] * 50 + [1] * 50), 100)


def test_hsu_per_class_concentration_is_fedcr_split():
  """per_class=True draws q_k ~ Dir(α·1_C): with α = 0.5 and 10 balanced classes the top 4
  classes hold E ≈ 0.83 of a client (FedCR's "~80 % in 4 classes"); Hsu's Dir(α·p) ≈ 0.99."""
  y = np.repeat(np.arange(10), 700)
  share = lambda parts: np.mean([np.sort(np.bincount(y[p], minlength=10))[::-1][:4].sum()
                                 / len(p) for p in parts])
  fedcr = share(hsu_dirichlet_partition(y, 100, 0.5, seed=0, per_class=True))
  hsu = share(hsu_dirichlet_partition(y, 100, 0.5, seed=0))
  assert 0.75 < fedcr < 0.9 and hsu > 0.95
  assert all(len(p) == 70 for p in hsu_dirichlet_partition(y, 100, 0.5, per_class=True))


def test_class_cycle_partition_is_fedcrs_noniid_deal():
  """FedCR's "noniid" rule: every client the same size, each client's labels inside its
  consecutive class set {(j + k) mod C}; balanced classes fill each client's classes equally;
  with a scarce class, examples move between clients sharing a class (still inside the sets,
  still equal sizes); the n mod N leftover examples are dropped; impossible deals and bad
  input are errors naming the parameter."""
  from fedjaxsparse.data.partitions import class_cycle_partition
  y = np.repeat(np.arange(10), 100)
  parts = class_cycle_partition(y, 10, 5, seed=0)
  assert sorted(np.concatenate(parts).tolist()) == list(range(1000))
  for j, p in enumerate(parts):
    counts = np.bincount(y[p], minlength=10)
    mine = [(j + k) % 10 for k in range(5)]
    assert set(np.flatnonzero(counts)) == set(mine)
    np.testing.assert_array_equal(counts[mine], 20)
  scarce = np.concatenate([np.zeros(300, int), np.repeat(np.arange(1, 10), 80)])
  parts = class_cycle_partition(scarce, 10, 5, seed=1)
  assert [len(p) for p in parts] == [102] * 10
  assert len(np.unique(np.concatenate(parts))) == 1020
  for j, p in enumerate(parts):
    assert set(scarce[p]) <= {(j + k) % 10 for k in range(5)}
  parts = class_cycle_partition(np.repeat(np.arange(10), 101), 20, 3, seed=2)
  assert [len(p) for p in parts] == [50] * 20    # 1010 examples: 10 dropped
  again = class_cycle_partition(np.repeat(np.arange(10), 101), 20, 3, seed=2)
  assert all(np.array_equal(a, b) for a, b in zip(parts, again))   # deterministic
  impossible = np.concatenate([np.zeros(900, int), np.repeat(np.arange(1, 10), 10)])
  with pytest.raises(ValueError, match="cannot be filled"):
    class_cycle_partition(impossible, 10, 2, seed=1)
  for bad in (0, 11):
    with pytest.raises(ValueError, match="classes_per_client"):
      class_cycle_partition(y, 10, bad)


def test_kmeans_partition_deals_each_cluster_to_its_own_clients():
  """Feature-wise heterogeneity (Cohort-Squeeze's split): on well-separated blobs every client
  of a block holds examples of one blob only, each blob is cut into ``per_cluster`` clients of
  near-equal size, and every example is dealt exactly once."""
  from fedjaxsparse.data.partitions import kmeans_partition
  rng = np.random.default_rng(0)
  sizes = (31, 40, 29)
  x = np.concatenate([rng.normal(loc=10.0 * c, size=(n, 3)) for c, n in enumerate(sizes)])
  truth = np.repeat(np.arange(3), sizes)
  parts, blocks = kmeans_partition(x, 3, 4, seed=1)
  assert len(parts) == 12 and [list(b) for b in blocks] == [list(range(4 * c, 4 * c + 4))
                                                            for c in range(3)]
  np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(len(x)))
  for block in blocks:
    members = np.concatenate([parts[i] for i in block])
    assert len(set(truth[members].tolist())) == 1                     # one blob per block
    counts = [len(parts[i]) for i in block]
    assert max(counts) - min(counts) <= 1                              # near-equal clients
  with pytest.raises(ValueError, match="per_cluster=40"):
    kmeans_partition(x, 3, 40, seed=1)
  with pytest.raises(ValueError, match="clusters must be an int"):
    kmeans_partition(x, 0, 2)
