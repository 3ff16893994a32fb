"""Pretraining heads: MLM, MRM (MRFR, MRC, MRC-kl), ITM and WRA, each returning a typed output."""

from model.heads.itm import ItmHead, ItmOutput
from model.heads.mlm import MlmHead, MlmOutput, PredictionTransform
from model.heads.mrm import MrcHead, MrcOutput, MrfrHead, MrfrOutput
from model.heads.wra import WraOutput, word_region_alignment

__all__ = [
    "ItmHead",
    "ItmOutput",
    "MlmHead",
    "MlmOutput",
    "MrcHead",
    "MrcOutput",
    "MrfrHead",
    "MrfrOutput",
    "PredictionTransform",
    "WraOutput",
    "word_region_alignment",
]
