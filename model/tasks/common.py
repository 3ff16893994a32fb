"""What the downstream task models share: the output type, the encoder call, the answer MLP and the
"pick one of a group of rows" losses and output used by VCR (choices) and retrieval (candidates):
softmax over a group, UNITER's per-row right/wrong cross-entropy (VCR) and its hinge on sigmoid
scores (retrieval)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from model.config import UniterConfig
from model.layers import init_bert_weights
from model.uniter import UniterModel

__all__ = [
    "TaskOutput",
    "UniterTaskModel",
    "answer_mlp",
    "grouped_choice_loss",
    "grouped_choice_output",
    "grouped_hinge_loss",
    "metrics_to_floats",
    "row_choice_loss",
]


@dataclass
class TaskOutput:
    """logits: the task's scores (shape documented per task); loss: scalar, None when the batch has
    no ``targets``; metrics: python floats (``loss``, accuracy-like values, ``n_examples``)."""

    logits: torch.Tensor
    loss: torch.Tensor | None = None
    metrics: dict[str, float] = field(default_factory=dict)


def answer_mlp(
    hidden_size: int, out_dim: int, *, in_dim: int | None = None, width: int | None = None, eps: float = 1e-12,
    activation: type[nn.Module] = nn.GELU,
) -> nn.Sequential:
    """UNITER's task head: Linear(in, W) -> activation -> LayerNorm(W) -> Linear(W, out), W = ``width``
    (default 2H: the VQA / SNLI-VE / VCR heads; the RefCOCO+ head's is H).

    The reference uses GELU in its VQA / SNLI-VE / RefExp heads and ReLU in its VCR head.
    """
    in_dim = in_dim or hidden_size
    width = width or 2 * hidden_size
    return nn.Sequential(
        nn.Linear(in_dim, width),
        activation(),
        nn.LayerNorm(width, eps=eps),
        nn.Linear(width, out_dim),
    )


def metrics_to_floats(values: Mapping[str, torch.Tensor], **counts: int) -> dict[str, float]:
    """Detach and convert with one device sync; counts are added as floats."""
    names = list(values)
    floats = torch.stack([values[n].detach().float() for n in names]).tolist() if names else []
    return {**dict(zip(names, floats)), **{k: float(v) for k, v in counts.items()}}


def _groups(scores: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """[R] row scores -> [G, R / G], checking that the rows split into len(targets) equal groups."""
    groups = targets.shape[0]
    if groups == 0 or scores.shape[0] % groups:
        raise ValueError(f"{scores.shape[0]} rows cannot be split into {groups} equal groups")
    return scores.view(groups, -1)


def grouped_choice_loss(scores: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows come in G contiguous groups of equal size; each group has one correct row.

    Args:
        scores: [R] one score per row, R = G * group size; targets: i64 [G], the correct row's
            index within its group.
    Returns:
        (loss: mean CE of the softmax over each group, accuracy: correct row ranked first,
        logits [G, group size]).
    """
    logits = _groups(scores, targets)
    loss = F.cross_entropy(logits.float(), targets)
    return loss, (logits.argmax(-1) == targets).float().mean(), logits


def row_choice_loss(row_logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """UNITER's VCR loss: every (question, choice) row is a 2-way right / wrong classification.

    Args:
        row_logits: [R, 2] (wrong, right) logits of R = G * group size rows; targets: i64 [G],
            the correct row's index within its group.
    Returns:
        mean over all R rows of the cross-entropy with label 1 for the correct row, 0 otherwise.
    """
    per_group = _groups(row_logits[:, 0], targets).shape[1]
    labels = (torch.arange(per_group, device=targets.device)[None, :] == targets[:, None]).long().flatten()
    return F.cross_entropy(row_logits.float(), labels)


def grouped_hinge_loss(scores: torch.Tensor, targets: torch.Tensor, *, margin: float) -> torch.Tensor:
    """UNITER's retrieval loss: hinge on sigmoid scores, every negative against its group's positive.

    Args:
        scores: [R] row scores (logits); targets: i64 [G], the positive's index in its group.
    Returns:
        mean over all (group, negative) pairs of ``max(0, margin + sigmoid(s_neg) - sigmoid(s_pos))``.
    """
    probs = _groups(scores, targets).float().sigmoid()
    positive = probs.gather(1, targets[:, None])
    negative = torch.ones_like(probs, dtype=torch.bool).scatter_(1, targets[:, None], False)
    return (margin + probs - positive).clamp(min=0)[negative].mean()


def grouped_choice_output(
    scores: torch.Tensor, targets: torch.Tensor | None, *, loss: torch.Tensor | None = None
) -> TaskOutput:
    """The output of a head that scores rows competing in groups (VCR choices, retrieval candidates).

    Args:
        scores: [R] one score per row; targets: i64 [G] (see :func:`grouped_choice_loss`) or None;
            loss: the training loss when it is not the softmax over each group's scores.
    Returns:
        without targets, logits = scores [R] (for ranking); with them, logits [G, R / G], the loss
        and metrics ``loss``, ``accuracy`` (the correct row scored highest), ``n_examples`` (= G).
    """
    if targets is None:
        return TaskOutput(logits=scores)
    softmax_loss, accuracy, logits = grouped_choice_loss(scores, targets)
    loss = softmax_loss if loss is None else loss
    metrics = metrics_to_floats({"loss": loss, "accuracy": accuracy}, n_examples=targets.shape[0])
    return TaskOutput(logits=logits, loss=loss, metrics=metrics)


class UniterTaskModel(nn.Module):
    """Base of the downstream models: ``self.uniter`` plus task modules that subclasses add.

    ``load_encoder_state(model, pretrain_state_dict)`` (model.uniter) fills the encoder from a
    pretraining checkpoint; heads start from BERT's initialization.
    """

    def __init__(self, config: UniterConfig, *, img_dim: int):
        super().__init__()
        self.config = config
        self.uniter = UniterModel(config, img_dim=img_dim)

    def init_heads(self, *modules: nn.Module) -> None:
        for module in modules:
            module.apply(lambda m: init_bert_weights(m, self.config.initializer_range))

    def encode(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Sequence output [R, Lt + Li, H] of the batch rows (docs/design.md §10 keys)."""
        return self.uniter(
            batch["input_ids"],
            batch["txt_mask"],
            batch["img_feat"],
            batch["img_pos"],
            batch["img_mask"],
            txt_type_ids=batch.get("txt_type_ids"),
            img_type_ids=batch.get("img_type_ids"),
        )
