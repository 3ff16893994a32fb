"""Referring expressions (RefCOCO+): score every region; the expression picks one."""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F

from model.config import UniterConfig
from model.tasks.common import TaskOutput, UniterTaskModel, answer_mlp, metrics_to_floats

__all__ = ["UniterForRefExp"]


class UniterForRefExp(UniterTaskModel):
    """Batch: docs/design.md §10 keys + ``targets`` i64 [B] = index (within the Li regions) of the
    referred region. Output logits [B, Li] with padded region positions set to -inf, so the
    softmax and the argmax only ever see real regions. Head: UNITER's ``re_output`` with ``mlp: 2``
    (its RefCOCO+ setting), Linear(H, H) -> GELU -> LayerNorm(H) -> Linear(H, 1) on every region.
    Loss: CE per expression **summed** over the batch, as UNITER's ``train_re.py`` sums it (the
    gradient clipping then acts on the sum); metrics: ``loss`` (that sum), ``accuracy`` (the
    evaluation turns the argmax region into a box for the IoU >= 0.5 criterion).
    """

    def __init__(self, config: UniterConfig, *, img_dim: int):
        super().__init__(config, img_dim=img_dim)
        h = config.hidden_size
        self.head = answer_mlp(h, 1, width=h, eps=config.layer_norm_eps)
        self.init_heads(self.head)

    def forward(self, batch: Mapping[str, torch.Tensor]) -> TaskOutput:
        lt = batch["input_ids"].shape[1]
        regions = self.encode(batch)[:, lt:]
        logits = self.head(regions).squeeze(-1).float().masked_fill(~batch["img_mask"].bool(), float("-inf"))
        targets = batch.get("targets")
        if targets is None:
            return TaskOutput(logits=logits)
        if not bool(batch["img_mask"].gather(1, targets.unsqueeze(1)).all()):
            raise ValueError("RefExp targets point at padded region positions")
        loss = F.cross_entropy(logits, targets, reduction="sum")
        accuracy = (logits.argmax(-1) == targets).float().mean()
        metrics = metrics_to_floats({"loss": loss, "accuracy": accuracy}, n_examples=targets.shape[0])
        return TaskOutput(logits=logits, loss=loss, metrics=metrics)
