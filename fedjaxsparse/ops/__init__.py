"""The small pure pieces algorithms compose: Top-K and thresholds (``sparsity``), ERK masks and
prune/regrow (``masks``), FedMRN's masked noise (``noise_masks``),
proximal operators with one signature (``proxes``), uplink compressors
(``compressors``), client samplings with exact marginals and the round's cohort
(``sampling``), local training loops and minibatches (``local``), aggregation weights
(``aggregation``), bit and FLOP ledgers (``accounting``, ``flops``), image augmentation
(``augment``) and FedP3's layer groups (``layer_groups``)."""
from fedjaxsparse.ops import (accounting, aggregation, augment, compressors, flops, layer_groups,
                              local, masks, noise_masks, proxes, sampling, sparsity)
from fedjaxsparse.core import public_dir as _public_dir

__all__ = [
    "accounting", "aggregation", "augment", "compressors", "flops", "layer_groups", "local",
    "masks", "noise_masks", "proxes", "sampling", "sparsity",
]
__dir__ = _public_dir(__all__)
