"""Sparse convex problems: gap-safe screening (``screening``), proximal solvers
(``prox_solvers``) and the smoothness and strong-convexity constants of linear models
(``constants``)."""
from fedjaxsparse.convex import constants, prox_solvers, screening

__all__ = [
    "constants", "prox_solvers", "screening",
]
