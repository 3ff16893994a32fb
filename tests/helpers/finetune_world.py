"""A small world to fine-tune in: build_dbs' synthetic test world, its real DBs, and pretraining exports.

By default the VQA and VCR test splits are labelled, as the mini world's evaluation-server files make
them; ``world(..., test_labels=False)`` builds the real-data case, where they are not.

The exports (``data/models/pretrain`` and ``pretrain_vcr``) are real ``UniterForPretraining``
weights in the format the pretraining stages write (``pipeline.training.model_io``), with the tiny
preset; their values are from a seeded initialization, not a pretraining run (the pretraining
stage has its own tests), which keeps this world fast to build. Built once per test session.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from helpers.dbs_synthetic import ROOT, params_for, write_world

# build_dbs settings the synthetic world needs: every VQA answer in the vocabulary, VCR texts that fit
# the tiny model's 128 positions
DB_OVERRIDES = ("build_dbs.vqa_min_answer_count=1", "build_dbs.max_txt_len_vcr=100")
FAST = ("model.preset=tiny", "model.init_from_bert=false", "finetune.scratch_init=random", "finetune.val_batches=1",
        "finetune.log_every=1", "finetune.val_every=0", "finetune.eval_batch_tokens=2000",
        "finetune.retrieval_neg_pool=3", "finetune.retrieval_hard_negatives=2", "finetune.compare_scratch=false",
        "finetune.scratch_per_task={}",  # a test's budget() holds for both starts (not params.yaml's scratch budgets)
        *DB_OVERRIDES)

_BUILT: dict[bool, Path] = {}


def budget(task: str, steps: int = 3, lr: float = 1e-3, batch_tokens: int = 600) -> str:
    return f"finetune.per_task.{task}={{steps: {steps}, lr: {lr}, batch_tokens: {batch_tokens}, warmup_steps: 1}}"


def ft_params(data: Path, *overrides: str):
    return params_for(data, *FAST, *overrides)


def write_export(data: Path, name: str, *, seed: int) -> Path:
    """``data/models/<name>/``: a tiny UniterForPretraining as the pretraining stages export it."""
    from pipeline.common.runinfo import atomic_write_json
    from pipeline.stores.readers import ImageDbGroup, TextDb
    from pipeline.training.checkpointing import save_safetensors
    from pipeline.training.model_io import CONFIG_FILE, MODEL_FILE, build_model, model_json, spec_from_params

    params = ft_params(data)
    txt = TextDb(data / "db" / "txt" / "vcr_qa_train")
    img = ImageDbGroup(data / "db" / "img", ["coco", "vcr"])
    vocab = int(txt.meta["vocab_size"]) + int(txt.meta.get("obj_tags", {}).get("extra_vocab", 0))
    spec = spec_from_params(params.model, vocab_size=vocab, img_dim=img.feature_dim, num_classes=img.num_classes,
                            wra_weight=0.0)
    model = build_model(spec, bert_checkpoint=None, init_from_bert=False, seed=seed)
    out = data / "models" / name
    out.mkdir(parents=True, exist_ok=True)
    save_safetensors(model.state_dict(), out / MODEL_FILE)
    atomic_write_json(out / CONFIG_FILE, model_json(spec, txt.meta, stage=name, steps=0))
    return out


def build(root: Path, *, test_labels: bool = True) -> Path:
    """Synthetic manifests and features -> the real build_dbs stage -> two exports, under ``root/data``."""
    from pipeline.stores.build_dbs import run as build_dbs

    data = root / "data"
    write_world(data, test_labels=test_labels)
    build_dbs(params_for(data, *DB_OVERRIDES))
    write_export(data, "pretrain", seed=1)
    write_export(data, "pretrain_vcr", seed=2)
    return data


def world(tmp_path_factory, *, test_labels: bool = True) -> Path:
    """The session's world (built on first use), copied to a fresh directory for the caller."""
    if test_labels not in _BUILT:
        _BUILT[test_labels] = build(tmp_path_factory.mktemp("finetune_world"), test_labels=test_labels)
    copy = tmp_path_factory.mktemp("finetune") / "data"
    shutil.copytree(_BUILT[test_labels], copy)
    return copy


__all__ = ["ROOT", "FAST", "budget", "ft_params", "world", "write_export"]
