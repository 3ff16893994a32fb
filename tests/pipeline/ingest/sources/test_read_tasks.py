"""VQA v2, VCR, NLVR2 and SNLI-VE readers on the hand-written fixtures."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from pipeline.ingest.sources import vqa as vqa_reader
from pipeline.ingest.sources.nlvr2 import _pair_dir
from pipeline.params.parser import load_params
from helpers.source_fixtures import FIXTURES, REPO, fates, fixture_overrides, ingest

VQA_SERVER = FIXTURES / "vqa/eval_server/v2_mscoco_test2015_annotations.json"
VCR_SERVER = FIXTURES / "vcr/eval_server/test_labels.jsonl"


def with_eval_server(tmp_path, *sets: str):
    """The fixture params plus evaluation-server files (the mini world's stand-ins for the hidden test labels)."""
    return load_params(REPO / "params.yaml", [*fixture_overrides(tmp_path), "world=real", *sets])


def test_vqa(fixture_params):
    result, manifest, rejects = ingest(fixture_params, "vqa")
    train, test = "v2_OpenEnded_mscoco_train2014_questions.json", "v2_OpenEnded_mscoco_test2015_questions.json"
    assert fates(rejects) == [
        (train, "questions[1]", "missing_caption"),
        (train, "questions[2]", "missing_field"),  # no question
        (train, "questions[3]", "duplicate_id"),  # question_id 1000 again
        (train, "questions[4]", "missing_field"),  # no annotation
        (train, "questions[5]", "bad_label"),  # 9 answers
        (train, "questions[6]", "unreadable_image"),  # COCO image 3 is truncated
        (train, "questions[7]", "malformed_row"),  # image_id "1"
        (train, "questions[8]", "text_too_long"),
        (train, "questions[9]", "missing_image"),
        (test, "questions[1]", "non_utf8"),
    ]
    assert manifest.example_id.tolist() == ["vqa:1000", "vqa:2000", "vqa:3000"]
    assert manifest.split.tolist() == ["train", "val", "test"]
    assert manifest.image_path[2].endswith("coco/test2015/COCO_test2015_000000000030.jpg")
    table = pq.read_table(result.manifest_path)
    assert table["answers"].to_pylist()[0] == ["red"] * 4 + ["orange"] + ["red"] * 4 + ["dark red"]
    assert table["answers"].to_pylist()[2] is None and table["multiple_choice_answer"].to_pylist()[2] is None
    assert table["question_type"].to_pylist()[:2] == ["what color is the", "how many"]
    assert set(manifest.image_source) == {"coco"}
    assert (result.rows_in, result.manifest_rows, result.rejected) == (13, 3, 10)


def test_vqa_test_answers_from_the_evaluation_server_file(tmp_path):
    """With ``annotations_test`` (val format) the test questions get their answers; nothing else changes."""
    params = with_eval_server(tmp_path, f"sources.vqa.annotations_test={VQA_SERVER}")
    result, manifest, rejects = ingest(params, "vqa")
    assert manifest.example_id.tolist() == ["vqa:1000", "vqa:2000", "vqa:3000"] and len(rejects) == 10
    test = pq.read_table(result.manifest_path).to_pylist()[2]
    assert test["split"] == "test" and test["answers"] == ["yes"] * 8 + ["no"] * 2
    assert (test["multiple_choice_answer"], test["answer_type"], test["question_type"]) == ("yes", "yes/no", "is the")
    # the file is an input of the stage (its digest goes into _run.json); without it, it is not
    assert vqa_reader.input_files(params.sources)["annotations_test"] == VQA_SERVER
    assert "annotations_test" not in vqa_reader.input_files(with_eval_server(tmp_path).sources)


def test_vqa_test_question_missing_from_the_evaluation_server_file_is_rejected(tmp_path):
    doc = json.loads(VQA_SERVER.read_text())
    doc["annotations"] = [a for a in doc["annotations"] if a["question_id"] != 3000]
    (tmp_path / "server.json").write_text(json.dumps(doc))
    _, manifest, rejects = ingest(with_eval_server(tmp_path, f"sources.vqa.annotations_test={tmp_path / 'server.json'}"),
                                  "vqa")
    assert "vqa:3000" not in manifest.example_id.tolist()
    assert ("v2_OpenEnded_mscoco_test2015_questions.json", "questions[0]", "missing_field") in fates(rejects)


def test_vcr(fixture_params):
    result, manifest, rejects = ingest(fixture_params, "vcr")
    assert fates(rejects) == [
        ("train.jsonl", "line 2", "malformed_row"),  # cut-off JSON
        ("train.jsonl", "line 3", "missing_field"),  # no answer_choices
        ("train.jsonl", "line 4", "bad_label"),  # answer_label 7
        ("train.jsonl", "line 5", "duplicate_id"),  # annot_id train-0 again
        ("train.jsonl", "line 6", "malformed_row"),  # object index 5 of 3 objects
        ("train.jsonl", "line 7", "missing_image"),  # image file absent
        ("train.jsonl", "line 8", "missing_image"),  # metadata file absent
        ("train.jsonl", "line 9", "non_utf8"),
        ("train.jsonl", "line 10", "missing_caption"),
        ("train.jsonl", "line 11", "malformed_row"),  # empty line
        ("test.jsonl", "line 2", "unreadable_image"),  # metadata is not JSON
    ]
    assert manifest.example_id.tolist() == ["vcr:train-0", "vcr:val-0", "vcr:test-0"]
    table = pq.read_table(result.manifest_path)
    assert table["answer_label"].to_pylist() == [0, 3, None] and table["rationale_label"].to_pylist() == [0, 2, None]
    first = manifest.iloc[0]
    assert first.text == "What is person0 doing ?"
    assert json.loads(first.question) == ["What", "is", [0], "doing", "?"]
    assert json.loads(first.objects) == ["person", "person", "car"]
    assert len(json.loads(first.answer_choices)) == 4 and len(json.loads(first.rationale_choices)) == 4
    assert first.metadata_path.endswith("3001_21_JUMP_STREET_00.00.28.367-00.00.29.988@0.json")
    assert first.image_id == "lsmdc_3001_21_JUMP_STREET/3001_21_JUMP_STREET_00.00.28.367-00.00.29.988@0.jpg"
    assert (result.rows_in, result.manifest_rows, result.rejected) == (14, 3, 11)


def test_vcr_test_labels_from_the_evaluation_server_file(tmp_path):
    result, manifest, rejects = ingest(with_eval_server(tmp_path, f"sources.vcr.test_labels={VCR_SERVER}"), "vcr")
    assert manifest.example_id.tolist() == ["vcr:train-0", "vcr:val-0", "vcr:test-0"] and len(rejects) == 11
    table = pq.read_table(result.manifest_path)
    assert table["answer_label"].to_pylist() == [0, 3, 2] and table["rationale_label"].to_pylist() == [0, 2, 1]


@pytest.mark.parametrize("line, fate", [
    ('{"annot_id": "test-9", "answer_label": 1, "rationale_label": 1}', "missing_field"),  # test-0 not in it
    ('{"annot_id": "test-0", "answer_label": 4, "rationale_label": 1}', "bad_label"),  # 4 choices only
])
def test_vcr_test_line_without_good_labels_in_the_file_is_rejected(tmp_path, line, fate):
    (tmp_path / "labels.jsonl").write_text(line + "\n")
    _, manifest, rejects = ingest(with_eval_server(tmp_path, f"sources.vcr.test_labels={tmp_path / 'labels.jsonl'}"),
                                  "vcr")
    assert "vcr:test-0" not in manifest.example_id.tolist()
    assert ("test.jsonl", "line 1", fate) in fates(rejects)


def test_a_bad_vcr_test_label_line_is_counted_and_named_and_the_rest_is_ingested(tmp_path, caplog):
    """One malformed line of the label file no longer aborts the dataset: it is logged (file and
    line) and counted; the question it was for, unlabelled, is rejected like any other."""
    bad = tmp_path / "labels.jsonl"
    bad.write_text('{"annot_id": "test-0", "answer_label": 1, "rationale_label": 1}\n{"annot_id": "test-1"}\n'
                   '{"annot_id": [1], "answer_label": 1\n')
    result, manifest, rejects = ingest(with_eval_server(tmp_path, f"sources.vcr.test_labels={bad}"), "vcr")
    assert "vcr:test-0" in manifest.example_id.tolist()
    assert result.notes["test_label_lines_unreadable"] == 2
    assert f"{bad}: line 2: expected annot_id" in caplog.text and f"{bad}: line 3: invalid JSON" in caplog.text
    assert result.rows_in == result.manifest_rows + result.rejected


def test_a_vcr_test_label_given_twice_names_both_lines(tmp_path):
    from pipeline.common.source_records import SourceFormatError

    bad = tmp_path / "labels.jsonl"
    bad.write_text('{"annot_id": "test-0", "answer_label": 1, "rationale_label": 1}\n'
                   '{"annot_id": "test-0", "answer_label": 2, "rationale_label": 1}\n')
    with pytest.raises(SourceFormatError, match=r"labels.jsonl: line 2: annot_id 'test-0' appears twice \(first on line 1\)"):
        ingest(with_eval_server(tmp_path, f"sources.vcr.test_labels={bad}"), "vcr")


def test_nlvr2(fixture_params):
    result, manifest, rejects = ingest(fixture_params, "nlvr2")
    assert fates(rejects) == [
        ("train.json", "line 3", "duplicate_id"),
        ("train.json", "line 4", "bad_label"),  # label "Maybe"
        ("train.json", "line 5", "missing_field"),  # no sentence
        ("train.json", "line 6", "missing_caption"),
        ("train.json", "line 7", "malformed_row"),  # identifier "bogus"
        ("train.json", "line 8", "bad_url"),  # left_url "not a url"
        ("train.json", "line 9", "missing_image"),  # right image of the pair absent
        ("train.json", "line 10", "malformed_row"),  # cut-off JSON
        ("dev.json", "line 1", "unreadable_image"),  # right image truncated
        ("dev.json", "line 3", "non_utf8"),
    ]
    assert manifest.example_id.tolist() == ["nlvr2:train-10171-0-0", "nlvr2:train-10171-0-1", "nlvr2:dev-851-0-0",
                                            "nlvr2:test1-0-1-0"]
    assert manifest.split.tolist() == ["train", "train", "dev", "test"]
    assert manifest.image_id[0] == "train-10171-0-img0" and manifest.image_id_2[0] == "train-10171-0-img1"
    assert manifest.image_path_2[3].endswith("nlvr2/test1/test1-0-1-img1.png")
    assert pq.read_table(result.manifest_path)["label"].to_pylist() == [True, False, None, True]
    assert manifest.url_2[0] == "https://i.imgur.com/right.jpg"
    assert (result.rows_in, result.manifest_rows, result.rejected) == (14, 4, 10)


def test_nlvr2_nested_train_directory(tmp_path):
    """The real train set keeps pairs in numbered sub-folders (``directory``); flat wins when present."""
    (tmp_path / "26").mkdir()
    (tmp_path / "26" / "train-1-0-img0.png").write_bytes(b"x")
    assert _pair_dir(tmp_path, {"directory": 26}, "train-1-0") == tmp_path / "26"
    (tmp_path / "train-1-0-img0.png").write_bytes(b"x")
    assert _pair_dir(tmp_path, {"directory": 26}, "train-1-0") == tmp_path
    assert _pair_dir(tmp_path, {}, "train-2-0") == tmp_path


def test_snli_ve(fixture_params):
    result, manifest, rejects = ingest(fixture_params, "snli_ve")
    train = "snli_ve_train.jsonl"
    assert fates(rejects) == [
        (train, "line 2", "bad_label"),  # gold_label "-"
        (train, "line 3", "missing_field"),  # no sentence2
        (train, "line 4", "duplicate_id"),  # pairID again
        (train, "line 5", "missing_caption"),
        (train, "line 6", "missing_image"),
        (train, "line 7", "malformed_row"),
        (train, "line 8", "non_utf8"),
        ("snli_ve_dev.jsonl", "line 2", "unreadable_image"),
        ("snli_ve_test.jsonl", "line 2", "text_too_long"),
    ]
    assert manifest.example_id.tolist() == ["snli_ve:1000092795.jpg#0r1e", "snli_ve:10002456.jpg#0r1c",
                                            "snli_ve:1000919630.jpg#0r1e"]
    assert manifest.label.tolist() == ["entailment", "contradiction", "entailment"]
    assert manifest.image_id.tolist() == ["1000092795", "10002456", "1000919630"]
    assert set(manifest.image_source) == {"flickr30k"}
    assert manifest.premise[1] == "A child in a pink dress is climbing stairs."
    assert manifest.text[2] == "A man wears a hat."
    assert (result.rows_in, result.manifest_rows, result.rejected) == (12, 3, 9)
