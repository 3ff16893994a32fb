"""VQA: an MLP over the pooled [CLS] scores every answer of the vocabulary (3,129 for VQA v2)."""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F

from model.config import UniterConfig
from model.tasks.common import TaskOutput, UniterTaskModel, answer_mlp, metrics_to_floats

__all__ = ["UniterForVqa"]


class UniterForVqa(UniterTaskModel):
    """Multi-label answer classification with soft targets.

    Batch: docs/design.md §10 keys, plus ``targets`` f32 [B, A] (soft scores, min(#humans/3, 1)).
    Output logits [B, A]. Loss: binary cross-entropy with logits, summed over answers and
    averaged over questions (UNITER's mean BCE times A). Metric ``vqa_score``: mean soft score of
    the top answer (the VQA accuracy when targets are the official soft scores).
    """

    def __init__(self, config: UniterConfig, *, img_dim: int, num_answers: int = 3129):
        super().__init__(config, img_dim=img_dim)
        self.num_answers = num_answers
        self.head = answer_mlp(config.hidden_size, num_answers, eps=config.layer_norm_eps)
        self.init_heads(self.head)

    def forward(self, batch: Mapping[str, torch.Tensor]) -> TaskOutput:
        logits = self.head(self.uniter.pool(self.encode(batch)))
        targets = batch.get("targets")
        if targets is None:
            return TaskOutput(logits=logits)
        if targets.shape != logits.shape:
            raise ValueError(f"VQA targets {tuple(targets.shape)} do not match logits {tuple(logits.shape)}")
        loss = F.binary_cross_entropy_with_logits(logits.float(), targets.float(), reduction="sum") / logits.shape[0]
        score = targets.gather(1, logits.argmax(-1, keepdim=True)).float().mean()
        metrics = metrics_to_floats({"loss": loss, "vqa_score": score}, n_examples=logits.shape[0])
        return TaskOutput(logits=logits, loss=loss, metrics=metrics)
