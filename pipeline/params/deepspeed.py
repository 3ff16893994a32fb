"""``pretrain.deepspeed`` and ``finetune.deepspeed``: more DeepSpeed config, merged over the one the
engine builds, given inline (a mapping) or as a JSON file below ``deploy/deepspeed/``.

The keys a stage builds from its own params (batch sizes, accumulation, clipping, precision, the
optimizer and its schedule, the ZeRO stage) are refused with the key to set instead, so one value
has one home. A file must lie below :data:`CONFIG_DIR`, which dvc.yaml lists as a dependency of
every training stage: editing the file reruns them, as editing an inline mapping does.
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from typing import Any, Mapping

CONFIG_DIR = PurePosixPath("deploy/deepspeed")  # dvc.yaml: a dep of pretrain, pretrain_vcr, finetune@*

# Sections a user may add or extend; DeepSpeed validates their values when the engine starts.
SECTIONS = ("zero_optimization", "bf16", "activation_checkpointing", "flops_profiler", "comms_logger",
            "wall_clock_breakdown", "memory_breakdown", "steps_per_print", "tensorboard", "csv_monitor",
            "wandb", "comet", "aio", "checkpoint", "communication_data_type", "prescale_gradients",
            "gradient_predivide_factor", "data_types", "timers", "compile")

# config key -> the params key(s) that set it, per stage section
OWNED: dict[str, dict[str, str]] = {
    "pretrain": {
        "train_batch_size": "pretrain.world_size x optim.grad_accum",
        "train_micro_batch_size_per_gpu": "one token bucket (pretrain.batch_tokens)",
        "gradient_accumulation_steps": "pretrain.optim.grad_accum",
        "gradient_clipping": "pretrain.optim.grad_clip", "bf16.enabled": "pretrain.precision",
        "fp16": "pretrain.precision", "optimizer": "pretrain.optim.*", "scheduler": "pretrain.optim.*",
        "zero_optimization.stage": "pretrain.zero_stage"},
    "finetune": {
        "train_batch_size": "one rank, one token bucket (finetune.per_task.<task>.batch_tokens)",
        "train_micro_batch_size_per_gpu": "one token bucket (finetune.per_task.<task>.batch_tokens)",
        "gradient_accumulation_steps": "fine-tuning (one optimizer step per batch)",
        "gradient_clipping": "finetune.grad_clip", "bf16.enabled": "finetune.precision",
        "fp16": "finetune.precision",
        "optimizer": "finetune.betas, finetune.weight_decay and finetune.per_task.<task>.lr",
        "scheduler": "finetune.per_task.<task>.warmup_steps and steps",
        "zero_optimization.stage": "finetune.zero_stage"},
}


def _shared(owned: Mapping[str, str]) -> frozenset[str]:
    """Sections a user may extend but one of whose keys params own (bf16.check_grad_overflow is the
    user's, bf16.enabled the precision key's), read off the dotted keys."""
    return frozenset(key.split(".", 1)[0] for key in owned if "." in key)


def mapping_problem(extra: Mapping[str, Any], section: str = "pretrain") -> str | None:
    """What is wrong with a DeepSpeed mapping for ``section`` (``pretrain`` or ``finetune``), or None.
    Names every key params own, so one edit fixes them all."""
    owned = OWNED[section]
    taken: list[str] = []
    for key, value in extra.items():
        if key in owned:
            taken.append(key)
        elif key not in SECTIONS:
            return f"unknown DeepSpeed section {key!r}; expected one of {sorted(SECTIONS)}"
        elif key in _shared(owned):
            if not isinstance(value, Mapping):
                return f"{key} must be a mapping, got {value!r}"
            taken += [f"{key}.{sub}" for sub in value if f"{key}.{sub}" in owned]
    if taken:
        return "; ".join(f"{key} is set by {owned[key]}" for key in taken) + \
            f": the stage owns {'it' if len(taken) == 1 else 'them'}, set {'it' if len(taken) == 1 else 'them'} there"
    return None


def read_file(path: Path | str) -> dict[str, Any]:
    """The JSON object in ``path``; ValueError naming the file (and line) when it is not one."""
    path = Path(path)
    try:
        value = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}:{err.lineno}:{err.colno}: not JSON ({err.msg})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path}: expected a JSON object of DeepSpeed config sections, got {type(value).__name__}")
    return value


def path_problem(path: Path) -> str | None:
    """A config file must be a ``.json`` below :data:`CONFIG_DIR` (the folder DVC tracks)."""
    rel = PurePosixPath(path.as_posix())
    if rel.suffix != ".json" or rel.is_absolute() or ".." in rel.parts or rel.parts[:2] != CONFIG_DIR.parts:
        return (f"a DeepSpeed config file must be a .json below {CONFIG_DIR}/ (dvc.yaml tracks that folder, so "
                f"editing the file reruns the stage), got {path}")
    return None


def problem(value: Mapping[str, Any] | Path, section: str) -> str | None:
    """What is wrong with ``<section>.deepspeed``: a mapping, or a file path (checked and read when it
    exists; a missing file is reported by the path check, ``must_exist``)."""
    if not isinstance(value, Path):
        return mapping_problem(value, section)
    bad = path_problem(value)
    if bad or not value.exists():
        return bad
    try:
        found = mapping_problem(read_file(value), section)
    except (OSError, ValueError) as err:
        return str(err)
    return f"{value}: {found}" if found else None


def resolve(value: Mapping[str, Any] | Path) -> dict[str, Any]:
    """The mapping to merge over the engine's config: ``value`` itself, or the file's object."""
    return read_file(value) if isinstance(value, Path) else dict(value)
