"""The papers' algorithms, one module per paper family, each a set of named constructors
returning an :class:`fedjaxsparse.core.Algorithm` (``init``/``step`` pure functions).
``import fedjaxsparse as fjs`` exposes every paper method at the top (``fjs.fedspa``, ...)."""
from fedjaxsparse.algorithms import (ato, cohort_round, ddss, ddss_baselines, ditto, efbv,
                                     fedavg, fedcr, fedht, fedlpfm, fedmrn, fedp3, fedp3_theory,
                                     fedpac, fedpm, fedprox, fedsr, fedspa, fml, oto, proxskip,
                                     representation, scafflix, sppm, subfedavg)
from fedjaxsparse.core import public_dir as _public_dir

__all__ = [
    "ato", "cohort_round", "ddss", "ddss_baselines", "ditto", "efbv", "fedavg", "fedcr", "fedht",
    "fedlpfm", "fedmrn", "fedpac", "fedsr",
    "fedp3", "fedp3_theory", "fedpm", "fedprox", "fedspa", "fml", "oto", "proxskip",
    "representation",
    "scafflix", "sppm", "subfedavg",
]
__dir__ = _public_dir(__all__)
