"""``python -m pipeline report matrix`` (pipeline/report/matrix.py): the side roots' layout and the
tables; the runs themselves are the tiny matrix of docs/rig.md (minutes, not a unit test)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from pipeline.report import matrix
from pipeline.stages import STAGES


def test_the_matrix_runs_stages_of_the_graph_and_splits_it_where_pretraining_begins():
    assert set(matrix.UPSTREAM_STAGES + matrix.CELL_STAGES + matrix.ABLATION_STAGES) <= set(STAGES)
    assert matrix.CELL_STAGES[0] == "pretrain" and matrix.UPSTREAM_STAGES[-1] == "build_dbs"
    assert matrix.cell_name(1234, "bf16", 2) == "seed1234-bf16-t2"


def test_a_cell_links_the_upstream_outputs_and_writes_its_own(tmp_path):
    up = tmp_path / "upstream" / "data"
    for rel in ("db/txt/x", "raw/mini/planted.json", "models/detector/model.pth", "reports/cleaning/coco.json",
                "checkpoints/old", "cache/locks/pretrain.lock"):
        (up / rel).parent.mkdir(parents=True, exist_ok=True)
        (up / rel).write_text(rel)
    cell = tmp_path / "cell" / "data"
    matrix.link_upstream(up, cell)
    matrix.link_upstream(up, cell)  # a resumed matrix links again without error
    assert (cell / "db").is_symlink() and (cell / "raw/mini/planted.json").read_text() == "raw/mini/planted.json"
    assert not (cell / "models").is_symlink() and (cell / "models/detector").is_symlink()
    assert not (cell / "reports").is_symlink() and not (cell / "checkpoints").exists()
    assert not (cell / "cache").exists()  # stage locks stay each root's own
    (cell / "models" / "pretrain").mkdir()  # the cell's own output stays out of upstream
    assert not (up / "models" / "pretrain").exists()


def test_the_params_of_the_matrix_parse_strictly(tmp_path):
    repo = Path(__file__).resolve().parents[3]
    raw = matrix.matrix_params(repo / "params.yaml", ["pretrain.steps=200", "finetune.compare_scratch=false"])
    assert raw["pretrain"]["steps"] == 200 and raw["finetune"]["compare_scratch"] is False


def _cell(passed: bool, gain: float, reading: str) -> dict:
    return {"verdicts": [{"check": "itm_beats_majority", "subject": "ITM acc over the majority rate",
                          "value": 0.06 if passed else 0.01, "margin": ">= +0.05", "passed": passed, "detail": ""}],
            "gains": {"vqa test/accuracy": {"gain": gain, "interval": None, "reading": reading}},
            "ran_with": {"precision": "fp32", "torch_threads": 1}, "ablation": None}


def test_the_tables_show_every_verdict_per_cell_and_the_gains_spread():
    md = matrix.matrix_markdown({"seed1-fp32-t1": _cell(True, 4.0, "gain"), "seed2-bf16-t2": _cell(False, -2.0, "loss")})
    assert "| itm_beats_majority | ITM acc over the majority rate | >= +0.05 | pass 0.06 | FAIL 0.01 |" in md
    assert "| vqa test/accuracy | +4.0 gain | -2.0 loss | +1.0 ± 4.2 (-2.0..+4.0) |" in md
    assert "observations, not verdicts" in md
    piped = _cell(False, 1.0, "gain")
    piped["verdicts"][0]["value"] = "error: a | b"  # a stage's own error, as the JSON keeps it
    assert "| FAIL error: a \\| b |" in matrix.matrix_markdown({"seed1-fp32-t1": piped})


def test_a_failing_stage_names_itself_its_log_and_its_own_error(tmp_path):
    (tmp_path / "params.yaml").write_text("seed: oops\n")
    with pytest.raises(matrix.StageFailed) as caught:
        matrix.run_stages(tmp_path, ["results"], [], threads=1, say=lambda *_: None)
    assert "results" in str(caught.value) and str(tmp_path / ".matrix" / "results.log") in str(caught.value)
    # the CLI's one-line error for bad params, not the log's last line of a traceback
    assert caught.value.stage == "results" and caught.value.reason == "error: params.yaml: missing key world"
    assert not (tmp_path / ".matrix" / "results.done").exists()
    assert (tmp_path / ".matrix" / "results.failed").read_text().strip() == caught.value.reason
    assert matrix.failed_stage(tmp_path, ["pretrain", "results"]) == "results"


DIVERGED = "error: finetune@refcoco_plus: the pretrained start diverged at step 40 (dev 80.1 -> 26.0)"


def _fake_stages(fail_in: set[str]):
    """``subprocess.run`` for the matrix's stage commands: every stage succeeds (``results`` writes an
    empty results.json), except ``finetune`` in a cell named in ``fail_in``, which logs DIVERGED, exits 1."""
    import subprocess

    def run(cmd, cwd, env, stdout, stderr):
        stage, root = cmd[3], Path(cwd)
        (root / "data").mkdir(exist_ok=True)
        if stage == "finetune" and root.name in fail_in:
            stdout.write("some progress\n" + DIVERGED + "\n")
            return subprocess.CompletedProcess(cmd, 1)
        if stage == "results":
            out = root / "data" / "reports" / "results.json"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps({"tasks": [], "rows": [], "meta_sum": {}}))
        return subprocess.CompletedProcess(cmd, 0)
    return run


def test_a_failing_cell_is_a_failing_row_and_the_matrix_goes_on(tmp_path, monkeypatch):
    from pipeline.report.cli import build_parser

    repo = Path(__file__).resolve().parents[3]
    out = tmp_path / "m"
    argv = ["matrix", "--out", str(out), "--params", str(repo / "params.yaml"), "--seeds", "1", "2",
            "--precisions", "fp32", "--threads", "1"]
    monkeypatch.setattr(matrix.subprocess, "run", _fake_stages({"seed1-fp32-t1"}))
    said: list[str] = []
    record = matrix.run_matrix(build_parser().parse_args(argv), say=said.append)
    assert list(record["cells"]) == ["seed1-fp32-t1", "seed2-fp32-t1"]  # seed 2 ran after seed 1 failed
    failed = {v["check"]: v for v in record["cells"]["seed1-fp32-t1"]["verdicts"] if v["passed"] is False}
    assert failed["ran"]["subject"] == "finetune" and failed["ran"]["value"] == DIVERGED
    assert any(DIVERGED in line for line in said)
    by_check = {v["check"]: v for v in record["cells"]["seed1-fp32-t1"]["verdicts"]}
    assert by_check["task_beats_chance"]["passed"] is None  # results never ran: n/a, not a second failure
    assert "ran" not in {v["check"] for v in record["cells"]["seed2-fp32-t1"]["verdicts"]}
    assert (out / "cells" / "seed2-fp32-t1" / matrix.MARKERS / "results.done").exists()
    assert f"| ran | finetune | exit status 0 | FAIL {DIVERGED} |" in (out / "matrix.md").read_text()
    # --no-run tabulates the failed cell too; resumed, the failed stage runs again and its row goes
    tabulated = matrix.run_matrix(build_parser().parse_args([*argv, "--no-run"]), say=lambda *_: None)
    assert list(tabulated["cells"]) == ["seed1-fp32-t1", "seed2-fp32-t1"]
    monkeypatch.setattr(matrix.subprocess, "run", _fake_stages(set()))
    resumed = matrix.run_matrix(build_parser().parse_args(argv), say=lambda *_: None)
    assert "ran" not in {v["check"] for v in resumed["cells"]["seed1-fp32-t1"]["verdicts"]}
    assert not (out / "cells" / "seed1-fp32-t1" / matrix.MARKERS / "finetune.failed").exists()


def test_the_command_is_registered(capsys):
    from pipeline.report.cli import build_parser

    args = build_parser().parse_args(["matrix", "--out", "x", "--seeds", "1", "--precisions", "bf16"])
    assert isinstance(args, argparse.Namespace) and args.seeds == [1] and args.threads == [1, 2]
    assert json.dumps(args.precisions) == '["bf16"]'


def test_params_the_schema_refuses_are_refused_before_any_run():
    from pipeline.params.parser import ParamsError

    repo = Path(__file__).resolve().parents[3]
    with pytest.raises(ParamsError, match="first_phase_steps"):
        matrix.matrix_params(repo / "params.yaml", ["pretrain.steps=20"])


def test_no_run_tabulates_only_the_cells_whose_stages_are_done(tmp_path):
    from pipeline.report.cli import build_parser

    out = tmp_path / "m"
    for name, stages in (("seed1-fp32-t1", matrix.CELL_STAGES), ("seed2-fp32-t1", matrix.CELL_STAGES[:2])):
        marks = out / "cells" / name / matrix.MARKERS
        marks.mkdir(parents=True)
        for stage in stages:
            (marks / f"{stage}.done").write_text("")
        results = out / "cells" / name / "data" / "reports" / "results.json"
        results.parent.mkdir(parents=True)
        results.write_text(json.dumps({"tasks": [], "rows": [], "meta_sum": {}}))
    repo = Path(__file__).resolve().parents[3]
    args = build_parser().parse_args(["matrix", "--out", str(out), "--params", str(repo / "params.yaml"),
                                      "--seeds", "1", "2", "--precisions", "fp32", "--threads", "1", "--no-run"])
    record = matrix.run_matrix(args, say=lambda *_: None)
    assert list(record["cells"]) == ["seed1-fp32-t1"]  # seed 2 has not run fine-tuning yet
    md = (out / "matrix.md").read_text()
    assert "seed1-fp32-t1" in md and "seed2" not in md and "| task_beats_chance | fine-tuning |" not in md
    assert not (out / "upstream" / matrix.MARKERS).exists()  # nothing ran


def test_until_stops_every_cell_after_its_stage():
    assert matrix.cell_stages(None, False) == matrix.CELL_STAGES
    assert matrix.cell_stages("pretrain", False) == ("pretrain",)
    assert matrix.cell_stages("finetune", True) == ("pretrain", "pretrain_vcr", "finetune") + matrix.ABLATION_STAGES
    md = matrix.matrix_markdown({"seed1-fp32-t1": _cell(True, 4.0, "gain")}, until="pretrain")
    assert "each cell ran up to `pretrain`" in md.splitlines()[0]
