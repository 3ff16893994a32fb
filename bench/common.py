"""What the bench scripts share: a stage process's settings, synthetic pretraining batches, FLOP
counting, and the timed training loops they put side by side.

Importing this module first gives the process a stage's OpenMP wait and malloc settings
(:mod:`pipeline.common.openmp`, :mod:`pipeline.common.malloc`), which only take effect before torch
loads; a user's own settings win, as in a stage.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from pipeline.common.malloc import keep_freed_memory  # noqa: E402  isort: skip
from pipeline.common.openmp import set_stage_wait_policy  # noqa: E402  isort: skip

set_stage_wait_policy()  # the OpenMP wait of a stage process (before torch loads)
keep_freed_memory()  # and its malloc settings
import torch  # noqa: E402  isort: skip

from pipeline.training.engine import (EngineSettings, autocast_forward, initialize, param_groups,  # noqa: E402
                                      warmup_linear_decay)

# the mini detector (pipeline/extract/detector/presets.py ``mini``): res5 out channels 64 x 8 = 512-d region
# features; soft labels over the mini world's 30 categories (5 colours x 6 shapes) + background
MINI_FEATURE_DIM, MINI_NUM_CLASSES = 512, 31


def synthetic_batch(task: str, *, batch: int, txt_len: int, regions: int, vocab: int, img_dim: int, classes: int,
                    g: torch.Generator) -> dict:
    """One pretraining batch of ``task`` in the docs/design.md §10 layout: ``batch`` examples of
    <= ``txt_len`` tokens and <= ``regions`` regions of ``img_dim``-d features, lengths varying a
    little like token buckets; MLM / MRM targets on ~15% of the positions, ITM targets at random."""
    lt = torch.randint(max(3, txt_len - 6), txt_len + 1, (batch,), generator=g)
    li = torch.randint(max(1, regions - 10), regions + 1, (batch,), generator=g)
    Lt, Li = int(lt.max()), int(li.max())
    txt_mask = torch.arange(Lt)[None] < lt[:, None]
    img_mask = torch.arange(Li)[None] < li[:, None]
    ids = torch.randint(1000, vocab, (batch, Lt), generator=g) * txt_mask
    soft = torch.rand(batch, Li, classes, generator=g)
    out = {"task": task, "input_ids": ids, "txt_mask": txt_mask, "img_mask": img_mask,
           "img_feat": torch.randn(batch, Li, img_dim, generator=g).relu(),
           "img_pos": torch.rand(batch, Li, 7, generator=g)}
    if task == "mlm":
        picked = (torch.rand(batch, Lt, generator=g) < 0.15) & txt_mask
        picked[:, 1] = True
        out["txt_labels"] = torch.where(picked, ids, torch.full_like(ids, -100))
        out["input_ids"] = torch.where(picked, torch.full_like(ids, 103), ids)
    elif task == "itm":
        out["itm_targets"] = torch.randint(0, 2, (batch,), generator=g)
    else:
        masked = (torch.rand(batch, Li, generator=g) < 0.15) & img_mask
        masked[:, 0] = True
        out.update(img_masked=masked, img_feat_target=out["img_feat"].clone(),
                   img_soft_labels=soft / soft.sum(-1, keepdim=True))
    return out


def flops_per_step(model: torch.nn.Module, batches: list[dict], prepare) -> float:
    """Mean FLOPs of one forward + backward over ``batches`` (FlopCounterMode; no optimizer)."""
    from torch.utils.flop_counter import FlopCounterMode

    total = 0
    for b in batches:
        counter = FlopCounterMode(display=False)
        with counter:
            out = model(prepare(b), b["task"])
            out.loss.backward()
        model.zero_grad(set_to_none=True)
        total += counter.get_total_flops()
    return total / len(batches)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class BareLoop:
    """Forward + ``loss.backward()``; gradients dropped (set to None) before the next forward."""

    def __init__(self, model, s: EngineSettings, prepare) -> None:
        self.model, self.prepare = model.to(s.device), prepare
        if s.precision == "bf16":
            self.model = self.model.to(torch.bfloat16)
        autocast_forward(self.model, s.precision, s.device)  # the engine's forward
        self.model.train()

    def step(self, batch: dict) -> float:
        self.model.zero_grad(set_to_none=True)
        out = self.model(self.prepare(batch), batch["task"])
        out.loss.backward()
        return float(out.loss.detach())


class PlainLoop:
    """A plain PyTorch step: forward, backward, ``clip_grad_norm_``, the engine's fused AdamW, scheduler."""

    def __init__(self, model, s: EngineSettings, prepare) -> None:
        self.model, self.s, self.prepare = model.to(s.device), s, prepare
        if s.precision == "bf16":
            self.model = self.model.to(torch.bfloat16)
        autocast_forward(self.model, s.precision, s.device)  # the engine's forward
        self.opt = torch.optim.AdamW(param_groups(self.model, s.weight_decay), lr=s.lr, betas=s.betas, eps=1e-6,
                                     fused=True)  # as pipeline.training.engine.initialize builds it
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, warmup_linear_decay(s.warmup_steps, s.total_steps))

    def step(self, batch: dict) -> float:
        out = self.model(self.prepare(batch), batch["task"])
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.s.grad_clip)
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        return float(out.loss.detach())


class EngineLoop:
    """The stage's DeepSpeed step (``pipeline.training.engine.initialize``)."""

    def __init__(self, model, s: EngineSettings, prepare) -> None:
        self.engine, self.prepare = initialize(model, s), prepare

    def step(self, batch: dict) -> float:
        out = self.engine(self.prepare(batch), batch["task"])
        self.engine.backward(out.loss)
        self.engine.step()
        return float(out.loss.detach())


def timed_round(loop, batches: list[dict], device: torch.device) -> list[float]:
    """Seconds of each ``loop.step`` over ``batches`` (the device synchronized around each)."""
    times = []
    for b in batches:
        sync(device)
        t = time.perf_counter()
        loop.step(b)
        sync(device)
        times.append(time.perf_counter() - t)
    return times
