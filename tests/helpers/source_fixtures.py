"""Params pointing every source at the hand-written fixtures in tests/fixtures/sources/.

Annotation files are used in place; the images they reference are written into a temporary
directory from ``images.json`` (ok / png / truncated / empty / json / badjson; unlisted = missing).
The RefCOCO refs are hand-written as JSON and pickled here (protocol 2, like the real Python 2 file).
"""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.ingest.ingest import IngestResult, ingest_dataset
from pipeline.ingest.sources.web_images import url_key
from pipeline.mini_world.shards import SHARD_SCHEMA
from pipeline.params.parser import Params, load_params

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "sources"
MAX_TEXT_CHARS = 80  # the fixtures' "too long" texts are 85-105 characters


def _image_bytes(fmt: str, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (24, 32, 3), dtype=np.uint8)).save(buf, format=fmt)
    return buf.getvalue()


def write_fixture_images(root: Path) -> None:
    """Create the image files listed in images.json below ``root``."""
    spec = json.loads((FIXTURES / "images.json").read_text())
    for seed, (name, kind) in enumerate(sorted(spec.items())):
        if name.startswith("_"):
            continue
        if "/url:" in name:  # CC/SBU downloads are named by the sha1 of their URL
            folder, url = name.split("/url:", 1)
            rel = Path(folder) / (hashlib.sha1(url.encode()).hexdigest() + ".jpg")
        else:
            rel = Path(name)
        full = _image_bytes("PNG" if rel.suffix == ".png" else "JPEG", seed)
        data = {
            "ok": full,
            "png": full,
            "truncated": full[: len(full) * 2 // 5],
            "empty": b"",
            "json": json.dumps({"boxes": [[1, 2, 10, 20, 0.9]], "names": ["person"], "width": 32,
                                "height": 24}).encode(),
            "badjson": b'{"boxes": [[1, 2,',
        }[kind]
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)


def fixture_overrides(tmp_path: Path) -> list[str]:
    images = tmp_path / "images"
    write_fixture_images(images)
    refs = tmp_path / "refs(unc).p"
    refs.write_bytes(pickle.dumps(json.loads((FIXTURES / "refcoco" / "refs.json").read_text()), protocol=2))
    f = FIXTURES
    sources = {
        "coco": {"captions_train": f / "coco/captions_train2014.json", "captions_val": f / "coco/captions_val2014.json",
                 # the coco reader does not read instances files; any existing file satisfies world: real
                 "instances_train": f / "coco/captions_train2014.json",
                 "instances_val": f / "coco/captions_val2014.json",
                 "karpathy": f / "coco/dataset_coco.json", "image_root": images / "coco",
                 "image_info_test": f / "coco/image_info_test2015.json"},
        "vg": {"image_data": f / "vg/image_data.json", "region_descriptions": f / "vg/region_descriptions.json",
               "image_root": images / "vg"},
        "flickr30k": {"karpathy": f / "flickr30k/dataset_flickr30k.json", "image_root": images / "flickr30k"},
        # the fixture images of CC/SBU lie in the sha1 layout; test_read_web.py lays them out as img2dataset's too
        "cc": {"train_tsv": f / "cc/Train_GCC-training.tsv", "val_tsv": f / "cc/Validation_GCC-1.1.0-Validation.tsv",
               "image_root": images / "cc", "image_layout": "sha1"},
        "sbu": {"urls": f / "sbu/SBU_captioned_photo_dataset_urls.txt",
                "captions": f / "sbu/SBU_captioned_photo_dataset_captions.txt", "image_root": images / "sbu",
                "image_layout": "sha1"},
        "vqa": {f"questions_{s}": f / f"vqa/v2_OpenEnded_mscoco_{s}{y}_questions.json"
                for s, y in (("train", 2014), ("val", 2014), ("test", 2015))}
        | {f"annotations_{s}": f / f"vqa/v2_mscoco_{s}2014_annotations.json" for s in ("train", "val")},
        "vcr": {"train": f / "vcr/train.jsonl", "val": f / "vcr/val.jsonl", "test": f / "vcr/test.jsonl",
                "image_root": images / "vcr"},
        "nlvr2": {"train": f / "nlvr2/train.json", "dev": f / "nlvr2/dev.json", "test": f / "nlvr2/test1.json",
                  "image_root": images / "nlvr2"},
        "snli_ve": {s: f / f"snli_ve/snli_ve_{s}.jsonl" for s in ("train", "dev", "test")},
        "refcoco": {"refs": refs, "instances": f / "refcoco/instances.json"},
    }
    out = [f"sources.{ds}.{key}={path}" for ds, keys in sources.items() for key, path in keys.items()]
    # as on real data: no evaluation-server files (the VQA and VCR tests give them where they read them)
    out += ["sources.vqa.annotations_test=null", "sources.vcr.test_labels=null"]
    return out + [f"paths.data={tmp_path / 'data'}", f"ingest.max_text_chars={MAX_TEXT_CHARS}"]


