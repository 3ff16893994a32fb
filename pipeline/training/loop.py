"""The step loop: one task per optimizer step, logging, validation, checkpoints, resume.

Generic over the model: ``engine(batch, task)`` must return an object with ``loss`` (scalar
tensor) and ``metrics`` (dict of floats, with ``n_tokens`` / ``n_regions`` / ``n_pairs`` counts).
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch

from model.layers import set_dropout
from pipeline.common.progress import track
from pipeline.training.checkpointing import Checkpointer, capture_rng, restore_rng
from pipeline.training.engine import Precision, cast_batch, current_lr, fill_missing_grads, start_backward_timers
from pipeline.training.launch import DistInfo
from pipeline.training.metrics import MetricsLogger, RunningMeans, evaluate
from pipeline.training.streams import BatchStream
from pipeline.training.task_mix import TaskSchedule, stream_task

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoopSettings:
    total_steps: int
    grad_accum: int
    log_every: int
    val_every: int  # 0: only at the end
    checkpoint_every: int  # 0: only at the end
    device: torch.device
    precision: Precision
    desc: str = "pretrain"
    # dropout (hidden and attention) during the schedule's first phase (steps 1..first_phase_steps);
    # None: the model's own throughout
    first_phase_dropout: float | None = None


@dataclass
class LoopResult:
    start_step: int  # the step training resumed from (0 for a fresh run)
    final_step: int
    last_val: dict[str, float]
    last_train: dict[str, float]
    task_digest: str  # chained sha256 over the streams (tasks) this rank actually ran, steps 1..final_step
    # seconds this call spent in training steps, validation and checkpointing (resume included)
    timings_s: dict[str, float]


def chain_task(digest: str, task: str) -> str:
    """Extend the running digest of the task sequence by one step's task."""
    return hashlib.sha256(f"{digest}:{task}".encode()).hexdigest()


def batch_units(batch: Mapping[str, Any]) -> int:
    """Real input units of a batch (text tokens + regions): what the token budget and tokens/s count."""
    n = 0
    for key in ("txt_mask", "img_mask"):
        if key in batch:
            n += int(batch[key].sum())
    if n == 0 and "input_ids" in batch:
        n = int(batch["input_ids"].numel())
    return n


def _sum_over_ranks(value: float) -> float:
    import torch.distributed as dist

    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return value
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t.item())


def _due(step: int, every: int, total: int) -> bool:
    return step == total or (every > 0 and step % every == 0)


def train(engine, *, schedule: TaskSchedule, streams: Mapping[str, BatchStream], checkpointer: Checkpointer,
          logger: MetricsLogger, val_batches: Mapping[str, Sequence[dict[str, Any]]], dist: DistInfo,
          settings: LoopSettings, resume_step: int | None,
          after_step: Callable[[int], None] | None = None) -> LoopResult:
    """Train ``engine`` up to ``settings.total_steps`` optimizer steps, resuming from ``resume_step``.

    Every rank calls this with its own streams and val batches. Logs per-task running means every
    ``log_every`` steps, validates every ``val_every``, checkpoints every ``checkpoint_every`` and
    at the end. A resumed run reproduces the steps an uninterrupted run would have taken exactly
    (same batches, same dropout, same optimizer state) on CPU. ``after_step(step)`` runs after each
    step's validation, before its checkpoint (fine-tuning's divergence guard).
    """
    s = settings
    missing = set(schedule.streams) - set(streams)
    if missing:
        raise ValueError(f"no batch stream for scheduled stream(s) {sorted(missing)}")
    means = RunningMeans()
    start, task_digest = 0, ""
    if resume_step is not None:
        state = checkpointer.load(engine, resume_step)
        for task, stream_state in state["streams"].items():
            if task in streams:
                streams[task].load_state_dict(stream_state)
        means.load_state_dict(state["means"])
        restore_rng(state["rng"])
        start, task_digest = resume_step, state["task_digest"]
        log.info("resumed from step %d", start)

    def prepare(batch: dict[str, Any]) -> dict[str, Any]:
        return cast_batch(batch, s.device, s.precision)

    last_val: dict[str, float] = {}
    last_train: dict[str, float] = {}
    engine.train()
    bar = track(total=s.total_steps, initial=start, desc=s.desc, disable=not dist.is_main, mininterval=2.0,
                dynamic_ncols=True, unit="step")
    # tokens/s counts training time only, per log interval: both counters restart at each log line
    interval_tokens, interval_s = 0, 0.0
    timings = {"train": 0.0, "validation": 0.0, "checkpoint": 0.0}
    for step in range(start + 1, s.total_steps + 1):
        step_start = time.perf_counter()
        stream = schedule.stream_at(step)  # "<task>" or "<task>/<dataset>"
        task = stream_task(stream)
        task_digest = chain_task(task_digest, stream)
        lr = current_lr(engine)
        if s.first_phase_dropout is not None:
            # by step number, so a run resumed inside or after the phase gets the same dropout
            set_dropout(engine.module, s.first_phase_dropout if step <= schedule.first_phase_steps else None)
        for _ in range(s.grad_accum):  # every micro batch from the step's stream, as UNITER's MetaLoader
            batch = streams[stream].next_batch()
            interval_tokens += batch_units(batch)
            out = engine(prepare(batch), task)
            start_backward_timers(engine)
            engine.backward(out.loss)
            fill_missing_grads(engine)
            engine.step()
            loss = float(out.loss.detach())
            means.add(f"train/{task}", loss, out.metrics)
            means.add_value("train/loss", loss)
        bar.update(1)
        step_s = time.perf_counter() - step_start
        interval_s += step_s
        timings["train"] += step_s

        if _due(step, s.log_every, s.total_steps):
            tokens = _sum_over_ranks(float(interval_tokens))
            last_train = means.reduce()
            last_train["train/tokens_per_s"] = tokens / max(interval_s, 1e-9)
            last_train["train/lr"] = lr
            logger.log(step, last_train)
            means.clear()
            bar.set_postfix(loss=f"{last_train.get('train/loss', float('nan')):.3f}", task=task, refresh=False)
            interval_tokens, interval_s = 0, 0.0
        if s.val_every >= 0 and val_batches and _due(step, s.val_every, s.total_steps):
            val_start = time.perf_counter()
            last_val = evaluate(engine, val_batches, prepare=prepare, module=engine.module)
            logger.log(step, last_val)
            timings["validation"] += time.perf_counter() - val_start
        if after_step is not None:
            after_step(step)
        if _due(step, s.checkpoint_every, s.total_steps):
            save_start = time.perf_counter()
            checkpointer.save(engine, step, {
                "step": step,
                "streams": {t: st.state_dict() for t, st in streams.items()},
                "means": means.state_dict(),
                "task_digest": task_digest,
                "rng": capture_rng(),
            })
            timings["checkpoint"] += time.perf_counter() - save_start
    bar.close()
    if start == s.total_steps and val_batches:  # resumed from the final checkpoint: nothing left to train
        val_start = time.perf_counter()
        last_val = evaluate(engine, val_batches, prepare=prepare, module=engine.module)
        timings["validation"] += time.perf_counter() - val_start
    return LoopResult(start_step=start, final_step=s.total_steps, last_val=last_val, last_train=last_train,
                      task_digest=task_digest, timings_s={k: round(v, 3) for k, v in timings.items()})
