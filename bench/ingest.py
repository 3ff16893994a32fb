"""Benchmark: streaming CC ingest vs a plain pandas baseline on a 1M-row CC-format TSV, with the
images in the sha1 layout and in img2dataset's shards.

    .venv/bin/python bench/ingest.py [--rows 1000000] [--keep DIR]

Writes a synthetic ``caption<TAB>url`` TSV (with ~1% defects of every line-level kind: blank
captions, bad URLs, duplicate URLs, non-UTF-8 bytes, lines with a wrong field count, too-long
captions) and img2dataset shard tables for its URLs (10,000 per shard, every 97th a failed
download; no image files), then runs, each in its own subprocess so peak memory (ru_maxrss) is
measured apart:

- ours:   ``pipeline.ingest.ingest.ingest_dataset(params, "cc")`` with ``check_images`` off, once per
          ``sources.cc.image_layout`` (sha1: paths from the URL hash; img2dataset: each batch of
          rows joined to the shards' url -> key, status by hashed lookups);
- pandas: ``pd.read_csv(sep="\\t", quoting=QUOTE_NONE)`` + the same validity rules in pandas
          (strip/blank/length, URL regex, non-UTF-8, duplicate URL, sha1 image ids), writing the
          same manifest and rejects parquet files; for the img2dataset layout it also reads the
          shard tables and ``merge``s them on url. Lines with a wrong field count are dropped by
          ``on_bad_lines="skip"``: pandas cannot keep them as rejects, so it does less work there.

Prints rows/s of each, the ratios, peak RSS of each (and of the bare interpreter after imports),
and checks that ours and pandas kept the same example ids in each layout.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MAX_TEXT_CHARS = 1000


def write_tsv(path: Path, rows: int, seed: int = 0) -> None:
    """A CC-format TSV with ~1% defects of each kind (deterministic for a seed)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    kinds = rng.integers(0, 100, size=rows)
    words = [b"a", b"red", b"dog", b"on", b"the", b"beach", b"with", b"blue", b"sky", b"near", b"an", b"old",
             b"house", b"at", b"sunset", b"two", b"people", b"walking"]
    word_idx = rng.integers(0, len(words), size=(rows, 9))
    with path.open("wb", buffering=1 << 20) as fh:
        for i in range(rows):
            caption = b" ".join(words[j] for j in word_idx[i])
            url = b"http://img%d.example.com/photos/%08d/large.jpg" % (i % 53, i)
            kind = kinds[i]
            if kind == 0:
                caption = b"  "
            elif kind == 1:
                url = b"htp:/broken.example.com/%d.jpg" % i
            elif kind == 2 and i > 0:
                url = b"http://img%d.example.com/photos/%08d/large.jpg" % ((i - 1) % 53, i - 1)  # duplicate
            elif kind == 3:
                caption = b"caf\xe9 " + caption
            elif kind == 4:
                caption = caption + b"\textra field"
            elif kind == 5:
                caption = caption * 120  # > MAX_TEXT_CHARS
            fh.write(caption + b"\t" + url + b"\n")


FAILED_EVERY = 97  # every 97th URL of the shards is a failed download
PER_SHARD = 10_000


