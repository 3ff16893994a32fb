"""``pretrain:`` section: DeepSpeed pretraining (first stage) and the VCR second stage."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Mapping


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-4
    betas: tuple[float, float] = (0.9, 0.98)
    weight_decay: float = 0.01
    warmup_steps: int = 50
    grad_clip: float = 2.0
    grad_accum: int = 1


@dataclass(frozen=True)
class VcrStageConfig:
    steps: int = 200
    mix_ratio: Mapping[str, float] = field(default_factory=lambda: {"mlm": 2.0, "mrfr": 1.0, "mrc_kl": 1.0})
    lr: float = 5e-5


@dataclass(frozen=True)
class PretrainConfig:
    steps: int = 1000
    mix_ratio: Mapping[str, float] = field(
        default_factory=lambda: {"mlm": 2.0, "mrfr": 1.0, "mrc": 0.0, "mrc_kl": 1.0, "itm": 2.0}
    )
    masking: Literal["conditional", "joint"] = "conditional"
    wra: bool = True
    wra_weight: float = 0.1
    datasets: Literal["indomain", "outdomain", "both"] = "indomain"
    batch_tokens: int = 4096
    val_every: int = 200
    checkpoint_every: int = 200
    world_size: int = 1
    zero_stage: int = 2
    optim: OptimConfig = field(default_factory=OptimConfig)
    vcr: VcrStageConfig = field(default_factory=VcrStageConfig)
