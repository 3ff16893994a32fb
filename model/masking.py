"""Conditional (and, for ablation, joint random) masking of one example.

UNITER masks one modality per example: an MLM batch masks text only and every region stays
visible; an MRM batch (mrfr, mrc, mrc_kl) masks regions only and the text stays intact. Prior
single-stream models masked both at once, which can hide a word together with the region it
refers to; ``scheme="joint"`` reproduces that for the ablation.

The datasets call these per example (docs/contracts.md section 6) with their own
``torch.Generator`` so a worker's draws are reproducible. Everything here works on CPU tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Literal

import torch

__all__ = [
    "IGNORE_INDEX",
    "TEXT_TASKS",
    "REGION_TASKS",
    "MaskedExample",
    "mask_tokens",
    "mask_regions",
    "mask_example",
]

IGNORE_INDEX = -100  # label value for positions that carry no MLM target (torch CE's default)
TEXT_TASKS = frozenset({"mlm"})
REGION_TASKS = frozenset({"mrfr", "mrc", "mrc_kl"})
UNMASKED_TASKS = frozenset({"itm"})


def _random_non_special(n: int, vocab_size: int, special: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """``n`` ids drawn uniformly from ``[0, vocab_size)`` minus the sorted ids in ``special``."""
    draws = torch.randint(0, vocab_size - special.numel(), (n,), generator=generator)
    # Shift past each excluded id in ascending order: the draw r becomes the r-th allowed id.
    for s in special.tolist():
        draws += (draws >= s).long()
    return draws


def mask_tokens(
    input_ids: torch.Tensor,
    *,
    mask_prob: float,
    vocab_size: int,
    mask_token_id: int,
    special_ids: Iterable[int],
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT masking of one example's WordPiece ids.

    Each non-special token is selected with probability ``mask_prob``; a selected token becomes
    [MASK] (80%), a random non-special id (10%) or stays itself (10%). If no token was selected,
    one non-special token is selected uniformly, so every MLM example has a target.

    Args:
        input_ids: i64 [L] (may or may not contain [CLS]/[SEP]; ids in ``special_ids`` are never
            selected).
    Returns:
        (masked_ids i64 [L], labels i64 [L]) with labels = the original id where selected and
        ``IGNORE_INDEX`` (-100) elsewhere.
    Raises:
        ValueError: if the example has no non-special token.
    """
    if input_ids.dim() != 1:
        raise ValueError(f"mask_tokens: expected one example's ids of shape [L], got {tuple(input_ids.shape)}")
    special = torch.tensor(sorted(set(int(s) for s in special_ids)), dtype=torch.long)
    candidate = ~torch.isin(input_ids, special)
    n_candidates = int(candidate.sum())
    if n_candidates == 0:
        raise ValueError(f"mask_tokens: no maskable token in input_ids {input_ids.tolist()} (all are special ids)")

    selected = (torch.rand(input_ids.shape, generator=generator) < mask_prob) & candidate
    if not bool(selected.any()):
        pick = torch.randint(0, n_candidates, (1,), generator=generator)
        selected[candidate.nonzero().squeeze(1)[pick]] = True

    labels = torch.full_like(input_ids, IGNORE_INDEX)
    labels[selected] = input_ids[selected]

    # One uniform per selected token decides its fate: [0, .8) mask, [.8, .9) random, [.9, 1) keep.
    fate = torch.rand(int(selected.sum()), generator=generator)
    masked_ids = input_ids.clone()
    positions = selected.nonzero().squeeze(1)
    to_mask = positions[fate < 0.8]
    to_random = positions[(fate >= 0.8) & (fate < 0.9)]
    masked_ids[to_mask] = mask_token_id
    if to_random.numel():
        masked_ids[to_random] = _random_non_special(to_random.numel(), vocab_size, special, generator)
    return masked_ids, labels


def mask_regions(num_regions: int, *, mask_prob: float, generator: torch.Generator) -> torch.Tensor:
    """Select regions to zero and predict (MRM): each with probability ``mask_prob``, at least one.

    Returns:
        bool [num_regions], True = masked.
    Raises:
        ValueError: if ``num_regions`` < 1.
    """
    if num_regions < 1:
        raise ValueError(f"mask_regions: an example needs at least one region to mask, got num_regions={num_regions}")
    masked = torch.rand(num_regions, generator=generator) < mask_prob
    if not bool(masked.any()):
        masked[torch.randint(0, num_regions, (1,), generator=generator)] = True
    return masked


@dataclass(frozen=True)
class MaskedExample:
    """One example after masking: ``input_ids`` i64 [L], ``txt_labels`` i64 [L], ``img_masked`` bool [n]."""

    input_ids: torch.Tensor
    txt_labels: torch.Tensor
    img_masked: torch.Tensor


def mask_example(
    input_ids: torch.Tensor,
    num_regions: int,
    *,
    task: str,
    scheme: Literal["conditional", "joint"],
    mask_prob: float,
    vocab_size: int,
    mask_token_id: int,
    special_ids: Iterable[int],
    generator: torch.Generator,
) -> MaskedExample:
    """Mask one example for a pretraining ``task`` under a masking ``scheme``.

    conditional: mlm masks text only, mrfr/mrc/mrc_kl mask regions only, itm masks nothing.
    joint (ablation): every masked task masks both modalities independently (each at
    ``mask_prob``, at least one element each, so the task's own loss always has targets);
    itm still masks nothing.
    """
    special_ids = tuple(special_ids)
    no_labels = torch.full_like(input_ids, IGNORE_INDEX)
    no_regions = torch.zeros(num_regions, dtype=torch.bool)
    if task in UNMASKED_TASKS:
        return MaskedExample(input_ids.clone(), no_labels, no_regions)
    if task not in TEXT_TASKS | REGION_TASKS:
        raise ValueError(f"mask_example: unknown task {task!r}; expected one of mlm, mrfr, mrc, mrc_kl, itm")
    if scheme not in ("conditional", "joint"):
        raise ValueError(f"mask_example: unknown masking scheme {scheme!r}; expected conditional or joint")

    mask_text = task in TEXT_TASKS or scheme == "joint"
    mask_image = task in REGION_TASKS or scheme == "joint"
    ids, labels = input_ids.clone(), no_labels
    if mask_text:
        ids, labels = mask_tokens(
            input_ids,
            mask_prob=mask_prob,
            vocab_size=vocab_size,
            mask_token_id=mask_token_id,
            special_ids=special_ids,
            generator=generator,
        )
    img_masked = mask_regions(num_regions, mask_prob=mask_prob, generator=generator) if mask_image else no_regions
    return MaskedExample(ids, labels, img_masked)
