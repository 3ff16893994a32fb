"""Checkpoints with exact resume, and the consolidated ``model.safetensors`` export.

A checkpoint ``<root>/step_NNNNNNN/`` holds DeepSpeed's engine state (module, ZeRO-partitioned
optimizer, LR scheduler) plus one ``trainer_state_rankR.pt`` per rank: the step, every task
stream's position, the Python / NumPy / torch RNG states and the metric accumulators. It counts
only once ``COMPLETE`` exists, written by rank 0 after every rank finished; a run killed mid-save
leaves an incomplete directory that resume ignores and the next save replaces.

``fingerprint.json`` records what the checkpoints were trained with (params and inputs). When it
does not match the current run, the old checkpoints belong to another experiment and are removed
instead of being resumed, but only when the root carries the pipeline's ownership marker
(pipeline/common/ownership.py): a directory the pipeline did not create is never removed.

A checkpoint directory is as untrusted as any input (a shared file system, a copied run): every
file of it loads with torch's weights-only unpickler, DeepSpeed's own loads included
(:func:`weights_only_loads`), so a planted pickle payload raises
:class:`~model.weights_file.UnsafeCheckpointError` naming the file instead of running.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import pickle
import random
import re
import shutil
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np
import torch

from model.weights_file import FORCE_UNSAFE, FORCE_WEIGHTS_ONLY, UnsafeCheckpointError, load_plain_torch, refused
from pipeline.common.ownership import check_owned, claim_dir, remove_owned
from pipeline.common.runinfo import atomic_write_bytes, atomic_write_json
from pipeline.training.launch import DistInfo

log = logging.getLogger(__name__)

_TAG = re.compile(r"^step_(\d{7,})$")
COMPLETE = "COMPLETE"
FINGERPRINT = "fingerprint.json"


def checkpoint_globals() -> tuple[Any, ...]:
    """What a checkpoint of ours names beyond tensors and plain containers, each building plain
    data only (no ``__reduce__`` or ``__setstate__`` of its own): numpy's array reconstruction
    (the RNG state in ``trainer_state_rank*.pt``) and three records of DeepSpeed's ZeRO optimizer
    state (its loss scaler, the ZeRO stage enum, a fragment's offsets)."""
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return (np._core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32)),
            LossScaler, ZeroStageEnum, fragment_address)


@contextlib.contextmanager
def weights_only_loads() -> Iterator[None]:
    """Inside, every ``torch.load`` (DeepSpeed's too) builds tensors, plain containers and
    :func:`checkpoint_globals` only; a file naming anything else raises ``pickle.UnpicklingError``."""
    saved = {k: os.environ.pop(k, None) for k in (FORCE_WEIGHTS_ONLY, FORCE_UNSAFE)}
    os.environ[FORCE_WEIGHTS_ONLY] = "1"
    try:
        with torch.serialization.safe_globals(list(checkpoint_globals())):
            yield
    finally:
        for key, value in saved.items():
            os.environ.pop(key, None)
            if value is not None:
                os.environ[key] = value


def refuse_unsafe_files(directory: Path) -> None:
    """Raise UnsafeCheckpointError naming the first ``*.pt`` file in ``directory`` whose pickle
    names a global outside the weights-only set (call inside :func:`weights_only_loads`). Reads
    each file's pickle opcodes only; nothing is unpickled."""
    for f in sorted(directory.glob("*.pt")):
        try:
            unsafe = sorted(torch.serialization.get_unsafe_globals_in_checkpoint(f))
        except (ValueError, RuntimeError, OSError):  # not a torch zip: the weights-only load refuses it
            continue
        if unsafe:
            raise refused(f, f"GLOBAL {unsafe[0]}")


