"""NLVR2: is a statement true of a *pair* of images? UNITER's three ways of feeding two images.

- triplet: one sequence ``[CLS] text [SEP] regions(left) regions(right)``. One row per example.
- pair: each image encoded with the text separately; the two pooled vectors are concatenated.
- pair_biattn: as pair, then each side's sequence attends to the other's (bidirectional
  attention), both are attention-pooled and concatenated. The paper's best variant.

In every variant the left image's regions have segment type 1 and the right image's type 2, a
third row started from the region type (UNITER's ``use_img_type``, data/nlvr2.py and
``init_type_embedding`` in model/nlvr2.py); ``image_types=False`` gives both images type 1.

The classifier (``head=``): ``linear`` (UNITER's ``nlvr2_output``: one Linear to the 2 classes) or
``mlp`` (this project's alternative: Linear -> GELU -> LayerNorm -> Linear). pair_biattn's
attention layers, fusion (Linear + ReLU + dropout) and attention pooling (ReLU(Linear) scores,
dropout on the weights) follow the reference's ``UniterForNlvr2PairedAttn``; every dropout here
draws its masks as the encoder's does (:mod:`model.dropout`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from model.config import IMAGE_TYPE, UniterConfig
from model.dropout import Dropout, attention, merge_heads
from model.tasks.common import TaskOutput, UniterTaskModel, answer_mlp, metrics_to_floats

__all__ = ["LEFT_IMAGE_TYPE", "NLVR2_HEADS", "NLVR2_VARIANTS", "RIGHT_IMAGE_TYPE", "UniterForNlvr2"]

NLVR2_VARIANTS = ("triplet", "pair", "pair_biattn")
NLVR2_HEADS = ("linear", "mlp")
LEFT_IMAGE_TYPE, RIGHT_IMAGE_TYPE = IMAGE_TYPE, 2  # the left image's regions keep the region type


class AttentionPool(nn.Module):
    """Softmax-weighted average of positions: [B, L, H] + mask [B, L] -> [B, H]; scores ReLU(Linear(x))."""

    def __init__(self, hidden_size: int, dropout: float):
        super().__init__()
        self.score = nn.Sequential(nn.Linear(hidden_size, 1), nn.ReLU())
        self.dropout = Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        weights = self.score(x).squeeze(-1).masked_fill(~mask, float("-inf")).softmax(-1)
        return torch.einsum("bl,blh->bh", self.dropout(weights), x)


class CrossAttention(nn.MultiheadAttention):
    """``nn.MultiheadAttention`` (batch first; same parameters and state dict) whose attention runs
    through :func:`model.dropout.attention`, so its dropout draws as the encoder's does."""

    def __init__(self, hidden_size: int, num_heads: int, dropout: float):
        super().__init__(hidden_size, num_heads, dropout=dropout, batch_first=True)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,  # type: ignore[override]
                key_padding_mask: torch.Tensor, need_weights: bool = False) -> tuple[torch.Tensor, None]:
        """query [B, Lq, H], key/value [B, Lk, H], key_padding_mask bool [B, Lk] (True = padding)
        -> ([B, Lq, H], None): the attention weights are never returned."""
        if need_weights:
            raise ValueError("CrossAttention does not return attention weights")
        w_q, w_k, w_v = self.in_proj_weight.chunk(3)
        b_q, b_k, b_v = self.in_proj_bias.chunk(3)
        b = query.shape[0]

        def heads(x: torch.Tensor) -> torch.Tensor:  # [B, L, H] -> [B, heads, L, H / heads]
            return x.view(b, -1, self.num_heads, self.head_dim).transpose(1, 2)

        q, k, v = heads(F.linear(query, w_q, b_q)), heads(F.linear(key, w_k, b_k)), heads(F.linear(value, w_v, b_v))
        out = attention(q, k, v, ~key_padding_mask[:, None, None, :], self.dropout if self.training else 0.0)
        return self.out_proj(merge_heads(out)), None