@pytest.fixture
def fixture_params(tmp_path) -> Params:
    """Params whose sources are the hand-written fixtures (world: real, so every path must exist)."""
    return load_params(REPO / "params.yaml", fixture_overrides(tmp_path) + ["world=real"])


def ingest(params: Params, dataset: str) -> tuple[IngestResult, pd.DataFrame, pd.DataFrame]:
    """Ingest one dataset; returns the result, the manifest and the rejects as DataFrames."""
    result = ingest_dataset(params, dataset, progress=False)
    return result, pd.read_parquet(result.manifest_path), pd.read_parquet(result.rejects_path)


def fates(rejects: pd.DataFrame) -> list[tuple[str, str, str]]:
    """(file name, locator, reason) of every reject, in file order."""
    return [(Path(f).name, loc, reason) for f, loc, reason in zip(rejects.source_file, rejects.locator, rejects.reason)]


def write_shard(root: Path, shard: int, rows: list[tuple[str, str, str | None]], *, finished: bool = True,
                per_shard: int = 100) -> None:
    """Shard ``shard`` of img2dataset's output: rows (url, status, error_message), keys numbered as
    img2dataset numbers them; the image of a successful row is moved in from ``<root>/<sha1>.jpg``."""
    name = f"{shard:05d}"
    (root / name).mkdir(parents=True, exist_ok=True)
    metas = []
    for i, (url, status, error) in enumerate(rows):
        key = f"{per_shard * shard + i:07d}"
        flat = root / f"{url_key(url)}.jpg"
        if status == "success":
            shutil.move(flat, root / name / f"{key}.jpg")
        metas.append({"caption": None, "url": url, "key": key, "status": status, "error_message": error}
                     | {k: None for k in SHARD_SCHEMA.names[5:]})
    pq.write_table(pa.Table.from_pylist(metas, schema=SHARD_SCHEMA), root / f"{name}.parquet")
    if finished:
        (root / f"{name}_stats.json").write_text(json.dumps({"count": len(rows)}))


def partial_real_params(tmp_path: Path) -> tuple[Path, Path]:
    """(params file, datasets root): the repo's params.yaml with ``world: real``, every ``sources`` path
    moved from data/raw/mini/ to an empty ``<tmp>/datasets/`` (nothing on disk until a test puts a
    dataset there in its published layout) and ``paths.data`` at ``<tmp>/data``. Nothing else changes:
    ``ingest.datasets``, ``extract.sources`` and ``finetune.tasks`` still name every dataset."""
    datasets = tmp_path / "datasets"
    datasets.mkdir()
    text = (REPO / "params.yaml").read_text().replace("data/raw/mini/", f"{datasets}/")
    text = text.replace("\nworld: mini ", "\nworld: real ", 1).replace("\n  data: data ", f"\n  data: {tmp_path / 'data'} ", 1)
    path = tmp_path / "params.yaml"
    path.write_text(text)
    return path, datasets


def put_cc(datasets: Path, scratch: Path) -> Path:
    """CC in its published layout below ``datasets/cc``: the fixture TSVs and, in img2dataset's
    layout, the fixture images (one finished shard; a URL without an image failed with a 404)."""
    cc = datasets / "cc"
    cc.mkdir(parents=True)
    for tsv in ("Train_GCC-training.tsv", "Validation_GCC-1.1.0-Validation.tsv"):
        shutil.copy(FIXTURES / "cc" / tsv, cc / tsv)
    write_fixture_images(scratch)
    shutil.move(scratch / "cc", cc / "images")
    urls = ["http://example.com/img/1.jpg", "http://example.com/img/7.jpg", "http://example.com/img/10.jpg",
            "https://example.com/img/13.jpg?x=1", "http://example.com/val/1.jpg"]
    rows = [(u, "success", None) if (cc / "images" / f"{url_key(u)}.jpg").exists()
            else (u, "failed_to_download", "HTTP Error 404: Not Found") for u in urls]
    write_shard(cc / "images", 0, rows)
    return cc
