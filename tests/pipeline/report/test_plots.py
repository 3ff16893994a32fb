"""pipeline.report.plots on series written by dvclive itself: values read back exactly, one SVG+PNG per
metric with train and val together, byte-identical re-renders, clear errors on bad files."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pipeline.report.plots import collect, read_series, render_all


def write_dvclive(directory: Path, steps: int) -> dict[str, list[float]]:
    """A dvclive run like pretraining's: train/{loss, mlm/acc} every step, val/loss every 2."""
    from dvclive import Live

    expected: dict[str, list[float]] = {"train/loss": [], "train/mlm/acc": [], "val/loss": []}
    live = Live(str(directory), dvcyaml=None, save_dvc_exp=False, report=None)
    for step in range(steps):
        live.step = step
        values = {"train/loss": 2.0 / (step + 1), "train/mlm/acc": step / steps}
        if step % 2 == 0:
            values["val/loss"] = 2.5 / (step + 1)
        for name, value in values.items():
            live.log_metric(name, value)
            expected[name].append(value)
    live.end()
    return expected


def test_series_are_read_back_as_dvclive_wrote_them(tmp_path):
    expected = write_dvclive(tmp_path / "metrics/pretrain", steps=6)
    series = collect(tmp_path / "metrics/pretrain")
    assert set(series) == {"loss", "mlm/acc"}
    assert set(series["loss"]) == {"train", "val"} and set(series["mlm/acc"]) == {"train"}
    assert series["loss"]["train"] == ([0, 1, 2, 3, 4, 5], pytest.approx(expected["train/loss"]))
    assert series["loss"]["val"] == ([0, 2, 4], pytest.approx(expected["val/loss"]))
    assert series["mlm/acc"]["train"][1] == pytest.approx(expected["train/mlm/acc"])


def test_every_metric_of_every_run_becomes_an_svg_and_png_deterministically(tmp_path):
    write_dvclive(tmp_path / "metrics/pretrain", steps=5)
    write_dvclive(tmp_path / "metrics/pretrain_vcr", steps=3)
    write_dvclive(tmp_path / "metrics/vqa/scratch", steps=2)  # fine-tuning: <task>/<start>
    (tmp_path / "metrics/vqa.json").write_text("{}")  # task metrics files are not dvclive runs
    out = tmp_path / "reports/plots"
    result = render_all(tmp_path / "metrics", out)
    assert sorted(result) == ["pretrain", "pretrain_vcr", "vqa/scratch"]
    assert (out / "vqa/scratch/mlm_acc.svg").is_file()
    names = sorted(p.name for p in (out / "pretrain").iterdir())
    assert names == ["loss.png", "loss.svg", "mlm_acc.png", "mlm_acc.svg"]
    svg = ET.parse(out / "pretrain/loss.svg").getroot()
    assert svg.tag.endswith("svg")
    assert (out / "pretrain/loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    index = (out / "index.md").read_text()
    assert "pretrain/loss.svg" in index and "pretrain_vcr/mlm_acc.svg" in index

    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    render_all(tmp_path / "metrics", out)
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert before == after


def test_a_broken_series_is_an_error_naming_the_file(tmp_path):
    bad = tmp_path / "x.tsv"
    bad.write_text("step\tloss\n0\t1.0\n1\tnan-ish\n")
    with pytest.raises(ValueError, match=r"x\.tsv:3"):
        read_series(bad)
    (tmp_path / "y.tsv").write_text("epoch\tloss\n0\t1\n")
    with pytest.raises(ValueError, match="step"):
        read_series(tmp_path / "y.tsv")


def test_no_metrics_still_writes_an_index(tmp_path):
    assert render_all(tmp_path / "missing", tmp_path / "plots") == {}
    assert "No dvclive metrics" in (tmp_path / "plots/index.md").read_text()
