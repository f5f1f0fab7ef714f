"""Sparse convex problems: gap-safe screening (``screening``), proximal solvers
(``prox_solvers``) and the smoothness and strong-convexity constants of linear models
(``constants``)."""
from fedjaxsparse.convex import constants, prox_solvers, screening
from fedjaxsparse.core import public_dir as _public_dir

__all__ = [
    "constants", "prox_solvers", "screening",
]
__dir__ = _public_dir(__all__)
