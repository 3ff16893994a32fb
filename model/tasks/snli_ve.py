"""SNLI-VE: does the image entail, contradict or stay neutral to the hypothesis? 3 classes on [CLS].

Loss (``loss=``): ``bce`` (default, UNITER's ``UniterForVisualEntailment``, the VQA model with 3
answers): binary cross-entropy of each class logit against the one-hot label, summed over the
classes and averaged over examples (the reference's ``mean * 3``). ``ce``: this project's
alternative, the 3-way softmax cross-entropy. Prediction: the argmax either way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import torch.nn.functional as F

from model.config import UniterConfig
from model.tasks.common import TaskOutput, UniterTaskModel, answer_mlp, metrics_to_floats

__all__ = ["SNLI_VE_LABELS", "SNLI_VE_LOSSES", "UniterForSnliVe"]

SNLI_VE_LABELS = ("entailment", "neutral", "contradiction")  # target index = position here
SNLI_VE_LOSSES = ("bce", "ce")


class UniterForSnliVe(UniterTaskModel):
    """Batch: docs/design.md §10 keys + ``targets`` i64 [B] (index into SNLI_VE_LABELS).
    Output logits [B, 3]; loss per ``loss``; metric ``accuracy``."""

    def __init__(self, config: UniterConfig, *, img_dim: int, loss: Literal["bce", "ce"] = "bce"):
        super().__init__(config, img_dim=img_dim)
        if loss not in SNLI_VE_LOSSES:
            raise ValueError(f"unknown SNLI-VE loss {loss!r}; expected one of {SNLI_VE_LOSSES}")
        self.loss = loss
        self.head = answer_mlp(config.hidden_size, len(SNLI_VE_LABELS), eps=config.layer_norm_eps)
        self.init_heads(self.head)

    def forward(self, batch: Mapping) -> TaskOutput:
        logits = self.head(self.uniter.pool(self.encode(batch)))
        targets = batch.get("targets")
        if targets is None:
            return TaskOutput(logits=logits)
        if self.loss == "ce":
            loss = F.cross_entropy(logits.float(), targets)
        else:
            one_hot = F.one_hot(targets, len(SNLI_VE_LABELS)).float()
            loss = F.binary_cross_entropy_with_logits(logits.float(), one_hot, reduction="sum") / logits.shape[0]
        accuracy = (logits.argmax(-1) == targets).float().mean()
        metrics = metrics_to_floats({"loss": loss, "accuracy": accuracy}, n_examples=targets.shape[0])
        return TaskOutput(logits=logits, loss=loss, metrics=metrics)
