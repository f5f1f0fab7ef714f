"""Running algorithms: the runner (``run``, ``run_batched``, chunks, evaluation schedules,
resume), client execution strategies and layouts (``clients``), device sharding
(``sharding``), multi-process ``jax.distributed`` (``distributed``), host-resident client
populations (``population``), vmapped hyper-parameter sweeps (``sweep``), centralised
training by epochs (``epochs``: ATO, Fed-LPFM's teacher), checkpoints with their fingerprints
and folder locks (``checkpoint``, ``fingerprint``, ``locking``)."""
from fedjaxsparse.runtime import (checkpoint, clients, distributed, epochs, fingerprint, locking,
                                  population, runner, sharding, sweep)
from fedjaxsparse.runtime.checkpoint import Checkpointing
from fedjaxsparse.runtime.runner import run
from fedjaxsparse.runtime.sweep import run_batched
from fedjaxsparse.core import public_dir as _public_dir

__all__ = [
    "checkpoint", "clients", "distributed", "epochs", "fingerprint", "locking", "population",
    "runner", "sharding", "sweep", "run", "run_batched", "Checkpointing",
]
__dir__ = _public_dir(__all__)
