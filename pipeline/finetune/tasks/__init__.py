"""Fine-tuning tasks: one module per task (dataset, collate, training step, evaluation, metrics).

``task_class(name)`` gives the :class:`~pipeline.finetune.tasks.base.FinetuneTask` of a task of
``pipeline.params.finetune.TASKS``.
"""

from __future__ import annotations

from pipeline.finetune.tasks.base import FinetuneTask
from pipeline.finetune.tasks.nlvr2 import Nlvr2Task
from pipeline.finetune.tasks.refcoco_plus import RefcocoPlusTask
from pipeline.finetune.tasks.retrieval import RetrievalTask
from pipeline.finetune.tasks.snli_ve import SnliVeTask
from pipeline.finetune.tasks.vcr import VcrTask
from pipeline.finetune.tasks.vqa import VqaTask

TASK_CLASSES: dict[str, type[FinetuneTask]] = {
    cls.name: cls for cls in (VqaTask, VcrTask, Nlvr2Task, SnliVeTask, RetrievalTask, RefcocoPlusTask)
}


def task_class(name: str) -> type[FinetuneTask]:
    if name not in TASK_CLASSES:
        raise ValueError(f"unknown fine-tuning task {name!r}; expected one of {sorted(TASK_CLASSES)}")
    return TASK_CLASSES[name]
