"""SNLI-VE: does the image entail, contradict or stay neutral to the hypothesis? 3-way on [CLS]."""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F

from model.config import UniterConfig
from model.tasks.common import TaskOutput, UniterTaskModel, answer_mlp, metrics_to_floats

__all__ = ["SNLI_VE_LABELS", "UniterForSnliVe"]

SNLI_VE_LABELS = ("entailment", "neutral", "contradiction")  # target index = position here


class UniterForSnliVe(UniterTaskModel):
    """Batch: docs/design.md §10 keys + ``targets`` i64 [B] (index into SNLI_VE_LABELS).
    Output logits [B, 3]; loss: CE; metric ``accuracy``."""

    def __init__(self, config: UniterConfig, *, img_dim: int):
        super().__init__(config, img_dim=img_dim)
        self.head = answer_mlp(config.hidden_size, len(SNLI_VE_LABELS), eps=config.layer_norm_eps)
        self.init_heads(self.head)

    def forward(self, batch: Mapping[str, torch.Tensor]) -> TaskOutput:
        logits = self.head(self.uniter.pool(self.encode(batch)))
        targets = batch.get("targets")
        if targets is None:
            return TaskOutput(logits=logits)
        loss = F.cross_entropy(logits.float(), targets)
        accuracy = (logits.argmax(-1) == targets).float().mean()
        metrics = metrics_to_floats({"loss": loss, "accuracy": accuracy}, n_examples=targets.shape[0])
        return TaskOutput(logits=logits, loss=loss, metrics=metrics)
