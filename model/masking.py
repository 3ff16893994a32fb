"""Conditional (and, for ablation, joint random) masking of one example.

UNITER masks one modality per example: an MLM batch masks text only and every region stays
visible; an MRM batch (mrfr, mrc, mrc_kl) masks regions only and the text stays intact. Prior
single-stream models masked both at once, which can hide a word together with the region it
refers to; ``scheme="joint"`` reproduces that for the ablation.

The datasets call these per example (docs/design.md §10) with their own
``torch.Generator`` so a worker's draws are reproducible. Everything here works on CPU tensors.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

__all__ = [
    "IGNORE_INDEX",
    "REGION_TASKS",
    "TEXT_TASKS",
    "MaskedExample",
    "mask_example",
    "mask_regions",
    "mask_tokens",
]

IGNORE_INDEX = -100  # label value for positions that carry no MLM target (torch CE's default)
TEXT_TASKS = frozenset({"mlm"})
REGION_TASKS = frozenset({"mrfr", "mrc", "mrc_kl"})
UNMASKED_TASKS = frozenset({"itm"})


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
        input_ids: i64 [L] on the CPU (may or may not contain [CLS]/[SEP]; ids in ``special_ids``
            are never selected).
    Returns:
        (masked_ids i64 [L], labels i64 [L]) with labels = the original id where selected and
        ``IGNORE_INDEX`` (-100) elsewhere.
    Raises:
        ValueError: if the example has no non-special token.
    """
    if input_ids.dim() != 1:
        raise ValueError(f"mask_tokens: expected one example's ids of shape [L], got {tuple(input_ids.shape)}")
    ids = input_ids.numpy()
    special = np.array(sorted({int(s) for s in special_ids}), dtype=np.int64)
    candidate = np.ones(ids.shape, dtype=bool)
    for s in special:  # a handful of ids: cheaper than np.isin's set machinery
        candidate &= ids != s
    if not candidate.any():
        raise ValueError(f"mask_tokens: no maskable token in input_ids {ids.tolist()} (all are special ids)")
    # One draw of 3 uniforms per token (selection, fate, replacement id): the loader calls this per
    # example, and a few NumPy ops on them are ~10x cheaper than many small torch ops.
    select_u, fate, replace_u = torch.rand(3, ids.shape[0], generator=generator, dtype=torch.float64).numpy()
    selected = (select_u < mask_prob) & candidate
    if not selected.any():
        # the candidate with the smallest selection uniform: uniform over candidates, no extra draw
        selected[np.flatnonzero(candidate)[select_u[candidate].argmin()]] = True
    labels = np.where(selected, ids, IGNORE_INDEX)
    masked = ids.copy()
    masked[selected & (fate < 0.8)] = mask_token_id
    to_random = selected & (fate >= 0.8) & (fate < 0.9)
    if to_random.any():
        # the r-th allowed id: draw r in [0, V - #special) and step past each excluded id in order
        draws = (replace_u[to_random] * (vocab_size - special.size)).astype(np.int64)
        for s in special:
            draws += draws >= s
        masked[to_random] = draws
    return torch.from_numpy(masked), torch.from_numpy(labels)


def mask_regions(num_regions: int, *, mask_prob: float, generator: torch.Generator) -> torch.Tensor:
    """Select regions to zero and predict (MRM): each with probability ``mask_prob``, at least one.

    Returns:
        bool [num_regions], True = masked.
    Raises:
        ValueError: if ``num_regions`` < 1.
    """
    if num_regions < 1:
        raise ValueError(f"mask_regions: an example needs at least one region to mask, got num_regions={num_regions}")
    u = torch.rand(num_regions, generator=generator)
    masked = u < mask_prob
    if not bool(masked.any()):
        masked[u.argmin()] = True  # uniform over regions, no extra draw
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
