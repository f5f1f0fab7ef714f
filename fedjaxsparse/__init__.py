"""fedjaxsparse: federated sparse training, compression and local training in JAX."""
from fedjaxsparse.core import Algorithm, global_params

__version__ = "0.1.0"
__all__ = ["Algorithm", "global_params", "__version__"]
