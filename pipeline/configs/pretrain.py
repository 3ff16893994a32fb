"""``pretrain:`` section: DeepSpeed pretraining (first stage) and the VCR second stage."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Mapping


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-4  # peak learning rate (AdamW)
    betas: tuple[float, float] = (0.9, 0.98)
    weight_decay: float = 0.01  # not applied to biases and LayerNorm weights
    warmup_steps: int = 10  # linear warmup, then linear decay to 0 at the last step
    grad_clip: float = 2.0  # global gradient norm
    grad_accum: int = 1  # micro-batches (token buckets) per optimizer step


@dataclass(frozen=True)
class VcrStageConfig:
    """Second stage on VCR text: starts from the first stage's model.safetensors, fresh optimizer."""

    steps: int = 30
    mix_ratio: Mapping[str, float] = field(default_factory=lambda: {"mlm": 2.0, "mrfr": 1.0, "mrc_kl": 1.0})
    lr: float = 3e-5
    warmup_steps: int = 3
    # qa: question + gold answer; qar: question + gold answer + gold rationale (two datasets)
    views: tuple[str, ...] = ("qa", "qar")


@dataclass(frozen=True)
class PretrainConfig:
    steps: int = 350  # optimizer steps
    # one task per optimizer step, drawn with these weights; 0 removes a task (ablation)
    mix_ratio: Mapping[str, float] = field(
        default_factory=lambda: {"mlm": 2.0, "mrfr": 1.0, "mrc": 0.0, "mrc_kl": 1.0, "itm": 2.0}
    )
    # steps 1..first_phase_steps draw from first_phase_mix instead (0: one mix throughout, as UNITER);
    # only tasks the mix has on: the phase orders the mix's tasks and never adds one
    first_phase_steps: int = 100
    first_phase_mix: Mapping[str, float] = field(default_factory=lambda: {"itm": 1.0})
    masking: Literal["conditional", "joint"] = "conditional"
    mask_prob: float = 0.15
    itm_neg_prob: float = 0.5
    wra: bool = True
    wra_weight: float = 0.1
    datasets: Literal["indomain", "outdomain", "both"] = "indomain"
    batch_tokens: int = 1024  # micro batch, per rank: padded text tokens + regions
    log_every: int = 5
    val_every: int = 50  # 0: validate only at the end
    val_batches: int = 4  # held-out batches per task (the same batches in every run)
    checkpoint_every: int = 50  # 0: only at the end
    keep_checkpoints: int = 2
    world_size: int = 1  # ranks on this node (GPUs, or CPU processes with gloo)
    hostfile: Path | None = None  # several nodes: `host slots=N` lines (deepspeed launcher)
    master_port: int = 0  # 0: a free port
    device: Literal["auto", "cpu", "cuda"] = "auto"
    precision: Literal["auto", "fp32", "bf16"] = "auto"  # auto: bf16 on GPU, fp32 on CPU
    zero_stage: int = 2
    num_workers: int = 0  # DataLoader workers per rank
    out_name: str = "pretrain"  # data/models/<out_name>, data/metrics/<out_name>; VCR: <out_name>_vcr
    optim: OptimConfig = field(default_factory=OptimConfig)
    vcr: VcrStageConfig = field(default_factory=VcrStageConfig)

    def first_phase(self) -> tuple[dict[str, float], int]:
        """The first phase that actually runs: (mix, steps), ``({}, 0)`` when there is none.

        Only tasks ``mix_ratio`` has on stay in it (it orders the mix's tasks, never adds one), so a
        task-subset ablation without ITM has no ITM-first phase either."""
        mix = {t: r for t, r in self.first_phase_mix.items() if r > 0 and self.mix_ratio.get(t, 0) > 0}
        return (mix, self.first_phase_steps) if mix and self.first_phase_steps else ({}, 0)

    def problems(self) -> list[tuple[str, str]]:
        """Rules between keys of this section, as (key, what is wrong); the parser raises on them."""
        out = []
        if self.first_phase_steps < 0:
            out.append(("first_phase_steps", f"must be >= 0, got {self.first_phase_steps}"))
        elif self.first_phase()[1] > self.steps:
            out.append(("first_phase_steps", f"{self.first_phase_steps} is more than steps ({self.steps}); "
                                             "lower it, or set it to 0 for no first phase"))
        return out
