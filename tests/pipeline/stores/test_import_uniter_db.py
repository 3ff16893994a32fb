"""Stage import_uniter_db on a small release written in UNITER's own formats (tests/helpers/uniter_release.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers.dbs_synthetic import ROOT, params_for
from helpers.uniter_release import C1, D, NBB, coco, regions, write_img_db, write_txt_db
from pipeline.common.locking import stage_keys
from pipeline.common.source_records import SourceFormatError
from pipeline.pretrain.datasets import PretrainDataset
from pipeline.stores.import_uniter_db import run
from pipeline.stores.readers import ImageDb, ImageDbGroup, TextDb
from pipeline.stores.text_db_builder import SNLI_LABELS
from pipeline.stores.tokenization import WordPieceTokenizer
from pipeline.stores.uniter_release.formats import UnsafeEntryError
from pipeline.training.batching import collate_pretrain

pytestmark = pytest.mark.stage  # runs a pipeline stage or trains a model (not in `make test-unit`)


# --------------------------------------------------------------------------------------------
# the release


@pytest.fixture(scope="module")
def tok():
    return WordPieceTokenizer()


@pytest.fixture(scope="module")
def release(tmp_path_factory, tok):
    root = tmp_path_factory.mktemp("release")
    rng = np.random.default_rng(0)
    train = {coco("train2014", 9): regions(rng, 15, above=12), coco("train2014", 25): regions(rng, 10)}
    val = {coco("val2014", 42): regions(rng, 12)}
    broken = {coco("val2014", 7): {k: v for k, v in regions(rng, 10).items() if k != "soft_labels"},
              coco("val2014", 8): regions(rng, 10), coco("val2014", 77): regions(rng, 10)}
    # compressed archives with an nbb file; one entry it does not list, one it gives no region
    write_img_db(root, "coco_train2014", train | {coco("train2014", k): regions(rng, 10) for k in (5, 6)},
                 compressed=True, nbb={coco("train2014", 9): 11, coco("train2014", 25): 10, coco("train2014", 6): 0,
                                       "coco_train2014_000000000099.npz": 3},
                 raw={"readme.txt": b"not an image"})
    write_img_db(root, "coco_val2014", val | broken, compressed=False,
                 nbb={coco("val2014", 42): 12, coco("val2014", 7): 10, coco("val2014", 8): 11, coco("val2014", 77): 10})
    # msgpack entries and no nbb file: the rule decides (14 above 0.2 -> 14; 3 above -> min 10; 105 -> max 100)
    flickr = {"flickr30k_000000001001.npz": regions(rng, 20, above=14),
              "flickr30k_000000001002.npz": regions(rng, 16, above=3),
              "flickr30k_000000001003.npz": regions(rng, 105)}
    write_img_db(root, "flickr30k", flickr, compressed=False, nbb=None)
    nlvr = {f"nlvr2_dev-{p}-img{k}.npz": regions(rng, 10) for p in ("1-0", "2-1") for k in (0, 1)}
    write_img_db(root, "nlvr2_dev", nlvr, compressed=True, nbb={k: 10 for k in nlvr})
    write_img_db(root, "vcr_gt_train", {"vcr_gt_x.npz": regions(rng, 10)}, compressed=True, nbb={"vcr_gt_x.npz": 10})

    ids = lambda n, base=2000: list(range(base, base + n))  # noqa: E731
    write_txt_db(root, "pretrain_coco_train", {
        "11": {"input_ids": ids(7), "img_fname": coco("train2014", 9), "raw": "a cat"},
        "12": {"input_ids": ids(70), "img_fname": coco("train2014", 25)},
        "13": {"input_ids": ids(4), "img_fname": coco("val2014", 7)},  # its image was skipped
    }, tok, raw={"14": b"not an lz4 frame"}, id2len_extra=("15",))
    write_txt_db(root, "pretrain_coco_restval", {"11": {"input_ids": ids(5), "img_fname": coco("val2014", 42)}}, tok)
    vqa = write_txt_db(root, "vqa_train", {
        "501": {"input_ids": ids(6), "img_fname": coco("train2014", 9), "question_id": 501,
                "target": {"labels": [2, 0], "scores": [1.0, 0.3]}},
        "502": {"input_ids": ids(3), "img_fname": coco("val2014", 42), "target": {"labels": [9], "scores": [1.0]}},
    }, tok)
    (vqa / "ans2label.json").write_text(json.dumps({"yes": 0, "no": 1, "two": 2}))
    write_txt_db(root, "nlvr2_dev", {
        "dev-1-0-0": {"input_ids": ids(5), "img_fname": [f"nlvr2_dev-1-0-img{k}.npz" for k in (0, 1)], "target": 1},
        "dev-2-1-3": {"input_ids": ids(5), "img_fname": [f"nlvr2_dev-2-1-img{k}.npz" for k in (0, 1)], "target": 0},
    }, tok)
    write_txt_db(root, "ve_dev", {  # UNITER's VE order: contradiction, entailment, neutral
        f"p{k}": {"input_ids": ids(4), "img_fname": f"flickr30k_00000000100{k + 1}.npz",
                  "target": {"labels": [k], "scores": [1.0]}} for k in range(3)}, tok)
    write_txt_db(root, "vcr_val", {"1": {"input_ids": ids(3), "img_fname": ["a", "b"]}}, tok)
    return root, {"train": train, "val": val, "broken": broken, "flickr": flickr, "nlvr": nlvr}


@pytest.fixture(scope="module")
def imported(release, tmp_path_factory):
    root, fields = release
    data = tmp_path_factory.mktemp("world") / "data"
    params = params_for(data, f"build_dbs.uniter_release.root={root}", "build_dbs.source=uniter_release",
                        "build_dbs.max_txt_len=60", "build_dbs.commit_every=2")
    return data, run(params), fields


# --------------------------------------------------------------------------------------------
# images


def test_image_values_round_trip_both_variants(imported):
    data, _, fields = imported
    db = ImageDb(data / "db" / "img" / "coco")
    for image_id, src, n in (("9", fields["train"][coco("train2014", 9)], 11),   # archive, nbb file: 11 of 15
                             ("42", fields["val"][coco("val2014", 42)], 12)):    # msgpack, nbb file: 12 of 12
        rec = db[image_id]
        assert db.nbb[image_id] == n and rec["features"].shape == (n, D)
        for name in ("features", "conf", "soft_labels"):
            assert rec[name].dtype == np.float16
            np.testing.assert_array_equal(rec[name], src[name][:n])
        np.testing.assert_array_equal(rec["norm_bb"][:, :6], src["norm_bb"][:n])
        area = src["norm_bb"][:n, 4].astype(np.float32) * src["norm_bb"][:n, 5].astype(np.float32)
        np.testing.assert_allclose(rec["norm_bb"][:, 6].astype(np.float32), area, rtol=1e-3, atol=1e-4)
        np.testing.assert_array_equal(rec["boxes"], src["norm_bb"][:n, :4].astype(np.float32))
        assert (rec["image_h"], rec["image_w"]) == (1, 1)
    assert db.feature_dim == D and db.num_classes == C1 and db.meta["class_names"] is None


def test_region_count_rule_without_nbb_file(imported):
    data, report, _ = imported
    db = ImageDb(data / "db" / "img" / "flickr30k")
    # the reference's rule: min(max_bb, max(min_bb, #conf > conf_th)) with 0.2 / 100 / 10
    assert db.nbb == {"1001": 14, "1002": 10, "1003": 100}
    assert report["image_dbs"]["flickr30k"]["nbb_from"] == {"rule": 3}
    assert report["image_dbs"]["flickr30k"]["regions_beyond_nbb"] == (20 - 14) + (16 - 10) + (105 - 100)


def test_skipped_image_entries_are_counted_by_reason(imported):
    data, report, _ = imported
    coco_report = report["image_dbs"]["coco"]
    assert coco_report["skipped"] == {"missing_field": 1, "not_in_nbb": 1, "too_few_regions": 2, "unmapped_name": 1}
    assert any("soft_labels" in s for s in coco_report["skipped_samples"]["missing_field"])
    assert sorted(ImageDb(data / "db" / "img" / "coco").nbb) == ["25", "42", "77", "9"]
    nlvr2_ids = {f"dev-{p}-img{k}" for p in ("1-0", "2-1") for k in (0, 1)}
    assert set(ImageDb(data / "db" / "img" / "nlvr2").nbb) == nlvr2_ids
    assert report["image_dbs"]["release:img_db/vcr_gt_train"]["written"] is False
    md = (data / "reports" / "uniter_import" / "report.md").read_text()
    assert "`coco`" in md and "missing_field: 1" in md and "too_few_regions: 2" in md


# --------------------------------------------------------------------------------------------
# texts


def test_pretrain_text_db_merges_release_dbs(imported, tok):
    data, report, _ = imported
    db = TextDb(data / "db" / "txt" / "pretrain_indomain_train")
    assert db.ids == ["pretrain_coco_restval:11", "pretrain_coco_train:11", "pretrain_coco_train:12"]
    rec = db["pretrain_coco_train:11"]
    np.testing.assert_array_equal(rec["input_ids"], np.arange(2000, 2007, dtype=np.int32))
    assert rec["input_ids"].dtype == np.int32 and rec["image_ids"] == ["coco/9"]
    assert db["pretrain_coco_train:12"]["input_ids"].shape == (60,) and db.meta["truncated"] == 1
    assert db.txt2img["pretrain_coco_restval:11"] == ["coco/42"] and db.id2len["pretrain_coco_restval:11"] == 5
    assert db.meta["special_ids"] == tok.special_ids and db.meta["img_db"] == ["coco"]
    assert report["text_dbs"]["pretrain_indomain_train"]["skipped"] == {
        "missing_image": 1, "missing_record": 1, "unreadable": 1}
    assert report["text_dbs"]["pretrain_indomain_train"]["missing_release_dbs"] == ["pretrain_vg_train"]
    # what the training code opens reads it: pretraining batches of every kind
    group = ImageDbGroup(data / "db" / "img", db.img_db_names)
    assert group.num_regions("coco/9") == 11 and group["coco/42"]["features"].shape == (12, D)
    for task in ("mlm", "mrc_kl", "itm"):
        ds = PretrainDataset([db], group, task=task, seed=1)
        batch = collate_pretrain([ds[i] for i in range(len(ds))])
        assert batch["img_feat"].shape[::2] == (3, D) and batch["img_pos"].shape[2] == 7


def test_task_targets_are_mapped(imported):
    data, report, _ = imported
    vqa = TextDb(data / "db" / "txt" / "vqa_train")
    assert vqa.ids == ["vqa_train:501"] and report["text_dbs"]["vqa_train"]["skipped"] == {"bad_field": 1}
    rec = vqa["vqa_train:501"]
    assert rec["question_id"] == "501" and rec["answer_labels"].tolist() == [2, 0]
    np.testing.assert_allclose(rec["answer_scores"], [1.0, 0.3])
    assert json.loads((vqa.path / "ans2label.json").read_text()) == {"yes": 0, "no": 1, "two": 2}
    nlvr = TextDb(data / "db" / "txt" / "nlvr2_dev")
    assert nlvr.meta["image_layout"] == "pair"
    assert nlvr["nlvr2_dev:dev-1-0-0"]["image_ids"] == ["nlvr2/dev-1-0-img0", "nlvr2/dev-1-0-img1"]
    assert [nlvr[e]["label"] for e in nlvr.ids] == [1, 0]
    ve = TextDb(data / "db" / "txt" / "snli_ve_dev")
    assert [SNLI_LABELS[ve[e]["label"]] for e in ve.ids] == ["contradiction", "entailment", "neutral"]
    assert report["text_dbs"]["release:txt_db/vcr_val.db"]["written"] is False


# --------------------------------------------------------------------------------------------
# refusals


class _Trap:
    """Unpickling this creates ``path``: proof that pickle ran."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


