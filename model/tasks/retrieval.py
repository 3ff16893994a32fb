"""Image-text retrieval: an ITM-style match score per (image, text) row, ranked per query.

Training rows come in groups per query: the positive pair and its hard negatives. Loss
(``loss=``): ``hinge`` (default, UNITER's ``UniterForImageTextRetrieval``): for every negative,
``max(0, margin + sigmoid(s_neg) - sigmoid(s_pos))``, averaged over all (query, negative) pairs,
margin 0.2 in the reference configs. ``softmax``: this project's alternative, cross-entropy of the
softmax over each group (positive + negatives).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import torch
from torch import nn

from model.config import UniterConfig
from model.tasks.common import TaskOutput, UniterTaskModel, grouped_choice_output, grouped_hinge_loss
from model.uniter import load_encoder_state

__all__ = ["RETRIEVAL_LOSSES", "UniterForRetrieval"]

RETRIEVAL_LOSSES = ("hinge", "softmax")


class UniterForRetrieval(UniterTaskModel):
    """Batch: docs/design.md §10 keys; for training, rows grouped per query (equal group sizes) with
    ``targets`` i64 [G] = index of the positive in its group. Without ``targets``, logits are the
    scores [rows] used to rank candidates (R@1/5/10 in the evaluation).
    """

    def __init__(
        self, config: UniterConfig, *, img_dim: int, loss: Literal["hinge", "softmax"] = "hinge", margin: float = 0.2
    ):
        super().__init__(config, img_dim=img_dim)
        if loss not in RETRIEVAL_LOSSES:
            raise ValueError(f"unknown retrieval loss {loss!r}; expected one of {RETRIEVAL_LOSSES}")
        self.loss, self.margin = loss, margin
        self.scorer = nn.Linear(config.hidden_size, 1)
        self.init_heads(self.scorer)

    def forward(self, batch: Mapping[str, torch.Tensor]) -> TaskOutput:
        scores = self.scorer(self.uniter.pool(self.encode(batch))).squeeze(-1)
        targets = batch.get("targets")
        if targets is None or self.loss == "softmax":
            return grouped_choice_output(scores, targets)
        return grouped_choice_output(scores, targets, loss=grouped_hinge_loss(scores, targets, margin=self.margin))

    def init_from_pretraining(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Encoder from a UniterForPretraining state dict, scorer from its ITM head.

        The score is logit(match) - logit(mismatch): its sigmoid is the ITM match probability, so a
        pretrained model retrieves zero-shot before any fine-tuning. (The reference starts its
        ranking head from the match row alone, ``init_output``; see docs/fidelity.md.)
        """
        load_encoder_state(self, state_dict)
        weight, bias = state_dict["itm.classifier.weight"], state_dict["itm.classifier.bias"]
        with torch.no_grad():
            self.scorer.weight.copy_((weight[1] - weight[0]).unsqueeze(0))
            self.scorer.bias.copy_((bias[1] - bias[0]).unsqueeze(0))
