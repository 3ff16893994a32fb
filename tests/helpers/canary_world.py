"""A scene world small enough to pretrain on in seconds: the learning canary's
(tests/pipeline/pretrain/test_learning_canary.py).

Scenes and their text are the mini world's own (``pipeline.mini_world.scenes.sample_scene``,
``pipeline.mini_world.text``: COCO captions, VG region phrases, CC/SBU alt-texts), drawn in
process, one object a picture: no image is rendered. The detector is the one part stood in for
(training and running it takes minutes): the object is one region whose feature is its colour's
and its shape's fixed random direction plus noise, with soft labels peaked on its class, as a
trained detector's are. The regions are written as feature shards by the extract stage's own
writer, and the real ``build_dbs`` stage turns them and the clean manifests into the LMDB stores
the pretraining stage reads. So every colour and shape word of a text is recoverable from its
image's region, and from nothing else.

``image_signal=False`` writes the same scenes and texts with every region's feature and soft labels
those of a class drawn at random (a detector that sees nothing): the canary's negative control.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.common.runinfo import atomic_write_bytes, mark_done
from pipeline.extract.detector.extractor import Regions
from pipeline.extract.detector.shards import encode_shard, shard_name
from pipeline.mini_world.scenes import CATEGORIES, CATEGORY_ID, COLOURS, SHAPES, Scene, dataset_rng, sample_scene
from pipeline.mini_world.text import coco_captions, region_phrases, web_caption

DIM = 32  # region feature width
CLASS_NAMES = ["__background__"] + [f"{c} {s}" for c, s in CATEGORIES]  # the mini detector's, background first
IMAGE_SIZE = 192
MAX_OBJECTS = 1  # one object a picture: each colour and shape word has one region to be read from
NOISE = 0.5  # feature noise (per dimension) around an object's class direction
# images per (dataset, split); COCO gives 2 captions an image, VG a phrase per object
SIZES = {("coco", "train"): 240, ("coco", "val"): 80, ("vg", "train"): 120, ("vg", "val"): 40,
         ("cc", "train"): 20, ("cc", "val"): 10, ("sbu", "train"): 20}
VOCAB_FILE = "canary_vocab.txt"


def db_overrides(data: Path) -> tuple[str, ...]:
    """Params for this world under ``data``: build_dbs reads the four pretraining datasets (and
    COCO's Karpathy manifest) and tokenizes with the world's own word-level WordPiece vocabulary
    (a few dozen words instead of BERT's 30,522: the tiny model learns their statistics in a few
    steps, so its budget goes to what the canary asks about)."""
    return ("ingest.datasets=[coco, vg, cc, sbu]", "finetune.tasks=[]", f"build_dbs.tokenizer={data / VOCAB_FILE}")


def write_vocab(path: Path, texts: list[str]) -> None:
    """A lower-case WordPiece vocab.txt: BERT's special tokens, then every word and punctuation mark of ``texts``."""
    from pipeline.stores.tokenization import SPECIAL_TOKENS

    words = sorted({w for t in texts for w in re.findall(r"[a-z0-9]+|[^\sa-z0-9]", t.lower())})
    path.write_text("\n".join([*SPECIAL_TOKENS, *words]) + "\n", encoding="utf-8")


def _directions(seed: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    rng = np.random.default_rng([seed, 0xC0105])
    unit = lambda: (v := rng.standard_normal(DIM)) / np.linalg.norm(v) * np.sqrt(DIM)  # noqa: E731
    return {c: unit() for c in COLOURS}, {s: unit() for s in SHAPES}


def scene_regions(scene: Scene, rng: np.random.Generator, *, seed: int,
                  decoys: np.random.Generator | None = None) -> Regions:
    """The stand-in detector's regions of ``scene``: one per object, in order. With ``decoys``, each
    region shows a class drawn from it instead of its object's (the negative control)."""
    colour_dir, shape_dir = _directions(seed)
    n = len(scene.objects)
    feats = rng.normal(0.0, NOISE, size=(n, DIM))
    soft = rng.dirichlet(np.full(len(CLASS_NAMES), 0.3), size=n) * 0.2
    for k, obj in enumerate(scene.objects):
        colour, shape = obj.colour, obj.shape
        if decoys is not None:  # a detector that sees nothing: the class of a random object
            colour, shape = CATEGORIES[int(decoys.integers(len(CATEGORIES)))]
        feats[k] += colour_dir[colour] + shape_dir[shape]
        soft[k, CATEGORY_ID[(colour, shape)]] += 0.8
    return Regions(features=feats.astype(np.float32), boxes=np.asarray([o.box for o in scene.objects], np.float32),
                   conf=soft[:, 1:].max(1).astype(np.float32), soft_labels=soft.astype(np.float32), attributes=None,
                   image_hw=(IMAGE_SIZE, IMAGE_SIZE))


def _write_features(root: Path, source: str, ids: list[str], regions: list[Regions], shard_size: int = 50) -> None:
    out = root / source
    out.mkdir(parents=True)
    for s, start in enumerate(range(0, len(ids), shard_size)):
        chunk, regs = ids[start:start + shard_size], regions[start:start + shard_size]
        path = out / shard_name(s)
        atomic_write_bytes(path, encode_shard(chunk, regs, feature_dim=DIM, num_classes=len(CLASS_NAMES)))
        mark_done(path, {"images": len(chunk), "regions": sum(len(r.boxes) for r in regs)})
    meta = {"feature_dim": DIM, "num_classes": len(CLASS_NAMES), "class_names": CLASS_NAMES,
            "detector": "canary", "mode": "detected"}
    (out / "meta.json").write_text(json.dumps(meta))


def _texts(source: str, rng: np.random.Generator, scene: Scene) -> list[str]:
    if source == "coco":
        return coco_captions(rng, scene, 2)
    if source == "vg":
        return [phrase for phrase, _ in region_phrases(rng, scene)]
    return [web_caption(rng, scene, source)]


def write_canary_world(data: Path, *, seed: int = 0, image_signal: bool = True) -> Path:
    """Features under ``data/features`` and clean manifests under ``data/clean`` (+ COCO's under
    ``data/manifests``); returns ``data``. Deterministic in ``seed``."""
    rows: dict[str, list[dict]] = {}
    for source in ("coco", "vg", "cc", "sbu"):
        rng = dataset_rng(seed, f"canary/{source}")
        decoys = None if image_signal else dataset_rng(seed, f"canary/{source}/decoys")
        ids, regions = [], []
        for split in ("train", "val"):
            for _ in range(SIZES.get((source, split), 0)):
                image_id = f"{len(ids) + 100}"
                scene = sample_scene(rng, size=IMAGE_SIZE, max_objects=MAX_OBJECTS)
                ids.append(image_id)
                regions.append(scene_regions(scene, rng, seed=seed, decoys=decoys))
                for c, text in enumerate(_texts(source, rng, scene)):
                    rows.setdefault(source, []).append({
                        "example_id": f"{source}-{image_id}-{c}", "dataset": source, "split": split,
                        "image_source": source, "image_id": image_id, "image_path": f"{source}/{image_id}.jpg",
                        "url": None, "text": text})
        _write_features(data / "features", source, ids, regions)
    (data / "clean").mkdir(parents=True)
    (data / "manifests").mkdir(parents=True)
    for source, source_rows in rows.items():
        pd.DataFrame(source_rows).to_parquet(data / "clean" / f"{source}.parquet", index=False)
    pd.DataFrame(rows["coco"]).to_parquet(data / "manifests" / "coco.parquet", index=False)
    write_vocab(data / VOCAB_FILE, [r["text"] for source_rows in rows.values() for r in source_rows])
    return data
