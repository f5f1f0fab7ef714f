"""Post-training pruning: the importance scores (magnitude, Wanda, RIA, SymWanda, stochRIA;
``scores``), calibration statistics (``calibration``), DSnoT and R²-DSnoT refinement
(``dsnot``), one-shot pruning of a model (``posttrain``), layer-sequential pruning
(``sequential``), the language-model evaluation protocol (``lm``; zero-shot multiple-choice
tasks in ``zeroshot``) and ATO's zero-invariant groups (``zig``)."""
from fedjaxsparse.core import lazy_submodules
from fedjaxsparse.pruning import calibration, dsnot, posttrain, scores, sequential, zig
from fedjaxsparse.core import public_dir as _public_dir

__all__ = [
    "calibration", "dsnot", "posttrain", "scores", "sequential", "zig", "lm", "zeroshot",
]
__dir__ = _public_dir(__all__)


# The language-model protocol (tokenizers, parquet C4 shards; zero-shot tasks): imported on
# first use (``fedjaxsparse.pruning.lm``, ``.zeroshot``), never by ``import fedjaxsparse``.
__getattr__ = lazy_submodules(__name__, ("lm", "zeroshot"))
