"""Fine-tuning tasks: one module per task (dataset, collate, training step, evaluation, metrics).

``task_class(name)`` gives the :class:`~pipeline.tasks.base.FinetuneTask` of a task of
``pipeline.configs.finetune.TASKS``.
"""

from __future__ import annotations

from pipeline.tasks.base import FinetuneTask
from pipeline.tasks.nlvr2 import Nlvr2Task
from pipeline.tasks.refcoco_plus import RefcocoPlusTask
from pipeline.tasks.retrieval import RetrievalTask
from pipeline.tasks.snli_ve import SnliVeTask
from pipeline.tasks.vcr import VcrTask
from pipeline.tasks.vqa import VqaTask

TASK_CLASSES: dict[str, type[FinetuneTask]] = {
    cls.name: cls for cls in (VqaTask, VcrTask, Nlvr2Task, SnliVeTask, RetrievalTask, RefcocoPlusTask)
}


def task_class(name: str) -> type[FinetuneTask]:
    if name not in TASK_CLASSES:
        raise ValueError(f"unknown fine-tuning task {name!r}; expected one of {sorted(TASK_CLASSES)}")
    return TASK_CLASSES[name]
