"""Conceptual Captions and SBU readers (streamed byte lines) on the hand-written fixtures."""

from __future__ import annotations

import hashlib
from pathlib import Path

from helpers.source_fixtures import FIXTURES, fates, ingest


def sha1(url: str) -> str:
    return hashlib.sha1(url.encode("utf-8")).hexdigest()


def test_cc(fixture_params):
    result, manifest, rejects = ingest(fixture_params, "cc")
    train, val = "Train_GCC-training.tsv", "Validation_GCC-1.1.0-Validation.tsv"
    assert fates(rejects) == [
        (train, "line 2", "missing_caption"),
        (train, "line 3", "malformed_row"),  # no TAB
        (train, "line 4", "non_utf8"),
        (train, "line 5", "bad_url"),  # no scheme
        (train, "line 6", "duplicate_id"),  # the URL of line 1 again
        (train, "line 7", "text_too_long"),
        (train, "line 8", "unreadable_image"),
        (train, "line 9", "unreadable_image"),
        (train, "line 10", "missing_image"),
        (train, "line 11", "malformed_row"),  # three fields
        (train, "line 12", "malformed_row"),  # empty line
        (val, "line 2", "duplicate_id"),  # a train URL, first seen in train
        (val, "line 3", "bad_url"),  # space in the host
    ]
    urls = ["http://example.com/img/1.jpg", "https://example.com/img/13.jpg?x=1", "http://example.com/img/14.jpg",
            "http://example.com/val/1.jpg"]
    assert manifest.url.tolist() == urls
    assert manifest.image_id.tolist() == [sha1(u) for u in urls]
    assert manifest.example_id.tolist() == [f"cc:{sha1(u)}" for u in urls]
    assert [Path(p).name for p in manifest.image_path] == [f"{sha1(u)}.jpg" for u in urls]
    assert manifest.split.tolist() == ["train", "train", "train", "val"]
    assert manifest.text[1] == 'Quotes "inside" a caption are kept.'  # no CSV quoting
    assert manifest.text[2] == "A line with a Windows line ending."
    assert (result.rows_in, result.manifest_rows, result.rejected) == (17, 4, 13)
    lines = (FIXTURES / "cc" / train).read_bytes().split(b"\n")
    assert rejects.raw_row[2] == lines[3].decode("utf-8", "backslashreplace")  # "caf\xe9 ..."


def test_sbu(fixture_params):
    result, manifest, rejects = ingest(fixture_params, "sbu")
    urls, caps = "SBU_captioned_photo_dataset_urls.txt", "SBU_captioned_photo_dataset_captions.txt"
    assert fates(rejects) == [
        (caps, "line 2", "missing_caption"),
        (urls, "line 3", "bad_url"),  # scheme 'htp'
        (caps, "line 4", "non_utf8"),
        (urls, "line 5", "duplicate_id"),
        (urls, "line 6", "unreadable_image"),
        (urls, "line 7", "missing_image"),
        (caps, "line 8", "text_too_long"),
        (urls, "line 10", "non_utf8"),  # bytes in the URL
        (urls, "line 11", "malformed_row"),  # the captions file has only 10 lines
    ]
    assert manifest.text.tolist() == ["Man sits on a bench in the park", "Sunset over the lake"]
    assert manifest.image_id[1] == sha1("http://static.flickr.com/13/14_g.jpg")
    assert set(manifest.split) == {"train"}
    assert rejects.raw_row[0] == "http://static.flickr.com/1/2_a.jpg\n"  # url line + newline + caption line
    assert (result.rows_in, result.manifest_rows, result.rejected) == (11, 2, 9)
