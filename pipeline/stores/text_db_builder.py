"""What goes into each text DB: manifests -> tokenized, truncated records with task targets.

One builder per family returns :class:`TextDbSpec` objects (records sorted by example id);
``pipeline.stores.build_dbs`` drops records whose images are missing and writes them. Image ids are
qualified with the image DB they live in (``"coco/391895"``) so DBs that mix sources (COCO + VG)
stay unambiguous; each spec says which image DBs it needs and how an example's images combine
(``single``, ``pair`` for NLVR2, ``concat`` for VCR: given boxes first, then detected ones, so
object tag k is region k).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from pipeline.common.runinfo import InputsMissingError
from pipeline.params.pretrain import DOMAIN_DATASETS
from pipeline.stores.tokenization import WordPieceTokenizer
from pipeline.stores.vqa_answers import build_answer_vocab, soft_targets

SNLI_LABELS = ("entailment", "neutral", "contradiction")
# manifest split value -> DB split name, per dataset (anything else is a contract violation)
SPLITS = {
    "coco": {"train": "train", "restval": "train", "val": "val", "test": "test"},
    "flickr30k": {"train": "train", "val": "val", "test": "test"},
    "vqa": {"train": "train", "val": "val", "test": "test"},
    "vcr": {"train": "train", "val": "val", "test": "test"},
    "nlvr2": {"train": "train", "dev": "dev", "test": "test", "test1": "test"},
    "snli_ve": {"train": "train", "dev": "dev", "test": "test"},
    "refcoco": {"train": "train", "val": "val", "testA": "testA", "testB": "testB"},
}
# dataset -> the name prefix(es) of its text DBs, one DB per prefix and split (``vqa_train``)
DB_PREFIXES = {"coco": ("retrieval_coco",), "flickr30k": ("retrieval_flickr",), "vqa": ("vqa",),
               "vcr": ("vcr_qa", "vcr_qar"), "nlvr2": ("nlvr2",), "snli_ve": ("snli_ve",),
               "refcoco": ("refcoco_plus",)}
PRETRAIN_SPLITS = ("train", "val")


def db_splits(dataset: str) -> tuple[str, ...]:
    """The DB splits of ``dataset``, in :data:`SPLITS` order (``restval`` joins ``train``)."""
    return tuple(dict.fromkeys(SPLITS[dataset].values()))


def pretrain_domains(corpora: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """``{domain: its corpora among corpora}`` for each domain with one (COCO + VG: ``indomain`` only)."""
    out = {domain: tuple(d for d in datasets if d in corpora) for domain, datasets in DOMAIN_DATASETS.items()}
    return {domain: datasets for domain, datasets in out.items() if datasets}


def text_db_names(datasets: Sequence[str], *, corpora: Sequence[str]) -> list[str]:
    """Every text DB the manifests of ``datasets`` and the clean pretraining ``corpora``
    (``Params.pretrain_corpora``) can give: build_dbs checks each directory before it writes any."""
    names = [f"pretrain_{d}_{s}" for d in pretrain_domains(corpora) for s in PRETRAIN_SPLITS]
    return names + [f"{prefix}_{split}" for dataset in DB_PREFIXES if dataset in datasets
                    for prefix in DB_PREFIXES[dataset] for split in db_splits(dataset)]


@dataclass
class TextDbSpec:
    """One text DB to write: ``records`` sorted by ``example_id``; each has ``input_ids`` i32 [L],
    ``image_ids`` (qualified) and task targets."""

    name: str
    task: str
    split: str
    datasets: list[str]
    image_layout: str
    max_txt_len: int
    records: list[dict[str, Any]]
    truncated: int
    meta: dict[str, Any] = field(default_factory=dict)
    side_files: dict[str, Any] = field(default_factory=dict)


def read_manifest(path: Path, columns: Sequence[str] | None = None) -> pd.DataFrame:
    if not path.is_file():
        raise InputsMissingError(f"manifest {path} does not exist (run ingest/decontaminate first)")
    frame = pd.read_parquet(path, columns=list(columns) if columns else None)
    if frame["example_id"].duplicated().any():
        dup = frame.loc[frame["example_id"].duplicated(), "example_id"].iloc[0]
        raise ValueError(f"{path}: example_id {dup!r} is not unique")
    return frame.sort_values("example_id", kind="stable").reset_index(drop=True)


def map_splits(frame: pd.DataFrame, dataset: str, path: Path) -> pd.Series:
    mapping = SPLITS[dataset]
    bad = sorted(set(frame["split"].dropna().astype(str)) - set(mapping))
    if bad:
        raise ValueError(f"{path}: unexpected split value(s) {bad} for {dataset}; expected {sorted(mapping)}")
    return frame["split"].map(mapping)


def encode_truncated(tok: WordPieceTokenizer, texts: Sequence[str], max_len: int) -> tuple[list[np.ndarray], int]:
    """Tokenize ``texts``; cut each to ``max_len`` ids. Returns (i32 arrays, number truncated)."""
    out, truncated = [], 0
    for ids in tok.encode_batch([t if isinstance(t, str) else "" for t in texts]):
        if len(ids) > max_len:
            truncated += 1
            ids = ids[:max_len]
        out.append(np.asarray(ids, dtype=np.int32))
    return out, truncated


def qualified(sources: Sequence[str], image_ids: Sequence[Any]) -> list[str]:
    return [f"{s}/{i}" for s, i in zip(sources, image_ids)]


def _simple_records(frame: pd.DataFrame, tok: WordPieceTokenizer, max_len: int,
                    extra: Callable[[Any], dict[str, Any]] | None = None) -> tuple[list[dict], int]:
    ids, truncated = encode_truncated(tok, frame["text"].tolist(), max_len)
    images = qualified(frame["image_source"].tolist(), frame["image_id"].astype(str).tolist())
    records = []
    for row, input_ids, image in zip(frame.itertuples(index=False), ids, images):
        rec = {"example_id": row.example_id, "input_ids": input_ids, "image_ids": [image]}
        if extra is not None:
            rec.update(extra(row))
        records.append(rec)
    return records, truncated


# --------------------------------------------------------------------------------------------
# pretraining


def pretrain_specs(clean_dir: Path, corpora: Sequence[str], tok: WordPieceTokenizer, *, max_len: int,
                   outdomain_val_size: int, seed: int) -> list[TextDbSpec]:
    """pretrain_indomain_{train,val} (clean COCO + VG), pretrain_outdomain_{train,val} (clean CC + SBU),
    each of the ``corpora`` it has (a domain with none of them is not built).

    Out-of-domain val = the CC val rows when the clean CC manifest has any, else a seeded split of
    ``outdomain_val_size`` images (all their captions) from the train rows.
    """
    specs = []
    for domain, datasets in pretrain_domains(corpora).items():
        frames = [read_manifest(clean_dir / f"{d}.parquet", ["example_id", "split", "image_source", "image_id", "text"])
                  for d in datasets]
        frame = pd.concat(frames, ignore_index=True)
        if frame["example_id"].duplicated().any():
            raise ValueError(f"example ids collide between clean manifests {datasets}")
        frame = frame.sort_values("example_id", kind="stable").reset_index(drop=True)
        split = frame["split"].astype(str)
        if domain == "outdomain" and not (split == "val").any():
            split = _seeded_image_split(frame, outdomain_val_size, seed)
        for name in PRETRAIN_SPLITS:
            part = frame[split == name]
            records, truncated = _simple_records(part, tok, max_len)
            specs.append(TextDbSpec(f"pretrain_{domain}_{name}", "pretrain", name, list(datasets), "single",
                                    max_len, records, truncated))
    return specs


def _seeded_image_split(frame: pd.DataFrame, val_images: int, seed: int) -> pd.Series:
    keys = sorted(set(frame["image_source"] + "/" + frame["image_id"].astype(str)))
    rng = np.random.default_rng([seed, 0x0D0])
    chosen = set(rng.permutation(len(keys))[:val_images].tolist())
    val_keys = {keys[i] for i in chosen}
    qualified_ids = frame["image_source"] + "/" + frame["image_id"].astype(str)
    return qualified_ids.map(lambda k: "val" if k in val_keys else "train")


# --------------------------------------------------------------------------------------------
# downstream tasks


def vqa_specs(manifest: Path, tok: WordPieceTokenizer, *, max_len: int, min_answer_count: int) -> list[TextDbSpec]:
    """vqa_{train,val,test}: soft targets over the answer vocabulary of train+val (ans2label.json)."""
    frame = read_manifest(manifest)
    split = map_splits(frame, "vqa", manifest)
    labelled = frame[split.isin(["train", "val"])]
    ans2label = build_answer_vocab(labelled["multiple_choice_answer"].dropna().astype(str), min_count=min_answer_count)

    def targets(row: Any) -> dict[str, Any]:
        answers = list(row.answers) if row.answers is not None else []
        labels, scores = soft_targets([str(a) for a in answers], ans2label)
        return {"question_id": str(row.question_id), "answer_labels": np.asarray(labels, dtype=np.int32),
                "answer_scores": np.asarray(scores, dtype=np.float32)}

    specs = []
    for name in db_splits("vqa"):
        records, truncated = _simple_records(frame[split == name], tok, max_len, targets)
        specs.append(TextDbSpec(f"vqa_{name}", "vqa", name, ["vqa"], "single", max_len, records, truncated,
                                meta={"num_answers": len(ans2label), "min_answer_count": min_answer_count},
                                side_files={"ans2label.json": ans2label}))
    return specs


def nlvr2_specs(manifest: Path, tok: WordPieceTokenizer, *, max_len: int) -> list[TextDbSpec]:
    """nlvr2_{train,dev,test}: two image ids per statement, label 1 (True) / 0 (False) / -1 (unknown)."""
    frame = read_manifest(manifest)
    split = map_splits(frame, "nlvr2", manifest)
    specs = []
    for name in db_splits("nlvr2"):
        part = frame[split == name]
        records, truncated = _simple_records(part, tok, max_len, lambda r: {"label": _bool_label(r.label)})
        for rec, row in zip(records, part.itertuples(index=False)):
            rec["image_ids"].append(f"{row.image_source}/{row.image_id_2}")
        specs.append(TextDbSpec(f"nlvr2_{name}", "nlvr2", name, ["nlvr2"], "pair", max_len, records, truncated,
                                meta={"label_names": ["False", "True"]}))
    return specs


def _bool_label(value: Any) -> int:
    if value is None or (isinstance(value, float) and np.isnan(value)) or value is pd.NA:
        return -1
    return int(bool(value))


def snli_ve_specs(manifest: Path, tok: WordPieceTokenizer, *, max_len: int) -> list[TextDbSpec]:
    """snli_ve_{train,dev,test}: hypothesis text, Flickr30k premise image, 3-way label."""
    frame = read_manifest(manifest)
    split = map_splits(frame, "snli_ve", manifest)
    bad = sorted(set(frame["label"].dropna().astype(str)) - set(SNLI_LABELS))
    if bad:
        raise ValueError(f"{manifest}: unexpected SNLI-VE label(s) {bad}; expected {list(SNLI_LABELS)}")
    specs = []
    for name in db_splits("snli_ve"):
        records, truncated = _simple_records(
            frame[split == name], tok, max_len,
            lambda r: {"label": SNLI_LABELS.index(r.label) if isinstance(r.label, str) else -1})
        specs.append(TextDbSpec(f"snli_ve_{name}", "snli_ve", name, ["snli_ve"], "single", max_len, records,
                                truncated, meta={"label_names": list(SNLI_LABELS)}))
    return specs


def retrieval_specs(manifest: Path, dataset: str, tok: WordPieceTokenizer, *, max_len: int) -> list[TextDbSpec]:
    """retrieval_{coco,flickr}_{train,val,test}: Karpathy splits (restval joins train)."""
    frame = read_manifest(manifest, ["example_id", "split", "image_source", "image_id", "text"])
    split = map_splits(frame, dataset, manifest)
    prefix, = DB_PREFIXES[dataset]
    specs = []
    for name in db_splits(dataset):
        records, truncated = _simple_records(frame[split == name], tok, max_len)
        specs.append(TextDbSpec(f"{prefix}_{name}", "retrieval", name, [dataset], "single", max_len,
                                records, truncated))
    return specs


def refcoco_specs(manifest: Path, instances: Path | None, tok: WordPieceTokenizer, *, max_len: int,
                  gt_img_db: str | None, gt_boxes_of: Callable[[str], np.ndarray | None]) -> list[TextDbSpec]:
    """refcoco_plus_{train,val,testA,testB}: expression, detected-box image, target box and gt boxes.

    ``target_box`` f32 [4] and ``gt_boxes`` f32 [k, 4] are x1,y1,x2,y2 pixels. The gt boxes are
    the given-box image DB's regions when it exists (``gt_image_ids``; the region order the model
    sees), else every instances.json annotation of the image in ann id order. ``target_index``
    is the gt box overlapping the target most (IoU >= 0.5), -1 if none.
    """
    frame = read_manifest(manifest)
    split = map_splits(frame, "refcoco", manifest)
    ann_boxes = _instance_boxes(instances) if instances is not None and instances.is_file() else {}
    specs = []
    for name in db_splits("refcoco"):
        part = frame[split == name]
        records, truncated = _simple_records(part, tok, max_len)
        for rec, row in zip(records, part.itertuples(index=False)):
            x, y, w, h = (float(v) for v in row.bbox)
            target = np.asarray([x, y, x + w, y + h], dtype=np.float32)
            gt = gt_boxes_of(str(row.image_id)) if gt_img_db else None
            if gt is None:
                gt = ann_boxes.get(str(row.image_id), np.zeros((0, 4), np.float32))
            else:
                rec["gt_image_ids"] = [f"{gt_img_db}/{row.image_id}"]
            ious = box_iou(target[None], gt)[0] if len(gt) else np.zeros(0)
            rec.update({"ref_id": str(row.ref_id), "ann_id": str(row.ann_id), "target_box": target,
                        "gt_boxes": np.asarray(gt, dtype=np.float32),
                        "target_index": int(ious.argmax()) if len(ious) and ious.max() >= 0.5 else -1})
        specs.append(TextDbSpec(f"refcoco_plus_{name}", "refcoco_plus", name, ["refcoco"], "single", max_len,
                                records, truncated, meta={"gt_img_db": gt_img_db}))
    return specs


def _instance_boxes(path: Path) -> dict[str, np.ndarray]:
    data = json.loads(path.read_text(encoding="utf-8"))
    per_image: dict[str, list[tuple[int, list[float]]]] = {}
    for ann in data.get("annotations", []):
        x, y, w, h = ann["bbox"]
        per_image.setdefault(str(ann["image_id"]), []).append((int(ann["id"]), [x, y, x + w, y + h]))
    return {k: np.asarray([b for _, b in sorted(v)], dtype=np.float32) for k, v in per_image.items()}


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of boxes a [m, 4] and b [n, 4] (x1, y1, x2, y2) -> [m, n]."""
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.clip(rb - lt, 0, None).prod(-1)
    area_a = (a[:, 2:] - a[:, :2]).clip(0).prod(-1)
    area_b = (b[:, 2:] - b[:, :2]).clip(0).prod(-1)
    return inter / np.maximum(area_a[:, None] + area_b[None, :] - inter, 1e-9)