class BiAttention(nn.Module):
    """Left attends to right and right to left; each result is fused with its own sequence."""

    def __init__(self, config: UniterConfig):
        super().__init__()
        h = config.hidden_size
        self.left_to_right = CrossAttention(h, config.num_heads, config.attention_dropout)
        self.right_to_left = CrossAttention(h, config.num_heads, config.attention_dropout)
        self.fuse = nn.Sequential(nn.Linear(2 * h, h), nn.ReLU(), Dropout(config.hidden_dropout))
        self.pool = AttentionPool(h, config.attention_dropout)

    def forward(self, left, right, left_mask, right_mask) -> torch.Tensor:
        """left/right [B, L, H], masks bool [B, L] (True = real) -> [B, 2H]."""
        from_right, _ = self.left_to_right(left, right, right, key_padding_mask=~right_mask, need_weights=False)
        from_left, _ = self.right_to_left(right, left, left, key_padding_mask=~left_mask, need_weights=False)
        left = self.fuse(torch.cat([from_right, left], -1))
        right = self.fuse(torch.cat([from_left, right], -1))
        return torch.cat([self.pool(left, left_mask), self.pool(right, right_mask)], -1)


class UniterForNlvr2(UniterTaskModel):
    """Binary NLVR2 classifier in one of ``NLVR2_VARIANTS``.

    Batch (docs/design.md §10 keys) + ``targets`` i64 [B] (1 = statement true) + with
    ``image_types``, ``img_type_ids`` i64 [rows, Li]: ``LEFT_IMAGE_TYPE`` / ``RIGHT_IMAGE_TYPE``
    per region (padding: any):
    - triplet: B rows; ``img_feat`` holds the left image's regions then the right image's.
    - pair, pair_biattn: 2B rows, row 2i = (text_i, left image), row 2i+1 = (text_i, right image).
    Output logits [B, 2]; loss: CE; metric ``accuracy``.
    """

    def __init__(
        self,
        config: UniterConfig,
        *,
        img_dim: int,
        variant: Literal["triplet", "pair", "pair_biattn"] = "pair_biattn",
        image_types: bool = True,
        head: Literal["linear", "mlp"] = "linear",
    ):
        super().__init__(config, img_dim=img_dim)
        if variant not in NLVR2_VARIANTS:
            raise ValueError(f"unknown NLVR2 variant {variant!r}; expected one of {NLVR2_VARIANTS}")
        if head not in NLVR2_HEADS:
            raise ValueError(f"unknown NLVR2 head {head!r}; expected one of {NLVR2_HEADS}")
        self.variant, self.image_types = variant, image_types
        h, eps = config.hidden_size, config.layer_norm_eps
        if image_types:
            self.uniter.grow_type_vocab(RIGHT_IMAGE_TYPE + 1, from_type=IMAGE_TYPE)
        in_dim = h if variant == "triplet" else 2 * h
        self.head = nn.Linear(in_dim, 2) if head == "linear" else answer_mlp(h, 2, in_dim=in_dim, eps=eps)
        self.biattn = BiAttention(config) if variant == "pair_biattn" else None
        self.init_heads(self.head, *([self.biattn] if self.biattn is not None else []))

    def forward(self, batch: Mapping[str, torch.Tensor]) -> TaskOutput:
        if self.image_types and batch.get("img_type_ids") is None:
            raise KeyError(f"NLVR2 {self.variant} batch lacks 'img_type_ids' (which regions belong to the right image)")
        sequence = self.encode(batch)
        rows = sequence.shape[0]
        if self.variant == "triplet":
            features = self.uniter.pool(sequence)
        else:
            if rows % 2:
                raise ValueError(f"NLVR2 {self.variant} batch needs an even number of rows (left/right), got {rows}")
            if self.variant == "pair":
                features = self.uniter.pool(sequence).view(rows // 2, -1)
            else:
                mask = torch.cat([batch["txt_mask"], batch["img_mask"]], 1).bool()
                features = self.biattn(sequence[0::2], sequence[1::2], mask[0::2], mask[1::2])
        logits = self.head(features)
        targets = batch.get("targets")
        if targets is None:
            return TaskOutput(logits=logits)
        if targets.shape[0] != logits.shape[0]:
            raise ValueError(f"NLVR2 {self.variant}: {targets.shape[0]} targets for {logits.shape[0]} examples")
        loss = F.cross_entropy(logits.float(), targets)
        accuracy = (logits.argmax(-1) == targets).float().mean()
        metrics = metrics_to_floats({"loss": loss, "accuracy": accuracy}, n_examples=targets.shape[0])
        return TaskOutput(logits=logits, loss=loss, metrics=metrics)
