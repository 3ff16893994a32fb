"""Image-text matching: is this caption about this image? Binary classifier on the pooled [CLS]."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["ItmHead", "ItmOutput"]


@dataclass
class ItmOutput:
    """loss: mean CE; logits [B, 2] (class 1 = matched); accuracy over the B pairs."""

    loss: torch.Tensor
    logits: torch.Tensor
    accuracy: torch.Tensor
    n_pairs: int


class ItmHead(nn.Module):
    def __init__(self, hidden_size: int):
        super().__init__()
        self.classifier = nn.Linear(hidden_size, 2)

    def forward(self, pooled: torch.Tensor, targets: torch.Tensor) -> ItmOutput:
        """pooled [B, H], targets i64 [B] (1 = matched pair, 0 = image swapped)."""
        logits = self.classifier(pooled)
        loss = F.cross_entropy(logits.float(), targets)
        accuracy = (logits.argmax(-1) == targets).float().mean()
        return ItmOutput(loss=loss, logits=logits, accuracy=accuracy, n_pairs=int(targets.numel()))
