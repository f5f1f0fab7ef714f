"""Running algorithms: the runner (``run``, ``run_batched``, chunks, evaluation schedules,
resume), client execution strategies and layouts (``clients``), device sharding
(``sharding``), multi-process ``jax.distributed`` (``distributed``), host-resident client
populations (``population``), vmapped hyper-parameter sweeps (``sweep``), checkpoints with
their fingerprints and folder locks (``checkpoint``, ``fingerprint``, ``locking``)."""
