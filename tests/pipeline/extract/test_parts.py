"""One source's extraction split over K tasks (``extract SOURCE:k/K``) and merged (``extract.parts``).

On the tiny world of tests/helpers/extract_world.py: three parts run in any order and merged give the feature
directories, and the image DBs ``build_dbs`` makes of them, of one task byte for byte; the merge
never loads the detector; a missing or stale part is named with the command that makes it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from helpers.extract_world import copy_manifests, feature_files, params_for, write_world

from pipeline.extract.detector.runner import plan_shards
from pipeline.extract.extract import run
from pipeline.extract.image_sets import make_settings, select
from pipeline.extract.parts import PART_FILE, Part, part_dir, part_of, shard_range, split_item
from pipeline.stores.image_db_builder import build_image_db

pytestmark = pytest.mark.stage  # runs a pipeline stage or trains a model (not in `make test-unit`)

DB_FILES = ("data.mdb", "nbb.json", "meta.json")


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    return write_world(tmp_path_factory.mktemp("parts_world"))


def _image_db(features: Path, out: Path) -> dict[str, bytes]:
    build_image_db(features, out, compression="lz4", commit_every=2, params_digest="test")
    return {name: (out / name).read_bytes() for name in DB_FILES}


def test_items_name_a_part_and_parts_tile_the_shards():
    assert split_item("cc:2/3") == ("cc", Part(2, 3)) and split_item("cc") == ("cc", None)
    assert split_item(None) == (None, None) and split_item("coco_gt:1/1") == ("coco_gt", Part(1, 1))
    for bad in ("cc:0/3", "cc:4/3", "cc:2", "cc:a/b", "cc:2/3/4"):
        with pytest.raises(ValueError, match=r"expected SOURCE:k/K with 1 <= k <= K"):
            split_item(bad)
    for n in range(0, 12):
        for parts in range(1, 6):
            ranges = [shard_range(n, Part(k, parts)) for k in range(1, parts + 1)]
            assert ranges[0][0] == 0 and ranges[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))  # contiguous, in order
            assert max(hi - lo for lo, hi in ranges) - min(hi - lo for lo, hi in ranges) <= 1
            assert all(part_of(i, n, parts).k == next(k for k, (lo, hi) in enumerate(ranges, 1) if lo <= i < hi)
                       for i in range(n))


def test_three_parts_merge_to_the_bytes_of_one_task(world, tmp_path, monkeypatch):
    data = tmp_path / "data"  # one data directory for both: rejects name the manifest's path
    copy_manifests(world, data)
    run(params_for(data, world["weights"]), "coco")  # coco (+ coco_gt) by one task, as today: the reference
    reference = {}
    for name in ("coco", "coco_gt"):
        out = data / "features" / name
        reference[name] = (feature_files(out), json.loads((out / "_run.json").read_text())["counts"],
                           _image_db(out, tmp_path / "db_single" / name))
        shutil.rmtree(out)
    params = params_for(data, world["weights"], "extract.parts=3")
    n = len(plan_shards(select(params, "coco").items, tmp_path, shard_size=3,
                        settings=make_settings(params)[0], mode="detected"))
    assert n >= 4  # enough shards for uneven parts
    for k in (3, 1, 2):  # order does not matter: each part writes only its own directory
        run(params, f"coco:{k}/3")
    for k in (1, 2, 3):
        lo, hi = shard_range(n, Part(k, 3))
        held = sorted(p.name for p in part_dir(params, "coco", Part(k, 3)).glob("shard-*.safetensors"))
        assert held == [f"shard-{i:05d}.safetensors" for i in range(lo, hi)]  # global shard numbers
        info = json.loads((part_dir(params, "coco", Part(k, 3)) / PART_FILE).read_text())
        assert info["shards"] == [lo, hi] and info["total_shards"] == n
    # coco_gt (2 images, one shard): parts 1 and 2 are empty, part 3 holds shard 0
    assert not list(part_dir(params, "coco_gt", Part(1, 3)).glob("shard-*"))
    assert not (data / "features" / "coco").exists()  # parts write only under cache/

    def no_detector(*args, **kwargs):
        raise AssertionError("the merge loaded the detector")

    monkeypatch.setattr("pipeline.extract.detector.build.load_detector", no_detector)
    # the merge host may see no GPU (or another one): it plans with the device the parts recorded
    run(params_for(data, world["weights"], "extract.parts=3", "extract.device=cuda"), "coco")
    for name in ("coco", "coco_gt"):
        merged = data / "features" / name
        files, counts, image_db = reference[name]
        assert feature_files(merged) == files
        record = json.loads((merged / "_run.json").read_text())
        assert record["merged_parts"] == 3 and record["shards_adopted"] == record["counts"]["shards"] > 0
        assert record["counts"] == counts
        assert _image_db(merged, tmp_path / "db" / name) == image_db
    assert not (data / "cache" / "extract_parts").exists()  # parts are removed once merged

    # a retried merge (parts gone) finds every shard in place and writes the same bytes again
    before = feature_files(data / "features" / "coco")
    run(params, "coco")
    assert feature_files(data / "features" / "coco") == before
    assert json.loads((data / "features" / "coco" / "_run.json").read_text())["shards_adopted"] == 0


def test_a_missing_part_is_named_with_the_command_that_makes_it(world, tmp_path):
    data = tmp_path / "data"
    copy_manifests(world, data)
    params = params_for(data, world["weights"], "extract.parts=3", "extract.shard_size=1")  # nlvr2: 2 shards
    run(params, "nlvr2:1/3")  # empty: shards [0, 0)
    run(params, "nlvr2:3/3")
    with pytest.raises(RuntimeError, match=r"part\(s\) \['2-of-3'\] missing or stale .*present: \['1-of-3', "
                                           r"'3-of-3'\].*`python -m pipeline extract nlvr2:2/3`"):
        run(params, "nlvr2")
    assert not (data / "features" / "nlvr2").exists()  # checked before anything is written
    run(params, "nlvr2:2/3")
    run(params, "nlvr2")
    assert json.loads((data / "features" / "nlvr2" / "_run.json").read_text())["counts"]["shards"] == 2


def test_a_part_extracted_with_other_settings_is_refused(world, tmp_path):
    data = tmp_path / "data"
    copy_manifests(world, data)
    params = params_for(data, world["weights"], "extract.parts=2", "extract.shard_size=1")  # nlvr2: 2 shards
    run(params_for(data, world["weights"], "extract.parts=2", "extract.shard_size=1", "extract.min_boxes=12"),
        "nlvr2:1/2")
    run(params, "nlvr2:2/2")
    with pytest.raises(ValueError, match=r"extract@nlvr2:1/2 was extracted with other settings .*'min_boxes': "
                                         r"'12 \(part\) vs 10 \(params\)'.*extract nlvr2:1/2` again"):
        run(params, "nlvr2")
