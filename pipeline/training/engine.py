"""The DeepSpeed engine: config from params, optimizer and schedule, ``deepspeed.initialize``.

Every path (GPU and CPU, one process or many) trains through a real DeepSpeed engine. The optimizer
is a torch AdamW handed to DeepSpeed as a client optimizer: DeepSpeed's own fused Adam would need a
JIT-compiled op, torch's needs none (and is fused on CUDA by itself).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Literal, Mapping

import torch

from pipeline.common.hardware import cpu_has_bf16

log = logging.getLogger(__name__)

# fp32; bf16: bf16 weights under DeepSpeed's bf16 optimizer (GPU); bf16_autocast: fp32 weights,
# optimizer and gradients, with matmuls and convolutions in bf16 under torch.autocast (CPU)
Precision = Literal["fp32", "bf16", "bf16_autocast"]


@dataclass(frozen=True)
class EngineSettings:
    """What the engine needs from params, already resolved for this machine."""

    device: torch.device
    precision: Precision
    world_size: int
    zero_stage: int
    grad_accum: int
    grad_clip: float
    lr: float
    betas: tuple[float, float]
    weight_decay: float
    warmup_steps: int
    total_steps: int
    # more DeepSpeed config, merged over the generated one (pretrain.deepspeed; checked at parse time)
    extra: Mapping[str, Any] = field(default_factory=dict)
    head_lr_mul: float = 1.0  # the lr of parameters outside the encoder, as a multiple of lr (param_groups)


def resolve_device(device: str, local_rank: int) -> torch.device:
    """``auto`` -> this rank's GPU when CUDA is available, else the CPU."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("pretrain.device=cuda but torch sees no CUDA device")
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def resolve_precision(precision: str, device: torch.device) -> Precision:
    """The precision a run uses on ``device``.

    GPU: ``auto`` and ``bf16`` -> bf16 (DeepSpeed). CPU: ``bf16`` -> bf16 autocast; ``auto`` ->
    bf16 autocast where the CPU has native bf16 (UNITER trained in mixed precision too), else fp32.
    So numbers depend on the kind of CPU; each ``_run.json`` records it (``machine``, ``precision``).
    """
    if device.type == "cpu":
        if precision == "auto":
            return "bf16_autocast" if cpu_has_bf16() else "fp32"
        return "bf16_autocast" if precision == "bf16" else precision  # type: ignore[return-value]
    return "bf16" if precision == "auto" else precision  # type: ignore[return-value]


def deepspeed_config(s: EngineSettings) -> dict[str, Any]:
    """The DeepSpeed config dict.

    Batches are bounded by tokens (TokenBucketSampler), so one DeepSpeed "micro batch" is one
    token bucket: ``train_micro_batch_size_per_gpu`` is 1 and the token budget lives in the sampler.
    """
    zero: dict[str, Any] = {"stage": s.zero_stage}
    if s.zero_stage >= 1:
        zero.update(contiguous_gradients=True, overlap_comm=s.device.type == "cuda",
                    reduce_bucket_size=50_000_000, allgather_bucket_size=50_000_000)
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": s.grad_accum,
        "train_batch_size": s.grad_accum * s.world_size,
        "gradient_clipping": s.grad_clip,
        "zero_optimization": zero,
        "bf16": {"enabled": s.precision == "bf16"},
        "fp16": {"enabled": False},
        # a client torch optimizer is fine under ZeRO: its state is partitioned like any other
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    return merge_config(config, s.extra)


def start_backward_timers(engine) -> None:
    """Start the backward timers that DeepSpeed's backward prologue would (call before
    ``engine.backward``; a no-op unless ``flops_profiler`` or ``wall_clock_breakdown`` enables them).

    DeepSpeed runs that prologue from hooks it puts on the tensors the forward returns; our models
    return a namespace, so the hooks never fire and the backward's epilogue stopped a timer that
    was never started ("AssertionError: timer is not started"). Nothing else of the prologue is
    replayed: training did without it before, and does the same now.
    """
    timers = engine.engine_timers
    for names in (timers.backward_timers, timers.backward_inner_timers):
        if names and not engine.timers(names[0]).started_:
            engine._start_timers(names)


