"""pipeline.report.plots on series written by dvclive itself: values read back exactly, one HTML page
whose figures put train and val, and a task's two starts, on one axis per metric; byte-identical
re-renders, clear errors on bad files."""

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


def _figures(page: str) -> dict[str, str]:
    """{figure id: its SVG text} of the page's embedded figures."""
    import base64
    import re

    return {fid: base64.b64decode(data).decode()
            for fid, data in re.findall(r'<figure id="([^"]+)"><img alt="[^"]*" src="data:image/svg\+xml;base64,([^"]+)"',
                                        page)}


def test_one_html_page_indexes_every_training_with_both_starts_on_one_axis(tmp_path):
    write_dvclive(tmp_path / "metrics/pretrain", steps=5)
    write_dvclive(tmp_path / "metrics/pretrain_vcr", steps=3)
    write_dvclive(tmp_path / "metrics/vqa/pretrained", steps=4)  # fine-tuning: <task>/<start>
    write_dvclive(tmp_path / "metrics/vqa/scratch", steps=4)
    (tmp_path / "metrics/vqa.json").write_text("{}")  # task metrics files are not dvclive runs
    out = tmp_path / "reports/plots"
    result = render_all(tmp_path / "metrics", out)
    assert list(result) == ["pretrain", "pretrain_vcr", "vqa"]  # pretraining first; a task's starts are one training
    assert result["vqa"] == ["loss", "mlm/acc"]
    assert [p.name for p in out.iterdir() if not p.name.startswith(".")] == ["index.html"]  # no loose images
    page = (out / "index.html").read_text()
    assert '<a href="#vqa">vqa</a> (2 figures' in page and '<a href="#pretrain-loss">loss</a>' in page
    figures = _figures(page)
    assert set(figures) == {"pretrain-loss", "pretrain-mlm-acc", "pretrain_vcr-loss", "pretrain_vcr-mlm-acc",
                            "vqa-loss", "vqa-mlm-acc"}
    vqa = ET.fromstring(figures["vqa-loss"])
    assert vqa.tag.endswith("svg")
    text = figures["vqa-loss"]
    # both starts overlaid, train and val each; the title says so; both axes are labelled
    for label in ("pretrained train", "pretrained val (held out)", "scratch train", "scratch val (held out)",
                  "vqa: loss (pretrained vs scratch)", "optimizer step"):
        assert label in text, label
    assert ">loss<" in text and "accuracy" in figures["vqa-mlm-acc"]
    assert "pretrain: loss" in figures["pretrain-loss"] and "pretrained" not in figures["pretrain-loss"]

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
    assert "No dvclive metrics" in (tmp_path / "plots/index.html").read_text()


def test_the_page_is_the_same_bytes_wherever_the_run_lies(tmp_path):
    """Two runs of one graph in different data roots (Airflow's local and Celery runs) give the
    same page: nothing of the run's absolute location is written into it."""
    import shutil

    write_dvclive(tmp_path / "a/metrics/vqa/pretrained", steps=3)
    shutil.copytree(tmp_path / "a", tmp_path / "elsewhere/b")
    from dvclive import Live

    for root, rate in (("a", 1000.0), ("elsewhere/b", 1250.0)):  # a rerun measures another throughput
        live = Live(str(tmp_path / root / "metrics/pretrain"), dvcyaml=None, save_dvc_exp=False, report=None)
        for step in range(3):
            live.step = step
            live.log_metric("train/loss", 1.0 / (step + 1))
            live.log_metric("train/tokens_per_s", rate + step)
        live.end()
    render_all(tmp_path / "a/metrics", tmp_path / "a/reports/plots")
    render_all(tmp_path / "elsewhere/b/metrics", tmp_path / "elsewhere/b/reports/plots")
    page_a = (tmp_path / "a/reports/plots/index.html").read_bytes()
    assert page_a == (tmp_path / "elsewhere/b/reports/plots/index.html").read_bytes()
    assert str(tmp_path).encode() not in page_a
    assert b"tokens_per_s.html" in page_a and b"tokens_per_s\"" not in page_a  # throughput: its own page
    assert (tmp_path / "a/reports/plots/tokens_per_s.html").read_bytes() != \
        (tmp_path / "elsewhere/b/reports/plots/tokens_per_s.html").read_bytes()
