"""Post-training pruning: the importance scores (magnitude, Wanda, RIA, SymWanda, stochRIA;
``scores``), calibration statistics (``calibration``), DSnoT and R²-DSnoT refinement
(``dsnot``), one-shot pruning of a model (``posttrain``), layer-sequential pruning
(``sequential``), the language-model evaluation protocol (``lm``) and ATO's zero-invariant
groups (``zig``)."""
