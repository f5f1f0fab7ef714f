"""The experiment harness: the experiment contract (``experiment``: declared or entry
experiments), the configuration and options (``options``), running methods and keeping their
results (``running``), tuning and seeds (``tuning``), paper
protocols — validation splits, searches, seeds, claims, the paper's numbers beside ours
(``protocol``) —, result plots (``plotting``) and the command line (``cli``). Tables: ``report``."""
from fedjaxsparse.harness import (cli, experiment, options, plotting, protocol, report, running,
                                  tuning)
from fedjaxsparse.core import public_dir as _public_dir

__all__ = [
    "cli", "experiment", "options", "plotting", "protocol", "report", "running", "tuning",
]
__dir__ = _public_dir(__all__)
