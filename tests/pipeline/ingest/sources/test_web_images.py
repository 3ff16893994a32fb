"""CC/SBU images in img2dataset's layout (pipeline/ingest/sources/web_images.py) on the hand-written fixtures:
the fixture images are laid out as img2dataset's ``files`` output (shard tables in its schema, the one
tests/pipeline/ingest/test_download.py checks against a real img2dataset run) and ingested again."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers.source_fixtures import fates, ingest, write_shard

from pipeline.ingest.sources import web_images
from pipeline.ingest.sources.web_images import ShardIndex, url_key

NOT_FOUND = "HTTP Error 404: Not Found"


def _img2dataset_params(params, dataset: str):
    src = dataclasses.replace(getattr(params.sources, dataset), image_layout="img2dataset")
    return dataclasses.replace(params, sources=dataclasses.replace(params.sources, **{dataset: src}))


def test_cc_fixtures_in_img2dataset_layout(fixture_params):
    root = Path(fixture_params.sources.cc.image_root)
    ok = lambda u: ("success", None)  # noqa: E731
    rows = [(u, *ok(u)) if (root / f"{url_key(u)}.jpg").exists() else (u, "failed_to_download", NOT_FOUND)
            for u in ("http://example.com/img/1.jpg", "http://example.com/img/7.jpg", "http://example.com/img/8.jpg",
                      "http://example.com/img/9.jpg", "http://example.com/img/10.jpg")]
    write_shard(root, 0, rows)
    write_shard(root, 1, [("https://example.com/img/13.jpg?x=1", "success", None),
                          ("http://example.com/img/1.jpg", "failed_to_download", "timed out")])  # a URL twice
    write_shard(root, 2, [("http://example.com/img/14.jpg", "success", None)], finished=False)  # still running
    write_shard(root, 3, [("http://example.com/val/1.jpg", "success", None)])
    params = _img2dataset_params(fixture_params, "cc")
    result, manifest, rejects = ingest(params, "cc")
    train, val = "Train_GCC-training.tsv", "Validation_GCC-1.1.0-Validation.tsv"
    # the same fates as the sha1 layout (test_read_web.py), but line 14's image is in an unfinished shard
    assert fates(rejects) == [
        (train, "line 2", "missing_caption"), (train, "line 3", "malformed_row"), (train, "line 4", "non_utf8"),
        (train, "line 5", "bad_url"), (train, "line 6", "duplicate_id"), (train, "line 7", "text_too_long"),
        (train, "line 8", "unreadable_image"), (train, "line 9", "unreadable_image"),
        (train, "line 10", "missing_image"), (train, "line 11", "malformed_row"), (train, "line 12", "malformed_row"),
        (train, "line 14", "missing_image"), (val, "line 2", "duplicate_id"), (val, "line 3", "bad_url"),
    ]
    detail = dict(zip(rejects.locator, rejects.detail))
    assert detail["line 10"] == f"{root}/00000/0000004.jpg: not downloaded, img2dataset failed_to_download: {NOT_FOUND}"
    assert detail["line 14"].startswith("http://example.com/img/14.jpg: in no finished img2dataset shard")
    assert manifest.url.tolist() == ["http://example.com/img/1.jpg", "https://example.com/img/13.jpg?x=1",
                                     "http://example.com/val/1.jpg"]
    # the successful copy of a URL given twice wins; key widths as written
    assert manifest.image_path.tolist() == [f"{root}/00000/0000000.jpg", f"{root}/00001/0000100.jpg",
                                            f"{root}/00003/0000300.jpg"]
    assert manifest.image_id.tolist() == [url_key(u) for u in manifest.url]  # ids do not depend on the layout
    assert result.notes["img2dataset_shards"] == 3


def test_sbu_fixtures_in_img2dataset_layout(fixture_params):
    root = Path(fixture_params.sources.sbu.image_root)
    urls = (Path(fixture_params.sources.sbu.urls).read_bytes().decode("utf-8", "replace").splitlines())
    rows = [(u, "success", None) if (root / f"{url_key(u)}.jpg").exists() else (u, "failed_to_download", NOT_FOUND)
            for u in dict.fromkeys(urls) if u.startswith("http")]
    sha1_result, _, sha1_rejects = ingest(fixture_params, "sbu")  # before the images move into the shard
    write_shard(root, 0, rows)
    result, manifest, rejects = ingest(_img2dataset_params(fixture_params, "sbu"), "sbu")
    assert fates(rejects) == fates(sha1_rejects)
    assert (result.manifest_rows, result.rejected) == (sha1_result.manifest_rows, sha1_result.rejected)
    missing = rejects[rejects.reason == "missing_image"].detail.tolist()
    assert missing and all(d.endswith(f"img2dataset failed_to_download: {NOT_FOUND}") for d in missing)
    assert all(Path(p).parent.name == "00000" and Path(p).exists() for p in manifest.image_path)


def test_lookup_walks_urls_that_share_the_first_hash(tmp_path, monkeypatch):
    """Two URLs with the same first 64-bit hash are told apart by the second (forced here)."""
    urls = [f"http://example.com/{i}.jpg" for i in range(50)]
    for u in urls:
        (tmp_path / f"{url_key(u)}.jpg").write_bytes(b"x")
    write_shard(tmp_path, 0, [(u, "success" if i % 3 else "failed_to_download", None if i % 3 else "boom")
                              for i, u in enumerate(urls)])
    real = web_images.url_hashes
    monkeypatch.setattr(web_images, "url_hashes", lambda xs: (real(xs)[0] * 0, real(xs)[1]))
    index = ShardIndex(tmp_path)
    found = index.lookup(urls + ["http://example.com/absent.jpg"])
    assert found[-1] == -1
    assert [index.path(i) for i in found[:-1]] == [f"{tmp_path}/00000/{i:07d}.jpg" for i in range(50)]
    assert [bool(index.ok[i]) for i in found[:-1]] == [bool(i % 3) for i in range(50)]
    assert index.error(found[0]) == "failed_to_download: boom"


def test_a_shard_table_without_the_img2dataset_columns_is_refused(tmp_path):
    pq.write_table(pa.table({"url": ["http://example.com/1.jpg"]}), tmp_path / "00000.parquet")
    (tmp_path / "00000_stats.json").write_text("{}")
    with pytest.raises(web_images.SourceFormatError, match="00000.parquet: not an img2dataset shard parquet"):
        ShardIndex(tmp_path)
