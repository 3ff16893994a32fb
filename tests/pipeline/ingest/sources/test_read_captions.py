"""COCO, Visual Genome and Flickr30k readers on the hand-written fixtures: every row's fate, exactly."""

from __future__ import annotations

import json

import pyarrow.parquet as pq

from helpers.source_fixtures import fates, ingest


def test_coco(fixture_params):
    result, manifest, rejects = ingest(fixture_params, "coco")
    train, val = "captions_train2014.json", "captions_val2014.json"
    assert fates(rejects) == [
        (train, "annotations[1]", "missing_caption"),  # blank caption
        (train, "annotations[2]", "missing_field"),  # no caption key
        (train, "annotations[3]", "duplicate_id"),  # annotation id 101 again
        (train, "annotations[4]", "bad_url"),  # coco_url without scheme
        (train, "annotations[5]", "unreadable_image"),  # truncated JPEG
        (train, "annotations[6]", "unreadable_image"),  # 0-byte file
        (train, "annotations[7]", "missing_image"),
        (train, "annotations[8]", "bad_label"),  # Karpathy split 'bogus'
        (train, "annotations[9]", "missing_field"),  # image not in Karpathy
        (train, "annotations[10]", "missing_field"),  # image record without file_name
        (train, "annotations[11]", "missing_field"),  # image_id not in images
        (train, "annotations[12]", "text_too_long"),
        (train, "annotations[13]", "malformed_row"),  # a string, not an object
        (train, "annotations[14]", "malformed_row"),  # caption is a number
        (train, "annotations[16]", "unreadable_image"),  # second caption of the truncated image
        (train, "annotations[17]", "missing_caption"),  # caption null
        (val, "annotations[1]", "non_utf8"),  # latin-1 byte inside the JSON file
    ]
    assert manifest.example_id.tolist() == ["coco:101", "coco:114", "coco:201", "coco:203"]
    assert (result.rows_in, result.manifest_rows, result.rejected) == (21, 4, 17)
    assert list(manifest.columns) == ["example_id", "dataset", "split", "image_source", "image_id", "image_path",
                                      "url", "text", "coco_split", "flickr_url", "width", "height"]
    first = manifest.iloc[0]
    assert first.split == "train" and first.coco_split == "train2014" and first.image_id == "1"
    assert first.image_path.endswith("coco/train2014/COCO_train2014_000000000001.jpg")
    assert first.flickr_url == "http://farm4.staticflickr.com/3153/2970773875_164f0c0b83_z.jpg"
    assert (first.width, first.height) == (64, 48)
    assert manifest.split.tolist() == ["train", "test", "val", "val"]
    assert manifest.text[1] == "A green triangle on grey."  # stripped
    assert manifest.flickr_url.isna().tolist() == [False, True, False, False]
    raw = rejects.raw_row[rejects.locator == "annotations[1]"]
    assert json.loads(raw.iloc[0]) == {"image_id": 1, "id": 102, "caption": "   "}
    assert "caf\\xe9" in rejects.raw_row.iloc[-1]  # undecodable byte kept, escaped
    run = json.loads((result.manifest_path.parent / "coco._run.json").read_text())
    assert run["counts"]["rows_in"] == 21 and run["counts"]["rejects_by_reason"]["missing_field"] == 4
    assert run["counts"]["karpathy_entries_without_cocoid"] == 1
    # dataset-specific schema: nullable ints, strings
    schema = pq.read_schema(result.manifest_path)
    assert str(schema.field("width").type) == "int64" and not schema.field("example_id").nullable


def test_vg(fixture_params):
    result, manifest, rejects = ingest(fixture_params, "vg")
    f = "region_descriptions.json"
    assert fates(rejects) == [
        (f, "[0].regions[1]", "missing_caption"),
        (f, "[0].regions[2]", "missing_field"),  # no phrase
        (f, "[0].regions[3]", "duplicate_id"),  # region_id 11 again
        (f, "[0].regions[4]", "malformed_row"),  # x is a string
        (f, "[0].regions[5]", "text_too_long"),
        (f, "[0].regions[6]", "non_utf8"),
        (f, "[1].regions[0]", "bad_url"),  # ftp:// image url
        (f, "[2].regions[0]", "unreadable_image"),
        (f, "[2].regions[1]", "unreadable_image"),
        (f, "[3].regions[0]", "missing_image"),
        (f, "[4].regions[0]", "missing_field"),  # image 5 not in image_data.json
        (f, "[5]", "missing_field"),  # image entry without regions
        (f, "[6]", "malformed_row"),  # regions is not a list
    ]
    assert manifest.example_id.tolist() == ["vg:11", "vg:81"]
    assert (result.rows_in, result.manifest_rows) == (15, 2)
    assert manifest.region_box.map(list).tolist() == [[1.0, 2.0, 10.0, 12.0], [4.0, 3.0, 20.5, 10.0]]
    table = pq.read_table(result.manifest_path)
    assert table["coco_id"].to_pylist() == ["9", None] and table["flickr_id"].to_pylist() == [None, "2970773875"]
    assert manifest.text.tolist() == ["a red circle", "purple triangle"]
    assert set(manifest.split) == {"train"} and manifest.image_path[1].endswith("vg/8.jpg")


def test_flickr30k(fixture_params):
    result, manifest, rejects = ingest(fixture_params, "flickr30k")
    f = "dataset_flickr30k.json"
    assert fates(rejects) == [
        (f, "images[0].sentences[1]", "missing_caption"),
        (f, "images[0].sentences[2]", "missing_field"),  # no raw
        (f, "images[0].sentences[3]", "malformed_row"),
        (f, "images[1].sentences[1]", "duplicate_id"),  # sentid 0 again
        (f, "images[2].sentences[0]", "unreadable_image"),
        (f, "images[3].sentences[0]", "missing_image"),
        (f, "images[4].sentences[0]", "bad_label"),  # split 'dev'
        (f, "images[5]", "missing_field"),  # image without sentences
        (f, "images[6].sentences[0]", "text_too_long"),
        (f, "images[6].sentences[1]", "non_utf8"),
        (f, "images[7].sentences[0]", "unreadable_image"),  # empty file
    ]
    assert manifest.example_id.tolist() == ["flickr30k:0", "flickr30k:3", "flickr30k:10"]
    assert manifest.image_id.tolist() == ["1000092795", "10002456", "1000919630"]
    assert manifest.split.tolist() == ["train", "val", "train"]
    assert manifest.url.isna().all() and manifest.text[2] == "A man in an orange hat."
    assert (result.rows_in, result.manifest_rows, result.rejected) == (14, 3, 11)
