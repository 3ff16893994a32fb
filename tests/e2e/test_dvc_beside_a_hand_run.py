"""`dvc repro -s -f build_dbs` while `python -m pipeline build_dbs`, run by hand, holds the stage lock.

DVC's own lock does not see the hand run, and DVC removed a stage's declared outputs before it ran
the command (which then queued on the stage lock): `data/db` vanished under the hand run, which died
with a traceback. build_dbs' outputs are now `persist: true` (DVC leaves them) and the stage itself
replaces every DB atomically and removes what a fresh build would not write, under its lock.

The interleaving is forced, not hoped for: the hand run stops inside its first text DB (a test
hook in its own process) until DVC's command is seen waiting for the lock; then it goes on. Both
must end well, and the DBs must be those of a build on its own, with `dvc repro` a no-op after.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.test_dvc_repro import BIN, fresh_copy, stage_env

pytestmark = pytest.mark.stage  # runs build_dbs three times and DVC (not in `make test-unit`)

HAND_RUN = """
import sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})
import pipeline.stores.build_dbs as build_dbs
from pipeline.__main__ import main
real, calls = build_dbs.encode_value, [0]
def paused(record, compression):  # inside the first text DB: wait for the test's go
    calls[0] += 1
    if calls[0] == 2:
        Path("hand.ready").touch()
        while not Path("hand.go").exists():
            time.sleep(0.1)
    return real(record, compression)
build_dbs.encode_value = paused
sys.exit(main(["build_dbs"]))
"""


def _wait_for(check, what: str, timeout: float = 240.0) -> None:
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.2)


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.name.startswith("_run")}


@pytest.mark.parametrize("lock_wait", [None, "0"])
def test_dvc_repro_beside_a_hand_run_of_build_dbs(tmp_path, lock_wait):
    from helpers.dbs_synthetic import params_for, write_world
    from pipeline.stores.build_dbs import run

    repo = fresh_copy(tmp_path / "repo", untracked=True)
    write_world(repo / "data")
    instances = repo / "data" / "raw" / "mini" / "refcoco+" / "instances.json"  # a dep of build_dbs in dvc.yaml
    instances.parent.mkdir(parents=True)
    instances.write_text(json.dumps({"annotations": []}))
    env = stage_env()
    env.pop("UNITER_LOCK_WAIT", None)
    tests = str(Path(__file__).resolve().parents[1])
    hand = subprocess.Popen([sys.executable, "-c", HAND_RUN.format(tests=tests)], cwd=repo, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    dvc_env = {**env, **({"UNITER_LOCK_WAIT": lock_wait} if lock_wait is not None else {})}
    dvc_log = tmp_path / "dvc.log"
    try:
        _wait_for(lambda: (repo / "hand.ready").exists() or hand.poll() is not None, "the hand run's pause")
        assert hand.poll() is None, hand.communicate()
        with dvc_log.open("w") as log:
            dvc = subprocess.Popen([str(BIN / "dvc"), "repro", "-s", "-f", "build_dbs"], cwd=repo, env=dvc_env,
                                   stdout=log, stderr=subprocess.STDOUT, text=True)
        # DVC's command queues on the lock (or gives up at once); any removal of outputs came before
        _wait_for(lambda: "waiting for build_dbs" in dvc_log.read_text() or dvc.poll() is not None,
                  "DVC's command at the lock")
        assert (repo / "data" / "db" / "img").is_dir(), "DVC removed build_dbs' outputs under the hand run"
        (repo / "hand.go").touch()
        out, err = hand.communicate(timeout=600)
        dvc.wait(timeout=600)
    finally:
        for proc in (hand, locals().get("dvc")):
            if proc is not None and proc.poll() is None:
                proc.kill()
    log = dvc_log.read_text()
    assert hand.returncode == 0 and "Traceback" not in err, err[-3000:]
    if lock_wait == "0":  # the second writer: one line naming the holder, the documented status, nothing touched
        assert dvc.returncode != 0 and "Traceback" not in log, log[-3000:]
        errors = [line for line in log.splitlines() if line.startswith("error: build_dbs is being written")]
        assert len(errors) == 1 and "held by pid" in errors[0], log[-3000:]
        assert "python -m pipeline build_dbs, exited with 3" in log, log[-3000:]
    else:
        assert dvc.returncode == 0 and "Traceback" not in log, log[-3000:]
        status = subprocess.run([str(BIN / "dvc"), "status", "build_dbs"], cwd=repo, env=env, capture_output=True,
                                text=True, timeout=300)
        assert "up to date" in status.stdout, status.stdout + status.stderr
    reference = tmp_path / "reference"
    write_world(reference)
    run(params_for(reference, f"sources.refcoco.instances={instances}"))
    assert _files(repo / "data" / "db") == _files(reference / "db")