def write_shards(tsv: Path, root: Path) -> int:
    """img2dataset's shard tables (and _stats.json) for the URLs of ``tsv`` in line order, each
    once, as ``download@cc`` would have got them; returns the number of failed downloads."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.mini_world.shards import SHARD_SCHEMA

    urls = []
    with tsv.open("rb") as fh:
        for line in fh:
            fields = line.rstrip(b"\r\n").split(b"\t")
            if len(fields) == 2:
                urls.append(fields[1].strip().decode("utf-8", errors="replace"))
    urls = pa.array(urls).unique()
    root.mkdir(parents=True, exist_ok=True)
    failed = 0
    for shard, start in enumerate(range(0, len(urls), PER_SHARD)):
        part = urls.slice(start, PER_SHARD)
        n = len(part)
        idx = np.arange(start, start + n)
        bad = (idx + 1) % FAILED_EVERY == 0
        failed += int(bad.sum())
        table = pa.table({
            "caption": pa.nulls(n, pa.string()), "url": part, "key": pa.array([f"{i:09d}" for i in idx.tolist()]),
            "status": pa.array(np.where(bad, "failed_to_download", "success").tolist()),
            "error_message": pa.array(["HTTP Error 404: Not Found" if b else None for b in bad.tolist()], pa.string()),
        } | {name: pa.nulls(n, SHARD_SCHEMA.field(name).type) for name in SHARD_SCHEMA.names[5:]}, schema=SHARD_SCHEMA)
        pq.write_table(table, root / f"{shard:05d}.parquet")
        (root / f"{shard:05d}_stats.json").write_text(json.dumps({"count": n, "successes": n - int(bad.sum())}))
    return failed


def run_ours(tsv: Path, out: Path, layout: str) -> dict:
    from pipeline.params.parser import load_params
    from pipeline.ingest.ingest import ingest_dataset

    empty = out / "empty.tsv"
    empty.write_bytes(b"")
    root = out / "shards" if layout == "img2dataset" else out
    params = load_params(REPO / "params.yaml", [
        f"sources.cc.train_tsv={tsv}", f"sources.cc.val_tsv={empty}", f"sources.cc.image_root={root}",
        f"sources.cc.image_layout={layout}", f"paths.data={out / ('ours_' + layout)}",
        "ingest.check_images=false", f"ingest.max_text_chars={MAX_TEXT_CHARS}"])
    start = time.perf_counter()
    result = ingest_dataset(params, "cc", progress=False)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "rows_in": result.rows_in, "manifest_rows": result.manifest_rows,
            "rejects": result.rejects, "manifest": str(result.manifest_path)}


def run_pandas(tsv: Path, out: Path, layout: str) -> dict:
    import pandas as pd

    from pipeline.common.source_records import URL_RE

    start = time.perf_counter()
    df = pd.read_csv(tsv, sep="\t", header=None, names=["caption", "url"], quoting=csv.QUOTE_NONE, dtype=str,
                     keep_default_na=False, na_filter=False, encoding="utf-8", encoding_errors="replace",
                     on_bad_lines="skip", engine="c")
    rows_in = len(df)
    caption, url = df["caption"].str.strip(), df["url"].str.strip()
    reason = pd.Series(pd.NA, index=df.index, dtype="object")
    # arrow-backed strings cannot hold undecodable bytes: they arrive as U+FFFD
    non_utf8 = caption.str.contains("\ufffd", regex=False) | url.str.contains("\ufffd", regex=False)
    reason[non_utf8] = "non_utf8"
    reason[reason.isna() & (caption.str.len() == 0)] = "missing_caption"
    reason[reason.isna() & (caption.str.len() > MAX_TEXT_CHARS)] = "text_too_long"
    reason[reason.isna() & ~url.str.match(URL_RE.pattern, case=False)] = "bad_url"
    ok = reason.isna()
    image_path = pd.Series("", index=df.index, dtype=object)
    if layout == "img2dataset":  # the shards' url -> shard, key, status: a hash join (Series.map)
        root = out / "shards"
        shards = pd.concat([pd.read_parquet(f, columns=["url", "key", "status"]).assign(shard=f.stem)
                            for f in sorted(root.glob("*.parquet"))]).drop_duplicates("url").set_index("url")
        status = url[ok].map(shards["status"])
        reason[ok & (status != "success").reindex(df.index, fill_value=False)] = "missing_image"
        ok = reason.isna()
        image_path[ok] = (str(root) + "/" + url[ok].map(shards["shard"]) + "/" + url[ok].map(shards["key"]) + ".jpg")
    image_id = pd.Series("", index=df.index, dtype=object)
    image_id[ok] = url[ok].map(lambda u: hashlib.sha1(u.encode("utf-8")).hexdigest())
    if layout == "sha1":
        image_path[ok] = str(out) + "/" + image_id[ok] + ".jpg"
    dup = ok & image_id.duplicated(keep="first") & (image_id != "")
    reason[dup] = "duplicate_id"
    ok = reason.isna()
    manifest = pd.DataFrame({
        "example_id": "cc:" + image_id[ok], "dataset": "cc", "split": "train", "image_source": "cc",
        "image_id": image_id[ok], "image_path": image_path[ok], "url": url[ok], "text": caption[ok]})
    rejected = ~ok
    raw = df["caption"][rejected] + "\t" + df["url"][rejected]  # bad bytes already replaced by U+FFFD
    rejects = pd.DataFrame({"dataset": "cc", "source_file": str(tsv),
                            "locator": "line " + (df.index[rejected] + 1).astype(str), "reason": reason[rejected],
                            "detail": reason[rejected], "raw_row": raw})
    dest = out / f"pandas_{layout}"
    dest.mkdir(exist_ok=True)
    manifest.to_parquet(dest / "cc.parquet", index=False, compression="zstd")
    rejects.to_parquet(dest / "cc.rejects.parquet", index=False, compression="zstd")
    seconds = time.perf_counter() - start
    counts = reason[rejected].value_counts().to_dict()
    return {"seconds": seconds, "rows_in": rows_in, "manifest_rows": int(ok.sum()), "rejects": counts,
            "manifest": str(dest / "cc.parquet")}


LAYOUTS = ("sha1", "img2dataset")


def child(which: str, layout: str, tsv: Path, out: Path) -> None:
    sys.path.insert(0, str(REPO))
    import pandas  # noqa: F401  (both sides pay for the same imports before measuring)
    import pyarrow.parquet  # noqa: F401

    import pipeline.ingest.ingest  # noqa: F401

    idle_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = (run_ours if which == "ours" else run_pandas)(tsv, out, layout)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result["idle_rss_mb"] = idle_kb / 1024
    print(json.dumps(result))


def measure(which: str, layout: str, tsv: Path, out: Path) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", which, layout, str(tsv), str(out)],
                          capture_output=True, text=True, check=False, cwd=REPO)
    if proc.returncode != 0:
        raise SystemExit(f"{which} {layout} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _ids(manifest: str) -> list[str]:
    import pyarrow.parquet as pq

    return pq.read_table(manifest, columns=["example_id"])["example_id"].to_pylist()


def report(rows: int, runs: dict[tuple[str, str], dict], small: dict, failed: int) -> None:
    """One table of every run, then the ratios and checks."""
    print(f"{'run':<26} {'seconds':>8} {'rows/s':>10} {'peak RSS':>9} {'above idle':>10} {'manifest':>9} "
          f"{'missing_image':>13}")
    for (which, layout), r in runs.items():
        print(f"{which + ' ' + layout:<26} {r['seconds']:8.2f} {rows / r['seconds']:>10,.0f} "
              f"{r['peak_rss_mb']:7.0f}MB {r['peak_rss_mb'] - r['idle_rss_mb']:8.0f}MB {r['manifest_rows']:>9,} "
              f"{r['rejects'].get('missing_image', 0):>13,}")
    for layout in LAYOUTS:
        ours, pandas_ = runs["ours", layout], runs["pandas", layout]
        print(f"{layout}: speed ours/pandas {pandas_['seconds'] / ours['seconds']:.2f}x, peak RSS ours/pandas "
              f"{ours['peak_rss_mb'] / pandas_['peak_rss_mb']:.2f}, same manifest example ids: "
              f"{_ids(ours['manifest']) == _ids(pandas_['manifest'])}")
    sha1, i2d = runs["ours", "sha1"], runs["ours", "img2dataset"]
    print(f"ours img2dataset vs sha1: {i2d['seconds'] / sha1['seconds']:.2f}x the time, "
          f"{i2d['peak_rss_mb'] - sha1['peak_rss_mb']:+.0f} MB peak RSS; {failed:,} failed downloads in the shards")
    print(f"ours img2dataset on the first {rows // 10:,} rows: peak RSS {small['peak_rss_mb']:.0f} MB "
          f"(vs {i2d['peak_rss_mb']:.0f} MB on all {rows:,}; the shard index holds every shard's URLs)")
    print("rejects by reason: " + "; ".join(f"{w} {lay}={dict(sorted(r['rejects'].items()))}"
                                            for (w, lay), r in runs.items() if w == "ours" or lay == "sha1")
          + " (pandas drops wrong-field-count lines silently)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--keep", type=Path, default=None, help="work in this directory and keep it")
    parser.add_argument("--child", nargs=4, metavar=("WHICH", "LAYOUT", "TSV", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], Path(args.child[2]), Path(args.child[3]))
        return
    sys.path.insert(0, str(REPO))
    with tempfile.TemporaryDirectory(prefix="bench_ingest_") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        tsv = work / "Train_GCC-training.tsv"
        start = time.perf_counter()
        write_tsv(tsv, args.rows)
        failed = write_shards(tsv, work / "shards")
        print(f"wrote {args.rows:,} rows ({tsv.stat().st_size / 1e6:.0f} MB) and their img2dataset shard tables "
              f"in {time.perf_counter() - start:.1f}s")
        runs = {(which, layout): measure(which, layout, tsv, work)
                for layout in LAYOUTS for which in ("ours", "pandas")}
        small = work / "tenth.tsv"  # the first tenth of the same file, the same shards
        with tsv.open("rb") as src, small.open("wb") as dst:
            dst.writelines(line for _, line in zip(range(args.rows // 10), src))
        (work / "tenth_out").mkdir(exist_ok=True)
        (work / "tenth_out" / "shards").symlink_to(work / "shards")
        report(args.rows, runs, measure("ours", "img2dataset", small, work / "tenth_out"), failed)


if __name__ == "__main__":
    main()
