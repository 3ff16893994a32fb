"""Benchmark: streaming CC ingest vs a plain pandas baseline on a 1M-row CC-format TSV.

    .venv/bin/python bench/ingest.py [--rows 1000000] [--keep DIR]

Writes a synthetic ``caption<TAB>url`` TSV (with ~1% defects of every line-level kind: blank
captions, bad URLs, duplicate URLs, non-UTF-8 bytes, lines with a wrong field count, too-long
captions), then runs, each in its own subprocess so peak memory (ru_maxrss) is measured apart:

- ours:   ``pipeline.ingest.ingest_dataset(params, "cc")`` with ``check_images`` off;
- pandas: ``pd.read_csv(sep="\\t", quoting=QUOTE_NONE)`` + the same validity rules in pandas
          (strip/blank/length, URL regex, non-UTF-8, duplicate URL, sha1 image ids), writing the
          same manifest and rejects parquet files. Lines with a wrong field count are dropped by
          ``on_bad_lines="skip"``: pandas cannot keep them as rejects, so it does less work there.

Prints rows/s of each, the ratio, peak RSS of each (and of the bare interpreter after imports),
and checks that both kept the same example ids.
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


def run_ours(tsv: Path, out: Path) -> dict:
    from pipeline.config import load_params
    from pipeline.ingest import ingest_dataset

    empty = out / "empty.tsv"
    empty.write_bytes(b"")
    params = load_params(REPO / "params.yaml", [
        f"sources.cc.train_tsv={tsv}", f"sources.cc.val_tsv={empty}", f"sources.cc.image_root={out}",
        f"paths.data={out / 'ours'}", "ingest.check_images=false", f"ingest.max_text_chars={MAX_TEXT_CHARS}"])
    start = time.perf_counter()
    result = ingest_dataset(params, "cc", progress=False)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "rows_in": result.rows_in, "manifest_rows": result.manifest_rows,
            "rejects": result.rejects, "manifest": str(result.manifest_path)}


def run_pandas(tsv: Path, out: Path) -> dict:
    import pandas as pd

    from pipeline.sources.records import URL_RE

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
    image_id = pd.Series("", index=df.index, dtype=object)
    image_id[ok] = url[ok].map(lambda u: hashlib.sha1(u.encode("utf-8")).hexdigest())
    dup = ok & image_id.duplicated(keep="first") & (image_id != "")
    reason[dup] = "duplicate_id"
    ok = reason.isna()
    manifest = pd.DataFrame({
        "example_id": "cc:" + image_id[ok], "dataset": "cc", "split": "train", "image_source": "cc",
        "image_id": image_id[ok], "image_path": str(out) + "/" + image_id[ok] + ".jpg", "url": url[ok],
        "text": caption[ok]})
    rejected = ~ok
    raw = df["caption"][rejected] + "\t" + df["url"][rejected]  # bad bytes already replaced by U+FFFD
    rejects = pd.DataFrame({"dataset": "cc", "source_file": str(tsv),
                            "locator": "line " + (df.index[rejected] + 1).astype(str), "reason": reason[rejected],
                            "detail": reason[rejected], "raw_row": raw})
    (out / "pandas").mkdir(exist_ok=True)
    manifest.to_parquet(out / "pandas" / "cc.parquet", index=False, compression="zstd")
    rejects.to_parquet(out / "pandas" / "cc.rejects.parquet", index=False, compression="zstd")
    seconds = time.perf_counter() - start
    counts = reason[rejected].value_counts().to_dict()
    return {"seconds": seconds, "rows_in": rows_in, "manifest_rows": int(ok.sum()), "rejects": counts,
            "manifest": str(out / "pandas" / "cc.parquet")}


def child(which: str, tsv: Path, out: Path) -> None:
    sys.path.insert(0, str(REPO))
    import pandas  # noqa: F401  (both sides pay for the same imports before measuring)
    import pyarrow.parquet  # noqa: F401

    import pipeline.ingest  # noqa: F401

    idle_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = (run_ours if which == "ours" else run_pandas)(tsv, out)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result["idle_rss_mb"] = idle_kb / 1024
    print(json.dumps(result))


def measure(which: str, tsv: Path, out: Path) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", which, str(tsv), str(out)], capture_output=True,
                          text=True, check=False, cwd=REPO)
    if proc.returncode != 0:
        raise SystemExit(f"{which} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--keep", type=Path, default=None, help="work in this directory and keep it")
    parser.add_argument("--child", nargs=3, metavar=("WHICH", "TSV", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], Path(args.child[1]), Path(args.child[2]))
        return
    with tempfile.TemporaryDirectory(prefix="bench_ingest_") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        tsv = work / "Train_GCC-training.tsv"
        start = time.perf_counter()
        write_tsv(tsv, args.rows)
        print(f"wrote {args.rows:,} rows ({tsv.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - start:.1f}s")
        ours, pandas_ = measure("ours", tsv, work), measure("pandas", tsv, work)
        small = work / "tenth.tsv"  # the first tenth of the same file: constant memory means the same peak
        with tsv.open("rb") as src, small.open("wb") as dst:
            dst.writelines(line for _, line in zip(range(args.rows // 10), src))
        (work / "tenth_out").mkdir(exist_ok=True)
        ours_small = measure("ours", small, work / "tenth_out")
        for name, r in (("ours (streaming)", ours), ("pandas read_csv", pandas_)):
            print(f"{name:<17} {r['seconds']:6.2f}s  {args.rows / r['seconds']:>9,.0f} rows/s  "
                  f"peak RSS {r['peak_rss_mb']:6.0f} MB (idle after imports {r['idle_rss_mb']:.0f} MB)  "
                  f"manifest {r['manifest_rows']:,}  rejects {sum(r['rejects'].values()):,}")
        print(f"speed ratio ours/pandas: {pandas_['seconds'] / ours['seconds']:.2f}x   "
              f"peak RSS ratio ours/pandas: {ours['peak_rss_mb'] / pandas_['peak_rss_mb']:.2f}  "
              f"(above idle: {ours['peak_rss_mb'] - ours['idle_rss_mb']:.0f} MB vs "
              f"{pandas_['peak_rss_mb'] - pandas_['idle_rss_mb']:.0f} MB)")
        print(f"ours on the first {args.rows // 10:,} rows: peak RSS {ours_small['peak_rss_mb']:.0f} MB "
              f"(vs {ours['peak_rss_mb']:.0f} MB on all {args.rows:,})")
        import pyarrow.parquet as pq

        same = (pq.read_table(ours["manifest"], columns=["example_id"])["example_id"].to_pylist()
                == pq.read_table(pandas_["manifest"], columns=["example_id"])["example_id"].to_pylist())
        print(f"same manifest example ids: {same}; rejects by reason ours={dict(sorted(ours['rejects'].items()))} "
              f"pandas={dict(sorted(pandas_['rejects'].items()))} (pandas drops wrong-field-count lines silently)")


if __name__ == "__main__":
    main()
