"""``python -m pipeline seeds``: the spread over seeds (unit), and the real finetune stage run per seed in
side data roots that leave the run's own outputs alone (stage, on the small fine-tuning world)."""

from __future__ import annotations

import json
import statistics

import pytest

from helpers.finetune_world import ROOT, budget, ft_params, world

from pipeline.finetune.seed_sweep import link_inputs, main, spread_markdown, spread_rows, sweep, write_spread


def record(pre: float, scratch: float, low: float, high: float) -> dict:
    entry = {"label": "VCR test Q→AR", "pretrained": pre, "scratch": scratch, "gain": round(pre - scratch, 4),
             "gain_interval": {"gain": round(pre - scratch, 2), "low": low, "high": high}}
    return {"summary": {"test/q2ar": entry}}


def test_spread_rows_give_each_seed_and_the_spread_of_every_column():
    records = {1234: record(19.44, 26.90, -8.98, -5.95), 1: record(19.27, 9.36, 8.41, 11.38),
               2: record(28.50, 18.82, 8.02, 11.34)}
    [row] = spread_rows(records)
    assert row["metric"] == "test/q2ar" and row["label"] == "VCR test Q→AR"
    assert list(row["per_seed"]) == [1234, 1, 2]
    assert row["per_seed"][1] == {"pretrained": 19.27, "scratch": 9.36, "gain": 9.91, "low": 8.41, "high": 11.38}
    gains = [-7.46, 9.91, 9.68]
    assert row["gain"]["mean"] == pytest.approx(statistics.fmean(gains), abs=1e-4)
    assert row["gain"]["sd"] == pytest.approx(statistics.stdev(gains), abs=1e-4)
    assert (row["gain"]["min"], row["gain"]["max"]) == (-7.46, 9.91)
    assert row["scratch"]["max"] == 26.90 and row["pretrained"]["n"] == 3
    md = spread_markdown("vcr", [row])
    assert "| 1234 | 19.44 | 26.90 | -7.46 | [-8.98, -5.95] |" in md
    assert f"gain {statistics.fmean(gains):.2f} ± {statistics.stdev(gains):.2f} (-7.46..9.91)" in md


def test_link_inputs_links_the_stores_and_refuses_to_shadow_a_real_directory(tmp_path):
    data = tmp_path / "data"
    for rel in ("db/txt", "manifests", "models/pretrain_vcr"):
        (data / rel).mkdir(parents=True)
    root = tmp_path / "seeds" / "seed1"
    link_inputs(data, root, "pretrain_vcr")
    link_inputs(data, root, "pretrain_vcr")  # a second sweep reuses the links
    assert (root / "db").resolve() == (data / "db").resolve() and (root / "db" / "txt").is_dir()
    assert (root / "models" / "pretrain_vcr").is_symlink() and (root / "manifests").is_symlink()
    other = tmp_path / "seeds" / "seed2"
    (other / "db").mkdir(parents=True)
    with pytest.raises(FileExistsError, match="seed2/db: exists and is not a link"):
        link_inputs(data, other, "pretrain_vcr")
    with pytest.raises(FileNotFoundError, match="models/pretrain: missing"):
        link_inputs(data, tmp_path / "seeds" / "seed3", "pretrain")


def test_a_seed_root_another_sweep_is_writing_is_not_written(tmp_path, capsys, monkeypatch):
    """The stage's own lock on the side root: with UNITER_LOCK_WAIT=0 the second sweep exits 3
    before the stage starts, and the holder is named."""
    from pipeline.common.locking import BUSY_EXIT, stage_lock

    monkeypatch.chdir(ROOT)
    data = tmp_path / "data"
    for rel in ("db", "manifests", "models/pretrain_vcr"):
        (data / rel).mkdir(parents=True)
    out = tmp_path / "sweep"
    (out / "seed1").mkdir(parents=True)
    monkeypatch.setenv("UNITER_LOCK_WAIT", "0")
    with stage_lock(out / "seed1", "finetune", shared=True), stage_lock(out / "seed1", "finetune@vcr"):
        status = main(["vcr", "--seeds", "1", "2", "--out", str(out), "--set", f"paths.data={data}"])
    assert status == BUSY_EXIT
    err = capsys.readouterr().err
    assert "finetune@vcr is being written by another run" in err
    assert not (out / "seed1" / "models" / "vcr").exists() and not (out / "seed2").exists()


@pytest.mark.parametrize("argv, message", [
    (["nope", "--seeds", "1", "2"], "unknown task 'nope'"),
    (["vcr", "--seeds", "1", "1"], "at least 2 distinct seeds"),
    (["vcr", "--seeds", "1", "2", "--set", "finetune.compare_scratch=false"], "no non-pretrained start"),
    (["vcr", "--seeds", "1", "2", "--set", "finetune.no_such_key=1"], "no_such_key"),
])
def test_bad_arguments_exit_2_and_say_why(argv, message, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.stage
@pytest.mark.parametrize("task, start", [("vcr", "pretrain_vcr"), ("vqa", "pretrain")])
def test_each_seed_runs_the_real_stage_beside_the_run_and_repeats_it(tmp_path_factory, task, start):
    """Two seeds in side roots (VCR: the second-stage start; VQA: also reads the manifests' human
    answers); the run's own data root gets no fine-tuning output, and a seed's record is the one
    the stage writes for that seed in place."""
    from pipeline.finetune.finetune import run as finetune

    data = world(tmp_path_factory)
    # the starts one after the other in this process: no child process start-up per run (the
    # parallel starts give the same result: test_finetune.py)
    overrides = (budget(task, steps=2), "finetune.compare_scratch=true", "finetune.parallel_starts=false")
    out = data / "seeds" / task
    load = lambda extra: ft_params(data, *overrides, *extra)  # noqa: E731
    records = sweep(load, load([]), task, [1, 2], out)
    assert set(records) == {1, 2}
    assert not (data / "models" / task).exists() and not (data / "metrics").exists()
    for seed in (1, 2):
        written = json.loads((out / f"seed{seed}" / "metrics" / f"{task}.json").read_text())
        assert written == records[seed]
        assert all({"pretrained", "scratch", "gain"} <= set(e) for e in written["summary"].values())
        assert (out / f"seed{seed}" / "models" / start).is_symlink()
    rows = write_spread(task, records, out)
    saved = json.loads((out / "spread.json").read_text())
    assert saved["seeds"] == [1, 2] and saved["rows"] == json.loads(json.dumps(rows))
    assert "| 2 |" in (out / "spread.md").read_text()
    # the same seed in the run's own root: the same record (the side root changes nothing it reads)
    direct = finetune(ft_params(data, *overrides, "finetune.seed=2"), task)[task]
    assert direct == records[2]
