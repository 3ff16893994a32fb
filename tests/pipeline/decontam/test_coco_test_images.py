"""COCO's test image list as decontamination reads it (the fixture's image_info_test2015.json)."""

from __future__ import annotations

from pipeline.decontam.coco_test_images import read_image_info

from helpers.source_fixtures import fixture_params  # noqa: F401  (a pytest fixture)


def test_coco_image_info_test(fixture_params, caplog):
    """image_info_test2015.json (no captions, no flickr_url): the test images' URLs for decontamination;
    entries without a usable coco_url are skipped and named."""
    table = read_image_info(fixture_params.sources.coco.image_info_test)
    assert table.column_names == ["image_source", "image_id", "url", "flickr_url"]
    assert table.column("image_id").to_pylist() == ["30", "31"]
    assert set(table.column("image_source").to_pylist()) == {"coco"}
    assert table.column("url").to_pylist()[0] == "http://images.cocodataset.org/test2015/COCO_test2015_000000000030.jpg"
    assert table.column("flickr_url").null_count == 2
    assert "2 image entries skipped" in caplog.text and "images[2]: missing_field: missing coco_url" in caplog.text
    assert "images[3]: bad_url" in caplog.text
