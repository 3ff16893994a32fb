"""All-pairs retrieval evaluation in bounded memory: Recall@K both ways from streamed score blocks.

Scoring every (text, image) pair is unavoidable (T x I model calls' worth of rows), but storing
the T x I score matrix, or the inputs of all pairs, is not: blocks of ``text_block x
image_block`` pairs are scored one at a time and folded into a running top-K per text (its best
images) and per image (its best texts). Memory is O((T + I) K + block), whatever T and I are.

Ties are broken toward the lower candidate index (exactly, see :func:`rank_keys`), so results are
deterministic.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

RECALL_KS = (1, 5, 10)

ScoreFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


_LOW32 = (1 << 32) - 1


def rank_keys(scores: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """One int64 per (score, candidate id) whose order is: higher score first, then lower id.

    The float32 bits are mapped to an integer with the same order (negative floats flipped), shifted
    up 32 bits, and the low 32 bits hold ``2^32 - 1 - id``. ``topk`` on these keys is an exact,
    deterministic top-k (no sort of whole rows, ties to the lower id).
    """
    bits = scores.float().contiguous().view(torch.int32).to(torch.int64)
    ordered = torch.where(bits >= 0, bits, -(1 << 31) - bits)
    return ordered * (1 << 32) + (_LOW32 - index)


def key_ids(keys: torch.Tensor) -> torch.Tensor:
    """The candidate ids back from :func:`rank_keys`."""
    return _LOW32 - (keys & _LOW32)


def _top(keys: torch.Tensor, k: int) -> torch.Tensor:
    return keys.topk(min(k, keys.shape[1]), dim=1, sorted=True).values


def streaming_topk(score_block: ScoreFn, n_texts: int, n_images: int, *, text_block: int, image_block: int,
                   k: int = max(RECALL_KS)) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Top-``k`` images of every text and top-``k`` texts of every image, scoring blocks of pairs.

    Args:
        score_block: ``(text_ids i64 [t], image_ids i64 [i]) -> scores f32 [t, i]``; never called
            with more than ``text_block * image_block`` pairs.
    Returns:
        (images of each text i64 [T, min(k, I)], texts of each image i64 [I, min(k, T)], the largest
        number of pairs scored in one call).
    """
    kt, ki = min(k, n_images), min(k, n_texts)
    text_keys = torch.zeros((n_texts, 0), dtype=torch.int64)
    image_ids = torch.zeros((n_images, ki), dtype=torch.long)
    all_texts = torch.arange(n_texts)
    largest = 0
    for i0 in range(0, n_images, image_block):
        images = torch.arange(i0, min(i0 + image_block, n_images))
        blocks = []
        for t0 in range(0, n_texts, text_block):
            texts = all_texts[t0:t0 + text_block]
            scores = score_block(texts, images).float().cpu()
            if scores.shape != (len(texts), len(images)):
                raise ValueError(f"score_block returned {tuple(scores.shape)}, expected {(len(texts), len(images))}")
            largest = max(largest, scores.numel())
            blocks.append(scores)
        column = torch.cat(blocks, dim=0)  # [T, images of this block]: linear in T
        text_keys = _top(torch.cat([text_keys, rank_keys(column, images.expand(n_texts, -1))], dim=1), kt)
        # these images have now met every text: their top-k is final
        image_ids[images] = key_ids(_top(rank_keys(column.T, all_texts.expand(len(images), -1)), ki))
    return key_ids(text_keys), image_ids, largest


def query_hits(top: torch.Tensor, relevant: Sequence[set[int]], k: int) -> list[float]:
    """Per query (row of ``top`` [queries, >= k]): 1.0 when a relevant candidate is in its top K, else 0.0."""
    return [float(any(c in rel for c in row[:k])) for row, rel in zip(top.tolist(), relevant)]


def recall_at_k(top: torch.Tensor, relevant: Sequence[set[int]], ks: Sequence[int] = RECALL_KS) -> dict[str, float]:
    """Percent of queries with a relevant candidate in their top K, for each K (K beyond the
    candidate count counts every candidate)."""
    n = len(relevant)
    return {f"r{k}": round(100.0 * sum(query_hits(top, relevant, k)) / n, 4) if n else 0.0 for k in ks}


def chance_recall(n_candidates: int, relevant_counts: Sequence[int], ks: Sequence[int] = RECALL_KS) -> dict[str, float]:
    """Expected Recall@K (percent) of a uniformly random ranking: 1 - C(n - g, K) / C(n, K) per query."""
    out = {}
    for k in ks:
        total = 0.0
        for g in relevant_counts:
            kk = min(k, n_candidates)
            total += 1.0 - math.comb(n_candidates - g, kk) / math.comb(n_candidates, kk)
        out[f"r{k}"] = round(100.0 * total / len(relevant_counts), 4) if relevant_counts else 0.0
    return out
