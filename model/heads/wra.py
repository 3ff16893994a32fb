"""Word-region alignment: optimal transport between contextual word and region outputs.

For each pair, words and regions are uniform distributions over their encoder outputs; their OT
distance under the cosine cost (model/ot.py, IPOT) is small when every word has a close region
and vice versa. WRA lowers it for matched pairs and raises it for mismatched ones; the loss is
added to ITM's with a weight.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from model.ot import IPOT_BETA, IPOT_INNER_STEPS, IPOT_ITERATIONS, ot_distance

__all__ = ["WRA_WORDS", "WraOutput", "word_positions", "word_region_alignment"]

# which text positions are WRA's words: every real one, [CLS] and [SEP] included (UNITER: its OT
# text padding mask is the text length with both, data/itm.py ``itm_ot_collate``), or only the
# tokens between them
WRA_WORDS = ("all", "content")


@dataclass
class WraOutput:
    """loss: sum(+d over positives, -d over negatives) / B (UNITER's form);
    distances [B]: OT distance per pair; plan [B, n_words_padded, Li] when requested, else None."""

    loss: torch.Tensor
    distances: torch.Tensor
    plan: torch.Tensor | None
    mean_pos: torch.Tensor  # 0-d, nan when the batch has no positive
    mean_neg: torch.Tensor


def word_positions(txt_mask: torch.Tensor, words: str = "all") -> torch.Tensor:
    """bool [B, Lt]: the real text positions (``all``), or those minus [CLS] (first) and [SEP]
    (last real token) (``content``)."""
    if words not in WRA_WORDS:
        raise ValueError(f"word_positions: words must be one of {WRA_WORDS}, got {words!r}")
    if words == "all":
        return txt_mask.bool().clone()
    words = txt_mask.bool().clone()
    words[:, 0] = False
    last = txt_mask.long().sum(1) - 1
    words[torch.arange(words.shape[0], device=words.device), last.clamp_min(0)] = False
    return words


def word_region_alignment(
    text_output: torch.Tensor,
    region_output: torch.Tensor,
    txt_mask: torch.Tensor,
    img_mask: torch.Tensor,
    itm_targets: torch.Tensor,
    *,
    beta: float = IPOT_BETA,
    iterations: int = IPOT_ITERATIONS,
    inner_steps: int = IPOT_INNER_STEPS,
    words: str = "all",
    return_plan: bool = False,
) -> WraOutput:
    """WRA loss for a batch of matched (target 1) and mismatched (target 0) pairs.

    Args:
        text_output [B, Lt, H], region_output [B, Li, H]: encoder outputs split by modality.
        txt_mask bool [B, Lt] (``[CLS] text [SEP]`` real positions), img_mask bool [B, Li].
        itm_targets i64 [B].
        words: ``all`` (UNITER) or ``content`` (``word_positions``).
    """
    word_mask = word_positions(txt_mask, words)
    distances, plan = ot_distance(
        text_output, region_output, word_mask, img_mask.bool(), beta=beta, iterations=iterations, inner_steps=inner_steps
    )
    positive = itm_targets == 1
    sign = positive.float() * 2.0 - 1.0
    loss = (sign * distances).sum() / distances.shape[0]
    with torch.no_grad():  # no .item() here: the caller syncs once for all metrics
        d, pos = distances.detach(), positive.float()
        mean_pos = (d * pos).sum() / pos.sum()
        mean_neg = (d * (1 - pos)).sum() / (1 - pos).sum()
    return WraOutput(
        loss=loss, distances=distances, plan=plan if return_plan else None, mean_pos=mean_pos, mean_neg=mean_neg
    )
