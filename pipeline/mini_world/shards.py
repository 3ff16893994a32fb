"""CC/SBU images laid out as img2dataset's ``files`` output, the way ``download@cc|sbu`` leaves them.

img2dataset (1.47, ``output_format=files``) numbers the URLs it is given: the i-th URL of shard s
gets the key ``10**oom_sample_per_shard * s + i``, zero-padded to ``oom_shard_count +
oom_sample_per_shard`` digits. Shard s is written as

- ``SSSSS/<key>.jpg``, ``<key>.txt`` (the caption) and ``<key>.json`` (the parquet row) for each
  downloaded image; nothing for a failed one;
- ``SSSSS.parquet``: one row per URL: the input columns (``caption``, ``url``), then ``key``,
  ``status``, ``error_message``, ``width``, ``height``, ``original_width``, ``original_height``,
  ``exif``, ``sha256``;
- ``SSSSS_stats.json``: counts per status, written when the shard is done (what resuming looks at).

The download stage runs img2dataset with ``disable_all_reencoding``: image bytes are kept as served,
so ``width``/``height`` are null. tests/pipeline/ingest/test_download.py checks this schema against a real
img2dataset run. Here a planted ``missing`` image becomes a failed download (HTTP 404) and its
defect record names the path the image would have had.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.mini_world.world import World

SAMPLES_PER_SHARD = 100  # small, so that even the small test world has several shards
OOM_SHARD_COUNT = 5  # img2dataset's default
NOT_FOUND = "HTTP Error 404: Not Found"  # urllib's message, as img2dataset records it

SHARD_SCHEMA = pa.schema([
    ("caption", pa.string()), ("url", pa.string()), ("key", pa.string()), ("status", pa.string()),
    ("error_message", pa.string()), ("width", pa.int32()), ("height", pa.int32()),
    ("original_width", pa.int32()), ("original_height", pa.int32()), ("exif", pa.string()), ("sha256", pa.string()),
])


def shard_key(index: int, per_shard: int = SAMPLES_PER_SHARD) -> tuple[str, str]:
    """(shard name, key) of the ``index``-th URL given to img2dataset."""
    shard, i = divmod(index, per_shard)
    oom_sample = math.ceil(math.log10(per_shard))
    return f"{shard:0{OOM_SHARD_COUNT}d}", f"{10**oom_sample * shard + i:0{OOM_SHARD_COUNT + oom_sample}d}"


def lay_out(world: World, dataset: str, rows: list[Any]) -> None:
    """Move the images of ``rows`` (web rows with ``image_key``, in the order their URLs were given
    to img2dataset) from ``<dataset>/images/<sha1>.jpg`` into shards, and write the shard files."""
    image_dir = f"{dataset}/images"
    shards: dict[str, list[dict[str, Any]]] = {}
    for index, row in enumerate(rows):
        shard, key = shard_key(index)
        rec = world.images[row.image_key]
        old, new = rec.relpath, f"{image_dir}/{shard}/{key}.jpg"
        caption = row.caption.decode("utf-8", errors="replace")
        meta = {"caption": caption, "url": row.url, "key": key, "status": "success", "error_message": None,
                "width": None, "height": None, "original_width": None, "original_height": None,
                "exif": None, "sha256": None}
        path = world.root / old
        if path.exists():
            data = path.read_bytes()
            path.unlink()
            meta["exif"], meta["sha256"] = "{}", hashlib.sha256(data).hexdigest()  # the world's JPEGs carry no EXIF
            world.write_bytes(new, data)
            world.write_bytes(f"{image_dir}/{shard}/{key}.txt", caption.encode())
            world.write_bytes(f"{image_dir}/{shard}/{key}.json", json.dumps(meta, indent=4).encode())
        else:  # a planted missing image: the server answered 404
            meta["status"], meta["error_message"] = "failed_to_download", NOT_FOUND
        rec.relpath = new
        for defect in world.defects:
            if defect["file"] == old:
                defect["file"] = new
        shards.setdefault(shard, []).append(meta)
    for shard, metas in shards.items():
        _write_shard(world, image_dir, shard, metas)


def _write_shard(world: World, image_dir: str, shard: str, metas: list[dict[str, Any]]) -> None:
    table = pa.Table.from_pylist(metas, schema=SHARD_SCHEMA)
    out = world.root / image_dir / f"{shard}.parquet"
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, out)
    statuses = Counter(m["status"] for m in metas)
    messages = Counter("success" if m["status"] == "success" else m["error_message"] for m in metas)
    stats = {"count": len(metas), "successes": statuses["success"],
             "failed_to_download": statuses["failed_to_download"], "failed_to_resize": statuses["failed_to_resize"],
             "duration": 0.0, "start_time": 0.0, "end_time": 0.0,  # fixed: the world is byte-identical per seed
             "status_dict": dict(sorted(messages.items()))}
    world.write_bytes(f"{image_dir}/{shard}_stats.json", json.dumps(stats, indent=4).encode())
