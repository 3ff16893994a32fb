"""``model.region_init: class_names``: fit the region projection from the image DBs before training.

Reads a deterministic sample of regions (features and soft labels) from the image DBs a stage
trains on, the detector's class names from their ``meta.json`` and the text DBs' tokenizer, and
sets ``img_embeddings.feat_proj`` to ``model.region_init.class_name_projection`` of them.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

import numpy as np
import torch

from model.region_init import class_name_embeddings, class_name_projection

log = logging.getLogger(__name__)

BACKGROUND = "__background__"


def shared_class_names(img_dbs) -> list[str]:
    """The class names (background first) every image DB of the group agrees on."""
    names = {tuple(db.meta.get("class_names") or ()) for db in img_dbs.dbs.values()}
    if len(names) != 1 or not next(iter(names)):
        raise ValueError(f"model.region_init=class_names needs one list of class_names in the meta.json of every "
                         f"image DB under {img_dbs.root}; found {len(names)} different lists")
    return list(names.pop())


def training_image_keys(txt_dbs) -> list[str]:
    """Sorted ``<image db>/<image id>`` of every image the examples of ``txt_dbs`` show (their
    txt2img): the pretraining training images, when given the pretraining train text DBs."""
    return sorted({key for db in txt_dbs for keys in db.txt2img.values() for key in keys})


def sample_regions(img_dbs, *, image_keys: list[str], max_images: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Features [N, D] and soft labels [N, C] of every region of up to ``max_images`` images, drawn
    without replacement by ``seed`` from ``image_keys`` (``<image db>/<image id>``, sorted).

    Only the images given are read: pretraining passes its training images, so no eval image
    (whose DB may be the same, e.g. COCO) shapes the start of any model."""
    keys = list(image_keys)
    if not keys:
        raise ValueError(f"region projection fit: no images to sample from (image DBs under {img_dbs.root})")
    rng = np.random.default_rng(seed)
    picked = sorted(rng.choice(len(keys), size=min(max_images, len(keys)), replace=False).tolist())
    feats, labels = [], []
    for k in picked:
        record = img_dbs[keys[k]]
        feats.append(np.asarray(record["features"], dtype=np.float32))
        labels.append(np.asarray(record["soft_labels"], dtype=np.float32))
    return torch.from_numpy(np.concatenate(feats)), torch.from_numpy(np.concatenate(labels))


def init_region_projection(uniter: torch.nn.Module, img_dbs, txt_meta: Mapping[str, Any], *, image_keys: list[str],
                           max_images: int, seed: int) -> dict[str, Any]:
    """Set ``uniter.img_embeddings.feat_proj`` from the class names; returns what was fitted (for logs/records)."""
    from pipeline.stores.tokenization import WordPieceTokenizer

    names = shared_class_names(img_dbs)
    tokenizer = WordPieceTokenizer(txt_meta.get("tokenizer"))
    name_ids = [[] if n == BACKGROUND else tokenizer.encode(n) for n in names]
    features, soft = sample_regions(img_dbs, image_keys=image_keys, max_images=max_images, seed=seed)
    if soft.shape[1] != len(names):
        raise ValueError(f"image DBs under {img_dbs.root}: soft labels have {soft.shape[1]} classes, "
                         f"meta.json names {len(names)}")
    from model.uniter import FEATURE_STD_EPS

    embedder = uniter.img_embeddings
    proj = embedder.feat_proj
    # fitted on what the projection reads: raw features, or standardized ones (model.region_feature_norm)
    eps = FEATURE_STD_EPS if embedder.feature_norm == "standardize" else None
    with torch.no_grad():
        emb = class_name_embeddings(uniter.embeddings.word_embeddings.weight.detach().cpu(), name_ids)
        weight, bias = class_name_projection(features, soft, emb, feature_eps=eps)
        # how well the fit explains the targets on its own sample (1 = exactly)
        target = soft @ emb
        fitted = embedder.project_input(features) @ weight.T + bias
        r2 = 1.0 - float(((fitted - target) ** 2).sum() / ((target - target.mean(0)) ** 2).sum().clamp_min(1e-12))
        proj.weight.copy_(weight.to(proj.weight.dtype))
        proj.bias.copy_(bias.to(proj.bias.dtype))
    report = {"regions": int(features.shape[0]), "classes": len(names), "r2": round(r2, 4)}
    log.info("region projection fitted to the detector's %d class names on %d regions (R² %.3f)", len(names),
             report["regions"], r2)
    return report
