"""fedjaxsparse: federated sparse training, compression and local training in JAX.

``import fedjaxsparse as fjs`` is all a user types:

* every paper method by its paper name, each returning an :class:`Algorithm` of two pure
  functions ``init(key, params, data)`` and ``step(key, state, data)``: ``fjs.fedavg``,
  ``fjs.sparse_proxskip``, ``fjs.ef21``, ``fjs.scafflix``, ``fjs.fedspa``, ``fjs.fedmrn``,
  ``fjs.fedp3``, ``fjs.fedlpfm``, ``fjs.dis_ddss``, ... (``fjs.METHODS`` lists them); the
  structured-pruning trainers ``fjs.ato`` and ``fjs.dhspg`` (``fjs.PRUNING_TRAINERS``);
* a new cohort method: ``fjs.cohort_round(fjs.ClientUpdate(init, update), ...)`` — the one
  cohort round every cohort family is built on;
* running them: ``fjs.run`` (rounds in ``lax.scan`` chunks, evaluation, checkpoints and
  resume, set by ``fjs.Checkpointing``) and ``fjs.run_batched`` (seeds or a hyper-parameter
  grid as one program);
  ``fjs.global_params(state)`` and ``fjs.personal_params(state)`` read the models;
* the pieces, by concept: ``fjs.compressors``, ``fjs.sparsity``, ``fjs.masks``,
  ``fjs.sampling``, ``fjs.proxes``, ``fjs.aggregation``, ``fjs.accounting`` (in ``fjs.ops``),
  ``fjs.data``, ``fjs.models``, ``fjs.pruning``, ``fjs.convex``, ``fjs.runtime``,
  ``fjs.algorithms`` (the modules of the paper families), ``fjs.evaluation``, ``fjs.errors``,
  and ``fjs.harness`` (experiments, tables, plots, CLI; loaded on first use).

Heavy optional modules load only when used: the harness (matplotlib), Hugging Face and CLIP
checkpoints (``fjs.models.hf``, ``fjs.models.clip``), the language-model protocol
(``fjs.pruning.lm``) and tensorflow-datasets sources.
"""
from fedjaxsparse import (algorithms, convex, core, data, errors, evaluation, models, ops,
                          pruning, runtime)
from fedjaxsparse.algorithms.ato import ato
from fedjaxsparse.algorithms.cohort_round import ClientUpdate, ServerPart, cohort_round
from fedjaxsparse.algorithms.ddss import (dis_ddss, dis_ddss_naive, prox_asvrg, sha_ddss,
                                          sha_ddss_naive)
from fedjaxsparse.algorithms.ddss_baselines import prox_asaga, pse
from fedjaxsparse.algorithms.ditto import ditto
from fedjaxsparse.algorithms.efbv import diana, ef21, ef_bv, ef_bv_pp, prox_gd
from fedjaxsparse.algorithms.fedavg import fedavg
from fedjaxsparse.algorithms.fedht import fedht, fediht
from fedjaxsparse.algorithms.fedlpfm import fedlpfm
from fedjaxsparse.algorithms.fedmrn import fedmrn
from fedjaxsparse.algorithms.fedp3 import fedp3
from fedjaxsparse.algorithms.fedp3_theory import fedp3_theory
from fedjaxsparse.algorithms.fedpm import fedpm
from fedjaxsparse.algorithms.fedprox import fedprox
from fedjaxsparse.algorithms.fedspa import fedspa
from fedjaxsparse.algorithms.fml import fml
from fedjaxsparse.algorithms.oto import dhspg
from fedjaxsparse.algorithms.proxskip import (accelerated_server_pruning,
                                              accelerated_server_pruning_modified,
                                              meta_sparse_proxskip, proxskip, randprox_l1,
                                              sparse_proxskip, sparse_proxskip_local,
                                              sparse_proxskip_modified)
from fedjaxsparse.algorithms.fedcr import fedcr
from fedjaxsparse.algorithms.fedpac import fedpac
from fedjaxsparse.algorithms.fedsr import fedsr
from fedjaxsparse.algorithms.scafflix import flix_sgd, i_scaffnew, scafflix
from fedjaxsparse.algorithms.sppm import fedavg_sppm_as, fedprox_sppm_as, local_gd, sppm_as
from fedjaxsparse.algorithms.subfedavg import subfedavg
from fedjaxsparse.core import (Algorithm, LossFn, Model, global_params, lazy_submodules,
                               personal_params)
from fedjaxsparse.ops import (accounting, aggregation, compressors, masks, proxes, sampling,
                              sparsity)
from fedjaxsparse.runtime import Checkpointing, run, run_batched
from fedjaxsparse.core import public_dir as _public_dir

__version__ = "0.1.0"
"""The package version."""

METHODS = (
    "fedavg", "fedprox", "proxskip", "sparse_proxskip", "sparse_proxskip_local",
    "sparse_proxskip_modified", "accelerated_server_pruning",
    "accelerated_server_pruning_modified", "meta_sparse_proxskip", "randprox_l1", "fedht",
    "fediht", "ef_bv", "ef_bv_pp", "ef21", "diana", "prox_gd", "scafflix", "i_scaffnew",
    "flix_sgd", "sppm_as", "fedprox_sppm_as", "fedavg_sppm_as", "local_gd", "fedspa", "ditto",
    "subfedavg", "fedpm", "fedmrn", "fedp3", "fedp3_theory", "fedlpfm", "fml",
    "sha_ddss_naive", "sha_ddss", "dis_ddss_naive", "dis_ddss", "prox_asvrg", "prox_asaga", "pse",
    "fedcr", "fedsr", "fedpac",
)
"""The paper methods at the top of the package, by their papers' names: each returns an
:class:`Algorithm` that :func:`run` runs."""

PRUNING_TRAINERS = ("ato", "dhspg")
"""The structured-pruning trainers at the top of the package (Auto-Train-Once, DHSPG): each
returns a trainer that :func:`fedjaxsparse.algorithms.ato.train` runs, not an
:class:`Algorithm`."""

__all__ = [
    *METHODS, *PRUNING_TRAINERS,
    "Algorithm", "ClientUpdate", "ServerPart", "cohort_round", "LossFn", "Model",
    "global_params", "personal_params", "run", "Checkpointing", "run_batched",
    "algorithms", "convex", "core", "data", "errors", "evaluation", "models", "ops", "pruning",
    "runtime", "harness", "accounting", "aggregation", "compressors", "masks", "proxes", "sampling",
    "sparsity", "METHODS", "PRUNING_TRAINERS", "__version__",
]
__dir__ = _public_dir(__all__)


# experiments, tables, plots, CLI (matplotlib): loaded on first use
__getattr__ = lazy_submodules(__name__, ("harness",))
