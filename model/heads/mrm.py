"""Masked region modeling heads: MRFR (feature regression), MRC (hard class) and MRC-kl (soft).

All three predict from the encoder output at the masked region positions only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from model.heads.mlm import PredictionTransform

__all__ = ["BACKGROUND", "KL_REDUCTIONS", "MrcHead", "MrcOutput", "MrfrHead", "MrfrOutput"]

BACKGROUND = 0  # soft_labels are [C+1] with the detector's background class first
# mrc_kl's reduction of the elementwise KL terms [N, C+1]: mean over all of them (UNITER) or, per
# region, their sum (the KL divergence itself), then the mean over regions: C+1 times larger
KL_REDUCTIONS = ("mean", "region_sum")


def _masked_rows(region_output: torch.Tensor, img_masked: torch.Tensor, task: str) -> torch.Tensor:
    if img_masked.shape != region_output.shape[:2]:
        raise ValueError(
            f"{task}: img_masked {tuple(img_masked.shape)} does not match the region positions "
            f"{tuple(region_output.shape[:2])}"
        )
    if not bool(img_masked.any()):
        raise ValueError(f"{task} batch has no masked region (img_masked is all False)")
    return region_output[img_masked]


@dataclass
class MrfrOutput:
    """loss: mean squared error per feature dimension over masked regions; prediction [N, D]."""

    loss: torch.Tensor
    prediction: torch.Tensor
    n_regions: int


class MrfrHead(nn.Module):
    """Regresses the original (unmasked) region feature from the encoder output.

    As in UNITER, the output projection is the transpose of the image embedder's feature
    projection (passed to ``forward``), plus a bias of size D owned here. The loss is UNITER's
    implementation of the paper's squared L2: the mean over masked regions *and* feature
    dimensions (i.e. the per-region squared L2 divided by D, keeping the scale independent of D).
    """

    def __init__(self, hidden_size: int, img_dim: int, *, eps: float = 1e-12):
        super().__init__()
        self.transform = PredictionTransform(hidden_size, eps)
        self.bias = nn.Parameter(torch.zeros(img_dim))

    def forward(
        self,
        region_output: torch.Tensor,
        img_masked: torch.Tensor,
        feat_target: torch.Tensor,
        feat_proj_weight: torch.Tensor,
    ) -> MrfrOutput:
        """region_output [B, Li, H], img_masked bool [B, Li], feat_target [B, Li, D], feat_proj_weight [H, D]."""
        hidden = self.transform(_masked_rows(region_output, img_masked, "mrfr"))
        prediction = F.linear(hidden, feat_proj_weight.t(), self.bias)
        loss = F.mse_loss(prediction.float(), feat_target[img_masked].float())
        return MrfrOutput(loss=loss, prediction=prediction, n_regions=int(img_masked.sum()))


@dataclass
class MrcOutput:
    """loss: mean CE (mrc) or the reduced KL terms (mrc_kl, ``kl_reduction``) over masked regions; logits [N, C+1];
    accuracy: predicted object class (background excluded) == detector's top object class."""

    loss: torch.Tensor
    logits: torch.Tensor
    accuracy: torch.Tensor
    n_regions: int


class MrcHead(nn.Module):
    """Classifies masked regions into the detector's C+1 classes (shared by mrc and mrc_kl).

    mrc: cross-entropy to the detector's most confident *object* class; background is excluded
    when taking that argmax, as UNITER does (a kept region is an object by construction).
    mrc_kl: the KL terms ``p_c (log p_c - log q_c)`` of the detector distribution p against the
    predicted q, over all C+1 classes of every masked region, reduced by ``kl_reduction``: ``mean``
    over all N x (C+1) terms as UNITER's ``F.kl_div(..., reduction="none")`` then ``loss.mean()``
    (ChenRocks/UNITER model/pretrain.py ``forward_mrc``, pretrain.py), or ``region_sum``: the KL
    divergence per region, averaged over regions (C+1 times UNITER's scale).
    """

    def __init__(self, hidden_size: int, num_classes: int, *, eps: float = 1e-12, kl_reduction: str = "mean"):
        super().__init__()
        if kl_reduction not in KL_REDUCTIONS:
            raise ValueError(f"MrcHead: kl_reduction must be one of {KL_REDUCTIONS}, got {kl_reduction!r}")
        self.kl_reduction = kl_reduction
        self.transform = PredictionTransform(hidden_size, eps)
        self.classifier = nn.Linear(hidden_size, num_classes)

    def forward(
        self,
        region_output: torch.Tensor,
        img_masked: torch.Tensor,
        soft_labels: torch.Tensor,
        *,
        kl: bool,
    ) -> MrcOutput:
        """region_output [B, Li, H], img_masked bool [B, Li], soft_labels [B, Li, C+1] (background first)."""
        task = "mrc_kl" if kl else "mrc"
        logits = self.classifier(self.transform(_masked_rows(region_output, img_masked, task))).float()
        target_dist = soft_labels[img_masked].float()
        if target_dist.shape[-1] != logits.shape[-1]:
            raise ValueError(
                f"{task}: soft labels have {target_dist.shape[-1]} classes, the head predicts {logits.shape[-1]}"
            )
        top_object = target_dist[:, BACKGROUND + 1 :].argmax(-1) + BACKGROUND + 1
        log_probs = F.log_softmax(logits, dim=-1)
        if kl:
            terms = F.kl_div(log_probs, target_dist, reduction="none")  # [N, C+1]
            loss = terms.mean() if self.kl_reduction == "mean" else terms.sum(-1).mean()
        else:
            loss = F.nll_loss(log_probs, top_object)
        predicted = logits[:, BACKGROUND + 1 :].argmax(-1) + BACKGROUND + 1
        accuracy = (predicted == top_object).float().mean()
        return MrcOutput(loss=loss, logits=logits, accuracy=accuracy, n_regions=int(img_masked.sum()))
