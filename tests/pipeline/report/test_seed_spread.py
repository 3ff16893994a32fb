"""`report spread`: fine-tuning scores over seeds, from a `dvc exp show --json` in DVC's own layout."""

from __future__ import annotations

import json
import statistics

import pytest
from rich.console import Console

from pipeline.report.cli import main
from pipeline.report.results_cli import ResultsError, experiments
from pipeline.report.seed_spread import check_only_seed_differs, spread_rows

SCORES = {"ft-seed1": (70.0, 60.0), "ft-seed2": (74.0, 61.0), "ft-seed3": (69.0, 63.5)}


def _rev(name: str, pretrained: float, scratch: float, **params) -> dict:
    rows = [{"task": "vqa", "metric": "test/accuracy", "label": "VQA test acc", "pretrained": pretrained,
             "scratch": scratch, "gain": round(pretrained - scratch, 4)},
            {"task": "nlvr2", "metric": "test/accuracy", "label": "NLVR2 test acc", "pretrained": 55.0,
             "scratch": None, "gain": None}]
    return {"rev": f"{name}-sha", "name": name, "data": {
        "params": {"params.yaml": {"data": {"seed": 1234, "finetune": {"seed": params.get("seed"),
                                                                        "grad_clip": params.get("clip", 2.0)}}}},
        "metrics": {"data/reports/results.json": {"data": {"rows": rows}}}}}


def _show(**extra) -> list[dict]:
    revs = [_rev(name, *scores, seed=int(name[-1]), **extra.get(name, {})) for name, scores in SCORES.items()]
    return [{"rev": "workspace", "data": {}},
            {"rev": "abc1234", "experiments": [{"name": r["name"], "revs": [r]} for r in revs]}]


def test_spread_rows_match_an_independent_computation():
    rows = {(r["task"], r["metric"]): r for r in spread_rows(experiments(_show())[2:])}
    vqa = rows[("vqa", "test/accuracy")]
    gains = [p - s for p, s in SCORES.values()]
    assert vqa["gain"]["n"] == 3 and vqa["gain"]["mean"] == pytest.approx(statistics.mean(gains), abs=1e-4)
    assert vqa["gain"]["sd"] == pytest.approx(statistics.stdev(gains), abs=1e-4)
    assert (vqa["pretrained"]["min"], vqa["pretrained"]["max"]) == (69.0, 74.0)
    nlvr2 = rows[("nlvr2", "test/accuracy")]
    assert nlvr2["pretrained"]["sd"] == 0.0 and "scratch" not in nlvr2  # no non-pretrained start there


def test_experiments_that_differ_beyond_the_seed_are_refused():
    exps = experiments(_show(**{"ft-seed2": {"clip": 5.0}}))[2:]
    with pytest.raises(ResultsError, match=r"differ in \['finetune.grad_clip'\], not only in finetune.seed"):
        check_only_seed_differs(exps)
    check_only_seed_differs(experiments(_show())[2:])  # the seed alone may differ


def test_cli_picks_the_seed_experiments_and_writes_markdown(tmp_path):
    show = tmp_path / "show.json"
    show.write_text(json.dumps(_show()))
    md = tmp_path / "spread.md"
    console = Console(record=True, width=200)
    assert main(["spread", "--from", str(show), "--md", str(md)], console=console) == 0
    text = md.read_text()
    assert "Over 3 fine-tuning seeds (ft-seed1, ft-seed2, ft-seed3)" in text
    mean = statistics.mean(p for p, _ in SCORES.values())
    assert f"| vqa | VQA test acc | {mean:.1f} ± {statistics.stdev(p for p, _ in SCORES.values()):.1f} (69.0..74.0)" in text
    assert main(["spread", "--from", str(show), "--exps", "ft-seed1", "nope"], console=console) == 1
    assert "no experiment with results named ['nope']" in console.export_text()
