"""SIGKILL at every filesystem step of ``atomic_dir``, ``claim_dir`` / ``remove_owned`` and the
pretraining export's writes, then a rerun: it must succeed and leave exactly the bytes of an
uninterrupted run (no leftover temporaries, no directory that locks the stage out).

The kill comes from a test-only audit hook (tests/helpers/kill.py) in a forked child, just before
the k-th operation that changes the filesystem. Production code has no hook. k runs from 1 until
the operation finishes without reaching k, so every step is a kill point.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable

import pytest

from helpers.kill import run_killed_at
from pipeline.common.ownership import atomic_dir, claim_dir, remove_owned, write_marker
from pipeline.common.runinfo import atomic_write_bytes, atomic_write_json


def _snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path below ``root`` -> its bytes (None for a directory)."""
    return {str(p.relative_to(root)): (None if p.is_dir() else p.read_bytes()) for p in sorted(root.rglob("*"))}


def _kill_everywhere(tmp_path: Path, setup: Callable[[Path], None], op: Callable[[Path], None]) -> int:
    """For every kill point k: fresh ``setup``, ``op`` killed at step k, ``op`` again (no kill);
    the tree must equal an uninterrupted run's. Returns the number of kill points."""
    reference = tmp_path / "reference"
    reference.mkdir()
    setup(reference)
    op(reference)
    expected = _snapshot(reference)
    k = 0
    while True:
        k += 1
        root = tmp_path / f"k{k}"
        root.mkdir()
        setup(root)
        if not run_killed_at(op, root, k):
            shutil.rmtree(root)
            return k - 1
        op(root)  # the rerun
        got = _snapshot(root)
        assert got == expected, f"after a kill at step {k} and a rerun: {sorted(set(got) ^ set(expected))}"
        shutil.rmtree(root)
        assert k < 500, "runaway: the operation never finished"


# ---------------------------------------------------------------------------------------------
# the operations


def _old_output(root: Path, out: Path | None = None) -> None:
    """An earlier run's output (marked), to be replaced: several files and a subdirectory."""
    out = out or root / "out"
    (out / "sub").mkdir(parents=True)
    write_marker(out, "stage")
    for name in ("a.bin", "b.bin", "c.json", "sub/d.bin"):
        (out / name).write_bytes(b"old " + name.encode())


def _replace_output(root: Path) -> None:
    """What a stage writing through ``atomic_dir`` does (a DB, a report, a model)."""
    with atomic_dir(root / "out", stage="stage") as tmp:
        (tmp / "sub").mkdir()
        atomic_write_bytes(tmp / "a.bin", b"new a" * 100)
        atomic_write_bytes(tmp / "sub" / "d.bin", b"new d")
        atomic_write_json(tmp / "c.json", {"n": 1})


def test_a_kill_at_any_step_of_atomic_dir_then_a_rerun_gives_the_same_bytes(tmp_path):
    steps = _kill_everywhere(tmp_path, _old_output, _replace_output)
    assert steps >= 15  # mkdtemp, marker, files, the swap and the old directory's removal


def test_a_kill_at_any_step_of_a_first_atomic_dir_then_a_rerun_gives_the_same_bytes(tmp_path):
    assert _kill_everywhere(tmp_path, lambda root: None, _replace_output) >= 8


def _old_checkpoints(root: Path, ck: Path | None = None) -> None:
    ck = claim_dir(ck or root / "ck", "pretrain", "other-run")
    for step in ("step_0000004", "step_0000008"):
        (ck / step).mkdir()
        for name in ("mp_rank_00_model_states.pt", "trainer_state_rank0.pt", "COMPLETE"):
            (ck / step / name).write_bytes(step.encode() + name.encode())


def _restart_checkpoints(root: Path) -> None:
    """What a run with other params does to an owned checkpoint root: remove it, claim it again."""
    remove_owned(root / "ck")
    claim_dir(root / "ck", "pretrain", "this-run")
    atomic_write_json(root / "ck" / "fingerprint.json", {"params": "this-run"})


def test_a_kill_at_any_step_of_remove_owned_and_claim_dir_then_a_rerun_gives_the_same_bytes(tmp_path):
    assert _kill_everywhere(tmp_path, _old_checkpoints, _restart_checkpoints) >= 10


def _export(root: Path) -> None:
    """The pretraining export's filesystem steps (pipeline/pretrain/export.py): the model directory
    through ``atomic_dir`` (safetensors weights, config, eval.json), then the checkpoints removed."""
    import torch

    from pipeline.training.checkpointing import save_safetensors

    with atomic_dir(root / "models" / "pretrain", stage="pretrain") as tmp:
        save_safetensors({"w": torch.arange(12, dtype=torch.float32).reshape(3, 4), "b": torch.ones(3)},
                         tmp / "model.safetensors")
        atomic_write_json(tmp / "model_config.json", {"hidden": 4})
        atomic_write_json(tmp / "eval.json", {"pretrained": {}})
    remove_owned(root / "checkpoints" / "pretrain")


def _before_export(root: Path) -> None:
    _old_checkpoints(root, root / "checkpoints" / "pretrain")
    _old_output(root, root / "models" / "pretrain")


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fork() in a process that may hold threads
def test_a_kill_at_any_step_of_the_export_then_a_rerun_gives_the_same_bytes(tmp_path):
    import torch  # noqa: F401 - imported before the forks, as in a training process

    assert _kill_everywhere(tmp_path, _before_export, _export) >= 15
