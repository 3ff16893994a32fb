"""The one training harness both training stages run through (pretraining and fine-tuning).

A stage resolves its params into a :class:`RunSettings` and hands the :class:`Trainer` its model,
schedule, streams and held-out batches; the trainer owns the rest of the machinery in one place:
the checkpoint directory and resume step (``checkpointing``), the DeepSpeed engine (``engine``),
dvclive (``metrics``), the step loop (``loop``) and the consolidated fp32 weights at the end.
Its steps are separate methods, as in detectron2's ``DefaultTrainer``, because the stages put their
own work between them: pretraining measures the untrained model after :meth:`build_engine`,
fine-tuning rebuilds its task model from :meth:`final_state`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from pipeline.training.checkpointing import Checkpointer, consolidated_state_dict
from pipeline.training.engine import EngineSettings, Precision, cast_batch, initialize
from pipeline.training.launch import DistInfo
from pipeline.training.loop import LoopResult, LoopSettings, train
from pipeline.training.metrics import MetricsLogger
from pipeline.training.streams import BatchStream
from pipeline.training.task_mix import TaskSchedule


@dataclass(frozen=True)
class RunSettings:
    """One training run's settings, resolved from its stage's params section."""

    stage: str  # owner name of the run's directories and its checkpoints ("pretrain", "finetune@vqa")
    desc: str  # the progress bar's label
    ckpt_dir: Path
    metrics_dir: Path  # dvclive
    fingerprint: Mapping[str, Any]  # checkpoints written under another fingerprint are removed, not resumed
    logged_params: Mapping[str, Any]  # dvclive's params
    steps: int
    lr: float
    warmup_steps: int
    grad_clip: float  # 0: none
    betas: tuple[float, float]
    weight_decay: float
    zero_stage: int
    keep_checkpoints: int
    log_every: int
    val_every: int  # 0: only at the end
    checkpoint_every: int  # 0: only at the end
    grad_accum: int = 1
    first_phase_dropout: float | None = None  # dropout in the schedule's first phase; None: the model's
    deepspeed: Mapping[str, Any] = field(default_factory=dict)  # merged over the generated DeepSpeed config
    head_lr_mul: float = 1.0  # fine-tuning: the task head's lr as a multiple of lr (UNITER's lr_mul)


class Trainer:
    """Trains one run on this rank (every rank of the group makes the same calls).

    Constructing it claims ``ckpt_dir`` and finds the step to resume from (:attr:`resume_step`,
    None for a fresh run); then :meth:`build_engine`, :meth:`fit`, :meth:`final_state`.
    """

    def __init__(self, settings: RunSettings, *, dist: DistInfo, device: torch.device, precision: Precision) -> None:
        self.settings, self.dist, self.device, self.precision = settings, dist, device, precision
        self.checkpointer = Checkpointer(settings.ckpt_dir, stage=settings.stage, keep=settings.keep_checkpoints,
                                         dist=dist, fingerprint=settings.fingerprint)
        self.resume_step = self.checkpointer.prepare()

    def prepare(self, batch: dict[str, Any]) -> dict[str, Any]:
        """A batch on this run's device, in its precision (what every forward pass is given)."""
        return cast_batch(batch, self.device, self.precision)

    def build_engine(self, module: torch.nn.Module, *, dropout_seed: int):
        """The DeepSpeed engine around ``module``; ``dropout_seed`` seeds torch's RNG first (this
        rank's dropout stream, which checkpoints carry on from)."""
        s = self.settings
        torch.manual_seed(dropout_seed)
        return initialize(module, EngineSettings(
            device=self.device, precision=self.precision, world_size=self.dist.world_size,
            zero_stage=s.zero_stage, grad_accum=s.grad_accum, grad_clip=s.grad_clip, lr=s.lr, betas=s.betas,
            weight_decay=s.weight_decay, warmup_steps=s.warmup_steps, total_steps=s.steps, extra=s.deepspeed,
            head_lr_mul=s.head_lr_mul))

    def fit(self, engine, *, schedule: TaskSchedule, streams: Mapping[str, BatchStream],
            val_batches: Mapping[str, Sequence[dict[str, Any]]],
            after_step: Callable[[int], None] | None = None) -> LoopResult:
        """Train ``engine`` to ``settings.steps`` from :attr:`resume_step`, logging to dvclive on
        rank 0; returns the loop's result (last metrics, task digest, phase timings).
        ``after_step(step)``: called after every step (the loop's hook)."""
        s = self.settings
        logger = MetricsLogger(s.metrics_dir, stage=s.stage, enabled=self.dist.is_main,
                               resume_step=self.resume_step, params=s.logged_params)
        try:
            return train(engine, schedule=schedule, streams=streams, checkpointer=self.checkpointer, logger=logger,
                         val_batches=val_batches, dist=self.dist, resume_step=self.resume_step,
                         after_step=after_step,
                         settings=LoopSettings(total_steps=s.steps, grad_accum=s.grad_accum, log_every=s.log_every,
                                               val_every=s.val_every, checkpoint_every=s.checkpoint_every,
                                               device=self.device, precision=self.precision, desc=s.desc,
                                               first_phase_dropout=s.first_phase_dropout))
        finally:
            logger.close()

    def final_state(self, engine) -> dict[str, torch.Tensor]:
        """The trained module's full fp32 state dict (rank 0, after :meth:`fit` saved the last step)."""
        return consolidated_state_dict(engine, self.settings.ckpt_dir, self.settings.steps, self.settings.zero_stage)
