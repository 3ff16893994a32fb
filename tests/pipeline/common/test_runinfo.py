"""_run.json wall times (pipeline/common/runinfo.py): a record created at the end of a stage still
reports the stage's whole duration."""

from __future__ import annotations

import json
import time
from pathlib import Path

from pipeline.common import runinfo
from pipeline.common.runinfo import RunRecord, stage_clock


def _wall(tmp_path, record: RunRecord) -> float:
    record.write(tmp_path)
    return json.loads((tmp_path / runinfo.RUN_FILE).read_text())["wall_time_s"]


def test_a_record_created_late_in_a_stage_counts_from_the_stage_start(tmp_path, monkeypatch):
    clock = iter([100.0, 130.0, 131.0])  # stage start, record created, record written
    monkeypatch.setattr(runinfo.time, "time", lambda: next(clock))
    with stage_clock() as start:
        assert start == 100.0
        record = RunRecord("train_detector", "digest")
        assert _wall(tmp_path, record) == 31.0


def test_outside_a_stage_the_record_counts_from_its_creation(tmp_path, monkeypatch):
    clock = iter([50.0, 52.5])
    monkeypatch.setattr(runinfo.time, "time", lambda: next(clock))
    assert _wall(tmp_path, RunRecord("extract@coco", "digest")) == 2.5


def test_the_clock_is_restored_after_the_stage(tmp_path):
    with stage_clock():
        pass
    assert runinfo._stage_start is None
    before = time.time()
    assert _wall(tmp_path, RunRecord("results", "digest")) <= time.time() - before + 0.01


CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC
stepping\t: 1
microcode\t: 0x1000065
flags\t\t: {flags}

processor\t: 1
cpu family\t: 99
"""


def test_the_machine_record_names_the_cpu_beyond_its_model_name(tmp_path):
    """Two machines of one CPU model name can give different pretrained models (docs/decisions.md#cpu-dependent-digits):
    _run.json must tell them apart."""
    info = {}
    for name, flags in {"a": "fpu avx512f avx512_bf16", "b": "avx512_bf16 fpu avx512f", "c": "fpu avx2"}.items():
        (tmp_path / name).write_text(CPUINFO.format(flags=flags))
        info[name] = runinfo._cpu_identity(runinfo._cpu_fields(tmp_path / name))
    assert info["a"]["cpu_id"] == "cpu family 25 model 17 stepping 1 microcode 0x1000065"  # the first block only
    assert info["a"] == info["b"] and info["a"]["cpu_flags"] != info["c"]["cpu_flags"]
    assert runinfo._cpu_fields(tmp_path / "a")["model name"] == "AMD EPYC"
    assert runinfo._cpu_fields(tmp_path / "missing") == {} and runinfo._cpu_identity({}) == {}
    assert {"cpu", "cpu_id", "cpu_flags"} <= set(runinfo.machine())


def test_the_record_has_the_peak_memory_of_the_process_and_of_a_larger_waited_for_child(tmp_path):
    import resource
    import subprocess
    import sys

    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # MB so far (a test worker may be large)
    size = int(own) + 300
    # a child that holds `size` MB resident (written, so the pages are touched) before it exits
    subprocess.run([sys.executable, "-c", f"b = bytearray({size} * 2**20); b[::4096] = b'x' * len(b[::4096])"],
                   check=True)
    RunRecord("extract@coco", "digest").write(tmp_path)
    peak = json.loads((tmp_path / runinfo.RUN_FILE).read_text())["peak_rss_mb"]
    assert own - 1 <= peak["process"] < size <= peak["child"], (own, size, peak)


def test_a_child_smaller_than_the_process_is_not_reported(tmp_path):
    """In a fresh process (a process's children's peak only grows): its small child is not reported."""
    import subprocess
    import sys

    script = ("import subprocess, sys; from pipeline.common.runinfo import RunRecord; "
              "subprocess.run([sys.executable, '-c', 'pass'], check=True); "
              f"RunRecord('results', 'digest').write({str(tmp_path)!r})")
    subprocess.run([sys.executable, "-c", script], check=True, cwd=Path(runinfo.__file__).parents[2])
    assert set(json.loads((tmp_path / runinfo.RUN_FILE).read_text())["peak_rss_mb"]) == {"process"}


def test_every_record_names_the_mini_world_version(tmp_path):
    """A result says which rig produced it (docs/rig.md): the generator's version is in every _run.json."""
    from pipeline.params.world import MINI_WORLD_VERSION

    RunRecord("mini_world", "digest").write(tmp_path)
    record = json.loads((tmp_path / runinfo.RUN_FILE).read_text())
    assert record["rig"] == {"mini_world_version": MINI_WORLD_VERSION} and MINI_WORLD_VERSION >= 1
