"""Property: no value the params parser accepts makes a stage's pre-work checks fail with a traceback.

Every numeric and mapping leaf of the parsed default ``params.yaml`` is a target. Hypothesis sets one
leaf to a drawn value (negative, zero, huge, nan/inf, or in range) and then either the parser
refuses it with a :class:`ParamsError` that names that key, or the stages' cheap validation (what
each stage runs before any work: plan and param checks, engine settings, the optimizer) accepts it.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
from pathlib import Path
from typing import Any, Iterator, Mapping

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from pipeline.params.parser import ParamsError, load_raw, parse_params
from pipeline.params.pretrain import FIRST_STAGE_TASKS

REPO = Path(__file__).resolve().parents[3]
RAW = load_raw(REPO / "params.yaml")


def _leaves(obj: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every int, float, float pair and mapping of floats below ``obj``."""
    if dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            yield from _leaves(getattr(obj, f.name), f"{prefix}.{f.name}" if prefix else f.name)
    elif isinstance(obj, Mapping) and obj and all(dataclasses.is_dataclass(v) for v in obj.values()):
        for k, v in obj.items():  # finetune.per_task.<task>
            yield from _leaves(v, f"{prefix}.{k}")
    elif isinstance(obj, Mapping) or (isinstance(obj, (int, float)) and not isinstance(obj, bool)):
        yield prefix, obj
    elif isinstance(obj, tuple) and obj and all(isinstance(v, float) for v in obj):
        yield prefix, obj


LEAVES = dict(_leaves(parse_params(RAW, check_paths=False), ""))

INTS = st.one_of(st.integers(-3, 10), st.integers(-(2**70), 2**70),
                 st.sampled_from([0, -1, 1, 2**32 - 1, 2**32, 10_000_000, 10_000_001, 10**26]))
FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.floats(-2.0, 2.0),
                   st.sampled_from([0.0, -0.0, 1.0, 0.5, 1e-4, -1.0, 1e30, math.nan, math.inf, -math.inf]))
RATIOS = st.dictionaries(st.sampled_from([*FIRST_STAGE_TASKS, "mlmm", "vqa"]), FLOATS | INTS, max_size=6)
SPLITS = st.dictionaries(st.sampled_from(["coco", "vqa", "moon", "../x"]), st.lists(st.sampled_from(["test", "val"])),
                         max_size=3)


def _draw_for(value: Any) -> st.SearchStrategy:
    """Values of the leaf's own shape, across and beyond its range."""
    if isinstance(value, Mapping):
        return SPLITS if all(isinstance(v, tuple) for v in value.values()) else RATIOS
    if isinstance(value, tuple):
        return st.tuples(FLOATS, FLOATS)
    if isinstance(value, int):
        return st.one_of(INTS, st.integers(0, 2 * max(value, 1)))
    return st.one_of(FLOATS, st.floats(0.0, 2 * max(value, 1.0)))


def _set(raw: dict, key: str, value: Any) -> dict:
    out = copy.deepcopy(raw)
    node = out
    *parents, last = key.split(".")
    for part in parents:
        node = node[part]
    node[last] = list(value) if isinstance(value, tuple) else value
    return out


def _blames(message: str, key: str) -> bool:
    """``key`` is named in ``message`` as itself (``a.b:`` or ``a.b.x:``), not as part of a longer key."""
    return re.search(rf"(?<![\w.]){re.escape(key)}(?![\w])", message) is not None


def _pre_work_checks(params) -> None:
    """What the stages run on params before they do any work (no files are read)."""
    from pipeline.finetune import finetune
    from pipeline.pretrain import plan as pretrain
    from pipeline.extract.detector.selection import num_kept
    from pipeline.decontam.phash import near_duplicate_pairs
    from pipeline.extract.image_sets import targets
    from pipeline.training.engine import EngineSettings, deepspeed_config, warmup_linear_decay
    from pipeline.training.task_mix import TaskSchedule

    for stage in ("pretrain", "pretrain_masking", "pretrain_vcr"):
        plan = pretrain.plan_stage(params, stage)
        TaskSchedule(plan.mix_ratio, seed=params.seed, first_phase_mix=plan.first_phase_mix,
                     first_phase_steps=plan.first_phase_steps)
        warmup_linear_decay(plan.warmup_steps, plan.steps)(plan.steps - 1)
    finetune.check_tasks(params, list(params.finetune.tasks))
    targets(params, None)
    cfg, ex = params.pretrain, params.extract
    num_kept(torch.rand(50), conf_th=ex.conf_th, min_boxes=ex.min_boxes, max_boxes=ex.max_boxes)
    near_duplicate_pairs([1, 2], [3], params.decontaminate.phash_max_distance)
    runs = [(cfg.optim.lr, cfg.optim.betas, cfg.optim.weight_decay, cfg.zero_stage, cfg.optim.grad_accum,
             cfg.optim.grad_clip, cfg.world_size, cfg.optim.warmup_steps, cfg.steps)]
    ft = params.finetune
    runs += [(t.lr, ft.betas, ft.weight_decay, ft.zero_stage, 1, ft.grad_clip, 1, t.warmup_steps, t.steps)
             for t in ft.per_task.values()]
    for lr, betas, decay, zero, accum, clip, world, warmup, steps in runs:
        deepspeed_config(EngineSettings(device=torch.device("cpu"), precision="fp32", world_size=world,
                                        zero_stage=zero, grad_accum=accum, grad_clip=clip, lr=lr, betas=betas,
                                        weight_decay=decay, warmup_steps=warmup, total_steps=steps))
        torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=lr, betas=betas, weight_decay=decay)


def test_the_walk_finds_every_kind_of_leaf():
    assert {"seed", "pretrain.steps", "pretrain.mix_ratio", "pretrain.optim.betas", "finetune.per_task.vqa.lr",
            "extract.train.max_minutes", "mini_world.n_coco", "decontaminate.eval_splits"} <= set(LEAVES)
    _pre_work_checks(parse_params(RAW, check_paths=False))  # the defaults pass


@pytest.mark.parametrize("key", sorted(LEAVES))
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_an_accepted_value_never_fails_a_stage_with_a_traceback(key, data):
    value = data.draw(_draw_for(LEAVES[key]), label=key)
    try:
        params = parse_params(_set(RAW, key, value), check_paths=False)
    except ParamsError as err:
        assert _blames(str(err), key), f"{key}={value!r}: {err}"
        event("refused by the parser")
        return
    event("accepted by the parser")
    try:
        _pre_work_checks(params)
    except Exception as err:  # noqa: BLE001  (the property: nothing a stage checks is left to it)
        pytest.fail(f"{key}={value!r} parsed, but a stage's checks raised {type(err).__name__}: {err}")
