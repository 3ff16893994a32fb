"""``python -m pipeline budgets``: the one-standard-error rule (unit), and points trained in side
data roots that score dev only and agree with the real stage's dev scores (stage, small world)."""

from __future__ import annotations

import json
import math

import pytest

from helpers.finetune_world import ROOT, budget, ft_params, world

from pipeline.finetune.budget_sweep import Point, choose, default_out, dev_point, main, point_overrides, run_point, \
    sweep, warmup_of, write_budgets


def items(hits: int, n: int) -> dict:
    return {"ids": [str(i) for i in range(n)], "groups": [str(i) for i in range(n)],
            "scores": [1.0] * hits + [0.0] * (n - hits)}


def point(steps: int, score: float, n: int) -> Point:
    p = score / 100
    return Point(steps=steps, score=score, se=100 * math.sqrt(p * (1 - p) / n), metrics={}, items={}, source="sweep")


def test_dev_point_is_the_binomial_se_of_each_metric_and_their_mean():
    one = dev_point(150, "val", ["q2ar"], {"val/q2ar": items(30, 120), "test/q2ar": items(1, 2)}, "sweep")
    assert one.score == 25.0 and one.se == pytest.approx(100 * math.sqrt(0.25 * 0.75 / 120), abs=1e-4)
    assert one.items == {"q2ar": 120}
    # retrieval: the mean of IR and TR R@1, SE 1/2 sqrt(SE_IR^2 + SE_TR^2), each on its own n
    two = dev_point(30, "val", ["ir_r1", "tr_r1"], {"val/ir_r1": items(22, 60), "val/tr_r1": items(14, 30)}, "run")
    ir, tr = 22 / 60, 14 / 30
    assert two.score == pytest.approx(50 * (ir + tr), abs=1e-4)
    assert two.se == pytest.approx(50 * math.sqrt(ir * (1 - ir) / 60 + tr * (1 - tr) / 30), abs=1e-4)
    assert two.metrics == {"ir_r1": round(100 * ir, 4), "tr_r1": round(100 * tr, 4)} and two.source == "run"
    with pytest.raises(ValueError, match="val/q2ar: no dev items"):
        dev_point(1, "val", ["q2ar"], {"val/q2ar": items(0, 0)}, "sweep")


@pytest.mark.parametrize("scores, n, chosen", [
    # an earlier sweep's dev scores (docs/decisions.md#finetune-budgets): the rule's choices from its table
    ({75: 67.40, 150: 71.78, 300: 71.99}, 366, 150),   # VQA: 75 falls under the bar 69.64
    ({150: 25.44, 300: 28.07, 600: 30.70}, 114, 300),  # VCR Q→AR: the bar 26.38
    ({75: 62.22, 150: 62.22, 300: 66.67}, 180, 300),   # NLVR2
    ({30: 68.89, 60: 76.67, 120: 80.37}, 270, 120),    # SNLI-VE
    ({60: 80.65, 120: 78.49, 240: 77.42}, 93, 60),     # RefCOCO+: the cheapest is the best
])
def test_choose_takes_the_cheapest_point_within_one_se_of_the_best(scores, n, chosen):
    assert choose([point(s, v, n) for s, v in scores.items()]) == chosen


def test_choose_breaks_a_tie_of_the_best_toward_the_cheaper_point():
    tied = [Point(300, 70.0, 0.5, {}, {}, "sweep"), Point(150, 70.0, 3.0, {}, {}, "sweep"),
            Point(75, 67.5, 1.0, {}, {}, "sweep")]
    assert choose(tied) == 75  # the best is the 150-step point, whose SE sets the bar at 67.0
    with pytest.raises(ValueError, match="no budget points"):
        choose([])


@pytest.mark.parametrize("name", ["vqa", "vcr", "nlvr2", "snli_ve", "retrieval_flickr", "refcoco_plus"])
def test_a_dev_only_task_knows_no_test_split(name, tmp_path):
    """What every task's evaluation iterates (``splits.scored``) and the DBs it opens hold dev only; the
    results' split is dev. The same task opened normally scores test too."""
    from pipeline.finetune.tasks import task_class
    from pipeline.finetune.tasks.base import TaskContext
    from pipeline.params.finetune import TASK_SPLITS

    params = ft_params(tmp_path)
    cfg = params.finetune

    def task(dev_only: bool):
        return task_class(name)(TaskContext(name=name, data=tmp_path, cfg=cfg, task_cfg=cfg.per_task[name],
                                            seed=params.seed, dev_only=dev_only))

    dev, test = TASK_SPLITS[name].dev, TASK_SPLITS[name].test
    only = task(True)
    assert only.splits.scored == dev and not only.test_labelled() and only.reported_split == only.dev_split
    assert not any(db.endswith(tuple(f"_{s}" for s in test)) for db in only.text_dbs())
    assert task(False).splits.scored == (*dev, *test)
    assert any(db.endswith(tuple(f"_{s}" for s in test)) for db in task(False).text_dbs())


