"""A tiny world for the extraction tests (tests/pipeline/extract/test_extract.py, test_parts.py).

A few rendered COCO-style scenes plus one image of each defect kind, manifests that list them
(clean + task manifests, with duplicates across manifests), VCR metadata files, RefCOCO+ boxes,
and a randomly initialized mini detector checkpoint.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd

from helpers.scene_kit import render_scene, save_mini_checkpoint, write_defect_images

from pipeline.params.parser import load_params

ROOT = Path(__file__).resolve().parents[2]
SCENE_IDS = [str(i) for i in range(101, 106)]


def _manifest(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path, index=False)


def write_world(root: Path) -> dict:
    """The tiny world under ``root``: images, manifests under ``root/data``, a random mini checkpoint."""
    raw = root / "raw"
    rng = np.random.default_rng(0)
    paths, objects = {}, {}
    for image_id in SCENE_IDS + ["106", "107"]:
        img, objs = render_scene(rng, 64, n_objects=2)
        paths[image_id] = raw / "coco" / f"COCO_train2014_{int(image_id):012d}.jpg"
        paths[image_id].parent.mkdir(parents=True, exist_ok=True)
        img.save(paths[image_id], quality=95)
        objects[image_id] = objs
    defects = write_defect_images(raw / "defects")
    row = lambda src, i, p: {"image_source": src, "image_id": i, "image_path": str(p), "text": "x"}  # noqa: E731
    clean = [row("coco", i, paths[i]) for i in SCENE_IDS] + [row("coco", f"d_{k}", p) for k, p in defects.items()]
    vqa = [row("coco", "101", paths["101"]), row("coco", "106", paths["106"])]
    refs = []
    for image_id, ann_base in (("101", 500), ("102", 600)):
        for k, obj in enumerate(objects[image_id]):
            x1, y1, x2, y2 = obj["box"]
            for sent in range(2):  # one manifest row per sentence
                refs.append(row("coco", image_id, paths[image_id]) | {"ann_id": ann_base + k, "bbox": [x1, y1, x2 - x1, y2 - y1]})
    refs.append(row("coco", "107", paths["107"]) | {"ann_id": 700, "bbox": [5.0, 5.0, 0.0, 10.0]})
    meta_dir = raw / "vcr"
    meta_dir.mkdir()
    vcr = []
    for image_id in ("v1", "v2", "v3"):
        meta = meta_dir / f"{image_id}.json"
        if image_id != "v3":  # v3's metadata file is missing
            boxes = [list(map(float, o["box"])) + [0.9] for o in objects["10" + image_id[1]]]
            meta.write_text(json.dumps({"boxes": boxes, "names": ["x"] * len(boxes), "width": 64, "height": 64}))
        vcr.append(row("vcr", image_id, paths["10" + image_id[1]]) | {"metadata_path": str(meta)})
    nlvr2 = [row("nlvr2", "n-img0", paths["103"]) | {"image_id_2": "n-img1", "image_path_2": str(paths["104"])}]
    manifests = {"clean/coco.parquet": clean, "manifests/vqa.parquet": vqa, "manifests/refcoco.parquet": refs,
                 "manifests/vcr.parquet": vcr, "manifests/nlvr2.parquet": nlvr2}
    data = root / "data"
    for rel, rows in manifests.items():
        _manifest(data / rel, rows)
    weights = save_mini_checkpoint(root / "weights" / "model_final.pth", image_size=64)
    return {"root": root, "data": data, "paths": paths, "objects": objects, "defects": defects,
            "weights": weights, "manifests": manifests}


def params_for(data: Path, weights: Path, *extra: str):
    """params.yaml for the tiny world: 3-image shards, CPU, one worker; ``extra`` overrides."""
    overrides = [f"paths.data={data}", f"extract.weights={weights}", "extract.shard_size=3", "extract.batch_size=2",
                 "extract.workers=1", "extract.device=cpu", *extra]
    return load_params(ROOT / "params.yaml", overrides, check_paths=False)


def copy_manifests(world: dict, data: Path) -> None:
    """The world's manifests into another data directory (a fresh run over the same images)."""
    for rel in world["manifests"]:
        (data / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(world["data"] / rel, data / rel)


def feature_files(out: Path) -> dict[str, bytes]:
    """File name -> bytes of a feature directory, run records left out (they hold wall times)."""
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file() and not p.name.startswith("_run")}
