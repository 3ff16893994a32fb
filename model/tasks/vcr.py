"""VCR: score each (question, choice) row; the choices of one question compete in a softmax.

Q->A rows hold question + answer choice; QA->R rows hold question + correct answer + rationale
choice. Q->AR accuracy (both right) is computed by the evaluation from the two predictions.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from model.config import UniterConfig
from model.tasks.common import TaskOutput, UniterTaskModel, answer_mlp, grouped_choice_output

__all__ = ["UniterForVcr"]


class UniterForVcr(UniterTaskModel):
    """Batch: docs/design.md §10 keys with rows grouped per question (row i*K + k is choice k of
    question i, K = rows / len(targets), 4 in VCR), ``targets`` i64 [B] = the correct choice,
    optional ``txt_type_ids`` (segments, e.g. question / answer / rationale; ``type_vocab_size``
    grows the segment table). Output logits [B, K] (or [rows] scores without targets); loss: CE
    over each question's choices; metric ``accuracy``."""

    def __init__(self, config: UniterConfig, *, img_dim: int, type_vocab_size: int = 2):
        super().__init__(config, img_dim=img_dim)
        self.uniter.grow_type_vocab(type_vocab_size)
        self.head = answer_mlp(config.hidden_size, 1, eps=config.layer_norm_eps)
        self.init_heads(self.head)

    def forward(self, batch: Mapping[str, torch.Tensor]) -> TaskOutput:
        scores = self.head(self.uniter.pool(self.encode(batch))).squeeze(-1)
        return grouped_choice_output(scores, batch.get("targets"))
