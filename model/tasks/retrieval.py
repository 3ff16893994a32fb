"""Image-text retrieval: an ITM-style match score per (image, text) row, ranked per query."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from model.config import UniterConfig
from model.tasks.common import TaskOutput, UniterTaskModel, grouped_choice_output
from model.uniter import load_encoder_state

__all__ = ["UniterForRetrieval"]


class UniterForRetrieval(UniterTaskModel):
    """Batch: docs/design.md §10 keys; for training, rows grouped per query (the positive pair and
    its hard negatives, equal group sizes) with ``targets`` i64 [G] = index of the positive in its
    group (UNITER's hard-negative fine-tuning: softmax over 1 + N candidates). Without ``targets``,
    logits are the scores [rows] used to rank candidates (R@1/5/10 in the evaluation).
    """

    def __init__(self, config: UniterConfig, *, img_dim: int):
        super().__init__(config, img_dim=img_dim)
        self.scorer = nn.Linear(config.hidden_size, 1)
        self.init_heads(self.scorer)

    def forward(self, batch: Mapping[str, torch.Tensor]) -> TaskOutput:
        scores = self.scorer(self.uniter.pool(self.encode(batch))).squeeze(-1)
        return grouped_choice_output(scores, batch.get("targets"))

    def init_from_pretraining(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Encoder from a UniterForPretraining state dict, scorer from its ITM head.

        The score is logit(match) - logit(mismatch), which ranks exactly as the ITM probability,
        so a pretrained model retrieves zero-shot before any fine-tuning.
        """
        load_encoder_state(self, state_dict)
        weight, bias = state_dict["itm.classifier.weight"], state_dict["itm.classifier.bias"]
        with torch.no_grad():
            self.scorer.weight.copy_((weight[1] - weight[0]).unsqueeze(0))
            self.scorer.bias.copy_((bias[1] - bias[0]).unsqueeze(0))
