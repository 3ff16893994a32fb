"""UNITER: text and region embedders feeding one single-stream BERT-style encoder.

The joint sequence is ``[CLS] text [SEP]`` (padded to Lt) followed by the regions (padded to Li);
every position attends to every real position of both modalities, padding is masked out of the
attention keys. Output positions follow the input layout: text first, then regions
(docs/design.md §10).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from model.bert_init import BertInitReport, default_bert_checkpoint, load_bert_weights
from model.config import IMAGE_TYPE, PRESETS, TEXT_TYPE, UniterConfig
from model.dropout import Dropout
from model.layers import Encoder, Pooler, init_bert_weights

__all__ = [
    "IMG_POS_DIM",
    "PRESETS",
    "BertInitReport",
    "ImageEmbeddings",
    "TextEmbeddings",
    "UniterConfig",
    "UniterModel",
    "default_bert_checkpoint",
    "load_bert_weights",
    "load_encoder_state",
]

IMG_POS_DIM = 7  # x1, y1, x2, y2, w, h, w*h, normalized by image size
FEATURE_STD_EPS = 1e-5  # region_feature_norm standardize: a small eps keeps padded (all-zero) rows at zero
BOX_CENTER = 0.5  # region_box_norm center: the middle of the [0, 1] range every box number lies in


class TextEmbeddings(nn.Module):
    """word + position + segment-type embedding, LayerNorm, dropout (BERT's embedder)."""

    def __init__(self, config: UniterConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout)

    def forward(self, input_ids: torch.Tensor, type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids i64 [B, Lt], type_ids i64 [B, Lt] or None (all text type 0) -> [B, Lt, H]."""
        length = input_ids.shape[1]
        if length > self.position_embeddings.num_embeddings:
            raise ValueError(
                f"text length {length} exceeds max_position_embeddings {self.position_embeddings.num_embeddings}"
            )
        positions = torch.arange(length, device=input_ids.device)
        if type_ids is None:
            types = self.token_type_embeddings.weight[TEXT_TYPE]
        else:
            types = self.token_type_embeddings(type_ids)
        emb = self.word_embeddings(input_ids) + self.position_embeddings(positions) + types
        return self.dropout(self.norm(emb))


class ImageEmbeddings(nn.Module):
    """LN(Linear(feature)) + LN(Linear(7-d box)) + type embedding, then LayerNorm and dropout.

    As UNITER's ``UniterImageEmbeddings`` (ChenRocks/UNITER model/model.py): a masked region (MRM)
    has its feature zeroed and a learned mask vector ``mask_embedding`` [D] added in feature space,
    so the encoder sees its box and "a masked region" but not its content.

    ``config.region_feature_norm``:

    - ``none`` (UNITER): the raw detector feature goes into the projection.
    - ``standardize`` (this project's switch): each region's feature vector is first standardized
      over its D dimensions (no parameters). Detector features are non-negative (post-ReLU
      pooling), and Adam's first updates of the projection are close to ``lr * sign(grad)``: with
      inputs that all share one sign, every weight row's update has one sign too, i.e. it adds
      ``u 1^T`` to the weight, which moves every region's projection by ``u * sum(feature)``, the
      same direction for all regions. Centering the input makes ``1^T x = 0``, so that update has
      no effect (measured at lr 3e-4: mean pairwise cosine of an image's regions 0.9+ without it).

    ``config.region_box_norm``:

    - ``none`` (UNITER): the 7 box numbers, all in [0, 1], go into ``pos_proj`` as they are.
    - ``center`` (this project's switch): minus 0.5 first. Non-negative inputs make the random
      projection of every box point nearly the same way (mean pairwise cosine 0.88 after
      ``pos_norm``), so at the start one large, seed-dependent vector is added to every region;
      on the mini world whether ITM is learned at all depended on that draw (docs/decisions.md#box-branch-zero).

    ``config.region_box_start`` (applied by :meth:`init_box_branch`, after the BERT-style init):

    - ``reference`` (UNITER): ``pos_norm``'s gain starts at 1, as every LayerNorm's.
    - ``zero`` (this project's switch): it starts at 0, so the box branch adds nothing at the start
      and grows from zero by gradient (the gain's gradient is nonzero; ``pos_proj``'s follows once
      the gain is). This removes the seed-dependent constant vector above instead of recentring
      it; on the mini world ITM took off on 6 of 6 pretraining seeds with it (docs/decisions.md#box-branch-zero).
    """

    def __init__(self, config: UniterConfig, img_dim: int):
        super().__init__()
        self.img_dim = img_dim
        self.feature_norm = config.region_feature_norm
        self.box_norm = config.region_box_norm
        self.box_start = config.region_box_start
        self.feat_proj = nn.Linear(img_dim, config.hidden_size)
        self.feat_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.pos_proj = nn.Linear(IMG_POS_DIM, config.hidden_size)
        self.pos_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        # UNITER's Embedding(2, D, padding_idx=0): row 0 (unmasked) is always zero, so only row 1 is a
        # parameter; [1, D], a matrix, so AdamW decays it as UNITER's optimizer groups do
        self.mask_embedding = nn.Parameter(torch.empty(1, img_dim).normal_(0.0, config.initializer_range))
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout)

    def init_box_branch(self) -> None:
        """Set the box branch's start as ``config.region_box_start`` says (call after weight init)."""
        if self.box_start == "zero":
            nn.init.zeros_(self.pos_norm.weight)

    def project_input(self, img_feat: torch.Tensor) -> torch.Tensor:
        """[..., D] raw features -> what ``feat_proj`` reads (f32; standardized under ``standardize``)."""
        img_feat = img_feat.float()
        if self.feature_norm == "standardize":  # an all-zero (padded) feature stays zero
            img_feat = F.layer_norm(img_feat, (self.img_dim,), eps=FEATURE_STD_EPS)
        return img_feat

    def forward(
        self,
        img_feat: torch.Tensor,
        img_pos: torch.Tensor,
        type_emb: torch.Tensor,
        img_masked: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """img_feat [B, Li, D], img_pos [B, Li, 7], type_emb [H] or [B, Li, H], img_masked bool [B, Li]."""
        dtype = self.feat_proj.weight.dtype  # features arrive as f32 even when the model runs in bf16
        img_feat = self.project_input(img_feat)
        if img_masked is not None:
            masked = img_masked.unsqueeze(-1)
            img_feat = img_feat.masked_fill(masked, 0.0) + masked * self.mask_embedding.float()
        if self.box_norm == "center":
            img_pos = img_pos - BOX_CENTER
        emb = self.feat_norm(self.feat_proj(img_feat.to(dtype))) + self.pos_norm(self.pos_proj(img_pos.to(dtype)))
        return self.dropout(self.norm(emb + type_emb))


class UniterModel(nn.Module):
    """The UNITER encoder: ``forward`` gives the joint sequence output, ``pool`` the [CLS] vector.

    Args:
        config: encoder shape (``UniterConfig.from_preset``).
        img_dim: region feature size D (2048 for bottom-up-attention features; the image DB's
            ``meta.json`` records it).
    """

    def __init__(self, config: UniterConfig, *, img_dim: int):
        super().__init__()
        self.config = config
        self.img_dim = img_dim
        self.embeddings = TextEmbeddings(config)
        self.img_embeddings = ImageEmbeddings(config, img_dim)
        self.encoder = Encoder(config)
        self.pooler = Pooler(config)
        self.type_sources: dict[int, int] = {}  # segment type -> the type it starts from (grow_type_vocab)
        self.apply(lambda m: init_bert_weights(m, config.initializer_range))
        self.img_embeddings.init_box_branch()

    def forward(
        self,
        input_ids: torch.Tensor,
        txt_mask: torch.Tensor,
        img_feat: torch.Tensor | None = None,
        img_pos: torch.Tensor | None = None,
        img_mask: torch.Tensor | None = None,
        img_masked: torch.Tensor | None = None,
        *,
        txt_type_ids: torch.Tensor | None = None,
        img_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Encode a batch of image-text pairs (or text only when ``img_feat`` is None).

        Args:
            input_ids: i64 [B, Lt], ``[CLS] text [SEP]`` padded with 0.
            txt_mask: bool [B, Lt], True = real token.
            img_feat: f32 [B, Li, D]; img_pos: f32 [B, Li, 7]; img_mask: bool [B, Li], True = real.
            img_masked: bool [B, Li] or None, regions whose features are zeroed (MRM).
            txt_type_ids / img_type_ids: i64 segment ids overriding the defaults (text 0, regions 1),
                e.g. NLVR2-triplet gives the second image type 2.
        Returns:
            sequence output [B, Lt + Li, H]: text positions first, then regions.
        """
        if input_ids.shape != txt_mask.shape:
            raise ValueError(f"input_ids {tuple(input_ids.shape)} and txt_mask {tuple(txt_mask.shape)} differ")
        txt_emb = self.embeddings(input_ids, txt_type_ids)
        if img_feat is None:
            return self.encoder(txt_emb, txt_mask.bool())
        self._check_image_inputs(input_ids, img_feat, img_pos, img_mask)
        if img_type_ids is None:
            type_emb = self.embeddings.token_type_embeddings.weight[IMAGE_TYPE]
        else:
            type_emb = self.embeddings.token_type_embeddings(img_type_ids)
        img_emb = self.img_embeddings(img_feat, img_pos, type_emb, img_masked)
        joint = torch.cat([txt_emb, img_emb.to(txt_emb.dtype)], dim=1)
        key_mask = torch.cat([txt_mask.bool(), img_mask.bool()], dim=1)
        return self.encoder(joint, key_mask)

    def pool(self, sequence_output: torch.Tensor) -> torch.Tensor:
        """[B, L, H] -> [B, H]: tanh(Linear(h_[CLS]))."""
        return self.pooler(sequence_output)

    def grow_type_vocab(self, type_vocab_size: int, *, from_type: int = IMAGE_TYPE) -> None:
        """Give the model ``type_vocab_size`` segment types; the ones beyond BERT's two start as a
        copy of row ``from_type`` (UNITER: NLVR2's second image from the region type 1, VCR's
        answer / rationale types from the text type 0).

        The rule is kept in ``type_sources`` so that loading a checkpoint with fewer types
        (``load_encoder_state``, ``load_bert_weights``) copies the *loaded* source row again.
        """
        old = self.embeddings.token_type_embeddings
        for row in range(2, type_vocab_size):  # BERT's rows 0 and 1 are never derived
            self.type_sources[row] = from_type
        if type_vocab_size > old.num_embeddings:
            new = nn.Embedding(type_vocab_size, old.embedding_dim).to(old.weight.device, old.weight.dtype)
            with torch.no_grad():
                new.weight[: old.num_embeddings] = old.weight
            self.embeddings.token_type_embeddings = new
        self.copy_new_types(old.num_embeddings)

    def copy_new_types(self, loaded_types: int) -> None:
        """Rows ``>= loaded_types`` with a recorded source (``grow_type_vocab``) become copies of it."""
        weight = self.embeddings.token_type_embeddings.weight
        with torch.no_grad():
            for row, source in sorted(self.type_sources.items()):
                if row >= loaded_types and source < loaded_types and row < weight.shape[0]:
                    weight[row] = weight[source]

    def _check_image_inputs(self, input_ids, img_feat, img_pos, img_mask) -> None:
        if img_pos is None or img_mask is None:
            raise ValueError("img_feat was given without img_pos and img_mask")
        b, li, d = img_feat.shape
        if d != self.img_dim:
            raise ValueError(f"img_feat has feature size {d}, but the model was built with img_dim={self.img_dim}")
        if b != input_ids.shape[0]:
            raise ValueError(f"batch size differs: input_ids {input_ids.shape[0]} vs img_feat {b}")
        if img_pos.shape != (b, li, IMG_POS_DIM) or img_mask.shape != (b, li):
            raise ValueError(
                f"expected img_pos [{b}, {li}, {IMG_POS_DIM}] and img_mask [{b}, {li}], "
                f"got {tuple(img_pos.shape)} and {tuple(img_mask.shape)}"
            )


def load_encoder_state(model: nn.Module, state_dict: Mapping[str, torch.Tensor], *, prefix: str = "uniter.") -> None:
    """Copy a pretrained encoder (``state_dict`` of UniterForPretraining, keys ``uniter.*``) into
    ``model.uniter`` of a downstream model; every encoder parameter must be present.

    Segment-type rows the checkpoint lacks are copied from their source row as loaded (the rule
    ``grow_type_vocab`` recorded), others keep their initialization.
    """
    target: UniterModel = model.uniter if hasattr(model, "uniter") else model
    encoder_state = {k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)}
    if not encoder_state:
        raise ValueError(f"load_encoder_state: no key starts with {prefix!r} (first keys: {list(state_dict)[:5]})")
    type_key = "embeddings.token_type_embeddings.weight"
    own_types = target.embeddings.token_type_embeddings.weight
    loaded_types = encoder_state[type_key].shape[0] if type_key in encoder_state else own_types.shape[0]
    if loaded_types < own_types.shape[0]:
        grown = own_types.detach().clone()
        grown[:loaded_types] = encoder_state[type_key]
        encoder_state[type_key] = grown
    missing, unexpected = target.load_state_dict(encoder_state, strict=False)
    if missing or unexpected:
        raise ValueError(f"load_encoder_state: missing keys {missing}, unexpected keys {unexpected}")
    target.copy_new_types(loaded_types)
