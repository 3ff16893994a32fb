"""Building the pretraining model from params, and reading / writing its exported form.

An exported model is a directory with ``model.safetensors`` (the full ``UniterForPretraining``
state dict in fp32: ``uniter.*`` encoder keys plus the ``mlm.*``, ``mrfr.*``, ``mrc.*``, ``itm.*``
heads; downstream tasks load ``uniter.*`` with ``model.uniter.load_encoder_state``) and
``model_config.json`` (what it takes to rebuild it: encoder shape, image feature size, detector
classes, tokenizer).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any, Mapping

import torch

from model.config import UniterConfig
from model.pretraining import UniterForPretraining

log = logging.getLogger(__name__)

MODEL_FILE = "model.safetensors"
CONFIG_FILE = "model_config.json"


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """Everything that fixes the model's parameter shapes (and its loss settings: WRA, MRC-kl)."""

    config: UniterConfig
    img_dim: int
    num_classes: int
    wra_weight: float
    mrc_kl_reduction: str = "mean"  # pretrain.mrc_kl_reduction
    wra_words: str = "all"  # pretrain.wra_words

    def to_json(self, **extra: Any) -> dict[str, Any]:
        return {"uniter_config": dataclasses.asdict(self.config), "img_dim": self.img_dim,
                "num_classes": self.num_classes, "wra_weight": self.wra_weight,
                "mrc_kl_reduction": self.mrc_kl_reduction, "wra_words": self.wra_words, **extra}

    def losses(self) -> dict[str, Any]:
        """UniterForPretraining's loss keyword arguments."""
        return {"wra_weight": self.wra_weight, "mrc_kl_reduction": self.mrc_kl_reduction, "wra_words": self.wra_words}


def spec_from_params(model_cfg, *, vocab_size: int, img_dim: int, num_classes: int, wra_weight: float,
                     mrc_kl_reduction: str = "mean", wra_words: str = "all") -> ModelSpec:
    """The ``model:`` preset with the vocabulary of the text DBs and the sizes of the image DBs."""
    config = UniterConfig.from_preset(model_cfg.preset, dropout=model_cfg.dropout, vocab_size=vocab_size,
                                      region_feature_norm=model_cfg.region_feature_norm,
                                      region_box_norm=model_cfg.region_box_norm,
                                      region_box_start=model_cfg.region_box_start,
                                      pooler_start=model_cfg.pooler_start)
    return ModelSpec(config=config, img_dim=img_dim, num_classes=num_classes, wra_weight=wra_weight,
                     mrc_kl_reduction=mrc_kl_reduction, wra_words=wra_words)


def build_model(spec: ModelSpec, *, bert_checkpoint: Path | None, init_from_bert: bool, seed: int,
                itm_init_std: float | None = None) -> UniterForPretraining:
    """A fresh model (same weights on every rank for the same seed), text side from BERT if asked;
    ``itm_init_std`` (pretrain.itm_init_std, a start only, so not in the spec) as UniterForPretraining's."""
    from model.bert_init import load_bert_weights

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = UniterForPretraining(spec.config, img_dim=spec.img_dim, num_classes=spec.num_classes,
                                     itm_init_std=itm_init_std, **spec.losses())
    if init_from_bert:
        from pipeline.common.hf_cache import resolve_bert_checkpoint  # a hub id -> its cached weights file

        report = load_bert_weights(model, resolve_bert_checkpoint(bert_checkpoint))
        log.info("text side initialized from %s (%d tensors)", report.path, len(report.loaded))
    return model


def read_exported(directory: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(model_config.json, state dict) of an exported model directory."""
    from safetensors.torch import load_file

    config_file, model_file = directory / CONFIG_FILE, directory / MODEL_FILE
    for f in (config_file, model_file):
        if not f.exists():
            raise FileNotFoundError(f"{f} not found: run the first pretraining stage (`pretrain`) before this one")
    return json.loads(config_file.read_text()), load_file(str(model_file))


def model_from_export(directory: Path, *, vocab_size: int, img_dim: int, num_classes: int,
                      dropout: float | None = None, mrc_kl_reduction: str | None = None
                      ) -> tuple[UniterForPretraining, ModelSpec]:
    """Rebuild an exported model, growing the word embeddings when ``vocab_size`` is larger (new
    rows, e.g. VCR object tags beyond the vocabulary, keep their fresh initialization).
    ``mrc_kl_reduction`` (a loss setting, not a weight) replaces the export's when given.

    Raises ValueError naming the file when the image feature size or the class count differ.
    """
    meta, state = read_exported(directory)
    if (meta["img_dim"], meta["num_classes"]) != (img_dim, num_classes):
        raise ValueError(f"{directory / CONFIG_FILE}: model has img_dim={meta['img_dim']}, "
                         f"num_classes={meta['num_classes']}; the image DBs have {img_dim}, {num_classes}")
    cfg = dict(meta["uniter_config"])
    if cfg["vocab_size"] > vocab_size:
        raise ValueError(f"{directory / CONFIG_FILE}: vocabulary {cfg['vocab_size']} is larger than the "
                         f"text DBs' {vocab_size} (different tokenizer?)")
    old_vocab = cfg["vocab_size"]
    cfg["vocab_size"] = vocab_size
    if dropout is not None:
        cfg.update(hidden_dropout=dropout, attention_dropout=dropout)
    spec = ModelSpec(config=UniterConfig(**cfg), img_dim=img_dim, num_classes=num_classes,
                     wra_weight=float(meta["wra_weight"]),
                     mrc_kl_reduction=mrc_kl_reduction or meta.get("mrc_kl_reduction", "mean"),
                     wra_words=meta.get("wra_words", "all"))
    model = UniterForPretraining(spec.config, img_dim=img_dim, num_classes=num_classes, **spec.losses())
    own = model.state_dict()
    for key, value in state.items():
        if key in own and value.shape != own[key].shape and value.shape[0] == old_vocab < own[key].shape[0]:
            grown = own[key].clone()
            grown[:old_vocab] = value
            state[key] = grown
    model.load_state_dict(state, strict=True)
    return model, spec


def model_json(spec: ModelSpec, txt_meta: Mapping[str, Any], **extra: Any) -> dict[str, Any]:
    """``model_config.json``: the spec plus the tokenizer the vocabulary belongs to."""
    tokenizer = {k: txt_meta[k] for k in ("tokenizer", "tokenizer_sha256", "vocab_size", "special_ids")
                 if k in txt_meta}
    return spec.to_json(tokenizer=tokenizer, **extra)
