import math

import pytest

from pipeline.training.task_mix import TaskSchedule


def test_frequencies_follow_mix_ratio_and_zero_ratios_never_run():
    mix = {"mlm": 2.0, "mrfr": 1.0, "mrc": 0.0, "mrc_kl": 1.0, "itm": 2.0}
    sched = TaskSchedule(mix, seed=1234)
    assert sched.tasks == ("itm", "mlm", "mrc_kl", "mrfr")
    n = 6000
    counts = sched.counts(n)
    assert "mrc" not in counts and sum(counts.values()) == n
    for task, count in counts.items():
        p = mix[task] / 6.0
        sd = math.sqrt(n * p * (1 - p))
        assert abs(count - n * p) < 4 * sd, (task, count, n * p)


def test_schedule_is_a_function_of_seed_and_step_only():
    a = TaskSchedule({"mlm": 1.0, "itm": 1.0}, seed=7)
    b = TaskSchedule({"itm": 1.0, "mlm": 1.0}, seed=7)  # key order does not matter
    assert a.tasks_for(1, 200) == b.tasks_for(1, 200)
    # resuming at step 101 sees the same tasks as the uninterrupted run
    assert [a.task_at(s) for s in range(101, 201)] == a.tasks_for(1, 200)[100:]
    assert TaskSchedule({"mlm": 1.0, "itm": 1.0}, seed=8).tasks_for(1, 200) != a.tasks_for(1, 200)


def test_bad_ratios_are_rejected():
    with pytest.raises(ValueError, match="at least one task"):
        TaskSchedule({"mlm": 0.0}, seed=0)
    with pytest.raises(ValueError, match=">= 0"):
        TaskSchedule({"mlm": -1.0, "itm": 1.0}, seed=0)
    with pytest.raises(ValueError, match="from 1"):
        TaskSchedule({"mlm": 1.0}, seed=0).task_at(0)


def test_first_phase_draws_from_its_own_mix_then_the_plain_schedule_resumes():
    mix = {"mlm": 2.0, "mrfr": 0.5, "mrc_kl": 0.5, "itm": 2.0}
    plain = TaskSchedule(mix, seed=3)
    phased = TaskSchedule(mix, seed=3, first_phase_mix={"itm": 1.0, "mrc": 0.0}, first_phase_steps=40)
    assert phased.tasks_for(1, 40) == ["itm"] * 40
    assert phased.tasks_for(41, 300) == plain.tasks_for(41, 300)
    assert phased.tasks == plain.tasks
    assert phased.counts(300)["itm"] == 40 + plain.tasks_for(41, 300).count("itm")
    # a first-phase task outside the main mix still gets its stream
    assert TaskSchedule({"mlm": 1.0}, seed=3, first_phase_mix={"itm": 1.0}, first_phase_steps=5).tasks == ("itm", "mlm")
    # no steps (or no mix): the plain schedule
    assert TaskSchedule(mix, seed=3, first_phase_mix={"itm": 1.0}).tasks_for(1, 50) == plain.tasks_for(1, 50)
    with pytest.raises(ValueError, match="first_phase_mix: at least one task"):
        TaskSchedule(mix, seed=3, first_phase_mix={"itm": 0.0}, first_phase_steps=5)
    with pytest.raises(ValueError, match="first_phase_steps must be >= 0"):
        TaskSchedule(mix, seed=3, first_phase_mix={"itm": 1.0}, first_phase_steps=-1)


def test_fixed_dataset_ratios_over_many_steps():
    """UNITER's MetaLoader: one stream per (task, dataset), drawn with the product of the task's and
    the dataset's ratio, whatever the datasets' sizes. All-data ratios 2:3:3:2 (COCO:VG:CC:SBU)."""
    mix = {"mlm": 2.0, "mrfr": 1.0, "mrc_kl": 1.0, "itm": 2.0}
    datasets = {"coco": 2.0, "vg": 3.0, "cc": 3.0, "sbu": 2.0}
    sched = TaskSchedule(mix, seed=99, dataset_ratio=datasets)
    assert len(sched.streams) == 16 and "mlm/coco" in sched.streams and "mlm" not in sched.streams
    n = 8000
    counts = sched.stream_counts(n)
    assert sum(counts.values()) == n
    for stream, count in counts.items():
        task, dataset = stream.split("/")
        p = mix[task] / 6.0 * datasets[dataset] / 10.0
        sd = math.sqrt(n * p * (1 - p))
        assert abs(count - n * p) < 4 * sd, (stream, count, n * p)
    for dataset, ratio in datasets.items():  # each dataset's share of all steps
        share = sum(c for s, c in counts.items() if s.endswith("/" + dataset)) / n
        assert abs(share - ratio / 10.0) < 0.02, (dataset, share)
    # the dataset is a second draw: the task sequence is that of the schedule without datasets
    assert [s.split("/")[0] for s in map(sched.stream_at, range(1, 301))] == TaskSchedule(mix, seed=99).tasks_for(1, 300)


def test_without_dataset_ratios_the_stream_is_the_task():
    sched = TaskSchedule({"mlm": 1.0, "itm": 1.0}, seed=3)
    assert sched.streams == sched.tasks and sched.stream_at(5) == sched.task_at(5)
    with pytest.raises(ValueError, match="dataset_ratio"):
        TaskSchedule({"mlm": 1.0}, seed=0, dataset_ratio={"coco": 0.0})
