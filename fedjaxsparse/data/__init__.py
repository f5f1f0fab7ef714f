"""Federated datasets: the padded pytree, partitioners, loaders and reference problems."""
from fedjaxsparse.data.embedded import diabetes, digits, synthetic
from fedjaxsparse.data.federated import (FederatedData, FederatedDataset, federate, pack_clients,
                                         split_clients)
from fedjaxsparse.data.partition import (PARTITIONS, dirichlet_partition, iid_partition,
                                         lognormal_partition, lognormal_sizes, natural_partition,
                                         partition, shard_partition)
from fedjaxsparse.data.problems import (example_weights, ridge_regression_optimum,
                                        ridge_regression_problem, softmax_regression_optimum,
                                        uniform_weights)
from fedjaxsparse.data.registry import DATASETS, load_dataset
