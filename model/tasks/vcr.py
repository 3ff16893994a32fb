"""VCR: score each (question, choice) row; pick the best-scored choice of each question.

Q->A rows hold question + answer choice; QA->R rows hold question + correct answer + rationale
choice, with segment types 0 / 2 / 3 (``model.config.VCR_*_TYPE``). Q->AR accuracy (both right) is
computed by the evaluation from the two predictions.

Loss (``loss=``): ``row`` (default, UNITER's ``UniterForVisualCommonsenseReasoning``): each row is a
2-way right / wrong classification, averaged over rows; the row's score is its "right" logit.
``softmax``: this project's alternative, cross-entropy of the softmax over each question's choices.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from torch import nn

from model.config import TEXT_TYPE, VCR_TYPE_VOCAB, UniterConfig
from model.tasks.common import TaskOutput, UniterTaskModel, answer_mlp, grouped_choice_output, row_choice_loss

__all__ = ["VCR_LOSSES", "UniterForVcr"]

VCR_LOSSES = ("row", "softmax")
RIGHT = 1  # column of the "right" logit in the row head's (wrong, right) output


class UniterForVcr(UniterTaskModel):
    """Batch: docs/design.md §10 keys with rows grouped per question (row i*K + k is choice k of
    question i, K = rows / len(targets), 4 in VCR), ``targets`` i64 [B] = the correct choice, and
    ``txt_type_ids`` i64 [rows, Lt] (question 0, answer 2, rationale 3; the segment table has
    ``VCR_TYPE_VOCAB`` rows, the new ones started from the text type as UNITER does).
    Output logits [B, K] (or [rows] scores without targets); metric ``accuracy``.
    """

    def __init__(self, config: UniterConfig, *, img_dim: int, loss: Literal["row", "softmax"] = "row"):
        super().__init__(config, img_dim=img_dim)
        if loss not in VCR_LOSSES:
            raise ValueError(f"unknown VCR loss {loss!r}; expected one of {VCR_LOSSES}")
        self.loss = loss
        self.uniter.grow_type_vocab(VCR_TYPE_VOCAB, from_type=TEXT_TYPE)
        # UNITER's VCR head: ReLU, and two outputs (wrong, right) per row
        self.head = answer_mlp(config.hidden_size, 2, eps=config.layer_norm_eps, activation=nn.ReLU)
        self.init_heads(self.head)

    def forward(self, batch: Mapping) -> TaskOutput:
        row_logits = self.head(self.uniter.pool(self.encode(batch)))
        scores = row_logits[:, RIGHT]
        targets = batch.get("targets")
        if targets is None or self.loss == "softmax":
            return grouped_choice_output(scores, targets)
        return grouped_choice_output(scores, targets, loss=row_choice_loss(row_logits, targets))
