"""UNITER's released LMDBs, written in the release's own formats for the importer's tests.

The writers follow the reference's converters (scripts/convert_imgdir.py, data/data.py): image
values are ``np.savez_compressed`` archives (with the ``allow_pickle`` array numpy 1.x stored beside
the fields) or msgpack maps packed by msgpack-numpy; text values are lz4 *frames* of msgpack maps.
Nothing here is written in this project's own format, so the importer is checked against the
release's format, not against itself.
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import lmdb
import lz4.frame
import msgpack
import msgpack_numpy
import numpy as np

from pipeline.stores.tokenization import WordPieceTokenizer

D, C1 = 8, 5  # feature dim, classes + background
FEAT = "feat_th0.2_max100_min10"
NBB = "nbb_th0.2_max100_min10.json"


def regions(rng: np.random.Generator, n: int, above: int | None = None) -> dict[str, np.ndarray]:
    """One image's fields as the release stores them; ``above`` regions have conf > 0.2 (conf descending)."""
    x1, y1 = rng.uniform(0, 0.5, n), rng.uniform(0, 0.5, n)
    x2, y2 = x1 + rng.uniform(0.05, 0.5, n), y1 + rng.uniform(0.05, 0.5, n)
    bb = np.stack([x1, y1, x2, y2, x2 - x1, y2 - y1], 1).astype(np.float16)
    above = n if above is None else above
    conf = np.concatenate([rng.uniform(0.3, 1.0, above), rng.uniform(0.0, 0.15, n - above)])
    return {"features": rng.normal(size=(n, D)).astype(np.float16), "norm_bb": bb,
            "conf": np.sort(conf)[::-1].astype(np.float16),
            "soft_labels": rng.dirichlet(np.ones(C1), n).astype(np.float16)}


def npz_value(fields: dict) -> bytes:
    """``np.savez_compressed`` as the release's converter called it under numpy 1.x, where its
    ``allow_pickle=True`` became one more array of that name."""
    buf = io.BytesIO()
    np.savez_compressed(buf, **fields)
    with zipfile.ZipFile(buf, "a", compression=zipfile.ZIP_DEFLATED) as zf:
        flag = io.BytesIO()
        np.lib.format.write_array(flag, np.asarray(True))
        zf.writestr("allow_pickle.npy", flag.getvalue())
    return buf.getvalue()


def msgpack_value(fields: dict) -> bytes:
    return msgpack.packb(fields, default=msgpack_numpy.encode, use_bin_type=True)


def put_all(path: Path, items: dict[str, bytes]) -> None:
    env = lmdb.open(str(path), map_size=64 << 20)
    with env.begin(write=True) as txn:
        for key, value in items.items():
            txn.put(key.encode("utf-8"), value)
    env.close()


def write_img_db(root: Path, name: str, entries: dict[str, dict], *, compressed: bool,
                 nbb: dict[str, int] | None, raw: dict[str, bytes] | None = None) -> None:
    d = root / "img_db" / name
    (d / (FEAT + ("_compressed" if compressed else ""))).mkdir(parents=True)
    enc = npz_value if compressed else msgpack_value
    items = {k: enc(v) for k, v in entries.items()} | (raw or {})
    items["__keys__"] = json.dumps(sorted(items)).encode()
    put_all(d / (FEAT + ("_compressed" if compressed else "")), items)
    if nbb is not None:
        (d / NBB).write_text(json.dumps(nbb))


def write_txt_db(root: Path, name: str, examples: dict[str, dict], tok: WordPieceTokenizer,
                 raw: dict[str, bytes] | None = None, id2len_extra: tuple[str, ...] = ()) -> Path:
    d = root / "txt_db" / f"{name}.db"
    d.mkdir(parents=True)
    items = {k: lz4.frame.compress(msgpack.packb(v, use_bin_type=True)) for k, v in examples.items()}
    put_all(d, items | (raw or {}))
    s = tok.special_ids
    meta = {"toker": "bert-base-uncased", "UNK": s["unk"], "CLS": s["cls"], "SEP": s["sep"], "MASK": s["mask"],
            "v_range": [999, tok.vocab_size]}
    ids = [*examples, *(raw or {}), *id2len_extra]
    (d / "meta.json").write_text(json.dumps(meta))
    # the side files as the release's: from the examples, whatever (damaged) values they hold
    lengths = {k: examples.get(k, {}).get("input_ids") for k in ids}
    (d / "id2len.json").write_text(json.dumps({k: len(v) if isinstance(v, list) else 0 for k, v in lengths.items()}))
    (d / "txt2img.json").write_text(json.dumps({k: v.get("img_fname") for k, v in examples.items()}, default=repr))
    return d


def coco(split: str, i: int) -> str:
    return f"coco_{split}_{i:012d}.npz"