def test_write_budgets_records_every_point_and_the_choice(tmp_path):
    points = [point(60, 80.65, 93), point(120, 78.49, 93)]
    assert write_budgets("refcoco_plus", points, tmp_path, current=60) == 60
    saved = json.loads((tmp_path / "budgets.json").read_text())
    assert saved["chosen"] == 60 and saved["dev_split"] == "val" and [p["steps"] for p in saved["points"]] == [60, 120]
    assert "| 60 (chosen) | 80.65 |" in (tmp_path / "budgets.md").read_text()
    assert warmup_of(75) == 7 and warmup_of(600) == 60


def test_a_point_root_another_sweep_is_writing_is_not_written(tmp_path, capsys, monkeypatch):
    """The stage's locks on each point's root, taken before any point trains: with UNITER_LOCK_WAIT=0
    the second sweep exits 3 and names the holder."""
    from pipeline.common.locking import BUSY_EXIT, stage_lock

    monkeypatch.chdir(ROOT)
    data = tmp_path / "data"
    for rel in ("db", "manifests", "models/pretrain_vcr"):
        (data / rel).mkdir(parents=True)
    out = tmp_path / "sweep"
    (out / "steps2").mkdir(parents=True)
    monkeypatch.setenv("UNITER_LOCK_WAIT", "0")
    with stage_lock(out / "steps2", "finetune", shared=True), stage_lock(out / "steps2", "finetune@vcr"):
        status = main(["vcr", "--steps", "1", "2", "--no-reuse-run", "--out", str(out), "--set", f"paths.data={data}"])
    assert status == BUSY_EXIT
    assert "finetune@vcr is being written by another run" in capsys.readouterr().err
    assert not (out / "steps1" / "checkpoints").exists() and not (out / "budgets.json").exists()


def test_the_scratch_start_has_its_own_budget_key_and_sweep_root(tmp_path):
    """``--start scratch``: a point sets finetune.scratch_per_task (the scratch start's lr and batch
    kept), the pretrained budget stays, and the sweep writes beside the pretrained one's."""
    base = ft_params(tmp_path, "finetune.per_task.vcr={steps: 300, lr: 0.0001, batch_tokens: 1024, warmup_steps: 30}",
                     "finetune.scratch_per_task={}")
    assert base.finetune.budget("vcr", "scratch") == base.finetune.budget("vcr", "pretrained")  # none of its own
    extra = point_overrides("vcr", 600, tmp_path / "steps600", "scratch", base=base)
    swept = ft_params(tmp_path, *extra)
    own = swept.finetune.budget("vcr", "scratch")
    assert (own.steps, own.warmup_steps, own.lr, own.batch_tokens) == (600, 60, 0.0001, 1024)
    assert swept.finetune.budget("vcr", "pretrained").steps == 300 and not swept.finetune.compare_scratch
    assert swept.paths.data == tmp_path / "steps600"
    assert default_out(tmp_path, "vcr", "scratch") == tmp_path / "budgets" / "vcr_scratch"
    assert default_out(tmp_path, "vcr") == tmp_path / "budgets" / "vcr"
    write_budgets("vcr", [point(150, 50.0, 100), point(300, 60.0, 100)], tmp_path, current=300, start="scratch")
    saved = json.loads((tmp_path / "budgets.json").read_text())
    assert saved["start"] == "scratch" and saved["chosen"] == 300
    assert "`finetune.scratch_per_task.vcr`" in (tmp_path / "budgets.md").read_text()


