"""Benchmark: decontaminating generated CC/SBU-style manifests of 5M, 20M, 100M rows against a 200K-image eval set.

Per size, the rows are generated on the fly (vectorized, one batch of 1M rows at a time) into a
parquet manifest, then each side runs in a fresh process started from this small one (so the peak
it reports is its own: ``VmHWM`` of /proc/self/status, which begins at the child's exec, unlike
``ru_maxrss``, which a child keeps from the process it was forked from):

- ``streamed``: ``pipeline.decontam.decontaminate.decontaminate_streamed`` as the stage runs it for
  CC/SBU: read the manifest in record batches, match, sort runs, merge, write the clean parquet;
  pHash search off (no images here);
- ``in_memory`` (``--sides``): ``decontaminate_dataset`` on the whole table (COCO's path; every
  dataset's before streaming), the clean table written as the stage writes it;
- ``pandas`` (the baseline; ``--skip-baseline`` at sizes where it cannot run): ``Series.apply`` of
  ``canonical_url`` and ``flickr_photo_id`` on every row, then ``merge`` with the eval key tables.

All sides that run must remove exactly the same images for the same reasons; the vectorized keys
must equal ``canonical_url`` on a sample. Target: >= 1M rows/s on 2 cores, peak memory flat in the
row count.

    .venv/bin/python bench/decontaminate.py [--rows 5000000 20000000 100000000] [--skip-baseline-above 5000000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

HOSTS = ["i.pinimg.com", "media.gettyimages.com", "farm.example-photos.com", "img.news-site.co.uk",
         "cdn.shopify.com", "upload.wikimedia.org", "static.blog.example.org", "pictures.example.net"]
COCO_URL = "http://images.cocodataset.org/val2014/COCO_val2014_{:012d}.jpg"


# --------------------------------------------------------------------------------------------
# synthetic data


def flickr_url(rng: random.Random, photo: int) -> str:
    """A random Flickr static URL form of ``photo`` (as SBU and COCO flickr_url carry them)."""
    server, secret, farm = rng.randrange(1, 9999), f"{rng.getrandbits(40):010x}", rng.randrange(1, 9)
    form = rng.random()
    if form < 0.55:
        return f"http://farm{farm}.static.flickr.com/{server}/{photo}_{secret}.jpg"
    if form < 0.8:
        return f"https://farm{farm}.staticflickr.com/{server}/{photo}_{secret}_z.jpg"
    if form < 0.95:
        return f"https://live.staticflickr.com/{server}/{photo}_{secret}_b.jpg"
    return f"https://c{farm}.staticflickr.com/{farm}/{server}/{photo}_{secret}_m.jpg"


def eval_table(n: int, seed: int) -> tuple[pa.Table, dict]:
    """n eval images: Flickr30k photos, COCO images (coco_url + flickr_url), NLVR2 web images."""
    rng = random.Random(seed)
    n_f30k, n_coco = n * 31 // 200, n // 2
    n_web = n - n_f30k - n_coco
    rows = {c: [] for c in ("ref", "image_source", "image_id", "image_path", "url", "flickr_url", "flickr_id",
                            "coco_id")}

    def add(ref, source, image_id, url=None, furl=None):
        for c, v in zip(rows, (ref, source, image_id, None, url, furl, None, None)):
            rows[c].append(v)

    f30k = [10**9 + 7 * k for k in range(n_f30k)]
    for photo in f30k:
        add(f"flickr30k/test/{photo}", "flickr30k", str(photo))
    coco_photos = [2 * 10**9 + 11 * k for k in range(n_coco)]
    for k, photo in enumerate(coco_photos):
        add(f"coco/test/{k}", "coco", str(k), COCO_URL.format(k), flickr_url(rng, photo))
    web = [f"https://nlvr-pics.example.com/{k % 331}/{rng.getrandbits(48):012x}.jpg?s=1&r={k}" for k in range(n_web)]
    for k, url in enumerate(web):
        add(f"nlvr2/test/{k}-img0", "nlvr2", f"{k}-img0", url)
    table = pa.table({c: pa.array(v, pa.string()) for c, v in rows.items()})
    return table, {"f30k": f30k, "coco_photos": coco_photos, "n_coco": n_coco, "web": web}


def url_variant(rng: random.Random, url: str) -> str:
    """An equivalent spelling: host case, default port, dot segments, fragment, reordered query."""
    scheme, rest = url.split("://", 1)
    host, path = rest.split("/", 1)
    query = ""
    if "?" in path:
        path, query = path.split("?", 1)
        query = "?" + "&".join(reversed(query.split("&")))
    port = ":80" if scheme == "http" else ":443"
    return f"{scheme.upper()}://{host.upper()}{port}/./{path}{query}#frag"


WORDS = ("a", "the", "man", "woman", "dog", "red", "blue", "car", "street", "on", "with", "in", "of", "old",
         "house", "tree", "sitting", "standing", "next", "to", "large", "small", "beach", "city", "photo")


def captions(rng: random.Random, n: int) -> list[str]:
    """CC-like captions (~8-14 words, ~60 characters)."""
    return [" ".join(rng.choices(WORDS, k=rng.randrange(8, 15))) for _ in range(n)]




def _pool(rng: random.Random, n: int) -> pa.Array:
    return pa.array(captions(rng, n), pa.string())


def _join(*parts) -> pa.Array:
    """Element-wise concatenation of string arrays and scalars."""
    return pc.binary_join_element_wise(*[p if isinstance(p, (pa.Array, pa.ChunkedArray)) else pa.scalar(p)
                                         for p in parts], pa.scalar(""))


def _hex(rng: np.random.Generator, n: int, nbytes: int) -> pa.Array:
    """n random lower-case hex strings of 2 * nbytes characters, built from one byte buffer."""
    digits = np.frombuffer(b"0123456789abcdef", np.uint8)
    raw = rng.integers(0, 256, (n, nbytes), dtype=np.uint8)
    chars = np.empty((n, 2 * nbytes), np.uint8)
    chars[:, 0::2], chars[:, 1::2] = digits[raw >> 4], digits[raw & 15]
    offsets = np.arange(0, 2 * nbytes * (n + 1), 2 * nbytes, dtype=np.int32)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(chars.tobytes()))


def _num(values: np.ndarray) -> pa.Array:
    return pc.cast(pa.array(values), pa.string())


def pretrain_batch(n: int, start: int, keys: dict, seed: int, pool: pa.Array) -> tuple[pa.Table, int]:
    """Rows start..start+n of the generated manifest: ~0.3% point at eval images under another URL
    form (built per row), ~44.7% Flickr URLs, the rest CC-style web URLs with queries, upper-case
    hosts, dot segments, ports and percent-escapes (built column-wise)."""
    rng, prng = np.random.default_rng([seed, start]), random.Random(seed * 1_000_003 + start)
    i = np.arange(start, start + n)
    r = rng.random(n)
    which = pa.array(i % len(HOSTS))
    host, upper = pa.array(HOSTS).take(which), pa.array([h.upper() for h in HOSTS]).take(which)
    rand8 = _hex(rng, n, 4)
    web = _join("https://", pc.if_else(pa.array((r >= 0.55) & (r < 0.58)), upper, host), "/", _num(i % 997), "/",
                rand8, "/photo-", _num(i), ".jpg")
    query = _join(web, "?w=", _num(rng.integers(100, 2000, n)), "&h=", _num(rng.integers(100, 2000, n)))
    dots = _join("https://", host, "/", _num(i % 997), "/", rand8, "/./x/../photo%2D", _num(i), ".jpg#top")
    port = _join("https://", host, ":443/", _num(i % 997), "/", rand8, "/ph%6fto caf\u00e9-", _num(i), ".jpg")
    farm, server = _num(rng.integers(1, 9, n)), _num(rng.integers(1, 9999, n))
    secret, photo = _hex(rng, n, 5), _num(3 * 10**9 + i)
    form = rng.random(n)
    flickr = pc.if_else(pa.array(form < 0.55), _join("http://farm", farm, ".static.flickr.com/", server, "/", photo, "_", secret, ".jpg"),
                        pc.if_else(pa.array(form < 0.8), _join("https://farm", farm, ".staticflickr.com/", server, "/", photo, "_", secret, "_z.jpg"),
                                   _join("https://live.staticflickr.com/", server, "/", photo, "_", secret, "_b.jpg")))
    urls = pc.if_else(pa.array(r < 0.45), flickr,
                      pc.if_else(pa.array(r < 0.55), query,
                                 pc.if_else(pa.array((r >= 0.58) & (r < 0.59)), dots,
                                            pc.if_else(pa.array((r >= 0.59) & (r < 0.60)), port, web))))
    planted_at = np.flatnonzero(rng.random(n) < 0.003)
    planted = []
    for k in planted_at:
        kind = prng.random()
        if kind < 1 / 3:
            planted.append(flickr_url(prng, prng.choice(keys["f30k"])))
        elif kind < 2 / 3:
            planted.append(flickr_url(prng, prng.choice(keys["coco_photos"])))
        elif kind < 5 / 6:
            planted.append(url_variant(prng, COCO_URL.format(prng.randrange(keys["n_coco"]))))
        else:
            planted.append(url_variant(prng, prng.choice(keys["web"])))
    if len(planted_at):
        mask = np.zeros(n, bool)
        mask[planted_at] = True
        urls = pc.replace_with_mask(urls.combine_chunks() if isinstance(urls, pa.ChunkedArray) else urls,
                                    pa.array(mask), pa.array(planted, pa.string()))
    # ids as ingest makes them (sha1 of the URL, in no particular order): sorting them costs real time
    ids = _hex(rng, n, 20)
    const = lambda v: pa.array([v], pa.string()).take(pa.array(np.zeros(n, np.int32)))  # noqa: E731
    table = pa.table({
        "example_id": _join("cc:", ids), "dataset": const("cc"), "split": const("train"),
        "image_source": const("cc"), "image_id": ids, "image_path": _join("cc/images/", ids, ".jpg"),
        "url": urls, "text": pool.take(pa.array(rng.integers(0, len(pool), n))),
    })
    return table, len(planted_at)


def write_rows(path: Path, rows: int, keys: dict, seed: int, batch: int = 1_000_000) -> int:
    """Generate ``rows`` rows into the parquet file ``path`` a batch at a time; returns the planted count."""
    pool = _pool(random.Random(seed), 4096)
    planted, writer = 0, None
    for start in range(0, rows, batch):
        table, p = pretrain_batch(min(batch, rows - start), start, keys, seed, pool)
        planted += p
        if writer is None:
            writer = pq.ParquetWriter(path, table.schema, compression="zstd")
        writer.write_table(table, row_group_size=batch)
    writer.close()
    return planted


# --------------------------------------------------------------------------------------------
# the sides, each in its own process


def _peak_rss_mb() -> float:
    """This process's own high-water mark (VmHWM: reset at exec, not inherited like ru_maxrss)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _cpu_s() -> float:
    """User + system CPU seconds of this process so far (all threads)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def side_streamed(paths: dict) -> dict:
    from pipeline.decontam.decontaminate import decontaminate_streamed
    from pipeline.decontam.eval_set import EvalIndex

    evals = pq.read_table(paths["eval"])
    c0, t0 = _cpu_s(), time.perf_counter()
    index = EvalIndex.build(evals)
    t1, c1 = time.perf_counter(), _cpu_s()
    runs = Path(paths["tmp"]) / "runs"
    runs.mkdir()
    result = decontaminate_streamed("cc", Path(paths["rows"]), Path(paths["rejects"]), index,
                                    Path(paths["tmp"]) / "clean.parquet", runs, finder=None, workers=paths["workers"])
    t2 = time.perf_counter()
    removed = sorted((e["image_id"], e["reason"]) for e in result.report["removed"])
    return {"index_s": t1 - t0, "match_s": t2 - t1, "cpu_s": _cpu_s() - c1, "index_cpu_s": c1 - c0, "removed": removed,
            "kept": result.report["kept_rows"], "peak_rss_mb": _peak_rss_mb()}


def side_in_memory(paths: dict) -> dict:
    from pipeline.decontam.decontaminate import decontaminate_dataset, write_parquet
    from pipeline.decontam.eval_set import EvalIndex

    evals = pq.read_table(paths["eval"])
    c0, t0 = _cpu_s(), time.perf_counter()
    index = EvalIndex.build(evals)
    t1, c1 = time.perf_counter(), _cpu_s()
    rows = pq.read_table(paths["rows"])
    result = decontaminate_dataset("cc", rows, pq.read_table(paths["rejects"]), index, finder=None,
                                   workers=paths["workers"])
    write_parquet(result.clean, Path(paths["tmp"]) / "clean_in_memory.parquet")
    t2 = time.perf_counter()
    removed = sorted((e["image_id"], e["reason"]) for e in result.report["removed"])
    return {"index_s": t1 - t0, "match_s": t2 - t1, "cpu_s": _cpu_s() - c1, "index_cpu_s": c1 - c0, "removed": removed,
            "kept": result.clean.num_rows, "peak_rss_mb": _peak_rss_mb()}


def side_pandas(paths: dict) -> dict:
    """The obvious pandas way: per-row apply of the scalar functions, then merges."""
    import pandas as pd

    from pipeline.decontam.urls import canonical_url, flickr_photo_id

    evals = pq.read_table(paths["eval"]).to_pandas()
    c0, t0 = _cpu_s(), time.perf_counter()
    ev_url = pd.DataFrame({"canon": evals["url"].dropna().apply(canonical_url)}).drop_duplicates()
    fid = pd.concat([evals["url"].dropna().apply(flickr_photo_id), evals["flickr_url"].dropna().apply(flickr_photo_id),
                     evals.loc[evals.image_source == "flickr30k", "image_id"].apply(flickr_photo_id)])
    ev_fid = pd.DataFrame({"fid": fid.dropna()}).drop_duplicates()
    ev_img = evals[["image_source", "image_id"]].drop_duplicates()
    t1, c1 = time.perf_counter(), _cpu_s()
    rows = pq.read_table(paths["rows"]).to_pandas()
    rows["canon"] = rows["url"].apply(lambda u: canonical_url(u) if u is not None else None)
    rows["fid"] = rows["url"].apply(lambda u: flickr_photo_id(u) if u is not None else None)
    hit_img = rows.merge(ev_img, on=["image_source", "image_id"], how="inner")["image_id"]
    hit_fid = rows.merge(ev_fid, on="fid", how="inner")["image_id"]
    hit_url = rows.merge(ev_url, on="canon", how="inner")["image_id"]
    reasons: dict[str, str] = {}
    for reason, hits in (("canonical_url", hit_url), ("flickr_photo_id", hit_fid), ("eval_split", hit_img)):
        reasons.update(dict.fromkeys(hits.tolist(), reason))  # later = higher priority
    kept = int((~rows["image_id"].isin(list(reasons))).sum())
    t2 = time.perf_counter()
    return {"index_s": t1 - t0, "match_s": t2 - t1, "cpu_s": _cpu_s() - c1, "index_cpu_s": c1 - c0,
            "removed": sorted(reasons.items()),
            "kept": kept, "peak_rss_mb": _peak_rss_mb()}


SIDES = {"streamed": side_streamed, "in_memory": side_in_memory, "pandas": side_pandas}


def run_side(side: str, paths: dict) -> dict:
    """``side`` in a fresh interpreter (exec'd from this small process); its result as JSON on stdout."""
    out = Path(paths["tmp"]) / f"{side}.json"
    subprocess.run([sys.executable, __file__, "--child", side, json.dumps(paths), str(out)], check=True)
    result = json.loads(out.read_text())
    result["removed"] = {tuple(x) for x in result["removed"]}
    return result


def check_vectorized_equals_scalar(urls: pa.Array, sample: int, seed: int) -> int:
    from pipeline.decontam.url_vec import url_keys
    from pipeline.decontam.urls import canonical_url, flickr_photo_id_from_url

    idx = np.random.default_rng(seed).choice(len(urls), size=min(sample, len(urls)), replace=False)
    picked = urls.take(pa.array(np.sort(idx))).to_pylist()
    canon, fids = url_keys(picked)
    assert canon.to_pylist() == [canonical_url(u) for u in picked], "vectorized canonical URLs differ"
    assert fids.to_pylist() == [flickr_photo_id_from_url(u) for u in picked], "vectorized Flickr ids differ"
    return len(picked)


def bench_size(rows: int, args, evals_path: str, keys: dict, sides: list[str]) -> list[dict]:
    with tempfile.TemporaryDirectory(dir=args.tmp_dir) as tmp:
        paths = {"rows": str(Path(tmp) / "rows.parquet"), "eval": evals_path, "workers": args.workers, "tmp": tmp,
                 "rejects": str(Path(tmp) / "rejects.parquet")}
        pq.write_table(pa.table({"reason": pa.array([], pa.string())}), paths["rejects"])
        t = time.perf_counter()
        planted = write_rows(Path(paths["rows"]), rows, keys, args.seed + 1)
        size_gb = Path(paths["rows"]).stat().st_size / 1e9
        print(f"{rows:,} rows ({planted:,} planted at eval images) generated in {time.perf_counter() - t:.1f}s "
              f"[{size_gb:.1f} GB parquet]", flush=True)
        first = pq.ParquetFile(paths["rows"]).read_row_group(0, columns=["url"]).column("url").combine_chunks()
        print(f"vectorized keys == canonical_url / flickr_photo_id on "
              f"{check_vectorized_equals_scalar(first, args.sample, args.seed):,} sampled rows", flush=True)
        results = []
        for side in sides:
            r = run_side(side, paths)
            total = r["index_s"] + r["match_s"]
            r |= {"side": side, "rows": rows, "rows_s": rows / r["match_s"], "total_s": total}
            print(f"  {side:9s} index {r['index_s']:5.1f}s  rows {r['match_s']:7.1f}s wall ({r['cpu_s']:7.1f} CPU-s, "
                  f"{r['cpu_s'] / rows * 1e6:.2f} per 1M rows)  {r['rows_s']:>10,.0f} rows/s  "
                  f"peak RSS {r['peak_rss_mb']:,.0f} MB  "
                  f"removed {len(r['removed']):,} images  load {os.getloadavg()[0]:.1f}", flush=True)
            results.append(r)
        for r in results[1:]:
            assert r["removed"] == results[0]["removed"], f"{r['side']} and {results[0]['side']} remove different images"
            assert r["kept"] == results[0]["kept"]
        assert len(results[0]["removed"]) >= planted
    return results


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        side, paths, out = sys.argv[2], json.loads(sys.argv[3]), Path(sys.argv[4])
        result = SIDES[side](paths)
        result["removed"] = [list(x) for x in result["removed"]]
        out.write_text(json.dumps(result))
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[5_000_000, 20_000_000, 100_000_000])
    parser.add_argument("--eval-images", type=int, default=200_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sample", type=int, default=50_000, help="rows checked against the scalar functions")
    parser.add_argument("--workers", type=int, default=2, help="threads (decontaminate.workers)")
    parser.add_argument("--sides", default="streamed,pandas", help=f"comma-separated, of {', '.join(SIDES)}")
    parser.add_argument("--skip-baseline", action="store_true", help="never run the pandas baseline")
    parser.add_argument("--skip-baseline-above", type=int, default=5_000_000,
                        help="run the pandas baseline only up to this many rows (it holds every row as Python objects)")
    parser.add_argument("--tmp-dir", default=None, help="where the generated manifest and the runs go (default: $TMPDIR)")
    args = parser.parse_args()

    evals, keys = eval_table(args.eval_images, args.seed)
    table = []
    with tempfile.TemporaryDirectory(dir=args.tmp_dir) as tmp:
        evals_path = str(Path(tmp) / "eval.parquet")
        pq.write_table(evals, evals_path)
        del evals
        for rows in args.rows:
            sides = [s for s in args.sides.split(",")
                     if s != "pandas" or (not args.skip_baseline and rows <= args.skip_baseline_above)]
            table += bench_size(rows, args, evals_path, keys, sides)
    print("\n| rows | side | rows/s (wall) | wall s | CPU s | CPU-s per 1M rows | peak RSS MB |\n"
          "|---:|---|---:|---:|---:|---:|---:|")
    for r in table:
        print(f"| {r['rows']:,} | {r['side']} | {r['rows_s']:,.0f} | {r['match_s']:.1f} | {r['cpu_s']:.1f} | "
              f"{r['cpu_s'] / r['rows'] * 1e6:.2f} | {r['peak_rss_mb']:,.0f} |")
    print(f"target: >= 1,000,000 rows/s on 2 cores, peak RSS flat in the row count; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (other work on the machine slows every side)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
