"""Federated datasets: the padded pytree (``FederatedData``), partitioners, loaders (embedded
sets, Fashion-MNIST IDX files, LEAF, Shakespeare, LIBSVM, BlogFeedback; tensorflow-datasets
sources load on first use), labelled stand-ins, reference problems and the dataset registry."""
from fedjaxsparse.data import (blogfeedback, embedded, fashion_mnist, federated, imagenet, leaf,
                               libsvm, partitions, problems, registry, shakespeare, sparse_rows,
                               standins)
from fedjaxsparse.data.embedded import diabetes, digits, synthetic
from fedjaxsparse.data.federated import (FederatedData, FederatedDataset, federate, pack_clients,
                                         split_clients)
# every partitioner of data/partitions.py, and ``partition(labels, num_clients, method)``, the
# dispatcher over them by name
from fedjaxsparse.data.partitions import (PARTITIONS, dirichlet_lognormal_partition,
                                         dirichlet_partition, hsu_dirichlet_partition,
                                         iid_partition, kmeans_partition, label_count_partition,
                                         lognormal_partition, lognormal_sizes, matching_test_sets,
                                         natural_partition, partition, shard_partition)
from fedjaxsparse.data.problems import (example_weights, ridge_regression_optimum,
                                        ridge_regression_problem, softmax_regression_optimum,
                                        uniform_weights)
from fedjaxsparse.data.registry import ARRAYS, DATASETS, load_arrays, load_dataset
from fedjaxsparse.core import public_dir as _public_dir

__all__ = [
    "blogfeedback", "embedded", "fashion_mnist", "federated", "imagenet", "leaf", "libsvm",
    "partition", "partitions", "problems", "registry", "shakespeare", "sparse_rows", "standins",
    "diabetes", "digits",
    "synthetic", "FederatedData", "FederatedDataset", "federate", "pack_clients", "split_clients",
    "PARTITIONS", "dirichlet_partition", "iid_partition", "lognormal_partition", "lognormal_sizes",
    "natural_partition", "shard_partition", "dirichlet_lognormal_partition",
    "hsu_dirichlet_partition", "kmeans_partition", "label_count_partition", "matching_test_sets",
    "example_weights",
    "ridge_regression_optimum", "ridge_regression_problem", "softmax_regression_optimum",
    "uniform_weights", "ARRAYS", "DATASETS", "load_arrays", "load_dataset",
]
__dir__ = _public_dir(__all__)