def merge_config(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``extra`` merged in: mappings recursively, anything else replaced."""
    out = dict(base)
    for key, value in extra.items():
        out[key] = merge_config(out[key], value) if isinstance(value, Mapping) and isinstance(out.get(key), Mapping) \
            else value
    return out


def param_groups(model: torch.nn.Module, weight_decay: float, *, lr: float | None = None,
                 head_lr_mul: float = 1.0) -> list[dict[str, Any]]:
    """AdamW groups: decay matrices, never biases or LayerNorm weights (BERT's convention).

    ``head_lr_mul`` != 1: every parameter outside the encoder (a ``uniter.`` module) gets two
    groups of its own, after the encoder's, at ``lr * head_lr_mul`` (UNITER's ``lr_mul``: its
    fine-tuning scripts train the new task head at 10x the encoder's rate, on the same schedule).
    """
    groups: dict[bool, tuple[list, list]] = {False: ([], []), True: ([], [])}
    split = head_lr_mul != 1.0
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        head = split and not (name.startswith("uniter.") or ".uniter." in name)
        decay, no_decay = groups[head]
        (no_decay if p.ndim < 2 or name.endswith(".bias") else decay).append(p)
    out = [{"params": groups[False][0], "weight_decay": weight_decay},
           {"params": groups[False][1], "weight_decay": 0.0}]
    if split:
        if lr is None:
            raise ValueError("param_groups: head_lr_mul needs lr")
        out += [{"params": groups[True][0], "weight_decay": weight_decay, "lr": lr * head_lr_mul},
                {"params": groups[True][1], "weight_decay": 0.0, "lr": lr * head_lr_mul}]
    return out


def warmup_linear_decay(warmup_steps: int, total_steps: int):
    """LR multiplier: linear warmup 0 -> 1 over ``warmup_steps``, then linear decay to 0 at ``total_steps``.

    The scheduler is stepped after each optimizer step, so step ``k`` (0-based) trains at
    ``lambda(k)``: the first step runs at ``1 / warmup_steps`` of the peak, not 0.
    """
    warmup = max(0, warmup_steps)
    total = max(total_steps, warmup + 1)

    def multiplier(k: int) -> float:
        if k < warmup:
            return (k + 1) / warmup
        return max(0.0, (total - k) / max(1, total - warmup))

    return multiplier


def _skip_cpu_shm_op() -> None:
    """Keep DeepSpeed from JIT-compiling its shared-memory comm op on CPU.

    DeepSpeed's torch comm backend builds ``deepspeed_shm_comm`` whenever it starts on the CPU
    accelerator (~70 s with a cold cache). Training never uses it: only ``inference_all_reduce``
    does. DeepSpeed reads op availability from ``deepspeed.ops.__compatible_ops__`` (a dict it
    caches and documents as editable), so marking the op unavailable makes it fall back to gloo.
    """
    import deepspeed

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def initialize(model: torch.nn.Module, s: EngineSettings):
    """``deepspeed.initialize`` with a torch AdamW and a warmup + linear decay LambdaLR.

    The process group must already exist (``launch.init_process_group``). Returns the engine;
    ``engine.module`` is ``model`` moved to ``s.device`` (and cast to bf16 when ``s.precision`` is bf16).
    """
    import deepspeed

    if s.device.type == "cpu":
        _skip_cpu_shm_op()
    model = model.to(s.device)
    autocast_forward(model, s.precision, s.device)
    # the fused kernel on CUDA and on the CPU alike: torch's CPU default is a per-tensor Python loop;
    # fused is one vectorized pass, 98 vs 20 ms a step for the `small` model with one thread
    # (docs/decisions.md#fused-adamw), and differs from the multi-tensor path in the last bits
    optimizer = torch.optim.AdamW(param_groups(model, s.weight_decay, lr=s.lr, head_lr_mul=s.head_lr_mul),
                                  lr=s.lr, betas=tuple(s.betas),
                                  eps=1e-6, fused=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_linear_decay(s.warmup_steps, s.total_steps))
    try:
        engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler,
                                               config=deepspeed_config(s), dist_init_required=False)
    except Exception as err:  # DeepSpeed validates its sections with pydantic
        if s.extra and type(err).__name__ == "ValidationError":
            raise ValueError(f"pretrain.deepspeed: DeepSpeed rejects the merged config: {err}") from None
        raise
    if s.world_size == 1 and s.zero_stage == 0:
        # one rank: DeepSpeed's gradient all-reduce is an identity (x1 over a group of one) that still
        # flattens, reduces and copies back every gradient; loop.train() calls fill_missing_grads instead
        engine.enable_backward_allreduce = False
        if s.device.type == "cpu" and s.precision != "bf16":
            # the clipping DeepSpeed runs for fp32 gradients, same bits, without its per-tensor Python
            # loop, its all-reduce over one rank and its multiply by exactly 1 when nothing is clipped;
            # the bound is the engine's own (its config's gradient_clipping), as DeepSpeed's clip reads it
            engine.clip_fp32_gradients = lambda: clip_grad_norm_(engine.module.parameters(),
                                                                 engine.gradient_clipping())
    skip_redundant_overflow_pass(engine)
    n_params = sum(p.numel() for p in model.parameters())
    log.info("deepspeed engine: %s, %s, ZeRO-%d, %d rank(s), grad accum %d, %.1fM parameters",
             s.device, s.precision, s.zero_stage, s.world_size, s.grad_accum, n_params / 1e6)
    return engine


def skip_redundant_overflow_pass(engine) -> bool:
    """Drop the per-gradient overflow pass of DeepSpeed's ZeRO-1/2 optimizer where its gradient norm
    test decides the same; returns whether it did.

    With ``bf16.check_grad_overflow`` on (DeepSpeed's default, kept: a step whose gradients hold inf
    or NaN is skipped, as UNITER's loss scaler does) that optimizer first reduces every gradient
    tensor to its max and min (a kernel pair per tensor, ~180 a step for ``base``, then a read on
    the host), and then, because it computes the global gradient norm for clipping
    (``zero_optimization.compute_grad_norm``, on by default), counts a non-finite norm as an
    overflow too. An inf or NaN element makes that norm non-finite, so the first pass never skips a
    step the norm test would not: the same steps are skipped either way
    (tests/pipeline/training/test_engine.py). The norm is summed over every gradient and every rank
    when there is one model-parallel group and no optimizer offload, the engine's only layouts; the
    pass stays in every other case.
    """
    opt = engine.optimizer
    applies = (getattr(opt, "check_grad_overflow", False) and getattr(opt, "compute_grad_norm", False)
               and getattr(opt, "cpu_offload", True) is False and getattr(engine, "mpu", None) is None
               and callable(getattr(opt, "has_overflow", None)))
    if applies:
        opt.has_overflow = lambda partition_gradients=True: False
    return bool(applies)


def autocast_forward(model: torch.nn.Module, precision: Precision, device: torch.device) -> None:
    """With ``bf16_autocast``, make every forward of ``model`` (training, validation, evaluation)
    run under bf16 autocast. An instance attribute, so state dicts and checkpoints are unchanged."""
    if precision == "bf16_autocast":
        model.forward = torch.autocast(device.type, dtype=torch.bfloat16)(model.forward)  # type: ignore[method-assign]


def clip_grad_norm_(parameters: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale the gradients by min(1, max_norm / (‖g‖₂ + 1e-6)), ‖g‖₂ over all of them; returns ‖g‖₂.

    On one rank the same bits as DeepSpeed's ``runtime.utils.clip_grad_norm_`` for fp32 gradients
    (the same per-tensor norms, summed of squares in the same order, the same float32 coefficient),
    and no pass over the gradients at all when the coefficient is 1 (x * 1 is x). For the CPU: the
    comparison with 1 reads the coefficient on the host.
    """
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.zeros(())
    total = torch.stack(torch._foreach_norm(grads, 2)).pow(2).sum().float().pow(0.5)
    coef = torch.min(torch.ones(1), torch.tensor([float(max_norm)]) / (total + 1e-6))
    if coef.item() < 1.0:
        torch._foreach_mul_(grads, coef.reshape(()))
    return total


def fill_missing_grads(engine) -> None:
    """What the skipped one-rank all-reduce did besides reducing: give every trainable parameter
    without a gradient (the heads of the tasks not in this step) a zero one, so that AdamW updates
    them exactly as it did with the all-reduce (momentum decay, weight decay). No-op otherwise."""
    if engine.enable_backward_allreduce:
        return
    for param in engine.module.parameters():
        if param.requires_grad and param.grad is None:
            param.grad = torch.zeros_like(param)


def current_lr(engine) -> float:
    """The learning rate the next optimizer step will use (first param group)."""
    lrs = engine.get_lr()
    return float(lrs[0]) if lrs else math.nan


def cast_batch(batch: dict[str, Any], device: torch.device, precision: Precision) -> dict[str, Any]:
    """Move a batch's tensors to ``device``; floating tensors become bf16 when the engine is bf16."""
    out: dict[str, Any] = {}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor):
            value = value.to(device, non_blocking=True)
            if precision == "bf16" and value.is_floating_point():
                value = value.to(torch.bfloat16)
        out[key] = value
    return out
