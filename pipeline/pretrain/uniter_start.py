"""The first pretraining stage started from a UNITER release file (``model.uniter_checkpoint``).

The file takes the place of BERT's text side and the random image side: every encoder weight and
every head the run needs come from it (:func:`model.uniter_format.load_uniter_state`). With
``pretrain.steps: 0`` the stage trains nothing and its export is the file's model, which is how
fine-tuning (``finetune@<task>``) and the VCR second stage (``pretrain_vcr``) start from a release
file; with steps it is continued pretraining. Everything is checked before the stage writes:
the pinned digest, the preset (``base`` 768x12, ``large`` 1024x24), the vocabulary of the text
DBs' tokenizer, the image feature size, what the encoder computes (UNITER's file: no feature
standardisation, no box centring) and every key.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from model.config import PRESETS
from model.uniter_format import ImportReport, UniterFormatError, load_uniter_state
from pipeline.params.parser import Params
from pipeline.pretrain.plan import StagePlan

log = logging.getLogger(__name__)

# the head each pretraining task trains (model/pretraining.py attribute names)
TASK_HEADS = {"mlm": "mlm", "mrfr": "mrfr", "mrc": "mrc", "mrc_kl": "mrc", "itm": "itm"}
# fine-tuning tasks that start a head from a pretraining head (retrieval's scorer from ITM's)
FINETUNE_HEADS = {"retrieval_flickr": "itm"}


@dataclass
class UniterStart:
    """A model built from a release file, and what the run records of it."""

    model: Any  # UniterForPretraining
    spec: Any  # model_io.ModelSpec
    report: ImportReport
    record: dict[str, Any]  # _run.json / model_config.json ``uniter_checkpoint``


def needed_heads(params: Params, plan: StagePlan) -> set[str]:
    """Heads the run trains (tasks with a ratio > 0, when it trains) or a fine-tuning task starts from."""
    heads = {TASK_HEADS[t] for t, r in plan.mix_ratio.items() if r > 0} if plan.steps else set()
    return heads | {FINETUNE_HEADS[t] for t in params.finetune.tasks if t in FINETUNE_HEADS}


def _check_fit(params: Params, release, *, vocab_size: int, tokenizer: str, img_dim: int) -> None:
    """UniterFormatError naming the file, the params key and both values for each thing that differs."""
    path, shape, model = release.path, release.shape, params.model
    problems = []
    preset = PRESETS[model.preset]
    if (shape.hidden_size, shape.num_layers) != (preset.hidden_size, preset.num_layers):
        hint = f": set model.preset={shape.preset}" if shape.preset else ""
        problems.append(f"it is a {shape.preset or 'non-preset'} model ({shape.hidden_size} x {shape.num_layers} "
                        f"layers), but model.preset is {model.preset} ({preset.hidden_size} x "
                        f"{preset.num_layers}){hint}")
    if shape.vocab_size != vocab_size:
        problems.append(f"its word embeddings have {shape.vocab_size} rows, but the text DBs' tokenizer ({tokenizer}) "
                        f"has {vocab_size} words: build the text DBs with the tokenizer the checkpoint was trained "
                        "with (UNITER: bert-base-cased, 28,996 words; build_dbs.tokenizer)")
    if shape.img_dim != img_dim:
        problems.append(f"its image projection reads {shape.img_dim}-d features, the image DBs hold {img_dim}-d ones")
    for key, value in release.forward_settings().items():
        ours = getattr(model, key)
        if ours != value:
            origin = "its export notes" if release.notes else "UNITER's model"
            problems.append(f"its weights were trained with {key}={value} ({origin}), but model.{key} is {ours}: "
                            f"set model.{key}={value} (or pretrain.recipe=uniter)")
    if problems:
        raise UniterFormatError(f"model.uniter_checkpoint {path}: " + "; ".join(problems))


def uniter_start(params: Params, plan: StagePlan, train_dbs: list[Any], img_dbs) -> UniterStart:
    """Build ``UniterForPretraining`` from params' preset and load the release file into it.

    Raises UniterFormatError (exit status 2) for a file that does not fit; nothing is written.
    """
    from model.pretraining import UniterForPretraining
    from pipeline.training.model_io import spec_from_params
    from pipeline.training.uniter_ckpt import read_release

    model_cfg, cfg = params.model, params.pretrain
    try:
        release = read_release(model_cfg.uniter_checkpoint, sha256=model_cfg.uniter_checkpoint_sha256)
    except UniterFormatError as err:
        raise UniterFormatError(f"model.uniter_checkpoint {err}") from None
    meta = train_dbs[0].meta
    vocab = int(meta["vocab_size"]) + int(meta.get("obj_tags", {}).get("extra_vocab", 0))
    _check_fit(params, release, vocab_size=vocab, tokenizer=str(meta.get("tokenizer", "not recorded")),
               img_dim=img_dbs.feature_dim)
    spec = spec_from_params(model_cfg, vocab_size=vocab, img_dim=img_dbs.feature_dim, num_classes=img_dbs.num_classes,
                            wra_weight=cfg.wra_weight if cfg.wra else 0.0, mrc_kl_reduction=cfg.mrc_kl_reduction,
                            wra_words=cfg.wra_words)
    model = UniterForPretraining(spec.config, img_dim=spec.img_dim, num_classes=spec.num_classes, **spec.losses())
    report = load_uniter_state(model, release.state, needs=needed_heads(params, plan),
                               source=f"model.uniter_checkpoint {release.path}")
    record = {"path": str(release.path), "sha256": release.sha256, "dtypes": list(release.dtypes),
              "shape": release.shape.describe(), "exported_by_this_project": release.notes is not None,
              **report.to_json()}
    log.info("%s: started from %s (sha256 %s, %s): heads %s loaded, %s skipped", plan.stage, release.path,
             release.sha256[:12], ", ".join(release.dtypes), report.loaded_heads or "none",
             report.skipped_heads or "none")
    return UniterStart(model=model, spec=spec, report=report, record=record)
