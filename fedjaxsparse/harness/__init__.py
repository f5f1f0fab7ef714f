"""The experiment harness: the experiment contract and its registry (``experiment``), paper
protocols — validation splits, searches, seeds, claims, the paper's numbers beside ours
(``protocol``) —, result plots (``plotting``) and the command line (``cli``). Tables: ``report``."""
from fedjaxsparse.harness import cli, experiment, plotting, protocol, report

__all__ = [
    "cli", "experiment", "plotting", "protocol", "report",
]