def capture_rng() -> dict[str, Any]:
    """Every RNG a training step may draw from (dropout uses torch's default generator)."""
    state: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(),
                             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: Mapping[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()


def tag_for(step: int) -> str:
    return f"step_{step:07d}"


def db_fingerprint(path: Path) -> str:
    """Cheap identity of a store directory for a run's ``fingerprint.json``: sha256 hex of its
    ``meta.json`` / ``_run.json`` records (minus wall time) and the size of ``data.mdb`` (-1 when
    absent). The LMDB itself is not hashed: a rebuilt DB gets a new build record anyway."""
    h = hashlib.sha256()
    for name in ("meta.json", "_run.json"):
        f = path / name
        if f.exists():
            record = json.loads(f.read_text())
            record.pop("wall_time_s", None)
            h.update(json.dumps(record, sort_keys=True).encode())
    mdb = path / "data.mdb"
    h.update(str(mdb.stat().st_size if mdb.exists() else -1).encode())
    return h.hexdigest()


class Checkpointer:
    """Saves and finds checkpoints below ``root`` for one training run (all ranks call every method)."""

    def __init__(self, root: Path, *, stage: str, fingerprint: Mapping[str, Any], keep: int, dist: DistInfo) -> None:
        if keep < 1:
            raise ValueError(f"Checkpointer: keep must be >= 1, got {keep}")
        self.root = Path(root)
        self.stage = stage  # written into the root's ownership marker
        self.fingerprint = json.loads(json.dumps(dict(fingerprint), sort_keys=True, default=str))
        self.keep = keep
        self.dist = dist

    # -- discovery -------------------------------------------------------------------------

    def complete_steps(self) -> list[int]:
        """Steps of the complete checkpoints, ascending."""
        if not self.root.is_dir():
            return []
        steps = []
        for p in self.root.iterdir():
            m = _TAG.match(p.name)
            if m and (p / COMPLETE).exists():
                steps.append(int(m.group(1)))
        return sorted(steps)

    def prepare(self) -> int | None:
        """Drop checkpoints of a different run; return the step of the newest complete one (or None)."""
        if self.dist.is_main:
            fp_file = self.root / FINGERPRINT
            stale = self.root.is_dir() and any(self.root.iterdir()) and (
                not fp_file.exists() or json.loads(fp_file.read_text()) != self.fingerprint)
            if stale:
                check_owned(self.root)  # never remove a directory this pipeline did not create
                log.warning("checkpoints in %s were trained with other params or inputs: removing them", self.root)
                remove_owned(self.root)
            claim_dir(self.root, self.stage, self.fingerprint.get("params"))
            atomic_write_json(fp_file, self.fingerprint)
            for p in self.root.iterdir():  # leftovers of a save that was killed
                if _TAG.match(p.name) and not (p / COMPLETE).exists():
                    shutil.rmtree(p, ignore_errors=True)
        _barrier()
        steps = self.complete_steps()
        return steps[-1] if steps else None

    # -- save / load -----------------------------------------------------------------------

    def save(self, engine, step: int, trainer_state: Mapping[str, Any]) -> Path:
        """Save the engine and this rank's trainer state as ``step_NNNNNNN``; prune old ones."""
        tag = tag_for(step)
        path = self.root / tag
        if self.dist.is_main and path.exists():
            shutil.rmtree(path)  # an incomplete save of the same step
        _barrier()
        engine.save_checkpoint(str(self.root), tag=tag, client_state={"trainer_step": step})
        buf = io.BytesIO()
        torch.save({"world_size": self.dist.world_size, **trainer_state}, buf)
        atomic_write_bytes(path / f"trainer_state_rank{self.dist.rank}.pt", buf.getvalue())
        _barrier()
        if self.dist.is_main:
            atomic_write_json(path / COMPLETE, {"step": step, "world_size": self.dist.world_size})
            for old in self.complete_steps()[: -self.keep]:
                shutil.rmtree(self.root / tag_for(old), ignore_errors=True)
        _barrier()
        return path

    def load(self, engine, step: int) -> dict[str, Any]:
        """Restore the engine from checkpoint ``step``; return this rank's trainer state.

        Raises ValueError when the checkpoint was written by a different number of ranks (each rank's
        data position is its own, so it cannot be carried over to another world size).
        """
        path = self.root / tag_for(step)
        done = json.loads((path / COMPLETE).read_text())
        if done["world_size"] != self.dist.world_size:
            raise ValueError(f"{path}: written by {done['world_size']} rank(s), this run has "
                             f"{self.dist.world_size}; remove {self.root} to start over")
        with weights_only_loads():
            refuse_unsafe_files(path)
            try:
                load_path, client = engine.load_checkpoint(str(self.root), tag=tag_for(step),
                                                           load_optimizer_states=True, load_lr_scheduler_states=True)
            except UnsafeCheckpointError:
                raise
            except pickle.UnpicklingError as err:  # what the static scan cannot see
                raise refused(path, str(err)) from None
            if load_path is None or client.get("trainer_step") != step:
                raise RuntimeError(f"{path}: DeepSpeed could not load this checkpoint")
            state_file = path / f"trainer_state_rank{self.dist.rank}.pt"
            state = load_plain_torch(state_file, allow=checkpoint_globals())
        if state.get("step") != step:
            raise RuntimeError(f"{state_file}: holds step {state.get('step')}, expected {step}")
        return state


def consolidated_state_dict(engine, checkpoint_root: Path, step: int, zero_stage: int) -> dict[str, torch.Tensor]:
    """The full fp32 state dict of ``engine.module`` (call on rank 0, after the final save).

    Under ZeRO 1-3 the fp32 master weights live partitioned in the optimizer states, so they are
    merged from the saved checkpoint with DeepSpeed's ``zero_to_fp32``; without ZeRO the module
    holds them. Buffers and tied parameters come from the module's own state dict, so the keys are
    exactly ``engine.module.state_dict()``'s.
    """
    module_state = engine.module.state_dict()
    if zero_stage == 0:
        merged = {}
    else:
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        with weights_only_loads():
            refuse_unsafe_files(Path(checkpoint_root) / tag_for(step))
            merged = get_fp32_state_dict_from_zero_checkpoint(str(checkpoint_root), tag=tag_for(step))
    out = {}
    for key, value in module_state.items():
        tensor = merged.get(key, value)
        out[key] = tensor.detach().to("cpu", torch.float32 if tensor.is_floating_point() else tensor.dtype)
    # tied weights: make the copies point at the merged master of the parameter they share
    names_by_ptr: dict[int, list[str]] = {}
    for name, p in engine.module.named_parameters(remove_duplicate=False):
        names_by_ptr.setdefault(p.data_ptr(), []).append(name)
    for names in names_by_ptr.values():
        source = next((n for n in names if n in merged), None)
        if source is not None:
            for n in names:
                if n in out:
                    out[n] = out[source]
    return out


def save_safetensors(state: Mapping[str, torch.Tensor], path: Path) -> None:
    """Write a plain safetensors file (keys sorted, shared tensors copied) atomically.

    The only metadata is ``format: pt``: safetensors writes a metadata map in no fixed order, so a
    second entry would make the bytes differ between two identical runs.
    """
    from safetensors.torch import save

    tensors = {k: state[k].contiguous().clone() for k in sorted(state)}
    atomic_write_bytes(path, save(tensors, metadata={"format": "pt"}))
