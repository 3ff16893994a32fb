"""``pretrain:`` section: DeepSpeed pretraining (first stage) and the VCR second stage."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping

from pipeline.configs import MAX_COUNT, MAX_STEPS, MAX_TOKENS, betas_problem, bounded, checked, must_exist, \
    name_problem, subset_problem, weights_problem, zero_stage_problem

# The tasks each stage can draw. model/pretraining.py (PRETRAIN_TASKS) and pipeline/pretrain.py keep
# their own copies because they import torch and this module must not; tests compare them.
FIRST_STAGE_TASKS = ("mlm", "mrfr", "mrc", "mrc_kl", "itm")
VCR_TASKS = ("mlm", "mrfr", "mrc", "mrc_kl")  # no ITM in the second stage: VCR has no mismatched pairs
VCR_VIEWS = ("qa", "qar")


# pretrain.deepspeed: DeepSpeed config sections a user may add or extend (merged over the config the
# engine builds). Keys that params already set are refused, so one value has one home.
DEEPSPEED_SECTIONS = ("zero_optimization", "activation_checkpointing", "flops_profiler", "comms_logger",
                      "wall_clock_breakdown", "memory_breakdown", "steps_per_print", "tensorboard", "csv_monitor",
                      "wandb", "comet", "aio", "checkpoint", "communication_data_type", "prescale_gradients",
                      "gradient_predivide_factor", "data_types", "timers", "compile")
DEEPSPEED_OWNED = {"train_batch_size": "pretrain.world_size x optim.grad_accum",
                   "train_micro_batch_size_per_gpu": "one token bucket (pretrain.batch_tokens)",
                   "gradient_accumulation_steps": "pretrain.optim.grad_accum",
                   "gradient_clipping": "pretrain.optim.grad_clip", "bf16": "pretrain.precision",
                   "fp16": "pretrain.precision", "optimizer": "pretrain.optim.*", "scheduler": "pretrain.optim.*",
                   "zero_optimization.stage": "pretrain.zero_stage"}


def deepspeed_problem(extra: Mapping[str, Any]) -> str | None:
    """What is wrong with a ``pretrain.deepspeed`` mapping, or None."""
    for key, value in extra.items():
        if key in DEEPSPEED_OWNED:
            return f"{key} is set by {DEEPSPEED_OWNED[key]}; set it there"
        if key not in DEEPSPEED_SECTIONS:
            return f"unknown DeepSpeed section {key!r}; expected one of {sorted(DEEPSPEED_SECTIONS)}"
        if key == "zero_optimization":
            if not isinstance(value, Mapping):
                return f"zero_optimization must be a mapping, got {value!r}"
            if "stage" in value:
                return f"zero_optimization.stage is set by {DEEPSPEED_OWNED['zero_optimization.stage']}; set it there"
    return None


# What each pretraining stage calls its outputs (data/models/<name>, data/metrics/<name>), from
# pretrain.out_name; fine-tuning reads the first two.
PRETRAIN_OUTPUTS = {"pretrain": "{}", "pretrain_vcr": "{}_vcr", "pretrain_masking": "{}_masking_ablation"}


def output_name(stage: str, out_name: str) -> str:
    """``output_name("pretrain_vcr", "pretrain")`` -> ``"pretrain_vcr"``: a pretraining stage's output name."""
    return PRETRAIN_OUTPUTS[stage].format(out_name)


@dataclass(frozen=True)
class OptimConfig:
    lr: float = bounded(1e-4, 0, 1, lo_open=True)  # peak learning rate (AdamW)
    betas: tuple[float, float] = (0.9, 0.98)
    weight_decay: float = bounded(0.01, 0, 1)  # not applied to biases and LayerNorm weights
    warmup_steps: int = bounded(10, 0, MAX_STEPS)  # linear warmup, then linear decay to 0 at the last step
    grad_clip: float = bounded(2.0, 0, 1e6)  # global gradient norm (0: no clipping)
    grad_accum: int = bounded(1, 1, 10_000)  # micro-batches (token buckets) per optimizer step

    def problems(self) -> list[tuple[str, str]]:
        """Keys of this section that are wrong, as (key, message); the parser raises on them."""
        return checked(betas=betas_problem(self.betas))


@dataclass(frozen=True)
class VcrStageConfig:
    """Second stage on VCR text: starts from the first stage's model.safetensors, fresh optimizer."""

    steps: int = bounded(30, 1, MAX_STEPS)
    mix_ratio: Mapping[str, float] = field(default_factory=lambda: {"mlm": 2.0, "mrfr": 1.0, "mrc_kl": 1.0})
    lr: float = bounded(3e-5, 0, 1, lo_open=True)
    warmup_steps: int = bounded(3, 0, MAX_STEPS)
    # qa: question + gold answer; qar: question + gold answer + gold rationale (two datasets)
    views: tuple[str, ...] = VCR_VIEWS

    def problems(self) -> list[tuple[str, str]]:
        """Keys of this section that are wrong, as (key, message); the parser raises on them."""
        return checked(mix_ratio=weights_problem(self.mix_ratio, VCR_TASKS, " in pretrain_vcr"),
                       views=subset_problem(self.views, VCR_VIEWS))


