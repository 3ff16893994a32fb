"""``pretrain:`` section: DeepSpeed pretraining (first stage) and the VCR second stage."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

from pipeline.params import deepspeed as deepspeed_params
from pipeline.params.finetune import TASKS as FINETUNE_TASKS
from pipeline.params.checks import MAX_COUNT, MAX_STEPS, MAX_TOKENS, betas_problem, bounded, checked, must_exist, \
    name_problem, subset_problem, weights_problem, zero_stage_problem

# The tasks each stage can draw, for every module of pipeline/ (the pretraining datasets and streams
# import them). model/pretraining.py keeps its own PRETRAIN_TASKS: the model layer imports nothing
# of pipeline/, and this module must not import torch; a test compares them.
FIRST_STAGE_TASKS = ("mlm", "mrfr", "mrc", "mrc_kl", "itm")
VCR_TASKS = ("mlm", "mrfr", "mrc", "mrc_kl")  # no ITM in the second stage: VCR has no mismatched pairs
VCR_VIEWS = ("qa", "qar")

# pretrain.datasets -> the pretraining datasets it draws from (the text DBs pretrain_<domain>_* hold them)
DOMAIN_DATASETS = {"indomain": ("coco", "vg"), "outdomain": ("cc", "sbu")}
DATASET_CHOICES = {"indomain": ("indomain",), "outdomain": ("outdomain",), "both": ("indomain", "outdomain")}
# pretrain.dataset_ratio: reference -> UNITER's fixed per-dataset ratios (ChenRocks/UNITER
# config/pretrain-indomain-base-8gpu.json: COCO and VG with the same task ratios, 1:1;
# config/pretrain-alldata-base-8gpu.json: COCO 6,8,4,4 / VG 9,12,6,6 / CC 9,12,6,6 / SBU 6,8,4,4,
# i.e. the same task mix times 2:3:3:2). UNITER ships no out-of-domain-only config: CC:SBU keep
# their all-data 3:2.
REFERENCE_DATASET_RATIOS = {"indomain": {"coco": 1.0, "vg": 1.0}, "outdomain": {"cc": 3.0, "sbu": 2.0},
                            "both": {"coco": 2.0, "vg": 3.0, "cc": 3.0, "sbu": 2.0}}

# pretrain.recipe: the value each recipe gives the keys it governs, where the key is null or absent
# in params.yaml (an explicit value overrides it; the run record lists such overrides). uniter:
# UNITER's choices throughout (docs/fidelity.md). project (default): the same, except where a
# measurement on the mini world showed UNITER's choice fails there (docs/decisions.md): ITM
# first (without dropout), the ITM classifier started ten times wider, the class-name start of the
# region projection, standardized region features and the box branch started from zero.
RECIPES = ("uniter", "project")
DEFAULT_RECIPE = "project"
RECIPE_DEFAULTS: dict[str, dict[str, Any]] = {
    "pretrain.first_phase_steps": {"uniter": 0, "project": 100},
    "pretrain.first_phase_dropout": {"uniter": None, "project": 0.0},
    "model.region_init": {"uniter": "random", "project": "class_names"},
    "model.region_feature_norm": {"uniter": "none", "project": "standardize"},
    "model.region_box_norm": {"uniter": "none", "project": "none"},
    "model.region_box_start": {"uniter": "reference", "project": "zero"},
    "model.pooler_start": {"uniter": "checkpoint", "project": "checkpoint"},
    "pretrain.itm_init_std": {"uniter": 0.02, "project": 0.2},
    "pretrain.mrc_kl_reduction": {"uniter": "mean", "project": "mean"},
    "pretrain.wra_words": {"uniter": "all", "project": "all"},
    "pretrain.dataset_ratio": {"uniter": "reference", "project": "reference"},
    "pretrain.optim.grad_clip": {"uniter": 5.0, "project": 5.0},
    "pretrain.vcr.grad_clip": {"uniter": 0.0, "project": 0.0},
}


def recipe_default(key: str, recipe: str = DEFAULT_RECIPE) -> Any:
    """The value ``recipe`` gives the dotted params ``key`` (the dataclass default is the default recipe's)."""
    return RECIPE_DEFAULTS[key][recipe]


def apply_recipe(raw: dict[str, Any]) -> dict[str, Any]:
    """Fill every recipe-governed key that ``raw`` (a params mapping) leaves null or absent with the
    value of ``raw["pretrain"]["recipe"]`` (in place; returns ``raw``). An unknown recipe fills the
    default recipe's values, so that the strict parser refuses ``pretrain.recipe`` itself."""
    pretrain = raw.get("pretrain")
    recipe = pretrain.get("recipe", DEFAULT_RECIPE) if isinstance(pretrain, dict) else DEFAULT_RECIPE
    if recipe not in RECIPES:
        recipe = DEFAULT_RECIPE
    for key, values in RECIPE_DEFAULTS.items():
        *parents, leaf = key.split(".")
        node = raw
        for part in parents:
            if node.get(part) is None:
                node[part] = {}
            node = node[part]
            if not isinstance(node, dict):
                break
        else:
            if node.get(leaf) is None:
                node[leaf] = values[recipe]
    return raw


def recipe_overrides(values: Mapping[str, Any], recipe: str) -> dict[str, Any]:
    """The governed keys whose value (``values``: dotted key -> parsed value) departs from ``recipe``'s."""
    out = {}
    for key, by_recipe in RECIPE_DEFAULTS.items():
        value = values[key]
        plain = dict(value) if isinstance(value, Mapping) else value
        if plain != by_recipe[recipe]:
            out[key] = plain
    return out


# What each pretraining stage calls its outputs (data/models/<name>, data/metrics/<name>), from
# pretrain.out_name; fine-tuning reads the first two.
PRETRAIN_OUTPUTS = {"pretrain": "{}", "pretrain_vcr": "{}_vcr", "pretrain_masking": "{}_masking_ablation"}


def output_name(stage: str, out_name: str) -> str:
    """``output_name("pretrain_vcr", "pretrain")`` -> ``"pretrain_vcr"``: a pretraining stage's output name."""
    return PRETRAIN_OUTPUTS[stage].format(out_name)


# what other stages write beside the pretraining outputs (data/models/<name>, data/metrics/<name>,
# data/checkpoints/<name>): the detector, the fine-tuning work root and each task's model
OTHER_STAGES_OUTPUTS = ("detector", "finetune", *FINETUNE_TASKS)


def out_name_problem(value: str) -> str | None:
    """None when ``pretrain.out_name`` is a name (:func:`name_problem`) none of whose outputs is
    another stage's, else the message (a clash would replace that stage's output)."""
    problem = name_problem(value)
    if problem:
        return problem
    taken = [output_name(stage, value) for stage in PRETRAIN_OUTPUTS
             if output_name(stage, value) in OTHER_STAGES_OUTPUTS]
    if taken:
        return (f"{value!r} names a pretraining output {taken[0]!r}, which the {taken[0]} stage or task writes "
                f"(data/models/{taken[0]}); choose another name")
    return None


@dataclass(frozen=True)
class OptimConfig:
    lr: float = bounded(1e-4, 0, 1, lo_open=True)  # peak learning rate (AdamW)
    betas: tuple[float, float] = (0.9, 0.98)
    weight_decay: float = bounded(0.01, 0, 1)  # not applied to biases and LayerNorm weights
    warmup_steps: int = bounded(70, 0, MAX_STEPS)  # linear warmup, then linear decay to 0 at the last step
    # global gradient norm (0: no clipping); UNITER 5.0 (config/pretrain-*.json grad_norm)
    grad_clip: float = bounded(recipe_default("pretrain.optim.grad_clip"), 0, 1e6)
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
    # global gradient norm (0: no clipping); UNITER none (config/pretrain-vcr-*.json grad_norm -1)
    grad_clip: float = bounded(recipe_default("pretrain.vcr.grad_clip"), 0, 1e6)
    # qa: question + gold answer; qar: question + gold answer + gold rationale (two datasets)
    views: tuple[str, ...] = VCR_VIEWS

    def problems(self) -> list[tuple[str, str]]:
        """Keys of this section that are wrong, as (key, message); the parser raises on them."""
        return checked(mix_ratio=weights_problem(self.mix_ratio, VCR_TASKS, " in pretrain_vcr"),
                       views=subset_problem(self.views, VCR_VIEWS))


@dataclass(frozen=True)
class PretrainConfig:
    # uniter | project: the defaults of the keys in RECIPE_DEFAULTS (apply_recipe fills them at parse time)
    recipe: Literal["uniter", "project"] = DEFAULT_RECIPE
    steps: int = bounded(700, 0, MAX_STEPS)  # optimizer steps; 0: only with model.uniter_checkpoint (export it as is)
    # one task per optimizer step, drawn with these weights; 0 removes a task (ablation)
    mix_ratio: Mapping[str, float] = field(
        default_factory=lambda: {"mlm": 2.0, "mrfr": 1.0, "mrc": 0.0, "mrc_kl": 1.0, "itm": 2.0}
    )
    # steps 1..first_phase_steps draw from first_phase_mix instead (0: one mix throughout, as UNITER);
    # only tasks the mix has on: the phase orders the mix's tasks and never adds one
    first_phase_steps: int = bounded(recipe_default("pretrain.first_phase_steps"), 0, MAX_STEPS)
    first_phase_mix: Mapping[str, float] = field(default_factory=lambda: {"itm": 1.0})
    # dropout (hidden and attention) during the first phase; None: the model's (model.dropout) throughout
    first_phase_dropout: float | None = bounded(recipe_default("pretrain.first_phase_dropout"), 0, 1, hi_open=True)
    masking: Literal["conditional", "joint"] = "conditional"
    mask_prob: float = bounded(0.15, 0, 1, lo_open=True, hi_open=True)
    itm_neg_prob: float = bounded(0.5, 0, 1)
    # std of the ITM classifier's normal start (UNITER: 0.02, BERT's initializer_range for every new layer)
    itm_init_std: float = bounded(recipe_default("pretrain.itm_init_std"), 0, 10, lo_open=True)
    wra: bool = True
    wra_weight: float = bounded(0.1, 0, 1e3)
    wra_words: Literal["all", "content"] = recipe_default("pretrain.wra_words")  # all: [CLS]/[SEP] too (UNITER)
    # mrc_kl's KL terms [N, C+1]: mean over all (UNITER) | region_sum (KL per region, C+1 times larger)
    mrc_kl_reduction: Literal["mean", "region_sum"] = recipe_default("pretrain.mrc_kl_reduction")
    datasets: Literal["indomain", "outdomain", "both"] = "indomain"
    # which dataset each step's batch comes from: reference (UNITER's fixed ratios) | size (the
    # datasets merged, drawn in proportion to their examples) | {dataset: ratio}
    dataset_ratio: Literal["reference", "size"] | Mapping[str, float] = recipe_default("pretrain.dataset_ratio")
    batch_tokens: int = bounded(1024, 1, MAX_TOKENS)  # micro batch, per rank: padded text tokens + regions
    log_every: int = bounded(5, 1, MAX_STEPS)
    val_every: int = bounded(50, 0, MAX_STEPS)  # 0: validate only at the end
    val_batches: int = bounded(4, 0, MAX_COUNT)  # held-out batches per task (the same batches in every run)
    # held-out batches per task behind eval.json (before / after this stage); 0: every val example once.
    # The val curves use val_batches; the margins the demo checks need the whole val set's precision
    eval_batches: int = bounded(0, 0, MAX_COUNT)
    checkpoint_every: int = bounded(100, 0, MAX_STEPS)  # 0: only at the end
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
    # profiler, ...): a mapping or a JSON file below deploy/deepspeed/ (params/deepspeed.py); DeepSpeed
    # validates the values when the engine starts
    deepspeed: Mapping[str, Any] | Path = must_exist(default_factory=dict)
    optim: OptimConfig = field(default_factory=OptimConfig)
    vcr: VcrStageConfig = field(default_factory=VcrStageConfig)

    def first_phase(self) -> tuple[dict[str, float], int]:
        """The first phase that actually runs: (mix, steps), ``({}, 0)`` when there is none.

        Only tasks ``mix_ratio`` has on stay in it (it orders the mix's tasks, never adds one), so a
        task-subset ablation without ITM has no ITM-first phase either."""
        mix = {t: r for t, r in self.first_phase_mix.items() if r > 0 and self.mix_ratio.get(t, 0) > 0}
        return (mix, self.first_phase_steps) if mix and self.first_phase_steps and self.steps else ({}, 0)

    def dataset_names(self, corpora: Sequence[str] | None = None) -> tuple[str, ...]:
        """The pretraining datasets ``datasets`` draws from (``indomain`` -> coco, vg); with ``corpora``
        (``Params.pretrain_corpora``: those build_dbs built) only those of them."""
        names = tuple(d for domain in DATASET_CHOICES[self.datasets] for d in DOMAIN_DATASETS[domain])
        return names if corpora is None else tuple(d for d in names if d in corpora)

    def dataset_weights(self, corpora: Sequence[str] | None = None) -> dict[str, float] | None:
        """Each dataset's share of the batches (by ``dataset_ratio``), of ``corpora`` only when given;
        None: one merged stream per task, datasets drawn in proportion to their examples (``size``)."""
        if self.dataset_ratio == "size":
            return None
        if self.dataset_ratio == "reference":
            weights = dict(REFERENCE_DATASET_RATIOS[self.datasets])
        else:
            weights = {d: float(self.dataset_ratio[d]) for d in self.dataset_names()}
        used = self.dataset_names(corpora)
        return {d: w for d, w in weights.items() if d in used}

    def _dataset_ratio_problem(self) -> str | None:
        if isinstance(self.dataset_ratio, str):
            return None
        names = self.dataset_names()
        if set(self.dataset_ratio) != set(names):
            return (f"must give a ratio to exactly the datasets of pretrain.datasets={self.datasets} {list(names)}, "
                    f"got {sorted(self.dataset_ratio)} (or use reference / size)")
        return weights_problem(self.dataset_ratio, names)

    def problems(self) -> list[tuple[str, str]]:
        """Keys of this section that are wrong, as (key, message); the parser raises on them.

        Runs after every bounded key is in range, so ``steps`` is valid when the phase is compared to it."""
        first_mix = weights_problem(self.first_phase_mix, FIRST_STAGE_TASKS) if self.first_phase_steps else None
        # ZeRO-3 fails in backward on this model (DeepSpeed 0.19.8: "active_backward_submodules is
        # empty"), even with the borrowed decoder weights registered as external parameters
        out = checked(out_name=out_name_problem(self.out_name),
                      deepspeed=deepspeed_params.problem(self.deepspeed, "pretrain"),
                      zero_stage=zero_stage_problem(self.zero_stage, (0, 1, 2)),
                      mix_ratio=weights_problem(self.mix_ratio, FIRST_STAGE_TASKS),
                      first_phase_mix=first_mix, dataset_ratio=self._dataset_ratio_problem())
        if not out and self.steps and self.first_phase()[1] > self.steps:
            out.append(("first_phase_steps", f"{self.first_phase_steps} is more than pretrain.steps ({self.steps}); "
                                             "lower it, or set it to 0 for no first phase"))
        return out