@pytest.mark.parametrize("compressed", [True, False])
def test_entry_needing_pickle_is_refused(tmp_path, tok, compressed):
    root, marker = tmp_path / "release", tmp_path / "pickle_ran"
    fields = regions(np.random.default_rng(1), 10)
    fields["conf"] = np.array([_Trap(marker)] * 10, dtype=object)
    write_img_db(root, "coco_val2014", {coco("val2014", 3): fields}, compressed=compressed,
                 nbb={coco("val2014", 3): 10})
    params = params_for(tmp_path / "data", f"build_dbs.uniter_release.root={root}")
    with pytest.raises(UnsafeEntryError) as err:
        run(params)
    message = str(err.value)
    assert coco("val2014", 3) in message and "coco_val2014" in message and "object array" in message
    assert compressed is False or "'conf'" in message
    assert not marker.exists() and not (tmp_path / "data" / "db" / "img" / "coco").exists()


def test_tokenizer_mismatch_names_the_key(tmp_path, tok):
    root = tmp_path / "release"
    write_img_db(root, "coco_val2014", {coco("val2014", 3): regions(np.random.default_rng(2), 10)}, compressed=True,
                 nbb={coco("val2014", 3): 10})
    d = write_txt_db(root, "pretrain_coco_val", {"1": {"input_ids": [2000], "img_fname": coco("val2014", 3)}}, tok)
    meta = json.loads((d / "meta.json").read_text())
    (d / "meta.json").write_text(json.dumps(meta | {"CLS": 5}))
    with pytest.raises(SourceFormatError, match=r"nothing written.*meta.json: CLS = 5.*build_dbs.tokenizer"):
        run(params_for(tmp_path / "data", f"build_dbs.uniter_release.root={root}"))
    assert not (tmp_path / "data" / "db").exists()  # checked before the image DB was written, not after


