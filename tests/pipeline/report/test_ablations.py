"""Stage ``ablations`` (``ablations/dvc.yaml``): the masking table from both first-stage reports."""

from __future__ import annotations

import json

import pytest

from helpers.dbs_synthetic import params_for

pytestmark = pytest.mark.stage  # runs a pipeline stage or trains a model (not in `make test-unit`)

HELD_OUT = {"mlm": {"batches": 4, "examples": 100}, "itm": {"batches": 4, "examples": 200, "matched": 100}}
BASE = {"steps": 100, "wra": True, "datasets": "indomain", "mix_ratio": {"itm": 2.0, "mlm": 2.0}, "held_out": HELD_OUT}
CONDITIONAL = {**BASE, "masking": "conditional",
               "pretrained": {"mlm": {"mlm_acc": 0.312}, "mrc_kl": {"mrc_acc": 0.043}, "itm": {"itm_acc": 0.611}}}
JOINT = {**BASE, "masking": "joint",
         "pretrained": {"mlm": {"mlm_acc": 0.262}, "mrc_kl": {"mrc_acc": 0.051}, "itm": {"itm_acc": 0.531}}}


def _write(data, name, report):
    (data / "models" / name).mkdir(parents=True, exist_ok=True)
    (data / "models" / name / "eval.json").write_text(json.dumps(report))


def test_masking_table_from_both_first_stage_reports(tmp_path):
    from pipeline.report.ablations import run

    data = tmp_path / "data"
    params = params_for(data)
    _write(data, "pretrain", CONDITIONAL)
    _write(data, "pretrain_masking_ablation", JOINT)
    results = run(params)
    md = (data / "reports" / "ablations.md").read_text()
    assert "## Masking" in md and "| held-out metric | conditional | joint |" in md
    assert "| MLM acc | 0.31 | 0.26 | -0.05 | – | – (no interval" in md and "| MRC-kl acc | 0.04 | 0.05 |" in md
    # ITM over 200 held-out pairs: -0.08, se sqrt(.611*.389/200 + .531*.469/200) = 0.0493
    assert "| ITM acc | 0.61 | 0.53 | -0.08 | [-0.1767, +0.0167] (200 pairs) | unresolved: interval holds 0 |" in md
    assert results["masking"]["differences"]["ITM acc"] == {"diff": -0.08, "low": -0.1767, "high": 0.0167,
                                                             "units": 200}
    assert results["masking"]["metrics"]["MLM acc"] == {"conditional": 0.312, "joint": 0.262}
    assert json.loads((data / "reports" / "ablations.json").read_text()) == results
    # the twin's masking may be either: the columns are sorted by name
    _write(data, "pretrain", JOINT)
    _write(data, "pretrain_masking_ablation", CONDITIONAL)
    assert run(params)["masking"]["maskings"] == ["conditional", "joint"]


def test_runs_that_are_no_ablation_are_refused(tmp_path):
    from pipeline.report.ablations import run

    data = tmp_path / "data"
    params = params_for(data)
    _write(data, "pretrain", CONDITIONAL)
    with pytest.raises(FileNotFoundError, match="pretrain_masking"):
        run(params)
    # only a comparison when both runs saw the same held-out batches and steps
    _write(data, "pretrain_masking_ablation", {**JOINT, "held_out": {"mlm": {"batches": 4, "examples": 99}}})
    with pytest.raises(ValueError, match="held-out batches or steps differ"):
        run(params)
    _write(data, "pretrain_masking_ablation", {**JOINT, "steps": 99})
    with pytest.raises(ValueError, match="held-out batches or steps differ"):
        run(params)
    _write(data, "pretrain_masking_ablation", CONDITIONAL)
    with pytest.raises(ValueError, match="both trained with conditional masking"):
        run(params)
