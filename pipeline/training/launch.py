"""Processes: the ``deepspeed`` launcher for several ranks, and the process group of one rank.

``run(params)`` of a training stage either is already one rank started by the ``deepspeed``
launcher (the launcher sets RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT), or it is
a plain ``python -m pipeline <stage>``. In the second case one process trains in-process as a
one-rank group, or, when ``world_size > 1`` or a hostfile is given, it re-launches the same stage
through the ``deepspeed`` launcher (one process per GPU, or per CPU share with gloo) and waits.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

log = logging.getLogger(__name__)

LAUNCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def in_launched_worker() -> bool:
    """True inside a process started by the ``deepspeed`` (or torchrun) launcher."""
    return all(k in os.environ for k in LAUNCH_ENV)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def process_group(device_type: str) -> Iterator[DistInfo]:
    """Initialize torch.distributed through DeepSpeed for this process; destroy it on exit.

    Outside a launcher this is a one-rank group on 127.0.0.1 (a free port). The backend is NCCL on
    GPU and gloo on CPU. On CPU the available cores are split evenly between the local ranks, so
    two ranks on two cores do not oversubscribe each other.
    """
    import deepspeed
    import torch.distributed as dist

    saved = {k: os.environ.get(k) for k in LAUNCH_ENV}
    if not in_launched_worker():
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(free_port()))
    local_world = int(os.environ.get("LOCAL_SIZE", os.environ.get("LOCAL_WORLD_SIZE", "1")))
    threads_before = torch.get_num_threads()
    if device_type == "cpu":
        from pipeline.training.engine import _skip_cpu_shm_op

        _skip_cpu_shm_op()
        if local_world > 1:
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    backend = "nccl" if device_type == "cuda" else "gloo"
    deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False, verbose=False)
    info = DistInfo(rank=dist.get_rank(), world_size=dist.get_world_size(),
                    local_rank=int(os.environ["LOCAL_RANK"]), local_world_size=local_world)
    try:
        yield info
    finally:
        if dist.is_initialized():
            # DeepSpeed's own destroy also drops the groups it cached (a later group would clash)
            deepspeed.comm.destroy_process_group()
        torch.set_num_threads(threads_before)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def launch_command(*, stage: str, params_file: Path, world_size: int, hostfile: Path | None,
                   master_port: int) -> list[str]:
    """The ``deepspeed`` launcher command that runs ``python -m pipeline <stage>`` on every rank.

    Single node: ``--num_gpus world_size`` slots on localhost (GPUs, or CPU processes when
    ``DS_ACCELERATOR=cpu``). Several nodes: the hostfile's ``host slots=N`` lines decide (pdsh
    reaches the other hosts; the params file must be on a filesystem they share).
    """
    cmd = [sys.executable, "-m", "deepspeed.launcher.runner", "--master_port", str(master_port or free_port()),
           "--no_local_rank", "--module"]
    if hostfile is not None:
        cmd += ["--hostfile", str(hostfile)]
    else:
        cmd += ["--num_gpus", str(world_size)]
    return cmd + ["pipeline", stage, "--params", str(params_file)]


def launch_workers(*, stage: str, params_file: Path, world_size: int, hostfile: Path | None,
                   master_port: int) -> None:
    """Run ``stage`` on ``world_size`` ranks through the ``deepspeed`` launcher and wait for them.

    Raises RuntimeError naming the exit status when any rank fails (the launcher then stops the others).
    """
    cmd = launch_command(stage=stage, params_file=params_file, world_size=world_size, hostfile=hostfile,
                         master_port=master_port)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env.setdefault("DS_ACCELERATOR", "cpu" if not torch.cuda.is_available() else "cuda")
    log.info("launching %s on %s: %s", stage, f"hostfile {hostfile}" if hostfile else f"{world_size} local rank(s)",
             " ".join(cmd))
    result = subprocess.run(cmd, env=env, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{stage}: the deepspeed launcher exited with status {result.returncode} "
                           f"(command: {' '.join(cmd)})")
