"""A small synthetic world in the formats build_dbs reads (docs/design.md §6 manifests, §8 shards).

Used by the store, build_dbs and pretraining-data tests while the real stages run elsewhere.
Everything is derived from a seed, so two calls write identical files.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.common.runinfo import atomic_write_bytes, mark_done
from pipeline.extract.detector.extractor import Regions
from pipeline.extract.detector.shards import encode_shard, shard_name
from pipeline.params.parser import load_params

ROOT = Path(__file__).resolve().parents[2]
DIM, CLASSES = 16, 6
WORDS = "a the red blue green small large circle square triangle left of right above below near with and".split()
LONG_TEXT = " ".join(["green circle"] * 40)  # 80 WordPieces > max_txt_len 60


def sentence(rng: np.random.Generator, lo: int = 4, hi: int = 12) -> str:
    return " ".join(rng.choice(WORDS, size=int(rng.integers(lo, hi))))


def _random_regions(rng: np.random.Generator, boxes: np.ndarray | None) -> Regions:
    """One 192 x 192 image's regions: the given boxes, or 3..11 random ones; random features and labels."""
    if boxes is None:
        boxes = np.sort(rng.uniform(0, 190, size=(int(rng.integers(3, 12)), 4)), axis=1)
    n = len(boxes)
    soft = rng.random((n, CLASSES))
    return Regions(features=rng.standard_normal((n, DIM)).astype(np.float32), boxes=boxes.astype(np.float32),
                   conf=rng.random(n).astype(np.float32), soft_labels=soft / soft.sum(1, keepdims=True),
                   attributes=None, image_hw=(192, 192))


def write_features(root: Path, name: str, image_ids: list[str], *, seed: int, shard_size: int = 5,
                   boxes_of: dict[str, np.ndarray] | None = None) -> None:
    """A feature directory with unsorted image order across shards, each shard encoded and marked
    done by the extract stage's own writer (pipeline/extract/detector/shards.py)."""
    rng = np.random.default_rng(seed)
    out = root / name
    out.mkdir(parents=True)
    ids = list(reversed(image_ids))  # shards are not in key order: the DB must sort
    for s, start in enumerate(range(0, len(ids), shard_size)):
        chunk = ids[start:start + shard_size]
        regions = [_random_regions(rng, boxes_of[i] if boxes_of else None) for i in chunk]
        path = out / shard_name(s)
        atomic_write_bytes(path, encode_shard(chunk, regions, feature_dim=DIM, num_classes=CLASSES))
        mark_done(path, {"images": len(chunk), "regions": sum(len(r.boxes) for r in regions)})
    meta = {"feature_dim": DIM, "num_classes": CLASSES, "class_names": [f"c{i}" for i in range(CLASSES)],
            "detector": "synthetic", "mode": "given" if name.endswith("_gt") else "detected"}
    (out / "meta.json").write_text(json.dumps(meta))


def _core(dataset: str, split: str, source: str, image_id: str, text: str, example_id: str) -> dict:
    return {"example_id": example_id, "dataset": dataset, "split": split, "image_source": source,
            "image_id": image_id, "image_path": f"{source}/{image_id}.jpg", "url": None, "text": text}


