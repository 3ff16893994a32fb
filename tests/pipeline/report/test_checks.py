"""The demo's verdicts (pipeline/report/checks.py) and ``python -m pipeline report checks``: each check
passes on outputs that meet its margin and fails, naming the subject, on outputs just short of it."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from pipeline.common.runinfo import file_digest
from pipeline.report import checks
from pipeline.report import cli as report_cli

EVAL = {"held_out": {"itm": {"batches": 2, "examples": 100, "matched": 56}},
        "no_pretraining": {"mlm": {"mlm_acc": 0.05}, "itm": {"itm_acc": 0.5}},
        "pretrained_text_only": {"mlm": {"mlm_acc": 0.40}},
        "pretrained": {"mlm": {"mlm_acc": 0.45}, "itm": {"itm_acc": 0.62}}}
RESULTS = {"tasks": ["vqa", "vcr"],
           "rows": [{"task": "vqa", "metric": "test/accuracy", "pretrained": 40.0, "scratch": 30.0, "chance": 34.0},
                    {"task": "vcr", "metric": "test/qar_accuracy", "pretrained": 30.0, "scratch": 10.0,
                     "chance": 6.25}]}
PLANTED = {"overlaps": [{"dataset": "coco", "image_id": "11", "reason": "eval_split", "matches": ["coco/test/1"]},
                        {"dataset": "cc", "image_id": "c1", "reason": "near_duplicate", "matches": ["x"]}],
           "controls": [{"dataset": "cc", "image_id": "c9", "reason": None}]}


def _write(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))


def _export(data: Path, name: str, stage: str, weights: bytes) -> None:
    (data / "models" / name).mkdir(parents=True, exist_ok=True)
    (data / "models" / name / "model.safetensors").write_bytes(weights)
    _write(data / "models" / name / "_run.json", {"stage": stage})


@pytest.fixture()
def data(tmp_path) -> Path:
    """A data directory whose outputs meet every margin."""
    data = tmp_path / "data"
    _write(data / "models" / "pretrain" / "eval.json", EVAL)
    _write(data / "reports" / "results.json", RESULTS)
    _write(data / "raw" / "mini" / "planted.json", PLANTED)
    _write(data / "reports" / "cleaning" / "coco.json", {"removed": [{"image_id": "11", "reason": "eval_split"}]})
    _write(data / "reports" / "cleaning" / "cc.json", {"removed": [{"image_id": "c1", "reason": "near_duplicate"}]})
    _export(data, "pretrain", "pretrain", b"pretrained weights")
    _export(data, "pretrain_vcr", "pretrain_vcr", b"vcr weights")
    for task, init in (("vqa", "pretrain"), ("vcr", "pretrain_vcr")):
        digest = file_digest(data / "models" / init / "model.safetensors")
        _write(data / "models" / task / "_run.json", {"input_digests": {"init": digest}})
        _write(data / "models" / task / "model_config.json", {"init": f"data/models/{init}"})
    return data


def _by_check(verdicts) -> dict[str, list]:
    out: dict[str, list] = {}
    for v in verdicts:
        out.setdefault(v.check, []).append(v.passed)
    return out


def test_outputs_that_meet_every_margin_pass_and_the_rerun_is_not_applicable_without_one(data):
    verdicts = checks.evaluate(data)
    assert _by_check(verdicts) == {"mlm_uses_image": [True, True], "itm_beats_majority": [True],
                                   "task_beats_chance": [True, True], "decontamination": [True, True],
                                   "start_is_the_export": [True, True], "rerun_identical": [None]}
    assert not checks.failed(verdicts)
    itm = next(v for v in verdicts if v.check == "itm_beats_majority")
    assert itm.value == 0.06 and itm.margin == ">= +0.05"  # 0.62 against a majority rate of 0.56


def test_the_margins_are_the_demos(data):
    # existing margins stay unless a rule written first changes them (docs/rig.md)
    assert (checks.MLM_MARGIN, checks.ITM_MARGIN, checks.CHANCE_MARGIN) == (0.03, 0.05, 5.0)


@pytest.mark.parametrize(("path", "change", "check"), [
    ("models/pretrain/eval.json", lambda r: r["pretrained_text_only"]["mlm"].update(mlm_acc=0.43), "mlm_uses_image"),
    ("models/pretrain/eval.json", lambda r: r["pretrained"]["itm"].update(itm_acc=0.60), "itm_beats_majority"),
    ("reports/results.json", lambda r: r["rows"][0].update(pretrained=38.9), "task_beats_chance"),
    ("reports/cleaning/cc.json", lambda r: r["removed"].append({"image_id": "c9", "reason": "canonical_url"}),
     "decontamination"),
    ("reports/cleaning/coco.json", lambda r: r["removed"][0].update(reason="coco_id"), "decontamination"),
    ("models/vcr/model_config.json", lambda r: r.update(init="data/models/pretrain"), "start_is_the_export"),
])
def test_an_output_just_short_of_a_margin_fails_that_check_only(data, path, change, check):
    obj = json.loads((data / path).read_text())
    change(obj)
    _write(data / path, obj)
    bad = checks.failed(checks.evaluate(data))
    assert bad and {v.check for v in bad} == {check}, bad


def test_a_start_from_other_weights_fails(data):
    (data / "models" / "pretrain" / "model.safetensors").write_bytes(b"pretrained weights, trained again")
    bad = checks.failed(checks.evaluate(data))
    assert [(v.check, v.subject) for v in bad] == [("start_is_the_export", "vqa from pretrain")]


def test_a_rerun_must_match_every_output_but_run_records_and_wall_clock_series(data, tmp_path):
    rerun = tmp_path / "rerun"
    shutil.copytree(data, rerun)
    _write(rerun / "models" / "pretrain" / "_run.json", {"stage": "pretrain", "wall_time_s": 9})
    (rerun / "checkpoints").mkdir()
    (rerun / "checkpoints" / "x").write_text("a working file")
    (rerun / "cache" / "locks").mkdir(parents=True)  # stage locks
    (rerun / "cache" / "locks" / "pretrain.lock").write_text("")
    same = [v for v in checks.evaluate(data, rerun=rerun) if v.check == "rerun_identical"]
    assert [v.passed for v in same] == [True]
    _write(rerun / "reports" / "results.json", {**RESULTS, "tasks": ["vqa"]})
    differ = [v for v in checks.evaluate(data, rerun=rerun) if v.check == "rerun_identical"]
    assert [v.passed for v in differ] == [False] and differ[0].detail.endswith(": reports/results.json")


def test_a_real_data_run_has_no_planted_overlaps_to_check(data):
    (data / "raw" / "mini" / "planted.json").unlink()
    verdicts = [v for v in checks.evaluate(data) if v.check == "decontamination"]
    assert [v.passed for v in verdicts] == [None]


def _cli(*argv: str) -> tuple[int, str]:
    buf = io.StringIO()
    code = report_cli.main(["checks", *argv], console=Console(file=buf, width=200, color_system=None))
    return code, buf.getvalue()


def test_the_command_prints_every_verdict_and_exits_1_when_one_fails(data, tmp_path):
    code, out = _cli("--dir", str(data), "--json", str(tmp_path / "checks.json"))
    assert code == 0 and "all 9 applicable checks pass" in out and "itm_beats_majority" in out
    saved = json.loads((tmp_path / "checks.json").read_text())
    assert saved["mini_world_version"] >= 1 and saved["checks_version"] == checks.CHECKS_VERSION
    assert len(saved["verdicts"]) == 10
    _write(data / "reports" / "results.json", {**RESULTS, "rows": [{**RESULTS["rows"][0], "pretrained": 35.0}]})
    code, out = _cli("--dir", str(data))
    assert code == 1 and "FAIL" in out and "1 of" in out
    assert _cli("--dir", str(tmp_path / "missing"))[0] == 1


def test_the_markdown_names_the_rig_and_each_verdict(data):
    md = checks.checks_markdown(checks.evaluate(data), "data")
    assert f"mini world v{checks.rig_stamp()['mini_world_version']}" in md
    assert "| itm_beats_majority | ITM acc over the majority rate | 0.06 | >= +0.05 | pass |" in md


def test_a_data_directory_without_the_runs_outputs_fails_rather_than_passing_nothing(tmp_path):
    verdicts = checks.evaluate(tmp_path)
    assert {v.check for v in checks.failed(verdicts)} == {"mlm_uses_image", "itm_beats_majority", "task_beats_chance",
                                                         "start_is_the_export"}
    assert all("dvc repro" in v.detail for v in checks.failed(verdicts))


def test_a_run_stopped_after_pretraining_reads_the_later_checks_as_not_applicable(data):
    for later in ("reports/results.json", "models/vqa", "models/vcr"):
        path = data / later
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    assert {v.check for v in checks.failed(checks.evaluate(data))} == {"task_beats_chance", "start_is_the_export"}
    partial = _by_check(checks.evaluate(data, ran={"decontaminate", "pretrain"}))
    assert partial["mlm_uses_image"] == [True, True] and partial["itm_beats_majority"] == [True]
    assert partial["task_beats_chance"] == [None] and partial["start_is_the_export"] == [None]
    assert partial["decontamination"] == [True, True]
    # a check whose stage ran still fails on what that stage got wrong
    _write(data / "models" / "pretrain" / "eval.json", {**EVAL, "pretrained": {**EVAL["pretrained"],
                                                                              "itm": {"itm_acc": 0.57}}})
    assert _by_check(checks.evaluate(data, ran={"pretrain"}))["itm_beats_majority"] == [False]