def test_build_dbs_with_source_uniter_release_runs_the_import_and_exits_2_on_a_pickle_entry(tmp_path):
    root = tmp_path / "release"
    fields = regions(np.random.default_rng(3), 10)
    fields["soft_labels"] = np.array([_Trap(tmp_path / "pickle_ran")] * 10, dtype=object)
    write_img_db(root, "flickr30k", {"flickr30k_000000000001.npz": fields}, compressed=True, nbb=None)
    cmd = [sys.executable, "-m", "pipeline", "build_dbs", "--set", f"paths.data={tmp_path / 'data'}",
           "--set", "build_dbs.source=uniter_release", "--set", f"build_dbs.uniter_release.root={root}"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "flickr30k_000000000001.npz" in done.stderr and "'soft_labels' is an object array" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "pickle_ran").exists()


def test_the_stage_is_on_the_cli_and_shares_build_dbs_lock():
    done = subprocess.run([sys.executable, "-m", "pipeline", "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert "import_uniter_db" in done.stdout
    assert stage_keys("import_uniter_db") == stage_keys("build_dbs")


def test_a_root_without_the_release_is_named(tmp_path):
    with pytest.raises(SourceFormatError, match=r"build_dbs.uniter_release.root: .*nowhere holds neither img_db/"):
        run(params_for(tmp_path / "data", f"build_dbs.uniter_release.root={tmp_path / 'nowhere'}"))


# --------------------------------------------------------------------------------------------
# all or nothing: every check before anything is written


def _small_release(root: Path, tok: WordPieceTokenizer, *, vqa: bool = False) -> None:
    """One COCO val image DB and a pretraining text DB on it (+ a VQA one)."""
    write_img_db(root, "coco_val2014", {coco("val2014", 3): regions(np.random.default_rng(4), 10)}, compressed=True,
                 nbb={coco("val2014", 3): 10})
    write_txt_db(root, "pretrain_coco_val", {"1": {"input_ids": [2000], "img_fname": coco("val2014", 3)}}, tok)
    if vqa:
        write_txt_db(root, "vqa_devval", {"7": {"input_ids": [2001], "img_fname": coco("val2014", 3),
                                                "target": {"labels": [0], "scores": [1.0]}}}, tok)


def test_an_unknown_image_folder_is_an_error_listing_the_known_names(tmp_path, tok):
    root = tmp_path / "release"
    _small_release(root, tok)
    write_img_db(root, "coco_test", {coco("test2015", 1): regions(np.random.default_rng(5), 10)}, compressed=True,
                 nbb={coco("test2015", 1): 10})  # renamed: the release calls it coco_test2015
    with pytest.raises(SourceFormatError) as err:
        run(params_for(tmp_path / "data", f"build_dbs.uniter_release.root={root}"))
    message = str(err.value)
    assert "img_db/coco_test not known to the importer" in message and "coco_test2015" in message
    assert "pretrain_coco_val.db" in message  # the text DB names it knows too
    assert not (tmp_path / "data" / "db").exists()


def test_an_unknown_text_db_is_an_error(tmp_path, tok):
    root = tmp_path / "release"
    _small_release(root, tok)
    write_txt_db(root, "pretrain_coco_tain", {"1": {"input_ids": [2000], "img_fname": coco("val2014", 3)}}, tok)
    with pytest.raises(SourceFormatError, match=r"txt_db/pretrain_coco_tain.db not known.*pretrain_coco_train.db"):
        run(params_for(tmp_path / "data", f"build_dbs.uniter_release.root={root}"))
    assert not (tmp_path / "data" / "db").exists()


def test_vqa_without_answer_vocabulary_and_a_bad_nbb_file_stop_before_writing(tmp_path, tok):
    root = tmp_path / "release"
    _small_release(root, tok, vqa=True)
    (root / "img_db" / "coco_val2014" / NBB).write_text(json.dumps({coco("val2014", 3): "ten"}))
    with pytest.raises(SourceFormatError) as err:
        run(params_for(tmp_path / "data", f"build_dbs.uniter_release.root={root}"))
    message = str(err.value)
    assert "txt_db/vqa_devval.db: no answer vocabulary: set build_dbs.uniter_release.ans2label" in message
    assert f"{NBB}: entry '{coco('val2014', 3)}' is 'ten', expected a region count" in message
    assert not (tmp_path / "data" / "db").exists()


def test_a_rule_without_its_lmdb_names_what_the_folder_holds(tmp_path, tok):
    root = tmp_path / "release"
    _small_release(root, tok)
    with pytest.raises(SourceFormatError, match=r"coco_val2014: no feat_th0.2_max36_min10\[_compressed\]/data.mdb"
                                                r".*holds \['feat_th0.2_max100_min10_compressed'\]"):
        run(params_for(tmp_path / "data", f"build_dbs.uniter_release.root={root}",
                       "build_dbs.uniter_release.max_bb=36"))


def test_a_refusal_in_a_later_db_leaves_the_earlier_run_untouched(tmp_path, tok):
    root, data = tmp_path / "release", tmp_path / "data"
    _small_release(root, tok)
    params = params_for(data, f"build_dbs.uniter_release.root={root}")
    run(params)
    before = {p: p.read_bytes() for p in sorted((data / "db").rglob("*")) if p.is_file()}
    fields = regions(np.random.default_rng(6), 10)
    fields["conf"] = np.array([_Trap(tmp_path / "pickle_ran")] * 10, dtype=object)
    # flickr30k converts after coco: an all-or-nothing import publishes neither
    write_img_db(root, "flickr30k", {"flickr30k_000000000001.npz": fields}, compressed=True, nbb=None)
    (root / "img_db" / "coco_val2014" / NBB).write_text(json.dumps({coco("val2014", 3): 9}))
    with pytest.raises(UnsafeEntryError):
        run(params)
    after = {p: p.read_bytes() for p in sorted((data / "db").rglob("*")) if p.is_file()}
    assert after == before and not (tmp_path / "pickle_ran").exists()


def test_a_release_of_only_not_converted_dbs_is_not_a_silent_success(tmp_path, tok):
    root = tmp_path / "release"
    write_img_db(root, "vcr_gt_val", {"vcr_gt_x.npz": regions(np.random.default_rng(7), 10)}, compressed=True,
                 nbb={"vcr_gt_x.npz": 10})
    with pytest.raises(SourceFormatError, match=r"no DB written from .*report.md"):
        run(params_for(tmp_path / "data", f"build_dbs.uniter_release.root={root}"))
    report = json.loads((tmp_path / "data" / "reports" / "uniter_import" / "report.json").read_text())
    assert report["image_dbs"]["release:img_db/vcr_gt_val"]["written"] is False


def test_world_real_with_only_the_release_on_disk_imports(tmp_path, tok):
    """A machine holding the release and no dataset: params.yaml says world: real, and no sources path exists."""
    from helpers.source_fixtures import partial_real_params

    from pipeline.__main__ import main

    params, _ = partial_real_params(tmp_path)
    root = tmp_path / "release"
    _small_release(root, tok)
    assert main(["import_uniter_db", "--params", str(params), "--set", f"build_dbs.uniter_release.root={root}"]) == 0
    assert (tmp_path / "data" / "db" / "img" / "coco" / "data.mdb").is_file()
    assert (tmp_path / "data" / "db" / "txt" / "pretrain_indomain_val" / "data.mdb").is_file()
    assert main(["build_dbs", "--params", str(params), "--set", "build_dbs.source=uniter_release",
                 "--set", f"build_dbs.uniter_release.root={root}"]) == 0


def test_dbs_of_an_earlier_build_that_the_import_does_not_write_are_removed(tmp_path, tok):
    """DVC leaves build_dbs' outputs in place (persist: true): a text DB of an earlier native build
    (VCR, which the import does not convert) must not stay beside the imported ones."""
    from pipeline.common.ownership import claim_dir

    root, data = tmp_path / "release", tmp_path / "data"
    _small_release(root, tok)
    earlier = claim_dir(data / "db" / "txt" / "vcr_qa_train", "build_dbs")
    (earlier / "data.mdb").write_bytes(b"an earlier build's")
    run(params_for(data, f"build_dbs.uniter_release.root={root}"))
    assert sorted(p.name for p in (data / "db" / "txt").iterdir()) == ["_run.json", "pretrain_indomain_val"]


def test_a_full_disk_during_the_import_is_one_line_and_publishes_nothing(tmp_path, tok, monkeypatch):
    from helpers.disk_full import fill_disk_at
    from pipeline.common.failures import MACHINE_STATE, describe

    root, data = tmp_path / "release", tmp_path / "data"
    _small_release(root, tok)
    fill_disk_at(monkeypatch, "/.uniter_import.tmp/txt/")  # a file of a staged text DB
    with pytest.raises(OSError) as info:
        run(params_for(data, f"build_dbs.uniter_release.root={root}"))
    status, line = describe(info.value)
    assert status == MACHINE_STATE and line.startswith("disk full: ") and "\n" not in line, line
    assert not [p for p in (data / "db").rglob("*") if p.is_file()]  # nothing published, staging removed