def write_world(data: Path, *, seed: int = 0, cc_val: bool = True, test_labels: bool = False) -> dict:
    """Features + clean and task manifests under ``data``; returns facts the tests check.

    ``test_labels``: the VQA and VCR test rows carry labels, as ingested with the mini world's
    evaluation-server files; without, they have none, as on real data."""
    rng = np.random.default_rng(seed)
    imgs = {s: [f"{100 + i}" for i in range(n)] for s, n in
            [("coco", 14), ("vg", 8), ("cc", 10), ("sbu", 8), ("flickr30k", 8), ("nlvr2", 8), ("vcr", 5)]}
    feat = data / "features"
    for k, (source, ids) in enumerate(sorted(imgs.items())):
        write_features(feat, source, ids, seed=seed + k)
    vcr_gt = {i: np.array([[10 * j, 10, 10 * j + 30, 60] for j in range(4)], np.float32) for i in imgs["vcr"]}
    write_features(feat, "vcr_gt", imgs["vcr"], seed=seed + 50, boxes_of=vcr_gt)
    coco_gt = {i: np.array([[5, 5, 50, 50], [60, 60, 120, 140], [100, 10, 180, 90]], np.float32) for i in imgs["coco"]}
    write_features(feat, "coco_gt", imgs["coco"], seed=seed + 60, boxes_of=coco_gt)

    man, clean = data / "manifests", data / "clean"
    man.mkdir(parents=True)
    clean.mkdir(parents=True)

    def save(frame_rows: list[dict], path: Path) -> None:
        pd.DataFrame(frame_rows).to_parquet(path, index=False)

    coco_rows = []
    for n, i in enumerate(imgs["coco"]):
        split = ["train", "restval", "val", "test"][n % 4]
        for c in range(2):
            text = LONG_TEXT if (n, c) == (0, 0) else sentence(rng)
            coco_rows.append(_core("coco", split, "coco", i, text, f"coco-{i}-{c}"))
    save(coco_rows, man / "coco.parquet")
    clean_coco = [dict(r, split="train" if r["split"] in ("train", "restval") else "val")
                  for r in coco_rows if r["split"] != "test"]
    clean_coco.append(_core("coco", "train", "coco", "999999", "an image nobody extracted", "coco-missing-0"))
    save(clean_coco, clean / "coco.parquet")
    save([_core("vg", "train" if n < 6 else "val", "vg", i, sentence(rng), f"vg-{i}-{r}")
          for n, i in enumerate(imgs["vg"]) for r in range(3)], clean / "vg.parquet")
    save([_core("cc", "val" if (cc_val and n >= 8) else "train", "cc", i, sentence(rng), f"cc-{i}")
          for n, i in enumerate(imgs["cc"])], clean / "cc.parquet")
    save([_core("sbu", "train", "sbu", i, sentence(rng), f"sbu-{i}") for i in imgs["sbu"]], clean / "sbu.parquet")
    save([_core("flickr30k", ["train", "val", "test"][n % 3], "flickr30k", i, sentence(rng), f"f30k-{i}-{c}")
          for n, i in enumerate(imgs["flickr30k"]) for c in range(2)], man / "flickr30k.parquet")

    vqa = []
    answer_sets = [["two"] * 2 + ["2"] + ["three"] * 7, ["yes"] * 9 + ["no"], ["2"] * 6 + ["three"] * 4,
                   ["A circle."] * 10]
    for n, i in enumerate(imgs["coco"][:12]):
        split = ["train", "val", "test"][n % 3]
        answers = answer_sets[n % 4] if split != "test" or test_labels else None
        mca = None if answers is None else max(set(answers), key=answers.count)
        vqa.append(dict(_core("vqa", split, "coco", i, "what color is the " + sentence(rng, 1, 3) + "?", f"vqa-{n}"),
                        question_id=n, answers=answers, multiple_choice_answer=mca, answer_type="other",
                        question_type="what"))
    save(vqa, man / "vqa.parquet")

    vcr = []
    for n, i in enumerate(imgs["vcr"]):
        q = ["Why", "is", [0, 1], "looking", "at", [3], "?"]
        answers = [["Because", [0], "is", "happy", "."]] + [["No", "idea", str(k), "."] for k in range(3)]
        rationales = [[[1], "smiles", "."]] + [["Because", "of", "the", "long", "reason"] * (50 if n == 0 else 1)] * 3
        split = ["train", "train", "val", "test", "train"][n]
        vcr.append(dict(_core("vcr", split, "vcr", i, "Why is 0 looking?", f"vcr-{n}"), annot_id=f"{split}-{n}",
                        question=json.dumps(q), answer_choices=json.dumps(answers),
                        rationale_choices=json.dumps(rationales), objects=json.dumps(["person"] * 3 + ["dog"]),
                        answer_label=None if split == "test" and not test_labels else 0,
                        rationale_label=None if split == "test" and not test_labels else 0,
                        metadata_path=f"vcr/{i}.json"))
    save(vcr, man / "vcr.parquet")

    nl = imgs["nlvr2"]
    save([dict(_core("nlvr2", ["train", "dev", "test1"][n % 3], "nlvr2", nl[2 * n % 8], sentence(rng), f"nlvr2-{n}"),
               image_id_2=nl[(2 * n + 1) % 8], image_path_2="x.png", label=[True, False, None][n % 3])
          for n in range(6)], man / "nlvr2.parquet")
    labels = ["entailment", "neutral", "contradiction"]
    save([dict(_core("snli_ve", ["train", "dev", "test"][n % 3], "flickr30k", imgs["flickr30k"][n % 8],
                     sentence(rng), f"snli-{n}"), premise="p", label=labels[n % 3]) for n in range(9)],
         man / "snli_ve.parquet")
    refs = []
    for n, i in enumerate(imgs["coco"][:8]):
        refs.append(dict(_core("refcoco", ["train", "val", "testA", "testB"][n % 4], "coco", i, sentence(rng),
                               f"ref-{n}"), ref_id=n, ann_id=1000 + n, sent_id=n, bbox=[60.0, 60.0, 60.0, 80.0],
                         category_id=1))
    save(refs, man / "refcoco.parquet")
    return {"imgs": imgs, "vcr_gt": vcr_gt, "coco_gt": coco_gt}


def params_for(data: Path, *overrides: str):
    """params.yaml of the repo with ``paths.data`` pointed at ``data`` (source paths unchecked)."""
    return load_params(ROOT / "params.yaml", [f"paths.data={data}", *overrides], check_paths=False)


def built_world(data: Path, *overrides: str) -> Path:
    """``write_world(data)`` then the real build_dbs stage over it; returns ``data``."""
    from pipeline.stores.build_dbs import run as build_dbs

    write_world(data)
    build_dbs(params_for(data, *overrides))
    return data