@dataclass(frozen=True)
class PretrainConfig:
    steps: int = bounded(350, 1, MAX_STEPS)  # optimizer steps
    # one task per optimizer step, drawn with these weights; 0 removes a task (ablation)
    mix_ratio: Mapping[str, float] = field(
        default_factory=lambda: {"mlm": 2.0, "mrfr": 1.0, "mrc": 0.0, "mrc_kl": 1.0, "itm": 2.0}
    )
    # steps 1..first_phase_steps draw from first_phase_mix instead (0: one mix throughout, as UNITER);
    # only tasks the mix has on: the phase orders the mix's tasks and never adds one
    first_phase_steps: int = bounded(100, 0, MAX_STEPS)
    first_phase_mix: Mapping[str, float] = field(default_factory=lambda: {"itm": 1.0})
    masking: Literal["conditional", "joint"] = "conditional"
    mask_prob: float = bounded(0.15, 0, 1, lo_open=True, hi_open=True)
    itm_neg_prob: float = bounded(0.5, 0, 1)
    wra: bool = True
    wra_weight: float = bounded(0.1, 0, 1e3)
    datasets: Literal["indomain", "outdomain", "both"] = "indomain"
    batch_tokens: int = bounded(1024, 1, MAX_TOKENS)  # micro batch, per rank: padded text tokens + regions
    log_every: int = bounded(5, 1, MAX_STEPS)
    val_every: int = bounded(50, 0, MAX_STEPS)  # 0: validate only at the end
    val_batches: int = bounded(4, 0, MAX_COUNT)  # held-out batches per task (the same batches in every run)
    checkpoint_every: int = bounded(50, 0, MAX_STEPS)  # 0: only at the end
    keep_checkpoints: int = bounded(2, 1, 1000)
    world_size: int = bounded(1, 1, 4096)  # ranks on this node (GPUs, or CPU processes with gloo)
    hostfile: Path | None = must_exist(None)  # several nodes: `host slots=N` lines (deepspeed launcher)
    master_port: int = bounded(0, 0, 65535)  # 0: a free port
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # auto: bf16 on GPU; on CPU bf16 autocast where the CPU has native bf16, else fp32
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    zero_stage: int = 0  # 0, 1 or 2 (problems(): ZeRO-3 is not supported); >0 only pays off on several ranks
    num_workers: int = bounded(0, 0, 256)  # DataLoader workers per rank
    out_name: str = "pretrain"  # data/models/<out_name>, data/metrics/<out_name>; VCR: <out_name>_vcr
    # merged over the DeepSpeed config the engine builds (offload, activation checkpointing, the flops
    # profiler, ...); DeepSpeed validates the values when the engine starts
    deepspeed: Mapping[str, Any] = field(default_factory=dict)
    optim: OptimConfig = field(default_factory=OptimConfig)
    vcr: VcrStageConfig = field(default_factory=VcrStageConfig)

    def first_phase(self) -> tuple[dict[str, float], int]:
        """The first phase that actually runs: (mix, steps), ``({}, 0)`` when there is none.

        Only tasks ``mix_ratio`` has on stay in it (it orders the mix's tasks, never adds one), so a
        task-subset ablation without ITM has no ITM-first phase either."""
        mix = {t: r for t, r in self.first_phase_mix.items() if r > 0 and self.mix_ratio.get(t, 0) > 0}
        return (mix, self.first_phase_steps) if mix and self.first_phase_steps else ({}, 0)

    def problems(self) -> list[tuple[str, str]]:
        """Keys of this section that are wrong, as (key, message); the parser raises on them.

        Runs after every bounded key is in range, so ``steps`` is valid when the phase is compared to it."""
        first_mix = weights_problem(self.first_phase_mix, FIRST_STAGE_TASKS) if self.first_phase_steps else None
        # ZeRO-3 fails in backward on this model (DeepSpeed 0.19.8: "active_backward_submodules is
        # empty"), even with the borrowed decoder weights registered as external parameters
        out = checked(out_name=name_problem(self.out_name), deepspeed=deepspeed_problem(self.deepspeed),
                      zero_stage=zero_stage_problem(self.zero_stage, (0, 1, 2)),
                      mix_ratio=weights_problem(self.mix_ratio, FIRST_STAGE_TASKS),
                      first_phase_mix=first_mix)
        if not out and self.first_phase()[1] > self.steps:
            out.append(("first_phase_steps", f"{self.first_phase_steps} is more than pretrain.steps ({self.steps}); "
                                             "lower it, or set it to 0 for no first phase"))
        return out
