"""Stage ``results`` and ``python -m pipeline report results [--exps]``: rows, Meta-Sum arithmetic,
Markdown, determinism, the pretraining section, and experiments side by side from `dvc exp show --json`."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from helpers.dbs_synthetic import params_for

pytestmark = pytest.mark.stage  # runs a pipeline stage or trains a model (not in `make test-unit`)

VQA = {"task": "vqa", "steps": 40, "chance": {"test/accuracy": 30.0, "val/accuracy": 31.0},
       "summary": {"test/accuracy": {"label": "VQA test acc", "pretrained": 71.5, "scratch": 60.25, "gain": 11.25,
                                     "chance": 30.0,
                                     "gain_interval": {"gain": 11.25, "low": 4.5, "high": 18.0, "se": 3.4,
                                                       "level": 0.95, "items": 400, "groups": 130,
                                                       "resamples": 10000}}}}
RETRIEVAL = {"task": "retrieval_flickr", "steps": 30, "chance": {},
             "summary": {"test/ir_r1": {"label": "Flickr IR R@1", "pretrained": 40.0, "scratch": 10.0, "gain": 30.0,
                                        "zero_shot": 20.0, "chance": 3.3333},
                         "test/tr_r1": {"label": "Flickr TR R@1", "pretrained": 50.0, "scratch": 16.5, "gain": 33.5,
                                        "zero_shot": 30.0, "chance": 16.6667}}}
PRETRAIN_EVAL = {"steps": 100, "masking": "joint", "wra": True, "datasets": "indomain",
                 "mix_ratio": {"itm": 2.0, "mlm": 2.0, "mrc": 0.0},
                 "no_pretraining": {"mlm": {"mlm_acc": 0.05}, "itm": {"itm_acc": 0.5}},
                 "pretrained": {"mlm": {"mlm_acc": 0.45}, "itm": {"itm_acc": 0.8}}}


def write_metrics(data: Path, *records: dict) -> None:
    (data / "metrics").mkdir(parents=True, exist_ok=True)
    for r in records:
        (data / "metrics" / f"{r['task']}.json").write_text(json.dumps(r))


def test_rows_and_meta_sum_by_hand():
    from pipeline.report.results import summarize

    out = summarize({"vqa": VQA, "retrieval_flickr": RETRIEVAL})
    assert [(r["task"], r["metric"], r["split"]) for r in out["rows"]] == [
        ("vqa", "test/accuracy", "test"), ("retrieval_flickr", "test/ir_r1", "test"),
        ("retrieval_flickr", "test/tr_r1", "test")]
    assert out["meta_sum"] == {"terms": 3, "pretrained": 161.5, "scratch": 86.75, "gain": 74.75,
                               "chance": 50.0, "gain_interval": None, "reading": "unknown"}  # retrieval: no interval
    no_scratch = {"task": "vqa", "summary": {"val/accuracy": {"label": "x", "pretrained": 70.0, "chance": 1.0}}}
    m = summarize({"vqa": no_scratch})["meta_sum"]
    assert m["pretrained"] == 70.0 and m["scratch"] is None and "gain" not in m


def test_a_gain_reads_as_a_gain_a_loss_or_unresolved_by_its_interval_with_no_exemption():
    """An observation, not a pass/fail: an interval below 0 reads as a loss (RefCOCO+'s -13.0 [-15.9,
    -10.2] once read "no: under 2 points"), and a row near its class oracle is read like any other."""
    from pipeline.report.results import summarize

    def row_reading(pretrained, scratch, low, ceiling_ref=None):
        entry = {"label": "x", "pretrained": pretrained, "scratch": scratch, "gain": pretrained - scratch,
                 "chance": 10.0}
        if low is not None:
            entry["gain_interval"] = {"gain": pretrained - scratch, "low": low, "high": 2 * (pretrained - scratch) - low}
        record = {"task": "vqa", "summary": {"test/accuracy": entry}}
        if ceiling_ref is not None:
            record["references"] = {"oracle": {"label": "oracle", "test/accuracy": ceiling_ref}}
        return summarize({"vqa": record})["rows"][0]["reading"]

    assert row_reading(70.0, 60.0, 3.1) == "gain"
    assert row_reading(70.0, 60.0, -0.8) == "unresolved"  # 10 points the split cannot tell from 0
    assert row_reading(70.0, 60.0, 0.0) == "unresolved"  # "above 0": a bound at 0 does not clear it
    assert row_reading(61.9, 60.0, 0.5) == "gain"  # small, but resolved: no margin is asserted
    assert row_reading(55.0, 68.0, -15.9) == "loss"  # interval [-15.9, -10.1]
    assert row_reading(60.0, 61.0, -3.0) == "unresolved"  # [-3.0, +1.0]
    assert row_reading(70.0, 60.0, None) == "unknown"  # no item scores, no interval
    assert row_reading(98.0, 96.0, 1.0, ceiling_ref=99.0) == "gain"  # no at-ceiling exemption


def test_the_meta_sum_gain_has_an_interval_from_the_rows_standard_errors():
    from pipeline.report.results import summarize

    def entry(p, s, se):
        return {"label": "x", "pretrained": p, "scratch": s, "gain": p - s, "chance": 1.0,
                "gain_interval": {"gain": p - s, "low": p - s - 2 * se, "high": p - s + 2 * se, "se": se}}

    records = {"vqa": {"task": "vqa", "summary": {"test/accuracy": entry(70.0, 60.0, 3.0)}},
               "retrieval_flickr": {"task": "retrieval_flickr",
                                    "summary": {"test/ir_r1": entry(40.0, 42.0, 2.0), "test/tr_r1": entry(50.0, 48.0, 2.0)}}}
    m = summarize(records)["meta_sum"]
    # vqa se 3; retrieval's two rows (one gallery) add as if fully correlated: 4; sqrt(9 + 16) = 5
    assert m["gain"] == 10.0 and m["gain_interval"]["se"] == 5.0
    assert (m["gain_interval"]["low"], m["gain_interval"]["high"]) == (0.2, 19.8) and m["reading"] == "gain"


def test_a_scratch_start_with_its_own_budget_shows_both_steps(tmp_path):
    """finetune.scratch_per_task gives the non-pretrained start its own steps (metrics' scratch_steps):
    the steps cell shows both, and the text no longer says the two starts train the same steps."""
    from pipeline.report.results import run

    data = tmp_path / "data"
    write_metrics(data, {**VQA, "scratch_steps": 80}, RETRIEVAL)
    results = run(params_for(data, "finetune.tasks=[vqa, retrieval_flickr]"))
    assert [r["scratch_steps"] for r in results["rows"]] == [80, None, None]
    md = (data / "reports" / "results.md").read_text()
    assert "| vqa | VQA test acc (`test/accuracy`) | 40 / 80 |" in md
    assert "| retrieval_flickr | Flickr IR R@1 (`test/ir_r1`) | 30 |" in md
    assert "same steps, data order" not in md


def test_a_non_pretrained_start_at_chance_is_marked(tmp_path):
    """A scratch start that scored no better than chance did not take off (RefCOCO+ in one fp32 run
    scored 22.6 against chance 25.3): its row says so and a note explains it; above chance, nothing."""
    from pipeline.report.results import SCRATCH_AT_CHANCE_MARK, run

    data = tmp_path / "data"
    ir, tr = RETRIEVAL["summary"]["test/ir_r1"], RETRIEVAL["summary"]["test/tr_r1"]
    learned = {**RETRIEVAL, "summary": {"test/ir_r1": ir, "test/tr_r1": {**tr, "scratch": 20.0}}}
    flat = {**learned, "summary": {**learned["summary"], "test/ir_r1": {**ir, "scratch": 3.3333}}}
    write_metrics(data, VQA, flat)
    results = run(params_for(data, "finetune.tasks=[vqa, retrieval_flickr]"))
    assert [r["scratch_at_chance"] for r in results["rows"]] == [False, True, False]  # equal to chance counts
    md = (data / "reports" / "results.md").read_text()
    assert f"| retrieval_flickr | Flickr IR R@1 (`test/ir_r1`){SCRATCH_AT_CHANCE_MARK} |" in md
    assert "| retrieval_flickr | Flickr TR R@1 (`test/tr_r1`) |" in md and "*Scratch at chance*" in md
    write_metrics(data, VQA, learned)
    results = run(params_for(data, "finetune.tasks=[vqa, retrieval_flickr]"))
    assert not any(r["scratch_at_chance"] for r in results["rows"])
    assert "*Scratch at chance*" not in (data / "reports" / "results.md").read_text()


def test_stage_writes_markdown_and_json_deterministically(tmp_path):
    from pipeline.report.results import run

    data = tmp_path / "data"
    write_metrics(data, VQA, RETRIEVAL)
    (data / "models" / "pretrain").mkdir(parents=True)
    (data / "models" / "pretrain" / "eval.json").write_text(json.dumps(PRETRAIN_EVAL))
    params = params_for(data, "finetune.tasks=[vqa, retrieval_flickr]")
    results = run(params)
    md = (data / "reports" / "results.md").read_text()
    assert "| vqa | VQA test acc (`test/accuracy`) | 40 | 71.50 | 60.25 | +11.25 | [+4.50, +18.00] (400 / 130) " \
           "| gain | – | 30.00 |" in md
    assert "The mini world is a test rig" in md  # what the rig can and cannot show, once
    assert "*95% interval*" in md and "10,000 resamples" in md
    assert "each task's test split" in md and "(dev: no test labels)" not in md
    assert "| retrieval_flickr | Flickr IR R@1 (`test/ir_r1`) | 30 | 40.00 | 10.00 | +30.00 | – | – | 20.00 | 3.33 |" in md
    assert "| **Meta-Sum** | sum of the 3 scores above | | **161.50** | 86.75 | +74.75 | – | – | | 50.00 |" in md
    assert "joint masking" in md and "| MLM acc | 0.05 | 0.45 |" in md and "| ITM acc | 0.50 | 0.80 |" in md
    assert "tasks: itm 2, mlm 2." in md  # no first phase
    saved = json.loads((data / "reports" / "results.json").read_text())
    assert saved == json.loads(json.dumps(results))
    assert saved["pretraining"]["setting"]["masking"] == "joint"
    before = {p: (data / "reports" / p).read_bytes() for p in ("results.md", "results.json")}
    run(params)
    assert {p: (data / "reports" / p).read_bytes() for p in before} == before


def test_results_md_points_to_the_ablations_pipeline_and_ignores_an_ablation_run(tmp_path):
    from pipeline.report.results import run

    data = tmp_path / "data"
    write_metrics(data, VQA)
    (data / "models" / "pretrain").mkdir(parents=True)
    (data / "models" / "pretrain" / "eval.json").write_text(json.dumps(
        {**PRETRAIN_EVAL, "first_phase": {"steps": 30, "mix_ratio": {"itm": 1.0, "mlm": 0.0}}}))
    results = run(params_for(data, "finetune.tasks=[vqa]"))
    md = (data / "reports" / "results.md").read_text()
    assert "tasks: itm 2, mlm 2 (steps 1-30: itm 1)." in md
    (data / "models" / "pretrain" / "eval.json").write_text(json.dumps(
        {**PRETRAIN_EVAL, "first_phase": {"steps": 30, "mix_ratio": {"itm": 1.0}, "dropout": 0.0}}))
    run(params_for(data, "finetune.tasks=[vqa]"))
    assert "(steps 1-30: itm 1, dropout 0)." in (data / "reports" / "results.md").read_text()
    # the masking ablation is a pipeline of its own (pipeline.report.ablations), not a section of results.md
    assert "masking_ablation" not in results and "## Masking ablation" not in md
    assert "`dvc repro ablations/dvc.yaml`" in md


def test_reference_levels_sit_beside_the_rows_they_bound(tmp_path):
    from pipeline.report.results import run

    data = tmp_path / "data"
    # the reference levels of the dev split are in the record too; the row takes the test split's
    test = "testA+testB/det_accuracy"
    refcoco = {"task": "refcoco_plus", "steps": 60, "chance": {test: 24.9},
               "summary": {test: {"label": "RefCOCO+ testA+testB", "pretrained": 92.8571, "scratch": 96.4286,
                                  "gain": -3.5715, "chance": 24.9}},
               "references": {"class_oracle": {"label": "class oracle", test: 96.4286, "val/det_accuracy": 99.0,
                                               "testA+testB/gt_accuracy": 100.0}}}
    write_metrics(data, VQA, refcoco)
    results = run(params_for(data, "finetune.tasks=[vqa, refcoco_plus]"))
    assert results["references"] == [{"task": "refcoco_plus", "metric": test, "reference": "class_oracle",
                                      "label": "class oracle", "value": 96.4286, "pretrained": 92.8571,
                                      "scratch": 96.4286}]
    md = (data / "reports" / "results.md").read_text()
    assert "## Reference levels" in md
    assert f"| refcoco_plus | `{test}` | class oracle | 96.43 | 92.86 | 96.43 |" in md
    assert results["meta_sum"]["terms"] == 2  # a reference is not a scored row
    # the scratch start sits at the oracle: the reference table shows it; the row is read like any other
    assert f"| refcoco_plus | RefCOCO+ testA+testB (`{test}`) |" in md and "at ceiling" not in md.lower()
    code, out = _report(["--dir", str(data)])
    assert code == 0 and f"refcoco_plus {test}: class oracle 96.43" in " ".join(out.split())
    write_metrics(data, {**refcoco, "references": {}})
    assert run(params_for(data, "finetune.tasks=[vqa, refcoco_plus]"))["references"] == []
    assert "## Reference levels" not in (data / "reports" / "results.md").read_text()


def test_a_task_without_test_labels_reports_dev_and_the_row_says_so(tmp_path):
    """VQA on real data: no evaluation-server answers, so its summary is val; the table marks the row
    and says why, and where the test predictions are."""
    from pipeline.report.results import run

    data = tmp_path / "data"
    vqa_dev = {**VQA, "summary": {"val/accuracy": {**VQA["summary"]["test/accuracy"], "label": "VQA val acc",
                                                   "chance": 31.0}}}
    write_metrics(data, vqa_dev, RETRIEVAL)
    results = run(params_for(data, "finetune.tasks=[vqa, retrieval_flickr]"))
    assert [r["split"] for r in results["rows"]] == ["dev", "test", "test"]
    md = (data / "reports" / "results.md").read_text()
    assert "| vqa | VQA val acc (`val/accuracy`) (dev: no test labels) | 40 | 71.50 |" in md
    assert "*dev: no test labels*: vqa scored on the dev split" in md
    assert "`data/models/vqa/vqa_predictions_test.json`" in md
    code, out = _report(["--dir", str(data)])
    assert code == 0 and "VQA val acc (dev: no test labels)" in out


def test_dev_rows_of_tasks_whose_dev_images_stayed_in_pretraining_are_marked(tmp_path):
    """decontaminate.keep_dev_in_pretraining: [vqa] (UNITER's data) with no VQA test labels."""
    from pipeline.report.results import SEEN_MARK, run

    data = tmp_path / "data"
    vqa_dev = {**VQA, "summary": {"val/accuracy": {**VQA["summary"]["test/accuracy"], "label": "VQA val acc",
                                                   "chance": 31.0}}}
    write_metrics(data, vqa_dev, RETRIEVAL)
    results = run(params_for(data, "finetune.tasks=[vqa, retrieval_flickr]",
                             "decontaminate.keep_dev_in_pretraining=[vqa, nlvr2]"))
    assert results["dev_in_pretraining"] == ["vqa"]  # nlvr2 is not fine-tuned here
    md = (data / "reports" / "results.md").read_text()
    assert f"| vqa | VQA val acc (`val/accuracy`) (dev: no test labels){SEEN_MARK} | 40 |" in md
    assert "*dev images in pretraining*: vqa scored on a dev split" in md
    assert md.count(SEEN_MARK) == 1  # the retrieval rows (test) are not marked
    unmarked = run(params_for(data, "finetune.tasks=[vqa, retrieval_flickr]"))
    assert unmarked["dev_in_pretraining"] == [] and SEEN_MARK not in (data / "reports" / "results.md").read_text()


def test_missing_task_metrics_name_the_stage(tmp_path):
    from pipeline.report.results import run

    write_metrics(tmp_path / "data", VQA)
    with pytest.raises(FileNotFoundError, match=r"nlvr2\.json not found: run `python -m pipeline finetune nlvr2`"):
        run(params_for(tmp_path / "data", "finetune.tasks=[vqa, nlvr2]"))


def _report(argv: list[str]) -> tuple[int, str]:
    from pipeline.report.cli import main

    buf = io.StringIO()
    code = main(["results", *argv], console=Console(file=buf, width=200))
    return code, buf.getvalue()


def test_report_results_table(tmp_path):
    from pipeline.report.results import run

    data = tmp_path / "data"
    code, out = _report(["--dir", str(data)])
    assert code == 1 and "run `python -m pipeline results`" in out
    write_metrics(data, VQA, RETRIEVAL)
    run(params_for(data, "finetune.tasks=[vqa, retrieval_flickr]"))
    code, out = _report(["--dir", str(data)])
    assert code == 0 and "Meta-Sum" in out and "161.50" in out and "Flickr TR R@1" in out


def _exp_data(masking: str, meta_sum: float | None) -> dict:
    metrics = {"data/reports/results.json": {"error": {"type": "FileNotFoundError", "msg": "no file"}}}
    if meta_sum is not None:
        rows = [{"task": "vqa", "metric": "val/accuracy", "label": "VQA val acc", "pretrained": meta_sum - 1.0}]
        metrics = {"data/reports/results.json": {"data": {"rows": rows, "meta_sum": {"pretrained": meta_sum}}},
                   "data/metrics/vqa.json": {"data": {"summary": {}}}}
    return {"rev": "x", "timestamp": None, "params": {"params.yaml": {"data": {
        "pretrain": {"masking": masking, "steps": 100}, "finetune": {"tasks": ["vqa"]}}}}, "metrics": metrics,
        "deps": {}, "outs": {}, "meta": {}}


# the shape of `dvc exp show --json` (DVC 3.67): workspace, then the commit with its experiments
EXP_SHOW = [
    {"rev": "workspace", "name": None, "data": _exp_data("joint", 396.5), "error": None, "experiments": None},
    {"rev": "54f68613984d1a93bb8218e8b1cdf10b9c2710a3", "name": "master", "data": _exp_data("conditional", None),
     "error": None, "experiments": [
         {"revs": [{"rev": "70e5416c", "name": "joint-masking", "data": _exp_data("joint", 396.5), "error": None,
                    "experiments": None}], "executor": None, "name": "joint-masking"},
         {"revs": [{"rev": "1b2d5420", "name": "conditional", "data": _exp_data("conditional", 399.97),
                    "error": None, "experiments": None}], "executor": None, "name": "conditional"}]},
]


def test_experiments_side_by_side(tmp_path, monkeypatch):
    from pipeline.report.results_cli import experiments, side_by_side

    monkeypatch.setenv("UNITER_RUNS_DIR", str(tmp_path / "no_runs"))  # no Airflow run columns here

    exps = experiments(EXP_SHOW)
    assert [e["name"] for e in exps] == ["workspace", "master", "joint-masking", "conditional"]
    names, rows = side_by_side(exps)
    assert rows == [("param pretrain.masking", ["joint", "conditional", "joint", "conditional"]),
                    ("VQA val acc", ["395.50", "–", "395.50", "398.97"]),
                    ("Meta-Sum", ["396.50", "–", "396.50", "399.97"])]

    show = tmp_path / "show.json"
    show.write_text(json.dumps(EXP_SHOW))
    md = tmp_path / "exps.md"
    code, out = _report(["--exps", "--from", str(show), "--md", str(md)])
    assert code == 0 and "joint-masking" in out and "399.97" in out
    assert md.read_text().splitlines()[0] == "| | workspace | master | joint-masking | conditional |"
    show.write_text(json.dumps([{**EXP_SHOW[1], "experiments": None, "data": _exp_data("joint", None)}]))
    code, out = _report(["--exps", "--from", str(show)])
    assert code == 1 and "no experiment has" in out


@pytest.mark.slow
def test_real_dvc_exp_show_is_parsed(tmp_path):
    """Two `dvc exp run`s in a scratch repository whose stage writes data/reports/results.json,
    declared and git-ignored as in this project (data/ ignored, the metrics file DVC-cached)."""
    repo = tmp_path / "repo"
    (repo / "data" / "reports").mkdir(parents=True)
    (repo / ".gitignore").write_text("/data/*\n")
    (repo / "params.yaml").write_text("pretrain:\n  masking: conditional\n")
    (repo / "make.py").write_text(
        "import json, yaml\n"
        "m = yaml.safe_load(open('params.yaml'))['pretrain']['masking']\n"
        "s = 399.97 if m == 'conditional' else 396.51\n"
        "row = {'task': 'vqa', 'metric': 'test/accuracy', 'label': 'VQA test acc', 'pretrained': s / 5}\n"
        "json.dump({'rows': [row], 'meta_sum': {'pretrained': s}}, open('data/reports/results.json', 'w'))\n")
    (repo / "dvc.yaml").write_text(
        "stages:\n  results:\n    cmd: python make.py\n    deps: [make.py]\n    params: [pretrain.masking]\n"
        "    metrics:\n      - data/reports/results.json\n")
    env = {**os.environ, "DVC_NO_ANALYTICS": "1", "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    dvc = str(Path(sys.executable).with_name("dvc"))
    for cmd in (["git", "init", "-q"], [dvc, "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "init"],
                [dvc, "exp", "run", "-q", "-n", "conditional"],
                [dvc, "exp", "run", "-q", "-n", "joint", "-S", "pretrain.masking=joint"]):
        subprocess.run(cmd, cwd=repo, env=env, check=True, capture_output=True)
    cwd = os.getcwd()
    os.chdir(repo)
    try:
        from pipeline.report.results_cli import dvc_exp_show, experiments, side_by_side

        exps = experiments(dvc_exp_show())
    finally:
        os.chdir(cwd)
    by_name = {e["name"]: e for e in exps}
    assert {"workspace", "conditional", "joint"} <= set(by_name)
    assert by_name["joint"]["results"]["meta_sum"]["pretrained"] == 396.51
    names, rows = side_by_side([by_name["conditional"], by_name["joint"]])
    assert rows[0] == ("param pretrain.masking", ["conditional", "joint"]) and rows[-1][1] == ["399.97", "396.51"]
    # the task rows too: DVC's metrics drop results.json's list of rows, so they are read from each revision
    assert ("VQA test acc", ["79.99", "79.30"]) in rows, rows


def test_airflow_runs_sit_beside_the_experiments(tmp_path, monkeypatch):
    """`report results --exps` lists runs/<run_name>/ too (params + data/reports/results.json), and
    params that only locate a run's files never count as a difference."""
    import yaml

    from pipeline.report.results_cli import airflow_runs, experiments, side_by_side

    runs = tmp_path / "runs"
    for name, masking, meta_sum in (("abl-joint", "joint", 390.25), ("pending", "conditional", None)):
        raw = {"paths": {"data": f"runs/{name}/data"}, "pretrain": {"masking": masking, "steps": 100},
               "finetune": {"tasks": ["vqa"]}, "mini_world": {"out_dir": f"runs/{name}/data/raw/mini"}}
        (runs / name / "data" / "reports").mkdir(parents=True)
        (runs / name / "params.yaml").write_text(yaml.safe_dump(raw))
        if meta_sum is not None:
            rows = [{"task": "vqa", "metric": "val/accuracy", "label": "VQA val acc", "pretrained": meta_sum - 1.0}]
            (runs / name / "data" / "reports" / "results.json").write_text(
                json.dumps({"rows": rows, "meta_sum": {"pretrained": meta_sum}}))
    found = airflow_runs(runs)
    assert [e["name"] for e in found] == ["run:abl-joint", "run:pending"] and found[1]["results"] is None
    names, rows = side_by_side(experiments(EXP_SHOW[:1]) + found)
    assert names == ["workspace", "run:abl-joint", "run:pending"]
    assert rows == [("param pretrain.masking", ["joint", "joint", "conditional"]),
                    ("VQA val acc", ["395.50", "389.25", "–"]), ("Meta-Sum", ["396.50", "390.25", "–"])]
    show = tmp_path / "show.json"
    show.write_text(json.dumps(EXP_SHOW[:1]))
    monkeypatch.setenv("UNITER_RUNS_DIR", str(runs))
    code, out = _report(["--exps", "--from", str(show)])
    assert code == 0 and "run:abl-joint" in out and "390.25" in out


def _detector_metrics(shape_acc: float) -> dict:
    """train_detector's metrics.json layout, with its targets."""
    return {"quality": {"images": 40, "objects": 109, "recall": 1.0, "shape_acc": shape_acc, "class_acc": shape_acc,
                        "regions_per_image": 10.0},
            "targets": {"recall": 0.9, "shape_acc": 0.8}, "targets_met": shape_acc >= 0.8,
            "training": {"iterations": 900}}


@pytest.mark.parametrize(("shape_acc", "verdict"), [(0.706, "**below target**"), (0.973, "met")])
def test_the_detectors_quality_and_its_targets_are_reported(tmp_path, shape_acc, verdict):
    from pipeline.report.results import run

    data = tmp_path / "data"
    write_metrics(data, VQA)
    (data / "models" / "detector").mkdir(parents=True)
    (data / "models" / "detector" / "metrics.json").write_text(json.dumps(_detector_metrics(shape_acc)))
    results = run(params_for(data, "finetune.tasks=[vqa]"))
    md = (data / "reports" / "results.md").read_text()
    assert results["detector"]["shape_acc"] == shape_acc and results["detector"]["targets_met"] == (verdict == "met")
    line = next(x for x in md.splitlines() if x.startswith("The detector trained by `train_detector`"))
    assert f"shape accuracy {shape_acc:.3f}" in line and "40 held-out images (109 objects)" in line
    assert f"(targets 0.9 and 0.8: {verdict}" in line
    assert ("every score above" in line) == (verdict != "met")


def test_a_detector_that_was_not_trained_here_gets_no_section(tmp_path):
    from pipeline.report.results import run

    data = tmp_path / "data"
    write_metrics(data, VQA)
    results = run(params_for(data, "finetune.tasks=[vqa]"))
    assert results["detector"] is None
    assert "## Region features" not in (data / "reports" / "results.md").read_text()
