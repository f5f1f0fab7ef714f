"""The experiment harness: the experiment contract and its registry (``experiment``), paper
protocols — validation splits, searches, seeds, claims, the paper's numbers beside ours
(``protocol``) —, result plots (``plotting``) and the command line (``cli``). Tables: ``report``."""
from fedjaxsparse.harness import cli, experiment, plotting, protocol, report
from fedjaxsparse.core import public_dir as _public_dir

__all__ = [
    "cli", "experiment", "plotting", "protocol", "report",
]
__dir__ = _public_dir(__all__)
