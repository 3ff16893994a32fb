"""Masked language modeling head, with its decoder tied to the word embeddings."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from model.masking import IGNORE_INDEX

__all__ = ["MlmHead", "MlmOutput", "PredictionTransform"]


class PredictionTransform(nn.Module):
    """Linear -> GELU -> LayerNorm, applied before every per-position prediction (BERT's transform)."""

    def __init__(self, hidden_size: int, eps: float = 1e-12):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.norm = nn.LayerNorm(hidden_size, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(F.gelu(self.dense(x)))


@dataclass
class MlmOutput:
    """loss: mean CE over masked tokens; logits [N, V] for the N masked tokens; accuracy: top-1 on them."""

    loss: torch.Tensor
    logits: torch.Tensor
    accuracy: torch.Tensor
    n_tokens: int


class MlmHead(nn.Module):
    """Predicts the original WordPiece at each masked text position.

    The output projection is the word-embedding matrix itself (passed to ``forward``), plus a
    per-word bias owned here, so the head adds only H*H + 3H + V parameters.
    """

    def __init__(self, hidden_size: int, vocab_size: int, *, eps: float = 1e-12):
        super().__init__()
        self.transform = PredictionTransform(hidden_size, eps)
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, text_output: torch.Tensor, labels: torch.Tensor, word_embeddings: torch.Tensor) -> MlmOutput:
        """text_output [B, Lt, H], labels i64 [B, Lt] (-100 = no target), word_embeddings [V, H]."""
        selected = labels != IGNORE_INDEX
        n_tokens = int(selected.sum())
        if n_tokens == 0:
            raise ValueError("MLM batch has no masked token (txt_labels are all -100)")
        hidden = self.transform(text_output[selected])  # decode masked positions only: V is large
        logits = F.linear(hidden, word_embeddings, self.bias)
        targets = labels[selected]
        loss = F.cross_entropy(logits.float(), targets)
        accuracy = (logits.argmax(-1) == targets).float().mean()
        return MlmOutput(loss=loss, logits=logits, accuracy=accuracy, n_tokens=n_tokens)
