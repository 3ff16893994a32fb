"""Start the region projection where the text side already is: at the detector's class names.

UNITER initializes the image embedder at random (``model.region_init: random``, the ``uniter``
recipe's start), so the BERT-initialized encoder first has to learn a mapping from region features
into its word space before any word can attend to the region that shows it. At full scale that is a small part of 100k+ steps; on a CPU budget of a few hundred steps
it is most of the run. ``class_name_projection`` fits the projection ``feat_proj`` (a Linear
D -> H) by ridge regression so that a region's projection approximates the word embedding of what
the detector says it is: ``sum_c p_c * E[name_c]``, with ``p`` the region's class distribution (the
soft labels the image DBs store for MRC-kl) and ``E[name]`` the mean of the word embeddings of the
name's WordPieces. Nothing else changes: the module, its shape and the training that follows are
the same; only the starting point of one matrix is data-driven (``model.region_init: class_names``,
this project's switch).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["class_name_embeddings", "class_name_projection"]


def class_name_embeddings(word_embeddings: torch.Tensor, name_ids: list[list[int]]) -> torch.Tensor:
    """[C, H]: row c is the mean word embedding of ``name_ids[c]`` (zeros for an empty name, e.g. background).

    word_embeddings: [V, H], the text side's input word embedding matrix.
    name_ids: per class, the WordPiece ids of its name.
    """
    vocab, hidden = word_embeddings.shape
    rows = []
    for ids in name_ids:
        if any(not 0 <= i < vocab for i in ids):
            raise ValueError(f"class_name_embeddings: token ids {ids} outside the vocabulary of {vocab}")
        rows.append(word_embeddings[list(ids)].float().mean(0) if ids else torch.zeros(hidden))
    return torch.stack(rows)


def class_name_projection(features: torch.Tensor, soft_labels: torch.Tensor, name_embeddings: torch.Tensor, *,
                          feature_eps: float | None, ridge: float = 1e-2) -> tuple[torch.Tensor, torch.Tensor]:
    """Ridge fit of ``f(x) @ W.T + b ~= p @ E`` over a sample of regions.

    Args:
        features: [N, D] raw region features; ``f`` is what ``ImageEmbeddings`` feeds its projection:
            the identity (``feature_eps`` None, UNITER's input) or the per-region standardization.
        soft_labels: [N, C] each region's class distribution (rows sum to 1; background included).
        name_embeddings: [C, H] from ``class_name_embeddings``.
        feature_eps: the ``layer_norm`` eps ``ImageEmbeddings`` standardizes with, None: no standardization.
        ridge: L2 penalty relative to the mean feature variance (keeps the fit stable when N ~ D).
    Returns:
        weight [H, D] and bias [H] for ``nn.Linear(D, H)``, in float32.
    """
    if features.ndim != 2 or soft_labels.ndim != 2 or features.shape[0] != soft_labels.shape[0]:
        raise ValueError(f"class_name_projection: features {tuple(features.shape)} and soft_labels "
                         f"{tuple(soft_labels.shape)} must be [N, D] and [N, C] with the same N")
    if soft_labels.shape[1] != name_embeddings.shape[0]:
        raise ValueError(f"class_name_projection: {soft_labels.shape[1]} classes in soft_labels but "
                         f"{name_embeddings.shape[0]} name embeddings")
    x = features.double()
    if feature_eps is not None:
        x = F.layer_norm(x, (features.shape[1],), eps=feature_eps)
    target = soft_labels.double() @ name_embeddings.double()
    x_mean, t_mean = x.mean(0), target.mean(0)
    xc, tc = x - x_mean, target - t_mean
    gram = xc.T @ xc
    penalty = ridge * gram.diagonal().mean().clamp_min(1e-12)
    weight_t = torch.linalg.solve(gram + penalty * torch.eye(gram.shape[0], dtype=gram.dtype), xc.T @ tc)
    bias = t_mean - x_mean @ weight_t
    return weight_t.T.float().contiguous(), bias.float()
