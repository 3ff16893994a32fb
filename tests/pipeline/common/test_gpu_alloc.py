"""pipeline.common.gpu_alloc on a CPU machine with a fake device count: concurrent processes never hold
one device index at the same time, devices come back after SIGKILL, a stage child keeps them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pipeline.common import gpu_alloc

# One holder process: takes N devices, appends what CUDA_VISIBLE_DEVICES it would give its stage,
# holds them HOLD seconds.
HOLDER = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from pipeline.common import gpu_alloc
    lock_dir, n, hold, label = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    with gpu_alloc.allocate(n, label=label, directory=lock_dir, count=int(sys.argv[5]), poll_s=0.05) as got:
        print(json.dumps(got.env({})), flush=True)
        time.sleep(hold)
""")


def holder(lock_dir: Path, n: int, hold: float, label: str, count: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", HOLDER, str(lock_dir), str(n), str(hold), label, str(count)],
                            stdout=subprocess.PIPE, text=True)


def test_device_count_sources(tmp_path):
    (tmp_path / "nvidia0").touch()
    (tmp_path / "nvidia1").touch()
    (tmp_path / "nvidiactl").touch()  # a control node, not a GPU
    assert gpu_alloc.device_count({}, dev=tmp_path) == 2
    assert gpu_alloc.device_count({"CUDA_VISIBLE_DEVICES": "3,5,7"}, dev=tmp_path) == 3
    assert gpu_alloc.device_count({"CUDA_VISIBLE_DEVICES": ""}, dev=tmp_path) == 0
    assert gpu_alloc.device_count({"UNITER_GPU_COUNT": "4", "CUDA_VISIBLE_DEVICES": "0"}, dev=tmp_path) == 4
    with pytest.raises(ValueError, match="UNITER_GPU_COUNT"):
        gpu_alloc.device_count({"UNITER_GPU_COUNT": "-1"})


def test_concurrent_tasks_never_share_a_device(tmp_path):
    count, procs = 3, []
    for i in range(8):  # 8 tasks wanting 1 or 2 of 3 devices: most of them wait
        procs.append(holder(tmp_path, 1 + i % 2, 0.3, f"task{i}", count))
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    intervals = gpu_alloc.read_intervals(tmp_path / gpu_alloc.RECORD_FILE)
    assert len(intervals) == 8 and all(iv.end is not None for iv in intervals)
    assert gpu_alloc.shared_devices(intervals) == []
    assert {len(iv.devices) for iv in intervals} == {1, 2}
    # what the stage is told is what the record says
    visible = sorted(json.loads(o)["CUDA_VISIBLE_DEVICES"] for o in outs)
    assert visible == sorted(",".join(map(str, iv.devices)) for iv in intervals)
    # and they did overlap in time: two tasks held different devices at once
    assert any(a.start < b.end and b.start < a.end for a in intervals for b in intervals if a is not b)


def test_the_overlap_check_sees_a_shared_device():
    a = gpu_alloc.Interval("h", 1, "x", (0, 1), 0.0, 2.0)
    b = gpu_alloc.Interval("h", 2, "y", (1,), 1.0, None)
    assert gpu_alloc.shared_devices([a, b]) == [(a, b, 1)]
    assert gpu_alloc.shared_devices([a, b], open_until=1.5) == [(a, b, 1)]
    assert gpu_alloc.shared_devices([a, gpu_alloc.Interval("h", 2, "y", (1,), 2.0, 3.0)]) == []


def test_a_killed_holder_frees_its_devices(tmp_path):
    first = holder(tmp_path, 2, 600, "killed", 2)
    assert json.loads(first.stdout.readline()) == {"CUDA_VISIBLE_DEVICES": "0,1"}
    os.kill(first.pid, signal.SIGKILL)
    first.wait(timeout=30)
    killed_at = time.time()
    second = holder(tmp_path, 2, 0, "after", 2)
    assert json.loads(second.communicate(timeout=60)[0]) == {"CUDA_VISIBLE_DEVICES": "0,1"}
    intervals = gpu_alloc.read_intervals(tmp_path / gpu_alloc.RECORD_FILE)
    assert [iv.label for iv in intervals] == ["killed", "after"] and intervals[0].end is None
    assert gpu_alloc.shared_devices(intervals, open_until=killed_at) == []


def test_a_stage_child_keeps_the_devices_and_a_waiter_times_out(tmp_path):
    with gpu_alloc.allocate(1, label="parent", directory=tmp_path, count=1) as got:
        child = subprocess.Popen(["sleep", "600"], pass_fds=got.fds)
    try:  # the parent released, its child still holds the lock
        with pytest.raises(TimeoutError, match="1 of 1 GPUs not free"):
            with gpu_alloc.allocate(1, label="waiter", directory=tmp_path, count=1, wait_s=0.3, poll_s=0.05):
                pass
    finally:
        child.kill()
        child.wait()
    with gpu_alloc.allocate(1, label="after", directory=tmp_path, count=1, wait_s=5) as got:
        assert got.devices == (0,)


def test_no_devices_means_no_allocation_and_an_unchanged_env(tmp_path):
    with gpu_alloc.allocate(2, label="cpu", directory=tmp_path, count=0) as got:
        assert got.devices == () and got.env({"A": "1"}) == {"A": "1"}
    assert not (tmp_path / gpu_alloc.RECORD_FILE).exists()
    with pytest.raises(ValueError):
        with gpu_alloc.allocate(0, label="none", directory=tmp_path, count=2):
            pass
