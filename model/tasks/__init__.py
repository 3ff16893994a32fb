"""Downstream task models: each wraps ``UniterModel`` with a small head and returns ``TaskOutput``."""

from model.tasks.common import TaskOutput, UniterTaskModel
from model.tasks.nlvr2 import NLVR2_VARIANTS, UniterForNlvr2
from model.tasks.refexp import UniterForRefExp
from model.tasks.retrieval import UniterForRetrieval
from model.tasks.snli_ve import SNLI_VE_LABELS, UniterForSnliVe
from model.tasks.vcr import UniterForVcr
from model.tasks.vqa import UniterForVqa

__all__ = [
    "NLVR2_VARIANTS",
    "SNLI_VE_LABELS",
    "TaskOutput",
    "UniterForNlvr2",
    "UniterForRefExp",
    "UniterForRetrieval",
    "UniterForSnliVe",
    "UniterForVcr",
    "UniterForVqa",
    "UniterTaskModel",
]
