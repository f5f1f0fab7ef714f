"""The experiment harness: the experiment contract and its registry (``experiment``), paper
protocols — validation splits, searches, seeds, claims, the paper's numbers beside ours
(``protocol``) —, result plots (``plotting``) and the command line (``cli``)."""