@pytest.mark.parametrize("argv, message", [
    (["nope", "--steps", "1", "2"], "unknown task 'nope'"),
    (["vcr", "--steps", "150"], "at least 2 distinct budgets"),
    (["vcr", "--steps", "0", "150"], "--steps must lie in"),
    (["vcr", "--steps", "150", "300", "--jobs", "0"], "--jobs must be >= 1"),
    (["vcr", "--steps", "150", "300", "--set", "finetune.no_such_key=1"], "no_such_key"),
    (["vcr", "--steps", "150", "300", "--set", "finetune.scratch_per_task={nope: {steps: 1, lr: 0.1, "
      "batch_tokens: 8, warmup_steps: 0}}"], "finetune.scratch_per_task: ['nope'] not allowed"),
])
def test_bad_arguments_exit_2_and_say_why(argv, message, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.stage
def test_points_score_dev_only_and_agree_with_the_stage_beside_the_run(tmp_path_factory):
    """Two points of VCR trained side by side in their own processes: each scores the dev split and
    nothing else, the run's own data root gets no output, and the 2-step point's dev items are the
    ones the real stage gives its pretrained start at 2 steps; that run's point is then reused."""
    from pipeline.finetune.finetune import run as finetune

    data = world(tmp_path_factory)
    two_steps = "finetune.per_task.vcr={steps: 2, lr: 0.001, batch_tokens: 600, warmup_steps: 0}"  # warmup_of(2)
    load = lambda extra: ft_params(data, two_steps, *extra)  # noqa: E731
    out = data / "budgets" / "vcr"
    points = sweep(load, load([]), "vcr", [1, 2], out, jobs=2, reuse_run=False)
    assert [(p.steps, p.source) for p in points] == [(1, "sweep"), (2, "sweep")]
    assert not (data / "models" / "vcr").exists() and not (data / "metrics").exists()
    result = json.loads((out / "steps2" / "checkpoints" / "finetune" / "vcr" / "pretrained" / "result"
                         / "result.json").read_text())
    assert set(result["metrics"]) == {"val"} and all(k.startswith("val/") for k in result["items"])
    assert (out / "steps2" / "models" / "pretrain_vcr").is_symlink()
    # the real stage at the same budget, in the run's own root: the same dev items; then it is the run's point
    stage = finetune(load(["finetune.compare_scratch=false"]), "vcr")["vcr"]
    assert stage["pretrained"]["val"] == result["metrics"]["val"] and "test" in stage["pretrained"]
    own = run_point(load(["finetune.compare_scratch=false"]), "vcr")
    assert own is not None and (own.steps, own.score, own.se) == (2, points[1].score, points[1].se)
    assert run_point(load(["finetune.compare_scratch=false", "finetune.per_task.vcr.lr=0.002"]), "vcr") is None
    assert run_point(load(["finetune.compare_scratch=false", budget("vcr", steps=2)]), "vcr") is None  # warmup 1


@pytest.mark.stage
def test_a_scratch_point_scores_dev_only_and_agrees_with_the_stage_own_budget(tmp_path_factory):
    """The scratch start's point at 2 steps, trained beside the run, gives the dev items the real
    stage gives its scratch start when finetune.scratch_per_task sets 2 steps while the pretrained
    start trains 1; the stage records both budgets and that run's point is then reused."""
    from pipeline.finetune.finetune import run as finetune
    from pipeline.finetune.finetune import task_digest

    data = world(tmp_path_factory)
    one_step = "finetune.per_task.vcr={steps: 1, lr: 0.001, batch_tokens: 600, warmup_steps: 0}"
    load = lambda extra: ft_params(data, one_step, *extra)  # noqa: E731
    base = load([])
    (p2,) = sweep(load, base, "vcr", [2], data / "budgets" / "vcr_scratch", jobs=1, reuse_run=False, start="scratch")
    assert (p2.steps, p2.source) == (2, "sweep")
    scratch_two = "finetune.scratch_per_task.vcr={steps: 2, lr: 0.001, batch_tokens: 600, warmup_steps: 0}"
    assert task_digest(load([scratch_two]), "vcr") != task_digest(base, "vcr")
    stage = finetune(load(["finetune.compare_scratch=true", "finetune.parallel_starts=false", scratch_two]),
                     "vcr")["vcr"]
    assert stage["steps"] == 1 and stage["scratch_steps"] == 2
    own = run_point(load(["finetune.compare_scratch=true", "finetune.parallel_starts=false", scratch_two]), "vcr",
                    "scratch")
    assert own is not None and (own.steps, own.score, own.se) == (2, p2.score, p2.se)
