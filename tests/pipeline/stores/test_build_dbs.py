"""Stage build_dbs on a synthetic world in the contract formats: contents, side files, targets,
truncation accounting, byte determinism, and a build killed midway."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from safetensors.numpy import load_file
from safetensors import safe_open

from helpers.dbs_synthetic import ROOT, write_world, params_for
from helpers.disk_full import fill_disk_at
from pipeline.common.ownership import OWNER_FILE
from pipeline.stores.build_dbs import run
from pipeline.stores.db_cli import main as db_main
from pipeline.stores.readers import ImageDb, TextDb
from pipeline.stores.text_db_builder import pretrain_specs, text_db_names
from pipeline.stores.tokenization import WordPieceTokenizer, default_vocab_path
from pipeline.stores.vqa_answers import answer_score, normalize_answer

pytestmark = pytest.mark.stage  # runs a pipeline stage or trains a model (not in `make test-unit`)

OVERRIDES = ("build_dbs.commit_every=2", "build_dbs.vqa_min_answer_count=1")
TEXT_DBS = {
    *(f"pretrain_{d}_{s}" for d in ("indomain", "outdomain") for s in ("train", "val")),
    *(f"vqa_{s}" for s in ("train", "val", "test")),
    *(f"vcr_{v}_{s}" for v in ("qa", "qar") for s in ("train", "val", "test")),
    *(f"nlvr2_{s}" for s in ("train", "dev", "test")),
    *(f"snli_ve_{s}" for s in ("train", "dev", "test")),
    *(f"retrieval_{d}_{s}" for d in ("coco", "flickr") for s in ("train", "val", "test")),
    *(f"refcoco_plus_{s}" for s in ("train", "val", "testA", "testB")),
}
IMAGE_DBS = {"cc", "coco", "coco_gt", "flickr30k", "nlvr2", "sbu", "vcr", "vcr_gt", "vg"}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    data = tmp_path_factory.mktemp("world") / "data"
    facts = write_world(data)
    counts = run(params_for(data, *OVERRIDES))
    return data, facts, counts


@pytest.fixture(scope="module")
def tok():
    return WordPieceTokenizer()


def files_below(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.name.startswith("_run")}


def test_every_db_and_side_file_is_written(built):
    data, _, counts = built
    assert {p.name for p in (data / "db" / "img").iterdir() if p.is_dir()} == IMAGE_DBS
    assert {p.name for p in (data / "db" / "txt").iterdir() if p.is_dir()} == TEXT_DBS
    for name in IMAGE_DBS:
        assert sorted(p.name for p in (data / "db" / "img" / name).iterdir()) == \
            [OWNER_FILE, "_run.json", "data.mdb", "meta.json", "nbb.json"]
    for name in TEXT_DBS:
        files = {p.name for p in (data / "db" / "txt" / name).iterdir()}
        assert {"_run.json", "data.mdb", "meta.json", "id2len.json", "txt2img.json", "img2txts.json"} <= files
        assert counts["txt"][name]["examples"] == len(TextDb(data / "db" / "txt" / name))
    assert (data / "db" / "img" / "_run.json").is_file() and (data / "db" / "txt" / "_run.json").is_file()
    params = params_for(data, *OVERRIDES)  # the preflight's list is the list of what is written
    assert set(text_db_names(params.ingest.datasets, corpora=params.pretrain_corpora())) == TEXT_DBS == \
        set(counts["txt"])


def test_image_dbs_round_trip_the_shards_exactly(built):
    data, _, _ = built
    for name in sorted(IMAGE_DBS):
        db = ImageDb(data / "db" / "img" / name)
        seen = 0
        for shard in sorted((data / "features" / name).glob("*.safetensors")):
            tensors = load_file(str(shard))
            with safe_open(str(shard), framework="numpy") as fh:
                ids = json.loads(fh.metadata()["image_ids"])
            off = tensors["offsets"]
            for i, image_id in enumerate(ids):
                rec = db[image_id]
                for key in ("features", "boxes", "norm_bb", "conf", "soft_labels"):
                    expected = tensors[key][off[i]:off[i + 1]]
                    assert rec[key].dtype == expected.dtype
                    np.testing.assert_array_equal(rec[key], expected)
                assert (rec["image_h"], rec["image_w"]) == tuple(tensors["image_hw"][i])
                assert db.nbb[image_id] == off[i + 1] - off[i]
                seen += 1
        assert seen == len(db) == db.meta["num_images"]
        assert db.feature_dim == 16 and db.num_classes == 6


def test_pretrain_text_matches_an_independent_bert_tokenizer_and_counts_truncation(built):
    from transformers import BertTokenizer

    data, _, counts = built
    ref = BertTokenizer(str(default_vocab_path()), do_lower_case=True)
    db = TextDb(data / "db" / "txt" / "pretrain_indomain_train")
    clean = pd.concat([pd.read_parquet(data / "clean" / f"{d}.parquet") for d in ("coco", "vg")])
    train = clean[clean["split"] == "train"].set_index("example_id")
    long_texts = 0
    for eid in train.index:
        if eid == "coco-missing-0":
            assert eid not in db.id2len
            continue
        expected = ref.convert_tokens_to_ids(ref.tokenize(train.loc[eid, "text"]))
        long_texts += len(expected) > 60
        rec = db[eid]
        assert rec["input_ids"].dtype == np.int32 and rec["input_ids"].tolist() == expected[:60]
        assert db.id2len[eid] == len(expected[:60])
        source = train.loc[eid, "image_source"]
        assert rec["image_ids"] == db.txt2img[eid] == [f"{source}/{train.loc[eid, 'image_id']}"]
    assert long_texts == 1 == db.meta["truncated"] == counts["txt"]["pretrain_indomain_train"]["truncated"]
    assert db.meta["dropped"] == {"missing_image": 1} and db.meta["img_db"] == ["coco", "vg"]
    img2txts = json.loads((db.path / "img2txts.json").read_text())
    assert sorted(itertools.chain(*img2txts.values())) == db.ids
    assert db.meta["vocab_size"] == 30522 and db.meta["special_ids"]["cls"] == 101


def test_outdomain_val_uses_cc_val_rows_or_a_seeded_image_split(built, tmp_path, tok):
    data, _, _ = built
    val = TextDb(data / "db" / "txt" / "pretrain_outdomain_val")
    assert val.ids == ["cc-108", "cc-109"]  # the clean CC val rows
    other = tmp_path / "data"
    write_world(other, cc_val=False)
    splits = [pretrain_specs(other / "clean", ("coco", "vg", "cc", "sbu"), tok, max_len=60, outdomain_val_size=3,
                             seed=7) for _ in range(2)]
    train, val = (next(s for s in splits[0] if s.name == f"pretrain_outdomain_{n}") for n in ("train", "val"))
    val_images = {r["image_ids"][0] for r in val.records}
    assert len(val_images) == 3 and not val_images & {r["image_ids"][0] for r in train.records}
    assert len(train.records) + len(val.records) == 18
    again = next(s for s in splits[1] if s.name == "pretrain_outdomain_val")
    assert [r["example_id"] for r in again.records] == [r["example_id"] for r in val.records]


def test_the_pretraining_dbs_are_those_of_the_corpora_configured(built, tmp_path):
    """COCO + VG (UNITER's in-domain pretraining) could not reach pretraining: build_dbs built the
    pretraining DBs only with all of coco, vg, cc and sbu in ingest.datasets. Now it builds those of
    the corpora configured; one configured without its clean manifest is named before any DB is built."""
    from pipeline.common.runinfo import InputsMissingError

    data = tmp_path / "data"
    write_world(data)
    (data / "clean" / "cc.parquet").unlink()
    (data / "clean" / "sbu.parquet").unlink()
    with pytest.raises(InputsMissingError, match=r"corpora without a clean manifest: cc, sbu \(.*/clean/cc"):
        run(params_for(data, *OVERRIDES))
    assert not (data / "db").exists()
    counts = run(params_for(data, *OVERRIDES, "ingest.datasets=[coco,vg,vqa,vcr,nlvr2,snli_ve,flickr30k,refcoco]"))
    assert set(counts["txt"]) == TEXT_DBS - {"pretrain_outdomain_train", "pretrain_outdomain_val"}
    ref = TextDb(built[0] / "db" / "txt" / "pretrain_indomain_train")  # the four corpora's build, same DB
    assert TextDb(data / "db" / "txt" / "pretrain_indomain_train").ids == ref.ids
    counts = run(params_for(data, *OVERRIDES, "decontaminate.pretrain_datasets=[coco]"))  # one of them cleaned
    assert TextDb(data / "db" / "txt" / "pretrain_indomain_val").meta["datasets"] == ["coco"]


def test_vqa_soft_targets_and_answer_vocabulary(built):
    data, _, _ = built
    for c in range(11):  # official accuracy: min(matches/3, 1) averaged over the ten 9-annotator subsets
        brute = np.mean([min((c - (k < c)) / 3, 1) for k in range(10)])
        assert answer_score(c) == pytest.approx(brute, abs=1e-6)
    assert normalize_answer("A circle.") == "circle" and normalize_answer("two") == "2"
    assert normalize_answer("dont") == "don't" and normalize_answer("1,000") == "1000"
    train = TextDb(data / "db" / "txt" / "vqa_train")
    ans2label = json.loads((train.path / "ans2label.json").read_text())
    assert ans2label == json.loads((data / "db" / "txt" / "vqa_test" / "ans2label.json").read_text())
    assert train.meta["num_answers"] == len(ans2label)
    # vocabulary = normalized most-common answers of train+val questions: "3", "yes", "2", "circle"
    assert sorted(ans2label) == ["2", "3", "circle", "yes"]
    rec = train["vqa-0"]  # answers: two x2, 2 x1, three x7 -> "2": 3 of 10 (0.9), "3": 7 of 10 (1.0)
    got = dict(zip(rec["answer_labels"].tolist(), rec["answer_scores"].tolist()))
    assert got == {ans2label["2"]: pytest.approx(0.9), ans2label["3"]: 1.0}
    assert TextDb(data / "db" / "txt" / "vqa_val")["vqa-1"]["answer_scores"].tolist() == [1.0]  # "no" not in vocab
    rec = train["vqa-3"]  # "A circle." x10 normalizes to "circle"
    assert dict(zip(rec["answer_labels"].tolist(), rec["answer_scores"].tolist())) == {ans2label["circle"]: 1.0}
    assert len(TextDb(data / "db" / "txt" / "vqa_test")["vqa-2"]["answer_labels"]) == 0


def test_vcr_views_object_tags_and_truncation(built, tok):
    data, _, _ = built
    qa, qar = (TextDb(data / "db" / "txt" / f"vcr_{v}_train") for v in ("qa", "qar"))
    assert qa.ids == qar.ids == ["vcr-0", "vcr-1", "vcr-4"]
    a, r = qa["vcr-0"], qar["vcr-0"]
    tag = [tok.object_tag_id(k) for k in range(4)]
    assert tag == [1, 2, 3, 4]  # [unused0].. in the BERT vocab
    q = tok.encode("Why is") + [tag[0], tag[1]] + tok.encode("looking at") + [tag[3]] + tok.encode("?")
    assert a["input_ids"].tolist() == q and len(a["choices"]) == 4 and a["label"] == 0
    assert a["choices"][0].tolist() == tok.encode("Because") + [tag[0]] + tok.encode("is happy .")
    assert "answer_choices" not in a and r["answer_label"] == 0 and r["label"] == 0
    assert r["choices"][0].tolist() == [tag[1]] + tok.encode("smiles .")
    # vcr-0 has 250-token rationales: only the QA->R view must shrink, to 220 in total
    total = len(r["input_ids"]) + max(map(len, r["answer_choices"])) + max(map(len, r["choices"]))
    assert total == 220 == qar.id2len["vcr-0"] and qar.meta["truncated"] == 1 and qa.meta["truncated"] == 0
    assert qa.meta["image_layout"] == "concat" and a["image_ids"] == ["vcr_gt/100", "vcr/100"]
    assert qa.meta["obj_tags"]["ids"] == tag
    test = TextDb(data / "db" / "txt" / "vcr_qar_test")
    assert test[test.ids[0]]["label"] == -1 and test[test.ids[0]]["answer_label"] == -1


def test_nlvr2_snli_refcoco_targets(built):
    data, facts, _ = built
    nl = TextDb(data / "db" / "txt" / "nlvr2_train")["nlvr2-0"]
    assert nl["image_ids"] == ["nlvr2/100", "nlvr2/101"] and nl["label"] == 1
    assert TextDb(data / "db" / "txt" / "nlvr2_dev")["nlvr2-1"]["label"] == 0
    assert TextDb(data / "db" / "txt" / "nlvr2_test")["nlvr2-2"]["label"] == -1  # split test1, no label
    assert TextDb(data / "db" / "txt" / "nlvr2_train").meta["image_layout"] == "pair"
    snli = TextDb(data / "db" / "txt" / "snli_ve_dev")
    assert snli["snli-1"]["label"] == 1 and snli.meta["label_names"][1] == "neutral"
    ref = TextDb(data / "db" / "txt" / "refcoco_plus_train")
    rec = ref["ref-0"]
    np.testing.assert_array_equal(rec["target_box"], [60, 60, 120, 140])
    np.testing.assert_array_equal(rec["gt_boxes"], facts["coco_gt"]["100"])
    assert rec["target_index"] == 1 and rec["gt_image_ids"] == ["coco_gt/100"]
    assert ref.meta["img_db"] == ["coco", "coco_gt"] and ref.meta["gt_img_db"] == "coco_gt"


KILL_SCRIPT = """
import os, signal, sys
sys.path.insert(0, {tests!r})
import pipeline.stores.image_db_builder as image_dbs
from helpers.dbs_synthetic import params_for
from pipeline.stores.build_dbs import run
from pipeline.stores.db_cli import main as db_main
real, calls = image_dbs.encode_value, [0]
def dying(record, compression):
    calls[0] += 1
    if calls[0] == 15:  # cc (10 images) is done; coco has committed 2 batches of 2
        os.kill(os.getpid(), signal.SIGKILL)
    return real(record, compression)
image_dbs.encode_value = dying
run(params_for({data!r}, *{overrides!r}))
"""


def test_killed_build_leaves_no_partial_db_and_rerun_is_byte_identical(built, tmp_path):
    clean_data, _, _ = built
    data = tmp_path / "data"
    write_world(data)
    script = KILL_SCRIPT.format(tests=str(Path(__file__).resolve().parents[2]), data=str(data), overrides=OVERRIDES)
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr[-2000:]
    img = data / "db" / "img"
    assert (img / "cc" / "data.mdb").is_file() and not (img / "coco").exists()
    assert [p.name for p in img.glob(".coco.*.tmp")]  # the killed build's temp dir, never at the final path
    run(params_for(data, *OVERRIDES))
    assert not list(img.glob(".*"))
    assert files_below(data / "db") == files_below(clean_data / "db")


def test_failure_during_a_text_db_keeps_the_previous_db_and_image_dbs_are_reused(built, tmp_path, monkeypatch):
    data = tmp_path / "data"
    write_world(data)
    run(params_for(data, *OVERRIDES))
    before = files_below(data / "db")
    mtime = (data / "db" / "img" / "coco" / "data.mdb").stat().st_mtime_ns
    import pipeline.stores.build_dbs as build_dbs

    real, calls = build_dbs.encode_value, [0]

    def failing(record, compression):
        calls[0] += 1
        if calls[0] == 40:
            raise RuntimeError("injected failure")
        return real(record, compression)

    monkeypatch.setattr(build_dbs, "encode_value", failing)
    with pytest.raises(RuntimeError, match="injected"):
        run(params_for(data, *OVERRIDES))
    assert files_below(data / "db") == before  # the DB being rebuilt was replaced by nothing half-done
    assert not list((data / "db" / "txt").glob(".*"))
    assert (data / "db" / "img" / "coco" / "data.mdb").stat().st_mtime_ns == mtime  # up to date: not rebuilt


def test_a_full_disk_in_a_text_db_is_one_line_and_keeps_the_previous_db(built, tmp_path, monkeypatch):
    from pipeline.common.failures import MACHINE_STATE, describe

    data = tmp_path / "data"
    write_world(data)
    run(params_for(data, *OVERRIDES))
    before = files_below(data / "db")
    target = data / "db" / "txt" / "vqa_val"
    with monkeypatch.context() as patch:
        fill_disk_at(patch, f"/.{target.name}.")  # a file inside the DB's temporary directory
        with pytest.raises(OSError) as info:
            run(params_for(data, *OVERRIDES))
    status, line = describe(info.value)
    assert status == MACHINE_STATE and line.startswith(f"disk full: {data}/db/txt/.vqa_val.") and "\n" not in line
    assert files_below(data / "db") == before
    assert not list((data / "db" / "txt").glob(".*"))


def test_db_cli_inspect_and_stats(built, capsys):
    data, _, _ = built
    assert db_main(["inspect", str(data / "db" / "txt" / "vcr_qa_train"), "--key", "vcr-0"]) == 0
    out = capsys.readouterr().out
    assert "why is <obj 0> <obj 1> looking at <obj 3> ?" in out and "choices[0]: because <obj 0> is happy." in out
    assert "int32" in out and "vcr_gt/100" in out
    assert db_main(["inspect", str(data / "db" / "img" / "coco"), "--key", "100"]) == 0
    out = capsys.readouterr().out
    assert "float16" in out and "features" in out and "soft_labels" in out and "regions:" in out
    assert db_main(["inspect", str(data / "db" / "img" / "coco"), "--key", "nope"]) == 1
    assert "'nope' not in image DB 'coco'" in capsys.readouterr().out
    assert db_main(["stats", str(data / "db" / "txt" / "pretrain_indomain_train")]) == 0
    out = capsys.readouterr().out
    assert "examples" in out and "34" in out and "truncated" in out and "text tokens per example" in out
    assert db_main(["stats", str(data)]) == 2


@pytest.mark.slow
def test_build_dbs_on_real_mini_world_manifests(tmp_path):
    """mini_world -> ingest -> decontaminate for real; features synthetic (the detector is slow to fit)."""
    from pipeline.decontam import decontaminate
    from pipeline.ingest import ingest
    from pipeline.params.parser import load_params, to_dict
    from helpers.mini_world import small_config
    from pipeline.mini_world import generate
    from helpers.dbs_synthetic import write_features

    base = load_params(ROOT / "params.yaml")
    world = tmp_path / "raw"
    generate(small_config(world), base.seed, world, base.eval_splits(), progress=False)
    default_root = str(base.mini_world.out_dir)
    overrides = [f"sources.{ds}.{key}={str(value).replace(default_root, str(world), 1)}"
                 for ds, section in to_dict(base.sources).items() for key, value in section.items()
                 if str(value).startswith(default_root)] + [f"paths.data={tmp_path / 'data'}"]
    params = load_params(ROOT / "params.yaml", overrides)
    ingest.run(params)
    decontaminate.run(params)
    data = tmp_path / "data"
    frames = {p.stem: pd.read_parquet(p) for p in sorted((data / "manifests").glob("*.parquet"))
              if not p.name.endswith(".rejects.parquet")}
    frames.update({f"clean_{p.stem}": pd.read_parquet(p) for p in (data / "clean").glob("*.parquet")})
    needed: dict[str, set[str]] = {}
    for frame in frames.values():
        for source, image_id in zip(frame["image_source"], frame["image_id"]):
            needed.setdefault(source, set()).add(str(image_id))
    needed.setdefault("nlvr2", set()).update(frames["nlvr2"]["image_id_2"].astype(str))
    for k, source in enumerate(sorted(needed)):
        write_features(data / "features", source, sorted(needed[source]), seed=k, shard_size=64)
    vcr = frames["vcr"].drop_duplicates("image_id")
    given = {i: np.zeros((len(json.loads(o)), 4), np.float32) for i, o in zip(vcr["image_id"], vcr["objects"])}
    write_features(data / "features", "vcr_gt", sorted(given), seed=99, shard_size=64, boxes_of=given)

    counts = run(params)
    assert set(counts["txt"]) == TEXT_DBS
    assert all(c["dropped"] == {} and "skipped" not in c and c["examples"] > 0 for c in counts["txt"].values())
    txt = data / "db" / "txt"
    qa = TextDb(txt / "vcr_qa_train")
    tags = qa.meta["obj_tags"]["ids"]
    for eid in qa.ids:  # every object tag points at a given box of the example's image
        rec = qa[eid]
        used = [tags.index(t) for t in rec["input_ids"].tolist() + sum((c.tolist() for c in rec["choices"]), [])
                if t in tags]
        gt_db, _, image_id = rec["image_ids"][0].partition("/")
        assert max(used) < len(rec["objects"]) == ImageDb(data / "db" / "img" / gt_db).nbb[image_id]
    vqa = TextDb(txt / "vqa_train")
    ans2label = json.loads((vqa.path / "ans2label.json").read_text())
    manifest = frames["vqa"].set_index("example_id")
    for eid in vqa.ids[:40]:
        rec = vqa[eid]
        answers = [normalize_answer(a) for a in manifest.loc[eid, "answers"]]
        expected = {ans2label[a]: answer_score(answers.count(a)) for a in set(answers) if a in ans2label}
        assert dict(zip(rec["answer_labels"].tolist(), rec["answer_scores"].tolist())) == pytest.approx(expected)
    nl = TextDb(txt / "nlvr2_dev")
    assert all(len(nl[e]["image_ids"]) == 2 and nl[e]["label"] in (0, 1) for e in nl.ids)
    ref = TextDb(txt / "refcoco_plus_val")
    assert all(ref[e]["target_index"] >= 0 for e in ref.ids)  # the referred box is among the image's gt boxes
    clean_cc_val = frames["clean_cc"].query("split == 'val'")["example_id"].tolist()
    assert TextDb(txt / "pretrain_outdomain_val").ids == sorted(clean_cc_val)
    # the mini world's evaluation-server files reach the test DBs: VQA and VCR test are labelled
    vqa_test = TextDb(txt / "vqa_test")
    assert len(vqa_test) and all(manifest.loc[e, "answers"] is not None for e in vqa_test.ids)
    assert sum(len(vqa_test[e]["answer_labels"]) > 0 for e in vqa_test.ids) > len(vqa_test) / 2
    for view in ("qa", "qar"):
        test = TextDb(txt / f"vcr_{view}_test")
        assert len(test) and all(test[e]["label"] >= 0 for e in test.ids)
